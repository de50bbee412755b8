"""LST metrics of a response token stream: TTFT, ITL, ITLmax, jitter σ over the last 8 intervals, tier.

All times are seconds on one clock chosen by the caller (normally ``time.monotonic`` wall time at
emission); the session maps the VAD's end-of-utterance pts onto that clock before calling
``utterance_end``. Figures are reported in milliseconds.

Definitions (fixed here so tests and dashboards agree):

* TTFT: end of the user's utterance → the first response token after it. p99 uses linear
  interpolation between order statistics (``numpy.percentile`` default) over the last
  ``history`` TTFTs.
* ITL: interval between consecutive tokens of one response (never across responses).
* jitter: population standard deviation (ddof=0) of the last ``window`` (8) ITLs; needs ≥ 2.
* tier: Gold TTFT99 ≤ 65 ms & jitter ≤ 3 ms; Silver ≤ 120 & ≤ 8; Bronze ≤ 200 & ≤ 15; else
  "none" (also "none" until there is a TTFT and a jitter figure).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

import numpy as np

#: (name, TTFT p99 limit ms, jitter limit ms), best first.
TIERS: tuple[tuple[str, float, float], ...] = (
    ("gold", 65.0, 3.0),
    ("silver", 120.0, 8.0),
    ("bronze", 200.0, 15.0),
)
JITTER_WINDOW = 8


def tier_for(ttft_ms_p99: float | None, jitter_ms: float | None) -> str:
    """The best tier whose TTFT-p99 and jitter limits are both met, else "none"."""
    if ttft_ms_p99 is None or jitter_ms is None:
        return "none"
    for name, ttft_limit, jitter_limit in TIERS:
        if ttft_ms_p99 <= ttft_limit and jitter_ms <= jitter_limit:
            return name
    return "none"


def _p99(values: Iterable[float]) -> float | None:
    arr = np.fromiter(values, dtype=np.float64)
    return float(np.percentile(arr, 99)) if len(arr) else None


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


class LSTMeter:
    """One session's token-stream meter: call ``utterance_end`` then ``token`` for each emission."""

    def __init__(self, window: int = JITTER_WINDOW, history: int = 1000) -> None:
        if window < 2:
            raise ValueError("jitter window must hold at least 2 intervals")
        self.window = window
        self._lock = threading.Lock()
        self._ttft_s: deque[float] = deque(maxlen=history)
        self._itl_s: deque[float] = deque(maxlen=window)
        self._itl_max_s: float | None = None
        self._pending_end: float | None = None
        self._last_token: float | None = None
        self.tokens = 0
        self.responses = 0
        self.intervals = 0

    def utterance_end(self, t: float) -> None:
        """The user stopped speaking at ``t`` (VAD end of utterance): the next token starts a response."""
        with self._lock:
            self._pending_end = t
            self._last_token = None

    def token(self, t: float) -> None:
        """A response token was emitted at ``t``."""
        with self._lock:
            self.tokens += 1
            if self._pending_end is not None:
                self._ttft_s.append(t - self._pending_end)
                self._pending_end = None
                self.responses += 1
            elif self._last_token is not None:
                itl = t - self._last_token
                self._itl_s.append(itl)
                self.intervals += 1
                self._itl_max_s = itl if self._itl_max_s is None else max(self._itl_max_s, itl)
            self._last_token = t

    def response_end(self) -> None:
        """The response finished: the gap to the next response's tokens is not an ITL."""
        with self._lock:
            self._last_token = None

    def ttfts_ms(self) -> list[float]:
        with self._lock:
            return [v * 1e3 for v in self._ttft_s]

    def jitter_ms(self) -> float | None:
        """σ (ddof=0) of the last ``window`` ITLs, in ms; None with fewer than 2."""
        with self._lock:
            if len(self._itl_s) < 2:
                return None
            return float(np.std(np.fromiter(self._itl_s, dtype=np.float64))) * 1e3

    def snapshot(self) -> dict:
        """ttft_ms_p99, itl_ms_max, jitter_ms, tier, plus counts and the last ITL."""
        jitter = self.jitter_ms()
        with self._lock:
            p99 = _p99(v * 1e3 for v in self._ttft_s)
            last_itl = self._itl_s[-1] * 1e3 if self._itl_s else None
            return {
                "ttft_ms_p99": _r(p99),
                "itl_ms_max": _r(None if self._itl_max_s is None else self._itl_max_s * 1e3),
                "itl_ms_last": _r(last_itl),
                "jitter_ms": _r(jitter),
                "tier": tier_for(p99, jitter),
                "tokens": self.tokens,
                "responses": self.responses,
                "intervals": self.intervals,
            }


class LSTAggregate:
    """All sessions' meters, for the server's /metrics/lst.

    Pooled TTFT p99 over every live session plus a bounded history of closed ones; worst ITLmax;
    jitter as the worst current session (the tier must hold for every session, so the worst rules).
    """

    def __init__(self, history: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._meters: dict[str, LSTMeter] = {}
        self._retired_ttft_ms: deque[float] = deque(maxlen=history)
        self._retired_itl_max_ms: float | None = None
        self._retired_sessions = 0

    def meter(self, session_id: str) -> LSTMeter:
        """The session's meter (created on first use)."""
        with self._lock:
            m = self._meters.get(session_id)
            if m is None:
                m = self._meters[session_id] = LSTMeter()
            return m

    def remove(self, session_id: str) -> None:
        """Close a session; its TTFTs and ITLmax stay in the pooled figures."""
        with self._lock:
            m = self._meters.pop(session_id, None)
            if m is None:
                return
            snap = m.snapshot()
            self._retired_ttft_ms.extend(m.ttfts_ms())
            if snap["itl_ms_max"] is not None:
                self._retired_itl_max_ms = max(self._retired_itl_max_ms or 0.0, snap["itl_ms_max"])
            self._retired_sessions += 1

    def snapshot(self) -> dict:
        with self._lock:
            meters = dict(self._meters)
            ttfts = list(self._retired_ttft_ms)
            itl_max = self._retired_itl_max_ms
            retired = self._retired_sessions
        sessions = {}
        jitters = []
        for sid, m in meters.items():
            snap = m.snapshot()
            sessions[sid] = snap
            ttfts.extend(m.ttfts_ms())
            if snap["itl_ms_max"] is not None:
                itl_max = max(itl_max or 0.0, snap["itl_ms_max"])
            if snap["jitter_ms"] is not None:
                jitters.append(snap["jitter_ms"])
        p99 = _p99(ttfts)
        worst_jitter = max(jitters) if jitters else None
        return {
            "ttft_ms_p99": _r(p99),
            "itl_ms_max": _r(itl_max),
            "jitter_ms": _r(worst_jitter),
            "jitter_ms_mean": _r(float(np.mean(jitters)) if jitters else None),
            "tier": tier_for(p99, worst_jitter),
            "sessions": len(meters),
            "closed_sessions": retired,
            "ttft_samples": len(ttfts),
            "per_session": sessions,
        }
