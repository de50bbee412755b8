"""A local OpenAI-compatible stand-in for a speech synthesizer, speaking with another engine.

``POST /v1/audio/speech`` (JSON ``{model, input, voice, response_format: "wav", speed}``) answers a
16-bit mono WAV at 24 kHz (the rate OpenAI's endpoint returns). It speaks with espeak-ng (or
festival's ``kal_diphone``), never with the answer's own voice, so a test of
``models.tts.OpenAITTS`` checks the forced aligner's word times on audio the aligner's side did not
make, against the engine's exact word onsets (``last_truth``). Modes, for tests and benches:
``ok``; ``slow`` (answers after ``delay_s``, to exercise a client's timeout); ``garbage`` (200 with
bytes that are no audio); ``error`` (HTTP 500). Anything else is a 404/400 with a JSON error.

    python -m app.loadtest.tts_standin --port 8002 --engine espeak
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import wave
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from alignment.espeak import TimedWord, resample, synthesize_speech
from alignment.json_types import JsonObject
from alignment.types import SAMPLE_RATE
from app.loadtest.loopback_http import LoopbackServer, error_body, reply

MAX_BODY = 64 * 1024
OUT_RATE = 24_000
MODES = ("ok", "slow", "garbage", "error")
ENGINES = ("espeak", "kal_diphone")


@dataclass(frozen=True)
class _Request:
    text: str
    speed: float


@dataclass
class StandInTTS(LoopbackServer[_Request]):
    """The server; ``start()`` binds 127.0.0.1 (port 0: any free one), ``base_url`` ends in /v1."""

    route: ClassVar[str] = "/audio/speech"
    max_body: ClassVar[int] = MAX_BODY
    mode: str = "ok"
    engine: str = "espeak"
    delay_s: float = 30.0  # "slow": how long before the answer
    #: The last phrase's words and their exact onsets (s from the returned audio's first sample).
    last_truth: tuple[TimedWord, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES or self.engine not in ENGINES:
            raise ValueError(f"mode must be one of {MODES}, engine one of {ENGINES}")

    def _parse(self, body: JsonObject) -> _Request:
        text = body["input"]
        if not isinstance(text, str) or not text.strip():
            raise ValueError("input must be a non-empty string")
        if body.get("response_format", "wav") != "wav":
            raise ValueError("only response_format 'wav' is served")
        speed = float(body.get("speed", 1.0))
        if not 0.25 <= speed <= 4.0:
            raise ValueError("speed must be within 0.25..4")
        return _Request(text, speed)

    async def _answer(self, writer: asyncio.StreamWriter, request: _Request, headers: dict[str, str],
                      arrived: float) -> None:
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        if self.mode == "error":
            return await reply(writer, 500, error_body("the stand-in was told to fail"))
        if self.mode == "garbage":
            junk = np.random.default_rng(self.requests).bytes(4096)
            return await reply(writer, 200, junk, "audio/wav")
        audio, truth = await asyncio.to_thread(_speak, self.engine, request.text, request.speed)
        self.last_truth = truth
        await reply(writer, 200, _wav(audio), "audio/wav")


def _speak(engine: str, text: str, speed: float) -> tuple[np.ndarray, tuple[TimedWord, ...]]:
    """16 kHz speech and its words' exact onsets, resampled to OUT_RATE."""
    if engine == "espeak":
        sp = synthesize_speech(text, wpm=int(round(175 * speed)))
    else:
        from app.loadtest.festival import synthesize_festival

        sp = synthesize_festival(text, voice="kal_diphone")
    return resample(sp.samples, SAMPLE_RATE, OUT_RATE), sp.words


def _wav(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as fh:
        fh.setnchannels(1)
        fh.setsampwidth(2)
        fh.setframerate(OUT_RATE)
        fh.writeframes((np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes())
    return buf.getvalue()


async def _serve(port: int, mode: str, engine: str, delay_s: float) -> None:
    tts = await StandInTTS(mode=mode, engine=engine, delay_s=delay_s, port=port).start()
    print(f"stand-in TTS at {tts.base_url} ({engine}, mode {mode}, pid {os.getpid()})", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--mode", choices=MODES, default="ok")
    p.add_argument("--engine", choices=ENGINES, default="espeak")
    p.add_argument("--delay-s", type=float, default=30.0, help="how long a 'slow' answer takes")
    args = p.parse_args(argv)
    try:
        asyncio.run(_serve(args.port, args.mode, args.engine, args.delay_s))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
