"""Token pacing: release response tokens at the policy's rate with a steady inter-token interval.

Why absolute deadlines: sleeping a fixed interval *after* each token adds every token's processing
and wake-up delay to the next interval, so the stream drifts and jitters. Instead token k+1 is due
at ``due_k + 1 / tokens_per_s``; a late wake-up is absorbed by the next sleep. When the *source*
is slower than the pace, the grid re-anchors on the token's arrival (no catch-up burst).

One pacer per session, one response at a time; everything runs on the event loop (sleeping costs
no CPU), so many sessions share a loop. A policy change (``set_policy``) applies from the next token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

from alignment.types import TokenRatePolicy


@dataclass(frozen=True)
class PacedToken:
    """A released token: ``due`` is its deadline and ``emitted`` when it was actually released
    (both on the pacer's clock, seconds); ``index`` counts tokens within the response."""

    text: str
    index: int
    due: float
    emitted: float

    @property
    def late_s(self) -> float:
        return self.emitted - self.due


def _check(policy: TokenRatePolicy) -> TokenRatePolicy:
    if not policy.tokens_per_s > 0:
        raise ValueError(f"tokens_per_s must be > 0, got {policy.tokens_per_s}")
    if policy.max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {policy.max_tokens}")
    return policy


async def _aiter(tokens: AsyncIterable[str] | Iterable[str]) -> AsyncIterator[str]:
    if isinstance(tokens, AsyncIterable):
        async for t in tokens:
            yield t
    else:
        for t in tokens:
            yield t


class TokenPacer:
    """Paces one session's response tokens (``pace``) under a changeable ``TokenRatePolicy``."""

    def __init__(
        self,
        policy: TokenRatePolicy,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``clock`` and ``sleep`` must agree (the defaults do: the event loop runs on monotonic time)."""
        self._policy = _check(policy)
        self._clock = clock
        self._sleep = sleep

    @property
    def policy(self) -> TokenRatePolicy:
        return self._policy

    def set_policy(self, policy: TokenRatePolicy) -> None:
        """Change rate / limit; takes effect when the next token is scheduled."""
        self._policy = _check(policy)

    async def pace(self, tokens: AsyncIterable[str] | Iterable[str]) -> AsyncIterator[PacedToken]:
        """Yield ``tokens`` at the policy's rate, the first as soon as it arrives, at most
        ``max_tokens`` of them (the source is closed early when the limit is reached)."""
        source = _aiter(tokens)
        due: float | None = None
        index = 0
        try:
            while index < self._policy.max_tokens:
                try:
                    text = await source.__anext__()
                except StopAsyncIteration:
                    break
                rate = self._policy.tokens_per_s
                now = self._clock()
                due = now if due is None else max(due + 1.0 / rate, now)
                delay = due - self._clock()
                if delay > 0:
                    await self._sleep(delay)
                yield PacedToken(text=text, index=index, due=due, emitted=self._clock())
                index += 1
        finally:
            await source.aclose()
            if isinstance(tokens, AsyncIterator) and hasattr(tokens, "aclose"):
                await tokens.aclose()  # type: ignore[attr-defined]
