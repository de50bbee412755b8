"""Output-frame sources: pick a renderer by name, so callers never import a backend directly.

``RenderRequest`` (``models.render``) is the one contract between the session and whatever draws
frames: the default ``OverlayRenderer`` (``models.overlay``: camera + captions + AU bars + load +
sync badge) or the optional diffusion backend in ``models.svd``. Callers import the contract and
the factory from here.
"""

from __future__ import annotations

from models.overlay import OverlayRenderer, fit_frame
from models.render import DEFAULT_SIZE, FrameRenderer, RendererUnavailable, RenderRequest
from models.svd import SVDRenderer

__all__ = [
    "BACKENDS",
    "DEFAULT_SIZE",
    "FrameRenderer",
    "OverlayRenderer",
    "RenderRequest",
    "RendererUnavailable",
    "create_renderer",
    "fit_frame",
]

BACKENDS: tuple[str, ...] = ("overlay", "svd")


def create_renderer(backend: str = "overlay", **options: object) -> FrameRenderer:
    """Build a renderer by name: ``"overlay"`` (default, always available) or ``"svd"``."""
    name = backend.strip().lower()
    if name == "overlay":
        return OverlayRenderer(**options)
    if name == "svd":
        try:
            return SVDRenderer(**options)
        except RendererUnavailable:
            raise
        except (OSError, RuntimeError) as exc:  # bad options (ValueError, TypeError) stay the caller's error
            raise RendererUnavailable(f"the 'svd' renderer could not start: {exc}") from exc
    raise ValueError(f"unknown renderer backend {backend!r}; choose one of {', '.join(BACKENDS)}")
