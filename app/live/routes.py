"""The live server's state and its HTTP handlers, one method per route (``app.live.server`` mounts them).

Refusals are short plain-text messages with the right status, never a traceback: 400 bad SDP, 401
missing/wrong bearer token, 403 foreign browser origin, 404 unknown session, 413 body too large, 415
not ``application/sdp``, 429 (+ Retry-After) too many offers from one address (``app.live.ratelimit``),
503 (+ Retry-After) while warming up or when the server is full (``app.live.admission``).

The server's ICE servers (``app.live.ice``) configure each session's own ICE agent and are told to the
client in ``Link`` headers, on the 201 and on ``OPTIONS /whip`` (which a browser asks before it builds
its offer). The answer caps the camera's bitrate (``b=AS``), which honest senders follow; what a
sender does beyond it is bounded in ``app.live.limits``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator

from aiortc import RTCPeerConnection, RTCSessionDescription
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from app.live import tracing
from app.live.admission import Admission
from app.live.config import ServerConfig
from app.live.gate import RequestGate
from app.live.ice import IceServer, link_headers, rtc_configuration, with_credentials
from app.live.offer import (
    OfferRefused,
    cap_bitrate,
    read_offer,
    resource_location,
)
from app.live.ratelimit import OfferRateLimit
from app.live.reliability import freeze_warm_heap, quiet_closed_transport_errors, reclaim
from app.live.server_metrics import ServerMetrics
from app.live.session import Session, SessionConfig, Stages
from app.live.stages import AnswerConfig
from app.live.turns import TurnConfig
from app.live.video_encoder import install as install_lean_encoder
from app.live.warmup import WarmState, release, warm_up
from models.http_client import close_shared_client

log = logging.getLogger("synchrony.server")

JSONBody = dict[str, object]
#: a server stopped during warm-up waits this long for the stage under way (one model load or first run)
WARM_STOP_WAIT_S = 30.0


def session_config(config: ServerConfig) -> SessionConfig:
    """What every session of this server runs with (its end-of-turn silences among them)."""
    turn = None
    if config.turn_end_s > 0:
        turn = TurnConfig(pause_s=min(0.1, config.turn_end_s), end_s=config.turn_end_s,
                          unfinished_end_s=max(config.turn_unfinished_end_s, config.turn_end_s))
    answer = None
    if config.tts != "off":
        answer = AnswerConfig(history_turns=config.history_turns, avatar_shift_s=config.avatar_shift_s)
    return SessionConfig(output_delay_s=config.output_delay_s, output_size=config.output_size,
                         media_timeout_s=config.media_timeout_s, turn=turn, answer=answer,
                         max_video_size=config.max_video_size, max_video_fps=config.max_video_fps,
                         max_bitrate_kbps=config.max_bitrate_kbps)


def _reclaim_soon(loop: asyncio.AbstractEventLoop) -> None:
    """Run ``reclaim`` off the loop, unless the server is shutting down (its executor is gone then)."""
    with contextlib.suppress(RuntimeError):
        loop.run_in_executor(None, reclaim)


class LiveServer:
    """Sessions, warm-up state and admission of one server; the route handlers are its methods."""

    def __init__(self, config: ServerConfig, stages: Stages | None = None) -> None:
        """Starts warming up now (in a thread) unless ``stages`` come pre-warmed."""
        self.config = config
        self.metrics = ServerMetrics()
        self.warm = WarmState()
        self.sessions: dict[str, Session] = {}
        self.pending = 0  # offers being answered, counted against the limit
        self.session_config = session_config(config)
        self.admission = Admission(config, self.metrics)
        self.gate = RequestGate(auth_token=config.auth_token, allowed_origins=config.allowed_origins,
                                metrics_auth=config.metrics_auth, rejected=self.metrics.rejected,
                                offers=OfferRateLimit(config.offer_rate_per_s, config.offer_burst))
        # Warm-up starts now, so model loading overlaps building the page (Gradio) and server start-up.
        self.owns_stages = stages is None  # stages handed in are the caller's to release
        self.warming: threading.Thread | None = None
        if stages is not None:
            self.warm.stages = stages
            self.finish_warmup()
        elif config.warmup:
            self.warming = threading.Thread(target=self._warm_thread, name="warm-up", daemon=True)
            self.warming.start()
        else:
            self.finish_warmup()

    # --- life cycle -------------------------------------------------------------------------------

    def _warm_thread(self) -> None:
        try:
            warm_up(self.config, self.warm)
        finally:
            self.finish_warmup()

    def finish_warmup(self) -> None:
        """Ready: freeze the warm heap (so reclaim() after each session scans only session objects),
        export the cold-start figures."""
        state = self.warm
        freeze_warm_heap()
        state.ready = True
        state.ready_after_s = round(time.monotonic() - state.started, 3)
        self.metrics.ready.set(1)
        for model, phases in state.cold_start.items():
            for phase, seconds in phases.items():
                self.metrics.cold_start.labels(model, phase).set(seconds)
        log.info("ready after %.2f s; cold start %s; missing %s", state.ready_after_s, state.cold_start,
                 state.stages.missing or "none")

    async def _measure_forever(self) -> None:
        while True:
            self.admission.measure(len(self.sessions), self.warm.stages.asr_worker)
            await asyncio.sleep(1.0)

    @contextlib.asynccontextmanager
    async def lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        """Watch the event loop's lag and measure capacity while serving; at the end close every session,
        then release the shared models this server warmed up."""
        tracing.configure()  # OTEL_* set: traces of each session (off and not imported otherwise)
        quiet_closed_transport_errors(asyncio.get_running_loop())
        loop_watch = asyncio.create_task(self.metrics.loop_lag.watch(), name="event-loop-lag")
        measuring = asyncio.create_task(self._measure_forever(), name="capacity")
        yield
        loop_watch.cancel()
        measuring.cancel()
        await asyncio.gather(*(s.close("server shutdown") for s in list(self.sessions.values())),
                             return_exceptions=True)
        await close_shared_client()
        if self.owns_stages:
            self.warm.stopping.set()  # stopped while warming up: finish the stage under way, start no other
            if self.warming is not None:
                await asyncio.to_thread(self.warming.join, WARM_STOP_WAIT_S)
            await release(self.warm.stages)
        await asyncio.to_thread(tracing.shutdown)

    def lst_snapshot(self) -> JSONBody | None:
        lst = self.warm.stages.lst
        return lst.snapshot() if lst is not None else None

    def on_end(self, session: Session, reason: str) -> None:
        """A session ended (any reason): forget it, count why, reclaim its memory soon."""
        if self.sessions.pop(session.id, None) is not None:
            self.metrics.sessions.set(len(self.sessions))
            label = reason.split(":", 1)[0].split(" (", 1)[0]
            self.metrics.sessions_ended.labels(label).inc()
            # Free the session's cyclic garbage and trim the heap (otherwise RSS grows with every session).
            loop = asyncio.get_running_loop()
            loop.call_later(0.5, _reclaim_soon, loop)

    # --- refusals ---------------------------------------------------------------------------------

    def ice_servers(self, name: str) -> tuple[IceServer, ...]:
        """The ICE servers with fresh short-lived TURN credentials (``name`` goes into their username)."""
        config = self.config
        return with_credentials(config.ice_servers, config.turn_secret, config.turn_ttl_s, name)

    def room_refusal(self) -> Response | None:
        """503 while warming up or when full, or None when a new session fits."""
        if not self.warm.ready:
            return self.gate.refuse(503, "warming up, retry shortly", {"Retry-After": "2"})
        limit = self.admission.limit(len(self.sessions))
        if len(self.sessions) + self.pending >= limit:
            return self.gate.refuse(503, f"server full ({limit} sessions: {self.admission.full(limit)})",
                               {"Retry-After": str(self.config.retry_after_s)})
        return None

    def session_for(self, session_id: str, request: Request) -> Session | Response:
        """The session a WHIP resource request names, or the refusal to send instead."""
        refused = self.gate.check(request)
        if refused is not None:
            return refused
        session = self.sessions.get(session_id)
        return session if session is not None else self.gate.refuse(404, "no such session")

    # --- routes (no docstrings: FastAPI would publish them in /openapi.json) -------------------------

    async def internal_error(self, _: Request, exc: Exception) -> Response:
        log.exception("internal error", exc_info=exc)
        return PlainTextResponse("internal server error\n", status_code=500)

    # POST /whip: a WHIP offer in, a session and its SDP answer out (201, ``Location``).
    async def whip_offer(self, request: Request) -> Response:
        refused = self.gate.rate(request) or self.gate.check(request)
        if refused is not None:
            return refused
        try:
            sdp = await read_offer(request, self.config.max_sdp_bytes)
        except OfferRefused as exc:
            return self.gate.refuse(exc.status, str(exc))
        refused = self.room_refusal()
        if refused is not None:
            return refused
        self.pending += 1
        name = secrets.token_urlsafe(12)
        pc = RTCPeerConnection(rtc_configuration(self.ice_servers(f"server-{name}"), self.config.ice_relay_only))
        try:  # whatever fails below, the slot this offer held is given back
            try:
                session = Session(name, pc, self.warm.stages, self.session_config,
                                  self.metrics, self.on_end, degradation=self.admission.degradation,
                                  traceparent=request.headers.get("traceparent"))
                session.hook()
            except Exception:
                await pc.close()
                raise
            refused = await self._negotiate(pc, session, sdp)
            if refused is not None:
                return refused
            self.sessions[session.id] = session
        finally:
            self.pending -= 1
        self.metrics.sessions.set(len(self.sessions))
        self.metrics.sessions_total.inc()
        log.info("session %s started (%d live)", session.id, len(self.sessions))
        answer = cap_bitrate(pc.localDescription.sdp, self.config.max_bitrate_kbps)
        response = Response(answer, status_code=201, media_type="application/sdp",
                            headers={"Location": resource_location(request, f"/whip/{session.id}")})
        for link in link_headers(self.ice_servers(session.id)):
            response.headers.append("Link", link)
        return response

    # OPTIONS /whip: the ICE servers (Link headers) a client needs before it builds its offer.
    async def whip_options(self, request: Request) -> Response:
        refused = self.gate.check(request)
        if refused is not None:
            return refused
        response = Response(status_code=204, headers={"Accept-Post": "application/sdp",
                                                      "Allow": "OPTIONS, POST"})
        for link in link_headers(self.ice_servers("client")):
            response.headers.append("Link", link)
        return response

    async def _negotiate(self, pc: RTCPeerConnection, session: Session, sdp: str) -> Response | None:
        """Apply the offer and answer it, or the 400 when aiortc cannot use it (the session closed)."""
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp, "offer"))
            session.attach()
            await pc.setLocalDescription(await pc.createAnswer())
            install_lean_encoder(pc)  # the returned videos' VP8 at the fastest real-time speed
        except Exception as exc:  # noqa: BLE001 - aiortc's parser and negotiation raise many kinds
            await session.close("offer refused")  # frees the tracks, tasks and AU thread it started
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return self.gate.refuse(400, f"cannot use this SDP offer: {why[:200]}")
        return None

    # DELETE /whip/<session>: end it.
    async def whip_delete(self, session_id: str, request: Request) -> Response:
        session = self.session_for(session_id, request)
        if isinstance(session, Response):
            return session
        await session.close("client DELETE")
        return Response(status_code=200)

    # GET /whip/<session>: its summary.
    async def whip_status(self, session_id: str, request: Request) -> Response:
        session = self.session_for(session_id, request)
        return session if isinstance(session, Response) else JSONResponse(session.summary())

    # PATCH /whip/<session>: no trickle ICE.
    async def whip_patch(self, session_id: str) -> Response:
        return PlainTextResponse("trickle ICE is not supported; send a complete offer\n", status_code=405,
                                 headers={"Allow": "DELETE"})

    async def healthz(self) -> dict[str, object]:
        return {"status": "ok", "sessions": len(self.sessions)}

    def ready_body(self) -> JSONBody:
        """``/readyz``'s body (also shown on the page)."""
        state = self.warm
        return {"ready": state.ready, "ready_after_s": state.ready_after_s, "cold_start": state.cold_start,
                "missing": state.stages.missing, "sessions": len(self.sessions),
                "max_sessions": self.config.max_sessions, "capacity": self.admission.limit(len(self.sessions)),
                **self.admission.readiness()}

    async def readyz(self) -> Response:
        return JSONResponse(self.ready_body(), status_code=200 if self.warm.ready else 503)

    async def prometheus(self, request: Request) -> Response:
        refused = self.gate.metrics(request)
        if refused is not None:
            return refused
        return Response(self.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def lst(self, request: Request) -> Response:
        refused = self.gate.metrics(request)
        if refused is not None:
            return refused
        stages = self.warm.stages
        if stages.lst is None:
            return JSONResponse({"error": "LST metrics unavailable", "missing": stages.missing.get("lst")},
                                status_code=503)
        return JSONResponse(stages.lst.snapshot())
