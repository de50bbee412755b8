"""What one session may cost, whatever its sender sends: bitrate, picture size, frame rate, garbage.

A hostile or broken WebRTC sender may send 4K at 60 fps, far more bits than it said, or RTP that is no
media: CPU the admission estimate never counted. Per receiver (:class:`ReceiverGuard`, on aiortc's packet
handler, decoder queue and decode-error flag):

* RTP bytes beyond ``max_kbps`` (a token bucket holding one second) are dropped before depacketizing;
  a sender still at twice the bound after ``SUSTAIN_S`` is cut off;
* VP8 key frames larger than ``max_pixels`` are not decoded (the size is in the frame header), nor
  anything after them until a key frame that fits;
* packets that are not media are counted per second; ``GARBAGE_SECONDS`` seconds in a row mostly
  garbage and the session is closed with an ``error`` event naming why.
After decoding, :class:`FrameCap` drops camera frames above ``max_fps`` (on their pts) and scales
larger ones down to fit ``max_size``, before the face stage and the camera buffer see them.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import av
from aiortc import RTCRtpReceiver
from aiortc.codecs import is_rtx
from aiortc.rtp import RtpPacket

import app.live.webrtc  # noqa: F401  (patches aiortc/aioice internals: the version pin)

if TYPE_CHECKING:
    from aiortc.jitterbuffer import JitterFrame
    from aiortc.rtcrtpparameters import RTCRtpCodecParameters

#: What aiortc's receiver puts on its decoder queue: the codec and one encoded frame.
DecoderItem = tuple["RTCRtpCodecParameters", "JitterFrame"]

SUSTAIN_S = 5.0  # seconds a sender may stay above twice the bitrate bound before it is cut off
GARBAGE_SECONDS = 3  # consecutive seconds mostly garbage that close the session
GARBAGE_MIN_PER_S = 10  # ... each with at least this many garbage packets
AUDIO_MAX_KBPS = 512  # Opus tops out at 510 kbit/s
_UNSET = object()


def vp8_keyframe_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a VP8 key frame's header (RFC 6386 section 9.1); None for other frames."""
    if len(data) < 10 or data[0] & 1 or data[3:6] != b"\x9d\x01\x2a":
        return None
    width, height = struct.unpack_from("<HH", data, 6)
    return width & 0x3FFF, height & 0x3FFF


class ReceiverGuard:
    """Bitrate bound, pre-decode size bound and garbage count for one RTP receiver.

    ``on_violation(message)`` is called once, on the event loop, when the sender must be cut off;
    ``on_oversized(width, height)`` for each frame skipped after a key frame too large to decode.
    """

    def __init__(self, receiver: RTCRtpReceiver, kind: str, max_kbps: int, max_pixels: int,
                 on_violation: Callable[[str], None], on_oversized: Callable[[int, int], None]) -> None:
        self.kind = kind
        self.rate = max(1, max_kbps) * 1000 / 8  # bytes/s
        self.max_kbps = max_kbps
        self.max_pixels = max_pixels
        self.on_violation = on_violation
        self.on_oversized = on_oversized
        self._tokens = self.rate
        self._last = time.monotonic()
        self._over_since: float | None = None
        self._window_start = self._last
        self._window_bytes = 0
        self._packets = 0
        self._garbage = 0
        self._decode_errors = 0
        self._garbage_seconds = 0
        self._skipping: tuple[int, int] | None = None  # the too-large key frame's size while skipping
        self.dropped_bytes = 0
        self.garbage_total = 0
        self.violated: str | None = None
        self._lock = threading.Lock()  # decode errors are counted on the decoder thread
        self._install(receiver)

    def _install(self, receiver: RTCRtpReceiver) -> None:
        handle = receiver._handle_rtp_packet
        nacks = getattr(receiver, "_RTCRtpReceiver__nack_generator", None)
        codecs: dict[int, RTCRtpCodecParameters] = getattr(receiver, "_RTCRtpReceiver__codecs", {})

        async def guarded(packet: RtpPacket, arrival_time_ms: int) -> None:
            codec = codecs.get(packet.payload_type)
            if not self._admit(len(packet.payload) + 12):
                if nacks is not None and codec is not None and not is_rtx(codec):
                    nacks.add(packet)  # seen, so not asked for again: a retransmission would be dropped too
                return
            packet._data = _UNSET  # type: ignore[attr-defined]  # aiortc sets it once the payload parses
            await handle(packet, arrival_time_ms)
            # aiortc parses a retransmission (RTX) as a new, unwrapped packet, so this one's payload is never
            # set: a lossy network's NACKed packets are not garbage.
            retransmission = codec is not None and is_rtx(codec)
            if packet.payload and not retransmission and getattr(packet, "_data", _UNSET) is _UNSET:
                self._count_garbage()
            self._tick()

        receiver._handle_rtp_packet = guarded  # type: ignore[method-assign]
        queue = getattr(receiver, "_RTCRtpReceiver__decoder_queue", None)
        if queue is not None:
            put = queue.put

            def put_checked(item: DecoderItem | None, *args: object, **kwargs: object) -> None:
                if item is None or self._decodable(item):
                    put(item, *args, **kwargs)

            queue.put = put_checked
        flag = getattr(receiver, "_RTCRtpReceiver__decoder_error", None)
        if flag is not None:
            set_flag = flag.set

            def decode_failed() -> None:
                with self._lock:
                    self._decode_errors += 1
                set_flag()

            flag.set = decode_failed

    # --- the bitrate bound ---------------------------------------------------------------------

    def _admit(self, size: int) -> bool:
        now = time.monotonic()
        self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._window_bytes += size
        if self._tokens >= size:
            self._tokens -= size
            return True
        self.dropped_bytes += size
        return False

    # --- garbage -------------------------------------------------------------------------------

    def _count_garbage(self) -> None:
        self._garbage += 1
        self.garbage_total += 1

    def _decodable(self, item: DecoderItem) -> bool:
        """Whether the decoder gets this encoded frame: not while skipping frames too large to decode."""
        codec, frame = item
        if getattr(codec, "name", "").lower() != "vp8":
            return True
        size = vp8_keyframe_size(frame.data)
        if size is not None:
            self._skipping = size if size[0] * size[1] > self.max_pixels else None
        if self._skipping is not None:
            self.on_oversized(*self._skipping)
        return self._skipping is None

    def _tick(self) -> None:
        """Once a second: the bitrate and garbage verdicts of the second just ended."""
        self._packets += 1
        now = self._last
        span = now - self._window_start
        if span < 1.0:
            return
        kbps = self._window_bytes * 8 / 1000 / span
        with self._lock:
            bad = self._garbage + self._decode_errors
            self._decode_errors = 0
        packets = self._packets
        self._window_start, self._window_bytes, self._packets, self._garbage = now, 0, 0, 0
        if self.violated is not None:
            return
        if kbps > 2 * self.max_kbps:
            self._over_since = self._over_since or now - span
            if now - self._over_since >= SUSTAIN_S:
                self._violate(f"incoming {self.kind} at {kbps:.0f} kbit/s, over the {self.max_kbps} kbit/s bound "
                              f"for {now - self._over_since:.0f} s")
                return
        else:
            self._over_since = None
        if bad >= GARBAGE_MIN_PER_S and bad * 2 >= packets:
            self._garbage_seconds += 1
            if self._garbage_seconds >= GARBAGE_SECONDS:
                self._violate(f"incoming {self.kind} is not decodable media ({bad} of {packets} packets in the "
                              f"last second were garbage, {GARBAGE_SECONDS} s in a row)")
        else:
            self._garbage_seconds = 0

    def _violate(self, message: str) -> None:
        self.violated = message
        self.on_violation(message)


class FrameCap:
    """Camera frames above ``max_fps`` (by pts) dropped, larger than ``max_size`` scaled to fit."""

    def __init__(self, max_size: tuple[int, int], max_fps: float) -> None:
        self.max_w, self.max_h = max_size
        self.fps = max_fps
        self._slot: int | None = None
        self.dropped = 0
        self.scaled = 0

    def take(self, t: float) -> bool:
        """Whether the frame at session time ``t`` is kept: at most one per slot of 1/``max_fps`` s, the
        slots centred on the grid, so a camera at the cap with a few ms of jitter keeps every frame."""
        if self.fps <= 0:
            return True
        slot = round(t * self.fps)
        if self._slot is not None and self._slot - 2 * self.fps <= slot <= self._slot:  # back 2 s+: a clock step
            self.dropped += 1
            return False
        self._slot = slot
        return True

    def fit(self, frame: av.VideoFrame) -> av.VideoFrame:
        """``frame``, scaled down (aspect kept, even sizes) when it is larger than ``max_size``."""
        w, h = frame.width, frame.height
        if w <= self.max_w and h <= self.max_h:
            return frame
        scale = min(self.max_w / w, self.max_h / h)
        small = frame.reformat(width=max(2, int(w * scale) // 2 * 2), height=max(2, int(h * scale) // 2 * 2),
                               interpolation="FAST_BILINEAR")
        self.scaled += 1
        return small
