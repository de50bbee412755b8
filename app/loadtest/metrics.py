"""What one load-test peer measured, computed from what it sent (the truth) and what came back.

Pure functions over plain data, so the figures can be checked without a server: the truth is the
generated clip's exact word onsets and marker times (``app.loadtest.testmedia``), looped and mapped to the
peer's clock (zero = the instant clip time zero was sent); what came back is the list of events
with their arrival wall times and the instants flashes were seen in the returned video.

Latencies use the client's clock only (arrival wall − truth wall), so they do not depend on the
server's session-clock zero, which lags the client's by the uplink delay. Token *times* do use the
server clock; matching tokens to truth words estimates that lag (``clock_lag_s``) first.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from alignment.json_types import JsonObject
from alignment.rounding import round_or_none, to_ms
from alignment.sync import FLAG_THRESHOLD_MS, TOLERANCE_MS
from alignment.text import dictionary_form as normalise  # how token text is compared to the script
from alignment.types import SAMPLE_RATE

if TYPE_CHECKING:
    from app.loadtest.testmedia import AVClip


@dataclass(frozen=True)
class Record:
    """A frozen figures record that writes itself as the JSON object it replaces (field order = key order)."""

    def to_json(self) -> JsonObject:
        return asdict(self)


@dataclass(frozen=True)
class TruthWord:
    """One spoken word of the clip: its text and exact start/end (s, clip time)."""

    text: str
    start: float
    end: float


@dataclass(frozen=True)
class ClipTruth:
    """The clip's ground truth, everything in clip seconds; the clip repeats every ``period_s``."""

    words: tuple[TruthWord, ...]
    markers: tuple[float, ...]  # audio click times (the flashes are at marker + av_offset_s)
    period_s: float
    av_offset_s: float
    speech_onset: float | None = None  # where the utterance's sound starts (a first stop's closure is silent)

    @property
    def utterance_end(self) -> float:
        return self.words[-1].end if self.words else 0.0


def word_ends(samples: np.ndarray, starts: Sequence[float], rel_threshold: float = 0.03) -> list[float]:
    """Each word's end: the last 10 ms of energy above ``rel_threshold``·peak before the next onset."""
    hop = SAMPLE_RATE // 100
    n = len(samples) // hop
    if n == 0:
        return [s for s in starts]
    rms = np.sqrt(np.mean(samples[: n * hop].reshape(n, hop).astype(np.float64) ** 2, axis=1))
    active = rms > rel_threshold * (rms.max() or 1.0)
    ends = []
    for i, s in enumerate(starts):
        lo = int(s * 100)
        hi = int(starts[i + 1] * 100) if i + 1 < len(starts) else n
        idx = np.nonzero(active[lo:hi])[0]
        ends.append((lo + idx[-1] + 1) / 100.0 if idx.size else (hi / 100.0))
    return ends


def clip_truth(clip: AVClip) -> ClipTruth:
    """Ground truth of an ``app.loadtest.testmedia.AVClip``; word ends from the speech energy, clicks removed."""
    starts = [w.start for w in clip.words]
    audio = np.array(clip.audio, np.float32)
    speech = audio.copy()
    for m in clip.markers:  # the 10 ms clicks are not speech: keep them out of the word ends
        i = int(round(m * SAMPLE_RATE))
        speech[max(i - 16, 0) : i + int(0.012 * SAMPLE_RATE)] = 0.0
    ends = word_ends(speech, starts)
    # A word lasts at least 50 ms, but never into the next one (festival says "a" in ~35 ms).
    nexts = [*starts[1:], float("inf")]
    words = tuple(
        TruthWord(normalise(w.text), float(w.start), float(min(max(e, w.start + 0.05), nxt)))
        for w, e, nxt in zip(clip.words, ends, nexts, strict=True)
    )
    from app.loadtest.answers import speech_span

    span = speech_span(speech, SAMPLE_RATE)
    return ClipTruth(words, tuple(clip.markers), len(audio) / SAMPLE_RATE, float(clip.av_offset_s),
                     None if span is None else span[0] / SAMPLE_RATE)


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (linear interpolation), None for no values."""
    if not values:
        return None
    return float(np.quantile(np.asarray(values, dtype=np.float64), q))


def sigma_windows(intervals: Sequence[float], window: int = 8) -> list[float]:
    """Population σ of every sliding window of ``window`` intervals (the LST jitter figure)."""
    return [statistics.pstdev(intervals[i - window : i]) for i in range(window, len(intervals) + 1)]


@dataclass(frozen=True)
class WordLatency:
    """One truth word occurrence and when its token first (and finally) arrived, client clock."""

    text: str
    start: float  # truth, peer clock (s since clip zero was sent)
    end: float
    token_start: float | None  # the token's start as the server stamped it (server clock)
    first_s: float | None  # first arrival (interim or final), peer clock
    final_s: float | None  # first final arrival, peer clock
    matched_by: str = ""  # "text" (same word), "time" (a misheard word over the same interval), "" (none)

    @property
    def latency_s(self) -> float | None:
        return None if self.first_s is None else self.first_s - self.end

    @property
    def final_latency_s(self) -> float | None:
        return None if self.final_s is None else self.final_s - self.end


def truth_occurrences(truth: ClipTruth, until_s: float) -> list[tuple[int, TruthWord]]:
    """Every (repetition, word) of the looped clip that ended before ``until_s`` (peer clock)."""
    out = []
    reps = int(until_s // truth.period_s) + 1 if truth.period_s > 0 else 1
    for r in range(reps):
        base = r * truth.period_s
        for w in truth.words:
            if base + w.end <= until_s:
                out.append((r, TruthWord(w.text, base + w.start, base + w.end)))
    return out


def match_tokens(
    truth: ClipTruth, tokens: Iterable[tuple[float, JsonObject]], until_s: float, tolerance_s: float = 0.45
) -> tuple[list[WordLatency], float | None, int]:
    """Match token events ``(arrival peer-clock s, message)`` to truth words.

    First by text: the same word within ``tolerance_s`` of its truth start, after correcting the
    server clock lag (truth start − token start, median over a coarse first pass). Then by time:
    a token with other text that overlaps a still unmatched word's interval by at least half of
    the shorter one (a misheard word still shows when the spoken word was transcribed).

    Returns the per-word latencies, the estimated lag and how many distinct tokens matched no
    word (insertions).
    """
    occ = [w for _, w in truth_occurrences(truth, until_s)]
    toks = [(t, m) for t, m in tokens if isinstance(m.get("start"), (int, float))]
    half = max(truth.period_s / 2.0, 0.5)

    def nearest(text: str, start: float, lag: float, window: float) -> int | None:
        best, best_d = None, window
        for i, w in enumerate(occ):
            if w.text == text:
                d = abs(w.start - (start + lag))
                if d <= best_d:
                    best, best_d = i, d
        return best

    diffs = []
    for _, m in toks:
        i = nearest(normalise(str(m.get("text", ""))), float(m["start"]), 0.0, half)
        if i is not None:
            diffs.append(occ[i].start - float(m["start"]))
    lag = float(statistics.median(diffs)) if diffs else None
    first: dict[int, float] = {}
    final: dict[int, float] = {}
    tstart: dict[int, float] = {}
    by: dict[int, str] = {}
    leftover = []
    for t, m in toks:
        i = nearest(normalise(str(m.get("text", ""))), float(m["start"]), lag or 0.0, tolerance_s)
        if i is None:
            leftover.append((t, m))
            continue
        _record(i, t, m, "text", first, final, tstart, by)
    # A misheard word ("round" for "brown") still stands for the spoken word: match it by time,
    # to a word no token matched by text, when their intervals overlap by half the shorter one.
    text_matched = set(by)
    unmatched: set[tuple[object, object, object]] = set()
    for t, m in leftover:
        s0, s1 = float(m["start"]) + (lag or 0.0), float(m.get("end", m["start"])) + (lag or 0.0)
        best, best_overlap = None, 0.0
        for i, w in enumerate(occ):
            if i in text_matched or t < w.start:  # nothing stands for a word before it began
                continue
            overlap = min(s1, w.end) - max(s0, w.start)
            if overlap > best_overlap and overlap >= 0.5 * min(s1 - s0, w.end - w.start):
                best, best_overlap = i, overlap
        if best is None:
            unmatched.add((m.get("utterance"), m.get("index"), m.get("start")))
        else:
            _record(best, t, m, "time", first, final, tstart, by)
    words = [
        WordLatency(w.text, w.start, w.end, tstart.get(i), first.get(i), final.get(i), by.get(i, ""))
        for i, w in enumerate(occ)
    ]
    return words, lag, len(unmatched)


def _record(i: int, t: float, m: JsonObject, how: str, first: dict[int, float], final: dict[int, float],
            tstart: dict[int, float], by: dict[int, str]) -> None:
    first[i] = min(first.get(i, math.inf), t)
    tstart.setdefault(i, float(m["start"]))
    by.setdefault(i, how)
    if m.get("final", True):
        final[i] = min(final.get(i, math.inf), t)


@dataclass(frozen=True)
class TurnFigures(Record):
    """Turn latency, ITL and jitter σ8 of the ``response`` words as one peer received them (ms)."""

    utterances: int
    turn_ms: list[float]
    turn_ms_p50: float | None
    turn_ms_p99: float | None
    itl_ms_p50: float | None
    itl_ms_max: float | None
    jitter_ms_max: float | None
    jitter_ms_p50: float | None


def turn_latency_and_itl(
    truth: ClipTruth, responses: Sequence[tuple[float, JsonObject]], until_s: float
) -> TurnFigures:
    """Turn latency as the client sees it (truth utterance end → first ``response`` word arriving),
    ITL and jitter σ8 at the receiving peer. Not LST TTFT (the server's request → first content,
    ``lst_ttft_ms``): this wait holds the turn decision, the ASR and the turn-hold (docs/LST.md).

    Response words are grouped by their ``utterance``; a group's turn latency counts from the
    latest truth utterance end before its first word.
    """
    ends = [r * truth.period_s + truth.utterance_end for r in range(int(until_s // truth.period_s) + 1)]
    groups: dict[object, list[float]] = {}
    for t, m in responses:
        groups.setdefault(m.get("utterance"), []).append(t)
    ttft, itl, sigmas = [], [], []
    for arrivals in groups.values():
        arrivals.sort()
        before = [e for e in ends if e <= arrivals[0] + 0.2]
        if before:
            ttft.append(arrivals[0] - before[-1])
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
        itl.extend(gaps)
        sigmas.extend(sigma_windows(gaps))
    return TurnFigures(
        utterances=len(groups),
        turn_ms=[round(x * 1000, 1) for x in ttft],
        turn_ms_p50=to_ms(quantile(ttft, 0.5)),
        turn_ms_p99=to_ms(quantile(ttft, 0.99)),
        itl_ms_p50=to_ms(quantile(itl, 0.5)),
        itl_ms_max=to_ms(max(itl) if itl else None),
        jitter_ms_max=to_ms(max(sigmas) if sigmas else None),
        jitter_ms_p50=to_ms(quantile(sigmas, 0.5)),
    )


@dataclass(frozen=True)
class FailedCheck(Record):
    """One failed ``sync`` event and ``why`` (see :func:`failed_check`); the rest as the event carried it."""

    why: str
    token: str | None
    audio: float | None
    text: float | None
    max_delta_ms: float | None
    audio_error_ms: float | None
    evidence: str | None


@dataclass(frozen=True)
class Level3Figures(Record):
    """Level-3 at one peer, from its ``sync`` events (see :func:`level3`)."""

    checks: int
    ok: int
    pass_rate: float | None
    max_delta_ms_p50: float | None
    max_delta_ms_p95: float | None
    video_minus_audio_ms_p50: float | None
    evidence_checks: int
    evidence: dict[str, int]
    # The validator's own offset policy: the evidence put the video more than 40 ms off the audio.
    flagged: bool
    # Words after silence checked against their acoustic onset (audio time vs the audio itself).
    onset_checks: int
    onset_failed: int
    onset_error_ms_p50: float | None
    # Why checks failed, so a report can tell a late caption from a misplaced word.
    failed: list[FailedCheck]


def level3(syncs: Sequence[JsonObject]) -> Level3Figures:
    """Level-3 figures from ``sync`` events: pass rate, deltas, the A/V offset the server saw.

    ``flagged``: the median evidence-based offset exceeds ``alignment.sync.FLAG_THRESHOLD_MS``.
    """
    n = len(syncs)
    ok = sum(bool(s.get("ok")) for s in syncs)
    deltas = [float(s["max_delta_ms"]) for s in syncs if isinstance(s.get("max_delta_ms"), (int, float))]
    # video − audio is the evidence-based A/V offset the validator applied (alignment.sync); checks
    # resting only on assigned pts restate the pipeline and prove nothing, so they do not count.
    av = [
        (float(s["video"]) - float(s["audio"])) * 1000.0
        for s in syncs
        if isinstance(s.get("video"), (int, float)) and isinstance(s.get("audio"), (int, float))
        and s.get("evidence", "assigned") != "assigned"
    ]
    offset = quantile(av, 0.5)
    onset_checked = [s for s in syncs if isinstance(s.get("audio_error_ms"), (int, float))]
    onset_err = [float(s["audio_error_ms"]) for s in onset_checked]
    evidence: dict[str, int] = {}
    for s in syncs:
        key = str(s.get("evidence", "assigned"))
        evidence[key] = evidence.get(key, 0) + 1
    return Level3Figures(
        checks=n,
        ok=ok,
        pass_rate=round(ok / n, 4) if n else None,
        max_delta_ms_p50=round_or_none(quantile(deltas, 0.5), 2),
        max_delta_ms_p95=round_or_none(quantile(deltas, 0.95), 2),
        video_minus_audio_ms_p50=round_or_none(offset, 2),
        evidence_checks=len(av),
        evidence=evidence,
        flagged=offset is not None and abs(offset) > FLAG_THRESHOLD_MS,
        onset_checks=len(onset_err),
        onset_failed=sum(not bool(s.get("ok")) for s in onset_checked),
        onset_error_ms_p50=round_or_none(quantile(onset_err, 0.5), 2),
        failed=[failed_check(s) for s in syncs if not s.get("ok")][:FAILED_KEPT],
    )


#: How many failed checks a peer's report keeps (its first ones).
FAILED_KEPT = 20


def failed_check(sync: JsonObject) -> FailedCheck:
    """One failed ``sync`` event, with ``why``: ``no_frame`` (no frame carried the word), ``late`` (its
    caption's first frame came over the tolerance after the word: the final came after the word's own
    frames were sent), ``onset`` (the word's time is off its acoustic onset), else ``delta`` (the
    evidence put the video over the tolerance off the audio)."""
    audio, text, delta = sync.get("audio"), sync.get("text"), sync.get("max_delta_ms")
    if not isinstance(text, (int, float)):
        why = "no_frame"
    elif isinstance(audio, (int, float)) and (text - audio) * 1000.0 > TOLERANCE_MS:
        why = "late"
    elif isinstance(delta, (int, float)) and delta <= TOLERANCE_MS:
        why = "onset"
    else:
        why = "delta"
    return FailedCheck(why, sync.get("token"), audio, text, delta, sync.get("audio_error_ms"), sync.get("evidence"))


def flash_lags(
    truth: ClipTruth, flashes: Sequence[float], until_s: float, window_s: float = 3.0
) -> list[float]:
    """For each sent click (peer clock), how long until a flash was seen in the returned video (s).

    A clean stream's lag is the server's output delay plus transport; an injected offset adds to it.
    """
    out = []
    seen = sorted(flashes)
    reps = int(until_s // truth.period_s) + 1 if truth.period_s > 0 else 1
    j = 0
    for r in range(reps):
        for m in truth.markers:
            click = r * truth.period_s + m
            if click + window_s > until_s:
                continue
            while j < len(seen) and seen[j] < click:
                j += 1
            if j < len(seen) and seen[j] - click <= window_s:
                out.append(seen[j] - click)
                j += 1
    return out


@dataclass(frozen=True)
class LatencySummary(Record):
    """Word→token latency at one peer (ms), first and final token, and recall (see :func:`summarise_latencies`)."""

    words: int
    matched: int
    recall: float | None
    recall_text: float | None
    latency_ms_p50: float | None
    latency_ms_p95: float | None
    latency_ms_max: float | None
    final_latency_ms_p50: float | None
    final_latency_ms_p95: float | None


def summarise_latencies(words: Sequence[WordLatency], settle_s: float = 0.0) -> LatencySummary:
    """p50/p95/max of word→token latency (first and final), recall; words before ``settle_s`` skipped."""
    ws = [w for w in words if w.start >= settle_s]
    first = [w.latency_s for w in ws if w.latency_s is not None]
    by_text = sum(w.matched_by == "text" for w in ws)
    final = [w.final_latency_s for w in ws if w.final_latency_s is not None]
    return LatencySummary(
        words=len(ws),
        matched=len(first),
        recall=round(len(first) / len(ws), 4) if ws else None,
        recall_text=round(by_text / len(ws), 4) if ws else None,
        latency_ms_p50=to_ms(quantile(first, 0.5)),
        latency_ms_p95=to_ms(quantile(first, 0.95)),
        latency_ms_max=to_ms(max(first) if first else None),
        final_latency_ms_p50=to_ms(quantile(final, 0.5)),
        final_latency_ms_p95=to_ms(quantile(final, 0.95)),
    )


@dataclass(frozen=True)
class AnswerStats(Record):
    """Spoken-answer figures pooled over the answers one peer (or a round) decoded (ms)."""

    answers: int
    voice_to_voice_ms: list[float]
    voice_to_voice_ms_p50: float | None
    voice_to_voice_ms_p95: float | None
    barge_ins: int
    stop_ms: list[float]
    stop_ms_p50: float | None
    stop_ms_p99: float | None
    false_interruptions: int
    false_interruption_rate: float | None
    lip_sync_ms: list[float]
    lip_sync_ms_p50: float | None
    lip_sync_abs_ms_p95: float | None


def answer_stats(per_answer: Sequence[Mapping[str, object]]) -> AnswerStats:
    """Pooled figures over answers measured at a peer (``app.loadtest.voicepeer.answer_figures``)."""
    v2v = [float(x) for f in per_answer if isinstance(x := f.get("voice_to_voice_ms"), (int, float))]
    stops = [float(x) for f in per_answer if isinstance(x := f.get("stop_ms"), (int, float))]
    lips = [float(x) for f in per_answer if isinstance(x := f.get("lip_sync_ms"), (int, float))]
    n = len(per_answer)
    false = sum(bool(f.get("false_interruption")) for f in per_answer)
    return AnswerStats(
        answers=n,
        voice_to_voice_ms=v2v,
        voice_to_voice_ms_p50=round_or_none(quantile(v2v, 0.5), 1),
        voice_to_voice_ms_p95=round_or_none(quantile(v2v, 0.95), 1),
        barge_ins=sum(bool(f.get("barge_in")) for f in per_answer),
        stop_ms=stops,
        stop_ms_p50=round_or_none(quantile(stops, 0.5), 1),
        stop_ms_p99=round_or_none(quantile(stops, 0.99), 1),
        false_interruptions=false,
        false_interruption_rate=round(false / n, 4) if n else None,
        lip_sync_ms=lips,
        lip_sync_ms_p50=round_or_none(quantile(lips, 0.5), 1),
        lip_sync_abs_ms_p95=round_or_none(quantile([abs(x) for x in lips], 0.95), 1),
    )
