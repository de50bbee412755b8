"""What a peer measures of the spoken answer, from what it received: pure functions over plain data.

The server's own figures (``answer_start.voice_latency_ms``, ``answer_sync``) restate its pipeline; these
are measured at the client, on the decoded Opus and avatar frames, against truths the peer made itself:

* voice-to-voice: the sent clip's known end of speech → the first received answer packet above
  ``LOUD_DBFS`` (wall time of the packet's arrival at the peer);
* lip-sync: the mouth opening read from the received frames' pixels against the received audio's
  envelope, both on the peer's lip-sync clock (RTP mapped through the RTCP sender reports, as a browser
  does), as the lag of maximum correlation (positive: video late);
* barge-in: the onset of a second utterance started during an answer → the answer's audio going silent
  at the peer (its last loud packet, plus that packet's 20 ms);
* an echo path (:class:`RoomResponse`): the received answer mixed back into the mic through a seeded
  room response (30–250 ms), so echo rejection is checked together with a real barge-in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: A received 20 ms answer frame at or above this level counts as sound (issue 35).
LOUD_DBFS = -40.0
#: The answer's audio arrives in 20 ms frames (Opus at 48 kHz).
FRAME_S = 0.02
#: The lags searched for the lip-sync offset (s): wider than any believable A/V offset.
MAX_LAG_S = 0.3
LAG_STEP_S = 0.005


def dbfs(samples: np.ndarray) -> float:
    """RMS level of float samples in [-1, 1], in dB relative to full scale (-inf for digital silence)."""
    x = np.asarray(samples, np.float64)
    if x.size == 0:
        return -math.inf
    rms = float(np.sqrt(np.mean(x * x)))
    return 20.0 * math.log10(rms) if rms > 0 else -math.inf


@dataclass(frozen=True)
class Packet:
    """One received 20 ms answer audio frame: its RTP packet's arrival (peer wall s), level (dBFS),
    and its time on the peer's lip-sync clock (s; None before the clock has an anchor)."""

    wall: float
    level: float
    media: float | None = None

    @property
    def loud(self) -> bool:
        return self.level >= LOUD_DBFS


def first_loud(packets: Sequence[Packet], after: float, before: float = math.inf) -> Packet | None:
    """The first packet arriving in ``[after, before)`` at or above ``LOUD_DBFS``; None if none."""
    for p in packets:
        if after <= p.wall < before and p.loud:
            return p
    return None


def last_loud(packets: Sequence[Packet], after: float, before: float = math.inf) -> Packet | None:
    """The last loud packet arriving in ``[after, before)``; None if none."""
    found = None
    for p in packets:
        if after <= p.wall < before and p.loud:
            found = p
    return found


def voice_to_voice(speech_end: float, packets: Sequence[Packet], before: float = math.inf) -> float | None:
    """Seconds from the user's true end of speech (peer wall) to the first loud answer packet after it."""
    p = first_loud(packets, speech_end, before)
    return None if p is None else p.wall - speech_end


def stop_latency(onset: float, packets: Sequence[Packet], before: float = math.inf) -> float | None:
    """Seconds from a barge-in's onset (peer wall) until the answer's audio went silent at the peer.

    Silent from the end of the last loud packet that arrived before ``before`` (the next answer's first
    audio, or the end of the record). None when no loud packet arrived after the onset at all (the answer
    had stopped already: no barge-in to time).
    """
    last = last_loud(packets, onset, before)
    return None if last is None else last.wall + FRAME_S - onset


def speech_span(samples: np.ndarray, rate: int, rel_db: float = -40.0, hop_s: float = 0.005,
                within: tuple[float, float] | None = None) -> tuple[int, int] | None:
    """(first, end) sample of the speech in ``samples``: the first and last ``hop_s`` window whose RMS is
    within ``rel_db`` of the loudest one. A synthesizer's leading pause is not digital silence (festival's
    diphone voices hiss at about -60 dBFS), so a sample threshold would put the onset in the pause.
    ``within``: where the synthesizer's first phone starts and its last one ends (s); the span is kept inside
    them, since a pause can hold sound that is not speech (kal_diphone's pause before a /w/ holds 200 ms of
    rumble at -39 dBFS, within 40 dB of its loudest window)."""
    x = np.asarray(samples, np.float64)
    hop = max(int(round(hop_s * rate)), 1)
    n = len(x) // hop
    if n == 0:
        return None
    rms = np.sqrt(np.mean(x[: n * hop].reshape(n, hop) ** 2, axis=1))
    if rms.max() <= 0:
        return None
    active = np.flatnonzero(rms >= rms.max() * 10 ** (rel_db / 20))
    span = int(active[0]) * hop, min((int(active[-1]) + 1) * hop, len(x))
    return span if within is None else span_within(span, within, rate)


def span_within(span: tuple[int, int], within: tuple[float, float], rate: int) -> tuple[int, int]:
    """``span`` (first, end sample) kept inside ``within`` (s): :func:`speech_span`'s bound, for a span in hand."""
    first = min(max(span[0], round(within[0] * rate)), span[1])
    return first, max(min(span[1], round(within[1] * rate)), first)


# --- the avatar's mouth, read from pixels ------------------------------------------------------------

#: Luma (0–255) under which a pixel of the mouth box counts as the open mouth's dark inside.
DARK_LUMA = 60


def luma(frame_rgb: np.ndarray) -> np.ndarray:
    """BT.601 luma of an RGB uint8 frame, as float32."""
    f = frame_rgb.astype(np.float32)
    return 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]


def mouth_box(lumas: Sequence[np.ndarray], top: float = 0.0, bottom: float = 0.8) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1) of the region whose dark pixels come and go most over ``lumas``.

    Found from the pixels alone: the mouth is where dark pixels come and go while the answer plays. Rows
    outside ``[top, bottom)`` of the frame (fractions; the caption band sits below) are left out, so
    words appearing in a caption cannot pass for a moving mouth; of the regions that vary, the one with
    the most variation wins, so a blink (a few frames of dark eyes) does not either.
    """
    from scipy import ndimage

    stack = np.stack([y < DARK_LUMA for y in lumas]).astype(np.float32)
    h, w = stack.shape[1:]
    var = stack.std(axis=0)
    var[: int(top * h)] = 0
    var[int(bottom * h) :] = 0
    if var.max() <= 0:
        return (h // 2, h // 2 + 1, w // 2, w // 2 + 1)
    labels, n = ndimage.label(ndimage.binary_closing(var >= 0.25 * var.max(), iterations=2))
    weight = ndimage.sum(var, labels, index=np.arange(1, n + 1))
    ys, xs = np.nonzero(labels == int(np.argmax(weight)) + 1)
    pad = 4
    return (max(int(ys.min()) - pad, 0), min(int(ys.max()) + pad + 1, h),
            max(int(xs.min()) - pad, 0), min(int(xs.max()) + pad + 1, w))


def mouth_opening(y: np.ndarray, box: tuple[int, int, int, int]) -> float:
    """Fraction of the mouth box's pixels dark enough to be the open mouth's inside (0..1)."""
    y0, y1, x0, x1 = box
    region = y[y0:y1, x0:x1]
    return float(np.mean(region < DARK_LUMA)) if region.size else 0.0


def envelope(samples: np.ndarray, rate: int, hop_s: float = 0.01, window_s: float = 0.04) -> np.ndarray:
    """RMS envelope every ``hop_s`` over ``window_s`` windows (centred); index i is time i·hop_s."""
    x = np.asarray(samples, np.float64)
    hop = max(int(round(hop_s * rate)), 1)
    n = len(x) // hop
    if n == 0:
        return np.zeros(0)
    power = np.mean(x[: n * hop].reshape(n, hop) ** 2, axis=1)
    k = max(int(round(window_s / hop_s)), 1)
    smooth = np.convolve(power, np.ones(k) / k, mode="same")
    return np.sqrt(smooth)


@dataclass(frozen=True)
class LipSync:
    """The lag (ms) at which the mouth opening best follows the audio envelope; positive: video late."""

    offset_ms: float
    correlation: float
    frames: int


def lip_sync_offset(env_t: np.ndarray, env: np.ndarray, video_t: np.ndarray, mouth: np.ndarray,
                    max_lag_s: float = MAX_LAG_S, step_s: float = LAG_STEP_S) -> LipSync | None:
    """Cross-correlate the mouth opening at ``video_t`` with the audio envelope at ``video_t - lag``.

    Both time axes are on one clock (the peer's, through the sender reports). Returns the lag of the
    highest Pearson correlation, or None when either signal is flat (no speech, or a still mouth) or
    fewer than 8 frames overlap the audio.
    """
    video_t, mouth = np.asarray(video_t, np.float64), np.asarray(mouth, np.float64)
    env_t, env = np.asarray(env_t, np.float64), np.asarray(env, np.float64)
    if len(video_t) < 8 or len(env_t) < 8 or np.std(mouth) <= 1e-9 or np.std(env) <= 1e-12:
        return None
    best: tuple[float, float] | None = None
    for lag in np.arange(-max_lag_s, max_lag_s + step_s / 2, step_s):
        t = video_t - lag
        inside = (t >= env_t[0]) & (t <= env_t[-1])
        if inside.sum() < 8:
            continue
        a = np.interp(t[inside], env_t, env)
        m = mouth[inside]
        if np.std(a) <= 1e-12 or np.std(m) <= 1e-9:
            continue
        r = float(np.corrcoef(a, m)[0, 1])
        if best is None or r > best[1]:
            best = (float(lag), r)
    if best is None:
        return None
    return LipSync(round(best[0] * 1000.0, 1), round(best[1], 3), int(len(video_t)))


# --- the echo path -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoomResponse:
    """A sparse room impulse response: (delay s, gain) taps, 30–250 ms, seeded.

    A direct path 30–60 ms (loudspeaker to mic, plus the playout buffer a device adds) and a few
    decaying reflections up to 250 ms: the echo a laptop speaker puts into its own microphone.
    """

    taps: tuple[tuple[float, float], ...]

    @classmethod
    def seeded(cls, seed: int, gain: float = 0.5, reflections: int = 4) -> RoomResponse:
        rng = np.random.default_rng(seed)
        taps = [(float(rng.uniform(0.030, 0.060)), gain)]
        for d in np.sort(rng.uniform(0.070, 0.250, reflections)):
            taps.append((float(d), float(gain * rng.uniform(0.15, 0.45) * math.exp(-(d - 0.03) / 0.12))))
        return cls(tuple(taps))

    @property
    def max_delay_s(self) -> float:
        return max(d for d, _ in self.taps)


class EchoPath:
    """The received answer, as the peer's loudspeaker played it, coming back into the peer's microphone.

    ``played(arrival_s, samples)`` hands over a received frame at the peer-clock instant it arrived; it is
    played as a receiver's jitter buffer plays it: right after the frame before, or ``buffer_s`` after its
    arrival when the buffer had run dry, and a backlog beyond ``max_buffer_s`` (a burst after a sender's
    stall) is dropped, as a receiver speeding its playout up drains it. Writing each frame at its own
    arrival instant instead would cut the echo into gaps and overlaps at every jittered arrival, a sound
    no loudspeaker makes. ``echo(peer_s, n)`` is what the room adds to the ``n`` mic samples sent from
    ``peer_s``. A ring buffer of a few seconds: bounded whatever the session's length.
    """

    def __init__(self, room: RoomResponse, rate: int = 48_000, seconds: float = 4.0, buffer_s: float = 0.02,
                 max_buffer_s: float = 0.08) -> None:
        self.room = room
        self.rate = rate
        self.buffer = int(round(buffer_s * rate))
        self.max_buffer = int(round(max_buffer_s * rate))
        self._buf = np.zeros(int(seconds * rate), np.float32)
        self._written_until = 0  # absolute sample index (peer clock · rate) written up to

    def played(self, arrival_s: float, samples: np.ndarray) -> None:
        arrived = int(round(arrival_s * self.rate))
        if arrived < 0:
            return
        start = self._written_until
        if start < arrived:  # the buffer ran dry: a gap of silence, then buffer_s of slack again
            start = arrived + self.buffer
            self._clear(self._written_until, start)
        elif start - arrived > self.max_buffer:  # drain the backlog: what was queued is never played
            self._clear(arrived + self.buffer, start)
            start = arrived + self.buffer
        n = len(samples)
        size = len(self._buf)
        idx = (np.arange(start, start + n) % size)
        self._buf[idx] = samples[-size:] if n > size else samples
        self._written_until = start + n

    def _clear(self, a: int, b: int) -> None:
        b = min(b, a + len(self._buf))
        if b > a:
            self._buf[np.arange(a, b) % len(self._buf)] = 0.0

    def echo(self, peer_s: float, n: int) -> np.ndarray:
        out = np.zeros(n, np.float32)
        size = len(self._buf)
        for delay, gain in self.room.taps:
            start = int(round((peer_s - delay) * self.rate))
            if start < 0 or start + n > self._written_until or self._written_until - start > size:
                continue
            out += gain * self._buf[np.arange(start, start + n) % size]
        return out


# --- words -------------------------------------------------------------------------------------------


def wer(ref: Sequence[str], hyp: Sequence[str]) -> tuple[int, int]:
    """(edits, reference words) between two word sequences (``alignment.text.word_edits``)."""
    from alignment.text import word_edits

    return word_edits(ref, hyp)


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (linear), None for no values."""
    return None if not values else float(np.quantile(np.asarray(values, np.float64), q))
