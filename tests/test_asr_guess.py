"""Tokens guessed ahead in a decode (verified in the decoder pass that feeds a sampled token) are
only a speed hint: the words, times and probabilities are those of plain greedy decoding."""

from __future__ import annotations

import pytest

from alignment.types import SAMPLE_RATE
from models.asr import engine as engine_mod
from models.asr.engine import _before_cut, _guess, get_engine


def test_a_guess_continues_the_last_tokens_previous_run():
    assert _guess([5, 1, 2, 3, 1], 5) == [2, 3, 1, 2, 3]  # a loop goes on
    assert _guess([7, 7], 3) == [7, 7, 7]
    assert _guess([4, 1, 2, 3, 9, 1], 2) == [2, 3]  # a phrase said again
    assert _guess([1, 2, 3], 4) == []  # the last token is new: no guess
    assert _guess([1, 2, 1], 0) == [] and _guess([1], 3) == []


def test_a_guess_stops_before_the_token_that_completes_a_loop():
    """Decoding stops at the token that makes a loop (:func:`_loop_cut`): no row after it is fed."""
    assert _before_cut([9, 5, 5], [5, 5, 5, 5]) == [5]  # the fourth 5 ends the decode
    assert _before_cut([1, 2, 3, 4, 1, 2], [3, 4, 1]) == [3]  # 1 2 3 4 said twice
    assert _before_cut([1, 2, 3], [4, 5]) == [4, 5]


def test_guesses_change_no_decode(whisper_model, speech, monkeypatch):
    """Partial windows (where tiny.en loops or repeats itself), with and without a prefix and a
    draft: every word, time and probability is the same, bit for bit, without guesses."""
    eng = get_engine("whisper", whisper_model, int8=True)
    fed: list[int] = []
    feed = engine_mod.DecoderPass.feed

    def counting(self, tokens, rowwise=False):  # noqa: ANN001, ANN202
        if rowwise:
            fed.append(len(tokens))
        return feed(self, tokens, rowwise)

    monkeypatch.setattr(engine_mod.DecoderPass, "feed", counting)
    cases = []
    for cut_s in (0.7, 1.0, 1.3, 1.6, 2.0, speech.duration):
        audio = speech.samples[: int(cut_s * SAMPLE_RATE)]
        plain = eng.transcribe(audio)
        cases += [(audio, (), ()), (audio, (), [w.raw for w in plain][:1])]
        if len(plain) > 2:
            cases.append((audio, [w.raw for w in plain[:2]], [w.raw for w in plain[2:]]))
    guessed = [eng.transcribe(a, prefix=p, draft=d) for a, p, d in cases]
    assert max(fed) > 1  # guesses were fed
    monkeypatch.setattr(engine_mod, "_GUESS", 0)
    fed.clear()
    plain = [eng.transcribe(a, prefix=p, draft=d) for a, p, d in cases]
    assert max(fed) == 1
    assert any(guessed)
    for g, p in zip(guessed, plain, strict=True):
        assert [(w.raw, w.start, w.end, w.probability) for w in g] == [
            (w.raw, w.start, w.end, w.probability) for w in p]


@pytest.mark.parametrize("n", [1, 3])
def test_a_guess_never_passes_the_budget(whisper_model, speech, n):
    """Guesses near the end of a short window's token budget stay inside the decoder context."""
    eng = get_engine("whisper", whisper_model, int8=True)
    audio = speech.samples[: int(0.4 * n * SAMPLE_RATE)]
    words = eng.transcribe(audio, prefix=[" the"] * 3)
    assert all(w.raw for w in words)
