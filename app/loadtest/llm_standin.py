"""A local OpenAI-compatible stand-in for a language model: a known first-token time, a steady stream.

It exists so that turn latency, LST TTFT and SEQ-Integrity can be measured with a responder whose
behaviour is known (``bench/turn_latency.py``, ``synchrony certify --responder openai``), on loopback,
without a model. ``POST /v1/chat/completions`` with ``stream: true`` answers OpenAI-shaped server-sent
events: the first content chunk ``ttft_s`` after the request, then one sub-word piece every
``1 / tokens_per_s`` s (at most ``max_tokens``: ``finish_reason: length``), then ``[DONE]``. A message
naming the weather also gets a ``get_weather`` tool call after a few words; one naming an umbrella gets
a tool call only. Every completion is kept in ``log`` (``StandInAnswer``: what it meant to send and what
it sent), so SEQ-Integrity can be judged against it. Anything else is a 404/400 JSON error.

    python -m app.loadtest.llm_standin --port 8001 --ttft-ms 100
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import ClassVar

from alignment.json_types import JsonObject
from app.loadtest.loopback_http import LoopbackServer

MAX_BODY = 256 * 1024
_IDS = itertools.count(1)


@dataclass(frozen=True)
class StandInAnswer:
    """One completion as the stand-in logged it: ``text`` the content it meant to send (after its
    ``max_tokens``), ``sent_text`` the content it wrote before the end or the client going away,
    ``tool_text`` its tool calls' names and arguments, ``completed``: every chunk and ``[DONE]`` written."""

    id: str
    user: str
    text: str
    sent_text: str
    tool_text: tuple[str, ...]
    finish_reason: str
    completed: bool
    traceparent: str | None = None  # the request's W3C trace context, when it carried one


@dataclass(frozen=True)
class _Plan:
    pieces: tuple[str, ...]
    tool_after: int | None  # the tool call goes after this many pieces (None: no tool call)
    tool: tuple[str, str] = ("", "")  # (name, arguments)
    finish_reason: str = "stop"


@dataclass(frozen=True)
class _Request:
    plan: _Plan
    user: str
    usage: bool  # ``stream_options.include_usage``: a last chunk with the token counts


@dataclass
class StandInLLM(LoopbackServer[_Request]):
    """The server; ``start()`` binds 127.0.0.1 (port 0: any free one), ``base_url`` ends in /v1."""

    route: ClassVar[str] = "/chat/completions"
    max_body: ClassVar[int] = MAX_BODY
    ttft_s: float = 0.1
    tokens_per_s: float = 50.0
    log: list[StandInAnswer] = field(default_factory=list)

    def _parse(self, body: JsonObject) -> _Request:
        plan, user = _plan(body)
        return _Request(plan, user, bool((body.get("stream_options") or {}).get("include_usage")))

    async def _answer(self, writer: asyncio.StreamWriter, request: _Request, headers: dict[str, str],
                      arrived: float) -> None:
        await self._stream(writer, request.plan, request.user, arrived, request.usage, headers.get("traceparent"))

    async def _stream(self, writer: asyncio.StreamWriter, plan: _Plan, user: str, arrived: float,
                      usage: bool, traceparent: str | None = None) -> None:
        """Write the planned chunks on their schedule; log what was meant and what was written."""
        cid = f"chatcmpl-standin-{next(_IDS)}"
        sent: list[str] = []
        completed = False
        try:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Connection: close\r\n\r\n")
            await writer.drain()
            due = arrived + self.ttft_s
            for delta, piece in _deltas(plan):
                await asyncio.sleep(max(due - asyncio.get_running_loop().time(), 0.0))
                writer.write(_chunk(cid, delta))
                await writer.drain()
                sent.append(piece)
                due += 1.0 / self.tokens_per_s
            writer.write(_chunk(cid, {}, plan.finish_reason))
            if usage:
                writer.write(_chunk(cid, None, usage={"prompt_tokens": len(user.split()), "completion_tokens":
                                                      len(plan.pieces), "total_tokens": len(user.split())
                                                      + len(plan.pieces)}))
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
            completed = True
        finally:
            self.log.append(StandInAnswer(cid, user, "".join(plan.pieces), "".join(sent),
                                          tuple(x for x in plan.tool if x), plan.finish_reason, completed,
                                          traceparent))


def _reply(body: JsonObject) -> list[str]:
    """A short answer that depends on the user's words (so responses differ per turn)."""
    messages = body["messages"]
    user = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
    return ["Sure,", "I", "heard:"] + str(user).split()[:12] + ["Anything", "else?"]


def split_word(word: str) -> list[str]:
    """A word as a tokenizer might cut it: words of 7+ letters lose their last 1-3 letters to a second
    piece ("synchrony" → "synchron", "y"); shorter words stay whole."""
    if len(word) < 7:
        return [word]
    cut = len(word) - 1 - len(word) % 3
    return [word[:cut], word[cut:]]


def _plan(body: JsonObject) -> tuple[_Plan, str]:
    """The pieces to send (sub-word, at most ``max_tokens``), and the tool call the message asks for."""
    messages = body["messages"]
    user = str(next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), ""))
    limit = max(int(body.get("max_tokens", 32)), 0)
    lowered = user.lower()
    if "umbrella" in lowered:  # a tool-only answer: no text at all
        return _Plan((), 0, ("get_weather", json.dumps({"place": "here", "what": "rain"})), "tool_calls"), user
    pieces: list[str] = []
    for i, word in enumerate(_reply(body)):
        parts = split_word(word)
        pieces += [(" " if i else "") + parts[0], *parts[1:]]
    finish = "length" if len(pieces) > limit else "stop"
    pieces = pieces[:limit]
    if "weather" in lowered and finish == "stop":
        return _Plan(tuple(pieces[:3]), 3, ("get_weather", json.dumps({"place": "here"})), "tool_calls"), user
    return _Plan(tuple(pieces), None, finish_reason=finish), user


def _deltas(plan: _Plan) -> list[tuple[JsonObject, str]]:
    """(delta, the content it carries) in order: content pieces, the tool call's deltas where due."""
    out: list[tuple[JsonObject, str]] = [({"content": p}, p) for p in plan.pieces]
    if plan.tool_after is not None:
        name, args = plan.tool
        half = len(args) // 2
        calls = [({"tool_calls": [{"index": 0, "id": "call_standin", "type": "function",
                                   "function": {"name": name, "arguments": ""}}]}, ""),
                 ({"tool_calls": [{"index": 0, "function": {"arguments": args[:half]}}]}, ""),
                 ({"tool_calls": [{"index": 0, "function": {"arguments": args[half:]}}]}, "")]
        out[plan.tool_after:plan.tool_after] = calls
    if out:
        out[0][0].setdefault("role", "assistant")
    return out


def _chunk(cid: str, delta: JsonObject | None, finish: str | None = None,
           usage: dict[str, int] | None = None) -> bytes:
    body: JsonObject = {"id": cid, "object": "chat.completion.chunk", "model": "standin",
                            "choices": [] if delta is None else [{"index": 0, "delta": delta,
                                                                  "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n".encode()


async def _serve(port: int, ttft_ms: float, rate: float) -> None:
    llm = await StandInLLM(ttft_s=ttft_ms / 1000.0, tokens_per_s=rate, port=port).start()
    print(f"stand-in LLM at {llm.base_url} (TTFT {ttft_ms:g} ms, {rate:g} tokens/s)", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--ttft-ms", type=float, default=100.0)
    p.add_argument("--rate", type=float, default=50.0, help="tokens per second after the first")
    args = p.parse_args(argv)
    try:
        asyncio.run(_serve(args.port, args.ttft_ms, args.rate))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
