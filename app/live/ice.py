"""Two process-wide adjustments to aioice (ICE under aiortc): host candidates and consent freshness.

Candidates: aioice offers every non-loopback interface address and never 127.0.0.1. A server or
peer that talks to loopback only (a local demo, the tests, the load test) must keep its media on
loopback too, so for them only 127.0.0.1 is offered. aioice has no setting for this, so its address
lookup is replaced process-wide; ``loopback_candidates(False)`` restores it.

Consent (RFC 7675): aioice sends a consent check every ~5 s, counts it failed unless the answer
comes within 0.5 s (no retransmission) and closes the connection after six failures in a row.
When the cores are short, datagrams wait in the server socket's receive queue; in bench/soak.py
(2 peers, 5 % loss, 2 cores) the answers arrived p50 0.65 s / p95 1.7 s after their checks, so the
checks kept failing and both healthy sessions were closed 35 s in. RFC 7675 expires consent 30 s
after the last *answered* check; ``patient_consent()`` makes each check an ordinary retransmitted
STUN transaction (answers within ~7.5 s count) and closes only after 30 s without one. A peer that
really vanished is still reaped by the session's media timeout (10 s) long before.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import aioice.ice
import aioice.stun

log = logging.getLogger(__name__)

_ALL_INTERFACES = aioice.ice.get_host_addresses
_AIOICE_QUERY_CONSENT = aioice.ice.Connection.query_consent

CONSENT_EXPIRY_S = 30.0  # RFC 7675 section 5.1
CONSENT_RETRANSMISSIONS = 3  # sent at 0, 0.5, 1.5, 3.5 s; given up at 7.5 s


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


async def _query_consent(self: Any) -> None:
    """``aioice.Connection.query_consent`` with RFC 7675's expiry: 30 s since the last answered check."""
    assert self.remote_password is not None
    answered = time.monotonic()
    while True:
        await asyncio.sleep(aioice.ice.CONSENT_INTERVAL * (0.8 + 0.4 * random.random()))
        for pair in list(self._nominated.values()):
            request = self.build_request(pair, nominate=False)
            try:
                await pair.protocol.request(request, pair.remote_addr,
                                            integrity_key=self.remote_password.encode("utf8"),
                                            retransmissions=CONSENT_RETRANSMISSIONS)
                answered = time.monotonic()
            except aioice.stun.TransactionError:
                pass
        if time.monotonic() - answered >= CONSENT_EXPIRY_S:
            log.info("ICE consent expired: no check answered for %.0f s", time.monotonic() - answered)
            self._query_consent_task = None
            await self.close()
            return


def patient_consent(enabled: bool = True) -> None:
    """Use RFC 7675 consent expiry (``enabled``) or aioice's own again."""
    aioice.ice.Connection.query_consent = _query_consent if enabled else _AIOICE_QUERY_CONSENT
