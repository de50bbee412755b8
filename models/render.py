"""The contract between the session and whatever draws output frames.

``RenderRequest`` carries everything one 16 fps output frame is drawn from (pts, captions, AUs,
load, Level-3 state); a :class:`FrameRenderer` turns it into pixels. Both renderers
(``models.overlay``, ``models.svd``) and their callers import it from here, so neither renderer
imports the other's caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from alignment.types import AUSample, LoadEstimate, WordToken

DEFAULT_SIZE: tuple[int, int] = (640, 360)


@dataclass(frozen=True)
class RenderRequest:
    """Everything needed to draw output frame ``index`` (presented at ``pts = index / 16``)."""

    index: int  # output frame k, presented at pts = k / 16
    pts: float
    camera: np.ndarray | None = field(repr=False, compare=False)  # latest camera frame at or before pts
    caption: tuple[WordToken, ...]  # words visible at this frame (current utterance so far), in order
    new_words: tuple[WordToken, ...]  # tokens attached to this frame (their first/second carrying frame)
    au: AUSample | None
    load: LoadEstimate | None
    sync_ok: bool | None
    size: tuple[int, int] = DEFAULT_SIZE  # (width, height) of the output


@runtime_checkable
class FrameRenderer(Protocol):
    """Anything that turns a ``RenderRequest`` into an (h, w, 3) uint8 RGB frame."""

    name: str

    def render(self, request: RenderRequest) -> np.ndarray: ...

    def close(self) -> None: ...


class RendererUnavailable(RuntimeError):
    """A renderer backend cannot be used here (missing dependency or weights)."""
