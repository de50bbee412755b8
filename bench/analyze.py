"""Throughput of `synchrony analyze` as a multiple of real time, per stage.

Generates a talking-face clip with espeak-ng speech of the requested length (default 30 s), encodes
it (H.264 + AAC), runs the offline pipeline on it and prints each stage's wall time and the real-time
factor. Target: faster than real time on 2 cores (RTF > 1). Usage:

    .venv/bin/python bench/analyze.py [--seconds 30] [--no-video]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from app.loadtest import testmedia
from app.offline.analyze import AnalyzeOptions, analyze

SENTENCES = [
    "Synchrony aligns every spoken word to the video frames.",
    "The weather today is bright and clear with a gentle breeze.",
    "Please remember to bring the blue folder to the meeting.",
    "A quiet river runs past the old mill at the edge of town.",
    "Numbers like seven and twelve are easy to hear.",
    "She opened the window and listened to the birds outside.",
    "We measured the latency of the pipeline on two cores.",
    "The train leaves the station at half past nine.",
    "Good tools make hard problems feel a little smaller.",
    "He wrote a short letter and posted it before lunch.",
]


def make_clip(seconds: float) -> testmedia.AVClip:
    text, i = "", 0
    while True:
        candidate = (text + " " + SENTENCES[i % len(SENTENCES)]).strip()
        if len(candidate.split()) / 2.6 > seconds - 1.2 and text:  # ~2.6 words/s at 160 wpm
            break
        text, i = candidate, i + 1
    return testmedia.make_av_clip(text=text, lead_in_s=0.5, tail_s=0.7, markers=(0.2,))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--no-video", action="store_true", help="skip rendering annotated.mp4")
    args = parser.parse_args()
    clip = make_clip(args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        path = testmedia.write_av_file(Path(tmp) / "bench.mp4", clip)
        t0 = time.perf_counter()
        report, code = analyze(path, AnalyzeOptions(out_dir=Path(tmp) / "out", write_video=not args.no_video,
                                                    progress=False))
        wall = time.perf_counter() - t0
    truth = [w.text.lower() for w in clip.words]
    said = {t["text"].lower().strip(".,!?") for t in report["tokens"]}
    recall = sum(w in said for w in truth) / max(len(truth), 1)
    print(f"command: .venv/bin/python bench/analyze.py --seconds {args.seconds:g}"
          + (" --no-video" if args.no_video else ""))
    print(f"clip: {report['duration_s']:.1f} s, {len(clip.frames)} input frames at {clip.fps:g} fps, "
          f"{len(truth)} words with known onsets")
    print("stage wall times (s; faces and asr run in parallel threads):")
    for stage, sec in report["timings_s"].items():
        print(f"  {stage:<14} {sec:7.2f}")
    rtf = report["duration_s"] / wall
    print(f"real-time factor: {rtf:.2f}x (duration / wall)")
    print(f"words recognised: {recall:.0%} of truth words; Level-3 pass: {report['sync']['pass_rate']}")
    ok = rtf > 1.0 and code == 0 and recall > 0.8
    print(f"target RTF > 1 with words recognised > 80 %: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
