"""Warm-up: build every live stage (``app.pipeline``) and run one inference through each before the
server says ready, so no session pays a cold start; what each took is kept for ``/readyz`` and
``/metrics``, and a stage that cannot load is recorded as missing (the server serves without it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from alignment.blas import single_threaded_blas
from alignment.espeak import synthesize_speech
from alignment.types import AU_NAMES, AUSample, VideoFrame
from app import pipeline
from app.live.asr_prestart import take_started_lanes
from app.live.config import ServerConfig
from app.live.session import Stages
from app.talking_face import talking_face_frames

log = logging.getLogger("synchrony.server")

T = TypeVar("T")

#: Stages that warm up on this thread, in this order; ``asr`` (the long pole) runs beside them.
_ORDER = ("faces", "controller", "render", "sync", "response", "lst")


@dataclass
class WarmState:
    """Stages and how long each took to load and to run once."""

    stages: Stages = field(default_factory=Stages)
    cold_start: dict[str, dict[str, float]] = field(default_factory=dict)
    ready: bool = False
    started: float = field(default_factory=time.monotonic)
    #: set when the server stops during warm-up: the stages not yet begun are skipped
    stopping: threading.Event = field(default_factory=threading.Event)
    ready_after_s: float | None = None

    def timed(self, model: str, phase: str, fn: Callable[[], T]) -> T:
        """``fn()``, its wall seconds recorded as ``cold_start[model][phase]``."""
        t0 = time.perf_counter()
        out = fn()
        self.cold_start.setdefault(model, {})[phase] = round(time.perf_counter() - t0, 4)
        return out


def warm_up(config: ServerConfig, state: WarmState) -> None:
    """Load every available stage and run one inference through it; record what is missing and why."""
    # One BLAS thread for the server process, before any stage runs: OpenBLAS's idle workers spin
    # after each call, and with the decode lanes in their own processes nothing here set it lazily.
    single_threaded_blas()
    probe = warmup_frame(config)
    warmers: dict[str, Callable[[], None]] = {
        "asr": lambda: _warm_asr(config, state),
        "faces": lambda: _warm_faces(state, probe),
        "controller": lambda: _warm_controller(state),
        "render": lambda: _warm_render(config, state, probe),
        "sync": lambda: _warm_sync(state),
        "response": lambda: _warm_response(config, state),
        "lst": lambda: _warm_lst(state),
    }
    # Whisper is the long pole: it loads and runs in its own thread while the rest warm up here.
    asr_thread = threading.Thread(target=_attempt, args=(config, state, "asr", warmers["asr"]),
                                  name="warm-up-asr", daemon=True)
    asr_thread.start()
    for name in _ORDER:
        _attempt(config, state, name, warmers[name])
    if config.tts != "off":  # spoken answers: not a stage of ``config.stages``, ``tts`` switches them
        _attempt(config, state, "tts", lambda: _warm_voice(config, state), always=True)
    asr_thread.join()


async def release(stages: Stages) -> None:
    """End what ``warm_up`` started for a server that is shutting down: the ASR lanes (child processes)
    and the answer's synthesizer (festival processes and their work directory). Sessions are closed first.
    One that fails is logged, and the rest are still released."""
    try:
        if stages.asr_worker is not None:
            await asyncio.to_thread(stages.asr_worker.stop)
    except Exception as exc:  # noqa: BLE001 - shutting down: say what was left, release the rest
        log.warning("shutdown: the ASR lanes were not stopped: %s", exc)
    try:
        if stages.voice is not None:
            await stages.voice.synthesizer.aclose()
    except Exception as exc:  # noqa: BLE001
        log.warning("shutdown: the voice was not closed: %s", exc)


def warmup_frame(config: ServerConfig) -> np.ndarray:
    """A real face (so the first face and render inferences run the full graph), else a black frame."""
    probe = np.zeros((360, 640, 3), np.uint8)
    if {"faces", "render"} & set(config.stages):
        with contextlib.suppress(Exception):  # matplotlib's sample portrait may be absent: a blank frame still loads
            probe = talking_face_frames(np.array([0.3]), (640, 360))[0]
    return probe


def warmup_speech() -> np.ndarray:
    """One short utterance (16 kHz mono): enough to run the streaming path end to end."""
    return synthesize_speech("hello there", lead_in_s=0.2).samples


def _attempt(config: ServerConfig, state: WarmState, name: str, fn: Callable[[], None],
             always: bool = False) -> None:
    """Warm one stage, or record why it is missing (disabled, a module or file absent, a failure)."""
    missing = state.stages.missing
    if name not in config.stages and not always:
        missing[name] = "disabled by configuration"
        return
    if state.stopping.is_set():
        missing[name] = "server stopping"
        return
    try:
        fn()
    except (ImportError, FileNotFoundError) as exc:
        missing[name] = f"{'module' if isinstance(exc, ImportError) else 'file'} not available: {exc}"
        log.warning("warm-up: %s unavailable: %s", name, exc)
    except Exception as exc:  # noqa: BLE001 - a broken stage is reported, the server still serves
        missing[name] = f"{type(exc).__name__}: {exc}"
        log.exception("warm-up: %s failed", name)


def _warm_faces(state: WarmState, probe: np.ndarray) -> None:
    extractor = state.timed("faces", "load", pipeline.face_extractor)
    state.timed("faces", "first_inference", lambda: extractor.extract(VideoFrame(0.0, probe)))
    extractor.close()
    state.stages.make_faces = pipeline.live_face_extractors()


def _warm_controller(state: WarmState) -> None:
    ctl = state.timed("controller", "load", pipeline.load_controller)
    sample = AUSample(0.0, tuple(0.1 for _ in AU_NAMES), True)

    def run() -> None:
        for i in range(64):
            ctl.step(AUSample(i / 30, sample.au, True))

    state.timed("controller", "first_inference", run)
    state.stages.make_controller = pipeline.load_controller


def _warm_asr(config: ServerConfig, state: WarmState) -> None:
    started = take_started_lanes(config.whisper_path, config.asr_lanes) if config.asr_processes else []
    worker = state.timed("asr", "load", lambda: pipeline.asr_worker(config.whisper_path, config.asr_lanes,
                                                                           config.asr_processes, started))
    state.timed("asr", "first_inference", worker.warmup)
    state.timed("asr", "first_stream", lambda: pipeline.warm_asr_stream(worker, warmup_speech()))
    state.stages.asr_worker = worker


def _warm_render(config: ServerConfig, state: WarmState, probe: np.ndarray) -> None:
    from models.video import RenderRequest

    renderer = state.timed("render", "load", lambda: pipeline.renderer(config.video_backend, config.svd_model))
    req = RenderRequest(index=0, pts=0.0, camera=probe, caption=(), new_words=(), au=None, load=None,
                        sync_ok=None, size=config.output_size)
    state.timed("render", "first_inference", lambda: renderer.render(req))
    state.stages.renderer = renderer


def _warm_sync(state: WarmState) -> None:
    from alignment.evidence import AVOffsetEstimator
    from alignment.sync import Level3Validator

    state.stages.make_validator = Level3Validator
    state.stages.make_offset_estimator = AVOffsetEstimator


def _warm_response(config: ServerConfig, state: WarmState) -> None:
    from alignment.pacing import TokenPacer
    from app.live.warm_answer import warm_answer

    make_responder = pipeline.responders(config.responder, config.llm_url)
    state.timed("responder", "load", make_responder)
    # the whole answer path once, against a local dummy (never the operator's LLM): no first-use stall
    state.timed("responder", "first_answer", lambda: warm_answer(config.responder))
    state.stages.make_responder = make_responder
    state.stages.make_pacer = TokenPacer


def _warm_voice(config: ServerConfig, state: WarmState) -> None:
    """The answer's voice (one synthesizer pool for every session), the avatar, and one answer run
    through the player against a local stand-in session (never the operator's LLM)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor
    from functools import partial

    from app.live.answer import AVATAR_FPS
    from app.live.stages import Voice
    from app.live.warm_answer import speak_once
    from models import tts

    options: dict[str, object] = {}
    if config.tts == "openai":
        options["base_url"] = config.tts_url
    if config.tts_voice:
        options["voice"] = config.tts_voice
    synth = state.timed("tts", "load", lambda: tts.make_synthesizer(config.tts, **options))
    avatar = mouth_at = rest = prepare = None
    if config.avatar:
        try:
            from models.avatar import AvatarRenderer
            from models.visemes import REST, timeline
            from models.visemes import mouth_at as phone_mouth

            avatar, rest, prepare = state.timed("avatar", "load", AvatarRenderer), REST, timeline
            mouth_at = partial(phone_mouth, frame_s=1.0 / AVATAR_FPS)  # a short closure still shows on a frame
            state.timed("avatar", "first_inference", lambda: avatar.draw(REST))
        except (ImportError, FileNotFoundError) as exc:
            state.stages.missing["avatar"] = f"not available: {exc}"
            avatar = mouth_at = rest = prepare = None
    name = config.tts_voice or getattr(synth, "voice", None) or tts.ANSWER_VOICE
    voice = Voice(synth, tts.PhraseChunker, tts.speaking_rate_wpm, avatar, mouth_at, rest,
                  name=f"{config.tts}:{name}", prepare=prepare)
    with ThreadPoolExecutor(1, thread_name_prefix="warm-up-answer") as pool:  # its own loop, whoever calls
        warm = getattr(synth, "warm", None)
        if warm is not None:  # every pooled process's voice loaded
            state.timed("tts", "warm", lambda: pool.submit(asyncio.run, warm()).result())
        state.timed("tts", "first_answer",
                    lambda: pool.submit(asyncio.run, speak_once(voice, "Hello there. I am ready.")).result())
    state.stages.voice = voice
    try:  # the user's speech over an answer stops it; its echo in the mic is removed first
        from models.bargein import BargeInDetector, BargeInTrace

        state.timed("barge-in", "load", BargeInDetector)
        state.stages.make_bargein = BargeInTrace.from_env
    except ImportError as exc:
        state.stages.missing["barge-in"] = f"module not available: {exc}"


def _warm_lst(state: WarmState) -> None:
    from alignment.lst import LSTAggregate

    state.stages.lst = LSTAggregate()
