"""Level-3 validator: hand-computed cases, the flag policy, and an injected offset caught end to end."""

from __future__ import annotations

import json
import math

import pytest

from alignment.evidence import OffsetEstimate, estimate_offset
from alignment.frames import attach_tokens, frame_count
from alignment.sync import Level3Validator, sync_event
from alignment.types import VideoFrame, WordToken
from app.loadtest import testmedia


def tok(start: float, text: str = "word") -> WordToken:
    return WordToken(text, start, start + 0.2)


def test_on_frame_without_evidence_is_assigned_and_ok():
    c = Level3Validator().check(tok(1.0), 1.0, None, "assigned")
    assert (c.audio, c.video, c.text, c.max_delta_ms, c.ok, c.evidence) == (1.0, 1.0, 1.0, 0.0, True, "assigned")


def test_offset_without_evidence_source_is_refused():
    with pytest.raises(ValueError, match="evidence"):
        Level3Validator().check(tok(1.0), 1.0, 0.01, "assigned")


@pytest.mark.parametrize(
    ("start", "frame", "offset", "max_ms", "ok"),
    [
        (1.0, 1.0, 0.050, 50.0, True),       # video exactly 50 ms after audio and text
        (1.0, 1.0, 0.0501, 50.1, False),     # just over
        (1.0, 1.0, -0.050, 50.0, True),      # video 50 ms early
        (1.04, 1.0, 0.010, 50.0, True),      # text 40 ms early, video 10 ms late: text-video = 50
        (1.04, 1.0, 0.011, 51.0, False),
        (1.04, 1.0, -0.050, 50.0, True),     # video 0.99: audio-video = 50, text in between
        (1.04, 1.0, -0.051, 51.0, False),
        (0.98, 1.0, 0.080, 80.0, False),     # an 80 ms offset cannot pass whatever the frames say
    ],
)
def test_hand_computed_edges(start, frame, offset, max_ms, ok):
    c = Level3Validator().check(tok(start), frame, offset, "markers")
    assert c.audio == start
    assert c.text == frame
    assert c.video == pytest.approx(start + offset)
    assert c.max_delta_ms == pytest.approx(max_ms, abs=1e-6)
    assert c.ok is ok
    assert c.evidence == "markers"


def test_custom_tolerance():
    c = Level3Validator(tolerance_ms=30).check(tok(1.0), 1.0, 0.035, "lips")
    assert not c.ok and c.max_delta_ms == pytest.approx(35.0)


def test_missing_frame_is_not_ok_and_json_safe():
    v = Level3Validator()
    c = v.check(tok(2.0), None, 0.0, "markers")
    assert not c.ok
    assert math.isnan(c.text) and math.isinf(c.max_delta_ms)
    c2 = v.check(tok(2.0), None, None, "assigned")
    assert not c2.ok and math.isnan(c2.video)
    event = sync_event(c)
    assert event["text"] is None and event["max_delta_ms"] is None and event["ok"] is False
    json.dumps(event, allow_nan=False)  # no NaN on the wire
    s = v.summary()
    assert (s.checked, s.passed, s.missing_frame) == (2, 0, 2)
    assert s.max_delta_ms_max is None


@pytest.mark.parametrize(
    ("offset", "flagged"),
    [(0.080, True), (0.020, False), (-0.120, True), (0.030, False), (-0.030, False),
     (0.0501, True), (-0.0501, True), (None, False)],
)
def test_offset_flag_policy(offset, flagged):
    v = Level3Validator()
    assert v.offset_flagged(offset) is flagged
    est = OffsetEstimate(0.0, offset, None if offset is None else "markers", 1.0, 1)
    assert v.offset_flagged(est) is flagged


def test_summary_counts_and_percentiles():
    v = Level3Validator()
    for start, frame, off in [(1.0, 1.0, 0.0), (1.0, 1.0, 0.02), (1.0, 1.0, 0.06), (1.0, 1.0, None)]:
        v.check(tok(start), frame, off, "markers" if off is not None else "assigned")
    s = v.summary()
    assert (s.checked, s.passed, s.missing_frame) == (4, 3, 0)
    assert s.pass_rate == 0.75
    assert s.by_evidence == {"markers": 3, "assigned": 1}
    assert s.max_delta_ms_max == pytest.approx(60.0)
    assert s.max_delta_ms_p50 == pytest.approx(10.0)
    assert s.as_dict()["pass_rate"] == 0.75


def _level3_on_clip(offset_s: float) -> tuple[list, list, OffsetEstimate]:
    """Ground-truth words of a marker clip with an injected offset, checked with and without evidence."""
    clip = testmedia.make_av_clip(
        text="send the report before noon", markers=(0.2, 2.4), av_offset_s=offset_s,
        size=(320, 180), lead_in_s=0.5,
    )
    frames = [VideoFrame(k / clip.fps, im) for k, im in enumerate(clip.frames)]
    estimate = estimate_offset(clip.audio, 0.0, frames)
    tokens = [WordToken(w.text, w.start, w.start + 0.1, index=i) for i, w in enumerate(clip.words)]
    attached = attach_tokens(tokens, frame_count(clip.duration))
    v = Level3Validator()
    with_evidence = [v.check_estimate(a.token, a.first_frame_pts, estimate) for a in attached]
    assigned = [v.check(a.token, a.first_frame_pts, None) for a in attached]
    return with_evidence, assigned, estimate


def test_injected_offset_is_caught_where_assigned_pts_pass():
    with_evidence, assigned, estimate = _level3_on_clip(0.080)
    assert estimate.source == "markers"
    assert all(c.ok for c in assigned), "the pipeline's own pts always look in sync"
    assert not any(c.ok for c in with_evidence), "an 80 ms offset must fail every token"
    assert all(c.evidence == "markers" for c in with_evidence)
    assert Level3Validator().offset_flagged(estimate)


def test_in_sync_clip_passes_with_evidence():
    with_evidence, _, estimate = _level3_on_clip(0.0)
    assert estimate.source == "markers" and abs(estimate.offset_s) < 0.002
    assert all(c.ok for c in with_evidence)
    assert not Level3Validator().offset_flagged(estimate)


def test_onset_evidence_fails_a_word_placed_away_from_its_sound():
    """The audio time is checked against the word's acoustic onset where it follows silence: a
    sharp onset (a vowel, a nasal) within -50..+40 ms, a soft one (stop, weak consonant) within
    -120..+40 ms, since its sound rises after the word begins."""
    v = Level3Validator()
    sharp = WordToken("money", 2.000, 2.3, True)
    soft = WordToken("table", 2.000, 2.3, True)
    assert v.check(sharp, 2.01, None, "assigned", acoustic_onset=2.02).ok  # 20 ms early: fine
    assert not v.check(sharp, 2.01, None, "assigned", acoustic_onset=2.08).ok  # 80 ms early
    assert not v.check(sharp, 2.01, None, "assigned", acoustic_onset=1.92).ok  # 80 ms late
    assert v.check(soft, 2.01, None, "assigned", acoustic_onset=2.08).ok  # the burst comes after the closure
    assert not v.check(soft, 2.01, None, "assigned", acoustic_onset=1.92).ok  # never after its sound
    check = v.check(sharp, 2.01, None, "assigned")  # no onset evidence: judged as before
    assert check.ok and check.audio_onset is None and check.audio_error_ms is None
    s = v.summary()
    assert (s.checked, s.onset_checked, s.onset_failed) == (6, 5, 3)
    event = sync_event(v.check(sharp, 2.01, None, "assigned", acoustic_onset=2.02))
    assert event["audio_onset"] == 2.02 and event["audio_error_ms"] == -20.0
