"""ICE host candidates: a loopback server or peer offers 127.0.0.1 only."""

from __future__ import annotations

from aiortc import RTCPeerConnection

from app.ice import is_loopback_host, is_loopback_url, loopback_candidates


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
