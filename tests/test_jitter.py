"""The marker-bit video jitter buffer: whole frames at their marker, base behaviour otherwise."""

from __future__ import annotations

from aiortc.rtp import RtpPacket

from app.live.jitter import AudioJitterBuffer, MarkerJitterBuffer


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


def audio(seq: int) -> RtpPacket:
    return packet(seq, seq * 960, True, bytes([seq % 256]))


def released(jb: AudioJitterBuffer, seqs: list[int]) -> list[int | None]:
    """The sequence number released by each add (None: held)."""
    out = []
    for s in seqs:
        frame = jb.add(audio(s))[1]
        out.append(None if frame is None else frame.timestamp // 960)
    return out


def test_audio_packets_leave_as_they_arrive():
    """aiortc's own buffer holds each packet until four later ones arrived (80 ms)."""
    assert released(AudioJitterBuffer(), [7, 8, 9, 10]) == [7, 8, 9, 10]


def test_reordered_audio_waits_for_the_missing_packet():
    assert released(AudioJitterBuffer(max_wait=2), [1, 3, 2, 4, 5]) == [1, None, 2, 3, 4]


def test_lost_audio_is_skipped_after_max_wait_and_the_backlog_stays_bounded():
    jb = AudioJitterBuffer(max_wait=2)
    # 3 lost: skipped once 3 packets past it came; the backlog is then 2 packets and stays there
    assert released(jb, [1, 2, 4, 5, 6, 7, 8]) == [1, 2, None, None, 4, 5, 6]
    # losses at 9, 12 and 20: every one is already outwaited by the backlog, nothing more is held
    seqs = [10, 11, 13, 14, 15, 16, 17, 18, 19, 21, 22]
    out = released(jb, seqs)
    assert None not in out and out == sorted(out) and 9 not in out and 12 not in out
    assert out[-1] == 19 and sum(p is not None for p in jb._packets) == 2  # 21, 22: 40 ms; aiortc's ~300 ms


def test_late_and_restarted_audio_sequences():
    jb = AudioJitterBuffer(max_wait=1)
    assert released(jb, [50, 52, 53]) == [50, None, 52]
    assert released(jb, [51]) == [None]  # came after it was skipped: dropped, not played late
    assert released(jb, [54, 40000, 40001]) == [53, 40000, 40001]  # a new sequence starts over
    assert released(jb, [40001 + 100]) == [None]  # a jump forward beyond the buffer is a gap too
