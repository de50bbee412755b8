"""Benchmark: what streaming costs in words on recorded human speech: live WER minus offline WER.

The connected clips of bench/data/human_speech.json go through the offline path (``transcribe_words``,
:func:`bench.human_onsets.offline_words`) and the live one (``StreamingASR`` finals,
:func:`bench.human_onsets.live_words`);
both are scored against the package's own transcript of each clip (asterisk's core-sounds-en.txt, the
LibriVox ``.txt`` and cards.transcription beside the pocketsphinx clips, the whisper.cpp test's JFK text, the
ALSA test voice's file names; gradio's clips ship none and are left out), never
against a recogniser's. Words compare by ``alignment.text.word_edits`` (lower case, no punctuation), so a
number Whisper writes as digits counts as an error in both paths alike. The gap is pooled over clips, with a
95 % bootstrap interval over clips.

    .venv/bin/python bench/human_wer.py [--part tuning|heldout|all] [--phases 4]

``--phases N``: each clip is also started 8, 16, ... ms later (bench/human_onsets.py's ``--phases``), and the
edits are pooled over the starts. Both paths move with the start: on 93 held-out words the gap read +1.1, +6.5,
+12.9 and +2.2 points at four starts 8 ms apart (12-07).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.text import word_edits  # noqa: E402
from bench.human_data import source_path  # noqa: E402
from bench.human_onsets import PHASE_STEP_S, Clip, clips, live_words, offline_words, padded  # noqa: E402

ASTERISK_TEXT = "debian:asterisk-core-sounds-en/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"
CARDS_TEXT = "pypi:pocketsphinx==5.1.1/test/data/cards/cards.transcription"
JFK_TEXT = "npm:nodejs-whisper@0.3.1/cpp/whisper.cpp/tests/parakeet-expected-jfk-output.txt"
GOFORWARD_TEXT = "go forward ten meters"  # pocketsphinx's goforward.fsg / goforward.kws
#: Written forms in the asterisk transcripts that the prompts speak out.
SPOKEN = {"*": "star", "#": "pound"}


def reference(clip: Clip) -> list[str] | None:
    """The package's transcript of ``clip`` as words, or None where none ships."""
    src = clip.source
    name = Path(src.split(":", 1)[1]).stem
    text: str | None = None
    if "en_US_f_Allison/" in src:
        prompt = src.split("en_US_f_Allison/", 1)[1][: -len(".wav")]  # e.g. dictate/both_help
        path = source_path(ASTERISK_TEXT)
        if path is not None:
            for line in gzip.open(path, "rt", encoding="utf-8", errors="replace"):
                key, _, said = line.partition(":")
                if key.strip() == prompt:
                    text = said
                    break
    elif "/librivox/" in src:
        path = source_path(src[: -len(".wav")] + ".txt")
        text = path.read_text() if path is not None else None
    elif "/cards/" in src:
        path = source_path(CARDS_TEXT)
        if path is not None:
            for line in path.read_text().splitlines():
                if line.rstrip().endswith(f"({name})"):
                    text = re.sub(r"</?s>|\(\w+\)", " ", line)
    elif src.endswith("goforward.raw"):
        text = GOFORWARD_TEXT
    elif src.startswith("alsa:"):
        text = name.replace("_", " ")  # ALSA's test voice says its channel's name
    elif src.endswith("jfk.wav"):
        path = source_path(JFK_TEXT)
        text = path.read_text() if path is not None else None
    if not text:
        return None
    for written, said in SPOKEN.items():
        text = text.replace(written, f" {said} ")
    return text.split()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "tuning", "heldout"), default="all")
    ap.add_argument("--phases", type=int, default=1, choices=range(1, 5), metavar="{1..4}",
                    help="also start every clip 8, 16, ... ms later; edits pooled over the starts")
    args = ap.parse_args(argv)
    print(f"$ python bench/human_wer.py --part {args.part}{f' --phases {args.phases}' if args.phases > 1 else ''}")
    print(f"load average {os.getloadavg()[0]:.1f} at start; 2-core machine")
    rows: dict[str, list[tuple[int, int, int]]] = {}  # part -> per clip (offline edits, live edits, reference words)
    by_start: dict[tuple[str, int], list[int]] = {}  # (part, start) -> the same, summed over the clips
    for clip in clips(args.part):
        if clip.pad:
            continue  # isolated words: bench/isolated_words.py
        ref = reference(clip)
        starts = [padded(clip, later_s=k * PHASE_STEP_S) for k in range(args.phases)] if ref is not None else []
        if ref is None or any(got is None for got in starts):
            print(f"  (no transcript or audio for {clip.source})")
            continue
        per_start = []
        for k, (audio, _) in enumerate(starts):
            e_off, n = word_edits(ref, [w.text for w in offline_words(audio)])
            e_live, _ = word_edits(ref, [w.text for w in live_words(audio)])
            per_start.append((e_off, e_live, n))
            by_start[(clip.part, k)] = [a + b for a, b in zip(by_start.get((clip.part, k), [0, 0, 0]),
                                                              (e_off, e_live, n), strict=True)]
            if e_live > e_off:
                print(f"  {Path(clip.source).name} +{1000 * k * PHASE_STEP_S:g} ms: offline {e_off} / live {e_live}"
                      f" edits of {n}")
        e_off, e_live, n = (sum(column) for column in zip(*per_start, strict=True))
        rows.setdefault(clip.part, []).append((e_off, e_live, n))
    if args.phases > 1:
        for (part, k), (e_off, e_live, n) in sorted(by_start.items()):
            print(f"  {part:<8} +{1000 * k * PHASE_STEP_S:g} ms: WER offline {100 * e_off / n:.1f} %, live "
                  f"{100 * e_live / n:.1f} %, gap {100 * (e_live - e_off) / n:+.1f} points")
    rng = np.random.default_rng(0)
    for part, r in sorted(rows.items()):
        a = np.array(r, float)
        off, live = a[:, 0].sum() / a[:, 2].sum(), a[:, 1].sum() / a[:, 2].sum()
        boot = []
        for _ in range(2000):
            s = a[rng.integers(0, len(a), len(a))]
            boot.append((s[:, 1].sum() - s[:, 0].sum()) / s[:, 2].sum())
        lo, hi = np.percentile(boot, [2.5, 97.5])
        gap = live - off
        words = int(a[:, 2].sum()) // args.phases
        print(f"  {part:<8} {len(r)} clips, {words} words: WER offline {100 * off:.1f} %, live "
              f"{100 * live:.1f} %, gap {100 * gap:+.1f} points [{100 * lo:+.1f} to {100 * hi:+.1f}]"
              f"  (≤ 3 points: {'PASS' if gap <= 0.03 else 'FAIL'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
