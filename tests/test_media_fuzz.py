"""Truncated, corrupt and mislabelled media never crash decoding: a usable result or a one-line MediaError."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alignment.types import SAMPLE_RATE
from app.loadtest import testmedia
from app.offline.media_io import DecodedMedia, MediaError, MonoResampler, decode_media


@pytest.fixture(scope="module")
def media_bytes(tmp_path_factory) -> dict[str, bytes]:
    clip = testmedia.make_av_clip(text="short clip", lead_in_s=0.2, tail_s=0.2, size=(160, 96))
    out = {}
    for ext in ("mp4", "mkv", "mov"):
        path = testmedia.write_av_file(tmp_path_factory.mktemp("m") / f"c.{ext}", clip)
        out[ext] = path.read_bytes()
    return out


def _decode_or_error(tmp_path, data: bytes, name: str) -> DecodedMedia | None:
    path = tmp_path / name
    path.write_bytes(data)
    try:
        media = decode_media(path)
    except MediaError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg
        return None
    assert media.has_audio or media.has_video
    assert np.isfinite(media.audio).all()
    assert all(f.image.ndim == 3 and f.image.shape[2] == 3 for f in media.frames)
    return media


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ext=st.sampled_from(["mp4", "mkv", "mov"]), cut=st.floats(0.0, 1.0))
def test_truncated_files(tmp_path, media_bytes, ext, cut):
    data = media_bytes[ext]
    _decode_or_error(tmp_path, data[: int(len(data) * cut)], f"t.{ext}")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ext=st.sampled_from(["mp4", "mkv"]), seed=st.integers(0, 2**31 - 1), flips=st.integers(1, 200))
def test_corrupted_bytes(tmp_path, media_bytes, ext, seed, flips):
    data = bytearray(media_bytes[ext])
    rng = np.random.default_rng(seed)
    for i in rng.integers(0, len(data), flips):
        data[int(i)] = int(rng.integers(0, 256))
    _decode_or_error(tmp_path, bytes(data), f"c.{ext}")


def test_truncated_mkv_keeps_what_decoded(tmp_path, media_bytes):
    data = media_bytes["mkv"]
    media = _decode_or_error(tmp_path, data[: len(data) * 2 // 3], "half.mkv")
    assert media is not None and (media.frames or len(media.audio))


def _wav_bytes() -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as wf:
        wf.setnchannels(2)
        wf.setsampwidth(2)
        wf.setframerate(44100)
        wf.writeframes((np.sin(np.arange(44100) / 10) * 8000).astype(np.int16).repeat(2).tobytes())
    return buf.getvalue()


def test_wrong_containers(tmp_path):
    from PIL import Image

    png = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(png, format="PNG")
    # A WAV named .mp4 is still audio: decoded, resampled to 16 kHz mono.
    media = _decode_or_error(tmp_path, _wav_bytes(), "audio.mp4")
    assert media is not None and media.has_audio and not media.has_video
    assert abs(len(media.audio) / 16000 - 1.0) < 0.01
    # A still image is a one-frame video, not a crash.
    media = _decode_or_error(tmp_path, png.getvalue(), "still.mp4")
    assert media is None or media.has_video
    for name, blob in [("zip.mp4", b"PK\x03\x04" + bytes(200)), ("text.mkv", b"hello\n" * 100)]:
        assert _decode_or_error(tmp_path, blob, name) is None


def test_audio_that_changes_format_mid_stream_is_resampled():
    """A corrupt file's audio can change format mid-stream (a CI fuzz run hit it: PyAV's resampler
    raised ValueError); MonoResampler starts a new resampler and loses no samples."""
    import av

    def frame(layout: str, rate: int, seconds: float) -> av.AudioFrame:
        n = int(rate * seconds)
        channels = 2 if layout == "stereo" else 1
        data = np.full((1, n * channels), 0.25, np.float32)  # packed flt
        f = av.AudioFrame.from_ndarray(data, format="flt", layout=layout)
        f.sample_rate = rate
        return f

    rs = MonoResampler()
    parts = [rs.resample(frame("stereo", 44100, 0.5)), rs.resample(frame("mono", 22050, 0.5)),
             rs.resample(frame("stereo", 48000, 0.5)), rs.resample(None)]
    samples = np.concatenate([o.to_ndarray().reshape(-1) for p in parts for o in p])
    assert abs(len(samples) - int(1.5 * SAMPLE_RATE)) <= 3 * 64
    assert np.isfinite(samples).all() and float(np.abs(samples).max()) > 0.1
