"""Live latency over loopback: a fresh `synchrony serve` process (its web page included), aiortc
WHIP peers sending a generated clip.

Targets (from the issue), each printed with PASS/FAIL:
  * /readyz ready ≤ 15 s after the server process starts (every model loaded and run once);
  * camera frame pts → its ``au`` event on the DataChannel: p95 ≤ 100 ms;
  * AU events keep up with the camera: ≥ 15 per second;
  * word end (the spoken word's, from the clip's truth) → its final ``token`` event: p50 ≤ 400 ms
    and p95 ≤ 900 ms;
  * final word onsets (the token's ``start``, server session clock) vs the clip's exact word
    onsets: ≥ 85 % within ±40 ms and mean ≤ 30 ms (no lag correction: the session clock must
    itself be right);
  * the first session's word latency (p50) within 1.2× of later sessions' (median of their p50s):
    no cold first session.

Latency is wall time at arrival on the client minus the wall time the client sent that clip time
(the peer paces the clip in real time from one start instant; session time zero is the first
packet the server received, within a few ms of clip time zero on loopback).

Usage: .venv/bin/python bench/live.py [--sessions 2] [--port 0] [--voice festival:slt_hts]

``--voice`` picks the clip's speaker: an espeak-ng voice (default en-us) or ``festival:<voice>``
(slt_hts, kal_diphone, ked_diphone): voices the word aligner was not built from.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from alignment.text import dictionary_form  # noqa: E402
from app.loadtest import testmedia  # noqa: E402
from app.loadtest.metrics import clip_truth, match_tokens  # noqa: E402
from app.loadtest.peer import WhipPeer  # noqa: E402

READY_S = 15.0
AU_P95_MS = 100.0
AU_RATE = 15.0
WORD_P50_MS = 400.0
WORD_P95_MS = 900.0
ONSET_WITHIN_40 = 0.85
ONSET_MEAN_MS = 30.0
FIRST_VS_LATER = 1.2
CLIP_MARKER_END = 6.0  # the second sync marker: in the tail, after the last word


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _wait_ready(base: str, t_start: float, timeout: float = 120.0) -> tuple[float, dict]:
    async with httpx.AsyncClient(base_url=base, timeout=2.0) as client:
        while time.monotonic() - t_start < timeout:
            try:
                resp = await client.get("/readyz")
                if resp.status_code == 200:
                    return time.monotonic() - t_start, resp.json()
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError(f"server not ready after {timeout} s")


async def run_session(base: str, clip: testmedia.AVClip, settle_s: float = 4.0) -> dict:
    """One peer sends the clip once (then silence); returns its latency figures."""
    peer = WhipPeer(f"{base}/whip", clip)
    await peer.connect()
    await asyncio.sleep(clip.duration + settle_s)
    await peer.close()
    t0 = peer.t0_wall
    au_ms = []
    for e in peer.events:
        if e.type == "au":
            sent = peer.sent_video_wall(float(e.message["pts"]))
            if sent is not None:
                au_ms.append(1000 * (e.wall - sent))
    aus = [e for e in peer.events if e.type == "au"]
    au_rate = (len(aus) - 1) / (aus[-1].wall - aus[0].wall) if len(aus) > 2 else 0.0
    finals = {}
    for e in peer.events:  # first final event per (utterance, index)
        m = e.message
        if e.type == "token" and m["final"]:
            finals.setdefault((m["utterance"], m["index"]), (e.wall, m))
    # Against the spoken word's true end (as bench/asr_stream.py), not the token's own end: a token
    # whose end ran late (as Whisper's do) would look early.
    tokens = [(e.wall - t0, e.message) for e in peer.events if e.type == "token"]
    matched, _lag, _extra = match_tokens(clip_truth(clip), tokens, clip.duration + settle_s)
    word_ms = [1000 * w.final_latency_s for w in matched if w.final_latency_s is not None]
    heard = sorted(((m["text"], float(m["start"])) for _, m in finals.values()), key=lambda x: x[1])
    return {
        "onset_ms": onset_errors_ms(clip, heard).tolist(),
        "per_word": per_word_errors(clip, heard),
        "au_ms": au_ms, "au_rate": au_rate, "word_ms": word_ms,
        "words": " ".join(m["text"] for _, m in sorted(finals.values(), key=lambda x: x[1]["start"])),
        "frames_back": peer.frames_received,
        "sync": [e.message for e in peer.events if e.type == "sync"],
        "late": sum(m["late"] for _, m in finals.values()),
    }


def onset_errors_ms(clip: testmedia.AVClip, finals: list[tuple[str, float]]) -> np.ndarray:
    """Signed start errors (ms) of final words ``(text, start)``, in start order, matched by text to
    the clip's words (no clock-lag correction: the session clock must itself be right)."""
    return np.array([e for _, e in per_word_errors(clip, finals) if e is not None])


def per_word_errors(clip: testmedia.AVClip, finals: list[tuple[str, float]]) -> list[tuple[str, float | None]]:
    """Each spoken word with its signed onset error (ms), None where no final word matched it:
    which words miss, so two paths can be compared word by word on the same clip."""
    spoken = [dictionary_form(w.text) for w in clip.words]
    heard = [dictionary_form(t) for t, _ in finals]
    err: list[float | None] = [None] * len(spoken)
    for b in difflib.SequenceMatcher(a=spoken, b=heard, autojunk=False).get_matching_blocks():
        for i in range(b.size):
            err[b.a + i] = 1000 * (finals[b.b + i][1] - clip.words[b.a + i].start)
    return list(zip(spoken, err, strict=True))


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=3, help="sequential sessions (≥ 2 to compare)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--voice", default="en-us", help="espeak-ng voice, or festival:<voice>")
    parser.add_argument("--output-delay", type=float, default=None,
                        help="ServerConfig.output_delay_s (default: the server's)")
    args = parser.parse_args()
    port = args.port or _free_port()
    base = f"http://127.0.0.1:{port}"
    text = "please call me back when you have a moment and send the report to my office before noon"
    clip = testmedia.make_av_clip(markers=(0.25, CLIP_MARKER_END), tail_s=1.0,
                                  speech=testmedia.speak(text, args.voice, lead_in_s=0.6))
    delay = [] if args.output_delay is None else ["--output-delay", str(args.output_delay)]
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), *delay]  # what a user runs
    t_start = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ready_s, ready = await _wait_ready(base, t_start)
        results = [await run_session(base, clip) for _ in range(max(args.sessions, 2))]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()

    load = os.getloadavg()
    extra = "" if args.output_delay is None else f" --output-delay {args.output_delay}"
    extra += "" if args.voice == "en-us" else f" --voice {args.voice}"
    print(f"command: {sys.executable} bench/live.py --sessions {max(args.sessions, 2)}{extra}")
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"cold start: {json.dumps(ready['cold_start'])}; missing stages: {sorted(ready['missing'])}")
    for i, r in enumerate(results):
        o = np.abs(r["onset_ms"])
        print(f"session {i + 1}: onsets mean {o.mean() if o.size else float('nan'):.1f} ms, "
              f"{100 * np.mean(o <= 40) if o.size else 0:.0f} % within ±40 ms;")
        print(f"   AU p50 {_pct(r['au_ms'], 50):.0f} ms p95 {_pct(r['au_ms'], 95):.0f} ms "
              f"({len(r['au_ms'])} events, {r['au_rate']:.1f}/s); word end→final p50 {_pct(r['word_ms'], 50):.0f} "
              f"ms p95 {_pct(r['word_ms'], 95):.0f} ms ({len(r['word_ms'])} words); frames back "
              f"{r['frames_back']}; Level-3 ok {sum(s['ok'] for s in r['sync'])}/{len(r['sync'])}, "
              f"late captions {r['late']}/{len(r['word_ms'])}")
        print(f"  heard: {r['words']!r}")
        print("  onset errors (ms): " + " ".join(f"{w}:{'-' if e is None else f'{e:+.0f}'}"
                                                 for w, e in r["per_word"]))
        print("  word end → final (ms): " + " ".join(f"{x:.0f}" for x in r["word_ms"]))  # to pool runs
    all_au = [x for r in results for x in r["au_ms"]]
    all_words = [x for r in results for x in r["word_ms"]]
    onsets = np.abs([x for r in results for x in r["onset_ms"]])
    within = float(np.mean(onsets <= 40)) if onsets.size else 0.0
    mean_onset = float(onsets.mean()) if onsets.size else float("inf")
    first = _pct(results[0]["word_ms"], 50)
    later = float(np.median([_pct(r["word_ms"], 50) for r in results[1:]]))  # median of later sessions' p50
    ratio = first / later if later > 0 else float("inf")
    checks = [
        (f"/readyz ready after {ready_s:.2f} s (≤ {READY_S:.0f} s)", ready_s <= READY_S),
        (f"camera pts → au event p95 {_pct(all_au, 95):.0f} ms (≤ {AU_P95_MS:.0f} ms)",
         bool(all_au) and _pct(all_au, 95) <= AU_P95_MS),
        (f"AU events {min(r['au_rate'] for r in results):.1f}/s (≥ {AU_RATE:.0f}/s)",
         min(r["au_rate"] for r in results) >= AU_RATE),
        (f"word end → final token p50 {_pct(all_words, 50):.0f} ms (≤ {WORD_P50_MS:.0f} ms)",
         bool(all_words) and _pct(all_words, 50) <= WORD_P50_MS),
        (f"word end → final token p95 {_pct(all_words, 95):.0f} ms (≤ {WORD_P95_MS:.0f} ms)",
         bool(all_words) and _pct(all_words, 95) <= WORD_P95_MS),
        (f"final onsets within ±40 ms {100 * within:.0f} % of {onsets.size} (≥ {100 * ONSET_WITHIN_40:.0f} %), "
         f"mean {mean_onset:.1f} ms (≤ {ONSET_MEAN_MS:.0f} ms)",
         within >= ONSET_WITHIN_40 and mean_onset <= ONSET_MEAN_MS),
        (f"first session word p50 {first:.0f} ms vs later {later:.0f} ms: ×{ratio:.2f} (≤ {FIRST_VS_LATER})",
         ratio <= FIRST_VS_LATER),
    ]
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
