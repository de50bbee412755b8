"""One synchrony server on one Ray node, run inside a Ray actor.

The actor's process loads the models once (``app.live.server.create_app`` warms them before ``/readyz``
says ready) and serves WHIP on the node's own address, so the SDP answer it gives carries the node's
ICE candidates and media flows between client and node, never through the ingress. The server runs
on an event loop in a thread of its own; the actor's methods only report where it listens. When the
node dies or is removed, the actor's process (and with it every session on the node) goes too.
"""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import replace

from app.live.config import ServerConfig

#: The custom Ray resource a node declares to host one synchrony server (`ray start --resources`).
NODE_RESOURCE = "synchrony_node"
#: Set on a Ray node to the address its clients reach it at, when that is not the node's Ray address.
HOST_ENV = "SYNCHRONY_NODE_HOST"
START_TIMEOUT_S = 180.0


class NodeServer:
    """A synchrony server (``create_app`` + uvicorn) in this process, on ``host`` and ``port``."""

    def __init__(self, config: ServerConfig, host: str | None = None, port: int = 0) -> None:
        from app.live.reliability import bound_native_memory

        bound_native_memory()  # before the models load and the codec threads start, as `synchrony serve`
        self.host = host or os.environ.get(HOST_ENV) or _ray_node_ip()
        self.url: str | None = None
        self._error: str | None = None
        self._started = threading.Event()
        threading.Thread(target=asyncio.run, args=(self._serve(config, port),), name="synchrony-node",
                         daemon=True).start()
        if not self._started.wait(START_TIMEOUT_S):
            raise RuntimeError(f"the node's server did not start within {START_TIMEOUT_S:.0f} s")
        if self._error is not None:
            raise RuntimeError(f"the node's server did not start: {self._error}")

    async def _serve(self, config: ServerConfig, port: int) -> None:
        from app.live.server import create_app, running_server

        try:
            # the ingress limits offers per client address; to a node every offer comes from the ingress
            async with running_server(create_app(replace(config, offer_rate_per_s=0.0)), self.host, port) as url:
                self.url = url
                self._started.set()
                await asyncio.Event().wait()  # serves for the life of the actor's process
        except Exception as exc:  # noqa: BLE001 - reported to the ingress through __init__
            self._error = f"{type(exc).__name__}: {exc}"
            self._started.set()

    def info(self) -> dict[str, object]:
        """Where this node's server listens, and which process and Ray node it is."""
        return {"url": self.url, "pid": os.getpid(), "node_id": _ray_node_id()}


def _ray_node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _ray_node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()
