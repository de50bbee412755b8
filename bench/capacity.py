"""Server CPU per full-pipeline session, per stage, and what a simulated load-test peer costs.

Spawns ``synchrony serve`` on 127.0.0.1 (from this tree, every session admitted, no degradation;
with ``--baseline REF`` first from that git commit too, in the same run, so the two figures share
the machine's conditions, with the same flags where that tree has them), runs one load-test round
of ``--peers`` light peers (pre-encoded media,
returned video counted, not decoded) looping the load test's sentence, and prints:

* server CPU per peer: the server process's CPU seconds during the round (psutil) per second a peer
  streamed (connect and teardown included), target ≤ ``--target`` cores;
* per stage, CPU-ms per second of media, from the server's per-thread counters
  (``synchrony_stage_cpu_seconds_total``, ``app.live.cpu_account``; this tree only), and their sum
  without the ASR: what a session would cost were its recognition free, the floor no ASR work can lower;
* the simulated peers' own CPU per peer (load-test workers after their clips were built), target ≤ 5 %;
* the round's word→token p95, Level-3 pass and recall, and the load average (the machine may be shared).

Exit 1 when a target is missed, 0 otherwise. CPU per session falls when the machine is short of
CPU (the ASR then decodes larger steps), so figures taken under a load average above the core
count understate it; the load average is printed with each figure.

Usage: PYTHONPATH=$PWD python bench/capacity.py [--peers 1] [--duration 30] [--baseline 79fed9e]
       [--variant '--shed 3']
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baseline import baseline_tree  # noqa: E402 - bench/baseline.py, beside this script

from app.live.cpu_account import STAGES  # noqa: E402
from app.loadtest import config, loopclip, rounds, spawn  # noqa: E402

SERVER_TARGET_CORES = 0.30
CLIENT_TARGET_CORES = 0.05


def stage_cpu(whip_url: str) -> dict[str, float]:
    """The server's per-stage CPU counters (empty for a server without them)."""
    metrics = spawn.scrape_metrics(whip_url)
    out = {}
    for stage in STAGES:
        key = f'synchrony_stage_cpu_seconds_total{{stage="{stage}"}}'
        if key in metrics:
            out[stage] = metrics[key]
    return out


def server_cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of the server process and its child processes (ASR lane processes) so far."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def measure(label: str, code_dir: Path | None, args: argparse.Namespace, out_dir: Path,
            extra: list[str] | None = None) -> dict[str, Any]:
    """One spawned server, one round of light peers: CPU per peer (server, per stage, client) and bounds.
    ``extra``: more arguments for the server (a ``--variant``)."""
    cli = ((code_dir or ROOT) / "app" / "cli.py").read_text()
    fixed = ["--admission", "fixed", "--no-degrade"] if "--no-degrade" in cli else []  # older trees lack them
    server = spawn.SpawnedServer(args.peers + 2, out_dir / f"server-{label.replace(' ', '_')}.log",
                                 fixed + (extra or []), code_dir=code_dir)
    try:
        ready = server.wait_ready()
        proc = psutil.Process(server.proc.pid)
        time.sleep(3.0)  # let warm-up threads finish
        cfg = config.RoundConfig(url=server.url, duration_s=args.duration)
        specs = config.plan_peers(args.peers, min(args.workers, args.peers), args.stagger, {}, "clean")
        load_before = os.getloadavg()
        stages0, cpu0 = stage_cpu(server.url), server_cpu_s(proc)
        rnd = rounds.run_round(specs, cfg, server.proc.pid).to_json()
        cpu1, stages1 = server_cpu_s(proc), stage_cpu(server.url)
        readyz = httpx.get(server.url.replace("/whip", "/readyz"), timeout=5).json()
    finally:
        server.stop()
    streamed = sum(p.get("run_s", 0.0) for p in rnd["peers"] if p.get("connected"))
    server_s = cpu1 - cpu0
    agg = rnd["aggregate"]
    return {
        "label": label, "ready_after_s": ready.get("ready_after_s"), "peer_seconds": round(streamed, 1),
        "server_cores_per_peer": round(server_s / streamed, 3) if streamed else None,
        "stages_ms_per_s": {k: round(1000 * (stages1[k] - stages0.get(k, 0.0)) / streamed, 1)
                            for k in stages1} if streamed and stages1 else {},
        "client_cores_per_peer": agg.get("client_cpu_per_peer"),
        "p95_ms": agg["latency_ms_p95"], "level3": agg["level3_pass_rate"], "recall": agg["recall"],
        "connected": agg["connected"], "load_avg": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()], "capacity": readyz.get("capacity"),
        "admission": readyz.get("admission"),
    }


def component_costs(seconds: float = 8.0) -> dict[str, float]:
    """CPU-ms per second of media of the stages this issue made cheaper, on CPU clocks (the whole
    process's, so MediaPipe's and libvpx's own threads count), with the old and the new settings:
    less sensitive to a shared machine than a live round, where a starved server does less work."""
    from fractions import Fraction

    from aiortc.codecs.vpx import Vp8Encoder

    from alignment.types import VideoFrame
    from app.live.au import FrameRate
    from app.live.cpu_account import process_cpu_s
    from app.live.video_encoder import LeanVp8Encoder
    from models.faces import FaceAUExtractor

    clip = loopclip.make_loop_clip(config.DEFAULT_TEXT, 0.0, (640, 360), 25.0)
    n = int(seconds * 25)
    frames = [clip.frames[i % len(clip.frames)] for i in range(n)]
    out: dict[str, float] = {}
    for label, fps in (("faces at 25/s (before)", 25.0), ("faces at 16/s (now)", 16.0)):
        faces, rate = FaceAUExtractor(running_mode="video"), FrameRate(fps)
        faces.extract_full(VideoFrame(0.0, frames[0]))  # graph warm
        c0 = process_cpu_s()
        for i, img in enumerate(frames):
            if rate.take(i / 25):
                faces.extract_full(VideoFrame(1.0 + i / 25, img))
        out[label] = 1000 * (process_cpu_s() - c0) / seconds
        faces.close()
    from app.live.output import to_yuv420p

    video = [to_yuv420p(f) for f in frames[: int(seconds * 16)]]  # encoding only: the conversion is below
    for label, encoder in (("VP8 encode, aiortc's settings (before)", Vp8Encoder()),
                           ("VP8 encode, lean (now)", LeanVp8Encoder())):
        c0 = process_cpu_s()
        for i, f in enumerate(video):
            f.pts, f.time_base = i * 5625, Fraction(1, 90_000)
            encoder.encode(f)
        out[label] = 1000 * (process_cpu_s() - c0) / seconds
    out.update(_conversion_costs(frames[: int(seconds * 16)], video, seconds))
    out.update(_child_scan_costs(seconds))
    return {k: round(v, 1) for k, v in out.items()}


def _conversion_costs(rgb: list[Any], video: list[Any], seconds: float) -> dict[str, float]:
    """The returned frames' RGB -> yuv420p and the camera frames' yuv420p -> RGB, before and now."""
    import av
    import cv2

    from app.live.convert import rgb as camera_rgb
    from app.live.cpu_account import process_cpu_s
    from app.live.output import to_yuv420p

    out: dict[str, float] = {}
    threads = cv2.getNumThreads()  # one since app.live.output was imported
    for label, convert, pool in (("RGB -> yuv420p, libswscale (before)",
                                  lambda img: av.VideoFrame.from_ndarray(img, format="rgb24").reformat(
                                      format="yuv420p"), threads),
                                 ("RGB -> yuv420p, OpenCV pool (before)", to_yuv420p, os.cpu_count() or 1),
                                 ("RGB -> yuv420p, OpenCV 1 thread (now)", to_yuv420p, threads)):
        cv2.setNumThreads(pool)
        c0 = process_cpu_s()
        for img in rgb:
            convert(img)
        out[label] = 1000 * (process_cpu_s() - c0) / seconds
    cv2.setNumThreads(threads)
    # yuv420p frames as decoded camera frames arrive: each converted once (AU) and once (render)
    for label, convert in (("camera -> RGB x2, converter per frame (before)",
                            lambda f: (f.to_ndarray(format="rgb24"), f.to_ndarray(format="rgb24", width=640,
                                                                                  height=360))),
                           ("camera -> RGB x2, converter per thread (now)",
                            lambda f: (camera_rgb(f), camera_rgb(f, (640, 360))))):
        fresh = [av.VideoFrame.from_ndarray(f.to_ndarray(), format="yuv420p") for f in video]
        c0 = process_cpu_s()
        for f in fresh:
            convert(f)
        del fresh  # the event loop drops each frame: its converter goes with it
        out[label] = 1000 * (process_cpu_s() - c0) / seconds
    return out


def _child_scan_costs(seconds: float) -> dict[str, float]:
    """The capacity measurement's look for ASR lane processes, before and now."""
    from app.live import cpu_account

    out: dict[str, float] = {}
    rescan = cpu_account.CHILDREN_RESCAN_S
    for label, every in (("capacity: child-process scan each call (before)", 0.0),
                         ("capacity: child processes rescanned every 10 s (now)", rescan)):
        cpu_account.CHILDREN_RESCAN_S = every
        c0 = cpu_account.process_cpu_s()
        for _ in range(int(seconds)):  # the server measures once a second: two reads of the children
            cpu_account.process_cpu_s()
            cpu_account.process_cpu_s()
        out[label] = 1000 * (cpu_account.process_cpu_s() - c0) / seconds
    cpu_account.CHILDREN_RESCAN_S = rescan
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", type=int, default=1)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--stagger", type=float, default=0.5)
    p.add_argument("--baseline", help="also measure the server of this git commit, first, in the same run")
    p.add_argument("--variant", action="append", default=[], metavar="ARGS",
                   help="also measure this tree's server with these extra arguments, after the default one "
                        "(e.g. --variant='--shed 3'; reported beside it, not judged: not the full pipeline)")
    p.add_argument("--target", type=float, default=SERVER_TARGET_CORES, help="server cores per peer")
    p.add_argument("--out", default="capacity-out")
    p.add_argument("--components", action="store_true", help="only the per-stage before/after figures on CPU "
                   "clocks (face analysis rate, VP8 encoder settings, the colour conversions of the camera and the "
                   "returned frames), no server")
    args = p.parse_args()
    if args.components:
        print(f"load avg {[round(x, 2) for x in os.getloadavg()]}")
        for label, ms in component_costs().items():
            print(f"{label:<54}{ms:>8.1f} CPU-ms per s of media")
        print(f"load avg {[round(x, 2) for x in os.getloadavg()]}")
        return 0
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            base = baseline_tree(args.baseline, Path(tmp))
            runs.append(measure(f"baseline {args.baseline}", base, args, out_dir))
        runs.append(measure("this tree", None, args, out_dir))
        for variant in args.variant:
            runs.append(measure(f"this tree {variant}", None, args, out_dir, shlex.split(variant)))
    print(f"command: PYTHONPATH=$PWD python bench/capacity.py {' '.join(sys.argv[1:])}")
    for r in runs:
        print(f"{r['label']}: server {r['server_cores_per_peer']} cores per peer over {r['peer_seconds']} "
              f"peer-s; client {r['client_cores_per_peer']} cores per peer; p95 word->token {r['p95_ms']} ms, "
              f"Level-3 {r['level3']}, recall {r['recall']}, connected {r['connected']}/{args.peers}; "
              f"load avg {r['load_avg'][0]}→{r['load_avg_after'][0]}; capacity {r['capacity']}")
    mine = runs[1 if args.baseline else 0]  # the default server of this tree: what the targets judge
    for run in runs:
        if run["stages_ms_per_s"]:
            total = sum(run["stages_ms_per_s"].values())
            print(f"\nper stage, CPU-ms per second of media (one session's share), {run['label']}:")
            print(f"{'stage':<14}{'CPU-ms/s':>10}{'share':>8}")
            for stage, ms in sorted(run["stages_ms_per_s"].items(), key=lambda kv: -kv[1]):
                print(f"{stage:<14}{ms:>10.1f}{ms / total:>8.0%}" if total else f"{stage:<14}{ms:>10.1f}")
            print(f"{'total':<14}{total:>10.1f}")
            rest = total - run["stages_ms_per_s"].get("asr", 0.0)
            print(f"{'all but asr':<14}{rest:>10.1f}  (what a session would cost were its ASR free)")
    checks = {
        f"server CPU per peer <= {args.target} cores": (mine["server_cores_per_peer"] or 9) <= args.target,
        f"simulated peer CPU <= {CLIENT_TARGET_CORES:.0%} of a core": (mine["client_cores_per_peer"] or 9)
        <= CLIENT_TARGET_CORES,
    }
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    (out_dir / "capacity.json").write_text(__import__("json").dumps(runs, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
