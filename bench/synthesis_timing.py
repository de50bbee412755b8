"""The previous word-timing refinement, kept for the benches only: synthesis DTW, then forced alignment.

The product refines by forced alignment alone (:mod:`alignment.timing`); bench/word_timing.py
still compares with this method (``synthesis``).

Whisper's DTW word timestamps on connected speech are ~110 ms off on average (≈ +70 ms late,
the first word snapped to the segment start). Two aligners improve on them:

1. **Alignment by synthesis** (the aeneas idea; `bench/synthesis_dtw.py`): espeak-ng speaks
   the words, and a causal DTW over level- and noise-matched MFCCs carries each word's onset in
   the synthetic reference into the real audio. It is exact on speech that sounds like the
   reference (synthetic speech of espeak-ng's kind, a TTS loop-back) and drifts on voices that do
   not. The DTW path says which case it is: its mean frame distance (:func:`_mismatch`) is low
   when the voices match. The voice belongs to the speaker, so these readings are pooled over a
   file or a stream (:class:`VoiceEvidence`), against a male and a female reference voice
   (:data:`REF_VOICES`) until the closer one is clear; up to :data:`SELF_MATCH` its times are kept.
2. **Forced alignment with a human-speech acoustic model** (:mod:`alignment.forced`,
   PocketSphinx's en-us HMMs) for every other word: the recognised words are aligned phone by
   phone to the audio. It was trained on many human speakers, so it does not care what the speaker
   sounds like. Where it finds no path (words that were not said), synthesis's times are kept.

A refined time over MAX_SHIFT_S from Whisper's estimate is rejected in favour of the estimate
(a dropped word can pull the next one onto it).

Streaming: with ``lookahead_s``, a call's times are computed from audio that ends at the last
word's ``end + lookahead_s`` (Whisper's estimate; a streaming recogniser makes words final only
once audio past their end is in, so this costs no waiting), never later: one forced alignment
of the words that need it. The synthesis DTW bounds each word at its own ``end + lookahead_s``
(its rows are real-audio frames and its recurrence is causal). A streaming recogniser emits finals
one or two at a time, so `models.asr.StreamingASR` puts the utterance's last two final words before them
(``context``, not aligned again): a one- or two-word text matches any similar stretch of audio.
After them it puts its next interim word (``follow``, not returned): the look-ahead audio mostly
holds that word's start, and a text that ended at the last final word made the forced alignment
stretch that word over it (a short word like "a" came out on the next word's onset). The bound is
then that following word's end + ``lookahead_s``: audio the recogniser has already heard.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from alignment.types import SAMPLE_RATE, WordToken
from bench.synthesis_dtw import HOP, WIN, Alignment, causal_dtw, distance_matrix, matched_features, mel_power

log = logging.getLogger(__name__)

#: Audio taken before the first and after the last estimate (Whisper snaps the first word early
#: and its estimates run late, so the truth is inside this window).
MARGIN_S = 0.5
#: A refined start further than this from Whisper's estimate is treated as a misalignment.
MAX_SHIFT_S = 1.0
#: Silence around the synthetic reference, so real pauses before/after speech have a match.
REF_PAD_S = 0.3
#: espeak-ng speaking rate of the reference (wpm); the DTW absorbs rate ratios 0.5-2.
REF_WPM = 175
REF_VOICE = "en-us"
#: Reference voices tried while a speaker's evidence is thin (a male and a female espeak-ng voice):
#: the closer one, by pooled mismatch, serves the rest of the stream.
REF_VOICES: tuple[str, ...] = (REF_VOICE, "en-us+f2")
#: Open-start filler cost, as a quantile of the frame-distance matrix.
FILLER_QUANTILE = 0.4
#: Extra cost (as a share of the filler cost) of holding a reference frame: keeps the path from
#: camping on one generic frame when the voices differ a lot.
STAY_PENALTY = 1.0
#: DTW problems solved together, and a cap on their cells (cost float64 + one back-pointer byte).
MAX_BATCH = 8
MAX_BATCH_CELLS = 4_000_000
#: Longer word lists are refined in runs of at most this many seconds (estimated).
MAX_GROUP_S = 8.0
MAX_GAP_S = 1.0
MIN_WORD_S = 0.02

#: Pooled path mismatch (:class:`VoiceEvidence`) up to which the speaker counts as sounding like
#: the closest reference voice, and alignment by synthesis, exact on such speech, is kept over
#: forced alignment. Chosen on espeak-ng and festival voices and sentences that no benchmark uses
#: (clean and at 10 dB SNR): it sits between the espeak-ng voices and festival's human-built ones.
SELF_MATCH = 0.75
#: Speech the path must cover before its mismatch says anything about the voice.
MIN_MATCHED_S = 0.3
#: Pooled speech after which the closest reference voice is fixed and the others are no longer
#: synthesised (their cost is paid only while the evidence is thin); a speaker then found unlike
#: it is no longer synthesised either, except where forced alignment finds no path.
SETTLE_S = 3.0

#: Audio kept before a group that starts on already-timed context words.
CONTEXT_MARGIN_S = 0.1

_WORD_CHARS = re.compile(r"[^\w'%.$-]+")


@dataclass(frozen=True)
class Reference:
    """Synthetic speech for a word list and each word's onset/end in it (s)."""

    samples: np.ndarray
    onsets: tuple[float, ...]
    ends: tuple[float, ...]


def _clean(text: str) -> str:
    """A word as the synthesiser should read it (no sentence punctuation)."""
    return _WORD_CHARS.sub("", text).strip(".-")


@dataclass(frozen=True)
class VoiceEvidence:
    """How much the speaker heard so far sounds like each reference voice.

    The voice is a property of the speaker, not of a word group: one short group's path mismatch
    is noisy (a streamed one- or two-word prefix reads higher than a whole sentence), so readings
    are pooled over a stream or a file, weighted by the speech each path covered, and the choice
    of aligner and reference voice is made on the pool. A context word matched again in the next
    streaming call counts again: the weights say how much each reading is worth, not new audio.
    """

    voices: tuple[str, ...] = REF_VOICES
    weighted: tuple[float, ...] = ()  # per voice: sum of mismatch x speech seconds
    spoken_s: tuple[float, ...] = ()  # per voice: speech seconds behind its readings
    fixed: str | None = None  # the reference voice kept once SETTLE_S of speech was pooled

    def __post_init__(self) -> None:
        n = len(self.voices)
        if not n:
            raise ValueError("at least one reference voice is needed")
        if not self.weighted and not self.spoken_s:
            object.__setattr__(self, "weighted", (0.0,) * n)
            object.__setattr__(self, "spoken_s", (0.0,) * n)
        if len(self.weighted) != n or len(self.spoken_s) != n:
            raise ValueError("one weight and one duration per reference voice")
        if self.fixed is not None and self.fixed not in self.voices:
            raise ValueError(f"fixed voice {self.fixed!r} is not one of {self.voices}")

    def add(self, readings: Mapping[str, tuple[float, float]]) -> VoiceEvidence:
        """This evidence plus one run's (mismatch, speech seconds) per reference voice (infinite
        or speechless readings add nothing); the voice is fixed once :data:`SETTLE_S` is pooled."""
        w, s = list(self.weighted), list(self.spoken_s)
        for voice, (mismatch, spoken_s) in readings.items():
            if np.isfinite(mismatch) and spoken_s > 0.0:
                k = self.voices.index(voice)
                w[k] += mismatch * spoken_s
                s[k] += spoken_s
        out = replace(self, weighted=tuple(w), spoken_s=tuple(s))
        if out.fixed is None and max(s) >= SETTLE_S:
            out = replace(out, fixed=out.best)
        return out

    def mismatch(self, voice: str) -> float:
        """Pooled mismatch against ``voice`` (inf before any speech)."""
        k = self.voices.index(voice)
        return self.weighted[k] / self.spoken_s[k] if self.spoken_s[k] > 0.0 else float("inf")

    @property
    def best(self) -> str:
        """The reference voice the speaker sounds most like (fixed once settled, so the times of
        every run are at hand for it)."""
        return self.fixed if self.fixed is not None else min(self.voices, key=self.mismatch)

    @property
    def candidates(self) -> tuple[str, ...]:
        """Reference voices worth synthesising for the next words (none once the speaker is
        settled as unlike every reference: forced alignment serves it)."""
        if self.fixed is None:
            return self.voices
        return (self.fixed,) if self.matches else ()

    @property
    def matches(self) -> bool:
        """The speaker sounds like the best reference voice (:data:`SELF_MATCH`), so alignment by
        synthesis is kept; False also while there is no evidence."""
        return self.mismatch(self.best) <= SELF_MATCH


@lru_cache(maxsize=64)
def synthesize_reference(words: tuple[str, ...], voice: str = REF_VOICE, wpm: int = REF_WPM) -> Reference:
    """Speak ``words`` with espeak-ng and locate each word in the synthetic audio.

    espeak reports one event per word it speaks, but merges some ("of the") and splits numbers;
    events are matched to words by character position, and words without an event get a time
    interpolated by character position between their neighbours.
    """
    from alignment.espeak import synthesize_speech  # espeak-ng wrapper (ctypes)

    spans: list[tuple[int, int]] = []
    parts: list[str] = []
    pos = 0
    for w in words:
        spans.append((pos, pos + len(w)))
        parts.append(w)
        pos += len(w) + 1
    text = " ".join(parts)
    speech = synthesize_speech(text, voice=voice, wpm=wpm, lead_in_s=REF_PAD_S)
    samples = np.concatenate([speech.samples, np.zeros(int(REF_PAD_S * SAMPLE_RATE), np.float32)])

    # Event -> character position (events come in text order).
    anchors: list[tuple[int, float]] = []
    cursor = 0
    for ev in speech.words:
        at = text.find(ev.text, cursor)
        if at < 0:
            continue
        anchors.append((at, ev.start))
        cursor = at + len(ev.text)
    speech_end = _active_end(samples, 0, len(samples))
    anchors = [(-1, REF_PAD_S)] + anchors + [(len(text) + 1, speech_end)]
    xs = np.array([a for a, _ in anchors], dtype=float)
    ys = np.maximum.accumulate(np.array([b for _, b in anchors], dtype=float))

    onsets = []
    for lo, hi in spans:
        inside = [t for a, t in anchors if lo <= a < hi]
        onsets.append(min(inside) if inside else float(np.interp(lo, xs, ys)))
    onsets_arr = np.maximum.accumulate(np.array(onsets))
    ends = []
    for i, on in enumerate(onsets_arr):
        nxt = onsets_arr[i + 1] if i + 1 < len(onsets_arr) else speech_end
        stop = _active_end(samples, int(on * SAMPLE_RATE), int(nxt * SAMPLE_RATE))
        ends.append(max(stop, on + 0.02))
    return Reference(samples, tuple(float(x) for x in onsets_arr), tuple(ends))


def _active_end(x: np.ndarray, lo: int, hi: int) -> float:
    """Time (s) just after the last non-silent 10 ms block of ``x[lo:hi]`` (``lo`` if all are silent)."""
    seg = x[lo:hi]
    if len(seg) < HOP:
        return hi / SAMPLE_RATE
    n = len(seg) // HOP
    rms = np.sqrt(np.mean(seg[: n * HOP].reshape(n, HOP) ** 2, axis=1))
    thr = 0.02 * float(np.max(np.abs(x))) if len(x) else 0.0
    loud = np.nonzero(rms > thr)[0]
    if len(loud) == 0:
        return lo / SAMPLE_RATE
    return (lo + (int(loud[-1]) + 1) * HOP) / SAMPLE_RATE


def _frame_time(frame: float) -> float:
    """Time (s) of a frame's reference point, the same for real and synthetic audio."""
    return frame * HOP / SAMPLE_RATE


def refine_word_times(
    audio: np.ndarray, audio_start_pts: float, words: Sequence[WordToken], lookahead_s: float | None = None,
    context: int = 0, voice: VoiceEvidence | None = None, follow: int = 0,
) -> list[WordToken]:
    """Return ``words`` with start/end refined against the audio (see the module docstring).

    ``audio`` is 16 kHz mono float32 whose sample 0 is at ``audio_start_pts``. With
    ``lookahead_s`` (streaming), the refined times depend on no audio later than the last word's
    estimated end + ``lookahead_s``. Words the alignment cannot place keep their estimates. The
    first ``context`` words (already timed) only lead the alignment: they are returned as given.
    ``voice``: what earlier speech of the same speaker said about its voice
    (:func:`refine_with_evidence` returns it updated). The last ``follow`` words are the words
    heard next (a streaming recogniser's interim ones): forced alignment takes them after the
    others, so the audio past the last refined word has a word to go to instead of stretching
    that word over the next one's start; they are not returned.
    """
    return refine_with_evidence(audio, audio_start_pts, words, lookahead_s, context, voice, follow)[0]


def refine_with_evidence(
    audio: np.ndarray, audio_start_pts: float, words: Sequence[WordToken], lookahead_s: float | None = None,
    context: int = 0, voice: VoiceEvidence | None = None, follow: int = 0,
) -> tuple[list[WordToken], VoiceEvidence]:
    """:func:`refine_word_times`, and the voice evidence with these words' readings added: a
    stream passes it to its next call, so the choice of aligner rests on all the speech so far."""
    if lookahead_s is not None and not lookahead_s >= 0.0:
        raise ValueError(f"lookahead_s must be >= 0 (got {lookahead_s})")
    if not 0 <= follow <= len(words):
        raise ValueError(f"follow must be between 0 and the number of words (got {follow})")
    evidence = voice if voice is not None else VoiceEvidence()
    words = list(words)
    n_main = len(words) - follow  # words[n_main:] only follow
    if n_main <= context:
        return list(words[:n_main]), evidence
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"audio must be 1-D mono samples, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("audio contains NaN or infinite samples")
    texts = [_clean(w.text) for w in words]
    keep = [i for i, t in enumerate(texts) if t]
    runs: list[tuple[list[int], list[bool], dict[str, list[tuple[float | None, float | None]]]]] = []
    if len(x) >= WIN and keep:
        # Synthesis first for every run, so the choice below rests on all of this call's speech
        # (none for a speaker already settled as unlike the references).
        for group in _groups(words, keep):
            if group[-1] < context or group[0] >= n_main:
                continue
            wanted = [context <= i < n_main for i in group]
            main = [i for i in group if i < n_main]  # synthesis sees the refined words only
            by_voice: dict[str, list[tuple[float | None, float | None]]] = {}
            if evidence.candidates:
                by_voice, evidence = _synthesis_group(x, audio_start_pts, [words[i] for i in main],
                                                      tuple(texts[i] for i in main), lookahead_s,
                                                      wanted[: len(main)], evidence)
                pad: list[tuple[float | None, float | None]] = [(None, None)] * (len(group) - len(main))
                by_voice = {v: times + pad for v, times in by_voice.items()}
            runs.append((group, wanted, by_voice))
    mapped: dict[int, tuple[float | None, float | None]] = {}
    for group, wanted, by_voice in runs:
        group_words, group_texts = [words[i] for i in group], tuple(texts[i] for i in group)
        if evidence.best in by_voice:
            chosen = _choose(x, audio_start_pts, group_words, lookahead_s, wanted, by_voice[evidence.best],
                             evidence.matches, led=group[0] < context)
        else:
            chosen = _forced_then_synthesis(x, audio_start_pts, group_words, group_texts, lookahead_s, wanted,
                                            evidence.best, led=group[0] < context)
        mapped.update(zip(group, chosen, strict=True))

    out: list[WordToken] = list(words[:context])
    last_start = max((w.start for w in out), default=-np.inf)
    for i, w in enumerate(words[context:n_main], start=context):
        on, end = mapped.get(i, (None, None))
        start = w.start if on is None or abs(on - w.start) > MAX_SHIFT_S else on
        start = max(start, last_start)
        stop = end if end is not None else w.end + (start - w.start)
        out.append(replace(w, start=float(start), end=float(max(stop, start + MIN_WORD_S))))
        last_start = start
    return out, evidence


def _synthesis_group(
    x: np.ndarray, pts0: float, words: Sequence[WordToken], texts: tuple[str, ...], lookahead_s: float | None,
    wanted: Sequence[bool], evidence: VoiceEvidence,
) -> tuple[dict[str, list[tuple[float | None, float | None]]], VoiceEvidence]:
    """One run's synthesis times with each candidate reference voice, and the evidence with its
    readings added (no voices when espeak-ng is unavailable)."""
    by_voice: dict[str, list[tuple[float | None, float | None]]] = {}
    readings: dict[str, tuple[float, float]] = {}
    for ref_voice in evidence.candidates:
        try:
            by_voice[ref_voice], readings[ref_voice] = _refine_group(x, pts0, words, texts, lookahead_s, wanted,
                                                                     ref_voice)
        except SynthesisUnavailable as exc:
            _warn_once(f"alignment by synthesis unavailable ({exc}); forced alignment only")
            return {}, evidence
    return by_voice, evidence.add(readings)


def _choose(
    x: np.ndarray, pts0: float, words: Sequence[WordToken], lookahead_s: float | None, wanted: Sequence[bool],
    by_dtw: Sequence[tuple[float | None, float | None]], voice_matches: bool, led: bool,
) -> list[tuple[float | None, float | None]]:
    """Each wanted word's (start, end): by synthesis where the speaker sounds like the reference
    (:class:`VoiceEvidence`), else by forced alignment, else by synthesis anyway."""
    matched = [w and voice_matches and d[0] is not None for w, d in zip(wanted, by_dtw, strict=True)]
    need = [w and not m for w, m in zip(wanted, matched, strict=True)]
    forced = _forced_group(x, pts0, words, lookahead_s, need, led) if any(need) else [(None, None)] * len(words)
    return [d if m or f[0] is None else f for d, f, m in zip(by_dtw, forced, matched, strict=True)]


def _forced_then_synthesis(
    x: np.ndarray, pts0: float, words: Sequence[WordToken], texts: tuple[str, ...], lookahead_s: float | None,
    wanted: Sequence[bool], ref_voice: str, led: bool,
) -> list[tuple[float | None, float | None]]:
    """Each wanted word's (start, end) for a speaker settled as unlike the references (or with no
    synthesis): by forced alignment, and by synthesis only for the words it found no path for."""
    forced = _forced_group(x, pts0, words, lookahead_s, wanted, led)
    missing = [w and f[0] is None for w, f in zip(wanted, forced, strict=True)]
    if not any(missing):
        return forced
    try:
        by_dtw = _refine_group(x, pts0, words, texts, lookahead_s, missing, ref_voice)[0]
    except SynthesisUnavailable as exc:
        _warn_once(f"alignment by synthesis unavailable ({exc}); forced alignment only")
        return forced
    return [d if m else f for d, f, m in zip(by_dtw, forced, missing, strict=True)]


@lru_cache(maxsize=8)
def _warn_once(message: str) -> None:
    """Log ``message`` the first time only: refinement runs on every streaming emission."""
    log.warning(message)


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


class SynthesisUnavailable(RuntimeError):
    """The reference could not be synthesised (espeak-ng missing or failing)."""


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
) -> list[tuple[float | None, float | None]]:
    """(start, end) on the session clock of the ``wanted`` words of one run, by forced alignment
    ((None, None) where it found no alignment). ``led``: the run starts on context words whose
    times are already right, so little audio is taken before them."""
    from alignment.forced import aligner, available

    result: list[tuple[float | None, float | None]] = [(None, None)] * len(words)
    if not available():
        return result

    def sample_at(t: float) -> int:
        return int(np.clip(round((t - pts0) * SAMPLE_RATE), 0, len(x)))

    lo = sample_at(words[0].start - (CONTEXT_MARGIN_S if led else MARGIN_S))
    t0 = pts0 + lo / SAMPLE_RATE
    if lookahead_s is None:  # offline: the whole run
        n, hi = len(words), sample_at(max(w.end for w in words) + MARGIN_S)
    else:  # streaming: audio up to the last word's bound (a following word's, if any)
        n, hi = len(words), sample_at(words[-1].end + lookahead_s)
    spans = aligner().align(x[lo:hi], [w.text for w in words[:n]]) if hi > lo else None
    if spans is not None:
        for j, span in enumerate(spans):
            if wanted[j] and span is not None:
                result[j] = (t0 + span.start, t0 + span.end)
    return result


def _refine_group(
    x: np.ndarray, pts0: float, words: Sequence[WordToken], texts: tuple[str, ...], lookahead_s: float | None,
    wanted: Sequence[bool], voice: str = REF_VOICE,
) -> tuple[list[tuple[float | None, float | None]], tuple[float, float]]:
    """Refined (start, end) on the session clock for the ``wanted`` words of one run of speakable
    words (None: not placed or not wanted) against ``voice``'s reference, and the run's reading
    for :class:`VoiceEvidence`: (path mismatch (:func:`_mismatch`), speech seconds) of the path
    that covered the most speech."""
    try:
        ref = synthesize_reference(texts, voice)
    except Exception as exc:  # espeak missing or failing: the caller keeps the estimates
        raise SynthesisUnavailable(str(exc)) from exc

    def sample_at(t: float) -> int:
        return int(np.clip(round((t - pts0) * SAMPLE_RATE), 0, len(x)))

    seg_lo = sample_at(words[0].start - MARGIN_S)
    seg_hi = sample_at(max(w.end for w in words) + MARGIN_S)
    # Where each word's evidence must stop; one DTW problem per distinct stop.
    stops: dict[int, list[int]] = {}
    for j, w in enumerate(words):
        if not wanted[j]:
            continue
        stop = seg_hi if lookahead_s is None else min(sample_at(w.end + lookahead_s), seg_hi)
        n_frames = 1 + (stop - seg_lo - WIN) // HOP if stop - seg_lo >= WIN else 0
        if n_frames >= 2:
            stops.setdefault(n_frames, []).append(j)
    result: list[tuple[float | None, float | None]] = [(None, None)] * len(words)
    reading = (float("inf"), 0.0)
    if not stops:
        return result, reading
    p_real = mel_power(x[seg_lo : seg_lo + (max(stops) - 1) * HOP + WIN])
    p_ref = mel_power(ref.samples)
    t0 = pts0 + seg_lo / SAMPLE_RATE
    start_limit = int((words[0].start + MARGIN_S - t0) * SAMPLE_RATE / HOP) + 1
    problems = sorted(stops)
    # Optional pauses between words: the reference frame just before each later word's onset.
    pause_cols = np.unique(np.clip(np.round(np.asarray(ref.onsets[1:]) * SAMPLE_RATE / HOP).astype(int) - 1,
                                   0, len(p_ref) - 1))
    batch_n = int(np.clip(MAX_BATCH_CELLS // (problems[-1] * len(p_ref)), 1, MAX_BATCH))
    for b in range(0, len(problems), batch_n):
        batch = problems[b : b + batch_n]
        costs, fillers, pauses = [], [], []
        for n_frames in batch:  # features from this problem's evidence prefix only
            feats = matched_features(p_real[:n_frames], p_ref)
            costs.append(distance_matrix(feats.real, feats.ref))
            fillers.append(float(np.quantile(costs[-1], FILLER_QUANTILE)))
            # Holding between two words may match the real frame against silence (the reference's
            # padding) instead of the boundary frame; same holding penalty either way.
            pauses.append(costs[-1][:, 0] + STAY_PENALTY * fillers[-1])
        fill = np.asarray(fillers)
        paths = causal_dtw(costs, fill, STAY_PENALTY * fill, start_limit, pause_cols, pauses)
        speech = (ref.onsets[0] * SAMPLE_RATE / HOP, ref.ends[-1] * SAMPLE_RATE / HOP)
        for n_frames, path, cost, f in zip(batch, paths, costs, fill, strict=True):
            mismatch, spoken_s = _mismatch(cost, path, float(f), speech)
            if spoken_s > reading[1]:
                reading = (mismatch, spoken_s)
            for j in stops[n_frames]:
                k_on, k_end = ref.onsets[j] * SAMPLE_RATE / HOP, ref.ends[j] * SAMPLE_RATE / HOP
                on = path.frame_of_or_after(k_on) if lookahead_s is not None else path.real_frame_of(k_on)
                end = path.real_frame_of(k_end)
                result[j] = (None if on is None else t0 + _frame_time(on),
                             None if end is None else t0 + _frame_time(end))
    return result, reading


def _mismatch(cost: np.ndarray, path: Alignment, filler: float, speech: tuple[float, float]
              ) -> tuple[float, float]:
    """How unlike the reference the real audio sounds along the path, where the reference speaks
    (``speech``: its first onset to its last end, in frames): the mean frame distance in units of
    the filler cost, low on espeak-ng-like speech, high on human voices. Silence matches silence in
    any voice, so it is left out, and under :data:`MIN_MATCHED_S` of speech proves nothing (inf).
    Also the seconds of speech the value rests on (its weight when readings are pooled)."""
    if filler <= 0.0 or len(path.ref_index) == 0:
        return float("inf"), 0.0
    frames = np.arange(len(path.ref_index)) + path.start_frame
    spoken = (path.ref_index >= speech[0]) & (path.ref_index <= speech[1])
    spoken_s = float(spoken.sum() * HOP / SAMPLE_RATE)
    if spoken_s < MIN_MATCHED_S:
        return float("inf"), 0.0
    return float(np.mean(cost[frames[spoken], path.ref_index[spoken]]) / filler), spoken_s
