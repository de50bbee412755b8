"""Word comparison rules, each written once: which characters of a word count depends on the job.

The rules differ on purpose and must not be merged: streaming agreement compares Whisper's words
with their apostrophes and any Unicode letter (:func:`agreement_key`), a pronouncing dictionary or
a test script spells words in ASCII (:func:`dictionary_form`), and the session's repeated-word
check looks at letters and digits alone (:func:`alnum_key`). Changing one changes which words
agree, align or count as repeats.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_PUNCTUATION = re.compile(r"[^\w']+")
_NOT_ASCII_WORD = re.compile(r"[^a-z0-9']+")


def without_punctuation(text: str) -> str:
    """``text`` with everything but word characters and apostrophes removed; case is kept.

    Forced decoder prefixes use it: Whisper re-tokenises them, so case must survive.
    """
    return _PUNCTUATION.sub("", text)


def agreement_key(word: str) -> str:
    """How two Whisper words are compared (streaming agreement, WER): lower case, punctuation removed."""
    return without_punctuation(word.lower())


def dictionary_form(word: str) -> str:
    """A word as a pronouncing dictionary or a test script spells it: lower case ASCII letters,
    digits and inner apostrophes (``"Don't,"`` -> ``"don't"``)."""
    return _NOT_ASCII_WORD.sub("", word.lower()).strip("'")


def alnum_key(word: str) -> str:
    """Letters and digits only, lower case: whether two tokens say the same word again."""
    return "".join(ch for ch in word.lower() if ch.isalnum())


def word_edits(ref: Sequence[str], hyp: Sequence[str]) -> tuple[int, int]:
    """(edits, reference words) between two word sequences compared by :func:`agreement_key`: the
    numerator and denominator of a word error rate, so rates pool over many utterances."""
    r = [k for k in (agreement_key(w) for w in ref) if k]
    h = [k for k in (agreement_key(w) for w in hyp) if k]
    d = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        prev, d[0] = d.copy(), i
        for j in range(1, len(h) + 1):
            d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r[i - 1] != h[j - 1]))
    return d[len(h)], len(r)
