"""Acoustic echo cancellation: remove the spoken answer's echo from the user's microphone.

The answer comes back delayed (network, playout, room), filtered, reverberant. Per mic block, numpy only:

1. Bulk delay: GCC-PHAT of the mic against the played audio (4 kHz, last second); two agreeing confident estimates.
2. Linear echo path: a partitioned-block frequency-domain NLMS filter around that delay; a background filter always
   adapts, and the foreground one (used) copies it when it cancels better (double talk).
3. Residual suppression per band: the echo left is the played band power times a learned coupling (at least
   ``min_coupling``); bands it explains go to a floor, louder ones (the user) pass.
4. Until a lock's filter has cancelled, the coupling is unknown, so the mic bounds it from above
   (:meth:`EchoCanceller._bound_coupling`): where nothing echoes (headphones, the browser's own canceller) the
   bound falls to the noise floor and the user passes whole under a loud answer. A lock is trusted only while its
   filter's output is no louder than the mic, and one never trusted is dropped (:attr:`EchoCanceller.trusted`).
When nothing was played recently ``process`` returns the chunk itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from alignment.types import SAMPLE_RATE, AudioChunk

_DECIM = 4  # delay estimation runs at 4 kHz


@dataclass(frozen=True)
class EchoConfig:
    """Tuning of the canceller; times in seconds."""

    max_delay_s: float = 0.5  # bulk delay searched (network + playout + room direct path)
    tail_s: float = 0.7  # echo still arrives this long after the delayed end of the played audio
    block: int = 320  # samples per adaptive-filter block (20 ms)
    partitions: int = 12  # filter length = partitions * block
    pre_delay_s: float = 0.02  # the filter starts this much before the estimated delay
    step: float = 1.0  # background NLMS step (normalized over the whole filter; stable below 2)
    bands: int = 24
    floor: float = 1e-4  # gain of bands explained by echo (-80 dB: at -60 dB Whisper still heard words)
    over: float = 4.0  # over-subtraction of the predicted residual echo
    coupling0: float = 2.0  # prior residual/played power ratio before anything is learned
    rt60_s: float = 0.8  # decay assumed for the predicted residual's reverberant tail
    delay_every_s: float = 0.5  # delay re-estimation period once locked (0.1 s before)
    delay_window_s: float = 1.0
    min_delay_s: float = 0.01  # a lag below this is a false peak (no real path is that short)
    spread_s: float = 0.1  # the delay may move this much either way (sender stalls, jitter buffer)
    trust_erle_db: float = 1.0  # the locked delay narrows the suppressor only once the filter cancels this much
    distrust_db: float = 3.0  # ... and stops narrowing it while the filter's output is this much louder than the mic
    #: a lock whose filter has not been trusted over this much played audio is dropped: no echo comes back at that
    #: delay, or not yet in a form the filter can cancel (live, with no echo in the session, a wrong lock left the
    #: coupling unbounded for good; on live echo traces a stale untrusted lock let echo through: BENCHMARKS.md)
    untrusted_s: float = 1.5
    #: this many consecutive estimates within coarse_tol_s make a coarse delay; 0 (off): in a clean live run of
    #: bench/voice.py it let the echo interrupt 7 % of answers (BENCHMARKS.md, spoken answers)
    coarse_votes: int = 0
    coarse_tol_s: float = 0.015
    coarse_conf: float = 4.0  # the least GCC-PHAT peak-to-spread ratio an estimate needs to vote
    coarse_min_s: float = 0.03  # no networked client's echo is earlier (a lag of one 20 ms frame is an artefact)
    coarse_coupling_floor: float = 0.5  # the coupling assumed at least while only a coarse delay is known
    #: the coupling assumed at least once the delay is trusted: what the filter leaves can jump far above what
    #: it was learned at (a filter re-converging after the echo path moved, or after double talk), and live
    #: that residual was heard as the user (bench/barge_in.py --trace; BENCHMARKS.md, spoken answers)
    min_coupling: float = 0.2
    cap_window_s: float = 0.25  # mic and played energy summed over this long bound the untrusted coupling
    #: within an answer the bound may rise this much a window (the user talking raises the mic energy; echo that
    #: begins with a new answer is bounded by that answer's first window)
    cap_rise: float = 1.5
    cap_min: float = 1e-5  # the bound never falls below this (so it can rise again)
    #: a later answer starts under the bound its predecessors left; the mic rising (its last 60 ms this much above
    #: its median 20 ms over the last ``return_window_s``, looked at every ``return_every_s``) within
    #: ``max_delay_s`` + ``return_slack_s`` of the answer's first sound (a played block above ``sound_db`` dBFS)
    #: may be its echo
    return_rise: float = 10.0
    return_window_s: float = 0.25
    return_every_s: float = 0.04
    return_slack_s: float = 0.12
    sound_db: float = -50.0
    #: such a rise is suspect this long (the barge-in detector waits); a GCC-PHAT peak-to-spread ratio this high
    #: over the mic's last ``return_window_s`` meanwhile says it is echo
    suspect_s: float = 0.2
    return_conf: float = 6.0
    answer_gap_s: float = 0.1  # played audio resuming after a gap this long is a new answer
    #: a window whose mic is quieter than this (mean power, dBFS) bounds nothing: digital silence is a muted or
    #: gated sender, not a path without echo (a live mic always carries some noise)
    cap_mic_db: float = -90.0

    def __post_init__(self) -> None:
        if self.block < 32 or self.partitions < 1 or not 0 < self.step < 2:
            raise ValueError(f"bad echo filter shape: block={self.block} partitions={self.partitions} step={self.step}")
        if self.coarse_votes < 0 or self.coarse_tol_s < 0 or self.coarse_coupling_floor < 0 or self.min_coupling < 0:
            raise ValueError(f"bad coupling or coarse delay settings: {self.coarse_votes} votes within "
                             f"{self.coarse_tol_s} s, floors {self.coarse_coupling_floor} / {self.min_coupling}")
        if self.cap_window_s <= 0 or self.cap_rise < 1 or self.cap_min <= 0:
            raise ValueError(f"bad coupling cap: window {self.cap_window_s} s, rise {self.cap_rise}")
        if min(self.return_window_s, self.return_every_s, self.untrusted_s) <= 0 or self.suspect_s < 0:
            raise ValueError(f"bad echo-return watch: window {self.return_window_s} s, every {self.return_every_s} s, "
                             f"suspect {self.suspect_s} s, untrusted {self.untrusted_s} s")
        if not 0 < self.floor <= 1 or self.max_delay_s <= 0 or self.tail_s < 0:
            raise ValueError("echo floor must be in (0, 1] and delays positive")


class _Ring:
    """Samples (or rows) by absolute index; unknown or overwritten positions read as zeros."""

    def __init__(self, size: int, width: int = 0) -> None:
        self.size = size
        self.buf = np.zeros((size, width) if width else size, np.float32)
        self.end = 0  # one past the last written absolute index
        self.start = 0  # first absolute index ever written

    def write(self, at: int, data: np.ndarray) -> None:
        n = len(data)
        if n == 0:
            return
        if self.end == 0 and self.start == 0:
            self.start = at
        if at > self.end:  # a gap reads as silence
            gap = min(at - self.end, self.size)
            idx = np.arange(at - gap, at) % self.size
            self.buf[idx] = 0
        if n > self.size:
            data, at = data[-self.size :], at + n - self.size
            n = self.size
        idx = np.arange(at, at + n) % self.size
        self.buf[idx] = data
        self.end = max(self.end, at + n)

    def read(self, a: int, b: int) -> np.ndarray:
        out = np.zeros((b - a, *self.buf.shape[1:]), np.float32)
        lo, hi = max(a, self.end - self.size, self.start), min(b, self.end)
        if hi > lo:
            out[lo - a : hi - a] = self.buf[np.arange(lo, hi) % self.size]
        return out


def _band_edges(bins: int, bands: int) -> np.ndarray:
    """Mel-spaced band edges over ``bins`` rfft bins (first band starts at bin 1)."""
    mel = np.linspace(0, 2595 * np.log10(1 + (SAMPLE_RATE / 2) / 700), bands + 1)
    hz = 700 * (10 ** (mel / 2595) - 1)
    edges = np.unique(np.clip(np.round(hz / (SAMPLE_RATE / 2) * (bins - 1)).astype(int), 1, bins))
    return edges


class DelayEstimator:
    """GCC-PHAT of the mic against the played audio at 4 kHz: the bulk delay and its confidence."""

    def __init__(self, max_delay_s: float, window_s: float) -> None:
        self.max_lag = int(max_delay_s * SAMPLE_RATE) // _DECIM
        self.win = int(window_s * SAMPLE_RATE) // _DECIM
        n = self.win + self.win + self.max_lag
        self.nfft = 1 << (n - 1).bit_length()

    def estimate(self, mic: np.ndarray, far: np.ndarray) -> tuple[int, float]:
        """``mic``: the last window; ``far``: the played audio over max_delay + window ending at the same
        time (16 kHz). Returns (delay in 16 kHz samples, peak-to-spread ratio)."""
        m = mic[: len(mic) // _DECIM * _DECIM].reshape(-1, _DECIM).mean(axis=1)
        f = far[: len(far) // _DECIM * _DECIM].reshape(-1, _DECIM).mean(axis=1)
        cross = np.conj(np.fft.rfft(m, self.nfft)) * np.fft.rfft(f, self.nfft)
        cross /= np.abs(cross) + 1e-12
        corr = np.fft.irfft(cross, self.nfft)[: self.max_lag + 1]
        k = int(np.argmax(corr))
        spread = float(np.std(corr)) + 1e-12
        return (self.max_lag - k) * _DECIM, float(corr[k] / spread)


class EchoCanceller:
    """Per-session echo canceller: ``played`` the answer audio as sent, ``process`` every mic chunk.

    Both sides are stamped on the session clock; the echo delay is found, not assumed.
    """

    def __init__(self, config: EchoConfig | None = None) -> None:
        cfg = self.config = config or EchoConfig()
        self.B, self.P = cfg.block, cfg.partitions
        self.N = 2 * self.B
        bins = self.B + 1
        span_s = cfg.max_delay_s + cfg.tail_s + cfg.delay_window_s
        self._far = _Ring(int(span_s * SAMPLE_RATE) + self.N * (self.P + 2))
        self._mic = _Ring(int(cfg.delay_window_s * SAMPLE_RATE) + self.N)
        self._fpow = _Ring(int(4 * SAMPLE_RATE) // self.B, cfg.bands)  # played band power per block-grid frame
        self._edges = _band_edges(bins, cfg.bands)
        self.bands = len(self._edges) - 1
        self._band_of = np.repeat(np.arange(self.bands), np.diff(self._edges))
        self._hf = np.zeros((self.P, bins), np.complex64)  # foreground filter (used)
        self._hb = np.zeros((self.P, bins), np.complex64)  # background filter (always adapts)
        self._ef = self._eb = self._df = 0.0  # smoothed error energies of the two filters, and the mic's
        self._erle_d = self._erle_e = 0.0  # smoothed mic / foreground-output energy while echo plays
        self._trusted = False
        self._ever_trusted = False  # the locked filter has cancelled at some point (until the lock goes)
        self._untrusted = 0  # samples of played audio the locked filter has gone untrusted over
        self._pxx = np.full(bins, 1e-6, np.float32)
        self._err = np.zeros(self.B, np.float32)  # previous block's output (suppression frame)
        self._coupling = np.full(self.bands, cfg.coupling0, np.float32)
        self._smooth_e = np.zeros(self.bands, np.float32)
        self._smooth_s = np.zeros(self.bands, np.float32)
        self._cap = np.full(self.bands, np.inf, np.float32)  # upper bound of the untrusted coupling
        self._cap_e = np.zeros(self.bands, np.float64)  # mic band energy over the current cap window
        self._cap_power = 0.0  # the mic's sum of squares over it
        self._cap_first = True  # no window of this answer has bounded the coupling yet: the next one sets it
        #: the prior holds until this answer's first window sets the bound: the session's first answer, or one
        #: the mic was seen echoing before that (headphones unplugged: echo must not pass under an old bound)
        self._prior_holds = True
        self._cap_frames: list[int] = []  # its blocks' frame indices
        self._watching = False  # this answer started under a carried bound and is watched for its echo
        self._suspect_until: int | None = None  # the mic rose where echo could be arriving: undecided until then
        self.returned = False  # this answer's echo was seen coming back under a bound carried from earlier ones
        self._return_check = DelayEstimator(cfg.max_delay_s, cfg.return_window_s)
        self._next_return_check = 0
        self._answer_sound: int | None = None  # the sample the current answer's first sound was played at
        #: samples after an answer's first sound within which its echo may be first reaching the mic
        self._arrival_span = int((cfg.max_delay_s + cfg.return_slack_s) * SAMPLE_RATE)
        self._mic_since = 0  # the mic ring holds every chunk from here on
        self._delay_est = DelayEstimator(cfg.max_delay_s, cfg.delay_window_s)
        self.delay: int | None = None  # bulk delay in samples, once locked
        self.coarse: int | None = None  # the delay several rough estimates agree on (a jittery path never locks)
        self._votes: deque[int] = deque(maxlen=cfg.coarse_votes)
        self._candidate: int | None = None
        self._next_delay_check = 0
        self._played_until = -1  # absolute sample index one past the last played sample
        self._mic_end = 0
        self._decay = 10 ** (-6 * self.B / SAMPLE_RATE / cfg.rt60_s)  # power decay per block

    # ---- the played side -------------------------------------------------------------------------
    def played(self, pts: float, samples: np.ndarray) -> None:
        """The answer audio exactly as sent to the client (16 kHz mono float), first sample at ``pts``."""
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        if not np.all(np.isfinite(x)):
            raise ValueError("played audio holds NaN or inf")
        at = int(round(pts * SAMPLE_RATE))
        if x.size == 0:
            return
        self._far.write(at, x)
        prev_end = self._played_until
        self._played_until = max(self._played_until, at + x.size)
        if prev_end < 0 or at - prev_end > self.config.answer_gap_s * SAMPLE_RATE:
            self._new_answer()
        if self._answer_sound is None:  # the answer's first sound: its echo can arrive no earlier
            step = min(self.B, x.size)
            blocks = x[: x.size // step * step].reshape(-1, step)
            loud = np.flatnonzero(np.mean(blocks * blocks, axis=1) > 10 ** (self.config.sound_db / 10))
            if loud.size:
                self._answer_sound = at + int(loud[0]) * step
        # band power of every block-grid frame touched by this write
        f0 = max(at, max(prev_end, at) - self.B) // self.B if prev_end > 0 else at // self.B
        f1 = (at + x.size) // self.B
        if f1 > f0:
            frames = self._far.read(f0 * self.B, f1 * self.B).reshape(-1, self.B)
            spec = np.abs(np.fft.rfft(frames, self.N, axis=1)) ** 2
            self._fpow.write(f0, self._to_bands(spec))

    def _to_bands(self, spec: np.ndarray) -> np.ndarray:
        e = self._edges
        c = np.cumsum(spec, axis=-1)
        c = np.concatenate([np.zeros((*spec.shape[:-1], 1)), c], axis=-1)
        return ((c[..., e[1:]] - c[..., e[:-1]]) / np.diff(e)).astype(np.float32)

    @property
    def active(self) -> bool:
        """True while echo of played audio may still arrive in the mic (playing + max delay + tail)."""
        return self._active_at(self._mic_end)

    def _active_at(self, mic_end: int) -> bool:
        horizon = int((self.config.max_delay_s + self.config.tail_s) * SAMPLE_RATE)
        return self._played_until >= 0 and mic_end < self._played_until + horizon

    @property
    def trusted(self) -> bool:
        """A delay is locked and the linear filter around it really cancels the echo (else the suppressor
        keeps assuming any delay: a wrong lock would let the echo through as the user)."""
        if self.delay is None:
            return False
        if not self._trusted:  # latched until the delay moves: the user talking over it lowers the ERLE
            ratio = 10 ** (self.config.trust_erle_db / 10)
            self._trusted = self._erle_d > ratio * self._erle_e and self._erle_d > 1e-6
            self._ever_trusted |= self._trusted
        elif self._ef > 10 ** (self.config.distrust_db / 10) * self._df:
            # ... but not when the filter's output is louder than the mic: the user talking over the echo never
            # does that, a filter gone wrong (the path moved under it) does
            self._trusted = False
        return self._trusted

    @property
    def _bound_serves(self) -> bool:
        """The mic's bound caps the coupling: no lock, or one whose filter never cancelled (a click just after an
        answer's first sound locks a delay where nothing echoes). A lock distrusted after it cancelled keeps the
        coupling floor: its output may hold more than the mic did (the path moved under the filter)."""
        return self.delay is None or not self._ever_trusted

    # ---- the mic side ----------------------------------------------------------------------------
    def process(self, chunk: AudioChunk) -> AudioChunk:
        """``chunk`` with the echo of the played answer removed (the same object when none can arrive)."""
        d = np.asarray(chunk.samples, dtype=np.float32).reshape(-1)
        start = int(round(chunk.pts * SAMPLE_RATE))
        if not self._active_at(start):
            self._mic_end = start + d.size
            return chunk
        if not np.all(np.isfinite(d)):
            raise ValueError("mic audio holds NaN or inf")
        if start != self._mic.end:  # the mic ring resumes here after a quiet spell
            self._mic_since = start
        self._mic.write(start, d)
        self._mic_end = start + d.size
        self._maybe_estimate_delay(self._mic_end)
        self._watch_return(self._mic_end)
        out = np.empty_like(d)
        for a in range(0, d.size, self.B):
            b = min(a + self.B, d.size)
            out[a:b] = self._block(start + b, d[a:b])
        return AudioChunk(chunk.pts, out)

    def _maybe_estimate_delay(self, end: int) -> None:
        cfg = self.config
        if end < self._next_delay_check:
            return
        period = cfg.delay_every_s if self.delay is not None and self.coarse is not None else 0.1
        self._next_delay_check = end + int(period * SAMPLE_RATE)
        win = int(cfg.delay_window_s * SAMPLE_RATE)
        far = self._far.read(end - win - int(cfg.max_delay_s * SAMPLE_RATE), end)
        mic = self._mic.read(end - win, end)
        if float(np.mean(far * far)) < 1e-7 or float(np.mean(mic * mic)) < 1e-9:
            return
        lag, conf = self._delay_est.estimate(mic, far)
        if not self._real_lag(lag):
            return
        self._vote(lag, conf)
        if conf < 9.0:
            return
        if self._candidate is not None and abs(lag - self._candidate) <= 2 * _DECIM:
            self._set_delay(lag)
        self._candidate = lag

    @property
    def settled(self) -> bool:
        """What the mic holds of the answer's echo is known: past the span where the current answer's echo may be
        first arriving (its first sound + ``max_delay_s`` + ``return_slack_s``), with a lock whose filter cancels or
        with no lock and the mic's bound in force. Otherwise (the prior, or a lock not yet trusted) a short burst
        of residual echo can pass for speech."""
        if self._answer_sound is None or self._mic_end - self._answer_sound <= self._arrival_span:
            return False
        return self.trusted if self.delay is not None else not self._prior_holds

    @property
    def suspect(self) -> bool:
        """The mic rose where this answer's echo could be first arriving under a bound carried from earlier answers
        with none: what it hears may be that echo, not the user, until ``_watch_return`` decides."""
        return self._suspect_until is not None

    def _watch_return(self, end: int) -> None:
        """An answer that starts under a bound carried from earlier ones: its echo, if any path now returns it,
        first reaches the mic within ``max_delay_s`` of the answer's first sound. A rise after that span is
        someone else. A rise within it is suspect for ``suspect_s``: a GCC-PHAT peak at a lag the answer could have
        reached says it is echo (the user's voice does not correlate with the answer's) and the prior comes back."""
        cfg = self.config
        if not self._bound_serves or self._prior_holds or not self._watching:
            self._suspect_until = None  # a lock that cancels decides it: the suppressor knows where echo is
            return
        if end < self._next_return_check:
            return
        self._next_return_check = end + int(cfg.return_every_s * SAMPLE_RATE)
        if self._suspect_until is not None:
            lag, conf = self._return_check.estimate(
                self._mic.read(end - self._return_check.win * _DECIM, end),
                self._far.read(end - (self._return_check.win + self._return_check.max_lag) * _DECIM, end))
            reached = end - (self._answer_sound or end) - 3 * self.B  # the longest lag its echo can hold 60 ms at
            if conf >= cfg.return_conf and self._real_lag(lag) and lag <= reached:
                self._suspect_until, self._watching, self.returned = None, False, True
                self._prior_holds = True  # until this answer's first window sets the bound
            elif end >= self._suspect_until:
                self._suspect_until = None
                self._watching = self._cap_first = False  # the user: the carried bound stays this answer's
            return
        if not self._cap_first:  # this answer's first window bounded the coupling already
            self._watching = False
            return
        if self._answer_sound is not None and end - self._answer_sound > self._arrival_span:
            # no echo came back in time: the carried bound is this answer's, and what rises now is someone else
            # (whose voice must not set the bound as an answer's first window would)
            self._watching = self._cap_first = False
            return
        known = min(end - self._mic_since, int(cfg.return_window_s * SAMPLE_RATE)) // self.B * self.B
        if known < 5 * self.B:
            return
        power = np.mean(self._mic.read(end - known, end).reshape(-1, self.B) ** 2, axis=1)
        if float(power[-3:].mean()) >= max(cfg.return_rise * float(np.median(power)), 1e-9):
            if self._answer_sound is None:  # nothing sounded yet: no echo of it can be arriving
                self._watching = self._cap_first = False
            else:
                self._suspect_until = end + int(cfg.suspect_s * SAMPLE_RATE)
                self._next_return_check = end  # look at once

    def _real_lag(self, lag: int) -> bool:
        """Not too short for any real path, and not the search's edge: when both windows start mid-sound their
        two steps, whitened, peak at zero shift (live, the user talking over an answer locked 0.5 s in a session
        with no echo, and the bound was off for good)."""
        return self.config.min_delay_s * SAMPLE_RATE <= lag < (self._delay_est.max_lag - 2) * _DECIM

    def _vote(self, lag: int, conf: float) -> None:
        """The coarse delay: the median of ``coarse_votes`` consecutive estimates that agree within
        ``coarse_tol_s`` (a path whose frames arrive jittered moves the peak by milliseconds, so it rarely
        gives the two near-identical confident estimates a lock needs, but it does agree roughly)."""
        cfg = self.config
        if cfg.coarse_votes == 0:  # off
            return
        if conf < cfg.coarse_conf or lag < cfg.coarse_min_s * SAMPLE_RATE:
            self._votes.clear()
            return
        self._votes.append(lag)
        votes = sorted(self._votes)
        if len(votes) < cfg.coarse_votes or votes[-1] - votes[0] > cfg.coarse_tol_s * SAMPLE_RATE:
            return
        new = votes[len(votes) // 2]
        if self.coarse is not None and abs(new - self.coarse) > cfg.spread_s * SAMPLE_RATE / 2:
            self._coupling[:] = cfg.coupling0  # the path moved: what was learned about it no longer holds
        self.coarse = new

    def _set_delay(self, lag: int) -> None:
        if self.delay is not None and abs(lag - self.delay) <= 2 * _DECIM:
            return
        if self.delay is not None:  # the echo path moved: the filters restart around the new delay
            self._drop_lock()
        self.delay = lag

    def _block(self, n: int, d: np.ndarray) -> np.ndarray:
        """One block of mic samples ending at absolute index ``n``: linear cancellation, then suppression."""
        e = d
        if self.delay is not None:
            e = self._linear(n, d)
        out = self._suppress(n, d, e)
        self._err = np.concatenate([self._err, e])[-self.B :]
        return out

    def _linear(self, n: int, d: np.ndarray) -> np.ndarray:
        B, P, N, L = self.B, self.P, self.N, d.size
        shift = self.delay - int(self.config.pre_delay_s * SAMPLE_RATE)  # type: ignore[operator]
        x = self._far.read(n - shift - (P + 1) * B, n - shift)
        frames = np.lib.stride_tricks.sliding_window_view(x, N)[::B][::-1]  # row p ends p blocks earlier
        X = np.fft.rfft(frames, axis=1)
        yf = np.fft.irfft(np.sum(X * self._hf, axis=0), N)[-L:]
        yb = np.fft.irfft(np.sum(X * self._hb, axis=0), N)[-L:]
        ef, eb = d - yf, d - yb
        px = np.sum(X.real**2 + X.imag**2, axis=0)
        self._pxx = np.maximum(0.9 * self._pxx, px)
        far_e = float(np.mean(x[-N:] ** 2))
        if far_e > 1e-8:
            E = np.fft.rfft(np.concatenate([np.zeros(N - L, np.float32), eb]))
            G = np.conj(X) * E / (self._pxx + 1e-3 * float(np.mean(self._pxx)) + 1e-4 * N)
            g = np.fft.irfft(G, N, axis=1)
            g[:, B:] = 0
            self._hb += (self.config.step * np.fft.rfft(g, axis=1)).astype(np.complex64)
            self._two_path(float(np.dot(ef, ef)), float(np.dot(eb, eb)), float(np.dot(d, d)))
            self._erle_d = 0.97 * self._erle_d + 0.03 * float(np.dot(d, d))
            self._erle_e = 0.97 * self._erle_e + 0.03 * float(np.dot(ef, ef))
            self._untrusted = 0 if self.trusted else self._untrusted + L
            if self._untrusted > self.config.untrusted_s * SAMPLE_RATE:
                self._drop_lock()  # a filter that never cancels found no echo path: the bound serves again
        return ef.astype(np.float32)

    def _drop_lock(self) -> None:
        """Forget the delay and everything the filters learned around it."""
        self._hf[:] = 0
        self._hb[:] = 0
        self._ef = self._eb = self._df = 0.0
        self._erle_d = self._erle_e = 0.0
        self._trusted = self._ever_trusted = False
        self._untrusted = 0
        self.delay = self._candidate = None

    def _two_path(self, efe: float, ebe: float, de: float) -> None:
        """Keep the foreground filter the better canceller: copy the background over it when it wins,
        reset the background to it when it diverges (near-end talk)."""
        a = 0.7
        self._ef = a * self._ef + (1 - a) * efe
        self._eb = a * self._eb + (1 - a) * ebe
        self._df = a * self._df + (1 - a) * de
        if self._eb < 0.8 * self._ef:
            self._hf[:] = self._hb
            self._ef = self._eb
        elif self._eb > 4.0 * self._ef + 1e-9 and self._eb > 0.5 * de:
            self._hb[:] = self._hf
            self._eb = self._ef

    def _center(self) -> int | None:
        """The delay the suppressor centres on: the trusted lock, else the coarse delay, else none (any)."""
        if self.trusted:
            return self.delay
        return self.coarse

    def _predicted_far(self, n: int, spread: int, center: int | None) -> np.ndarray:
        """Played band power that may be echoing at ``n``: max over the uncertain delay range (``center``
        widened by ``spread`` samples, or any delay without one), with a reverberant decay for older frames."""
        cfg, B = self.config, self.B
        if center is None:
            lo_d, hi_d = 0, int(cfg.max_delay_s * SAMPLE_RATE)
        else:
            lo_d, hi_d = center - spread, center + spread // 2 + B
        f_hi = (n - max(lo_d, 0)) // B + 1
        f_mid = (n - hi_d) // B
        n_tail = int(cfg.tail_s * SAMPLE_RATE) // B
        rows = self._fpow.read(f_mid - n_tail, f_hi)
        w = np.ones(len(rows), np.float32)
        w[:n_tail] = self._decay ** np.arange(n_tail, 0, -1)
        return np.max(rows * w[:, None], axis=0)

    def _suppress(self, n: int, d: np.ndarray, e: np.ndarray) -> np.ndarray:
        """``e`` (the linear filter's output for mic block ``d``) with the bands the echo explains floored."""
        L, N = e.size, self.N
        center = self._center()
        s = self._predicted_far(n, int(self.config.spread_s * SAMPLE_RATE), center)
        if float(s.max()) <= 1e-10:
            return e.astype(np.float32)
        frame = np.concatenate([self._err, e])[-N:]
        if frame.size < N:
            frame = np.concatenate([np.zeros(N - frame.size, np.float32), frame])
        spec = np.fft.rfft(frame)
        eb = self._to_bands(np.abs(spec) ** 2)
        if center is not None:  # coupling against the aligned frames, applied over the widened range
            self._learn_coupling(eb, self._predicted_far(n, int(self.config.pre_delay_s * SAMPLE_RATE), center))
        if self._bound_serves:  # until an echo is found and cancelled (before, the filter's output is about d)
            self._bound_coupling(n, d, eb)
        if self.trusted:
            coupling = np.maximum(self._coupling, self.config.min_coupling)
        else:
            coupling = np.maximum(self._coupling, self.config.coarse_coupling_floor)
            if self._bound_serves and not self._prior_holds:  # no echo cancelled yet: what the mic showed bounds it
                coupling = np.minimum(coupling, self._cap)
        ratio = self.config.over * coupling * s / (eb + 1e-10)
        gain = np.clip(1.0 - ratio, self.config.floor, 1.0)
        gbin = np.ones(spec.size, np.float32)
        gbin[self._edges[0] : self._edges[-1]] = gain[self._band_of]
        gbin[: self._edges[0]] = gain[0]
        return np.fft.irfft(spec * gbin, N)[-L:].astype(np.float32)

    def _learn_coupling(self, e_bands: np.ndarray, s: np.ndarray) -> None:
        """Residual/played power per band: falls fast to what is seen, rises slowly (near-end talk)."""
        self._smooth_e = 0.6 * self._smooth_e + 0.4 * e_bands
        self._smooth_s = 0.6 * self._smooth_s + 0.4 * s
        live = self._smooth_s > 1e-6
        r = self._smooth_e / np.maximum(self._smooth_s, 1e-10)
        c = self._coupling
        down = live & (r < c)
        up = live & ~down
        c[down] = 0.9 * c[down] + 0.1 * r[down]
        c[up] = np.minimum(c[up] * 1.01, r[up])

    def _new_answer(self) -> None:
        """Played audio resumed after a gap: the bound is set again from this answer's first window; until then
        the one carried from earlier answers holds, watched (``_watch_return``), or in the session's first the prior."""
        self._cap_first = True
        self._prior_holds = not bool(np.isfinite(self._cap).any())
        self._watching = not self._prior_holds
        self._suspect_until = None
        self.returned = False
        self._next_return_check = 0
        self._answer_sound = None
        self._cap_e[:] = 0
        self._cap_power = 0.0
        self._cap_frames = []

    def _bound_coupling(self, n: int, d: np.ndarray, mic_bands: np.ndarray) -> None:
        """Per ``cap_window_s``: the mic's band energy over the played band energy at the delay (0 to
        ``max_delay_s``) that played least. Echo at the true delay alone makes the mic's energy at least
        coupling x that, so the ratio bounds the coupling from above whatever the delay; the user talking
        only raises it. Within an answer the bound falls at once and rises by ``cap_rise`` a window; an answer's
        first window sets it either way."""
        self._cap_e += mic_bands
        self._cap_power += float(np.dot(d, d))
        self._cap_frames.append((n - 1) // self.B)
        if len(self._cap_frames) * self.B < self.config.cap_window_s * SAMPLE_RATE:
            return
        frames = np.array(self._cap_frames)
        self._cap_frames = []
        e, self._cap_e = self._cap_e, np.zeros(self.bands, np.float64)
        power, self._cap_power = self._cap_power / (frames.size * self.B), 0.0
        if power < 10 ** (self.config.cap_mic_db / 10):
            return
        lags = int(self.config.max_delay_s * SAMPLE_RATE) // self.B + 1
        f0 = int(frames.min())
        rows = self._fpow.read(f0 - lags, int(frames.max()) + 1)  # row i is frame f0 - lags + i
        played = np.stack([rows[frames - f0 + lags - lag].sum(axis=0) for lag in range(lags + 1)])
        least = played.min(axis=0)
        seen = least > 1e-4 * frames.size  # the answer played in that band at every delay
        ratio = (e / np.maximum(least, 1e-12)).astype(np.float32)
        bound = np.maximum(ratio[seen], self.config.cap_min)
        if self._cap_first:  # an answer's first window: whatever the bound was, it is this now
            self._cap[seen] = bound
            self._cap_first = not seen.any()
            self._prior_holds &= self._cap_first
        else:
            self._cap[seen] = np.minimum(bound, self._cap[seen] * self.config.cap_rise)
