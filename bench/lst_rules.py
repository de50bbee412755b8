"""The same token streams judged by LST rules v1, v2 and v3, in one table.

v1: TTFT from the end of the user's speech; jitter = σ of the last 8 ITLs only.
v2: TTFT from the request going out to the first token emitted (a prefetched answer's turn-hold
inside it); jitter = the worst σ over every 8 consecutive ITLs; turn latency beside, not judged.
v3 (``alignment.lst``): TTFT from the request written to the first content read (the serving
chain); the turn-hold reported inside the turn latency; the pacer glides across a policy change
(``alignment.pacing``, run here on a virtual clock).

Each stream is built exactly (no wall clock), so the verdicts are deterministic. The script fails
(exit 1) if the rules miss the cases they exist for: a stall followed by 8 even tokens must not read
Gold; an even stream from a fast responder must not be judged by the turn decision; an 80 ms LLM
whose answer was prefetched and held must not be judged by the hold (v3); a load step mid-answer
must stay within Gold under v3's glide.

    .venv/bin/python bench/lst_rules.py
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

import numpy as np

from alignment.lst import LSTMeter, tier_for
from alignment.pacing import TokenPacer
from alignment.types import TokenRatePolicy


@dataclass(frozen=True)
class Stream:
    name: str
    decide_s: float  # end of speech → responder request (turn decision + final decode)
    ttft_s: float  # responder request → first content read
    itls_s: tuple[float, ...]
    hold_s: float = 0.0  # first content read → first token emitted (a prefetch waiting for the turn's end)
    v3_itls_s: tuple[float, ...] | None = None  # what v3's pacer makes of it, where it differs


def _glide(before: int, after: int, rate0: float, rate1: float) -> tuple[float, ...]:
    """The ITLs TokenPacer emits when the policy changes rate0 → rate1 after ``before`` tokens."""

    class VT:
        now = 0.0

        @staticmethod
        def clock() -> float:
            return VT.now

        @staticmethod
        async def sleep(d: float) -> None:
            VT.now += d

    async def run() -> list[float]:
        pacer = TokenPacer(TokenRatePolicy(rate0, 1000, 0.5), clock=VT.clock, sleep=VT.sleep)
        out = []
        async for tok in pacer.pace(str(i) for i in range(before + after + 1)):
            out.append(tok.emitted)
            if tok.index == before:
                pacer.set_policy(TokenRatePolicy(rate1, 1000, 0.5))
        return out

    return tuple(np.diff(asyncio.run(run())))


def _streams() -> list[Stream]:
    rng = np.random.default_rng(0)
    even = (1 / 12,) * 24
    return [
        Stream("even 12 tok/s, fast responder, 600 ms turn decision", 0.600, 0.040, even),
        Stream("stall 500+300 ms, then 8 even tokens", 0.020, 0.040, (0.5, 0.3) + (0.1,) * 8),
        Stream("one 200 ms stall mid-response, even elsewhere", 0.020, 0.040, even[:12] + (0.2,) + even[:11]),
        Stream("±4 ms uniform jitter at 10 tok/s", 0.020, 0.050, tuple(0.1 + rng.uniform(-0.004, 0.004, 24))),
        Stream("policy change 12 → 8 tok/s mid-response", 0.020, 0.040, even[:12] + (0.125,) * 12,
               v3_itls_s=_glide(12, 36, 12.0, 8.0)),
        Stream("slow responder (TTFT 150 ms), even", 0.020, 0.150, even),
        Stream("80 ms LLM, prefetched, first token held 140 ms for the turn's end", 0.020, 0.080, even,
               hold_s=0.140),
    ]


def old_rule(s: Stream) -> tuple[float, float, str]:
    """Version 1: TTFT from the end of speech, σ of the last 8 ITLs."""
    ttft_ms = (s.decide_s + s.ttft_s + s.hold_s) * 1e3
    jitter_ms = float(np.std(np.asarray(s.itls_s[-8:]))) * 1e3
    return ttft_ms, jitter_ms, tier_for(ttft_ms, jitter_ms)


def v2_rule(s: Stream) -> dict:
    """Version 2: TTFT from the request going out to the first token emitted (the hold inside)."""
    meter = LSTMeter()
    meter.begin_response(s.decide_s, speech_end_t=0.0)
    t = s.decide_s + s.ttft_s + s.hold_s
    meter.token(t)
    for itl in s.itls_s:
        t += itl
        meter.token(t)
    snap = meter.snapshot()
    return {**snap, "tier": tier_for(snap["ttft_ms_p99"], snap["jitter_ms"])}


def v3_rule(s: Stream) -> dict:
    """Version 3 (``alignment.lst``): TTFT to the first content read; the hold in the turn latency."""
    meter = LSTMeter()
    first_read = s.decide_s + s.ttft_s
    meter.begin_response(s.decide_s, speech_end_t=0.0, first_content_t=first_read)
    t = first_read + s.hold_s
    meter.token(t)
    for itl in s.v3_itls_s or s.itls_s:
        t += itl
        meter.token(t)
    return meter.snapshot()


def main() -> int:
    rows = []
    print(f"{'stream':<66} | {'v1 TTFT':>7} {'v1 σ8':>6} {'v1':>6} | {'v2 TTFT':>7} {'v2 σ8':>6} {'v2':>6} | "
          f"{'v3 TTFT':>7} {'hold':>5} {'turn':>5} {'σ8':>6} {'last8':>5} {'ITLmax':>6} {'v3':>6}")
    for s in _streams():
        o_ttft, o_jit, o_tier = old_rule(s)
        v2, v3 = v2_rule(s), v3_rule(s)
        rows.append((s, o_tier, v2, v3))
        print(f"{s.name:<66} | {o_ttft:7.1f} {o_jit:6.2f} {o_tier:>6} | {v2['ttft_ms_p99']:7.1f} "
              f"{v2['jitter_ms']:6.2f} {v2['tier']:>6} | {v3['ttft_ms_p99']:7.1f} {v3['hold_ms_p50']:5.0f} "
              f"{v3['turn_ms_p50']:5.0f} {v3['jitter_ms']:6.2f} {v3['jitter_ms_last8']:5.2f} {v3['itl_ms_max']:6.1f} "
              f"{v3['tier']:>6}")
    by = {s.name: (o, v2, v3) for s, o, v2, v3 in rows}
    even, stall = by[rows[0][0].name], by[rows[1][0].name]
    step, held = by[rows[4][0].name], by[rows[6][0].name]
    checks = {
        "stall + 8 even tokens: v1 read Gold, v2/v3 do not": stall[0] == "gold" and stall[2]["tier"] != "gold",
        "even stream, fast responder: Gold by the standard's TTFT (v1: none)":
            even[0] == "none" and even[2]["tier"] == "gold",
        "80 ms LLM, prefetched and held: v2 none (hold in TTFT), v3 silver, the hold in the turn latency":
            held[1]["tier"] == "none" and held[2]["tier"] == "silver" and held[2]["hold_ms_p50"] > 100,
        "load step 12 → 8 tok/s mid-answer: v2 none, v3's glide keeps Gold":
            step[1]["tier"] == "none" and step[2]["tier"] == "gold",
    }
    for what, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
