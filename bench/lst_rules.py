"""The same token streams judged by the old LST rules and the new ones, in one table.

Old (LST version 1): TTFT from the end of the user's speech; jitter = σ of the last 8 ITLs only.
New (version 2, ``alignment.lst``): TTFT from the responder request (the standard's); jitter = the
worst σ over every 8 consecutive ITLs of the stream; turn latency reported beside, not judged.

Each stream is built exactly (no clock, no sleeping), so the verdicts are deterministic. The script
fails (exit 1) if the new rules miss the cases they exist for: a stall followed by 8 even tokens
must not read Gold, and an even stream from a fast responder must not be judged by the time the
turn decision took.

    .venv/bin/python bench/lst_rules.py
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from alignment.lst import LSTMeter, tier_for


@dataclass(frozen=True)
class Stream:
    name: str
    decide_s: float  # end of speech → responder request (turn decision + final decode)
    ttft_s: float  # responder request → first token
    itls_s: tuple[float, ...]


def _streams() -> list[Stream]:
    rng = np.random.default_rng(0)
    even = (1 / 12,) * 24
    return [
        Stream("even 12 tok/s, fast responder, 600 ms turn decision", 0.600, 0.040, even),
        Stream("stall 500+300 ms, then 8 even tokens", 0.020, 0.040, (0.5, 0.3) + (0.1,) * 8),
        Stream("one 200 ms stall mid-response, even elsewhere", 0.020, 0.040, even[:12] + (0.2,) + even[:11]),
        Stream("±4 ms uniform jitter at 10 tok/s", 0.020, 0.050, tuple(0.1 + rng.uniform(-0.004, 0.004, 24))),
        Stream("policy change 12 → 8 tok/s mid-response", 0.020, 0.040, even[:12] + (0.125,) * 12),
        Stream("slow responder (TTFT 150 ms), even", 0.020, 0.150, even),
    ]


def old_rule(s: Stream) -> tuple[float, float, str]:
    """Version 1: TTFT from the end of speech, σ of the last 8 ITLs."""
    ttft_ms = (s.decide_s + s.ttft_s) * 1e3
    jitter_ms = float(np.std(np.asarray(s.itls_s[-8:]))) * 1e3
    return ttft_ms, jitter_ms, tier_for(ttft_ms, jitter_ms)


def new_rule(s: Stream) -> dict:
    meter = LSTMeter()
    meter.begin_response(s.decide_s, speech_end_t=0.0)
    t = s.decide_s + s.ttft_s
    meter.token(t)
    for itl in s.itls_s:
        t += itl
        meter.token(t)
    return meter.snapshot()


def main() -> int:
    rows = []
    print(f"{'stream':<54} | {'old TTFT':>8} {'old σ8':>7} {'old tier':>8} | {'LST TTFT':>8} {'turn':>6} "
          f"{'worst σ8':>8} {'last σ8':>7} {'ITLmax':>7} {'new tier':>8}")
    for s in _streams():
        o_ttft, o_jit, o_tier = old_rule(s)
        n = new_rule(s)
        rows.append((s, o_tier, n))
        print(f"{s.name:<54} | {o_ttft:8.1f} {o_jit:7.2f} {o_tier:>8} | {n['ttft_ms_p99']:8.1f} "
              f"{n['turn_ms_p50']:6.0f} {n['jitter_ms']:8.2f} {n['jitter_ms_last8']:7.2f} {n['itl_ms_max']:7.1f} "
              f"{n['tier']:>8}")
    (_, even_old, even_new), (_, stall_old, stall_new) = rows[0], rows[1]
    checks = {
        "stall + 8 even tokens: old rule read Gold, new rule does not":
            stall_old == "gold" and stall_new["tier"] != "gold",
        "even stream, fast responder: Gold by the standard's TTFT (old rule: none)":
            even_old == "none" and even_new["tier"] == "gold",
    }
    for what, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
