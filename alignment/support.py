"""Whether the audio supports a recognised word: no final word the audio did not say.

tiny.en, given a short window, can say what is not there (a one-word utterance came out as a phrase repeated three
times, several words at one instant). A word may become final only when:

* the forced alignment (:mod:`alignment.forced`) found it over speech (``LOUD_DB`` over the floor of the audio
  around it, within ``SPEECH_RANGE_DB`` of the loudest frame), before the end of speech;
* its duration is a word's (``MAX_WORD_S``) and it starts after the word before it (``MIN_STEP_S``);
* it does not start the utterance again over audio already given to a word (:func:`_restarts`), nor, at the
  utterance's end, lie mostly inside a word before it (``INSIDE_S``: "Messages" came out as "Messages is, as it");
* a repeat of the words just before it stands well over speech, the utterance's text does not compress like a loop
  (Whisper's compression-ratio rule), and the audio holds both copies (:func:`repeat_heard`).
Whisper's no-speech rule is the engine's, on every decoded window. The alignment is the refinement's own; the rest
is numpy.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from alignment.onsets import levels_db
from alignment.text import agreement_key
from alignment.types import SAMPLE_RATE, WordToken

FRAME_S = 0.01
#: A frame this far above the floor, and within SPEECH_RANGE_DB of the loudest, is speech.
LOUD_DB = 6.0
SPEECH_RANGE_DB = 35.0
#: Share of a word's frames that must be speech (a stop's closure and a soft ending are quiet).
MIN_LOUD_SHARE = 0.2
#: ... and for a word that repeats the words before it (a loop must show its audio).
LOOP_LOUD_SHARE = 0.4
#: The floor: this percentile of the levels of the audio given (it holds some pause or pre-roll).
FLOOR_PERCENTILE = 10.0
#: Levels are clipped here: digital silence is not a floor to stand above.
FLOOR_DBFS = -70.0
MAX_WORD_S = 2.0
#: A word starts at least this long after the word before it (three of the aligner's frames: a short "a").
MIN_STEP_S = 0.03
_TIME_EPS_S = 1e-6
#: Whisper's rule: a text that gzip compresses better than this is a repetition loop.
MAX_COMPRESSION_RATIO = 2.4
#: A restart: a run of at least this many words said already in the utterance, whose first word starts
#: at least RESTART_OVERLAP_S before the end of the word before it.
RESTART_MIN_WORDS = 2
RESTART_OVERLAP_S = 0.05
#: Inside, at an utterance's end: a word that starts at least INSIDE_S before the end of a word before it, with at
#: least INSIDE_SHARE of its span before that end, has no audio of its own (a late word end overlaps the next word
#: by less). Not mid-utterance: there a refused word holds back the words after it, and in noise word ends run late.
INSIDE_S = 0.1
INSIDE_SHARE = 0.5


@dataclass(frozen=True)
class Verdict:
    """Per word: supported, or why not (``"unplaced"``, ``"silent"``, ``"duration"``, ``"overlap"``,
    ``"restart"``, ``"inside"``, ``"loop"``)."""

    reasons: tuple[str, ...]

    @property
    def supported(self) -> tuple[bool, ...]:
        return tuple(not r for r in self.reasons)


def compression_ratio(text: str) -> float:
    """Whisper's compression ratio of ``text`` (bytes / zlib-compressed bytes)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def judge(
    samples: np.ndarray, t0: float, words: Sequence[WordToken], placed: Sequence[bool],
    before: Sequence[str] = (), previous_start: float | None = None, speech_end: float | None = None,
    previous_end: float | None = None,
) -> Verdict:
    """Which of ``words`` (refined, in order) the audio supports.

    ``samples``: 16 kHz audio whose first sample is at ``t0`` (session s), holding the words and
    some audio before them; ``placed``: per word, whether the forced alignment found it;
    ``before``: the utterance's words before these (already final), for the loop rules;
    ``previous_start`` / ``previous_end``: the span of the word before the first of these, if any;
    ``speech_end``: where the utterance's speech ended (the VAD's end), at an endpoint.
    """
    if len(placed) != len(words):
        raise ValueError("one placed flag per word")
    levels = np.maximum(levels_db(samples, hop_s=FRAME_S), FLOOR_DBFS)  # consecutive 10 ms frames
    floor = float(np.percentile(levels, FLOOR_PERCENTILE)) if levels.size else FLOOR_DBFS
    peak = float(levels.max()) if levels.size else FLOOR_DBFS
    loud = levels >= max(floor + LOUD_DB, peak - SPEECH_RANGE_DB)
    keys = [agreement_key(w) for w in before] + [agreement_key(w.text) for w in words]
    loop = _loop_words(keys)[len(before) :]
    ends = [-np.inf if previous_end is None else previous_end] + [w.end for w in words[:-1]]
    restart = _restarts(keys, len(before), [w.start < e - RESTART_OVERLAP_S for w, e in zip(words, ends, strict=True)])
    text = " ".join([*before, *(w.text for w in words)])
    looping = compression_ratio(text) > MAX_COMPRESSION_RATIO
    reasons = []
    last = -np.inf if previous_start is None else previous_start
    reach = -np.inf if previous_end is None else previous_end  # the latest end of a word before this one
    for k, (w, ok) in enumerate(zip(words, placed, strict=True)):
        share = _loud_share(loud, t0, w.start, w.end)
        step, last = w.start - last, w.start
        inside = (speech_end is not None and reach - w.start >= INSIDE_S
                  and min(reach, w.end) - w.start >= INSIDE_SHARE * (w.end - w.start))
        reach = max(reach, w.end)
        if looping:
            reasons.append("loop")
        elif not ok:
            reasons.append("unplaced")
        elif w.end - w.start > MAX_WORD_S:
            reasons.append("duration")
        elif step < MIN_STEP_S - _TIME_EPS_S:  # two times on the 10 ms grid, 30 ms apart, may differ by a hair less
            reasons.append("overlap")
        elif restart[k]:
            reasons.append("restart")
        elif inside:
            reasons.append("inside")
        elif speech_end is not None and w.start >= speech_end - MIN_STEP_S:
            reasons.append("silent")
        elif share < (LOOP_LOUD_SHARE if loop[k] else MIN_LOUD_SHARE):
            reasons.append("loop" if loop[k] and share >= MIN_LOUD_SHARE else "silent")
        else:
            reasons.append("")
    return Verdict(tuple(reasons))


def _loud_share(loud: np.ndarray, t0: float, start: float, end: float) -> float:
    """Share of the 10 ms frames in [start, end) that are speech (0 outside the audio)."""
    a = max(int(np.floor((start - t0) / FRAME_S)), 0)
    b = min(int(np.ceil((end - t0) / FRAME_S)), loud.size)
    return float(loud[a:b].mean()) if b > a else 0.0


def _restarts(keys: Sequence[str], first: int, inside: Sequence[bool]) -> list[bool]:
    """Per word of ``keys[first:]``: it belongs to a restart, a run of at least RESTART_MIN_WORDS
    words found earlier in ``keys`` whose first word starts inside the word before it (``inside``)."""
    flags = [False] * (len(keys) - first)
    for i in range(first, len(keys)):
        if not inside[i - first]:
            continue
        n = 0
        while i + n < len(keys) and _occurs(keys[i : i + n + 1], keys[:i]):
            n += 1
        if n >= RESTART_MIN_WORDS:
            flags[i - first : i - first + n] = [True] * n
    return flags


def _occurs(run: Sequence[str], keys: Sequence[str]) -> bool:
    """``run`` is a contiguous part of ``keys``."""
    n = len(run)
    return any(list(keys[j : j + n]) == list(run) for j in range(len(keys) - n + 1))


def _loop_words(keys: Sequence[str]) -> list[bool]:
    """Per word: it belongs to a copy of the word run just before it (``a b a b``: the second
    ``a b``; ``x x x``: the second and third ``x``)."""
    flags = [False] * len(keys)
    for start, n in loop_runs(keys):
        flags[start : start + n] = [True] * n
    return flags


def loop_runs(keys: Sequence[str]) -> list[tuple[int, int]]:
    """Each copy of the word run just before it, as (first index of the copy, run length), found
    at the copy's last word, the shortest run first."""
    runs = []
    for i in range(len(keys)):
        for n in range(1, i // 2 + 1 + 1):
            if i - 2 * n + 1 < 0:
                break
            if keys[i - n + 1 : i + 1] == keys[i - 2 * n + 1 : i - n + 1]:
                runs.append((i - n + 1, n))
                break
    return runs


#: Audio around a repeat that its check scores (s): the edges of the first and last copy.
REPEAT_MARGIN_S = 0.15
#: A repeat is refused only when the words without it fit the audio clearly better: by more than
#: this, in the aligner's score per 10 ms frame of the scored audio (calibrated on the tuning
#: speakers' one-word clips, each scored once and doubled: docs/asr-measurements.md).
MIN_REPEAT_GAIN = -1.0


def repeat_heard(samples: np.ndarray, t0: float, original: Sequence[WordToken], copy: Sequence[WordToken],
                 fit: Callable[[np.ndarray, Sequence[str]], float | None]) -> bool:
    """Whether the audio holds ``copy`` (a repeat of the words ``original``, just before it) as
    well as the original: the words without the copy must not explain the audio of both clearly
    better than the words with it. ``samples`` start at ``t0`` (session s); ``fit`` scores a text against audio
    (:meth:`alignment.forced.ForcedAligner.fit`, higher is better, None: does not fit)."""
    a = max(int((original[0].start - REPEAT_MARGIN_S - t0) * SAMPLE_RATE), 0)
    b = min(int((copy[-1].end + REPEAT_MARGIN_S - t0) * SAMPLE_RATE), len(samples))
    gain = repeat_gain(samples[a:b], [w.text for w in original], [w.text for w in copy], fit)
    return gain > MIN_REPEAT_GAIN


def repeat_gain(audio: np.ndarray, original: Sequence[str], copy: Sequence[str],
                fit: Callable[[np.ndarray, Sequence[str]], float | None]) -> float:
    """How much better ``original`` then ``copy`` fits ``audio`` than ``original`` alone, per 10 ms
    frame (-inf where the copy does not fit at all, +inf where only the text with it does)."""
    with_copy = fit(audio, [*original, *copy])
    if with_copy is None:
        return -np.inf
    without = fit(audio, list(original))
    if without is None:
        return np.inf
    return (with_copy - without) / (len(audio) / (FRAME_S * SAMPLE_RATE))


def refuse_unheard_repeats(samples: np.ndarray, t0: float, prior: Sequence[WordToken], words: Sequence[WordToken],
                           supported: Sequence[bool], fit: Callable[[np.ndarray, Sequence[str]], float | None],
                           ) -> tuple[list[bool], int]:
    """``supported`` (per word of ``words``, after ``prior``: the utterance's last final words), less
    each repeat of the words just before it whose second copy the audio does not hold
    (:func:`repeat_heard`); and how many repeats that refused."""
    out, refused = list(supported), 0
    tokens = [*prior, *words]
    for start, n in loop_runs([agreement_key(t.text) for t in tokens]):
        k = start - len(prior)
        if k < 0 or not all(out[k : k + n]):
            continue
        if not repeat_heard(samples, t0, tokens[start - n : start], tokens[start : start + n], fit):
            out[k : k + n] = [False] * n
            refused += 1
    return out, refused
