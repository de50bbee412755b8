"""Word-timing refinement: accuracy against espeak ground truth, the streaming bound, edge cases.

(tests/test_forced.py holds the same claims on festival's voices, which no part of the
refinement was built from.)

The accuracy tests use real Whisper word times on a sentence and a voice that were not used to
tune the refinement, so they fail if refinement regresses to (or towards) raw Whisper timing.
"""

from __future__ import annotations

import difflib
import re
import time

import numpy as np
import pytest

from alignment.timing import end_by_next_start, refine_word_times
from alignment.types import SAMPLE_RATE, WordToken
from app.loadtest import testmedia

SENTENCE = "the little boat drifted slowly toward the sandy beach at sunset"
VOICE, WPM = "en-gb-x-rp", 170  # neither sentence nor voice was used for tuning
LOOKAHEAD = 0.2


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _onset_errors_by_word(words: list[WordToken], truth: tuple[testmedia.TimedWord, ...]) -> dict[int, float]:
    """|start - true onset| (ms) by index into ``truth``, for words matched to truth by text (words
    espeak merged are skipped)."""
    a, b = [_norm(w.text) for w in words], [_norm(t.text) for t in truth]
    return {blk.b + k: abs(words[blk.a + k].start - truth[blk.b + k].start) * 1000
            for blk in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks()
            for k in range(blk.size)}


def _onset_errors_ms(words: list[WordToken], truth: tuple[testmedia.TimedWord, ...]) -> np.ndarray:
    """|start - true onset| (ms) for words matched to truth by text."""
    return np.asarray(list(_onset_errors_by_word(words, truth).values()))


def _raw_words(model, audio: np.ndarray) -> list[WordToken]:
    """Unrefined Whisper word times (models.asr when it offers them, else openai-whisper directly)."""
    try:
        from models.asr import transcribe_words

        return transcribe_words(audio, refine=False)
    except (ImportError, TypeError):
        import whisper

        res = whisper.transcribe(model, audio, word_timestamps=True, language="en", fp16=False,
                                 condition_on_previous_text=False, temperature=0.0)
        return [WordToken(w["word"].strip(), float(w["start"]), float(w["end"]))
                for seg in res["segments"] for w in seg["words"]]


@pytest.fixture(scope="module")
def fresh_speech() -> testmedia.Speech:
    # A fresh process: the same audio however many syntheses earlier tests (and their threads) made.
    sp = testmedia.synthesize_speech_fresh(SENTENCE, voice=VOICE, wpm=WPM, lead_in_s=0.45)
    tail = np.zeros(SAMPLE_RATE // 2, np.float32)
    return testmedia.Speech(np.concatenate([sp.samples, tail]), sp.words, sp.text)


@pytest.fixture(scope="module")
def clean_case(whisper_model, fresh_speech):
    return fresh_speech.samples, _raw_words(whisper_model, fresh_speech.samples)


def test_refined_onsets_beat_raw_whisper_on_unseen_voice(clean_case, fresh_speech):
    audio, raw = clean_case
    t = time.perf_counter()
    refined = refine_word_times(audio, 0.0, raw)
    ms_per_word = 1000 * (time.perf_counter() - t) / len(raw)
    e_raw, e_ref = _onset_errors_ms(raw, fresh_speech.words), _onset_errors_ms(refined, fresh_speech.words)
    assert len(e_ref) >= 8, "too few recognised words matched the truth to judge timing"
    w40_raw, w40_ref = np.mean(e_raw <= 40), np.mean(e_ref <= 40)
    print(f"raw: mean {e_raw.mean():.1f} ms, ±40 ms {w40_raw:.0%}; refined: mean {e_ref.mean():.1f} ms, "
          f"±40 ms {w40_ref:.0%}; {ms_per_word:.1f} ms/word")
    assert w40_ref >= 0.8
    assert w40_ref >= w40_raw + 0.3
    assert e_ref.mean() <= 0.5 * e_raw.mean()


def test_refinement_holds_at_10db_snr(whisper_model, fresh_speech):
    noisy = testmedia.add_noise(fresh_speech.samples, 10.0, seed=3)
    raw = _raw_words(whisper_model, noisy)
    e_raw = _onset_errors_ms(raw, fresh_speech.words)
    e_ref = _onset_errors_ms(refine_word_times(noisy, 0.0, raw), fresh_speech.words)
    assert len(e_ref) >= 6
    print(f"10 dB: raw ±40 ms {np.mean(e_raw <= 40):.0%}, refined {np.mean(e_ref <= 40):.0%}")
    assert np.mean(e_ref <= 40) >= 0.7
    assert np.mean(e_ref <= 40) > np.mean(e_raw <= 40)


def test_streaming_is_accurate_and_uses_no_audio_past_the_bound(clean_case, fresh_speech):
    audio, raw = clean_case
    streamed = refine_word_times(audio, 0.0, raw, lookahead_s=LOOKAHEAD)
    e = _onset_errors_ms(streamed, fresh_speech.words)
    assert np.mean(e <= 40) >= 0.7
    rng = np.random.default_rng(0)
    for n in (3, len(raw) // 2, len(raw) - 1):  # a streaming call refines the words heard so far
        head = refine_word_times(audio, 0.0, raw[:n], lookahead_s=LOOKAHEAD)
        bound = int(round((raw[n - 1].end + LOOKAHEAD) * SAMPLE_RATE))
        altered = audio.copy()  # everything after the bound replaced by loud unrelated noise
        altered[bound:] = rng.normal(0, 0.3, len(audio) - bound).astype(np.float32)
        assert refine_word_times(altered, 0.0, raw[:n], lookahead_s=LOOKAHEAD) == head, f"{n} words"
        # A buffer that simply ends at the bound gives the same times too.
        assert refine_word_times(audio[:bound], 0.0, raw[:n], lookahead_s=LOOKAHEAD) == head


def test_times_follow_the_session_clock(clean_case):
    audio, raw = clean_case
    base = refine_word_times(audio, 0.0, raw)
    shifted = [WordToken(w.text, w.start + 12.5, w.end + 12.5, w.final, w.probability, w.utterance, w.index)
               for w in raw]
    moved = refine_word_times(audio, 12.5, shifted)
    assert [round(w.start - 12.5, 6) for w in moved] == [round(w.start, 6) for w in base]
    assert [w.text for w in moved] == [w.text for w in raw]


def test_output_is_ordered_and_keeps_token_identity(clean_case):
    audio, raw = clean_case
    out = refine_word_times(audio, 0.0, raw)
    assert len(out) == len(raw)
    for a, b in zip(raw, out, strict=True):
        assert (a.text, a.final, a.utterance, a.index, a.probability) == (b.text, b.final, b.utterance,
                                                                          b.index, b.probability)
        assert b.end > b.start
    starts = [w.start for w in out]
    assert starts == sorted(starts)


def test_long_input_is_aligned_in_runs(fresh_speech):
    """Four sentences with pauses (> MAX_GROUP_S in all): every run is placed, none drifts.

    The estimates here are Whisper-like (late by 60-100 ms), derived from the truth, because this
    checks the splitting, not Whisper.
    """
    parts, truth, t = [], [], 0.0
    # espeak-ng in a fresh process: libespeak-ng keeps state, and after other calls it merged "a quiet".
    for text in ("a quiet morning by a lake", "the bus was late again today",
                 "we waited near a station until noon", "then we walked home slowly"):
        sp = testmedia.synthesize_speech_fresh(text, voice="en-us+m3", wpm=150, lead_in_s=0.7)
        assert len(sp.words) == len(text.split())  # no words merged by espeak: the text is exact
        truth += [testmedia.TimedWord(w.text, w.start + t) for w in sp.words]
        parts.append(sp.samples)
        t += sp.duration
    audio = np.concatenate(parts)
    rng = np.random.default_rng(1)
    words = [WordToken(w.text, w.start + rng.uniform(0.06, 0.1), w.start + 0.25, index=k)
             for k, w in enumerate(truth)]
    out = refine_word_times(audio, 0.0, words)
    err = np.abs([o.start - w.start for o, w in zip(out, truth, strict=True)]) * 1000
    assert audio.size / SAMPLE_RATE > 8.0
    assert np.mean(err <= 40) >= 0.9, err.round()


def test_empty_words_give_empty_list():
    assert refine_word_times(np.zeros(SAMPLE_RATE, np.float32), 0.0, []) == []


def test_silence_keeps_estimates_finite_and_ordered():
    words = [WordToken("hello", 0.3, 0.6), WordToken("world", 0.6, 1.0)]
    for lookahead in (None, LOOKAHEAD):
        out = refine_word_times(np.zeros(2 * SAMPLE_RATE, np.float32), 0.0, words, lookahead_s=lookahead)
        assert [w.text for w in out] == ["hello", "world"]
        assert all(np.isfinite([w.start, w.end]).all() for w in out)
        assert out[0].start <= out[1].start
        assert all(abs(o.start - w.start) <= 1.0 for o, w in zip(out, words, strict=True))


def test_word_at_buffer_edge_and_tiny_buffers(fresh_speech):
    truth = fresh_speech.words
    end = truth[-1].start + 0.06  # the buffer stops 60 ms into the last word
    audio = fresh_speech.samples[: int(end * SAMPLE_RATE)]
    # Whisper-like estimates: late, the last one right at the buffer edge.
    words = [WordToken(t.text, min(t.start + 0.05, end - 0.005), min(t.start + 0.3, end)) for t in truth]
    for lookahead in (None, LOOKAHEAD):
        out = refine_word_times(audio, 0.0, words, lookahead_s=lookahead)
        assert [w.text for w in out] == [w.text for w in words]
        assert truth[-1].start - 0.04 <= out[-1].start <= end + 0.03
        assert all(a.start <= b.start for a, b in zip(out, out[1:], strict=False))
    assert refine_word_times(np.zeros(100, np.float32), 0.0, words[:2]) == words[:2]


def test_words_without_speakable_text_keep_their_times(clean_case):
    audio, raw = clean_case
    words = [raw[0], WordToken("...", raw[0].end, raw[0].end + 0.05), *raw[1:]]
    out = refine_word_times(audio, 0.0, words)
    assert out[1].text == "..." and out[1].start >= out[0].start


def test_bad_input_is_a_clear_error():
    words = [WordToken("hi", 0.1, 0.3)]
    with pytest.raises(ValueError, match="1-D"):
        refine_word_times(np.zeros((2, SAMPLE_RATE), np.float32), 0.0, words)
    with pytest.raises(ValueError, match="NaN"):
        refine_word_times(np.full(SAMPLE_RATE, np.nan, np.float32), 0.0, words)
    with pytest.raises(ValueError, match="lookahead"):
        refine_word_times(np.zeros(SAMPLE_RATE, np.float32), 0.0, words, lookahead_s=-0.1)


def test_streaming_recogniser_leaves_one_blas_thread():
    """numpy's OpenBLAS workers spin after threaded calls; a streaming recogniser caps BLAS at one
    thread for the process (the spinning cost streaming ASR ~40 % of a second core)."""
    from threadpoolctl import threadpool_info

    from alignment.blas import single_threaded_blas

    single_threaded_blas.cache_clear()
    single_threaded_blas()
    blas = [lib for lib in threadpool_info() if lib["user_api"] == "blas"]
    assert blas and all(lib["num_threads"] == 1 for lib in blas)


def test_fresh_synthesis_is_the_same_in_every_run(fresh_speech):
    """libespeak-ng keeps state between calls, so in-process speech depends on what was spoken
    before; the fixture's fresh-process speech does not."""
    testmedia.synthesize_speech(SENTENCE, voice=VOICE, wpm=WPM)  # this process's state moves on
    again = testmedia.synthesize_speech_fresh(SENTENCE, voice=VOICE, wpm=WPM, lead_in_s=0.45)
    assert np.array_equal(again.samples, fresh_speech.samples[: len(again.samples)])
    assert again.words == fresh_speech.words


def test_an_end_past_the_next_start_is_moved_back_to_it():
    words = [WordToken("the", 0.50, 1.00), WordToken("library", 0.64, 0.88), WordToken("is", 1.10, 1.44)]
    out = end_by_next_start(words)
    assert [(w.start, w.end) for w in out] == [(0.50, 0.64), (0.64, 0.88), (1.10, 1.44)]
    assert end_by_next_start([]) == []


def test_context_words_lead_the_reference_and_come_back_as_given(clean_case):
    audio, raw = clean_case
    full = refine_word_times(audio, 0.0, raw, lookahead_s=LOOKAHEAD)
    led = refine_word_times(audio, 0.0, full[:3] + raw[3:], lookahead_s=LOOKAHEAD, context=3)
    assert led[:3] == full[:3]
    assert [w.text for w in led] == [w.text for w in raw]
    assert all(abs(a.start - b.start) <= 0.04 for a, b in zip(led[3:], full[3:], strict=True))
