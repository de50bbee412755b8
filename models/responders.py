"""Responders: what the session says back, as text tokens, behind one interface.

``Responder.tokens(utterance, policy)`` yields raw tokens (at most ``policy.max_tokens``) as fast as
they come; ``Responder.respond(utterance, policy, pacer)`` yields them paced (``PacedToken``) at the
policy's rate. Two are built in:

* ``caption`` (default): the recognised transcript streamed back word by word as live captions;
* ``openai``: any OpenAI-compatible streaming chat endpoint (``POST {base_url}/chat/completions``
  with ``stream: true``, server-sent events), passing ``max_tokens`` and ``temperature``. Every
  network step has a timeout and the whole response a deadline, so a dead server never hangs a
  session; failures raise ``ResponderError`` with a message fit for the user.
"""

from __future__ import annotations

import asyncio
import json
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

import httpx

from alignment.pacing import PacedToken, TokenPacer
from alignment.types import TokenRatePolicy


class ResponderError(RuntimeError):
    """A responder could not produce a response (unreachable server, bad reply, timeout)."""


class Responder(ABC):
    """Turns the user's utterance into a stream of text tokens under a token-rate policy."""

    name: str = "responder"
    #: Worth requesting before the user's turn is surely over (app/live/turns.py): a responder with a
    #: network TTFT overlaps it with the rest of the silence; an instant one gains nothing.
    prefetch: bool = False

    @abstractmethod
    def tokens(self, utterance: str, policy: TokenRatePolicy) -> AsyncIterator[str]:
        """Raw tokens, unpaced, at most ``policy.max_tokens``."""

    async def respond(
        self, utterance: str, policy: TokenRatePolicy, pacer: TokenPacer | None = None
    ) -> AsyncIterator[PacedToken]:
        """Tokens paced at the policy's rate (``pacer`` keeps its own, changeable, policy)."""
        pacer = pacer or TokenPacer(policy)
        async for tok in pacer.pace(self.tokens(utterance, policy)):
            yield tok


class CaptionResponder(Responder):
    """Streams the recognised transcript back as live captions, one word per token."""

    name = "caption"

    async def tokens(self, utterance: str, policy: TokenRatePolicy) -> AsyncIterator[str]:
        for i, word in enumerate(utterance.split()):
            if i >= policy.max_tokens:
                return
            yield word


class OpenAIResponder(Responder):
    """Streams a chat completion from an OpenAI-compatible server (SSE over ``httpx``)."""

    name = "openai"
    prefetch = True

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000/v1",
        model: str = "default",
        api_key: str | None = None,
        system_prompt: str = "You are a concise, helpful assistant. Answer briefly.",
        connect_timeout_s: float = 3.0,
        read_timeout_s: float = 10.0,
        total_timeout_s: float = 60.0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.system_prompt = system_prompt
        self.timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=5.0, pool=5.0)
        self.total_timeout_s = total_timeout_s

    def payload(self, utterance: str, policy: TokenRatePolicy) -> dict:
        """The request body: streaming, with the policy's ``max_tokens`` and ``temperature``."""
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": utterance},
            ],
            "stream": True,
            "max_tokens": int(policy.max_tokens),
            "temperature": float(policy.temperature),
        }

    async def tokens(self, utterance: str, policy: TokenRatePolicy) -> AsyncIterator[str]:
        if policy.max_tokens <= 0:
            return
        headers = {"Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        count = 0
        try:
            async with asyncio.timeout(self.total_timeout_s):
                async with httpx.AsyncClient(timeout=self.timeout) as client:
                    async with client.stream(
                        "POST", self.url, json=self.payload(utterance, policy), headers=headers
                    ) as resp:
                        if resp.status_code != 200:
                            body = (await resp.aread()).decode("utf-8", "replace")[:200]
                            raise ResponderError(f"{self.url} answered HTTP {resp.status_code}: {body}")
                        async for line in resp.aiter_lines():
                            text, done = _parse_sse_line(line, self.url)
                            if done:
                                return
                            if text:
                                yield text
                                count += 1
                                if count >= policy.max_tokens:
                                    return
        except TimeoutError:
            raise ResponderError(
                f"{self.url} did not finish within {self.total_timeout_s:g} s"
            ) from None
        except httpx.ConnectError as exc:
            raise ResponderError(f"cannot connect to {self.url}: {exc or 'connection refused'}") from None
        except httpx.TimeoutException as exc:
            raise ResponderError(f"timed out talking to {self.url} ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise ResponderError(f"HTTP error talking to {self.url}: {exc}") from None


def _parse_sse_line(line: str, url: str) -> tuple[str, bool]:
    """One SSE line → (content text, done). Comments, events without data and role-only deltas → ''."""
    line = line.strip()
    if not line.startswith("data:"):
        return "", False
    data = line[5:].strip()
    if data == "[DONE]":
        return "", True
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        raise ResponderError(f"{url} sent a malformed stream chunk: {data[:80]!r}") from None
    if "error" in chunk:
        raise ResponderError(f"{url} reported an error: {chunk['error']}")
    choices = chunk.get("choices") or []
    if not choices:
        return "", False
    choice = choices[0]
    delta = choice.get("delta") or {}
    text = delta.get("content") or ""
    return text, False


RESPONDERS: dict[str, type[Responder]] = {"caption": CaptionResponder, "openai": OpenAIResponder}


def make_responder(name: str = "caption", **options: object) -> Responder:
    """Build a responder by name (``caption`` or ``openai``); options go to its constructor."""
    try:
        cls = RESPONDERS[name]
    except KeyError:
        raise ValueError(f"unknown responder {name!r}; choose one of {', '.join(RESPONDERS)}") from None
    return cls(**options)  # type: ignore[arg-type]
