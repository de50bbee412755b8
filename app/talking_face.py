"""A synthetic talking face: a real portrait whose mouth opens with a given envelope.

Below both rooms: the live server's warm-up runs its first face and render inferences on it, and the
load-test media (``app.loadtest.testmedia``) builds its face videos from it, so lip motion carries
real audio-visual evidence.
"""

from __future__ import annotations

import numpy as np


def portrait() -> np.ndarray:
    """A real face photo (RGB uint8) that matplotlib ships: Grace Hopper, public domain."""
    from matplotlib import cbook
    from PIL import Image

    with cbook.get_sample_data("grace_hopper.jpg") as fh:
        return np.asarray(Image.open(fh).convert("RGB"))


def talking_face_frames(
    envelope: np.ndarray, size: tuple[int, int] = (640, 360), base: np.ndarray | None = None
) -> list[np.ndarray]:
    """One frame per envelope value: the portrait centred in ``size`` (w, h), jaw dropped by the value.

    The mouth region is stretched downward (up to 4 % of the frame height) with a dark mouth gap,
    enough for a face tracker to see the lips part.
    """
    from PIL import Image

    w, h = size
    img = base if base is not None else portrait()
    scale = h / img.shape[0]
    face = np.asarray(Image.fromarray(img).resize((int(img.shape[1] * scale), h)))
    canvas = np.zeros((h, w, 3), np.uint8)
    x0 = max((w - face.shape[1]) // 2, 0)
    face = face[:, : w - x0]
    canvas[:, x0 : x0 + face.shape[1]] = face
    # Mouth of the Grace Hopper portrait, as fractions of the (resized) face image.
    mouth_y = int(0.458 * h)
    mouth_x0, mouth_x1 = x0 + int(0.45 * face.shape[1]), x0 + int(0.58 * face.shape[1])
    chin_y = int(0.56 * h)
    frames = []
    for value in envelope:
        frame = canvas.copy()
        drop = int(round(float(value) * 0.04 * h))
        if drop > 0:
            region = canvas[mouth_y:chin_y, mouth_x0 - 20 : mouth_x1 + 20]
            stretched = np.asarray(
                Image.fromarray(region).resize((region.shape[1], region.shape[0] + drop))
            )[: chin_y - mouth_y]
            frame[mouth_y + drop : chin_y, mouth_x0 - 20 : mouth_x1 + 20] = stretched[: chin_y - mouth_y - drop]
            gap = slice(mouth_y, mouth_y + drop)
            frame[gap, mouth_x0:mouth_x1] = (frame[gap, mouth_x0:mouth_x1] * 0.25).astype(np.uint8) + 15
        frames.append(frame)
    return frames
