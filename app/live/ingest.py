"""Ingest: the client's camera and microphone tracks, read onto the session clock.

Each incoming track gets its clock (``alignment.clock``) fed from its receiver's RTP and RTCP
(``app.live.webrtc``) and a jitter buffer that releases media without aiortc's extra wait
(``app.live.jitter``). The read loops hand every decoded frame on with its session time: camera
frames as they are, audio resampled to the ASR's 16 kHz mono with continuous pts.

Each receiver is guarded before decoding (``app.live.limits``: bitrate, key-frame size, garbage) and
camera frames are capped in rate and size after it, so a sender costs no more than a 720p 30 fps
camera whatever it sends; a sender cut off by a guard gets an ``error`` event and its session closes.
An Opus decoder's output starts with the encoder's look-ahead (:data:`OPUS_LOOKAHEAD_S`), so audio
is read that much earlier than its RTP timestamp says.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Protocol

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCRtpReceiver
from aiortc.mediastreams import MediaStreamError

from alignment.clock import SessionClock, TrackClock
from alignment.types import SAMPLE_RATE
from app.live import jitter
from app.live.limits import AUDIO_MAX_KBPS, FrameCap, ReceiverGuard
from app.live.output import VIDEO_CLOCK
from app.live.stages import SessionConfig, Stage
from app.live.webrtc import hook_receiver, set_origin

AUDIO_CLOCK = 48_000
#: Largest camera frame a session keeps (1080p). The session holds ~2 s of decoded frames for
#: rendering, so a peer sending absurd sizes would otherwise grow the whole server's memory.
MAX_VIDEO_PIXELS = 1920 * 1088
#: libopus's encoder look-ahead at 48 kHz (``OPUS_GET_LOOKAHEAD``: 2.5 ms of analysis plus 4 ms
#: of delay compensation, 312 samples, in its VOIP and AUDIO modes, which browsers and aiortc use;
#: the Ogg mapping calls it pre-skip). RTP carries no pre-skip, so a decoder emits it as a delay.
OPUS_LOOKAHEAD_S = 312 / AUDIO_CLOCK
#: Decoded sample rate -> the codec's delay to take off. aiortc decodes only Opus at 48 kHz (G.711
#: at 8 kHz and G.722 at 16 kHz, whose few-sample filter delays are left alone).
CODEC_DELAY_S = {AUDIO_CLOCK: OPUS_LOOKAHEAD_S}
REANCHOR_S = 0.02  # audio pts further than this from the running sample count: a gap or clock step


@dataclass(frozen=True)
class _Size:
    """The size of a frame skipped before decoding (what ``MediaSink.oversized`` reads of a frame)."""

    width: int
    height: int


class MediaRejected(ValueError):
    """A sender whose media the server will not take (the message says why)."""


class MediaSink(Protocol):
    """Where the read loops hand what they read (the session)."""

    config: SessionConfig

    def fail_stage(self, stage: Stage, exc: BaseException) -> None: ...
    def spawn(self, coro: Coroutine[object, object, None], name: Stage) -> asyncio.Task[None]: ...
    async def close(self, reason: str) -> None: ...
    def media_arrived(self, wall: float) -> None: ...
    def oversized(self, frame: av.VideoFrame) -> None: ...
    def camera_frame(self, t: float, frame: av.VideoFrame, arrival: float) -> None: ...
    def audio(self, pts: float, samples: np.ndarray) -> None: ...


def open_track(pc: RTCPeerConnection, clock: SessionClock,
               track: MediaStreamTrack) -> tuple[TrackClock, RTCRtpReceiver | None]:
    """The track's clock and receiver, its RTP/RTCP feeding that clock and its jitter buffer installed."""
    receiver = next((t.receiver for t in pc.getTransceivers() if t.receiver.track is track), None)
    if receiver is None:
        receiver = next((t.receiver for t in pc.getTransceivers()
                         if t.kind == track.kind and t.receiver.track is None), None)
    tclock = clock.track(track.kind, VIDEO_CLOCK if track.kind == "video" else AUDIO_CLOCK)
    if receiver is not None:
        hook_receiver(receiver, tclock)
        jitter.install(receiver)  # video at its marker bit, audio without aiortc's 80 ms prefetch
    return tclock, receiver


async def _receive(track: MediaStreamTrack, tclock: TrackClock, receiver: RTCRtpReceiver | None,
                   sink: MediaSink) -> tuple[av.AudioFrame | av.VideoFrame, float, float]:
    """The track's next frame, its session time and its arrival (monotonic s), reported to ``sink``."""
    frame = await track.recv()
    arrival = time.monotonic()
    sink.media_arrived(arrival)
    set_origin(receiver, tclock)
    return frame, tclock.time(int(frame.pts), arrival), arrival


def reject(sink: MediaSink, stage: Stage, message: str) -> None:
    """Tell the client why its media is refused (an ``error`` event), then close its session."""
    sink.fail_stage(stage, MediaRejected(message))

    async def close_soon() -> None:
        await asyncio.sleep(0.5)  # the error event leaves on the data channel before it closes
        await sink.close(f"media rejected: {message}")

    sink.spawn(close_soon(), Stage.CLOSE)


def guard(receiver: RTCRtpReceiver | None, kind: str, sink: MediaSink) -> ReceiverGuard | None:
    """Bound what ``receiver`` passes on (``app.live.limits``); a sender cut off closes its session."""
    if not isinstance(receiver, RTCRtpReceiver):
        return None
    config = sink.config
    stage = Stage.VIDEO_IN if kind == "video" else Stage.AUDIO_IN

    def too_large(width: int, height: int) -> None:  # as a decoded frame that large would be: dropped, reported
        sink.oversized(_Size(width, height))  # type: ignore[arg-type]

    max_kbps = config.max_bitrate_kbps if kind == "video" else AUDIO_MAX_KBPS
    return ReceiverGuard(receiver, kind, max_kbps, MAX_VIDEO_PIXELS, lambda why: reject(sink, stage, why), too_large)


async def read_video(track: MediaStreamTrack, tclock: TrackClock, receiver: RTCRtpReceiver | None,
                     sink: MediaSink) -> None:
    """Camera frames to ``sink`` until the track ends: capped in rate and size (oversized ones are
    reported, not kept)."""
    guard(receiver, "video", sink)
    config = getattr(sink, "config", None) or SessionConfig()
    cap = FrameCap(config.max_video_size, config.max_video_fps)
    try:
        while True:
            frame, t, arrival = await _receive(track, tclock, receiver, sink)
            if frame.width * frame.height > MAX_VIDEO_PIXELS:
                sink.oversized(frame)
                continue
            if not cap.take(t):
                continue
            sink.camera_frame(t, cap.fit(frame), arrival)
    except MediaStreamError:
        return


async def read_audio(track: MediaStreamTrack, tclock: TrackClock, receiver: RTCRtpReceiver | None,
                     sink: MediaSink) -> None:
    """Microphone audio to ``sink`` as 16 kHz mono float32 with continuous pts, until the track ends."""
    guard(receiver, "audio", sink)
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    anchor: float | None = None  # session time of output sample 0
    produced = 0
    try:
        while True:
            frame, t, _arrival = await _receive(track, tclock, receiver, sink)
            if receiver is not None:  # decoded from RTP (in-process replays hand on raw PCM)
                t -= CODEC_DELAY_S.get(frame.sample_rate, 0.0)
            out = np.concatenate([f.to_ndarray().reshape(-1) for f in resampler.resample(frame)] or
                                 [np.zeros(0, np.float32)])
            expected = None if anchor is None else anchor + produced / SAMPLE_RATE
            if expected is None or abs(expected - t) > REANCHOR_S:  # start, or a gap/clock step: re-anchor
                anchor, produced = t, 0
            pts = anchor + produced / SAMPLE_RATE
            produced += len(out)
            if out.size:
                sink.audio(pts, out.astype(np.float32, copy=False))
    except MediaStreamError:
        return
