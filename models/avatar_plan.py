"""A spoken answer planned frame by frame: what each 16 fps output frame of the avatar must show.

The SVD avatar (``models.svd_avatar``) conditions every generated frame on its own drawing, so it
needs, before a clip is generated, the mouth and the words of each frame of it. ``plan_answer``
puts the answer's phrases on the session clock and gives every output frame k (pts k/16) the mouth
``mouth_at`` holds at that pts and the answer words ``alignment.frames`` attaches to it (±40 ms of
the word's start). The caption shows the answer's words up to the newest one attached so far,
highlighting it, so a word first appears on the first frame that carries it. Pure and torch-free:
the CPU avatar, the SVD avatar and the tests all read the same plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from alignment.frames import FPS, TOLERANCE_S, TokenFrames, attach_tokens, frame_pts
from alignment.types import SpokenPhrase, WordToken
from models.visemes import REST, MouthShape, mouth_at, timeline

#: Words kept in a frame's caption (the renderer shows those that fit, ending at the highlight).
CAPTION_WORDS = 12


@dataclass(frozen=True)
class FrameCondition:
    """What output frame ``index`` (presented at ``pts``) shows while the answer plays."""

    index: int
    pts: float
    mouth: MouthShape
    tokens: tuple[WordToken, ...]  # the answer words attached to this frame (±40 ms of their start)
    caption: tuple[str, ...]  # the answer's words shown so far, ending with the newest attached
    highlight: int | None  # index in ``caption`` of the newest attached word


@dataclass(frozen=True)
class AnswerPlan:
    """Every output frame of one answer, from the first that can carry its first word to the last
    that can carry its last; frames outside are at rest (``condition`` says so)."""

    start: float  # session s of the answer's first audio sample
    end: float  # session s of its last
    tokens: tuple[TokenFrames, ...]  # each word on the session clock with the frames carrying it
    frames: tuple[FrameCondition, ...]  # frames[i].index == first_frame + i, never empty

    @property
    def first_frame(self) -> int:
        return self.frames[0].index

    @property
    def last_frame(self) -> int:
        return self.frames[-1].index

    def condition(self, index: int) -> FrameCondition:
        """Frame ``index``'s condition. Outside the answer the mouth rests; after it the last caption
        stays (until the player stops the answer), so a phrase more changes no frame before it."""
        i = index - self.first_frame
        if 0 <= i < len(self.frames):
            return self.frames[i]
        last = self.frames[-1] if i > 0 else None
        caption, highlight = (last.caption, last.highlight) if last is not None else ((), None)
        return FrameCondition(index, frame_pts(index), REST, (), caption, highlight)

    def clip_indices(self, clip_frames: int) -> range:
        """The clips ``n`` (frames ``[n*L, (n+1)*L)``) that hold a frame of the answer."""
        return range(self.first_frame // clip_frames, self.last_frame // clip_frames + 1)


def _check_phrase(ph: SpokenPhrase) -> None:
    if not isinstance(ph, SpokenPhrase):
        raise TypeError(f"plan_answer takes SpokenPhrase objects, got {type(ph).__name__}")
    if not ph.words:
        raise ValueError(f"phrase {ph.text!r} has no words: nothing to align to the avatar's frames")
    if not ph.phones:
        raise ValueError(f"phrase {ph.text!r} has no phones: the avatar's mouth needs the synthesizer's phone "
                         "times (festival gives them; a TTS without them can only drive the CPU avatar at rest)")


def _starts(phrases: Sequence[SpokenPhrase], start: float, starts: Sequence[float] | None) -> list[float]:
    if not math.isfinite(start) or start < 0:
        raise ValueError(f"an answer's start must be a session time >= 0, got {start!r}")
    if starts is None:  # back to back, as the player hands them on when synthesis keeps ahead
        out, t = [], start
        for ph in phrases:
            out.append(t)
            t += ph.duration
        return out
    out = [float(s) for s in starts]
    if len(out) != len(phrases):
        raise ValueError(f"{len(phrases)} phrases but {len(out)} start times")
    for i, t0 in enumerate(out):
        overlaps = i + 1 < len(out) and out[i + 1] < t0 + phrases[i].duration - 1e-6
        if not math.isfinite(t0) or t0 < start - 1e-9 or overlaps:
            raise ValueError(f"phrase start times must be finite, from {start} on, and each phrase must end "
                             f"before the next starts; got {out}")
    return out


def plan_answer(phrases: SpokenPhrase | Sequence[SpokenPhrase], start: float,
                starts: Sequence[float] | None = None) -> AnswerPlan:
    """Per-frame conditions of an answer whose first phrase starts playing at session time ``start``.

    ``starts``: each phrase's session start, when the player left gaps between them (default: back to
    back). Raises ``ValueError`` for an empty answer, a phrase without words or phones, bad times.
    """
    phrases = [phrases] if isinstance(phrases, SpokenPhrase) else list(phrases)
    if not phrases:
        raise ValueError("an empty answer has nothing to plan: give at least one SpokenPhrase")
    for ph in phrases:
        _check_phrase(ph)
    at = _starts(phrases, start, starts)
    placed = [(t0, t0 + ph.duration, timeline(ph.phones)) for t0, ph in zip(at, phrases, strict=True)]
    words = [WordToken(w.text, t0 + w.start, t0 + w.end, index=i)
             for i, (t0, w) in enumerate((t0, w) for t0, ph in zip(at, phrases, strict=True) for w in ph.words)]
    attached = attach_tokens(words)
    end = placed[-1][1]
    first = max(math.ceil((start - TOLERANCE_S) * FPS - 1e-6), 0)
    last = max(math.floor((max(end, words[-1].start) + TOLERANCE_S) * FPS + 1e-6), first)
    by_frame: dict[int, list[WordToken]] = {}
    for item in attached:
        for k in item.frames:
            by_frame.setdefault(k, []).append(item.token)
    frames, shown = [], 0  # shown: words of the answer attached up to this frame
    for k in range(first, last + 1):
        pts = frame_pts(k)
        mouth = REST
        for t0, t1, phones in placed:
            if t0 <= pts < t1:
                mouth = mouth_at(phones, pts - t0, frame_s=1.0 / FPS)
                break
        here = tuple(by_frame.get(k, ()))
        if here:
            shown = max(shown, max(t.index for t in here) + 1)
        caption = tuple(w.text for w in words[max(shown - CAPTION_WORDS, 0):shown])
        frames.append(FrameCondition(k, pts, mouth, here, caption, len(caption) - 1 if caption else None))
    return AnswerPlan(start, end, tuple(attached), tuple(frames))
