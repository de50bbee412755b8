"""What a sender's resolution and frame rate cost the server: a 4K 60 fps camera vs a 720p 30 fps one.

A server child process (faces, controller, renderer and the Level-3 stage warmed; no ASR, so the
video path is what is measured) takes one aiortc peer at a time. Each peer sends the talking-face
clip, pre-encoded as VP8 (so the peer's own encoding costs nothing during the run), scaled to its
size: 1280x720 at 30 fps, 1920x1080 at 60 fps and 3840x2160 at 60 fps (under the bitrate bound).
The server's CPU (its process, all threads) over ``--seconds`` after a warm-up is printed per sender,
with the ratios to 720p30; the limits of ``app.live.limits`` are what bound the others' cost (4K key
frames are too large to decode; frames above 30 fps are dropped and larger than 720p scaled down
before the face stage).

Usage: .venv/bin/python bench/sender_cost.py [--seconds 20] [--warm 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: name, size, fps, bitrate: the 4K and 1080p senders stay under the server's 4 Mbit/s bound (a sender over it
#: is cut off after 5 s, which would make it cheap for another reason)
SENDERS = (("720p30", (1280, 720), 30, 1_500_000), ("1080p60", (1920, 1080), 60, 3_000_000),
           ("4K60", (3840, 2160), 60, 3_000_000))


def _serve(url_file: str) -> None:
    """Child process: the server with the video stages warmed; its URL → url_file."""
    from app.live.server import ServerConfig, create_app, running_server
    from app.live.stages import Stage

    async def main() -> None:
        config = ServerConfig.in_process(ui=False,
                                         stages=(Stage.FACES, Stage.CONTROLLER, Stage.RENDER, Stage.SYNC))
        async with running_server(create_app(config)) as base:
            Path(url_file).write_text(base)
            while True:
                await asyncio.sleep(3600)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


def encode(frames: list[np.ndarray], size: tuple[int, int], fps: int, bitrate: int) -> list[bytes]:
    """``frames`` scaled to ``size`` and encoded as one VP8 loop (a key frame first), one at a time."""
    import av

    ctx = av.CodecContext.create("libvpx", "w")
    ctx.width, ctx.height, ctx.pix_fmt = size[0], size[1], "yuv420p"
    ctx.time_base, ctx.framerate = Fraction(1, fps), Fraction(fps, 1)
    ctx.bit_rate, ctx.gop_size, ctx.thread_count = bitrate, len(frames), 2
    ctx.options = {"deadline": "realtime", "cpu-used": "16", "lag-in-frames": "0", "auto-alt-ref": "0"}
    packets: list[Any] = []
    for i, img in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(width=size[0], height=size[1],
                                                                          format="yuv420p")
        frame.pts = i
        packets += ctx.encode(frame)
    packets += ctx.encode(None)
    return [bytes(p) for p in packets]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(base: str, pid: int, name: str, packets: list[bytes], fps: int, audio: list[bytes],
                  seconds: float, warm: float) -> dict[str, float]:
    from app.loadtest.drive import _make_peer_class

    peer = _make_peer_class()(f"{base}/whip", frames=[np.zeros((8, 8, 3), np.uint8)], fps=fps,
                              audio=np.zeros(16000, np.float32), loop=True, vp8_packets=packets, opus_packets=audio)
    await peer.connect(timeout=20)
    await asyncio.sleep(warm)
    c0, t0, f0 = cpu_seconds(pid), time.monotonic(), peer.frames_received
    await asyncio.sleep(seconds)
    c1, t1, f1 = cpu_seconds(pid), time.monotonic(), peer.frames_received
    errors = [m["message"] for m in peer.of_type("error")]
    await peer.close()
    kbps = sum(len(p) for p in packets) * 8 / 1000 / (len(packets) / fps)
    result = {"cores": (c1 - c0) / (t1 - t0), "returned_fps": (f1 - f0) / (t1 - t0), "sent_kbps": kbps}
    print(f"{name:8s} sender ({kbps:.0f} kbit/s sent): server {result['cores']:.3f} cores, returned video "
          f"{result['returned_fps']:.1f} fps; errors: {errors or 'none'}", flush=True)
    return result


async def run(seconds: float, warm: float) -> None:
    from app.loadtest import testmedia
    from app.loadtest.loopclip import encode_opus_loop

    clip = testmedia.make_av_clip(text="please call me back when you have a moment", fps=30.0)
    frames = clip.frames[:30]
    audio = encode_opus_loop(clip.audio[: len(clip.audio) // 320 * 320])  # whole 20 ms frames
    encoded = {}
    for name, size, fps, bitrate in SENDERS:
        t = time.monotonic()
        encoded[name] = encode(frames, size, fps, bitrate)
        print(f"encoded {name}: {len(encoded[name])} frames in {time.monotonic() - t:.1f} s", flush=True)
    url_file = tempfile.NamedTemporaryFile(prefix="sender-cost-", suffix=".url", delete=False).name
    Path(url_file).write_text("")
    proc = subprocess.Popen([sys.executable, __file__, "--serve", url_file], cwd=ROOT)
    try:
        t0 = time.monotonic()
        while not (base := Path(url_file).read_text().strip()):
            if proc.poll() is not None or time.monotonic() - t0 > 300:
                raise RuntimeError("the server did not start")
            await asyncio.sleep(0.1)
        async with httpx.AsyncClient(base_url=base) as c:
            while (await c.get("/readyz")).status_code != 200:
                await asyncio.sleep(0.2)
        idle0, t = cpu_seconds(proc.pid), time.monotonic()
        await asyncio.sleep(3)
        print(f"idle server: {(cpu_seconds(proc.pid) - idle0) / (time.monotonic() - t):.3f} cores")
        results = {}
        for name, _size, fps, _bitrate in SENDERS:
            results[name] = await measure(base, proc.pid, name, encoded[name], fps, audio, seconds, warm)
            await asyncio.sleep(2)
        for name in ("1080p60", "4K60"):
            ratio = results[name]["cores"] / results["720p30"]["cores"]
            verdict = f"  ({'PASS' if ratio <= 1.0 else 'FAIL'}: <= 1.0)" if name == "4K60" else ""
            print(f"{name} / 720p30 server CPU: {ratio:.2f}{verdict}")
    finally:
        proc.terminate()
        proc.wait(15)
        os.unlink(url_file)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warm", type=float, default=5.0)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve)
        return
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    asyncio.run(run(args.seconds, args.warm))


if __name__ == "__main__":
    main()
