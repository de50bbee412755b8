"""Token pacing: release response tokens at the policy's rate with a steady inter-token interval.

Token k+1 is due one interval after token k's actual release: the consumer's work (the DataChannel
send) is absorbed, and a late wake-up (a busy event loop) lengthens one interval only, where a fixed
grid would follow it with a short one (σ of the intervals √2 × the wake-up noise instead of 1 ×);
the price is a pace slower by the mean wake-up delay. A slow source re-anchors the same way.

A policy change (``set_policy``) glides: each interval moves at most ``max_step_s`` from the last
(a ramp of slope δ has σ8 ≈ 2.29 δ, so 1.2 ms keeps a load step mid-answer at σ8 ≈ 2.75 ms, Gold,
where a jump 12 → 8 tok/s reads ≈ 21 ms). ``continue_from`` carries the interval into the session's
next answer, since σ8 windows span answers (docs/LST.md). A new ``max_tokens`` applies from the
next token. One pacer per session; sleeping on the event loop costs no CPU.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

from alignment.types import TokenRatePolicy

#: The most one inter-token interval may differ from the last (s): a rate change glides (σ8 ≈ 2.75 ms).
MAX_STEP_S = 0.0012


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
        max_step_s: float = MAX_STEP_S,
    ) -> None:
        """``clock`` and ``sleep`` must agree (the defaults do: the event loop runs on monotonic time);
        ``max_step_s``: the glide's step (``math.inf``: a new rate applies at once)."""
        if not max_step_s > 0:
            raise ValueError(f"max_step_s must be > 0, got {max_step_s}")
        self._policy = _check(policy)
        self._clock = clock
        self._sleep = sleep
        self._max_step = max_step_s
        self._interval: float | None = None  # the last interval used (s); None: start at the policy's

    @property
    def interval_s(self) -> float:
        """The interval the pace is at now (s): the policy's, or on its way to it."""
        return self._interval if self._interval is not None else 1.0 / self._policy.tokens_per_s

    def continue_from(self, interval_s: float | None) -> None:
        """Start from the interval a previous answer's pacer reached (its ``interval_s``)."""
        if interval_s is not None and math.isfinite(interval_s) and interval_s > 0:
            self._interval = interval_s

    def _next_interval(self) -> float:
        target = 1.0 / self._policy.tokens_per_s
        now = self._interval if self._interval is not None else target
        self._interval = now + max(-self._max_step, min(self._max_step, target - now))
        return self._interval

    @property
    def policy(self) -> TokenRatePolicy:
        return self._policy

    def set_policy(self, policy: TokenRatePolicy) -> None:
        """Change rate / limit: the limit from the next token, the rate gliding toward the new one."""
        self._policy = _check(policy)

    async def pace(self, tokens: AsyncIterable[str] | Iterable[str]) -> AsyncIterator[PacedToken]:
        """Yield ``tokens`` at the policy's rate, the first as soon as it arrives, at most
        ``max_tokens`` of them (the source is closed early when the limit is reached)."""
        source = _aiter(tokens)
        released: float | None = None  # when the last token went out
        index = 0
        try:
            while index < self._policy.max_tokens:
                try:
                    text = await source.__anext__()
                except StopAsyncIteration:
                    break
                now = self._clock()
                due = now if released is None else max(released + self._next_interval(), now)
                delay = due - now
                if delay > 0:
                    await self._sleep(delay)
                released = self._clock()
                yield PacedToken(text=text, index=index, due=due, emitted=released)
                index += 1
        finally:
            await source.aclose()
            if isinstance(tokens, AsyncIterator) and hasattr(tokens, "aclose"):
                await tokens.aclose()  # type: ignore[attr-defined]
