"""The session clock: arrival anchoring until an SR, one sender timeline after, RTP wrap."""

from __future__ import annotations

import pytest

from alignment.clock import SenderReport, SessionClock, ntp_to_seconds, rtp_diff


def test_rtp_diff_wraps():
    assert rtp_diff(5, (1 << 32) - 5) == 10
    assert rtp_diff((1 << 32) - 5, 5) == -10
    assert rtp_diff(1000, 400) == 600


def test_ntp_to_seconds():
    assert ntp_to_seconds((3 << 32) | (1 << 31)) == pytest.approx(3.5)


def test_zero_is_first_media_and_arrival_mode():
    clock = SessionClock()
    video = clock.track("video", 90_000)
    audio = clock.track("audio", 48_000)
    # Video's first frame arrives at wall 100.0, audio's first frame 30 ms later.
    assert video.time(0, arrival=100.0) == 0.0
    assert audio.time(0, arrival=100.030) == pytest.approx(0.030)
    # Later frames follow their own RTP clocks, not their (jittery) arrival.
    assert video.time(9000, arrival=100.2) == pytest.approx(0.1)
    assert audio.time(4800, arrival=999.0) == pytest.approx(0.130)
    assert clock.modes() == {"video": "arrival", "audio": "arrival"}


def test_first_frame_needs_arrival():
    with pytest.raises(ValueError, match="arrival"):
        SessionClock().track("video", 90_000).time(0, arrival=None)


def test_sender_reports_put_tracks_on_one_timeline():
    """Audio captured at the same instant as video but delivered 45 ms later ends up at the same time."""
    clock = SessionClock()
    video = clock.track("video", 90_000)
    audio = clock.track("audio", 48_000)
    v0, a0 = 123_456, (1 << 32) - 2_400  # random origins; audio wraps 50 ms in
    video.set_origin(v0)
    audio.set_origin(a0)
    video.time(0, arrival=10.000)
    audio.time(0, arrival=10.045)  # network skew: audio path 45 ms slower
    sender_t0 = 5000.0  # sender NTP seconds when both first frames were captured
    video.on_sender_report(SenderReport(ntp=sender_t0 + 1.0, rtp=(v0 + 90_000) % (1 << 32)))
    assert video.time(0, None) == pytest.approx(0.0)  # until audio's SR, the first SR's track holds
    audio.on_sender_report(SenderReport(ntp=sender_t0 + 1.0, rtp=(a0 + 48_000) % (1 << 32)))
    assert clock.modes() == {"video": "sender", "audio": "sender"}
    # Audio, the reference, keeps the time its arrival gave it; video joins it on the sender clock.
    assert audio.time(0, None) == pytest.approx(0.045)
    assert video.time(0, None) == pytest.approx(0.045)
    assert audio.time(48_000 * 2, None) == pytest.approx(video.time(90_000 * 2, None))
    assert clock.steps == 1  # video moved once


def test_a_late_stamped_video_report_does_not_move_audio():
    """Video's SR comes first, stamped 60 ms after capture (encode delay + send wait): the audio
    times (what words are placed by) stay where audio's own arrival put them."""
    clock = SessionClock()
    video = clock.track("video", 90_000)
    audio = clock.track("audio", 48_000)
    video.set_origin(0)
    audio.set_origin(0)
    audio.time(0, arrival=20.001)  # both captured at sender 300.0; audio arrives 1 ms later
    video.time(0, arrival=20.030)  # video after a 29 ms encode
    audio_before = [audio.time(pts, None) for pts in (4_800, 48_000)]
    video.on_sender_report(SenderReport(ntp=300.0 + 0.5 + 0.060, rtp=45_000))
    audio.on_sender_report(SenderReport(ntp=300.0 + 1.0 + 0.002, rtp=48_000))
    assert [audio.time(pts, None) for pts in (4_800, 48_000)] == pytest.approx(audio_before)
    assert audio.mode == "sender"
    # Video lands on audio's timeline up to its report's stamping delay, not its arrival delay.
    assert video.time(0, None) == pytest.approx(0.058)


def test_sender_report_before_first_frame_is_kept():
    clock = SessionClock()
    video = clock.track("video", 90_000)
    video.set_origin(0)
    video.on_sender_report(SenderReport(ntp=1.0, rtp=0))
    assert video.time(0, arrival=3.0) == 0.0  # the early report is applied with the first frame
    assert video.mode == "sender"
    assert video.time(45_000, None) == pytest.approx(0.5)


def test_least_delayed_sender_report_wins():
    """Reports stamped late (send time, not capture time) must not drag the timeline around."""
    clock = SessionClock()
    video = clock.track("video", 90_000)
    video.set_origin(1000)
    video.time(0, arrival=50.0)
    video.on_sender_report(SenderReport(ntp=101.020, rtp=1000 + 90_000))  # 20 ms encode delay
    t1 = video.time(180_000, None)
    video.on_sender_report(SenderReport(ntp=102.035, rtp=1000 + 180_000))  # 35 ms: ignored
    assert video.time(180_000, None) == pytest.approx(t1)
    video.on_sender_report(SenderReport(ntp=103.005, rtp=1000 + 270_000))  # 5 ms: better, adopted
    assert video.time(180_000, None) == pytest.approx(t1 - 0.015)
    assert clock.steps == 1


def test_first_packet_arrival_anchors_before_decoded_frames():
    """A jitter buffer releasing the first audio frame 80 ms late does not move audio's time."""
    clock = SessionClock()
    audio = clock.track("audio", 48_000)
    audio.on_first_packet(rtp=777, arrival=20.0)
    audio.set_origin(777)
    assert audio.time(0, arrival=20.080) == pytest.approx(0.0)
    assert audio.time(960, arrival=20.081) == pytest.approx(0.020)
    assert clock.zero_wall == 20.0
