"""Word onsets through the browser page vs through an aiortc peer, for the same audio.

One server process; the same generated clip (a festival voice by default: not the engine the
aligner could have been built from) is sent twice:

* by ``app.loadtest.peer.WhipPeer`` (aiortc), once: final-word onsets vs the clip's exact word onsets;
* by headless Chromium playing the clip as its fake camera and microphone into the Gradio page
  (which asks for no noise suppression or gain control, and for echo cancellation exactly when the
  server speaks its answers: ``--echo-cancellation`` runs the server with ``tts="festival"``, so the
  page keeps the canceller on and plays the spoken answers while the words are timed): the fake devices
  start before the call and loop the clip, so the page's session clock is the clip's plus an
  unknown constant ``c``; ``c`` is estimated as the median (token start - true onset) over the
  first pass, and the spread around it is what the page adds.

Prints, per path, mean |error| and the share within ±40 ms (the browser's after removing ``c``),
how many final words share a start time with another, and PASS/FAIL: the browser path within
5 points (share) and 10 ms (mean) of the aiortc path, and no shared start times.

    .venv/bin/python bench/browser_timing.py [--voice festival:slt_hts] [--echo-cancellation]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.loadtest import testmedia  # noqa: E402
from app.loadtest.peer import WhipPeer  # noqa: E402
from bench.live import _wait_ready, onset_errors_ms  # noqa: E402
from tests.test_browser import write_y4m  # noqa: E402

TEXT = ("the farmer sold fresh eggs at the market on saturday",
        "it rained all night so the roads were still wet")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def make_clip(voice: str) -> testmedia.AVClip:
    """Two sentences with a pause between them, over the talking face."""
    a = testmedia.speak(TEXT[0], voice, lead_in_s=0.6)
    b = testmedia.speak(TEXT[1], voice, lead_in_s=0.8)
    shift = a.duration
    words = a.words + tuple(testmedia.TimedWord(w.text, w.start + shift) for w in b.words)
    speech = testmedia.Speech(np.concatenate([a.samples, b.samples]), words, " ".join(TEXT))
    return testmedia.make_av_clip(tail_s=1.2, speech=speech)


async def via_aiortc(base: str, clip: testmedia.AVClip) -> list[tuple[str, float]]:
    peer = WhipPeer(f"{base}/whip", clip)
    await peer.connect()
    await asyncio.sleep(clip.duration + 3.0)
    await peer.close()
    seen: dict[tuple[int, int], tuple[str, float]] = {}
    for e in peer.events:
        m = e.message
        if e.type == "token" and m["final"]:
            seen.setdefault((m["utterance"], m["index"]), (m["text"], float(m["start"])))
    return sorted(seen.values(), key=lambda x: x[1])


async def via_browser(base: str, clip: testmedia.AVClip, workdir: Path) -> list[tuple[str, float]]:
    from playwright.async_api import async_playwright

    y4m = write_y4m(workdir / "face.y4m", clip.frames, int(clip.fps))
    wav = workdir / "speech.wav"
    testmedia.write_wav(wav, testmedia.resample(clip.audio, 16_000, 48_000), rate=48_000)
    args = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-video-capture={y4m}", f"--use-file-for-fake-audio-capture={wav}",
            "--disable-features=WebRtcHideLocalIpsWithMdns", "--allow-loopback-in-peer-connection",
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--no-first-run", "--autoplay-policy=no-user-gesture-required"]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            page = await browser.new_page()
            await page.goto(f"{base}/", wait_until="domcontentloaded")
            await page.wait_for_function("window.synchrony !== undefined", timeout=60_000)
            await page.click("#sy-start")
            await asyncio.sleep(2 * clip.duration + 3.0)  # two passes of the looped clip
            finals = await page.eval_on_selector_all(
                "#sy-transcript .sy-final", "els => els.map(e => [e.dataset.text, parseFloat(e.dataset.start)])")
            await page.click("#sy-stop")
        finally:
            await browser.close()
    return sorted(((t, s) for t, s in finals), key=lambda x: x[1])


def first_pass(clip: testmedia.AVClip, finals: list[tuple[str, float]]) -> tuple[float, np.ndarray]:
    """The clock offset ``c`` of the looped clip and the first pass's errors around it (ms)."""
    coarse = onset_errors_ms(clip, finals)
    c = float(np.median(coarse)) if coarse.size else 0.0
    one = [(t, s) for t, s in finals if c / 1000 - 0.5 <= s < c / 1000 + clip.duration - 0.3]
    e = onset_errors_ms(clip, one)
    c = float(np.median(e)) if e.size else c
    return c, e - c


def shared_starts(finals: list[tuple[str, float]]) -> int:
    starts = [round(s, 3) for _, s in finals]
    return len(starts) - len(set(starts))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--voice", default="festival:slt_hts", help="espeak-ng voice, or festival:<voice>")
    ap.add_argument("--echo-cancellation", action="store_true", help="the server speaks its answers, so the "
                    "page opens the microphone with the browser's echo cancellation on")
    args = ap.parse_args()
    if not Path(CHROMIUM).exists():
        print("chromium is not installed (make system)")
        return 1
    clip = make_clip(args.voice)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    # The ASR lanes in processes, as `synchrony serve` runs them.
    tts = "festival" if args.echo_cancellation else "off"
    code = (f"from app.live.server import ServerConfig, listening_socket, serve; "
            f"serve(listening_socket('127.0.0.1', {port}), ServerConfig.in_process(asr_processes=True, tts={tts!r}))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        await _wait_ready(base, time.monotonic())
        peer = await via_aiortc(base, clip)
        with tempfile.TemporaryDirectory() as tmp:
            page = await via_browser(base, clip, Path(tmp))
    finally:
        proc.terminate()
        proc.wait(10)
    e_peer = onset_errors_ms(clip, peer)
    c, e_page = first_pass(clip, page)
    print(f"$ python bench/browser_timing.py --voice {args.voice}"
          + (" --echo-cancellation" if args.echo_cancellation else "")
          + f"  (page echo cancellation {'on, answers spoken' if args.echo_cancellation else 'off'})")
    print(f"load average {os.getloadavg()[0]:.1f}; clip {clip.duration:.1f} s, {len(clip.words)} words")
    rows = {"aiortc peer": (e_peer, shared_starts(peer)), "browser page": (e_page, shared_starts(page))}
    for name, (e, shared) in rows.items():
        a = np.abs(e)
        print(f"  {name:<13} matched {a.size:>2}  mean |error| {a.mean() if a.size else float('nan'):5.1f} ms  "
              f"within ±40 ms {100 * np.mean(a <= 40) if a.size else 0:5.1f} %  median signed "
              f"{np.median(e) if e.size else float('nan'):+6.1f} ms  shared start times {shared}")
    print(f"  browser clock offset c = {c:.0f} ms (fake devices start before the call)")
    print("  errors (ms): aiortc", np.round(e_peer).astype(int).tolist(),
          "browser", np.round(e_page).astype(int).tolist())
    ap_, ab = np.abs(e_peer), np.abs(e_page)
    ok = (ab.size >= 0.8 * ap_.size > 0 and np.mean(ab <= 40) >= np.mean(ap_ <= 40) - 0.05
          and ab.mean() <= ap_.mean() + 10 and rows["browser page"][1] == 0)
    print(f"browser within 5 points and 10 ms of aiortc, no shared start times: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
