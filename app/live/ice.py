"""Loopback-only ICE host candidates, for servers and peers that talk to 127.0.0.1 only.

aioice offers every non-loopback interface address and never 127.0.0.1. A server or peer that talks
to loopback only (a local demo, the tests, the load test) must keep its media on loopback too, so
for them only 127.0.0.1 is offered. aioice has no setting for this, so its address lookup is
replaced process-wide; ``loopback_candidates(False)`` restores it. (The consent patch and the
other reaches into aiortc/aioice internals are in ``app.live.webrtc``.)
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import aioice.ice

_ALL_INTERFACES = aioice.ice.get_host_addresses


def _loopback_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    return ["127.0.0.1"] if use_ipv4 else (["::1"] if use_ipv6 else [])


def loopback_candidates(enabled: bool = True) -> None:
    """Offer only loopback host candidates (``enabled``), or every interface again."""
    aioice.ice.get_host_addresses = _loopback_addresses if enabled else _ALL_INTERFACES


def is_loopback_host(host: str | None) -> bool:
    """True when ``host`` (name or address) resolves to loopback addresses only."""
    if not host:
        return False
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {info[4][0].split("%")[0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a).is_loopback for a in addrs)


def is_loopback_url(url: str) -> bool:
    return is_loopback_host(urlsplit(url).hostname)
