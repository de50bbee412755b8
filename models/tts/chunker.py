"""Phrases out of a streaming answer: where to cut the text for the synthesizer.

A language model streams sub-word pieces ("synchron", "y", " world", "."); a synthesizer wants
whole phrases, and intonation wants them to end where the sentence or clause does. The first
phrase is cut early so it is synthesized and played while the rest still streams in; later ones
may be longer (they are synthesized while the one before plays).

A word is complete only when whitespace follows it (the next piece may continue it: "3" "." "5",
"e" "." "g" "."), so a phrase never ends inside a word; the rest waits for the next piece or
:meth:`PhraseChunker.flush`. A phrase ends after a word that ends a sentence (``. ! ?``, not an
abbreviation or an initial), at a line break, after clause punctuation (``, ; : —``) once it has
``min_clause_words`` words (``first_clause_words`` for the first), or at a word boundary once it
has ``max_words`` (``first_max_words``). A run of text with no whitespace past ``max_chars`` is
cut anyway (a pasted URL must not hold the answer's voice back forever).
"""

from __future__ import annotations

import re

_ABBREVIATIONS = frozenset(
    "dr mr mrs ms prof st jr sr vs e.g eg i.e ie approx no fig dept inc ltd co mt jan feb mar apr aug sep "
    "sept oct nov dec a.m p.m u.s u.k".split())
_CLOSERS = "\"')]}*_`”’»"
_CLAUSE = (",", ";", ":", "—", "–")


def _ends_sentence(word: str) -> bool:
    core = word.rstrip(_CLOSERS)
    if not core.endswith((".", "!", "?", "…")):
        return False
    if core.endswith(("!", "?", "…", "...")):
        return True
    stem = core[:-1].lstrip("\"'([{*_`“‘«").lower()
    if stem in _ABBREVIATIONS or re.fullmatch(r"[a-z]", stem):  # "Dr." "e.g." an initial "J."
        return False
    return True


def _ends_clause(word: str) -> bool:
    core = word.rstrip(_CLOSERS)
    return core.endswith(_CLAUSE) or core in ("-", "—", "–")


class PhraseChunker:
    """Feeds on raw responder pieces, returns whole phrases (stripped text) as they complete."""

    def __init__(self, max_words: int = 14, first_max_words: int = 6, min_clause_words: int = 3,
                 first_clause_words: int = 2, max_chars: int = 400) -> None:
        if min(max_words, first_max_words, min_clause_words, first_clause_words, max_chars) < 1:
            raise ValueError("PhraseChunker's word and character limits must be >= 1")
        self.max_words = max_words
        self.first_max_words = first_max_words
        self.min_clause_words = min_clause_words
        self.first_clause_words = first_clause_words
        self.max_chars = max_chars
        self._buf = ""
        self._emitted = 0

    def feed(self, piece: str) -> list[str]:
        """Add the next piece of the answer; the phrases it completed (often none)."""
        if not isinstance(piece, str):
            raise TypeError(f"PhraseChunker.feed wants str, got {type(piece).__name__}")
        self._buf += piece
        out: list[str] = []
        while (phrase := self._next_phrase()) is not None:
            out.append(phrase)
        return out

    def flush(self) -> list[str]:
        """The answer is over: whatever is left, as one last phrase (none if only whitespace)."""
        rest, self._buf = self._buf.strip(), ""
        if not rest:
            return []
        self._emitted += 1
        return [rest]

    def _next_phrase(self) -> str | None:
        """Cut one phrase off the buffer where a rule says so; None when no rule fires yet."""
        first = self._emitted == 0
        max_words = self.first_max_words if first else self.max_words
        clause_words = self.first_clause_words if first else self.min_clause_words
        count = 0
        # Only words followed by whitespace are complete; the last run may still grow.
        for m in re.finditer(r"\S+(?=(\s+))", self._buf):
            word, space = m.group(0), m.group(1)
            count += 1
            cut = m.end() + len(space)
            if (_ends_sentence(word) and not (count == 1 and re.fullmatch(r"\d{1,3}[.)]", word))
                    or "\n" in space
                    or (_ends_clause(word) and count >= clause_words)
                    or count >= max_words):
                return self._take(cut)
        if len(self._buf) > self.max_chars and not self._buf[-1:].isspace():
            return self._take(len(self._buf))
        return None

    def _take(self, cut: int) -> str | None:
        phrase, self._buf = self._buf[:cut].strip(), self._buf[cut:].lstrip()
        if not phrase:
            return None
        self._emitted += 1
        return phrase
