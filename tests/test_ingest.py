"""Ingest's audio times: decoded Opus is read at the instant the sender captured it."""

from __future__ import annotations

import asyncio
import fractions

import av
import numpy as np
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError

from alignment.clock import SessionClock
from alignment.types import SAMPLE_RATE
from app.live.ingest import AUDIO_CLOCK, OPUS_LOOKAHEAD_S, read_audio

FRAME = 960  # 20 ms at 48 kHz, as WebRTC senders packetise Opus


def _opus_round_trip(pcm: np.ndarray) -> list[av.AudioFrame]:
    """``pcm`` (48 kHz s16 mono) through aiortc's Opus encoder and decoder, frame by frame, each
    decoded frame stamped with its packet's RTP timestamp as a receiver sees it."""
    enc, dec = OpusEncoder(), OpusDecoder()
    out = []
    for n in range(0, len(pcm) - FRAME + 1, FRAME):
        frame = av.AudioFrame.from_ndarray(pcm[None, n : n + FRAME], format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = AUDIO_CLOCK, n, fractions.Fraction(1, AUDIO_CLOCK)
        payloads, ts = enc.encode(frame)
        for p in payloads:
            for d in dec.decode(JitterFrame(data=p, timestamp=ts)):
                d.pts = ts
                out.append(d)
    return out


class _Track:
    kind = "audio"

    def __init__(self, frames: list[av.AudioFrame]) -> None:
        self._frames = list(frames)

    async def recv(self) -> av.AudioFrame:
        if not self._frames:
            raise MediaStreamError
        return self._frames.pop(0)


class _Sink:
    def __init__(self) -> None:
        self.chunks: list[tuple[float, np.ndarray]] = []

    def media_arrived(self, wall: float) -> None: ...
    def oversized(self, frame: av.VideoFrame) -> None: ...
    def camera_frame(self, t: float, frame: av.VideoFrame, arrival: float) -> None: ...

    def audio(self, pts: float, samples: np.ndarray) -> None:
        self.chunks.append((pts, samples))


def test_opus_delays_decoded_audio_by_the_encoders_lookahead():
    """The mechanism behind the correction: a click sent at RTP time t comes out of the decoder
    312 samples (6.5 ms) after t."""
    pcm = np.zeros(AUDIO_CLOCK // 2, np.int16)
    click = 4800 + 123  # 100 ms in, off the frame grid
    pcm[click : click + 48] = 20000
    decoded = np.concatenate([f.to_ndarray().reshape(-1, 2)[:, 0] for f in _opus_round_trip(pcm)])
    found = int(np.argmax(np.abs(np.correlate(decoded.astype(float), pcm[click - 96 : click + 144].astype(float),
                                              "valid")))) + 96
    assert abs((found - click) / AUDIO_CLOCK - OPUS_LOOKAHEAD_S) <= 2 / AUDIO_CLOCK, found - click


def test_ingest_reads_opus_audio_at_its_capture_time():
    """A click at clip time 0.3 s is at session time 0.3 s (± a sample at 16 kHz) in what ingest
    hands on, not the codec's look-ahead later."""
    pcm = np.zeros(AUDIO_CLOCK, np.int16)
    click = int(0.3 * AUDIO_CLOCK)
    pcm[click : click + 48] = 20000
    clock = SessionClock()
    tclock = clock.track("audio", AUDIO_CLOCK)
    sink = _Sink()
    receiver = object()  # as from an RTP receiver (one with no aiortc state to read)
    asyncio.run(read_audio(_Track(_opus_round_trip(pcm)), tclock, receiver, sink))  # type: ignore[arg-type]
    pts0 = sink.chunks[0][0]
    audio = np.concatenate([s for _, s in sink.chunks])
    onset = pts0 + int(np.argmax(np.abs(audio) > 0.3)) / SAMPLE_RATE
    assert abs(onset - 0.3) <= 1.5 / SAMPLE_RATE, onset
