"""Scale-out through the cluster ingress on a local two-node Ray cluster, with the load tester's peers.

Phases (each prints its figures and PASS/FAIL; exit 1 on any FAIL):
  * single: one ``synchrony serve`` process with ``--per-node`` peers for ``--duration`` s: the
    reference, what one server holds per session at that load (the load test's bounds: p95
    word→token ≤ 1000 ms, Level-3 pass ≥ 99 %); then twice as many peers (reported, not judged): the
    load the two-node cluster puts on this machine's cores.
  * spread: ``synchrony cluster`` on two local nodes (the Ray cluster and the ingress run in this
    process; each node runs its own server with its own models), 2 × ``--per-node`` peers through the
    ingress: every peer connected, sessions on both nodes (the ingress's /metrics, per node), every
    session within the same bounds.
  * removal: the same peers for ``--removal-duration`` s; ``--remove-at`` s in, the node holding the
    most sessions is removed (its raylet and its processes killed). PASS: the ingress stops placing
    there within 2 s and marks it lost; that node's peers see their video stop and their connection
    end (ICE consent: about 30–45 s); the other node's peers keep the bounds; then ``--per-node`` new
    peers all land on the node that is left.

Each node runs on a core of its own (CPU affinity, ``synchrony cluster --pin-nodes``), as on
separate machines, and so does the single server of the reference; the ingress, Ray's own processes
and the peers float over all cores, as they would not on real machines. ``--share-cores`` runs the
nodes on all cores instead: then two nodes with one session each load the cores like one server
with two, and the single server also runs twice the peers (reported, not judged). The load average
is printed with every phase.

Usage: .venv/bin/python bench/cluster.py [--per-node 1] [--duration 20] [--removal-duration 60]
       [--remove-at 12] [--share-cores] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cluster.local import node_cores  # noqa: E402
from app.cluster.placement import LOST, READY  # noqa: E402
from app.loadtest.config import RoundConfig, plan_peers  # noqa: E402
from app.loadtest.rounds import run_round  # noqa: E402
from app.loadtest.spawn import SpawnedServer, scrape_metrics  # noqa: E402
from app.loadtest.verdict import L3_BOUND, P95_BOUND_MS  # noqa: E402

WORKERS = 2


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_peers(url: str, n: int, duration_s: float, seed: int) -> dict[str, Any]:
    """One load-test round of ``n`` peers against ``url`` (blocking); the round dict, load average added."""
    cfg = RoundConfig(url=url, duration_s=duration_s, seed=seed)
    before = _load()
    rnd = run_round(plan_peers(n, min(WORKERS, n), 0.5, {}, "clean"), cfg, None).to_json()
    rnd["load_avg"] = [before, _load()]
    return rnd


def peer_row(peer: dict[str, Any]) -> dict[str, Any]:
    """One peer's figures that the phases judge."""
    lat, l3 = peer.get("latency") or {}, peer.get("level3") or {}
    location = peer.get("location") or ""
    parts = location.rstrip("/").split("/")
    return {"peer": peer["index"], "node": parts[-2] if len(parts) >= 2 and parts[-3:-2] == ["whip"] else None,
            "connected": bool(peer.get("connected")), "error": peer.get("error"),
            "p95_ms": lat.get("latency_ms_p95"), "level3": l3.get("pass_rate"),
            "last_video_s": len(peer.get("frames_per_s") or []), "run_s": peer.get("run_s"),
            "level3_failed": l3.get("failed") or []}


def within_bounds(row: dict[str, Any]) -> bool:
    return (row["connected"] and not row["error"] and row["p95_ms"] is not None and row["p95_ms"] <= P95_BOUND_MS
            and row["level3"] is not None and row["level3"] >= L3_BOUND)


def failures(row: dict[str, Any]) -> str:
    """Why a session's Level-3 checks failed (``app.loadtest.metrics.failed_check``), or nothing."""
    whys = Counter(f["why"] for f in row["level3_failed"])
    return f" (failed: {', '.join(f'{k} ×{v}' for k, v in sorted(whys.items()))})" if whys else ""


def verdict(name: str, ok: bool, detail: str) -> bool:
    print(f"  {name}: {detail}  {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def single_phase(per_node: int, duration_s: float, cores: set[int] | None, out: dict[str, Any]) -> bool:
    """One server: ``per_node`` peers (the same per-node load; judged); on ``cores`` (one node's), or
    on all cores and then twice the peers (the same load on this machine's cores as the two-node
    cluster; reported)."""
    rounds = {}
    with tempfile.TemporaryDirectory() as tmp:
        # Every peer admitted: the 2 × per-node round is a reference, and a measured admission
        # that has seen no session yet would refuse its second peer.
        server = SpawnedServer(2 * per_node, Path(tmp) / "server.log", extra=["--admission", "fixed"], cores=cores)
        try:
            server.wait_ready()
            for n in (per_node,) if cores else (per_node, 2 * per_node):
                print(f"single server: {n} peer(s), {duration_s:.0f} s", flush=True)
                rounds[n] = run_peers(server.url, n, duration_s, seed=n)
                time.sleep(2.0)  # let the server tear the sessions down
        finally:
            server.stop()
    out["single"] = {}
    for n, rnd in rounds.items():
        rows = [peer_row(p) for p in rnd["peers"]]
        out["single"][n] = {"rows": rows, "load_avg": rnd["load_avg"], "aggregate": _brief(rnd["aggregate"])}
        for r in rows:
            print(f"    {n} peer(s), peer {r['peer']}: p95 {r['p95_ms']} ms, Level-3 {r['level3']}{failures(r)}"
                  f"  (load {rnd['load_avg']})")
    rows = out["single"][per_node]["rows"]
    return verdict(f"single server, {per_node} peer(s): every session within bounds",
                   all(within_bounds(r) for r in rows), f"{len(rows)} sessions")


def _brief(agg: dict[str, Any]) -> dict[str, Any]:
    return {k: agg.get(k) for k in ("peers", "connected", "latency_ms_p50", "latency_ms_p95", "level3_pass_rate",
                                    "recall", "turn_ms_p50")}


async def cluster_phases(args: argparse.Namespace, out: dict[str, Any]) -> bool:
    import ray

    from app.cluster.ingress import create_ingress_app
    from app.cluster.local import start_local_cluster, stop_local_cluster
    from app.cluster.registry import NAMESPACE, RegistryConfig
    from app.live.server import ServerConfig, running_server

    cluster = start_local_cluster(2, 1, pin=not args.share_cores)
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    config = RegistryConfig(server=ServerConfig(ui=False, max_sessions=args.per_node), node_host="127.0.0.1")
    ok = True
    try:
        async with running_server(create_ingress_app(config)) as base, httpx.AsyncClient(base_url=base) as client:
            url = f"{base}/whip"
            t0 = time.monotonic()
            while (await client.get("/readyz")).json()["nodes_ready"] < 2:
                if time.monotonic() - t0 > 240:
                    raise RuntimeError("the two nodes were not ready within 240 s")
                await asyncio.sleep(0.5)
            print(f"cluster: 2 nodes ready after {time.monotonic() - t0:.1f} s (load {_load()})", flush=True)
            ok &= await spread_phase(url, client, args, out)
            ok &= await removal_phase(url, client, cluster, args, out)
    finally:
        stop_local_cluster(cluster)
    return ok


async def spread_phase(url: str, client: httpx.AsyncClient, args: argparse.Namespace, out: dict[str, Any]) -> bool:
    n = 2 * args.per_node
    print(f"spread: {n} peers through the ingress, {args.duration:.0f} s", flush=True)
    rnd = await asyncio.to_thread(run_peers, url, n, args.duration, 2)
    rows = [peer_row(p) for p in rnd["peers"]]
    metrics = await asyncio.to_thread(scrape_metrics, url)  # the ingress serves on this event loop
    started = {k: v for k, v in metrics.items() if k.startswith("synchrony_sessions_started_total{")}
    out["spread"] = {"rows": rows, "load_avg": rnd["load_avg"], "sessions_started_by_node": started,
                     "aggregate": _brief(rnd["aggregate"])}
    for r in rows:
        print(f"    peer {r['peer']} on node {r['node']}: p95 {r['p95_ms']} ms, Level-3 {r['level3']}{failures(r)}"
              f"  (load {rnd['load_avg']})")
    ok = verdict("every peer connected", all(r["connected"] and not r["error"] for r in rows), f"{len(rows)} peers")
    ok &= verdict("sessions on both nodes (ingress /metrics)", len(started) == 2 and all(v >= 1 for v in
                  started.values()), json.dumps(started))
    ok &= verdict("every session within the single server's bounds", all(within_bounds(r) for r in rows),
                  f"p95 ≤ {P95_BOUND_MS:.0f} ms, Level-3 ≥ {L3_BOUND:.0%}")
    return ok


async def removal_phase(url: str, client: httpx.AsyncClient, cluster: Any, args: argparse.Namespace,
                        out: dict[str, Any]) -> bool:
    n = 2 * args.per_node
    print(f"removal: {n} peers, {args.removal_duration:.0f} s; a node removed {args.remove_at:.0f} s in", flush=True)
    peers = asyncio.create_task(asyncio.to_thread(run_peers, url, n, args.removal_duration, 3))
    await asyncio.sleep(args.remove_at)
    nodes = (await client.get("/readyz")).json()["nodes"]
    victim = max((k for k, v in nodes.items() if v["state"] == READY), key=lambda k: nodes[k]["sessions"])
    handle = next(h for h in cluster.worker_nodes if h.node_id.startswith(victim))
    removed = time.monotonic()
    await asyncio.to_thread(cluster.remove_node, handle, False)
    stopped_s = lost_s = None
    while time.monotonic() - removed < 60 and lost_s is None:
        state = (await client.get("/readyz")).json()["nodes"][victim]["state"]
        if state != READY and stopped_s is None:
            stopped_s = time.monotonic() - removed
        if state == LOST:
            lost_s = time.monotonic() - removed
        await asyncio.sleep(0.1)
    rnd = await peers
    rows = [peer_row(p) for p in rnd["peers"]]
    gone = [r for r in rows if r["node"] == victim]
    kept = [r for r in rows if r["node"] not in (None, victim)]
    print(f"    removed node {victim}: the ingress stopped placing there after {stopped_s} s, lost after {lost_s} s")
    for r in rows:
        print(f"    peer {r['peer']} on node {r['node']}{' (removed)' if r['node'] == victim else ''}: "
              f"p95 {r['p95_ms']} ms, Level-3 {r['level3']}{failures(r)}, "
              f"last video at {r['last_video_s']} s of {r['run_s']} s,"
              f" error {r['error']!r}  (load {rnd['load_avg']})")
    after = await asyncio.to_thread(run_peers, url, args.per_node, 10.0, 4)
    after_rows = [peer_row(p) for p in after["peers"]]
    metrics = await asyncio.to_thread(scrape_metrics, url)
    out["removal"] = {"victim": victim, "stopped_placing_s": stopped_s, "lost_s": lost_s, "rows": rows,
                      "load_avg": rnd["load_avg"], "after": after_rows,
                      "placements": {k: v for k, v in metrics.items() if k.startswith("synchrony_cluster_placements")}}
    ok = verdict("every peer connected before the removal", all(r["connected"] for r in rows),
                 f"{sum(r['connected'] for r in rows)} of {len(rows)}")
    ok &= verdict("ingress stops placing on the removed node within 2 s", stopped_s is not None and stopped_s <= 2.0,
                 f"{stopped_s if stopped_s is None else round(stopped_s, 2)} s")
    ok &= verdict("the removed node is marked lost", lost_s is not None, f"after {lost_s and round(lost_s, 1)} s")
    ok &= verdict("its sessions end (video stops, the client's connection ends)", bool(gone) and all(
        r["last_video_s"] <= args.remove_at + 3 and r["error"] and "connection" in r["error"] for r in gone),
        f"{len(gone)} session(s)")
    ok &= verdict("the other node's sessions keep the bounds", bool(kept) and all(within_bounds(r) for r in kept),
                  f"{len(kept)} session(s)")
    ok &= verdict("new sessions land on the remaining node only", all(
        r["connected"] and r["node"] not in (None, victim) for r in after_rows), json.dumps(
        [r["node"] for r in after_rows]))
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-node", type=int, default=1, help="sessions per node (and the single server's peers)")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--removal-duration", type=float, default=60.0)
    p.add_argument("--remove-at", type=float, default=12.0)
    p.add_argument("--skip-single", action="store_true", help="only the cluster phases")
    p.add_argument("--share-cores", action="store_true", help="nodes on all cores, not one core each")
    p.add_argument("--json", default=None, help="write every figure here")
    args = p.parse_args()
    cores = None if args.share_cores else node_cores(2, 1)
    if not args.share_cores and cores is None:
        p.error("pinning two nodes needs two cores; pass --share-cores")
    out: dict[str, Any] = {"args": vars(args), "cpus": os.cpu_count(), "load_avg_start": _load()}
    print(f"bench/cluster.py {' '.join(sys.argv[1:])}  (cpus {os.cpu_count()}, load {_load()})", flush=True)
    ok = True if args.skip_single else single_phase(args.per_node, args.duration, cores and cores[0], out)
    ok &= asyncio.run(cluster_phases(args, out))
    out["ok"] = ok
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"overall: {'PASS' if ok else 'FAIL'}  (load {_load()})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
