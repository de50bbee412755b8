"""Benchmark: the answer's speech (models.tts) — latency, cost, timing and intelligibility.

On a fixed set of answer sentences, with a warm FestivalTTS pool (the product's default):

* time to first phrase audio: the PhraseChunker's first phrase of each answer (streamed in as
  sub-word pieces), from the request to the SpokenPhrase in hand; p50 / p95;
* real-time factor (synthesis wall / audio duration), one phrase at a time and two at once, and
  CPU-ms per second of speech: festival's processes (/proc) and this process apart;
* word onsets against an independent measure: festival's own times vs the forced aligner's on the
  same audio; and OpenAITTS (forced aligner) vs the stand-in's exact espeak-ng onsets;
* Whisper tiny.en WER on the synthesized sentences (offline path, ``models.asr.transcribe_words``),
  both sides normalised alike (``normalize_text``: "$42.50" and "forty two dollars and fifty cents"
  agree) — the baseline the spoken answers must match. At the fastest and slowest speaking rates.

    flock /tmp/heavy.lock .venv/bin/python bench/tts.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time

import numpy as np

from alignment.text import word_edits
from alignment.types import SAMPLE_RATE
from models.controller import POLICIES
from models.tts import FestivalTTS, OpenAITTS, PhraseChunker, normalize_text, speaking_rate_wpm
from models.tts.base import display_words
from models.tts.normalize import bare

SENTENCES: tuple[str, ...] = (
    "Sure, I can help with that.",
    "The meeting starts at 10:30 tomorrow morning.",
    "Paris is the capital of France, and it is known for the Eiffel Tower.",
    "Water boils at 100 degrees Celsius at sea level.",
    "You should drink about two liters of water every day.",
    "The train to Boston leaves from platform 4 in twenty minutes.",
    "Your order of 3 books will cost $42.50 including shipping.",
    "Light from the sun takes about eight minutes to reach the earth.",
    "I would recommend taking a short walk after lunch.",
    "The first computer program was written in the 1840s by Ada Lovelace.",
    "It will be sunny this afternoon, with a high of 25 degrees.",
    "Please remember to bring your passport and your ticket.",
    "The library closes at 9 pm on weekdays and at noon on Sundays.",
    "A healthy adult heart beats between sixty and one hundred times a minute.",
    "Turn left at the next corner, then walk straight for two blocks.",
    "About 70% of the earth's surface is covered by water.",
    "The museum opened in 1995 and now has over two million visitors a year.",
    "Dr. Smith will see you on Monday, the 3rd of June.",
    "If you feel tired, try going to bed half an hour earlier.",
    "That is a great question, and the short answer is yes.",
)


def wer(ref: list[str], hyp: list[str]) -> tuple[int, int]:
    """(word edits, reference words) on normalised words."""
    return word_edits(ref, hyp)


def spoken_words(text: str) -> list[str]:
    return [bare(s) for w in normalize_text(text) for s in w.spoken]


def first_phrase(sentence: str) -> str:
    """The chunker's first phrase of ``sentence`` streamed as ~4-character pieces."""
    chunker = PhraseChunker()
    pieces = [sentence[i : i + 4] for i in range(0, len(sentence), 4)]
    for piece in pieces:
        if out := chunker.feed(piece):
            return out[0]
    return chunker.flush()[0]


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


async def festival_figures(tts: FestivalTTS, repeats: int) -> dict[str, list]:
    wpm = speaking_rate_wpm(POLICIES[0])
    await tts.synthesize("Warm up.", wpm)
    firsts = [first_phrase(s) for s in SENTENCES]
    latency = []
    for _ in range(repeats):
        for phrase in firsts:
            t0 = time.perf_counter()
            await tts.synthesize(phrase, wpm)
            latency.append(time.perf_counter() - t0)
    print(f"first phrases: {np.mean([len(p.split()) for p in firsts]):.1f} words on average, e.g. {firsts[1]!r}")
    print(f"time to first phrase audio (warm pool, {len(latency)} requests): p50 {pct(latency, 50) * 1000:.0f} ms, "
          f"p95 {pct(latency, 95) * 1000:.0f} ms, max {max(latency) * 1000:.0f} ms")

    results: dict[str, list] = {}
    for concurrency in (1, 2):
        cpu0, own0, wall0 = tts.cpu_seconds(), time.process_time(), time.perf_counter()
        phrases = []
        for i in range(0, len(SENTENCES), concurrency):
            batch = SENTENCES[i : i + concurrency]
            phrases += await asyncio.gather(*(tts.synthesize(s, wpm) for s in batch))
        wall = time.perf_counter() - wall0
        speech = sum(p.duration for p in phrases)
        fest_ms = (tts.cpu_seconds() - cpu0) * 1000 / speech
        own_ms = (time.process_time() - own0) * 1000 / speech
        print(f"{concurrency} at a time: {speech:.1f} s of speech in {wall:.2f} s wall, real-time factor "
              f"{wall / speech:.3f}; CPU per second of speech: festival {fest_ms:.0f} ms + this process "
              f"{own_ms:.0f} ms")
    for level in (0, 3):
        wpm = speaking_rate_wpm(POLICIES[level])
        results[f"{wpm:.0f}"] = [await tts.synthesize(s, wpm) for s in SENTENCES]
    return results


def onset_agreement(results: dict[str, list]) -> None:
    from alignment.forced import aligner

    for wpm, phrases in results.items():
        errors = []
        for sentence, phrase in zip(SENTENCES, phrases, strict=True):
            words = normalize_text(sentence)
            found = aligner().align(phrase.audio, [bare(s) for w in words for s in w.spoken]) or []
            if len(found) != sum(len(w.spoken) for w in words):
                continue
            ref = display_words(words, [None if a is None else (a.start, a.end) for a in found])
            errors += [(a.start - b.start) * 1000 for a, b in zip(phrase.words, ref, strict=True)]
        e = np.abs(np.array(errors))
        print(f"festival word onsets vs the forced aligner at {wpm} wpm ({len(e)} words): mean |error| "
              f"{e.mean():.1f} ms, median {np.median(e):.1f} ms, {np.mean(e <= 40) * 100:.0f} % within ±40 ms")


def whisper_wer(results: dict[str, list]) -> None:
    from models.asr import transcribe_words
    from models.whisper_loader import load_whisper

    model = load_whisper()
    pad = np.zeros(int(0.3 * SAMPLE_RATE), np.float32)
    for wpm, phrases in results.items():
        edits = total = 0
        for sentence, phrase in zip(SENTENCES, phrases, strict=True):
            heard = transcribe_words(np.concatenate([pad, phrase.audio, pad]), model=model)
            # Whisper splits "10:30" into the words "10" ":30" (or ".30"): join them back before reading.
            text = re.sub(r"(\d) ([.:]\d)", r"\1\2", " ".join(w.text for w in heard))
            e, n = wer(spoken_words(sentence), spoken_words(text))
            edits, total = edits + e, total + n
            if e:
                print(f"    {wpm} wpm: {sentence!r} heard as {text!r}")
        print(f"Whisper tiny.en WER at {wpm} wpm ({len(phrases)} sentences, {total} words): "
              f"{edits / total * 100:.1f} %")


async def openai_figures() -> None:
    from app.loadtest.tts_standin import StandInTTS

    server = await StandInTTS().start()
    tts = OpenAITTS(server.base_url)
    errors, latency = [], []
    try:
        for sentence in SENTENCES:
            plain = " ".join(w.strip(",.") for w in sentence.split())
            if any(ch.isdigit() or ch in "$%" for ch in plain) or "." in sentence[:-1]:
                continue  # espeak-ng reads numbers its own way: keep sentences whose words are its words
            t0 = time.perf_counter()
            phrase = await tts.synthesize(sentence, 160.0)
            latency.append(time.perf_counter() - t0)
            truth = server.last_truth
            if len(truth) == len(phrase.words):
                errors += [(w.start - t.start) * 1000 for w, t in zip(phrase.words, truth, strict=True)]
    finally:
        await tts.aclose()
        await server.stop()
    e = np.abs(np.array(errors))
    print(f"OpenAITTS on the espeak-ng stand-in ({len(latency)} sentences, {len(e)} words): onsets vs exact, mean "
          f"|error| {e.mean():.1f} ms, {np.mean(e <= 40) * 100:.0f} % within ±40 ms; request p50 "
          f"{pct(latency, 50) * 1000:.0f} ms (stand-in synthesis + decode + alignment)")


async def run(repeats: int) -> None:
    tts = FestivalTTS()
    try:
        results = await festival_figures(tts, repeats)
    finally:
        await tts.aclose()
    onset_agreement(results)
    await openai_figures()
    whisper_wer(results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="passes over the first phrases for the latency figure")
    args = ap.parse_args(argv)
    print("command: flock /tmp/heavy.lock .venv/bin/python bench/tts.py " + " ".join(sys.argv[1:]))
    print(f"machine: {os.cpu_count()} CPUs, 1-min load average {os.getloadavg()[0]:.1f} (other work on it)")
    print(f"voice: festival slt_hts, pool of 2; rates {speaking_rate_wpm(POLICIES[0]):.0f} / "
          f"{speaking_rate_wpm(POLICIES[3]):.0f} wpm (load levels 0 / 3)")
    asyncio.run(run(args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
