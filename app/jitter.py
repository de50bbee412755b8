"""A video jitter buffer that releases a frame at its RTP marker bit.

aiortc's ``JitterBuffer`` only knows a video frame is complete when the first packet of the *next*
frame arrives, which adds one frame interval (40 ms at 25 fps) to every camera frame before it is
decoded. Senders set the RTP marker bit on the last packet of each frame (RFC 3550; VP8 and H.264
payload formats), so a contiguous run of packets with one timestamp that ends in a marker is a
whole frame. Without a marker (lost or a sender that omits it) the base behaviour applies.
"""

from __future__ import annotations

from typing import Any

from aiortc.jitterbuffer import JitterBuffer, JitterFrame


class MarkerJitterBuffer(JitterBuffer):
    """``JitterBuffer`` for video that emits a frame as soon as its marker packet completes it."""

    def __init__(self, capacity: int = 512) -> None:
        super().__init__(capacity=capacity, is_video=True)

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        packets: list[Any] = []
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


def install(receiver: Any) -> bool:
    """Swap a video ``RTCRtpReceiver``'s jitter buffer (before packets arrive); False if not possible."""
    name = "_RTCRtpReceiver__jitter_buffer"
    current = getattr(receiver, name, None)
    if not isinstance(current, JitterBuffer) or getattr(receiver, "_RTCRtpReceiver__kind", "") != "video":
        return False
    setattr(receiver, name, MarkerJitterBuffer(current.capacity))
    return True
