"""The peer's answer measures (app/loadtest/answers.py, voicepeer.py) on generated media with a known truth."""

from __future__ import annotations

import math

import numpy as np
import pytest

from alignment.types import SAMPLE_RATE
from app.loadtest import answers as ans
from app.loadtest.voicepeer import AUDIO_FRAME, AUDIO_RATE, ScriptedMic, Utterance, echo_tokens


def test_dbfs_of_full_scale_sine_and_silence():
    t = np.arange(48_000) / 48_000
    assert ans.dbfs(np.sin(2 * np.pi * 440 * t)) == pytest.approx(-3.01, abs=0.05)
    assert ans.dbfs(np.zeros(960)) == -math.inf
    assert ans.dbfs(0.01 * np.ones(960)) == pytest.approx(-40.0, abs=0.01)


def _packets(levels: list[float], t0: float = 10.0) -> list[ans.Packet]:
    return [ans.Packet(t0 + i * ans.FRAME_S, lv) for i, lv in enumerate(levels)]


def test_voice_to_voice_is_the_first_loud_packet_after_the_end_of_speech():
    packets = _packets([-60.0] * 30 + [-45.0] * 5 + [-20.0] * 50 + [-70.0] * 20)
    # packet 35 is the first at or above -40 dBFS: 10 + 0.7 s
    assert ans.voice_to_voice(10.2, packets) == pytest.approx(0.5)
    assert ans.voice_to_voice(12.0, packets) is None  # nothing loud after


def test_stop_latency_runs_to_the_end_of_the_last_loud_packet():
    packets = _packets([-20.0] * 50 + [-80.0] * 50)  # loud until 11.0 s
    assert ans.stop_latency(10.8, packets) == pytest.approx(0.2)
    assert ans.stop_latency(11.5, packets) is None  # the answer had stopped before the onset
    # a later answer's audio is not this one's
    later = packets + _packets([-20.0] * 10, t0=13.0)
    assert ans.stop_latency(10.8, later, before=12.9) == pytest.approx(0.2)


def test_lip_sync_offset_recovers_a_shift_of_the_talking_face(speech):
    """The pixel measure (dark mouth pixels in a box found from the pixels) against the audio envelope
    finds an 80 ms video delay within one 16 fps frame's tolerance, and ~0 without a shift."""
    from app.loadtest.testmedia import speech_envelope, talking_face_frames

    audio = speech.samples
    fps = 16.0
    n = int(len(audio) / SAMPLE_RATE * fps)
    for shift in (0.0, 0.08):
        video_t = np.arange(n) / fps
        frames = talking_face_frames(speech_envelope(audio, video_t - shift), (320, 180))
        lumas = [ans.luma(f) for f in frames]
        box = ans.mouth_box(lumas)
        mouth = np.array([ans.mouth_opening(y, box) for y in lumas])
        env = ans.envelope(audio, SAMPLE_RATE)
        env_t = np.arange(len(env)) * 0.01 + 0.005
        lip = ans.lip_sync_offset(env_t, env, video_t, mouth)
        assert lip is not None and lip.correlation > 0.5
        assert lip.offset_ms == pytest.approx(shift * 1000, abs=20), lip


def test_lip_sync_needs_a_moving_mouth():
    t = np.arange(100) * 0.01
    assert ans.lip_sync_offset(t, np.random.default_rng(0).random(100), t[::6], np.zeros(17)) is None


def test_mouth_box_ignores_the_caption_band():
    """Words flickering in the bottom band vary more than the mouth: the box still lands on the mouth."""
    frames = []
    for k in range(40):
        y = np.full((180, 320), 160.0, np.float32)
        y[80 : 80 + (k % 5) * 3, 140:180] = 20  # the mouth opens and closes
        y[150:175, :] = 20 if k % 2 else 200  # a caption band flickering hard
        frames.append(y)
    y0, y1, x0, x1 = ans.mouth_box(frames)
    assert 70 <= y0 <= 82 and 88 <= y1 <= 100 and 130 <= x0 <= 142 and 176 <= x1 <= 190


def test_room_response_is_seeded_and_within_30_to_250_ms():
    a, b = ans.RoomResponse.seeded(3), ans.RoomResponse.seeded(3)
    assert a == b and a != ans.RoomResponse.seeded(4)
    assert all(0.030 <= d <= 0.250 for d, _ in a.taps) and a.max_delay_s <= 0.250


def test_echo_path_delays_what_was_played_by_each_tap():
    room = ans.RoomResponse(((0.05, 0.5), (0.2, 0.1)))
    path = ans.EchoPath(room, rate=1000, seconds=2.0, buffer_s=0.0)
    path.played(1.0, np.ones(20, np.float32))  # 1.000–1.020 s
    assert path.echo(1.05, 20) == pytest.approx(np.full(20, 0.5))
    assert path.echo(1.20, 20) == pytest.approx(np.full(20, 0.1))
    assert not path.echo(1.10, 20).any()
    assert not path.echo(0.5, 20).any()  # before anything was played


def test_echo_path_plays_frames_back_to_back_like_a_jitter_buffer():
    """Frames arriving jittered or in a burst play contiguous; a dry buffer leaves a gap; a long backlog drains."""
    path = ans.EchoPath(ans.RoomResponse(((0.0, 1.0),)), rate=1000, seconds=2.0, buffer_s=0.01, max_buffer_s=0.05)
    path.played(1.000, np.full(20, 1.0, np.float32))  # plays 1.010–1.030
    path.played(1.003, np.full(20, 2.0, np.float32))  # early (a burst): queued behind, 1.030–1.050
    path.played(1.045, np.full(20, 3.0, np.float32))  # 5 ms late against 1.040 but the buffer holds: 1.050–1.070
    assert path.echo(1.010, 60) == pytest.approx(np.repeat([1.0, 2.0, 3.0], 20))
    path.played(1.200, np.full(20, 4.0, np.float32))  # the buffer ran dry: silence, then 1.210–1.230
    assert not path.echo(1.070, 140).any()
    assert path.echo(1.210, 20) == pytest.approx(np.full(20, 4.0))
    for _ in range(5):  # a burst of 100 ms at once: 1.230–1.330 queued
        path.played(1.205, np.full(20, 5.0, np.float32))
    path.played(1.210, np.full(20, 6.0, np.float32))  # backlog 120 ms > 50 ms: drained, plays 1.220–1.240
    assert path.echo(1.220, 20) == pytest.approx(np.full(20, 6.0))
    assert not path.echo(1.240, 90).any()


def test_speech_span_skips_a_hissing_leading_pause():
    rng = np.random.default_rng(0)
    x = (1e-3 * rng.standard_normal(16_000)).astype(np.float32)  # -60 dBFS hiss throughout
    x[4000:12000] += 0.3 * np.sin(2 * np.pi * 200 * np.arange(8000) / 16_000).astype(np.float32)
    a, b = ans.speech_span(x, SAMPLE_RATE)
    assert abs(a - 4000) <= 80 and abs(b - 12000) <= 80
    assert ans.speech_span(x, SAMPLE_RATE, within=(0.3, 0.6)) == (4800, 9600)  # inside the synthesizer's phones
    assert ans.speech_span(x, SAMPLE_RATE, within=(0.0, 1.0)) == (a, b)  # phones wider than the sound: the sound
    assert ans.speech_span(np.zeros(1600), SAMPLE_RATE) is None


async def test_the_truth_of_what_the_mic_says_stays_within_the_synthesizers_phones():
    """festival kal_diphone's pause before a /w/ holds ~200 ms of rumble within 40 dB of the loudest window:
    by level alone the onset lands in the pause. Bounded by the synthesizer's phones it does not, and the
    sent audio is the same."""
    from app.loadtest import festival
    from app.loadtest.peer import _Start

    if not festival.available("kal_diphone"):
        pytest.skip("festival voice kal_diphone is not installed (make system)")
    speech = festival.synthesize_festival("what is the weather like today", "kal_diphone")
    first, last = speech.words[0].start, speech.last_phone_end
    assert last is not None and first < last < speech.duration
    a, b = ans.speech_span(speech.samples, SAMPLE_RATE)
    assert a / SAMPLE_RATE < first - 0.15  # the level alone puts the onset in the pause
    mic = ScriptedMic(_Start())
    plain = mic.say(speech.samples, speech.text, at_s=0.1)
    bounded = mic.say(speech.samples, speech.text, at_s=5.0, phones=(first, last))
    assert plain.onset == plain.sent_at == pytest.approx(0.1, abs=1 / AUDIO_RATE)
    assert bounded.sent_at == pytest.approx(5.0, abs=1 / AUDIO_RATE)
    assert bounded.onset - bounded.sent_at == pytest.approx(first - a / SAMPLE_RATE, abs=1e-3)
    assert bounded.end - bounded.sent_at <= min(b, round(last * SAMPLE_RATE)) / SAMPLE_RATE - a / SAMPLE_RATE + 1e-3
    assert plain.end - plain.onset == pytest.approx((b - a) / SAMPLE_RATE, abs=2e-3)  # the same audio is sent
    mic.stop()


def test_the_loop_clip_keeps_no_sound_before_festivals_first_phone():
    """The load test's loop clip is gated the same way: the rumble in kal_diphone's pause before a /w/ is not
    kept as the utterance's onset (its Level-3 onset check would fail every loop's first word)."""
    from app.loadtest import festival, testmedia
    from app.loadtest.loopclip import _gate_pauses

    if not festival.available("kal_diphone"):
        pytest.skip("festival voice kal_diphone is not installed (make system)")
    speech = testmedia.speak("what is the weather like today", "festival:kal_diphone", lead_in_s=0.6)
    assert np.abs(speech.samples[int(0.62 * SAMPLE_RATE) : int(0.75 * SAMPLE_RATE)]).max() > 5e-3  # the rumble
    gated = _gate_pauses(speech).samples
    first = int(round((speech.words[0].start - 0.01) * SAMPLE_RATE))
    assert not gated[:first].any() and gated[first : first + SAMPLE_RATE // 10].any()
    assert speech.last_phone_end is not None
    assert not gated[int(round((speech.last_phone_end + 0.011) * SAMPLE_RATE)) :].any()


def test_wer_counts_edits_over_reference_words():
    assert ans.wer("the cat sat".split(), "the cat sat".split()) == (0, 3)
    assert ans.wer("the cat sat".split(), "a cat sat down".split()) == (2, 3)
    assert ans.wer(["Hello,", "world."], ["hello", "world"]) == (0, 2)


async def test_scripted_mic_sends_what_it_was_told_when_it_was_told(speech):
    from app.loadtest.peer import _Start

    start = _Start()
    mic = ScriptedMic(start)
    utt = mic.say(speech.samples, "x", at_s=0.1)
    a, b = ans.speech_span(speech.samples, SAMPLE_RATE)
    assert utt.onset == pytest.approx(0.1, abs=1 / AUDIO_RATE)
    assert utt.end - utt.onset == pytest.approx((b - a) / SAMPLE_RATE, abs=0.002)
    frames = [await mic.recv() for _ in range(10)]
    pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32) / 32767
    first = np.flatnonzero(np.abs(pcm) > 1e-3)[0]
    assert first / AUDIO_RATE == pytest.approx(0.1, abs=0.005)  # within the first 5 ms window
    assert [f.pts for f in frames] == [i * AUDIO_FRAME for i in range(10)]
    mic.stop()
    with pytest.raises(ValueError, match="silent"):
        mic.say(np.zeros(100, np.float32))


async def test_scripted_mic_has_the_noise_floor_it_was_given():
    from app.loadtest.peer import _Start

    quiet, noisy = ScriptedMic(_Start()), ScriptedMic(_Start(), noise_dbfs=-60.0)
    zeros = np.concatenate([(await quiet.recv()).to_ndarray().reshape(-1) for _ in range(5)])
    pcm = np.concatenate([(await noisy.recv()).to_ndarray().reshape(-1) for _ in range(5)]).astype(np.float32) / 32767
    assert not zeros.any(), "without a noise floor the silence is digital"
    assert 20 * np.log10(np.sqrt(np.mean(pcm**2))) == pytest.approx(-60.0, abs=0.5)
    quiet.stop()
    noisy.stop()


def test_echo_tokens_are_words_the_peer_never_said():
    class E:
        def __init__(self, m):
            self.message = m

    said = [Utterance("a", 1.0, 2.0)]
    events = [E({"type": "token", "final": True, "start": 1.5}), E({"type": "token", "final": True, "start": 4.0}),
              E({"type": "token", "final": False, "start": 5.0})]
    assert echo_tokens(events, said) == 1


def test_heard_words_count_the_finals_of_what_was_said_over_an_answer():
    from app.loadtest.voicepeer import heard_words

    class E:
        def __init__(self, m):
            self.message = m

    said = [Utterance("what is the time", 1.0, 2.0), Utterance("hold on hold on", 5.0, 6.0, barge_in=True)]
    events = [E({"type": "token", "final": True, "start": t, "text": w}) for t, w in
              ((1.2, "what"), (5.1, "Hold"), (5.4, "on,"), (5.6, "hold"), (9.0, "on"))]
    events.append(E({"type": "token", "final": False, "start": 5.8, "text": "on"}))
    assert heard_words(events, said) == (3, 4)  # the last "on": an interim, and a final said nowhere near


def test_answer_figures_pool_per_peer_and_per_round():
    from app.loadtest import metrics as lm
    from app.loadtest.records import AnswerSummary
    from app.loadtest.report import text_summary
    from app.loadtest.rounds import pooled_answers

    per = [{"voice_to_voice_ms": 500.0, "stop_ms": 200.0, "barge_in": True, "lip_sync_ms": -10.0},
           {"voice_to_voice_ms": 700.0, "stop_ms": None, "barge_in": False, "lip_sync_ms": 30.0,
            "false_interruption": True}]
    stats = lm.answer_stats(per)
    assert stats.voice_to_voice_ms_p50 == 600.0 and stats.stop_ms_p50 == 200.0
    assert stats.false_interruption_rate == 0.5 and stats.lip_sync_abs_ms_p95 == pytest.approx(29.0)
    peer = AnswerSummary(decoded=True, audio_packets=900, audio_bytes=0, avatar_frames=300, starts=2, stats=stats)
    counted = AnswerSummary(decoded=False, audio_packets=1000, audio_bytes=0, avatar_frames=0, starts=3)
    pooled = pooled_answers([peer, peer, counted]).to_json()
    assert pooled["answers"] == 4 and pooled["starts"] == 7 and pooled["audio_packets"] == 2800
    assert pooled["voice_to_voice_ms_p50"] == 600.0 and pooled["barge_ins"] == 2 and pooled["false_interruptions"] == 2
    assert pooled_answers([counted]).to_json() == {"starts": 3, "audio_packets": 1000, "avatar_frames": 0}
    agg = {"peers": 1, "connected": 1, "latency_ms_p50": 1, "latency_ms_p95": 2, "final_latency_ms_p95": 3,
           "recall": 1.0, "level3_pass_rate": 1.0, "level3_checks": 1, "turn_ms_p50": 1, "bounds": {"ok": True},
           "answer": pooled}
    assert "spoken answers: 4 (7 started), voice-to-voice p50 600.0 ms" in text_summary({"rounds": [
        {"aggregate": agg, "peers": []}]})
