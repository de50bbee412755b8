"""Calibration of the repeat check (:func:`alignment.support.repeat_heard`) on recorded one-word clips.

tiny.en hears one word as the same word twice ("friends friends", "1 1"); the forced aligner then
fits both copies into the one word's audio. The check scores the text with the copy and without it
on the same audio (:meth:`alignment.forced.ForcedAligner.fit`). Per clip of
bench/data/isolated_words.json (one speaker split at a time): the clip said once, scored as "x" and
"x x" (a repeat the audio does not hold), and the clip said twice with a short gap (a repeat it
does). Printed per margin (gain of "x x" over "x" per 10 ms frame): false repeats accepted and
genuine repeats refused. The margin is chosen on the tuning speakers; the held-out ones judge it.

    .venv/bin/python bench/repeat_fit.py --part tuning
    .venv/bin/python bench/repeat_fit.py --part heldout
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.forced import aligner  # noqa: E402
from alignment.support import MIN_REPEAT_GAIN, repeat_gain  # noqa: E402
from alignment.types import SAMPLE_RATE  # noqa: E402
from bench.human_data import load  # noqa: E402
from bench.isolated_words import DATA, wilson  # noqa: E402

MARGINS = (-1.5, -1.0, -0.5, 0.0, 0.5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("tuning", "heldout"), default="tuning")
    ap.add_argument("--gap", type=float, default=0.05, help="s of silence between the two copies")
    args = ap.parse_args(argv)
    data = json.loads(DATA.read_text())
    speakers = set(data["split"][args.part])
    edge = np.zeros(int(0.15 * SAMPLE_RATE), np.float32)
    gap = np.zeros(int(args.gap * SAMPLE_RATE), np.float32)
    once, twice = [], []
    for clip in data["clips"]:
        words = clip["accept"][0].split()
        if clip.get("speaker") not in speakers or len(words) != 1 or (audio := load(clip["source"])) is None:
            continue
        once.append(repeat_gain(np.concatenate([edge, audio, edge]), words, words, aligner().fit))
        twice.append(repeat_gain(np.concatenate([edge, audio, gap, audio, edge]), words, words, aligner().fit))
    if not once:
        print("no clips available")
        return 1
    g1, g2 = np.array(once), np.array(twice)
    print(f"$ python bench/repeat_fit.py --part {args.part} --gap {args.gap}: {len(g1)} one-word clips "
          f"({', '.join(sorted(speakers))})")
    for m in MARGINS:
        fa, fr = int(np.sum(g1 > m)), int(np.sum(g2 <= m))
        (a_lo, a_hi), (r_lo, r_hi) = wilson(fa, len(g1)), wilson(fr, len(g2))
        mark = "  <- shipped (MIN_REPEAT_GAIN)" if m == MIN_REPEAT_GAIN else ""
        print(f"  margin {m:+.1f}: false repeats accepted {fa} ({100 * fa / len(g1):.1f} %, {100 * a_lo:.1f}-"
              f"{100 * a_hi:.1f}), genuine repeats refused {fr} ({100 * fr / len(g2):.1f} %, {100 * r_lo:.1f}-"
              f"{100 * r_hi:.1f}){mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
