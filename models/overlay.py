"""The default output-frame renderer: the camera frame with captions, AU bars, load and the sync badge.

A few ms per frame on one core, deterministic (the same request gives the same pixels), and the
picture the diffusion backend (``models.svd``) falls back to and draws its overlay with.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from alignment.types import AU_NAMES, AUSample, LoadEstimate, WordToken
from models.render import RenderRequest

# --- drawing helpers ---------------------------------------------------------------------------

_FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
_BACKGROUND = (24, 27, 33)
_PANEL = (12, 14, 18)
_TEXT = (236, 238, 242)
_DIM = (150, 156, 168)
_HIGHLIGHT = (255, 211, 77)
_AU_BAR = (86, 196, 214)
_AU_TRACK = (58, 64, 76)
_LOAD_COLOURS = ((88, 196, 120), (214, 200, 72), (236, 142, 58), (226, 74, 70))
_LOAD_NAMES = ("low", "moderate", "high", "very high")
_BADGE = {
    True: ((40, 160, 88), "SYNC OK"),
    False: ((200, 52, 52), "SYNC FAIL"),
    None: ((96, 102, 116), "SYNC ?"),
}


@lru_cache(maxsize=32)
def _font(size: int, bold: bool = False, mono: bool = False) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu from Debian fonts-dejavu-core when present, else Pillow's built-in font."""
    stem = "DejaVuSansMono" if mono else "DejaVuSans"
    path = _FONT_DIR / f"{stem}{'-Bold' if bold else ''}.ttf"
    try:
        return ImageFont.truetype(str(path), size)
    except OSError:
        try:
            return ImageFont.load_default(size)
        except (TypeError, OSError):
            return ImageFont.load_default()


@lru_cache(maxsize=2048)
def _text_mask(text: str, font: ImageFont.FreeTypeFont | ImageFont.ImageFont,
               anchor: str) -> tuple[Image.Image, int, int]:
    """A rasterised glyph run and its offset from the anchor point (text repeats frame to frame)."""
    left, top, right, bottom = (int(v) for v in font.getbbox(text, anchor=anchor))
    mask = Image.new("L", (max(right - left, 1), max(bottom - top, 1)), 0)
    ImageDraw.Draw(mask).text((-left, -top), text, font=font, fill=255, anchor=anchor)
    return mask, left, top


class _Painter:
    """PIL drawing on one frame, with text stamped from cached glyph masks (rasterising is the cost)."""

    def __init__(self, image: Image.Image) -> None:
        self.image = image
        self.draw = ImageDraw.Draw(image)

    def text(self, xy: tuple[float, float], text: str, font: ImageFont.FreeTypeFont | ImageFont.ImageFont,
             fill: tuple[int, int, int], anchor: str = "la") -> None:
        if not text:
            return
        try:
            mask, left, top = _text_mask(text, font, anchor)
        except (TypeError, ValueError):  # a bitmap fallback font without anchor support
            self.draw.text(xy, text, font=font, fill=fill)
            return
        x, y = int(round(xy[0])) + left, int(round(xy[1])) + top
        self.image.paste(fill, (x, y, x + mask.width, y + mask.height), mask)


def _text_width(font: ImageFont.FreeTypeFont | ImageFont.ImageFont, text: str) -> float:
    return float(font.getlength(text))


def _shade(canvas: np.ndarray, x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int],
           alpha: float) -> None:
    """Blend a translucent rectangle into ``canvas`` in place (integer maths, clipped to the frame)."""
    h, w = canvas.shape[:2]
    x0, x1, y0, y1 = max(x0, 0), min(x1, w), max(y0, 0), min(y1, h)
    if x1 <= x0 or y1 <= y0:
        return
    a = int(round(alpha * 256))
    region = canvas[y0:y1, x0:x1].astype(np.uint16)
    region *= 256 - a
    region += np.asarray(colour, np.uint16) * a
    canvas[y0:y1, x0:x1] = (region >> 8).astype(np.uint8)


def _as_rgb(image: np.ndarray) -> np.ndarray:
    """Accept RGB, RGBA or grey uint8 camera frames; reject anything else with a clear message."""
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        raise ValueError(f"camera frame must be uint8, got {arr.dtype}")
    if arr.ndim == 2:
        return np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim == 3 and arr.shape[2] in (3, 4):
        return arr[:, :, :3]
    raise ValueError(f"camera frame must be (h, w, 3) RGB, got shape {arr.shape}")


def _resize(rgb: np.ndarray, w: int, h: int) -> np.ndarray:
    """Area-average down, bilinear up: OpenCV (ships with mediapipe) when present, else Pillow."""
    try:
        import cv2
    except ImportError:
        return np.asarray(Image.fromarray(np.ascontiguousarray(rgb)).resize((w, h), Image.Resampling.BILINEAR))
    shrink = w < rgb.shape[1]
    return cv2.resize(np.ascontiguousarray(rgb), (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def fit_frame(image: np.ndarray | None, size: tuple[int, int],
              background: tuple[int, int, int] = _BACKGROUND) -> np.ndarray:
    """``image`` resized to fit ``size`` (w, h) keeping its aspect, letterboxed on ``background``."""
    w, h = size
    if (isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[:2] == (h, w) and image.shape[2] in (3, 4)
            and image.dtype == np.uint8):
        return np.array(image[:, :, :3], order="C")  # already fits: one copy, no canvas to fill
    canvas = np.empty((h, w, 3), np.uint8)
    canvas[:] = background
    if image is None:
        return canvas
    rgb = _as_rgb(image)
    ih, iw = rgb.shape[:2]
    if ih == 0 or iw == 0:
        return canvas
    scale = min(w / iw, h / ih)
    nw, nh = max(int(round(iw * scale)), 1), max(int(round(ih * scale)), 1)
    if (nw, nh) != (iw, ih):
        rgb = _resize(rgb, nw, nh)
    x0, y0 = (w - nw) // 2, (h - nh) // 2
    canvas[y0 : y0 + nh, x0 : x0 + nw] = rgb
    return canvas


def _same_word(a: WordToken, b: WordToken) -> bool:
    return a.utterance == b.utterance and a.index == b.index and a.text == b.text


class OverlayRenderer:
    """The default renderer: the camera frame annotated with what the pipeline knows at this pts.

    Caption line at the bottom (this frame's new words highlighted), 12 AU bars, the load level with
    the policy's tokens/s, a Level-3 sync badge and the frame's pts. Deterministic: the same request
    gives the same pixels. One instance may be shared across threads (it keeps no per-frame state).
    """

    name = "overlay"

    def __init__(
        self, size: tuple[int, int] | None = None, show_au: bool = True, show_load: bool = True
    ) -> None:
        self.default_size = tuple(size) if size is not None else None
        self.show_au = show_au
        self.show_load = show_load

    def render(self, request: RenderRequest) -> np.ndarray:
        """Draw one output frame, (h, w, 3) uint8 RGB at ``request.size``."""
        size = self.default_size or request.size
        w, h = _check_size(size)
        frame = fit_frame(request.camera, (w, h))
        s = h / 360.0  # layout unit: everything scales with the output height
        pad = max(int(round(6 * s)), 2)
        caption_h = max(int(round(44 * s)), 12)

        # Translucent panels first (numpy), then every stroke and glyph in one PIL pass.
        _shade(frame, 0, h - caption_h, w, h, _PANEL, 0.62)
        header_font = _font(max(int(round(12 * s)), 7), mono=True)
        header = f"{request.pts:.3f} s  ·  frame {request.index}"
        header_w = int(_text_width(header_font, header)) + 2 * pad
        header_h = max(int(round(20 * s)), 9)
        _shade(frame, pad, pad, pad + header_w, pad + header_h, _PANEL, 0.6)

        au_box = self._au_box(w, h, s, pad, caption_h) if self.show_au else None
        if au_box is not None:
            _shade(frame, *au_box, _PANEL, 0.55)
        load_top = pad * 2 + header_h
        load_box = (pad, load_top, pad + int(round(150 * s)), load_top + int(round(42 * s)))
        if self.show_load:
            _shade(frame, *load_box, _PANEL, 0.6)

        image = Image.fromarray(frame)
        p = _Painter(image)
        if request.camera is None:
            p.text((w / 2, (h - caption_h) / 2), "no camera", font=_font(max(int(round(16 * s)), 7)),
                      fill=_DIM, anchor="mm")
        p.text((pad * 2, pad + header_h // 2), header, font=header_font, fill=_TEXT, anchor="lm")
        self._draw_badge(p, request.sync_ok, w, s, pad)
        if self.show_load:
            self._draw_load(p, request.load, load_box, s)
        if au_box is not None:
            self._draw_aus(p, request.au, au_box, s)
        self._draw_caption(p, request, w, h, s, caption_h)
        return np.asarray(image)

    def close(self) -> None:
        """Nothing to release; present for the ``FrameRenderer`` protocol."""

    # --- parts ------------------------------------------------------------------------------

    @staticmethod
    def _au_box(w: int, h: int, s: float, pad: int, caption_h: int) -> tuple[int, int, int, int] | None:
        row = int(round(14 * s))
        box_w = int(round(118 * s))
        if row < 9:
            return None  # too small an output to show AU bars legibly
        top = pad * 2 + max(int(round(22 * s)), 9)
        bottom = top + row * (len(AU_NAMES) + 1) + pad
        if bottom > h - caption_h - pad or box_w > w // 2:
            return None  # too small an output to show AU bars legibly
        return (w - pad - box_w, top, w - pad, bottom)

    @staticmethod
    def _draw_badge(p: _Painter, ok: bool | None, w: int, s: float, pad: int) -> None:
        colour, label = _BADGE[None if ok is None else bool(ok)]
        font = _font(max(int(round(11 * s)), 7), bold=True)
        tw = _text_width(font, label)
        bh = max(int(round(20 * s)), 9)
        x1 = w - pad
        x0 = int(x1 - tw - 2 * pad - bh * 0.6)
        p.draw.rounded_rectangle((x0, pad, x1, pad + bh), radius=bh // 2, fill=colour)
        dot = bh * 0.18
        cx, cy = x0 + pad + dot, pad + bh / 2
        p.draw.ellipse((cx - dot, cy - dot, cx + dot, cy + dot), fill=(255, 255, 255))
        p.text((x1 - pad, cy), label, font=font, fill=(255, 255, 255), anchor="rm")

    @staticmethod
    def _draw_load(p: _Painter, load: LoadEstimate | None,
                   box: tuple[int, int, int, int], s: float) -> None:
        x0, y0, x1, y1 = box
        font = _font(max(int(round(11 * s)), 7), bold=True)
        small = _font(max(int(round(10 * s)), 6))
        inner = max(int(round(6 * s)), 2)
        if load is None:
            p.text((x0 + inner, y0 + inner), "LOAD  —", font=font, fill=_DIM, anchor="lt")
            p.text((x0 + inner, y1 - inner), "waiting for face", font=small, fill=_DIM, anchor="lb")
            return
        level = min(max(int(load.level), 0), 3)
        p.text((x0 + inner, y0 + inner), f"LOAD {level}", font=font, fill=_TEXT, anchor="lt")
        p.text((x1 - inner, y0 + inner), _LOAD_NAMES[level], font=small, fill=_LOAD_COLOURS[level],
                  anchor="rt")
        seg_y0 = y0 + int(round(20 * s))
        seg_h = max(int(round(5 * s)), 2)
        seg_w = (x1 - x0 - 2 * inner - 3 * inner // 2) / 4
        for i in range(4):
            sx = x0 + inner + i * (seg_w + inner / 2)
            fill = _LOAD_COLOURS[i] if i <= level else _AU_TRACK
            p.draw.rectangle((sx, seg_y0, sx + seg_w, seg_y0 + seg_h), fill=fill)
        policy = load.policy
        p.text((x0 + inner, y1 - inner), f"{policy.tokens_per_s:.1f} tok/s  ·  max {policy.max_tokens}",
                  font=small, fill=_DIM, anchor="lb")

    @staticmethod
    def _draw_aus(p: _Painter, sample: AUSample | None,
                  box: tuple[int, int, int, int], s: float) -> None:
        x0, y0, x1, _ = box
        row = max(int(round(14 * s)), 6)
        font = _font(max(int(round(9 * s)), 6))
        inner = max(int(round(5 * s)), 2)
        face = sample is not None and sample.face
        title_font = _font(max(int(round(8 * s)), 6), bold=True)
        p.text((x0 + inner, y0 + row // 2 + 1), "ACTION UNITS", font=title_font,
                  fill=_TEXT if face else _DIM, anchor="lm")
        if not face:
            p.text((x1 - inner, y0 + row // 2 + 1), "no face", font=title_font, fill=_LOAD_COLOURS[3],
                      anchor="rm")
        label_w = int(round(32 * s))
        bar_x0, bar_x1 = x0 + inner + label_w, x1 - inner
        bar_h = max(int(round(6 * s)), 2)
        values = sample.au if sample is not None else (0.0,) * len(AU_NAMES)
        for i, (name, value) in enumerate(zip(AU_NAMES, values, strict=True)):
            cy = y0 + row * (i + 1) + row // 2 + 1
            p.text((x0 + inner, cy), name, font=font, fill=_TEXT if face else _DIM, anchor="lm")
            top, bottom = cy - bar_h // 2, cy - bar_h // 2 + bar_h
            p.draw.rectangle((bar_x0, top, bar_x1, bottom), fill=_AU_TRACK)
            v = float(np.clip(value, 0.0, 1.0)) if face and np.isfinite(value) else 0.0
            if v > 0:
                p.draw.rectangle((bar_x0, top, bar_x0 + v * (bar_x1 - bar_x0), bottom), fill=_AU_BAR)

    @staticmethod
    def _draw_caption(p: _Painter, request: RenderRequest, w: int, h: int, s: float,
                      caption_h: int) -> None:
        words = list(request.caption)
        new = list(request.new_words)
        for tok in new:  # a new word always shows, even if the caption has not caught up with it
            if not any(_same_word(tok, c) for c in words):
                words.append(tok)
        if not words:
            return
        font = _font(max(int(round(20 * s)), 7))
        bold = _font(max(int(round(20 * s)), 7), bold=True)
        space = _text_width(font, " ")
        margin = max(int(round(14 * s)), 4)
        items = []
        for tok in words:
            hot = any(_same_word(tok, n) for n in new)
            f = bold if hot else font
            items.append((tok.text, f, _text_width(f, tok.text), hot))
        # Keep the newest words that fit on one line; older ones scroll off to the left.
        avail = w - 2 * margin
        total, start = 0.0, len(items)
        while start > 0:
            width = items[start - 1][2] + (space if total else 0.0)
            if total + width > avail and start < len(items):
                break
            total += width
            start -= 1
        shown = items[start:]
        x = margin if start > 0 else (w - total) / 2
        cy = h - caption_h / 2
        for text, f, tw, hot in shown:
            if hot:
                hl = max(int(round(3 * s)), 1)
                half = getattr(f, "size", 10) * 0.62
                p.draw.rounded_rectangle((x - hl, cy - half, x + tw + hl, cy + half), radius=hl * 2,
                                       fill=(70, 58, 20))
            p.text((x, cy), text, font=f, fill=_HIGHLIGHT if hot else _TEXT, anchor="lm")
            x += tw + space


def _check_size(size: tuple[int, int]) -> tuple[int, int]:
    """Output size as positive ints, with a clear error for nonsense."""
    try:
        w, h = (int(v) for v in size)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"size must be (width, height), got {size!r}") from exc
    if w < 16 or h < 16 or w > 8192 or h > 8192:
        raise ValueError(f"output size must be between 16 and 8192 pixels a side, got {w}x{h}")
    return w, h
