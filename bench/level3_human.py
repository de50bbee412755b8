"""Benchmark: Level-3's per-word audio check on recorded human speech, against hand-read onsets.

Level-3 judges a word's audio time by evidence the aligner did not make: where the word follows
silence, the acoustic onset (``alignment.onsets.onset_after_silence``), which the placed start must
sit within ``onset_window_ms`` of; elsewhere the word has no evidence and passes. This bench runs
that check, exactly as the live path does (the previous word's placed start keeps that word's rise
out), on the hand-read sets (bench/human_onsets.py loads them) with three kinds of placement:

Clips are padded with their own noise (a live mic never goes digitally silent between words; a step from
digital silence to a recording's hiss reads as a rise).

* natural: the product's offline placements (transcription, then refinement), matched to the
  hand-read words by text; "correctly timed" within +-40 ms of the hand-read onset, "misplaced"
  more than 80 ms from it (issue 36);
* truth: the hand-read onset itself (correctly timed by definition);
* injected: each correctly timed natural placement moved 120 ms earlier and 120 ms later
  (misplaced: more than 80 ms from the truth).

A false alarm is a failed check on a correctly timed word; a miss is a misplaced word that passes
(with evidence that did not catch it, or with none). Targets: false alarms <= 1 %, misses <= 10 %.
Figures carry Wilson 95 % intervals.

    .venv/bin/python bench/level3_human.py [--part tuning|heldout|all]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from alignment.onsets import onset_after_silence, onset_window_ms  # noqa: E402
from bench.human_onsets import clips, place  # noqa: E402
from bench.isolated_words import wilson  # noqa: E402

CORRECT_MS = 40.0
MISPLACED_MS = 80.0
SHIFT_MS = 120.0


def verdict(audio: np.ndarray, start: float, previous: float | None, text: str) -> tuple[str, float | None]:
    """'pass', 'fail' (evidence outside the word's window) or 'none' (no evidence: passes), and the
    placed start minus the acoustic onset (ms) where there is one."""
    onset = onset_after_silence(audio, 0.0, start, previous)
    if onset is None:
        return "none", None
    lo, hi = onset_window_ms(text)
    gap = 1000 * (start - onset)
    return ("pass" if lo <= gap <= hi else "fail"), gap


def share(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {100 * k / max(n, 1):.1f} % [{100 * lo:.1f}-{100 * hi:.1f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "tuning", "heldout"), default="all")
    ap.add_argument("--show", action="store_true", help="list each false alarm and each miss that had evidence")
    args = ap.parse_args(argv)
    print(f"$ python bench/level3_human.py --part {args.part}; load average {os.getloadavg()[0]:.1f} (2 cores)")
    tallies: dict[str, Counter[str]] = {}
    for clip in clips(args.part):
        placed = place(clip, room=True)
        if placed is None:
            continue
        kind = "isolated" if clip.pad else "connected"
        for k, (text, onset, _) in enumerate(clip.words):
            truth = onset + placed.lead
            j = placed.match.get(k)
            if j is None:
                continue
            start = placed.words[j].start
            previous = placed.words[j - 1].start if j > 0 else None
            error = 1000 * (start - truth)
            rows = [("truth", truth)]
            if abs(error) <= CORRECT_MS:
                rows += [("natural correct", start), ("injected", start - SHIFT_MS / 1000),
                         ("injected", start + SHIFT_MS / 1000)]
            elif abs(error) > MISPLACED_MS:
                rows.append(("natural misplaced", start))
            for label, t in rows:
                v, gap = verdict(placed.audio, t, previous, text)
                correct = label in ("truth", "natural correct")
                if args.show and ((v == "fail") == correct) and v != "none":
                    print(f"    {clip.part} {clip.speaker:<10} {label:<17} {text!r:<14} placed - truth "
                          f"{1000 * (t - truth):+5.0f} ms, placed - onset {gap:+5.0f} ms (window "
                          f"{onset_window_ms(text)}), {clip.source.rsplit('/', 1)[-1]}")
                for key in (f"{clip.part}/{kind}/{label}", f"{clip.part}/all/{label}"):
                    tallies.setdefault(key, Counter())[v] += 1
    for key in sorted(tallies):
        c = tallies[key]
        n = sum(c.values())
        with_evidence = c["pass"] + c["fail"]
        if key.endswith(("truth", "correct")):
            print(f"  {key:<36} false alarms {share(c['fail'], n)}; with evidence {with_evidence}")
        else:
            print(f"  {key:<36} missed {share(c['pass'] + c['none'], n)} (no evidence {c['none']}, evidence "
                  f"passed {c['pass']})")
    pooled = {label: sum((c for key, c in tallies.items() if "/all/" in key and key.endswith(label)), Counter())
              for label in ("truth", "correct", "injected", "misplaced")}
    fa = pooled["truth"] + pooled["correct"]
    missed = pooled["injected"] + pooled["misplaced"]
    fa_rate = fa["fail"] / max(sum(fa.values()), 1)
    miss_rate = (missed["pass"] + missed["none"]) / max(sum(missed.values()), 1)
    ok = fa_rate <= 0.01 and miss_rate <= 0.10
    print(f"pooled: false alarms {fa_rate:.1%} (<= 1 %), misses {miss_rate:.1%} (<= 10 %): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
