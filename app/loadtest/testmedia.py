"""Generated media with known ground truth: speech with exact word onsets, a talking face, sync markers.

Used by the tests, the benchmarks and the load-test peers, so every timing claim can be checked
against a truth the pipeline did not produce itself:

* speech from libespeak-ng (``alignment.espeak``, re-exported here), with its word events as
  exact word onsets;
* a face video made from a portrait that matplotlib ships (Grace Hopper, public domain), whose
  mouth opens with the speech envelope, so lip motion carries real audio-visual evidence
  (``app.talking_face``, re-exported here);
* broadcast-style sync markers: a white flash in the video and a 1 kHz click in the audio at
  the same instants, optionally with a deliberately injected audio/video offset.
"""

from __future__ import annotations

import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from alignment import clicks as _clicks
from alignment import evidence as _evidence
from alignment.espeak import (
    EspeakUnavailable,
    Speech,
    TimedWord,
    resample,
    synthesize_speech,
    synthesize_speech_fresh,
)
from alignment.types import SAMPLE_RATE
from app.talking_face import portrait, talking_face_frames

__all__ = [  # re-exported
    "EspeakUnavailable", "Speech", "TimedWord", "portrait", "resample", "synthesize_speech",
    "synthesize_speech_fresh", "talking_face_frames",
]


def add_noise(samples: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    """White noise at ``snr_db`` relative to the power of the active (non-silent) samples."""
    rng = np.random.default_rng(seed)
    active = samples[np.abs(samples) > 1e-4]
    power = float(np.mean(active**2)) if active.size else 1e-6
    noise = rng.normal(0.0, np.sqrt(power / 10 ** (snr_db / 10)), samples.shape)
    return (samples + noise).astype(np.float32)


# --- video ----------------------------------------------------------------------------------

def speech_envelope(samples: np.ndarray, times: np.ndarray, window_s: float = 0.04) -> np.ndarray:
    """RMS of the audio in a window centred on each time, normalised to [0, 1]."""
    half = int(window_s * SAMPLE_RATE / 2)
    idx = (times * SAMPLE_RATE).astype(int)
    env = np.array(
        [np.sqrt(np.mean(samples[max(i - half, 0) : i + half] ** 2)) if 0 <= i < len(samples) else 0.0
         for i in idx]
    )
    peak = env.max() if env.size and env.max() > 0 else 1.0
    return np.clip(env / peak, 0.0, 1.0)


# --- sync markers ---------------------------------------------------------------------------
# The marker spec (and its detector) lives in alignment.evidence; this is the generator side.

CLICK_HZ = _clicks.CLICK_HZ
CLICK_S = _clicks.CLICK_S
FLASH_FRAMES = 1  # the light pulse lasts exactly one frame period


def add_clicks(
    samples: np.ndarray, times: list[float], amplitude: float = _clicks.CLICK_AMPLITUDE
) -> np.ndarray:
    """Mix a 10 ms 1 kHz tone burst starting at each time into ``samples``."""
    out = samples.copy()
    n = int(round(CLICK_S * SAMPLE_RATE))
    burst = amplitude * np.sin(2 * np.pi * CLICK_HZ * np.arange(n) / SAMPLE_RATE).astype(np.float32)
    for t in times:
        i = int(round(t * SAMPLE_RATE))
        if 0 <= i < len(out):
            seg = out[i : i + n]
            seg += burst[: len(seg)]
    return np.clip(out, -1.0, 1.0)


def add_marker_box(frame: np.ndarray) -> np.ndarray:
    """A frame with the (unlit, black) marker patch in its top-left corner."""
    return add_flash(frame, 0.0)


def add_flash(frame: np.ndarray, level: float = 1.0) -> np.ndarray:
    """A frame whose top-left marker patch is lit to ``level`` (0 black … 1 white).

    ``level`` is the fraction of the frame's exposure during which the flash was on, so a flash
    that starts between two frames shows in both with brightness that encodes its phase.
    """
    out = frame.copy()
    side = _evidence.flash_patch_side(frame.shape[0])
    out[:side, :side] = int(round(float(np.clip(level, 0.0, 1.0)) * 255))
    return out


def flash_exposure(onset: float, n_frames: int, fps: float) -> dict[int, float]:
    """Exposure fraction of each frame lit by a one-period light pulse starting at ``onset`` (s).

    Frame k integrates light over its cell ``[k/fps - T/2, k/fps + T/2)`` with ``T = 1/fps``.
    """
    period = 1.0 / fps
    out: dict[int, float] = {}
    first = int(np.floor(onset * fps - 0.5))
    for k in range(first, first + 3):
        lo, hi = max(k * period - period / 2, onset), min(k * period + period / 2, onset + period)
        if hi > lo and 0 <= k < n_frames:
            out[k] = (hi - lo) / period
    return out


@dataclass(frozen=True)
class AVClip:
    """A generated audio+video clip with everything a test needs to know about it."""

    audio: np.ndarray = field(repr=False)
    frames: list[np.ndarray] = field(repr=False)
    fps: float
    words: tuple[TimedWord, ...]
    text: str
    markers: tuple[float, ...]
    av_offset_s: float  # video content late (+) or early (-) relative to the audio

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def make_av_clip(
    text: str = "the quick brown fox jumps over the lazy dog",
    fps: float = 25.0,
    size: tuple[int, int] = (640, 360),
    lead_in_s: float = 0.6,
    tail_s: float = 0.6,
    markers: tuple[float, ...] = (),
    av_offset_s: float = 0.0,
    voice: str = "en-us",
    wpm: int = 160,
    speech: Speech | None = None,
) -> AVClip:
    """Speech with known word onsets over a talking face, with optional flash/click sync markers.

    A positive ``av_offset_s`` shifts all visual content (lips and flashes) later than the audio.
    With ``markers``, every frame carries the black marker patch (top-left), lit by a light pulse
    of one frame period starting at each marker instant (+ offset), integrated over each frame's
    exposure cell so its brightness keeps the sub-frame phase (see alignment.evidence); the audio
    gets a 1 kHz click at each marker instant. ``speech`` (with its lead-in) replaces the
    espeak-ng speech of ``text``.
    """
    if speech is None:
        speech = synthesize_speech(text, voice=voice, wpm=wpm, lead_in_s=lead_in_s)
    text = speech.text
    audio = np.concatenate([speech.samples, np.zeros(int(tail_s * SAMPLE_RATE), np.float32)])
    audio = add_clicks(audio, list(markers))
    n_frames = int(len(audio) / SAMPLE_RATE * fps)
    visual_t = np.arange(n_frames) / fps - av_offset_s
    env = speech_envelope(speech.samples, visual_t)
    frames = talking_face_frames(env, size)
    if markers:
        frames = [add_marker_box(f) for f in frames]
    for t in markers:
        for k, level in flash_exposure(t + av_offset_s, n_frames, fps).items():
            frames[k] = add_flash(frames[k], level)
    return AVClip(audio, frames, fps, speech.words, text, tuple(markers), av_offset_s)


def speak(text: str, voice: str = "en-us", lead_in_s: float = 0.0) -> Speech:
    """``text`` in an espeak-ng voice, or in a festival voice named ``festival:<voice>``
    (app.loadtest.festival), with each word's exact onset."""
    if voice.startswith("festival:"):
        from app.loadtest.festival import synthesize_festival

        return synthesize_festival(text, voice.split(":", 1)[1], lead_in_s=lead_in_s)
    return synthesize_speech(text, voice=voice, lead_in_s=lead_in_s)


def write_wav(path: str | Path, samples: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    """16-bit PCM mono WAV."""
    pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as wf:
        wf.setnchannels(1)
        wf.setsampwidth(2)
        wf.setframerate(rate)
        wf.writeframes(pcm.tobytes())


def write_av_file(path: str | Path, clip: AVClip, audio: bool = True, video: bool = True) -> Path:
    """Encode a clip to a media file (H.264 + AAC; MP4, MKV or MOV by extension) with PyAV.

    ``audio=False`` or ``video=False`` leaves that stream out (for missing-track handling).
    """
    from fractions import Fraction

    import av

    path = Path(path)
    with av.open(str(path), "w") as container:
        vstream = astream = None
        if video:
            vstream = container.add_stream("libx264", rate=Fraction(clip.fps).limit_denominator(1000))
            h, w = clip.frames[0].shape[:2]
            vstream.width, vstream.height = w, h
            vstream.pix_fmt = "yuv420p"
        if audio:
            astream = container.add_stream("aac", rate=SAMPLE_RATE)
            astream.layout = "mono"
        if vstream is not None:
            for img in clip.frames:
                container.mux(vstream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
            container.mux(vstream.encode())
        if astream is not None:
            pcm = (np.clip(clip.audio, -1, 1) * 32767).astype(np.int16)
            for i in range(0, len(pcm), 1024):
                frame = av.AudioFrame.from_ndarray(pcm[None, i : i + 1024], format="s16", layout="mono")
                frame.sample_rate = SAMPLE_RATE
                frame.pts = i
                container.mux(astream.encode(frame))
            container.mux(astream.encode())
    return path
