"""Where the server's CPU goes, per stage, and how many sessions it can therefore admit.

A sampling profiler cannot answer "CPU per stage": MediaPipe and libvpx compute on native threads
that Python never sees, and a thread blocked in native code looks busy to it. The kernel can: it
keeps CPU time per thread (``/proc/self/task/<tid>/stat``). :class:`CpuAccount` reads that about once
a second, names each thread's stage (by its Python thread name, or, for native threads, by the
name they inherited from the thread that started them: see :func:`name_native_thread`) and adds
the deltas up, so the CPU of threads that have since ended is kept.

:class:`CapacityEstimate` turns the measured process CPU into the number of sessions to admit:
the cores this process may use, times a target utilisation, over the measured CPU per session
(the process's CPU rate above its idle rate, divided by the live sessions, smoothed). Until a
session has been measured it uses ``prior_cost_cores``, a figure measured with
``bench/capacity.py`` on this machine kind; the live measurement replaces it as sessions run.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.live.stages import Stage

if TYPE_CHECKING:
    import psutil

#: Stage of a thread, by the start of its name (Python name first, then the native ``comm``).
STAGE_BY_PREFIX: tuple[tuple[str, Stage], ...] = (
    ("au-", Stage.FACES),  # a session's face analysis thread: MediaPipe + the LSTM controller ...
    ("drishti", Stage.FACES),  # ... and MediaPipe's graph threads (it names them itself)
    ("asr-", Stage.ASR),  # VAD + streaming Whisper lanes (threads, or child processes named ``asr-lane``)
    ("render", Stage.RENDER),  # camera conversion + overlay of the returned video
    ("asyncio_", Stage.VP8_ENCODE),  # the default executor: aiortc encodes the returned video there
    ("video-decoder", Stage.VP8_DECODE),  # aiortc's decoder threads: the camera ...
    ("audio-decoder", Stage.OPUS_DECODE),  # ... and the microphone
    ("MainThread", Stage.EVENT_LOOP),  # aiortc RTP/RTCP/SRTP/SCTP, events, pacing, per-packet session work
)
#: ``other``: threads of no stage above; ``unattributed``: threads that started and ended between samples.
STAGES: tuple[Stage, ...] = tuple(dict.fromkeys(s for _, s in STAGE_BY_PREFIX)) + (Stage.OTHER, Stage.UNATTRIBUTED)
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def name_native_thread(name: str) -> bool:
    """Give the calling OS thread a name (15 bytes; Linux ``prctl``): threads it starts from now on
    inherit it, which is how MediaPipe's and torch's native threads are told apart. False elsewhere."""
    from app.live.reliability import _libc

    libc = _libc()
    if not libc:
        return False
    try:
        return libc.prctl(15, name.encode()[:15] + b"\0", 0, 0, 0) == 0  # PR_SET_NAME
    except (AttributeError, OSError):
        return False


def stage_of(python_name: str | None, comm: str) -> Stage:
    """The stage a thread's CPU counts toward: by its Python name, else by its native name (a native
    or executor thread started by a named thread carries that thread's name)."""
    for name in (python_name, comm):
        if name:
            for prefix, stage in STAGE_BY_PREFIX:
                if name.startswith(prefix):
                    return stage
    return Stage.OTHER


#: How often the list of child processes is rebuilt. Finding them reads every process's
#: ``/proc/<pid>/stat`` on the machine; reading the known ones is one file each.
CHILDREN_RESCAN_S = 10.0


class _ChildProcesses:
    """This process's child processes, found again at most every ``CHILDREN_RESCAN_S`` (or once
    one of them has ended)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scanned = -math.inf
        self._procs: list[psutil.Process] = []

    def get(self) -> list[psutil.Process]:
        import psutil

        with self._lock:
            now = time.monotonic()
            if now - self._scanned >= CHILDREN_RESCAN_S:
                try:
                    self._procs = psutil.Process().children(recursive=True)
                except psutil.Error:
                    self._procs = []
                self._scanned = now
            return list(self._procs)

    def ended(self) -> None:
        self._scanned = -math.inf


_KIDS = _ChildProcesses()


def _children() -> list[tuple[int, str, float]]:
    """(pid, comm, user+system seconds) of this process's ASR lane processes (children named ``asr-lane``;
    others, such as a test's own load generators, are not the server's). A child started since the
    last scan counts from the next one, with all its CPU so far."""
    import psutil

    out = []
    for kid in _KIDS.get():
        try:
            with kid.oneshot():
                name = kid.name()
                if name.startswith("asr-lane"):
                    t = kid.cpu_times()
                    out.append((kid.pid, name, t.user + t.system))
        except psutil.Error:
            _KIDS.ended()
    return out


def _thread_cpu_s(tid: int) -> tuple[str, float] | None:
    """(comm, user+system seconds) of one thread of this process, None if it has ended."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    comm = raw[raw.find("(") + 1 : raw.rfind(")")]
    fields = raw[raw.rfind(")") + 2 :].split()
    return comm, (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (fields 14, 15)


class CpuAccount:
    """CPU seconds per stage since it started (monotone), from per-thread kernel counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[int, float] = {}  # tid -> CPU seconds at the last sample
        self.totals: dict[Stage, float] = dict.fromkeys(STAGES, 0.0)
        self.available = os.path.isdir("/proc/self/task")

    def sample(self) -> dict[Stage, float]:
        """Add every thread's CPU since the last sample to its stage; returns the totals."""
        if not self.available:
            return dict(self.totals)
        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        with self._lock:
            seen: dict[int, float] = {}
            for pid, comm, cpu in _children():  # a whole child process counts as one thread (key: -pid)
                seen[-pid] = cpu
                delta = cpu - self._last.get(-pid, 0.0)
                if delta > 0:
                    self.totals[stage_of(None, comm)] += delta
            for entry in os.listdir("/proc/self/task"):
                tid = int(entry)
                got = _thread_cpu_s(tid)
                if got is None:
                    continue
                comm, cpu = got
                seen[tid] = cpu
                delta = cpu - self._last.get(tid, 0.0)
                if delta > 0:
                    stage = stage_of(names.get(tid), comm)
                    self.totals[stage] += delta
            self._last = seen
            attributed = sum(v for k, v in self.totals.items() if k != Stage.UNATTRIBUTED)
            self.totals[Stage.UNATTRIBUTED] = max(process_cpu_s() - attributed,
                                                  self.totals[Stage.UNATTRIBUTED])
            return dict(self.totals)


def process_cpu_s() -> float:
    """CPU seconds of this process and its live child processes (the ASR lanes) so far, user + system."""
    t = os.times()
    return t.user + t.system + sum(cpu for _, _, cpu in _children())


def usable_cores() -> float:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota if one is set."""
    cores = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max":
            cores = min(cores, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return cores


def _cpu_ticks(cpus: frozenset[int]) -> tuple[int, int]:
    """(idle, total) clock ticks of ``cpus`` so far, from /proc/stat (idle includes I/O wait)."""
    idle = total = 0
    with open("/proc/stat") as fh:
        for line in fh:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
                continue
            ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            idle += ticks[3] + ticks[4]
            total += sum(ticks)
    return idle, total


class SpareCores:
    """Cores this process could have used but nobody did, since the last :meth:`sample`: the idle share of
    the CPUs it may run on (every process's work counts, so a neighbour taking them shows), capped by what
    its cgroup quota left it. None where /proc/stat cannot be read, or on the first call."""

    def __init__(self) -> None:
        self.cpus = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
        self._last: tuple[int, int] | None = None

    def sample(self, own_rate: float, usable: float) -> float | None:
        """``own_rate``: this process's CPU (cores) over the same interval; ``usable``: :func:`usable_cores`."""
        try:
            ticks = _cpu_ticks(self.cpus)
        except (OSError, ValueError):
            return None
        last, self._last = self._last, ticks
        if last is None or ticks[1] <= last[1]:
            return None
        idle = (ticks[0] - last[0]) / (ticks[1] - last[1]) * len(self.cpus)
        return max(min(idle, usable - own_rate), 0.0)


@dataclass(frozen=True)
class Capacity:
    """What admission decides from: the sessions to admit and the figures they come from."""

    sessions: int  # admit while live sessions are fewer than this
    cost_cores: float  # CPU per session (cores), measured (or the prior until measured)
    idle_cores: float  # the process's CPU with no session
    measured: bool  # False while ``cost_cores`` is still the prior
    cores: float
    target_utilisation: float


class CapacityEstimate:
    """Sessions this server admits, from its measured CPU per session (see the module docstring).

    ``update(sessions)`` is called about once a second with the live session count. The per-session
    cost is an exponential average (time constant ``tau_s``, starting from the prior) of
    (CPU rate − idle rate) / sessions over intervals in which the session count did not change; the
    idle rate is the same average over intervals with no session. It counts as measured once
    ``tau_s`` session-seconds went into it.
    """

    def __init__(self, prior_cost_cores: float, cores: float | None = None, target_utilisation: float = 0.85,
                 max_sessions: int = 64, tau_s: float = 20.0, clock: Callable[[], float] = time.monotonic,
                 cpu: Callable[[], float] = process_cpu_s) -> None:
        if prior_cost_cores <= 0 or not 0 < target_utilisation <= 1 or max_sessions < 1:
            raise ValueError("prior_cost_cores > 0, 0 < target_utilisation <= 1 and max_sessions >= 1")
        self.cores = cores if cores is not None else usable_cores()
        self.target = target_utilisation
        self.max_sessions = max_sessions
        self.tau_s = tau_s
        self._clock, self._cpu = clock, cpu
        self.cost = prior_cost_cores
        self.idle = 0.0
        self.measured = False
        self._session_s = 0.0  # session-seconds folded into the cost
        self.rate = 0.0  # the process's CPU (cores) over the last interval
        self._last: tuple[float, float, int] | None = None  # (time, cpu, sessions)

    def update(self, sessions: int) -> Capacity:
        """Fold in the CPU used since the last call (during which ``sessions`` were live)."""
        now, cpu = self._clock(), self._cpu()
        last = self._last
        self._last = (now, cpu, sessions)
        if last is not None and last[2] == sessions and now - last[0] > 0.2:
            dt = now - last[0]
            rate = max(cpu - last[1], 0.0) / dt
            self.rate = rate
            w = 1.0 - math.exp(-dt / self.tau_s)
            if sessions == 0:
                self.idle += w * (rate - self.idle)
            else:
                per = max(rate - self.idle, 0.0) / sessions
                self.cost += w * (per - self.cost)
                self._session_s += dt * sessions
                self.measured = self._session_s >= self.tau_s
        return self.current()

    def current(self) -> Capacity:
        budget = max(self.cores * self.target - self.idle, 0.0)
        n = int(budget / max(self.cost, 1e-3))
        return Capacity(sessions=max(1, min(n, self.max_sessions)), cost_cores=round(self.cost, 4),
                        idle_cores=round(self.idle, 4), measured=self.measured, cores=self.cores,
                        target_utilisation=self.target)
