"""A load step driven through the media: the talking face, strained from a given clip time on.

The certification workload's *load step* and *truncation* contexts need the server's own load
controller to read a step mid-answer from the camera, not a debug route. The controller was trained
on brow lowering (AU4), lid tightening (AU7), chin raise (AU17) and lip-corner depression (AU15)
rising with load (``models.controller_training.LOAD_SIGNATURE``), each relative to the person's
neutral baseline of the first seconds. ``strained_portrait`` warps the project's portrait that way
(brows pulled down toward the eyes, lids narrowed, mouth corners down, chin pushed up), so the same
talking face can speak both halves; ``controller_reading`` runs the server's extractor (video mode)
and the shipped controller over frames and says which level it reads when, so a clip is checked
against what the controller actually outputs, never assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

#: Strain of the portrait at amount 1, in pixels of the 640×360 talking-face frame (the portrait is
#: scaled to the frame's height): brows down, lids closer, corners down, chin up.
BROW_PX, LID_PX, CORNER_PX = 9.0, 2.5, 4.0
#: Landmark rows and columns of the portrait in that frame (MediaPipe's mesh on the neutral face):
#: forehead, brow line, eye line, mouth corners, lower lip, chin; the face's centre column.
_FOREHEAD, _BROW, _EYE, _CORNERS, _LIP, _CHIN, _CENTRE_X = 75, 101, 113, 167, 188, 205, 326
#: The frame's size the constants above are measured in, and the portrait's horizontal offset there.
_FRAME_H, _FRAME_W = 360, 640


@dataclass(frozen=True)
class Reading:
    """The controller's level at clip time ``pts`` (None while it learns the baseline)."""

    pts: float
    level: int | None


def _bump(y: np.ndarray, top: float, peak: float, bottom: float) -> np.ndarray:
    """0 at ``top``, 1 at ``peak``, 0 at ``bottom``, linear between."""
    up = np.clip((y - top) / max(peak - top, 1e-6), 0.0, 1.0)
    down = np.clip((bottom - y) / max(bottom - peak, 1e-6), 0.0, 1.0)
    return np.where(y <= peak, up, down)


def _displacement(yy: np.ndarray, xx: np.ndarray, amount: float) -> np.ndarray:
    """Downward displacement (frame pixels) of each frame pixel's content at ``amount``."""
    near = np.clip(1.0 - np.abs(xx - _CENTRE_X) / 70.0, 0.0, 1.0) ** 0.5
    dy = BROW_PX * _bump(yy, _FOREHEAD, _BROW, _EYE) * near
    dy += LID_PX * np.clip(1.0 - np.abs(yy - _EYE) / 8.0, 0.0, 1.0) * -np.sign(yy - _EYE) * near
    mouth = np.abs(xx - _CENTRE_X) < 45
    dy += CORNER_PX * _bump(yy, 150, _CORNERS, 185) * (1.0 - 0.7 * np.clip(
        1.0 - np.abs(xx - _CENTRE_X) / 45.0, 0.0, 1.0)) * mouth
    dy -= CORNER_PX * _bump(yy, 172, _LIP, _CHIN) * (np.abs(xx - _CENTRE_X) < 40)
    return dy * amount


@cache
def strained_portrait(amount: float = 1.0) -> np.ndarray:
    """The portrait (its own resolution, RGB uint8) strained by ``amount`` (0: as it is)."""
    from scipy.ndimage import map_coordinates

    from app.talking_face import portrait

    img = portrait()
    if amount == 0:
        return img
    h, w = img.shape[:2]
    scale = _FRAME_H / h  # portrait pixel → frame pixel
    x0 = max((_FRAME_W - int(w * scale)) // 2, 0)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    src_y = yy - _displacement(yy * scale, xx * scale + x0, amount) / scale
    out = np.stack([map_coordinates(img[..., c].astype(np.float32), [src_y, xx], order=1, mode="nearest")
                    for c in range(3)], axis=-1)
    return np.clip(out, 0, 255).astype(np.uint8)


def controller_reading(frames: list[np.ndarray], fps: float, au_fps: float = 16.0) -> list[Reading]:
    """The shipped controller's level over ``frames`` as a live session reads them: the server's face
    extractor (video mode) at ``au_fps``, then ``models.controller.LoadController`` (batched)."""
    from alignment.types import VideoFrame
    from app.pipeline import face_extractor, load_controller

    step = max(int(round(fps / au_fps)), 1)
    samples = []
    with face_extractor("video") as ex:
        for i in range(0, len(frames), step):
            samples.append(ex.extract(VideoFrame(i / fps, frames[i])))
    estimates = load_controller().run(samples)
    return [Reading(s.pts, None if e is None else int(e.level)) for s, e in zip(samples, estimates, strict=True)]


def level_changes(readings: list[Reading]) -> list[tuple[float, int]]:
    """(clip time, new level) at each change of the level read (the first level counts)."""
    out: list[tuple[float, int]] = []
    for r in readings:
        if r.level is not None and (not out or out[-1][1] != r.level):
            out.append((round(r.pts, 3), r.level))
    return out


def face_frames(envelope: np.ndarray, amounts: np.ndarray, size: tuple[int, int] = (640, 360)) -> list[np.ndarray]:
    """The talking face, frame k with its mouth at ``envelope[k]`` and strained by ``amounts[k]``."""
    from app.talking_face import talking_face_frames

    if len(envelope) != len(amounts):
        raise ValueError(f"{len(envelope)} envelope values but {len(amounts)} strain amounts")
    out: list[np.ndarray] = []
    start = 0
    for k in range(1, len(envelope) + 1):
        if k == len(envelope) or amounts[k] != amounts[start]:
            base = strained_portrait(float(amounts[start])) if amounts[start] else None
            out += talking_face_frames(envelope[start:k], size, base=base)
            start = k
    return out
