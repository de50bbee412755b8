"""Text-to-speech for the spoken answer: phrases in, audio with every word's and phone's time out.

* :mod:`models.tts.normalize` — :func:`normalize_text`: what each display word is read as.
* :mod:`models.tts.chunker` — :class:`PhraseChunker`: a streamed answer cut into phrases.
* :mod:`models.tts.rate` — :func:`speaking_rate_wpm`: the load policy's speaking rate.
* :mod:`models.tts.festival` — :class:`FestivalTTS`: resident festival processes (the default).
* :mod:`models.tts.openai_tts` — :class:`OpenAITTS`: any OpenAI-compatible ``/audio/speech``,
  word times from the forced aligner.

docs/SPEECH.md describes the engines, the pool, normalisation, chunking and the rate mapping.
"""

from __future__ import annotations

from models.tts.base import ANSWER_VOICE, SpeechSynthesizer, TTSError
from models.tts.chunker import PhraseChunker
from models.tts.festival import FestivalTTS
from models.tts.normalize import NormalizedWord, normalize_text
from models.tts.openai_tts import OpenAITTS
from models.tts.rate import speaking_rate_wpm

SYNTHESIZERS = ("festival", "openai")


def make_synthesizer(name: str, **options: object) -> SpeechSynthesizer:
    """A synthesizer by name: ``festival`` (FestivalTTS's keyword options) or ``openai`` (``base_url``
    required, then OpenAITTS's options)."""
    if name == "festival":
        return FestivalTTS(**options)  # type: ignore[arg-type]
    if name == "openai":
        if not options.get("base_url"):
            raise ValueError("the openai synthesizer needs base_url (e.g. http://127.0.0.1:8002/v1)")
        return OpenAITTS(**options)  # type: ignore[arg-type]
    raise ValueError(f"unknown synthesizer {name!r}; choose from {', '.join(SYNTHESIZERS)}")


__all__ = [
    "ANSWER_VOICE",
    "SYNTHESIZERS",
    "FestivalTTS",
    "NormalizedWord",
    "OpenAITTS",
    "PhraseChunker",
    "SpeechSynthesizer",
    "TTSError",
    "make_synthesizer",
    "normalize_text",
    "speaking_rate_wpm",
]
