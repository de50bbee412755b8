"""The server's patches of aiortc's and aioice's internals, pinned to the versions they were written for.

They read private attributes and replace private methods, so importing this module with other
versions installed fails at once (:func:`check_versions`) instead of misbehaving in a live session.
Here: ICE consent per RFC 7675 (:func:`patient_consent`: 30 s without an answered check, not six
0.5 s misses, which closed healthy sessions when the cores were short); receiver hooks for the
session clock (:func:`hook_receiver`, :func:`set_origin`); the answer's senders (one MediaStream id,
sender reports on the media clock so encoder backlog does not leak into a browser's lip-sync, and the
bundle's transport for a second video m-line).

Patches that belong to one job live beside it and import this module, so the pin covers them too:
``app.live.jitter`` (receiver jitter buffers), ``app.live.video_encoder`` (the sender's VP8 encoder),
``app.live.ice`` (aioice's host addresses), ``app.live.limits`` (the receiver's packet handler) and,
for load-test peers, ``app.loadtest.netem`` (aioice's datagram send/receive). docs/ARCHITECTURE.md maps them.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import random
import time
import uuid
from collections.abc import Callable
from typing import Protocol

import aioice.ice
import aioice.stun
from aiortc import RTCRtpCodecParameters, RTCRtpReceiver, RTCRtpSender, RTCRtpTransceiver
from aiortc.clock import current_ntp_time
from aiortc.rtcrtpsender import RTCEncodedFrame
from aiortc.rtp import (
    RtcpByePacket,
    RtcpPacket,
    RtcpSdesPacket,
    RtcpSenderInfo,
    RtcpSourceInfo,
    RtcpSrPacket,
    RtpPacket,
)

from alignment.clock import SenderReport, TrackClock, ntp_to_seconds

log = logging.getLogger("app.live.ice")  # the consent patch's log lines keep their logger name

#: The versions these patches were written against (pyproject.toml pins the same).
PINNED = {"aiortc": "1.16.0", "aioice": "0.13.0"}


def check_versions(pinned: dict[str, str] = PINNED) -> None:
    """Refuse to patch versions other than the pinned ones (their internals may differ)."""
    wrong = {name: importlib.metadata.version(name) for name in pinned}
    wrong = {name: v for name, v in wrong.items() if v != pinned[name]}
    if wrong:
        found = ", ".join(f"{n} {v}" for n, v in wrong.items())
        want = " ".join(f"{n}=={pinned[n]}" for n in wrong)
        raise ImportError(f"app.live.webrtc patches aiortc/aioice internals and needs {want}; found {found}. "
                          f"Install the pinned versions (pip install {want}).")


check_versions()

# --- ICE consent (aioice) ---------------------------------------------------------------------------

_AIOICE_QUERY_CONSENT = aioice.ice.Connection.query_consent

CONSENT_EXPIRY_S = 30.0  # RFC 7675 section 5.1
CONSENT_RETRANSMISSIONS = 3  # sent at 0, 0.5, 1.5, 3.5 s; given up at 7.5 s


async def _query_consent(self: aioice.ice.Connection) -> None:
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
    """Use RFC 7675 consent expiry (``enabled``) or aioice's own again (process-wide)."""
    aioice.ice.Connection.query_consent = _query_consent if enabled else _AIOICE_QUERY_CONSENT


# --- RTP receivers (aiortc) -------------------------------------------------------------------------


class _TimestampMapper(Protocol):
    _origin: int | None


def hook_receiver(receiver: RTCRtpReceiver, tclock: TrackClock) -> None:
    """Feed the track's first packet arrival and RTCP sender reports to its clock.

    aiortc's two packet handlers are wrapped per instance; everything else still goes to aiortc
    unchanged.
    """
    original = receiver._handle_rtcp_packet
    original_rtp = receiver._handle_rtp_packet

    async def handle_rtp(packet: RtpPacket, arrival_time_ms: int) -> None:
        if tclock.first_pts is None and packet.payload:
            tclock.on_first_packet(int(packet.timestamp), time.monotonic())
        await original_rtp(packet, arrival_time_ms)

    receiver._handle_rtp_packet = handle_rtp  # type: ignore[method-assign]

    async def handle(packet: RtcpPacket) -> None:
        if isinstance(packet, RtcpSrPacket):
            set_origin(receiver, tclock)
            info = packet.sender_info
            tclock.on_sender_report(SenderReport(ntp_to_seconds(info.ntp_timestamp), info.rtp_timestamp))
        await original(packet)

    receiver._handle_rtcp_packet = handle  # type: ignore[method-assign]


def set_origin(receiver: RTCRtpReceiver | None, tclock: TrackClock) -> None:
    """The raw RTP timestamp aiortc's frame.pts counts from (its private TimestampMapper origin)."""
    if tclock.origin is not None or receiver is None:
        return
    mapper: _TimestampMapper | None = getattr(receiver, "_RTCRtpReceiver__timestamp_mapper", None)
    origin = getattr(mapper, "_origin", None)  # aiortc's private state: absent before the first frame
    if isinstance(origin, int):
        tclock.set_origin(origin)


# --- RTP senders (aiortc) -----------------------------------------------------------------------------


def share_stream(senders: list[RTCRtpSender], stream_id: str | None = None) -> str:
    """Put ``senders`` in one MediaStream (one ``msid`` stream id in the SDP), so a browser lip-syncs
    their tracks; returns the id. aiortc gives every sender of a peer connection the connection's own
    stream id (``RTCPeerConnection.__createTransceiver``) and reads ``sender._stream_id`` when it
    writes the SDP, so this must run before ``createAnswer``."""
    sid = stream_id or str(uuid.uuid4())
    for sender in senders:
        sender._stream_id = sid
    return sid


class SenderOrigin:
    """The random RTP timestamp origin aiortc adds to a sender's encoder timestamps (a local variable
    of ``RTCRtpSender._run_rtp``), recovered from the first packets: once a frame's packets are out,
    the sender's last RTP timestamp minus that frame's encoder timestamp is the origin."""

    def __init__(self) -> None:
        self.value: int | None = None
        self._last: int | None = None

    def wrap(self, sender: RTCRtpSender) -> None:
        original = sender._next_encoded_frame

        async def next_encoded_frame(codec: RTCRtpCodecParameters) -> RTCEncodedFrame | None:
            if self.value is None and self._last is not None and sender._RTCRtpSender__packet_count > 0:
                self.value = (sender._RTCRtpSender__rtp_timestamp - self._last) & 0xFFFFFFFF
            enc = await original(codec)
            if enc is not None and self.value is None:
                self._last = enc.timestamp
            return enc

        sender._next_encoded_frame = next_encoded_frame  # type: ignore[method-assign]


def media_clock_reports(sender: RTCRtpSender, rtp_of: Callable[[float], int | None],
                        zero_wall: Callable[[], float | None]) -> SenderOrigin:
    """RTCP sender reports whose RTP time is the media clock's at the report's NTP time.

    aiortc pairs the NTP time at which its last RTP packet was SENT with that packet's RTP time, so
    the encoder's backlog and the pacing of the send loop move every report, and a browser that
    lip-syncs two tracks by their reports plays one late by that much. Here the report's RTP time
    is derived from the track's own stamps: ``rtp_of(t)`` is the encoder timestamp (before the
    sender's origin) of session time ``t``, and ``zero_wall()`` the wall time of session time zero.
    Until the origin is known (the first frame is out) aiortc's own pair is sent.
    """
    origin = SenderOrigin()
    origin.wrap(sender)

    async def run_rtcp() -> None:
        p = "_RTCRtpSender__"
        getattr(sender, p + "rtcp_started").set()
        try:
            while True:
                await asyncio.sleep(0.5 + random.random())
                ntp, rtp = getattr(sender, p + "ntp_timestamp"), getattr(sender, p + "rtp_timestamp")
                zero = zero_wall()
                if origin.value is not None and zero is not None:
                    wall, now_ntp = time.monotonic(), current_ntp_time()
                    stamp = rtp_of(wall - zero)
                    if stamp is not None:
                        ntp, rtp = now_ntp, (origin.value + stamp) & 0xFFFFFFFF
                packets: list[RtcpPacket] = [RtcpSrPacket(ssrc=sender._ssrc, sender_info=RtcpSenderInfo(
                    ntp_timestamp=ntp, rtp_timestamp=rtp,
                    packet_count=getattr(sender, p + "packet_count") & 0xFFFFFFFF,
                    octet_count=getattr(sender, p + "octet_count") & 0xFFFFFFFF))]
                setattr(sender, p + "lsr", (ntp >> 16) & 0xFFFFFFFF)
                setattr(sender, p + "lsr_time", time.time())
                cname = getattr(sender, p + "cname")
                if cname is not None:
                    packets.append(RtcpSdesPacket(chunks=[RtcpSourceInfo(ssrc=sender._ssrc,
                                                                         items=[(1, cname.encode("utf8"))])]))
                await sender._send_rtcp(packets)
        except asyncio.CancelledError:
            pass
        await sender._send_rtcp([RtcpByePacket(sources=[sender._ssrc])])
        getattr(sender, p + "rtcp_exited").set()

    sender._run_rtcp = run_rtcp  # type: ignore[method-assign]
    return origin


def share_transport(transceiver: RTCRtpTransceiver, like: RTCRtpTransceiver) -> None:
    """Carry ``transceiver``'s media on ``like``'s transport.

    A second m-line of one kind (the avatar's video after the camera's) is created by aiortc on the
    first one's transport before the offer's BUNDLE group is applied; the group then moves the first
    m-line onto the bundle's transport but skips the second (already marked bundled), which is left
    on a transport that never connects, so its sender never starts.
    """
    transport = like.receiver.transport
    if transceiver.receiver.transport is not transport:
        transceiver.receiver.setTransport(transport)
        transceiver.sender.setTransport(transport)
