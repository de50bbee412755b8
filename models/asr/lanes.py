"""Where a lane's turns run: one stream's queued audio fed to its recogniser, in the server's
process (a thread lane) or in a child process of its own (:class:`ProcessLane`, ``synchrony serve``'s
default), and the warm-up that makes a lane's first session as fast as its later ones.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import numpy as np

from alignment.forced import warm_this_thread
from alignment.types import SAMPLE_RATE, AudioChunk
from models.asr.engine import DecodedWord, Engine, get_engine
from models.asr.streaming import ASREvent, StreamingASR, StreamingConfig
from models.lane_process import name_process, spawn_lane

log = logging.getLogger(__name__)


def _merge_contiguous(chunks: list[AudioChunk]) -> list[AudioChunk]:
    """Join chunks that follow each other without a gap, so a turn decodes once, not per chunk."""
    out: list[AudioChunk] = []
    run: list[AudioChunk] = []
    for c in chunks:
        if run and abs(c.pts - run[-1].end) > 0.5 / SAMPLE_RATE:
            out.append(join_chunks(run))
            run = []
        run.append(c)
    if run:
        out.append(join_chunks(run))
    return out


def join_chunks(run: list[AudioChunk]) -> AudioChunk:
    """One chunk holding ``run`` (assumed contiguous), starting at the first one's pts."""
    if len(run) == 1:
        return run[0]
    return AudioChunk(run[0].pts, np.concatenate([np.asarray(c.samples, np.float32) for c in run]))


def feed_turn(asr: StreamingASR, chunks: list[AudioChunk], closing: bool, held: int = 0) -> list[ASREvent | None]:
    """One lane turn of one stream: the ``held`` chunks one by one (as if each had been fed when it
    came), then the rest (contiguous runs joined: a stream that fell behind decodes once, not per
    chunk), then its flush if closing."""
    events: list[ASREvent | None] = []
    for c in chunks[:held]:
        events += asr.feed(c)
    for c in _merge_contiguous(chunks[held:]):
        events += asr.feed(c)
    if closing:
        events += asr.flush()
        events.append(None)
    return events


#: Warm-up stream: 20 ms chunks, as a WebRTC peer delivers audio, and silence after the speech so
#: the utterance ends (its finalisation and word timing run too).
_WARM_CHUNK = 320
_WARM_TAIL_S = 0.4


def warm_stream(engine: Engine, config: StreamingConfig, speech: np.ndarray) -> None:
    """Run the streaming path once on ``speech`` (VAD, incremental decode, finalisation, word
    timing and its support check) with ``engine``, so no session pays for its first use."""
    audio = np.concatenate([np.asarray(speech, np.float32), np.zeros(int(_WARM_TAIL_S * SAMPLE_RATE), np.float32)])
    stream = StreamingASR(engine, config)
    for i in range(0, len(audio), _WARM_CHUNK):
        stream.feed(AudioChunk(i / SAMPLE_RATE, audio[i : i + _WARM_CHUNK]))
    stream.flush()


# --- what a lane process and its parent say over the pipe: one small record per message ---------------


@dataclass(frozen=True)
class Ready:
    """Child → parent, once: the model is loaded."""


@dataclass(frozen=True)
class Stop:
    """Parent → child: return."""


@dataclass(frozen=True)
class Warmup:
    """Parent → child: transcribe ``audio`` once (the engine's first inference)."""

    audio: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class WarmStream:
    """Parent → child: run the streaming path once on ``speech``."""

    speech: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class Job:
    """Parent → child: one lane turn of stream ``sid`` (see :func:`feed_turn`)."""

    sid: str
    chunks: list[AudioChunk] = field(repr=False)
    held: int
    closing: bool
    step_s: float


@dataclass(frozen=True)
class Warmed:
    """Child → parent: a warm-up finished (``seconds``: its first inference, for ``Warmup``)."""

    seconds: float = 0.0


@dataclass(frozen=True)
class Turn:
    """Child → parent: a job's events, its decodes and their seconds, and the stream's ``quiet_until``."""

    events: list[ASREvent | None]
    decodes: int
    decode_s: float
    quiet_until: float


@dataclass(frozen=True)
class Failed:
    """Child → parent: the request failed (the parent closes that stream; the lane goes on)."""

    message: str


LaneRequest = Stop | Warmup | WarmStream | Job
LaneReply = Ready | Warmed | Turn | Failed


#: A lane process's nice value above the server's: the event loop's RTP and audio work (whose audio the
#: lanes wait for) then gets its core first when both want one; a decode takes tens of ms, a late packet
#: holds up every session.
LANE_NICE = 3


def lane_main(conn: Connection, whisper_path: str | None, config: StreamingConfig) -> None:
    """A process lane's child: one engine, the streams pinned to it, requests answered in order."""
    import os

    from models.whisper_loader import load_whisper

    name_process("asr-lane")
    if LANE_NICE > 0 and hasattr(os, "nice"):
        os.nice(LANE_NICE)
    engine = get_engine("whisper", load_whisper(whisper_path) if whisper_path else None, int8=config.int8)
    warm_this_thread()
    streams: dict[str, StreamingASR] = {}
    try:
        conn.send(Ready())
    except OSError:  # the parent stopped while this lane loaded
        return
    while True:
        try:
            msg: LaneRequest = conn.recv()
        except (EOFError, OSError):  # the parent closed its end or exited: nothing left to answer
            return
        if isinstance(msg, Stop):
            return
        try:
            reply: LaneReply = _answer(msg, engine, config, streams)
        except Exception as exc:  # noqa: BLE001 - the parent closes that stream; the lane goes on
            if isinstance(msg, Job):
                streams.pop(msg.sid, None)
            reply = Failed(f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except OSError:  # the parent went away while this request was decoded
            return


def _answer(msg: Warmup | WarmStream | Job, engine: Engine, config: StreamingConfig,
            streams: dict[str, StreamingASR]) -> LaneReply:
    """A lane process's reply to one request."""
    if isinstance(msg, Warmup):
        t = time.perf_counter()
        engine.transcribe(msg.audio)
        return Warmed(time.perf_counter() - t)
    if isinstance(msg, WarmStream):
        warm_stream(engine, config, msg.speech)
        return Warmed()
    asr = streams.get(msg.sid)
    if asr is None:
        asr = streams[msg.sid] = StreamingASR(engine, replace(config, step_s=msg.step_s))
    elif asr.config.step_s != msg.step_s:
        asr.config = replace(asr.config, step_s=msg.step_s)
    before_n, before_s = asr.decode_count, asr.decode_s
    events = feed_turn(asr, msg.chunks, msg.closing, msg.held)
    if msg.closing:
        del streams[msg.sid]
    return Turn(events, asr.decode_count - before_n, asr.decode_s - before_s, asr.quiet_until())


class InLaneProcesses:
    """The engine of a worker whose lanes decode in their own processes: the server process's
    streams keep their settings (the step) and never decode, so no model is loaded there."""

    name = "whisper (in the lane processes)"

    def transcribe(self, audio: np.ndarray, prefix: Sequence[str] = (), prompt: str = "",
                   draft: Sequence[str] = (), expect_words: bool = False) -> list[DecodedWord]:
        raise RuntimeError("this worker decodes in its lane processes")


def on_each_lane(lanes: list[ProcessLane], call: Callable[[ProcessLane], None]) -> None:
    """``call`` on every lane at once (each lane is its own process: its warm-up need not wait for
    the others')."""
    if len(lanes) <= 1:
        for lane in lanes:
            call(lane)
        return
    with ThreadPoolExecutor(len(lanes), thread_name_prefix="asr-warm") as pool:
        for done in [pool.submit(call, lane) for lane in lanes]:
            done.result()


class ProcessLane:
    """A decode lane in a child process (from the fork server: the server's threads must not be forked); the
    parent's lane thread sends it one stream's turn and blocks, without the lock, for the events.
    A child that dies (killed, out of memory) is started again: the turn it was running fails (that
    stream is closed), and the streams pinned to it start over with fresh recogniser state."""

    def __init__(self, whisper_path: str | None, config: StreamingConfig, index: int,
                 started: tuple[Connection, BaseProcess] | None = None) -> None:
        self._args = (whisper_path, config)
        self._name = f"asr-lane-{index}"
        self._lock = threading.Lock()  # one request in flight (the lane thread; warm-up before it)
        self.restarts = 0
        self._ever_ready = False
        self._broken: str | None = None
        self._start(started)

    def _start(self, started: tuple[Connection, BaseProcess] | None = None) -> None:
        """Adopt ``started`` (a child running :func:`lane_main` with these settings), else spawn one."""
        self._conn, self.proc = started or spawn_lane(lane_main, self._name, *self._args,
                                                      default_model=self._args[0] is None)
        self._ready = False

    def _call(self, msg: LaneRequest) -> LaneReply:
        with self._lock:
            if self._broken is not None:
                raise RuntimeError(self._broken)
            try:
                if not self._ready:
                    self._conn.recv()  # Ready: the model is loaded
                    self._ready = self._ever_ready = True
                self._conn.send(msg)
                reply = self._conn.recv()
            except (EOFError, OSError) as exc:
                code = self.proc.exitcode
                self._conn.close()
                self.proc.join(timeout=5)
                if not self._ever_ready:  # it never started (no model, no memory): starting it again would loop
                    self._broken = f"ASR lane process failed to start (exit code {code})"
                    raise RuntimeError(self._broken) from exc
                self.restarts += 1
                log.error("ASR lane process %s ended (exit code %s); starting it again", self._name, code)
                self._start()
                raise RuntimeError(f"ASR lane process ended (exit code {code})") from exc
        if isinstance(reply, Failed):
            raise RuntimeError(f"ASR lane process: {reply.message}")
        return reply

    def warmup(self, audio: np.ndarray) -> None:
        self._call(Warmup(audio))

    def warm_stream(self, speech: np.ndarray) -> None:
        self._call(WarmStream(speech))

    def run(self, sid: str, chunks: list[AudioChunk], held: int, closing: bool, step_s: float,
            ) -> tuple[list[ASREvent | None], int, float, float]:
        """One turn of stream ``sid`` in the child (:func:`_answer`): (events, decodes, decode seconds,
        the stream's ``quiet_until`` after it)."""
        reply = self._call(Job(sid, chunks, held, closing, step_s))
        assert isinstance(reply, Turn)
        return reply.events, reply.decodes, reply.decode_s, reply.quiet_until

    def stop(self) -> None:
        try:
            self._conn.send(Stop())
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
