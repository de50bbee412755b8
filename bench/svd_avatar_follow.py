"""Benchmark: does an SVD model follow per-frame conditioning latents (the answer avatar's mouth)?

Published SVD weights were trained with ONE reference latent repeated over every frame. The answer's
SVD avatar (models.svd_avatar) gives frame i the latent of its own drawing instead (the mouth of the
phone spoken at that frame). This measures whether the generated pictures follow: for a festival
sentence planned per frame (models.avatar_plan), each generated frame's mouth openness is read on the
pixels (mean darkness of the drawn mouth box, and drawn_mouth_open's dark share) and correlated with
the planned openness. The control is the stock pipeline on the neutral face with the same seed,
steps and motion: its r shows what the model does without per-frame conditioning.

Target (our own bar): r(planned, generated) >= 0.5 and >= 0.3 above the control. A verdict needs real
weights (--svd-model PATH) and a GPU; --tiny runs the path with a tiny random pipeline (no verdict).

    .venv/bin/python bench/svd_avatar_follow.py --svd-model PATH [--size 512x320] [--steps 10]
    .venv/bin/python bench/svd_avatar_follow.py --tiny
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from alignment.types import SpokenPhrase
from models.avatar import AvatarRenderer
from models.avatar_plan import AnswerPlan, plan_answer
from models.svd import generate_clip, load_svd_pipeline
from models.svd_avatar import draw_references, make_avatar_clip
from models.svd_conditioning import SVDSettings
from models.tts import festival
from models.visemes import REST

SENTENCE = "Maybe we could meet by the lake on Monday, about five o'clock, if the weather is fine."
MIN_R = 0.5
MIN_GAIN = 0.3


def _phrase_plan() -> AnswerPlan:
    async def say() -> SpokenPhrase:
        tts = festival.FestivalTTS(processes=1)
        try:
            return await tts.synthesize(SENTENCE, festival.NATURAL_WPM[tts.voice])
        finally:
            await tts.aclose()

    return plan_answer(asyncio.run(say()), 0.5)


def _mouth_measures(frames: np.ndarray, box: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per frame: darkness of the mouth box (1 - mean luma / 255) and the share of dark pixels (< 80)."""
    x0, y0, x1, y1 = box
    region = frames[:, y0:y1, x0:x1, :].astype(np.float32)
    luma = region @ np.array([0.299, 0.587, 0.114], np.float32)
    return 1.0 - luma.mean(axis=(1, 2)) / 255.0, (region < 80).all(axis=3).mean(axis=(1, 2))


def _r(a: np.ndarray, b: np.ndarray) -> float:
    if a.std() < 1e-9 or b.std() < 1e-9:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


@dataclass(frozen=True)
class Follow:
    """Correlations of the planned mouth openness with the mouth read on pixels, over all frames."""

    frames: int
    gen_s: float
    r_drawing: float  # the references themselves (the measure's ceiling)
    r_conditioned: float  # per-frame conditioned clips, mouth-box darkness
    r_conditioned_dark_share: float  # ... share of dark pixels (drawn_mouth_open's measure)
    r_stock: float  # the stock pipeline on the neutral face (the control)


def run(pipe: Any, size: tuple[int, int], settings: SVDSettings, clip_frames: int) -> Follow:
    """Every clip of the sentence, per-frame conditioned and stock; the correlations of the mouth."""
    plan = _phrase_plan()
    avatar = AvatarRenderer(size)  # what SVDAvatar conditions on at this generation size
    box = avatar.mouth_box()
    planned, drawn, cond_dark, stock_dark, gen_s = [], [], [], [], 0.0
    for n in plan.clip_indices(clip_frames):
        clip = make_avatar_clip(pipe, avatar, plan, n, clip_frames, settings, decode_chunk_size=8)
        stock = generate_clip(pipe, avatar.draw(REST), clip.conditioning, clip_frames, size, 8)
        refs = draw_references(plan, avatar, n * clip_frames, clip_frames)
        planned += [c.mouth.open for c in clip.conditions]
        drawn.append(_mouth_measures(refs, box)[0])
        cond_dark.append(_mouth_measures(clip.frames, box))
        stock_dark.append(_mouth_measures(stock, box)[0])
        gen_s += clip.gen_s
    p = np.array(planned)
    cd, cs = np.concatenate([c[0] for c in cond_dark]), np.concatenate([c[1] for c in cond_dark])
    return Follow(len(p), gen_s, _r(p, np.concatenate(drawn)), _r(p, cd), _r(p, cs),
                  _r(p, np.concatenate(stock_dark)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--svd-model", help="a saved StableVideoDiffusionPipeline directory (or cached hub id)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random pipeline: checks this script, no verdict")
    ap.add_argument("--size", default="512x320", help="generation WxH (multiples of 8)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--frames", type=int, default=0, help="frames per clip (default: the UNet's num_frames)")
    args = ap.parse_args(argv)
    print("command: .venv/bin/python bench/svd_avatar_follow.py " + " ".join(sys.argv[1:] if argv is None else argv))
    if not festival.available():
        print("festival slt_hts is not installed: the sentence's phones come from it")
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.tiny:
        from bench.svd_gpu import TINY_IMAGE_ENCODER, TINY_UNET, TINY_VAE, build_pipeline

        torch.set_num_threads(1)
        pipe, size, steps = build_pipeline(TINY_UNET, TINY_VAE, TINY_IMAGE_ENCODER, device, torch.float32), (64, 64), 1
    elif args.svd_model:
        pipe = load_svd_pipeline(args.svd_model, device=device)
        size, steps = tuple(int(v) for v in args.size.lower().split("x")), args.steps
    else:
        ap.error("give --svd-model PATH (real weights) or --tiny")
    frames = args.frames or int(pipe.unet.config.num_frames)
    started = time.perf_counter()
    out = run(pipe, size, SVDSettings(steps=steps), frames)
    print(f"device {device}, {size[0]}x{size[1]}, {frames} frames/clip, {steps} steps, load "
          f"{os.getloadavg()[0]:.1f}, wall {time.perf_counter() - started:.1f} s ({out.gen_s:.1f} s generating)")
    print(f"  {out.frames} frames; r(planned open, mouth darkness): drawing {out.r_drawing:.2f}, "
          f"per-frame conditioned {out.r_conditioned:.2f} (dark share {out.r_conditioned_dark_share:.2f}), "
          f"stock pipeline {out.r_stock:.2f}")
    if args.tiny:
        print("tiny random weights: no verdict (the script ran end to end)")
        return 0
    ok = out.r_conditioned >= MIN_R and out.r_conditioned - out.r_stock >= MIN_GAIN
    print(f"{'PASS' if ok else 'FAIL'}: need r >= {MIN_R} and >= {MIN_GAIN} above the stock pipeline")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
