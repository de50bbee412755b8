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
from collections.abc import Sequence
from dataclasses import replace

from alignment.rounding import round_or_none
from app.loadtest.config import MAX_ROUNDS, PeerSpec, RoundConfig, plan_peers
from app.loadtest.cpusampler import CpuSampler, steady_cpu
from app.loadtest.drive import worker_main
from app.loadtest.metrics import quantile
from app.loadtest.records import (
    AnswerSummary,
    DecodedAnswers,
    Detection,
    LoadReport,
    PeerResult,
    PlanBounds,
    PlanRound,
    PlanSettings,
    PooledAnswers,
    RampVerdict,
    RoundResult,
    RoundVerdict,
    ScenarioSet,
    ScenarioVerdict,
    WorkerReport,
)
from app.loadtest.spawn import SpawnedServer, base_url, scrape_lst, scrape_metrics
from app.loadtest.verdict import L3_BOUND, P95_BOUND_MS, aggregate, client_cpu_per_peer


def run_round(specs: list[PeerSpec], cfg: RoundConfig, server_pid: int | None) -> RoundResult:
    """Run one round of peers in worker processes; returns per-peer results, aggregates and CPU."""
    ctx = mp.get_context("spawn")
    workers = sorted({s.worker for s in specs})
    out: mp.queues.Queue[WorkerReport] = ctx.Queue(maxsize=len(workers) + 1)
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
    results: list[PeerResult] = []
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
        pending.discard(msg.worker)
        results.extend(msg.peers)
        if msg.cpu_s is not None:
            worker_cpu[msg.worker] = msg.cpu_s
            setup_cpu[msg.worker] = msg.cpu_setup_s
        if msg.error:
            errors.append(f"worker {msg.worker}: {msg.error}")
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
    if pending:
        errors.append(f"workers {sorted(pending)} gave no result before the deadline (terminated)")
    cpu = sampler.stop()
    wall = time.monotonic() - t_start
    seen = {r.index for r in results}
    for s in specs:
        if s.index not in seen:
            results.append(PeerResult(s.index, s.worker, s.offset_ms, s.netem,
                                      error="no result (worker failed or timed out)"))
    results.sort(key=lambda r: r.index)
    as_json = [r.to_json() for r in results]  # verdict.aggregate reads the peers' JSON form
    agg = aggregate(as_json, cfg.min_recall, cfg.allow_refusals, cfg.require_lst)
    return RoundResult(
        peers=results, aggregate=agg,
        answer=pooled_answers([r.figures.answer for r in results if r.connected and r.figures is not None]),
        client_cpu_per_peer=client_cpu_per_peer(as_json, worker_cpu, setup_cpu),
        degradation=sampler.degradation, cpu_all_live=steady_cpu(cpu, sampler.sessions, agg["connected"]),
        cpu=cpu, sessions=sampler.sessions, errors=errors, wall_s=round(wall, 1), worker_cpu_s=worker_cpu,
        worker_setup_cpu_s=setup_cpu)


def pooled_answers(answers: Sequence[AnswerSummary]) -> PooledAnswers:
    """The round's spoken-answer figures over every connected peer's answers: counts over all of them,
    figures over those that decoded their answers."""
    counts = PooledAnswers(sum(a.starts for a in answers), sum(a.audio_packets for a in answers),
                           sum(a.avatar_frames for a in answers))
    decoded = [a.stats for a in answers if a.decoded and a.stats is not None]
    if not any(a.decoded for a in answers):
        return counts
    v2v = [x for a in decoded for x in a.voice_to_voice_ms]
    stops = [x for a in decoded for x in a.stop_ms]
    lips = [x for a in decoded for x in a.lip_sync_ms]
    n = sum(a.answers for a in decoded)
    false = sum(a.false_interruptions for a in decoded)
    return replace(counts, decoded=DecodedAnswers(
        answers=n,
        voice_to_voice_ms_p50=round_or_none(quantile(v2v, 0.5), 1),
        voice_to_voice_ms_p95=round_or_none(quantile(v2v, 0.95), 1),
        barge_ins=sum(a.barge_ins for a in decoded),
        stop_ms_p50=round_or_none(quantile(stops, 0.5), 1),
        stop_ms_p99=round_or_none(quantile(stops, 0.99), 1),
        false_interruptions=false,
        false_interruption_rate=round(false / n, 4) if n else None,
        lip_sync_ms_p50=round_or_none(quantile(lips, 0.5), 1),
        lip_sync_abs_ms_p95=round_or_none(quantile([abs(x) for x in lips], 0.95), 1),
    ))


def run_plan(args: argparse.Namespace, cfg: RoundConfig, pid: int | None,
             server: SpawnedServer | None = None) -> LoadReport:
    """For each ``--netem`` scenario: one round, or a ramp (``--find-max``); at most ``MAX_ROUNDS`` in all."""
    rounds: list[PlanRound] = []
    results: dict[str, ScenarioVerdict] = {}
    for netem in args.netem:
        results[netem] = _run_scenario(args, cfg, pid, netem, rounds, server)
        if server is not None and server.exit_code() is not None:
            break  # nothing left to measure
    result = next(iter(results.values())) if len(results) == 1 else ScenarioSet(results)
    return LoadReport(cfg, PlanSettings(args.peers, args.workers, args.netem, args.offset_ms, args.offset_peers,
                                        args.find_max, args.stagger),
                      rounds, result, PlanBounds(P95_BOUND_MS, L3_BOUND, cfg.min_recall, cfg.require_lst))


def _run_scenario(args: argparse.Namespace, cfg: RoundConfig, pid: int | None, netem: str,
                  rounds: list[PlanRound], server: SpawnedServer | None = None) -> ScenarioVerdict:
    """One netem scenario: a round or a ramp; appends its rounds to ``rounds``, returns its verdict."""
    sustained = 0
    broken = False
    n = args.peers
    mine: list[PlanRound] = []
    while len(rounds) < MAX_ROUNDS:
        offsets = {i: args.offset_ms for i in range(n - args.offset_peers, n)} if args.offset_peers else {}
        specs = plan_peers(n, min(args.workers, n), args.stagger, offsets, netem)
        print(f"round: {n} peers, netem={netem}, {cfg.duration_s:.0f} s ...", flush=True)
        load_before = [round(x, 2) for x in os.getloadavg()]
        rnd = run_round(specs, replace(cfg, seed=cfg.seed + len(rounds)), pid)
        load_after = [round(x, 2) for x in os.getloadavg()]
        server_metrics, server_lst = scrape_metrics(cfg.url), scrape_lst(cfg.url)
        agg = rnd.aggregate
        print(f"  p95 word->token {agg['latency_ms_p95']} ms, Level-3 pass {agg['level3_pass_rate']}, "
              f"recall {agg['recall']}, connected {agg['connected']}/{agg['peers']}: "
              f"{'PASS' if rnd.ok else 'FAIL'}", flush=True)
        died = server.exit_code() if server is not None else None
        if died is not None:
            rnd = replace(rnd, errors=[*rnd.errors, f"the spawned server exited with code {died} during this "
                                       f"round (negative: killed by signal {-died}); see {server.log_path}"])
            print(f"  the server exited with code {died}: stopping (log: {server.log_path})", flush=True)
        planned = PlanRound(rnd, n, netem, load_before, load_after, server_metrics, server_lst, died)
        rounds.append(planned)
        mine.append(planned)
        if not args.find_max or died is not None or (not rnd.ok and not args.keep_going):
            break
        broken = broken or not rnd.ok
        if not broken:
            sustained = n  # this round and every smaller one held
        if n >= args.max_peers:
            break
        n = min(n + args.step, args.max_peers)
        time.sleep(2.0)  # let the server tear the previous sessions down
    exits = [r.server_exit_code for r in mine if r.server_exit_code is not None]
    if args.find_max:
        broke = next((r for r in mine if not r.round.ok), None)
        return RampVerdict(
            ok=sustained > 0, netem=netem, peers_sustained=sustained, server_exit_code=exits[0] if exits else None,
            bound_broke_at=None if broke is None else broke.n_peers,
            failed_checks=[] if broke is None else
            [k for k, v in broke.round.aggregate["bounds"]["checks"].items() if not v],
            curve=[(r.n_peers, r.round.aggregate["latency_ms_p95"], r.round.aggregate["level3_pass_rate"],
                    r.round.aggregate["connected"]) for r in mine])
    agg = mine[0].round.aggregate
    ok = agg["bounds"]["ok"] if not args.offset_peers else (
        agg["offset_peers_flagged"] == agg["offset_peers"] and agg["clean_peers_flagged"] == 0)
    detection = None
    if args.offset_peers:
        detection = Detection(args.offset_ms, agg["offset_peers_flagged"], agg["offset_peers"],
                              agg["clean_peers_flagged"])
    return RoundVerdict(ok and not exits, netem, agg["bounds"], exits[0] if exits else None, detection)
