"""The returned video: frame k (pts k/16) rendered ``output_delay_s`` after camera time k/16 arrived.

The delay is what lets words land on their frames: by the time frame k is drawn, the words spoken
at k/16 are (usually) known. :class:`FrameComposer` gathers what frame k shows (camera, caption,
AU bars, load, the last Level-3 verdict) and renders it; :class:`OutputTrack` paces the frames and
knows nothing of the session beyond the composer and the clock.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from alignment.clock import SessionClock
from alignment.frames import FPS, TokenFrames, frame_pts
from alignment.types import WordToken
from app.live.au import FaceAnalysis
from app.live.convert import rgb
from app.live.degrade import Degradation
from app.live.level3 import SyncStage
from app.live.observe import Drop, SessionObserver
from app.live.reliability import lower_thread_priority
from app.live.stages import Stage, StageHost
from app.live.words import ShownWords
from models.video import FrameRenderer, RenderRequest

try:
    import cv2 as _cv2  # ships with mediapipe
except ImportError:  # pragma: no cover - the conversion falls back to libswscale
    _cv2 = None
else:
    # OpenCV splits each conversion over a pool of its own threads, which wait busy for the next
    # one: on a server that converts many small frames for many sessions that costs more CPU than
    # the conversions. One thread each (process-wide), as for the VP8 encoder.
    _cv2.setNumThreads(1)

VIDEO_CLOCK = 90_000  # RTP clock rate of video
#: The returned video's frames are drawn here, apart from the default executor where aiortc encodes
#: them, so the two stages' CPU can be told apart (app.live.cpu_account); two threads serve every session.
#: They run at nice ``RENDER_NICE``: a frame is drawn ``output_delay_s`` (1.5 s) before it is due, the audio
#: path and the ASR have no such slack.
RENDER_NICE = 3
_RENDER_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="render",
                                  initializer=lambda: lower_thread_priority(RENDER_NICE))
CAPTION_HOLD_S = 4.0  # a caption stays up this long after its last word
CAPTION_WORDS = 12


def caption_at(placed: Iterable[TokenFrames], k: int) -> tuple[WordToken, ...]:
    """Words of the latest utterance already shown by frame ``k`` (for 4 s after its last word)."""
    shown = [s for s in placed if s.frames and s.frames[0] <= k]
    if not shown:
        return ()
    latest = max(s.token.utterance for s in shown)
    words = sorted((s.token for s in shown if s.token.utterance == latest), key=lambda w: w.start)
    if words and frame_pts(k) - words[-1].end > CAPTION_HOLD_S:
        return ()
    return tuple(words[-CAPTION_WORDS:])


def to_yuv420p(image: np.ndarray) -> av.VideoFrame:
    """An RGB image as a yuv420p frame (BT.601 limited range, what libswscale gives: same values)."""
    h, w = image.shape[:2]
    if _cv2 is not None and h % 2 == 0 and w % 2 == 0:
        yuv = _cv2.cvtColor(np.ascontiguousarray(image), _cv2.COLOR_RGB2YUV_I420)
        return av.VideoFrame.from_ndarray(yuv, format="yuv420p")
    return av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")


class CameraFrames:
    """Recent decoded camera frames (references, ~2 s), kept for rendering."""

    def __init__(self, keep: int = 64) -> None:
        self._frames: deque[tuple[float, av.VideoFrame]] = deque(maxlen=keep)

    def __len__(self) -> int:
        return len(self._frames)

    def append(self, t: float, frame: av.VideoFrame) -> None:
        self._frames.append((t, frame))

    def at(self, t: float) -> av.VideoFrame | None:
        """The latest frame at or before ``t`` (the oldest kept if all are later)."""
        for ct, frame in reversed(self._frames):
            if ct <= t + 1e-6:
                return frame
        return self._frames[0][1] if self._frames else None

    def clear(self) -> None:
        self._frames.clear()


@dataclass(frozen=True)
class FrameSources:
    """What a returned frame shows, each read from the stage that makes it."""

    camera: CameraFrames
    words: ShownWords  # the captions and the words new on each frame (``app.live.words``)
    faces: FaceAnalysis  # AU bars and load
    sync: SyncStage | None = None  # the last Level-3 verdict (None: no validator)


class FrameComposer:
    """What each returned frame shows, and the renderer that draws it (the camera if it fails)."""

    def __init__(self, host: StageHost, sources: FrameSources, renderer: FrameRenderer | None,
                 size: tuple[int, int], degradation: Degradation | None = None) -> None:
        """``size``: the returned video's (halved at the degradation's video step)."""
        self.host, self.sources, self.renderer, self.size = host, sources, renderer, size
        self.degradation = degradation
        self._fallback: np.ndarray | None = None

    def output_size(self) -> tuple[int, int]:
        """The returned video's size now: the configured one, halved at the degradation's video step."""
        w, h = self.size
        scale = self.degradation.effects.output_scale if self.degradation is not None else 1.0
        return (w, h) if scale >= 1.0 else (max(2 * round(w * scale / 2), 16), max(2 * round(h * scale / 2), 16))

    def request(self, k: int) -> Callable[[], RenderRequest]:
        """Collect what frame ``k`` shows (on the loop, cheap); the returned call builds the request
        (camera conversion included) and is run in the render thread."""
        t, src = frame_pts(k), self.sources
        best = src.camera.at(t)
        new_words = src.words.new_words(k)
        caption = caption_at(src.words.placed(), k)
        au, load = src.faces.au_at(t), src.faces.load_at(t)
        sync = src.sync
        sync_ok, size = (sync.last_ok if sync is not None else None), self.output_size()

        def build() -> RenderRequest:
            camera = rgb(best, size) if best is not None else None
            return RenderRequest(index=k, pts=t, camera=camera, caption=caption, new_words=new_words, au=au,
                                 load=load, sync_ok=sync_ok, size=size)

        return build

    def render(self, build: Callable[[], RenderRequest]) -> av.VideoFrame:
        """Render thread: the frame as the encoder takes it (yuv420p), so it is not converted later
        in aiortc's encoder thread by libswscale (~10x slower for this conversion)."""
        return to_yuv420p(self._draw(build()))

    def _draw(self, request: RenderRequest) -> np.ndarray:
        renderer = self.renderer
        if renderer is not None and Stage.RENDER not in self.host.degraded:
            try:
                return renderer.render(request)
            except Exception as exc:  # noqa: BLE001
                self.host.loop.call_soon_threadsafe(self.host.fail_stage, Stage.RENDER, exc)
        if request.camera is not None:
            return request.camera
        w, h = request.size
        if self._fallback is None or self._fallback.shape[:2] != (h, w):
            self._fallback = np.zeros((h, w, 3), np.uint8)
        return self._fallback

    def prune(self, k: int) -> None:
        self.sources.words.prune(k)


class OutputTrack(MediaStreamTrack):
    """The 16 fps video the session sends back: frame k rendered at camera time k/16 + output delay."""

    kind = "video"

    def __init__(self, clock: SessionClock, delay_s: float, composer: FrameComposer,
                 observer: SessionObserver) -> None:
        super().__init__()
        self.clock, self.delay_s, self.composer, self.observer = clock, delay_s, composer, observer
        self.next_index = 0
        self.sent = 0

    async def recv(self) -> av.VideoFrame:
        while not self.clock.started:
            if self.readyState != "live":
                raise MediaStreamError
            await asyncio.sleep(0.02)
        if self.readyState != "live":
            raise MediaStreamError
        zero = self.clock.zero_wall
        assert zero is not None
        k = self.next_index
        behind = math.floor((time.monotonic() - zero - self.delay_s) * FPS) - k
        if behind > 2:  # rendering fell behind real time: skip ahead rather than queue up
            self.observer.dropped(Drop.OUTPUT_FRAMES, behind)
            k += behind
        due = zero + frame_pts(k) + self.delay_s
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self.next_index = k + 1
        build = self.composer.request(k)
        c0 = time.monotonic()
        frame = await asyncio.get_running_loop().run_in_executor(_RENDER_POOL, self.composer.render, build)
        self.observer.frame_rendered(time.monotonic() - (zero + frame_pts(k)), time.monotonic() - c0)
        self.composer.prune(k)
        frame.pts = int(round(frame_pts(k) * VIDEO_CLOCK))
        frame.time_base = Fraction(1, VIDEO_CLOCK)
        self.sent += 1
        return frame
