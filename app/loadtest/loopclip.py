"""The clip every peer sends, built once per worker: looped seamlessly, optionally pre-encoded.

Pre-encoding (VP8 and Opus once per worker) keeps the load generator's own CPU small, so more of the
machine is left to the server under test.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from alignment.espeak import Speech
    from app.loadtest.testmedia import AVClip


def make_loop_clip(text: str, offset_ms: float, size: tuple[int, int], fps: float, voice: str | None = None,
                   mic_noise_dbfs: float | None = None) -> AVClip:
    """A talking-face clip with sync markers whose audio and video loop seamlessly.

    ``voice``: an espeak-ng voice or ``festival:<voice>``; by default the load test's
    (``app.loadtest.config.DEFAULT_VOICE``, festival's kal_diphone: not the answers' voice).
    ``mic_noise_dbfs``: a white noise floor at that RMS level over the whole loop, as a live mic carries
    (``app.loadtest.config.DEFAULT_MIC_NOISE_DBFS``); none: digital silence around the speech.

    Its duration is a whole number of video frames and of 20 ms audio frames, so looping it never
    drifts audio against video. Markers: one in the lead-in, one in the tail, each at the start of
    a frame's exposure cell, so a clean clip's flash lights exactly one frame fully.
    """
    from alignment.types import SAMPLE_RATE
    from app.loadtest import testmedia
    from app.loadtest.config import DEFAULT_VOICE

    step = int(SAMPLE_RATE / fps)  # samples per video frame (640 at 25 fps: also 2 × 20 ms)
    speech = testmedia.speak(text, voice or DEFAULT_VOICE, lead_in_s=0.6)
    speech = _gate_pauses(speech)
    total = int(np.ceil((len(speech.samples) + 0.6 * SAMPLE_RATE) / step) * step)
    tail_s = (total - len(speech.samples) + 0.5) / SAMPLE_RATE
    half = 0.5 / fps
    markers = (round(6 / fps - half, 6), round((total - 8 * step) / SAMPLE_RATE - half, 6))  # 0.22 s, end − 0.34 s
    clip = testmedia.make_av_clip(text, fps=fps, size=size, lead_in_s=0.6, tail_s=tail_s, markers=markers,
                                  av_offset_s=offset_ms / 1000.0, speech=speech)
    audio = clip.audio[:total]
    if len(audio) < total:
        audio = np.concatenate([audio, np.zeros(total - len(audio), np.float32)])
    if mic_noise_dbfs is not None:
        noise = np.random.default_rng(0).standard_normal(total) * 10 ** (mic_noise_dbfs / 20)
        audio = (audio + noise).astype(np.float32)
    n_frames = total // step
    frames = list(clip.frames[:n_frames])
    while len(frames) < n_frames:
        frames.append(frames[-1])
    return replace(clip, audio=audio, frames=frames)


def _gate_pauses(speech: Speech) -> Speech:
    """The speech with the synthesizer's leading and trailing pause set to digital silence.

    festival's pauses hiss at about -60 dBFS; after the clip's digitally silent lead-in that step reads
    as the utterance's acoustic onset (``alignment.onsets``) 200+ ms before its first word's sound, and
    every loop's first word would fail its Level-3 onset check. The sound kept is also within festival's
    first and last phone: kal_diphone's pause before a /w/ holds 200 ms of rumble at -39 dBFS, loud enough
    to pass the level test. espeak-ng's pauses are silent already.
    """
    from alignment.types import SAMPLE_RATE
    from app.loadtest.answers import speech_span

    x = np.array(speech.samples, np.float32)
    span = speech_span(x, SAMPLE_RATE, within=speech.phones)
    if span is None:
        return speech
    first, stop = span
    margin = SAMPLE_RATE // 100
    x[: max(first - margin, 0)] = 0.0
    x[stop + margin :] = 0.0
    return replace(speech, samples=x)


def encode_vp8_loop(frames: list[np.ndarray], fps: float, bitrate: int = 800_000, gop: int = 25) -> list[bytes]:
    """The clip's frames encoded once as VP8 (a keyframe every ``gop`` frames, the first one too).

    ``--pre-encode`` sends these instead of encoding every frame per peer, so the load generator's
    own CPU stays small beside the server's; ``--no-pre-encode`` encodes per frame and answers
    keyframe requests, as a real client does.
    """
    import av

    ctx = av.CodecContext.create("libvpx", "w")
    h, w = frames[0].shape[:2]
    ctx.width, ctx.height, ctx.pix_fmt = w, h, "yuv420p"
    ctx.time_base = Fraction(1, int(round(fps)))
    ctx.framerate = Fraction(int(round(fps)), 1)
    ctx.bit_rate, ctx.gop_size, ctx.thread_count = bitrate, gop, 1
    ctx.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0", "auto-alt-ref": "0"}
    packets = []
    for i, img in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
        frame.pts = i
        packets += ctx.encode(frame)
    packets += ctx.encode(None)
    if len(packets) != len(frames) or not packets[0].is_keyframe:
        raise RuntimeError(f"VP8 pre-encoding gave {len(packets)} packets for {len(frames)} frames")
    return [bytes(p) for p in packets]


def encode_opus_loop(samples16k: np.ndarray) -> list[bytes]:
    """The clip's audio as the 20 ms Opus packets aiortc's sender would make of it, once.

    Encoded by aiortc's own ``OpusEncoder`` over three passes of the loop; the middle pass's packets
    are kept (packet k carries clip frame k), so the encoder state runs on across the loop point
    as it does for a peer that encodes live.
    """
    import av
    from aiortc.codecs.opus import OpusEncoder

    from app.loadtest.peer import AUDIO_FRAME, AUDIO_RATE, ClipAudioTrack

    pcm = ClipAudioTrack(samples16k, None)._pcm  # type: ignore[arg-type]
    n = len(pcm) // AUDIO_FRAME
    if n < 1 or n * AUDIO_FRAME != len(pcm):
        raise ValueError(f"the loop must be whole 20 ms frames ({len(pcm)} samples at 48 kHz)")
    encoder = OpusEncoder()
    by_frame: dict[int, bytes] = {}
    for i in range(3 * n):
        chunk = pcm[(i % n) * AUDIO_FRAME : (i % n + 1) * AUDIO_FRAME]
        frame = av.AudioFrame.from_ndarray(chunk[None, :], format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = AUDIO_RATE, i * AUDIO_FRAME, Fraction(1, AUDIO_RATE)
        payloads, ts = encoder.encode(frame)
        for j, payload in enumerate(payloads):
            by_frame[ts // AUDIO_FRAME + j] = payload
    packets = [by_frame.get(n + k) for k in range(n)]
    if any(p is None for p in packets):
        raise RuntimeError("Opus pre-encoding lost frames of the loop")
    return packets  # type: ignore[return-value]
