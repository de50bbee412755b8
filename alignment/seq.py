"""SEQ-Integrity: does the answer a client received keep the sequence the responder sent?

The words delivered (``response`` events: index, text) must be **in order** (indices 0, 1, 2, …,
none twice, none skipped), **a prefix on a word boundary** of the responder's full answer (its
pieces joined, split on whitespace; an answer that ended ``done`` holds every word, one cut short
may stop after any whole word) and **free of tool-call text**. An empty or tool-only answer keeps it
when nothing was shown; the unit of ``max_tokens`` on the delivery path is the whole word; the score
is the share of answers that keep every rule (docs/LST.md). ``WordAssembler`` is the delivery
path's half: raw pieces in, whole words out, a trailing word withheld when a length limit cut it.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SentAnswer:
    """What the responder sent for one answer: its content text and its tool calls' text."""

    text: str
    tool_text: tuple[str, ...] = ()

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(self.text.split())


@dataclass(frozen=True)
class SeqVerdict:
    """One answer's verdict: ``kept`` when ``violations`` is empty."""

    delivered: int
    sent: int
    violations: tuple[str, ...]

    @property
    def kept(self) -> bool:
        return not self.violations


def check_answer(delivered: Sequence[tuple[int, str]], sent: SentAnswer, done: bool | None = None) -> SeqVerdict:
    """Judge one answer: ``delivered`` (index, text) in arrival order; ``done``: the answer ended
    ``done`` (True), was cut short (False), or its end is unknown (None: any whole-word prefix)."""
    problems: list[str] = []
    seen: set[int] = set()
    due = 0
    for index, _ in delivered:
        if index in seen:
            problems.append(f"index {index} delivered twice")
            continue
        if index != due:
            problems.append(f"index {index} arrived where {due} was due (skipped or out of order)")
        seen.add(index)
        due = index + 1
    words = sent.words
    tool = " ".join(sent.tool_text)
    texts = [text for _, text in delivered]
    for k, text in enumerate(texts):
        want = words[k] if k < len(words) else None
        if text == want:
            continue
        if tool and text and text in tool and text not in words:
            problems.append(f"word {k} {text!r} is tool-call text")
        elif want is not None and text and want.startswith(text):
            problems.append(f"word {k} {text!r} is split from {want!r}")
        elif want is None:
            problems.append(f"word {k} {text!r} is past the {len(words)} words sent")
        else:
            problems.append(f"word {k} {text!r} is not the sent {want!r}")
    if done and len(texts) < len(words):
        problems.append(f"ended done after {len(texts)} of {len(words)} words")
    return SeqVerdict(len(texts), len(words), tuple(problems))


def score(verdicts: Sequence[SeqVerdict]) -> float | None:
    """The share of answers that kept every rule (None without answers)."""
    return sum(v.kept for v in verdicts) / len(verdicts) if verdicts else None


class WordAssembler:
    """Raw responder pieces → whole words (pieces join by concatenation; whitespace ends a word)."""

    def __init__(self) -> None:
        self._partial = ""

    def feed(self, piece: str) -> list[str]:
        """The words this piece completes (a word completes when whitespace follows it)."""
        text = self._partial + piece
        parts = text.split()
        if not parts:
            self._partial = ""
            return []
        if text[-1].isspace():
            self._partial = ""
            return parts
        self._partial = parts[-1]
        return parts[:-1]

    def flush(self, complete: bool) -> list[str]:
        """The last word if the stream ended on its own (``complete``); withheld when a length limit
        cut it (the word may be split)."""
        last, self._partial = self._partial, ""
        return [last] if last and complete else []


async def words_of(pieces: AsyncIterable[str], complete: Callable[[], bool],
                   joined: bool = True) -> AsyncIterator[str]:
    """Whole words out of ``pieces``; ``complete()`` is asked once the pieces end (False: the last
    word may be split, so it is withheld). ``joined=False``: each piece already is one word."""
    if not joined:
        async for word in pieces:
            if word.strip():
                yield word.strip()
        return
    asm = WordAssembler()
    async for piece in pieces:
        for word in asm.feed(piece):
            yield word
    for word in asm.flush(complete()):
        yield word
