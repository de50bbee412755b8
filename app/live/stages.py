"""The live session's stages by name, what each needs from the models, and the shared factories.

One name per stage (:class:`Stage`): configuration (``ServerConfig.stages``, warm-up's ``missing``),
the ``hello`` and ``error`` events, degradation and the metrics' ``stage`` labels all use it. It is a
``str`` enum whose values are the strings on the wire and in the CLI, so neither changed.

The Protocols say what the session calls on each model, so a reader can follow a word from the
ASR stream to the frame that shows it without opening ``models/``; tests may pass small fakes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from alignment.types import (
    AudioChunk,
    AUSample,
    LoadEstimate,
    SpokenPhone,
    SpokenPhrase,
    SyncCheck,
    TokenRatePolicy,
    VideoFrame,
    WordToken,
)
from app.live.turns import TurnConfig

if TYPE_CHECKING:
    from alignment.evidence import OffsetEstimate, VisualObservation
    from alignment.lst import LSTAggregate
    from alignment.pacing import PacedToken
    from models.asr import UtteranceEnd
    from models.faces import FaceObservation
    from models.responders import Conversation, RequestTimes
    from models.video import FrameRenderer



#: JSON values as the wire events carry them.
Wire = dict[str, object]


class WireEvent(Protocol):
    """A wire event (app.live.events has one per ``type``): what the session sends to the client."""

    type: str

    def to_wire(self) -> Wire: ...

class Stage(StrEnum):
    """Every stage name in use; the values are today's strings (wire, CLI, metrics labels)."""

    # models a server warms up (``ServerConfig.stages``, ``missing``)
    FACES = "faces"
    CONTROLLER = "controller"
    ASR = "asr"
    RENDER = "render"
    SYNC = "sync"
    RESPONSE = "response"
    LST = "lst"
    # what a session emits (``hello``'s ``stages``; ``error``'s ``stage``)
    VIDEO = "video"
    AU = "au"
    LOAD = "load"
    TOKEN = "token"
    # latency labels of ``synchrony_stage_latency_seconds`` (besides ``au`` and ``render``)
    TOKEN_INTERIM = "token_interim"
    TOKEN_FINAL = "token_final"
    # CPU accounting only (``app.live.cpu_account``): threads that belong to no model
    VP8_ENCODE = "vp8_encode"
    VP8_DECODE = "vp8_decode"
    OPUS_DECODE = "opus_decode"
    EVENT_LOOP = "event_loop"
    OTHER = "other"
    UNATTRIBUTED = "unattributed"
    # a session's own tasks: a task that fails reports under its name (``error``'s ``stage``)
    VIDEO_IN = "video-in"
    AUDIO_IN = "audio-in"
    ASR_EVENTS = "asr-events"
    RESPONSE_PREFETCH = "response-prefetch"
    ANSWER = "answer"  # the spoken answer's synthesis task
    TTS = "tts"  # the speech synthesizer (``warning``'s ``stage``)
    BARGE_IN = "barge-in"  # the echo canceller and barge-in detector
    WATCHDOG = "watchdog"
    CLOSE = "close"


# --- what the session needs from each model --------------------------------------------------------


class ASRStream(Protocol):
    """One session's handle on the shared ASR worker (``models.asr.ASRStream``)."""

    def push(self, chunk: AudioChunk) -> None: ...
    def close(self) -> None: ...
    def events(self) -> AsyncIterator[WordToken | UtteranceEnd]: ...


class ASRWorker(Protocol):
    """The ASR shared by every session (``models.asr.ASRWorker``)."""

    def open(self, session_id: str) -> ASRStream: ...
    def set_step_s(self, step_s: float | None) -> None: ...
    def stop(self) -> None: ...


class FaceExtractor(Protocol):
    """Face AUs of one camera frame (``models.faces.FaceAUExtractor``)."""

    def extract_full(self, frame: VideoFrame) -> FaceObservation: ...
    def close(self) -> None: ...


class Controller(Protocol):
    """AU window → load level and policy (``models.controller.LoadController``)."""

    def step(self, sample: AUSample) -> LoadEstimate | None: ...


class Validator(Protocol):
    """The Level-3 check of one final word (``alignment.sync.Level3Validator``)."""

    def check_estimate(self, token: WordToken, video_pts: float, estimate: OffsetEstimate | None,
                       onset: float | None) -> SyncCheck: ...


class OffsetEstimator(Protocol):
    """Independent A/V evidence: sync-marker flashes, lips, acoustic onsets (``alignment.evidence``)."""

    def push_audio(self, chunk: AudioChunk) -> None: ...
    def push_visual(self, obs: VisualObservation) -> None: ...
    def estimate(self) -> OffsetEstimate: ...
    def acoustic_onset(self, near: float, previous: float | None = None) -> float | None: ...


class Responder(Protocol):
    """The answer's text, token by token (``models.responders.Responder``)."""

    prefetch: bool

    def tokens(self, utterance: str, policy: TokenRatePolicy, times: RequestTimes | None = None,
               headers: Mapping[str, str] | None = None,
               context: Conversation | None = None) -> AsyncIterator[str]: ...


class BargeIn(Protocol):
    """``models.bargein.BargeIn``: the user's speech onset over the answer."""

    pts: float


class BargeInDetector(Protocol):
    """Mic audio with the answer's echo removed, and the user's speech over it (``models.bargein``)."""

    def played(self, pts: float, samples: np.ndarray) -> None: ...
    def feed(self, chunk: AudioChunk, answering: bool) -> tuple[AudioChunk, BargeIn | None]: ...


class Pacer(Protocol):
    """Releases response tokens at the policy's rate (``alignment.pacing.TokenPacer``)."""

    @property
    def policy(self) -> TokenRatePolicy: ...
    @property
    def interval_s(self) -> float: ...
    def continue_from(self, interval_s: float | None) -> None: ...
    def set_policy(self, policy: TokenRatePolicy) -> None: ...
    def pace(self, tokens: AsyncIterator[str]) -> AsyncIterator[PacedToken]: ...


# --- the spoken answer (app.live.answer): models.tts, models.avatar, models.visemes -----------------


class Synthesizer(Protocol):
    """``models.tts.SpeechSynthesizer``."""

    name: str

    async def synthesize(self, text: str, wpm: float) -> SpokenPhrase: ...
    async def aclose(self) -> None: ...


class Mouth(Protocol):
    """``models.visemes.MouthShape``."""

    open: float
    width: float
    round: float


class Avatar(Protocol):
    """``models.avatar.AvatarRenderer``: thread-safe, drawn in the render pool."""

    size: tuple[int, int]

    def draw(self, mouth: Mouth, caption: tuple[str, ...] = (), highlight: int | None = None, *,
             t: float | None = None) -> np.ndarray: ...


class Chunker(Protocol):
    """``models.tts.PhraseChunker``."""

    def feed(self, piece: str) -> list[str]: ...
    def flush(self) -> list[str]: ...


@dataclass(frozen=True)
class Voice:
    """What speaks an answer and draws its face: the shared models of a server."""

    synthesizer: Synthesizer
    make_chunker: Callable[[], Chunker]
    wpm: Callable[[TokenRatePolicy], float]  # load policy → speaking rate
    avatar: Avatar | None = None
    mouth_at: Callable[[Sequence[SpokenPhone], float], Mouth] | None = None  # (phones, s into the phrase)
    rest: Mouth | None = None
    name: str = ""
    #: a phrase's phones made ready for one ``mouth_at`` call per frame (``models.visemes.timeline``)
    prepare: Callable[[Sequence[SpokenPhone]], Sequence[SpokenPhone]] | None = None


@dataclass(frozen=True)
class AnswerConfig:
    """Per-session knobs of the spoken answer (``ServerConfig`` fills them)."""

    history_turns: int = 8  # turns of conversation a responder sees
    #: TEST ONLY: draw the avatar this many seconds behind the audio it is stamped with (the injected
    #: A/V shift that the answer's Level-3 must catch). Never set by the CLI.
    avatar_shift_s: float = 0.0


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
    # Spoken answers (app/live/answer.py) where the server has a voice; None: answers are text only.
    answer: AnswerConfig | None = None
    # what one session may cost whatever its sender sends (app.live.limits): camera frames scaled down to fit
    # this size and dropped above this rate before the face stage; RTP above the bitrate dropped
    max_video_size: tuple[int, int] = (1280, 720)
    max_video_fps: float = 30.0
    max_bitrate_kbps: int = 4000


@dataclass
class Stages:
    """The shared, warmed-up stage factories; ``None`` where a stage is unavailable."""

    asr_worker: ASRWorker | None = None
    make_faces: Callable[[], FaceExtractor] | None = None
    make_controller: Callable[[], Controller] | None = None
    renderer: FrameRenderer | None = None
    make_validator: Callable[[], Validator] | None = None
    make_offset_estimator: Callable[[], OffsetEstimator] | None = None
    make_responder: Callable[[], Responder] | None = None
    make_pacer: Callable[[TokenRatePolicy], Pacer] | None = None
    lst: LSTAggregate | None = None  # one meter per session, pooled for /metrics/lst
    voice: Voice | None = None  # speaks the answers (synthesizer, chunker, avatar), shared by every session
    make_bargein: Callable[[], BargeInDetector] | None = None
    missing: dict[str, str] = field(default_factory=dict)


# --- what a stage needs from the session that owns it ----------------------------------------------


class StageHost(Protocol):
    """The session as its stages see it: events out, failures, tasks, and the degraded stages."""

    id: str
    loop: asyncio.AbstractEventLoop

    @property
    def degraded(self) -> Mapping[str, str]: ...
    def emit(self, event: WireEvent) -> bool: ...
    def fail_stage(self, stage: Stage, exc: BaseException) -> None: ...
    def spawn(self, coro: Coroutine[object, object, None], name: Stage) -> asyncio.Task[None]: ...


T = TypeVar("T")


def attempt(host: StageHost, stage: Stage, fn: Callable[[], T]) -> T | None:
    """``fn()``, or None once it failed: one stage failing degrades only that stage."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - one stage failing degrades only that stage
        host.fail_stage(stage, exc)
        return None
