"""Benchmark: turn latency (end of the user's speech → first response token) and turns cut short.

Targets (issue 22): turn latency p50 ≤ 600 ms and p95 ≤ 900 ms with a responder whose own TTFT is
~100 ms, with no more turns cut short than before (a turn is cut short when the server answers at a
pause inside it).

A spawned ``synchrony serve --responder openai`` talks to ``app.loadtest.llm_standin`` (TTFT ``--ttft-ms``,
on loopback). One WebRTC peer (``app.loadtest.peer.WhipPeer``) speaks held-out turns: sentences used nowhere
else, in voices the ASR was not tuned on (bench/asr_stream.py HELD_OUT_VOICES), most with a
hesitation pause inside (0.35–0.6 s), each followed by 2.5 s of silence. Truth is the generated
audio: where each part's speech ends. For every response the server sends, the end of speech it
answered (its arrival minus the server-measured ``turn_ms``, one monotonic clock on this machine)
is matched to the truth: near a pause inside a turn → that turn was cut short; near the end of a
turn → the turn's latency is the first token's arrival minus the true end of speech (what the
user waits, network included). The server's own figures (turn_ms, LST TTFT) are printed beside.

Both are measured in one run, same clip and machine, in interleaved rounds: "before" with
``--turn-end-silence 0`` (the ASR's endpoint and final decode decide, as before app/live/turns.py),
"after" with the defaults.

    .venv/bin/python bench/turn_latency.py [--ttft-ms 100] [--rounds 2] [--server-arg=--turn-end-silence=0.3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alignment.types import SAMPLE_RATE

#: (parts, pause inside ms) — parts are spoken with the pause between them.
TURNS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("i would like to order", "a large pizza with mushrooms"), 450),
    (("what time does the pharmacy close tonight",), 0),
    (("the package arrived this morning", "but the box was badly damaged"), 400),
    (("can you remind me", "to call the dentist tomorrow"), 550),
    (("we are meeting at the station", "at half past six"), 350),
    (("how far is it to the airport",), 0),
    (("i think", "we should leave a little earlier"), 600),
    (("the heating in my flat", "stopped working last night"), 500),
    (("please add eggs and butter to the shopping list",), 0),
    (("my phone keeps restarting", "every few minutes"), 400),
)
VOICES = ("en-gb-scotland", "en-us-nyc", "en-us+f2")
END_PAUSE_S = 2.5


@dataclass(frozen=True)
class TurnTruth:
    inside_ends: tuple[float, ...]  # clip time where speech stops before a pause inside the turn
    end: float  # clip time where the turn's speech ends


def build_clip(fps: float = 25.0) -> tuple[object, list[TurnTruth]]:
    from app.loadtest import testmedia

    parts, truths, t = [np.zeros(int(0.6 * SAMPLE_RATE), np.float32)], [], 0.6
    for k, (texts, pause_ms) in enumerate(TURNS):
        inside = []
        for j, text in enumerate(texts):
            audio = testmedia.synthesize_speech(text, voice=VOICES[k % len(VOICES)]).samples
            voiced = np.flatnonzero(np.abs(audio) > 1e-3)
            audio = audio[: int(voiced[-1]) + 1] if voiced.size else audio
            parts.append(audio)
            t += len(audio) / SAMPLE_RATE
            if j < len(texts) - 1:
                inside.append(t)
                parts.append(np.zeros(int(pause_ms / 1000 * SAMPLE_RATE), np.float32))
                t += pause_ms / 1000
        truths.append(TurnTruth(tuple(inside), t))
        parts.append(np.zeros(int(END_PAUSE_S * SAMPLE_RATE), np.float32))
        t += END_PAUSE_S
    audio = np.concatenate(parts).astype(np.float32)
    n = int(len(audio) / SAMPLE_RATE * fps)
    frames = testmedia.talking_face_frames(testmedia.speech_envelope(audio, np.arange(n) / fps))
    return testmedia.AVClip(audio, frames, fps, (), "turns", (), 0.0), truths


def classify(firsts: list[tuple[float, float, float]], truths: list[TurnTruth], period: float, loops: int,
             by_turn: dict[int, list[int]]) -> tuple[list[float], int, int, list[float], list[float]]:
    """firsts: (arrival clip time, turn_ms, ttft_ms) per response → (turn latencies s, turns cut short,
    unmatched responses, server turn_ms of matched turns, LST TTFT ms); ``by_turn`` collects the
    latencies (ms) per turn of TURNS."""
    latencies, server_turn, ttfts = [], [], []
    cut_turns: set[tuple[int, int]] = set()
    unmatched = 0
    answered: set[tuple[int, int]] = set()
    for arrival, turn_ms, ttft_ms in firsts:
        ttfts.append(ttft_ms)
        end_seen = arrival - turn_ms / 1000.0  # the end of speech the server answered (clip time)
        best = None
        for loop in range(loops):
            base = loop * period
            for k, truth in enumerate(truths):
                for inside in truth.inside_ends:
                    if abs(end_seen - (base + inside)) < 0.3:
                        best = ("cut", (loop, k), 0.0)
                if abs(end_seen - (base + truth.end)) < 0.4:
                    best = ("end", (loop, k), arrival - (base + truth.end))
        if best is None:
            unmatched += 1
        elif best[0] == "cut":
            cut_turns.add(best[1])
        elif best[1] not in answered:
            answered.add(best[1])
            latencies.append(best[2])
            server_turn.append(turn_ms)
            by_turn[best[1][1]].append(round(best[2] * 1000))
    return latencies, len(cut_turns), unmatched, server_turn, ttfts


@dataclass(frozen=True)
class Figures:
    latencies_ms: np.ndarray
    cut: int
    unmatched: int
    server_turn_ms: list[float]
    ttft_ms: list[float]
    by_turn: dict[int, list[int]]


async def measure(args: argparse.Namespace, server_args: list[str]) -> Figures:
    from app.loadtest.llm_standin import StandInLLM
    from app.loadtest.peer import WhipPeer
    from app.loadtest.spawn import SpawnedServer

    clip, truths = await asyncio.to_thread(build_clip)
    llm = await StandInLLM(ttft_s=args.ttft_ms / 1000.0).start()
    log = Path(tempfile.mkdtemp(prefix="turn-latency-")) / "server.log"
    server = SpawnedServer(2, log, ["--responder", "openai", "--llm-url", llm.base_url, *server_args])
    try:
        await asyncio.to_thread(server.wait_ready)
        peer = WhipPeer(server.url, clip, loop=True)
        await peer.connect(timeout=20)
        await asyncio.sleep(args.loops * clip.duration + 0.5)
        await peer.close()
    finally:
        await asyncio.to_thread(server.stop)
        await llm.stop()
    t0 = peer.t0_wall
    firsts = [(e.wall - t0, e.message["turn_ms"], e.message["ttft_ms"]) for e in peer.events
              if e.type == "response" and "turn_ms" in e.message]
    by_turn: dict[int, list[int]] = {k: [] for k in range(len(TURNS))}
    lat, cut, unmatched, server_turn, ttfts = classify(firsts, truths, clip.duration, args.loops, by_turn)
    return Figures(np.asarray(lat) * 1000, cut, unmatched, server_turn, ttfts, by_turn)


def report(name: str, f: Figures, turns: int, with_pause: int) -> None:
    ms = f.latencies_ms
    print(f"{name}: load average {[round(x, 2) for x in os.getloadavg()]}")
    if len(ms):
        print(f"  turn latency (true end of speech → first token at the client): n={len(ms)} "
              f"p50 {np.percentile(ms, 50):.0f} ms, p95 {np.percentile(ms, 95):.0f} ms, max {ms.max():.0f} ms")
        print(f"  server turn_ms (VAD end of speech → first token): p50 {np.percentile(f.server_turn_ms, 50):.0f} ms,"
              f" p95 {np.percentile(f.server_turn_ms, 95):.0f} ms; LST TTFT p50 {np.percentile(f.ttft_ms, 50):.0f} ms,"
              f" p99 {np.percentile(f.ttft_ms, 99):.0f} ms")
    print(f"  turns cut short (answered at a pause inside): {f.cut} of {with_pause}; turns answered at their end: "
          f"{len(ms)} of {turns}; responses matching no truth: {f.unmatched}")
    print("  per turn (ms): " + "; ".join(f"'{' '.join(TURNS[k][0])[-18:]}' {v}" for k, v in f.by_turn.items()))


def _pool(runs: list[Figures]) -> Figures:
    return Figures(np.concatenate([f.latencies_ms for f in runs]), sum(f.cut for f in runs),
                   sum(f.unmatched for f in runs), [x for f in runs for x in f.server_turn_ms],
                   [x for f in runs for x in f.ttft_ms],
                   {k: [x for f in runs for x in f.by_turn[k]] for k in runs[0].by_turn})


async def run(args: argparse.Namespace) -> int:
    turns = len(TURNS) * args.loops
    with_pause = sum(1 for parts, _ in TURNS if len(parts) > 1) * args.loops
    print(f"{turns} turns ({with_pause} with a pause inside), responder TTFT {args.ttft_ms:g} ms")
    befores, afters = [], []
    for r in range(args.rounds):  # interleaved, so a load that drifts over the run hits both alike
        befores.append(await measure(args, ["--turn-end-silence", "0"]))
        report(f"round {r + 1} before (the ASR's endpoint answers: --turn-end-silence 0)", befores[-1], turns,
               with_pause)
        afters.append(await measure(args, args.server_arg))
        report(f"round {r + 1} after (live turns, server args {args.server_arg or 'defaults'})", afters[-1], turns,
               with_pause)
    before, after = _pool(befores), _pool(afters)
    report("all rounds, before", before, turns * args.rounds, with_pause * args.rounds)
    report("all rounds, after", after, turns * args.rounds, with_pause * args.rounds)
    # Cuts are compared as rates over the rounds whose every response matched the truth (a round
    # whose responses matched nothing counts no cuts, which would flatter it).
    cut_b, n_b = sum(f.cut for f in befores if not f.unmatched), with_pause * sum(not f.unmatched for f in befores)
    cut_a, n_a = sum(f.cut for f in afters if not f.unmatched), with_pause * sum(not f.unmatched for f in afters)
    ms = after.latencies_ms
    checks = {
        "turn latency p50 <= 600 ms": len(ms) > 0 and np.percentile(ms, 50) <= 600,
        "turn latency p95 <= 900 ms": len(ms) > 0 and np.percentile(ms, 95) <= 900,
        f"turns cut short: {cut_a} of {n_a} after <= {cut_b} of {n_b} before":
            n_a > 0 and n_b > 0 and cut_a / n_a <= cut_b / n_b,
        "every turn answered at its end": len(ms) == turns * args.rounds,
    }
    for what, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {what}")
    return 0 if all(checks.values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ttft-ms", type=float, default=100.0, help="the stand-in responder's own TTFT")
    ap.add_argument("--loops", type=int, default=1, help="times the clip is spoken per measurement")
    ap.add_argument("--rounds", type=int, default=2, help="before/after measurement pairs, interleaved")
    ap.add_argument("--server-arg", action="append", default=[], help="extra `synchrony serve` argument (after)")
    args = ap.parse_args()
    t = time.monotonic()
    code = asyncio.run(run(args))
    print(f"({time.monotonic() - t:.0f} s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
