"""Decoding recorded media onto one session clock, and writing the annotated output.

Audio becomes 16 kHz mono float32; video frames become RGB arrays with pts in seconds. The
session clock's zero is the earliest presentation time of any decoded stream, so audio and video
keep their recorded relative offset (what the file says is what we check).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from alignment.types import SAMPLE_RATE, VideoFrame


class MediaError(ValueError):
    """The input cannot be analysed at all; the message is one line meant for the user."""


@dataclass(frozen=True)
class DecodedMedia:
    """A recording decoded onto the session clock."""

    path: Path
    audio: np.ndarray = field(repr=False)  # 16 kHz mono float32, sample 0 at ``audio_pts``
    audio_pts: float
    frames: tuple[VideoFrame, ...] = field(repr=False)
    video_fps: float
    has_audio: bool
    has_video: bool

    @property
    def duration(self) -> float:
        audio_end = self.audio_pts + len(self.audio) / SAMPLE_RATE if self.has_audio else 0.0
        video_end = self.frames[-1].pts + 1.0 / self.video_fps if self.frames else 0.0
        return max(audio_end, video_end)


def _stream_start(stream: av.stream.Stream) -> float | None:
    if stream.start_time is None or stream.time_base is None:
        return None
    return float(stream.start_time * stream.time_base)


class MonoResampler:
    """16 kHz mono float frames from audio frames of any format, even one that changes mid-stream
    (corrupt files do that; one ``av.AudioResampler`` takes a single input format and raises)."""

    def __init__(self) -> None:
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        self._input: tuple[str, str, int] | None = None

    def resample(self, frame: av.AudioFrame | None) -> list[av.AudioFrame]:
        """Resampled frames for ``frame``; None flushes what the resampler still holds."""
        if frame is None:
            return list(self._resampler.resample(None))
        key = (frame.format.name, frame.layout.name, frame.sample_rate)
        out: list[av.AudioFrame] = []
        if self._input is not None and key != self._input:
            out = list(self._resampler.resample(None))
            self._resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        self._input = key
        return out + list(self._resampler.resample(frame))


def decode_media(path: str | Path, max_width: int = 960) -> DecodedMedia:
    """Decode ``path`` fully; raise MediaError with a one-line reason when it is not usable media.

    Frames wider than ``max_width`` are downscaled (face tracking and rendering need no more).
    """
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise MediaError(f"{path}: empty file (0 bytes)")
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        raise MediaError(f"{path}: not a readable media file ({exc.__class__.__name__})") from None
    with container:
        astreams = list(container.streams.audio[:1])
        vstreams = list(container.streams.video[:1])
        if not astreams and not vstreams:
            raise MediaError(f"{path}: contains no audio or video stream")
        starts = [s for s in (_stream_start(st) for st in astreams + vstreams) if s is not None]
        zero = min(starts) if starts else 0.0
        audio_parts: list[np.ndarray] = []
        audio_pts: float | None = None
        frames: list[VideoFrame] = []
        resampler = MonoResampler()
        try:
            for packet in container.demux(*(astreams + vstreams)):
                for frame in packet.decode():
                    if isinstance(frame, av.AudioFrame):
                        for out in resampler.resample(frame):
                            if audio_pts is None:
                                audio_pts = _frame_time(out, frame) - zero
                            audio_parts.append(out.to_ndarray().reshape(-1))
                    elif isinstance(frame, av.VideoFrame):
                        frames.append(VideoFrame(_frame_time(frame, frame) - zero, _to_rgb(frame, max_width)))
            for out in resampler.resample(None):
                audio_parts.append(out.to_ndarray().reshape(-1))
        except av.error.FFmpegError as exc:
            if not audio_parts and not frames:
                raise MediaError(f"{path}: cannot decode ({exc.__class__.__name__}: {exc})") from None
            # A truncated tail: keep what decoded; the report says what it covers.
        fps = float(vstreams[0].average_rate) if vstreams and vstreams[0].average_rate else 0.0
    audio = np.concatenate(audio_parts).astype(np.float32) if audio_parts else np.zeros(0, np.float32)
    if not len(audio) and not frames:
        raise MediaError(f"{path}: no decodable audio or video (zero-length media)")
    if frames and not fps:
        span = frames[-1].pts - frames[0].pts
        fps = (len(frames) - 1) / span if span > 0 else 25.0
    return DecodedMedia(
        path=path,
        audio=audio,
        audio_pts=max(audio_pts or 0.0, 0.0),
        frames=tuple(frames),
        video_fps=fps,
        has_audio=len(audio) > 0,
        has_video=bool(frames),
    )


def _frame_time(frame: av.frame.Frame, source: av.frame.Frame) -> float:
    pts, base = (frame.pts, frame.time_base) if frame.pts is not None else (source.pts, source.time_base)
    if pts is None or base is None:
        return 0.0
    return float(pts * base)


def _to_rgb(frame: av.VideoFrame, max_width: int) -> np.ndarray:
    if frame.width > max_width:
        height = int(round(frame.height * max_width / frame.width / 2) * 2)
        frame = frame.reformat(width=max_width, height=height)
    return frame.to_ndarray(format="rgb24")


def write_annotated(
    path: str | Path, frames: Iterator[np.ndarray], fps: int, audio: np.ndarray | None, audio_pts: float = 0.0
) -> Path:
    """Encode RGB frames (H.264, yuv420p) at ``fps`` with the original audio (AAC) muxed in.

    Audio is placed at ``audio_pts`` on the same clock as frame 0 (pts 0), so the file keeps the
    analysed alignment.
    """
    path = Path(path)
    with av.open(str(path), "w", format="mp4") as container:
        vstream = container.add_stream("libx264", rate=Fraction(fps, 1))
        vstream.pix_fmt = "yuv420p"
        vstream.options = {"preset": "veryfast", "crf": "26"}
        astream = None
        if audio is not None and len(audio):
            astream = container.add_stream("aac", rate=SAMPLE_RATE)
            astream.layout = "mono"
        started = False
        for k, img in enumerate(frames):
            if not started:
                vstream.width, vstream.height = img.shape[1], img.shape[0]
                started = True
            vf = av.VideoFrame.from_ndarray(img, format="rgb24")
            vf.pts = k
            vf.time_base = Fraction(1, fps)
            container.mux(vstream.encode(vf))
        container.mux(vstream.encode())
        if astream is not None and audio is not None:
            offset = int(round(audio_pts * SAMPLE_RATE))
            block = 1024
            for i in range(0, len(audio), block):
                af = av.AudioFrame.from_ndarray(audio[None, i : i + block].astype(np.float32), format="flt",
                                                layout="mono")
                af.sample_rate = SAMPLE_RATE
                af.pts = offset + i
                af.time_base = Fraction(1, SAMPLE_RATE)
                container.mux(astream.encode(af))
            container.mux(astream.encode())
    return path
