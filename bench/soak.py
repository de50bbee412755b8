"""Reliability of the live server: connect/disconnect cycles, a vanished peer, a lossy soak.

A fresh server process (every model warmed, as ``synchrony serve`` runs it) gets a debug route
(``app.live.reliability``) so its RSS, threads, asyncio tasks, file descriptors, sessions, ASR streams
and queue depths can be read from outside; the aiortc WHIP peers run in this process.

Phases and targets (each printed with PASS/FAIL):
  * cycles: ``--cycles N`` sessions (talking-face clip, every stage running) connect, get their
    first returned frames and DELETE. Idle server RSS (after a garbage collection) is read after 10
    warm cycles, every 20 cycles and after the last: growth, last − first, must be ≤ 20 MB. The
    readings in between and their least-squares trend are printed too: idle RSS moves in steps of
    ~10–25 MB with heap state, so one pair of readings is a coarse figure. Threads, tasks, fds,
    sessions and ASR streams back to the baseline; no failed cycle.
  * vanish: a peer process is SIGKILLed mid-session (no DELETE, no DTLS close). Its session is
    reaped within the media timeout + 3 s (well inside ICE consent's 30 s), and threads, tasks and
    ASR streams return to what they were before it connected.
  * soak: ``--peers P`` looping sessions for ``--minutes M`` with ``--netem`` (default 5 % loss +
    40±20 ms jitter, both directions). Sampled every ``--interval`` s: RSS, queues, drops. PASS:
    server alive, no session lost, no stage error; RSS over the second half grows ≤ 20 MB; no queue
    grows (the ASR queue stays within its bound and the second half's peak ≤ 1.5× the first half's +
    one chunk); no stage's mean latency grows (second half ≤ 1.5× the first + 50 ms); events still flow.

Usage: .venv/bin/python bench/soak.py [--cycles 200] [--minutes 10] [--peers 2] [--quick] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import Request  # at module level: FastAPI resolves the route's annotations here

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.live.reliability import LoopLag  # noqa: E402
from app.loadtest import testmedia  # noqa: E402
from app.loadtest.peer import WhipError, WhipPeer  # noqa: E402

if TYPE_CHECKING:
    from fastapi import FastAPI

RSS_GROWTH_MB = 20.0
REAP_SLACK_S = 3.0
QUEUE_GROWTH = 1.5
DEFAULT_NETEM = "loss=5%,delay=40ms,jitter=20ms"
#: Per-session bounds the session/ASR code promises (None: no fixed bound, so it must not grow):
#: ASR queue 5 s of audio (ASRWorker.max_queue_s), 64 camera frames, tokens pruned at 400, events
#: channel 1 MiB; frames with words still to draw are pruned once sent (a few seconds ahead at most).
QUEUE_BOUNDS: dict[str, float | None] = {
    "asr_queued_s": 5.0 + 0.1, "camera_frames": 64, "tokens_held": 400, "frame_words": 200,
    "channel_buffered": 1 << 20, "tasks": None, "threads": None,
}


# --- the server process -----------------------------------------------------------------------


def install_debug_route(app: FastAPI, path: str = "/debug/resources") -> None:
    """Add ``GET path`` (``?gc=1``, ``?trim=1``: see ``app.live.reliability.snapshot``) returning JSON."""
    from app.live.reliability import heap_mb, snapshot

    async def resources(request: Request) -> dict[str, object]:
        q = request.query_params
        return snapshot(app, collect=q.get("gc") == "1", trim=q.get("trim") == "1").as_dict()

    async def allocations(request: Request) -> dict[str, object]:
        """``?at=start`` keeps a tracemalloc snapshot; ``?at=diff`` lists where memory grew since (by line)."""
        import gc
        import tracemalloc

        if not tracemalloc.is_tracing():
            return {"error": "start the server with PYTHONTRACEMALLOC=1 (bench/soak.py --trace-leaks)"}
        gc.collect()
        now = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        if request.query_params.get("at") == "start":
            app.state.leak_snapshot = now
            return {"kept": len(now.traces)}
        stats = now.compare_to(app.state.leak_snapshot, "lineno")
        return {"grew": [f"{st.size_diff / 1e6:+.2f} MB in {st.count_diff:+d} blocks at {st.traceback}"
                         for st in stats[:25]]}

    async def heap(request: Request) -> dict[str, object]:
        """Where idle RSS sits: glibc's arenas (in use / free / mmapped) and Python's own blocks."""
        return {"py_blocks": sys.getallocatedblocks(), **(heap_mb() or {})}

    app.add_api_route(path, resources, methods=["GET"])
    app.add_api_route(path + "/heap", heap, methods=["GET"])
    app.add_api_route(path + "/allocations", allocations, methods=["GET"])


def _serve(port_file: str, max_sessions: int, media_timeout_s: float) -> None:
    """Child process: the real server (all models warmed) plus the debug route; port → port_file."""
    import logging

    from app.live.reliability import bound_native_memory

    bound_native_memory()  # as `synchrony serve` does
    from app.live.server import ServerConfig, create_app, running_server

    logging.basicConfig(level=logging.WARNING, format="server %(levelname)s %(name)s: %(message)s")

    async def main() -> None:
        app = create_app(ServerConfig.in_process(ui=False, max_sessions=max_sessions,
                                                 media_timeout_s=media_timeout_s))
        install_debug_route(app)
        async with running_server(app) as base:
            Path(port_file).write_text(base)
            while True:
                await asyncio.sleep(3600)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


class ServerProcess:
    """Start the child server and wait until /readyz says every model is warm."""

    def __init__(self, max_sessions: int, media_timeout_s: float, trace_leaks: bool = False) -> None:
        self.port_file = tempfile.NamedTemporaryFile(prefix="soak-", suffix=".url", delete=False).name
        Path(self.port_file).write_text("")
        env = {**os.environ, "PYTHONTRACEMALLOC": "1"} if trace_leaks else None
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", self.port_file, "--max-sessions", str(max_sessions),
             "--media-timeout", str(media_timeout_s)], cwd=ROOT, env=env)
        self.base = ""

    async def start(self, timeout: float = 300.0) -> float:
        t0 = time.monotonic()
        while not (base := Path(self.port_file).read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"server did not start (exit code {self.proc.poll()})")
            await asyncio.sleep(0.1)
        self.base = base
        async with httpx.AsyncClient(base_url=base, timeout=5.0) as c:
            while (await c.get("/readyz")).status_code != 200:
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError("server not ready in time")
                await asyncio.sleep(0.2)
        return time.monotonic() - t0

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        os.unlink(self.port_file)


async def resources(base: str, collect: bool = False, trim: bool = False) -> dict[str, Any]:
    params = {"gc": "1" if collect else "0", "trim": "1" if trim else "0"}
    async with httpx.AsyncClient(base_url=base, timeout=10.0) as c:
        return (await c.get("/debug/resources", params=params)).json()


async def metrics(base: str) -> dict[str, float]:
    """The server's Prometheus counters and gauges as ``name{labels}`` → value."""
    async with httpx.AsyncClient(base_url=base, timeout=10.0) as c:
        text = (await c.get("/metrics")).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(synchrony_\w+(?:\{[^}]*\})?) ([-+0-9.eEinfa]+)$", line)
        if m and not m.group(1).endswith(("_bucket", "_created")) and "_bucket{" not in m.group(1):
            out[m.group(1)] = float(m.group(2))
    return out


def _select(m: dict[str, float], prefix: str) -> dict[str, float]:
    return {k[len(prefix):].strip("{}"): v for k, v in m.items() if k.startswith(prefix)}


#: Stage latencies the soak follows per interval (the server's histograms; ``au``: camera frame → ``au`` event,
#: ``token_*``: a word's end → its token event, ``render``: camera time → frame out).
LATENCY_STAGES = ("au", "token_interim", "token_final", "render")
LATENCY_GROWTH = 1.5  # the second half's mean latency of a stage may be at most this × the first half's + 50 ms


def _stage_totals(m: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Per stage, the latency histogram's (sum, count) so far."""
    sums = _select(m, "synchrony_stage_latency_seconds_sum")
    counts = _select(m, "synchrony_stage_latency_seconds_count")
    return {st: (sums.get(f'stage="{st}"', 0.0), counts.get(f'stage="{st}"', 0.0)) for st in LATENCY_STAGES}


def _interval_means(now: dict[str, tuple[float, float]], before: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean latency (ms) per stage over one interval; a stage with no event in it is left out."""
    out = {}
    for st, (total, n) in now.items():
        d_sum, d_n = total - before[st][0], n - before[st][1]
        if d_n > 0:
            out[st] = round(1000 * d_sum / d_n, 1)
    return out


async def settled(base: str, baseline: dict[str, Any] | None = None, timeout: float = 20.0) -> dict[str, Any]:
    """Resources once no session/stream is left and threads/tasks are back (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while True:
        r = await resources(base)
        done = r["sessions"] == 0 and r["asr_streams"] == 0
        if baseline is not None:
            done = done and r["threads"] <= baseline["threads"] and r["tasks"] <= baseline["tasks"]
        if done or time.monotonic() > deadline:
            await asyncio.sleep(0.5)
            r = await resources(base, collect=True)
            r["rss_trimmed_mb"] = (await resources(base, trim=True))["rss_mb"]
            return r
        await asyncio.sleep(0.2)


#: Server-wide thread pools that grow lazily to a fixed maximum: asyncio's default executor and the
#: frame renderer's (app.live.output, 2 workers). A thread of theirs appearing is not a session's leak.
_FIXED_POOLS = ("asyncio_", "render_")


def _own_threads(r: dict[str, Any]) -> int:
    """Threads other than the fixed pools' (``_FIXED_POOLS``)."""
    return sum(1 for n in r["thread_names"] if not n.startswith(_FIXED_POOLS))


def _left_behind(before: dict[str, Any], after: dict[str, Any], counts: tuple[str, ...]) -> dict[str, int]:
    """What a phase left behind: each count's change, and threads outside the fixed pools."""
    out = {k: after[k] - before[k] for k in counts}
    out["threads"] = _own_threads(after) - _own_threads(before)
    return out


def _new_threads(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(set(after["thread_names"]) - set(before["thread_names"]))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# --- phases -----------------------------------------------------------------------------------


async def one_cycle(url: str, clip: Any) -> float:
    """Connect, wait for the hello and two returned frames, DELETE; returns the seconds it took."""
    t0 = time.monotonic()
    for _ in range(20):
        peer = WhipPeer(url, clip, loop=True)
        try:
            await peer.connect(timeout=20)
            break
        except WhipError as exc:
            if exc.status != 503:
                raise
            await asyncio.sleep(float(exc.retry_after or 1))
        except BaseException:
            await peer.close(delete=False)
            raise
    else:
        raise RuntimeError("server stayed full")
    try:
        await peer.wait_for("hello", timeout=20)
        await peer.wait_frames(2, timeout=30)
    finally:
        status = await peer.close()
    if status != 200:
        raise RuntimeError(f"DELETE answered {status}")
    return time.monotonic() - t0


async def phase_cycles(base: str, clip: Any, n: int, parallel: int, trace_leaks: bool = False) -> dict[str, Any]:
    url = f"{base}/whip"
    for _ in range(10):  # warm: first sessions fill caches (codecs, MediaPipe graphs, oneDNN primitives)
        await asyncio.gather(*(one_cycle(url, clip) for _ in range(parallel)))
    before = await settled(base)
    print(f"  after 10 warm cycles: idle server RSS {before['rss_mb']:.1f} MB, heap {await _heap(base)}", flush=True)
    if trace_leaks:
        await _allocations(base, "start")
    times: list[float] = []
    failures: list[str] = []
    checkpoints: list[tuple[int, float]] = [(0, before["rss_mb"])]
    done = 0
    t0 = time.monotonic()
    while done < n:
        batch = min(parallel, n - done)
        results = await asyncio.gather(*(one_cycle(url, clip) for _ in range(batch)), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                failures.append(f"{type(r).__name__}: {r}"[:200])
            else:
                times.append(r)
        done += batch
        if done % 20 < parallel and done < n:
            r = await settled(base, before)  # idle, like ``before``: a leak shows as a rising series
            checkpoints.append((done, r["rss_mb"]))
            print(f"  cycles {done}/{n}: idle server RSS {r['rss_mb']:.1f} MB, threads {r['threads']}, "
                  f"tasks {r['tasks']}, heap {await _heap(base)}, {time.monotonic() - t0:.0f} s", flush=True)
    after = await settled(base, before)
    checkpoints.append((n, after["rss_mb"]))
    print(f"  cycles {n}/{n}: idle server RSS {after['rss_mb']:.1f} MB, heap {await _heap(base)}", flush=True)
    if trace_leaks:
        for line in (await _allocations(base, "diff")).get("grew", []):
            print(f"  grew: {line}", flush=True)
    growth = after["rss_mb"] - before["rss_mb"]
    trend = _trend(checkpoints) * n
    held = after["rss_trimmed_mb"] - before["rss_trimmed_mb"]
    leaks = _left_behind(before, after, ("tasks", "fds", "sessions", "asr_streams"))
    new_threads = _new_threads(before, after)
    ok = growth <= RSS_GROWTH_MB and all(v <= 0 for v in leaks.values()) and not failures
    times.sort()
    return {"ok": ok, "cycles": n, "parallel": parallel, "failures": failures[:10], "n_failures": len(failures),
            "rss_before_mb": before["rss_mb"], "rss_after_mb": after["rss_mb"], "rss_growth_mb": round(growth, 2),
            "rss_trend_mb": round(trend, 2),
            "rss_growth_after_trim_mb": round(held, 2),
            "rss_checkpoints_mb": checkpoints,
            "leaked": leaks, "new_threads": new_threads,
            "cycle_s_p50": round(times[len(times) // 2], 2) if times else None,
            "wall_s": round(time.monotonic() - t0, 1)}


async def _heap(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, timeout=30.0) as c:
        return (await c.get("/debug/resources/heap")).json()


async def _allocations(base: str, at: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, timeout=120.0) as c:
        return (await c.get("/debug/resources/allocations", params={"at": at})).json()


def _trend(points: list[tuple[int, float]]) -> float:
    """Least-squares slope (MB per cycle) of idle RSS readings against the cycle count."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


async def phase_vanish(base: str, media_timeout_s: float) -> dict[str, Any]:
    before = await settled(base)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.loadtest.peer", f"{base}/whip", cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    async with httpx.AsyncClient(base_url=base, timeout=5.0) as c:
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 120)  # type: ignore[union-attr]
            location = line.decode().strip()
            sid = location.rsplit("/", 1)[-1]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                resp = await c.get(f"/whip/{sid}")
                if resp.status_code == 200 and resp.json().get("frames_sent", 0) >= 5:
                    break
                await asyncio.sleep(0.2)
            during = await resources(base)
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        t_kill = time.monotonic()
        while (await c.get(f"/whip/{sid}")).status_code == 200 and time.monotonic() - t_kill < 60:
            await asyncio.sleep(0.1)
        reaped_s = time.monotonic() - t_kill
        m = await metrics(base)
    after = await settled(base, before)
    back = _left_behind(before, after, ("tasks", "sessions", "asr_streams"))
    ok = reaped_s <= media_timeout_s + REAP_SLACK_S and all(v <= 0 for v in back.values())
    return {"ok": ok, "reaped_s": round(reaped_s, 2), "limit_s": media_timeout_s + REAP_SLACK_S,
            "during": {k: during[k] for k in ("sessions", "asr_streams", "threads", "tasks")},
            "after_minus_before": back, "new_threads": _new_threads(before, after),
            "ended": _select(m, "synchrony_sessions_ended_total")}


async def phase_soak(base: str, clip: Any, peers: int, minutes: float, interval: float,
                     netem: str) -> dict[str, Any]:
    from app.loadtest.netem import NetemLink, parse_profile

    profile = parse_profile(netem)
    ended_before = _select(await metrics(base), "synchrony_sessions_ended_total")  # earlier phases' endings
    links: list[NetemLink] = []
    live: list[WhipPeer] = []
    for i in range(peers):
        peer = WhipPeer(f"{base}/whip", clip, loop=True, keep_frames=1)
        link = NetemLink(profile, seed=1000 + i)
        peer.pc.on("icegatheringstatechange", lambda p=peer, lk=link: lk.attach_pc(p.pc))
        await peer.connect(timeout=30)
        links.append(link)
        live.append(peer)
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    end = t0 + minutes * 60
    lost: list[str] = []
    client_lag = LoopLag(window_s=interval)
    lag_watch = asyncio.create_task(client_lag.watch())
    totals = _stage_totals(await metrics(base))
    try:
        while True:
            now = time.monotonic()
            r = await resources(base)
            m = await metrics(base)
            latest = _stage_totals(m)
            latency_ms, totals = _interval_means(latest, totals), latest
            events = sum(len(p.events) for p in live)
            frames = sum(p.frames_received for p in live)
            per_session = []
            async with httpx.AsyncClient(base_url=base, timeout=10.0) as c:
                for p in live:
                    resp = await c.get(f"/whip/{p.session_id}")
                    info = resp.json() if resp.status_code == 200 else {}
                    per_session.append({"frames_received": p.frames_received, "events": len(p.events),
                                        "frames_sent": info.get("frames_sent"), "degraded": info.get("degraded"),
                                        "state": p.pc.connectionState})
            samples.append({"t_s": round(now - t0, 1), "rss_mb": r["rss_mb"], "sessions": r["sessions"],
                            "threads": _own_threads(r), "tasks": r["tasks"],
                            "asr_queue_chunks": r["asr_queue_chunks"],
                            "asr_queued_s": r["asr_queued_s"], "camera_frames": r["camera_frames"],
                            "tokens_held": r["tokens_held"], "frame_words": r["frame_words"],
                            "channel_buffered": r["channel_buffered"],
                            "drops": _select(m, "synchrony_drops_total"), "events": events, "frames": frames,
                            "per_session": per_session, "latency_ms": latency_ms,
                            "loop_lag_s": {"server": round(m.get("synchrony_event_loop_lag_max_seconds", -1.0), 3),
                                           "client": round(client_lag.max_s(), 3)},
                            "loop_stalls": {"server": m.get("synchrony_event_loop_stall_count", -1.0),
                                            "client": client_lag.stalls},
                            "server_alive": True})
            s = samples[-1]
            print(f"  soak {s['t_s']:6.0f} s: RSS {s['rss_mb']:.1f} MB, sessions {s['sessions']}, ASR queue "
                  f"{s['asr_queued_s']:.2f} s, camera {s['camera_frames']}, tokens {s['tokens_held']}, "
                  f"events {events}, frames {frames}, drops {sum(s['drops'].values()):.0f}; per session "
                  f"{[(x['frames_received'], x['frames_sent']) for x in per_session]}; loop lag max "
                  f"server {s['loop_lag_s']['server']:.2f} s, client {s['loop_lag_s']['client']:.2f} s; latency ms "
                  f"{s['latency_ms']}", flush=True)
            for p in live:
                if p.pc.connectionState in ("failed", "closed") and p.session_id not in lost:
                    lost.append(str(p.session_id))
            if now >= end:
                break
            await asyncio.sleep(min(interval, max(end - time.monotonic(), 0.0)))
    finally:
        lag_watch.cancel()
        for p in live:
            await p.close()
    m = await metrics(base)
    return _soak_verdict(samples, m, lost, [lk.stats() for lk in links], peers, minutes, netem, ended_before)


def _soak_verdict(samples: list[dict[str, Any]], m: dict[str, float], lost: list[str],
                  link_stats: list[dict[str, Any]], peers: int, minutes: float, netem: str,
                  ended_before: dict[str, float]) -> dict[str, Any]:
    half = len(samples) // 2
    first, second = samples[:half] or samples, samples[half:]
    rss_growth = max(s["rss_mb"] for s in second) - second[0]["rss_mb"]
    queues = {}
    for q, bound in QUEUE_BOUNDS.items():
        a, b = max(s[q] for s in first), max(s[q] for s in second)
        limit = bound * peers if bound is not None else QUEUE_GROWTH * a + 1
        queues[q] = {"first_half_max": a, "second_half_max": b, "limit": limit, "grows": b > limit}
    ended = {k: v - ended_before.get(k, 0.0) for k, v in _select(m, "synchrony_sessions_ended_total").items()}
    errors = {k: v for k, v in _select(m, "synchrony_stage_errors_total").items() if v > 0}
    flowing = len(samples) >= 2 and samples[-1]["events"] > samples[-2]["events"] and \
        samples[-1]["frames"] > samples[-2]["frames"]
    abnormal = {k: v for k, v in ended.items() if "client DELETE" not in k and v > 0}
    loss = [round(ls[d]["loss_rate"], 4) for ls in link_stats for d in ("up", "down") if "loss_rate" in ls[d]]
    latency = _latency_halves(first, second)
    ok = (not lost and not abnormal and not errors and rss_growth <= RSS_GROWTH_MB and flowing
          and not any(v["grows"] for v in latency.values())
          and not any(q["grows"] for q in queues.values())
          and all(s["sessions"] == peers for s in samples))
    return {"ok": ok, "peers": peers, "minutes": minutes, "netem": netem, "measured_loss": loss,
            "samples": len(samples), "rss_first_mb": samples[0]["rss_mb"], "rss_last_mb": samples[-1]["rss_mb"],
            "rss_max_mb": max(s["rss_mb"] for s in samples), "rss_growth_second_half_mb": round(rss_growth, 2),
            "queues": queues, "latency_ms": latency, "drops": samples[-1]["drops"], "sessions_lost": lost,
            "ended": ended,
            "loop_lag_max_s": {side: max(s["loop_lag_s"][side] for s in samples) for side in ("server", "client")},
            "loop_stalls": samples[-1]["loop_stalls"],
            "stage_errors": errors, "events_flowing_at_end": flowing, "timeline": samples}


def _latency_halves(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stage, the mean of the interval means in each half, and whether the second half's grew."""
    out = {}
    for st in LATENCY_STAGES:
        a = [s["latency_ms"][st] for s in first if st in s["latency_ms"]]
        b = [s["latency_ms"][st] for s in second if st in s["latency_ms"]]
        if not a or not b:
            continue
        mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
        out[st] = {"first_half_ms": round(mean_a, 1), "second_half_ms": round(mean_b, 1),
                   "max_interval_ms": max(a + b), "grows": mean_b > LATENCY_GROWTH * mean_a + 50.0}
    return out


# --- main -------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    load0 = os.getloadavg()
    server = ServerProcess(max(args.peers, args.parallel) + 1, args.media_timeout, args.trace_leaks)
    try:
        ready_s = await server.start()
        print(f"server ready in {ready_s:.1f} s at {server.base}", flush=True)
        clip = testmedia.make_av_clip()
        out: dict[str, Any] = {"ready_s": round(ready_s, 1)}
        if args.cycles:
            print(f"cycles: {args.cycles} connect/disconnect ({args.parallel} at a time) ...", flush=True)
            out["cycles"] = await phase_cycles(server.base, clip, args.cycles, args.parallel, args.trace_leaks)
        if not args.no_vanish:
            print("vanish: SIGKILL a peer mid-session ...", flush=True)
            out["vanish"] = await phase_vanish(server.base, args.media_timeout)
        if args.minutes > 0:
            print(f"soak: {args.peers} peers, {args.minutes} min, netem {args.netem} ...", flush=True)
            out["soak"] = await phase_soak(server.base, clip, args.peers, args.minutes, args.interval, args.netem)
            out["soak"]["server_alive"] = server.alive
            out["soak"]["ok"] = out["soak"]["ok"] and server.alive
    finally:
        server.stop()
    out["load_before"] = [round(x, 2) for x in load0]
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def report(out: dict[str, Any], command: str) -> bool:
    print(f"\ncommand: {command}")
    print(f"machine: {os.cpu_count()} CPUs, load average before {out['load_before']}, after {out['load_after']}")
    ok = True
    if "cycles" in out:
        c = out["cycles"]
        print(f"cycles  {verdict(c['ok'])}: {c['cycles']} cycles ({c['parallel']} at a time, {c['wall_s']} s, "
              f"p50 {c['cycle_s_p50']} s/cycle), server RSS {c['rss_before_mb']} → {c['rss_after_mb']} MB "
              f"(growth {c['rss_growth_mb']} MB, target ≤ {RSS_GROWTH_MB}; after a heap trim "
              f"{c['rss_growth_after_trim_mb']} MB; idle readings every 20 cycles "
              f"{[round(v) for _, v in c['rss_checkpoints_mb']]}, trend {c['rss_trend_mb']} MB); leaked {c['leaked']}; "
              f"failed cycles {c['n_failures']} {c['failures'][:2]}")
        ok &= c["ok"]
    if "vanish" in out:
        v = out["vanish"]
        print(f"vanish  {verdict(v['ok'])}: reaped {v['reaped_s']} s after SIGKILL (target ≤ {v['limit_s']} s); "
              f"during {v['during']}; after − before {v['after_minus_before']} (new threads {v['new_threads']})")
        ok &= v["ok"]
    if "soak" in out:
        s = out["soak"]
        grows = [k for k, q in s["queues"].items() if q["grows"]]
        print(f"soak    {verdict(s['ok'])}: {s['peers']} peers × {s['minutes']} min, netem {s['netem']} "
              f"(measured loss {s['measured_loss']}); server alive {s['server_alive']}; RSS {s['rss_first_mb']} → "
              f"{s['rss_last_mb']} MB (max {s['rss_max_mb']}, second-half growth {s['rss_growth_second_half_mb']} MB, "
              f"target ≤ {RSS_GROWTH_MB}); growing queues {grows or 'none'}; sessions lost {s['sessions_lost']}; "
              f"stage errors {s['stage_errors'] or 'none'}; drops {s['drops']}; "
              f"events flowing {s['events_flowing_at_end']}; event-loop lag max {s['loop_lag_max_s']} s, "
              f"stalls > 0.25 s {s['loop_stalls']}")
        for q, v in s["queues"].items():
            print(f"          {q}: first-half max {v['first_half_max']}, second-half max {v['second_half_max']} "
                  f"(limit {v['limit']})")
        for st, v in s["latency_ms"].items():
            print(f"          latency {st}: mean {v['first_half_ms']} → {v['second_half_ms']} ms (first → second half; "
                  f"worst interval {v['max_interval_ms']} ms; grows {v['grows']})")
        ok &= s["ok"]
    print(f"overall {verdict(ok)}")
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=200)
    p.add_argument("--parallel", type=int, default=2, help="sessions cycled at once")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--peers", type=int, default=2)
    p.add_argument("--interval", type=float, default=10.0, help="soak sampling interval, s")
    p.add_argument("--netem", default=DEFAULT_NETEM)
    p.add_argument("--media-timeout", type=float, default=5.0, help="server's reaping timeout, s")
    p.add_argument("--no-vanish", action="store_true")
    p.add_argument("--trace-leaks", action="store_true",
                   help="run the server under tracemalloc and print where memory grew over the cycles (slow)")
    p.add_argument("--quick", action="store_true", help="20 cycles, a 1-minute soak sampled every 5 s")
    p.add_argument("--json", default=None, help="write the figures (with the soak timeline) here")
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    p.add_argument("--max-sessions", type=int, default=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        _serve(args.serve, args.max_sessions, args.media_timeout)
        return
    if args.quick:
        args.cycles, args.minutes, args.interval = min(args.cycles, 20), min(args.minutes, 1.0), 5.0
    command = " ".join([".venv/bin/python", "bench/soak.py", *sys.argv[1:]])
    out = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, **out}, indent=1))
    sys.exit(0 if report(out, command) else 1)


if __name__ == "__main__":
    main()
