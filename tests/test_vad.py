"""Streaming Silero VAD on generated speech with known word onsets."""

from __future__ import annotations

import numpy as np
import pytest

from app.loadtest import testmedia
from models.vad import WINDOW, StreamingVAD, VADConfig, speech_segments


@pytest.fixture(scope="module")
def two_sentences():
    a = testmedia.synthesize_speech("please send the report", lead_in_s=0.4)
    b = testmedia.synthesize_speech("then call me at noon", lead_in_s=0.8)
    return a, b, np.concatenate([a.samples, b.samples, np.zeros(8000, np.float32)])


def test_one_segment_around_the_speech(speech):
    audio = np.concatenate([speech.samples, np.zeros(8000, np.float32)])
    segs = speech_segments(audio)
    assert len(segs) == 1
    start, end = segs[0]
    assert abs(start - speech.words[0].start) < 0.12
    assert speech.words[-1].start < end <= speech.duration + 0.1


def test_pause_splits_utterances_unless_min_silence_is_longer(two_sentences):
    a, b, audio = two_sentences
    segs = speech_segments(audio, VADConfig(min_silence_s=0.3))
    assert len(segs) == 2
    assert segs[0][1] < a.duration + 0.5 < segs[1][0]
    assert len(speech_segments(audio, VADConfig(min_silence_s=1.5))) == 1


def test_silence_and_empty_give_no_events():
    assert speech_segments(np.zeros(16_000, np.float32)) == []
    assert speech_segments(np.zeros(0, np.float32)) == []
    vad = StreamingVAD()
    assert vad.feed(np.zeros(100, np.float32)) == [] and vad.flush() == []


def test_events_do_not_depend_on_chunking(two_sentences):
    *_, audio = two_sentences
    whole = StreamingVAD(t0=2.0)
    ref = whole.feed(audio) + whole.flush()
    pieces = StreamingVAD(t0=2.0)
    got = []
    for i in range(0, len(audio), 333):
        got += pieces.feed(audio[i : i + 333])
    got += pieces.flush()
    assert got == ref
    assert [e.kind for e in ref] == ["start", "end", "start", "end"]
    assert all(e.pts >= 2.0 for e in ref)


def test_streams_keep_their_own_state(speech):
    noise = np.random.default_rng(1).normal(0, 0.01, speech.samples.size).astype(np.float32)
    alone = StreamingVAD()
    ref = alone.feed(speech.samples)
    x, y = StreamingVAD(), StreamingVAD()
    got_x = []
    for i in range(0, speech.samples.size, WINDOW):
        got_x += x.feed(speech.samples[i : i + WINDOW])
        y.feed(noise[i : i + WINDOW])
    assert got_x == ref


def test_bad_config_is_rejected():
    with pytest.raises(ValueError):
        VADConfig(threshold=1.5)
    with pytest.raises(ValueError):
        VADConfig(min_silence_s=-1)
