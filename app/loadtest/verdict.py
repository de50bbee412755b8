"""A round's pooled figures and whether they meet the sustain bounds (p95 word→token, Level-3 pass).

Pure functions over the peers' JSON-safe results, so a round's verdict can be checked without a server.
"""

from __future__ import annotations

from typing import Any

from alignment.lst import judge_samples, tier_rank
from app.loadtest import metrics as lm

#: The bounds a round must meet to count as "sustained".
P95_BOUND_MS = 1000.0
L3_BOUND = 0.99
RECALL_BOUND = 0.0  # off by default (the task's bounds are p95 and Level-3); --min-recall turns it on


def client_cpu_per_peer(results: list[dict[str, Any]], worker_cpu: dict[int, float],
                        setup_cpu: dict[int, float]) -> float | None:
    """The load generator's own cost: workers' CPU after their clips were built, per second a peer
    streamed (cores per peer; connecting and closing included, clip building not)."""
    streamed = sum(r.get("run_s", 0.0) for r in results if r.get("connected"))
    if not worker_cpu or streamed <= 0:
        return None
    spent = sum(worker_cpu[w] - setup_cpu.get(w, 0.0) for w in worker_cpu)
    return round(spent / streamed, 4)


def aggregate(results: list[dict[str, Any]], min_recall: float = RECALL_BOUND,
              allow_refusals: bool = False, require_lst: str | None = None) -> dict[str, Any]:
    """Round figures: pooled word→token latency, Level-3 pass over clean peers, offset detection.

    With ``allow_refusals`` a peer the server refused with 503 + Retry-After (full) is counted as
    refused, not failed: the bounds then hold over the admitted peers.
    """
    first, final = [], []
    words = matched = by_text = 0
    l3_ok = l3_n = 0
    turn: list[float] = []
    jitter: list[float] = []
    for r in results:
        for w in r.get("words", []):
            words += 1
            by_text += len(w) > 5 and w[5] == "text"
            if w[2] is not None:
                matched += 1
                first.append(w[2] - w[1])
            if w[3] is not None:
                final.append(w[3] - w[1])
        l3 = r.get("level3") or {}
        if not r.get("offset_ms") and l3.get("checks"):
            l3_ok += l3["ok"]
            l3_n += l3["checks"]
        resp = r.get("responses") or {}
        turn.extend(resp.get("turn_ms") or [])
        if resp.get("jitter_ms_max") is not None:
            jitter.append(resp["jitter_ms_max"])
    timeline = latency_windows([(w[1], w[2] - w[1]) for r in results for w in r.get("words", []) if w[2] is not None])
    injected = [r for r in results if r.get("offset_ms")]
    clean = [r for r in results if not r.get("offset_ms") and r.get("connected")]
    refused = [r["index"] for r in results if (r.get("refused") or {}).get("retry_after")]
    agg = {
        "peers": len(results),
        "connected": sum(bool(r.get("connected")) for r in results),
        "refused": refused,
        "failed": [r["index"] for r in results if r.get("error") and not (allow_refusals and r["index"] in refused)],
        "words": words,
        "matched": matched,
        "recall": round(matched / words, 4) if words else None,
        "recall_text": round(by_text / words, 4) if words else None,
        "latency_ms_p50": lm.to_ms(lm.quantile(first, 0.5)),
        "latency_ms_p95": lm.to_ms(lm.quantile(first, 0.95)),
        "final_latency_ms_p95": lm.to_ms(lm.quantile(final, 0.95)),
        "level3_checks": l3_n,
        "level3_pass_rate": round(l3_ok / l3_n, 4) if l3_n else None,
        "turn_ms_p50": lm.round_or_none(lm.quantile(turn, 0.5), 1),
        "turn_ms_p99": lm.round_or_none(lm.quantile(turn, 0.99), 1),
        "jitter_ms_max": max(jitter) if jitter else None,
        "offset_peers_flagged": sum(bool((r.get("level3") or {}).get("flagged")) for r in injected),
        "offset_peers": len(injected),
        "clean_peers_flagged": sum(bool((r.get("level3") or {}).get("flagged")) for r in clean),
        "latency_by_window": timeline,
    }
    agg["lst"] = judge_samples([x for r in results for x in r.get("lst_ttft_ms", [])],
                               [r.get("lst_itl_ms", []) for r in results])
    agg["bounds"] = check_bounds(agg, min_recall, allow_refusals, require_lst)
    return agg


def latency_windows(points: list[tuple[float, float]], window_s: float = 3.0) -> list[list[float | int | None]]:
    """Word→token latency pooled over peers in windows of peer-clock time: [start s, words, p50 ms, p95 ms].

    Shows how a time-varying network (stepwise delay, first-frame blocking) moves the latency.
    """
    if not points:
        return []
    out = []
    for k in range(int(max(t for t, _ in points) // window_s) + 1):
        lat = [x for t, x in points if k * window_s <= t < (k + 1) * window_s]
        out.append([k * window_s, len(lat), lm.to_ms(lm.quantile(lat, 0.5)), lm.to_ms(lm.quantile(lat, 0.95))])
    return out


def check_bounds(agg: dict[str, Any], min_recall: float = RECALL_BOUND, allow_refusals: bool = False,
                 require_lst: str | None = None) -> dict[str, Any]:
    """Which sustain bounds a round met: p95 word→token, Level-3 pass, all connected (+ recall, LST tier
    if asked).

    p95 counts only words that got a token; ``min_recall`` > 0 also stops a server from passing by
    dropping words. With ``allow_refusals``, every peer must be admitted and stay connected, or be
    refused with 503 + Retry-After, and at least one must be admitted. ``require_lst``: the round's
    LST tier (``agg["lst"]``: the server-measured TTFT and ITL samples its ``response`` events
    carried, judged by ``alignment.lst``) is at least this.
    """
    p95, l3, recall = agg["latency_ms_p95"], agg["level3_pass_rate"], agg["recall"]
    if allow_refusals:
        connected = (0 < agg["connected"] and agg["connected"] + len(agg.get("refused", ())) == agg["peers"]
                     and not agg["failed"])
        name = "every peer admitted and connected, or refused with 503 + Retry-After"
    else:
        connected, name = agg["connected"] == agg["peers"] and not agg["failed"], "all peers connected"
    checks = {
        f"p95 word->token <= {P95_BOUND_MS:.0f} ms": p95 is not None and p95 <= P95_BOUND_MS,
        f"Level-3 pass >= {L3_BOUND:.0%}": l3 is not None and l3 >= L3_BOUND,
        name: connected,
    }
    if min_recall > 0:
        checks[f"word recall >= {min_recall:.0%}"] = recall is not None and recall >= min_recall
    if require_lst:
        lst = agg.get("lst") or {}
        checks[f"LST tier >= {require_lst}"] = tier_rank(lst.get("tier", "none")) >= tier_rank(require_lst)
    return {"ok": all(checks.values()), "checks": checks}
