"""The live server: WHIP signaling (RFC 9725) for aiortc sessions, metrics, health, the Gradio page.

``create_app(config)`` builds the FastAPI app (tests use it directly) from the handlers of
``app.live.routes``; ``serve(host, port, config)`` runs it under uvicorn. Every model is loaded and
run once at start-up (in a thread, ``app.live.warmup``) before ``/readyz`` says ready; the per-model
cold-start breakdown is logged, exported on ``/metrics`` and returned by ``/readyz``. The server
admits as many sessions as its measured capacity (``app.live.admission``) or ``max_sessions``,
whichever is lower.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI

from app.live.config import ServerConfig
from app.live.offer import allow_cross_origin
from app.live.routes import LiveServer
from app.live.session import Stages

__all__ = ["STATIC_DIR", "ServerConfig", "create_app", "running_server", "serve"]

STATIC_DIR = Path(__file__).with_name("static")


def create_app(config: ServerConfig | None = None, stages: Stages | None = None) -> FastAPI:
    """The FastAPI app; pass pre-warmed ``stages`` to share loaded models between apps (tests)."""
    from app.live.ice import patient_consent

    patient_consent()  # RFC 7675 expiry: a loaded server answers consent checks later than aioice waits
    config = config or ServerConfig()
    live = LiveServer(config, stages)
    app = FastAPI(title="synchrony", lifespan=live.lifespan, docs_url=None, redoc_url=None)
    app.state.config = config
    app.state.metrics = live.metrics
    live.metrics.watch_lst(live.lst_snapshot)
    app.state.sessions = live.sessions
    app.state.warm = live.warm
    app.state.degradation = live.admission.degradation

    allow_cross_origin(app, config.allowed_origins)
    app.add_exception_handler(Exception, live.internal_error)
    app.add_api_route("/whip", live.whip_offer, methods=["POST"])
    app.add_api_route("/whip/{session_id}", live.whip_delete, methods=["DELETE"])
    app.add_api_route("/whip/{session_id}", live.whip_status, methods=["GET"])
    app.add_api_route("/whip/{session_id}", live.whip_patch, methods=["PATCH"])
    app.add_api_route("/healthz", live.healthz, methods=["GET"])
    app.add_api_route("/readyz", live.readyz, methods=["GET"])
    app.add_api_route("/metrics", live.prometheus, methods=["GET"])
    app.add_api_route("/metrics/lst", live.lst, methods=["GET"])

    if config.ui:
        from fastapi.staticfiles import StaticFiles

        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
        from app.live.ui import mount_ui

        app = mount_ui(app, config, ready=live.ready_body)
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
