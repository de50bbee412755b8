"""Running rounds: one round of peers in worker processes, or a ramp (``--find-max``) per netem scenario.

Everything is bounded: a round has a deadline, a ramp a maximum number of rounds (``MAX_ROUNDS``),
and the run stops by itself.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import time
from dataclasses import asdict, replace
from typing import Any

from app.loadtest.config import MAX_ROUNDS, PeerSpec, RoundConfig, plan_peers
from app.loadtest.cpusampler import CpuSampler, steady_cpu
from app.loadtest.drive import worker_main
from app.loadtest.spawn import SpawnedServer, base_url, scrape_lst, scrape_metrics
from app.loadtest.verdict import L3_BOUND, P95_BOUND_MS, aggregate, client_cpu_per_peer


def run_round(specs: list[PeerSpec], cfg: RoundConfig, server_pid: int | None) -> dict[str, Any]:
    """Run one round of peers in worker processes; returns per-peer results, aggregates and CPU."""
    ctx = mp.get_context("spawn")
    workers = sorted({s.worker for s in specs})
    out = ctx.Queue(maxsize=len(workers) + 1)
    sampler = CpuSampler(server_pid, readyz_url=base_url(cfg.url) + "/readyz").start()
    procs = []
    t_start = time.monotonic()
    for w in workers:
        p = ctx.Process(target=worker_main, args=(w, [s for s in specs if s.worker == w], cfg, out),
                        name=f"loadtest-worker-{w}", daemon=True)
        p.start()
        sampler.add_worker(p.pid)
        procs.append(p)
    # Deadline: the last peer's start + connect + run + close, plus time to build clips and report.
    run_s = max(cfg.duration_s, cfg.max_duration_s)
    deadline = t_start + max(s.start_s for s in specs) + cfg.connect_timeout_s + run_s + 60.0
    results: list[dict[str, Any]] = []
    worker_cpu: dict[int, float] = {}
    setup_cpu: dict[int, float] = {}
    errors: list[str] = []
    pending = set(workers)
    while pending and time.monotonic() < deadline:
        try:
            msg = out.get(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        pending.discard(msg["worker"])
        results.extend(msg["peers"])
        if "cpu_s" in msg:
            worker_cpu[msg["worker"]] = msg["cpu_s"]
            setup_cpu[msg["worker"]] = msg.get("cpu_setup_s", 0.0)
        if msg.get("error"):
            errors.append(f"worker {msg['worker']}: {msg['error']}")
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
    if pending:
        errors.append(f"workers {sorted(pending)} gave no result before the deadline (terminated)")
    cpu = sampler.stop()
    wall = time.monotonic() - t_start
    seen = {r["index"] for r in results}
    for s in specs:
        if s.index not in seen:
            results.append({"index": s.index, "worker": s.worker, "offset_ms": s.offset_ms, "netem": s.netem,
                            "connected": False, "error": "no result (worker failed or timed out)"})
    results.sort(key=lambda r: r["index"])
    agg = aggregate(results, cfg.min_recall, cfg.allow_refusals, cfg.require_lst)
    agg["client_cpu_per_peer"] = client_cpu_per_peer(results, worker_cpu, setup_cpu)
    agg["degradation"] = sampler.degradation  # [t, level] at each change of the server's degradation level
    agg["cpu_all_live"] = steady_cpu(cpu, sampler.sessions, agg["connected"])
    agg["answer"] = pooled_answers(results)
    return {"peers": results, "aggregate": agg, "cpu": cpu, "sessions": sampler.sessions, "errors": errors,
            "wall_s": round(wall, 1), "worker_cpu_s": worker_cpu, "worker_setup_cpu_s": setup_cpu}


def pooled_answers(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The round's spoken-answer figures over every peer that decoded its answers; counts otherwise."""
    from alignment.rounding import round_or_none
    from app.loadtest.metrics import quantile

    answers = [p.get("answer") or {} for p in results if p.get("connected")]
    out: dict[str, Any] = {"starts": sum(a.get("starts", 0) for a in answers),
                           "audio_packets": sum(a.get("audio_packets", 0) for a in answers),
                           "avatar_frames": sum(a.get("avatar_frames", 0) for a in answers)}
    decoded = [a for a in answers if a.get("decoded")]
    if not decoded:
        return out
    pool = {k: [x for a in decoded for x in a.get(k, [])] for k in ("voice_to_voice_ms", "stop_ms", "lip_sync_ms")}
    n = sum(a.get("answers", 0) for a in decoded)
    false = sum(a.get("false_interruptions", 0) for a in decoded)
    out.update({
        "answers": n,
        "voice_to_voice_ms_p50": round_or_none(quantile(pool["voice_to_voice_ms"], 0.5), 1),
        "voice_to_voice_ms_p95": round_or_none(quantile(pool["voice_to_voice_ms"], 0.95), 1),
        "barge_ins": sum(a.get("barge_ins", 0) for a in decoded),
        "stop_ms_p50": round_or_none(quantile(pool["stop_ms"], 0.5), 1),
        "stop_ms_p99": round_or_none(quantile(pool["stop_ms"], 0.99), 1),
        "false_interruptions": false,
        "false_interruption_rate": round(false / n, 4) if n else None,
        "lip_sync_ms_p50": round_or_none(quantile(pool["lip_sync_ms"], 0.5), 1),
        "lip_sync_abs_ms_p95": round_or_none(quantile([abs(x) for x in pool["lip_sync_ms"]], 0.95), 1),
    })
    return out


def run_plan(args: argparse.Namespace, cfg: RoundConfig, pid: int | None,
             server: SpawnedServer | None = None) -> dict[str, Any]:
    """For each ``--netem`` scenario: one round, or a ramp (``--find-max``); at most ``MAX_ROUNDS`` in all."""
    rounds: list[dict[str, Any]] = []
    results = {}
    for netem in args.netem:
        results[netem] = _run_scenario(args, cfg, pid, netem, rounds, server)
        if server is not None and server.exit_code() is not None:
            break  # nothing left to measure
    result = next(iter(results.values())) if len(results) == 1 else {
        "ok": all(r["ok"] for r in results.values()), "scenarios": results}
    return {"config": {**asdict(cfg), "peers": args.peers, "workers": args.workers, "netem": args.netem,
                       "offset_ms": args.offset_ms, "offset_peers": args.offset_peers,
                       "find_max": args.find_max, "stagger_s": args.stagger},
            "rounds": rounds, "result": result,
            "bounds": {"p95_word_to_token_ms": P95_BOUND_MS, "level3_pass": L3_BOUND, "recall": cfg.min_recall,
                       "lst_tier": cfg.require_lst}}


def _run_scenario(args: argparse.Namespace, cfg: RoundConfig, pid: int | None, netem: str,
                  rounds: list[dict[str, Any]], server: SpawnedServer | None = None) -> dict[str, Any]:
    """One netem scenario: a round or a ramp; appends its rounds to ``rounds``, returns its verdict."""
    sustained = 0
    broken = False
    n = args.peers
    mine: list[dict[str, Any]] = []
    while len(rounds) < MAX_ROUNDS:
        offsets = {i: args.offset_ms for i in range(n - args.offset_peers, n)} if args.offset_peers else {}
        specs = plan_peers(n, min(args.workers, n), args.stagger, offsets, netem)
        print(f"round: {n} peers, netem={netem}, {cfg.duration_s:.0f} s ...", flush=True)
        load_before = [round(x, 2) for x in os.getloadavg()]
        rnd = run_round(specs, replace(cfg, seed=cfg.seed + len(rounds)), pid)
        rnd["load_avg_before"], rnd["load_avg_after"] = load_before, [round(x, 2) for x in os.getloadavg()]
        rnd["n_peers"], rnd["netem"] = n, netem
        rnd["server_metrics"] = scrape_metrics(cfg.url)
        rnd["server_lst"] = scrape_lst(cfg.url)
        rounds.append(rnd)
        mine.append(rnd)
        agg = rnd["aggregate"]
        print(f"  p95 word->token {agg['latency_ms_p95']} ms, Level-3 pass {agg['level3_pass_rate']}, "
              f"recall {agg['recall']}, connected {agg['connected']}/{agg['peers']}: "
              f"{'PASS' if agg['bounds']['ok'] else 'FAIL'}", flush=True)
        died = server.exit_code() if server is not None else None
        if died is not None:
            rnd["server_exit_code"] = died
            rnd["errors"].append(f"the spawned server exited with code {died} during this round "
                                 f"(negative: killed by signal {-died}); see {server.log_path}")
            print(f"  the server exited with code {died}: stopping (log: {server.log_path})", flush=True)
        if not args.find_max or died is not None or (not agg["bounds"]["ok"] and not args.keep_going):
            break
        broken = broken or not agg["bounds"]["ok"]
        if not broken:
            sustained = n  # this round and every smaller one held
        if n >= args.max_peers:
            break
        n = min(n + args.step, args.max_peers)
        time.sleep(2.0)  # let the server tear the previous sessions down
    exits = [r["server_exit_code"] for r in mine if "server_exit_code" in r]
    if args.find_max:
        broke = next((r for r in mine if not r["aggregate"]["bounds"]["ok"]), None)
        return {"ok": sustained > 0, "netem": netem, "peers_sustained": sustained,
                **({"server_exit_code": exits[0]} if exits else {}),
                "bound_broke_at": None if broke is None else broke["n_peers"],
                "failed_checks": [] if broke is None else
                [k for k, v in broke["aggregate"]["bounds"]["checks"].items() if not v],
                "curve": [[r["n_peers"], r["aggregate"]["latency_ms_p95"], r["aggregate"]["level3_pass_rate"],
                           r["aggregate"]["connected"]] for r in mine]}
    agg = mine[0]["aggregate"]
    ok = agg["bounds"]["ok"] if not args.offset_peers else (
        agg["offset_peers_flagged"] == agg["offset_peers"] and agg["clean_peers_flagged"] == 0)
    result = {"ok": ok and not exits, "netem": netem, "bounds": agg["bounds"],
              **({"server_exit_code": exits[0]} if exits else {})}
    if args.offset_peers:
        result["detection"] = {"offset_ms": args.offset_ms, "flagged": agg["offset_peers_flagged"],
                               "of": agg["offset_peers"], "clean_flagged": agg["clean_peers_flagged"]}
    return result
