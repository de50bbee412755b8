"""Generated media with known ground truth: speech with exact word onsets, a talking face, sync markers.

Used by the tests, the benchmarks and the load-test peers, so every timing claim can be checked
against a truth the pipeline did not produce itself:

* speech from libespeak-ng (Debian ``espeak-ng``) through ctypes, with its word events
  (event type 1, ``audio_position`` in ms) as exact word onsets;
* a face video made from a portrait that matplotlib ships (Grace Hopper, public domain), whose
  mouth opens with the speech envelope, so lip motion carries real audio-visual evidence;
* broadcast-style sync markers: a white flash in the video and a 1 kHz click in the audio at
  the same instants, optionally with a deliberately injected audio/video offset.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from alignment import evidence as _evidence
from alignment.types import SAMPLE_RATE

# --- speech ---------------------------------------------------------------------------------

_ESPEAK_EVENT_WORD = 1
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_ESPEAK_RATE = 1
_ESPEAK_PITCH = 3


class _EspeakEvent(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_EspeakEvent)
)


class EspeakUnavailable(RuntimeError):
    """libespeak-ng is not installed (``apt-get install espeak-ng``)."""


@dataclass(frozen=True)
class TimedWord:
    """A word of generated speech and its exact onset (s) in the generated audio."""

    text: str
    start: float


@dataclass(frozen=True)
class Speech:
    """16 kHz mono float32 speech and the exact onset of each word."""

    samples: np.ndarray = field(repr=False)
    words: tuple[TimedWord, ...]
    text: str

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


class _Espeak:
    """The process-wide libespeak-ng engine (it keeps global state, so calls are serialised)."""

    _lock = threading.Lock()
    _lib: ctypes.CDLL | None = None
    _rate_hz = 22050

    def __init__(self) -> None:
        self._pcm: list[np.ndarray] = []
        self._events: list[tuple[int, int, int, int]] = []
        self._callback = _SynthCallback(self._on_synth)

    def _on_synth(self, wav: ctypes.Array, n: int, events: ctypes.Array) -> int:
        if n > 0 and wav:
            self._pcm.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        i = 0
        while events[i].type != 0:
            ev = events[i]
            if ev.type == _ESPEAK_EVENT_WORD:
                self._events.append((ev.text_position, ev.length, ev.audio_position, ev.sample))
            i += 1
        return 0

    @classmethod
    def _load(cls) -> ctypes.CDLL:
        if cls._lib is None:
            name = ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
            try:
                lib = ctypes.CDLL(name)
            except OSError as exc:
                raise EspeakUnavailable(
                    "libespeak-ng not found; install it with `apt-get install espeak-ng`"
                ) from exc
            lib.espeak_Initialize.restype = ctypes.c_int
            lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
            lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
            lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
            lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
            lib.espeak_Synth.argtypes = [
                ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
            ]
            rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, 0)
            if rate <= 0:
                raise EspeakUnavailable("espeak_Initialize failed")
            cls._rate_hz = rate
            cls._lib = lib
        return cls._lib

    def synthesize(self, text: str, voice: str, wpm: int, pitch: int) -> tuple[np.ndarray, list]:
        with self._lock:
            lib = self._load()
            lib.espeak_SetSynthCallback(self._callback)
            if lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise ValueError(f"unknown espeak-ng voice {voice!r}")
            lib.espeak_SetParameter(_ESPEAK_RATE, int(wpm), 0)
            lib.espeak_SetParameter(_ESPEAK_PITCH, int(pitch), 0)
            data = text.encode("utf-8")
            self._pcm, self._events = [], []
            lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, 0, None, None)
            lib.espeak_Synchronize()
            pcm = np.concatenate(self._pcm) if self._pcm else np.zeros(0, np.int16)
            return pcm, list(self._events)


_ENGINE: _Espeak | None = None


def resample(x: np.ndarray, src_hz: int, dst_hz: int) -> np.ndarray:
    """Band-limited resampling (polyphase), float32 out."""
    from math import gcd

    from scipy.signal import resample_poly

    if src_hz == dst_hz:
        return x.astype(np.float32)
    g = gcd(src_hz, dst_hz)
    return resample_poly(x.astype(np.float64), dst_hz // g, src_hz // g).astype(np.float32)


def synthesize_speech(
    text: str, voice: str = "en-us", wpm: int = 160, pitch: int = 50, lead_in_s: float = 0.0
) -> Speech:
    """Speak ``text`` with espeak-ng; return 16 kHz audio and each word's exact onset.

    ``lead_in_s`` of silence is prepended (and added to the onsets).
    """
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = _Espeak()
    pcm, events = _ENGINE.synthesize(text, voice, wpm, pitch)
    audio = resample(pcm.astype(np.float32) / 32768.0, _Espeak._rate_hz, SAMPLE_RATE)
    encoded = text.encode("utf-8")
    words = []
    for text_pos, length, audio_ms, _sample in events:
        raw = encoded[text_pos - 1 : text_pos - 1 + length].decode("utf-8", "ignore")
        word = raw.strip(" \t\n.,;:!?\"'()")
        if word:
            words.append(TimedWord(word, audio_ms / 1000.0 + lead_in_s))
    lead = np.zeros(int(round(lead_in_s * SAMPLE_RATE)), np.float32)
    return Speech(np.concatenate([lead, audio]), tuple(words), text)


def add_noise(samples: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    """White noise at ``snr_db`` relative to the power of the active (non-silent) samples."""
    rng = np.random.default_rng(seed)
    active = samples[np.abs(samples) > 1e-4]
    power = float(np.mean(active**2)) if active.size else 1e-6
    noise = rng.normal(0.0, np.sqrt(power / 10 ** (snr_db / 10)), samples.shape)
    return (samples + noise).astype(np.float32)


# --- video ----------------------------------------------------------------------------------

def portrait() -> np.ndarray:
    """A real face photo (RGB uint8) that matplotlib ships: Grace Hopper, public domain."""
    from matplotlib import cbook
    from PIL import Image

    with cbook.get_sample_data("grace_hopper.jpg") as fh:
        return np.asarray(Image.open(fh).convert("RGB"))


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


def talking_face_frames(
    envelope: np.ndarray, size: tuple[int, int] = (640, 360), base: np.ndarray | None = None
) -> list[np.ndarray]:
    """One frame per envelope value: the portrait centred in ``size`` (w, h), jaw dropped by the value.

    The mouth region is stretched downward (up to 4 % of the frame height) with a dark mouth gap,
    enough for a face tracker to see the lips part.
    """
    from PIL import Image

    w, h = size
    img = base if base is not None else portrait()
    scale = h / img.shape[0]
    face = np.asarray(Image.fromarray(img).resize((int(img.shape[1] * scale), h)))
    canvas = np.zeros((h, w, 3), np.uint8)
    x0 = max((w - face.shape[1]) // 2, 0)
    face = face[:, : w - x0]
    canvas[:, x0 : x0 + face.shape[1]] = face
    # Mouth of the Grace Hopper portrait, as fractions of the (resized) face image.
    mouth_y = int(0.458 * h)
    mouth_x0, mouth_x1 = x0 + int(0.45 * face.shape[1]), x0 + int(0.58 * face.shape[1])
    chin_y = int(0.56 * h)
    frames = []
    for value in envelope:
        frame = canvas.copy()
        drop = int(round(float(value) * 0.04 * h))
        if drop > 0:
            region = canvas[mouth_y:chin_y, mouth_x0 - 20 : mouth_x1 + 20]
            stretched = np.asarray(
                Image.fromarray(region).resize((region.shape[1], region.shape[0] + drop))
            )[: chin_y - mouth_y]
            frame[mouth_y + drop : chin_y, mouth_x0 - 20 : mouth_x1 + 20] = stretched[: chin_y - mouth_y - drop]
            gap = slice(mouth_y, mouth_y + drop)
            frame[gap, mouth_x0:mouth_x1] = (frame[gap, mouth_x0:mouth_x1] * 0.25).astype(np.uint8) + 15
        frames.append(frame)
    return frames


# --- sync markers ---------------------------------------------------------------------------
# The marker spec (and its detector) lives in alignment.evidence; this is the generator side.

CLICK_HZ = _evidence.CLICK_HZ
CLICK_S = _evidence.CLICK_S
FLASH_FRAMES = 1  # the light pulse lasts exactly one frame period


def add_clicks(
    samples: np.ndarray, times: list[float], amplitude: float = _evidence.CLICK_AMPLITUDE
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
) -> AVClip:
    """Speech with known word onsets over a talking face, with optional flash/click sync markers.

    A positive ``av_offset_s`` shifts all visual content (lips and flashes) later than the audio.
    With ``markers``, every frame carries the black marker patch (top-left), lit by a light pulse
    of one frame period starting at each marker instant (+ offset), integrated over each frame's
    exposure cell so its brightness keeps the sub-frame phase (see alignment.evidence); the audio
    gets a 1 kHz click at each marker instant.
    """
    speech = synthesize_speech(text, voice=voice, wpm=wpm, lead_in_s=lead_in_s)
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
