"""Stable Video Diffusion as an output-frame source: clips of 16 fps frames generated ahead of playout.

The renderer turns the session's reference image (the latest camera frame, or a chosen avatar) into
short clips with diffusers' ``StableVideoDiffusionPipeline``. Each clip covers output frames
``[n*L, (n+1)*L)`` (frame k presented at k/16 s on the session clock, exactly like the overlay), so
token attachment (alignment.frames, ±40 ms) and the Level-3 validator run on them unchanged; the
overlay draws captions, AU bars and the sync badge over the generated picture.

Clip n+1 is generated in a worker thread while clip n plays. Every clip's real-time factor
(seconds of video per second of generation) is measured; when the last few clips all fall below
the required factor the renderer switches to the overlay for good and says why. docs/SVD.md says
exactly which signal conditions what.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from alignment.frames import FPS, frame_pts
from alignment.json_types import JsonObject
from alignment.types import AUSample, LoadEstimate, WordToken
from models.overlay import OverlayRenderer, fit_frame
from models.render import RendererUnavailable, RenderRequest
from models.svd_conditioning import (
    ClipConditioning,
    ClipWindow,
    SVDSettings,
    build_window,
    condition_clip,
    word_key,
)

if TYPE_CHECKING:
    import torch
    from diffusers import StableVideoDiffusionPipeline

log = logging.getLogger(__name__)

# --- loading and generation ---------------------------------------------------------------------

def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_svd_pipeline(
    model: str | Path, device: str | None = None, dtype: torch.dtype | None = None, variant: str | None = None
) -> StableVideoDiffusionPipeline:
    """A ``StableVideoDiffusionPipeline`` from a local directory or a hub id already in the HF cache.

    Never downloads: hub ids resolve with ``local_files_only=True``. Raises ``RendererUnavailable``
    with a message saying what to do when the weights are not here.
    """
    import torch
    from diffusers import StableVideoDiffusionPipeline

    device = device or _default_device()
    if dtype is None:
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
    path = Path(str(model)).expanduser()
    looks_local = path.exists() or str(model).startswith((".", "/", "~"))
    if looks_local and not (path / "model_index.json").is_file():
        raise RendererUnavailable(
            f"--svd-model {model}: no model_index.json there; point it at a saved "
            "StableVideoDiffusionPipeline directory (pipeline.save_pretrained(PATH))"
        )
    source = str(path) if looks_local else str(model)
    try:
        pipe = StableVideoDiffusionPipeline.from_pretrained(
            source, dtype=dtype, variant=variant, local_files_only=True
        )
    except (OSError, ValueError) as exc:
        where = "that directory" if looks_local else "a local directory or the local Hugging Face cache"
        raise RendererUnavailable(
            f"SVD weights {model!r} could not be loaded from {where} (downloads are disabled at run "
            f"time; save the pipeline to a directory and pass --svd-model PATH): {exc}"
        ) from exc
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def _check_gen_size(size: Sequence[int]) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in size)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"gen_size must be (width, height), got {size!r}") from exc
    if w < 16 or h < 16 or w % 8 or h % 8:
        raise ValueError(f"gen_size must be at least 16 px and a multiple of 8 a side, got {w}x{h}")
    return w, h


def load_avatar(avatar: str | Path | np.ndarray) -> np.ndarray:
    """An avatar image as RGB uint8, from a path or an array; clear errors for anything else."""
    if isinstance(avatar, np.ndarray):
        arr = avatar
    else:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(Path(avatar).expanduser()) as im:
                arr = np.asarray(im.convert("RGB"))
        except (OSError, UnidentifiedImageError) as exc:
            raise ValueError(f"avatar image {avatar!s} cannot be read: {exc}") from exc
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] not in (3, 4) or min(arr.shape[:2]) < 8:
        raise ValueError(f"avatar must be an (h, w, 3) uint8 RGB image, got {arr.dtype} {arr.shape}")
    return np.ascontiguousarray(arr[:, :, :3])


def generate_clip(
    pipe: StableVideoDiffusionPipeline, reference: np.ndarray, cond: ClipConditioning, n_frames: int,
    gen_size: tuple[int, int], decode_chunk_size: int | None = None,
) -> np.ndarray:
    """One clip: (n_frames, h, w, 3) uint8 RGB from ``reference`` under ``cond``."""
    import torch
    from PIL import Image

    w, h = gen_size
    image = Image.fromarray(fit_frame(reference, (w, h)))
    device = getattr(pipe, "_execution_device", None) or pipe.device
    gen_device = "cpu" if str(device).startswith("mps") else device
    generator = torch.Generator(device=gen_device).manual_seed(cond.seed)
    out = pipe(
        image,
        height=h,
        width=w,
        num_frames=n_frames,
        num_inference_steps=cond.num_inference_steps,
        min_guidance_scale=cond.min_guidance_scale,
        max_guidance_scale=cond.max_guidance_scale,
        fps=cond.fps,
        motion_bucket_id=cond.motion_bucket_id,
        noise_aug_strength=cond.noise_aug_strength,
        decode_chunk_size=decode_chunk_size or n_frames,
        generator=generator,
        output_type="np",
    ).frames
    frames = np.asarray(out)[0]
    return (np.clip(np.nan_to_num(frames), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


# --- the renderer -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Clip:
    """A generated clip: frame ``i`` is output frame ``first_frame + i``, presented at its pts."""

    index: int
    first_frame: int
    frames: np.ndarray = field(repr=False)  # (n, h, w, 3) uint8
    window: ClipWindow
    conditioning: ClipConditioning
    reference_pts: float | None  # pts of the camera frame used, None for an avatar
    gen_s: float  # wall seconds the generation took
    started: float  # perf_counter at start of generation

    @property
    def n_frames(self) -> int:
        return int(self.frames.shape[0])

    @property
    def pts(self) -> tuple[float, ...]:
        return tuple(frame_pts(self.first_frame + i) for i in range(self.n_frames))

    @property
    def rtf(self) -> float:
        """Seconds of video per second of generation: ≥ 1 keeps up with 16 fps playout."""
        return (self.n_frames / FPS) / max(self.gen_s, 1e-9)


@dataclass(frozen=True)
class ClipStat:
    """A generated clip without its pixels (what the report keeps)."""

    index: int
    first_frame: int
    n_frames: int
    gen_s: float
    rtf: float
    conditioning: ClipConditioning
    window: ClipWindow
    started: float  # perf_counter when generation began


@dataclass(frozen=True)
class SVDReport:
    """How the diffusion backend did: per-clip RTF, where frames came from, whether it gave up."""

    clips: tuple[ClipStat, ...]
    frames_svd: int
    frames_overlay: int
    late_frames: int  # frames served by the overlay because their clip was not ready in time
    skipped_clips: int  # clips dropped because playout had passed them before generation began
    min_rtf: float  # the RTF a clip needed to count as keeping up
    fallback: bool
    message: str | None

    @property
    def rtf_mean(self) -> float | None:
        """Total video seconds over total generation seconds."""
        if not self.clips:
            return None
        return sum(c.n_frames for c in self.clips) / FPS / max(sum(c.gen_s for c in self.clips), 1e-9)

    def as_dict(self) -> JsonObject:
        rtf = self.rtf_mean
        return {
            "backend": "svd",
            "clips": len(self.clips),
            "rtf_mean": None if rtf is None else round(rtf, 4),
            "rtf_per_clip": [round(c.rtf, 4) for c in self.clips],
            "motion_bucket_per_clip": [c.conditioning.motion_bucket_id for c in self.clips],
            "frames_svd": self.frames_svd,
            "frames_overlay": self.frames_overlay,
            "late_frames": self.late_frames,
            "skipped_clips": self.skipped_clips,
            "min_rtf": self.min_rtf,
            "fallback": self.fallback,
            "message": self.message,
        }


@dataclass(frozen=True)
class _Job:
    epoch: int  # the stream the job belongs to (see SVDRenderer.reset)
    clip_index: int
    first_frame: int
    n_frames: int
    reference: np.ndarray = field(repr=False)
    reference_pts: float | None
    window: ClipWindow
    conditioning: ClipConditioning


_STOP = None  # the worker's stop sentinel on the job queue


class SVDRenderer:
    """``FrameRenderer`` backed by Stable Video Diffusion, with a rolling clip schedule.

    ``realtime=True`` (live sessions): ``render`` never waits; a frame whose clip is not ready is
    drawn by the overlay and counted late, and ``fallback_after`` consecutive clips below
    ``min_rtf`` switch the renderer to the overlay for the rest of the session. ``realtime=False``
    (offline files): ``render`` waits for each clip, RTF is still measured and reported.
    """

    name = "svd"

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        svd_model: str | Path | None = None,
        pipeline: StableVideoDiffusionPipeline | None = None,
        avatar: str | Path | np.ndarray | None = None,
        clip_frames: int | None = None,
        gen_size: Sequence[int] = (1024, 576),
        steps: int = 10,
        settings: SVDSettings | None = None,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        variant: str | None = None,
        decode_chunk_size: int | None = 8,
        realtime: bool = True,
        min_rtf: float = 1.0,
        fallback_after: int = 3,
        captions: bool = True,
        size: Sequence[int] | None = None,
        wait_timeout_s: float = 600.0,
    ) -> None:
        model = model if model is not None else svd_model
        if pipeline is None:
            if model is None:
                raise RendererUnavailable(
                    "the 'svd' renderer needs weights: pass --svd-model PATH (a saved "
                    "StableVideoDiffusionPipeline directory, or a hub id already in the local HF cache)"
                )
            pipeline = load_svd_pipeline(model, device=device, dtype=dtype, variant=variant)
        else:
            pipeline.set_progress_bar_config(disable=True)
        if fallback_after < 1:
            raise ValueError("fallback_after must be at least 1")
        if min_rtf < 0:
            raise ValueError("min_rtf must be ≥ 0")
        self.pipe = pipeline
        self.settings = settings or SVDSettings(steps=steps)
        native = int(getattr(pipeline.unet.config, "num_frames", 14) or 14)
        self.clip_frames = int(clip_frames or native)
        if self.clip_frames < 2:
            raise ValueError("clip_frames must be at least 2")
        self.gen_size = _check_gen_size(gen_size)
        self.avatar = load_avatar(avatar) if avatar is not None else None
        self.decode_chunk_size = decode_chunk_size
        self.realtime = realtime
        self.min_rtf = float(min_rtf)
        self.fallback_after = int(fallback_after)
        self.captions = captions
        self.wait_timeout_s = wait_timeout_s
        self._overlay = OverlayRenderer(size=tuple(size) if size is not None else None)

        self._lock = threading.Condition()
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=2)  # clip n+1 (and at most one more)
        self._ready: dict[int, Clip] = {}
        self._scheduled: set[int] = set()
        self._stats: list[ClipStat] = []
        self._planned: list[WordToken] | None = None
        self._tokens: dict[tuple[int, int], WordToken] = {}
        self._aus: deque[AUSample] = deque(maxlen=4 * self.clip_frames)
        self._load: LoadEstimate | None = None
        self._camera: tuple[np.ndarray, float] | None = None
        self._playhead = -1
        self._epoch = 0
        self._frames_svd = self._frames_overlay = self._late = self._skipped = 0
        self._fallback = False
        self._message: str | None = None
        self.last_source: str | None = None
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="svd-clips", daemon=True)
        self._worker.start()

    # --- public API ---------------------------------------------------------------------------

    def plan(self, tokens: Iterable[WordToken]) -> None:
        """Give tokens known ahead (offline): each clip is then conditioned on its own frames' window."""
        self._planned = sorted(tokens, key=lambda t: t.start)

    def render(self, request: RenderRequest) -> np.ndarray:
        """Frame ``request.index``: from its generated clip when ready, else from the overlay.

        An index lower than one already rendered, or frame 0 again, starts a new stream (``reset``):
        one renderer follows one frame sequence at a time (a warm-up render is not a session).
        """
        if self._closed:
            raise RuntimeError("SVDRenderer is closed")
        if request.index < self._playhead or (request.index == 0 and self._playhead >= 0):
            self.reset()
        self._observe(request)
        if self._fallback:
            return self._from_overlay(request)
        n = request.index // self.clip_frames
        self._schedule(n, block=not self.realtime)
        self._schedule(n + 1)  # keep one clip ahead of playout
        with self._lock:
            clip = self._ready.get(n)
            if clip is None and not self.realtime and n in self._scheduled:
                deadline = time.monotonic() + self.wait_timeout_s
                while n not in self._ready and not self._fallback and time.monotonic() < deadline:
                    self._lock.wait(timeout=0.5)
                clip = self._ready.get(n)
            self._forget_before(n)
        if clip is None:
            if not self._fallback:
                self._late += 1
            return self._from_overlay(request)
        image = clip.frames[request.index - clip.first_frame]
        self._frames_svd += 1
        self.last_source = "svd"
        if self.captions:
            return self._overlay.render(replace(request, camera=image))
        return fit_frame(image, self._overlay.default_size or request.size)

    def report(self) -> SVDReport:
        """Where things stand now (safe to call at any time)."""
        with self._lock:
            return SVDReport(
                clips=tuple(self._stats),
                frames_svd=self._frames_svd,
                frames_overlay=self._frames_overlay,
                late_frames=self._late,
                skipped_clips=self._skipped,
                min_rtf=self.min_rtf,
                fallback=self._fallback,
                message=self._message,
            )

    def reset(self) -> None:
        """Forget the current stream (clips, words, reference); measured RTFs and fallback stay."""
        with self._lock:
            self._epoch += 1
            self._ready.clear()
            self._scheduled.clear()
            self._tokens.clear()
            self._aus.clear()
            self._load = None
            self._camera = None
            self._playhead = -1
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break

    @property
    def fallback(self) -> bool:
        return self._fallback

    def close(self) -> None:
        """Stop the worker (after the clip in progress) and drop generated frames."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._ready.clear()
            self._lock.notify_all()
        while True:  # make room for the stop marker without blocking on a full queue
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        self._jobs.put(_STOP)
        self._worker.join(timeout=self.wait_timeout_s)

    # --- internals ----------------------------------------------------------------------------

    def _from_overlay(self, request: RenderRequest) -> np.ndarray:
        self._frames_overlay += 1
        self.last_source = "overlay"
        return self._overlay.render(request)

    def _observe(self, request: RenderRequest) -> None:
        self._playhead = max(self._playhead, request.index)
        for tok in (*request.caption, *request.new_words):
            self._tokens[word_key(tok)] = tok  # a revision replaces the interim word
        if len(self._tokens) > 512:  # bounded: keep the newest words
            for key in sorted(self._tokens, key=lambda k: self._tokens[k].start)[:-256]:
                del self._tokens[key]
        if request.au is not None:
            self._aus.append(request.au)
        if request.load is not None:
            self._load = request.load
        if request.camera is not None:
            self._camera = (request.camera, request.pts)

    def _reference(self) -> tuple[np.ndarray, float | None] | None:
        if self.avatar is not None:
            return self.avatar, None
        if self._camera is not None:
            return np.array(self._camera[0], copy=True), self._camera[1]
        return None

    def _window_for(self, n: int) -> ClipWindow:
        first = n * self.clip_frames
        if self._planned is not None:
            return build_window(first, self.clip_frames, self._planned, self._aus, self._load, own=True)
        # Live: the clip's own words are not known yet; use the clip_frames frames up to the playhead.
        last = max(self._playhead, 0)
        start = max(last - self.clip_frames + 1, 0)
        return build_window(start, last - start + 1, self._tokens.values(), self._aus, self._load, own=False)

    def _schedule(self, n: int, block: bool = False) -> None:
        if n in self._scheduled or self._fallback:
            return
        ref = self._reference()
        if ref is None:
            return  # nothing to animate yet: the overlay draws these frames
        window = self._window_for(n)
        job = _Job(self._epoch, n, n * self.clip_frames, self.clip_frames, ref[0], ref[1], window,
                   condition_clip(window, n, self.settings))
        try:
            self._jobs.put(job, block=block, timeout=self.wait_timeout_s if block else None)
        except queue.Full:
            return  # the worker is behind; try again on a later frame
        self._scheduled.add(n)
        for old in [k for k in self._scheduled if k < n - 2]:
            self._scheduled.discard(old)

    def _forget_before(self, n: int) -> None:
        for k in [k for k in self._ready if k < n]:
            del self._ready[k]

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            if self._closed or self._fallback or job.epoch != self._epoch:
                continue
            if self.realtime and job.first_frame + job.n_frames - 1 < self._playhead:
                with self._lock:
                    self._skipped += 1  # playout is already past this clip
                continue
            started = time.perf_counter()
            try:
                frames = generate_clip(self.pipe, job.reference, job.conditioning, job.n_frames,
                                       self.gen_size, self.decode_chunk_size)
            except Exception as exc:  # any generation failure degrades to the overlay, never crashes
                self._give_up(f"SVD generation failed ({type(exc).__name__}: {exc}); using the overlay")
                continue
            clip = Clip(job.clip_index, job.first_frame, frames, job.window, job.conditioning,
                        job.reference_pts, time.perf_counter() - started, started)
            self._finish(clip, job.epoch)

    def _finish(self, clip: Clip, epoch: int) -> None:
        with self._lock:
            self._stats.append(ClipStat(clip.index, clip.first_frame, clip.n_frames, clip.gen_s, clip.rtf,
                                        clip.conditioning, clip.window, clip.started))
            if not self._closed and epoch == self._epoch:
                self._ready[clip.index] = clip
            self._lock.notify_all()
            recent = self._stats[-self.fallback_after:]
            slow = (self.realtime and len(recent) == self.fallback_after
                    and all(s.rtf < self.min_rtf for s in recent))
        if slow:
            rtfs = ", ".join(f"{s.rtf:.2f}" for s in recent)
            self._give_up(
                f"SVD cannot keep up with {FPS} fps playout: real-time factor {rtfs} for the last "
                f"{self.fallback_after} clips (needs ≥ {self.min_rtf:g}); switched to the overlay renderer"
            )

    def _give_up(self, message: str) -> None:
        with self._lock:
            if self._fallback:
                return
            self._fallback = True
            self._message = message
            self._ready.clear()
            self._lock.notify_all()
        log.warning("%s", message)

