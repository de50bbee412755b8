"""Placing live tokens on output frames: on time, late (frames already sent), and revisions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from alignment.frames import TOLERANCE_S, frame_pts, frames_for_time
from alignment.types import WordToken
from app.live.session import place_token


def word(text: str, start: float) -> WordToken:
    return WordToken(text, start, start + 0.3, final=False)


def test_on_time_token_gets_its_ideal_frames():
    tok = word("hello", 1.0)  # frame 16 exactly
    frames, late = place_token(tok, None, (), next_frame=10)
    assert frames == frames_for_time(1.0) == (16,)
    assert not late


def test_token_after_its_frames_went_out_is_drawn_on_the_next_frame():
    tok = word("late", 1.0)
    frames, late = place_token(tok, None, (), next_frame=20)
    assert frames == (20,) and late


def test_half_sent_pair_keeps_the_frame_still_to_come():
    tok = word("edge", 1.03)  # frames 16 and 17 are both within 40 ms
    assert frames_for_time(1.03) == (16, 17)
    frames, late = place_token(tok, None, (), next_frame=17)
    assert frames == (17,) and late
    assert abs(frame_pts(17) - tok.start) <= TOLERANCE_S


def test_revision_of_a_word_on_screen_keeps_its_frames_but_a_new_word_moves():
    first = word("quick", 1.0)
    final = WordToken("quick", 1.02, 1.3, final=True)
    assert place_token(final, first, (16,), next_frame=30) == ((16,), False)
    changed = WordToken("quack", 1.02, 1.3, final=True)
    frames, late = place_token(changed, first, (16,), next_frame=30)
    assert frames == (30,) and late


@given(start=st.floats(0.0, 60.0), next_frame=st.integers(0, 1200))
def test_frames_are_never_in_the_past_and_late_means_missed(start, next_frame):
    frames, late = place_token(word("w", start), None, (), next_frame)
    assert frames and all(k >= next_frame for k in frames)
    ideal = frames_for_time(start)
    assert late == (frames[0] != ideal[0])
    if not late:
        assert all(abs(frame_pts(k) - start) <= TOLERANCE_S + 1e-9 for k in frames)
