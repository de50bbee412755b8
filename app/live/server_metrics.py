"""Prometheus metrics of the live server, on a registry of its own (one per app, so tests can make many).

Observers beside the flow, not inside the stages: sessions call ``observe_stage`` / ``drop`` /
``sync`` / ``observe_lst`` with what they already measured. The LST figures that need a whole
stream (p99, worst jitter σ8, tier) are read from the ``LSTAggregate`` at scrape time
(``watch_lst``), per session and pooled, so nothing has to be forgotten when a session ends.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from app.live.reliability import LoopLag
from app.live.stages import Stage

if TYPE_CHECKING:
    from alignment.lst import TokenTiming

#: ``LSTAggregate.snapshot()``: figures by name, and ``per_session`` figures by session id
LSTSnapshot = dict  # JSON figures, as alignment.lst returns them

_ITL_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0)


class ServerMetrics:
    """Sessions, per-stage latency (wall at emission − pts), drops, Level-3 pass rate, cold start."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("synchrony_sessions", "live sessions", registry=r)
        self.sessions_total = Counter("synchrony_sessions_started", "sessions started", registry=r)
        self.sessions_ended = Counter(
            "synchrony_sessions_ended", "sessions ended, by reason", ["reason"], registry=r
        )
        self.rejected = Counter("synchrony_whip_rejected", "WHIP requests refused, by status", ["status"],
                                registry=r)
        self.stage_latency = Histogram(
            "synchrony_stage_latency_seconds",
            "wall time at emission minus the pts of what was emitted, per stage",
            ["stage"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.stage_compute = Histogram(
            "synchrony_stage_compute_seconds", "compute time of one stage call", ["stage"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.drops = Counter("synchrony_drops", "items dropped (latest-wins video, late frames, …)",
                             ["stage"], registry=r)
        self.sync_checks = Counter("synchrony_sync_checks", "Level-3 checks, by verdict", ["ok"], registry=r)
        self.sync_pass_rate = Gauge("synchrony_sync_pass_rate", "Level-3 checks passed / checks", registry=r)
        self.stage_errors = Counter("synchrony_stage_errors", "stage failures that degraded a session",
                                    ["stage"], registry=r)
        self.cold_start = Gauge("synchrony_cold_start_seconds", "warm-up time per model and phase",
                                ["model", "phase"], registry=r)
        self.ready = Gauge("synchrony_ready", "1 once every model is loaded and has run once", registry=r)
        self.loop_lag = LoopLag()
        Gauge("synchrony_event_loop_lag_max_seconds", "longest event-loop stall in the last 10 s",
              registry=r).set_function(self.loop_lag.max_s)
        Gauge("synchrony_event_loop_stall_count", "event-loop stalls over 0.25 s since start",
              registry=r).set_function(lambda: self.loop_lag.stalls)
        self.stage_cpu = Counter("synchrony_stage_cpu_seconds", "CPU seconds per stage (per-thread kernel counters; "
                                 "app.live.cpu_account)", ["stage"], registry=r)
        self.capacity = Gauge("synchrony_capacity_sessions", "sessions this server admits, from its measured CPU "
                              "per session", registry=r)
        self.session_cost = Gauge("synchrony_session_cost_cores", "measured CPU per live session, in cores",
                                  registry=r)
        self.idle_cost = Gauge("synchrony_idle_cost_cores", "measured CPU of the process with no session, in cores",
                               registry=r)
        self.degradation = Gauge("synchrony_degradation_level", "steps of the overload degradation order in "
                                 "effect (0: none)", registry=r)
        self.lst_ttft = Histogram("synchrony_lst_ttft_seconds",
                                  "LST TTFT: responder request to first response token (pooled)",
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.lst_turn = Histogram("synchrony_lst_turn_latency_seconds",
                                  "turn latency: end of the user's speech to first response token (pooled)",
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.lst_itl = Histogram("synchrony_lst_itl_seconds", "inter-token interval within a response (pooled)",
                                 buckets=_ITL_BUCKETS, registry=r)
        self.voice_latency = Histogram("synchrony_voice_latency_seconds",
                                       "the user's end of speech to the answer's first audio sent (server side)",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.answers = Counter("synchrony_answers", "answers ended, by reason (done, barge_in, max_tokens, error)",
                               ["reason"], registry=r)
        self.barge_ins = Counter("synchrony_barge_ins", "answers the user spoke over (barge-in)", registry=r)
        self.answer_sync = Counter("synchrony_answer_sync_checks", "Level-3 checks of spoken answer words, "
                                   "by verdict", ["ok"], registry=r)
        self._checks = 0
        self._passed = 0
        self._stage_cpu_seen: dict[Stage, float] = {}
        # (wall, word end → token s, final): the overload signal's view of how late words are
        self._word_latency: deque[tuple[float, float, bool]] = deque(maxlen=4096)

    def observe_lst(self, timing: TokenTiming) -> None:
        """One emitted token's ``alignment.lst.TokenTiming``."""
        for hist, value in ((self.lst_ttft, timing.ttft_s), (self.lst_turn, timing.turn_s),
                            (self.lst_itl, timing.itl_s)):
            if value is not None:
                hist.observe(max(value, 0.0))

    def watch_lst(self, snapshot: Callable[[], LSTSnapshot | None]) -> None:
        """Export ``snapshot()`` (``LSTAggregate.snapshot``; None: no LST stage) as gauges at scrape time."""
        self.registry.register(_LSTCollector(snapshot))

    def observe_stage(self, stage: Stage, latency_s: float, compute_s: float | None = None) -> None:
        self.stage_latency.labels(stage).observe(max(latency_s, 0.0))
        if stage in (Stage.TOKEN_INTERIM, Stage.TOKEN_FINAL):
            self._word_latency.append((time.monotonic(), latency_s, stage == Stage.TOKEN_FINAL))
        if compute_s is not None:
            self.stage_compute.labels(stage).observe(max(compute_s, 0.0))

    def word_latency_median(self, window_s: float = 2.0) -> float:
        """The median word end → token latency of the tokens emitted in the last ``window_s`` (0: none).
        The median, not the maximum: a revised interim of an old word is one late token, not overload."""
        since = time.monotonic() - window_s
        recent = sorted(lat for wall, lat, _final in list(self._word_latency) if wall >= since)
        return recent[len(recent) // 2] if recent else 0.0

    def final_latency_high(self, window_s: float = 2.0) -> float:
        """The 90th percentile of word end → final latency over the finals of the last ``window_s`` (0: none).

        Finals, not interims: a caption is drawn from its final, so a final that comes later than
        the output delay (less the word's length) is a caption drawn late. Finals come once a word, so
        their tail is not one revised interim, and it shows captions turning late while the median of
        all tokens, interims included, still looks fine.
        """
        since = time.monotonic() - window_s
        recent = sorted(lat for wall, lat, final in list(self._word_latency) if final and wall >= since)
        return recent[min(len(recent) - 1, int(0.9 * len(recent)))] if recent else 0.0

    def drop(self, stage: str, n: int = 1) -> None:
        self.drops.labels(stage).inc(n)

    def sync(self, ok: bool) -> None:
        self.sync_checks.labels("true" if ok else "false").inc()
        self._checks += 1
        self._passed += int(ok)
        self.sync_pass_rate.set(self._passed / self._checks)

    def stage_cpu_totals(self, totals: dict[Stage, float]) -> None:
        """Advance the per-stage CPU counters to ``totals`` (monotone CPU seconds per stage)."""
        for stage, total in totals.items():
            delta = total - self._stage_cpu_seen.get(stage, 0.0)
            if delta > 0:
                self.stage_cpu.labels(stage).inc(delta)
                self._stage_cpu_seen[stage] = total

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


#: snapshot key (ms) → gauge name (s) and help; ``tier`` is exported as a rank (0 none … 3 gold).
_LST_GAUGES = (
    ("ttft_ms_p99", "synchrony_lst_ttft_p99_seconds", "LST TTFT p99 (request written to first content read)"),
    ("ttft_ms_p50", "synchrony_lst_ttft_p50_seconds", "LST TTFT p50 (request written to first content read)"),
    ("turn_ms_p50", "synchrony_lst_turn_latency_p50_seconds", "turn latency p50 (end of speech to first token)"),
    ("turn_ms_p95", "synchrony_lst_turn_latency_p95_seconds", "turn latency p95 (end of speech to first token)"),
    ("itl_ms_max", "synchrony_lst_itl_max_seconds", "longest inter-token interval"),
    ("jitter_ms", "synchrony_lst_jitter_seconds", "worst inter-token jitter sigma over 8 intervals"),
    ("hold_ms_p99", "synchrony_lst_turn_hold_p99_seconds", "turn-hold p99 (first content read to first token shown)"),
)
#: snapshot key (a share, 0..1) → gauge name and help.
_LST_SHARES = (
    ("seq_integrity", "synchrony_lst_seq_integrity", "SEQ-Integrity: share of answers that kept every rule"),
    ("prefetch_waste", "synchrony_lst_prefetch_waste", "share of prefetched requests discarded"),
)


class _LSTCollector(Collector):
    """LST gauges from the aggregate's snapshot: pooled (no label) and per live session (``session``)."""

    def __init__(self, snapshot: Callable[[], LSTSnapshot | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from alignment.lst import tier_rank

        snap = self._snapshot()
        if snap is None:
            return
        sessions = snap.get("per_session", {})
        for key, name, doc in _LST_GAUGES:
            pooled = GaugeMetricFamily(name, doc + ", pooled over sessions")
            if snap.get(key) is not None:
                pooled.add_metric([], snap[key] / 1000.0)
            yield pooled
            per = GaugeMetricFamily(name.replace("synchrony_lst_", "synchrony_lst_session_"), doc + ", per session",
                                    labels=["session"])
            for sid, s in sessions.items():
                if s.get(key) is not None:
                    per.add_metric([sid], s[key] / 1000.0)
            yield per
        for key, name, doc in _LST_SHARES:
            share = GaugeMetricFamily(name, doc + ", pooled over sessions")
            if snap.get(key) is not None:
                share.add_metric([], snap[key])
            yield share
        tier = GaugeMetricFamily("synchrony_lst_tier", "LST tier reached: 0 none, 1 bronze, 2 silver, 3 gold")
        tier.add_metric([], tier_rank(snap["tier"]))
        yield tier
        per_tier = GaugeMetricFamily("synchrony_lst_session_tier", "LST tier per session (0 none … 3 gold)",
                                     labels=["session"])
        for sid, s in sessions.items():
            per_tier.add_metric([sid], tier_rank(s["tier"]))
        yield per_tier
