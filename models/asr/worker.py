"""The cross-session ASR scheduler: many sessions' streams on a few worker threads.

Bounded per-session audio queues (a full queue drops the oldest audio and counts it),
earliest-deadline-first scheduling on ``lanes`` worker threads (a model copy each), an async event
stream per session. With ``processes=True`` each lane decodes in a child process of its own
(:class:`ProcessLane`): a decode makes thousands of short torch calls, each of which gives up and
retakes the interpreter lock, so decoding in the server's process makes every other thread (the
event loop's RTP work above all) queue behind it for the lock and for a core; a child has its own lock.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import numpy as np
from whisper.model import Whisper

from alignment.espeak import EspeakUnavailable, synthesize_speech
from alignment.forced import warm_this_thread
from alignment.types import SAMPLE_RATE, AudioChunk
from models.asr.engine import Engine, WhisperEngine, get_engine
from models.asr.lanes import InLaneProcesses, ProcessLane, feed_turn, on_each_lane, warm_stream
from models.asr.streaming import ASREvent, StreamingASR, StreamingConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerStats:
    """A snapshot of the worker: queued audio, drops, decode cost."""

    streams: int
    queue_depth: int  # chunks waiting, all streams
    queued_s: float  # audio seconds waiting, all streams
    dropped_chunks: int
    dropped_s: float
    decodes: int
    decode_ms_mean: float
    decode_ms_last: float
    events_dropped: int
    oldest_wait_s: float = 0.0  # how long the oldest due audio no lane has taken yet has waited (0: none)
    turns: int = 0  # lane turns taken (a stream's audio handed to a lane): about one a decode, not one a chunk


class ASRStream:
    """One session's handle on an :class:`ASRWorker` (create with ``worker.open(session_id)``): its audio
    queue, its events and its recogniser's config; the recogniser is the lane's (see :class:`ASRWorker`)."""

    def __init__(self, cond: threading.Condition, session_id: str, config: StreamingConfig, max_queue_s: float,
                 max_events: int, loop: asyncio.AbstractEventLoop | None) -> None:
        self._cond = cond  # the worker's: it guards the queue and wakes a lane
        self.session_id = session_id
        #: the recogniser's settings (``ASRWorker.set_step_s`` changes the step); the recogniser itself
        #: lives where the stream is decoded: the worker's lane threads, or its lane process
        self.config = config
        self.max_queue_s = max_queue_s
        self._max_queue_n = int(round(max_queue_s * SAMPLE_RATE))  # samples, so no float drift
        self._chunks: deque[AudioChunk] = deque()
        self._queued_n = 0
        self.dropped_chunks = 0
        self._dropped_n = 0
        self.events_dropped = 0
        self._loop = loop
        self._events: asyncio.Queue[ASREvent | None] = asyncio.Queue(maxsize=max_events)
        self.closed = False
        self.finished = False
        self.busy = False  # a worker lane is feeding it (lanes never feed one stream at once)
        self.lane: int | None = None  # the one lane that may feed it (process lanes keep its state), else any
        # Audio ending before this pts cannot change the recogniser's output (StreamingASR.quiet_until):
        # it is held, not handed to a lane, until a chunk reaching past it (or a gap, or the close) comes.
        self.quiet_until = -float("inf")
        self._arrived: deque[float] = deque()  # when each queued chunk came (monotonic), beside _chunks
        self._end: float | None = None  # pts just after the last chunk pushed
        # monotonic time its oldest due audio (or close) arrived; inf: nothing due (nothing queued, or all held)
        self.waiting_since = float("inf")

    # Called on the event loop (or any thread): never blocks.
    def push(self, chunk: AudioChunk) -> None:
        """Queue audio for recognition; a full queue drops the oldest audio and counts it."""
        if self.closed:
            raise RuntimeError(f"ASR stream {self.session_id!r} is closed")
        with self._cond:
            now = time.monotonic()
            gap = self._end is not None and abs(chunk.pts - self._end) > 0.5 / SAMPLE_RATE
            self._end = chunk.end
            self._chunks.append(chunk)
            self._arrived.append(now)
            self._queued_n += len(chunk.samples)
            while self._queued_n > self._max_queue_n and len(self._chunks) > 1:
                old = self._chunks.popleft()
                self._arrived.popleft()
                self._queued_n -= len(old.samples)
                self.dropped_chunks += 1
                self._dropped_n += len(old.samples)
            # While a lane feeds it the recogniser's quiet_until moves on: ``recheck`` decides then.
            if not self.busy and not self.due and (gap or chunk.end >= self.quiet_until):
                self.waiting_since = now
                self._wake()

    def _held(self) -> int:
        """How many queued chunks, from the oldest, end before ``quiet_until`` (under the lock)."""
        n = 0
        for c in self._chunks:
            if c.end >= self.quiet_until:
                break
            n += 1
        return n

    def recheck(self, quiet_until: float) -> None:
        """After a lane's turn (under the lock): the recogniser's new ``quiet_until``; audio that came
        meanwhile and reaches past it is due from when it came."""
        self.quiet_until = quiet_until
        if self.due:
            return
        held = self._held()
        if held < len(self._chunks):
            self.waiting_since = self._arrived[held]

    def _wake(self) -> None:
        """Wake a lane (under the lock): any one, or every one when only the pinned lane may take it."""
        if self.lane is None:
            self._cond.notify()
        else:
            self._cond.notify_all()

    @property
    def dropped_s(self) -> float:
        """Seconds of audio this stream's full queue has dropped."""
        return self._dropped_n / SAMPLE_RATE

    # Read by the worker under its lock.
    @property
    def queued_chunks(self) -> int:
        """Chunks waiting for a lane."""
        return len(self._chunks)

    @property
    def queued_samples(self) -> int:
        """Samples waiting for a lane."""
        return self._queued_n

    @property
    def dropped_samples(self) -> int:
        """Samples this stream's full queue has dropped (counted in samples, so no float drift)."""
        return self._dropped_n

    def close(self) -> None:
        """No more audio: the worker flushes this stream, then the event iterator ends."""
        with self._cond:
            self.closed = True
            self.waiting_since = min(self.waiting_since, time.monotonic())
            self._wake()

    async def events(self) -> AsyncIterator[ASREvent]:
        """Every event of this stream until it is closed and flushed."""
        while True:
            ev = await self._events.get()
            if ev is None:
                return
            yield ev

    @property
    def due(self) -> bool:
        """Audio (or the close) waits for a lane: something is queued that is not held, or it is closing."""
        return self.waiting_since != float("inf")

    @property
    def settled(self) -> bool:
        """No lane is feeding it and none has audio of it to take: what is queued (if anything) is held."""
        return not self.busy and not self.due

    def take(self, max_chunks: int) -> tuple[list[AudioChunk], int]:
        """The oldest queued chunks, at most ``max_chunks``, and how many of them, from the first, were
        held (the worker calls it under its lock)."""
        held = self._held()
        out: list[AudioChunk] = []
        while self._chunks and len(out) < max_chunks:
            c = self._chunks.popleft()
            self._arrived.popleft()
            self._queued_n -= len(c.samples)
            out.append(c)
        self.waiting_since = time.monotonic() if self._chunks or self.closed else float("inf")
        return out, min(held, len(out))

    def deliver(self, items: list[ASREvent | None]) -> None:
        """Hand events to the consumer on its event loop (None ends the stream); a full queue
        drops the oldest undelivered event and counts it."""
        def put() -> None:
            for ev in items:
                while True:
                    try:
                        self._events.put_nowait(ev)
                        break
                    except asyncio.QueueFull:
                        self._events.get_nowait()  # drop the oldest undelivered event
                        self.events_dropped += 1

        if self._loop is None or self._loop.is_closed():
            put()
        else:
            self._loop.call_soon_threadsafe(put)


def _engine_copy(engine: Engine) -> Engine:
    """An engine with its own copy of the weights, for a second worker lane."""
    if isinstance(engine, WhisperEngine):
        return WhisperEngine(copy.deepcopy(engine.model), engine.context_pad_s, engine.threads, engine.int8)
    return engine  # an unknown engine is shared (its own locking decides)


class ASRWorker:
    """Many sessions on ``lanes`` workers, earliest deadline first, bounded queues.

    Each turn feeds one session's queued chunks (at most ``max_chunks_per_turn``) to its recogniser and
    hands the events to that session's queue on its event loop. Audio that cannot change the output (it
    ends before :meth:`StreamingASR.quiet_until`) rides along with the next turn instead of waking a lane
    for every 20 ms chunk. Lanes are threads, each with its own copy of the model (forward passes on one
    model are serialised), or with ``processes=True`` child processes (:class:`ProcessLane`) free of the
    server's interpreter lock; a stream is pinned at ``open`` to the lane with the fewest streams, whose
    recogniser holds its state. ``started_lanes``: children already loading (``app.live.asr_prestart``).
    """

    def __init__(
        self,
        engine: str | Engine = "whisper",
        config: StreamingConfig | None = None,
        max_queue_s: float = 5.0,
        max_events: int = 512,
        max_streams: int = 64,
        max_chunks_per_turn: int = 10_000,
        model: Whisper | None = None,
        autostart: bool = True,
        lanes: int = 1,
        processes: bool = False,
        whisper_path: str | None = None,
        started_lanes: Sequence[tuple[Connection, BaseProcess]] = (),
    ) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be >= 1, got {lanes}")
        if processes and not (isinstance(engine, str) and model is None):
            raise ValueError("process lanes load the model themselves: pass whisper_path, not an engine or model")
        self.config = config or StreamingConfig()
        self._stream_config = self.config  # new streams' config (``set_step_s`` may change its step)
        started = list(started_lanes)  # children already running lane_main with these settings
        self.processes: list[ProcessLane] = [ProcessLane(whisper_path, self.config, i, started[i] if i < len(started)
                                                         else None) for i in range(lanes)] if processes else []
        # With process lanes no model is loaded here: each child holds its streams' recognisers.
        self.engine: Engine = InLaneProcesses() if processes else get_engine(engine, model, int8=self.config.int8)
        self.engines: list[Engine] = [] if processes else [self.engine] + [_engine_copy(self.engine)
                                                                           for _ in range(lanes - 1)]
        self.max_queue_s = max_queue_s
        self.max_events = max_events
        self.max_streams = max_streams
        self.max_chunks_per_turn = max_chunks_per_turn
        self._streams: dict[str, ASRStream] = {}
        # thread lanes' recognisers, one per open stream (a lane feeds a stream only while it holds it: busy)
        self._recognisers: dict[str, StreamingASR] = {}
        self._order: deque[str] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._decodes = 0
        self._turns = 0
        self._decode_s = 0.0
        self._closed_drops = (0, 0, 0)  # chunks, samples, events dropped by streams now closed
        self._last_ms = 0.0
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"asr-worker-{i}", daemon=True)
            for i in range(lanes)
        ]
        if autostart:
            self.start()

    def start(self) -> None:
        """Start the worker threads (done by the constructor unless ``autostart=False``)."""
        for t in self._threads:
            if not t.is_alive() and t.ident is None:
                t.start()

    def warmup(self) -> float:
        """Run one real inference (encoder, decoder, alignment); return its wall seconds."""
        try:
            audio = synthesize_speech("warm up", lead_in_s=0.1).samples
        except EspeakUnavailable:
            rng = np.random.default_rng(0)
            audio = (0.05 * rng.standard_normal(SAMPLE_RATE)).astype(np.float32)
        t = time.perf_counter()
        for eng in self.engines:
            eng.transcribe(audio)
        on_each_lane(self.processes, lambda lane: lane.warmup(audio))
        return time.perf_counter() - t

    def warm_streams(self, speech: np.ndarray) -> None:
        """Run the streaming path once on ``speech`` where decoding happens: in every lane process
        (each has its own VAD, recogniser and aligners to warm), or here for thread lanes."""
        if self.processes:
            on_each_lane(self.processes, lambda lane: lane.warm_stream(speech))
        else:
            warm_stream(self.engine, self.config, speech)

    def open(self, session_id: str) -> ASRStream:
        """A new session stream; call from the event loop that will iterate its events."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._cond:
            if self._stop:
                raise RuntimeError("ASR worker is stopped")
            if session_id in self._streams:
                raise ValueError(f"ASR session {session_id!r} is already open")
            if len(self._streams) >= self.max_streams:
                raise RuntimeError(f"ASR worker is full ({self.max_streams} sessions)")
            stream = ASRStream(self._cond, session_id, self._stream_config, self.max_queue_s, self.max_events, loop)
            if not self.processes:  # thread lanes: the recogniser lives here (a lane process holds its own)
                self._recognisers[session_id] = StreamingASR(self.engine, stream.config)
            else:  # pinned: its recogniser state lives in that lane's process
                load = [0] * len(self.processes)
                for s in self._streams.values():
                    if s.lane is not None:
                        load[s.lane] += 1
                stream.lane = load.index(min(load))
            self._streams[session_id] = stream
            self._order.append(session_id)
            return stream

    def set_step_s(self, step_s: float | None) -> None:
        """Re-decode every ``step_s`` of new speech from now on, in every stream (None: the configured
        step); a server sheds decodes this way under overload (``app.live.degrade``)."""
        with self._cond:
            self._stream_config = self.config if step_s is None else replace(self.config, step_s=step_s)
            for s in self._streams.values():
                s.config = replace(s.config, step_s=self._stream_config.step_s)

    def stats(self) -> WorkerStats:
        with self._cond:
            streams = list(self._streams.values())
            return WorkerStats(
                streams=len(streams),
                queue_depth=sum(s.queued_chunks for s in streams),
                queued_s=sum(s.queued_samples for s in streams) / SAMPLE_RATE,
                dropped_chunks=self._closed_drops[0] + sum(s.dropped_chunks for s in streams),
                dropped_s=(self._closed_drops[1] + sum(s.dropped_samples for s in streams)) / SAMPLE_RATE,
                decodes=self._decodes,
                decode_ms_mean=round(1000 * self._decode_s / max(self._decodes, 1), 2),
                decode_ms_last=round(self._last_ms, 2),
                events_dropped=self._closed_drops[2] + sum(s.events_dropped for s in streams),
                oldest_wait_s=max((time.monotonic() - s.waiting_since for s in streams
                                   if s.queued_chunks and s.due), default=0.0),
                turns=self._turns,
            )

    def stop(self) -> None:
        """Stop the thread (pending audio is discarded); streams' iterators end."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=10)
        for lane in self.processes:
            lane.stop()
        for s in list(self._streams.values()):
            s.deliver([None])

    def _next(self, lane: int) -> tuple[ASRStream, list[AudioChunk], int, bool] | None:
        """Earliest deadline first: the free session whose audio (or close) has waited longest,
        ties in round-robin order (under the lock): the session that has waited longest is the one
        whose words are latest, which plain round-robin ignores. Streams pinned to another lane are skipped."""
        best: ASRStream | None = None
        for sid in self._order:
            s = self._streams[sid]
            if s.busy or not s.due:
                continue
            if s.lane is not None and s.lane != lane:
                continue
            if best is None or s.waiting_since < best.waiting_since:
                best = s
        if best is None:
            return None
        self._order.remove(best.session_id)
        self._order.append(best.session_id)
        best.busy = True
        self._turns += 1
        if best.queued_chunks:
            chunks, held = best.take(self.max_chunks_per_turn)
            return best, chunks, held, False
        return best, [], 0, True

    def _feed_here(self, stream: ASRStream, engine: Engine, chunks: list[AudioChunk], held: int, closing: bool,
                   ) -> tuple[list[ASREvent | None], int, float, float]:
        """One turn of ``stream`` on this thread lane's ``engine`` (what :meth:`ProcessLane.run` does in a
        child): (events, decodes, decode seconds, the recogniser's ``quiet_until`` after it)."""
        asr = self._recognisers[stream.session_id]
        asr.engine = engine
        if asr.config.step_s != stream.config.step_s:
            asr.config = replace(asr.config, step_s=stream.config.step_s)
        before_n, before_s = asr.decode_count, asr.decode_s
        events = feed_turn(asr, chunks, closing, held)
        return events, asr.decode_count - before_n, asr.decode_s - before_s, asr.quiet_until()

    def _run(self, lane: int) -> None:
        process = self.processes[lane] if self.processes else None
        engine = self.engines[lane] if process is None else self.engine
        if process is None:
            warm_this_thread()
        while True:
            with self._cond:
                job = self._next(lane)
                while job is None and not self._stop:
                    self._cond.wait()
                    job = self._next(lane)
                if self._stop:
                    return
            assert job is not None
            stream, chunks, held, closing = job
            quiet = -float("inf")
            try:
                events: list[ASREvent | None]
                if process is not None:
                    events, n, spent, quiet = process.run(stream.session_id, chunks, held, closing,
                                                          stream.config.step_s)
                else:
                    events, n, spent, quiet = self._feed_here(stream, engine, chunks, held, closing)
                if n:
                    with self._cond:
                        self._decodes += n
                        self._decode_s += spent
                        self._last_ms = 1000 * spent / n
            except Exception:  # a bad stream must not take the worker down
                log.exception("ASR failed for session %s; closing it", stream.session_id)
                events = [None]
                closing = True
            if closing:  # unregister before the end-of-stream marker reaches the consumer
                with self._cond:
                    stream.finished = True
                    self._recognisers.pop(stream.session_id, None)
                    if self._streams.pop(stream.session_id, None) is not None:
                        c, n, e = self._closed_drops
                        self._closed_drops = (c + stream.dropped_chunks, n + stream.dropped_samples,
                                              e + stream.events_dropped)
                    if stream.session_id in self._order:
                        self._order.remove(stream.session_id)
            if events:
                stream.deliver(events)
            with self._cond:
                stream.busy = False
                stream.recheck(quiet)
                self._cond.notify_all()  # another lane may be waiting for this stream's audio
