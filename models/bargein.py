"""Barge-in: tell the user's real interruption from the answer's own echo in the microphone.

Every mic chunk goes through the echo canceller while echo may arrive (the cleaned chunk goes on to
the ASR and the turn detector, so the echo yields no user words). While an answer is playing the
cleaned audio is also classified by the Silero VAD: a speech onset sustained for
``min_speech_s`` of speech-like windows is a barge-in, stamped with the onset. A cough or a slam is
short or not speech-like and does not hold that long. Once the canceller has settled on the answer's echo,
a shorter stretch of sure speech fires too: there residual echo no longer passes for speech, and a
noise burst rarely looks that sure. Outside answers nothing is classified and,
once no echo can arrive, the chunk is returned as it came.
"""

from __future__ import annotations

import os
import pickle
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from alignment.echo import EchoCanceller, EchoConfig
from alignment.types import AudioChunk
from models.vad import WINDOW, WINDOW_S, StreamingVAD, VADConfig


@dataclass(frozen=True)
class BargeIn:
    """The user started speaking over the answer; ``pts`` is the speech onset (session clock, s)."""

    pts: float


@dataclass(frozen=True)
class BargeInConfig:
    """``min_speech_s``: speech-like audio needed after the onset; ``threshold``: VAD probability that
    counts as speech; ``max_gap_windows``: non-speech windows tolerated inside that stretch."""

    min_speech_s: float = 0.096
    threshold: float = 0.6
    #: once the canceller has settled on the answer's echo (``EchoCanceller.settled``), this much of the stretch
    #: at ``sure_threshold`` or more fires at once (short noise bursts held 0.6-0.86 for that long)
    sure_speech_s: float = 0.064
    sure_threshold: float = 0.9
    max_gap_windows: int = 0
    min_level_db: float = -50.0  # a speech window must be at least this loud (RMS, dBFS) after cleaning
    echo: EchoConfig = EchoConfig()

    def __post_init__(self) -> None:
        if self.min_speech_s < 0 or self.sure_speech_s < 0 or not 0 < self.threshold <= self.sure_threshold < 1 \
                or self.max_gap_windows < 0:
            raise ValueError(f"bad barge-in config: {self}")


class BargeInDetector:
    """One session's barge-in detector; ``played`` the answer audio, ``feed`` every mic chunk."""

    def __init__(self, config: BargeInConfig | None = None) -> None:
        self.config = config or BargeInConfig()
        self.canceller = EchoCanceller(self.config.echo)
        self._vad: StreamingVAD | None = None
        self._answering = False
        self._onset: float | None = None
        self._speech_windows = 0
        self._sure = 0  # consecutive windows at sure_threshold or more
        self._gap = 0
        self._fired = False
        self._echo_reset = False
        self._pending = np.zeros(0, np.float32)
        self._t = 0.0
        self._min_power = 10 ** (self.config.min_level_db / 10)
        self._need = max(1, int(np.ceil(self.config.min_speech_s / WINDOW_S - 1e-9)))  # speech-like windows
        self._need_sure = max(1, int(np.ceil(self.config.sure_speech_s / WINDOW_S - 1e-9)))  # sure ones, once settled

    def played(self, pts: float, samples: np.ndarray) -> None:
        """The answer audio as sent (16 kHz), first sample at ``pts`` on the session clock."""
        self.canceller.played(pts, samples)

    def feed(self, chunk: AudioChunk, answering: bool) -> tuple[AudioChunk, BargeIn | None]:
        """The cleaned chunk, and a BargeIn the first time the user is heard talking over the answer."""
        clean = self.canceller.process(chunk)
        if not answering:
            self._answering = False
            return clean, None
        if not self._answering:  # a new answer: fresh VAD state from this chunk on
            self._answering = True
            self._fired = False
            self._echo_reset = False
            self._onset = None
            self._sure = 0
            self._pending = np.zeros(0, np.float32)
            if self._vad is None:
                self._vad = StreamingVAD(VADConfig(threshold=self.config.threshold), t0=chunk.pts)
            else:
                self._vad.reset(chunk.pts)
        if self._fired:
            return clean, None
        return clean, self._classify(clean)

    def _classify(self, clean: AudioChunk) -> BargeIn | None:
        """Run the VAD window by window over the cleaned audio; the first sustained stretch fires."""
        vad = self._vad
        assert vad is not None
        if self._pending.size == 0:
            self._t = clean.pts
        buf = np.concatenate([self._pending, np.asarray(clean.samples, np.float32)])
        n = buf.size // WINDOW
        need = self._need
        need_sure = self._need_sure if self.canceller.settled else need + 1
        hit: BargeIn | None = None
        for i in range(n):
            t = self._t + i * WINDOW_S
            win = buf[i * WINDOW : (i + 1) * WINDOW]
            loud = float(np.mean(win * win)) >= self._min_power
            p = vad.probability(win)  # every window: the VAD's state runs on
            self._sure = self._sure + 1 if loud and p >= self.config.sure_threshold else 0
            if loud and p >= self.config.threshold:
                if self._onset is None:
                    self._onset, self._speech_windows = t, 0
                self._speech_windows += 1
                self._gap = 0
            elif self._onset is not None:
                self._gap += 1
                if self._gap > self.config.max_gap_windows:
                    self._onset = None
            if self.canceller.returned and not self._echo_reset:  # what was heard while unsure was echo
                self._onset, self._echo_reset = None, True
            sustained = self._speech_windows >= need or self._sure >= need_sure
            if hit is None and self._onset is not None and sustained and not self.canceller.suspect:
                hit = BargeIn(self._onset)
                self._fired = True
                break
        self._pending = buf[n * WINDOW :] if hit is None else np.zeros(0, np.float32)
        self._t += n * WINDOW_S
        return hit


#: A directory here makes every detector record its inputs there (``BargeInTrace``): a diagnostic.
TRACE_ENV = "SYNCHRONY_ECHO_TRACE"
#: Set (to anything) beside it, the traced detectors record but never stop an answer: every answer plays
#: on under the user's speech, so a replay can time any detector, however slow.
TRACE_LISTEN_ENV = "SYNCHRONY_ECHO_TRACE_LISTEN"


class BargeInTrace:
    """A detector that also appends everything it is given to a file: the answer audio as sent and each
    mic chunk with whether an answer was playing. Live echo (the real network, playout and server stalls)
    is what the offline scenes get wrong; ``bench/barge_in.py --trace`` replays these files through any
    detector configuration. About 130 KB a second of session: a diagnostic, never on by default."""

    def __init__(self, detector: BargeInDetector, path: Path, stops: bool = True) -> None:
        self.detector = detector
        self.stops = stops
        self._file: BinaryIO = open(path, "ab")  # noqa: SIM115 - appended to for the session's life

    @classmethod
    def from_env(cls) -> BargeInDetector | BargeInTrace:
        """A plain detector, or a traced one writing under ``$SYNCHRONY_ECHO_TRACE`` when that is set."""
        folder = os.environ.get(TRACE_ENV)
        if not folder:
            return BargeInDetector()
        Path(folder).mkdir(parents=True, exist_ok=True)
        path = Path(folder) / f"bargein-{os.getpid()}-{uuid.uuid4().hex[:8]}.pkl"
        return cls(BargeInDetector(), path, stops=not os.environ.get(TRACE_LISTEN_ENV))

    def played(self, pts: float, samples: np.ndarray) -> None:
        self._write(("played", pts, np.asarray(samples, np.float32)))
        self.detector.played(pts, samples)

    def feed(self, chunk: AudioChunk, answering: bool) -> tuple[AudioChunk, BargeIn | None]:
        self._write(("mic", chunk.pts, np.asarray(chunk.samples, np.float32), answering))
        clean, hit = self.detector.feed(chunk, answering)
        return clean, hit if self.stops else None

    def _write(self, record: tuple[object, ...]) -> None:
        pickle.dump(record, self._file)
        self._file.flush()


def read_trace(path: Path) -> list[tuple[object, ...]]:
    """The records of one ``BargeInTrace`` file, in order (pickle: read only traces you made)."""
    out = []
    with open(path, "rb") as f:
        while True:
            try:
                out.append(pickle.load(f))
            except EOFError:
                return out
