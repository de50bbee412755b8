"""Responders: caption, and openai against a local server speaking the OpenAI streaming protocol."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest

from alignment.pacing import TokenPacer
from alignment.types import TokenRatePolicy
from models import http_client
from models.responders import (
    CaptionResponder,
    OpenAIResponder,
    ResponderError,
    make_responder,
)

POLICY = TokenRatePolicy(tokens_per_s=40.0, max_tokens=64, temperature=0.3)
REPLY = ["Sure", ",", " the", " report", " goes", " to", " your", " office", " before", " noon", "."]


@dataclass
class FakeOpenAI:
    """A tiny raw-asyncio HTTP/1.1 server streaming chat-completion chunks as server-sent events."""

    mode: str = "ok"  # ok | http500 | silent | garbage
    requests: list[dict] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def start(self) -> FakeOpenAI:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            self.paths.append(lines[0].split()[1])
            headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(json.loads(body))
            if self.mode == "silent":
                await asyncio.sleep(30)
                return
            if self.mode == "http500":
                msg = b'{"error": "model overloaded"}'
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(msg), msg))
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Connection: close\r\n\r\n")
            if self.mode == "garbage":
                writer.write(b"data: {not json\n\n")
            else:
                writer.write(b": keep-alive comment\n\n")
                first = {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}
                writer.write(f"data: {json.dumps(first)}\n\n".encode())
                for tok in REPLY:
                    chunk = {"id": "c1", "object": "chat.completion.chunk",
                             "choices": [{"index": 0, "delta": {"content": tok}, "finish_reason": None}]}
                    writer.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    await writer.drain()
                    await asyncio.sleep(0.001)
                writer.write(b"data: [DONE]\n\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def fake_openai():
    servers: list[FakeOpenAI] = []

    async def make(mode: str = "ok") -> FakeOpenAI:
        srv = await FakeOpenAI(mode=mode).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        await srv.stop()


async def test_openai_streams_tokens_and_passes_policy(fake_openai):
    srv = await fake_openai()
    responder = OpenAIResponder(base_url=srv.base_url, model="tiny")
    toks = [t async for t in responder.tokens("where does the report go?", POLICY)]
    assert toks == REPLY
    assert srv.paths == ["/v1/chat/completions"]
    req = srv.requests[0]
    assert req["stream"] is True and req["model"] == "tiny"
    assert req["max_tokens"] == POLICY.max_tokens and req["temperature"] == pytest.approx(POLICY.temperature)
    assert req["messages"][-1] == {"role": "user", "content": "where does the report go?"}


async def test_openai_requests_share_one_client_made_off_the_loop(fake_openai, monkeypatch):
    """Every session's requests on a loop use one pooled client, built in a worker thread: building one
    (an SSL context, 20–35 ms) on the loop stalled every other session's paced tokens."""
    made_on: list[int] = []

    class Recording(httpx.AsyncClient):
        def __init__(self, *args: object, **kwargs: object) -> None:
            made_on.append(threading.get_ident())
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(http_client.httpx, "AsyncClient", Recording)
    await http_client.close_shared_client()
    srv = await fake_openai()
    sessions = [OpenAIResponder(base_url=srv.base_url) for _ in range(2)]
    for responder in sessions * 2:
        assert [t async for t in responder.tokens("where does the report go?", POLICY)] == REPLY
    assert len(srv.requests) == 4
    assert len(made_on) == 1 and made_on[0] != threading.get_ident()
    await http_client.close_shared_client()


async def test_openai_tokens_are_paced_and_capped(fake_openai):
    srv = await fake_openai()
    responder = make_responder("openai", base_url=srv.base_url)
    policy = TokenRatePolicy(tokens_per_s=25.0, max_tokens=6, temperature=0.2)
    out = [t async for t in responder.respond("hi", policy, TokenPacer(policy))]
    assert [t.text for t in out] == REPLY[:6]
    assert srv.requests[0]["max_tokens"] == 6
    gaps = np.asarray([b.due - a.emitted for a, b in zip(out, out[1:], strict=False)])
    # Never faster than the pace: each due one interval after the last release, unless the source was late.
    assert (gaps >= 0.04 - 1e-9).all() and np.median(gaps) == pytest.approx(0.04, abs=1e-9)
    assert out[-1].emitted - out[0].emitted >= 5 * 0.04 - 0.002  # paced, not a burst


async def test_openai_connection_refused_is_a_clear_error(fake_openai):
    srv = await fake_openai()
    url = srv.base_url
    await srv.stop()
    responder = OpenAIResponder(base_url=url, connect_timeout_s=1.0)
    with pytest.raises(ResponderError, match="cannot connect"):
        [t async for t in responder.tokens("hello", POLICY)]


async def test_openai_silent_server_times_out(fake_openai):
    srv = await fake_openai("silent")
    responder = OpenAIResponder(base_url=srv.base_url, read_timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(ResponderError, match="timed out"):
        [t async for t in responder.tokens("hello", POLICY)]
    assert time.monotonic() - t0 < 5.0


async def test_openai_http_error_and_garbage_are_clear_errors(fake_openai):
    bad = await fake_openai("http500")
    with pytest.raises(ResponderError, match="HTTP 500.*overloaded"):
        [t async for t in OpenAIResponder(base_url=bad.base_url).tokens("hello", POLICY)]
    garbage = await fake_openai("garbage")
    with pytest.raises(ResponderError, match="malformed"):
        [t async for t in OpenAIResponder(base_url=garbage.base_url).tokens("hello", POLICY)]


async def test_caption_responder_streams_transcript_at_pace():
    policy = TokenRatePolicy(tokens_per_s=50.0, max_tokens=5, temperature=0.0)
    out = [t async for t in CaptionResponder().respond("please send the report to my office", policy)]
    assert [t.text for t in out] == ["please", "send", "the", "report", "to"]
    gaps = np.asarray([b.due - a.emitted for a, b in zip(out, out[1:], strict=False)])
    # each due 20 ms after the last release (never faster)
    assert (gaps >= 0.02 - 1e-9).all() and np.median(gaps) == pytest.approx(0.02, abs=1e-9)
    assert make_responder().name == "caption"


def test_unknown_responder_and_bad_url():
    with pytest.raises(ValueError, match="unknown responder"):
        make_responder("gpt-telepathy")
    with pytest.raises(ValueError, match="http"):
        OpenAIResponder(base_url="127.0.0.1:8000")


async def test_openai_sends_earlier_turns_with_only_what_was_spoken(fake_openai):
    from models.responders import Conversation

    srv = await fake_openai()
    history = (("what is the plan", "We meet at noon and"), ("sorry, go on", ""))
    responder = OpenAIResponder(base_url=srv.base_url, model="tiny")
    [t async for t in responder.tokens("and after that?", POLICY, context=Conversation(history))]
    messages = srv.requests[-1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "user"]
    assert messages[2]["content"] == "We meet at noon and" and messages[-1]["content"] == "and after that?"


async def test_assistant_answers_simple_intents_and_never_just_echoes():
    import datetime

    from alignment.types import LoadEstimate
    from models.responders import AssistantResponder, Conversation

    class Noon(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 1, 2, 12, 5, tzinfo=tz)

    r = AssistantResponder(now=Noon)
    busy = Conversation((("hello", "Hello! I can hear and see you."),),
                        LoadEstimate(1.0, 2, (0.0, 0.1, 0.8, 0.1), TokenRatePolicy(4.0, 24, 0.3)))
    assert r.answer("hi there").startswith("Hello")
    assert "face" in r.answer("what can you do")
    assert r.answer("what time is it") == "It is 12:05 UTC."
    assert r.answer("thanks a lot") == "You are welcome."
    assert r.answer("can you repeat that", busy) == "I said: Hello! I can hear and see you."
    heard = r.answer("the report is due before noon", busy)
    assert "the report is due before noon" in heard and "busy" in heard and heard != "the report is due before noon"
    toks = [t async for t in r.tokens("the report is due before noon", TokenRatePolicy(8.0, 5, 0.5), context=busy)]
    assert len(toks) == 5 and r.word_tokens
def test_warm_up_runs_the_answer_path_against_a_local_dummy():
    """Warm-up's answer (app/live/warm_answer.py): both responder kinds, whole words, no operator LLM."""
    from app.live.warm_answer import warm_answer

    assert warm_answer("openai") == 5  # "Warm" + "ing" assembled: "Warming up the answer path."
    assert warm_answer("caption") == 5
