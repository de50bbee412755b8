"""Acoustic onsets of words that follow silence: evidence of a word's audio time that no aligner made.

Level-3 must check a word's audio time against something other than the estimate that placed
it. Where a word follows a pause, the audio itself says when it starts: the level rises out of
the noise floor. This module finds that rise from the signal alone (10 ms RMS in 5 ms steps),
so a word the aligner put 80 ms off is caught whatever aligner was used. Words inside connected
speech have no such evidence and are not judged by it (None).

The onset is the first frame more than ``QUIET_DB`` above the floor after at least
``MIN_SILENCE_S`` of frames within it, when the level then reaches ``RISE_DB`` above the floor
within ``RAMP_S``. The floor is a low percentile of the levels around the word, so steady
background noise raises it instead of reading as speech. A stop consonant's closure is silent
and a weak consonant sits near the floor, so for those words the rise comes late: an aligner's
onset (and a synthesizer's word boundary) may sit up to ~120 ms before it (:func:`onset_window_ms`).
"""

from __future__ import annotations

import numpy as np

from alignment.types import SAMPLE_RATE

HOP_S = 0.005
WINDOW_S = 0.010
#: How far from the word's placed start a rise is looked for.
SEARCH_S = 0.25
#: Audio before the search window used for the noise floor.
CONTEXT_S = 1.0
MIN_SILENCE_S = 0.12
QUIET_DB = 3.0
RISE_DB = 15.0
#: The level must reach RISE_DB within this long of leaving the floor (speech, not a creak).
RAMP_S = 0.05
#: A floor this far below full scale is digital silence, not a room: levels are clipped to it.
FLOOR_DBFS = -90.0


def _levels_db(x: np.ndarray) -> np.ndarray:
    """RMS level (dBFS) of ``WINDOW_S`` frames every ``HOP_S``."""
    hop, win = int(HOP_S * SAMPLE_RATE), int(WINDOW_S * SAMPLE_RATE)
    if len(x) < win:
        return np.zeros(0)
    n = 1 + (len(x) - win) // hop
    csum = np.concatenate([[0.0], np.cumsum(np.asarray(x, np.float64) ** 2)])
    starts = np.arange(n) * hop
    power = (csum[starts + win] - csum[starts]) / win
    return np.maximum(10.0 * np.log10(np.maximum(power, 1e-20)), FLOOR_DBFS)


def onset_after_silence(samples: np.ndarray, t0: float, near: float, previous: float | None = None
                        ) -> float | None:
    """The acoustic onset (session s) of speech that follows silence, nearest to ``near`` (a
    word's placed start); None when no silence-to-speech rise lies within ``SEARCH_S`` of it.

    ``samples`` is 16 kHz mono audio whose first sample is at ``t0`` (session s). ``previous``,
    the start of the word before, keeps that word's own rise from being taken for this one's:
    only rises nearer to ``near`` than to ``previous`` count.
    """
    lo = max(0, int((near - SEARCH_S - CONTEXT_S - t0) * SAMPLE_RATE))
    hi = min(len(samples), int((near + SEARCH_S + WINDOW_S - t0) * SAMPLE_RATE))
    if hi - lo < int((MIN_SILENCE_S + 2 * WINDOW_S) * SAMPLE_RATE):
        return None
    levels = _levels_db(samples[lo:hi])
    if levels.size == 0:
        return None
    floor = float(np.percentile(levels, 10))
    quiet = levels <= floor + QUIET_DB
    loud = levels >= floor + RISE_DB
    need = int(round(MIN_SILENCE_S / HOP_S))
    ramp = int(round(RAMP_S / HOP_S))
    run = 0
    best: float | None = None
    for k in range(len(levels)):
        if quiet[k]:
            run += 1
            continue
        if run >= need and loud[k : k + ramp + 1].any():  # left the floor, and rose to speech
            t = t0 + (lo + k * HOP_S * SAMPLE_RATE) / SAMPLE_RATE + WINDOW_S / 2
            ours = previous is None or t > (previous + near) / 2
            if ours and abs(t - near) <= SEARCH_S and (best is None or abs(t - near) < abs(best - near)):
                best = t
        run = 0
    return best


#: First phones (espeak-ng mnemonics) whose sound rises after the word begins: stops (the
#: closure is silent) and weak fricatives and /h/ (they sit near the noise floor).
_SOFT_ONSETS = frozenset("ptkbdgfvTDhCx")
#: start - acoustic onset (ms) that a correctly placed word may show: a word never starts more
#: than the product's ±40 ms after its sound rises, and a soft onset may rise up to ~120 ms
#: after the word begins (synthesizers' and aligners' word boundaries both put the closure or
#: the weak consonant inside the word). Measured in BENCHMARKS.md (onset evidence).
SHARP_WINDOW_MS = (-50.0, 40.0)
SOFT_WINDOW_MS = (-120.0, 40.0)


def onset_window_ms(word: str) -> tuple[float, float]:
    """The accepted range of (placed start - acoustic onset) for ``word``, by its first phone."""
    from alignment.espeak import EspeakUnavailable, phonemes

    try:
        first = phonemes(word).lstrip("',%=_: ")[:1]
    except (EspeakUnavailable, ValueError):
        return SOFT_WINDOW_MS  # the more tolerant range: never fail a word for lack of a dictionary
    return SOFT_WINDOW_MS if first in _SOFT_ONSETS else SHARP_WINDOW_MS
