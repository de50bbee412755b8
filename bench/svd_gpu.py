"""Benchmark: how fast an SVD-XT-sized pipeline makes 16 fps video, and how many steps are real time.

Target (issue 8): the ``svd`` backend is viable for live sessions when a 25-frame 256×256 clip with
classifier-free guidance (the pipeline's default 1 → 3 ramp) can be generated within its own
playout time (25 / 16 = 1.5625 s) at ≥ 4 Euler steps. 576×1024 (SVD's training size) is measured
and reported beside it, without a target.

The pipeline has the real architecture of stabilityai/stable-video-diffusion-img2vid-xt (the
config numbers are written below) with random weights: compute does not depend on weight values,
so no download is needed. fp16 on CUDA. Each size is timed through ``models.svd.generate_clip``
(the renderer's own call) at two step counts; the difference gives the per-step cost and the rest
is the fixed cost (CLIP image encoder, VAE encode, VAE decode in chunks of 8). A direct 25-step
run checks that linear model. Real-time steps = floor((1.5625 s − fixed) / per-step).

Without a CUDA GPU the script says so, checks the SVD-XT configs on the meta device (parameter
counts and a shape-only UNet forward at 576×1024×25), runs a tiny CPU smoke clip and exits 0.

    .venv/bin/python bench/svd_gpu.py [--frames 25] [--sizes 1024x576,256x256] [--steps 4,12] [--cpu-smoke]
    .venv/bin/python bench/svd_gpu.py --tiny --sizes 64x64,256x256 --frames 4 --steps 1,2 --check-steps 3
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch

from models.svd import generate_clip
from models.svd_conditioning import ClipConditioning

PLAYOUT_FPS = 16
TARGET_SIZE = (256, 256)
TARGET_MIN_STEPS = 4

# --- stabilityai/stable-video-diffusion-img2vid-xt, as published (model_index + */config.json) ------

SVD_XT_UNET = dict(
    sample_size=96,
    in_channels=8,
    out_channels=4,
    down_block_types=(
        "CrossAttnDownBlockSpatioTemporal",
        "CrossAttnDownBlockSpatioTemporal",
        "CrossAttnDownBlockSpatioTemporal",
        "DownBlockSpatioTemporal",
    ),
    up_block_types=(
        "UpBlockSpatioTemporal",
        "CrossAttnUpBlockSpatioTemporal",
        "CrossAttnUpBlockSpatioTemporal",
        "CrossAttnUpBlockSpatioTemporal",
    ),
    block_out_channels=(320, 640, 1280, 1280),
    addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=768,  # 3 added time ids (fps-1, motion bucket, noise aug) x 256
    layers_per_block=2,
    cross_attention_dim=1024,
    transformer_layers_per_block=1,
    num_attention_heads=(5, 10, 20, 20),
    num_frames=25,
)
SVD_XT_VAE = dict(  # AutoencoderKLTemporalDecoder
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    latent_channels=4,
    sample_size=768,
    scaling_factor=0.18215,
    force_upcast=True,
)
SVD_XT_IMAGE_ENCODER = dict(  # CLIPVisionModelWithProjection, OpenCLIP ViT-H/14
    hidden_size=1280,
    intermediate_size=5120,
    num_attention_heads=16,
    num_hidden_layers=32,
    patch_size=14,
    image_size=224,
    projection_dim=1024,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
)
SVD_XT_SCHEDULER = dict(  # EulerDiscreteScheduler
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    interpolation_type="linear",
    num_train_timesteps=1000,
    prediction_type="v_prediction",
    sigma_max=700.0,
    sigma_min=0.002,
    steps_offset=1,
    timestep_spacing="leading",
    timestep_type="continuous",
    use_karras_sigmas=True,
)
SVD_XT_FEATURE_EXTRACTOR = dict(  # CLIPImageProcessor
    crop_size=224,
    size=224,
    do_center_crop=True,
    do_normalize=True,
    do_resize=True,
    do_rescale=True,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
    resample=3,
)

# A tiny model of the same shape family, for the CPU smoke run.
TINY_UNET = dict(
    block_out_channels=(32, 64), layers_per_block=1, in_channels=8, out_channels=4,
    down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
    up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
    cross_attention_dim=32, num_attention_heads=(2, 4), addition_time_embed_dim=16,
    projection_class_embeddings_input_dim=48, num_frames=8,
)
TINY_VAE = dict(block_out_channels=(32, 32), down_block_types=("DownEncoderBlock2D",) * 2, latent_channels=4,
                layers_per_block=1)
TINY_IMAGE_ENCODER = dict(hidden_size=32, projection_dim=32, num_hidden_layers=2, num_attention_heads=4,
                          image_size=224, intermediate_size=37, patch_size=32)


def build_pipeline(unet_cfg: dict, vae_cfg: dict, enc_cfg: dict, device: str, dtype: torch.dtype) -> Any:
    """A randomly initialised StableVideoDiffusionPipeline, built directly on ``device``."""
    from diffusers import (
        AutoencoderKLTemporalDecoder,
        EulerDiscreteScheduler,
        StableVideoDiffusionPipeline,
        UNetSpatioTemporalConditionModel,
    )
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(0)
    with torch.device(device):
        unet = UNetSpatioTemporalConditionModel(**unet_cfg)
        vae = AutoencoderKLTemporalDecoder(**vae_cfg)
        encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(**enc_cfg))
    # .to(device) as well: the temporal mix factors are made with torch.Tensor([...]), which ignores the
    # default device, so they would stay on the CPU.
    unet, vae, encoder = (m.to(device) if dtype == torch.float32 else m.to(device=device, dtype=dtype)
                          for m in (unet, vae, encoder))
    pipe = StableVideoDiffusionPipeline(
        vae=vae, image_encoder=encoder, unet=unet, scheduler=EulerDiscreteScheduler(**SVD_XT_SCHEDULER),
        feature_extractor=CLIPImageProcessor(**SVD_XT_FEATURE_EXTRACTOR),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _reference(w: int, h: int) -> np.ndarray:
    from app.loadtest.testmedia import talking_face_frames

    return talking_face_frames(np.array([0.5]), (w, h))[0]


def _cond(steps: int, guidance: float) -> ClipConditioning:
    return ClipConditioning(fps=PLAYOUT_FPS, motion_bucket_id=127, noise_aug_strength=0.02,
                            min_guidance_scale=1.0, max_guidance_scale=guidance, num_inference_steps=steps, seed=0)


def _time_clip(pipe: Any, ref: np.ndarray, size: tuple[int, int], frames: int, steps: int, guidance: float,
               repeats: int = 1) -> float:
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = generate_clip(pipe, ref, _cond(steps, guidance), frames, size, decode_chunk_size=8)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        if out.shape != (frames, size[1], size[0], 3):
            raise RuntimeError(f"unexpected clip shape {out.shape}")
    return statistics.median(times)


def _params(module: torch.nn.Module) -> float:
    return sum(p.numel() for p in module.parameters()) / 1e9


def meta_check(frames: int) -> bool:
    """SVD-XT configs are consistent: parameter counts and a shape-only UNet forward at 576×1024."""
    from diffusers import AutoencoderKLTemporalDecoder, UNetSpatioTemporalConditionModel
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    with torch.device("meta"):
        unet = UNetSpatioTemporalConditionModel(**SVD_XT_UNET).to("meta")  # mix factors are made on cpu
        vae = AutoencoderKLTemporalDecoder(**SVD_XT_VAE)
        enc = CLIPVisionModelWithProjection(CLIPVisionConfig(**SVD_XT_IMAGE_ENCODER))
        sample = torch.empty(2, frames, 8, 576 // 8, 1024 // 8)
        out = unet(sample, torch.empty(()), encoder_hidden_states=torch.empty(2, 1, 1024),
                   added_time_ids=torch.empty(2, 3), return_dict=False)[0]
    ok = tuple(out.shape) == (2, frames, 4, 72, 128)
    print(f"  SVD-XT config check (meta device): UNet {_params(unet):.3f} B params, VAE {_params(vae):.3f} B, "
          f"CLIP ViT-H/14 image encoder {_params(enc):.3f} B; UNet forward on (2, {frames}, 8, 72, 128) → "
          f"{tuple(out.shape)}: {'PASS' if ok else 'FAIL'}")
    return ok


def cpu_smoke() -> bool:
    """Tiny random pipeline, one 8-frame 64×64 clip on CPU: the code path runs and returns frames."""
    pipe = build_pipeline(TINY_UNET, TINY_VAE, TINY_IMAGE_ENCODER, "cpu", torch.float32)
    ref = _reference(64, 64)
    _time_clip(pipe, ref, (64, 64), 8, 1, 1.0)  # warm-up
    t1 = _time_clip(pipe, ref, (64, 64), 8, 1, 3.0)
    t3 = _time_clip(pipe, ref, (64, 64), 8, 3, 3.0)
    per_step = max((t3 - t1) / 2, 0.0)
    ok = math.isfinite(t1) and math.isfinite(t3)
    print(f"  tiny CPU smoke (random tiny SVD, 8 frames 64x64, CFG): 1 step {t1:.3f} s, 3 steps {t3:.3f} s, "
          f"≈{per_step * 1000:.0f} ms/step, RTF at 1 step {8 / PLAYOUT_FPS / t1:.2f}: {'PASS' if ok else 'FAIL'}")
    return ok


def gpu_bench(sizes: list[tuple[int, int]], frames: int, lo: int, hi: int, check_steps: int = 25,
              tiny: bool = False) -> bool:
    """The timing run; ``tiny`` swaps in the tiny model (fp32, any device) to exercise this code path."""
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    print(f"  device: {torch.cuda.get_device_name(0) if cuda else 'cpu'}, torch {torch.__version__}, {dtype}")
    t = time.perf_counter()
    cfgs = (TINY_UNET, TINY_VAE, TINY_IMAGE_ENCODER) if tiny else (SVD_XT_UNET, SVD_XT_VAE, SVD_XT_IMAGE_ENCODER)
    pipe = build_pipeline(*cfgs, device, torch.float32 if tiny else dtype)
    print(f"  built {'tiny' if tiny else 'SVD-XT-sized'} pipeline with random weights in "
          f"{time.perf_counter() - t:.1f} s (UNet {_params(pipe.unet):.3f} B params)")
    budget = frames / PLAYOUT_FPS
    verdict = None
    for w, h in sizes:
        ref = _reference(w, h)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        _time_clip(pipe, ref, (w, h), frames, lo, 3.0)  # warm-up (kernels, allocator)
        print(f"  {w}x{h}, {frames} frames (playout {budget:.4f} s at {PLAYOUT_FPS} fps), decode chunk 8:")
        for label, guidance in (("CFG 1→3", 3.0), ("no CFG", 1.0)):
            t_lo = _time_clip(pipe, ref, (w, h), frames, lo, guidance, repeats=2)
            t_hi = _time_clip(pipe, ref, (w, h), frames, hi, guidance, repeats=2)
            per_step = (t_hi - t_lo) / (hi - lo)
            fixed = max(t_lo - lo * per_step, 0.0)
            t_check = _time_clip(pipe, ref, (w, h), frames, check_steps, guidance)
            predicted = fixed + check_steps * per_step
            if per_step <= 0:
                print(f"    {label:8s} per-step cost not resolved ({t_lo:.3f} s at {lo} steps, {t_hi:.3f} s at "
                      f"{hi}: timing noise); widen --steps")
                if (w, h) == TARGET_SIZE and guidance == 3.0:
                    verdict = False
                continue
            rt_steps = math.floor((budget - fixed) / per_step) if budget > fixed else 0
            print(f"    {label:8s} per step {per_step * 1000:8.1f} ms, fixed {fixed * 1000:8.1f} ms; "
                  f"{check_steps} steps {t_check:7.3f} s (model {predicted:7.3f} s) = {frames / t_check:6.2f} "
                  f"frames/s, RTF {budget / t_check:.3f}; real time at 16 fps with ≤ {rt_steps} steps")
            if (w, h) == TARGET_SIZE and guidance == 3.0:
                verdict = rt_steps >= TARGET_MIN_STEPS
        if cuda:
            print(f"    peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    if verdict is None:
        print(f"target size {TARGET_SIZE[0]}x{TARGET_SIZE[1]} not measured: no verdict")
        return True
    print(f"target: {frames}-frame {TARGET_SIZE[0]}x{TARGET_SIZE[1]} clip with CFG in real time at "
          f"≥ {TARGET_MIN_STEPS} steps: {'PASS' if verdict else 'FAIL'}")
    return verdict


def _size(text: str) -> tuple[int, int]:
    w, h = (int(v) for v in text.lower().split("x"))
    return w, h


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--sizes", default="1024x576,256x256", help="comma-separated WxH list")
    ap.add_argument("--steps", default="4,12", help="the two step counts the per-step cost is fitted from")
    ap.add_argument("--check-steps", type=int, default=25, help="step count timed directly (frames/s figure)")
    ap.add_argument("--cpu-smoke", action="store_true", help="skip the GPU even if there is one")
    ap.add_argument("--tiny", action="store_true",
                    help="run the timing path with the tiny model (checks this script without a GPU)")
    args = ap.parse_args(argv)
    print("command: .venv/bin/python bench/svd_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv))
    lo, hi = (int(v) for v in args.steps.split(","))
    if args.tiny:
        torch.set_num_threads(1)
        return 0 if gpu_bench([_size(s) for s in args.sizes.split(",")], args.frames, lo, hi, args.check_steps,
                              tiny=True) else 1
    if not torch.cuda.is_available() or args.cpu_smoke:
        print("no CUDA GPU here (torch.cuda.is_available() is False or --cpu-smoke): the SVD-XT timing needs one; "
              f"running the config check and a tiny CPU smoke run instead ({os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.1f})")
        torch.set_num_threads(1)
        ok = meta_check(args.frames) and cpu_smoke()
        print(f"CPU smoke: {'PASS' if ok else 'FAIL'} (no GPU verdict)")
        return 0 if ok else 1
    sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
    return 0 if gpu_bench(sizes, args.frames, lo, hi, args.check_steps) else 1


if __name__ == "__main__":
    raise SystemExit(main())
