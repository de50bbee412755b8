"""The certification's cells (LST v3): mutation context × network strategy, and the raw samples of
one peer's run, taken where the standard says each figure is judged.

* **TTFT at the server**: the ``ttft_ms`` (request written → first content read), ``turn_ms`` and
  ``hold_ms`` the first ``response`` word of each answer carries.
* **ITL at the receiving peer**, where the network acts: the gaps between the arrivals of an
  answer's consecutive words at the client (kind ``itl``); the server's own ITLs are kept as
  ``server_itl`` (reported, not judged).
* **SEQ-Integrity at the receiving peer**, against the stand-in LLM's own log (kind ``seq``,
  ``app.loadtest.seqcheck``); without a log (``caption``, ``--url``) there is no ``seq`` sample.

A sample's ``context`` is its answer's mutation context (the workload turn it answered says which),
or ``cold start`` for every answer of the first pass of the first session on a freshly started server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

from app.loadtest.llm_standin import StandInAnswer
from app.loadtest.seqcheck import AnswerKey, Utterance, client_answers, judge, utterance_of

if TYPE_CHECKING:
    from app.loadtest.peer import ReceivedEvent

#: One raw sample: a JSON object, the certificate's Merkle leaf as it is hashed (canonical JSON).
Sample: TypeAlias = dict[str, object]

#: The named network strategies (netem specs, ``app.loadtest.netem.parse_profile``).
NETWORKS: dict[str, str] = {
    "clean": "clean",
    "loss+jitter": "loss=1%,delay=20ms,jitter=5ms",  # independent loss, a FIFO link whose delay varies ±5 ms
    "delay-mutation": "link=20ms-120ms,period=4s",  # the link's queueing delay jumps every 4 s
}
#: Mutation contexts, in report order. ``truncation`` and ``load step`` are driven through the media:
#: the workload's face strains mid-answer (``app.loadtest.stepclip``) and the controller reads a step.
CONTEXTS = ("plain", "truncation", "insertion", "tool calls", "load step", "cold start")
COLD = "cold start"


def netem_spec(name: str) -> str:
    """The netem spec of a named strategy, or the argument itself (any ``parse_profile`` spec)."""
    return NETWORKS.get(name, name)


def samples_v3(events: Sequence[ReceivedEvent], t0: float, context_at: Callable[[float], tuple[str, str]],
               scenario: str, responder: str, session: str, cold_until: float | None,
               log: Sequence[StandInAnswer] | None) -> list[Sample]:
    """The run's samples (see the module docstring). ``context_at(clip time)`` → (turn, context) of
    the turn whose speech ended last before it; ``cold_until``: client time before which every
    answer is the cold start (None: not a fresh server's first session)."""
    out: list[Sample] = []
    last_arrival: dict[Utterance, float] = {}
    ctx: dict[Utterance, str] = {}
    messages: list[Mapping[str, object]] = []
    for ev in events:
        m = ev.message
        if m.get("type") not in ("response", "response_end"):
            continue
        messages.append(m)
        if m.get("type") != "response":
            continue
        client_s = round(ev.wall - t0, 4)
        utt = utterance_of(m.get("utterance"))
        base = {"scenario": scenario, "responder": responder, "session": session, "utterance": utt,
                "index": m.get("index"), "client_s": client_s}
        if isinstance(m.get("ttft_ms"), (int, float)):
            turn, context = context_at(ev.wall - t0 - float(m.get("ms_after_utterance") or 0) / 1000.0)
            ctx[utt] = COLD if cold_until is not None and client_s < cold_until else context
            out.append({**base, "context": ctx[utt], "kind": "ttft", "ms": m["ttft_ms"], "turn_ms": m.get("turn_ms"),
                        "hold_ms": m.get("hold_ms"), "turn": turn})
            last_arrival[utt] = ev.wall
            continue
        if isinstance(m.get("itl_ms"), (int, float)):
            out.append({**base, "context": ctx.get(utt, "plain"), "kind": "server_itl", "ms": m["itl_ms"]})
        if utt in last_arrival:
            out.append({**base, "context": ctx.get(utt, "plain"), "kind": "itl",
                        "ms": round((ev.wall - last_arrival[utt]) * 1000, 3)})
        last_arrival[utt] = ev.wall
    if log is not None:
        out += _seq_samples(messages, log, ctx, scenario, responder, session)
    return out


def _seq_samples(messages: list[Mapping[str, object]], log: Sequence[StandInAnswer], ctx: Mapping[Utterance, str],
                 scenario: str, responder: str, session: str) -> list[Sample]:
    answers = client_answers(messages)
    ids = {a.completion for a in answers if a.completion}
    by_completion = {a.completion: a for a in answers}
    mine = [a for a in log if a.id in ids or (not a.text.strip() and a.completed)]
    out = []
    for key, verdict in judge(answers, mine):
        answer = by_completion.get(key)
        utt: AnswerKey = answer.utterance if answer is not None else None
        context = ctx.get(utt[0] if isinstance(utt, tuple) else utt, "tool calls" if answer is None else "plain")
        out.append({"scenario": scenario, "responder": responder, "session": session, "kind": "seq",
                    "context": context, "answer": key, "kept": verdict.kept, "words": verdict.delivered,
                    "violations": list(verdict.violations)})
    return out
