"""Where a spawned server's CPU goes per thread while light peers run: which thread waits on which.

Spawns ``synchrony serve`` (every session admitted, no degradation), runs one load-test round, and
samples, once a second, every server thread's (and ASR lane process's) kernel counters: CPU, time
spent runnable but waiting for a core (``schedstat``), context switches; plus the machine's
``/proc/stat`` split and the server's event-loop lag. Optionally ``py-spy`` dumps or a recording
(``--record``). Threads that wait runnable for longer than they run, switching thousands of times a
second, while the machine still has idle time, are handing the interpreter lock back and forth.

Usage: PYTHONPATH=$PWD python bench/threads_diag.py [--peers 2] [--duration 20] [--pyspy 0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.loadtest import config, rounds, spawn  # noqa: E402

_CLK = os.sysconf("SC_CLK_TCK")


def tasks(pid: int) -> list[str]:
    """/proc paths of every thread of ``pid`` and of its child processes (the ASR lane processes)."""
    import psutil

    try:
        pids = [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        pids = [pid]
    out = []
    for p in pids:
        try:
            out += [f"/proc/{p}/task/{t}" for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
    return out


T = TypeVar("T")


def _per_thread(pid: int, file: str, read: Callable[[str], T]) -> dict[int, T]:
    """tid -> ``read`` of each live thread's ``/proc/<pid>/task/<tid>/<file>`` (threads that end
    between listing and reading are left out)."""
    out: dict[int, T] = {}
    for path in tasks(pid):
        try:
            with open(f"{path}/{file}") as fh:
                out[int(path.rsplit("/", 1)[1])] = read(fh.read())
        except (OSError, IndexError, ValueError):
            continue
    return out


def run_delay(pid: int) -> dict[int, float]:
    """tid -> seconds each thread waited runnable for a core (``schedstat``'s run delay)."""
    return _per_thread(pid, "schedstat", lambda text: int(text.split()[1]) / 1e9)


def ctx_switches(pid: int) -> dict[int, int]:
    """tid -> context switches (voluntary + involuntary) of each live thread of ``pid`` so far."""
    return _per_thread(pid, "status", lambda text: sum(int(line.split()[-1]) for line in text.splitlines()
                                                       if "ctxt_switches" in line))


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (comm, CPU seconds) of every thread of ``pid``."""
    out = {}
    for path in tasks(pid):
        entry = path.rsplit("/", 1)[1]
        try:
            raw = open(f"{path}/stat", "rb").read().decode(errors="replace")
        except OSError:
            continue
        comm = raw[raw.find("(") + 1 : raw.rfind(")")]
        f = raw[raw.rfind(")") + 2 :].split()
        out[int(entry)] = (comm, (int(f[11]) + int(f[12])) / _CLK)
    return out


PYSPY = str(Path(sys.executable).parent / "py-spy")


def python_names(pid: int) -> dict[int, str]:
    """OS thread id -> Python thread name (``py-spy dump --json``; empty without py-spy)."""
    import json

    try:
        r = subprocess.run([PYSPY, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
        return {t["os_thread_id"]: t.get("thread_name") or "?" for t in json.loads(r.stdout)}
    except Exception:  # noqa: BLE001
        return {}


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: everything but idle and iowait)."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(f) - f[3] - f[4]) / _CLK


def machine_split() -> list[int]:
    """/proc/stat's first line: user nice system idle iowait irq softirq steal (ticks)."""
    return [int(x) for x in open("/proc/stat").readline().split()[1:9]]


def sampler(pid: int, stop: threading.Event, url: str, rows: list[dict[str, Any]], pyspy: int,
            dumps: list[str], names: dict[int, str], record: int, out: Path) -> None:
    """Once a second: per-thread CPU and a few /metrics figures; ``pyspy`` dumps spread over the run."""
    last = thread_cpu(pid)
    t_last = time.monotonic()
    m_last = machine_busy_s()
    d_last = run_delay(pid)
    x_last = ctx_switches(pid)
    n = 0
    while not stop.wait(1.0):
        now, cur = time.monotonic(), thread_cpu(pid)
        dt = now - t_last
        per: dict[int, float] = {}
        for tid, (comm, cpu) in cur.items():
            per[tid] = (cpu - last.get(tid, (comm, 0.0))[1]) / dt
        try:
            m = spawn.scrape_metrics(url)
        except Exception:  # noqa: BLE001
            m = {}
        m_now = machine_busy_s()
        d_now = run_delay(pid)
        x_now = ctx_switches(pid)
        delay = {t: (v - d_last.get(t, 0.0)) / dt for t, v in d_now.items()}
        rows.append({"machine": (m_now - m_last) / dt, "t": now, "per": per, "delay": delay,
                     "ctx": {t: (v - x_last.get(t, 0)) / dt for t, v in x_now.items()},
                     "comm": {t: c for t, (c, _) in cur.items()}, "lag": m.get("synchrony_event_loop_lag_max_seconds"),
                     "sessions": m.get("synchrony_sessions")})
        last, t_last, m_last, d_last, x_last = cur, now, m_now, d_now, x_now
        n += 1
        if n == 6 and record:
            mode = ["--nonblocking"] if record < 0 else ["--native"]
            subprocess.Popen([PYSPY, "record", "--pid", str(pid), "--idle", "--threads", *mode,
                              "-r", "100", "-d", str(abs(record)), "-f", "raw", "-o", str(out / "record.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if n % 5 == 2:
            names.update(python_names(pid))
        if pyspy and n % 4 == 0 and len(dumps) < pyspy:
            r = subprocess.run([PYSPY, "dump", "--pid", str(pid)], capture_output=True, text=True)
            dumps.append(r.stdout + r.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", type=int, default=2)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--pyspy", type=int, default=0, help="py-spy dumps to take (every 4 s)")
    p.add_argument("--record", type=int, default=0, help="py-spy record this many seconds (--native; <0: --gil)")
    p.add_argument("--extra", default="", help="more `synchrony serve` arguments")
    p.add_argument("--out", default="/tmp/capdiag")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = spawn.SpawnedServer(args.peers + 2, out / "server.log",
                                 ["--admission", "fixed", "--no-degrade", *args.extra.split()])
    rows: list[dict[str, Any]] = []
    dumps: list[str] = []
    names: dict[int, str] = {}
    try:
        server.wait_ready()
        time.sleep(3.0)
        split0, w0 = machine_split(), time.monotonic()
        stop = threading.Event()
        th = threading.Thread(target=sampler, args=(server.proc.pid, stop, server.url, rows, args.pyspy, dumps,
                                                      names, args.record, out))
        th.start()
        cfg = config.RoundConfig(url=server.url, duration_s=args.duration)
        specs = config.plan_peers(args.peers, 1, 0.5, {}, "clean")
        rnd = rounds.run_round(specs, cfg, server.proc.pid).to_json()
        stop.set()
        th.join()
    finally:
        server.stop()
    split1, w1 = machine_split(), time.monotonic()
    names_ = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    print("machine over the round (cores): " + ", ".join(
        f"{n} {(b - a) / _CLK / (w1 - w0):.2f}" for n, a, b in zip(names_, split0, split1, strict=True)))
    busy = [r for r in rows if (r["sessions"] or 0) >= args.peers]
    tot: dict[str, float] = defaultdict(float)
    wait: dict[str, float] = defaultdict(float)
    ctx: dict[str, float] = defaultdict(float)
    for r in busy:
        for tid, v in r["per"].items():
            key = f"{names.get(tid, r['comm'][tid])} [{tid}]"
            tot[key] += v / max(len(busy), 1)
            wait[key] += r["delay"].get(tid, 0.0) / max(len(busy), 1)
            ctx[key] += r["ctx"].get(tid, 0.0) / max(len(busy), 1)
    agg = rnd["aggregate"]
    print(f"peers {args.peers}: p95 {agg['latency_ms_p95']} ms, Level-3 {agg['level3_pass_rate']}, "
          f"recall {agg['recall']}; client {agg.get('client_cpu_per_peer')} cores per peer; "
          f"{len(busy)} s with all sessions live")
    mach = [r["machine"] for r in busy if "machine" in r]
    print(f"context switches {sum(sum(r['ctx'].values()) for r in busy) / max(len(busy), 1):.0f}/s (server threads)")
    print(f"machine busy {sum(mach) / max(len(mach), 1):.2f} cores (all processes)")
    print(f"process {sum(tot.values()):.2f} cores, waited runnable {sum(wait.values()):.2f}; "
          "loop lag max (10 s windows): "
          f"{max((r['lag'] or 0) for r in busy) if busy else None}")
    for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
        if v >= 0.005:
            print(f"  {k:<28}{v:6.3f} cores, waited runnable {wait[k]:6.3f}, {ctx[k]:6.0f} switches/s")
    for i, d in enumerate(dumps):
        (out / f"pyspy-{i}.txt").write_text(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
