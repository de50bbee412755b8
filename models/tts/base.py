"""What every speech synthesizer shares: the protocol, the error, and display-word timing.

A synthesizer is given a phrase as displayed ("It is 42.") and speaks its normalised form ("It is
forty two."); the phrase it returns carries the display words, each spanning the spoken tokens it
was read as (:func:`display_words`), so a caption highlights "42" for as long as "forty two" is
heard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from alignment.types import SpokenPhrase, SpokenWord
from models.tts.normalize import NormalizedWord

#: Answers speak festival's HTS voice (a statistical voice trained on a human speaker); the load
#: test's simulated users speak kal_diphone, so the two are never the same voice.
ANSWER_VOICE = "slt_hts"
#: Words per minute outside this range are clamped: slower drags, faster slurs.
MIN_WPM, MAX_WPM = 80.0, 300.0
#: The longest phrase one call synthesizes (the chunker cuts far shorter ones).
MAX_PHRASE_CHARS = 2000


class TTSError(RuntimeError):
    """Speech could not be synthesized; the message is fit for a user ("festival died", "TTS at URL
    timed out")."""


@runtime_checkable
class SpeechSynthesizer(Protocol):
    """Speaks one phrase at a time; shared by every session of a server."""

    name: str

    async def synthesize(self, text: str, wpm: float) -> SpokenPhrase:
        """``text`` spoken at about ``wpm`` words per minute; words carry the display words of ``text``."""
        ...

    async def aclose(self) -> None:
        """Release processes and connections; the synthesizer is not used again."""
        ...


def check_request(text: str, wpm: float) -> float:
    """The request's wpm, clamped; a clear error for what cannot be spoken."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if len(text) > MAX_PHRASE_CHARS:
        raise TTSError(f"phrase too long to speak at once ({len(text)} characters, at most {MAX_PHRASE_CHARS})")
    try:
        rate = float(wpm)
    except (TypeError, ValueError):
        raise ValueError(f"wpm must be a number, got {wpm!r}") from None
    if not rate > 0 or rate == float("inf"):
        raise ValueError(f"wpm must be a positive number, got {wpm!r}")
    return min(max(rate, MIN_WPM), MAX_WPM)


def display_words(words: Sequence[NormalizedWord],
                  spans: Sequence[tuple[float, float] | None]) -> tuple[SpokenWord, ...]:
    """Each display word that was heard, spanning its spoken tokens (``spans``: one per spoken token
    in order, None where the synthesizer or aligner gave that token no time).

    A display word starts where its first timed token starts and ends where its last one ends;
    words with no timed token (nothing to say, or not found) are left out.
    """
    expected = sum(len(w.spoken) for w in words)
    if len(spans) != expected:
        raise ValueError(f"{len(spans)} token spans for {expected} spoken tokens")
    out: list[SpokenWord] = []
    k = 0
    for w in words:
        timed = [s for s in spans[k : k + len(w.spoken)] if s is not None]
        k += len(w.spoken)
        if timed:
            out.append(SpokenWord(w.original, timed[0][0], max(timed[-1][1], timed[0][0])))
    return tuple(out)


def empty_phrase(text: str, sample_rate: int) -> SpokenPhrase:
    """A phrase with nothing to say (only symbols, emoji, markdown)."""
    import numpy as np

    return SpokenPhrase(text=text, audio=np.zeros(0, np.float32), sample_rate=sample_rate, words=())
