"""One live WebRTC session: incoming tracks → one clock → stages → events and a 16 fps video back.

:class:`Session` builds its stages (each given what it needs in its constructor) and each does one job:
ingest (``app.live.ingest``: tracks onto the session clock); AU (``app.live.au``: latest frame → AUs
→ load controller → ``au`` / ``load``); words (``app.live.words``: audio → ASR → ``token`` events
placed on output frames, then Level-3 ``sync``); response (``app.live.response``: turn ends → the
responder → paced ``response`` tokens → ``lst``); output (``app.live.output``: frame k drawn
``output_delay_s`` after camera time k/16, so its words are usually known); answer (``app.live.answer``:
the spoken answer and its avatar in one MediaStream, every mic chunk through the barge-in detector
first). docs/ARCHITECTURE.md follows a word through them.

A stage that fails degrades only its own session (an ``error`` event and a log line); losing the media
or the connection ends the session. Stages the server could not load are absent: the session never
invents their events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection, RTCRtpReceiver, RTCRtpTransceiver

from alignment.clock import SessionClock, TrackClock
from alignment.frames import FPS
from alignment.lst import LSTMeter
from alignment.types import AudioChunk
from app.live import tracing
from app.live.answer import AnswerPlayer
from app.live.answer_lst import ConversationTrace
from app.live.au import FaceAnalysis
from app.live.degrade import Degradation
from app.live.events import ErrorEvent, HelloEvent
from app.live.ingest import MAX_VIDEO_PIXELS, open_track, read_audio, read_video
from app.live.level3 import OffsetFeed, SyncStage
from app.live.observe import Drop, MetricsObserver
from app.live.output import CameraFrames, FrameComposer, FrameSources, OutputTrack
from app.live.response import Responses
from app.live.server_metrics import ServerMetrics
from app.live.stages import BargeInDetector, SessionConfig, Stage, Stages, WireEvent, attempt
from app.live.turns import TurnDetector
from app.live.webrtc import media_clock_reports, share_stream, share_transport
from app.live.words import ShownWords, Transcript

log = logging.getLogger("synchrony.session")

_CHANNEL_MAX_BUFFERED = 1 << 20  # bytes queued on the events channel before messages are dropped
_INGEST = (Stage.VIDEO_IN, Stage.AUDIO_IN)  # a failing read loop ends the session


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
        degradation: Degradation | None = None,
        traceparent: str | None = None,
    ) -> None:
        """``degradation``: the server's overload degradation (None: never degrade); ``traceparent``:
        the WHIP POST's, so the session's trace joins the caller's (``app.live.tracing``)."""
        self.id = session_id
        self.trace = ConversationTrace(tracing.session_span(session_id, traceparent))
        self.pc = pc
        self.stages = stages
        self.config = config
        self.observer = MetricsObserver(metrics)
        self.on_end = on_end
        self.clock = SessionClock()
        self.loop = asyncio.get_running_loop()
        self.created = time.monotonic()
        self.end_reason: str | None = None
        self._degraded: dict[str, str] = {}
        self.channel: RTCDataChannel | None = None
        self.last_media_wall = time.monotonic()
        self.counts: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._degradation = degradation
        self.camera = CameraFrames()
        self.shown = ShownWords()
        # The stages, built by ``attach`` once the offer says what the client sends and receives:
        self.feed: OffsetFeed | None = None
        self.faces: FaceAnalysis | None = None
        self.sync: SyncStage | None = None
        self.responses: Responses | None = None
        self._lst: LSTMeter | None = None
        self.output: OutputTrack | None = None
        self.words: Transcript | None = None  # once the microphone's track opened an ASR stream
        self.answers: AnswerPlayer | None = None
        self.bargein: BargeInDetector | None = None
        self._camera_track: MediaStreamTrack | None = None
        self._mic_track: MediaStreamTrack | None = None

    @property
    def degraded(self) -> Mapping[str, str]:
        """Stages of this session that failed, and why."""
        return self._degraded

    # --- wiring -----------------------------------------------------------------------------

    def hook(self) -> None:
        """Register the peer connection's callbacks (before the offer is applied: it emits tracks)."""
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)

    def attach(self) -> None:
        """After the offer is applied: build the stages, send the output video (and the answer's tracks
        where the server speaks)."""
        video = [t for t in self.pc.getTransceivers() if t.kind == "video"]
        if self.stages.voice is not None and self.config.answer is not None:
            self._attach_answers(video[1] if len(video) > 1 else None, video[0] if video else None)
        self.output = self._build_stages()
        if video:
            video[0].sender.replaceTrack(self.output)
            video[0].direction = "sendrecv"
            share_stream([video[0].sender])  # the captioned camera: a stream of its own
        if self._camera_track is not None and self.faces is not None:
            self.faces.start()
        self._open_words()
        self.spawn(self._watchdog(), Stage.WATCHDOG)

    def _build_stages(self) -> OutputTrack:
        """Each stage with the next ones it feeds, the last first, so nothing is wired afterwards:
        Level-3 and the answers, then the faces that feed them, then the returned video."""
        st, config = self.stages, self.config
        validator = attempt(self, Stage.SYNC, st.make_validator) if st.make_validator is not None else None
        estimator = attempt(self, Stage.SYNC, st.make_offset_estimator) if st.make_offset_estimator else None
        self.feed = OffsetFeed(self, estimator)
        if st.lst is not None:
            lst = st.lst
            self._lst = attempt(self, Stage.LST, lambda: lst.meter(self.id))
        responder = attempt(self, Stage.RESPONSE, st.make_responder) if st.make_responder is not None else None
        if validator is not None:
            self.sync = SyncStage(self, validator, self.feed, self.observer, self.trace)
        if responder is not None:
            turns = TurnDetector(config.turn) if config.turn is not None else None
            history = config.answer.history_turns if config.answer is not None else 8
            self.responses = Responses(self, responder, turns, self.clock, st.make_pacer, self._lst, self.observer,
                                       player=self.answers, history_turns=history, trace=self.trace)
        self.faces = FaceAnalysis(self, config, st, self.clock, self.observer, self._degradation,
                                  visual=self.feed.visual,
                                  load_changed=self.responses.set_load if self.responses is not None else None)
        sources = FrameSources(self.camera, self.shown, self.faces, self.sync)
        composer = FrameComposer(self, sources, st.renderer, config.output_size, self._degradation)
        return OutputTrack(self.clock, config.output_delay_s, composer, self.observer)

    def _attach_answers(self, avatar_transceiver: RTCRtpTransceiver | None,
                        camera_transceiver: RTCRtpTransceiver | None) -> None:
        """The answer's audio on the audio m-line (now sendrecv) and its avatar on the second video
        m-line, in one MediaStream, their sender reports on the media clock."""
        st, config = self.stages, self.config.answer
        assert st.voice is not None and config is not None
        audio = next((t for t in self.pc.getTransceivers() if t.kind == "audio"), None)
        if audio is None:
            return
        if st.make_bargein is not None:
            self.bargein = attempt(self, Stage.BARGE_IN, st.make_bargein)
        bargein = self.bargein
        player = AnswerPlayer(self, self.clock, st.voice, config, self.observer,
                              on_played=bargein.played if bargein is not None else None)
        audio.sender.replaceTrack(player.audio_track)
        audio.direction = "sendrecv"
        senders = [audio.sender]
        zero = lambda: self.clock.zero_wall  # noqa: E731
        origin = media_clock_reports(audio.sender, player.audio_track.rtp_of, zero)
        player.rtp_origin = lambda: origin.value
        avatar = player.enable_avatar() if avatar_transceiver is not None else None
        if avatar is not None and avatar_transceiver is not None and camera_transceiver is not None:
            share_transport(avatar_transceiver, camera_transceiver)
            avatar_transceiver.sender.replaceTrack(avatar)
            avatar_transceiver.direction = "sendrecv"
            media_clock_reports(avatar_transceiver.sender, avatar.rtp_of, zero)
            senders.append(avatar_transceiver.sender)
        share_stream(senders)
        self.answers = player

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != "events":
            log.info("session %s: ignoring data channel %r", self.id, channel.label)
            return
        self.channel = channel
        player = self.answers
        self.emit(HelloEvent(self.id, FPS, self.config.output_delay_s, self._available_stages(),
                             self.stages.missing, answer_audio=player is not None,
                             answer_video=player is not None and player.avatar_track is not None,
                             voice=player.voice.name if player is not None else ""))

    def _available_stages(self) -> tuple[Stage, ...]:
        s = self.stages
        present = ((Stage.VIDEO, True), (Stage.AU, s.make_faces is not None),
                   (Stage.LOAD, s.make_controller is not None), (Stage.TOKEN, s.asr_worker is not None),
                   (Stage.SYNC, s.make_validator is not None), (Stage.RESPONSE, s.make_responder is not None),
                   (Stage.LST, s.lst is not None))
        return tuple(stage for stage, here in present if here)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video" and self._camera_track is not None:
            log.info("session %s: a second incoming video track is not read", self.id)
            self.spawn(_drain(track), Stage.VIDEO_IN)
            return
        if track.kind == "video":
            self._camera_track = track
        tclock, receiver = open_track(self.pc, self.clock, track)
        if track.kind == "video":
            self.spawn(self._video_in(track, tclock, receiver), Stage.VIDEO_IN)
            if self.faces is not None:  # else ``attach`` starts it
                self.faces.start()
        elif track.kind == "audio":
            self._mic_track = track
            self._open_words()
            self.spawn(self._audio_in(track, tclock, receiver), Stage.AUDIO_IN)

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state in ("failed", "closed"):
            self.spawn(self.close(f"connection {state}"), Stage.CLOSE)

    # --- events out -------------------------------------------------------------------------

    def emit(self, event: WireEvent) -> bool:
        """Send one event to the client; drops (and counts) when the channel is backed up."""
        ch = self.channel
        if ch is None or ch.readyState != "open":
            return False
        if ch.bufferedAmount > _CHANNEL_MAX_BUFFERED:
            self.observer.dropped(Drop.EVENTS)
            return False
        try:
            ch.send(json.dumps(event.to_wire(), separators=(",", ":")))
        except Exception as exc:  # noqa: BLE001 - a closing channel must not take the session down
            log.debug("session %s: event dropped: %s", self.id, exc)
            return False
        self.counts[event.type] = self.counts.get(event.type, 0) + 1
        return True

    def fail_stage(self, stage: Stage, exc: BaseException) -> None:
        """Degrade one stage of this session: log why, tell the client, keep the rest running."""
        if stage in self._degraded:
            return
        reason = f"{type(exc).__name__}: {exc}"
        self._degraded[str(stage)] = reason
        self.observer.stage_failed(stage)
        log.error("session %s: stage %s degraded: %s", self.id, stage, reason, exc_info=exc)
        self.emit(ErrorEvent(stage, reason))

    # --- media in (called by the read loops) ------------------------------------------------

    async def _video_in(self, track: MediaStreamTrack, tclock: TrackClock, receiver: RTCRtpReceiver | None) -> None:
        await read_video(track, tclock, receiver, self)
        await self.close("video track ended")

    async def _audio_in(self, track: MediaStreamTrack, tclock: TrackClock, receiver: RTCRtpReceiver | None) -> None:
        await read_audio(track, tclock, receiver, self)
        await self.close("audio track ended")

    def _open_words(self) -> None:
        """The words stage on the microphone's ASR stream, once there is a microphone and the stages
        it feeds are built (``attach``)."""
        worker = self.stages.asr_worker
        if worker is None or self.words is not None or self._mic_track is None or self.output is None:
            return
        stream = attempt(self, Stage.ASR, lambda: worker.open(self.id))
        if stream is not None:
            self.words = Transcript(self, stream, self.shown, self.output, self.clock, self.observer, self.trace,
                                    responses=self.responses, sync=self.sync)
            self.spawn(self.words.run(), Stage.ASR_EVENTS)

    def media_arrived(self, wall: float) -> None:
        self.last_media_wall = wall

    def oversized(self, frame: av.VideoFrame) -> None:
        """A camera frame too large to keep: degrade, count, go on."""
        self.observer.dropped(Drop.VIDEO_OVERSIZED)
        self.fail_stage(Stage.VIDEO, ValueError(
            f"camera frame {frame.width}x{frame.height} is larger than {MAX_VIDEO_PIXELS} pixels; "
            "frames that large are dropped"))

    def camera_frame(self, t: float, frame: av.VideoFrame, arrival: float) -> None:
        self.camera.append(t, frame)
        if self.feed is None or self.faces is None:  # media before ``attach``: nothing reads it yet
            return
        self.feed.camera_frame(t, frame, self.faces.started and Stage.AU not in self._degraded)
        self.faces.offer(t, frame, arrival)

    def audio(self, pts: float, samples: np.ndarray) -> None:
        chunk = AudioChunk(pts, samples)  # frozen: one per 20 ms for every consumer
        if self.bargein is not None and self.answers is not None:
            chunk = self._through_bargein(chunk, self.bargein, self.answers)
        if self.words is not None and self.words.push(chunk) and self.feed is not None:
            self.feed.audio(chunk)
        if self.responses is not None and self.responses.turns is not None:
            self.responses.audio(chunk)

    def _through_bargein(self, chunk: AudioChunk, detector: BargeInDetector, player: AnswerPlayer) -> AudioChunk:
        """The mic chunk without the answer's echo; the user speaking over the answer stops it."""
        if Stage.BARGE_IN in self._degraded:
            return chunk
        try:
            cleaned, barge = detector.feed(chunk, player.answering)
        except Exception as exc:  # noqa: BLE001 - the detector failing leaves the raw mic audio
            self.fail_stage(Stage.BARGE_IN, exc)
            return chunk
        if barge is not None and player.answering:
            log.info("session %s: barge-in at %.3f s", self.id, barge.pts)
            self.observer.barge_in()
            if self.responses is not None:
                self.responses.barge_in()
            else:
                player.stop()
        return cleaned

    # --- lifecycle ----------------------------------------------------------------------------

    async def _watchdog(self) -> None:
        """Reap a session whose media stopped (a peer that vanished without closing)."""
        while not self._closing:
            await asyncio.sleep(min(1.0, self.config.media_timeout_s / 4))
            if time.monotonic() - self.last_media_wall > self.config.media_timeout_s:
                self.spawn(self.close("media timeout"), Stage.CLOSE)
                return

    def held(self) -> tuple[int, int, int]:
        """What the session holds in memory now (camera frames, placed tokens, frames with words):
        each is bounded, and the reliability checks watch that they stay so."""
        return (len(self.camera), *self.shown.held())

    def summary(self) -> dict[str, object]:
        lst = attempt(self, Stage.LST, self._lst.snapshot) if self._lst is not None else None
        sync = self.sync
        return {
            "session": self.id,
            "age_s": round(time.monotonic() - self.created, 2),
            "clock": self.clock.modes(),
            "events": dict(self.counts),
            "frames_sent": self.output.sent if self.output is not None else 0,
            "answer": self.answers.summary() if self.answers is not None else None,
            "sync": {"checks": sync.total if sync else 0, "passed": sync.passed if sync else 0},
            "degraded": dict(self._degraded),
            "lst": lst,
        }

    async def close(self, reason: str) -> None:
        """End the session once: stop the AU thread, the ASR stream, the tasks and the connection."""
        if self._closing:
            return
        self._closing = True
        self.end_reason = reason
        log.info("session %s ended: %s", self.id, reason)
        if self.faces is not None:
            self.faces.stop()
        if self.output is not None:
            self.output.stop()
        if self.answers is not None:
            self.answers.close()
        if self.words is not None:
            self.words.close()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        try:
            await asyncio.wait_for(self.pc.close(), 5.0)
        except Exception as exc:  # noqa: BLE001
            log.warning("session %s: closing the peer connection: %s", self.id, exc)
        if self.faces is not None:
            await self.faces.join()
            self.faces.forget_frame()
        # Free the decoded frames and evidence now: reference cycles (peer-connection callbacks ↔
        # session) would hold them (~20 MB) until the next full garbage collection.
        self.camera.clear()
        if self.feed is not None:
            self.feed.estimator = None
        if self.stages.lst is not None:
            with contextlib.suppress(Exception):
                self.stages.lst.remove(self.id)
        self.trace.root.set({"synchrony.end_reason": reason})
        self.trace.root.end()
        if self.on_end is not None:
            self.on_end(self, reason)

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def running_tasks(self) -> list[asyncio.Task[None]]:
        """This session's tasks not yet done. (A finished task is forgotten by its done-callback,
        which runs a loop turn later: the close task is still listed just after it returned.)"""
        return [t for t in self._tasks if not t.done()]

    def threads_alive(self) -> bool:
        return self.faces is not None and self.faces.alive()

    def spawn(self, coro: Coroutine[object, object, None], name: Stage) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        task.set_name(f"{self.id}:{name}")
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, name))
        return task

    def _task_done(self, task: asyncio.Task[None], name: Stage) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if name in _INGEST:
                log.error("session %s: %s failed: %r", self.id, name, exc)
                if not self._closing:
                    self.spawn(self.close(f"{name} failed: {exc}"), Stage.CLOSE)
            else:
                self.fail_stage(name, exc)


async def _drain(track: MediaStreamTrack) -> None:
    """Read a track nobody uses, so aiortc's queue for it does not grow."""
    with contextlib.suppress(Exception):
        while True:
            await track.recv()


__all__ = ["Session", "SessionConfig", "Stages", "OutputTrack"]
