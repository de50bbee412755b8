"""The AU stage: the latest camera frame → face AUs (MediaPipe) → load controller, off the event loop.

Face analysis costs ~9 ms a frame and must never hold up audio, so it runs in one worker thread per
session, fed through a one-slot mailbox (the latest frame wins: a frame not yet taken is replaced,
never queued). Its results go back to the event loop, which emits ``au`` / ``load`` events and keeps
a short history for the returned video's overlay.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import av

from alignment.clock import SessionClock
from alignment.types import AUSample, LoadEstimate, VideoFrame
from app.live.convert import rgb
from app.live.cpu_account import name_native_thread
from app.live.degrade import Degradation
from app.live.events import AUEvent, LoadEvent
from app.live.observe import Drop, SessionObserver
from app.live.reliability import lower_thread_priority
from app.live.stages import Controller, FaceExtractor, SessionConfig, Stage, StageHost, Stages


class FrameRate:
    """Which frames a stage processes to run at most ``fps`` on average, decided on their pts.

    A credit bucket, not a minimum gap: at 16/s from a 25 fps camera it takes 16 frames of every 25
    (a minimum gap of 1/16 s would take every other frame, 12.5/s). A frame whose pts goes backwards
    (a clock step) is taken and restarts the count.
    """

    def __init__(self, fps: float) -> None:
        if fps <= 0:
            raise ValueError("fps must be > 0")
        self.fps = fps
        self._credit = 1.0
        self._last: float | None = None

    def take(self, pts: float) -> bool:
        if self._last is not None and pts >= self._last:
            self._credit = min(2.0, self._credit + (pts - self._last) * self.fps)  # ≤ 1 frame ahead
        else:
            self._credit = 1.0
        self._last = pts
        if self._credit >= 1.0 - 1e-9:
            self._credit -= 1.0
            return True
        return False


@dataclass(frozen=True)
class FaceResult:
    """One analysed frame, as the worker hands it to the event loop."""

    sample: AUSample
    estimate: LoadEstimate | None
    compute_s: float
    mouth: float | None  # mouth openness for the lip evidence (None: no face)


class FaceAnalysis:
    """One session's AU worker thread and the AU / load history it produced."""

    def __init__(self, host: StageHost, config: SessionConfig, stages: Stages, clock: SessionClock,
                 observer: SessionObserver, degradation: Degradation | None, *,
                 visual: Callable[[float, float | None], None] | None = None,
                 load_changed: Callable[[LoadEstimate], None] | None = None) -> None:
        """``visual``: called on the loop with each result's pts and mouth openness (the A/V offset
        evidence, ``app.live.level3.OffsetFeed.visual``); ``load_changed``: with each new load estimate
        (``app.live.response.Responses.set_load``: the answers follow its policy)."""
        self.host, self.config, self.clock = host, config, clock
        self.observer, self.degradation = observer, degradation
        self._visual, self._load_changed = visual, load_changed
        self._stages = stages
        self.au: deque[AUSample] = deque(maxlen=128)
        self.load: deque[LoadEstimate] = deque(maxlen=128)
        self._slot: tuple[float, av.VideoFrame, float] | None = None
        self._slot_cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the loop side ------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the worker (once, and only with a face stage)."""
        make_faces = self._stages.make_faces
        if make_faces is not None and self._thread is None:
            self._thread = threading.Thread(target=self._work, args=(make_faces,), name=f"au-{self.host.id}",
                                            daemon=True)
            self._thread.start()

    def offer(self, t: float, frame: av.VideoFrame, arrival: float) -> None:
        """The latest camera frame; replaces one the worker has not taken yet."""
        with self._slot_cond:
            if self._slot is not None:
                self.observer.dropped(Drop.AU_LATEST_WINS)
            self._slot = (t, frame, arrival)
            self._slot_cond.notify()

    def stop(self) -> None:
        self._stop.set()
        with self._slot_cond:
            self._slot_cond.notify_all()

    async def join(self, timeout_s: float = 3.0) -> None:
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout_s)

    @property
    def frame_waiting(self) -> bool:
        """A camera frame is in the mailbox, not yet taken by the worker."""
        return self._slot is not None

    def forget_frame(self) -> None:
        self._slot = None

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def au_at(self, t: float) -> AUSample | None:
        return next((s for s in reversed(self.au) if s.pts <= t), None)

    def load_at(self, t: float) -> LoadEstimate | None:
        return next((e for e in reversed(self.load) if e.pts <= t), None)

    def _deliver(self, result: FaceResult) -> None:
        sample = result.sample
        self.au.append(sample)
        wall = self.clock.wall_of(sample.pts)
        if wall is not None:
            self.observer.faces_analysed(time.monotonic() - wall, result.compute_s)
        self.host.emit(AUEvent(sample))
        if self._visual is not None:
            self._visual(sample.pts, result.mouth)
        estimate = result.estimate
        if estimate is not None:
            self.load.append(estimate)
            if self._load_changed is not None:
                self._load_changed(estimate)
            self.host.emit(LoadEvent(estimate))

    # --- the worker thread --------------------------------------------------------------------

    def _fail(self, stage: Stage, exc: BaseException) -> None:
        self.host.loop.call_soon_threadsafe(self.host.fail_stage, stage, exc)

    def _open(self, make_faces: Callable[[], FaceExtractor]) -> tuple[FaceExtractor, Controller | None] | None:
        lower_thread_priority(self.config.au_nice)  # before make_faces, so MediaPipe's threads inherit it
        name_native_thread("au-" + self.host.id[:8])  # ... and its name, so their CPU is counted as face analysis
        try:
            faces = make_faces()
            controller = self._stages.make_controller() if self._stages.make_controller else None
        except Exception as exc:  # noqa: BLE001
            self._fail(Stage.AU, exc)
            return None
        return faces, controller

    def _next_frame(self) -> tuple[float, av.VideoFrame] | None:
        """Wait for the mailbox's frame; None once stopped."""
        with self._slot_cond:
            while self._slot is None and not self._stop.is_set():
                self._slot_cond.wait(0.5)
            if self._stop.is_set() or self._slot is None:
                return None
            (t, frame, _arrival), self._slot = self._slot, None
        return t, frame

    def _work(self, make_faces: Callable[[], FaceExtractor]) -> None:
        """Worker thread: latest camera frame → AUs → controller; results to the loop."""
        opened = self._open(make_faces)
        if opened is None:
            return
        faces, controller = opened
        rate = FrameRate(self.config.au_max_fps)
        while (got := self._next_frame()) is not None:
            t, frame = got
            if self.degradation is not None:
                rate.fps = min(self.config.au_max_fps, self.degradation.effects.au_fps)
            if not rate.take(t):
                continue
            try:
                c0 = time.monotonic()
                obs = faces.extract_full(VideoFrame(t, rgb(frame)))
                sample, mouth = obs.au, (obs.mouth_open if obs.face else None)
                compute = time.monotonic() - c0
            except Exception as exc:  # noqa: BLE001
                self._fail(Stage.AU, exc)
                return
            estimate = None
            if controller is not None and Stage.LOAD not in self.host.degraded:
                try:
                    estimate = controller.step(sample)
                except Exception as exc:  # noqa: BLE001
                    self._fail(Stage.LOAD, exc)
                    controller = None
            try:
                self.host.loop.call_soon_threadsafe(self._deliver, FaceResult(sample, estimate, compute, mouth))
            except RuntimeError:  # loop closed
                return
        faces.close()
