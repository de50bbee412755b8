"""The answer's face: a simple drawn avatar whose mouth follows the spoken phones, on the CPU.

The session draws one frame per 16 fps output frame while an answer plays: ``mouth_at`` (in
``models.visemes``) gives the mouth for the frame's time within the phrase, and ``draw`` turns it
into pixels. Everything that does not move (background, head, hair, brows, nose, caption panel) is
drawn once per renderer and copied for each frame; a frame adds only the eyes, the mouth and the
caption, with OpenCV on the calling thread, so many sessions can share one render pool. ``draw`` is a
pure function of its arguments (the blink is a function of the ``t`` passed in), which makes frames
reproducible and the renderer safe to call from several threads at once. Nothing on the avatar is a
sync marker: a player's lip sync is judged on the mouth itself (``drawn_mouth_open``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from models.visemes import REST, MouthShape

try:
    import cv2
except ImportError as exc:  # pragma: no cover - mediapipe ships opencv
    raise ImportError("models.avatar needs OpenCV (cv2), which the mediapipe wheel ships") from exc

# One thread per conversion/draw, process-wide, as app.live.output does: OpenCV's own pool spins.
cv2.setNumThreads(1)

# Colours are RGB (frames are RGB uint8 like every renderer's).
_BG_TOP = (206, 226, 240)
_BG_BOTTOM = (150, 184, 214)
_SKIN = (246, 206, 170)
_SKIN_SHADE = (226, 180, 146)
_HAIR = (92, 62, 44)
_CHEEK = (244, 170, 150)
_EYE_WHITE = (252, 252, 250)
_IRIS = (70, 110, 150)
_PUPIL = (24, 28, 36)
_BROW = (84, 56, 40)
_LIP = (200, 92, 104)
_LIP_LINE = (140, 52, 64)
_INNER = (58, 18, 30)  # the dark inside of the mouth: what the pixel measure counts
_TEETH = (244, 242, 236)
_TONGUE = (178, 70, 84)
_SHIRT = (72, 120, 168)
_PANEL = (22, 26, 34)
_TEXT = (232, 236, 242)
_HIGHLIGHT = (255, 211, 77)

CAPTION_FRACTION = 0.15  # bottom share of the frame kept for the caption row (with or without words)
_FONT = cv2.FONT_HERSHEY_SIMPLEX
_AA = cv2.LINE_AA

# Blinks: about one every BLINK_PERIOD_S, jittered per blink by a fixed hash, each BLINK_S long.
BLINK_PERIOD_S = 3.6
BLINK_S = 0.16


def blink_at(t: float | None) -> float:
    """Eye openness 0..1 at ``t`` s (deterministic: the same t always blinks the same); 1 when t is None."""
    if t is None or not math.isfinite(t):
        return 1.0
    k = math.floor(t / BLINK_PERIOD_S)
    for n in (k - 1, k):  # a blink may start in the previous period and run over
        jitter = ((n * 2654435761) % 997) / 997.0  # Knuth's multiplicative hash: fixed, no RNG state
        start = n * BLINK_PERIOD_S + 0.4 + jitter * (BLINK_PERIOD_S - 0.4 - BLINK_S)
        x = (t - start) / BLINK_S
        if 0.0 <= x < 1.0:
            return abs(1.0 - 2.0 * x)  # close, then open
    return 1.0


@lru_cache(maxsize=4096)
def _text_size(word: str, scale: float, thickness: int) -> tuple[int, int]:
    (w, h), _ = cv2.getTextSize(word, _FONT, scale, thickness)
    return w, h


def _ascii(word: str) -> str:
    """Hershey fonts draw ASCII only: other letters become their closest ASCII or '?'."""
    import unicodedata

    plain = unicodedata.normalize("NFKD", word).encode("ascii", "ignore").decode("ascii")
    return plain or "?"


class _Layout:
    """Every length of the face for one frame size (pixels, rounded once)."""

    def __init__(self, size: tuple[int, int]) -> None:
        w, h = size
        self.w, self.h = w, h
        self.caption_top = int(round(h * (1.0 - CAPTION_FRACTION)))
        face_h = self.caption_top
        self.r = r = 0.36 * face_h  # head half-height
        self.cx, self.cy = w / 2.0, 0.50 * face_h
        self.head_axes = (0.80 * r, r)
        self.eye_y = self.cy - 0.12 * r
        self.eye_dx = 0.33 * r
        self.eye_axes = (0.16 * r, 0.12 * r)
        self.iris_r = 0.085 * r
        self.mouth_y = self.cy + 0.50 * r
        self.caption_scale = max(0.3, 0.5 * h / 240.0)
        self.caption_thick = max(1, int(round(h / 240.0)))

    def mouth_box(self) -> tuple[int, int, int, int]:
        """(x0, y0, x1, y1) of the region the mouth can occupy (inner mouth included)."""
        r = self.r
        return (int(self.cx - 0.42 * r), int(self.mouth_y - 0.26 * r),
                int(self.cx + 0.42 * r) + 1, int(self.mouth_y + 0.30 * r) + 1)


def _pt(x: float, y: float) -> tuple[int, int]:
    return int(round(x)), int(round(y))


def _axes(a: float, b: float) -> tuple[int, int]:
    return max(int(round(a)), 1), max(int(round(b)), 1)


def _base(layout: _Layout) -> np.ndarray:
    """Background, shoulders, head, hair, brows, nose, cheeks and the caption panel: drawn once."""
    w, h = layout.w, layout.h
    ramp = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None, None]
    top, bottom = np.array(_BG_TOP, np.float32), np.array(_BG_BOTTOM, np.float32)
    img = np.ascontiguousarray(np.broadcast_to(top + (bottom - top) * ramp, (h, w, 3)).astype(np.uint8))
    r, cx, cy = layout.r, layout.cx, layout.cy
    # shoulders and neck
    cv2.ellipse(img, _pt(cx, layout.caption_top + 0.15 * r), _axes(1.25 * r, 0.55 * r), 0, 180, 360, _SHIRT, -1, _AA)
    cv2.rectangle(img, _pt(cx - 0.28 * r, cy + 0.6 * r), _pt(cx + 0.28 * r, layout.caption_top - 0.3 * r),
                  _SKIN_SHADE, -1)
    # hair behind the head, ears, head
    cv2.ellipse(img, _pt(cx, cy - 0.08 * r), _axes(0.90 * r, 1.0 * r), 0, 0, 360, _HAIR, -1, _AA)
    for side in (-1, 1):
        cv2.ellipse(img, _pt(cx + side * 0.80 * r, cy + 0.02 * r), _axes(0.11 * r, 0.18 * r), 0, 0, 360,
                    _SKIN_SHADE, -1, _AA)
    cv2.ellipse(img, _pt(cx, cy), _axes(*layout.head_axes), 0, 0, 360, _SKIN, -1, _AA)
    # fringe: the top of the head under the hair
    cv2.ellipse(img, _pt(cx, cy - 0.62 * r), _axes(0.78 * r, 0.40 * r), 0, 180, 360, _HAIR, -1, _AA)
    cv2.ellipse(img, _pt(cx, cy - 0.62 * r), _axes(0.78 * r, 0.12 * r), 0, 0, 180, _HAIR, -1, _AA)
    # brows, nose, cheeks
    for side in (-1, 1):
        ex = cx + side * layout.eye_dx
        cv2.ellipse(img, _pt(ex, layout.eye_y - 0.10 * r), _axes(0.17 * r, 0.10 * r), 0, 200, 340, _BROW,
                    max(1, int(round(0.045 * r))), _AA)
        cv2.circle(img, _pt(cx + side * 0.46 * r, cy + 0.30 * r), max(int(round(0.12 * r)), 1), _CHEEK, -1, _AA)
    cv2.ellipse(img, _pt(cx, cy + 0.22 * r), _axes(0.07 * r, 0.05 * r), 0, 20, 160, _SKIN_SHADE,
                max(1, int(round(0.035 * r))), _AA)
    # caption panel
    cv2.rectangle(img, (0, layout.caption_top), (w - 1, h - 1), _PANEL, -1)
    img.setflags(write=False)
    return img


class AvatarRenderer:
    """Draws the avatar at ``size`` (w, h), both even; thread-safe (nothing mutable is shared)."""

    name = "avatar"

    def __init__(self, size: tuple[int, int] = (320, 240)) -> None:
        try:
            w, h = (int(v) for v in size)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"size must be (width, height), got {size!r}") from exc
        if w < 64 or h < 48 or w % 2 or h % 2:
            raise ValueError(f"avatar size must be even and at least 64x48, got {w}x{h}")
        self.size = (w, h)
        self._layout = _Layout(self.size)
        self._base = _base(self._layout)

    def draw(self, mouth: MouthShape = REST, caption: tuple[str, ...] = (), highlight: int | None = None,
             *, t: float | None = None) -> np.ndarray:
        """One (h, w, 3) uint8 RGB frame: the face with ``mouth``, and ``caption`` with word ``highlight``
        emphasised. ``t`` (s, any clock) only drives the blink; the same arguments give the same pixels."""
        if not isinstance(mouth, MouthShape):
            raise TypeError(f"mouth must be a MouthShape, got {type(mouth).__name__}")
        img = self._base.copy()
        self._eyes(img, blink_at(t))
        self._mouth(img, mouth)
        if caption:
            self._caption(img, tuple(caption), highlight)
        return img

    def mouth_box(self) -> tuple[int, int, int, int]:
        """(x0, y0, x1, y1): where the mouth is drawn at this size (for pixel measures of the mouth)."""
        return self._layout.mouth_box()

    def close(self) -> None:
        """Nothing to release (kept for symmetry with the frame renderers)."""

    # --- per-frame parts --------------------------------------------------------------------------

    def _eyes(self, img: np.ndarray, openness: float) -> None:
        L = self._layout
        r = L.r
        ax, ay = L.eye_axes
        for side in (-1, 1):
            ex = L.cx + side * L.eye_dx
            if openness < 0.15:  # closed: a lid line
                cv2.ellipse(img, _pt(ex, L.eye_y), _axes(ax, 0.35 * ay), 0, 0, 180, _BROW,
                            max(1, int(round(0.03 * r))), _AA)
                continue
            cv2.ellipse(img, _pt(ex, L.eye_y), _axes(ax, ay * openness), 0, 0, 360, _EYE_WHITE, -1, _AA)
            iris = max(int(round(L.iris_r * min(1.0, 0.4 + openness))), 1)
            cv2.circle(img, _pt(ex, L.eye_y + 0.01 * r), iris, _IRIS, -1, _AA)
            cv2.circle(img, _pt(ex, L.eye_y + 0.01 * r), max(iris // 2, 1), _PUPIL, -1, _AA)
            cv2.circle(img, _pt(ex + 0.03 * r, L.eye_y - 0.03 * r), max(int(round(0.02 * r)), 1), _EYE_WHITE,
                       -1, _AA)
            if openness < 1.0:  # the upper lid comes down
                cv2.ellipse(img, _pt(ex, L.eye_y), _axes(ax * 1.05, ay * 1.1), 0, 180, 360, _SKIN,
                            max(1, int(round(ay * (1.0 - openness) * 1.2))), _AA)

    def _mouth(self, img: np.ndarray, m: MouthShape) -> None:
        L = self._layout
        r, cx, cy = L.r, L.cx, L.mouth_y
        half_w = r * (0.20 + 0.18 * m.width) * (1.0 - 0.38 * m.round)  # lip corners: spread vs pursed
        lip = r * (0.045 + 0.035 * m.round)  # lip thickness: pursed lips look fuller
        gap = r * 0.38 * m.open  # the opening's height
        if gap < 0.04 * r:  # closed lips: two lips meeting, a line between them
            cv2.ellipse(img, _pt(cx, cy), _axes(half_w + 0.3 * lip, lip * 1.1 + gap / 2), 0, 0, 360, _LIP, -1, _AA)
            cv2.line(img, _pt(cx - half_w, cy), _pt(cx + half_w, cy), _LIP_LINE,
                     max(1, int(round(0.025 * r))), _AA)
            return
        inner_w = half_w * (1.0 - 0.25 * m.round * (1.0 - m.open))
        cv2.ellipse(img, _pt(cx, cy), _axes(half_w + lip, gap / 2 + lip), 0, 0, 360, _LIP, -1, _AA)
        cv2.ellipse(img, _pt(cx, cy), _axes(inner_w, gap / 2), 0, 0, 360, _TEETH, -1, _AA)
        teeth = min(0.06 * r, 0.3 * gap)  # the upper teeth's visible band
        cv2.ellipse(img, _pt(cx, cy + teeth / 2), _axes(inner_w * 0.96, max(gap / 2 - teeth / 2, 1.0)),
                    0, 0, 360, _INNER, -1, _AA)
        if m.open > 0.45:
            cv2.ellipse(img, _pt(cx, cy + gap * 0.38), _axes(inner_w * 0.55, gap * 0.14), 0, 180, 360,
                        _TONGUE, -1, _AA)

    def _caption(self, img: np.ndarray, words: tuple[str, ...], highlight: int | None) -> None:
        L = self._layout
        scale, thick = L.caption_scale, L.caption_thick
        texts = [_ascii(w) for w in words]
        sizes = [_text_size(s, scale, thick + (1 if i == highlight else 0)) for i, s in enumerate(texts)]
        space = _text_size(" ", scale, thick)[0]
        margin = max(4, L.w // 40)
        # the words that fit, ending with the highlighted one (or the last): a caption follows the voice
        last = highlight if highlight is not None and 0 <= highlight < len(texts) else len(texts) - 1
        first, width = last, sizes[last][0]
        while first > 0 and width + space + sizes[first - 1][0] <= L.w - 2 * margin:
            first -= 1
            width += space + sizes[first][0]
        end = last
        while end + 1 < len(texts) and width + space + sizes[end + 1][0] <= L.w - 2 * margin:
            end += 1
            width += space + sizes[end][0]
        text_h = max(s[1] for s in sizes[first:end + 1])
        y = L.caption_top + (L.h - L.caption_top + text_h) // 2
        x = max(margin, (L.w - width) // 2)
        for i in range(first, end + 1):
            if i == highlight:
                cv2.putText(img, texts[i], (x, y), _FONT, scale, _HIGHLIGHT, thick + 1, _AA)
                cv2.line(img, (x, y + 3), (x + sizes[i][0], y + 3), _HIGHLIGHT, thick)
            else:
                cv2.putText(img, texts[i], (x, y), _FONT, scale, _TEXT, thick, _AA)
            x += sizes[i][0] + space


def drawn_mouth_open(frame: np.ndarray, box: tuple[int, int, int, int], dark: int = 80) -> float:
    """How open a drawn mouth is, from the pixels alone: the share of dark pixels in ``box``.

    Dark = every RGB channel below ``dark``; skin, lips, teeth and tongue are all lighter, the inner
    mouth is not. Used to find the first frame whose mouth opens for a word, and by the tests.
    """
    x0, y0, x1, y1 = box
    region = np.asarray(frame)[y0:y1, x0:x1, :3]
    if region.size == 0:
        raise ValueError(f"mouth box {box} is outside a {frame.shape[1]}x{frame.shape[0]} frame")
    return float(np.count_nonzero((region < dark).all(axis=2))) / float(region.shape[0] * region.shape[1])
