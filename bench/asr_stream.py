"""Streaming ASR benchmark: final-word latency, WER vs offline, RTF, CPU — with a baseline.

Audio: espeak-ng sentences (app.loadtest.testmedia) in several voices with exact word onsets; a word's
true end is the next word's onset (connected speech) or, for the last word of a sentence, the
last sample above -40 dB. Each stream is a few sentences with pauses between them.

* 1 stream, computation-aware simulated real time: 20 ms chunks are fed at their real-time
  instants on a simulated clock that advances by the measured compute of each ``feed``; an event
  is emitted at the simulated time its ``feed`` returned. Latency = emit time - true word end.
* N streams (default 4) through one :class:`models.asr.ASRWorker` with ``--lanes`` (default 2,
  one per core) decode threads, in real (wall) time: one asyncio producer per stream pushes
  20 ms chunks at their real-time instants; and simulated on CPU clocks, one core and one core
  per lane.
* Zero compute: the same single-stream run on a clock that only audio advances, i.e. the
  finalisation policy's own latency floor.
* WER of the streamed finals and of offline :func:`models.asr.transcribe_words` on the same
  audio, against the text that was spoken.
* Baseline in the same run: LocalAgreement-2 over faster-whisper (30-s padded), 1 s steps, no
  VAD gating (whisper_streaming's scheme), simulated real time like the 1-stream case.

Clocks: the machine is shared (other jobs load its two cores), so latency is reported twice: on
a clock that advances by the wall time of each compute step (this machine as loaded now), and on
one that advances by the CPU time used (what a dedicated core would take). The N-stream case runs
through the real ASRWorker in wall time, and as the worker's scheduling policy on a CPU clock.

Targets: 1 stream p50 <= 350 ms and p95 <= 700 ms; N streams p95 <= 1.0 s; streaming WER within
2 points of offline. Every target is judged on both clocks; exit status 1 when any fails.

    .venv/bin/python bench/asr_stream.py            # 5 sentences per stream
    .venv/bin/python bench/asr_stream.py --quick    # 2 sentences per stream: a quick look
    .venv/bin/python bench/asr_stream.py --held-out --no-baseline   # + 4 held-out sets x 8 sessions
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.text import agreement_key, word_edits  # noqa: E402
from alignment.types import SAMPLE_RATE, AudioChunk, WordToken  # noqa: E402
from app.loadtest import testmedia  # noqa: E402
from app.loadtest.metrics import TruthWord  # noqa: E402
from bench.asr_engines import BaselineStreamingASR, faster_whisper_engine  # noqa: E402
from models.asr import (  # noqa: E402
    ASRWorker,
    Engine,
    StreamingASR,
    StreamingConfig,
    UtteranceEnd,
    join_chunks,
    transcribe_words,
)
from models.asr.streaming import AGREEMENT  # noqa: E402

SENTENCES = (
    "please send the report to my office before noon",
    "the meeting has been moved to thursday afternoon",
    "can you check whether the lights are still on in the lab",
    "we should finish the first draft by the end of the week",
    "my brother bought a new bicycle last summer",
    "turn left at the next corner and park near the bank",
    "the children played in the garden until it was dark",
    "remember to water the plants while I am away",
)
# Sentences beyond SENTENCES: --held-out reports the policy's floor and its WER against offline on
# them, so a policy that fits SENTENCES alone shows. (The guard change of 2026-12-01 was judged on
# them too, so they are held out from the step/commit tuning before it, not from that.)
HELD_OUT = {
    "H": (
        "the train to the city leaves every twenty minutes",
        "she painted the kitchen a bright shade of yellow",
        "could you bring some bread and milk on your way home",
        "the old bridge was closed for repairs last month",
        "our team won the game in the final minute",
        "he forgot his umbrella and got wet in the rain",
        "the museum opens at nine on most weekdays",
        "please turn off the music before you go to sleep",
    ),
    "C": (
        "i left my keys on the table by the door",
        "the doctor will see you in about ten minutes",
        "we need more chairs for the party on friday",
        "the store on the corner sells fresh fruit",
        "he runs five miles every morning before work",
        "our flight was delayed because of the storm",
        "please write your name at the top of the page",
        "the cat slept on the warm windowsill all day",
    ),
    "D": (
        "the printer on the second floor is out of paper",
        "my sister is learning to play the piano",
        "they built a new school near the river",
        "you can pay with cash or with a card",
        "the soup needs a little more salt and pepper",
        "i will call you back after the meeting ends",
        "the library is closed on sundays and holidays",
        "we watched the sunset from the top of the hill",
    ),
}
VOICES = ("en-us", "en-GB-x-rp", "en-us+f3", "en-029")
# --held-out also decodes SENTENCES in these voices: the policy was tuned on VOICES only.
HELD_OUT_VOICES = ("en-gb-scotland", "en-us-nyc", "en-gb-x-gbcwmd", "en-us+f2")
CHUNK = 320  # 20 ms
PAUSE_S = 0.9


@dataclass(frozen=True)
class Session:
    audio: np.ndarray
    words: tuple[TruthWord, ...]  # espeak word events (it merges a few, e.g. "has been")
    text: tuple[str, ...]  # the words spoken: the WER reference

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def make_session(k: int, n_sentences: int, sentences: tuple[str, ...] = SENTENCES,
                 voices: tuple[str, ...] = VOICES) -> Session:
    """Stream ``k``: ``n_sentences`` sentences in voice ``k``, 0.9 s pauses, 0.5 s lead and tail."""
    voice = voices[k % len(voices)]
    parts = [np.zeros(int(0.5 * SAMPLE_RATE), np.float32)]
    words: list[TruthWord] = []
    text: list[str] = []
    t = 0.5
    for j in range(n_sentences):
        sentence = sentences[(k * 3 + j) % len(sentences)]
        text += sentence.split()
        sp = testmedia.speak(sentence, voice)
        loud = np.nonzero(np.abs(sp.samples) > 0.01)[0]
        speech_end = (loud[-1] + 1) / SAMPLE_RATE if loud.size else sp.duration
        for i, w in enumerate(sp.words):
            end = sp.words[i + 1].start if i + 1 < len(sp.words) else speech_end
            words.append(TruthWord(w.text, t + w.start, t + end))
        parts += [sp.samples, np.zeros(int(PAUSE_S * SAMPLE_RATE), np.float32)]
        t += sp.duration + PAUSE_S
    parts.append(np.zeros(int(0.5 * SAMPLE_RATE), np.float32))
    return Session(np.concatenate(parts), tuple(words), tuple(text))


def chunks(audio: np.ndarray) -> list[AudioChunk]:
    return [AudioChunk(i / SAMPLE_RATE, audio[i : i + CHUNK]) for i in range(0, len(audio), CHUNK)]


def wer(ref: list[str], hyp: list[str]) -> float:
    """Word error rate (edit distance / reference length) on normalised words."""
    edits, words = word_edits(ref, hyp)
    return edits / max(words, 1)


def matched(session: Session, finals: list[tuple[float, WordToken]]) -> list[tuple[TruthWord, float, WordToken]]:
    """(spoken word, emit time, final token) for each final matched (in order) to a spoken word."""
    ref = [agreement_key(w.text) for w in session.words]
    hyp = [agreement_key(tok.text) for _, tok in finals]
    return [(session.words[block.a + i], *finals[block.b + i])
            for block in difflib.SequenceMatcher(a=ref, b=hyp, autojunk=False).get_matching_blocks()
            for i in range(block.size)]


def latencies(session: Session, finals: list[tuple[float, WordToken]]) -> list[float]:
    """Emit time - true end for each final word matched to a spoken word."""
    return [t - truth.end for truth, t, _ in matched(session, finals)]


@dataclass
class RunResult:
    lat: list[float]  # emission on the wall-time simulated clock - true word end
    lat_cpu: list[float]  # the same on the CPU-time clock (one dedicated core)
    lat_zero: list[float]  # the same with zero compute: the policy's own latency floor
    finals: list[list[str]]
    compute_s: float
    cpu_s: float
    audio_s: float
    decodes: int
    onset_err: tuple[float, ...] = ()  # final word start - true start (s), matched words


def run_simulated(sessions: list[Session], config: StreamingConfig, engine: str | Engine = "whisper",
                  policy: type[StreamingASR] = StreamingASR) -> RunResult:
    """One stream at a time on computation-aware simulated clocks.

    Two clocks advance together: by the wall time of each ``feed`` (this machine, as loaded now)
    and by the process CPU time it used (what a dedicated core would take; nothing else runs in
    this process meanwhile). The decode points
    depend only on the audio, so one pass serves both.
    """
    lat, lat_cpu, lat_zero, finals_text, compute, cpu, decodes = [], [], [], [], 0.0, 0.0, 0
    onset_err: list[float] = []
    for s in sessions:
        asr = policy(engine, config)
        sim = sim_cpu = sim_zero = 0.0
        finals: list[tuple[float, WordToken]] = []
        finals_cpu: list[tuple[float, WordToken]] = []
        finals_zero: list[tuple[float, WordToken]] = []
        for c in [*chunks(s.audio), None]:
            if c is not None:
                sim, sim_cpu, sim_zero = max(sim, c.end), max(sim_cpu, c.end), c.end
            t, p = time.perf_counter(), time.process_time()
            evs = asr.feed(c) if c is not None else asr.flush()
            dt, dc = time.perf_counter() - t, time.process_time() - p
            compute += dt
            cpu += dc
            sim += dt
            sim_cpu += dc
            fin = [e for e in evs if isinstance(e, WordToken) and e.final]
            finals += [(sim, e) for e in fin]
            finals_cpu += [(sim_cpu, e) for e in fin]
            finals_zero += [(sim_zero, e) for e in fin]
        lat += latencies(s, finals)
        lat_cpu += latencies(s, finals_cpu)
        lat_zero += latencies(s, finals_zero)
        onset_err += [tok.start - truth.start for truth, _, tok in matched(s, finals_zero)]
        finals_text.append([tok.text for _, tok in finals])
        decodes += asr.decode_count
    return RunResult(lat, lat_cpu, lat_zero, finals_text, compute, cpu, sum(s.duration for s in sessions), decodes,
                     tuple(onset_err))


def run_lanes_cpu(sessions: list[Session], config: StreamingConfig, lanes: int) -> RunResult:
    """``lanes`` dedicated cores (ASRWorker(lanes=...)): sessions split evenly, one core each."""
    parts = [run_worker_cpu(sessions[i::lanes], config) for i in range(lanes) if sessions[i::lanes]]
    order = [k for i in range(lanes) for k in range(len(sessions))[i::lanes]]
    finals = [f for p in parts for f in p.finals]
    finals = [finals[order.index(k)] for k in range(len(sessions))]
    return RunResult([x for p in parts for x in p.lat], [x for p in parts for x in p.lat], [], finals,
                     sum(p.compute_s for p in parts), sum(p.cpu_s for p in parts),
                     sum(p.audio_s for p in parts), sum(p.decodes for p in parts))


def run_worker_cpu(sessions: list[Session], config: StreamingConfig) -> RunResult:
    """All sessions on one dedicated core, simulated: the ASRWorker's policy on a CPU-time clock.

    Like the worker, each turn takes the audio that has arrived by now of the session whose
    oldest unprocessed audio arrived first (earliest deadline first), joins it and feeds it once
    (at most one decode); a session with nothing left is flushed in its own turn.
    """
    streams = [StreamingASR("whisper", config) for _ in sessions]
    todo = [chunks(s.audio) for s in sessions]
    pos = [0] * len(sessions)
    done = [False] * len(sessions)
    finals: list[list[tuple[float, WordToken]]] = [[] for _ in sessions]
    sim, cpu = 0.0, 0.0
    while not all(done):
        live = [k for k in range(len(sessions)) if not done[k]]
        # Oldest waiting audio first; an exhausted session (its close pending) goes first.
        due = {k: (todo[k][pos[k]].end if pos[k] < len(todo[k]) else -1.0) for k in live}
        ready = [k for k in live if due[k] <= sim + 1e-9]
        if not ready:
            sim = min(due.values())
            continue
        k = min(ready, key=lambda i: due[i])
        j = pos[k]
        while j < len(todo[k]) and todo[k][j].end <= sim + 1e-9:
            j += 1
        batch = todo[k][pos[k] : j]
        pos[k] = j
        p = time.process_time()
        evs = streams[k].feed(join_chunks(batch)) if batch else []
        if pos[k] == len(todo[k]):
            evs += streams[k].flush()
            done[k] = True
        dc = time.process_time() - p
        sim += dc
        cpu += dc
        finals[k] += [(sim, e) for e in evs if isinstance(e, WordToken) and e.final]
    lat = [x for s, f in zip(sessions, finals, strict=True) for x in latencies(s, f)]
    return RunResult(lat, lat, [], [[t.text for _, t in f] for f in finals], cpu, cpu,
                     sum(s.duration for s in sessions), sum(a.decode_count for a in streams))


async def run_worker(sessions: list[Session], config: StreamingConfig, lanes: int = 1) -> tuple[RunResult, object]:
    """All sessions at once through one ASRWorker, chunks pushed at their real-time instants."""
    worker = ASRWorker("whisper", config, max_queue_s=10.0, lanes=lanes)
    worker.warmup()
    cpu0 = time.process_time()
    t0 = time.perf_counter() + 0.2

    async def one(k: int, s: Session) -> list[tuple[float, WordToken]]:
        stream = worker.open(f"bench-{k}")
        start = t0 + 0.137 * k  # staggered so streams do not tick in lockstep
        got: list[tuple[float, WordToken]] = []

        async def consume() -> None:
            async for ev in stream.events():
                if isinstance(ev, WordToken) and ev.final:
                    got.append((time.perf_counter() - start, ev))
                elif isinstance(ev, UtteranceEnd):
                    pass

        task = asyncio.create_task(consume())
        for c in chunks(s.audio):
            delay = start + c.end - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            stream.push(c)
        stream.close()
        await task
        return got

    results = await asyncio.gather(*(one(k, s) for k, s in enumerate(sessions)))
    cpu = time.process_time() - cpu0
    stats = worker.stats()
    worker.stop()
    lat = [x for s, got in zip(sessions, results, strict=True) for x in latencies(s, got)]
    res = RunResult(lat, lat, [], [[t.text for _, t in got] for got in results], stats.decodes * stats.decode_ms_mean
                    / 1000, cpu, sum(s.duration for s in sessions), stats.decodes)
    return res, stats


def spoken(sessions: list[Session]) -> list[str]:
    """The words spoken in ``sessions``, in order: the WER reference."""
    return [w for s in sessions for w in s.text]


def offline_wer(sessions: list[Session]) -> float:
    """WER of offline :func:`models.asr.transcribe_words` on the sessions' audio."""
    return wer(spoken(sessions), [w.text for s in sessions for w in transcribe_words(s.audio)])


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 sentences per stream (a quick look)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--lanes", type=int, default=2, help="ASRWorker lanes (threads, one model copy each)"
                    " for the N-stream case; the machine has 2 cores")
    ap.add_argument("--held-out", action="store_true", help="also the policy floor and WER on the HELD_OUT sets")
    ap.add_argument("--held-out-sessions", type=int, default=8)
    args = ap.parse_args(argv)
    n_sent = 2 if args.quick else 5
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"machine: {os.cpu_count()} cpus, load average at start {os.getloadavg()[0]:.2f} "
          "(shared with other engineers' jobs; absolute times are inflated by that load)")
    sessions = [make_session(k, n_sent) for k in range(max(args.streams, 1))]
    # All audio before any decoding: refinement synthesises speech too, and libespeak-ng keeps
    # state between calls, so audio made after a run would change with what that run synthesised.
    held_sets = [(f"{name}, bench voices", sentences, VOICES) for name, sentences in HELD_OUT.items()]
    held_sets.append(("SENTENCES, held-out voices", SENTENCES, HELD_OUT_VOICES))
    held_out = [(name, [make_session(k, n_sent, sentences, voices) for k in range(args.held_out_sessions)])
                for name, sentences, voices in held_sets] if args.held_out else []
    config = StreamingConfig()
    fails = 0

    def verdict(name: str, value: float, target: float, unit: str = "ms") -> None:
        nonlocal fails
        ok = value <= target
        fails += not ok
        close = abs(value - target) < 0.5 or unit == "points"  # a FAIL never reads as the target
        shown = f"{value:.1f}" if close else f"{value:.0f}"
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {shown} {unit} (target <= {target:.0f} {unit})")

    # Offline reference (same model, same audio).
    transcribe_words(sessions[0].audio[: 2 * SAMPLE_RATE])  # load and warm (numba DTW compile)
    off_ref = spoken(sessions)
    wer_off = offline_wer(sessions)

    one = run_simulated(sessions, config, "whisper")
    wer_stream = wer(off_ref, sum(one.finals, []))
    print(f"\n1 stream at a time ({len(sessions)} sessions, {len(VOICES[: len(sessions)])} voices), whisper"
          f" (variable context), step {config.step_s}s, LocalAgreement-{AGREEMENT},"
          f" simulated real time: {len(one.lat)} words, audio {one.audio_s:.1f}s")
    print(f"  wall clock (this machine, loaded): p50 {1000 * pct(one.lat, 50):.0f} ms"
          f"  p95 {1000 * pct(one.lat, 95):.0f} ms  max {1000 * max(one.lat, default=float('nan')):.0f} ms")
    print(f"  CPU clock (one dedicated core):    p50 {1000 * pct(one.lat_cpu, 50):.0f} ms"
          f"  p95 {1000 * pct(one.lat_cpu, 95):.0f} ms  max {1000 * max(one.lat_cpu, default=float('nan')):.0f} ms")
    print(f"  zero compute (the policy's floor): p50 {1000 * pct(one.lat_zero, 50):.0f} ms"
          f"  p95 {1000 * pct(one.lat_zero, 95):.0f} ms  max {1000 * max(one.lat_zero, default=float('nan')):.0f} ms")
    print(f"  RTF wall {one.compute_s / one.audio_s:.3f}, CPU {one.cpu_s / one.audio_s:.3f}"
          f" ({one.cpu_s:.2f} CPU s for {one.audio_s:.1f} s audio, {one.cpu_s / len(sessions):.2f} per stream);"
          f" decodes {one.decodes}, {1000 * one.compute_s / max(one.decodes, 1):.0f} ms wall"
          f" / {1000 * one.cpu_s / max(one.decodes, 1):.0f} ms CPU per decoding feed")
    print(f"  WER streaming {100 * wer_stream:.1f}%  offline {100 * wer_off:.1f}%  ({len(off_ref)} words)")
    err = np.abs(one.onset_err)
    print(f"  final-word onsets vs truth (a word goes on the frames within 40 ms of its start):"
          f" mean {1000 * err.mean():.0f} ms, within 40 ms {100 * np.mean(err <= 0.04):.0f}%"
          f" ({err.size} words; informative, no target here)")
    verdict("1 stream p50, wall clock", 1000 * pct(one.lat, 50), 350)
    verdict("1 stream p95, wall clock", 1000 * pct(one.lat, 95), 700)
    verdict("1 stream p50, CPU clock", 1000 * pct(one.lat_cpu, 50), 350)
    verdict("1 stream p95, CPU clock", 1000 * pct(one.lat_cpu, 95), 700)
    verdict("WER streaming - offline", 100 * (wer_stream - wer_off), 2.0, "points")

    if args.streams > 1:
        refs = spoken(sessions)
        many, stats = asyncio.run(run_worker(sessions, config, args.lanes))
        print(f"\n{args.streams} streams through one ASRWorker ({args.lanes} lanes), real time (wall):"
              f" {len(many.lat)} words")
        print(f"  p50 {1000 * pct(many.lat, 50):.0f} ms  p95 {1000 * pct(many.lat, 95):.0f} ms"
              f"  max {1000 * max(many.lat, default=float('nan')):.0f} ms; CPU {many.cpu_s / args.streams:.2f} s"
              f" per stream for {many.audio_s / args.streams:.1f} s audio;"
              f" WER {100 * wer(refs, sum(many.finals, [])):.1f}%")
        print(f"  worker: {stats}")
        rr = run_worker_cpu(sessions, config)
        print(f"{args.streams} streams, the worker's scheduling on a CPU clock (one dedicated core):"
              f" p50 {1000 * pct(rr.lat, 50):.0f} ms  p95 {1000 * pct(rr.lat, 95):.0f} ms;"
              f" CPU RTF {rr.cpu_s / rr.audio_s:.3f}; decodes {rr.decodes};"
              f" WER {100 * wer(refs, sum(rr.finals, [])):.1f}%")
        if args.lanes > 1:
            rl = run_lanes_cpu(sessions, config, args.lanes)
            print(f"{args.streams} streams, {args.lanes} lanes, each lane's scheduling on its own CPU clock"
                  f" ({args.lanes} dedicated cores): p50 {1000 * pct(rl.lat, 50):.0f} ms"
                  f"  p95 {1000 * pct(rl.lat, 95):.0f} ms; decodes {rl.decodes};"
                  f" WER {100 * wer(refs, sum(rl.finals, [])):.1f}%")
        else:
            rl = rr
        verdict(f"{args.streams} streams p95, wall clock ({args.lanes} lanes)", 1000 * pct(many.lat, 95), 1000)
        verdict(f"{args.streams} streams p95, CPU clock ({args.lanes} cores)", 1000 * pct(rl.lat, 95), 1000)

    if not args.no_baseline:
        # LocalAgreement-2 (the module's AGREEMENT) on the 1 s grid only
        base_cfg = replace(config, step_s=1.0, max_window_s=15.0, refine=False, guard_decode=False)
        base = run_simulated(sessions, base_cfg, faster_whisper_engine(), BaselineStreamingASR)
        print("\nbaseline: LocalAgreement-2 over faster-whisper (int8, 30-s padded), 1 s chunks, no VAD,"
              f" simulated real time: {len(base.lat)} words")
        print(f"  wall clock p50 {1000 * pct(base.lat, 50):.0f} ms  p95 {1000 * pct(base.lat, 95):.0f} ms;"
              f" CPU clock p50 {1000 * pct(base.lat_cpu, 50):.0f} ms  p95 {1000 * pct(base.lat_cpu, 95):.0f} ms;"
              f" RTF wall {base.compute_s / base.audio_s:.3f}; WER {100 * wer(off_ref, sum(base.finals, [])):.1f}%")
        print(f"  ours vs baseline, p50: {pct(base.lat, 50) / max(pct(one.lat, 50), 1e-9):.1f}x lower (wall),"
              f" {pct(base.lat_cpu, 50) / max(pct(one.lat_cpu, 50), 1e-9):.1f}x lower (CPU)")
    if args.held_out:
        print(f"\nheld out ({args.held_out_sessions} sessions of {n_sent} sentences a set; 1 stream, simulated):")
        zero, cpu, errs_str, errs_off, n_ref = [], [], 0.0, 0.0, 0
        for name, held in held_out:
            res = run_simulated(held, config, "whisper")
            ref = spoken(held)
            w_off, w_str = offline_wer(held), wer(ref, sum(res.finals, []))
            errs_str, errs_off, n_ref = errs_str + w_str * len(ref), errs_off + w_off * len(ref), n_ref + len(ref)
            zero, cpu = zero + res.lat_zero, cpu + res.lat_cpu
            print(f"  {name}: floor p50 {1000 * pct(res.lat_zero, 50):.0f} ms"
                  f"  p95 {1000 * pct(res.lat_zero, 95):.0f} ms;"
                  f" CPU clock p50 {1000 * pct(res.lat_cpu, 50):.0f} ms  p95 {1000 * pct(res.lat_cpu, 95):.0f} ms;"
                  f" WER streaming {100 * w_str:.1f}%  offline {100 * w_off:.1f}%")
        print(f"  pooled ({len(cpu)} words, {n_ref} reference words): floor p50 {1000 * pct(zero, 50):.0f} ms"
              f"  p95 {1000 * pct(zero, 95):.0f} ms; WER streaming {100 * errs_str / n_ref:.1f}%"
              f"  offline {100 * errs_off / n_ref:.1f}%")
        verdict("held out, pooled: 1 stream p50, CPU clock", 1000 * pct(cpu, 50), 350)
        verdict("held out, pooled: 1 stream p95, CPU clock", 1000 * pct(cpu, 95), 700)
        verdict("held out, pooled: WER streaming - offline", 100 * (errs_str - errs_off) / n_ref, 2.0, "points")
    print(f"\nload average at end {os.getloadavg()[0]:.2f}; {'ALL PASS' if not fails else f'{fails} FAIL'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
