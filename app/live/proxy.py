"""Running behind a reverse proxy: believe its ``X-Forwarded-*`` headers, and only its.

A proxy that terminates TLS (nginx, Caddy) connects from its own address, over plain HTTP, often
with its own ``Host``. When the connecting address is one of ``forwarded_allow_ips`` ("*": any),
:class:`ForwardedHeaders` rewrites the request as the browser made it: the client address from the
rightmost untrusted ``X-Forwarded-For`` hop (what per-address offer limits count), the scheme from
``X-Forwarded-Proto``, ``Host`` from ``X-Forwarded-Host`` (what the same-origin check compares a
browser's ``Origin`` with), and a path prefix from ``X-Forwarded-Prefix`` (kept in the scope as
``PREFIX_KEY``; the WHIP ``Location`` header starts with it). From any other address the headers
are ignored, so a client cannot forge its address or origin.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

PREFIX_KEY = "synchrony.prefix"


def _trusted(host: str | None, allowed: Sequence[str]) -> bool:
    if host is None or not allowed:
        return False
    if "*" in allowed:
        return True
    for entry in allowed:
        try:
            if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            if host == entry:
                return True
    return False


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    values = [v.decode("latin-1") for k, v in headers if k.lower() == name]
    return ", ".join(values) if values else None


class ForwardedHeaders:
    """ASGI middleware applying a trusted proxy's ``X-Forwarded-*`` headers (see the module doc)."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = tuple(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            if _trusted(client[0] if client else None, self.allowed):
                scope = self._rewrite(dict(scope))
        await self.app(scope, receive, send)

    def _rewrite(self, scope: Scope) -> Scope:
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers", []))
        forwarded_for = _header(headers, b"x-forwarded-for")
        if forwarded_for:
            hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
            untrusted = [h for h in hops if not _trusted(h, self.allowed)]
            client = (untrusted or hops)[-1] if hops else None
            if client:
                scope["client"] = (client, 0)
        proto = _header(headers, b"x-forwarded-proto")
        if proto:
            proto = proto.split(",")[0].strip().lower()
            if proto in ("http", "https", "ws", "wss"):
                scope["scheme"] = proto
        host = _header(headers, b"x-forwarded-host")
        if host:
            host = host.split(",")[0].strip()
            scope["headers"] = [(k, v) for k, v in headers if k.lower() != b"host"] + [(b"host", host.encode())]
        prefix = _header(headers, b"x-forwarded-prefix")
        if prefix:
            scope[PREFIX_KEY] = "/" + prefix.split(",")[0].strip().strip("/") if prefix.strip("/ ") else ""
        return scope
