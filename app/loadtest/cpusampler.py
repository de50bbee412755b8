"""CPU of the server's process tree and of the load-test workers during a round, and the server's
degradation level: the report shows the client's cost next to the server's so the reader can judge."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.loadtest import metrics as lm

if TYPE_CHECKING:
    import psutil

#: One CPU sample: (s since the round started, server tree %, load-test workers %, whole machine %).
CpuSample = tuple[float, float | None, float, float]


@dataclass(frozen=True)
class SteadyCpu(lm.Record):
    """Mean CPU % (100 = one core) over the samples taken with every session live (see :func:`steady_cpu`)."""

    samples: int
    cores: int
    server: float | None
    clients: float
    machine: float


class CpuSampler:
    """Samples CPU % of the server process tree and of the load-test workers every ``period_s``."""

    def __init__(self, server_pid: int | None, period_s: float = 0.5, max_samples: int = 20_000,
                 readyz_url: str | None = None) -> None:
        """``readyz_url``: also record the server's degradation level (``/readyz``) once a second."""
        import psutil

        self._psutil = psutil
        self.server = psutil.Process(server_pid) if server_pid else None
        self.workers: list[psutil.Process] = []
        self.period_s = period_s
        self.max_samples = max_samples
        self.samples: list[CpuSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._t0 = time.monotonic()
        self._tree: dict[int, psutil.Process] = {}
        self.readyz_url = readyz_url
        self.degradation: list[tuple[float, int]] = []  # (t, level) whenever the level changed
        self.sessions: list[tuple[float, int]] = []  # (t, live sessions) whenever the count changed

    def _tree_percent(self) -> float | None:
        if self.server is None:
            return None
        try:
            procs = [self.server, *self.server.children(recursive=True)]
        except self._psutil.Error:
            return None
        total = 0.0
        for p in procs:
            cached = self._tree.setdefault(p.pid, p)
            with contextlib.suppress(self._psutil.Error):
                total += cached.cpu_percent(None)
        return total

    def _workers_percent(self) -> float:
        total = 0.0
        for p in self.workers:
            with contextlib.suppress(self._psutil.Error):
                total += p.cpu_percent(None)
        return total

    def _run(self) -> None:
        self._tree_percent()
        self._psutil.cpu_percent(None)
        while not self._stop.wait(self.period_s) and len(self.samples) < self.max_samples:
            self.samples.append((round(time.monotonic() - self._t0, 2), lm.round_or_none(self._tree_percent(), 1),
                                 round(self._workers_percent(), 1), self._psutil.cpu_percent(None)))
            if self.readyz_url and len(self.samples) % max(int(round(1.0 / self.period_s)), 1) == 0:
                self._poll_degradation()

    def _poll_degradation(self) -> None:
        """The server's degradation level and live sessions (``/readyz``), kept where they change."""
        import httpx

        try:
            body = httpx.get(self.readyz_url, timeout=1.0).json()
            level, live = body.get("degradation", {}).get("level"), body.get("sessions")
        except (httpx.HTTPError, ValueError, AttributeError):
            return
        t = round(time.monotonic() - self._t0, 1)
        if isinstance(level, int) and (not self.degradation or self.degradation[-1][1] != level):
            self.degradation.append((t, level))
        if isinstance(live, int) and (not self.sessions or self.sessions[-1][1] != live) and len(self.sessions) < 1000:
            self.sessions.append((t, live))

    def add_worker(self, pid: int) -> None:
        with contextlib.suppress(self._psutil.Error):
            p = self._psutil.Process(pid)
            p.cpu_percent(None)
            self.workers.append(p)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> list[CpuSample]:
        self._stop.set()
        self._thread.join(timeout=5)
        return list(self.samples)


def steady_cpu(cpu: list[CpuSample], sessions: list[tuple[float, int]], n: int) -> SteadyCpu | None:
    """Mean CPU % (100 = one core) of the server's process tree, the load-test workers and the whole
    machine over the samples taken while at least ``n`` sessions were live (the server's ``/readyz``,
    polled once a second); None without such a sample.

    The steady part of a round: a mean over the whole round takes in the clips being built before
    the peers connect and the teardown after, and waters the server's figure down by a third or more.
    """
    steady = []
    for sample in cpu:
        live = [k for t, k in sessions if t <= sample[0]]
        if n and live and live[-1] >= n:
            steady.append(sample)
    if not steady:
        return None
    server = [s[1] for s in steady if s[1] is not None]
    cores = os.cpu_count() or 1
    return SteadyCpu(len(steady), cores, round(sum(server) / len(server), 1) if server else None,
                     round(sum(s[2] for s in steady) / len(steady), 1),
                     round(sum(s[3] for s in steady) / len(steady) * cores, 1))
