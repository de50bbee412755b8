"""Why is the answer stream uneven at the receiving peer under load? A break-down, per answer word.

Spawns ``synchrony serve`` (``--responder``; ``openai`` talks to the stand-in LLM in a process of its
own), connects ``--peers`` load-test peers (pre-encoded media, one process each, as ``synchrony
loadtest`` does) and keeps every ``response`` event with its arrival time. Every word after an
answer's first carries the server's own interval (``itl_ms``: pacer release to release), so each
arrival gap splits into the server's interval and the transit difference (peer gap − server gap:
DataChannel send, SCTP, the loopback, the peer's own event loop). Beside it: the peer's event-loop
lag (a 5 ms timer), the server's loop-lag gauge and degradation level, and the load average.

Prints per responder: worst σ8 at the peer, of the server's intervals and of the transit
difference; how many intervals stray > 5 ms from the pace on each side; the worst windows.

    flock /tmp/heavy.lock .venv/bin/python bench/stream_evenness.py --responder openai --peers 2 --duration 40 \
        [--variant this --variant nice --variant base --base-dir /tmp/base-tree]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from alignment.lst import worst_sigma


def _peer_proc(index: int, url: str, duration_s: float, start_s: float, out: Any, nice: int = 0) -> None:
    try:
        if nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        out.put(asyncio.run(_peer(index, url, duration_s, start_s)))
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        out.put({"index": index, "error": f"{type(exc).__name__}: {exc}"})


async def _peer(index: int, url: str, duration_s: float, start_s: float) -> dict[str, Any]:
    from app.loadtest.config import DEFAULT_TEXT, DEFAULT_VOICE
    from app.loadtest.drive import _make_peer_class
    from app.loadtest.loopclip import encode_opus_loop, encode_vp8_loop, make_loop_clip

    loop = asyncio.get_running_loop()
    clip = await loop.run_in_executor(None, make_loop_clip, DEFAULT_TEXT, 0.0, (640, 360), 25.0, DEFAULT_VOICE)
    vp8 = await loop.run_in_executor(None, encode_vp8_loop, clip.frames, 25.0)
    opus = await loop.run_in_executor(None, encode_opus_loop, clip.audio)
    await asyncio.sleep(start_s)
    peer = _make_peer_class()(url, clip, loop=True, vp8_packets=vp8, opus_packets=opus)
    lags: list[tuple[float, float]] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            await asyncio.sleep(0.005)
            now = time.monotonic()
            lags.append((now, now - t0 - 0.005))

    watcher = asyncio.create_task(watch())
    try:
        await peer.connect(timeout=20.0)
        end = time.monotonic() + duration_s
        while time.monotonic() < end and peer.pc.connectionState not in ("failed", "closed"):
            await asyncio.sleep(0.25)
    finally:
        stop.set()
        await watcher
        await asyncio.wait_for(peer.close(), 10)
    responses = [(e.wall, e.message) for e in peer.events if e.type == "response"]
    return {"index": index, "responses": responses, "lags": lags, "error": None}


def _answers(responses: list[tuple[float, dict[str, Any]]]) -> list[list[tuple[float, dict[str, Any]]]]:
    """Response words grouped into answers (a new answer at index 0)."""
    out: list[list[tuple[float, dict[str, Any]]]] = []
    for wall, m in responses:
        if m.get("index") == 0 or not out:
            out.append([])
        out[-1].append((wall, m))
    return out


def _sampler(url: str, stop: threading.Event, rows: list[tuple[float, float, float, float]]) -> None:
    from app.loadtest.spawn import scrape_metrics

    while not stop.wait(1.0):
        m = scrape_metrics(url)
        rows.append((time.monotonic(), os.getloadavg()[0], m.get("synchrony_event_loop_lag_max_seconds", -1.0),
                     m.get("synchrony_degradation_level", -1.0)))


def analyse(peers: list[dict[str, Any]], lags_off_ms: float = 5.0) -> None:
    for p in peers:
        if p.get("error"):
            print(f"peer {p['index']}: {p['error']}")
            continue
        lag = np.asarray([x[1] for x in p["lags"]]) * 1000
        peer_gaps, server_gaps, transit, worst = [], [], [], []
        for ans in _answers(p["responses"]):
            pg = [(b[0] - a[0]) * 1000 for a, b in zip(ans, ans[1:], strict=False)]
            sg = [float(b[1].get("itl_ms", np.nan)) for b in ans[1:]]
            if len(pg) < 2:
                continue
            peer_gaps.append(pg)
            server_gaps.append(sg)
            transit.append([a - b for a, b in zip(pg, sg, strict=True)])
            worst.append((worst_sigma(pg) or 0.0, worst_sigma(sg) or 0.0, ans[0][0], pg, sg))
        if not peer_gaps:
            print(f"peer {p['index']}: no answers")
            continue
        allp, alls = np.concatenate(peer_gaps), np.concatenate(server_gaps)
        pace = float(np.median(alls))
        print(f"peer {p['index']}: {len(peer_gaps)} answers, {len(allp)} intervals, pace {pace:.1f} ms")
        print(f"  worst σ8: peer {max(w[0] for w in worst):.2f} ms, server {max(w[1] for w in worst):.2f} ms, "
              f"transit difference {max(worst_sigma(t) or 0 for t in transit):.2f} ms")
        print(f"  intervals off the pace by > {lags_off_ms:g} ms: peer {int(np.sum(np.abs(allp - pace) > lags_off_ms))}"
              f", server {int(np.sum(np.abs(alls - pace) > lags_off_ms))}; transit |Δ| > {lags_off_ms:g} ms: "
              f"{int(np.sum(np.abs(allp - alls) > lags_off_ms))}")
        print(f"  peer loop lag (5 ms timer): p50 {np.percentile(lag, 50):.2f}, p99 {np.percentile(lag, 99):.2f}, "
              f"max {lag.max():.1f} ms; > 10 ms: {int(np.sum(lag > 10))} of {lag.size}")
        for w in sorted(worst, key=lambda w: -w[0])[:3]:
            print(f"  answer at {w[2]:.1f}: peer σ8 {w[0]:.2f}, server σ8 {w[1]:.2f}; peer gaps "
                  f"{[round(x) for x in w[3][:24]]}; server {[round(x) for x in w[4][:24]]}")


def _run(responder: str, variant: str, args: argparse.Namespace) -> None:
    """One server (this tree, or ``base``: the tree at ``--base-commit``), its peers, the break-down.
    ``nice``: the server's event-loop thread (and what it starts from then on) at nice −5, the peers too."""
    from app.loadtest.spawn import SpawnedServer

    standin = None
    extra = ["--responder", responder, *args.server_arg]
    if responder == "openai":
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        standin = subprocess.Popen([sys.executable, "-m", "app.loadtest.llm_standin", "--port", str(port),
                                    "--ttft-ms", str(args.ttft_ms)], stdout=subprocess.DEVNULL)
        extra += ["--llm-url", f"http://127.0.0.1:{port}/v1"]
    log = Path(tempfile.gettempdir()) / f"stream-evenness-{os.getpid()}-{responder}-{variant}.log"
    code = Path(args.base_dir) if variant == "base" else None
    server = SpawnedServer(args.peers + 2, log, extra, code_dir=code)
    rows: list[tuple[float, float, float, float]] = []
    stop = threading.Event()
    nice = -5 if variant == "nice" else 0
    try:
        server.wait_ready()
        if nice:
            os.setpriority(os.PRIO_PROCESS, server.proc.pid, nice)  # the main thread: uvicorn's event loop
        sampler = threading.Thread(target=_sampler, args=(server.url, stop, rows), daemon=True)
        sampler.start()
        ctx = mp.get_context("spawn")
        q: Any = ctx.Queue()
        procs = [ctx.Process(target=_peer_proc, args=(i, server.url, args.duration, 0.5 * i, q, nice))
                 for i in range(args.peers)]
        for pr in procs:
            pr.start()
        peers = [q.get(timeout=args.duration + 180) for _ in procs]
        for pr in procs:
            pr.join(10)
    finally:
        stop.set()
        server.stop()
        if standin is not None:
            standin.terminate()
            standin.wait(10)
    loads = [r[1] for r in rows]
    lag = [r[2] for r in rows if r[2] >= 0]
    levels = sorted({int(r[3]) for r in rows if r[3] >= 0})
    print(f"== {responder}, server {variant}, {args.peers} peers, {args.duration:g} s; load average "
          f"{min(loads, default=0):.2f} → {max(loads, default=0):.2f}; server loop lag (10 s max) "
          f"max {1000 * max(lag, default=0):.1f} ms, median {1000 * float(np.median(lag)) if lag else 0:.1f} ms; "
          f"degradation levels {levels}", flush=True)
    analyse(sorted(peers, key=lambda p: p["index"]))


def simulate(seed: int = 0, words: int = 4000, rate: float = 12.0) -> None:
    """The two schedules under the same wake-up lateness, on a virtual clock (no server): a fixed grid
    (``due_k + interval``, the pacer before) and from the last release (``emitted_k + interval``, now).
    Lateness: exponential noise (mean 1, 3 ms) plus, in 2 % of wake-ups, a stall of 10–60 ms."""
    rng = np.random.default_rng(seed)
    interval = 1000.0 / rate
    for mean in (1.0, 3.0):
        late = rng.exponential(mean, words) + (rng.random(words) < 0.02) * rng.uniform(10, 60, words)
        grid = np.arange(words) * interval + late  # emitted = due + late, due on the grid
        last = np.cumsum(np.full(words, interval) + late)  # emitted = previous emitted + interval + late
        g, r = np.diff(grid), np.diff(last)
        print(f"simulated {words} words at {rate:g} tok/s, wake-up noise mean {mean:g} ms + 2 % stalls 10–60 ms: "
              f"worst σ8 grid {worst_sigma(list(g)):.2f} / last release {worst_sigma(list(r)):.2f} ms; "
              f"median σ8 {np.median(_sigmas(g)):.2f} / {np.median(_sigmas(r)):.2f} ms; "
              f"mean interval {g.mean():.1f} / {r.mean():.1f} ms")


def _sigmas(gaps: np.ndarray) -> np.ndarray:
    return np.std(np.lib.stride_tricks.sliding_window_view(gaps, 8), axis=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--responder", action="append", choices=("openai", "caption", "assistant"))
    ap.add_argument("--variant", action="append", choices=("this", "nice", "base"),
                    help="this tree; this tree with the server's loop and the peers at nice -5; --base-dir's tree")
    ap.add_argument("--base-dir", default="", help="a source tree to compare with (variant base)")
    ap.add_argument("--peers", type=int, default=2)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--ttft-ms", type=float, default=80.0)
    ap.add_argument("--server-arg", action="append", default=[])
    ap.add_argument("--simulate", action="store_true", help="only the two schedules on a virtual clock")
    args = ap.parse_args()
    if args.simulate:
        simulate()
        return 0
    if not (1 <= args.peers <= 4 and 5 <= args.duration <= 300):
        ap.error("--peers 1..4, --duration 5..300")
    variants = args.variant or ["this"]
    if "base" in variants and not Path(args.base_dir, "app").is_dir():
        ap.error("variant base needs --base-dir (a source tree)")
    for responder in args.responder or ["openai"]:
        for variant in variants:
            _run(responder, variant, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
