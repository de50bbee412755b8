"""SEQ-Integrity at the receiving peer: the ``response`` words a client got, judged against the
stand-in LLM's own log of what it sent (``app.loadtest.llm_standin.StandInAnswer``).

An answer, as the client sees it, is the ``response`` events of one ``utterance`` in arrival order;
its first word names the completion it came from (``completion``), which keys the stand-in's log.
A group whose completion is unknown or missing (the first word lost) keeps no rule. An answer that
ended with ``response_end`` reason ``done`` must hold every sent word; otherwise (cut short, or no
``response_end``) any whole-word prefix keeps the rule. Tool-only and empty completions count as
answers that keep the rules when nothing of theirs was shown. ``alignment.seq`` holds the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from alignment.seq import SentAnswer, SeqVerdict, check_answer
from app.loadtest.llm_standin import StandInAnswer

#: The wire's ``utterance`` of a ``response`` (an int from the server; anything JSON from elsewhere).
Utterance: TypeAlias = int | float | str | bool | None
#: An answer's key: its utterance, or (utterance, completion id) for a second answer to the same one.
AnswerKey: TypeAlias = Utterance | tuple[Utterance, str]


@dataclass(frozen=True)
class ClientAnswer:
    """One answer as the client received it."""

    utterance: AnswerKey
    completion: str | None
    words: tuple[tuple[int, str], ...]  # (index, text) in arrival order
    done: bool | None  # response_end said done (True) / cut short (False) / no response_end (None)


def utterance_of(value: object) -> Utterance:
    """A wire ``utterance`` as a key (a value that is not a JSON scalar: its text)."""
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _index(value: object) -> int:
    """A word's index; -1 for one that is not a number (it then breaks the order rule, never the check)."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return -1


def client_answers(messages: Iterable[Mapping[str, object]]) -> list[ClientAnswer]:
    """Group ``response`` (and ``response_end``) messages (JSON objects) by answer, in arrival order."""
    words: dict[AnswerKey, list[tuple[int, str]]] = {}
    completion: dict[AnswerKey, str | None] = {}
    current: dict[Utterance, AnswerKey] = {}  # utterance → the key of its answer now arriving
    done: dict[AnswerKey, bool] = {}
    for m in messages:
        if m.get("type") == "response":
            utt = utterance_of(m.get("utterance"))
            cid = m.get("completion")
            cid = None if cid is None else str(cid)
            key = current.setdefault(utt, utt)
            if cid is not None and completion.get(key) not in (None, cid):
                key = current[utt] = (utt, cid)  # a second answer to the same utterance
            words.setdefault(key, []).append((_index(m.get("index", -1)), str(m.get("text", ""))))
            if cid is not None:
                completion.setdefault(key, cid)
        elif m.get("type") == "response_end":
            answer = utterance_of(m.get("answer"))
            done[current.get(answer, answer)] = m.get("reason") == "done"
    return [ClientAnswer(k, completion.get(k), tuple(w), done.get(k)) for k, w in words.items()]


def judge(answers: Sequence[ClientAnswer], log: Sequence[StandInAnswer]) -> list[tuple[str, SeqVerdict]]:
    """(completion id or utterance, verdict) per answer, plus the shown-nothing tool-only ones."""
    by_id = {a.id: a for a in log}
    out: list[tuple[str, SeqVerdict]] = []
    shown = set()
    for a in answers:
        sent = by_id.get(a.completion or "")
        if sent is None:
            out.append((f"utterance {a.utterance}", SeqVerdict(len(a.words), 0, (
                f"no completion id on its first word (got {a.completion!r}): the first word was lost",))))
            continue
        shown.add(sent.id)
        out.append((sent.id, check_answer(a.words, SentAnswer(sent.sent_text, sent.tool_text), a.done)))
    for sent in log:
        if sent.id not in shown and not sent.text.strip() and sent.completed:
            out.append((sent.id, SeqVerdict(0, 0, ())))  # tool-only / empty: nothing shown, as it must be
    return out
