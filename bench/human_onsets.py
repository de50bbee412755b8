"""Benchmark: offline word-onset accuracy on the hand-read human speech sets, per speaker.

Truth is onsets read by hand (bench/data/human_speech.json and human_onsets.json: connected speech;
the clips of bench/data/isolated_words.json that carry an ``onset``), never an aligner's. Each clip goes through
the offline path that bench/word_timing.py scores as "offline" (``transcribe_words`` then
``refine_word_times``), or with ``--live`` through the live one (``StreamingASR`` fed 20 ms chunks; its
finals); recognised words are matched to the hand-read ones by text, as there. An
isolated clip is padded with 0.5 s of silence on each side. Per speaker and part of the split:
share within +-40 ms with a Wilson 95 % interval, for all words and for the 'clear' ones, mean
|error|, median signed error, and words the recogniser missed (no match).

    .venv/bin/python bench/human_onsets.py                  # both sets, all speakers
    .venv/bin/python bench/human_onsets.py --part heldout   # the held-out speakers only
    .venv/bin/python bench/human_onsets.py --live           # the streaming recogniser's finals
    .venv/bin/python bench/human_onsets.py --room           # isolated clips padded with their own noise, not zeros
    .venv/bin/python bench/human_onsets.py --live --phases 4  # each clip also started 8, 16, 24 ms later, pooled

Why ``--phases``: a stream's decodes fall where its audio puts them, so a clip started 10 ms later is decoded
in other windows, and tiny.en hears some words differently (the held-out live figure read 72-79 % at four
starts). Pooled over starts a quarter of a VAD window apart, a figure depends less on where each clip began.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.text import agreement_key  # noqa: E402
from alignment.timing import refine_word_times  # noqa: E402
from alignment.types import SAMPLE_RATE, WordToken  # noqa: E402
from bench.asr_stream import chunks  # noqa: E402
from bench.human_data import load  # noqa: E402
from bench.isolated_words import wilson  # noqa: E402
from models.asr import StreamingASR, StreamingConfig, transcribe_words  # noqa: E402

DATA = Path(__file__).with_name("data")
PAD_S = 0.5
#: ``--phases``: each further start is this much later (a quarter of the VAD's 32 ms window).
PHASE_STEP_S = 0.008
#: human_onsets.json (the first hand-read set) marks confidence high / low.
CONFIDENCE = {"high": "clear", "low": "unclear"}


@dataclass(frozen=True)
class Clip:
    """One recording with its hand-read words (text, onset s, confidence)."""

    source: str
    speaker: str
    part: str
    raw_rate: int
    words: tuple[tuple[str, float, str], ...]
    pad: bool


def clips(part: str) -> list[Clip]:
    """The connected clips and the isolated clips with an onset, of ``part`` ('all' for every one)."""
    out = []
    for name in ("human_speech.json", "human_onsets.json", "isolated_words.json"):
        data = json.loads((DATA / name).read_text())
        part_of = {s: p for p, speakers in data.get("split", {}).items() for s in speakers}
        for c in data["clips"]:
            spk = c.get("speaker", "?")
            if part != "all" and part_of.get(spk) != part:
                continue
            if "words" in c:
                words = tuple((w["text"], float(w["onset"]), CONFIDENCE.get(w["confidence"], w["confidence"]))
                              for w in c["words"])
            elif "onset" in c:
                words = ((c["text"], float(c["onset"]), c["confidence"]),)
            else:
                continue
            out.append(Clip(c["source"], spk, part_of.get(spk, "?"), int(c.get("raw_rate", 16000)), words,
                            pad="words" not in c))
    return out


@dataclass(frozen=True)
class Placed:
    """A clip run through the offline path: its padded audio, the words placed on it, and for each hand-read
    word (by index) the index of the placed word matched to it by text; ``lead``: the padding before the clip."""

    audio: np.ndarray
    lead: float
    words: list[WordToken]
    match: dict[int, int]


def padded(clip: Clip, room: bool = False, later_s: float = 0.0) -> tuple[np.ndarray, float] | None:
    """``clip``'s audio with 0.5 s of silence after it (and before an isolated one), and the padding before it;
    None when its audio cannot be had. ``room``: the padding is the recording's own noise (its quietest 20 ms,
    looped), as a live mic carries on between words, instead of digital silence. ``later_s``: the whole starts
    that much later, on a copy of its own first samples (no step into digital silence)."""
    audio = load(clip.source, clip.raw_rate)
    if audio is None:
        return None
    pad = np.zeros(int(PAD_S * SAMPLE_RATE), np.float32)
    if room:
        frames = audio[: audio.size // 320 * 320].reshape(-1, 320)
        quietest = frames[int(np.argmin(np.mean(frames * frames, axis=1)))]
        pad = np.resize(quietest, pad.size).astype(np.float32)
    whole, lead = (np.concatenate([pad, audio, pad]), PAD_S) if clip.pad else (np.concatenate([audio, pad]), 0.0)
    n = int(round(later_s * SAMPLE_RATE))
    return np.concatenate([whole[:n], whole]), lead + n / SAMPLE_RATE


def offline_words(audio: np.ndarray) -> list[WordToken]:
    """The offline path's words for 16 kHz ``audio``: transcription, then refinement."""
    return refine_word_times(audio, 0.0, transcribe_words(audio, refine=False))


def live_words(audio: np.ndarray) -> list[WordToken]:
    """The live path's final words for 16 kHz ``audio``, fed to ``StreamingASR`` in 20 ms chunks."""
    asr = StreamingASR("whisper", StreamingConfig())
    events = [e for c in chunks(audio) for e in asr.feed(c)] + asr.flush()
    return [e for e in events if isinstance(e, WordToken) and e.final]


def place(clip: Clip, room: bool = False, live: bool = False, later_s: float = 0.0) -> Placed | None:
    """``clip`` (:func:`padded`) through the offline path, or with ``live`` the live one; None when its audio
    cannot be had."""
    got = padded(clip, room, later_s)
    if got is None:
        return None
    audio, lead = got
    words = live_words(audio) if live else offline_words(audio)
    return Placed(audio, lead, words, _match(words, clip))


def _match(words: list[WordToken], clip: Clip) -> dict[int, int]:
    """Index of the placed word matched by text to each hand-read word (by index)."""
    a = [agreement_key(w.text) for w in words]
    b = [agreement_key(t) for t, _, _ in clip.words]
    blocks = difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks()
    return {blk.b + i: blk.a + i for blk in blocks for i in range(blk.size)}


def errors(clip: Clip, live: bool = False, room: bool = False, later_s: float = 0.0
           ) -> list[tuple[float | None, str]]:
    """(signed onset error ms, or None where unmatched; confidence) per hand-read word of ``clip``."""
    placed = place(clip, room, live, later_s)
    if placed is None:
        return []
    return [(1000 * (placed.words[placed.match[k]].start - w[1] - placed.lead) if k in placed.match else None, w[2])
            for k, w in enumerate(clip.words)]


def line(label: str, rows: list[tuple[float | None, str]], repeats: int = 1) -> str:
    """One figure's line. ``repeats``: each word is in ``rows`` that many times (once per start), so the interval
    is taken on the words, not on their copies."""
    e = np.array([r for r, _ in rows if r is not None], float)
    ec = np.array([r for r, c in rows if r is not None and c == "clear"], float)
    k, n = int(np.sum(np.abs(e) <= 40)), e.size
    kc, nc = int(np.sum(np.abs(ec) <= 40)), ec.size
    lo, hi = wilson(round(k / repeats), round(n / repeats))
    loc, hic = wilson(round(kc / repeats), round(nc / repeats))
    if n == 0:
        return f"  {label:<22} no matched words ({len(rows)} hand-read)"
    return (f"  {label:<22} {k:>3}/{n:<3} within ±40 ms {100 * k / n:5.1f} % [{100 * lo:.1f}–{100 * hi:.1f}]"
            f"  clear {kc}/{nc} {100 * kc / max(nc, 1):5.1f} % [{100 * loc:.1f}–{100 * hic:.1f}]"
            f"  mean |e| {np.abs(e).mean():5.1f} ms  median signed {np.median(e):+6.1f}  unmatched {len(rows) - n}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "tuning", "heldout"), default="all")
    ap.add_argument("--live", action="store_true", help="the streaming recogniser's finals, not the offline words")
    ap.add_argument("--room", action="store_true", help="pad with the recording's own noise, as a live mic carries on")
    ap.add_argument("--phases", type=int, default=1, choices=range(1, 5), metavar="{1..4}",
                    help=f"also start every clip {1000 * PHASE_STEP_S:g}, {2000 * PHASE_STEP_S:g}, ... ms later; "
                    "figures pooled over the starts")
    args = ap.parse_args(argv)
    print(f"$ python bench/human_onsets.py --part {args.part}{' --live' if args.live else ''}"
          f"{' --room' if args.room else ''}{f' --phases {args.phases}' if args.phases > 1 else ''}")
    print(f"load average {os.getloadavg()[0]:.1f} at start; 2-core machine")
    by_speaker: dict[tuple[str, str, str], list[tuple[float | None, str]]] = {}
    by_phase: dict[tuple[str, int], list[tuple[float | None, str]]] = {}
    for k in range(args.phases):
        for clip in clips(args.part):
            kind = "connected" if not clip.pad else "isolated"
            rows = errors(clip, args.live, args.room, k * PHASE_STEP_S)
            by_speaker.setdefault((clip.part, kind, clip.speaker), []).extend(rows)
            by_phase.setdefault((f"{clip.part}/{kind}", k), []).extend(rows)
    pooled: dict[str, list[tuple[float | None, str]]] = {}
    for (part, kind, spk), rows in sorted(by_speaker.items()):
        print(line(f"{part}/{kind}/{spk}", rows, args.phases))
        pooled.setdefault(f"{part}/{kind}", []).extend(rows)
        pooled.setdefault("all", []).extend(rows)
    if args.phases > 1:
        for (label, k), rows in sorted(by_phase.items()):
            print(line(f"{label} +{1000 * k * PHASE_STEP_S:g} ms", rows))
    for label, rows in sorted(pooled.items()):
        print(line(f"pooled {label}", rows, args.phases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
