"""No final word the audio does not support: the support check on real speech, and the streaming
recogniser keeping a made-up phrase out of its finals while the word that was said comes through."""

from __future__ import annotations

import numpy as np
import pytest

from alignment.support import compression_ratio, judge
from alignment.text import agreement_key
from alignment.timing import align_words
from alignment.types import SAMPLE_RATE, AudioChunk, WordToken
from app.loadtest import testmedia
from models.asr import DecodedWord, StreamingASR, StreamingConfig

LEAD_S = 0.5


@pytest.fixture(scope="module")
def sentence() -> testmedia.Speech:
    sp = testmedia.speak("please call me back when you have a moment", "en-us", lead_in_s=LEAD_S)
    return testmedia.Speech(np.concatenate([sp.samples, np.zeros(SAMPLE_RATE, np.float32)]), sp.words, sp.text)


def _truth_tokens(sp: testmedia.Speech) -> list[WordToken]:
    starts = [w.start for w in sp.words] + [sp.duration - 1.0]
    return [WordToken(w.text, starts[i], starts[i + 1], index=i) for i, w in enumerate(sp.words)]


def test_words_said_are_supported_and_words_over_silence_are_not(sentence):
    refined = align_words(sentence.samples, 0.0, _truth_tokens(sentence))
    assert all(refined.placed)
    assert all(judge(sentence.samples, 0.0, refined.words, refined.placed).supported)
    silent = [WordToken("help", 0.05, 0.3), WordToken("yourself", 0.3, 0.45)]  # the lead-in: no speech
    assert judge(sentence.samples, 0.0, silent, [True, True]).reasons == ("silent", "silent")
    assert judge(sentence.samples, 0.0, refined.words[:1], [False]).reasons == ("unplaced",)
    long = [WordToken("a", 0.4, 3.0)]
    assert judge(sentence.samples, 0.0, long, [True]).reasons == ("duration",)


def test_a_loop_needs_its_audio_and_a_long_loop_is_refused_outright(sentence):
    words = list(align_words(sentence.samples, 0.0, _truth_tokens(sentence)).words)
    # "call me" said again, placed over the sentence's last words' quieter ends: a loop's copies
    # must stand on speech more than a first mention does.
    assert judge(sentence.samples, 0.0, words[:3], [True] * 3, before=()).supported == (True,) * 3
    loop = "help yourself to " * 6
    assert compression_ratio(loop) > 2.4 > compression_ratio(sentence.text)
    reasons = judge(sentence.samples, 0.0, words[:2], [True] * 2, before=loop.split()).reasons
    assert reasons == ("loop", "loop")


class _LoopingEngine:
    """Hears the one word that was said, then makes up a phrase three times at one instant inside
    it (what tiny.en did with a one-word "Phil."). Not a model: it isolates what
    the finalisation policy does with such a hypothesis."""

    name = "scripted"

    def __init__(self, word: tuple[str, float, float]) -> None:
        self.word = word

    def transcribe(self, audio, prefix=(), prompt="", draft=(), expect_words=False):  # noqa: ANN001, ANN201
        dur = len(audio) / SAMPLE_RATE
        raw, a, b = self.word
        if dur < b + 0.1:
            return [DecodedWord(w, 0.0, 0.0, 1.0) for w in prefix]
        at = (a + b) / 2  # several words at one instant, inside the word that was said
        made_up = [DecodedWord(" " + w, at, at, 0.9) for w in "help yourself to help yourself to help yourself".split()]
        heard = [DecodedWord(raw, a, b, 0.9), *made_up]
        k = 0
        while k < min(len(prefix), len(heard)) and agreement_key(prefix[k]) == heard[k].key:
            k += 1
        return [DecodedWord(w, 0.0, 0.0, 1.0) for w in prefix] + heard[k:]


def test_a_made_up_phrase_after_a_one_word_utterance_is_never_final():
    word = testmedia.speak("Phil", "en-us", lead_in_s=LEAD_S)
    audio = np.concatenate([word.samples, np.zeros(SAMPLE_RATE, np.float32)])
    onset = word.words[0].start
    loud = np.nonzero(np.abs(word.samples) > 0.01)[0]
    end = (loud[-1] + 1) / SAMPLE_RATE
    asr = StreamingASR(_LoopingEngine((" Phil.", onset - 0.15, end - 0.15)), StreamingConfig(carry_s=0.0))
    events = [e for i in range(0, audio.size, 320) for e in asr.feed(AudioChunk(i / SAMPLE_RATE, audio[i : i + 320]))]
    events += asr.flush()
    finals = [e.text for e in events if isinstance(e, WordToken) and e.final]
    assert finals == ["Phil."] or finals == ["Phil"], finals
    assert asr.unsupported >= 1


def test_a_word_on_the_audio_of_the_final_word_before_it_is_not_supported():
    """tiny.en, given a window that ends inside a long word, hears it twice ("Whiskey Whiskey."):
    forced through both, the aligner puts the copy inside the first word's span. The copy shares
    that word's audio; the words of a sentence, each after the one before it, do not."""
    said = testmedia.speak("whiskey", "en-us", lead_in_s=LEAD_S)
    audio = np.concatenate([said.samples, np.zeros(SAMPLE_RATE // 2, np.float32)])
    end = (np.nonzero(np.abs(said.samples) > 0.01)[0][-1] + 1) / SAMPLE_RATE
    one = align_words(audio, 0.0, [WordToken("whiskey", said.words[0].start, end)])
    assert one.placed == (True,)
    first = one.words[0]
    two = align_words(audio, 0.0, [WordToken("whiskey", first.start, first.end, index=0),
                                   WordToken("whiskey", first.start + 0.1, first.end, index=1)])
    copy = two.words[1]
    assert first.start < copy.start < first.end
    kw = {"before": ["whiskey"], "previous_start": first.start, "previous_end": first.end}
    assert judge(audio, 0.0, [copy], [True], **kw).reasons == ("overlap",)
    # A word refused before it is not the word it follows: "You Hotel." after a final "hotel".
    lead = WordToken("you", 0.05, 0.12)
    reasons = judge(audio, 0.0, [lead, first], [True, True], **kw).reasons
    assert reasons[0] and reasons[1] == "overlap", reasons


def test_each_word_of_a_sentence_after_the_one_before_it_is_supported(sentence):
    """The shared-span rule against connected speech: each word judged after the final word before
    it (as the streaming recogniser finalises them, one or two at a time)."""
    words = list(align_words(sentence.samples, 0.0, _truth_tokens(sentence)).words)
    for prev, w in zip(words, words[1:], strict=False):
        v = judge(sentence.samples, 0.0, [w], [True], previous_start=prev.start, previous_end=prev.end)
        assert v.supported == (True,), (w.text, v.reasons)


@pytest.mark.parametrize("word", ["no", "seven"])
def test_a_word_said_again_after_a_short_pause_comes_through_both_times(whisper_model, word):
    """The next utterance opens on the last one's words (the carry). When its first word repeats a
    carried one, the recogniser hears it again without the carry (forced through it, tiny.en says
    carried words again over other speech); a user saying the word again is still heard (real
    tiny.en, espeak-ng speech)."""
    a = testmedia.speak(word, "en-us", lead_in_s=0.3)
    b = testmedia.speak(word, "en-us", lead_in_s=1.0)
    audio = np.concatenate([a.samples, b.samples, np.zeros(SAMPLE_RATE, np.float32)])
    asr = StreamingASR(model=whisper_model)
    events = [e for i in range(0, audio.size, 320) for e in asr.feed(AudioChunk(i / SAMPLE_RATE, audio[i : i + 320]))]
    events += asr.flush()
    finals = [(e.utterance, agreement_key(e.text)) for e in events if isinstance(e, WordToken) and e.final]
    key = agreement_key(word)
    spoken = {key, {"seven": "7"}.get(key, key)}
    # (the first utterance, a lone short word at the stream's start, is not what this is about)
    assert [u for u, _ in finals][-1:] == [1] and len(finals) == len(set(finals)), finals
    assert all(k in spoken for _, k in finals), finals
