"""Benchmark: one-word utterances of recorded human speech through the live recogniser.

A final word must be one the audio said. tiny.en, given a short window, can say what is not there
(a one-word "Phil." once came out as "help yourself to help yourself to help yourself"), and the
carried context of the utterance before a short pause is where that happens. Each session here is
a stretch of connected human speech, then isolated words (bench/data/isolated_words.json: one
recorded word per clip, from a Debian package) with pauses from 0.6 to 3 s between them, streamed
in 20 ms chunks through :class:`models.asr.StreamingASR` (the live path's policy, refinement and
support check). Per word: the finals the stream emitted from its start to the next clip's.

* correct: the finals are the clip's words (a spelling ``accept`` lists; two clips say two words);
* invented: every other final word, split into words in place of the spoken ones (misheard: as
  many finals as words said, none right) and extra words (beyond what was said: a repeat, a
  carried word said again, a tail);
* missed: no final for the clip.

Targets: zero invented final words; >= 90 % correct. Figures carry Wilson 95 % intervals.
``--start K`` runs sessions K+1.. (new pairings of clips, pauses and leads: sessions 13-24 are not
the ones the finalisation rules were read from).

    .venv/bin/python bench/isolated_words.py                 # 12 sessions
    .venv/bin/python bench/isolated_words.py --sessions 4    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.text import agreement_key  # noqa: E402
from alignment.types import SAMPLE_RATE, AudioChunk, WordToken  # noqa: E402
from bench.human_data import load  # noqa: E402
from models.asr import StreamingASR, StreamingConfig  # noqa: E402

DATA = Path(__file__).with_name("data") / "isolated_words.json"
#: Connected speech that opens each session (its finals are not scored; it makes the carry).
LEADS = ("gradio:media_assets/audio/heath_ledger.mp3", "gradio:media_assets/audio/cate_blanch_2.mp3",
         "debian:asterisk-core-sounds-en-wav/usr/share/asterisk/sounds/en_US_f_Allison/one-moment-please.wav",
         "debian:asterisk-core-sounds-en-wav/usr/share/asterisk/sounds/en_US_f_Allison/please-try-again.wav")
PAUSES_S = (0.6, 0.9, 1.3, 2.2, 3.0, 0.8, 1.6)
PER_SESSION = 8


@dataclass(frozen=True)
class Trial:
    text: str
    accept: tuple[str, ...]
    start: float  # session s: the clip's first sample
    stop: float  # session s: the next clip's first sample (or the stream's end)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def build_session(k: int, clips: list[dict], leads: list[np.ndarray]) -> tuple[np.ndarray, list[Trial]]:
    """Session ``k``: a lead of connected speech, then PER_SESSION isolated words with pauses."""
    parts = [np.zeros(SAMPLE_RATE // 2, np.float32), leads[k % len(leads)]]
    t = sum(p.size for p in parts) / SAMPLE_RATE
    trials: list[Trial] = []
    chosen = [clips[(k * PER_SESSION + j) % len(clips)] for j in range(PER_SESSION)]
    for j, (clip, audio) in enumerate(chosen):
        pause = np.zeros(int(PAUSES_S[(k + j) % len(PAUSES_S)] * SAMPLE_RATE), np.float32)
        parts += [pause, audio]
        start = t + pause.size / SAMPLE_RATE
        t = start + audio.size / SAMPLE_RATE
        trials.append(Trial(clip["text"], tuple(clip["accept"]), start, 0.0))
    parts.append(np.zeros(SAMPLE_RATE, np.float32))
    end = t + 1.0
    trials = [Trial(tr.text, tr.accept, tr.start, trials[i + 1].start if i + 1 < len(trials) else end)
              for i, tr in enumerate(trials)]
    return np.concatenate(parts), trials


def stream(audio: np.ndarray) -> tuple[list[WordToken], int, int]:
    """The finals of one streamed session (20 ms chunks), the words held back as unsupported, and
    of those the repeats whose second copy the audio did not hold."""
    asr = StreamingASR("whisper", StreamingConfig())
    finals: list[WordToken] = []
    for i in range(0, audio.size, 320):
        finals += [e for e in asr.feed(AudioChunk(i / SAMPLE_RATE, audio[i : i + 320]))
                   if isinstance(e, WordToken) and e.final]
    finals += [e for e in asr.flush() if isinstance(e, WordToken) and e.final]
    return finals, asr.unsupported, asr.repeats_unheard


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--start", type=int, default=0, help="skip the first START sessions")
    ap.add_argument("--part", choices=("all", "tuning", "heldout"), default="all",
                    help="the json's split: the tuning speakers, the held-out ones, or all")
    args = ap.parse_args(argv)
    print(f"$ python bench/isolated_words.py --sessions {args.sessions} --start {args.start} --part {args.part}")
    print(f"load average {os.getloadavg()[0]:.1f} at start")
    data = json.loads(DATA.read_text())
    speakers = set(data["split"][args.part]) if args.part != "all" else None
    clips = [(c, a) for c in data["clips"]
             if (speakers is None or c.get("speaker") in speakers) and (a := load(c["source"])) is not None]
    leads = [a for s in LEADS if (a := load(s)) is not None]
    if not clips or not leads:
        print("no clips available")
        return 1
    # Spread the kinds of word (numbers, call signs, prompts) over the sessions.
    clips = [clips[i] for i in np.random.default_rng(0).permutation(len(clips))]
    n_words = correct = missed = invented = inventing = held = misheard = repeats = 0
    t0 = time.perf_counter()
    for k in range(args.start, args.start + args.sessions):
        audio, trials = build_session(k, clips, leads)
        finals, unsupported, unheard = stream(audio)
        held += unsupported
        repeats += unheard
        line = []
        for tr in trials:
            got = [f for f in finals if tr.start - 0.3 <= f.start < tr.stop - 0.3]
            keys = tuple(agreement_key(f.text) for f in got)
            spellings = {tuple(agreement_key(w) for w in a.split()) for a in tr.accept}
            ok = keys in spellings
            said = {k for sp in spellings for k in sp}
            n_words += 1
            correct += ok
            missed += not got
            invented += 0 if ok else len(got)
            inventing += bool(got) and not ok
            if got and not ok and not said & set(keys) and len(keys) <= max(len(sp) for sp in spellings):
                misheard += len(got)
            line.append(f"{tr.text}->{' '.join(f.text for f in got) or '-'}{'' if ok else ' (!)'}")
        print(f"  session {k + 1}: " + "; ".join(line), flush=True)
    lo, hi = wilson(correct, n_words)
    names = ", ".join(sorted(speakers or data.get("speakers", {}))) or "asterisk_allison_f"
    print(f"\nsessions {args.start + 1}-{args.start + args.sessions}, {n_words} isolated clips ({names}),"
          f" {time.perf_counter() - t0:.0f} s")
    print(f"  finalised correctly: {correct}/{n_words} = {100 * correct / n_words:.1f} %"
          f" (Wilson 95 % {100 * lo:.1f}-{100 * hi:.1f} %)")
    ilo, ihi = wilson(inventing, n_words)
    print(f"  invented final words: {invented}, in {inventing} of the {n_words} utterances (Wilson 95 %"
          f" {100 * ilo:.1f}-{100 * ihi:.1f} %): {misheard} misheard (in place of the words said),"
          f" {invented - misheard} extra; missed words: {missed}; words held back as unsupported: {held}"
          f" (repeats the audio did not hold: {repeats})")
    ok = invented == 0 and correct >= 0.9 * n_words
    print(f"  targets (zero invented, >= 90 % correct): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
