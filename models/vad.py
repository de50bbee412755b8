"""Streaming Silero VAD: speech start/end events per stream over 512-sample 16 kHz windows.

The ONNX model shipped inside the ``silero-vad`` wheel is loaded once per process and shared; each
stream keeps only its own recurrent state (2x1x128 floats) and 64-sample context, so many
sessions cost one small ONNX call per 32 ms of audio each (~0.1 ms). Nothing is downloaded.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import numpy as np

from alignment.types import SAMPLE_RATE

WINDOW = 512  # samples per VAD decision at 16 kHz (32 ms)
_CONTEXT = 64  # samples of the previous window the model sees (silero v5+)
WINDOW_S = WINDOW / SAMPLE_RATE

_SESSION = None
_SESSION_LOCK = threading.Lock()


def _session():  # noqa: ANN202 - onnxruntime.InferenceSession, imported lazily
    """The process-wide ONNX session (thread-safe ``run``), from the silero-vad wheel's data."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            import onnxruntime

            path = resources.files("silero_vad.data").joinpath("silero_vad.onnx")
            opts = onnxruntime.SessionOptions()
            opts.inter_op_num_threads = 1
            opts.intra_op_num_threads = 1
            opts.log_severity_level = 3
            _SESSION = onnxruntime.InferenceSession(
                str(path), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        return _SESSION


@dataclass(frozen=True)
class VADEvent:
    """Speech began (``start``) or ended (``end``) at ``pts`` (stream clock, s)."""

    kind: Literal["start", "end"]
    pts: float


@dataclass(frozen=True)
class VADConfig:
    """Decision thresholds; ``min_silence_s`` of non-speech ends an utterance."""

    threshold: float = 0.5
    neg_threshold: float | None = None  # default: threshold - 0.15 (hysteresis)
    min_silence_s: float = 0.25
    speech_pad_s: float = 0.03  # a start event is reported this much before the first speech window

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"VAD threshold must be in (0, 1), got {self.threshold}")
        if self.min_silence_s < 0:
            raise ValueError(f"min_silence_s must be >= 0, got {self.min_silence_s}")


class StreamingVAD:
    """One stream's VAD state. Feed any number of samples; get start/end events with pts.

    ``t0`` is the pts of the first sample fed. End events carry the pts where speech stopped
    (the end of the last speech window), not the time the silence was confirmed.
    """

    def __init__(self, config: VADConfig | None = None, t0: float = 0.0) -> None:
        self.config = config or VADConfig()
        self._neg = (
            self.config.neg_threshold
            if self.config.neg_threshold is not None
            else max(self.config.threshold - 0.15, 0.01)
        )
        self._session = _session()
        self.reset(t0)

    def reset(self, t0: float = 0.0) -> None:
        """Forget all state; the next sample fed is presented at ``t0``."""
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros((1, _CONTEXT), np.float32)
        self._pending = np.zeros(0, np.float32)
        self._t0 = t0
        self._n = 0  # samples consumed into windows
        self.triggered = False
        self._silence_start: float | None = None
        self.last_prob = 0.0

    @property
    def pts(self) -> float:
        """Pts just after the last sample that has been classified."""
        return self._t0 + self._n / SAMPLE_RATE

    @property
    def silence_start(self) -> float | None:
        """Where the silence that may end the current speech began (None: none yet); an end event
        comes once ``pts`` is ``min_silence_s`` past it."""
        return self._silence_start

    def probability(self, window: np.ndarray) -> float:
        """Speech probability of one 512-sample window (advances this stream's state)."""
        x = np.concatenate([self._context, window.reshape(1, WINDOW).astype(np.float32)], axis=1)
        out, self._state = self._session.run(
            None, {"input": x, "state": self._state, "sr": np.array(SAMPLE_RATE, dtype=np.int64)}
        )
        self._context = x[:, -_CONTEXT:]
        return float(out.reshape(-1)[0])

    def feed(self, samples: np.ndarray) -> list[VADEvent]:
        """Classify all complete windows in ``samples`` (plus any carried remainder)."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        buf = np.concatenate([self._pending, samples]) if self._pending.size else samples
        events: list[VADEvent] = []
        n_win = len(buf) // WINDOW
        for i in range(n_win):
            win_start = self.pts
            prob = self.probability(buf[i * WINDOW : (i + 1) * WINDOW])
            self._n += WINDOW
            self.last_prob = prob
            ev = self._decide(prob, win_start, self.pts)
            if ev is not None:
                events.append(ev)
        self._pending = buf[n_win * WINDOW :].copy()
        return events

    def _decide(self, prob: float, win_start: float, win_end: float) -> VADEvent | None:
        cfg = self.config
        if prob >= cfg.threshold:
            self._silence_start = None
            if not self.triggered:
                self.triggered = True
                return VADEvent("start", max(win_start - cfg.speech_pad_s, self._t0))
            return None
        if self.triggered and prob < self._neg:
            if self._silence_start is None:
                self._silence_start = win_start
            if win_end - self._silence_start >= cfg.min_silence_s - 1e-9:
                self.triggered = False
                end = self._silence_start
                self._silence_start = None
                return VADEvent("end", end)
        return None

    def flush(self) -> list[VADEvent]:
        """End of stream: close an open utterance at the last classified pts."""
        if not self.triggered:
            return []
        self.triggered = False
        end = self._silence_start if self._silence_start is not None else self.pts
        self._silence_start = None
        return [VADEvent("end", end)]


def speech_segments(
    audio: np.ndarray, config: VADConfig | None = None, t0: float = 0.0
) -> list[tuple[float, float]]:
    """Offline helper: (start, end) pts of every speech segment in ``audio``."""
    vad = StreamingVAD(config, t0)
    segs: list[tuple[float, float]] = []
    start: float | None = None
    for ev in vad.feed(audio) + vad.flush():
        if ev.kind == "start":
            start = ev.pts
        elif start is not None:
            segs.append((start, ev.pts))
            start = None
    return segs
