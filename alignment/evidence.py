"""Independent evidence of the audio/video offset: sync markers and lip motion vs speech.

The pipeline's own pts prove nothing about whether picture and sound agree, so this measures how late
the visual content is relative to the audio content (``offset_s`` > 0: video late) from the media.

* Markers (``source="markers"``, as :mod:`app.loadtest.testmedia` makes them): a 10 ms 1 kHz click
  (found to the sample by :mod:`alignment.clicks`) and a corner patch lit for one frame period. A
  frame integrates light over its cell, so the brightness-weighted centroid of the lit frames gives
  the onset to a fraction of a millisecond, not ±T/2. Each flash pairs with the nearest click.
* Lips (``source="lips"``): mouth openness per frame (from a face tracker, never the audio) against
  the speech envelope at each candidate lag in ±300 ms; the Pearson peak (parabola-refined) is the
  offset, its height the confidence; None when weak, static, faceless or with too little speech.

:class:`AVOffsetEstimator` works on a bounded window; :func:`estimate_offset` runs once over a recording.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alignment.clicks import ClickStream
from alignment.types import SAMPLE_RATE, AudioChunk, VideoFrame

FLASH_PATCH_FRACTION = 1 / 8  # of the frame height
FLASH_PATCH_MIN_PX = 16

_FLASH_STEP = 0.05  # brightness rise (of full scale) that starts a flash
_FLASH_MAX_FRAMES = 4  # a longer bright run is scene content, not a marker
_FLASH_SUM_RANGE = (0.7, 1.3)  # a one-period pulse lights one frame period in total


# --- records -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VisualObservation:
    """What the estimator needs from one camera frame: mouth openness (None: no face) and flash score."""

    pts: float
    mouth_open: float | None = None
    flash: float | None = None


@dataclass(frozen=True)
class LipEstimate:
    """Offset from lip motion vs speech envelope, with the peak correlation as confidence."""

    offset_s: float
    confidence: float
    n_frames: int


@dataclass(frozen=True)
class OffsetEstimate:
    """How late the visual content is relative to the audio (s), and what says so.

    ``source`` is ``"markers"``, ``"lips"`` or None (no evidence: ``offset_s`` is None too).
    """

    pts: float
    offset_s: float | None
    source: str | None
    confidence: float
    n_markers: int = 0


# --- sync markers: video -------------------------------------------------------------------------

def flash_patch_side(height: int) -> int:
    """Side (px) of the square marker patch in the top-left corner of a frame ``height`` px tall."""
    return max(int(height * FLASH_PATCH_FRACTION), FLASH_PATCH_MIN_PX)


def flash_score(image: np.ndarray) -> float:
    """Brightness of the marker patch in [0, 1] (its inner half, away from codec-blurred edges)."""
    side = flash_patch_side(image.shape[0])
    q = side // 4
    patch = image[q : side - q, q : side - q]
    if patch.ndim == 3:
        luma = patch[..., :3].astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    else:
        luma = patch.astype(np.float64)
    return float(np.mean(luma) / 255.0)


class _FlashStream:
    """Flash onsets from per-frame patch brightness, one frame at a time."""

    def __init__(self, history: int = 16) -> None:
        self._recent: deque[tuple[float, float]] = deque(maxlen=history)  # baseline frames
        self._run: list[tuple[float, float]] = []
        self._periods: deque[float] = deque(maxlen=history)
        self._last_pts: float | None = None

    def _baseline(self) -> float | None:
        if not self._recent:
            return None  # a flash needs at least one unlit frame before it
        return float(np.median([s for _, s in self._recent]))

    def push(self, pts: float, score: float) -> float | None:
        if self._last_pts is not None and pts > self._last_pts:
            self._periods.append(pts - self._last_pts)
        self._last_pts = pts
        base = self._baseline()
        if base is None:
            self._recent.append((pts, score))
            return None
        if not self._run:
            if score - base > _FLASH_STEP:
                self._run = [self._recent[-1], (pts, score)]  # with the frame before, as a neighbour
            else:
                self._recent.append((pts, score))
            return None
        self._run.append((pts, score))
        if score - base > _FLASH_STEP:
            if len(self._run) > _FLASH_MAX_FRAMES + 2:
                self._run = []  # lasting brightness: scene content, not a marker; a new baseline
                self._recent.clear()
                self._recent.append((pts, score))
            return None
        run, self._run = self._run, []
        self._recent.append((pts, score))
        return self._onset(run, base)

    def _onset(self, run: list[tuple[float, float]], base: float) -> float | None:
        period = float(np.median(self._periods)) if self._periods else None
        if period is None or base >= 0.9:
            return None
        pts = np.array([p for p, _ in run])
        w = np.clip((np.array([s for _, s in run]) - base) / (1.0 - base), 0.0, None)
        total = float(w.sum())
        if not _FLASH_SUM_RANGE[0] <= total <= _FLASH_SUM_RANGE[1]:
            return None
        if np.any(np.diff(pts) > 1.5 * period):
            return None  # a dropped frame inside the flash: the phase is lost
        centre = float(np.dot(w, pts) / total)
        return centre - period / 2


def detect_flashes(pts: Sequence[float], scores: Sequence[float]) -> list[float]:
    """Onsets (s) of marker flashes in a series of per-frame :func:`flash_score` values."""
    stream = _FlashStream()
    out = []
    for p, s in zip(pts, scores, strict=True):
        onset = stream.push(float(p), float(s))
        if onset is not None:
            out.append(onset)
    return out


# --- lip evidence --------------------------------------------------------------------------------

def _envelope_grid(samples: np.ndarray, step_s: float = 0.001, window_s: float = 0.04) -> np.ndarray:
    """Speech RMS over a centred window, every ``step_s`` from sample 0."""
    x = np.asarray(samples, np.float64)
    csum = np.concatenate([[0.0], np.cumsum(x * x)])
    centres = np.arange(0, len(x), int(round(step_s * SAMPLE_RATE)))
    half = int(window_s * SAMPLE_RATE / 2)
    lo = np.clip(centres - half, 0, len(x))
    hi = np.clip(centres + half, 0, len(x))
    return np.sqrt(np.maximum(csum[hi] - csum[lo], 0.0) / np.maximum(hi - lo, 1))


def lip_offset(
    mouth_pts: Sequence[float],
    mouth_open: Sequence[float | None],
    samples: np.ndarray,
    audio_t0: float,
    max_lag_s: float = 0.3,
    lag_step_s: float = 0.005,
    min_confidence: float = 0.5,
    min_frames: int = 25,
) -> LipEstimate | None:
    """Offset (video late, s) from mouth openness vs speech envelope; None when the evidence is weak."""
    pts = np.asarray(mouth_pts, np.float64)
    m = np.array([np.nan if v is None else float(v) for v in mouth_open], np.float64)
    keep = np.isfinite(m)
    pts, m = pts[keep], m[keep]
    if len(m) < min_frames or float(np.std(m)) < 1e-3:
        return None  # no face, or a face that does not move
    step = 0.001
    env = _envelope_grid(samples, step)
    if env.size == 0 or float(np.max(env)) < 1e-3:
        return None  # silence
    active = env > 0.1 * float(np.max(env))
    lags = np.arange(-max_lag_s, max_lag_s + lag_step_s / 2, lag_step_s)
    idx = np.rint((pts[None, :] - lags[:, None] - audio_t0) / step).astype(int)  # (lags, frames)
    inside = (idx >= 0) & (idx < len(env))
    e = np.where(inside, env[np.clip(idx, 0, len(env) - 1)], 0.0)
    mm = np.where(inside, m[None, :], 0.0)
    count = inside.sum(axis=1)
    speech_frames = (inside & active[np.clip(idx, 0, len(env) - 1)]).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        n = np.maximum(count, 1)
        e_mean, m_mean = e.sum(axis=1) / n, mm.sum(axis=1) / n
        cov = (e * mm).sum(axis=1) / n - e_mean * m_mean
        var_e = (e * e).sum(axis=1) / n - e_mean**2
        var_m = (mm * mm).sum(axis=1) / n - m_mean**2
        r = cov / np.sqrt(var_e * var_m)
    r[(count < min_frames) | (var_e < 1e-12) | (var_m < 1e-12)] = np.nan
    if np.all(np.isnan(r)):
        return None
    best = int(np.nanargmax(r))
    peak = float(r[best])
    if speech_frames[best] < min_frames // 2 or peak < min_confidence:
        return None
    if best in (0, len(lags) - 1):
        return None  # the best lag is at the search edge: the true one may lie outside
    a, c = r[best - 1], r[best + 1]
    frac = 0.0
    if np.isfinite(a) and np.isfinite(c) and (a - 2 * peak + c) < 0:
        frac = float(np.clip(0.5 * (a - c) / (a - 2 * peak + c), -0.5, 0.5))
    return LipEstimate(float(lags[best] + frac * lag_step_s), peak, len(m))


# --- streaming estimator -------------------------------------------------------------------------

class _AudioRing:
    """The last ``capacity`` samples of a contiguous audio stream (gaps are filled with silence)."""

    def __init__(self, capacity: int) -> None:
        self._buf = np.zeros(capacity, np.float32)
        self._n = 0  # samples written in total
        self._t0: float | None = None  # pts of sample 0 of the stream

    @property
    def capacity(self) -> int:
        return len(self._buf)

    def append(self, pts: float, samples: np.ndarray) -> None:
        x = np.asarray(samples, np.float32).reshape(-1)
        if self._t0 is None:
            self._t0 = pts
        expected = int(round((pts - self._t0) * SAMPLE_RATE))
        if expected > self._n:  # a gap: silence, at most one buffer of it
            self._write(np.zeros(min(expected - self._n, len(self._buf)), np.float32))
            self._n = expected
        elif expected < self._n:  # overlap: drop what was already written
            x = x[self._n - expected :]
        self._write(x)

    def _write(self, x: np.ndarray) -> None:
        cap = len(self._buf)
        if len(x) >= cap:
            self._buf[:] = x[-cap:]
            self._n += len(x)
            self._buf = np.roll(self._buf, self._n % cap)
            return
        start = self._n % cap
        first = min(cap - start, len(x))
        self._buf[start : start + first] = x[:first]
        self._buf[: len(x) - first] = x[first:]
        self._n += len(x)

    def view(self) -> tuple[float, np.ndarray]:
        """(pts of the first sample held, the samples held in order) — a copy."""
        if self._t0 is None:
            return 0.0, np.zeros(0, np.float32)
        cap = len(self._buf)
        held = min(self._n, cap)
        start = self._n - held
        out = np.roll(self._buf, -(start % cap))[:held] if self._n > cap else self._buf[:held].copy()
        return self._t0 + start / SAMPLE_RATE, out


class AVOffsetEstimator:
    """A/V offset from markers (preferred) or lips, fed incrementally; memory bounded by ``window_s``.

    Feed :meth:`push_audio` with the session's audio chunks and :meth:`push_visual` with one
    :class:`VisualObservation` per camera frame (in pts order); :meth:`estimate` gives the
    current verdict. Marker pairs older than ``window_s`` stop counting, so a stream whose sync
    drifts is judged on recent evidence.
    """

    def __init__(
        self,
        window_s: float = 10.0,
        max_lag_s: float = 0.3,
        max_pair_s: float = 0.5,
        lip_min_confidence: float = 0.5,
        max_frames: int | None = None,
        lip_refresh_s: float = 1.0,
    ) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self.max_lag_s = max_lag_s
        self.max_pair_s = max_pair_s
        self.lip_min_confidence = lip_min_confidence
        self._audio = _AudioRing(int(round((window_s + max_lag_s) * SAMPLE_RATE)))
        self._clicks = ClickStream()
        self._flashes = _FlashStream()
        self._frames: deque[VisualObservation] = deque(maxlen=max_frames or int(window_s * 60))
        self._open_clicks: deque[float] = deque(maxlen=16)
        self._open_flashes: deque[float] = deque(maxlen=16)
        self._pairs: deque[tuple[float, float]] = deque(maxlen=32)  # (click pts, offset)
        self._latest = 0.0
        self.lip_refresh_s = lip_refresh_s
        self._lip_cache: tuple[int, LipEstimate | None] | None = None
        self._lip_at = -math.inf
        self._version = 0

    # feeding

    def push_audio(self, chunk: AudioChunk) -> None:
        """Add a chunk of 16 kHz mono audio presented at ``chunk.pts``."""
        self._audio.append(chunk.pts, chunk.samples)
        self._latest = max(self._latest, chunk.end)
        self._open_clicks.extend(self._clicks.push(chunk.pts, chunk.samples))
        self._pair()
        self._version += 1

    def acoustic_onset(self, near: float, previous: float | None = None) -> float | None:
        """The onset of speech after silence nearest ``near`` in the audio held
        (:func:`alignment.onsets.onset_after_silence`); None without such evidence."""
        from alignment.onsets import onset_after_silence

        t0, samples = self._audio.view()
        return onset_after_silence(samples, t0, near, previous)

    def push_visual(self, obs: VisualObservation) -> None:
        """Add one camera frame's observation."""
        self._frames.append(obs)
        self._latest = max(self._latest, obs.pts)
        while self._frames and self._frames[0].pts < self._latest - self.window_s:
            self._frames.popleft()
        if obs.flash is not None:
            onset = self._flashes.push(obs.pts, obs.flash)
            if onset is not None:
                self._open_flashes.append(onset)
                self._pair()
        self._version += 1

    def push_frame(self, frame: VideoFrame, mouth_open: float | None = None) -> None:
        """Convenience: score the marker patch of ``frame`` and push it with its mouth openness."""
        self.push_visual(VisualObservation(frame.pts, mouth_open, flash_score(frame.image)))

    def _pair(self) -> None:
        while self._open_flashes and self._open_clicks:
            f = self._open_flashes[0]
            near = [c for c in self._open_clicks if abs(f - c) <= self.max_pair_s]
            if near:
                c = min(near, key=lambda c: abs(f - c))
                self._open_clicks.remove(c)
                self._pairs.append((c, f - c))
                self._open_flashes.popleft()
            elif min(self._open_clicks) > f + self.max_pair_s or self._latest > f + 2 * self.max_pair_s:
                self._open_flashes.popleft()  # no click will come for this flash
            else:
                break
        while self._open_clicks and self._open_clicks[0] < self._latest - 2 * self.max_pair_s - 1.0:
            self._open_clicks.popleft()
        while self._pairs and self._pairs[0][0] < self._latest - self.window_s:
            self._pairs.popleft()

    # verdict

    def marker_offsets(self) -> list[float]:
        """Offsets of the marker pairs inside the window."""
        return [off for c, off in self._pairs if c >= self._latest - self.window_s]

    def lip_estimate(self) -> LipEstimate | None:
        """Lip-vs-speech offset over the window (~10 ms for 10 s of media, so recomputed at most once
        per ``lip_refresh_s`` of stream time; the cached verdict is returned in between)."""
        if self._lip_cache is not None and (
            self._lip_cache[0] == self._version or self._latest - self._lip_at < self.lip_refresh_s
        ):
            return self._lip_cache[1]
        self._lip_at = self._latest
        frames = [f for f in self._frames if f.pts >= self._latest - self.window_s]
        result = None
        if frames:
            t0, audio = self._audio.view()
            result = lip_offset(
                [f.pts for f in frames], [f.mouth_open for f in frames], audio, t0,
                max_lag_s=self.max_lag_s, min_confidence=self.lip_min_confidence,
            )
        self._lip_cache = (self._version, result)
        return result

    def estimate(self) -> OffsetEstimate:
        """The current offset: markers when any were paired in the window, else lips, else None."""
        offsets = self.marker_offsets()
        if offsets:
            med = float(np.median(offsets))
            spread = float(np.median(np.abs(np.array(offsets) - med)))
            confidence = 1.0 - min(spread / 0.02, 0.5)  # pairs that disagree lower it
            return OffsetEstimate(self._latest, med, "markers", confidence, len(offsets))
        lips = self.lip_estimate()
        if lips is not None:
            return OffsetEstimate(self._latest, lips.offset_s, "lips", lips.confidence)
        return OffsetEstimate(self._latest, None, None, 0.0)

    def memory_items(self) -> int:
        """Items held (audio samples + frames + markers): bounded whatever the stream length."""
        return (self._audio.capacity + len(self._frames) + len(self._pairs)
                + len(self._open_clicks) + len(self._open_flashes))


def estimate_offset(
    audio: np.ndarray,
    audio_pts: float,
    frames: Sequence[VideoFrame],
    mouth_open: Sequence[float | None] | None = None,
    chunk_s: float = 0.02,
) -> OffsetEstimate:
    """The A/V offset of a whole recording (offline): markers first, then lips, else None.

    ``mouth_open`` is one value per frame from a face tracker (None or NaN: no face).
    """
    if mouth_open is not None and len(mouth_open) != len(frames):
        raise ValueError(f"mouth_open has {len(mouth_open)} values for {len(frames)} frames")
    duration = len(audio) / SAMPLE_RATE
    video_span = (frames[-1].pts - frames[0].pts) if frames else 0.0
    est = AVOffsetEstimator(window_s=max(duration, video_span, 1.0) + 1.0, max_frames=len(frames) + 1)
    step = max(int(chunk_s * SAMPLE_RATE), 1)
    fi = 0
    for i in range(0, len(audio), step):
        t = audio_pts + i / SAMPLE_RATE
        while fi < len(frames) and frames[fi].pts <= t:
            est.push_frame(frames[fi], None if mouth_open is None else mouth_open[fi])
            fi += 1
        est.push_audio(AudioChunk(t, audio[i : i + step]))
    for j in range(fi, len(frames)):
        est.push_frame(frames[j], None if mouth_open is None else mouth_open[j])
    return est.estimate()
