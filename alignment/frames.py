"""Token <-> output-frame alignment at a fixed output rate.

Output frame k is presented at k / FPS seconds on the session clock. A token attaches to every
frame whose pts lies within ``TOLERANCE_S`` of the token's start, so each token gets one or two
frames (frames are 62.5 ms apart and every instant is within 31.25 ms of some frame).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from alignment.types import WordToken

FPS = 16
FRAME_PERIOD_S = 1.0 / FPS
TOLERANCE_S = 0.040
_EPS = 1e-9  # float slack so a token exactly 40 ms from a frame still attaches


def frame_pts(index: int, fps: int = FPS) -> float:
    """Presentation time of output frame ``index``."""
    return index / fps


def frame_count(duration_s: float, fps: int = FPS) -> int:
    """Number of output frames presented within ``[0, duration_s)``."""
    if duration_s <= 0:
        return 0
    return math.ceil(duration_s * fps - _EPS)


def frames_for_time(
    t: float, n_frames: int | None = None, fps: int = FPS, tolerance_s: float = TOLERANCE_S
) -> tuple[int, ...]:
    """Indices of the frames within ``tolerance_s`` of time ``t`` (clipped to ``[0, n_frames)``)."""
    lo = max(math.ceil((t - tolerance_s) * fps - 1e-6), 0)
    hi = math.floor((t + tolerance_s) * fps + 1e-6)
    if n_frames is not None:
        hi = min(hi, n_frames - 1)
    return tuple(k for k in range(lo, hi + 1) if abs(k / fps - t) <= tolerance_s + _EPS)


@dataclass(frozen=True)
class TokenFrames:
    """A token and the output frames that carry it."""

    token: WordToken
    frames: tuple[int, ...]

    @property
    def first_frame_pts(self) -> float | None:
        return frame_pts(self.frames[0]) if self.frames else None


def attach_tokens(
    tokens: Iterable[WordToken], n_frames: int | None = None, fps: int = FPS
) -> list[TokenFrames]:
    """Attach each token to the frames within tolerance of its start."""
    return [TokenFrames(tok, frames_for_time(tok.start, n_frames, fps)) for tok in tokens]


def tokens_by_frame(attached: Iterable[TokenFrames]) -> dict[int, list[WordToken]]:
    """Invert an attachment: frame index -> tokens carried by that frame, in start order."""
    out: dict[int, list[WordToken]] = {}
    for item in attached:
        for k in item.frames:
            out.setdefault(k, []).append(item.token)
    for toks in out.values():
        toks.sort(key=lambda t: t.start)
    return out
