"""The Level-3 stage: each final word's audio, video and text times checked against independent evidence.

:class:`OffsetFeed` gives the A/V offset estimator its evidence (every frame's marker flash, the mouth
of the frames the AU stage analysed, the audio); :class:`SyncStage` checks each final word with it
(``alignment.sync``), emits its ``sync`` event and marks a failure on the session's trace.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import av
import numpy as np

from alignment.evidence import OffsetEstimate, VisualObservation
from alignment.frames import TokenFrames, frame_pts
from alignment.types import AudioChunk
from app.live.answer_lst import ConversationTrace
from app.live.events import SyncEvent
from app.live.observe import SessionObserver
from app.live.stages import OffsetEstimator, Stage, StageHost, Validator, attempt

T = TypeVar("T")


def flash_of(frame: av.VideoFrame) -> float:
    """Marker-patch brightness of a decoded frame, read from its luma plane (no colour conversion)."""
    from alignment.evidence import flash_score

    if frame.format.name in ("yuv420p", "yuvj420p", "nv12"):
        plane = frame.planes[0]
        luma = np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)[:, : plane.width]
        return float(flash_score(luma))
    return float(flash_score(frame.to_ndarray(format="gray")))


class OffsetFeed:
    """The A/V offset estimator's evidence, in pts order; gone (None) once it failed."""

    def __init__(self, host: StageHost, estimator: OffsetEstimator | None) -> None:
        self.host = host
        self.estimator = estimator
        self._flash_pending: deque[tuple[float, float]] = deque(maxlen=256)  # (pts, flash) awaiting AUs
        self._estimate: tuple[float, OffsetEstimate] | None = None  # (wall, estimate), refreshed ≤ 1/s
        self._last_final_start: float | None = None  # the word before, for the onset check

    @property
    def active(self) -> bool:
        return self.estimator is not None

    def camera_frame(self, t: float, frame: av.VideoFrame, faces_running: bool) -> None:
        """Every frame's flash (a one-frame flash must not be skipped); without face analysis the
        frames go to the estimator at once, else with the mouth of the frame analysed next."""
        if self.estimator is None:
            return
        self._flash_pending.append((t, flash_of(frame)))
        if not faces_running:
            self.visual(t, None)

    def audio(self, chunk: AudioChunk) -> None:
        if self.estimator is not None:
            self._feed(self.estimator.push_audio, chunk)

    def visual(self, upto: float, mouth: float | None) -> None:
        """Every frame up to ``upto`` in pts order: flash scores for all, mouth openness for the
        frame the AU stage processed (frames it skipped carry none)."""
        while (est := self.estimator) is not None and self._flash_pending \
                and self._flash_pending[0][0] <= upto + 1e-6:
            pts, flash = self._flash_pending.popleft()
            here = abs(pts - upto) <= 1e-6
            self._feed(est.push_visual, VisualObservation(pts, mouth if here else None, flash))

    def _feed(self, push: Callable[[T], None], item: T) -> None:
        try:
            push(item)
        except Exception as exc:  # noqa: BLE001
            self.host.fail_stage(Stage.SYNC, exc)
            self.estimator = None

    def evidence(self, start: float) -> tuple[OffsetEstimate | None, float | None]:
        """The current offset estimate (its lip search costs ~10 ms: ≤ 1/s) and the acoustic onset
        near a final word's ``start``."""
        est = self.estimator
        if est is None:
            return None, None
        now = time.monotonic()
        if self._estimate is None or now - self._estimate[0] > 1.0:
            got = attempt(self.host, Stage.SYNC, est.estimate)
            self._estimate = (now, got) if got is not None else None
        estimate = self._estimate[1] if self._estimate is not None else None
        previous = self._last_final_start
        onset = attempt(self.host, Stage.SYNC, lambda: est.acoustic_onset(start, previous))
        return estimate, onset

    def final_word(self, start: float) -> None:
        self._last_final_start = start


class SyncStage:
    """Level-3 per final word: audio, video and text times within 50 ms, against the evidence."""

    def __init__(self, host: StageHost, validator: Validator, feed: OffsetFeed, observer: SessionObserver,
                 trace: ConversationTrace) -> None:
        self.host, self.validator, self.feed, self.observer, self.trace = host, validator, feed, observer, trace
        self.total = 0
        self.passed = 0
        self.last_ok: bool | None = None

    def check(self, placed: TokenFrames) -> None:
        """Check a final word; while the latest verdict is a failure, the word is marked on the trace."""
        self._check(placed)
        if self.last_ok is False:
            self.trace.event("level3_failure", {"synchrony.word": placed.token.text,
                                                "synchrony.pts": placed.token.start})

    def _check(self, placed: TokenFrames) -> None:
        if Stage.SYNC in self.host.degraded:
            return
        estimate, onset = self.feed.evidence(placed.token.start)
        self.feed.final_word(placed.token.start)
        check = attempt(self.host, Stage.SYNC, lambda: self.validator.check_estimate(
            placed.token, frame_pts(placed.frames[0]), estimate, onset))
        if check is None:
            return
        self.total += 1
        self.passed += int(check.ok)
        self.last_ok = check.ok
        self.observer.sync_checked(check)
        self.host.emit(SyncEvent(check))
