"""The live server: WHIP signaling (RFC 9725) for aiortc sessions, metrics, health, the Gradio page.

``create_app(config)`` builds the FastAPI app (tests use it directly); ``serve(host, port, config)``
runs it under uvicorn. Every model is loaded and run once at start-up (in a thread) before
``/readyz`` says ready; the per-model cold-start breakdown is logged, exported on ``/metrics`` and
returned by ``/readyz``. Refusals are short plain-text messages with the right status, never a
traceback: 400 bad SDP, 401 missing/wrong bearer token, 404 unknown session, 413 body too large,
415 not ``application/sdp``, 503 (+ Retry-After) while warming up or when the server is full: as many
sessions live as its measured capacity (``app.live.cpu_account``: usable cores × target utilisation over
the measured CPU per session) or ``max_sessions``, whichever is lower.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from app.live.cpu_account import Capacity, CapacityEstimate, CpuAccount
from app.live.degrade import ORDER, Degradation, OverloadSignal
from app.live.reliability import freeze_warm_heap, reclaim
from app.live.server_metrics import ServerMetrics
from app.live.session import Session, SessionConfig, Stages
from app.live.stages import Stage
from app.live.video_encoder import install as install_lean_encoder

log = logging.getLogger("synchrony.server")

STATIC_DIR = Path(__file__).with_name("static")
MAX_SDP_BYTES = 64 * 1024
#: CPU (cores) of one full-pipeline session with the load test's clip on a 2-core machine, measured by
#: ``bench/capacity.py`` (BENCHMARKS.md: 0.75–0.88 in the rounds that held their bounds; the higher
#: one, so a fresh server errs towards refusing): the admission estimate until it has measured its own.
SESSION_COST_CORES = 0.88


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``synchrony serve`` can set."""

    max_sessions: int = 4
    video_backend: str = "overlay"
    svd_model: str | None = None
    responder: str = "caption"
    llm_url: str | None = None
    whisper_path: str | None = None
    auth_token: str | None = None
    allowed_origins: tuple[str, ...] = ()
    output_delay_s: float = 1.5  # > final-word latency p95 (bench/asr_stream.py), so captions land on their frames
    output_size: tuple[int, int] = (640, 360)
    media_timeout_s: float = 10.0
    asr_lanes: int = 2  # decode threads sharing the sessions (2 cores: 4-stream p95 about halves vs 1)
    # "measured": admit as many as the measured CPU per session allows (``synchrony serve``'s default);
    # "fixed": max_sessions (in-process test servers, whose CPU includes their own test peers)
    admission: str = "fixed"
    session_cost_cores: float = SESSION_COST_CORES  # CPU per session until this server has measured its own
    target_utilisation: float = 0.85  # of the usable cores, for admitted sessions
    retry_after_s: int = 5  # Retry-After of a 503 when full
    # under a brief overload, shed work in app.live.degrade.ORDER before words run late (``synchrony serve``'s
    # default; off for in-process servers, whose load includes their own test peers)
    degrade: bool = False
    turn_end_s: float = 0.3  # silence that ends a user's turn (app/live/turns.py); 0: the ASR's endpoint decides
    turn_unfinished_end_s: float = 0.6  # ... after a word a sentence rarely ends on
    max_sdp_bytes: int = MAX_SDP_BYTES
    ui: bool = True  # mount the Gradio page at /
    warmup: bool = True  # load and run every model before /readyz says ready
    stages: tuple[Stage, ...] = (Stage.FACES, Stage.CONTROLLER, Stage.ASR, Stage.RENDER, Stage.SYNC, Stage.RESPONSE,
                                 Stage.LST)


class SdpError(ValueError):
    """An offer we cannot answer; the message is shown to the client as is."""


#: Codecs aiortc can decode, per media kind (rtpmap encoding names, lower case).
DECODABLE = {"audio": ("opus", "g722", "pcmu", "pcma"), "video": ("vp8", "h264")}


# --- SDP checks ---------------------------------------------------------------------------------


def check_offer(sdp: str) -> None:
    """Refuse offers that are not WHIP offers we can answer, with a message that says why."""
    lines = [ln.strip() for ln in sdp.replace("\r\n", "\n").split("\n") if ln.strip()]
    if not lines or lines[0] != "v=0":
        raise SdpError("not an SDP offer: the body must start with 'v=0'")
    if any(len(ln) < 2 or ln[1] != "=" for ln in lines):
        bad = next(ln for ln in lines if len(ln) < 2 or ln[1] != "=")
        raise SdpError(f"malformed SDP line: {bad[:60]!r}")
    sections: list[list[str]] = []
    for ln in lines:
        if ln.startswith("m="):
            sections.append([ln])
        elif sections:
            sections[-1].append(ln)
    kinds = {sec[0][2:].split(" ", 1)[0] for sec in sections}
    for kind in ("audio", "video", "application"):
        if kind not in kinds:
            what = "a DataChannel (m=application) for the 'events' channel" if kind == "application" else kind
            raise SdpError(f"the offer has no {what} section")
    for sec in sections:
        m = re.match(r"m=(\w+) (\d+) (\S+) (.+)$", sec[0])
        if m is None:
            raise SdpError(f"malformed media line: {sec[0][:60]!r}")
        kind = m.group(1)
        if kind in ("audio", "video"):
            if m.group(2) == "0":
                raise SdpError(f"the offer rejects its {kind} section (port 0)")
            direction = next((a[2:] for a in sec if a[2:] in ("sendrecv", "sendonly", "recvonly", "inactive")),
                             "sendrecv")
            wanted = ("sendrecv",) if kind == "video" else ("sendrecv", "sendonly")
            if direction not in wanted:
                raise SdpError(f"the {kind} section is {direction}; it must be {' or '.join(wanted)}")
            if not any(a.startswith("a=rtpmap:") for a in sec):
                raise SdpError(f"the {kind} section lists no codecs (a=rtpmap)")
            offered = {a.split(" ", 1)[1].split("/", 1)[0].lower() for a in sec
                       if a.startswith("a=rtpmap:") and " " in a}
            if not offered & set(DECODABLE[kind]):
                raise SdpError(f"the {kind} section offers no codec this server decodes "
                               f"(supported: {', '.join(DECODABLE[kind])})")
    text = "\n".join(lines)
    for attr, what in (("a=ice-ufrag:", "ICE credentials (a=ice-ufrag)"), ("a=ice-pwd:", "ICE credentials (a=ice-pwd)"),
                       ("a=fingerprint:", "a DTLS fingerprint (a=fingerprint)")):
        if attr not in text:
            raise SdpError(f"the offer has no {what}; it may be truncated")


class OfferRefused(Exception):
    """A WHIP request refused before any session exists: ``status`` and the one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_offer(request: Request, max_bytes: int) -> str:
    """The offer's SDP text, checked; ``OfferRefused`` 415 (not application/sdp), 413 (larger than
    ``max_bytes``) or 400 (not UTF-8, not an offer we can answer). The cluster ingress uses it too, so
    bad input gets the same answers there."""
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype != "application/sdp":
        raise OfferRefused(415, f"Content-Type must be application/sdp, not {ctype or 'missing'!r}")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise OfferRefused(413, f"SDP offer larger than {max_bytes} bytes")
    body = b""
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise OfferRefused(413, f"SDP offer larger than {max_bytes} bytes")
    try:
        sdp = body.decode("utf-8")
        check_offer(sdp)
    except UnicodeDecodeError:
        raise OfferRefused(400, "SDP offer is not UTF-8 text") from None
    except SdpError as exc:
        raise OfferRefused(400, str(exc)) from None
    return sdp


def allow_cross_origin(app: FastAPI, origins: tuple[str, ...]) -> None:
    """Let pages from ``origins`` use WHIP (and read ``Location``) across origins."""
    if origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(origins),
                           allow_methods=["POST", "DELETE", "GET", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type"], expose_headers=["Location"])


# --- warm-up ------------------------------------------------------------------------------------


@dataclass
class WarmState:
    """Stages and how long each took to load and to run once."""

    stages: Stages = field(default_factory=Stages)
    cold_start: dict[str, dict[str, float]] = field(default_factory=dict)
    ready: bool = False
    started: float = field(default_factory=time.monotonic)
    ready_after_s: float | None = None


def _timed(state: WarmState, model: str, phase: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    out = fn()
    state.cold_start.setdefault(model, {})[phase] = round(time.perf_counter() - t0, 4)
    return out


def warm_up(config: ServerConfig, state: WarmState) -> None:
    """Load every available stage and run one inference through it; record what is missing and why."""
    import numpy as np

    from alignment.types import AU_NAMES, AUSample, VideoFrame

    st = state.stages
    probe = np.zeros((360, 640, 3), np.uint8)
    if {"faces", "render"} & set(config.stages):
        with contextlib.suppress(Exception):  # a real face, so the first inference runs the full graph
            from app.loadtest.testmedia import talking_face_frames

            probe = talking_face_frames(np.array([0.3]), (640, 360))[0]

    def attempt(name: str, fn: Callable[[], None]) -> None:
        if name not in config.stages:
            st.missing[name] = "disabled by configuration"
            return
        try:
            fn()
        except (ImportError, FileNotFoundError) as exc:
            st.missing[name] = f"{'module' if isinstance(exc, ImportError) else 'file'} not available: {exc}"
            log.warning("warm-up: %s unavailable: %s", name, exc)
        except Exception as exc:  # noqa: BLE001 - a broken stage is reported, the server still serves
            st.missing[name] = f"{type(exc).__name__}: {exc}"
            log.exception("warm-up: %s failed", name)

    def faces() -> None:
        from models.faces import FaceAUExtractor

        extractor = _timed(state, "faces", "load", FaceAUExtractor)
        _timed(state, "faces", "first_inference", lambda: extractor.extract(VideoFrame(0.0, probe)))
        extractor.close()
        st.make_faces = lambda: FaceAUExtractor(running_mode="video")

    def controller() -> None:
        from models.controller import LoadController

        ctl = _timed(state, "controller", "load", LoadController)
        sample = AUSample(0.0, tuple(0.1 for _ in AU_NAMES), True)

        def run() -> None:
            for i in range(64):
                ctl.step(AUSample(i / 30, sample.au, True))

        _timed(state, "controller", "first_inference", run)
        st.make_controller = LoadController

    def asr() -> None:
        from models.asr import ASRWorker

        worker = _timed(state, "asr", "load", lambda: _make_asr_worker(ASRWorker, config))
        warm = getattr(worker, "warmup", None)
        if callable(warm):
            _timed(state, "asr", "first_inference", warm)
        _timed(state, "asr", "first_stream", lambda: _warm_stream(worker))
        st.asr_worker = worker

    def render() -> None:
        from models.video import RenderRequest, create_renderer

        options: dict[str, Any] = {}
        if config.video_backend == "svd" and config.svd_model:
            options["model"] = config.svd_model
        renderer = _timed(state, "render", "load", lambda: create_renderer(config.video_backend, **options))
        req = RenderRequest(index=0, pts=0.0, camera=probe, caption=(), new_words=(), au=None, load=None,
                            sync_ok=None, size=config.output_size)
        _timed(state, "render", "first_inference", lambda: renderer.render(req))
        st.renderer = renderer

    def sync() -> None:
        from alignment.sync import Level3Validator

        st.make_validator = Level3Validator
        with contextlib.suppress(ImportError):
            from alignment.evidence import AVOffsetEstimator

            st.make_offset_estimator = AVOffsetEstimator

    def response() -> None:
        from alignment.pacing import TokenPacer
        from models.responders import make_responder

        options: dict[str, Any] = {"base_url": config.llm_url} if config.llm_url else {}
        _timed(state, "responder", "load", lambda: make_responder(config.responder, **options))
        st.make_responder = lambda: make_responder(config.responder, **options)
        st.make_pacer = TokenPacer

    def lst() -> None:
        from alignment.lst import LSTAggregate

        st.lst = LSTAggregate()

    # Whisper is the long pole: it loads and runs in its own thread while the rest warm up here.
    asr_thread = threading.Thread(target=attempt, args=("asr", asr), name="warm-up-asr", daemon=True)
    asr_thread.start()
    for name, fn in (("faces", faces), ("controller", controller), ("render", render),
                     ("sync", sync), ("response", response), ("lst", lst)):
        attempt(name, fn)
    asr_thread.join()


def _warm_stream(worker: Any) -> None:
    """Run the streaming path once (VAD, incremental decode, finalisation) so no session pays for it."""
    import numpy as np

    from alignment.types import AudioChunk
    from app.loadtest.testmedia import synthesize_speech
    from models.asr import StreamingASR

    audio = synthesize_speech("hello there", lead_in_s=0.2).samples  # one short utterance is enough
    audio = np.concatenate([audio, np.zeros(6400, np.float32)])
    stream = StreamingASR(worker.engine, worker.config)
    for i in range(0, len(audio), 320):
        stream.feed(AudioChunk(i / 16000, audio[i : i + 320]))
    stream.flush()


def _make_asr_worker(cls: Any, config: ServerConfig) -> Any:
    """One shared ASR worker with ``asr_lanes`` decode threads (a model copy each)."""
    model = None
    if config.whisper_path:
        from models.whisper_loader import load_whisper

        model = load_whisper(config.whisper_path)
    return cls(model=model, lanes=config.asr_lanes)


# --- the app ------------------------------------------------------------------------------------


def _refuse(status: int, message: str, metrics: ServerMetrics, headers: dict[str, str] | None = None) -> Response:
    metrics.rejected.labels(str(status)).inc()
    return PlainTextResponse(message + "\n", status_code=status, headers=headers)


def _reclaim_soon(loop: asyncio.AbstractEventLoop) -> None:
    """Run ``reclaim`` off the loop, unless the server is shutting down (its executor is gone then)."""
    with contextlib.suppress(RuntimeError):
        loop.run_in_executor(None, reclaim)


def create_app(config: ServerConfig | None = None, stages: Stages | None = None) -> FastAPI:
    """The FastAPI app; pass pre-warmed ``stages`` to share loaded models between apps (tests)."""
    from app.live.webrtc import patient_consent

    patient_consent()  # RFC 7675 expiry: a loaded server answers consent checks later than aioice waits
    config = config or ServerConfig()
    metrics = ServerMetrics()
    state = WarmState()
    sessions: dict[str, Session] = {}
    pending = 0
    turn = None
    if config.turn_end_s > 0:
        from app.live.turns import TurnConfig

        turn = TurnConfig(pause_s=min(0.1, config.turn_end_s), end_s=config.turn_end_s,
                          unfinished_end_s=max(config.turn_unfinished_end_s, config.turn_end_s))
    session_config = SessionConfig(output_delay_s=config.output_delay_s, output_size=config.output_size,
                                   media_timeout_s=config.media_timeout_s, turn=turn)

    account = CpuAccount()
    capacity = CapacityEstimate(config.session_cost_cores, target_utilisation=config.target_utilisation,
                                max_sessions=config.max_sessions)
    app_capacity: list[Capacity] = [capacity.current()]
    degradation = Degradation(enabled=config.degrade)

    def measure() -> None:
        """Once a second: CPU per stage into /metrics, and the capacity admission uses."""
        metrics.stage_cpu_totals(account.sample())
        now = capacity.update(len(sessions))
        app_capacity[0] = now
        worker = state.stages.asr_worker
        backlog = 0.0
        if worker is not None and hasattr(worker, "stats"):
            backlog = getattr(worker.stats(), "oldest_wait_s", 0.0)
        before = degradation.level
        signal = OverloadSignal(capacity.rate, capacity.cores, backlog, metrics.word_latency_median())
        level = degradation.update(signal, time.monotonic())
        if level != before:
            log.warning("degradation level %d -> %d (%s)", before, level, ", ".join(ORDER[:level]) or "none")
            step = degradation.effects.asr_step_s
            if worker is not None and hasattr(worker, "set_step_s"):
                worker.set_step_s(step)
        metrics.degradation.set(level)
        metrics.capacity.set(admit_limit())
        metrics.session_cost.set(now.cost_cores)
        metrics.idle_cost.set(now.idle_cores)

    def admit_limit() -> int:
        """Sessions admitted now. Measured: none beyond those live while the server sheds work
        (degradation level > 0), since a starved process also under-measures its cost per session."""
        limit = config.max_sessions
        if config.admission != "fixed":
            limit = min(limit, app_capacity[0].sessions)
            if degradation.level > 0:
                limit = min(limit, len(sessions))
        return limit

    async def measure_forever() -> None:
        while True:
            measure()
            await asyncio.sleep(1.0)

    def finish_warmup() -> None:
        freeze_warm_heap()  # so reclaim() after each session scans only session objects
        state.ready = True
        state.ready_after_s = round(time.monotonic() - state.started, 3)
        metrics.ready.set(1)
        for model, phases in state.cold_start.items():
            for phase, seconds in phases.items():
                metrics.cold_start.labels(model, phase).set(seconds)
        log.info("ready after %.2f s; cold start %s; missing %s", state.ready_after_s, state.cold_start,
                 state.stages.missing or "none")

    def warm_thread() -> None:
        try:
            warm_up(config, state)
        finally:
            finish_warmup()

    # Warm-up starts now, so model loading overlaps building the page (Gradio) and server start-up.
    if stages is not None:
        state.stages = stages
        finish_warmup()
    elif config.warmup:
        threading.Thread(target=warm_thread, name="warm-up", daemon=True).start()
    else:
        finish_warmup()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop_watch = asyncio.create_task(metrics.loop_lag.watch(), name="event-loop-lag")
        measuring = asyncio.create_task(measure_forever(), name="capacity")
        yield
        loop_watch.cancel()
        measuring.cancel()
        await asyncio.gather(*(s.close("server shutdown") for s in list(sessions.values())),
                             return_exceptions=True)

    app = FastAPI(title="synchrony", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.config = config
    app.state.metrics = metrics
    metrics.watch_lst(lambda: state.stages.lst.snapshot() if state.stages.lst is not None else None)
    app.state.sessions = sessions
    app.state.warm = state
    app.state.degradation = degradation

    allow_cross_origin(app, config.allowed_origins)

    def authorised(request: Request) -> bool:
        if not config.auth_token:
            return True
        given = request.headers.get("authorization", "")
        return secrets.compare_digest(given.encode(), f"Bearer {config.auth_token}".encode())

    def origin_allowed(request: Request) -> bool:
        """Browsers send Origin: accept our own page and ``allowed_origins``; other clients send none."""
        origin = request.headers.get("origin")
        if origin is None or origin in config.allowed_origins:
            return True
        return urlsplit(origin).netloc.lower() == request.headers.get("host", "").lower()

    def refuse_origin(request: Request) -> Response:
        origin = request.headers.get("origin", "")[:80]
        return _refuse(403, f"origin {origin!r} is not allowed (same origin or allowed_origins only)", metrics)

    def on_end(session: Session, reason: str) -> None:
        if sessions.pop(session.id, None) is not None:
            metrics.sessions.set(len(sessions))
            label = reason.split(":", 1)[0].split(" (", 1)[0]
            metrics.sessions_ended.labels(label).inc()
            # Free the session's cyclic garbage and trim the heap (RSS grew ~10 MB per session otherwise).
            loop = asyncio.get_running_loop()
            loop.call_later(0.5, _reclaim_soon, loop)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> Response:
        log.exception("internal error", exc_info=exc)
        return PlainTextResponse("internal server error\n", status_code=500)

    @app.post("/whip")
    async def whip_offer(request: Request) -> Response:
        nonlocal pending
        if not authorised(request):
            return _refuse(401, "missing or wrong bearer token", metrics, {"WWW-Authenticate": "Bearer"})
        if not origin_allowed(request):
            return refuse_origin(request)
        try:
            sdp = await read_offer(request, config.max_sdp_bytes)
        except OfferRefused as exc:
            return _refuse(exc.status, str(exc), metrics)
        if not state.ready:
            return _refuse(503, "warming up, retry shortly", metrics, {"Retry-After": "2"})
        limit = admit_limit()
        if len(sessions) + pending >= limit:
            why = ("shedding work under overload" if degradation.level > 0 else
                   "max_sessions" if limit == config.max_sessions else "measured capacity")
            return _refuse(503, f"server full ({limit} sessions: {why})", metrics,
                           {"Retry-After": str(config.retry_after_s)})
        pending += 1
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        session = Session(secrets.token_urlsafe(12), pc, state.stages, session_config, metrics, on_end,
                          degradation=degradation)
        session.hook()
        try:
            try:
                await pc.setRemoteDescription(RTCSessionDescription(sdp, "offer"))
                session.attach()
                await pc.setLocalDescription(await pc.createAnswer())
                install_lean_encoder(pc)  # the returned video's VP8 at the fastest real-time speed
            except Exception as exc:  # noqa: BLE001 - aiortc's parser and negotiation raise many kinds
                await session.close("offer refused")  # frees the tracks, tasks and AU thread it started
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                return _refuse(400, f"cannot use this SDP offer: {why[:200]}", metrics)
            sessions[session.id] = session
        finally:
            pending -= 1
        metrics.sessions.set(len(sessions))
        metrics.sessions_total.inc()
        log.info("session %s started (%d live)", session.id, len(sessions))
        return Response(pc.localDescription.sdp, status_code=201, media_type="application/sdp",
                        headers={"Location": f"/whip/{session.id}"})

    def session_for(session_id: str, request: Request) -> Session | Response:
        """The session a WHIP resource request names, or the refusal to send instead."""
        if not authorised(request):
            return _refuse(401, "missing or wrong bearer token", metrics, {"WWW-Authenticate": "Bearer"})
        if not origin_allowed(request):
            return refuse_origin(request)
        session = sessions.get(session_id)
        return session if session is not None else _refuse(404, "no such session", metrics)

    @app.delete("/whip/{session_id}")
    async def whip_delete(session_id: str, request: Request) -> Response:
        session = session_for(session_id, request)
        if isinstance(session, Response):
            return session
        await session.close("client DELETE")
        return Response(status_code=200)

    @app.get("/whip/{session_id}")
    async def whip_status(session_id: str, request: Request) -> Response:
        session = session_for(session_id, request)
        return session if isinstance(session, Response) else JSONResponse(session.summary())

    @app.patch("/whip/{session_id}")
    async def whip_patch(session_id: str) -> Response:
        return PlainTextResponse("trickle ICE is not supported; send a complete offer\n", status_code=405,
                                 headers={"Allow": "DELETE"})

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "sessions": len(sessions)}

    def ready_body() -> dict[str, Any]:
        return {"ready": state.ready, "ready_after_s": state.ready_after_s, "cold_start": state.cold_start,
                "missing": state.stages.missing, "sessions": len(sessions), "max_sessions": config.max_sessions,
                "capacity": admit_limit(), "admission": {"mode": config.admission, **asdict(app_capacity[0])},
                "degradation": {"level": degradation.level, "steps": list(ORDER[: degradation.level]),
                                "order": list(ORDER)}}

    @app.get("/readyz")
    async def readyz() -> Response:
        return JSONResponse(ready_body(), status_code=200 if state.ready else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/metrics/lst")
    async def lst() -> Response:
        if state.stages.lst is None:
            return JSONResponse({"error": "LST metrics unavailable", "missing": state.stages.missing.get("lst")},
                                status_code=503)
        return JSONResponse(state.stages.lst.snapshot())

    if config.ui:
        from fastapi.staticfiles import StaticFiles

        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
        from app.live.ui import mount_ui

        app = mount_ui(app, config, ready=ready_body)
    return app


@contextlib.asynccontextmanager
async def running_server(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on this event loop; yields its base URL (tests, benches, load tests)."""
    import uvicorn

    from app.live.ice import is_loopback_host, loopback_candidates

    loopback_candidates(is_loopback_host(host))  # a loopback server keeps its media on loopback

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn exited before it started")
            await asyncio.sleep(0.02)
        bound = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        await task


def serve(host: str, port: int, config: ServerConfig) -> None:
    """Run the server until interrupted (blocking)."""
    import uvicorn

    from app.live.ice import is_loopback_host, loopback_candidates

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loopback_candidates(is_loopback_host(host))  # a loopback server keeps its media on loopback
    uvicorn.run(create_app(config), host=host, port=port, log_level="info")
