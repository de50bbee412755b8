"""``synchrony probe URL [--require TIER]``: read a server's /metrics/lst, print it, judge the tier.

Meant as a CI step: exit 0 when the server's pooled tier is at least the required one (or when no
tier is required), 1 below it, 2 on bad usage, 3 when the figures cannot be read (server down,
no LST stage, not JSON). The verdict is the server's own (``alignment.lst`` definitions, version
in ``lst_version``); the probe adds ``--min-responses`` so a server that has not answered yet
cannot pass by having nothing to judge.
"""

from __future__ import annotations

import argparse
import json
import sys

import httpx

from alignment.json_types import JsonObject
from alignment.lst import TIER_NAMES, tier_rank

EXIT_OK, EXIT_BELOW, EXIT_USAGE, EXIT_UNREADABLE = 0, 1, 2, 3


def lst_url(url: str) -> str:
    """The /metrics/lst URL for a server base URL, a WHIP URL, or the endpoint itself."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"URL must start with http:// or https://, got {url!r}")
    base = url.rstrip("/")
    if base.endswith("/metrics/lst"):
        return base
    for suffix in ("/whip", "/metrics"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base + "/metrics/lst"


def fetch_lst(url: str, timeout_s: float = 5.0, token: str | None = None) -> JsonObject:
    """GET the figures; ValueError with a one-line reason when they cannot be had."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(url, timeout=timeout_s, headers=headers)
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None
    if resp.status_code != 200:
        raise ValueError(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        body = resp.json()
    except json.JSONDecodeError:
        raise ValueError(f"{url} did not answer JSON: {resp.text[:80]!r}") from None
    if not isinstance(body, dict) or "tier" not in body:
        raise ValueError(f"{url} answered JSON without a tier: {str(body)[:120]}")
    return body


def judge(snap: JsonObject, require: str | None, min_responses: int = 1) -> tuple[bool, str]:
    """(passed, one-line reason)."""
    responses = int(snap.get("ttft_samples") or 0)
    tier = str(snap.get("tier", "none"))
    if require is None:
        return True, f"tier {tier} (nothing required)"
    if responses < min_responses:
        return False, f"only {responses} responses measured (need {min_responses}); tier {tier} is not evidence"
    if tier_rank(tier) >= tier_rank(require):
        return True, f"tier {tier} meets {require}"
    return False, f"tier {tier} is below the required {require}"


def summary_lines(snap: JsonObject) -> list[str]:
    def ms(key: str) -> str:
        v = snap.get(key)
        return "n/a" if v is None else f"{v:.1f} ms"

    return [
        f"LST TTFT p99 (request written → first content read): {ms('ttft_ms_p99')}   p50 {ms('ttft_ms_p50')}",
        f"ITL jitter σ8 (worst window):          {ms('jitter_ms')}   ITLmax {ms('itl_ms_max')}",
        f"turn latency (end of speech → first token, turn-hold included): p50 {ms('turn_ms_p50')}  "
        f"p95 {ms('turn_ms_p95')}; turn-hold p99 {ms('hold_ms_p99')}",
        f"SEQ-Integrity {snap.get('seq_integrity', 'n/a')} over {snap.get('seq_answers', 0)} answers; prefetch waste "
        f"{snap.get('prefetch_wasted', 0)} of {snap.get('prefetch_requests', 0)} requests",
        f"responses {snap.get('ttft_samples', 0)}, sessions {snap.get('sessions', 0)} live + "
        f"{snap.get('closed_sessions', 0)} closed, definitions v{snap.get('lst_version', 1)}",
        f"tier: {snap.get('tier', 'none')}",
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="synchrony probe", description=__doc__.splitlines()[0])
    p.add_argument("url", help="server base URL (http://127.0.0.1:8000), its /whip or /metrics/lst")
    p.add_argument("--require", choices=TIER_NAMES[1:], default=None, help="exit 1 below this tier")
    p.add_argument("--min-responses", type=int, default=1, help="with --require: fail with fewer measured responses")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the server")
    p.add_argument("--token", default=None, help="bearer token, if the server asks for one")
    p.add_argument("--json", action="store_true", help="print the server's JSON instead of the summary")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        url = lst_url(args.url)
    except ValueError as exc:
        print(f"synchrony probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        snap = fetch_lst(url, args.timeout, args.token)
    except ValueError as exc:
        print(f"synchrony probe: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    print(json.dumps(snap, indent=1) if args.json else "\n".join(summary_lines(snap)))
    ok, why = judge(snap, args.require, args.min_responses)
    print(f"{'PASS' if ok else 'FAIL'}: {why}")
    return EXIT_OK if ok else EXIT_BELOW
