"""The answer's media as the tracks send it and as its checks read it: the tracks' real-time pacing, 48 kHz PCM
from a phrase, the quiet-room floor under the sent audio, and the envelope match that finds a word in it."""

from __future__ import annotations

import asyncio
import functools
import math
import time

import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from alignment.clock import SessionClock
from alignment.types import SAMPLE_RATE, SpokenPhrase

AUDIO_RATE = 48_000
#: How far the drawn mouths may lag or lead the audio for the fit to find it.
MAX_LAG_S = 0.2
#: Sent audio kept for the checks (16 kHz).
KEEP_AUDIO_S = 8.0


#: The level of a quiet room (dBFS) added to the sent audio before its onsets are looked for: between
#: answers the track sends digital silence, and a synthesizer's own pauses lie far above that (about
#: -75 dBFS), so without a floor a phrase's first quiet samples would read as its onset.
ROOM_DBFS = -60.0


@functools.cache
def room_noise() -> np.ndarray:
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(int(KEEP_AUDIO_S * SAMPLE_RATE)).astype(np.float32) * 10 ** (ROOM_DBFS / 20)
    noise.flags.writeable = False
    return noise


def envelope_lag(sent: np.ndarray, sent_t0: float, src: np.ndarray, src_t0: float, start: float,
                 end: float, max_lag_s: float = MAX_LAG_S) -> float | None:
    """How late (s) the word [start, end) (session s, placed by ``src_t0``) lies in ``sent`` (16 kHz
    from ``sent_t0``): the lag that best matches the two 5 ms level envelopes."""
    hop = SAMPLE_RATE // 200
    i0 = int(round((start - 0.05 - src_t0) * SAMPLE_RATE))
    i1 = int(round((end + 0.05 - src_t0) * SAMPLE_RATE))
    i0, i1 = max(i0, 0), min(i1, len(src))
    if i1 - i0 < 4 * hop:
        return None
    ref = _env(src[i0:i1], hop)
    best, best_cost = None, math.inf
    for k in range(-int(max_lag_s * 200), int(max_lag_s * 200) + 1):
        j0 = int(round((src_t0 + i0 / SAMPLE_RATE - sent_t0) * SAMPLE_RATE)) + k * hop
        if j0 < 0 or j0 + (i1 - i0) > len(sent):
            continue
        cost = float(np.mean((_env(sent[j0:j0 + i1 - i0], hop) - ref) ** 2))
        if cost < best_cost - 1e-9:
            best, best_cost = k / 200, cost
    return best


def _env(x: np.ndarray, hop: int) -> np.ndarray:
    n = len(x) // hop
    frames = x[:n * hop].reshape(n, hop).astype(np.float64)
    return 10 * np.log10(np.mean(frames ** 2, axis=1) + 1e-8)


def resample_16k(x: np.ndarray, rate: int) -> np.ndarray:
    from alignment.espeak import resample

    return resample(np.asarray(x, np.float32), rate, SAMPLE_RATE)


def to_pcm48(phrase: SpokenPhrase) -> np.ndarray:
    """The phrase's audio as the track sends it: 48 kHz int16 (a worker thread)."""
    from alignment.espeak import resample

    if phrase.sample_rate <= 0 or phrase.audio.ndim != 1 or not np.isfinite(phrase.audio).all():
        raise ValueError("the synthesizer returned unusable audio")
    x = resample(np.asarray(phrase.audio, np.float32), phrase.sample_rate, AUDIO_RATE)
    return (np.clip(x, -1.0, 1.0) * 32767).astype(np.int16)


#: More behind real time than this and the tracks skip ahead instead of catching up.
MAX_BEHIND_S = 0.2


class Paced:
    """Absolute deadlines on the session clock: item n is due at ``start + n * period``; a late
    wake-up is absorbed by the next sleep, and far behind real time the grid skips ahead."""

    def __init__(self, clock: SessionClock, period: float, skip: bool) -> None:
        self.clock, self.period, self.skip = clock, period, skip
        self.n: int | None = None

    async def next(self, track: MediaStreamTrack) -> float:
        """Wait for the next item's time; returns it (session s)."""
        while not self.clock.started:
            if track.readyState != "live":
                raise MediaStreamError
            await asyncio.sleep(0.02)
        zero = self.clock.zero_wall
        assert zero is not None
        now = time.monotonic() - zero
        if self.n is None:
            self.n = max(0, math.ceil(now / self.period))
        elif self.skip and now - self.n * self.period > MAX_BEHIND_S:
            self.n = math.ceil(now / self.period)
        t = self.n * self.period
        wait = zero + t - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if track.readyState != "live":
            raise MediaStreamError
        self.n += 1
        return t
