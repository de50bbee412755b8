"""A local OpenAI-compatible stand-in for a language model: a known first-token time, a steady stream.

``POST /v1/chat/completions`` with ``stream: true`` answers server-sent events shaped like
OpenAI's: the first content chunk ``ttft_s`` after the request arrived, then one piece every
``1 / tokens_per_s`` s, then a chunk with ``finish_reason`` and ``[DONE]``. The answer is a short
acknowledgement of the user's last message, streamed as a model does: sub-word pieces ("synchron",
"y"), at most ``max_tokens`` pieces (``finish_reason: length`` when that cuts it). A message that
mentions the weather also gets a ``get_weather`` tool call (OpenAI ``tool_calls`` deltas, argument
fragments, ``finish_reason: tool_calls``) after a few words; one that mentions an umbrella gets a
tool call only (an answer with no text); one that asks for "everything" a long answer. Every completion
is kept in ``log`` (``StandInAnswer``):
what it meant to send and what it did send, so SEQ-Integrity can be judged against it.
Anything else is a 404/400 with a one-line JSON error. It exists so that turn latency, LST TTFT
and SEQ-Integrity can be measured with a responder whose behaviour is known (``bench/turn_latency.py``,
``synchrony certify --responder openai``), on loopback, without a model.

    python -m app.loadtest.llm_standin --port 8001 --ttft-ms 100
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

MAX_BODY = 256 * 1024
#: Words of the long answer to a request for "everything" (more than the load policy's smallest max_tokens).
LONG_WORDS = 60
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


@dataclass
class StandInLLM:
    """The server; ``start()`` binds 127.0.0.1 (port 0: any free one), ``base_url`` ends in /v1."""

    ttft_s: float = 0.1
    tokens_per_s: float = 50.0
    host: str = "127.0.0.1"
    port: int = 0
    requests: int = 0
    log: list[StandInAnswer] = field(default_factory=list)
    _server: asyncio.Server | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://{self.host}:{self._server.sockets[0].getsockname()[1]}/v1"

    async def start(self) -> StandInLLM:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        arrived = asyncio.get_running_loop().time()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines = head.decode("latin-1").split("\r\n")
            method, path = (lines[0].split() + ["", ""])[:2]
            headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            length = int(headers.get("content-length", "0") or 0)
            if method != "POST" or not path.endswith("/chat/completions"):
                return await _error(writer, 404, f"no route {method} {path}")
            if not 0 <= length <= MAX_BODY:
                return await _error(writer, 400, "body too large")
            try:
                body = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
                plan, user = _plan(body)
            except (json.JSONDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
                return await _error(writer, 400, f"bad request: {exc}")
            self.requests += 1
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            await self._stream(writer, plan, user, arrived, usage, headers.get("traceparent"))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

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


def _reply(body: Any) -> list[str]:
    """A short answer that depends on the user's words (so responses differ per turn); a long one
    (``LONG_WORDS``) when the user asks for "everything", so a limit lowered mid-answer can cut it."""
    messages = body["messages"]
    user = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
    said = str(user).split()
    if "everything" in str(user).lower() and said:
        return ["Here", "is", "everything:"] + [said[i % len(said)] for i in range(LONG_WORDS)] + ["Anything", "else?"]
    return ["Sure,", "I", "heard:"] + said[:12] + ["Anything", "else?"]


def split_word(word: str) -> list[str]:
    """A word as a tokenizer might cut it: words of 7+ letters lose their last 1-3 letters to a second
    piece ("synchrony" → "synchron", "y"); shorter words stay whole."""
    if len(word) < 7:
        return [word]
    cut = len(word) - 1 - len(word) % 3
    return [word[:cut], word[cut:]]


def _plan(body: Any) -> tuple[_Plan, str]:
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


def _deltas(plan: _Plan) -> list[tuple[dict[str, Any], str]]:
    """(delta, the content it carries) in order: content pieces, the tool call's deltas where due."""
    out: list[tuple[dict[str, Any], str]] = [({"content": p}, p) for p in plan.pieces]
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


def _chunk(cid: str, delta: dict[str, Any] | None, finish: str | None = None,
           usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "model": "standin",
                            "choices": [] if delta is None else [{"index": 0, "delta": delta,
                                                                  "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n".encode()


async def _error(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    data = json.dumps({"error": {"message": message}}).encode()
    writer.write(f"HTTP/1.1 {status} Error\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                 f"Connection: close\r\n\r\n".encode() + data)
    await writer.drain()


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
