"""Word-timing refinement: put each recognised word where it was said, by forced alignment.

Whisper's word timestamps on connected speech run late (the first word snaps to the segment start), so the
recognised words are aligned phone by phone to the audio with a human-speech acoustic model (:mod:`alignment.forced`,
PocketSphinx's en-us HMMs). A word the aligner starts inside a pause starts where the level rises instead
(:func:`alignment.onsets.start_after_pause`). Where it finds no path (words not said), Whisper's estimate is kept
and the word is marked not placed: the streaming recogniser treats it as unsupported (:mod:`alignment.support`).
A refined time more than MAX_SHIFT_S from the estimate is rejected (a dropped word can pull the next one onto it).

Streaming (``lookahead_s``): times come from audio ending at the last word's end + look-ahead, never later. The
utterance's last two finals go before the new words as ``context`` (a one-word text matches any similar stretch of
audio), and the next interim word after them as ``follow`` (the look-ahead audio mostly holds its start; without
it the last word is stretched over it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from alignment.onsets import pause_levels, start_after_pause
from alignment.types import SAMPLE_RATE, WordToken

#: Audio taken before the first and after the last estimate (Whisper snaps the first word early
#: and its estimates run late, so the truth is inside this window).
MARGIN_S = 0.5
#: A refined start further than this from Whisper's estimate is treated as a misalignment.
MAX_SHIFT_S = 1.0
#: Longer word lists are refined in runs of at most this many seconds (estimated).
MAX_GROUP_S = 8.0
MAX_GAP_S = 1.0
MIN_WORD_S = 0.02
#: Audio kept before a group that starts on already-timed context words.
CONTEXT_MARGIN_S = 0.1
#: Audio before a group whose levels join the noise floor that tells a pause (alignment.onsets).
FLOOR_CONTEXT_S = 2.0


@dataclass(frozen=True)
class Refinement:
    """Refined words and, per word, whether the forced alignment found it in the audio
    (False: the word kept Whisper's estimate, or it was a context word given as timed)."""

    words: tuple[WordToken, ...]
    placed: tuple[bool, ...]


def refine_word_times(
    audio: np.ndarray, audio_start_pts: float, words: Sequence[WordToken], lookahead_s: float | None = None,
    context: int = 0, follow: int = 0,
) -> list[WordToken]:
    """Return ``words`` with start/end refined against the audio (see the module docstring).

    ``audio`` is 16 kHz mono float32 whose sample 0 is at ``audio_start_pts``. With
    ``lookahead_s`` (streaming), the refined times depend on no audio later than the last word's
    estimated end + ``lookahead_s``. Words the alignment cannot place keep their estimates. The
    first ``context`` words (already timed) only lead the alignment: they are returned as given.
    The last ``follow`` words are the words heard next (a streaming recogniser's interim ones):
    aligned after the others so the audio past the last refined word has a word to go to; they
    are not returned.
    """
    return list(align_words(audio, audio_start_pts, words, lookahead_s, context, follow).words)


def align_words(
    audio: np.ndarray, audio_start_pts: float, words: Sequence[WordToken], lookahead_s: float | None = None,
    context: int = 0, follow: int = 0,
) -> Refinement:
    """:func:`refine_word_times`, with whether each returned word was placed by the aligner."""
    if lookahead_s is not None and not lookahead_s >= 0.0:
        raise ValueError(f"lookahead_s must be >= 0 (got {lookahead_s})")
    if not 0 <= follow <= len(words):
        raise ValueError(f"follow must be between 0 and the number of words (got {follow})")
    words = list(words)
    n_main = len(words) - follow  # words[n_main:] only follow
    if n_main <= context:
        return Refinement(tuple(words[:n_main]), (False,) * max(n_main, 0))
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"audio must be 1-D mono samples, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("audio contains NaN or infinite samples")
    keep = [i for i, w in enumerate(words) if _speakable(w.text)]
    mapped: dict[int, tuple[float, float]] = {}
    if len(x) >= 400 and keep:
        for group in _groups(words, keep):
            if group[-1] < context or group[0] >= n_main:
                continue
            wanted = [context <= i < n_main for i in group]
            spans = _forced_group(x, audio_start_pts, [words[i] for i in group], lookahead_s, wanted,
                                  led=group[0] < context)
            mapped.update((i, s) for i, s in zip(group, spans, strict=True) if s is not None)

    out: list[WordToken] = list(words[:context])
    placed: list[bool] = [False] * context
    last_start = max((w.start for w in out), default=-np.inf)
    for i, w in enumerate(words[context:n_main], start=context):
        span = mapped.get(i)
        ok = span is not None and abs(span[0] - w.start) <= MAX_SHIFT_S
        start = span[0] if ok and span is not None else w.start
        start = max(start, last_start)
        stop = span[1] if ok and span is not None else w.end + (start - w.start)
        out.append(replace(w, start=float(start), end=float(max(stop, start + MIN_WORD_S))))
        placed.append(ok)
        last_start = start
    return Refinement(tuple(out), tuple(placed))


def _speakable(text: str) -> bool:
    """The word has letters or digits to align (punctuation alone has no sound)."""
    return any(c.isalnum() for c in text)


def end_by_next_start(words: Sequence[WordToken]) -> list[WordToken]:
    """``words`` with each end moved back to the next word's start where it ran past it.

    In connected speech a word ends where the next begins. Streaming refinement often has no end
    in a word's evidence (a word longer than the look-ahead) and keeps Whisper's late estimate,
    past the next onset. (Not inside :func:`refine_word_times`: there a word's times depend on no
    audio past its own look-ahead, and the next start does.)
    """
    out = list(words)
    for i in range(len(out) - 1):
        if out[i].end > out[i + 1].start:
            out[i] = replace(out[i], end=max(out[i + 1].start, out[i].start + MIN_WORD_S))
    return out


def _groups(words: Sequence[WordToken], keep: Sequence[int]) -> list[list[int]]:
    """Runs of words to align together: split at utterance changes, at pauses over MAX_GAP_S and
    after MAX_GROUP_S (estimated), so the cost stays linear in the audio length."""
    groups: list[list[int]] = [[]]
    for i in keep:
        g = groups[-1]
        if g and (words[i].utterance != words[g[-1]].utterance
                  or words[i].start - words[g[-1]].end > MAX_GAP_S
                  or words[i].start - words[g[0]].start > MAX_GROUP_S):
            groups.append([])
        groups[-1].append(i)
    return groups


def _forced_group(
    x: np.ndarray, pts0: float, words: Sequence[WordToken], lookahead_s: float | None, wanted: Sequence[bool],
    led: bool,
) -> list[tuple[float, float] | None]:
    """(start, end) on the session clock of the ``wanted`` words of one run, by forced alignment
    (None where it found no alignment). ``led``: the run starts on context words whose times are
    already right, so little audio is taken before them."""
    from alignment.forced import aligner, available

    result: list[tuple[float, float] | None] = [None] * len(words)
    if not available():
        return result

    def sample_at(t: float) -> int:
        return int(np.clip(round((t - pts0) * SAMPLE_RATE), 0, len(x)))

    lo = sample_at(words[0].start - (CONTEXT_MARGIN_S if led else MARGIN_S))
    t0 = pts0 + lo / SAMPLE_RATE
    if lookahead_s is None:  # offline: the whole run
        hi = sample_at(max(w.end for w in words) + MARGIN_S)
    else:  # streaming: audio up to the last word's bound (a following word's, if any)
        hi = sample_at(words[-1].end + lookahead_s)
    spans = aligner().align(x[lo:hi], [w.text for w in words]) if hi > lo else None
    if spans is None:
        return result
    floor_lo = sample_at(pts0 + lo / SAMPLE_RATE - FLOOR_CONTEXT_S)
    pauses = pause_levels(x[floor_lo:hi])
    t_levels = pts0 + floor_lo / SAMPLE_RATE
    for j, span in enumerate(spans):
        if wanted[j] and span is not None:
            start = t_levels + start_after_pause(pauses, t0 + span.start - t_levels, t0 + span.end - t_levels,
                                                 words[j].text)
            result[j] = (start, t0 + span.end)
    return result
