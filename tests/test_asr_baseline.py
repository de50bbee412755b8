"""bench/asr_stream.py's baseline (bench/asr_engines.py): faster-whisper and the ungated policy.

It lives in bench/ because nothing in the product uses it; it is tested here so the bench's
comparison keeps running.
"""

from __future__ import annotations

import numpy as np

from alignment.text import agreement_key
from alignment.types import SAMPLE_RATE, AudioChunk, WordToken
from bench.asr_engines import BaselineStreamingASR, faster_whisper_engine
from models.asr import StreamingConfig


def test_faster_whisper_engine_hears_the_words(speech):
    words = faster_whisper_engine().transcribe(speech.samples)
    said = {w.key for w in words}
    assert sum(agreement_key(w.text) in said for w in speech.words) >= len(speech.words) - 1
    assert all(0 <= w.start <= w.end <= speech.duration + 0.5 for w in words)


def test_baseline_policy_decodes_without_a_vad_and_finalises_at_the_end(speech):
    cfg = StreamingConfig(step_s=1.0, max_window_s=15.0, refine=False, guard_decode=False)  # LocalAgreement-2
    asr = BaselineStreamingASR(faster_whisper_engine(), cfg)
    audio = speech.samples
    events = [e for i in range(0, audio.size, 320) for e in asr.feed(AudioChunk(i / SAMPLE_RATE, audio[i : i + 320]))]
    assert asr.decode_count == int(audio.size / SAMPLE_RATE)  # one decode per second of audio, speech or not
    events += asr.flush()
    finals = [e for e in events if isinstance(e, WordToken) and e.final]
    said = {agreement_key(w.text) for w in finals}
    assert sum(agreement_key(w.text) in said for w in speech.words) >= len(speech.words) - 1
    assert [w.index for w in finals] == list(range(len(finals)))
    assert np.all(np.diff([w.start for w in finals]) >= 0)
