"""Echo cancellation and barge-in on real festival speech, real Silero VAD and real Whisper tiny.en.

Scenes (bench/echo_sim.py, tuning sentences and seeds): the answer (slt_hts) echoes back through a
seeded room (delay, band-pass, attenuation, reverberant tail); a user or a noise event may join.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from alignment.echo import EchoCanceller, EchoConfig
from alignment.types import SAMPLE_RATE, AudioChunk
from app.loadtest.festival import available
from bench import echo_sim as es
from bench.barge_in import run_after, run_scene
from models.bargein import BargeInConfig, BargeInDetector

pytestmark = pytest.mark.skipif(not (available("slt_hts") and available("kal_diphone")), reason="festival voices")


@pytest.fixture(scope="module")
def echo_scenes() -> list[es.Scene]:
    return [es.make_scene(np.random.default_rng(seed), es.TUNE_ANSWERS[seed % 3]) for seed in (1, 2, 3)]


def test_nothing_played_passes_the_chunk_through_unchanged():
    det = BargeInDetector()
    chunk = AudioChunk(1.0, np.random.default_rng(0).standard_normal(320).astype(np.float32) * 0.1)
    out, hit = det.feed(chunk, answering=False)
    assert out is chunk and hit is None
    assert not det.canceller.active
    assert EchoCanceller().process(chunk) is chunk


def test_echo_alone_gives_no_barge_in_and_no_words(echo_scenes, whisper_model):
    from models.asr.offline import transcribe_words

    for scene in echo_scenes:
        clean, onset, emitted, _ = run_scene(scene, BargeInDetector())
        assert emitted is None, f"echo through a {scene.room.delay_s * 1e3:.0f} ms room was taken for a barge-in"
        raw_words = transcribe_words(scene.mic, model=whisper_model)
        assert raw_words, "the uncancelled echo should be heard as words (else this test proves nothing)"
        assert transcribe_words(clean, model=whisper_model) == []
        a = int((scene.answer_pts + scene.room.delay_s + 1.0) * SAMPLE_RATE)
        b = int((scene.answer_pts + scene.room.delay_s + scene.played.size / SAMPLE_RATE) * SAMPLE_RATE)
        erle = 10 * np.log10(np.sum(scene.echo[a:b] ** 2) / (np.sum(clean[a:b] ** 2) + 1e-12))
        assert erle > 15.0


@pytest.mark.parametrize("user", es.TUNE_USERS, ids=[u[0] for u in es.TUNE_USERS])
def test_a_real_barge_in_is_detected_near_its_onset(user):
    for seed in (5, 9):  # onsets 1.8 s and 1.5 s into the answer, after the echo delay is locked
        _check_barge_in(seed, user)


@pytest.mark.xfail(strict=True, reason="known gap: before the echo delay is locked (~1 s into an answer) the "
                   "suppressor assumes the worst delay and a barge-in there is heard 0.5-1 s late")
def test_a_barge_in_in_the_answers_first_second_is_detected_near_its_onset():
    _check_barge_in(4, es.TUNE_USERS[0])


def _check_barge_in(seed: int, user: tuple[str, str]) -> None:
    scene = es.make_scene(np.random.default_rng(seed), es.TUNE_ANSWERS[seed % 3], user=user)
    _, onset, emitted, _ = run_scene(scene, BargeInDetector())
    assert onset is not None and emitted is not None, f"barge-in by {user[0]} missed"
    assert scene.onset is not None
    assert scene.onset - 0.1 <= onset <= scene.onset + 0.3
    assert emitted - scene.onset <= 0.45


@pytest.mark.parametrize("kind", ["cough", "click", "door", "noise"])
def test_coughs_and_noise_bursts_are_not_barge_ins(kind):
    for seed in (7, 9):
        _check_no_barge_in(seed, kind)


def test_a_cough_silero_once_took_for_speech_is_suppressed():
    # the suppressor keeps assuming any delay until the filter really cancels, which covers this cough
    _check_no_barge_in(6, "cough")


@pytest.mark.xfail(strict=True, reason="known gap: Silero holds >= 0.6 for 128 ms on some noise bursts (tuning "
                   "seeds: 1 of 16)")
def test_some_noise_bursts_are_still_taken_for_barge_ins():
    _check_no_barge_in(8, "noise")


def _check_no_barge_in(seed: int, kind: str) -> None:
    scene = es.make_scene(np.random.default_rng(seed), es.TUNE_ANSWERS[seed % 3], noise=kind)
    _, _, emitted, _ = run_scene(scene, BargeInDetector())
    assert emitted is None, f"a {kind} was taken for a barge-in"


@pytest.mark.parametrize("seed", [5, 9])
def test_with_no_echo_the_user_is_heard_whole_under_a_loud_answer(seed, whisper_model):
    """Headphones, or the browser's own echo cancellation: nothing comes back, and the user talking over the
    answer must reach the ASR and the barge-in detector as said (the worst-case echo assumed before a delay is
    found once floored most of the user's bands)."""
    from models.asr.offline import transcribe_words

    user = es.TUNE_USERS[seed % 2]
    before = es.make_scene(np.random.default_rng(seed + 100), es.TUNE_ANSWERS[(seed + 1) % 3], echoes=False)
    scene = es.make_scene(np.random.default_rng(seed), es.TUNE_ANSWERS[seed % 3], user=user, echoes=False)
    # an answer nobody spoke over went first: the bound carries into this one
    clean, _, emitted, _ = run_after(before, scene, BargeInDetector())
    assert scene.onset is not None and emitted is not None and emitted - scene.onset <= 0.3
    a, b = int((scene.onset - 0.1) * SAMPLE_RATE), clean.size
    kept = 10 * np.log10(np.sum(clean[a:b] ** 2) / np.sum(scene.mic[a:b] ** 2))
    assert kept > -1.0, f"the canceller took {-kept:.1f} dB of the user's speech with no echo to remove"
    def heard(x: np.ndarray) -> list[str]:
        return [w.text.strip(" .,!?").lower() for w in transcribe_words(x, model=whisper_model)]

    said, kept_words = heard(scene.mic[a:b]), iter(heard(clean[a:b]))
    assert len(said) >= len(user[1].split()), "Whisper should hear the user in the raw mic (else this proves nothing)"
    assert all(w in kept_words for w in said), "a word the raw mic holds was lost in the cleaned one"


@pytest.mark.parametrize("seed", [0, 2])
def test_a_user_early_in_a_later_answer_with_no_echo_is_heard_at_once(seed):
    """0.65 s into an answer, before any window of it can bound the coupling, the user could be its echo first
    arriving; with no echo in the answers before, a short wait for a GCC-PHAT peak tells them apart (the tree
    before held the prior over the whole window and never heard these users)."""
    before = es.make_scene(np.random.default_rng(seed + 100), es.TUNE_ANSWERS[(seed + 1) % 3], echoes=False)
    scene = es.make_scene(np.random.default_rng(seed), es.TUNE_ANSWERS[seed % 3], user=es.TUNE_USERS[0],
                          echoes=False, at_s=0.65)
    det = BargeInDetector()
    clean, _, emitted, _ = run_after(before, scene, det)
    assert scene.onset is not None and emitted is not None and emitted - scene.onset <= 0.3
    assert not det.canceller.returned, "the user was taken for the answer's echo"
    a, b = int(scene.onset * SAMPLE_RATE), int((scene.onset + 0.5) * SAMPLE_RATE)
    kept = 10 * np.log10(np.sum(clean[a:b] ** 2) / np.sum(scene.mic[a:b] ** 2))
    assert kept > -3.0, f"the canceller took {-kept:.1f} dB of the user's first half second"


def _replay_recorded(name: str) -> Iterator[tuple[EchoCanceller, AudioChunk, AudioChunk]]:
    """A recorded live stretch (``tests/data/<name>.npz``, 16-bit) through a fresh canceller: per mic chunk, the
    canceller, the chunk and what it made of it; the answer audio is given as it was sent by then."""
    from pathlib import Path

    z = np.load(Path(__file__).parent / "data" / f"{name}.npz")
    played = z["played"].astype(np.float32).reshape(len(z["played_pts"]), -1) / 32767
    mic = z["mic"].astype(np.float32).reshape(len(z["mic_pts"]), -1) / 32767
    canceller, j = EchoCanceller(), 0
    for pts, samples in zip(z["mic_pts"], mic, strict=True):
        while j < len(played) and z["played_pts"][j] <= pts:
            canceller.played(float(z["played_pts"][j]), played[j])
            j += 1
        chunk = AudioChunk(float(pts), samples)
        yield canceller, chunk, canceller.process(chunk)


def test_a_session_with_no_echo_locks_no_delay():
    """Recorded live (``bench/voice.py --no-echo --trace``, room seed 7; two stretches of it, 16-bit): the user
    talking over loud answers, nothing echoing. Both GCC-PHAT windows then start mid-sound and peak at the
    search's edge; the tree before locked a 0.5 s delay there, which turned the coupling bound off for the rest
    of the session (barge-ins took up to 1 s)."""
    states = [(canceller.delay, canceller.active) for canceller, _, _ in _replay_recorded("no_echo_session_edge_lock")]
    locks = {delay for delay, _ in states}
    assert sum(active for _, active in states) > 100, "the stretch must hold answers the mic could echo"
    assert locks == {None}, f"delays of {locks - {None}} samples locked with no echo"


def test_a_lock_never_trusted_leaves_the_user_whole():
    """Recorded live (``synchrony loadtest --peers 1``, the peer's mic at -70 dBFS, traced; 4 s of it): nothing
    echoes, but the loop's sync click lands just after each answer's first sound and GCC-PHAT locks a delay on it.
    Until that lock's filter cancels anything, the mic's bound still caps the coupling: the tree before took the
    lock as echo, the prior came back, and the user's next sentence over the answer lost 2-70 dB a chunk."""
    locked, said, kept, worst = False, 0.0, 0.0, 0.0
    for canceller, chunk, clean in _replay_recorded("no_echo_session_click_lock"):
        locked |= canceller.delay is not None
        x, y = np.asarray(chunk.samples), np.asarray(clean.samples)
        if chunk.pts >= 9.0 and canceller.active and np.mean(x**2) > 1e-4:  # the user, over the answer
            said, kept = said + float(np.sum(x**2)), kept + float(np.sum(y**2))
            worst = min(worst, 10 * np.log10(np.sum(y**2) / np.sum(x**2)))
    assert locked and said > 0, "the stretch must hold the wrong lock and the user over the answer"
    assert 10 * np.log10(kept / said) > -1.0 and worst > -6.0, f"user lost {10 * np.log10(kept / said):.1f} dB"


def test_a_wrong_lock_in_a_session_with_no_echo_is_dropped():
    """A delay locked where nothing echoes (a GCC-PHAT artefact) must not switch the coupling bound off for good:
    its filter never cancels, so after ``untrusted_s`` of played audio the lock goes and the bound serves again."""
    scene = es.make_scene(np.random.default_rng(4), es.TUNE_ANSWERS[0], echoes=False)
    canceller = EchoCanceller(EchoConfig(untrusted_s=2.0))  # the answer is 3.2 s long
    a0, locked = int(scene.answer_pts * SAMPLE_RATE), int((scene.answer_pts + 0.5) * SAMPLE_RATE)
    dropped_at = None
    for i in range(0, scene.mic.size - 320 + 1, 320):
        if a0 <= i < a0 + scene.played.size:
            canceller.played(i / SAMPLE_RATE, scene.played[i - a0 : i - a0 + 320])
        if i == locked:
            canceller.delay = 2400  # as a wrong lock would
        canceller.process(AudioChunk(i / SAMPLE_RATE, scene.mic[i : i + 320]))
        if dropped_at is None and i >= locked and canceller.delay is None:
            dropped_at = (i - locked) / SAMPLE_RATE
    assert scene.played.size / SAMPLE_RATE > canceller.config.untrusted_s + 1, "the answer is too short to show it"
    assert dropped_at is not None and dropped_at <= canceller.config.untrusted_s + 0.5, f"dropped at {dropped_at}"


def test_echo_that_begins_after_an_answer_without_any_is_not_a_barge_in():
    """What the mic showed over an answer with no echo bounds the coupling; echo that starts with the next answer
    (headphones unplugged) must still be removed, not pass under that bound."""
    for seed in (1, 2, 3):
        rng = np.random.default_rng(seed)
        quiet = es.make_scene(rng, es.TUNE_ANSWERS[seed % 3], echoes=False)
        det = BargeInDetector()
        run_scene(quiet, det)
        assert float(np.median(det.canceller._cap)) < 0.01, "no echo came back: the bound should have fallen"
        _, _, emitted, _ = run_scene(es.make_scene(rng, es.TUNE_ANSWERS[(seed + 1) % 3]), det,
                                     quiet.mic.size / SAMPLE_RATE)  # run_after, with the bound read in between
        assert emitted is None, f"echo beginning with the second answer (seed {seed}) was taken for a barge-in"
        assert det.canceller.returned or det.canceller.delay is not None, "the echo's return went unseen"


@pytest.mark.parametrize("seed", [2, 7])
def test_a_filter_gone_wrong_is_not_trusted(seed):
    """Live, a filter that had cancelled can end up adding echo (both filters adapted while the path moved
    under them); its louder output passed the narrowed suppressor as the user (bench/barge_in.py --trace).
    Here both filters are turned into that mid-answer: the canceller must stop trusting the lock at once
    (the user talking over the echo never makes the output louder than the mic) and nothing may fire."""
    scene = es.make_scene(np.random.default_rng(seed), es.TUNE_ANSWERS[seed % 3])
    det = BargeInDetector()
    c, a0 = det.canceller, int(scene.answer_pts * SAMPLE_RATE)
    mid, broken_at = a0 + scene.played.size // 2, None
    for i in range(0, scene.mic.size - 320 + 1, 320):
        playing = a0 <= i < a0 + scene.played.size
        if playing:
            det.played(i / SAMPLE_RATE, scene.played[i - a0 : i - a0 + 320])
        if broken_at is None and i >= mid and c.trusted:
            c._hf *= -2  # the prediction now adds the echo back, twice over
            c._hb *= -2
            broken_at = i
        _, hit = det.feed(AudioChunk(i / SAMPLE_RATE, scene.mic[i : i + 320]), playing)
        assert hit is None, f"the broken filter's output was taken for a barge-in at {i / SAMPLE_RATE:.2f} s"
        if broken_at is not None and i - broken_at >= 0.1 * SAMPLE_RATE:
            assert not c.trusted, "a filter louder than the mic is still trusted 100 ms on"
            broken_at = scene.mic.size  # checked once
    assert broken_at == scene.mic.size, "the lock was never trusted before the break (else this proves nothing)"


def test_the_canceller_finds_the_echo_delay(echo_scenes):
    for scene in echo_scenes:
        det = BargeInDetector()
        run_scene(scene, det)
        assert det.canceller.delay is not None
        assert abs(det.canceller.delay / SAMPLE_RATE - scene.room.delay_s) < 0.005


def test_the_load_test_peers_echo_path_gives_no_barge_in():
    """The peer's sparse taps (0.5 direct path), 40-150 ms of network, arrival jitter and server stalls: after a
    stall moved the delay the narrowed suppressor let the echo through as the user. These are the scenes that
    did (held-out sentences: the tuning ones are too short to show it; bench/barge_in.py does not use them)."""
    for k in (2, 10, 18, 20, 22):
        rng = np.random.default_rng(100 + k)
        scene = es.make_peer_scene(rng, es.HELD_ANSWERS[k % 4], float(rng.uniform(0.04, 0.15)), 0.01,
                                   room_seed=k % 3, stall_p=0.06)
        det = BargeInDetector()
        _, _, emitted, _ = run_scene(scene, det)
        assert emitted is None, f"the peer's echo (scene {k}) was taken for a barge-in"


def test_bad_input_is_a_clear_error():
    ec = EchoCanceller()
    with pytest.raises(ValueError, match="NaN"):
        ec.played(0.0, np.array([0.0, np.nan], np.float32))
    ec.played(0.0, np.zeros(320, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        ec.process(AudioChunk(0.02, np.full(320, np.inf, np.float32)))
    with pytest.raises(ValueError):
        EchoConfig(floor=0.0)
    with pytest.raises(ValueError, match="echo-return watch"):
        EchoConfig(untrusted_s=0.0)
    with pytest.raises(ValueError):
        BargeInConfig(threshold=1.5)


def test_a_stalled_sender_stamped_when_it_sent_gives_no_barge_in_and_a_loud_user_still_stops_it():
    """The server told when each answer frame really went out (a stall, then the frames due in it in a burst):
    the peer's echo (0.5 at 38-49 ms, network, arrival jitter) alone is no barge-in, and a user louder than the
    answer over that same echo, 1.5 s into it, is one, stamped near the onset."""
    for k in (2, 10, 18):
        for user in (None, ("kal_diphone", "hold on let me check")):
            rng = np.random.default_rng(100 + k)
            scene = es.make_peer_scene(rng, es.HELD_ANSWERS[k % 4], float(rng.uniform(0.04, 0.15)), 0.01,
                                       room_seed=k % 3, stall_p=0.06, stamp_sent=True, user=user,
                                       at_s=1.5 if user else None, user_db=6.0)
            _, onset, emitted, _ = run_scene(scene, BargeInDetector())
            if user is None:
                assert emitted is None, f"the stalled sender's echo (scene {k}) was taken for a barge-in"
                continue
            assert scene.onset is not None and onset is not None and emitted is not None, f"scene {k}: missed"
            assert scene.onset - 0.1 <= onset <= scene.onset + 0.4
            assert emitted - scene.onset <= 0.7


@pytest.mark.xfail(strict=True, reason="known gap of the coarse delay (off by default): with the peer's echo "
                   "played out by a jitter buffer, its narrowed suppressor lets the echo through as the user")
def test_a_user_one_second_into_the_answer_is_heard_before_the_delay_locks():
    """The peer's echo path (frames played as they arrive, jittered) rarely gives the two near-identical
    confident estimates a lock needs; three rough ones that agree (the coarse delay) narrow the suppressor, so a
    user as loud as the answer 1 s into it is heard within 0.4 s, and the same echo alone is still no barge-in."""
    for k in (1, 2, 5):
        for user in (es.TUNE_USERS[k % 2], None):
            rng = np.random.default_rng(200 + k)
            scene = es.make_peer_scene(rng, es.TUNE_ANSWERS[k % 3], float(rng.uniform(0.04, 0.15)), 0.01,
                                       room_seed=k % 3, stall_p=0.01, stamp_sent=True, user=user, at_s=1.0)
            det = BargeInDetector(BargeInConfig(echo=EchoConfig(coarse_votes=3)))  # off by default for now
            _, onset, emitted, _ = run_scene(scene, det)
            if user is None:
                assert emitted is None, f"the echo (scene {k}) was taken for a barge-in"
                assert det.canceller.coarse is not None
                assert abs(det.canceller.coarse / SAMPLE_RATE - scene.room.delay_s) < 0.03
                continue
            assert scene.onset is not None and onset is not None and emitted is not None, f"scene {k}: missed"
            assert scene.onset - 0.1 <= onset <= scene.onset + 0.3
            assert emitted - scene.onset <= 0.4


def test_a_traced_detector_replays_to_the_same_barge_in(tmp_path):
    """``bench/barge_in.py --trace`` tunes on live recordings: replaying one must reproduce what the detector did."""
    from models.bargein import BargeInTrace, read_trace

    scene = es.make_scene(np.random.default_rng(5), es.TUNE_ANSWERS[5 % 3], user=es.TUNE_USERS[0])
    _, onset, emitted, _ = run_scene(scene, BargeInTrace(BargeInDetector(), tmp_path / "t.pkl"))
    assert onset is not None and emitted is not None
    records = read_trace(tmp_path / "t.pkl")
    assert {r[0] for r in records} == {"played", "mic"}
    det, fired = BargeInDetector(), []
    for r in records:
        if r[0] == "played":
            det.played(r[1], r[2])
        elif det.feed(AudioChunk(r[1], r[2]), r[3])[1] is not None:
            fired.append(r[1])
    assert len(fired) == 1 and abs(fired[0] + 0.02 - emitted) < 1e-6
    listening = BargeInTrace(BargeInDetector(), tmp_path / "listen.pkl", stops=False)
    assert run_scene(scene, listening)[2] is None  # records, never stops the answer: it plays on
    heard = read_trace(tmp_path / "listen.pkl")
    assert sum(r[0] == "mic" for r in heard) == sum(r[0] == "mic" for r in records)
    assert sum(r[0] == "played" for r in heard) > sum(r[0] == "played" for r in records)


def test_the_canceller_settles_on_an_answer_only_once_its_echo_could_have_arrived():
    """The barge-in detector asks for less speech once the canceller has settled (``EchoCanceller.settled``):
    not while the answer's echo may still be first arriving, nor before a window has bounded what echoes (its
    first window that saw the answer at every delay ends ~0.75 s in)."""
    rng = np.random.default_rng(0)
    canceller = EchoCanceller()
    canceller.played(0.0, (0.1 * rng.standard_normal(2 * SAMPLE_RATE)).astype(np.float32))
    settled = []
    for k in range(100):  # 2 s of a mic with a noise floor and no echo
        canceller.process(AudioChunk(k * 0.02, (1e-3 * rng.standard_normal(320)).astype(np.float32)))
        settled.append(canceller.settled)
    first = settled.index(True)
    span = EchoConfig().max_delay_s + EchoConfig().return_slack_s
    assert span < (first + 1) * 0.02 <= 1.0 and all(settled[first:])
    assert canceller.delay is None


def test_sure_speech_once_settled_stops_the_answer_sooner_and_never_later():
    """Past the answer's echo-arrival span, two windows of sure speech fire; otherwise the longer stretch applies
    (``EchoCanceller.settled``). The espeak-ng user's onsets read sure at once; the festival user's do not."""
    gains = {}
    for seed, user in ((3, 1), (7, 1), (5, 0), (9, 0)):
        scene = es.make_scene(np.random.default_rng(seed), es.TUNE_ANSWERS[seed % 3], user=es.TUNE_USERS[user])
        _, _, sure, _ = run_scene(scene, BargeInDetector())
        _, _, longer, _ = run_scene(scene, BargeInDetector(BargeInConfig(sure_speech_s=0.2)))
        assert sure is not None and longer is not None
        gains[(seed, user)] = round(longer - sure, 3)
    assert min(gains.values()) >= 0, f"fired later: {gains}"
    assert gains[(3, 1)] >= 0.03 and gains[(7, 1)] >= 0.03, f"fired sooner by {gains} s"
