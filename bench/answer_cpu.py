"""CPU of one session's spoken answer on the server, answers playing about half the time.

Drives the real answer path in real time without a network: an ``AnswerPlayer`` with the warmed
festival voice and avatar, its audio and avatar tracks pulled at their own pace (as aiortc's senders
pull them) and each frame encoded with the encoders the server uses (aiortc's Opus, the lean VP8).
An answer of the built-in assistant is started every ``--period`` seconds; it plays for about half of
it. CPU = this process's CPU time (tracks, resampling, drawing, encoding, the answer's Level-3) plus
the festival pool's processes, over the wall time. The same run with no answer started gives the idle
cost (silence frames, the cached idle face).

    python bench/answer_cpu.py [--seconds 30] [--period 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


async def run(voice: object, seconds: float, period: float | None) -> tuple[float, float, float]:
    from aiortc.codecs.opus import OpusEncoder

    from alignment.clock import SessionClock
    from alignment.types import TokenRatePolicy
    from app.live.answer import AnswerPlayer
    from app.live.stages import AnswerConfig
    from app.live.video_encoder import LeanVp8Encoder
    from app.live.warm_answer import _LocalHost, _Quiet
    from models.responders import AssistantResponder

    host, clock = _LocalHost(), SessionClock()
    clock.zero_wall = time.monotonic()
    player = AnswerPlayer(host, clock, voice, AnswerConfig(), _Quiet())  # type: ignore[arg-type]
    audio, avatar = player.audio_track, player.enable_avatar()
    assert avatar is not None
    opus, vp8 = OpusEncoder(), LeanVp8Encoder()
    loop = asyncio.get_running_loop()
    stop = time.monotonic() + seconds
    playing = 0.0

    async def pull(track: object, encoder: object) -> None:
        while time.monotonic() < stop:
            frame = await track.recv()  # type: ignore[attr-defined]
            await loop.run_in_executor(None, encoder.encode, frame)  # type: ignore[attr-defined]

    async def answers() -> None:
        nonlocal playing
        n = 0
        text = AssistantResponder().answer("hello there")  # ~4 s of speech
        while period is not None and time.monotonic() < stop:
            a = player.begin(n, None, lambda: TokenRatePolicy(8.0, 64, 0.5))
            for i, w in enumerate(text.split()):
                a.feed(w if i == 0 else " " + w)
            a.close_input()
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(a.finished.wait(), max(0.1, stop - t0))
            except TimeoutError:  # the run ended while it played
                pass
            playing += time.monotonic() - t0 - (0.0 if a.started_wall is None else a.started_wall - t0)
            n += 1
            await asyncio.sleep(max(0.0, period - (time.monotonic() - t0)))

    synth = voice.synthesizer  # type: ignore[attr-defined]
    fest0 = synth.cpu_seconds() if hasattr(synth, "cpu_seconds") else 0.0
    c0, w0 = time.process_time(), time.monotonic()
    await asyncio.gather(pull(audio, opus), pull(avatar, vp8), answers())
    wall = time.monotonic() - w0
    cpu = time.process_time() - c0
    fest = (synth.cpu_seconds() if hasattr(synth, "cpu_seconds") else 0.0) - fest0
    player.close()
    return cpu / wall, fest / wall, playing / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--period", type=float, default=8.0, help="an answer starts every PERIOD s")
    args = parser.parse_args()
    from alignment.blas import single_threaded_blas
    from app.live.config import ServerConfig
    from app.live.warmup import WarmState, _warm_voice

    single_threaded_blas()
    state = WarmState()
    _warm_voice(ServerConfig.in_process(ui=False, tts="festival"), state)
    voice = state.stages.voice
    idle, _, _ = asyncio.run(run(voice, min(args.seconds, 15.0), None))
    cpu, fest, share = asyncio.run(run(voice, args.seconds, args.period))
    print(f"command: python bench/answer_cpu.py --seconds {args.seconds:g} --period {args.period:g}")
    print(f"idle (silence + idle face, encoded): {idle:.3f} cores")
    print(f"answering {share:.0%} of the time: server process {cpu:.3f} cores + festival {fest:.3f} cores "
          f"= {cpu + fest:.3f} cores per session")


if __name__ == "__main__":
    main()
