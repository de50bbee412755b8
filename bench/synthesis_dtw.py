"""Spectral features and a causal DTW for aligning real speech to a synthetic reference (benches only).

Kept apart from :mod:`alignment.timing` so the signal processing (numpy only) can be tested and
reused without the synthesiser. Rows of every matrix here are frames of the *real* audio and the
recurrence only looks backwards in time, so the alignment at audio frame ``t`` never depends on
audio after ``t``: that is what makes the streaming look-ahead bound hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from alignment.blas import single_threaded_blas
from alignment.types import SAMPLE_RATE

HOP = 160  # samples: 10 ms frames
WIN = 400  # samples: 25 ms analysis window
N_FFT = 512
N_MELS = 40
N_CEPS = 13

# DTW step choices stored for backtracking, in tie-break order: among equally good paths prefer
# diagonal steps, so a path leaves silence as late as possible (a word onset inside a silent
# stretch of the reference, as espeak's are, then lands just before the real speech, not at the
# start of the pause).
_STEP, _SKIP, _STAY, _START = 0, 1, 2, 3
_ADVANCE = (1, 2, 0)


@lru_cache(maxsize=2)
def _mel_filterbank(n_mels: int = N_MELS, n_fft: int = N_FFT, fmin: float = 60.0, fmax: float = 7600.0
                    ) -> np.ndarray:
    """Triangular mel filters (n_mels, n_fft // 2 + 1)."""

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    mels = np.linspace(hz_to_mel(np.array(fmin)), hz_to_mel(np.array(fmax)), n_mels + 2)
    bins = mel_to_hz(mels) / SAMPLE_RATE * n_fft
    k = np.arange(n_fft // 2 + 1)[None, :]
    lo, mid, hi = bins[:-2, None], bins[1:-1, None], bins[2:, None]
    up = (k - lo) / np.maximum(mid - lo, 1e-9)
    down = (hi - k) / np.maximum(hi - mid, 1e-9)
    return np.clip(np.minimum(up, down), 0.0, None).astype(np.float64)


@lru_cache(maxsize=2)
def _dct_matrix(n_in: int = N_MELS, n_out: int = N_CEPS) -> np.ndarray:
    """Orthonormal DCT-II rows (n_out, n_in): log-mel -> cepstrum."""
    n = np.arange(n_in)
    m = np.cos(np.pi / n_in * (n[None, :] + 0.5) * np.arange(n_out)[:, None]) * np.sqrt(2.0 / n_in)
    m[0] /= np.sqrt(2.0)
    return m


def mel_power(samples: np.ndarray) -> np.ndarray:
    """Mel-band power per frame (n_frames, N_MELS); frame j covers samples [j*HOP, j*HOP + WIN)."""
    single_threaded_blas()
    x = np.asarray(samples, dtype=np.float64)
    if len(x) < WIN:
        return np.zeros((0, N_MELS))
    n = 1 + (len(x) - WIN) // HOP
    idx = np.arange(WIN)[None, :] + HOP * np.arange(n)[:, None]
    frames = x[idx] * np.hanning(WIN)[None, :]
    spec = np.abs(np.fft.rfft(frames, N_FFT, axis=1)) ** 2
    return spec @ _mel_filterbank().T


def noise_floor(power: np.ndarray, share: float = 0.2) -> np.ndarray:
    """Per-band stationary noise power: the mean over the quietest ``share`` of frames.

    A mean (not a low quantile) so the floor added to the reference has the level the real
    noise has on average in those frames.
    """
    if len(power) == 0:
        return np.zeros(N_MELS)
    energy = power.sum(axis=1)
    quiet = energy <= np.quantile(energy, share)
    return power[quiet].mean(axis=0)


def cepstra(power: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """MFCCs of ``power + floor`` (n_frames, N_CEPS)."""
    return np.log(power + floor[None, :]) @ _dct_matrix().T


@dataclass(frozen=True)
class MatchedFeatures:
    """Comparable (same level, same noise floor, same normalisation) features of real and reference audio."""

    real: np.ndarray
    ref: np.ndarray


def matched_features(p_real: np.ndarray, p_ref: np.ndarray) -> MatchedFeatures:
    """MFCCs of real and reference mel power after giving both the same level and noise floor.

    The synthetic reference is noiseless; adding the real recording's noise floor (at the real
    level) to it makes the two spectra comparable in noise instead of comparing speech with hiss.
    Every statistic comes from ``p_real`` as given, so a prefix of the audio yields features that
    depend on that prefix only.
    """
    if len(p_real) == 0 or len(p_ref) == 0:
        return MatchedFeatures(np.zeros((len(p_real), N_CEPS)), np.zeros((len(p_ref), N_CEPS)))
    e_real, e_ref = p_real.sum(axis=1), p_ref.sum(axis=1)
    gain = np.quantile(e_real, 0.9) / max(np.quantile(e_ref, 0.9), 1e-20)
    eps = 1e-6 * max(float(np.quantile(e_real, 0.9)), 1e-20) / N_MELS
    floor = noise_floor(p_real) + eps
    a, b = cepstra(p_real, floor), cepstra(p_ref * gain, floor)
    # One normalisation for both (pooled statistics), so equal spectra stay equal features.
    both = np.concatenate([a, b])
    mu, sd = both.mean(axis=0, keepdims=True), both.std(axis=0, keepdims=True) + 1e-6
    return MatchedFeatures((a - mu) / sd, (b - mu) / sd)


def distance_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean frame distances (len(a), len(b)).

    scipy's cdist, not a BLAS matmul: on a loaded 2-core machine a threaded BLAS call for these
    small matrices was ~8x slower.
    """
    from scipy.spatial.distance import cdist

    return cdist(a, b)


@dataclass(frozen=True)
class Alignment:
    """A monotone path: for each real frame from ``start_frame`` to ``end_frame``, its reference frame."""

    start_frame: int
    ref_index: np.ndarray  # ref_index[k] = reference frame matched to real frame start_frame + k

    @property
    def end_frame(self) -> int:
        return self.start_frame + len(self.ref_index) - 1

    def real_frame_of(self, ref_frame: float) -> float | None:
        """Fractional real frame where the path first reaches ``ref_frame`` (None if it never does)."""
        r = self.ref_index
        hits = np.nonzero(r >= ref_frame)[0]
        if len(hits) == 0:
            return None
        k = int(hits[0])
        if k == 0:
            return float(self.start_frame)
        prev = r[k - 1]
        frac = (ref_frame - prev) / max(r[k] - prev, 1)
        return self.start_frame + k - 1 + float(np.clip(frac, 0.0, 1.0))

    def frame_of_or_after(self, ref_frame: float) -> float:
        """Like :meth:`real_frame_of`, but if the path ends before ``ref_frame`` (the word has not
        started within the evidence), the frame where the evidence ends: the earliest time that
        agrees with it. (Extrapolating at the reference's pace is worse: where a path rests
        inside a silence is arbitrary.)"""
        f = self.real_frame_of(ref_frame)
        return f if f is not None else self.end_frame + WIN / HOP


def causal_dtw(
    costs: list[np.ndarray],
    fillers: np.ndarray,
    stay_penalties: np.ndarray,
    start_limit: int,
    pause_cols: np.ndarray | None = None,
    pause_costs: list[np.ndarray] | None = None,
) -> list[Alignment]:
    """Open-end asymmetric DTW for several problems against one reference, in one pass.

    ``costs[k]`` is (T_k, R): real frames x reference frames. Each real frame advances the
    reference by 1, 2 or 0 frames (holding costs ``stay_penalties[k]`` extra), so every path to
    real frame ``t`` has the same number of cells and paths ending at the same frame compare
    fairly: problem k's path is the best one ending at its last real frame, anywhere in the
    reference. Real frames before the path starts cost ``fillers[k]`` each, allowed only before
    ``start_limit`` (an unlimited open start lets a poorly matching voice skip most of the audio).
    Optional pauses: at reference frames ``pause_cols`` (between words) the path may also hold
    while real frame ``t`` costs ``pause_costs[k][t]`` (its distance to silence) and no holding
    penalty, so a pause the reference lacks is absorbed where it belongs, between two words.
    Row ``t`` depends on real frames ``<= t`` only. Batched because each streaming word is its
    own problem (its own audio prefix) and per-row numpy overhead dominates.
    """
    k_n = len(costs)
    if k_n == 0:
        return []
    r_n = costs[0].shape[1]
    lengths = np.array([c.shape[0] for c in costs])
    t_n = int(lengths.max())
    cost = np.zeros((k_n, t_n, r_n))
    for k, c in enumerate(costs):
        cost[k, : len(c)] = c
    back = np.empty((k_n, t_n, r_n), dtype=np.int8)
    use_pause = pause_cols is not None and pause_costs is not None and len(pause_cols) > 0
    if use_pause:
        pause = np.full((k_n, t_n), np.inf)
        for k, pc in enumerate(pause_costs):
            pause[k, : len(pc)] = pc
    last_rows = np.empty((k_n, r_n))
    inf = np.inf
    prev = np.full((k_n, r_n), inf)
    pad1, pad2 = np.full((k_n, 1), inf), np.full((k_n, 2), inf)
    stay_pen = np.asarray(stay_penalties, dtype=float)[:, None]
    fillers = np.asarray(fillers, dtype=float)
    for t in range(t_n):
        step = np.concatenate([pad1, prev[:, :-1]], axis=1)
        skip = np.concatenate([pad2, prev[:, :-2]], axis=1)[:, :r_n]
        stay = prev + stay_pen
        best = np.minimum(np.minimum(step, skip), stay)
        choice = np.where(step <= best, _STEP, np.where(skip <= best, _SKIP, _STAY)).astype(np.int8)
        if t < start_limit:
            start = fillers * t  # real frames 0..t-1 spent outside the path
            use = start < best[:, 0]
            best[use, 0] = start[use]
            choice[use, 0] = _START
        row = cost[:, t] + best
        if use_pause:
            held = prev[:, pause_cols] + pause[:, t, None]
            better = held < row[:, pause_cols]
            row[:, pause_cols] = np.where(better, held, row[:, pause_cols])
            choice[:, pause_cols] = np.where(better, _STAY, choice[:, pause_cols])
        back[:, t] = choice
        ends = lengths - 1 == t
        last_rows[ends] = row[ends]
        prev = row
    return [_backtrack(back[k], int(lengths[k]) - 1, int(np.argmin(last_rows[k]))) for k in range(k_n)]


def _backtrack(back: np.ndarray, t: int, r: int) -> Alignment:
    refs = []
    while True:
        refs.append(r)
        c = int(back[t, r])
        if c == _START or t == 0:
            break
        r -= _ADVANCE[c]
        t -= 1
    return Alignment(start_frame=t, ref_index=np.asarray(refs[::-1], dtype=np.int64))
