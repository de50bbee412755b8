"""LST metrics of a response token stream: LST TTFT, turn latency, ITL, ITLmax, jitter σ8, tier.

Seconds on one clock the caller chooses (``time.monotonic`` at emission); figures in ms. The
definitions, fixed here so tests, dashboards and certificates agree, are in docs/LST.md:
**LST TTFT** (v3: request's first byte written → first content read; p99 by ``numpy.percentile``
over the last ``history`` responses); **turn latency** (VAD end of speech → first token emitted,
holding the turn-hold ``hold_ms``; reported, never judged); **prefetch waste**; **SEQ-Integrity**
(``alignment.seq``); **ITL** (within one response); **jitter σ8** (ddof=0 over 8 consecutive ITLs,
windows may span responses; ``jitter_ms`` the worst window, ``jitter_ms_last8`` the last);
**ITLmax** (reported, not judged: one interval d among seven of m has σ8 = (d − m)·√7/8);
**tier**: Gold TTFT99 ≤ 65 ms & jitter ≤ 3 ms, Silver ≤ 120 & ≤ 8, Bronze ≤ 200 & ≤ 15, else none.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from alignment.rounding import round_or_none

#: (name, TTFT p99 limit ms, jitter limit ms), best first.
TIERS: tuple[tuple[str, float, float], ...] = (
    ("gold", 65.0, 3.0),
    ("silver", 120.0, 8.0),
    ("bronze", 200.0, 15.0),
)
TIER_NAMES = ("none", "bronze", "silver", "gold")  # worst first: index = rank
JITTER_WINDOW = 8
#: Version of the figures' definitions in ``lst`` events, /metrics/lst and certificates (1: TTFT from
#: the end of speech, jitter over the last 8 ITLs only; 2: TTFT from the request going out, holding
#: a prefetched answer's turn-hold; 3: the definitions above).
LST_VERSION = 3


def tier_for(ttft_ms_p99: float | None, jitter_ms: float | None) -> str:
    """The best tier whose TTFT-p99 and jitter limits are both met, else "none"."""
    if ttft_ms_p99 is None or jitter_ms is None:
        return "none"
    for name, ttft_limit, jitter_limit in TIERS:
        if ttft_ms_p99 <= ttft_limit and jitter_ms <= jitter_limit:
            return name
    return "none"


def tier_rank(tier: str) -> int:
    """0 none … 3 gold; a clear ValueError for an unknown name (CLI input)."""
    try:
        return TIER_NAMES.index(tier.lower())
    except ValueError:
        raise ValueError(f"unknown LST tier {tier!r}; choose one of {', '.join(TIER_NAMES[1:])}") from None


def percentile(values: Iterable[float], q: float) -> float | None:
    """``numpy.percentile`` (linear) of ``values``; None when empty."""
    arr = np.fromiter(values, dtype=np.float64)
    return float(np.percentile(arr, q)) if len(arr) else None


def worst_sigma(itls: Sequence[float], window: int = JITTER_WINDOW) -> float | None:
    """Worst σ (ddof=0) over every ``window`` consecutive values; σ of all with fewer; None under 2."""
    n = len(itls)
    if n < 2:
        return None
    arr = np.asarray(itls, dtype=np.float64)
    if n <= window:
        return float(np.std(arr))
    windows = np.lib.stride_tricks.sliding_window_view(arr, window)
    return float(np.std(windows, axis=1).max())


def judge_samples(ttft_ms: Sequence[float], itl_ms_streams: Sequence[Sequence[float]],
                  version: int = LST_VERSION) -> dict:
    """The verdict on raw samples, by the meter's definitions: LST TTFT p99 over every response,
    worst σ8 over each stream's ITLs (one stream = one session's ITLs in emission order), tier.
    ``version``: the definitions the samples were taken under (v2 and v3 judge them alike; what
    differs is where their TTFT starts), stamped into the verdict."""
    p99 = percentile(ttft_ms, 99)
    sigmas = [s for s in (worst_sigma(list(stream)) for stream in itl_ms_streams) if s is not None]
    jitter = max(sigmas) if sigmas else None
    itl_max = max((max(stream) for stream in itl_ms_streams if len(stream)), default=None)
    return {"lst_version": version, "ttft_ms_p99": round_or_none(p99, 3), "jitter_ms": round_or_none(jitter, 3),
            "itl_ms_max": round_or_none(itl_max, 3),
            "responses": len(ttft_ms), "intervals": sum(len(s) for s in itl_ms_streams),
            "tier": tier_for(p99, jitter)}


@dataclass(frozen=True)
class TokenTiming:
    """What one emitted token measured (s): the first of a response has ``ttft_s`` (and ``turn_s``
    when the end of speech is known, ``hold_s``: its first content read → emitted); later ones
    have ``itl_s``."""

    ttft_s: float | None = None
    turn_s: float | None = None
    itl_s: float | None = None
    hold_s: float | None = None



def _latency_percentiles(ttft_ms: Sequence[float], turn_ms: Sequence[float]) -> dict[str, float | None]:
    """The TTFT and turn-latency percentiles of a snapshot, in their wire order."""
    return {
        "ttft_ms_p99": round_or_none(percentile(ttft_ms, 99), 3),
        "ttft_ms_p50": round_or_none(percentile(ttft_ms, 50), 3),
        "turn_ms_p50": round_or_none(percentile(turn_ms, 50), 3),
        "turn_ms_p95": round_or_none(percentile(turn_ms, 95), 3),
        "turn_ms_p99": round_or_none(percentile(turn_ms, 99), 3),
    }

def _waste_and_integrity(sent: int, wasted: int, answers: int, kept: int) -> dict[str, float | int | None]:
    """Prefetch waste (discarded / sent) and SEQ-Integrity (kept / answers), with their counts."""
    return {"prefetch_requests": sent, "prefetch_wasted": wasted,
            "prefetch_waste": round(wasted / sent, 4) if sent else None,
            "seq_answers": answers, "seq_integrity": round(kept / answers, 4) if answers else None}


class LSTMeter:
    """One session's token-stream meter: ``begin_response`` then ``token`` for each emission."""

    def __init__(self, window: int = JITTER_WINDOW, history: int = 1000) -> None:
        if window < 2:
            raise ValueError("jitter window must hold at least 2 intervals")
        self.window = window
        self._lock = threading.Lock()
        self._ttft_s: deque[float] = deque(maxlen=history)
        self._turn_s: deque[float] = deque(maxlen=history)
        self._itl_s: deque[float] = deque(maxlen=window)
        self._itl_count = 0  # ITLs in the stream (the deque keeps the last ``window``)
        self._early_itl_s: list[float] = []  # the stream's first ITLs, until a full window exists
        self._worst_sigma_s: float | None = None
        self._itl_max_s: float | None = None
        self._pending: tuple[float, float | None, float | None] | None = None  # (request, speech end, first read)
        self._last_token: float | None = None
        self._hold_s: deque[float] = deque(maxlen=history)
        self.tokens = 0
        self.responses = 0
        self.intervals = 0
        self.prefetch_sent = 0  # requests sent at a pause, before the turn was surely over
        self.prefetch_wasted = 0  # … of them discarded (the user went on speaking)
        self.seq_answers = 0  # answers judged for SEQ-Integrity (alignment.seq)
        self.seq_kept = 0  # … that kept every rule

    def begin_response(self, request_t: float, speech_end_t: float | None = None,
                       first_content_t: float | None = None) -> None:
        """The responder's request was written at ``request_t`` for a turn whose speech ended at
        ``speech_end_t``, and its first content was read at ``first_content_t`` (None: at the first
        token's emission): the next token is this response's first."""
        with self._lock:
            self._pending = (request_t, speech_end_t, first_content_t)
            self._last_token = None

    def prefetch(self, wasted: bool = False) -> None:
        """A request sent at a pause (``wasted=False``), or one of them discarded (``wasted=True``)."""
        with self._lock:
            if wasted:
                self.prefetch_wasted += 1
            else:
                self.prefetch_sent += 1

    def answer_integrity(self, kept: bool) -> None:
        """One answer's SEQ-Integrity verdict (``alignment.seq.check_answer``)."""
        with self._lock:
            self.seq_answers += 1
            self.seq_kept += bool(kept)

    def token(self, t: float) -> TokenTiming:
        """A response token was emitted at ``t``; returns what it measured."""
        with self._lock:
            self.tokens += 1
            timing = TokenTiming()
            if self._pending is not None:
                request_t, speech_end_t, first_t = self._pending
                self._pending = None
                first_t = t if first_t is None else first_t
                timing = TokenTiming(ttft_s=first_t - request_t, hold_s=t - first_t,
                                     turn_s=None if speech_end_t is None else t - speech_end_t)
                self._ttft_s.append(timing.ttft_s)  # type: ignore[arg-type]
                self._hold_s.append(timing.hold_s)  # type: ignore[arg-type]
                if timing.turn_s is not None:
                    self._turn_s.append(timing.turn_s)
                self.responses += 1
            elif self._last_token is not None:
                timing = TokenTiming(itl_s=t - self._last_token)
                self._add_itl(timing.itl_s)  # type: ignore[arg-type]
            self._last_token = t
            return timing

    def _add_itl(self, itl: float) -> None:
        self._itl_s.append(itl)
        self.intervals += 1
        self._itl_max_s = itl if self._itl_max_s is None else max(self._itl_max_s, itl)
        if self.intervals < self.window:
            self._early_itl_s.append(itl)
            return
        self._early_itl_s = []
        sigma = float(np.std(np.fromiter(self._itl_s, dtype=np.float64)))
        self._worst_sigma_s = sigma if self._worst_sigma_s is None else max(self._worst_sigma_s, sigma)

    def response_end(self) -> None:
        """The response finished: the gap to the next response's tokens is not an ITL."""
        with self._lock:
            self._last_token = None

    def ttfts_ms(self) -> list[float]:
        with self._lock:
            return [v * 1e3 for v in self._ttft_s]

    def turns_ms(self) -> list[float]:
        with self._lock:
            return [v * 1e3 for v in self._turn_s]

    def holds_ms(self) -> list[float]:
        with self._lock:
            return [v * 1e3 for v in self._hold_s]

    def jitter_ms(self) -> float | None:
        """The worst σ8 of the stream so far, in ms (see the module docstring); None under 2 ITLs."""
        with self._lock:
            return self._worst_ms()

    def _worst_ms(self) -> float | None:
        if self._worst_sigma_s is not None:
            return self._worst_sigma_s * 1e3
        early = worst_sigma(self._early_itl_s, self.window)
        return None if early is None else early * 1e3

    def snapshot(self) -> dict:
        """LST TTFT p50/p99, turn latency p50/p95/p99, ITLmax, worst and last-8 jitter, tier, counts."""
        with self._lock:
            ttft = [v * 1e3 for v in self._ttft_s]
            turn = [v * 1e3 for v in self._turn_s]
            p99 = percentile(ttft, 99)
            jitter = self._worst_ms()
            last8 = worst_sigma(list(self._itl_s)[-self.window:], self.window) if len(self._itl_s) >= 2 else None
            last_itl = self._itl_s[-1] * 1e3 if self._itl_s else None
            return {
                "lst_version": LST_VERSION,
                **_latency_percentiles(ttft, turn),
                "itl_ms_max": round_or_none(None if self._itl_max_s is None else self._itl_max_s * 1e3, 3),
                "itl_ms_last": round_or_none(last_itl, 3),
                "jitter_ms": round_or_none(jitter, 3),
                "jitter_ms_last8": round_or_none(None if last8 is None else last8 * 1e3, 3),
                "tier": tier_for(p99, jitter),
                "tokens": self.tokens,
                "responses": self.responses,
                "intervals": self.intervals,
                "hold_ms_p50": round_or_none(percentile((v * 1e3 for v in self._hold_s), 50), 3),
                "hold_ms_p99": round_or_none(percentile((v * 1e3 for v in self._hold_s), 99), 3),
                **_waste_and_integrity(self.prefetch_sent, self.prefetch_wasted, self.seq_answers, self.seq_kept),
            }

    def counts(self) -> tuple[int, int, int, int]:
        """(prefetch sent, prefetch wasted, SEQ answers, SEQ kept), for pooling."""
        with self._lock:
            return self.prefetch_sent, self.prefetch_wasted, self.seq_answers, self.seq_kept


class LSTAggregate:
    """All sessions' meters, for the server's /metrics/lst and /metrics.

    Pooled LST TTFT and turn latency over every live session plus a bounded history of closed ones;
    worst ITLmax; jitter as the worst session, live or recently closed (the tier must hold for every
    session, so the worst rules).
    """

    def __init__(self, history: int = 10_000, closed_sessions: int = 1000) -> None:
        self._lock = threading.Lock()
        self._meters: dict[str, LSTMeter] = {}
        self._retired_ttft_ms: deque[float] = deque(maxlen=history)
        self._retired_turn_ms: deque[float] = deque(maxlen=history)
        self._retired_hold_ms: deque[float] = deque(maxlen=history)
        self._retired_jitter_ms: deque[float] = deque(maxlen=closed_sessions)
        self._retired_itl_max_ms: float | None = None
        self._retired_sessions = 0
        self._retired_counts = (0, 0, 0, 0)  # prefetch sent, wasted, SEQ answers, kept (LSTMeter.counts)

    def meter(self, session_id: str) -> LSTMeter:
        """The session's meter (created on first use)."""
        with self._lock:
            m = self._meters.get(session_id)
            if m is None:
                m = self._meters[session_id] = LSTMeter()
            return m

    def remove(self, session_id: str) -> None:
        """Close a session; its TTFTs, turn latencies, worst jitter and ITLmax stay in the pooled figures."""
        with self._lock:
            m = self._meters.pop(session_id, None)
            if m is None:
                return
            snap = m.snapshot()
            self._retired_ttft_ms.extend(m.ttfts_ms())
            self._retired_turn_ms.extend(m.turns_ms())
            self._retired_hold_ms.extend(m.holds_ms())
            if snap["jitter_ms"] is not None:
                self._retired_jitter_ms.append(snap["jitter_ms"])
            if snap["itl_ms_max"] is not None:
                self._retired_itl_max_ms = max(self._retired_itl_max_ms or 0.0, snap["itl_ms_max"])
            self._retired_sessions += 1
            self._retired_counts = tuple(a + b for a, b in zip(self._retired_counts, m.counts(), strict=True))

    def snapshot(self) -> dict:
        with self._lock:
            meters = dict(self._meters)
            ttfts = list(self._retired_ttft_ms)
            turns = list(self._retired_turn_ms)
            holds = list(self._retired_hold_ms)
            jitters = list(self._retired_jitter_ms)
            itl_max = self._retired_itl_max_ms
            retired = self._retired_sessions
            counts = self._retired_counts
        sessions = {}
        live_jitters = []
        for sid, m in meters.items():
            counts = tuple(a + b for a, b in zip(counts, m.counts(), strict=True))
            snap = m.snapshot()
            sessions[sid] = snap
            ttfts.extend(m.ttfts_ms())
            turns.extend(m.turns_ms())
            holds.extend(m.holds_ms())
            if snap["itl_ms_max"] is not None:
                itl_max = max(itl_max or 0.0, snap["itl_ms_max"])
            if snap["jitter_ms"] is not None:
                live_jitters.append(snap["jitter_ms"])
        jitters += live_jitters
        p99 = percentile(ttfts, 99)
        worst_jitter = max(jitters) if jitters else None
        return {
            "lst_version": LST_VERSION,
            **_latency_percentiles(ttfts, turns),
            "itl_ms_max": round_or_none(itl_max, 3),
            "jitter_ms": round_or_none(worst_jitter, 3),
            "jitter_ms_mean": round_or_none(float(np.mean(live_jitters)) if live_jitters else None, 3),
            "tier": tier_for(p99, worst_jitter),
            "sessions": len(meters),
            "closed_sessions": retired,
            "ttft_samples": len(ttfts),
            "turn_samples": len(turns),
            "hold_ms_p50": round_or_none(percentile(holds, 50), 3),
            "hold_ms_p99": round_or_none(percentile(holds, 99), 3),
            **_waste_and_integrity(*counts),
            "per_session": sessions,
        }
