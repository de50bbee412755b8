"""The marker-bit video jitter buffer: whole frames at their marker, base behaviour otherwise."""

from __future__ import annotations

from aiortc.rtp import RtpPacket

from app.jitter import MarkerJitterBuffer


def packet(seq: int, ts: int, marker: bool, data: bytes) -> RtpPacket:
    p = RtpPacket(payload_type=96, sequence_number=seq, timestamp=ts, marker=int(marker))
    p._data = data
    return p


def test_frame_released_at_its_marker_not_at_the_next_frame():
    jb = MarkerJitterBuffer(capacity=16)
    assert jb.add(packet(100, 9000, False, b"ab"))[1] is None
    _, frame = jb.add(packet(101, 9000, True, b"cd"))
    assert frame is not None and frame.data == b"abcd" and frame.timestamp == 9000
    _, frame = jb.add(packet(102, 12600, True, b"ef"))
    assert frame is not None and frame.data == b"ef"


def test_reordered_packets_wait_for_the_gap():
    jb = MarkerJitterBuffer(capacity=16)
    jb.add(packet(10, 0, False, b"a"))
    assert jb.add(packet(12, 0, True, b"c"))[1] is None  # 11 missing: not complete
    _, frame = jb.add(packet(11, 0, False, b"b"))
    assert frame is not None and frame.data == b"abc"


def test_lost_marker_falls_back_to_the_next_timestamp():
    jb = MarkerJitterBuffer(capacity=16)
    jb.add(packet(1, 0, False, b"x"))
    jb.add(packet(2, 0, False, b"y"))  # its marker packet never comes
    _, frame = jb.add(packet(3, 3600, False, b"z"))
    assert frame is not None and frame.data == b"xy"
