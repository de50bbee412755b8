"""ICE host candidates (a loopback server or peer offers 127.0.0.1 only) and consent expiry."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aioice
import aioice.ice
import aioice.stun
import pytest
from aiortc import RTCPeerConnection

import app.live.webrtc
from app.live.ice import is_loopback_host, is_loopback_url, loopback_candidates
from app.live.webrtc import patient_consent


def _candidate_addresses(sdp: str) -> set[str]:
    return {line.split()[4] for line in sdp.splitlines() if line.startswith("a=candidate:")}


async def test_loopback_candidates_only_then_restored():
    loopback_candidates(True)
    try:
        pc = RTCPeerConnection()
        pc.createDataChannel("events")
        await pc.setLocalDescription(await pc.createOffer())
        assert _candidate_addresses(pc.localDescription.sdp) == {"127.0.0.1"}
        await pc.close()
    finally:
        loopback_candidates(False)
    pc = RTCPeerConnection()
    pc.createDataChannel("events")
    await pc.setLocalDescription(await pc.createOffer())
    assert "127.0.0.1" not in _candidate_addresses(pc.localDescription.sdp)  # aioice's own choice again
    await pc.close()


def test_loopback_detection():
    assert is_loopback_host("127.0.0.1") and is_loopback_host("localhost") and is_loopback_host("::1")
    assert not is_loopback_host("192.0.2.1") and not is_loopback_host("") and not is_loopback_host(None)
    assert is_loopback_url("http://127.0.0.1:8000/whip") and not is_loopback_url("http://10.1.2.3/whip")


async def _connected_pair(answer_delay_s: float | None) -> tuple[Any, Any]:
    """Two aioice connections on loopback; ``b`` answers STUN requests ``answer_delay_s`` late
    (None: never), as a server whose receive queue is that deep would."""
    a, b = aioice.Connection(ice_controlling=True), aioice.Connection(ice_controlling=False)
    for conn in (a, b):
        await conn.gather_candidates()
    for here, there in ((a, b), (b, a)):
        here.remote_username, here.remote_password = there.local_username, there.local_password
        for cand in there.local_candidates:
            await here.add_remote_candidate(cand)
        await here.add_remote_candidate(None)
    await asyncio.gather(a.connect(), b.connect())
    loop = asyncio.get_running_loop()
    for proto in b._protocols:
        send = proto.send_stun

        def late(message: Any, addr: Any, send: Any = send) -> None:
            if message.message_class != aioice.stun.Class.RESPONSE:
                send(message, addr)
            elif answer_delay_s is not None:
                loop.call_later(answer_delay_s, send, message, addr)

        proto.send_stun = late
    return a, b


async def _closed_within(conn: Any, seconds: float) -> bool:
    t0 = time.monotonic()
    while not conn._closed and time.monotonic() - t0 < seconds:
        await asyncio.sleep(0.05)
    return bool(conn._closed)


async def test_consent_tolerates_late_answers_and_still_expires_without_any(monkeypatch):
    """aioice alone drops a connection whose consent answers take 0.7 s; RFC 7675 expiry keeps it, and
    still closes one that stopped answering."""
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.2)
    monkeypatch.setattr(app.live.webrtc, "CONSENT_EXPIRY_S", 1.5)
    monkeypatch.setattr(app.live.webrtc, "CONSENT_RETRANSMISSIONS", 1)  # a check gives up after 1.5 s
    try:
        patient_consent(False)
        a, b = await _connected_pair(0.7)
        assert await _closed_within(a, 8.0)  # aioice: six checks in a row not answered within 0.5 s
        await b.close()

        patient_consent(True)
        a, b = await _connected_pair(0.7)
        assert not await _closed_within(a, 5.0)
        await a.close()
        await b.close()

        a, b = await _connected_pair(None)
        assert await _closed_within(a, 6.0)
        await b.close()
    finally:
        patient_consent(False)


def test_webrtc_patches_refuse_unpinned_versions():
    """The patches read aiortc/aioice internals: other versions fail loudly, naming the pins."""
    from app.live.webrtc import PINNED, check_versions

    check_versions()  # the installed versions are the pinned ones
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert all(f'"{name}=={version}"' in pyproject for name, version in PINNED.items())
    with pytest.raises(ImportError, match=r"aiortc==0\.0\.1"):
        check_versions({**PINNED, "aiortc": "0.0.1"})
