"""CPU per second of a stream's audio on one ASR lane, and whether another checkout's code emits the same.

What a decode lane spends (process CPU time, not wall: the machine is shared) to serve N
streams of the load test's looping sentence, each stream at its own phase of the loop (its own
decodes), fed one after the other in lane turns of ``--turn-ms`` of audio per stream (160 ms: a
loaded lane, whose every stream has a decode due in most turns; 20 ms: an idle lane, each turn
one WebRTC frame).

``--compare DIR`` also runs the code in DIR (e.g. an export of main) in the same rounds, in its
own process, so a code change is measured against it on the same machine load, and says whether
its events are the same. Rounds alternate the runs; the median is reported.

    python bench/asr_lane_cpu.py --streams 1 --compare /tmp/main  # this code vs main's, 1 stream
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def _loop_audio() -> np.ndarray:
    """The load test's looping sentence, synthesised once: espeak-ng keeps state between syntheses,
    so a second synthesis in the same process is not the same audio."""
    from app.loadtest.config import DEFAULT_TEXT
    from app.loadtest.loopclip import make_loop_clip

    return make_loop_clip(DEFAULT_TEXT, 0, (320, 240), 25).audio


def _audio(seconds: float, phase_s: float) -> np.ndarray:
    from alignment.types import SAMPLE_RATE

    clip = _loop_audio()
    n = int(seconds * SAMPLE_RATE)
    loop = np.tile(clip, n // clip.size + 2)
    k = int(phase_s * SAMPLE_RATE) % clip.size
    return np.ascontiguousarray(loop[k : k + n], dtype=np.float32)


def _measure(n_streams: int, mode: str, seconds: float, turn_ms: int) -> dict[str, object]:
    """Run ``n_streams`` streams through one lane; CPU ms per stream-second and the events' digest."""
    from alignment.types import SAMPLE_RATE, AudioChunk
    from models.asr import StreamingASR

    turn = int(turn_ms * SAMPLE_RATE / 1000)
    audios = [_audio(seconds, 0.83 * i) for i in range(n_streams)]
    streams = [StreamingASR() for _ in range(n_streams)]
    events: list[list[object]] = [[] for _ in range(n_streams)]
    cpu0 = time.process_time()
    for k in range(0, audios[0].size, turn):
        chunks = [AudioChunk(k / SAMPLE_RATE, a[k : k + turn]) for a in audios]
        for i, c in enumerate(chunks):
            events[i] += streams[i].feed(c)
    for i, s in enumerate(streams):
        events[i] += s.flush()
    cpu = time.process_time() - cpu0
    return {"streams": n_streams, "mode": mode, "turn_ms": turn_ms,
            "cpu_ms_per_stream_s": 1000 * cpu / (n_streams * seconds),
            "decodes": sum(s.decode_count for s in streams), "events": repr(events)}


def _child(args: argparse.Namespace) -> None:
    import torch

    from models.asr import StreamingASR
    from models.asr.engine import get_engine

    torch.set_num_threads(1)
    get_engine("whisper", int8=True)
    warm = StreamingASR()  # warm-up: first-use costs (VAD, aligners, kernels) are not the lane's
    from alignment.types import SAMPLE_RATE, AudioChunk

    a = _audio(3.5, 0.0)
    for k in range(0, a.size, 2560):
        warm.feed(AudioChunk(k / SAMPLE_RATE, a[k : k + 2560]))
    warm.flush()
    for n in args.streams:
        print(json.dumps(_measure(n, "alone", args.seconds, args.turn_ms)), flush=True)


def _run(code: Path, args: argparse.Namespace, label: str) -> list[dict[str, object]]:
    cmd = [sys.executable, str(ROOT / "bench" / "asr_lane_cpu.py"), "--child", "--seconds", str(args.seconds),
           "--turn-ms", str(args.turn_ms), "--streams", *map(str, args.streams)]
    env = dict(os.environ, PYTHONPATH=str(code), OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, env=env, cwd=code, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for r in rows:
        r["code"] = label
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--seconds", type=float, default=10.0, help="audio per stream")
    ap.add_argument("--turn-ms", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--compare", type=Path, help="another checkout: its code runs in the same rounds")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    rows: list[dict[str, object]] = []
    for _ in range(args.rounds):
        if args.compare:
            rows += _run(args.compare.resolve(), args, "compare")
        rows += _run(ROOT, args, "this")
    groups: dict[tuple[object, ...], list[dict[str, object]]] = {}
    for r in rows:
        groups.setdefault((r["streams"], r["code"], r["mode"]), []).append(r)
    print(f"turns of {args.turn_ms} ms, {args.seconds:.0f} s of audio per stream, {args.rounds} rounds (median)")
    print(f"{'streams':>7} {'code':>8} {'CPU ms / stream-s':>18} {'decodes':>8}  events")
    ref = {n: g[0]["events"] for (n, c, _m), g in groups.items() if c == "this"}
    for (n, code, _m), g in sorted(groups.items()):
        cpu = statistics.median(float(r["cpu_ms_per_stream_s"]) for r in g)
        same = all(r["events"] == ref.get(n) for r in g)
        print(f"{n:>7} {code:>8} {cpu:>18.1f} {g[0]['decodes']:>8}  {'same' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
