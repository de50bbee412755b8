"""WhipPeer's media tracks: 20 ms audio frames at 48 kHz and clip-rate video, paced in real time."""

from __future__ import annotations

import time

import numpy as np
import pytest

from app.loadtest.peer import AUDIO_FRAME, AUDIO_RATE, VIDEO_CLOCK, ClipAudioTrack, ClipVideoTrack, _Start


async def test_audio_track_sends_20ms_frames_with_sample_pts_in_real_time():
    t = np.arange(16_000) / 16_000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    track = ClipAudioTrack(tone, _Start())
    frames = [await track.recv() for _ in range(15)]
    assert [f.pts for f in frames] == [i * AUDIO_FRAME for i in range(15)]
    assert all(f.samples == AUDIO_FRAME and f.sample_rate == AUDIO_RATE for f in frames)
    wall = track._start.wall
    assert time.monotonic() - wall >= 14 * 0.020 - 0.005  # paced, not as fast as possible
    pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32) / 32767
    spectrum = np.abs(np.fft.rfft(pcm))
    assert abs(np.argmax(spectrum) * AUDIO_RATE / len(pcm) - 440) < 5  # the tone survived resampling
    track.stop()


async def test_video_track_uses_clip_fps_and_records_send_times():
    frames = [np.full((36, 64, 3), v, np.uint8) for v in (0, 80, 160)]
    start = _Start()
    track = ClipVideoTrack(frames, 25.0, start)
    out = [await track.recv() for _ in range(5)]
    assert [f.pts for f in out] == [round(i / 25 * VIDEO_CLOCK) for i in range(5)]
    # after the clip ends the last frame repeats (a still camera)
    assert out[4].to_ndarray(format="rgb24").mean() == pytest.approx(out[2].to_ndarray(format="rgb24").mean(), abs=2)
    assert [round(t, 3) for t, _ in track.sent] == [0.0, 0.04, 0.08, 0.12, 0.16]
    sent_at = [w for _, w in track.sent]
    assert sent_at[-1] - sent_at[0] >= 0.16 - 0.01
    track.stop()


def test_video_track_needs_frames():
    with pytest.raises(ValueError, match="at least one frame"):
        ClipVideoTrack([], 25.0, _Start())


async def test_pre_encoding_peer_sends_only_the_encoded_tracks(monkeypatch):
    """The load-test peer replays pre-encoded packets at the clip's rates, and never builds the raw
    tracks (48 kHz PCM, YUV frames) it would not send."""
    from app.loadtest import drive, peer

    def unexpected(*args: object, **kwargs: object) -> None:
        raise AssertionError("a raw track was built")

    monkeypatch.setattr(peer, "ClipAudioTrack", unexpected)
    monkeypatch.setattr(peer, "ClipVideoTrack", unexpected)
    frames = [np.zeros((36, 64, 3), np.uint8)] * 3
    p = drive._make_peer_class()("http://127.0.0.1:9/whip", audio=np.zeros(1600, np.float32), frames=frames,
                                 fps=30.0, vp8_packets=[b"v0", b"v1"], opus_packets=[b"a0"])
    try:
        assert (p.video_track.kind, p.video_track._fps, p.audio_track.kind, p.audio_track._fps) == \
            ("video", 30.0, "audio", 50.0)
        sent = [await p.video_track.recv() for _ in range(3)]
        assert [bytes(s) for s in sent] == [b"v0", b"v1", b"v0"]
        assert [s.pts for s in sent] == [0, 3000, 6000]
    finally:
        await p.pc.close()


def test_warm_http_client_builds_the_shared_tls_context_once():
    from app.loadtest import peer

    peer.warm_http_client()
    assert peer._tls_context() is peer._tls_context()
