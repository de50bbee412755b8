"""Responders: what the session says back, as text tokens, behind one interface.

``Responder.tokens(utterance, policy, times=None, headers=None, context=None)`` yields raw tokens (at most
``policy.max_tokens``) as they come; ``Responder.respond(utterance, policy, pacer)`` yields them paced
(``PacedToken``). A ``RequestTimes`` records the request's first byte written, the first content delta read
(LST TTFT, docs/LST.md), the finish reason and the tool calls (never yielded as text). ``context``
(:class:`Conversation`) holds the earlier turns and the user's load. Three are built in:

* ``assistant`` (``synchrony serve``'s default): a small rule-based assistant that needs no LLM
  (greetings, "what can you do", the time, thanks, "repeat that"; otherwise what it heard, briefer
  under load);
* ``caption``: the recognised transcript streamed back word by word (tests, load tests);
* ``openai``: any OpenAI-compatible streaming chat endpoint, passing ``max_tokens`` and ``temperature``;
  every network step has a timeout and the whole response a deadline; failures raise ``ResponderError``.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import httpx

from alignment.pacing import PacedToken, TokenPacer
from alignment.types import LoadEstimate, TokenRatePolicy
from models.http_client import shared_client


@dataclass(frozen=True)
class Conversation:
    """What a responder may know beyond the utterance: earlier turns, oldest first, as (the user's
    words, the delivered prefix of the answer: ``AnswerOutcome.text``), and the user's load now."""

    history: tuple[tuple[str, str], ...] = ()
    load: LoadEstimate | None = None


class ResponderError(RuntimeError):
    """A responder could not produce a response (unreachable server, bad reply, timeout)."""


@dataclass
class RequestTimes:
    """What one responder request measured, filled in as it streams (times: ``time.monotonic`` s).

    ``sent``: the request's first byte written (a built-in responder: when it was first pulled);
    ``first``: the first content delta read (built-in: the first token produced); ``content``:
    every content piece received, the responder's full answer as it arrived; ``tool_calls``: tool
    names and argument fragments received (never shown as text); ``finish_reason``: the server's,
    or ``length`` when the responder stopped at ``max_tokens`` itself.
    """

    sent: float | None = None
    first: float | None = None
    last: float | None = None
    completion_id: str | None = None
    finish_reason: str | None = None
    content: list[str] = field(default_factory=list)
    tool_calls: list[str] = field(default_factory=list)
    usage: dict[str, int] | None = None

    def got(self, piece: str) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.last = now
        self.content.append(piece)


class Responder(ABC):
    """Turns the user's utterance into a stream of text tokens under a token-rate policy."""

    name: str = "responder"
    #: Worth requesting before the user's turn is surely over (app/live/turns.py): a responder with a
    #: network TTFT overlaps it with the rest of the silence; an instant one gains nothing.
    prefetch: bool = False
    #: Tokens are whole words without the spaces between them (joined with a space to be read); False:
    #: raw text pieces that join by concatenation ("synchron", "y", " world"), assembled into words on
    #: the delivery path (``alignment.seq.words_of``).
    word_tokens: bool = False
    model: str = ""

    @abstractmethod
    def tokens(self, utterance: str, policy: TokenRatePolicy, times: RequestTimes | None = None,
               headers: Mapping[str, str] | None = None,
               context: Conversation | None = None) -> AsyncIterator[str]:
        """Raw tokens, unpaced, at most ``policy.max_tokens``; ``times`` is filled in as they come,
        ``headers`` go on the request (``traceparent``) where there is one."""

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
    word_tokens = True

    async def tokens(self, utterance: str, policy: TokenRatePolicy, times: RequestTimes | None = None,
                     headers: Mapping[str, str] | None = None,
                     context: Conversation | None = None) -> AsyncIterator[str]:
        times = times or RequestTimes()
        times.sent = time.monotonic()  # before the answer is made: its making is part of TTFT
        async for word in _stream_words(utterance.split(), policy, times):
            yield word


async def _stream_words(words: list[str], policy: TokenRatePolicy, times: RequestTimes) -> AsyncIterator[str]:
    """A built-in responder's words as a token stream: at most ``policy.max_tokens``, each one's time recorded."""
    for i, word in enumerate(words):
        if i >= policy.max_tokens:
            times.finish_reason = "length"
            return
        times.got(word)
        yield word
    times.finish_reason = "stop"


_LOAD_WORDS = ("relaxed", "a little busy", "busy", "overloaded")
_INTENTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((name, re.compile(rx)) for name, rx in (
    ("repeat", r"\b(repeat|say (that|it) again|come again|pardon)\b"),
    ("abilities", r"\b(what can you do|what do you do|help me|how does this work|what are you)\b"),
    ("time", r"\b(what time|the time|time is it)\b"),
    ("thanks", r"\b(thanks|thank you|cheers)\b"),
    ("bye", r"\b(bye|goodbye|see you)\b"),
    ("how", r"\bhow are you\b"),
    ("name", r"\b(who are you|your name)\b"),
    ("load", r"\b(my load|how busy|am i (busy|tired|stressed|overloaded))\b"),
    ("greeting", r"^(hi|hello|hey|good (morning|afternoon|evening))\b"),
))


class AssistantResponder(Responder):
    """A small assistant that needs no LLM: short answers to simple intents, else what it heard and
    the load it saw. Under load its answers get shorter (and the policy's ``max_tokens`` cuts them)."""

    name = "assistant"
    word_tokens = True

    def __init__(self, now: type[datetime.datetime] = datetime.datetime) -> None:
        self._now = now

    def answer(self, utterance: str, context: Conversation | None = None) -> str:
        """The whole answer's text."""
        context = context or Conversation()
        heard = " ".join(utterance.split())
        said = re.sub(r"[^a-z' ]", " ", heard.lower()).strip()
        level = context.load.level if context.load is not None else None
        if not said:
            return "Sorry, I did not catch that. Could you say it again?"
        intent = next((name for name, rx in _INTENTS if rx.search(said)), None)
        if intent == "repeat":
            last = next((a for _, a in reversed(context.history) if a), "")
            return f"I said: {last}" if last else "I have not said anything yet. Ask me something."
        if intent == "abilities":
            return ("I listen and transcribe your words with their timing, read your face for signs of load, "
                    "and answer out loud, slower and shorter when you look busy.")
        if intent == "time":
            now = self._now.now(datetime.UTC)
            return f"It is {now:%H:%M} UTC."
        if intent == "thanks":
            return "You are welcome."
        if intent == "bye":
            return "Goodbye, and thanks for trying synchrony."
        if intent == "how":
            return "I am fine, thank you. " + _load_remark(level)
        if intent == "name":
            return "I am synchrony, a voice assistant that paces itself to your load."
        if intent == "load":
            return _load_remark(level) if level is not None else "I cannot see your face yet, so I cannot tell."
        if intent == "greeting":
            return "Hello! I can hear and see you. Ask me what I can do."
        quoted = " ".join(heard.split()[:12]) + (" ..." if len(heard.split()) > 12 else "")
        if level is not None and level >= 2:
            return f"I heard: {quoted.rstrip('.?!')}. You look {_LOAD_WORDS[level]}, so I will keep it short."
        return f"I heard you say: {quoted.rstrip('.?!')}. {_load_remark(level)}"

    async def tokens(self, utterance: str, policy: TokenRatePolicy, times: RequestTimes | None = None,
                     headers: Mapping[str, str] | None = None,
                     context: Conversation | None = None) -> AsyncIterator[str]:
        times = times or RequestTimes()
        times.sent = time.monotonic()  # before the answer is made: its making is part of TTFT
        async for word in _stream_words(self.answer(utterance, context).split(), policy, times):
            yield word


def _load_remark(level: int | None) -> str:
    if level is None:
        return "I cannot see your face yet, so I cannot tell how busy you are."
    if level == 0:
        return "You look relaxed, so I can talk at an easy pace."
    return f"You look {_LOAD_WORDS[min(level, 3)]}, so I will speak slower and keep it brief."


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

    def payload(self, utterance: str, policy: TokenRatePolicy, context: Conversation | None = None) -> dict:
        """The request body: streaming, with the policy's ``max_tokens`` and ``temperature``, and the
        earlier turns (each answer as far as it was delivered) before the utterance."""
        messages: list[dict[str, str]] = [{"role": "system", "content": self.system_prompt}]
        for user, answer in context.history if context is not None else ():
            messages.append({"role": "user", "content": user})
            if answer:
                messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": utterance})
        return {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "max_tokens": int(policy.max_tokens),
            "temperature": float(policy.temperature),
        }

    async def tokens(self, utterance: str, policy: TokenRatePolicy, times: RequestTimes | None = None,
                     headers: Mapping[str, str] | None = None,
                     context: Conversation | None = None) -> AsyncIterator[str]:
        if policy.max_tokens <= 0:
            return
        times = times or RequestTimes()
        sent = {"Accept": "text/event-stream", **(headers or {})}
        if self.api_key:
            sent["Authorization"] = f"Bearer {self.api_key}"

        async def trace(event: str, info: Mapping[str, object]) -> None:  # httpcore's trace extension
            if event == "http11.send_request_headers.started" and times.sent is None:
                times.sent = time.monotonic()  # the request's first byte is about to be written

        count = 0
        try:
            async with asyncio.timeout(self.total_timeout_s):
                client = await shared_client()
                async with client.stream("POST", self.url, json=self.payload(utterance, policy, context),
                                         headers=sent, timeout=self.timeout, extensions={"trace": trace}) as resp:
                    if resp.status_code != 200:
                        body = (await resp.aread()).decode("utf-8", "replace")[:200]
                        raise ResponderError(f"{self.url} answered HTTP {resp.status_code}: {body}")
                    async for line in resp.aiter_lines():
                        text, done = _parse_sse_line(line, self.url, times)
                        if done:
                            return
                        if text:
                            times.got(text)
                            yield text
                            count += 1
                            if count >= policy.max_tokens:
                                times.finish_reason = times.finish_reason or "length"
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


def _parse_sse_line(line: str, url: str, times: RequestTimes | None = None) -> tuple[str, bool]:
    """One SSE line → (content text, done). Comments, events without data, role-only and tool-call
    deltas → '' (tool calls, the finish reason, the id and usage go to ``times``, never to text)."""
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
    if not isinstance(chunk, dict):
        raise ResponderError(f"{url} sent a stream chunk that is not an object: {data[:80]!r}")
    if "error" in chunk:
        raise ResponderError(f"{url} reported an error: {chunk['error']}")
    times = times if times is not None else RequestTimes()
    times.completion_id = times.completion_id or chunk.get("id")
    if isinstance(chunk.get("usage"), dict):
        times.usage = {k: v for k, v in chunk["usage"].items() if isinstance(v, int)}
    choices = chunk.get("choices") or []
    if not choices:
        return "", False
    choice = choices[0]
    times.finish_reason = choice.get("finish_reason") or times.finish_reason
    delta = choice.get("delta") or {}
    for call in delta.get("tool_calls") or []:
        fn = call.get("function") or {}
        times.tool_calls += [str(v) for v in (fn.get("name"), fn.get("arguments")) if v]
    text = delta.get("content") or ""
    return text if isinstance(text, str) else "", False


RESPONDERS: dict[str, type[Responder]] = {"assistant": AssistantResponder, "caption": CaptionResponder,
                                          "openai": OpenAIResponder}


def make_responder(name: str = "caption", **options: object) -> Responder:
    """Build a responder by name (``assistant``, ``caption`` or ``openai``); options go to its constructor."""
    try:
        cls = RESPONDERS[name]
    except KeyError:
        raise ValueError(f"unknown responder {name!r}; choose one of {', '.join(RESPONDERS)}") from None
    return cls(**options)  # type: ignore[arg-type]
