"""Barge-in figures, offline: detection delay, false interruptions, residual echo, CPU per chunk.

Scenes from bench/echo_sim.py on the HELD-OUT sentences, voices and room seeds (the detector was
tuned on TUNE_* with seeds 0-9): the answer (festival slt_hts) plays from 0.5 s and its echo comes
back through a random room; a barge-in scene adds a user (ked/kal diphone, espeak-ng, a human
clip) at a random point of the answer; an echo-only scene adds nothing, a noise scene a cough,
clicks, a slam or a noise burst. The mic is fed in 20 ms chunks as a session would.

Detection delay = the end of the chunk whose ``feed`` returned the BargeIn minus the true onset
(network and client playout come on top). A BargeIn before the true onset, in an echo-only or a
noise scene, is a false interruption. ERLE compares the mic's echo energy with the cleaned output
over echo-only answers (from the echo's arrival to its end). ``--peer``: the voice bench's echo path instead
(the coarse delay was tuned on TUNE_* with peer seeds 0-15 and 200-205). ``--trace FOLDER``: a live session
recorded by ``bench/voice.py --trace`` (the detector's inputs as the server saw them), replayed. Run:
``flock /tmp/heavy.lock env PYTHONPATH=$PWD .venv/bin/python bench/barge_in.py``
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from alignment.echo import EchoCanceller, EchoConfig
from alignment.types import SAMPLE_RATE as SR
from alignment.types import AudioChunk
from bench import echo_sim as es
from models.bargein import BargeInConfig, BargeInDetector

CHUNK = 320
#: Cleaned echo above this level (dBFS) may still be heard as words (the canceller's floor note, alignment/echo.py).
LEAK_DBFS = -55.0


def run_scene(scene: es.Scene, det: BargeInDetector,
              t0: float = 0.0) -> tuple[np.ndarray, float | None, float | None, list[float]]:
    """Feed the scene from session time ``t0``; (cleaned mic, onset pts of the BargeIn, time it was emitted, cpu s
    per chunk), times on the scene's own clock."""
    a0 = int(scene.answer_pts * SR)
    out, cpu = [], []
    onset = emitted = None
    sends, j = scene.sends, 0
    end = int(round(sends[-1][0] * SR)) + CHUNK if sends else a0 + scene.played.size
    for i in range(0, scene.mic.size - CHUNK + 1, CHUNK):
        playing = a0 <= i < end and emitted is None
        t = time.perf_counter()
        if sends is None and playing:
            det.played(t0 + i / SR, scene.played[i - a0 : i - a0 + CHUNK])
        while sends is not None and emitted is None and j < len(sends) and sends[j][0] < (i + CHUNK) / SR:
            det.played(t0 + sends[j][1], sends[j][2])  # what went out before this mic chunk could hold its echo
            j += 1
        clean, hit = det.feed(AudioChunk(t0 + i / SR, scene.mic[i : i + CHUNK]), playing)
        cpu.append(time.perf_counter() - t)
        out.append(clean.samples)
        if hit is not None and emitted is None:
            onset, emitted = hit.pts - t0, (i + CHUNK) / SR
    return np.concatenate(out), onset, emitted, cpu


def run_after(before: es.Scene, scene: es.Scene,
              det: BargeInDetector) -> tuple[np.ndarray, float | None, float | None, list[float]]:
    """``run_scene`` of ``scene`` in the session ``before`` opened: the same detector, from where its mic ended."""
    run_scene(before, det)
    return run_scene(scene, det, before.mic.size / SR)


def canceller_cpu(scene: es.Scene) -> list[float]:
    """CPU s per chunk of the echo canceller alone over the scene."""
    ec = EchoCanceller()
    a0, cpu = int(scene.answer_pts * SR), []
    for i in range(0, scene.mic.size - CHUNK + 1, CHUNK):
        t = time.perf_counter()
        if a0 <= i < a0 + scene.played.size:
            ec.played(i / SR, scene.played[i - a0 : i - a0 + CHUNK])
        ec.process(AudioChunk(i / SR, scene.mic[i : i + CHUNK]))
        cpu.append(time.perf_counter() - t)
    return cpu


def erle_db(scene: es.Scene, clean: np.ndarray) -> float:
    a = int((scene.answer_pts + scene.room.delay_s) * SR)
    b = min(int((scene.answer_pts + scene.room.delay_s + scene.played.size / SR) * SR), clean.size)
    return float(10 * np.log10(np.sum(scene.echo[a:b] ** 2) / (np.sum(clean[a:b] ** 2) + 1e-12)))


def peer_scenes(args: argparse.Namespace, answers: tuple[str, ...], users: tuple[tuple[str, str], ...],
                make: Callable[[], BargeInDetector]) -> None:
    """The load-test peer's echo path (``bench/voice.py``): sparse taps, 40-150 ms of network, jittered frames
    played out by the peer's jitter buffer, 1 % of frames after a server stall, each frame stamped when it went
    out; the user 0.5-1.5 s into the answer (as the voice bench barges in) at -6..+6 dB from the answer's peak."""
    delays, false_echo, missed = [], 0, 0
    for k in range(args.n):
        rng = np.random.default_rng(args.seed + k)
        bulk, user_db, at = float(rng.uniform(0.04, 0.15)), float(rng.uniform(-6, 6)), float(rng.uniform(0.5, 1.5))
        for user in (users[k % len(users)], None):
            scene = es.make_peer_scene(np.random.default_rng(args.seed + 7919 * (k + 1)), answers[k % len(answers)],
                                       bulk, 0.01, room_seed=args.seed + k, stall_p=0.01, stamp_sent=True, user=user,
                                       at_s=at, user_db=user_db)
            _, _, emitted, _ = run_scene(scene, make())
            if user is None:
                false_echo += emitted is not None
            elif scene.onset is None or emitted is None or not 0 <= emitted - scene.onset <= 1.0:
                missed += 1
            else:
                delays.append(emitted - scene.onset)
    d = np.array(delays or [np.nan]) * 1e3
    print(f"peer echo path, {'tuning' if args.tune else 'held-out'}: {args.n} barge-ins 0.5-1.5 s into the answer, "
          f"{args.n} echo-only; load average {[round(x, 2) for x in os.getloadavg()]}")
    print(f"detection delay: p50 {np.nanpercentile(d, 50):.0f} ms  p90 {np.nanpercentile(d, 90):.0f} ms  max "
          f"{np.nanmax(d):.0f} ms  (detected within 1 s {len(delays)}/{args.n}); false interruptions by the echo "
          f"{false_echo}/{args.n}")


def no_echo_scenes(args: argparse.Namespace, answers: tuple[str, ...], users: tuple[tuple[str, str], ...],
                   make: Callable[[], BargeInDetector]) -> None:
    """Sessions where nothing echoes back (headphones, the browser's echo cancellation, a load-test peer without
    an echo path): the user barges in 0.5-1.5 s into an answer (as the voice bench does) at -12..-4 dB from its
    peak, in the session's first answer and in a later one (an answer nobody spoke over went before). What the
    canceller takes from the user (every 20 ms chunk of the user louder than -50 dBFS, cleaned against raw) is
    what the ASR loses."""
    loud = 10 ** (-50 / 10)
    print(f"no echo, {'tuning' if args.tune else 'held-out'}: {args.n} barge-ins while the answer plays")
    for later in (False, True):
        delays, lost = [], []
        for k in range(args.n):
            rng = np.random.default_rng(args.seed + k)
            scene = es.make_scene(rng, answers[k % len(answers)], user=users[k % len(users)], echoes=False,
                                  at_s=float(rng.uniform(0.5, 1.5)))
            if later:
                before = es.make_scene(np.random.default_rng(args.seed + 700 + k), answers[(k + 1) % len(answers)],
                                       echoes=False)
                clean, _, emitted, _ = run_after(before, scene, make())
            else:
                clean, _, emitted, _ = run_scene(scene, make())
            assert scene.onset is not None
            if emitted is not None and emitted <= scene.onset + 1.0:
                delays.append(emitted - scene.onset)
            a0, a1 = int(scene.answer_pts * SR), int((scene.answer_pts + scene.played.size / SR) * SR)
            for i in range(a0, min(a1, clean.size) - CHUNK + 1, CHUNK):
                raw = float(np.mean(scene.mic[i : i + CHUNK] ** 2))
                if raw > loud:
                    lost.append(10 * np.log10(raw / (float(np.mean(clean[i : i + CHUNK] ** 2)) + 1e-12)))
        d, g = np.array(delays or [np.nan]) * 1e3, np.array(lost)
        print(f"{'a later answer' if later else 'first answer'}: detection delay p50 {np.nanpercentile(d, 50):.0f} ms"
              f"  p99 {np.nanpercentile(d, 99):.0f} ms  (detected within 1 s {len(delays)}/{args.n}); user energy "
              f"removed over {g.size} loud chunks: p50 {np.median(g):.1f} dB  p90 {np.percentile(g, 90):.1f} dB; "
              f"chunks losing > 6 dB {np.mean(g > 6):.1%}")
    # a cough, a click, a slam or a noise burst with nothing echoing: the VAD alone must refuse it
    noise_false = 0
    for k in range(args.n):
        rng = np.random.default_rng(args.seed + 300 + k)
        scene = es.make_scene(rng, answers[k % len(answers)], noise=("cough", "click", "door", "noise")[k % 4],
                              echoes=False)
        noise_false += run_scene(scene, make())[2] is not None
    # then the echo begins (headphones unplugged): the bound learned without echo must not let it interrupt
    late_false = 0
    for k in range(args.n):
        rng = np.random.default_rng(args.seed + 500 + k)
        quiet = es.make_scene(rng, answers[k % len(answers)], echoes=False)
        late_false += run_after(quiet, es.make_scene(rng, answers[(k + 1) % len(answers)]), make())[2] is not None
    print(f"false interruptions: noise events {noise_false}/{args.n}; an echo-only answer after one with no echo "
          f"{late_false}/{args.n}")


def trace_offset(mic: np.ndarray, mic_t0: float, voice: np.ndarray) -> float:
    """Session time minus peer time: the lag that best matches the peer's voice-only track against the traced
    mic (both 16 kHz; the mic also holds the echo), by cross-correlation at 4 kHz."""
    from scipy.signal import fftconvolve

    a = mic[: mic.size // 4 * 4].reshape(-1, 4).mean(axis=1)
    b = voice[: voice.size // 4 * 4].reshape(-1, 4).mean(axis=1)
    c = fftconvolve(a, b[::-1], mode="full")
    lag = int(np.argmax(c)) - (b.size - 1)  # mic index = voice index + lag
    return mic_t0 + lag * 4 / SR


def trace_replay(folder: str, make: Callable[[], BargeInDetector]) -> tuple[list[float], int, int, int]:
    """Replay a live session's detector inputs (``bench/voice.py --trace``) through ``make()``; prints and
    returns (detection delays s, false interruptions, barge-ins missed, answers).

    Each stretch of chunks fed while an answer played is an answer, split where the user finished an
    utterance (its answer replaces the one playing). An answer's first BargeIn is timed when a barge-in
    utterance began in it and the BargeIn came after that onset (less 100 ms) and within 1 s; before the
    onset, or in an answer nobody spoke over, it is a false interruption. Traced with ``--trace-listen``
    every answer played on, so any detector can be timed; otherwise the live detector stopped the answer
    and a slower one cannot be seen (counted missed)."""
    from pathlib import Path

    from models.bargein import read_trace

    (path,) = sorted(Path(folder).glob("bargein-*.pkl"))
    truth = np.load(Path(folder) / "truth.npz")
    records = read_trace(path)
    mic = [r for r in records if r[0] == "mic"]
    mic_t0 = float(mic[0][1])  # type: ignore[arg-type]
    offset = trace_offset(np.concatenate([r[2] for r in mic]), mic_t0, truth["voice"])  # type: ignore[misc]
    onsets, ends = truth["onset"] + offset, truth["end"] + offset
    barges = onsets[truth["barge_in"]]
    speech = list(zip(onsets, ends, strict=True))
    splits = sorted(ends + 0.2)
    det = make()
    delays: list[float] = []
    false = missed = answers = 0
    loud_echo = echo_only = 0  # 20 ms chunks while an answer played and the user was silent: of them, cleaned
    quiet = 10 ** (LEAK_DBFS / 10)  # output louder than LEAK_DBFS (echo the ASR may hear as words)
    start: float | None = None  # of the answer playing
    fired: float | None = None

    def close(end: float) -> None:
        nonlocal false, missed
        assert start is not None
        onset = next((o for o in barges if start - 0.2 <= o < end), None)
        if fired is None or (onset is not None and fired > onset + 1.0):
            missed += onset is not None
        elif onset is not None and fired >= onset - 0.1:
            delays.append(fired - onset)
        elif not any(a - 0.1 <= fired <= b for a, b in speech):  # else the user, just not on cue
            false += 1

    k = 0
    for r in records:
        if r[0] == "played":
            det.played(float(r[1]), r[2])  # type: ignore[arg-type]
            continue
        _, pts, samples, answering = r
        chunk = AudioChunk(float(pts), samples)  # type: ignore[arg-type]
        split = False
        while k < len(splits) and splits[k] <= chunk.pts:
            split, k = True, k + 1
        if start is not None and (not answering or split):
            close(chunk.pts)
            start = None
        playing = bool(answering) and not split  # a split chunk resets the detector for the next answer
        clean, hit = det.feed(chunk, playing)
        if answering and not any(a - 0.3 <= chunk.pts <= b + 0.3 for a, b in speech):
            echo_only += 1
            loud_echo += float(np.mean(clean.samples ** 2)) > quiet
        if playing and start is None:
            start, fired = chunk.pts, None
            answers += 1
        if hit is not None and fired is None:
            fired = chunk.pts + chunk.samples.size / SR
    d = np.array(delays or [np.nan]) * 1e3
    print(f"trace {path.name}: offset session - peer {offset:.3f} s; {answers} answers, {len(barges)} barge-ins said")
    print(f"detection delay (fired - true onset): n={len(delays)} p50 {np.nanpercentile(d, 50):.0f} ms  p90 "
          f"{np.nanpercentile(d, 90):.0f} ms  p99 {np.nanpercentile(d, 99):.0f} ms  max {np.nanmax(d):.0f} ms; "
          f"missed {missed}; false interruptions {false}; cleaned echo above {LEAK_DBFS:.0f} dBFS in "
          f"{loud_echo} of {echo_only} echo-only chunks")
    return delays, false, missed, answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=56, help="scenes of each kind (barge-in, echo-only, noise)")
    ap.add_argument("--seed", type=int, default=1000, help="room seed base (tuning used 0-9)")
    ap.add_argument("--tune", action="store_true", help="use the tuning set instead of the held-out one")
    ap.add_argument("--peer", action="store_true", help="the load-test peer's echo path instead of rooms")
    ap.add_argument("--no-echo", action="store_true", help="sessions where no echo comes back: what the user keeps")
    ap.add_argument("--coarse", action="store_true", help="the detector with the coarse delay (A/B; off by default)")
    ap.add_argument("--trace", default=None, help="replay a live session recorded by bench/voice.py --trace FOLDER")
    args = ap.parse_args()
    on = BargeInConfig(echo=EchoConfig(coarse_votes=3))
    make = partial(BargeInDetector, on) if args.coarse else BargeInDetector
    if args.trace:
        trace_replay(args.trace, make)
        return
    answers, users = (es.TUNE_ANSWERS, es.TUNE_USERS) if args.tune else (es.HELD_ANSWERS, es.HELD_USERS)
    if args.peer:
        peer_scenes(args, answers, users, make)
        return
    if args.no_echo:
        no_echo_scenes(args, answers, users, make)
        return
    delays, onset_err, erle, cpu_active, cpu_idle, cpu_aec = [], [], [], [], [], []
    false_echo = false_noise = early = missed = 0
    for k in range(args.n):
        rng = np.random.default_rng(args.seed + k)
        answer = answers[k % len(answers)]
        scene = es.make_scene(rng, answer, user=users[k % len(users)])
        _, onset, emitted, cpu = run_scene(scene, make())
        assert scene.onset is not None
        if emitted is None or emitted > scene.onset + 1.0:
            missed += 1
        elif onset is not None and onset < scene.onset - 0.1:
            early += 1
        else:
            delays.append(emitted - scene.onset)
            onset_err.append(onset - scene.onset)
        scene = es.make_scene(rng, answer)
        clean, onset, emitted, cpu = run_scene(scene, make())
        false_echo += emitted is not None
        erle.append(erle_db(scene, clean))
        first = int(scene.answer_pts * SR) // CHUNK
        last = int((scene.answer_pts + scene.played.size / SR) * SR) // CHUNK
        cpu_active += cpu[first:last]
        cpu_idle += cpu[:first]
        cpu_aec += canceller_cpu(scene)[first:last]
        kind = ("cough", "click", "door", "noise")[k % 4]
        scene = es.make_scene(rng, answer, noise=kind)
        _, onset, emitted, _ = run_scene(scene, make())
        false_noise += emitted is not None
    n = args.n
    d = np.array(delays) * 1e3
    print(f"set: {'tuning' if args.tune else 'held-out'}  scenes: {n} barge-in, {n} echo-only, {n} noise")
    print(f"detection delay (emit - true onset): p50 {np.percentile(d, 50):.0f} ms  p99 {np.percentile(d, 99):.0f} ms"
          f"  max {d.max():.0f} ms  (detected {len(d)}/{n}, missed {missed}, before the onset {early})")
    e = np.array(onset_err) * 1e3
    print(f"BargeIn.pts - true onset: p50 {np.percentile(e, 50):.0f} ms  p5 {np.percentile(e, 5):.0f} ms"
          f"  p95 {np.percentile(e, 95):.0f} ms")
    print(f"false interruptions: echo-only {false_echo}/{n} = {false_echo / n:.1%}  noise events {false_noise}/{n}"
          f" = {false_noise / n:.1%}  all {(false_echo + false_noise + early) / (3 * n):.1%} of answers")
    print(f"ERLE over echo-only answers: p50 {np.median(erle):.1f} dB  p10 {np.percentile(erle, 10):.1f} dB"
          f"  min {min(erle):.1f} dB")
    ca, ci, cc = np.array(cpu_active) * 1e3, np.array(cpu_idle) * 1e3, np.array(cpu_aec) * 1e3
    print(f"CPU per 20 ms chunk while answering: canceller alone mean {cc.mean():.3f} ms p99"
          f" {np.percentile(cc, 99):.3f} ms; canceller + VAD mean {ca.mean():.3f} ms"
          f" p99 {np.percentile(ca, 99):.3f} ms;"
          f" nothing played recently mean {ci.mean() * 1e3:.1f} us")


if __name__ == "__main__":
    main()
