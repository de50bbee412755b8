"""What a live server holds right now: memory, threads, tasks, sessions, ASR streams and queue depths.

Leaks and growing queues only show when the same figures are taken before and after (connect/
disconnect cycles, a vanished peer, a long lossy soak). ``snapshot(app)`` takes them from a running
``app.live.server`` app; it must run on the app's event loop (it counts that loop's asyncio tasks).
``bench/soak.py`` exposes it on a debug route of its own server process; the tests call it in-process.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal, Protocol

from alignment.json_types import JsonObject

if TYPE_CHECKING:
    import ctypes

    from aiortc import RTCDataChannel
    from fastapi import FastAPI


@dataclass(frozen=True)
class ResourceSnapshot:
    """One reading; every count is over the whole process (server, and peers if they share it)."""

    wall: float
    rss_mb: float
    threads: int
    thread_names: tuple[str, ...]
    tasks: int
    fds: int
    sessions: int
    asr_streams: int
    asr_queue_chunks: int  # audio chunks waiting for the ASR worker, all sessions
    asr_queued_s: float
    asr_dropped_s: float
    camera_frames: int  # decoded camera frames held for rendering, all sessions
    tokens_held: int  # tokens kept for captions, all sessions
    frame_words: int  # output frames with words still to draw, all sessions
    channel_buffered: int  # bytes queued on the sessions' events channels

    def as_dict(self) -> JsonObject:
        d = asdict(self)
        d["thread_names"] = list(self.thread_names)
        return d


class LoopLag:
    """How late an event loop wakes a timer: every real-time job on that loop (RTP, SCTP, ICE) waits as long.

    A CPU-bound call on the loop, or a loop starved of the GIL, shows here before it shows as late
    words, frozen video or ICE consent failures.
    """

    def __init__(self, window_s: float = 10.0, stall_s: float = 0.25) -> None:
        self.window_s = window_s
        self.stall_s = stall_s
        self.stalls = 0  # wake-ups later than stall_s, since start
        self._worst: deque[tuple[float, float]] = deque()  # (wall, lag), lags decreasing: [0] is the max

    def max_s(self, now: float | None = None) -> float:
        """Longest stall in the last ``window_s`` seconds."""
        now = time.monotonic() if now is None else now
        while self._worst and now - self._worst[0][0] > self.window_s:
            self._worst.popleft()
        return self._worst[0][1] if self._worst else 0.0

    def record(self, lag_s: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if lag_s > self.stall_s:
            self.stalls += 1
        while self._worst and self._worst[-1][1] <= lag_s:
            self._worst.pop()
        self._worst.append((now, lag_s))

    async def watch(self, period_s: float = 0.1) -> None:
        """Sample the running loop until cancelled."""
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(period_s)
            now = time.monotonic()
            self.record(max(now - t0 - period_s, 0.0), now)


def lower_thread_priority(nice: int) -> bool:
    """Raise the calling thread's nice value by ``nice``; threads it starts from now on inherit it.

    On Linux nice is per thread. A session's face analysis is latest-wins (it skips frames it had no
    time for), the ASR and the event loop are not: when the cores are short, the kernel should take
    from the former. False where the platform has no per-thread priority.
    """
    if nice <= 0 or not hasattr(os, "setpriority"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except OSError:
        return False
    return True


def rss_mb() -> float:
    """Resident set size of this process in MB (from /proc, no dependency)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


_LIBC: ctypes.CDLL | Literal[False] | None = None
_M_ARENA_MAX = -8  # mallopt parameter (glibc malloc.h)


def _libc() -> ctypes.CDLL | Literal[False]:
    """glibc via ctypes, or False where it is not there (musl, macOS)."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
            _LIBC.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC


def bound_native_memory(arenas: int = 2, onednn_cache: int = 32) -> bool:
    """Bound two native memory pools that grew with the number of sessions served; call it before
    the server loads models or starts threads (``synchrony serve`` does). Returns False where glibc
    is not there (the arena cap then does nothing).

    * glibc gives each contending thread its own malloc arena; short sessions' codec, AU, ASR and
      executor threads land in ever different arenas, each keeping its freed pages fragmented. Two
      arenas (as ``MALLOC_ARENA_MAX=2``) keep the baseline low and flat after warm-up.
    * oneDNN caches a compiled primitive per input shape; Whisper's window lengths vary continuously,
      so the cache fills with shapes that rarely come back (the encoder's activations, the decoder's
      matmuls) and holds them until it is full. 32 entries cost no measurable ASR CPU; each entry
      kept costs memory. An explicit ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` wins.

    The figures behind both choices (bench/soak.py) are in docs/benchmarks-history.md.
    """
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(onednn_cache))
    libc = _libc()
    return bool(libc) and libc.mallopt(_M_ARENA_MAX, arenas) == 1


def release_memory() -> bool:
    """Hand freed heap back to the OS (glibc ``malloc_trim``); False where that is not available.

    Each session's threads (AU worker, aiortc codecs) allocate in glibc arenas; when the session
    ends the memory is free but stays in the process, so RSS ratchets up session after session
    (measured: ~8 MB per session, all of it returned by one trim). Call it off the event loop.
    """
    libc = _libc()
    if not libc:
        return False
    libc.malloc_trim(0)
    return True


def heap_mb() -> dict[str, float] | None:
    """glibc's heap summed over its arenas (``mallinfo2``), MB: a rise in ``in_use_mb`` is live native
    memory, in ``free_mb`` the allocator's retention. Tells a leak from fragmentation when RSS grows;
    None where glibc 2.33+ is not there."""
    libc = _libc()
    mallinfo2 = getattr(libc, "mallinfo2", None) if libc else None
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _mallinfo2_type()
    m = mallinfo2()
    return {"in_use_mb": round(m.uordblks / 1e6, 2), "free_mb": round(m.fordblks / 1e6, 2),
            "mmapped_mb": round(m.hblkhd / 1e6, 2), "arena_mb": round(m.arena / 1e6, 2)}


@lru_cache(maxsize=1)
def _mallinfo2_type() -> type:
    """glibc's ``struct mallinfo2`` (malloc.h): ten ``size_t`` fields."""
    import ctypes

    names = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    return type("MallInfo2", (ctypes.Structure,), {"_fields_": [(n, ctypes.c_size_t) for n in names]})


def freeze_warm_heap() -> None:
    """After warm-up: hide the loaded models' objects from the cyclic collector (``gc.freeze``).

    A full collection over the ~450k model objects takes ~0.4 s; frozen, it scans only what
    sessions created since, in milliseconds, so ``reclaim`` can run after every session.
    """
    gc.collect()
    gc.freeze()


def reclaim() -> None:
    """After a session ends: free its cyclic garbage (aiortc's peer-connection graph, codec contexts)
    now rather than at some later full collection, then hand the freed heap back to the OS."""
    gc.collect()
    release_memory()


def _fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


class HoldsMemory(Protocol):
    """What a snapshot reads off a live session (app.live.session.Session)."""

    channel: RTCDataChannel | None  # None until the client opens it

    def held(self) -> tuple[int, int, int]: ...


def snapshot(app: FastAPI, collect: bool = False, trim: bool = False) -> ResourceSnapshot:
    """Read the figures off a running app (``collect``: collect garbage; ``trim``: then trim the heap).

    RSS without ``trim`` is what the OS sees; with it, memory the allocator merely retains is gone,
    so a growth that survives a trim is held by live objects (a leak), one that does not is retention.
    """
    if collect or trim:
        gc.collect()
    if trim:
        release_memory()
    sessions: dict[str, HoldsMemory] = dict(getattr(app.state, "sessions", {}))
    warm = getattr(app.state, "warm", None)
    worker = getattr(getattr(warm, "stages", None), "asr_worker", None)
    streams = queue = 0
    queued = dropped = 0.0
    if worker is not None and hasattr(worker, "stats"):
        st = worker.stats()
        streams, queue, queued, dropped = st.streams, st.queue_depth, st.queued_s, st.dropped_s
    camera = tokens = frame_words = buffered = 0
    for s in sessions.values():
        held = s.held()
        camera, tokens, frame_words = camera + held[0], tokens + held[1], frame_words + held[2]
        if s.channel is not None:
            buffered += int(s.channel.bufferedAmount or 0)
    names = tuple(sorted(t.name for t in threading.enumerate()))
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # not on a running loop
        tasks = -1
    return ResourceSnapshot(
        wall=time.monotonic(), rss_mb=round(rss_mb(), 2), threads=len(names), thread_names=names, tasks=tasks,
        fds=_fds(), sessions=len(sessions), asr_streams=streams, asr_queue_chunks=queue,
        asr_queued_s=round(queued, 3), asr_dropped_s=round(dropped, 3), camera_frames=camera,
        tokens_held=tokens, frame_words=frame_words, channel_buffered=buffered,
    )


_teardown_log = logging.getLogger("app.live.teardown")


def quiet_closed_transport_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log aiortc's "not connected" task errors after a peer left at debug level, not as tracebacks.

    aiortc sends DataChannel data from fire-and-forget tasks; one that runs after the peer's DTLS
    transport closed fails with ``ConnectionError`` and nothing retrieves it, so asyncio logs a
    traceback for an ordinary disconnect. Every other exception keeps the loop's own handling.
    """
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        if isinstance(exc, ConnectionError) and "not connected" in str(exc):
            _teardown_log.debug("a task sent on a closed transport: %s", exc)
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
