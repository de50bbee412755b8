"""Jitter buffers for the server's receivers: video frames at their marker bit, audio without lag.

Video: aiortc's ``JitterBuffer`` knows a frame is complete only when the next frame's first packet
arrives, one frame interval late. Senders set the RTP marker bit on a frame's last packet (RFC 3550;
VP8 and H.264 payload formats), so a contiguous run with one timestamp ending in a marker is a whole
frame; without a marker the base behaviour applies.

Audio: aiortc's audio buffer hands a packet on only once four later ones have arrived, and after a
loss keeps a backlog for the rest of the session. Every Opus RTP packet is a whole frame (RFC 7587),
so :class:`AudioJitterBuffer` releases packets in order as they arrive, waits for a missing one only
while at most ``max_wait`` later packets have come (reordering), then skips it: the ASR hears a short
silence instead of everything late.
"""

from __future__ import annotations

from aiortc import RTCRtpReceiver
from aiortc.jitterbuffer import MAX_MISORDER, JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_add

import app.live.webrtc  # noqa: F401  (patches aiortc/aioice internals: the version pin)


class MarkerJitterBuffer(JitterBuffer):
    """``JitterBuffer`` for video that emits a frame as soon as its marker packet completes it."""

    def __init__(self, capacity: int = 512) -> None:
        super().__init__(capacity=capacity, is_video=True)

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        packets: list[RtpPacket] = []
        timestamp = None
        for count in range(self.capacity):
            packet = self._packets[(self._origin + count) % self._capacity]  # type: ignore[operator]
            if packet is None:
                break
            if timestamp is None:
                timestamp = packet.timestamp
            elif packet.timestamp != timestamp:
                break  # the older frame had no marker: let the base class decide
            packets.append(packet)
            if packet.marker:
                self.remove(count + 1)
                return JitterFrame(data=b"".join(p._data for p in packets), timestamp=timestamp)
        return super()._remove_frame(sequence_number)


class AudioJitterBuffer(JitterBuffer):
    """In-order audio packets at once; a missing one waited for over at most ``max_wait`` later ones.

    One packet leaves per packet received (aiortc's receiver takes one frame per ``add``), so a
    wait leaves a backlog of at most ``max_wait`` packets (40 ms at 20 ms packets) until the stream
    pauses; it never grows past that.
    """

    def __init__(self, capacity: int = 16, max_wait: int = 2) -> None:
        super().__init__(capacity=capacity)
        if not 0 <= max_wait < capacity:
            raise ValueError(f"max_wait must be in [0, {capacity})")
        self.max_wait = max_wait

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        seq = packet.sequence_number
        if self._origin is None:
            self._origin = seq
        delta = uint16_add(seq, -self._origin)
        behind = uint16_add(self._origin, -seq)
        if behind < delta:  # older than the next packet due
            if behind < MAX_MISORDER:
                return False, None  # too late: already skipped or played
            self.remove(self.capacity)  # the sender restarted its sequence
            self._origin, delta = seq, 0
        if delta >= self.capacity:
            self.remove(min(delta - self.capacity + 1, self.capacity))
            delta = self.capacity - 1
            self._origin = uint16_add(seq, -delta)
        self._packets[seq % self.capacity] = packet
        return False, self._release()

    def _at(self, k: int) -> RtpPacket | None:
        """The packet ``k`` places after the origin, or None."""
        return self._packets[(self._origin + k) % self.capacity]

    def _release(self) -> JitterFrame | None:
        """The packet at the origin, or past a gap that ``max_wait`` later packets have outwaited."""
        newest = max((k for k in range(self.capacity) if self._at(k) is not None), default=-1)
        for k in range(self.capacity):
            packet = self._at(k)
            if packet is not None:
                if k and newest - k + 1 <= self.max_wait:
                    return None  # a gap before it, not waited for long enough
                self.remove(k + 1)
                return JitterFrame(data=packet._data, timestamp=packet.timestamp)
        return None


def install(receiver: RTCRtpReceiver) -> bool:
    """Swap an ``RTCRtpReceiver``'s jitter buffer for the one above of its kind (before packets
    arrive); False if not possible."""
    name = "_RTCRtpReceiver__jitter_buffer"
    current = getattr(receiver, name, None)
    if not isinstance(current, JitterBuffer):
        return False
    kind = getattr(receiver, "_RTCRtpReceiver__kind", "")
    if kind == "video":
        setattr(receiver, name, MarkerJitterBuffer(current.capacity))
    elif kind == "audio":
        setattr(receiver, name, AudioJitterBuffer(current.capacity))
    else:
        return False
    return True
