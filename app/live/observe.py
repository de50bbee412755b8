"""What a session's stages report as they work, and the observer that turns it into server metrics.

The stages say what happened (a word was placed, a check was made, a frame was dropped) and go on;
what is counted, and where, is the observer's business, so adding a metric never touches a stage.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from app.live.stages import Stage

if TYPE_CHECKING:
    from alignment.frames import TokenFrames
    from alignment.lst import TokenTiming
    from alignment.sync import SyncCheck
    from app.live.server_metrics import ServerMetrics


class Drop(StrEnum):
    """What a session drops rather than queues (``synchrony_drops_total{stage}``)."""

    EVENTS = "events"  # the events channel's send buffer is backed up
    VIDEO_OVERSIZED = "video_oversized"  # a camera frame larger than the session keeps
    AU_LATEST_WINS = "au_latest_wins"  # a camera frame replaced before face analysis took it
    OUTPUT_FRAMES = "output_frames"  # returned frames skipped to catch up with real time


class SessionObserver(Protocol):
    def dropped(self, what: Drop, n: int = 1) -> None: ...
    def stage_failed(self, stage: Stage) -> None: ...
    def faces_analysed(self, latency_s: float, compute_s: float) -> None: ...
    def frame_rendered(self, latency_s: float, compute_s: float) -> None: ...
    def token_placed(self, placed: TokenFrames, latency_s: float) -> None: ...
    def sync_checked(self, check: SyncCheck) -> None: ...
    def response_token(self, timing: TokenTiming) -> None: ...
    def voice_latency(self, seconds: float) -> None: ...
    def answer_ended(self, reason: str) -> None: ...
    def barge_in(self) -> None: ...
    def answer_sync_checked(self, ok: bool) -> None: ...


class MetricsObserver:
    """Records what sessions report in the server's Prometheus metrics."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def dropped(self, what: Drop, n: int = 1) -> None:
        self.metrics.drop(str(what), n)

    def stage_failed(self, stage: Stage) -> None:
        self.metrics.stage_errors.labels(str(stage)).inc()

    def faces_analysed(self, latency_s: float, compute_s: float) -> None:
        self.metrics.observe_stage(Stage.AU, latency_s, compute_s)

    def frame_rendered(self, latency_s: float, compute_s: float) -> None:
        self.metrics.observe_stage(Stage.RENDER, latency_s, compute_s)

    def token_placed(self, placed: TokenFrames, latency_s: float) -> None:
        """``latency_s``: wall time from the word's end to its token."""
        self.metrics.observe_stage(Stage.TOKEN_FINAL if placed.token.final else Stage.TOKEN_INTERIM, latency_s)

    def sync_checked(self, check: SyncCheck) -> None:
        self.metrics.sync(check.ok)

    def response_token(self, timing: TokenTiming) -> None:
        self.metrics.observe_lst(timing)

    def voice_latency(self, seconds: float) -> None:
        """The user's end of speech → the answer's first audio handed to the track."""
        self.metrics.voice_latency.observe(max(seconds, 0.0))

    def answer_ended(self, reason: str) -> None:
        self.metrics.answers.labels(reason).inc()

    def barge_in(self) -> None:
        self.metrics.barge_ins.inc()

    def answer_sync_checked(self, ok: bool) -> None:
        self.metrics.answer_sync.labels("true" if ok else "false").inc()
