"""SEQ-Integrity: the rules on hand-made answers, and the real delivery path (stand-in LLM over
loopback → OpenAIResponder → word assembly → pacer → ``response`` wire events) judged at the
receiving end against the stand-in's own log, clean and with injected faults."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from alignment.lst import LSTMeter
from alignment.pacing import TokenPacer
from alignment.seq import SentAnswer, WordAssembler, check_answer, score, words_of
from alignment.types import AnswerEnd, TokenRatePolicy
from app.live.answer_lst import MeteredAnswer
from app.live.events import ResponseEvent
from app.loadtest.llm_standin import StandInLLM, split_word
from app.loadtest.seqcheck import client_answers, judge
from models.responders import OpenAIResponder, RequestTimes

SENT = SentAnswer("Sure, synchrony works fine.", ("get_weather", '{"place": "here"}'))


def _idx(*words: str) -> list[tuple[int, str]]:
    return list(enumerate(words))


def test_rules_on_hand_made_answers():
    assert check_answer(_idx("Sure,", "synchrony", "works", "fine."), SENT, done=True).kept
    assert check_answer(_idx("Sure,", "synchrony"), SENT, done=False).kept  # cut short on a word boundary
    assert check_answer(_idx("Sure,", "synchrony"), SENT).kept  # end unknown: any whole-word prefix
    split = check_answer(_idx("Sure,", "synchron"), SENT, done=False)
    assert not split.kept and "split" in split.violations[0]
    twice = check_answer([(0, "Sure,"), (1, "synchrony"), (1, "synchrony")], SENT)
    assert not twice.kept and "twice" in twice.violations[0]
    skipped = check_answer([(0, "Sure,"), (2, "works")], SENT)
    assert not skipped.kept and any("skipped" in v for v in skipped.violations)
    tool = check_answer(_idx("Sure,", "get_weather"), SENT)
    assert not tool.kept and "tool-call text" in tool.violations[0]
    early = check_answer(_idx("Sure,", "synchrony"), SENT, done=True)
    assert not early.kept and "ended done after 2 of 4" in early.violations[0]
    tool_only = SentAnswer("", ("get_weather", "{}"))
    assert check_answer([], tool_only, done=True).kept  # nothing shown: kept
    assert not check_answer(_idx("{}"), tool_only).kept
    assert score([check_answer([], tool_only)] * 3 + [split]) == 0.75 and score([]) is None


async def test_word_assembler_joins_pieces_and_withholds_a_cut_word():
    asm = WordAssembler()
    out = [w for p in ("Sure,", " synchron", "y", " wor", "ks", " fi") for w in asm.feed(p)]
    assert out == ["Sure,", "synchrony", "works"] and asm.flush(complete=False) == []
    assert split_word("synchrony") == ["synchron", "y"] and split_word("tell") == ["tell"]

    async def pieces():
        for p in ("Sure,", " synchron", "y"):
            yield p

    assert [w async for w in words_of(pieces(), complete=lambda: True)] == ["Sure,", "synchrony"]
    assert [w async for w in words_of(pieces(), complete=lambda: False)] == ["Sure,"]


class _VirtualTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.now += delay
        await asyncio.sleep(0)


TURNS = (
    ("please tell me about synchrony and synchronisation", 64),
    ("what is the weather going to be like tomorrow", 64),  # content, then a tool call
    ("should I take an umbrella", 64),  # a tool call only: an answer with no text
    ("could you recommend a restaurant downtown", 7),  # max_tokens cuts it, maybe mid-word
    ("I would like to book a table for four people", 64),
)


async def _deliver(responder: OpenAIResponder, utterance: int, text: str, max_tokens: int, fault: str | None,
                   lower_at: int | None = None, stop_at: int | None = None) -> list[dict]:
    """One answer through the delivery path; ``fault``: "duplicate" (a word sent twice) or
    "split" (raw pieces shown as words); ``lower_at``: the controller lowers max_tokens to 3 words
    after this many; ``stop_at``: a barge-in after this many words."""
    vt = _VirtualTime()
    policy = TokenRatePolicy(tokens_per_s=20.0, max_tokens=max_tokens, temperature=0.5)
    metered = MeteredAnswer(responder, policy, LSTMeter(), None, utterance, None)
    pacer = TokenPacer(policy, clock=vt.clock, sleep=vt.sleep)
    words = metered.words(text)
    if fault == "split":
        times = RequestTimes()
        metered.times = times
        words = words_of(responder.tokens(text, policy, times=times), lambda: True, joined=False)
    out: list[dict] = []
    reason = AnswerEnd.BARGE_IN
    async for tok in pacer.pace(words):
        metered.shown(tok)
        cid = metered.times.completion_id if tok.index == 0 else None
        out.append(ResponseEvent(utterance, tok.index, tok.text, 0.0, completion=cid).to_wire())
        if fault == "duplicate" and tok.index == 1:
            out.append(dict(out[-1]))
        if lower_at is not None and tok.index + 1 == lower_at:
            pacer.set_policy(dataclasses.replace(policy, max_tokens=3))
        if stop_at is not None and tok.index + 1 == stop_at:
            break
    else:
        reason = metered.reason(pacer.policy.max_tokens)
    metered.end(reason)
    out.append({"type": "response_end", "answer": utterance, "reason": str(reason)})
    return out


async def _run(fault: str | None) -> tuple[list, StandInLLM]:
    llm = await StandInLLM(ttft_s=0.0, tokens_per_s=2000.0).start()
    try:
        responder = OpenAIResponder(base_url=llm.base_url)
        messages: list[dict] = []
        for k, (text, max_tokens) in enumerate(TURNS * 4):
            lower_at = 2 if k % 5 == 4 else None  # truncation mid-answer by the controller
            stop_at = 2 if k % 7 == 3 else None  # the user speaks during the answer
            messages += await _deliver(responder, k, text, max_tokens, fault, lower_at, stop_at)
        await asyncio.sleep(0.05)  # the stand-in logs a completion when its stream closes
        return judge(client_answers(messages), llm.log), llm
    finally:
        await llm.stop()


async def test_the_delivery_path_keeps_seq_integrity_against_the_standins_log():
    verdicts, llm = await _run(None)
    assert len(llm.log) == len(TURNS) * 4
    assert any(a.tool_text and a.text for a in llm.log) and any(a.tool_text and not a.text for a in llm.log)
    assert any(a.finish_reason == "length" for a in llm.log)
    bad = [(k, v.violations) for k, v in verdicts if not v.kept]
    assert not bad, bad
    assert score([v for _, v in verdicts]) == 1.0 and len(verdicts) == len(TURNS) * 4


@pytest.mark.parametrize("fault", ["duplicate", "split"])
async def test_an_injected_fault_scores_below_the_bar(fault):
    verdicts, _ = await _run(fault)
    s = score([v for _, v in verdicts])
    assert s is not None and s < 0.98, [v.violations for _, v in verdicts]
    assert any(fault.replace("duplicate", "twice") in " ".join(v.violations) for _, v in verdicts)


async def test_tool_call_deltas_never_become_text():
    llm = await StandInLLM(ttft_s=0.0, tokens_per_s=2000.0).start()
    try:
        times = RequestTimes()
        policy = TokenRatePolicy(tokens_per_s=20.0, max_tokens=64, temperature=0.5)
        pieces = [p async for p in OpenAIResponder(base_url=llm.base_url).tokens(
            "what is the weather", policy, times=times)]
    finally:
        await llm.stop()
    assert "".join(pieces) == "Sure, I heard:" and times.finish_reason == "tool_calls"
    assert times.tool_calls[0] == "get_weather" and "place" in "".join(times.tool_calls)
    assert times.sent is not None and times.first is not None and times.first >= times.sent
    assert times.completion_id and times.completion_id.startswith("chatcmpl-standin-")
    pieces = await pieces_of("tell me about synchrony")
    assert pieces[pieces.index(" synchron") + 1] == "y"  # sub-word pieces, as a model sends them


async def pieces_of(text: str) -> list[str]:
    llm = await StandInLLM(ttft_s=0.0, tokens_per_s=2000.0).start()
    try:
        policy = TokenRatePolicy(tokens_per_s=20.0, max_tokens=64, temperature=0.5)
        return [p async for p in OpenAIResponder(base_url=llm.base_url).tokens(text, policy)]
    finally:
        await llm.stop()
