"""The response stream that a recording would have produced live, replayed on its session clock.

`analyze` has no wall clock to measure, so it runs the real caption responder and the real
TokenPacer on a virtual clock (sleeping advances it exactly): utterance ends come from the
recognised words, the policy in force is the controller's at that moment, and the first token of
each response is released when that utterance's transcript would have been ready — its end plus
its share of the ASR compute actually measured in this run (by audio length). Pacing on a virtual
clock is ideal, so jitter here is the pacer's own schedule; live jitter comes from `serve`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from alignment.json_types import JsonObject
from alignment.lst import LSTMeter
from alignment.pacing import TokenPacer
from alignment.types import LoadEstimate, TokenRatePolicy, WordToken
from app import pipeline
from models.controller import policy_for_level


class _VirtualClock:
    """A clock that only moves when someone sleeps on it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)


def _policy_at(t: float, loads: Sequence[LoadEstimate]) -> TokenRatePolicy:
    policy = policy_for_level(0)
    for est in loads:
        if est.pts > t:
            break
        policy = est.policy
    return policy


def replay_lst(tokens: Sequence[WordToken], loads: Sequence[LoadEstimate], asr_seconds: float) -> JsonObject:
    """LST figures of the caption response stream for ``tokens`` (grouped by utterance)."""
    utterances: dict[int, list[WordToken]] = {}
    for tok in tokens:
        utterances.setdefault(tok.utterance, []).append(tok)
    speech_s = sum(max(ws[-1].end - ws[0].start, 0.0) for ws in utterances.values()) or 1.0
    clock, meter = _VirtualClock(), LSTMeter()
    responder = pipeline.responders("caption", None)()
    responses = []

    async def run() -> None:
        for words in utterances.values():
            end = words[-1].end
            ready = end + asr_seconds * max(words[-1].end - words[0].start, 0.0) / speech_s
            clock.now = max(clock.now, ready)
            meter.begin_response(clock.now, speech_end_t=end)  # the request goes out once the ASR is done
            policy = _policy_at(end, loads)
            pacer = TokenPacer(policy, clock=clock, sleep=clock.sleep)
            emitted = [tok.emitted async for tok in responder.respond(" ".join(w.text for w in words), policy, pacer)]
            for t in emitted:
                meter.token(t)
            meter.response_end()
            responses.append({"utterance_end": round(end, 3), "first_token": round(emitted[0], 3) if emitted else None,
                              "tokens": len(emitted), "tokens_per_s": policy.tokens_per_s})

    asyncio.run(run())
    return {"mode": "replay", **meter.snapshot(), "responses": responses}
