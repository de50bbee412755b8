"""Token <-> output-frame alignment at a fixed output rate, for the offline and the live path alike.

Output frame k is presented at k / FPS seconds on the session clock. A token attaches to every
frame whose pts lies within ``TOLERANCE_S`` of the token's start, so each token gets one or two
frames (frames are 62.5 ms apart and every instant is within 31.25 ms of some frame). Live, frames
already sent cannot carry a word any more: :func:`place_token` says which frames still can.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from alignment.text import alnum_key
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
    """A token and the output frames that carry it; ``late``: later than its ideal frames (live only)."""

    token: WordToken
    frames: tuple[int, ...]
    late: bool = False

    @property
    def first_frame_pts(self) -> float | None:
        return frame_pts(self.frames[0]) if self.frames else None


def place_token(
    tok: WordToken,
    next_frame: int | None = None,
    previous: TokenFrames | None = None,
    n_frames: int | None = None,
    fps: int = FPS,
) -> TokenFrames:
    """The output frames that will actually carry ``tok``, and whether that is later than ideal.

    Ideal: the frames within ±40 ms of its start (all of them offline, ``next_frame`` None). Live,
    frames before ``next_frame`` were already sent and cannot carry it any more, so a token that
    arrives after its frames went out is drawn on the next frame (``late``). A revision of a word
    already on screen (``previous``, same text) keeps the frames it was first presented on, when
    they are within the tolerance of its start: a hypothesis that showed the word somewhere else
    (an interim that put a whole repeated sentence at one instant) does not pin the final there.
    """
    ideal = frames_for_time(tok.start, n_frames, fps)
    if next_frame is None:
        return TokenFrames(tok, ideal)
    if (previous is not None and previous.frames and previous.frames[0] < next_frame
            and alnum_key(previous.token.text) == alnum_key(tok.text)
            and abs(frame_pts(previous.frames[0], fps) - tok.start) <= TOLERANCE_S + _EPS):
        frames = previous.frames
    else:
        frames = tuple(k for k in ideal if k >= next_frame) or (next_frame,)
    return TokenFrames(tok, frames, bool(ideal) and frames[0] != ideal[0])


def attach_tokens(
    tokens: Iterable[WordToken], n_frames: int | None = None, fps: int = FPS
) -> list[TokenFrames]:
    """Attach each token to the frames within tolerance of its start (offline: no frame sent yet)."""
    return [place_token(tok, n_frames=n_frames, fps=fps) for tok in tokens]


def tokens_by_frame(attached: Iterable[TokenFrames]) -> dict[int, list[WordToken]]:
    """Invert an attachment: frame index -> tokens carried by that frame, in start order."""
    out: dict[int, list[WordToken]] = {}
    for item in attached:
        for k in item.frames:
            out.setdefault(k, []).append(item.token)
    for toks in out.values():
        toks.sort(key=lambda t: t.start)
    return out
