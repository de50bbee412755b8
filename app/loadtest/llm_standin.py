"""A local OpenAI-compatible stand-in for a language model: a known first-token time, a steady stream.

``POST /v1/chat/completions`` with ``stream: true`` answers server-sent events: the first content
chunk ``ttft_s`` after the request arrived, then one word every ``1 / tokens_per_s`` s (a short
acknowledgement of the user's last message, at most ``max_tokens`` words), then ``[DONE]``.
Anything else is a 404/400 with a one-line JSON error. It exists so that turn latency and LST
TTFT can be measured with a responder whose own TTFT is known (``bench/turn_latency.py``,
``synchrony certify --responder openai``), on loopback, without a model.

    python -m app.loadtest.llm_standin --port 8001 --ttft-ms 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

MAX_BODY = 256 * 1024


@dataclass
class StandInLLM:
    """The server; ``start()`` binds 127.0.0.1 (port 0: any free one), ``base_url`` ends in /v1."""

    ttft_s: float = 0.1
    tokens_per_s: float = 50.0
    host: str = "127.0.0.1"
    port: int = 0
    requests: int = 0
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
                words = _reply(body)
            except (json.JSONDecodeError, ValueError, TypeError) as exc:
                return await _error(writer, 400, f"bad request: {exc}")
            self.requests += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Connection: close\r\n\r\n")
            await writer.drain()
            due = arrived + self.ttft_s
            for i, word in enumerate(words):
                await asyncio.sleep(max(due - asyncio.get_running_loop().time(), 0.0))
                chunk = {"object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": {"content": word if i == 0 else " " + word}}]}
                writer.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await writer.drain()
                due += 1.0 / self.tokens_per_s
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


def _reply(body: Any) -> list[str]:
    """A short answer that depends on the user's words (so responses differ per turn)."""
    messages = body["messages"]
    user = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
    limit = int(body.get("max_tokens", 32))
    words = ["Sure,", "I", "heard:"] + str(user).split()[:12] + ["Anything", "else?"]
    return words[: max(limit, 0)]


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
