"""The returned video's VP8 encoder: aiortc's, with settings for a server that encodes many streams.

aiortc opens libvpx with ``cpu-used -6`` and temporal noise reduction (``noise-sensitivity 4``),
tuned for camera video. The returned video is rendered (a camera frame already decoded once, an
overlay, flat UI), so noise reduction buys nothing, and the fastest real-time speed loses little.
Bitrate control (REMB), packetization and keyframes on request stay aiortc's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import av
from aiortc.codecs.vpx import Vp8Encoder

import app.live.webrtc  # noqa: F401  (patches aiortc/aioice internals: the version pin)

if TYPE_CHECKING:
    from aiortc import RTCPeerConnection

#: libvpx options that differ from aiortc's (the rest are kept).
LEAN_OPTIONS = {"cpu-used": "16", "noise-sensitivity": "0"}


class LeanVp8Encoder(Vp8Encoder):
    """``Vp8Encoder`` whose libvpx context is opened with aiortc's settings and :data:`LEAN_OPTIONS`."""

    def encode(self, frame: av.VideoFrame, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        if frame.format.name != "yuv420p":
            frame = frame.reformat(format="yuv420p")
        codec = self.codec
        if codec is None or (frame.width, frame.height) != (codec.width, codec.height) or (
                abs(self.target_bitrate - codec.bit_rate) / codec.bit_rate > 0.1):
            self.codec = _open(frame.width, frame.height, self.target_bitrate)
        return super().encode(frame, force_keyframe)  # aiortc sees an open context that fits: it encodes


def _open(width: int, height: int, bitrate: int) -> av.CodecContext:
    """A libvpx context as aiortc 1.16 opens it (``Vp8Encoder.encode``), with :data:`LEAN_OPTIONS`."""
    codec = av.CodecContext.create("libvpx", "w")
    codec.width, codec.height, codec.pix_fmt = width, height, "yuv420p"
    codec.bit_rate, codec.gop_size, codec.qmin, codec.qmax = bitrate, 3000, 2, 56
    codec.options = {
        "bufsize": str(bitrate), "cpu-used": "-6", "deadline": "realtime", "lag-in-frames": "0",
        "minrate": str(bitrate), "maxrate": str(bitrate), "noise-sensitivity": "4", "overshoot-pct": "15",
        "partitions": "0", "static-thresh": "1", "undershoot-pct": "100", **LEAN_OPTIONS,
    }
    codec.thread_count = 1  # aiortc's choice up to 640x480; a server encodes many streams, one thread each
    return codec


def install(pc: RTCPeerConnection) -> bool:
    """Give the peer connection's video senders (the returned camera, the avatar) the lean encoder,
    where VP8 was negotiated (call after the answer is set, before media flows); False when none
    took it (H.264: aiortc's own)."""
    installed = False
    for t in pc.getTransceivers():
        codecs = getattr(t, "_codecs", None)
        if t.kind == "video" and codecs and str(codecs[0].mimeType).lower() == "video/vp8":
            name = "_RTCRtpSender__encoder"
            if getattr(t.sender, name, "missing") is None:
                setattr(t.sender, name, LeanVp8Encoder())
                installed = True
    return installed
