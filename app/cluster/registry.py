"""The cluster's synchrony nodes: found through Ray, given a server each, watched until they die.

A Ray node takes part when it declares the custom resource ``synchrony_node`` (one unit). For each
such node the registry starts one ``NodeServer`` actor pinned to it (node affinity, not soft) that
holds that unit, so a node never runs two servers. The actors are named and detached: an ingress that
restarts finds the running servers again instead of starting new ones (and their sessions live on).

Every ``poll_interval_s`` the registry reads each node's ``GET /readyz`` (state, sessions, room). A
node whose server does not answer is *unreachable* at once and takes no new sessions; it becomes
*lost* for good when Ray says its actor died or its node is gone, and is never placed on again (Ray
node ids are never reused: a machine that comes back joins as a new node).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import httpx

from alignment.json_types import JsonObject
from app.cluster.node import NODE_RESOURCE, START_TIMEOUT_S, NodeServer
from app.cluster.placement import LOST, READY, STARTING, UNREACHABLE, WARMING, NodeView, node_capacity
from app.live.config import ServerConfig

if TYPE_CHECKING:
    from ray.actor import ActorHandle

log = logging.getLogger("synchrony.cluster")

NAMESPACE = "synchrony"
KEY_LENGTH = 12  # hex digits of the Ray node id that name a node in session URLs and metrics


@dataclass(frozen=True)
class RegistryConfig:
    """How the nodes' servers are configured and how often the registry looks at them."""

    server: ServerConfig
    node_host: str | None = None  # None: each node's SYNCHRONY_NODE_HOST, else its Ray address
    resource: str = NODE_RESOURCE
    poll_interval_s: float = 0.5
    discover_interval_s: float = 1.0
    readyz_timeout_s: float = 2.0


@dataclass
class _Node:
    view: NodeView
    node_id: str
    actor: ActorHandle
    pid: int | None = None
    why: str = ""  # why it is unreachable or lost
    missing: dict[str, str] = field(default_factory=dict)  # stages its server runs without, and why


class NodeRegistry:
    """Known nodes by key (the first hex digits of their Ray node id); see the module docstring."""

    def __init__(self, config: RegistryConfig) -> None:
        self.config = config
        self._nodes: dict[str, _Node] = {}
        self._starting: set[asyncio.Task] = set()

    # --- what the ingress reads and reports -------------------------------------------------

    def views(self) -> list[NodeView]:
        return [n.view for n in self._nodes.values()]

    def get(self, key: str) -> NodeView | None:
        node = self._nodes.get(key)
        return node.view if node is not None else None

    def describe(self) -> dict[str, JsonObject]:
        """Every node as /readyz shows it."""
        return {key: {"state": n.view.state, "url": n.view.url, "sessions": n.view.sessions,
                      "capacity": n.view.capacity, "free": n.view.free, "pid": n.pid, "ray_node_id": n.node_id,
                      "missing": n.missing, **({"why": n.why} if n.why else {})} for key, n in self._nodes.items()}

    def placed(self, key: str) -> None:
        """A session is being placed on ``key``: count it until the node's next report."""
        node = self._nodes[key]
        node.view = replace(node.view, placed=node.view.placed + 1)

    def released(self, key: str) -> None:
        """A session on ``key`` ended through the ingress, or a placement there failed: its room is free
        again before the node's next report."""
        node = self._nodes[key]
        if node.view.placed:
            node.view = replace(node.view, placed=node.view.placed - 1)
        else:
            node.view = replace(node.view, sessions=max(node.view.sessions - 1, 0))

    def full(self, key: str) -> None:
        """``key`` refused a session (503): take no more there until its next report."""
        node = self._nodes[key]
        node.view = replace(node.view, placed=max(node.view.capacity - node.view.sessions, 0))

    def unreachable(self, key: str, why: str) -> None:
        node = self._nodes[key]
        if node.view.state != LOST:
            if node.view.state != UNREACHABLE:
                log.warning("node %s unreachable: %s", key, why)
            node.view, node.why = replace(node.view, state=UNREACHABLE), why

    def lose(self, key: str, why: str) -> None:
        """``key`` is gone for good: never placed on again; its actor is ended if it still runs."""
        node = self._nodes[key]
        if node.view.state == LOST:
            return
        log.warning("node %s lost: %s", key, why)
        node.view, node.why = replace(node.view, state=LOST, sessions=0, placed=0), why
        with contextlib.suppress(Exception):
            import ray

            ray.kill(node.actor, no_restart=True)

    # --- the watch loop ---------------------------------------------------------------------

    async def run(self, client: httpx.AsyncClient) -> None:
        """Discover nodes, start their servers and poll them, until cancelled."""
        next_discovery = 0.0
        try:
            while True:
                if time.monotonic() >= next_discovery:
                    next_discovery = time.monotonic() + self.config.discover_interval_s
                    try:
                        await self._discover()
                    except Exception:  # noqa: BLE001 - a Ray hiccup must not stop the watch
                        log.exception("node discovery failed; retrying")
                await asyncio.gather(*(self._poll(key, client) for key, n in list(self._nodes.items())
                                       if n.view.url and n.view.state != LOST))
                await asyncio.sleep(self.config.poll_interval_s)
        finally:
            for task in self._starting:
                task.cancel()

    async def _discover(self) -> None:
        import ray

        nodes = await asyncio.to_thread(ray.nodes)
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        for key, node in self._nodes.items():
            if node.node_id not in alive:
                self.lose(key, "Ray reports its node dead or removed")
        for n in nodes:
            node_id = n["NodeID"]
            if (n.get("Alive") and n.get("Resources", {}).get(self.config.resource, 0) >= 1
                    and node_id[:KEY_LENGTH] not in self._nodes):
                await self._start(node_id)

    async def _start(self, node_id: str) -> None:
        key = node_id[:KEY_LENGTH]
        actor = await asyncio.to_thread(self._create_actor, node_id)
        self._nodes[key] = _Node(NodeView(key, None, STARTING), node_id, actor)
        log.info("node %s: starting its server", key)
        task = asyncio.create_task(self._await_start(key), name=f"start-node-{key}")
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def _create_actor(self, node_id: str) -> ActorHandle:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return ray.remote(NodeServer).options(
            name=f"synchrony-node-{node_id}", namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
            num_cpus=0, resources={self.config.resource: 1}, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(self.config.server, self.config.node_host)

    async def _await_start(self, key: str) -> None:
        node = self._nodes[key]
        try:
            info = await asyncio.wait_for(node.actor.info.remote(), START_TIMEOUT_S + 60)
        except Exception as exc:  # noqa: BLE001 - RayActorError, a start-up error, or no start in time
            self.lose(key, f"its server did not start: {type(exc).__name__}: {str(exc)[:300]}")
            return
        if node.view.state == STARTING:
            node.pid = info["pid"]
            node.view = replace(node.view, url=info["url"], state=WARMING)
            log.info("node %s: server at %s (pid %s), warming up", key, info["url"], info["pid"])

    async def _poll(self, key: str, client: httpx.AsyncClient) -> None:
        node = self._nodes[key]
        try:
            resp = await client.get(f"{node.view.url}/readyz", timeout=self.config.readyz_timeout_s)
            body = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            self.unreachable(key, f"GET /readyz: {type(exc).__name__}: {exc}"[:200])
            await self._confirm_alive(key)
            return
        if node.view.state == LOST:
            return
        node.view = replace(node.view, state=READY if body.get("ready") else WARMING, placed=0,
                            sessions=int(body.get("sessions", 0)), capacity=node_capacity(body))
        node.why, node.missing = "", body.get("missing") or {}

    async def _confirm_alive(self, key: str) -> None:
        """Ask Ray whether an unreachable node's actor still lives; a dead one is lost for good."""
        import ray

        node = self._nodes[key]
        try:
            await asyncio.wait_for(node.actor.info.remote(), self.config.readyz_timeout_s)
        except ray.exceptions.ActorDiedError as exc:
            self.lose(key, f"its server's actor died ({type(exc).__name__})")
        except (TimeoutError, ray.exceptions.RayError):
            pass  # no answer yet, or "temporarily unavailable": unreachable until Ray decides
