"""Offline transcription: every word of a recording, final and timing-refined.

Silero VAD cuts utterances and each is decoded on its own with an audio context of its own length
+ 0.5 s (not 30 s of padding); word times come from cross-attention DTW and are then refined by
:func:`alignment.timing.refine_word_times`.
"""

from __future__ import annotations

import numpy as np
from whisper.model import Whisper

from alignment.timing import end_by_next_start, refine_word_times
from alignment.types import SAMPLE_RATE, WordToken
from models.asr.engine import Engine, check_audio, get_engine, without_unheard_tail
from models.vad import VADConfig, speech_segments


def transcribe_words(
    audio: np.ndarray,
    t0: float = 0.0,
    model: Whisper | None = None,  # default: load_whisper()
    refine: bool = True,
    engine: str | Engine = "whisper",
    pad_s: float = 0.2,
) -> list[WordToken]:
    """All words in ``audio`` (t0 = pts of ``audio[0]``), final, on the session clock.

    Each VAD utterance (padded by ``pad_s``, split at 25 s) is decoded on its own with a variable
    audio context; word times come from cross-attention DTW, then the timing refinement.
    """
    audio = check_audio(audio)
    if audio.size < SAMPLE_RATE // 10:
        return []
    eng = get_engine(engine, model)
    segs = speech_segments(audio, VADConfig(min_silence_s=0.3))
    pieces: list[tuple[int, int]] = []
    for s, e in segs:
        a = max(int((s - pad_s) * SAMPLE_RATE), 0)
        b = min(int((e + pad_s) * SAMPLE_RATE), audio.size)
        while b - a > 25 * SAMPLE_RATE:
            pieces.append((a, a + 25 * SAMPLE_RATE))
            a += 25 * SAMPLE_RATE
        if b > a:
            pieces.append((a, b))
    words: list[WordToken] = []
    for utt, (a, b) in enumerate(pieces):
        for i, w in enumerate(without_unheard_tail(eng.transcribe(audio[a:b]))):
            base = t0 + a / SAMPLE_RATE
            words.append(WordToken(w.text, base + w.start, base + w.end, True, w.probability, utt, i))
    if refine and words:
        words = end_by_next_start(refine_word_times(audio, t0, words))
    return words
