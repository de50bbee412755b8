"""TokenPacer: deadlines from the last release, rate changes at the next token, max_tokens, many sessions.

The schedule logic is checked on a virtual clock (the shared test machine stalls for 100+ ms at
times, which would make exact wall-clock assertions flaky); real time is checked loosely.
"""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from alignment.lst import worst_sigma
from alignment.pacing import MAX_STEP_S, TokenPacer
from alignment.types import TokenRatePolicy


def _policy(rate: float, max_tokens: int = 1000) -> TokenRatePolicy:
    return TokenRatePolicy(tokens_per_s=rate, max_tokens=max_tokens, temperature=0.5)


class VirtualTime:
    """A clock whose sleeps advance it, each wake-up ``overshoot`` seconds late."""

    def __init__(self, overshoot: float = 0.0) -> None:
        self.now = 100.0
        self.overshoot = overshoot

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.now += delay + self.overshoot
        await asyncio.sleep(0)

    def pacer(self, policy: TokenRatePolicy, **kw) -> TokenPacer:
        return TokenPacer(policy, clock=self.clock, sleep=self.sleep, **kw)


async def test_deadlines_from_the_last_release_absorb_consumer_work():
    vt = VirtualTime(overshoot=0.002)
    out = []
    async for tok in vt.pacer(_policy(10.0)).pace(f"w{i}" for i in range(12)):
        out.append(tok)
        vt.now += 0.030  # consumer work after each token
    assert [t.text for t in out] == [f"w{i}" for i in range(12)]
    itl = np.diff([t.emitted for t in out])
    # sleep-after-work would give 132 ms intervals; a steady 2 ms wake-up delay keeps them even
    assert np.allclose(itl, 0.102, atol=1e-9)
    assert all(abs(t.late_s - 0.002) < 1e-9 for t in out[1:])


class OneLateWake(VirtualTime):
    """Every wake-up on time but one, ``late`` seconds late (a busy event loop)."""

    def __init__(self, late: float, at: int) -> None:
        super().__init__()
        self.late, self.at, self.sleeps = late, at, 0

    async def sleep(self, delay: float) -> None:
        self.sleeps += 1
        self.now += delay + (self.late if self.sleeps == self.at else 0.0)
        await asyncio.sleep(0)


async def test_a_late_wake_up_lengthens_one_interval_only():
    """A fixed grid would follow a 30 ms late interval with a 30 ms short one (σ8 15 ms); from the
    last release, the rest stay at the pace (σ8 = 30·√7/8 ≈ 9.9 ms)."""
    vt = OneLateWake(0.030, at=5)
    itl = np.diff([t.emitted async for t in vt.pacer(_policy(10.0)).pace(str(i) for i in range(16))])
    assert itl[4] == pytest.approx(0.130) and np.allclose(np.delete(itl, 4), 0.1, atol=1e-9)
    assert worst_sigma(list(itl * 1000)) == pytest.approx(30 * math.sqrt(7) / 8, abs=1e-6)


async def test_rate_change_applies_at_next_token_without_a_glide():
    vt = VirtualTime()
    pacer = vt.pacer(_policy(10.0), max_step_s=math.inf)
    out = []
    async for tok in pacer.pace(str(i) for i in range(8)):
        out.append(tok)
        if tok.index == 3:
            pacer.set_policy(_policy(4.0))
    gaps = np.diff([t.due for t in out])
    assert np.allclose(gaps[:3], 0.1, atol=1e-9)
    assert np.allclose(gaps[3:], 0.25, atol=1e-9)


async def test_max_tokens_stops_and_closes_the_source():
    closed = asyncio.Event()
    pulled = 0

    async def endless():
        nonlocal pulled
        try:
            while True:
                pulled += 1
                yield "x"
        finally:
            closed.set()

    vt = VirtualTime()
    out = [t async for t in vt.pacer(_policy(20.0, max_tokens=5)).pace(endless())]
    assert len(out) == 5
    assert pulled == 5  # never pulls a token it will not emit
    assert closed.is_set()
    assert [t async for t in vt.pacer(_policy(20.0, max_tokens=0)).pace(["a", "b"])] == []


async def test_slow_source_reanchors_without_burst():
    vt = VirtualTime()

    async def slow():
        for i in range(5):
            vt.now += 0.5  # the source needs 500 ms per token; the pace is 100 ms
            yield str(i)

    out = [t async for t in vt.pacer(_policy(10.0)).pace(slow())]
    itl = np.diff([t.emitted for t in out])
    assert np.allclose(itl, 0.5, atol=1e-9)  # each released on arrival, no catch-up burst
    assert all(t.late_s == 0.0 for t in out)


async def test_real_time_rate_and_concurrent_sessions():
    n_sessions, n_tokens, rate = 16, 10, 40.0

    async def session(k: int) -> list:
        pacer = TokenPacer(_policy(rate))
        return [t async for t in pacer.pace(f"s{k}t{i}" for i in range(n_tokens))]

    t0 = time.monotonic()
    results = await asyncio.gather(*(session(k) for k in range(n_sessions)))
    elapsed = time.monotonic() - t0
    span = (n_tokens - 1) / rate
    assert span - 0.01 < elapsed < 3 * span  # concurrent, not serialised (16x)
    for k, toks in enumerate(results):
        assert [t.text for t in toks] == [f"s{k}t{i}" for i in range(n_tokens)]
        assert toks[-1].emitted - toks[0].emitted >= span - 0.005  # never faster than the pace


def test_bad_policy_is_rejected():
    with pytest.raises(ValueError, match="tokens_per_s"):
        TokenPacer(_policy(0.0))
    pacer = TokenPacer(_policy(5.0))
    with pytest.raises(ValueError, match="max_tokens"):
        pacer.set_policy(TokenRatePolicy(5.0, -1, 0.5))


async def test_a_load_step_mid_answer_glides_within_gold():
    """12 → 8 tok/s after token 10: the interval moves by at most MAX_STEP_S a token, so every σ8
    window stays under Gold's 3 ms (a jump reads ~21 ms), and the next answer starts where it was."""
    vt = VirtualTime()
    pacer = vt.pacer(_policy(12.0))
    out = []
    async for tok in pacer.pace(str(i) for i in range(60)):
        out.append(tok.emitted)
        if tok.index == 10:
            pacer.set_policy(_policy(8.0))
    itl = np.diff(out)
    assert np.abs(np.diff(itl)).max() <= MAX_STEP_S + 1e-9
    assert worst_sigma(list(itl * 1000)) < 3.0
    assert itl[-1] == pytest.approx(0.125)  # reached the new rate: 41.7 ms in 35 steps
    nxt = vt.pacer(_policy(12.0))
    nxt.continue_from(pacer.interval_s)
    second = [t.emitted async for t in nxt.pace(str(i) for i in range(5))]
    assert np.diff(second)[0] == pytest.approx(0.125 - MAX_STEP_S)  # the next answer glides back
    jump = vt.pacer(_policy(12.0), max_step_s=math.inf)
    jumped = []
    async for tok in jump.pace(str(i) for i in range(30)):
        jumped.append(tok.emitted)
        if tok.index == 10:
            jump.set_policy(_policy(8.0))
    assert worst_sigma(list(np.diff(jumped) * 1000)) > 15.0  # what the glide avoids
