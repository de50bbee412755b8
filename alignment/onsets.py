"""Acoustic onsets of words that follow silence: evidence of a word's audio time that no aligner made.

Level-3 must check a word's audio time against something other than the estimate that placed it. After a pause
the level (10 ms RMS in 5 ms steps) rises out of the noise floor where the word starts, whatever aligner placed it;
words inside connected speech have no such evidence and are not judged by it (None).

The onset is the first frame ``QUIET_DB`` over the floor (a low percentile of the levels around the word, so steady
noise raises it) after ``MIN_SILENCE_S`` within it, when the level then reaches ``RISE_DB`` within ``RAMP_S``. A
stop's closure is silent and a weak consonant sits near the floor, so an aligner's onset may sit up to ~120 ms
before that rise, ~180 ms for /f/ or /θ/ (:func:`onset_window_ms`).

The refinement uses the same levels for one thing the aligner gets wrong: after a pause it often gives up to 200 ms
of the quiet to the next word's first phone, and a word cannot begin in a pause (:func:`start_after_pause`). For a
word so moved, the check and the placement share their evidence; everywhere else the check stays independent.
"""

from __future__ import annotations

from dataclasses import dataclass

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
#: start_after_pause: a pause is at least MIN_SILENCE_S of levels within PAUSE_QUIET_DB of the floor (a
#: stop's closure inside connected speech is mostly shorter, and keeps the aligner's start), one 5 ms step
#: over it allowed (a room's noise flickers); speech starts at the first level PAUSE_RISE_DB over the floor
#: (:func:`_pause_floor`).
PAUSE_QUIET_DB = 6.0
PAUSE_RISE_DB = 12.0
PAUSE_FLOOR_PERCENTILE = 5.0
#: Only where the word's loudest level stands this far over the floor: in noise a word's first sounds sit
#: near the floor, and the rise comes late.
PAUSE_CLEAN_DB = 25.0
#: How far past the aligner's start the rise may be.
PAUSE_SEARCH_S = 0.3
#: A stop's word starts this long before its burst, the level's rise: its closure is part of the word but
#: silent after a pause. Hand-read onsets mark the burst, synthesizers' segments the closure's start.
STOP_LEAD_S = 0.02
_STOPS = frozenset("ptkbdg")
_FRICATIVES = frozenset("fvTDhCxsSzZ")


def levels_db(x: np.ndarray, hop_s: float = HOP_S) -> np.ndarray:
    """RMS level (dBFS) of ``WINDOW_S`` frames every ``hop_s`` (``WINDOW_S``: frames side by side)."""
    hop, win = int(round(hop_s * SAMPLE_RATE)), int(WINDOW_S * SAMPLE_RATE)
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
    levels = levels_db(samples[lo:hi])
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


@dataclass(frozen=True)
class PauseLevels:
    """The levels of some audio (:func:`levels_db`), the floor its pauses sit at and which levels are
    quiet: worked out once for all the words placed on that audio (:func:`pause_levels`)."""

    levels: np.ndarray
    floor: float
    quiet: np.ndarray


def pause_levels(samples: np.ndarray) -> PauseLevels:
    """:class:`PauseLevels` of ``samples`` (16 kHz), which should reach back before the words so that
    its floor is a pause's."""
    levels = levels_db(samples)
    floor = _pause_floor(levels)
    return PauseLevels(levels, floor, _median3(levels) <= floor + PAUSE_QUIET_DB)


def _median3(levels: np.ndarray) -> np.ndarray:
    """Each level replaced by the median of it and its two neighbours: one step of a room's noise
    flickering over the quiet band does not end a pause."""
    if levels.size < 3:
        return levels
    padded = np.concatenate([levels[:1], levels, levels[-1:]])
    return np.median(np.stack([padded[:-2], padded[1:-1], padded[2:]]), axis=0)


def start_after_pause(audio: PauseLevels, start: float, end: float, word: str) -> float:
    """``start`` (s from the audio's first sample) moved to where the level rises, when it lies in
    a pause; otherwise ``start``. ``end`` (the word's end) bounds the move. By the word's first
    phone: a vowel, nasal or liquid starts at the rise, a stop STOP_LEAD_S before it, a fricative
    where the level leaves the pause."""
    levels, floor, quiet = audio.levels, audio.floor, audio.quiet
    k = max(0, int(round(start / HOP_S)) - 1)  # the window centred nearest the start
    if k >= len(levels) or not quiet[k]:
        return start
    first, last = k, k
    while first > 0 and quiet[first - 1]:
        first -= 1
    while last < len(levels) and quiet[last]:
        last += 1
    if (last - first) * HOP_S < MIN_SILENCE_S:
        return start  # a closure or a dip, not a pause
    stop = min(int(min(end, start + PAUSE_SEARCH_S) / HOP_S), len(levels))
    if stop <= last or levels[last:max(int(end / HOP_S), stop)].max() < floor + PAUSE_CLEAN_DB:
        return start
    rise = next((j for j in range(last, stop) if levels[j] > floor + PAUSE_RISE_DB), None)
    if rise is None:
        return start
    first_phone = _first_phone(word)
    if first_phone in _FRICATIVES:
        return last * HOP_S + WINDOW_S / 2  # frication builds up from the floor: it starts where the pause ends
    onset = rise * HOP_S + WINDOW_S / 2
    return max(start, onset - STOP_LEAD_S) if first_phone in _STOPS else onset


def _pause_floor(levels: np.ndarray) -> float:
    """The level a pause sits at: digital silence where the audio has a pause of it (a synthesizer's,
    or a mic's noise suppression), else a low percentile of the audible levels (the room's noise)."""
    digital = np.concatenate([[False], levels <= FLOOR_DBFS, [False]])
    edges = np.flatnonzero(np.diff(digital.astype(np.int8)))
    if edges.size and np.max(edges[1::2] - edges[::2]) * HOP_S >= MIN_SILENCE_S:
        return FLOOR_DBFS
    audible = levels[levels > FLOOR_DBFS]
    return float(np.percentile(audible, PAUSE_FLOOR_PERCENTILE)) if audible.size else FLOOR_DBFS


def _first_phone(word: str) -> str | None:
    """The espeak-ng mnemonic ``word`` begins with (None without a pronunciation)."""
    from alignment.espeak import EspeakUnavailable, phonemes

    try:
        return phonemes(word).lstrip("',%=_: ")[:1] or None
    except (EspeakUnavailable, ValueError):
        return None


#: First phones (espeak-ng mnemonics) whose sound rises after the word begins: stops (the
#: closure is silent) and weak fricatives and /h/ (they sit near the noise floor).
_SOFT_ONSETS = frozenset("ptkbdgfvTDhCx")
#: The weak voiceless fricatives, /f/ and /θ/: their faint noise is spread far above 4 kHz, so telephone-band
#: audio keeps little of it and the level rises only at the vowel, up to a whole fricative later.
_WEAK_FRICATIVES = frozenset("fT")
#: start - acoustic onset (ms) that a correctly placed word may show: listeners mark a word up to
#: ~50 ms after its level first rises (a breathy or pre-voiced start: hand-read onsets), and a soft
#: onset may rise up to ~120 ms after the word begins (synthesizers' and aligners' word boundaries
#: both put the closure or the weak consonant inside the word), a weak fricative's up to ~180 ms.
#: Measured on the hand-read human sets: docs/benchmarks-history.md, 12-06 (thirtieth session).
SHARP_WINDOW_MS = (-50.0, 50.0)
SOFT_WINDOW_MS = (-120.0, 50.0)
WEAK_FRICATIVE_WINDOW_MS = (-180.0, 50.0)


def onset_window_ms(word: str) -> tuple[float, float]:
    """The accepted range of (placed start - acoustic onset) for ``word``, by its first phone."""
    first = _first_phone(word)
    if first is None:
        return SOFT_WINDOW_MS  # the more tolerant range: never fail a word for lack of a dictionary
    if first in _WEAK_FRICATIVES:
        return WEAK_FRICATIVE_WINDOW_MS
    return SOFT_WINDOW_MS if first in _SOFT_ONSETS else SHARP_WINDOW_MS
