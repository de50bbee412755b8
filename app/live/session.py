"""One live WebRTC session: incoming tracks → one clock → stages → events and a 16 fps video back.

Per session:

* camera → ``alignment.clock`` → a one-slot latest-wins mailbox → a worker thread running the face
  AU extractor (MediaPipe) and the load controller → ``au`` / ``load`` events;
* microphone → clock → 48 kHz→16 kHz → the shared ASR worker's stream → ``token`` events, attached
  to output frames (16 fps, ±40 ms) → Level-3 validator → ``sync`` events; utterance ends → the
  responder → paced ``response`` tokens → ``lst`` figures;
* an output video track rendering frame k (pts k/16) ``output_delay_s`` after camera time k/16
  reached the server, so the words that belong on frame k are (usually) known when it is drawn;
  a word that arrives later is drawn on the next frame and its ``frames`` / ``sync`` say so.

A stage that fails degrades only its own session (an ``error`` event and a log line, the rest goes
on); losing the media or the connection ends the session. Stages whose modules have not landed are
simply absent: the session never invents their events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError

from alignment.clock import SenderReport, SessionClock, TrackClock, ntp_to_seconds
from alignment.frames import FPS, TOLERANCE_S, frame_pts, frames_for_time
from alignment.text import alnum_key as _norm
from alignment.types import SAMPLE_RATE, AudioChunk, AUSample, LoadEstimate, VideoFrame, WordToken
from app.live.cpu_account import name_native_thread
from app.live.reliability import lower_thread_priority
from app.live.server_metrics import ServerMetrics
from app.live.turns import TurnConfig, TurnDetector, looks_unfinished

log = logging.getLogger("synchrony.session")

WIRE_VERSION = 1
_VIDEO_CLOCK = 90_000
#: A turn's words "reach" its end of speech when the last one ends this close to it (ASR word ends
#: fall a little before the VAD's end of speech; a word still missing leaves a larger gap).
HEARD_SLACK_S = 0.35
_CHANNEL_MAX_BUFFERED = 1 << 20  # bytes queued on the events channel before messages are dropped
#: Largest camera frame a session keeps (1080p). The session holds ~2 s of decoded frames for
#: rendering, so a peer sending absurd sizes would otherwise grow the whole server's memory.
MAX_VIDEO_PIXELS = 1920 * 1088
try:
    import cv2 as _cv2  # ships with mediapipe
except ImportError:  # pragma: no cover - the conversion falls back to libswscale
    _cv2 = None
#: The returned video's frames are drawn here, apart from the default executor where aiortc encodes
#: them, so the two stages' CPU can be told apart (app.live.cpu_account); two threads serve every session.
_RENDER_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="render")


@dataclass(frozen=True)
class SessionConfig:
    """Per-session knobs (the server fills them from ``ServerConfig``)."""

    output_delay_s: float = 1.5  # > final-word latency p95 (bench/asr_stream.py), so captions land on their frames
    output_size: tuple[int, int] = (640, 360)
    media_timeout_s: float = 10.0
    au_max_fps: float = 16.0  # face analysis rate (camera pts): the controller resamples, 16/s match the output
    au_nice: int = 5  # face analysis yields the CPU to ASR and the event loop (CFS weight ≈ 1/3)
    # End-of-turn decisions beside the ASR (app/live/turns.py); None: answer at the ASR's endpoint only.
    turn: TurnConfig | None = field(default_factory=TurnConfig)


@dataclass
class Stages:
    """The shared, warmed-up stage factories; ``None`` where a stage is unavailable."""

    asr_worker: Any = None
    make_faces: Callable[[], Any] | None = None
    make_controller: Callable[[], Any] | None = None
    renderer: Any = None
    make_validator: Callable[[], Any] | None = None
    make_offset_estimator: Callable[[], Any] | None = None
    make_responder: Callable[[], Any] | None = None
    make_pacer: Callable[..., Any] | None = None
    lst: Any = None  # alignment.lst.LSTAggregate: one meter per session, pooled for /metrics/lst
    missing: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Shown:
    """A token as the session will show it: the frames that actually carry it."""

    token: WordToken
    frames: tuple[int, ...]
    late: bool


class Session:
    """A live session bound to one ``RTCPeerConnection``."""

    def __init__(
        self,
        session_id: str,
        pc: RTCPeerConnection,
        stages: Stages,
        config: SessionConfig,
        metrics: ServerMetrics,
        on_end: Callable[[Session, str], None] | None = None,
        degradation: Any = None,
    ) -> None:
        """``degradation``: the server's ``app.live.degrade.Degradation`` (None: never degrade)."""
        self.id = session_id
        self.pc = pc
        self.stages = stages
        self.config = config
        self.metrics = metrics
        self.on_end = on_end
        self.degradation = degradation
        self.clock = SessionClock()
        self.loop = asyncio.get_running_loop()
        self.created = time.monotonic()
        self.end_reason: str | None = None
        self.degraded: dict[str, str] = {}
        self.channel: RTCDataChannel | None = None
        self.output = OutputTrack(self)
        self.last_media_wall = time.monotonic()
        self.counts: dict[str, int] = {}
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        # camera frames kept for rendering (refs to decoded frames), AU/load history for overlays
        self._camera: deque[tuple[float, av.VideoFrame]] = deque(maxlen=64)
        self._au: deque[AUSample] = deque(maxlen=128)
        self._load: deque[LoadEstimate] = deque(maxlen=128)
        # tokens: (utterance, index) -> shown token; per-frame new words
        self._tokens: dict[tuple[int, int], _Shown] = {}
        self._frame_words: dict[int, list[WordToken]] = {}
        self._last_sync_ok: bool | None = None
        self._sync_total = 0
        self._sync_ok = 0
        # AU worker: one-slot mailbox
        self._slot: tuple[float, av.VideoFrame, float] | None = None
        self._slot_cond = threading.Condition()
        # One camera frame can be converted by the AU thread and the render thread at once; libswscale
        # state is per frame, and concurrent use of it crashed the process (SIGSEGV at 2-4 peers).
        self._convert_lock = threading.Lock()
        self._au_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._asr_stream: Any = None
        self._offset_estimator: Any = None
        self._validator: Any = None
        self._lst: Any = None
        self._responder: Any = None
        self._response_task: asyncio.Task | None = None
        # turns (app/live/turns.py): words heard since the last answered turn, a prefetched response
        self._turns = TurnDetector(config.turn) if config.turn is not None else None
        self._turn_words: dict[tuple[int, int], tuple[float, float, str]] = {}  # key → (start, end, text)
        self._answered_until = -math.inf  # speech end (pts) of the last turn answered
        self._unanswered_end: float | None = None  # a turn ended before its words came: answer when they do
        self._prefetch: tuple[asyncio.Task, asyncio.Event, float, str] | None = None  # task, gate, pts, text
        self._pause_pts: float | None = None  # speech end of the pause now running (turn not over yet)
        self._controller: Any = None
        self._pacer: Any = None
        self._flash_pending: deque[tuple[float, float]] = deque(maxlen=256)  # (pts, flash) awaiting AUs
        self._estimate: tuple[float, Any] | None = None  # (wall, OffsetEstimate), refreshed ≤ 1/s
        self._last_final_start: float | None = None  # the word before, for the onset check

    # --- wiring -----------------------------------------------------------------------------

    def hook(self) -> None:
        """Register the peer connection's callbacks (before the offer is applied: it emits tracks)."""
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)

    def attach(self) -> None:
        """After the offer is applied: send the output video and build the per-session stages."""
        pc = self.pc
        video = [t for t in pc.getTransceivers() if t.kind == "video"]
        if video:
            video[0].sender.replaceTrack(self.output)
            video[0].direction = "sendrecv"
        if self.stages.make_validator is not None:
            self._validator = self._safe("sync", self.stages.make_validator)
        if self.stages.make_offset_estimator is not None:
            self._offset_estimator = self._safe("sync", self.stages.make_offset_estimator)
        if self.stages.lst is not None:
            self._lst = self._safe("lst", lambda: self.stages.lst.meter(self.id))
        if self.stages.make_responder is not None:
            self._responder = self._safe("response", self.stages.make_responder)
        self._spawn(self._watchdog(), "watchdog")

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != "events":
            log.info("session %s: ignoring data channel %r", self.id, channel.label)
            return
        self.channel = channel
        self.emit({"type": "hello", "session": self.id, "version": WIRE_VERSION, "fps": FPS,
                   "output_delay_s": self.config.output_delay_s,
                   "stages": sorted(self._available_stages()), "missing": self.stages.missing})

    def _available_stages(self) -> set[str]:
        s = self.stages
        names = {"video"}
        if s.make_faces:
            names.add("au")
        if s.make_controller:
            names.add("load")
        if s.asr_worker is not None:
            names.add("token")
        if s.make_validator:
            names.add("sync")
        if s.make_responder:
            names.add("response")
        if s.lst is not None:
            names.add("lst")
        return names

    def _on_track(self, track: MediaStreamTrack) -> None:
        receiver = next((t.receiver for t in self.pc.getTransceivers() if t.receiver.track is track), None)
        if receiver is None:
            receiver = next((t.receiver for t in self.pc.getTransceivers()
                             if t.kind == track.kind and t.receiver.track is None), None)
        rate = _VIDEO_CLOCK if track.kind == "video" else 48_000
        tclock = self.clock.track(track.kind, rate)
        if receiver is not None:
            from app.live.jitter import install

            _hook_receiver(receiver, tclock)
            install(receiver)  # video at its marker bit, audio without aiortc's 80 ms prefetch (app/live/jitter.py)
        if track.kind == "video":
            self._spawn(self._read_video(track, tclock, receiver), "video-in")
            if self.stages.make_faces is not None and self._au_thread is None:
                self._au_thread = threading.Thread(target=self._au_worker, name=f"au-{self.id}", daemon=True)
                self._au_thread.start()
        elif track.kind == "audio":
            self._spawn(self._read_audio(track, tclock, receiver), "audio-in")

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state in ("failed", "closed"):
            self._spawn(self.close(f"connection {state}"), "close")

    # --- events out -------------------------------------------------------------------------

    def emit(self, message: dict[str, Any]) -> bool:
        """Send one JSON event to the client; drops (and counts) when the channel is backed up."""
        ch = self.channel
        if ch is None or ch.readyState != "open":
            return False
        if ch.bufferedAmount > _CHANNEL_MAX_BUFFERED:
            self.metrics.drop("events")
            return False
        try:
            ch.send(json.dumps(message, separators=(",", ":")))
        except Exception as exc:  # noqa: BLE001 - a closing channel must not take the session down
            log.debug("session %s: event dropped: %s", self.id, exc)
            return False
        kind = str(message.get("type"))
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return True

    def fail_stage(self, stage: str, exc: BaseException) -> None:
        """Degrade one stage of this session: log why, tell the client, keep the rest running."""
        if stage in self.degraded:
            return
        reason = f"{type(exc).__name__}: {exc}"
        self.degraded[stage] = reason
        self.metrics.stage_errors.labels(stage).inc()
        log.error("session %s: stage %s degraded: %s", self.id, stage, reason, exc_info=exc)
        self.emit({"type": "error", "stage": stage, "message": reason, "fatal": False})

    def _safe(self, stage: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - one stage failing degrades only that stage
            self.fail_stage(stage, exc)
            return None

    # --- camera → AUs → load ----------------------------------------------------------------

    async def _read_video(self, track: MediaStreamTrack, tclock: TrackClock, receiver: Any) -> None:
        try:
            while True:
                frame = await track.recv()
                arrival = time.monotonic()
                self.last_media_wall = arrival
                _set_origin(receiver, tclock)
                t = tclock.time(int(frame.pts), arrival)
                if frame.width * frame.height > MAX_VIDEO_PIXELS:  # not kept: degrade, count, go on
                    self.metrics.drop("video_oversized")
                    self.fail_stage("video", ValueError(
                        f"camera frame {frame.width}x{frame.height} is larger than {MAX_VIDEO_PIXELS} pixels; "
                        "frames that large are dropped"))
                    continue
                self._camera.append((t, frame))
                if self._offset_estimator is not None:  # every frame: a one-frame flash must not be skipped
                    self._flash_pending.append((t, _flash_of(frame)))
                    if self._au_thread is None or "au" in self.degraded:
                        self._flush_visual(t, None)
                with self._slot_cond:
                    if self._slot is not None:
                        self.metrics.drop("au_latest_wins")
                    self._slot = (t, frame, arrival)
                    self._slot_cond.notify()
        except MediaStreamError:
            await self.close("video track ended")

    def _au_worker(self) -> None:
        """Worker thread: latest camera frame → AUs (MediaPipe) → controller; results to the loop."""
        lower_thread_priority(self.config.au_nice)  # before make_faces, so MediaPipe's threads inherit it
        name_native_thread("au-" + self.id[:8])  # ... and its name, so their CPU is counted as face analysis
        try:
            faces = self.stages.make_faces()  # type: ignore[misc]
            controller = self.stages.make_controller() if self.stages.make_controller else None
        except Exception as exc:  # noqa: BLE001
            self.loop.call_soon_threadsafe(self.fail_stage, "au", exc)
            return
        rate = FrameRate(self.config.au_max_fps)
        while not self._stop.is_set():
            with self._slot_cond:
                while self._slot is None and not self._stop.is_set():
                    self._slot_cond.wait(0.5)
                if self._stop.is_set():
                    break
                t, frame, _arrival = self._slot  # type: ignore[misc]
                self._slot = None
            if self.degradation is not None:
                rate.fps = min(self.config.au_max_fps, self.degradation.effects.au_fps)
            if not rate.take(t):
                continue
            try:
                c0 = time.monotonic()
                with self._convert_lock:
                    image = frame.to_ndarray(format="rgb24")
                if hasattr(faces, "extract_full"):
                    obs = faces.extract_full(VideoFrame(t, image))
                    sample, mouth = obs.au, (obs.mouth_open if obs.face else None)
                else:
                    sample, mouth = faces.extract(VideoFrame(t, image)), None
                compute = time.monotonic() - c0
            except Exception as exc:  # noqa: BLE001
                self.loop.call_soon_threadsafe(self.fail_stage, "au", exc)
                return
            estimate = None
            if controller is not None and "load" not in self.degraded:
                try:
                    estimate = controller.step(sample)
                except Exception as exc:  # noqa: BLE001
                    self.loop.call_soon_threadsafe(self.fail_stage, "load", exc)
                    controller = None
            try:
                self.loop.call_soon_threadsafe(self._on_au, sample, estimate, compute, mouth)
            except RuntimeError:  # loop closed
                return
        close = getattr(faces, "close", None)
        if callable(close):
            close()

    def _on_au(self, sample: AUSample, estimate: LoadEstimate | None, compute: float, mouth: float | None) -> None:
        self._au.append(sample)
        wall = self.clock.wall_of(sample.pts)
        if wall is not None:
            self.metrics.observe_stage("au", time.monotonic() - wall, compute)
        self.emit({"type": "au", "pts": round(sample.pts, 4), "au": sample.as_dict(), "face": sample.face})
        if self._offset_estimator is not None:
            self._flush_visual(sample.pts, mouth)
        if estimate is not None:
            self._load.append(estimate)
            if self._pacer is not None:
                self._safe("response", lambda: self._pacer.set_policy(estimate.policy))
            self.emit({"type": "load", "pts": round(estimate.pts, 4), "level": estimate.level,
                       "probs": [round(float(p), 4) for p in estimate.probs],
                       "policy": estimate.policy.as_dict()})

    def _flush_visual(self, upto: float, mouth: float | None) -> None:
        """Hand the A/V estimator every frame up to ``upto`` in pts order: flash scores for all,
        mouth openness for the frame the AU stage processed (frames it skipped carry none)."""
        from alignment.evidence import VisualObservation

        while self._flash_pending and self._flash_pending[0][0] <= upto + 1e-6:
            pts, flash = self._flash_pending.popleft()
            here = abs(pts - upto) <= 1e-6
            self._feed_offset("video", VisualObservation(pts, mouth if here else None, flash))
            if self._offset_estimator is None:
                return

    # --- microphone → ASR → tokens → Level-3 ------------------------------------------------

    async def _read_audio(self, track: MediaStreamTrack, tclock: TrackClock, receiver: Any) -> None:
        worker = self.stages.asr_worker
        if worker is not None:
            stream = self._safe("asr", lambda: worker.open(self.id))
            if stream is not None:
                self._asr_stream = stream
                self._spawn(self._asr_events(stream), "asr-events")
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        anchor: float | None = None  # session time of output sample 0
        produced = 0
        try:
            while True:
                frame = await track.recv()
                arrival = time.monotonic()
                self.last_media_wall = arrival
                _set_origin(receiver, tclock)
                t = tclock.time(int(frame.pts), arrival)
                out = np.concatenate([f.to_ndarray().reshape(-1) for f in resampler.resample(frame)] or
                                     [np.zeros(0, np.float32)])
                expected = None if anchor is None else anchor + produced / SAMPLE_RATE
                if expected is None or abs(expected - t) > 0.02:  # start, or a gap/clock step: re-anchor
                    anchor, produced = t, 0
                pts = anchor + produced / SAMPLE_RATE
                produced += len(out)
                if out.size and self._asr_stream is not None and "asr" not in self.degraded:
                    chunk = AudioChunk(pts, out.astype(np.float32, copy=False))
                    try:
                        self._asr_stream.push(chunk)
                    except Exception as exc:  # noqa: BLE001
                        self.fail_stage("asr", exc)
                    if self._offset_estimator is not None:
                        self._feed_offset("audio", chunk)
                if out.size and self._turns is not None and self._responder is not None:
                    self._on_turn_audio(AudioChunk(pts, out.astype(np.float32, copy=False)))
        except MediaStreamError:
            await self.close("audio track ended")

    async def _asr_events(self, stream: Any) -> None:
        try:
            async for ev in stream.events():
                if isinstance(ev, WordToken):
                    self._on_token(ev)
                elif type(ev).__name__ == "UtteranceEnd":
                    self._on_utterance_end(ev)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            self.fail_stage("asr", exc)

    def _on_token(self, tok: WordToken) -> None:
        key = (tok.utterance, tok.index)
        prev = self._tokens.get(key)
        frames, late = place_token(tok, prev.token if prev else None, prev.frames if prev else (),
                                   self.output.next_index)
        shown = _Shown(tok, frames, late)
        if prev is not None:
            for k in prev.frames:
                words = self._frame_words.get(k)
                if words and prev.token in words:
                    words.remove(prev.token)
        self._tokens[key] = shown
        if self._turns is not None and tok.start >= self._answered_until - 0.05:
            self._turn_words[key] = (tok.start, tok.end, tok.text)
            if self._unanswered_end is not None and self._heard_until(self._unanswered_end):
                self._end_turn(self._unanswered_end)
            elif self._pause_pts is not None and (self._prefetch is None
                                                  or self._prefetch[3] != self._turn_text(self._pause_pts)):
                self._prefetch_response(self._pause_pts)  # the words reached the pause, or changed: (re)send
        for k in frames:
            self._frame_words.setdefault(k, []).append(tok)
        now = time.monotonic()
        wall_end = self.clock.wall_of(tok.end)
        if wall_end is not None:
            self.metrics.observe_stage("token_final" if tok.final else "token_interim", now - wall_end)
        self.emit({"type": "token", "text": tok.text, "start": round(tok.start, 4), "end": round(tok.end, 4),
                   "final": tok.final, "frames": list(frames), "utterance": tok.utterance,
                   "index": tok.index, "late": late})
        if tok.final and self._validator is not None and "sync" not in self.degraded:
            self._check_sync(shown)

    def _check_sync(self, shown: _Shown) -> None:
        from alignment.sync import sync_event

        estimate = None
        if self._offset_estimator is not None:
            now = time.monotonic()
            if self._estimate is None or now - self._estimate[0] > 1.0:  # lip search costs ~10 ms: ≤ 1/s
                est = self._safe("sync", self._offset_estimator.estimate)
                self._estimate = (now, est) if est is not None else None
            estimate = self._estimate[1] if self._estimate is not None else None
        onset = None
        if self._offset_estimator is not None:
            previous = self._last_final_start
            onset = self._safe("sync", lambda: self._offset_estimator.acoustic_onset(shown.token.start, previous))
        self._last_final_start = shown.token.start
        check = self._safe("sync", lambda: self._validator.check_estimate(
            shown.token, frame_pts(shown.frames[0]), estimate, onset))
        if check is None:
            return
        self._sync_total += 1
        self._sync_ok += int(check.ok)
        self._last_sync_ok = check.ok
        self.metrics.sync(check.ok)
        self.emit(sync_event(check))

    def _feed_offset(self, kind: str, item: Any) -> None:
        est = self._offset_estimator
        try:
            if kind == "audio":
                est.push_audio(item)
            else:
                est.push_visual(item)
        except Exception as exc:  # noqa: BLE001
            self.fail_stage("sync", exc)
            self._offset_estimator = None

    # --- responses -----------------------------------------------------------------------------

    def _on_utterance_end(self, ev: Any) -> None:
        """The ASR's endpoint: answers unless the turn detector did (or is still deciding)."""
        if self._responder is None or "response" in self.degraded:
            return
        pts, text = float(getattr(ev, "pts", 0.0)), str(getattr(ev, "text", ""))
        if self._turns is not None:
            # Only for a turn that ended before its words were heard (an utterance inside it, or it).
            pending = self._unanswered_end
            if pending is None or not self._answered_until < pts <= pending + 0.5 or not text.strip():
                return
            if pts >= pending - 0.05:
                self._unanswered_end = None
            self._answered_until = pts
            self._turn_words = {k: w for k, w in self._turn_words.items() if w[0] >= pts}  # the next turn's
        self._start_response(text, pts, getattr(ev, "utterance", 0), None)

    def _on_turn_audio(self, chunk: AudioChunk) -> None:
        if "response" in self.degraded:
            return
        for ev in self._turns.feed(chunk, self._turn_text()):  # type: ignore[union-attr]
            if ev.kind == "pause":
                self._pause_pts = ev.pts
                self._prefetch_response(ev.pts)
            elif ev.kind == "resume":
                self._pause_pts = None
                self._drop_prefetch()
            else:
                self._pause_pts = None
                self._end_turn(ev.pts)

    def _turn_text(self, until: float = math.inf) -> str:
        """The turn's words (interims included) that start before ``until``."""
        return " ".join(text for start, _, text in sorted(self._turn_words.values()) if start < until)

    def _turn_utterance(self) -> int:
        return max((u for u, _ in self._turn_words), default=0)

    def _heard_until(self, pts: float) -> bool:
        """The words spoken before ``pts`` reach it (the ASR has caught up with this end of speech)."""
        ends = [end for start, end, _ in self._turn_words.values() if start < pts]
        return bool(ends) and max(ends) >= pts - HEARD_SLACK_S

    def _prefetch_response(self, pts: float) -> None:
        """Speech paused after words that can end a sentence: send the request now, hold its tokens
        (responders with a network TTFT only: the hold counts in the LST TTFT, docs/LST.md)."""
        text = self._turn_text(pts)
        self._drop_prefetch()
        if (not getattr(self._responder, "prefetch", False) or not text or looks_unfinished(text)
                or not self._heard_until(pts)):
            return
        gate = asyncio.Event()
        task = self._spawn(self._respond(text, pts, self._turn_utterance(), gate), "response-prefetch")
        self._prefetch = (task, gate, pts, text)

    def _drop_prefetch(self) -> None:
        if self._prefetch is not None:
            self._prefetch[0].cancel()
            self._prefetch = None

    def _end_turn(self, pts: float) -> None:
        """The turn is over: release the prefetched answer or start one, once its words are heard
        (until then the first token that reaches the end, or the ASR's endpoint, answers)."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None and abs(prefetch[2] - pts) < 1e-6 and not prefetch[0].done():
            self._interrupt_answer()
            self._response_task = prefetch[0]
            prefetch[1].set()
        else:
            if prefetch is not None:
                prefetch[0].cancel()
            if not self._heard_until(pts):
                self._unanswered_end = pts
                return
            self._start_response(self._turn_text(pts), pts, self._turn_utterance(), None)
        self._unanswered_end = None
        self._answered_until = pts
        self._turn_words = {k: w for k, w in self._turn_words.items() if w[0] >= pts}  # the next turn's

    def _interrupt_answer(self) -> None:
        if self._response_task is not None and not self._response_task.done():
            self._response_task.cancel()  # a new turn interrupts the previous answer

    def _start_response(self, text: str, pts: float, utterance: int, gate: asyncio.Event | None) -> None:
        self._interrupt_answer()
        self._response_task = self._spawn(self._respond(text, pts, utterance, gate), "response")

    async def _respond(self, text: str, speech_end_pts: float, utterance: int, gate: asyncio.Event | None) -> None:
        """Answer one turn: responder tokens paced at the current load's policy, LST-metered.

        With a ``gate`` (a prefetch) the request goes out now and its first token waits for the gate,
        before pacing, so the pace starts when the tokens may be shown. Each ``response`` event
        carries what its token measured (``ttft_ms`` and ``turn_ms`` on the first, ``itl_ms`` on the
        rest), so a client can keep the raw samples (``synchrony certify``).
        """
        policy = self._load[-1].policy if self._load else _default_policy()
        speech_end = self.clock.wall_of(speech_end_pts)
        pacer = self.stages.make_pacer(policy) if self.stages.make_pacer else None
        request = time.monotonic()  # the responder's request goes out with the first pull below
        since = speech_end if speech_end is not None else request

        async def released() -> Any:
            async for raw in self._responder.tokens(text, policy):
                if gate is not None and not gate.is_set():
                    await gate.wait()
                self._pacer = pacer  # the answer now being shown follows load changes
                yield raw

        try:
            first = True
            async for tok in (pacer or _default_pacer(policy)).pace(released()):
                emitted = float(getattr(tok, "emitted", time.monotonic()))
                event = {"type": "response", "utterance": utterance, "index": getattr(tok, "index", 0),
                         "text": str(getattr(tok, "text", tok)),
                         "ms_after_utterance": round((emitted - since) * 1000, 1)}
                if self._lst is not None:
                    if first:  # only now: an answer still streaming before this one keeps its own ITLs
                        self._lst.begin_response(request, speech_end)
                    timing = self._lst.token(emitted)
                    self.metrics.observe_lst(timing)
                    event.update({k: round(v * 1000, 3) for k, v in (("ttft_ms", timing.ttft_s),
                                  ("turn_ms", timing.turn_s), ("itl_ms", timing.itl_s)) if v is not None})
                first = False
                self.emit(event)
            if self._lst is not None and not first:
                self._lst.response_end()
                self.emit({"type": "lst", **_lst_dict(self._lst.snapshot())})
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            self.fail_stage("response", exc)
        finally:
            if self._pacer is pacer:
                self._pacer = None

    # --- rendering (called by OutputTrack) ----------------------------------------------------

    def render_request(self, k: int) -> Callable[[], Any]:
        """Collect what frame ``k`` shows (on the loop, cheap); the returned call builds the request
        (camera conversion included) and is run in the render thread."""
        from models.video import RenderRequest

        t = frame_pts(k)
        best = None
        for ct, frame in reversed(self._camera):
            if ct <= t + 1e-6:
                best = frame
                break
        if best is None and self._camera:
            best = self._camera[0][1]
        new_words = tuple(self._frame_words.pop(k, ()))
        caption = self._caption_at(k)
        au = next((s for s in reversed(self._au) if s.pts <= t), None)
        load = next((e for e in reversed(self._load) if e.pts <= t), None)
        sync_ok, size = self._last_sync_ok, self.output_size()

        def build() -> Any:
            camera = None
            if best is not None:
                with self._convert_lock:
                    camera = best.to_ndarray(format="rgb24", width=size[0], height=size[1])
            return RenderRequest(index=k, pts=t, camera=camera, caption=caption, new_words=new_words, au=au,
                                 load=load, sync_ok=sync_ok, size=size)

        return build

    def output_size(self) -> tuple[int, int]:
        """The returned video's size now: the configured one, halved at the degradation's video step."""
        w, h = self.config.output_size
        scale = self.degradation.effects.output_scale if self.degradation is not None else 1.0
        return (w, h) if scale >= 1.0 else (max(2 * round(w * scale / 2), 16), max(2 * round(h * scale / 2), 16))

    def _caption_at(self, k: int) -> tuple[WordToken, ...]:
        """Words of the latest utterance already shown by frame ``k`` (for 4 s after its last word)."""
        shown = [s for s in self._tokens.values() if s.frames and s.frames[0] <= k]
        if not shown:
            return ()
        latest = max(s.token.utterance for s in shown)
        words = sorted((s.token for s in shown if s.token.utterance == latest), key=lambda w: w.start)
        if words and frame_pts(k) - words[-1].end > 4.0:
            return ()
        return tuple(words[-12:])

    def prune(self, k: int) -> None:
        """Forget per-frame words for frames already sent and tokens of old utterances."""
        for old in [i for i in self._frame_words if i < k]:
            del self._frame_words[old]
        if len(self._tokens) > 400:
            keep = sorted(self._tokens.items(), key=lambda kv: kv[1].token.start)[-200:]
            self._tokens = dict(keep)

    # --- lifecycle ----------------------------------------------------------------------------

    async def _watchdog(self) -> None:
        """Reap a session whose media stopped (a peer that vanished without closing)."""
        while not self._closing:
            await asyncio.sleep(min(1.0, self.config.media_timeout_s / 4))
            if time.monotonic() - self.last_media_wall > self.config.media_timeout_s:
                self._spawn(self.close("media timeout"), "close")
                return

    def summary(self) -> dict[str, Any]:
        lst = None
        if self._lst is not None:
            snap = self._safe("lst", self._lst.snapshot)
            lst = _lst_dict(snap) if snap is not None else None
        return {
            "session": self.id,
            "age_s": round(time.monotonic() - self.created, 2),
            "clock": self.clock.modes(),
            "events": dict(self.counts),
            "frames_sent": self.output.sent,
            "sync": {"checks": self._sync_total, "passed": self._sync_ok},
            "degraded": dict(self.degraded),
            "lst": lst,
        }

    async def close(self, reason: str) -> None:
        """End the session once: stop the AU thread, the ASR stream, the tasks and the connection."""
        if self._closing:
            return
        self._closing = True
        self.end_reason = reason
        log.info("session %s ended: %s", self.id, reason)
        self._stop.set()
        with self._slot_cond:
            self._slot_cond.notify_all()
        self.output.stop()
        stream, self._asr_stream = self._asr_stream, None
        if stream is not None:
            closer = getattr(stream, "close", None)
            try:
                result = closer() if callable(closer) else None
                if asyncio.iscoroutine(result):
                    await result
            except Exception as exc:  # noqa: BLE001
                log.warning("session %s: closing the ASR stream: %s", self.id, exc)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        try:
            await asyncio.wait_for(self.pc.close(), 5.0)
        except Exception as exc:  # noqa: BLE001
            log.warning("session %s: closing the peer connection: %s", self.id, exc)
        if self._au_thread is not None:
            await asyncio.to_thread(self._au_thread.join, 3.0)
        # Free the decoded frames and evidence now: reference cycles (peer-connection callbacks ↔
        # session) would hold them (~20 MB) until the next full garbage collection.
        self._camera.clear()
        self._slot = None
        self._offset_estimator = None
        if self.stages.lst is not None:
            with contextlib.suppress(Exception):
                self.stages.lst.remove(self.id)
        if self.on_end is not None:
            self.on_end(self, reason)

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def running_tasks(self) -> list[asyncio.Task]:
        """This session's tasks not yet done. (A finished task is forgotten by its done-callback,
        which runs a loop turn later: the close task is still listed just after it returned.)"""
        return [t for t in self._tasks if not t.done()]

    def threads_alive(self) -> bool:
        return self._au_thread is not None and self._au_thread.is_alive()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        task.set_name(f"{self.id}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            name = task.get_name().split(":", 1)[-1]
            if name in ("video-in", "audio-in"):
                log.error("session %s: %s failed: %r", self.id, name, exc)
                if not self._closing:
                    self._spawn(self.close(f"{name} failed: {exc}"), "close")
            else:
                self.fail_stage(name, exc)  # type: ignore[arg-type]


class OutputTrack(MediaStreamTrack):
    """The 16 fps video the session sends back: frame k rendered at camera time k/16 + output delay."""

    kind = "video"

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.next_index = 0
        self.sent = 0
        self._fallback: np.ndarray | None = None

    async def recv(self) -> av.VideoFrame:
        s = self.session
        while not s.clock.started:
            if self.readyState != "live":
                raise MediaStreamError
            await asyncio.sleep(0.02)
        if self.readyState != "live":
            raise MediaStreamError
        zero = s.clock.zero_wall
        assert zero is not None
        delay = s.config.output_delay_s
        k = self.next_index
        behind = math.floor((time.monotonic() - zero - delay) * FPS) - k
        if behind > 2:  # rendering fell behind real time: skip ahead rather than queue up
            s.metrics.drop("output_frames", behind)
            k += behind
        due = zero + frame_pts(k) + delay
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self.next_index = k + 1
        build = s.render_request(k)
        c0 = time.monotonic()
        frame = await asyncio.get_running_loop().run_in_executor(_RENDER_POOL, self._render_frame, build)
        s.metrics.observe_stage("render", time.monotonic() - (zero + frame_pts(k)), time.monotonic() - c0)
        s.prune(k)
        frame.pts = int(round(frame_pts(k) * _VIDEO_CLOCK))
        frame.time_base = Fraction(1, _VIDEO_CLOCK)
        self.sent += 1
        return frame

    def _render_frame(self, build: Callable[[], Any]) -> av.VideoFrame:
        """Render thread: the frame as the encoder takes it (yuv420p), so it is not converted later
        in aiortc's encoder thread by libswscale (~10x slower for this conversion)."""
        return to_yuv420p(self._render(build))

    def _render(self, build: Callable[[], Any]) -> np.ndarray:
        request = build()
        renderer = self.session.stages.renderer
        if renderer is not None and "render" not in self.session.degraded:
            try:
                return renderer.render(request)
            except Exception as exc:  # noqa: BLE001
                self.session.loop.call_soon_threadsafe(self.session.fail_stage, "render", exc)
        if request.camera is not None:
            return request.camera
        w, h = request.size
        if self._fallback is None or self._fallback.shape[:2] != (h, w):
            self._fallback = np.zeros((h, w, 3), np.uint8)
        return self._fallback


# --- helpers --------------------------------------------------------------------------------


def to_yuv420p(image: np.ndarray) -> av.VideoFrame:
    """An RGB image as a yuv420p frame (BT.601 limited range, what libswscale gives: same values)."""
    h, w = image.shape[:2]
    if _cv2 is not None and h % 2 == 0 and w % 2 == 0:
        yuv = _cv2.cvtColor(np.ascontiguousarray(image), _cv2.COLOR_RGB2YUV_I420)
        return av.VideoFrame.from_ndarray(yuv, format="yuv420p")
    return av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")


class FrameRate:
    """Which frames a stage processes to run at most ``fps`` on average, decided on their pts.

    A credit bucket, not a minimum gap: at 16/s from a 25 fps camera it takes 16 frames of every 25
    (a minimum gap of 1/16 s would take every other frame, 12.5/s). A frame whose pts goes backwards
    (a clock step) is taken and restarts the count.
    """

    def __init__(self, fps: float) -> None:
        if fps <= 0:
            raise ValueError("fps must be > 0")
        self.fps = fps
        self._credit = 1.0
        self._last: float | None = None

    def take(self, pts: float) -> bool:
        if self._last is not None and pts >= self._last:
            self._credit = min(2.0, self._credit + (pts - self._last) * self.fps)  # ≤ 1 frame ahead
        else:
            self._credit = 1.0
        self._last = pts
        if self._credit >= 1.0 - 1e-9:
            self._credit -= 1.0
            return True
        return False


def place_token(
    tok: WordToken, prev: WordToken | None, prev_frames: tuple[int, ...], next_frame: int
) -> tuple[tuple[int, ...], bool]:
    """The output frames that will actually carry ``tok``, and whether that is later than ideal.

    Ideal: the frames within ±40 ms of its start. Frames already sent cannot carry it any more, so
    a token that arrives after its frames went out is drawn on the next frame (``late``). A revision
    of a word already on screen (same text) keeps the frames it was first presented on.
    """
    ideal = frames_for_time(tok.start)
    if prev is not None and prev_frames and prev_frames[0] < next_frame and _norm(prev.text) == _norm(tok.text):
        frames = prev_frames
    else:
        frames = tuple(k for k in ideal if k >= next_frame) or (next_frame,)
    late = bool(ideal) and frames[0] != ideal[0]
    return frames, late


def _hook_receiver(receiver: Any, tclock: TrackClock) -> None:
    """Feed the track's first packet arrival and RTCP sender reports to its clock.

    aiortc keeps both inside ``RTCRtpReceiver`` (no public API), so its two packet handlers are
    wrapped per instance; everything else still goes to aiortc unchanged.
    """
    from aiortc.rtp import RtcpSrPacket

    original = receiver._handle_rtcp_packet
    original_rtp = receiver._handle_rtp_packet

    async def handle_rtp(packet: Any, arrival_time_ms: int) -> None:
        if tclock.first_pts is None and packet.payload:
            tclock.on_first_packet(int(packet.timestamp), time.monotonic())
        await original_rtp(packet, arrival_time_ms)

    receiver._handle_rtp_packet = handle_rtp

    async def handle(packet: Any) -> None:
        if isinstance(packet, RtcpSrPacket):
            _set_origin(receiver, tclock)
            info = packet.sender_info
            tclock.on_sender_report(SenderReport(ntp_to_seconds(info.ntp_timestamp), info.rtp_timestamp))
        await original(packet)

    receiver._handle_rtcp_packet = handle


def _set_origin(receiver: Any, tclock: TrackClock) -> None:
    """The raw RTP timestamp aiortc's frame.pts counts from (its private TimestampMapper origin)."""
    if tclock.origin is not None or receiver is None:
        return
    mapper = getattr(receiver, "_RTCRtpReceiver__timestamp_mapper", None)
    origin = getattr(mapper, "_origin", None)
    if isinstance(origin, int):
        tclock.set_origin(origin)


def _flash_of(frame: av.VideoFrame) -> float:
    """Marker-patch brightness of a decoded frame, read from its luma plane (no colour conversion)."""
    from alignment.evidence import flash_score

    if frame.format.name in ("yuv420p", "yuvj420p", "nv12"):
        plane = frame.planes[0]
        luma = np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)[:, : plane.width]
        return float(flash_score(luma))
    return float(flash_score(frame.to_ndarray(format="gray")))


def _default_pacer(policy: Any) -> Any:
    from alignment.pacing import TokenPacer

    return TokenPacer(policy)


def _default_policy() -> Any:
    """The policy before the controller has spoken (or without one): level 0's."""
    try:
        from models.controller import policy_for_level

        return policy_for_level(0)
    except ImportError:
        from alignment.types import TokenRatePolicy

        return TokenRatePolicy(tokens_per_s=12.0, max_tokens=256, temperature=0.8)


def _lst_dict(snap: Any) -> dict[str, Any]:
    if isinstance(snap, dict):
        return snap
    return {k: getattr(snap, k, None) for k in ("ttft_ms_p99", "itl_ms_max", "jitter_ms", "tier")}


__all__ = ["Session", "SessionConfig", "Stages", "OutputTrack", "TOLERANCE_S"]
