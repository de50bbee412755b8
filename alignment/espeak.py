"""espeak-ng speech through libespeak-ng (ctypes), with the exact onset of every word.

Its one product job is :func:`phonemes`: pronouncing words the forced aligner's dictionary lacks
(names, Whisper's spellings, numbers; :mod:`alignment.forced`). Speech synthesis with word events
serves generated test speech with ground-truth word times (``app.loadtest.testmedia``) and the
benches. Word events are libespeak-ng's event type 1; ``audio_position`` is in ms.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from alignment.types import SAMPLE_RATE

_ESPEAK_EVENT_WORD = 1
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_ESPEAK_RATE = 1
_ESPEAK_PITCH = 3
_CHARS_UTF8 = 1


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
    #: where the synthesizer's last phone ends (s), when it says: its trailing pause may still hold sound
    last_phone_end: float | None = None

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE

    @property
    def phones(self) -> tuple[float, float] | None:
        """(first phone's start, last phone's end) in s, where the synthesizer says both; else None."""
        return None if self.last_phone_end is None or not self.words else (self.words[0].start, self.last_phone_end)


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
            lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
            lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
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

    def phonemes(self, text: str, voice: str) -> str:
        """espeak-ng's phoneme mnemonics for ``text`` (words separated by spaces, stress marks kept)."""
        with self._lock:
            lib = self._load()
            if lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise ValueError(f"unknown espeak-ng voice {voice!r}")
            buf = ctypes.c_char_p(text.encode("utf-8"))
            ptr = ctypes.c_void_p(ctypes.cast(buf, ctypes.c_void_p).value)
            parts = []
            while ptr.value:  # one clause per call; the pointer moves on (NULL at the end)
                out = lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, 0)
                if not out:
                    break
                parts.append(out.decode("utf-8", "ignore"))
            return " ".join(p.strip() for p in parts if p.strip())

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


def _engine() -> _Espeak:
    """The process-wide engine, made on first use."""
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = _Espeak()
    return _ENGINE


def resample(x: np.ndarray, src_hz: int, dst_hz: int) -> np.ndarray:
    """Band-limited resampling (polyphase), float32 out."""
    from math import gcd

    from scipy.signal import resample_poly

    if src_hz == dst_hz:
        return x.astype(np.float32)
    g = gcd(src_hz, dst_hz)
    up, down = dst_hz // g, src_hz // g
    return resample_poly(x.astype(np.float64), up, down, window=_lowpass(up, down)).astype(np.float32)


@lru_cache(maxsize=8)
def _lowpass(up: int, down: int) -> np.ndarray:
    """resample_poly's own default filter (Kaiser, beta 5), designed once per rate pair: the design
    cost ~1 ms, as much as resampling a sentence (word-timing refinement synthesises per word batch)."""
    from scipy.signal import firwin

    rate = max(up, down)
    h = firwin(2 * 10 * rate + 1, 1.0 / rate, window=("kaiser", 5.0))
    h.flags.writeable = False
    return h


def synthesize_speech(
    text: str, voice: str = "en-us", wpm: int = 160, pitch: int = 50, lead_in_s: float = 0.0
) -> Speech:
    """Speak ``text`` with espeak-ng; return 16 kHz audio and each word's exact onset.

    ``lead_in_s`` of silence is prepended (and added to the onsets).
    """
    pcm, events = _engine().synthesize(text, voice, wpm, pitch)
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


def phonemes(text: str, voice: str = "en-us") -> str:
    """espeak-ng's phoneme mnemonics for ``text``: its pronunciation of any spelling (letter-to-sound
    rules for words no dictionary has, numbers read out)."""
    return _engine().phonemes(text, voice)


def synthesize_speech_fresh(
    text: str, voice: str = "en-us", wpm: int = 160, pitch: int = 50, lead_in_s: float = 0.0
) -> Speech:
    """:func:`synthesize_speech` in a new process, where no synthesis came before it.

    libespeak-ng keeps state from one call to the next: the same sentence in the same voice comes
    out a few samples longer or shorter and differs from its first voiced sample on. Audio that
    must be the same in every run (a test fixture made after other tests, some of whose threads
    synthesise speech) is made here instead; it costs a process start (~1 s).
    """
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(synthesize_speech, (text, voice, wpm, pitch, lead_in_s))
