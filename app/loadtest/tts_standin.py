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
import json
import os
import wave
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alignment.espeak import TimedWord, resample, synthesize_speech
from alignment.types import SAMPLE_RATE

MAX_BODY = 64 * 1024
OUT_RATE = 24_000
MODES = ("ok", "slow", "garbage", "error")
ENGINES = ("espeak", "kal_diphone")


@dataclass
class StandInTTS:
    """The server; ``start()`` binds 127.0.0.1 (port 0: any free one), ``base_url`` ends in /v1."""

    mode: str = "ok"
    engine: str = "espeak"
    delay_s: float = 30.0  # "slow": how long before the answer
    host: str = "127.0.0.1"
    port: int = 0
    requests: int = 0
    #: The last phrase's words and their exact onsets (s from the returned audio's first sample).
    last_truth: tuple[TimedWord, ...] = ()
    _server: asyncio.Server | None = field(default=None, repr=False)
    _handlers: set[asyncio.Task[None]] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES or self.engine not in ENGINES:
            raise ValueError(f"mode must be one of {MODES}, engine one of {ENGINES}")

    @property
    def base_url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://{self.host}:{self._server.sockets[0].getsockname()[1]}/v1"

    async def start(self) -> StandInTTS:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        return self

    async def stop(self) -> None:
        """Stop listening and end the requests still in progress (a "slow" one waits otherwise)."""
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines = head.decode("latin-1").split("\r\n")
            method, path = (lines[0].split() + ["", ""])[:2]
            headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            length = int(headers.get("content-length", "0") or 0)
            if method != "POST" or not path.endswith("/audio/speech"):
                return await _reply(writer, 404, _error(f"no route {method} {path}"))
            if not 0 <= length <= MAX_BODY:
                return await _reply(writer, 400, _error("body too large"))
            try:
                body = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
                text, speed = _request(body)
            except (json.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
                return await _reply(writer, 400, _error(f"bad request: {exc}"))
            self.requests += 1
            if self.mode == "slow":
                await asyncio.sleep(self.delay_s)
            if self.mode == "error":
                return await _reply(writer, 500, _error("the stand-in was told to fail"))
            if self.mode == "garbage":
                junk = np.random.default_rng(self.requests).bytes(4096)
                return await _reply(writer, 200, junk, "audio/wav")
            audio, truth = await asyncio.to_thread(_speak, self.engine, text, speed)
            self.last_truth = truth
            await _reply(writer, 200, _wav(audio), "audio/wav")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError,
                asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()


def _request(body: Any) -> tuple[str, float]:
    text = body["input"]
    if not isinstance(text, str) or not text.strip():
        raise ValueError("input must be a non-empty string")
    if body.get("response_format", "wav") != "wav":
        raise ValueError("only response_format 'wav' is served")
    speed = float(body.get("speed", 1.0))
    if not 0.25 <= speed <= 4.0:
        raise ValueError("speed must be within 0.25..4")
    return text, speed


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


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message}}).encode()


async def _reply(writer: asyncio.StreamWriter, status: int, data: bytes, ctype: str = "application/json") -> None:
    writer.write(f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\nContent-Type: {ctype}\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    await writer.drain()


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
