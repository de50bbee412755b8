"""What conditions each Stable Video Diffusion clip: the aligned window of the session it covers.

Pure functions of the window (words, mouth AUs, load level) so the mapping can be tested without a
model; ``models.svd`` schedules clips and calls them. docs/SVD.md says which signal conditions what.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from alignment.frames import FPS, TOLERANCE_S, frame_pts
from alignment.types import AU_NAMES, AUSample, LoadEstimate, WordToken

_MOUTH_AUS = (AU_NAMES.index("AU25"), AU_NAMES.index("AU26"))  # lips part, jaw drop


@dataclass(frozen=True)
class ClipWindow:
    """What the session knew about one stretch of the clock when a clip was scheduled.

    ``start``/``end`` bound the frames' pts widened by the ±40 ms attachment tolerance, so a word is
    in the window exactly when it attaches to one of the window's frames. ``own`` says whether the
    window is the clip's own frames (tokens known ahead, e.g. offline) or the frames just before it.
    """

    first_frame: int
    n_frames: int
    start: float
    end: float
    speech: float  # fraction of the window covered by words, 0..1
    words: tuple[str, ...]
    mouth: float | None  # mean of AU25/AU26 over face samples in the window, None without a face
    load_level: int | None
    own: bool


@dataclass(frozen=True)
class ClipConditioning:
    """The SVD call's conditioning for one clip (the UNet's added time ids are fps-1, motion, noise aug)."""

    fps: int
    motion_bucket_id: int
    noise_aug_strength: float
    min_guidance_scale: float
    max_guidance_scale: float
    num_inference_steps: int
    seed: int


@dataclass(frozen=True)
class SVDSettings:
    """How windows map to conditioning; the defaults are documented in docs/SVD.md."""

    motion_min: int = 24  # motion_bucket_id for a silent, still window
    motion_max: int = 180  # ... for a window full of speech with an open mouth
    load_damping: float = 0.15  # each load level removes this fraction of the motion (calmer for a loaded user)
    noise_aug_strength: float = 0.02
    min_guidance_scale: float = 1.0
    max_guidance_scale: float = 3.0
    steps: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.motion_min <= self.motion_max <= 255:
            raise ValueError("need 0 <= motion_min <= motion_max <= 255")
        if self.steps < 1:
            raise ValueError("steps must be at least 1")
        if not 0.0 <= self.noise_aug_strength <= 1.0:
            raise ValueError("noise_aug_strength must be in [0, 1]")
        if not 0.0 <= self.load_damping <= 1.0 / 3.0:
            raise ValueError("load_damping must be in [0, 1/3]")


def speech_activity(window: ClipWindow) -> float:
    """0..1: how much the window talks; the mouth AUs (when a face was seen) count for a quarter."""
    if window.mouth is None:
        return window.speech
    return float(np.clip(0.75 * window.speech + 0.25 * window.mouth, 0.0, 1.0))


def condition_clip(window: ClipWindow, clip_index: int, settings: SVDSettings) -> ClipConditioning:
    """Conditioning for clip ``clip_index`` from its aligned window (pure, so it can be tested alone)."""
    activity = speech_activity(window)
    damping = 1.0 - settings.load_damping * (window.load_level or 0)
    motion = settings.motion_min + (settings.motion_max - settings.motion_min) * activity * damping
    return ClipConditioning(
        fps=FPS,
        motion_bucket_id=int(round(np.clip(motion, 0, 255))),
        noise_aug_strength=settings.noise_aug_strength,
        min_guidance_scale=settings.min_guidance_scale,
        max_guidance_scale=settings.max_guidance_scale,
        num_inference_steps=settings.steps,
        seed=settings.seed + clip_index,
    )


def word_key(tok: WordToken) -> tuple[int, int]:
    """A word's identity across revisions: (utterance, index)."""
    return (tok.utterance, tok.index)


def build_window(
    first_frame: int,
    n_frames: int,
    tokens: Iterable[WordToken],
    aus: Iterable[AUSample] = (),
    load: LoadEstimate | None = None,
    own: bool = True,
) -> ClipWindow:
    """The aligned window over frames ``[first_frame, first_frame + n_frames)``."""
    if n_frames < 1:
        raise ValueError("a window needs at least one frame")
    tokens = list(tokens)
    start = max(frame_pts(first_frame) - TOLERANCE_S, 0.0)
    end = frame_pts(first_frame + n_frames - 1) + TOLERANCE_S
    inside = sorted((t for t in tokens if start - 1e-9 <= t.start <= end + 1e-9), key=lambda t: t.start)
    # Union of the words' [start, end] inside the window (words may overlap after revisions).
    covered, cursor = 0.0, start
    for tok in sorted(tokens_in_span(tokens, start, end), key=lambda t: t.start):
        lo, hi = max(tok.start, cursor), min(tok.end, end)
        if hi > lo:
            covered += hi - lo
            cursor = hi
    mouths = [float(np.mean([s.au[i] for i in _MOUTH_AUS])) for s in aus
              if s.face and start - 1e-9 <= s.pts <= end + 1e-9]
    return ClipWindow(
        first_frame=first_frame,
        n_frames=n_frames,
        start=start,
        end=end,
        speech=float(np.clip(covered / (end - start), 0.0, 1.0)),
        words=tuple(t.text for t in inside),
        mouth=float(np.clip(np.mean(mouths), 0.0, 1.0)) if mouths else None,
        load_level=None if load is None else int(load.level),
        own=own,
    )


def tokens_in_span(tokens: Iterable[WordToken], start: float, end: float) -> list[WordToken]:
    """Tokens whose [start, end] overlaps [start, end]."""
    return [t for t in tokens if t.end > start and t.start < end]
