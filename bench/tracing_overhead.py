"""What a turn's spans cost on the event loop, tracing off and on (a collector that is down).

A turn makes a ``turn`` span with ``asr``, ``llm``, ``tts`` and ``playback`` children, a
``first_token`` and a ``barge_in`` event, and the GenAI attributes (``app.live.tracing``). The
script times N such turns with tracing off (no-op objects) and on (the OTLP/HTTP exporter pointed
at a closed port behind the bounded queue, so the export thread only fails and drops), and prints
µs per turn and the share of one core at one turn every 3 s.

    .venv/bin/python bench/tracing_overhead.py [--turns 2000]
"""

from __future__ import annotations

import argparse
import time

from alignment.types import TokenRatePolicy
from app.live import tracing

POLICY = TokenRatePolicy(tokens_per_s=12.0, max_tokens=256, temperature=0.8)


def one_turn(root: tracing._NoSpan, i: int) -> None:
    now = time.monotonic()
    turn = tracing.turn_span(root, i, now - 0.3)
    turn.child("asr", start=now - 0.3).end(now - 0.1)
    llm = tracing.llm_span(turn, "model", POLICY, "openai")
    llm.headers()
    llm.event("first_token", {"synchrony.ttft_ms": 80.0})
    llm.set({"gen_ai.response.finish_reasons": ["stop"], "gen_ai.usage.output_tokens": 30})
    llm.end()
    turn.child("tts").end()
    playback = turn.child("playback")
    turn.event("barge_in")
    playback.end()
    turn.end()


def per_turn_us(root: tracing._NoSpan, turns: int) -> float:
    t0 = time.perf_counter()
    for i in range(turns):
        one_turn(root, i)
    return (time.perf_counter() - t0) / turns * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=2000)
    args = ap.parse_args()
    off = per_turn_us(tracing.NO_SPAN, args.turns)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    tr = tracing.Tracing(exporter=OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces", timeout=1))
    root = tr.session("bench")
    per_turn_us(root, 50)  # first use
    on = per_turn_us(root, args.turns)
    dropped = tr.queue.dropped
    tr.shutdown()
    print(f"tracing off: {off:.1f} µs per turn; on (collector down): {on:.1f} µs per turn, "
          f"{dropped} spans dropped of {args.turns * 5}")
    print(f"at one turn every 3 s: {on / 3e6 * 100:.4f} % of one core (budget 1 %)")
    print(f"command: .venv/bin/python bench/tracing_overhead.py --turns {args.turns}")


if __name__ == "__main__":
    main()
