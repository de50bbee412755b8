"""A/V offset evidence: sync markers (through a real codec), lip motion via MediaPipe, the streaming estimator."""

from __future__ import annotations

import av
import numpy as np
import pytest

from alignment import clicks
from alignment import evidence as ev
from alignment.sync import Level3Validator
from alignment.types import SAMPLE_RATE, AudioChunk, VideoFrame
from app.loadtest import testmedia

TEXT = "please send the report to my office before noon and call me back"


def clip_frames(clip: testmedia.AVClip) -> list[VideoFrame]:
    return [VideoFrame(k / clip.fps, im) for k, im in enumerate(clip.frames)]


def decode(path) -> tuple[np.ndarray, float, list[VideoFrame]]:
    """Decode a file with PyAV onto its own timestamps (audio 16 kHz mono, video RGB)."""
    with av.open(str(path)) as c:
        frames = [VideoFrame(float(f.pts * f.time_base), f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
    with av.open(str(path)) as c:
        chunks = [(float(f.pts * f.time_base), f.to_ndarray()[0]) for f in c.decode(audio=0)]
    return np.concatenate([x for _, x in chunks]).astype(np.float32), chunks[0][0], frames


# --- markers -----------------------------------------------------------------------------------

def test_clicks_found_to_the_sample_and_not_in_speech(speech):
    times = [0.1234, 1.5, 2.71828]
    audio = testmedia.add_clicks(speech.samples, times)
    found = clicks.detect_clicks(audio, t0=10.0)
    assert len(found) == len(times)
    for f, t in zip(found, times, strict=True):
        assert abs(f - 10.0 - round(t * SAMPLE_RATE) / SAMPLE_RATE) < 0.1e-3
    assert clicks.detect_clicks(speech.samples) == [], "speech alone must not look like a marker"


def test_quiet_audio_skips_the_click_filter_only_where_no_lag_could_reach_the_threshold():
    """The skip rests on amplitude <= 2 * sqrt(window energy / n); a burst just loud enough is still found."""
    rng = np.random.default_rng(3)
    n = clicks._CLICK_N
    for scale in (0.001, 0.02, 0.3):
        x = rng.standard_normal(4000) * scale
        x[1000:1000 + n] += scale * np.sin(2 * np.pi * clicks.CLICK_HZ * np.arange(n) / SAMPLE_RATE)
        energy = clicks._window_energy(x)
        amplitude, _ = clicks._click_scan(x, energy)
        assert np.all(amplitude <= 2 * np.sqrt(energy / n) * (1 + 1e-9) + 1e-12)
    quiet = np.zeros(4000)
    quiet[2000:2000 + n] = 0.06 * np.sin(2 * np.pi * clicks.CLICK_HZ * np.arange(n) / SAMPLE_RATE)
    found = clicks.detect_clicks(quiet)
    assert len(found) == 1 and abs(found[0] * SAMPLE_RATE - 2000) <= 1
    assert clicks.detect_clicks(quiet * 0.5) == []


def test_click_gate_follows_the_filter_and_never_hides_a_click(monkeypatch):
    """The sliding-DFT envelope matches the direct filter's to rounding, and detection with the gate
    finds exactly what the full filter finds (clicks of any level and phase, in noise of any level)."""
    rng = np.random.default_rng(5)
    n = clicks._CLICK_N
    inputs: list[np.ndarray] = []
    found: list[list[float]] = []
    for trial in range(60):
        x = rng.standard_normal(int(rng.integers(n, 3000))) * rng.choice([0.003, 0.03, 0.3])
        if trial % 2 and len(x) > n:
            at = int(rng.integers(0, len(x) - n))
            phase = 2 * np.pi * clicks.CLICK_HZ * np.arange(n) / SAMPLE_RATE + rng.uniform(0, 2 * np.pi)
            x[at:at + n] += rng.uniform(0.03, 0.8) * np.sin(phase)
        inputs.append(x)
        amplitude, _ = clicks._click_scan(x, clicks._window_energy(x))
        np.testing.assert_allclose(clicks._sliding_envelope(x) / (n / 2), amplitude, rtol=1e-9, atol=1e-12)
        found.append(clicks.detect_clicks(x))
    monkeypatch.setattr(clicks, "_may_hold_click", lambda x, energy: True)
    assert [clicks.detect_clicks(x) for x in inputs] == found
    assert sum(map(len, found)) >= 20


def test_click_stream_checks_each_lag_once_and_finds_what_a_full_scan_finds(monkeypatch):
    """Streams with clicks (some straddling chunks), gaps and odd chunk sizes: the stream that runs
    the detector only while a candidate lag is held reports exactly what running it on every chunk does."""
    rng = np.random.default_rng(11)
    n = clicks._CLICK_N
    streams = []
    for _ in range(12):
        x = rng.standard_normal(int(rng.integers(4000, 12000))) * rng.choice([0.002, 0.02])
        for at in rng.integers(0, len(x) - n, 4):
            x[at:at + n] += rng.uniform(0.06, 0.6) * np.sin(2 * np.pi * clicks.CLICK_HZ * np.arange(n) / SAMPLE_RATE)
        cuts = np.cumsum(rng.choice([160, 304, 320, 320, 320, 333, 960], 200))
        chunks = np.split(x, cuts[cuts < len(x)])
        t, timed = 5.0, []
        for c in chunks:
            timed.append((t, c))
            t += len(c) / SAMPLE_RATE + (0.05 if rng.random() < 0.03 else 0.0)  # now and then a gap
        streams.append(timed)

    def run() -> list[list[float]]:
        out = []
        for timed in streams:
            stream = clicks.ClickStream()
            out.append([o for t, c in timed for o in stream.push(t, c)])
        return out

    found = run()
    monkeypatch.setattr(clicks.ClickStream, "_may_hold", lambda self, old: True)
    assert run() == found
    assert sum(map(len, found)) >= 30


@pytest.mark.parametrize("fps", [25.0, 30.0])
def test_flash_phase_gives_subframe_onsets(fps):
    rng = np.random.default_rng(int(fps))
    onsets = np.sort(rng.uniform(0.5, 9.5, 6))
    onsets = onsets[np.concatenate([[True], np.diff(onsets) > 0.3])]
    n = int(10 * fps)
    base = np.full((48, 64, 3), 90, np.uint8)
    frames = [testmedia.add_marker_box(base) for _ in range(n)]
    for t in onsets:
        for k, level in testmedia.flash_exposure(float(t), n, fps).items():
            frames[k] = testmedia.add_flash(frames[k], level)
    pts = [k / fps for k in range(n)]
    found = ev.detect_flashes(pts, [ev.flash_score(f) for f in frames])
    assert len(found) == len(onsets)
    err = np.abs(np.array(found) - onsets)
    assert err.max() < 2e-3, f"sub-frame error {err.max() * 1000:.2f} ms (a frame is {1000 / fps:.0f} ms)"


def test_flash_with_a_dropped_frame_is_ignored_not_misread():
    fps, n = 25.0, 100
    frames = [testmedia.add_marker_box(np.full((48, 64, 3), 60, np.uint8)) for _ in range(n)]
    for t in (1.01, 2.53):
        for k, level in testmedia.flash_exposure(t, n, fps).items():
            frames[k] = testmedia.add_flash(frames[k], level)
    keep = [k for k in range(n) if k != 26]  # frame 26 (1.04 s, lit 75 %) never arrived
    found = ev.detect_flashes([k / fps for k in keep], [ev.flash_score(frames[k]) for k in keep])
    assert len(found) == 1 and abs(found[0] - 2.53) < 1e-3


def test_lasting_brightness_change_is_not_a_flash_and_resets_the_baseline():
    fps, n = 25.0, 120
    frames = [np.full((48, 64, 3), 20 if k < 40 else 150, np.uint8) for k in range(n)]  # the scene brightens
    for k, level in testmedia.flash_exposure(3.01, n, fps).items():
        frames[k] = testmedia.add_flash(frames[k], 150 / 255 + level * (1 - 150 / 255))
    found = ev.detect_flashes([k / fps for k in range(n)], [ev.flash_score(f) for f in frames])
    assert len(found) == 1 and abs(found[0] - 3.01) < 1e-3


@pytest.mark.parametrize(("offset_s", "flagged", "codec"), [(0.080, True, True), (0.020, False, False),
                                                          (-0.120, True, True), (0.0, False, False)])
def test_marker_offset_on_generated_clips(tmp_path, offset_s, flagged, codec):
    clip = testmedia.make_av_clip(
        text="send the report before noon", markers=(0.2, 1.3, 2.6), av_offset_s=offset_s,
        size=(320, 180), lead_in_s=0.5, fps=30.0 if codec else 25.0,
    )
    if codec:
        audio, audio_pts, frames = decode(testmedia.write_av_file(tmp_path / "clip.mp4", clip))
    else:
        audio, audio_pts, frames = clip.audio, 0.0, clip_frames(clip)
    est = ev.estimate_offset(audio, audio_pts, frames)
    assert est.source == "markers" and est.n_markers == 3
    assert abs(est.offset_s - offset_s) <= 0.010, f"estimate {est.offset_s * 1000:+.1f} ms"
    assert Level3Validator().offset_flagged(est) is flagged


def test_no_markers_no_face_gives_no_estimate():
    clip = testmedia.make_av_clip(text="send the report", size=(320, 180), av_offset_s=0.1)
    est = ev.estimate_offset(clip.audio, 0.0, clip_frames(clip))
    assert est.offset_s is None and est.source is None and est.confidence == 0.0
    assert not Level3Validator().offset_flagged(est)


def test_bad_input_is_a_clear_error(av_clip):
    with pytest.raises(ValueError, match="mouth_open"):
        ev.estimate_offset(av_clip.audio, 0.0, clip_frames(av_clip)[:3], mouth_open=[0.1])
    with pytest.raises(ValueError, match="window_s"):
        ev.AVOffsetEstimator(window_s=0)


# --- lips (real face tracker on the generated talking face) -----------------------------------

@pytest.fixture(scope="module")
def lip_clip():
    """A talking face 100 ms late, with its mouth openness measured by MediaPipe (image mode)."""
    from models.faces import FaceAUExtractor

    clip = testmedia.make_av_clip(text=TEXT, av_offset_s=0.100, size=(480, 270))
    frames = clip_frames(clip)
    with FaceAUExtractor(running_mode="image") as fx:
        obs = [fx.extract_full(f) for f in frames]
    mouth = [o.mouth_open if o.face else None for o in obs]
    return clip, frames, mouth


def test_lip_offset_recovers_injected_offset(lip_clip):
    clip, frames, mouth = lip_clip
    assert sum(m is not None for m in mouth) > 0.9 * len(mouth), "face not tracked"
    lips = ev.lip_offset([f.pts for f in frames], mouth, clip.audio, 0.0)
    assert lips is not None and lips.confidence > 0.7
    assert abs(lips.offset_s - 0.100) < 0.015, f"lip estimate {lips.offset_s * 1000:+.1f} ms"
    est = ev.estimate_offset(clip.audio, 0.0, frames, mouth_open=mouth)
    assert est.source == "lips" and est.offset_s == pytest.approx(lips.offset_s)


def test_lip_offset_refuses_weak_evidence(lip_clip):
    clip, frames, mouth = lip_clip
    pts = [f.pts for f in frames]
    assert ev.lip_offset(pts, [None] * len(pts), clip.audio, 0.0) is None, "no face"
    assert ev.lip_offset(pts, mouth, np.zeros_like(clip.audio), 0.0) is None, "silence"
    still = next(m for m in mouth if m is not None)  # one measured frame, held: a face that never moves
    assert ev.lip_offset(pts, [still] * len(pts), clip.audio, 0.0) is None, "static face"
    rng = np.random.default_rng(0)
    shuffled = list(rng.permutation(np.array([np.nan if m is None else m for m in mouth])))
    assert ev.lip_offset(pts, shuffled, clip.audio, 0.0) is None, "lips unrelated to the speech"


# --- streaming estimator ----------------------------------------------------------------------

def test_streaming_matches_offline_on_a_clip(av_clip):
    frames = clip_frames(av_clip)
    est = ev.AVOffsetEstimator(window_s=5.0)
    step, fi = 320, 0
    for i in range(0, len(av_clip.audio), step):
        t = i / SAMPLE_RATE
        while fi < len(frames) and frames[fi].pts <= t:
            est.push_frame(frames[fi])
            fi += 1
        est.push_audio(AudioChunk(t, av_clip.audio[i : i + step]))
    got = est.estimate()
    assert got.source == "markers" and got.n_markers == 2
    assert abs(got.offset_s) < 0.002
    assert got.offset_s == pytest.approx(ev.estimate_offset(av_clip.audio, 0.0, frames).offset_s, abs=1e-4)


def test_streaming_memory_is_bounded_and_follows_drift():
    """Two minutes of markers every 2 s; the offset jumps from 0 to +100 ms halfway."""
    fps, chunk = 25.0, 320
    est = ev.AVOffsetEstimator(window_s=6.0)
    rng = np.random.default_rng(1)
    sizes = []
    k = 0
    for block in range(60):  # 2 s blocks
        t0 = 2.0 * block
        offset = 0.0 if t0 < 60 else 0.100
        marker = t0 + 0.5 + rng.uniform(0, 0.04)
        audio = rng.normal(0, 0.01, int(2.0 * SAMPLE_RATE)).astype(np.float32)
        audio = testmedia.add_clicks(audio, [marker - t0])
        levels = testmedia.flash_exposure(marker + offset, 10**9, fps)
        for i in range(0, len(audio), chunk):
            t = t0 + i / SAMPLE_RATE
            while k / fps <= t:
                est.push_visual(ev.VisualObservation(k / fps, None, levels.get(k, 0.0)))
                k += 1
            est.push_audio(AudioChunk(t, audio[i : i + chunk]))
        sizes.append(est.memory_items())
        if block == 25:
            mid = est.estimate()
    end = est.estimate()
    assert mid.source == "markers" and abs(mid.offset_s) < 0.002
    assert end.source == "markers" and abs(end.offset_s - 0.100) < 0.002
    assert end.n_markers <= 4, "only the markers inside the 6 s window count"
    ring = int((6.0 + est.max_lag_s) * SAMPLE_RATE)
    assert max(sizes) <= ring + 6.0 * fps + 1 + 16 * 2 + 32, f"memory grew: {sizes}"
    assert max(sizes[5:]) - min(sizes[5:]) <= 3, f"memory not steady once the window is full: {sizes}"


def test_audio_ring_keeps_the_latest_window_and_fills_gaps():
    ring = ev._AudioRing(100)
    ring.append(1.0, np.arange(60, dtype=np.float32))
    gap_pts = 1.0 + 80 / SAMPLE_RATE  # 20 samples missing
    ring.append(gap_pts, np.arange(60, 90, dtype=np.float32))
    t0, held = ring.view()
    assert len(held) == 100 and t0 == pytest.approx(1.0 + 10 / SAMPLE_RATE)
    assert np.all(held[50:70] == 0)  # the gap became silence
    assert held[-1] == 89 and held[0] == 10
