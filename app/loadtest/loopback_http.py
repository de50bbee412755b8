"""The scaffolding the loopback stand-ins share: bind, ``base_url``, stop, and one JSON POST route.

``StandInLLM`` and ``StandInTTS`` differ only in the request they accept and the answer they write; the
HTTP/1.1 head parsing, the body limit, the one-line JSON errors and the tracked handlers (so ``stop`` ends a
request still in progress) live here once.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Self, TypeVar

from alignment.json_types import JsonObject

R = TypeVar("R")


def error_body(message: str) -> bytes:
    """A one-line JSON error, as OpenAI's endpoints write them."""
    return json.dumps({"error": {"message": message}}).encode()


async def reply(writer: asyncio.StreamWriter, status: int, data: bytes, ctype: str = "application/json") -> None:
    """A whole response with its length, then the connection closes."""
    writer.write(f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\nContent-Type: {ctype}\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    await writer.drain()


@dataclass(kw_only=True)
class LoopbackServer(Generic[R]):
    """Serves ``POST …<route>`` with a JSON body on 127.0.0.1 (port 0: any free one); ``base_url`` ends in /v1.

    A subclass names ``route`` and ``max_body``, turns the body into its request (``_parse``: raise
    ValueError, TypeError, KeyError or AttributeError for a 400) and writes the answer (``_answer``)."""

    route: ClassVar[str]
    max_body: ClassVar[int]
    host: str = "127.0.0.1"
    port: int = 0
    requests: int = 0
    _server: asyncio.Server | None = field(default=None, repr=False)
    _handlers: set[asyncio.Task[None]] = field(default_factory=set, repr=False)

    @property
    def base_url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://{self.host}:{self._server.sockets[0].getsockname()[1]}/v1"

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        return self

    async def stop(self) -> None:
        """Stop listening and end the requests still in progress (a slow one would wait otherwise)."""
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    def _parse(self, body: JsonObject) -> R:
        raise NotImplementedError

    async def _answer(self, writer: asyncio.StreamWriter, request: R, headers: dict[str, str],
                      arrived: float) -> None:
        raise NotImplementedError

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        arrived = asyncio.get_running_loop().time()
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines = head.decode("latin-1").split("\r\n")
            method, path = (lines[0].split() + ["", ""])[:2]
            headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            length = int(headers.get("content-length", "0") or 0)
            if method != "POST" or not path.endswith(self.route):
                return await reply(writer, 404, error_body(f"no route {method} {path}"))
            if not 0 <= length <= self.max_body:
                return await reply(writer, 400, error_body("body too large"))
            try:
                body = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                request = self._parse(body)
            except (json.JSONDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
                return await reply(writer, 400, error_body(f"bad request: {exc}"))
            self.requests += 1
            await self._answer(writer, request, headers, arrived)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError,
                asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
