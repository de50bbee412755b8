"""ICE for servers and peers: which host candidates to offer, and the STUN/TURN servers to use.

Host candidates. aioice offers every non-loopback interface address and never 127.0.0.1. A server
or peer that talks to loopback only (a local demo, the tests, the load test) must keep its media on
loopback too, so for them only 127.0.0.1 is offered; a server bound to one address offers that one
(``host_candidates``). aioice has no setting for this, so its address lookup is replaced
process-wide; ``loopback_candidates(False)`` restores it.

STUN/TURN servers (``--ice-server``). One list configures the server's own aiortc agent and is told
to WHIP clients in ``Link: <url>; rel="ice-server"`` headers (RFC 9725 section 4.6). TURN servers
without fixed credentials get short-lived ones from a shared secret (coturn's ``use-auth-secret``,
the "TURN REST API" scheme): username ``<expiry unix time>:<name>``, password
base64(HMAC-SHA1(secret, username)), so no long-lived password reaches a browser.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import aioice.ice

import app.live.webrtc  # noqa: F401  (patches aiortc/aioice internals: the version pin)

if TYPE_CHECKING:
    from aiortc import RTCConfiguration

_ALL_INTERFACES = aioice.ice.get_host_addresses

_URL = re.compile(r"(?P<scheme>stuns?|turns?):(?:(?P<user>[^:@/?]+):(?P<cred>[^@]+)@)?"
                  r"(?P<host>\[[0-9a-fA-F:.]+\]|[^:?@/\s]+)(?::(?P<port>\d{1,5}))?(?:\?transport=(?P<transport>udp|tcp))?")


def _loopback_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    return ["127.0.0.1"] if use_ipv4 else (["::1"] if use_ipv6 else [])


def loopback_candidates(enabled: bool = True) -> None:
    """Offer only loopback host candidates (``enabled``), or every interface again."""
    aioice.ice.get_host_addresses = _loopback_addresses if enabled else _ALL_INTERFACES


def host_candidates(host: str | None) -> None:
    """Host candidates for a server bound to ``host``: loopback only, that one address, or every
    interface (a wildcard or a name that is not one address)."""
    if is_loopback_host(host):
        loopback_candidates(True)
        return
    try:
        addr = ipaddress.ip_address(host or "")
    except ValueError:
        loopback_candidates(False)
        return
    if addr.is_unspecified:
        loopback_candidates(False)
        return

    def only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [str(addr)] if (use_ipv4 if addr.version == 4 else use_ipv6) else []

    aioice.ice.get_host_addresses = only


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


# --- STUN / TURN servers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class IceServer:
    """One STUN or TURN server: its URL (RFC 7064/7065, no credentials in it) and credentials."""

    url: str
    username: str | None = None
    credential: str | None = None

    @property
    def is_turn(self) -> bool:
        return self.url.startswith("turn")


def parse_ice_server(text: str) -> IceServer:
    """``stun:host[:port]``, ``turn[s]:[user:password@]host[:port][?transport=udp|tcp]`` → IceServer;
    ``ValueError`` naming what is wrong."""
    m = _URL.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a STUN/TURN URL: {text!r} (stun:host:3478, turn:user:pass@host:3478?transport=udp, "
                         "turns:host:5349?transport=tcp)")
    scheme, user, cred = m.group("scheme"), m.group("user"), m.group("cred")
    if scheme.startswith("stun") and user:
        raise ValueError(f"STUN URLs carry no credentials: {text!r}")
    if scheme.startswith("stun") and m.group("transport"):
        raise ValueError(f"STUN URLs take no ?transport: {text!r}")
    port = m.group("port")
    if port is not None and not 0 < int(port) < 65536:
        raise ValueError(f"bad port in {text!r}")
    url = f"{scheme}:{m.group('host')}" + (f":{port}" if port else "")
    if m.group("transport"):
        url += f"?transport={m.group('transport')}"
    return IceServer(url, user, cred)


def turn_rest_credentials(secret: str, ttl_s: int, name: str = "synchrony",
                          now: float | None = None) -> tuple[str, str]:
    """Short-lived TURN credentials from coturn's ``static-auth-secret``: (username, password)."""
    expiry = int((time.time() if now is None else now) + ttl_s)
    username = f"{expiry}:{name}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


def with_credentials(servers: Sequence[IceServer], secret: str | None, ttl_s: int,
                     name: str = "synchrony") -> tuple[IceServer, ...]:
    """``servers`` with short-lived credentials filled in for TURN servers that have none."""
    if not secret:
        return tuple(servers)
    out = []
    for s in servers:
        if s.is_turn and s.username is None:
            user, cred = turn_rest_credentials(secret, ttl_s, name)
            s = replace(s, username=user, credential=cred)
        out.append(s)
    return tuple(out)


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def link_headers(servers: Sequence[IceServer]) -> list[str]:
    """RFC 9725 section 4.6 ``Link`` header values, one per server."""
    values = []
    for s in servers:
        value = f'<{s.url}>; rel="ice-server"'
        if s.is_turn and s.username is not None:
            value += (f"; username={_quoted(s.username)}; credential={_quoted(s.credential or '')}"
                      '; credential-type="password"')
        values.append(value)
    return values


def rtc_configuration(servers: Sequence[IceServer], relay_only: bool = False) -> RTCConfiguration:
    """The aiortc configuration for these servers (aioice uses the first STUN and first TURN one)."""
    from aiortc import RTCConfiguration, RTCIceServer
    from aiortc.rtcconfiguration import RTCIceTransportPolicy

    ice = [RTCIceServer(urls=s.url, username=s.username, credential=s.credential) for s in servers]
    policy = RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL
    return RTCConfiguration(iceServers=ice, iceTransportPolicy=policy)
