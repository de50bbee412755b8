"""Token <-> frame attachment at 16 fps within ±40 ms, with its edges."""

from __future__ import annotations

import pytest

from alignment.frames import (
    FPS,
    attach_tokens,
    frame_count,
    frame_pts,
    frames_for_time,
    tokens_by_frame,
)
from alignment.types import WordToken


def test_frame_k_is_presented_at_k_over_16():
    assert FPS == 16
    assert frame_pts(0) == 0.0
    assert frame_pts(16) == pytest.approx(1.0)
    assert frame_pts(3) == pytest.approx(0.1875)


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (0.0, (0,)),  # on a frame
        (0.125, (2,)),  # on frame 2, neighbours are 62.5 ms away
        (0.03125, (0, 1)),  # exactly between frames 0 and 1: both within 31.25 ms
        (0.0625 + 0.040, (1, 2)),  # exactly 40 ms after frame 1 still attaches (and 22.5 ms before 2)
        (0.0625 - 0.0401, (0,)),  # 40.1 ms before frame 1: only frame 0 (22.4 ms away)
        (-0.5, ()),  # before the clock starts
    ],
)
def test_frames_within_40ms(t, expected):
    assert frames_for_time(t) == expected


def test_every_instant_gets_one_or_two_frames():
    for i in range(2000):
        t = i * 0.0013
        frames = frames_for_time(t)
        assert 1 <= len(frames) <= 2
        assert all(abs(frame_pts(k) - t) <= 0.040 + 1e-9 for k in frames)


def test_past_the_last_frame_is_clipped():
    n = frame_count(1.0)
    assert n == 16
    assert frames_for_time(1.0, n_frames=n) == ()  # frame 16 does not exist
    assert frames_for_time(0.95, n_frames=n) == (15,)


def test_frame_count_edges():
    assert frame_count(0.0) == 0
    assert frame_count(-1.0) == 0
    assert frame_count(0.0625) == 1
    assert frame_count(0.0626) == 2


def test_attach_and_invert():
    toks = [WordToken("hello", 0.12, 0.40), WordToken("world", 0.031, 0.09)]
    attached = attach_tokens(toks, n_frames=10)
    assert attached[0].frames == (2,)
    assert attached[0].first_frame_pts == pytest.approx(0.125)
    assert attached[1].frames == (0, 1)
    by_frame = tokens_by_frame(attached)
    assert [t.text for t in by_frame[0]] == ["world"]
    assert sorted(by_frame) == [0, 1, 2]


def test_no_tokens_no_attachments():
    assert attach_tokens([]) == []
    assert tokens_by_frame([]) == {}
