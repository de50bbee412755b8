"""Warm the answer path before the server says ready, against a local dummy, never the operator's LLM; and
one spoken answer without a peer (``speak_once``: synthesis, playback bookkeeping, one avatar frame).

The first session on a fresh server used to pay first-use costs inside its first answer (imports,
the HTTP client's set-up, the SSE parser, the word assembler, the pacer, the wire encoding), which
showed as a stall in its σ8. ``warm_answer`` runs one whole answer through the same code on a
private event loop: the configured responder kind (``openai`` pointed at a loopback dummy that
speaks the streaming protocol; ``caption`` as is) → ``MeteredAnswer`` → ``TokenPacer`` →
``ResponseEvent`` → JSON, with a scratch LST meter (the server's figures stay untouched).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from alignment.clock import SessionClock
from alignment.lst import LSTMeter
from alignment.pacing import TokenPacer
from alignment.types import TokenRatePolicy
from app.live.answer import FRAME_S, AnswerPlayer, draw_avatar
from app.live.answer_lst import MeteredAnswer
from app.live.events import LSTEvent, ResponseEvent, WarningEvent
from app.live.stages import AnswerConfig, Stage, Voice
from models.http_client import close_shared_client

_PIECES = ("Warm", "ing", " up", " the", " answer", " path.")


async def _dummy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A minimal OpenAI-compatible streaming reply (the request is read and ignored)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(
            b"content-length:")), 0)
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for piece in _PIECES:
            chunk = {"id": "warm-up", "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            writer.write(f"data: {json.dumps(chunk)}\n\n".encode())
        writer.write(b'data: {"id": "warm-up", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
                     b"data: [DONE]\n\n")
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def _answer(responder_name: str) -> int:
    from models.responders import make_responder

    server = await asyncio.start_server(_dummy, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        options = {"base_url": f"http://127.0.0.1:{port}/v1"} if responder_name == "openai" else {}
        responder = make_responder(responder_name, **options)
        policy = TokenRatePolicy(tokens_per_s=200.0, max_tokens=64, temperature=0.5)
        meter = LSTMeter()
        metered = MeteredAnswer(responder, policy, meter, None, 0, time.monotonic())
        pacer = TokenPacer(policy)
        sent = 0
        async for tok in pacer.pace(metered.words("warming up the answer path")):
            timing = metered.shown(tok)
            json.dumps(ResponseEvent(0, tok.index, tok.text, 0.0, timing, completion="warm-up").to_wire())
            sent += 1
        metered.end(metered.reason(policy.max_tokens))
        json.dumps(LSTEvent(meter.snapshot()).to_wire())
        return sent
    finally:
        await close_shared_client()  # this private loop's (the server's loop makes its own, off the loop)
        server.close()
        await server.wait_closed()


def warm_answer(responder_name: str) -> int:
    """Run one answer end to end on a private loop (call from a thread); returns the words sent."""
    return asyncio.run(_answer(responder_name))


class _LocalHost:
    """A stand-in session: collects the events, runs the tasks."""

    id = "warm-up"

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.events: list[object] = []
        self.failures: list[BaseException] = []
        self.degraded: dict[str, str] = {}

    def emit(self, event: object) -> bool:
        self.events.append(event)
        return True

    def fail_stage(self, stage: Stage, exc: BaseException) -> None:
        self.failures.append(exc)

    def spawn(self, coro: object, name: Stage) -> asyncio.Task[None]:
        return asyncio.ensure_future(coro)  # type: ignore[arg-type]


class _Quiet:
    """An observer that records nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


async def speak_once(voice: Voice, text: str, timeout_s: float = 20.0) -> list[object]:
    """Run one answer through a player (synthesis, resampling, playback bookkeeping, the mouth, one
    avatar frame) as fast as it goes, without tracks; returns the events it emitted. Raises when
    the synthesizer failed."""
    from alignment.types import TokenRatePolicy

    host, clock = _LocalHost(), SessionClock()
    clock.zero_wall = time.monotonic()
    player = AnswerPlayer(host, clock, voice, AnswerConfig(), _Quiet())  # type: ignore[arg-type]
    policy = TokenRatePolicy(8.0, 64, 0.5)
    answer = player.begin(0, None, lambda: policy)
    for i, word in enumerate(text.split()):
        answer.feed(word if i == 0 else " " + word)
    answer.close_input()
    t, deadline, drew = 0.0, time.monotonic() + timeout_s, False
    while not answer.finished.is_set() and time.monotonic() < deadline:
        if player.audio_at(t) is None:
            await asyncio.sleep(0.01)
        elif voice.avatar is not None and not drew:
            mouth = player.mouth_at(t)
            if mouth is not None:
                await asyncio.get_running_loop().run_in_executor(None, draw_avatar, voice.avatar, mouth)
                drew = True
        t += FRAME_S
    player.close()
    warnings = [e for e in host.events if isinstance(e, WarningEvent)]
    if warnings or answer.failed:
        raise RuntimeError(warnings[0].message if warnings else "speech synthesis failed")
    if not answer.finished.is_set():
        raise TimeoutError(f"the answer was not spoken within {timeout_s:g} s")
    return host.events
