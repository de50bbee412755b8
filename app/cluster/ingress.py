"""The cluster's one WHIP endpoint: it places each session on a node and steps out of the way.

``POST /whip`` checks the offer exactly as a single server does (same 400/401/403/413/415 answers,
before readiness and room), then forwards it to the ready node with the most free room (``placement``)
and returns that node's SDP answer as is: its ICE candidates are the node's, so media never flows
through the ingress. The ``Location``, ``/whip/<node>/<session>``, names the node, so ``DELETE`` reaches
the session wherever it lives and the ingress keeps no per-session state (it can be restarted, or run
twice). ``503`` + ``Retry-After`` when no node has room or none is ready. ``/readyz``, ``/metrics`` and
``/metrics/lst`` cover the whole cluster, from each node's own endpoints.

Serving other machines works as on one server: HTTPS (``tls``), the bearer token, offers limited per
client address here (429; the nodes do not limit), ``OPTIONS /whip`` and the node's
``Link: rel="ice-server"`` headers passed on, and a trusted proxy's forwarded headers (``app.live.proxy``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from app.cluster.aggregate import merge_lst, merge_metrics
from app.cluster.placement import LOST, READY, NodeView, placement_order
from app.cluster.registry import NodeRegistry, RegistryConfig
from app.live.gate import RequestGate
from app.live.ice import link_headers, with_credentials
from app.live.offer import (
    OfferRefused,
    allow_cross_origin,
    read_offer,
    resource_location,
)
from app.live.ratelimit import OfferRateLimit

if TYPE_CHECKING:
    import socket

    from app.live.server import Tls

log = logging.getLogger("synchrony.cluster")

PROXY_TIMEOUT_S = 20.0  # a loaded node answers an offer in well under a second; this is the give-up
SCRAPE_TIMEOUT_S = 3.0


class ClusterMetrics:
    """The ingress's own Prometheus families (the nodes' are merged in at scrape time)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.placements = Counter("synchrony_cluster_placements", "sessions placed, by node", ["node"], registry=r)
        self.rejected = Counter("synchrony_cluster_whip_rejected", "WHIP requests the ingress refused, by status",
                                ["status"], registry=r)
        self.nodes = Gauge("synchrony_cluster_nodes", "nodes, by state", ["state"], registry=r)
        self.node_sessions = Gauge("synchrony_cluster_node_sessions", "live sessions per node (last report)",
                                   ["node"], registry=r)
        self.node_capacity = Gauge("synchrony_cluster_node_capacity", "sessions a node admits", ["node"], registry=r)

    def exposition(self, views: list[NodeView]) -> str:
        for state in ("starting", "warming", READY, "unreachable", LOST):
            self.nodes.labels(state).set(sum(v.state == state for v in views))
        for v in views:
            self.node_sessions.labels(v.key).set(v.sessions if v.state != LOST else 0)
            self.node_capacity.labels(v.key).set(v.capacity if v.state == READY else 0)
        return generate_latest(self.registry).decode()


def _plain(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return PlainTextResponse(message + "\n", status_code=status, headers=headers)


def _forwarded_headers(request: Request) -> dict[str, str]:
    auth = request.headers.get("authorization")
    return {"Authorization": auth} if auth else {}


class Ingress:
    """The ingress's view of the cluster (``registry``), its HTTP client to the nodes, and its route
    handlers, one method per route."""

    def __init__(self, config: RegistryConfig, registry: NodeRegistry | None = None) -> None:
        self.registry = registry or NodeRegistry(config)
        self.server = config.server
        self.metrics = ClusterMetrics()
        self.gate = RequestGate(auth_token=self.server.auth_token, allowed_origins=self.server.allowed_origins,
                                metrics_auth=self.server.metrics_auth, rejected=self.metrics.rejected,
                                offers=OfferRateLimit(self.server.offer_rate_per_s, self.server.offer_burst))
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """The HTTP client to the nodes (open while the app runs)."""
        if self._client is None:
            raise RuntimeError("the ingress is not running")
        return self._client

    @contextlib.asynccontextmanager
    async def lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        """Watch the cluster's nodes while serving."""
        self._client = client = httpx.AsyncClient(timeout=PROXY_TIMEOUT_S)
        watch = asyncio.create_task(self.registry.run(client), name="cluster-watch")
        yield
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await client.aclose()

    # --- routes (no docstrings: FastAPI would publish them in /openapi.json) -------------------------

    async def internal_error(self, _: Request, exc: Exception) -> Response:
        log.exception("internal error", exc_info=exc)
        return _plain(500, "internal server error")

    # OPTIONS /whip: the ICE servers (Link headers) a client needs before it builds its offer.
    async def whip_options(self, request: Request) -> Response:
        refused = self.gate.check(request)
        if refused is not None:
            return refused
        response = Response(status_code=204, headers={"Accept-Post": "application/sdp", "Allow": "OPTIONS, POST"})
        config = self.server
        for link in link_headers(with_credentials(config.ice_servers, config.turn_secret, config.turn_ttl_s,
                                                  "client")):
            response.headers.append("Link", link)
        return response

    # POST /whip: checked here, answered by the first node in placement order that has room.
    async def whip_offer(self, request: Request) -> Response:
        refused = self.gate.rate(request) or self.gate.check(request)
        if refused is not None:
            return refused
        try:
            sdp = await read_offer(request, self.server.max_sdp_bytes)
        except OfferRefused as exc:
            return self.gate.refuse(exc.status, str(exc))
        headers = {"Content-Type": "application/sdp", **_forwarded_headers(request)}
        for node in placement_order(self.registry.views()):
            answer = await self._offer_to(node, sdp, headers, request)
            if answer is not None:
                return answer
        return self._no_room()

    async def _offer_to(self, node: NodeView, sdp: str, headers: dict[str, str],
                        request: Request) -> Response | None:
        """The node's answer to the offer (or its refusal, as is); None to try the next node."""
        registry = self.registry
        registry.placed(node.key)  # counted before the answer, so concurrent offers spread out
        try:
            resp = await self.client.post(f"{node.url}/whip", content=sdp, headers=headers)
        except httpx.HTTPError as exc:
            registry.released(node.key)
            registry.unreachable(node.key, f"POST /whip: {type(exc).__name__}: {exc}"[:200])
            return None
        if resp.status_code == 503:
            registry.full(node.key)  # its own count was ahead of its last report: try the next
            return None
        if resp.status_code != 201:  # the node could not use the offer: its answer, as is
            registry.released(node.key)
            self.metrics.rejected.labels(str(resp.status_code)).inc()
            return _plain(resp.status_code, resp.text.strip()[:300])
        self.metrics.placements.labels(node.key).inc()
        session = resp.headers.get("location", "").rstrip("/").rsplit("/", 1)[-1]
        log.info("session %s placed on node %s", session, node.key)
        answer = Response(resp.content, status_code=201, media_type="application/sdp",
                          headers={"Location": resource_location(request, f"/whip/{node.key}/{session}")})
        for link in resp.headers.get_list("link"):
            answer.headers.append("Link", link)
        return answer

    def _no_room(self) -> Response:
        """503 when no node took the offer: none ready yet, or all full."""
        views = self.registry.views()
        if not any(v.state == READY for v in views):
            return self.gate.refuse(503, "no node is ready yet, retry shortly", {"Retry-After": "2"})
        capacity = sum(v.capacity for v in views if v.state == READY)
        ready = sum(v.state == READY for v in views)
        return self.gate.refuse(503, f"cluster full ({capacity} sessions on {ready} nodes)", {"Retry-After": "5"})

    async def whip_delete(self, node_key: str, session_id: str, request: Request) -> Response:
        return await self._to_session(node_key, session_id, request)

    async def whip_status(self, node_key: str, session_id: str, request: Request) -> Response:
        return await self._to_session(node_key, session_id, request)

    async def _to_session(self, node_key: str, session_id: str, request: Request) -> Response:
        """GET or DELETE /whip/<node>/<session>: forwarded to the node that holds the session."""
        refused = self.gate.check(request)
        if refused is not None:
            return refused
        node = self.registry.get(node_key)
        if node is None or node.url is None:
            return self.gate.refuse(404, "no such session")
        if node.state == LOST:
            return self.gate.refuse(404, "no such session: its node has left the cluster")
        try:
            resp = await self.client.request(request.method, f"{node.url}/whip/{session_id}",
                                             headers=_forwarded_headers(request))
        except httpx.HTTPError as exc:
            self.registry.unreachable(node_key, f"{request.method} session: {type(exc).__name__}: {exc}"[:200])
            return self.gate.refuse(502, f"node {node_key} did not answer; retry")
        if request.method == "DELETE" and resp.status_code == 200:
            self.registry.released(node_key)
        return Response(resp.content, status_code=resp.status_code,
                        media_type=resp.headers.get("content-type", "text/plain"))

    # /whip/<session> without a node: not a session of this cluster.
    async def whip_unknown(self, session_id: str) -> Response:
        return self.gate.refuse(404, "no such session")

    async def whip_patch(self, path: str) -> Response:
        return _plain(405, "trickle ICE is not supported; send a complete offer", {"Allow": "DELETE"})

    async def healthz(self) -> dict[str, object]:
        views = [v for v in self.registry.views() if v.state != LOST]
        return {"status": "ok", "sessions": sum(v.sessions for v in views), "nodes": len(views)}

    async def readyz(self) -> Response:
        ready = [v for v in self.registry.views() if v.state == READY]
        capacity = sum(v.capacity for v in ready)
        body = {"ready": bool(ready), "nodes_ready": len(ready), "sessions": sum(v.sessions for v in ready),
                "capacity": capacity, "max_sessions": capacity, "nodes": self.registry.describe()}
        return JSONResponse(body, status_code=200 if ready else 503)

    async def scrape(self, path: str) -> dict[str, httpx.Response]:
        """Every live node's 200 answer to ``GET path``, by node key (a node that does not answer is left out)."""
        live = [v for v in self.registry.views() if v.url and v.state != LOST]

        async def one(view: NodeView) -> httpx.Response | None:
            with contextlib.suppress(httpx.HTTPError):
                return await self.client.get(f"{view.url}{path}", timeout=SCRAPE_TIMEOUT_S, headers=self._node_auth())
            return None

        answers = await asyncio.gather(*(one(v) for v in live))
        return {v.key: r for v, r in zip(live, answers, strict=True) if r is not None and r.status_code == 200}

    def _node_auth(self) -> dict[str, str]:
        token = self.server.auth_token
        return {"Authorization": f"Bearer {token}"} if token and self.server.metrics_auth else {}

    async def prometheus(self, request: Request) -> Response:
        refused = self.gate.metrics(request)
        if refused is not None:
            return refused
        nodes = {key: r.text for key, r in (await self.scrape("/metrics")).items()}
        text = merge_metrics(self.metrics.exposition(self.registry.views()), nodes)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def lst(self, request: Request) -> Response:
        refused = self.gate.metrics(request)
        if refused is not None:
            return refused
        nodes = {}
        for key, r in (await self.scrape("/metrics/lst")).items():
            with contextlib.suppress(ValueError):
                nodes[key] = r.json()
        if not nodes:
            return JSONResponse({"error": "no node reports LST metrics"}, status_code=503)
        return JSONResponse(merge_lst(nodes))


def create_ingress_app(config: RegistryConfig, registry: NodeRegistry | None = None) -> FastAPI:
    """The ingress app; it watches the cluster's nodes (``registry``) while it runs."""
    ingress = Ingress(config, registry)
    app = FastAPI(title="synchrony cluster", lifespan=ingress.lifespan, docs_url=None, redoc_url=None)
    app.state.registry = ingress.registry
    app.state.metrics = ingress.metrics

    allow_cross_origin(app, ingress.server.allowed_origins)
    app.add_exception_handler(Exception, ingress.internal_error)
    app.add_api_route("/whip", ingress.whip_offer, methods=["POST"])
    app.add_api_route("/whip", ingress.whip_options, methods=["OPTIONS"])
    app.add_api_route("/whip/{node_key}/{session_id}", ingress.whip_delete, methods=["DELETE"])
    app.add_api_route("/whip/{node_key}/{session_id}", ingress.whip_status, methods=["GET"])
    app.add_api_route("/whip/{session_id}", ingress.whip_unknown, methods=["GET", "DELETE"])
    app.add_api_route("/whip/{path:path}", ingress.whip_patch, methods=["PATCH"])
    app.add_api_route("/healthz", ingress.healthz, methods=["GET"])
    app.add_api_route("/readyz", ingress.readyz, methods=["GET"])
    app.add_api_route("/metrics", ingress.prometheus, methods=["GET"])
    app.add_api_route("/metrics/lst", ingress.lst, methods=["GET"])
    if ingress.server.forwarded_allow_ips:
        from app.live.proxy import ForwardedHeaders

        app.add_middleware(ForwardedHeaders, allowed=ingress.server.forwarded_allow_ips)
    return app


class NoRayCluster(RuntimeError):
    """``synchrony cluster`` found no Ray cluster to join."""


def serve_cluster(sock: socket.socket, config: RegistryConfig, ray_address: str | None = None,
                  local_nodes: int = 0, node_cpus: int = 1, pin_nodes: bool = False, tls: Tls | None = None) -> None:
    """Run the ingress on ``sock`` (``app.live.server.listening_socket``) until interrupted (blocking): on a
    running Ray cluster, or on a local one it starts."""
    import ray

    from app.cluster.local import start_local_cluster, stop_local_cluster
    from app.cluster.registry import NAMESPACE
    from app.live.server import run_until_stopped

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per readiness poll
    cluster = start_local_cluster(local_nodes, node_cpus, pin_nodes) if local_nodes else None
    try:
        ray.init(address=cluster.address if cluster is not None else ray_address, namespace=NAMESPACE,
                 log_to_driver=False)
    except ConnectionError as exc:
        raise NoRayCluster(f"no Ray cluster at {ray_address!r} ({exc}); start one (`ray start --head`, "
                           "nodes with --resources '{\"synchrony_node\": 1}') or pass --local-nodes N") from None
    try:
        run_until_stopped(create_ingress_app(config), sock, tls)
    finally:
        if cluster is not None:
            stop_local_cluster(cluster)
        else:
            ray.shutdown()
