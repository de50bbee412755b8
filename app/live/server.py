"""The live server: WHIP signaling (RFC 9725) for aiortc sessions, metrics, health, the Gradio page.

``create_app(config)`` builds the FastAPI app (tests use it directly) from the handlers of
``app.live.routes``; ``serve(listening_socket(host, port), config)`` runs it under uvicorn, over TLS when given a
certificate and key (browsers open the camera only on HTTPS pages or localhost; docs/DEPLOY.md).
Every model is loaded and run once at start-up (in a thread, ``app.live.warmup``) before ``/readyz``
says ready; the per-model cold-start breakdown is logged, exported on ``/metrics`` and returned by
``/readyz``. The server admits as many sessions as its measured capacity (``app.live.admission``) or ``max_sessions``,
whichever is lower.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI

from app.live.config import ServerConfig
from app.live.offer import allow_cross_origin
from app.live.routes import LiveServer
from app.live.session import Stages

if TYPE_CHECKING:
    import uvicorn

__all__ = ["STATIC_DIR", "ServerConfig", "Tls", "create_app", "listening_socket", "run_until_stopped",
           "running_server", "serve", "stop_gracefully_on_sigterm"]

STATIC_DIR = Path(__file__).with_name("static")


def create_app(config: ServerConfig | None = None, stages: Stages | None = None) -> FastAPI:
    """The FastAPI app; pass pre-warmed ``stages`` to share loaded models between apps (tests)."""
    from app.live.webrtc import patient_consent

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
    app.add_api_route("/whip", live.whip_options, methods=["OPTIONS"])
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
    if config.forwarded_allow_ips:
        from app.live.proxy import ForwardedHeaders

        app.add_middleware(ForwardedHeaders, allowed=config.forwarded_allow_ips)
    return app


@dataclass(frozen=True)
class Tls:
    """A certificate chain and its private key (PEM files), for HTTPS."""

    cert: Path
    key: Path

    def check(self) -> None:
        """``ValueError`` saying what is wrong when the pair cannot be loaded (before uvicorn starts)."""
        import ssl

        for what, path in (("certificate", self.cert), ("key", self.key)):
            if not Path(path).is_file():
                raise ValueError(f"TLS {what} {path} does not exist")
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(self.cert), str(self.key))
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"cannot use TLS certificate {self.cert} with key {self.key}: {exc}") from None

    def uvicorn(self) -> dict[str, str]:
        return {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}


@contextlib.asynccontextmanager
async def running_server(app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                         tls: Tls | None = None) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on this event loop; yields its base URL (tests, benches, load tests)."""
    import uvicorn

    from app.live.ice import host_candidates

    host_candidates(host)  # a loopback server keeps its media on loopback; one bound to an address, there
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                           proxy_headers=False, **(tls.uvicorn() if tls else {})))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn exited before it started")
            await asyncio.sleep(0.02)
        bound = server.servers[0].sockets[0].getsockname()[1]
        yield f"{'https' if tls else 'http'}://{host}:{bound}"
    finally:
        server.should_exit = True
        await task


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's TCP socket, bound before anything else starts: a port already in use is a one-line
    error, not a warm-up torn down half way. ``OSError`` when it cannot be bound."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class _StopWhileStarting:
    """SIGTERM before uvicorn serves (imports, warm-up, a Ray cluster starting) would kill the process on the spot
    and leave its lanes' and festival's files behind; instead it is remembered, and the server shuts down through
    its lifespan as soon as uvicorn runs. Once uvicorn serves it handles SIGTERM itself."""

    def __init__(self) -> None:
        self.requested = False
        self.server: uvicorn.Server | None = None

    def __call__(self, _signum: int, _frame: object) -> None:
        self.requested = True
        if self.server is not None:
            self.server.should_exit = True

    def attach(self, server: uvicorn.Server) -> None:
        self.server = server
        server.should_exit = server.should_exit or self.requested


_stop_while_starting = _StopWhileStarting()


def stop_gracefully_on_sigterm() -> None:
    """From now on a SIGTERM shuts the server down cleanly, however early it comes (main thread only)."""
    signal.signal(signal.SIGTERM, _stop_while_starting)


def serve(sock: socket.socket, config: ServerConfig, tls: Tls | None = None) -> None:
    """Run the server on ``sock`` (from :func:`listening_socket`) until interrupted (blocking)."""
    from app.live.ice import host_candidates

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host_candidates(sock.getsockname()[0])  # a loopback server keeps its media on loopback; one on an address, there
    run_until_stopped(create_app(config), sock, tls)


def run_until_stopped(app: FastAPI, sock: socket.socket, tls: Tls | None = None) -> None:
    """``app`` under uvicorn on ``sock`` until Ctrl+C or SIGTERM (blocking); says where it serves."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info", proxy_headers=False,
                                           **(tls.uvicorn() if tls else {})))
    logging.getLogger("synchrony.server").info("serving on %s://%s:%d (Ctrl+C stops)", "https" if tls else "http",
                                               f"[{host}]" if ":" in host else host, port)
    _stop_while_starting.attach(server)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C is how it is meant to stop
        server.run(sockets=[sock])
