"""Admission: how many sessions the server takes now, and the once-a-second measurement behind it.

Each second the CPU per stage goes to ``/metrics``, the measured CPU per session updates the
capacity (``app.live.cpu_account``), and the overload signal moves the degradation level
(``app.live.degrade``), whose ASR step reaches the shared worker at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from app.live.config import ServerConfig
from app.live.cpu_account import Capacity, CapacityEstimate, CpuAccount, SpareCores
from app.live.degrade import FINAL_SHARE_OF_DELAY, ORDER, Degradation, OverloadSignal
from app.live.server_metrics import ServerMetrics

if TYPE_CHECKING:
    from models.asr import ASRWorker

log = logging.getLogger("synchrony.server")


class Admission:
    """The server's CPU account, capacity estimate and degradation level, and the limit they set."""

    def __init__(self, config: ServerConfig, metrics: ServerMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.account = CpuAccount()
        self.spare = SpareCores()
        self.capacity = CapacityEstimate(config.session_cost_cores, target_utilisation=config.target_utilisation,
                                         max_sessions=config.max_sessions)
        self.current: Capacity = self.capacity.current()
        self.degradation = Degradation(enabled=config.degrade, floor=config.shed_steps)
        self._asr_step_s: float | None = None  # the ASR step last given to the worker (None: configured)

    def measure(self, live: int, worker: ASRWorker | None) -> None:
        """Once a second, with ``live`` sessions: CPU per stage into /metrics, and the capacity
        admission uses."""
        metrics = self.metrics
        metrics.stage_cpu_totals(self.account.sample())
        now = self.current = self.capacity.update(live)
        spare = self.spare.sample(self.capacity.rate, self.capacity.cores)
        backlog = worker.stats().oldest_wait_s if worker is not None else 0.0
        before = self.degradation.level
        signal = None
        if live:
            signal = OverloadSignal(self.capacity.rate, self.capacity.cores, backlog, metrics.word_latency_median(),
                                    metrics.final_latency_high(), FINAL_SHARE_OF_DELAY * self.config.output_delay_s,
                                    spare or 0.0)
            level = self.degradation.update(signal, time.monotonic())
        else:  # no session has work to shed (the CPU is the warm-up's, or another process's): none is shed
            level = self.degradation.reset(time.monotonic())
        if level != before:
            log.warning("degradation level %d -> %d (%s); overload: %s", before, level,
                        ", ".join(ORDER[:level]) or "none", "; ".join(signal.why() if signal else []) or "none")
        step_s = self.degradation.effects.asr_step_s
        if worker is not None and step_s != self._asr_step_s:  # a level change, or the floor's at start
            worker.set_step_s(step_s)
            self._asr_step_s = step_s
        metrics.degradation.set(level)
        metrics.capacity.set(self.limit(live))
        metrics.session_cost.set(now.cost_cores)
        metrics.idle_cost.set(now.idle_cores)

    def limit(self, live: int) -> int:
        """Sessions admitted now. Measured: none beyond the ``live`` ones while the server sheds work
        under overload (beyond its floor), since a starved process also under-measures its cost per session."""
        limit = self.config.max_sessions
        if self.config.admission != "fixed":
            limit = min(limit, self.current.sessions)
            if self.degradation.overloaded:
                limit = min(limit, live)
        return limit

    def full(self, limit: int) -> str:
        """Why the server is full at ``limit`` sessions, for the 503's message."""
        if self.degradation.overloaded:
            return "shedding work under overload"
        return "max_sessions" if limit == self.config.max_sessions else "measured capacity"

    def readiness(self) -> dict[str, object]:
        """The admission and degradation parts of ``/readyz``."""
        level = self.degradation.level
        return {"admission": {"mode": self.config.admission, **asdict(self.current)},
                "degradation": {"level": level, "steps": list(ORDER[:level]), "order": list(ORDER),
                                "floor": self.degradation.floor}}
