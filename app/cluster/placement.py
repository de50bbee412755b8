"""Which node takes the next session: the ready node with the most free room.

Each node reports its own room on ``GET /readyz``: ``capacity`` (what it admits, from its measured
per-session cost) when it reports one, else ``max_sessions``, and its live ``sessions``. Sessions the
ingress placed since that report count as taken, so a burst of offers does not pile onto one node
between two polls; a node that still says 503 is simply skipped for the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from alignment.json_types import JsonObject

#: A node's states as the ingress sees them. Only ``ready`` nodes take sessions; ``lost`` is final.
STARTING, WARMING, READY, UNREACHABLE, LOST = "starting", "warming", "ready", "unreachable", "lost"


@dataclass(frozen=True)
class NodeView:
    """One node at one moment: where its server is, its state, its sessions and its room."""

    key: str
    url: str | None
    state: str
    sessions: int = 0
    capacity: int = 0
    placed: int = 0  # sessions placed here since its last report

    @property
    def free(self) -> int:
        return max(self.capacity - self.sessions - self.placed, 0) if self.state == READY else 0


def node_capacity(readyz: JsonObject) -> int:
    """The sessions a node admits: ``capacity`` if it reports one (the capacity work), else ``max_sessions``."""
    value = readyz.get("capacity")
    if value is None:
        value = readyz.get("max_sessions", 0)
    return int(value) if isinstance(value, int | float) else 0


def placement_order(nodes: list[NodeView]) -> list[NodeView]:
    """Nodes that have room, best first: most free room, then fewest sessions, then by key."""
    return sorted((n for n in nodes if n.free > 0), key=lambda n: (-n.free, n.sessions + n.placed, n.key))
