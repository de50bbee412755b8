"""Does the first session on a freshly started server stream its answers as evenly as later ones?

Each of ``--starts`` rounds starts a fresh ``synchrony serve`` (the OpenAI stand-in responder,
``--ttft-ms``), then streams the certification workload once in a first session and once in a second
one, one after the other. For each session it prints the worst σ8 of the ITLs the server measured
(``itl_ms`` on ``response`` events), the worst σ8 at the receiving peer (arrival gaps), the LST TTFT
p99 and the tier (server σ8 and TTFT). It checks the issue's bar: over every start the first
session's tier equals the later sessions' and its σ8 is at most the median σ8 + 2 ms.

    flock /tmp/heavy.lock .venv/bin/python bench/first_session.py [--starts 5] [--ttft-ms 80]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from alignment.lst import judge_samples, worst_sigma
from app.loadtest.certify import Workload


async def _session(url: str, workload: Workload, seed: int) -> dict:
    from app.loadtest.certify import run_scenario

    events, t0, _, info = await run_scenario(url, workload, "clean", 1, seed)
    server_itl, client_itl, ttft = [], [], []
    last: dict = {}
    for ev in events:
        m = ev.message
        if m.get("type") != "response":
            continue
        utt = m.get("utterance")
        if isinstance(m.get("ttft_ms"), (int, float)):
            ttft.append(m["ttft_ms"])
        elif isinstance(m.get("itl_ms"), (int, float)):
            server_itl.append(m["itl_ms"])
            if utt in last:
                client_itl.append((ev.wall - last[utt]) * 1000)
        last[utt] = ev.wall
    verdict = judge_samples(ttft, [server_itl])
    return {"server_s8": worst_sigma(server_itl), "client_s8": worst_sigma(client_itl),
            "ttft99": verdict["ttft_ms_p99"], "tier": verdict["tier"], "answers": len(ttft), "error": info.get("error")}


async def main_async(args: argparse.Namespace) -> int:
    from app.loadtest.certify import STANDARD_TURNS, workload_clip
    from app.loadtest.llm_standin import StandInLLM
    from app.loadtest.spawn import SpawnedServer

    workload = await asyncio.to_thread(workload_clip, STANDARD_TURNS)
    llm = await StandInLLM(ttft_s=args.ttft_ms / 1000.0).start()
    rows = []
    try:
        for k in range(args.starts):
            log = Path(tempfile.gettempdir()) / f"first-session-{k}.log"
            server = SpawnedServer(2, log, ["--responder", "openai", "--llm-url", llm.base_url])
            try:
                await asyncio.to_thread(server.wait_ready)
                first = await _session(server.url, workload, 10 * k)
                later = await _session(server.url, workload, 10 * k + 1)
            finally:
                await asyncio.to_thread(server.stop)
            rows.append((first, later))
            for name, r in (("first", first), ("later", later)):
                print(f"start {k} {name}: server σ8 {r['server_s8']:.2f} ms, peer σ8 {r['client_s8']:.2f} ms, "
                      f"TTFT99 {r['ttft99']} ms, {r['answers']} answers, tier {r['tier']}"
                      + (f" ({r['error']})" if r["error"] else ""), flush=True)
    finally:
        await llm.stop()
    all_s8 = [r["server_s8"] for pair in rows for r in pair if r["server_s8"] is not None]
    median = statistics.median(all_s8)
    same_tier = all(first["tier"] == later["tier"] for first, later in rows)
    within = all(first["server_s8"] is not None and first["server_s8"] <= median + 2.0 for first, _ in rows)
    print(f"median server σ8 {median:.2f} ms; first sessions {[round(f['server_s8'], 2) for f, _ in rows]}")
    print(f"{'PASS' if same_tier else 'FAIL'}: the first session's tier equals the later one's at every start")
    print(f"{'PASS' if within else 'FAIL'}: the first session's σ8 <= median + 2 ms at every start")
    print(f"command: flock /tmp/heavy.lock .venv/bin/python bench/first_session.py --starts {args.starts} "
          f"--ttft-ms {args.ttft_ms:g}")
    return 0 if same_tier and within else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--ttft-ms", type=float, default=80.0)
    return asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
