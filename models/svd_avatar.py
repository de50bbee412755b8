"""The answer's avatar from Stable Video Diffusion, each frame conditioned on its own drawing.

``StableVideoDiffusionPipeline`` concatenates ONE reference image's VAE latent to every frame's noise
(the UNet's input channels 4-7). ``generate_conditioned_clip`` runs the same denoising loop itself
but gives frame i the latent of reference i: for the answer, the CPU avatar drawn for output frame
``n*L + i`` with the mouth and the caption words that ``models.avatar_plan`` gives that frame (the
seeds' ``svd_step(frame_idx, cond=aligned_tokens)``). The CLIP image embedding (cross-attention)
stays the neutral face's. The noise augmentation of the references is one pattern per clip, so
frames' conditioning latents differ only where their drawings differ. ``SVDAvatar`` generates an
answer's clips in a worker thread; a frame whose clip is not ready is drawn on the CPU (clips are
exempt from the latency targets). Published SVD weights were trained with one repeated latent:
whether they follow per-frame latents is unmeasured (docs/AVATAR.md).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from alignment.frames import FPS
from models.avatar import AvatarRenderer
from models.avatar_plan import AnswerPlan, FrameCondition
from models.overlay import fit_frame
from models.render import RendererUnavailable
from models.svd import _check_gen_size, load_svd_pipeline
from models.svd_conditioning import ClipConditioning, SVDSettings, build_window, condition_clip
from models.visemes import REST

log = logging.getLogger(__name__)


# --- one clip ------------------------------------------------------------------------------------

def _as_frames(references: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    refs = np.asarray(references)
    if refs.dtype != np.uint8 or refs.ndim != 4 or refs.shape[3] != 3 or refs.shape[0] < 1:
        raise ValueError(f"references must be (n, h, w, 3) uint8 RGB frames, got {refs.dtype} {refs.shape}")
    _check_gen_size((refs.shape[2], refs.shape[1]))
    return refs


def _to_pixels(frames: np.ndarray, torch: Any, device: Any) -> Any:
    """uint8 (n, h, w, 3) → float (n, 3, h, w) in [-1, 1], as the pipeline's VideoProcessor does it."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).to(device).permute(0, 3, 1, 2).float() / 255.0
    return x * 2.0 - 1.0


def frame_latents(pipe: Any, references: np.ndarray, noise_aug_strength: float = 0.0,
                  generator: Any = None, chunk: int = 8) -> Any:
    """VAE latents (n, 4, h/8, w/8) of each reference, after one shared noise-augmentation pattern."""
    import torch
    from diffusers.utils.torch_utils import randn_tensor

    device = pipe._execution_device
    pixels = _to_pixels(references, torch, device)
    if noise_aug_strength > 0:
        noise = randn_tensor((1, *pixels.shape[1:]), generator=generator, device=device, dtype=pixels.dtype)
        pixels = pixels + noise_aug_strength * noise
    upcast = pipe.vae.dtype == torch.float16 and pipe.vae.config.force_upcast
    if upcast:
        pipe.vae.to(dtype=torch.float32)
    try:
        pixels = pixels.to(dtype=pipe.vae.dtype)
        parts = [pipe.vae.encode(pixels[i:i + chunk]).latent_dist.mode() for i in range(0, len(pixels), chunk)]
    finally:
        if upcast:
            pipe.vae.to(dtype=torch.float16)
    return torch.cat(parts)


def generate_conditioned_clip(
    pipe: Any, references: np.ndarray | Sequence[np.ndarray], cond: ClipConditioning, *,
    identity: np.ndarray | None = None, decode_chunk_size: int | None = None,
) -> np.ndarray:
    """A clip whose frame i is conditioned on ``references[i]``: (n, h, w, 3) uint8 RGB at their size.

    ``identity`` (default ``references[0]``) gives the CLIP embedding; guidance, time ids, noise and
    the Euler loop are ``StableVideoDiffusionPipeline``'s, on a copy of its scheduler (thread-safe).
    """
    import torch
    from diffusers.pipelines.stable_video_diffusion.pipeline_stable_video_diffusion import retrieve_timesteps
    from PIL import Image

    refs = _as_frames(references)
    n, h, w = refs.shape[:3]
    ident = refs[0] if identity is None else fit_frame(np.asarray(identity), (w, h))
    device = pipe._execution_device
    generator = torch.Generator(device="cpu" if str(device).startswith("mps") else device).manual_seed(cond.seed)
    cfg = cond.max_guidance_scale > 1.0
    with torch.inference_mode():
        embeddings = pipe._encode_image(Image.fromarray(ident), device, 1, cfg)
        dtype = embeddings.dtype
        latents_c = frame_latents(pipe, refs, cond.noise_aug_strength, generator,
                                  decode_chunk_size or 8).to(dtype).unsqueeze(0)  # (1, n, 4, h/8, w/8)
        if cfg:
            latents_c = torch.cat([torch.zeros_like(latents_c), latents_c])
        time_ids = pipe._get_add_time_ids(cond.fps - 1, cond.motion_bucket_id, cond.noise_aug_strength, dtype,
                                          1, 1, cfg).to(device)  # SVD was trained on fps - 1
        scheduler = copy.deepcopy(pipe.scheduler)
        timesteps, _ = retrieve_timesteps(scheduler, cond.num_inference_steps, device)
        latents = _initial_noise(pipe, n, h, w, dtype, device, generator) * scheduler.init_noise_sigma
        scale = torch.linspace(cond.min_guidance_scale, cond.max_guidance_scale, n, device=device, dtype=dtype)
        scale = scale.reshape(1, n, 1, 1, 1)
        for t in timesteps:
            x = torch.cat([latents] * 2) if cfg else latents
            x = torch.cat([scheduler.scale_model_input(x, t), latents_c], dim=2)
            pred = pipe.unet(x, t, encoder_hidden_states=embeddings, added_time_ids=time_ids, return_dict=False)[0]
            if cfg:
                uncond, with_cond = pred.chunk(2)
                pred = uncond + scale * (with_cond - uncond)
            latents = scheduler.step(pred, t, latents).prev_sample
        video = pipe.decode_latents(latents, n, decode_chunk_size or n)
        frames = pipe.video_processor.postprocess_video(video=video, output_type="np")
    frames = np.asarray(frames)[0]
    return (np.clip(np.nan_to_num(frames), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _initial_noise(pipe: Any, n: int, h: int, w: int, dtype: Any, device: Any, generator: Any) -> Any:
    """The initial noise of an n-frame clip, shaped as the pipeline's ``prepare_latents`` shapes it."""
    from diffusers.utils.torch_utils import randn_tensor

    c = pipe.unet.config.in_channels // 2
    f = pipe.vae_scale_factor
    return randn_tensor((1, n, c, h // f, w // f), generator=generator, device=device, dtype=dtype)


# --- an answer's clips ---------------------------------------------------------------------------

def draw_references(plan: AnswerPlan, avatar: AvatarRenderer, first_frame: int, n_frames: int) -> np.ndarray:
    """The CPU avatar for output frames ``first_frame ..`` under ``plan``: (n, h, w, 3) uint8."""
    out = []
    for k in range(first_frame, first_frame + n_frames):
        c = plan.condition(k)
        out.append(avatar.draw(c.mouth, c.caption, c.highlight, t=c.pts))
    return np.stack(out)


@dataclass(frozen=True)
class AvatarClip:
    """Generated frames of clip ``index``: frame i is output frame ``first_frame + i``."""

    index: int
    first_frame: int
    frames: np.ndarray = field(repr=False)  # (L, h, w, 3) uint8 at gen_size
    conditions: tuple[FrameCondition, ...] = field(repr=False)  # what each frame was conditioned on
    conditioning: ClipConditioning
    gen_s: float

    @property
    def rtf(self) -> float:
        """Seconds of video per second of generation (≥ 1 keeps up with 16 fps)."""
        return (len(self.frames) / FPS) / max(self.gen_s, 1e-9)


def make_avatar_clip(pipe: Any, avatar: AvatarRenderer, plan: AnswerPlan, n: int, clip_frames: int,
                     settings: SVDSettings, decode_chunk_size: int | None = None) -> AvatarClip:
    """Clip ``n`` of ``plan``: each frame conditioned on its drawing, motion on the clip's words."""
    first = n * clip_frames
    conditions = tuple(plan.condition(k) for k in range(first, first + clip_frames))
    window = build_window(first, clip_frames, [item.token for item in plan.tokens], own=True)
    cond = condition_clip(window, n, settings)
    started = time.perf_counter()
    refs = draw_references(plan, avatar, first, clip_frames)
    frames = generate_conditioned_clip(pipe, refs, cond, identity=avatar.draw(REST),
                                       decode_chunk_size=decode_chunk_size)
    return AvatarClip(n, first, frames, conditions, cond, time.perf_counter() - started)


# --- the renderer the answer's avatar track uses --------------------------------------------------

@dataclass(frozen=True)
class SVDAvatarReport:
    """How the SVD avatar did: clips made, their real-time factors, where frames came from."""

    clips: int
    rtf_per_clip: tuple[float, ...]
    frames_svd: int
    frames_cpu: int  # drawn on the CPU: no clip ready for them (or generation failed)
    message: str | None  # why generation stopped, if it did


class SVDAvatar:
    """Avatar frames for a spoken answer, generated by SVD a few clips ahead of the playhead.

    ``play(plan)`` starts an answer or extends it (a phrase more): ready clips whose frames'
    conditions are unchanged are kept, a new answer replaces the old one. ``frame(k)`` returns output
    frame k at ``size``: from its clip when ready, else the CPU avatar drawn from the same plan, so a
    slow GPU costs picture quality, never timing. ``stop()`` (barge-in) drops the answer.
    """

    name = "svd-avatar"

    def __init__(self, model: str | Path | None = None, *, pipeline: Any = None,
                 gen_size: Sequence[int] = (1024, 576), size: Sequence[int] | None = None,
                 clip_frames: int | None = None, steps: int = 10, settings: SVDSettings | None = None,
                 device: str | None = None, dtype: Any = None, variant: str | None = None,
                 decode_chunk_size: int | None = 8, ahead_clips: int = 2) -> None:
        if pipeline is None:
            if model is None:
                raise RendererUnavailable(
                    "the SVD avatar needs weights: pass --svd-model PATH (a saved StableVideoDiffusionPipeline "
                    "directory, or a hub id already in the local HF cache)")
            pipeline = load_svd_pipeline(model, device=device, dtype=dtype, variant=variant)
        pipeline.set_progress_bar_config(disable=True)
        if ahead_clips < 1:
            raise ValueError("ahead_clips must be at least 1")
        self.pipe = pipeline
        self.gen_size = _check_gen_size(gen_size)
        self.size = (int(size[0]), int(size[1])) if size is not None else self.gen_size
        self.avatar = AvatarRenderer(self.gen_size)  # the references SVD is conditioned on
        self._cpu = self.avatar if self.size == self.gen_size else AvatarRenderer(self.size)
        self.clip_frames = int(clip_frames or getattr(pipeline.unet.config, "num_frames", 14) or 14)
        if self.clip_frames < 2:
            raise ValueError("clip_frames must be at least 2")
        self.settings = settings or SVDSettings(steps=steps)
        self.decode_chunk_size = decode_chunk_size
        self.ahead_clips = int(ahead_clips)
        self._lock = threading.Condition()
        self._plan: AnswerPlan | None = None
        self._ready: dict[int, AvatarClip] = {}
        self._playhead = -1
        self._rtf: list[float] = []
        self._svd = self._drawn = 0
        self._message: str | None = None
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="svd-avatar", daemon=True)
        self._worker.start()

    def play(self, plan: AnswerPlan) -> None:
        """Show ``plan`` from now on; clips already made for frames it conditions the same way stay."""
        with self._lock:
            self._plan = plan
            for n in [n for n, c in self._ready.items() if not self._valid(c, plan)]:
                del self._ready[n]
            self._lock.notify_all()

    def stop(self) -> None:
        """The answer stopped (barge-in, or done): frames rest from now on."""
        with self._lock:
            self._plan = None
            self._ready.clear()
            self._lock.notify_all()

    def frame(self, index: int, wait_s: float = 0.0) -> np.ndarray:
        """Output frame ``index`` at ``size`` (RGB uint8); waits up to ``wait_s`` for its clip (offline)."""
        if self._closed:
            raise RuntimeError("SVDAvatar is closed")
        n, i = divmod(index, self.clip_frames)
        deadline = time.monotonic() + wait_s
        with self._lock:
            self._playhead = max(self._playhead, index)
            self._lock.notify_all()
            plan = self._plan
            clip = self._ready.get(n)
            while (clip is None and plan is not None and self._message is None
                   and n in plan.clip_indices(self.clip_frames) and time.monotonic() < deadline):
                self._lock.wait(timeout=min(0.5, max(deadline - time.monotonic(), 0.01)))
                plan, clip = self._plan, self._ready.get(n)
            for old in [k for k in self._ready if k < n]:
                del self._ready[old]
            cond = plan.condition(index) if plan is not None else None
            if clip is not None and cond is not None and clip.conditions[i] == cond:
                self._svd += 1
                return fit_frame(clip.frames[i], self.size)
            self._drawn += 1
        if cond is None:
            return self._cpu.draw(REST, t=index / FPS)
        return self._cpu.draw(cond.mouth, cond.caption, cond.highlight, t=cond.pts)

    def report(self) -> SVDAvatarReport:
        with self._lock:
            return SVDAvatarReport(len(self._rtf), tuple(self._rtf), self._svd, self._drawn, self._message)

    def close(self) -> None:
        """Stop the worker after the clip in progress."""
        with self._lock:
            self._closed = True
            self._ready.clear()
            self._lock.notify_all()
        self._worker.join(timeout=600)

    # --- the worker ---------------------------------------------------------------------------

    def _valid(self, clip: AvatarClip, plan: AnswerPlan) -> bool:
        return all(plan.condition(c.index) == c for c in clip.conditions)

    def _next_clip(self) -> tuple[AnswerPlan, int] | None:
        plan = self._plan
        if plan is None or self._message is not None:
            return None
        clips = plan.clip_indices(self.clip_frames)
        lo = max(self._playhead // self.clip_frames if self._playhead >= 0 else clips.start, clips.start)
        for n in range(lo, min(lo + self.ahead_clips, clips.stop)):
            if n not in self._ready:
                return plan, n
        return None

    def _run(self) -> None:
        while True:
            with self._lock:
                job = None
                while not self._closed and (job := self._next_clip()) is None:
                    self._lock.wait(timeout=0.5)
                if self._closed or job is None:
                    return
            plan, n = job
            try:
                clip = make_avatar_clip(self.pipe, self.avatar, plan, n, self.clip_frames, self.settings,
                                        self.decode_chunk_size)
            except Exception as exc:  # a failing GPU degrades to the CPU avatar, never crashes the answer
                with self._lock:
                    self._message = f"SVD avatar generation failed ({type(exc).__name__}: {exc}); drawing on the CPU"
                    self._lock.notify_all()
                log.warning("%s", self._message)
                continue
            with self._lock:
                self._rtf.append(clip.rtf)
                if self._plan is not None and self._valid(clip, self._plan):
                    self._ready[n] = clip
                self._lock.notify_all()
