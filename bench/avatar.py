"""Avatar speed: ms per drawn frame (mean, p95) and what its frames cost the VP8 encoder.

The mouths are those of a real answer (festival's slt_hts voice, phone times from the utterance),
sampled at 16 fps with ``mouth_at``, with the caption row and a highlight that moves word by word,
as a session draws them. Draw and ``mouth_at`` are timed on the calling thread's CPU clock (a shared
machine's other work does not count) and on the wall clock. The encoder part feeds the same 16 fps
avatar sequence and a camera-like one (the talking portrait the load test sends, with sensor noise)
through the server's lean VP8 encoder (``app.live.video_encoder``), yuv420p converted beforehand.

    flock /tmp/heavy.lock .venv/bin/python bench/avatar.py [--frames 320] [--all-cores]
"""

from __future__ import annotations

import argparse
import fractions
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from alignment.types import SpokenPhone
from models.avatar import AvatarRenderer
from models.visemes import REST, MouthShape, mouth_at, timeline

FPS = 16
TEXT = "Maybe we could meet by the lake on Monday, about five o'clock, if the weather is fine."
_SCM = """(voice_cmu_us_slt_arctic_hts)
(set! utt (utt.synth (Utterance Text "{text}")))
(mapcar (lambda (s) (format t "PHONE\\t%s\\t%f\\t%f\\n"
                           (item.name s) (item.feat s "segment_start") (item.feat s "end")))
  (utt.relation.items utt 'Segment))
(mapcar (lambda (w) (format t "WORD\\t%s\\t%f\\n" (item.name w) (item.feat w "word_start")))
  (utt.relation.items utt 'Word))
"""


def _answer() -> tuple[list[SpokenPhone], list[tuple[str, float]]]:
    """Phones and word onsets of TEXT from festival (a synthetic babble if festival is missing)."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            scm = Path(tmp) / "a.scm"
            scm.write_text(_SCM.format(text=TEXT))
            out = subprocess.run(["festival", "--batch", str(scm)], capture_output=True, text=True,
                                 check=True, timeout=120).stdout
        rows = [line.split("\t") for line in out.splitlines()]
        phones = [SpokenPhone(r[1], float(r[2]), float(r[3])) for r in rows if r[0] == "PHONE"]
        words = [(r[1], float(r[2])) for r in rows if r[0] == "WORD"]
        if phones and words:
            return phones, words
    except (OSError, subprocess.SubprocessError):
        pass
    print("festival unavailable: a synthetic phone sequence stands in")
    cycle = ["pau", "m", "aa", "d", "iy", "s", "ow", "p", "ae", "t", "uw"]
    phones = [SpokenPhone(p, 0.08 * i, 0.08 * (i + 1)) for i, p in enumerate(cycle * 6)]
    return phones, [(f"w{i}", 0.3 * i) for i in range(16)]


def _stats(ms: list[float]) -> str:
    a = np.asarray(ms)
    return f"mean {a.mean():.3f} ms, p95 {np.percentile(a, 95):.3f} ms"


def _frames_args(n: int) -> list[tuple[MouthShape, tuple[str, ...], int | None, float]]:
    phones, words = _answer()
    tl = timeline(phones)
    dur = phones[-1].end
    caption = tuple(w for w, _ in words)
    out = []
    for k in range(n):
        t = (k / FPS) % dur
        said = [i for i, (_, s) in enumerate(words) if s <= t]
        out.append((mouth_at(tl, t, frame_s=1 / FPS), caption, said[-1] if said else None, k / FPS))
    return out


def bench_draw(sizes: list[tuple[int, int]], n: int) -> dict[tuple[int, int], list[np.ndarray]]:
    phones, _ = _answer()
    tl = timeline(phones)
    cpu = []
    for k in range(n):
        t0 = time.thread_time()
        mouth_at(tl, (k / FPS) % phones[-1].end, frame_s=1 / FPS)
        cpu.append((time.thread_time() - t0) * 1e3)
    print(f"mouth_at ({len(phones)} phones): {_stats(cpu)} (thread CPU)")
    args = _frames_args(n)
    drawn = {}
    for size in sizes:
        r = AvatarRenderer(size)
        r.draw(REST)
        wall, cpu, frames = [], [], []
        for mouth, caption, hi, t in args:
            w0, c0 = time.perf_counter(), time.thread_time()
            frames.append(r.draw(mouth, caption, hi, t=t))
            cpu.append((time.thread_time() - c0) * 1e3)
            wall.append((time.perf_counter() - w0) * 1e3)
        print(f"draw {size[0]}x{size[1]}: CPU {_stats(cpu)}; wall {_stats(wall)}  ({n} frames)")
        drawn[size] = frames
    return drawn


def _camera_like(n: int, size: tuple[int, int]) -> list[np.ndarray]:
    from app.loadtest import testmedia

    env = 0.5 + 0.5 * np.sin(np.arange(n) * 2 * np.pi / 9.0)
    base = testmedia.talking_face_frames(env, size=size)
    rng = np.random.default_rng(0)
    return [np.clip(f.astype(np.int16) + rng.normal(0, 3, f.shape).astype(np.int16), 0, 255).astype(np.uint8)
            for f in base]


def bench_encode(label: str, frames: list[np.ndarray]) -> None:
    import av
    import cv2

    from app.live.video_encoder import LeanVp8Encoder

    enc = LeanVp8Encoder()
    cpu, sizes = [], []
    for k, rgb in enumerate(frames):
        h, w = rgb.shape[:2]
        yuv = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)
        frame = av.VideoFrame(w, h, "yuv420p")
        for plane, data in zip(frame.planes, (yuv[:h], yuv[h:h + h // 4].reshape(h // 2, w // 2),
                                              yuv[h + h // 4:].reshape(h // 2, w // 2)), strict=True):
            plane.update(np.ascontiguousarray(data))
        frame.pts, frame.time_base = k * 90000 // FPS, fractions.Fraction(1, 90000)
        c0 = time.thread_time()
        payloads, _ = enc.encode(frame, force_keyframe=(k == 0))
        cpu.append((time.thread_time() - c0) * 1e3)
        sizes.append(sum(len(p) for p in payloads))
    steady = cpu[FPS:] or cpu
    kbps = sum(sizes[FPS:] or sizes) * 8 * FPS / max(len(sizes[FPS:] or sizes), 1) / 1000
    print(f"VP8 encode {label}: CPU {_stats(steady)} per frame after the first second; {kbps:.0f} kbit/s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=320)
    ap.add_argument("--all-cores", action="store_true", help="do not pin the process to one core")
    ap.add_argument("--no-encode", action="store_true", help="skip the VP8 part")
    args = ap.parse_args(argv)
    if args.frames < 2 * FPS:
        ap.error("--frames must be at least 32")
    if not args.all_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print("command:", " ".join([os.path.relpath(sys.executable), *sys.argv]))
    drawn = bench_draw([(320, 240), (640, 360)], args.frames)
    if not args.no_encode:
        for size in ((320, 240), (640, 360)):
            bench_encode(f"avatar {size[0]}x{size[1]}", drawn[size])
            bench_encode(f"camera-like {size[0]}x{size[1]}", _camera_like(args.frames, size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
