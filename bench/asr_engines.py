"""The baseline of bench/asr_stream.py: LocalAgreement over faster-whisper, no VAD gate.

Not part of the product: the live path and offline analysis use :class:`models.asr.WhisperEngine`
behind :class:`models.asr.StreamingASR`. The baseline answers "what does the usual recipe
(whisper_streaming's LocalAgreement over a 30-s padded CTranslate2 decode, every step, no VAD)
give on the same sessions?", so it lives beside the bench that asks.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from alignment.text import agreement_key
from alignment.types import SAMPLE_RATE
from models.asr import ASREvent, DecodedWord, StreamingASR
from models.vad import VADEvent
from models.whisper_loader import bundled_model_dir


class FasterWhisperEngine:
    """faster-whisper (CTranslate2, int8) on the bundled tiny.en directory; pads every call to 30 s."""

    name = "faster-whisper"

    def __init__(self, model_dir: str | None = None, compute_type: str = "int8", cpu_threads: int = 1) -> None:
        from faster_whisper import WhisperModel

        path = model_dir or bundled_model_dir()
        if path is None:
            raise RuntimeError("faster-whisper engine needs a CTranslate2 model directory")
        self.model = WhisperModel(str(path), device="cpu", compute_type=compute_type, cpu_threads=cpu_threads)
        self.lock = threading.Lock()

    def transcribe(
        self, audio: np.ndarray, prefix: Sequence[str] = (), prompt: str = "", draft: Sequence[str] = (),
        expect_words: bool = False,  # no prefix forcing here, so nothing to hold
    ) -> list[DecodedWord]:
        audio = np.asarray(audio, np.float32).reshape(-1)
        if audio.size < SAMPLE_RATE // 10:
            return []
        with self.lock:
            segments, _info = self.model.transcribe(
                audio, language="en", beam_size=1, best_of=1, temperature=0.0, word_timestamps=True,
                condition_on_previous_text=False, initial_prompt=prompt or None, vad_filter=False,
            )
            return [
                DecodedWord(w.word, float(w.start), float(w.end), float(w.probability))
                for seg in segments
                for w in (seg.words or [])
                if agreement_key(w.word)
            ]


@lru_cache(maxsize=1)
def faster_whisper_engine() -> FasterWhisperEngine:
    """One engine per process (it loads the model)."""
    return FasterWhisperEngine()


def after_committed(words: list[DecodedWord], committed: list[DecodedWord]) -> list[DecodedWord]:
    """For engines that cannot force a prefix: the words after the committed ones.

    Words that start before the last committed word ended (less 0.1 s) are dropped, then any
    1-5 word overlap between the committed tail and the new head is removed (as in
    whisper_streaming's hypothesis buffer).
    """
    if not committed:
        return words
    cut = committed[-1].end - 0.1
    new = [w for w in words if w.start > cut]
    for n in range(min(5, len(committed), len(new)), 0, -1):
        if [w.key for w in committed[-n:]] == [w.key for w in new[:n]]:
            return new[n:]
    return new


class BaselineStreamingASR(StreamingASR):
    """:class:`StreamingASR` decoding every step regardless of speech (no VAD gate, no endpoints
    until the input ends), over an engine that does not force the committed words as a prefix."""

    def flush(self) -> list[ASREvent]:
        return self._on_vad(VADEvent("end", self._pos)) if self._in_utt else []

    def _on_audio(self, samples: np.ndarray) -> list[ASREvent]:
        events = [] if self._in_utt else self._on_vad(VADEvent("start", self._pos))
        self._buf.append(samples)
        self._pos += samples.size / SAMPLE_RATE
        return events

    @property
    def _heard(self) -> float:
        return self._pos

    def _after_prefix(self, words: list[DecodedWord], audio: np.ndarray) -> list[DecodedWord]:
        return after_committed(words, self._committed)
