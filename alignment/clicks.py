"""Sync-marker clicks in audio: the 1 kHz bursts of :mod:`alignment.evidence`'s marker spec.

A quadrature matched filter (sin and cos templates, so the codec's phase shifts do not matter):
the I/Q envelope is a triangle peaking exactly at the burst onset, located to the sample (1/16 ms);
a coherence gate (energy in the tone / energy in the window ≥ 0.8) rejects speech. Live sessions
run it on every 20 ms of audio, so audio that cannot hold a click is told apart cheaply first.
"""

from __future__ import annotations

import math

import numpy as np

from alignment.types import SAMPLE_RATE

CLICK_HZ = 1000.0
CLICK_S = 0.010
CLICK_AMPLITUDE = 0.5

_CLICK_N = int(round(CLICK_S * SAMPLE_RATE))
_MIN_CLICK_AMPLITUDE = 0.05
_MIN_CLICK_COHERENCE = 0.8


def _click_templates() -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(_CLICK_N) / SAMPLE_RATE
    return np.sin(2 * np.pi * CLICK_HZ * t), np.cos(2 * np.pi * CLICK_HZ * t)


_SIN, _COS = _click_templates()
_IQ = _COS + 1j * _SIN  # one complex template: |correlation| is the I/Q envelope


def _window_energy(x: np.ndarray) -> np.ndarray:
    """Sum of squares of each burst-long window (``len(x) - n + 1`` of them)."""
    n = _CLICK_N
    csum = np.concatenate([[0.0], np.cumsum(x.astype(np.float64) ** 2)])
    return np.maximum(csum[n:] - csum[:-n], 0.0)


#: Shorter audio goes through the direct correlation (and may skip it: :func:`_may_hold_click`).
_DIRECT_MAX = 16 * 1024
_ROTATION = np.exp(-2j * np.pi * CLICK_HZ * np.arange(_DIRECT_MAX) / SAMPLE_RATE)


def _sliding_envelope(x: np.ndarray) -> np.ndarray:
    """:func:`_click_scan`'s I/Q envelope, to rounding, as a sliding DFT bin: with z = e^(-iωj),
    |sum_k x[p+k] z^k| = |S[p+n] - S[p]| for S the running sum of x[j] z^j (a few array passes
    instead of one dot product per lag). ``len(x) < _DIRECT_MAX``."""
    s = np.zeros(len(x) + 1, np.complex128)
    np.cumsum(x * _ROTATION[: len(x)], out=s[1:])
    return np.abs(s[_CLICK_N:] - s[:-_CLICK_N])


def _quiet(energy: np.ndarray) -> bool:
    """No lag loud enough: |correlation with the unit-modulus template| <= sqrt(n * window energy)
    (Cauchy-Schwarz), so the amplitude is at most 2 * sqrt(energy / n)."""
    return 4.0 * float(energy.max()) / _CLICK_N < 0.99 * _MIN_CLICK_AMPLITUDE**2


def _click_candidates(x: np.ndarray, energy: np.ndarray) -> np.ndarray:
    """The lags that may pass both the amplitude and the coherence test (every lag of long audio).
    The running sums' rounding (≲ 2·len·eps·sum|x|) is covered many times over by the slack."""
    if len(x) >= _DIRECT_MAX:
        return np.arange(len(energy))
    env = _sliding_envelope(x) * (1.0 + 1e-6) + 1e-10 * float(np.abs(x).sum())
    loud = env >= _MIN_CLICK_AMPLITUDE * _CLICK_N / 2
    return np.flatnonzero(loud & (env >= _MIN_CLICK_COHERENCE * np.sqrt(energy * _CLICK_N / 2)))


def _may_hold_click(x: np.ndarray, energy: np.ndarray) -> bool:
    """False only when no lag passes both tests, as the peak of any reported click does."""
    return not _quiet(energy) and _click_candidates(x, energy).size > 0


def _click_scan(x: np.ndarray, energy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tone amplitude and coherence for a burst starting at each lag (``len(x) - n + 1`` lags)."""
    n = _CLICK_N
    if len(x) < _DIRECT_MAX:  # a streaming chunk: direct correlation beats FFT set-up
        iq = np.correlate(x, _IQ, mode="valid")
    else:
        from scipy.signal import oaconvolve

        iq = oaconvolve(x, np.conj(_IQ[::-1]), mode="valid")
    env = np.abs(iq)
    amplitude = env / (n / 2)
    coherence = env / np.maximum(np.sqrt(energy * n / 2), 1e-12)
    return amplitude, coherence


def detect_clicks(samples: np.ndarray, t0: float = 0.0) -> list[float]:
    """Onsets (s, on the clock where sample 0 is at ``t0``) of the 1 kHz marker bursts in ``samples``."""
    x = np.asarray(samples, dtype=np.float64).reshape(-1)
    n = _CLICK_N
    if len(x) < n:
        return []
    energy = _window_energy(x)
    # A peak that is reported passes both tests, so audio where no lag does (quiet audio, speech)
    # skips the full filter and the peak search; what is found is unchanged.
    if not _may_hold_click(x, energy):
        return []
    amplitude, coherence = _click_scan(x, energy)
    onsets: list[float] = []
    last = -(10**9)
    for p in np.flatnonzero(amplitude >= _MIN_CLICK_AMPLITUDE):
        if p <= last:
            continue
        lo, hi = max(p - n, 0), min(p + n, len(amplitude) - 1)
        peak = lo + int(np.argmax(amplitude[lo : hi + 1]))
        if amplitude[p] < amplitude[peak] and peak != p:
            continue  # not the local maximum: the scan reaches it later
        if coherence[peak] < _MIN_CLICK_COHERENCE:
            continue
        frac = 0.0
        if 0 < peak < len(amplitude) - 1:
            a, b, c = amplitude[peak - 1], amplitude[peak], amplitude[peak + 1]
            denom = a - 2 * b + c
            frac = float(np.clip(0.5 * (a - c) / denom, -0.5, 0.5)) if denom < 0 else 0.0
        onsets.append(t0 + (peak + frac) / SAMPLE_RATE)
        last = peak + n
    return onsets


class ClickStream:
    """Click detection over audio arriving in chunks, keeping only a few bursts' worth of samples.

    Each lag (burst start) is checked once, by :func:`_click_candidates`, when its window is complete;
    the full detector runs only while a lag that may start a click is held. The check covers only the
    lags that reach the new samples: for a 20 ms chunk under 500 samples, so numpy keeps the GIL
    (larger arrays hand it to other threads, and the event loop waits to get it back).
    """

    def __init__(self) -> None:
        self._tail = np.zeros(0, np.float64)
        self._t0 = 0.0
        self._last = -math.inf
        self._n0 = 0  # stream samples before self._tail[0], since the last restart
        self._hot = -1  # the last lag (stream sample) that may start a click; -1: none

    def push(self, t0: float, samples: np.ndarray) -> list[float]:
        if self._tail.size == 0 or abs(t0 - (self._t0 + len(self._tail) / SAMPLE_RATE)) > 1.5 / SAMPLE_RATE:
            self._tail, self._t0 = np.zeros(0, np.float64), t0  # first chunk or a gap: restart
            self._n0, self._hot = 0, -1
        old = len(self._tail)
        self._tail = np.concatenate([self._tail, np.asarray(samples, np.float64).reshape(-1)])
        n = _CLICK_N
        settled_end = self._t0 + (len(self._tail) - 2 * n) / SAMPLE_RATE
        found = []
        for onset in detect_clicks(self._tail, self._t0) if self._may_hold(old) else ():
            if onset < settled_end and onset > self._last + CLICK_S:
                found.append(onset)
                self._last = onset
        keep = min(len(self._tail), 3 * n)
        drop = len(self._tail) - keep
        self._t0 += drop / SAMPLE_RATE
        self._n0 += drop
        self._tail = self._tail[drop:]
        return found

    def _may_hold(self, old: int) -> bool:
        """Whether a lag held may start a click: one found earlier, or a new one (its window reaches
        past the ``old`` samples held before this chunk)."""
        first = max(old - _CLICK_N + 1, 0)
        x = self._tail[first:]
        if len(x) >= _CLICK_N:
            energy = _window_energy(x)
            lags = np.zeros(0, np.intp) if _quiet(energy) else _click_candidates(x, energy)
            if lags.size:
                self._hot = max(self._hot, self._n0 + first + int(lags[-1]))
        return self._hot >= self._n0
