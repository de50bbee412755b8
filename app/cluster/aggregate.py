"""The cluster's /metrics and /metrics/lst, made from each node's own.

Prometheus: every node's samples get a ``node`` label and are grouped by metric family under one
``# HELP``/``# TYPE`` pair, after the ingress's own ``synchrony_cluster_*`` families; so
``synchrony_sessions{node="…"}`` shows where the sessions are. LST: each node's snapshot as it is,
and cluster figures that the tier must meet on every node: the worst node's TTFT p99 (no lower than
the p99 of all TTFTs pooled), the largest ITLmax, the worst jitter.
"""

from __future__ import annotations

from alignment.json_types import JsonObject
from alignment.lst import tier_for


def with_node_label(sample: str, node: str) -> str:
    """``name{a="b"} 1.0`` → ``name{node="k",a="b"} 1.0``; ``name 1.0`` → ``name{node="k"} 1.0``."""
    brace, space = sample.find("{"), sample.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        return f'{sample[: brace + 1]}node="{node}",{sample[brace + 1 :]}'
    return f'{sample[:space]}{{node="{node}"}}{sample[space:]}' if space != -1 else sample


def merge_metrics(own: str, nodes: dict[str, str]) -> str:
    """The ingress's exposition followed by every node's, families merged, samples labelled by node."""
    families: dict[str, dict[str, list[str]]] = {}
    for node, text in nodes.items():
        family = ""
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                meta = families.setdefault(family, {"meta": [], "samples": []})["meta"]
                if line not in meta:
                    meta.append(line)
            elif line and not line.startswith("#"):
                families.setdefault(family, {"meta": [], "samples": []})["samples"].append(
                    with_node_label(line, node))
    lines = [own.rstrip("\n")] if own.strip() else []
    for family in families.values():
        lines.extend(family["meta"] + family["samples"])
    return "\n".join(lines) + "\n"


def _worst(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def merge_lst(nodes: dict[str, JsonObject]) -> JsonObject:
    """Cluster LST figures from each node's ``/metrics/lst`` snapshot (see the module docstring)."""
    ttft = _worst([s.get("ttft_ms_p99") for s in nodes.values()])
    jitter = _worst([s.get("jitter_ms") for s in nodes.values()])
    return {
        "ttft_ms_p99": ttft,
        "itl_ms_max": _worst([s.get("itl_ms_max") for s in nodes.values()]),
        "jitter_ms": jitter,
        "tier": tier_for(ttft, jitter),
        "sessions": sum(int(s.get("sessions", 0)) for s in nodes.values()),
        "closed_sessions": sum(int(s.get("closed_sessions", 0)) for s in nodes.values()),
        "ttft_samples": sum(int(s.get("ttft_samples", 0)) for s in nodes.values()),
        "per_session": {f"{node}/{sid}": figures for node, s in nodes.items()
                        for sid, figures in (s.get("per_session") or {}).items()},
        "per_node": {node: {k: v for k, v in s.items() if k != "per_session"} for node, s in nodes.items()},
    }
