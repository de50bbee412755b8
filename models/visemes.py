"""Festival phones → visemes → mouth shapes: what the avatar's mouth does while an answer is spoken.

The answer's voice (festival's ``cmu_us_slt_arctic_hts``) speaks the US English "radio" phone set and
gives every phone its time (``SpokenPhone``). Each phone maps to one of 15 visemes (the common
lip-sync set: silence, four consonant places that show on the lips, five that barely do, five vowel
families), and each viseme to a ``MouthShape``. ``mouth_at`` samples the mouth at any instant with a
simple coarticulation: a phone holds its shape and, over its last ``BLEND_S``, moves towards the next
phone's, so the lips anticipate the next sound as real lips do; a bilabial (m, b, p) is a closure and
stays fully closed. Diphthongs glide from their first vowel to their second. The table is in
docs/AVATAR.md.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from alignment.types import SpokenPhone


@dataclass(frozen=True)
class MouthShape:
    """How the mouth looks, each 0..1: ``open`` jaw/lip opening, ``width`` corner spread, ``round`` pursing."""

    open: float
    width: float
    round: float

    def __post_init__(self) -> None:
        for name in ("open", "width", "round"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"MouthShape.{name} must be in [0, 1], got {value!r}")

    def towards(self, other: MouthShape, w: float) -> MouthShape:
        """The shape ``w`` (0..1) of the way from this one to ``other``."""
        w = min(max(w, 0.0), 1.0)
        return MouthShape(self.open + (other.open - self.open) * w,
                          self.width + (other.width - self.width) * w,
                          self.round + (other.round - self.round) * w)


#: The closed, relaxed mouth of silence.
REST = MouthShape(open=0.0, width=0.5, round=0.1)

#: Viseme → mouth shape. Consonant shapes are what the lips and jaw show during the consonant.
VISEMES: dict[str, MouthShape] = {
    "sil": REST,
    "PP": MouthShape(0.0, 0.45, 0.15),   # m b p: lips pressed together
    "FF": MouthShape(0.08, 0.5, 0.0),    # f v: lower lip under the upper teeth
    "TH": MouthShape(0.2, 0.5, 0.0),     # th dh: tongue between the teeth
    "DD": MouthShape(0.22, 0.55, 0.05),  # t d: tongue tip on the ridge, jaw slightly open
    "kk": MouthShape(0.3, 0.5, 0.05),    # k g hh: tongue back, jaw open
    "CH": MouthShape(0.22, 0.35, 0.65),  # ch jh sh zh: lips pushed forward
    "SS": MouthShape(0.1, 0.65, 0.0),    # s z: teeth together, lips spread
    "nn": MouthShape(0.22, 0.55, 0.05),  # n l ng: like DD, slightly longer hold
    "RR": MouthShape(0.25, 0.4, 0.5),    # r er: lips a little rounded
    "aa": MouthShape(0.9, 0.6, 0.05),    # aa ae ah ax: open jaw
    "E": MouthShape(0.55, 0.75, 0.0),    # eh: half open, spread
    "I": MouthShape(0.22, 0.8, 0.0),      # ih iy y: nearly closed, spread
    "O": MouthShape(0.7, 0.45, 0.75),     # ao ow: open and round
    "U": MouthShape(0.25, 0.3, 0.95),     # uh uw w: small and round
}

#: Festival's radio phone set (``PhoneSet.description`` of the HTS voice) → viseme.
PHONE_VISEME: dict[str, str] = {
    # silence and non-speech
    "pau": "sil", "h#": "sil", "brth": "sil",
    # bilabials
    "m": "PP", "b": "PP", "p": "PP", "em": "PP",
    # labiodentals, dentals
    "f": "FF", "v": "FF", "th": "TH", "dh": "TH",
    # alveolars
    "t": "DD", "d": "DD", "dx": "DD", "n": "nn", "nx": "nn", "en": "nn", "l": "nn", "el": "nn",
    # velars and glottal
    "k": "kk", "g": "kk", "ng": "nn", "hh": "kk", "hv": "kk",
    # postalveolars
    "ch": "CH", "jh": "CH", "sh": "CH", "zh": "CH",
    # sibilants
    "s": "SS", "z": "SS",
    # rhotics and glides
    "r": "RR", "er": "RR", "axr": "RR", "w": "U", "y": "I",
    # vowels
    "aa": "aa", "ae": "aa", "ah": "aa", "ax": "aa", "ay": "aa", "aw": "aa",
    "eh": "E", "ey": "E",
    "ih": "I", "iy": "I",
    "ao": "O", "ow": "O", "oy": "O",
    "uh": "U", "uw": "U",
}

#: Diphthongs glide from their own viseme (the first vowel) to this one over their second half.
GLIDE_TO: dict[str, str] = {"ay": "I", "aw": "U", "oy": "I", "ey": "I", "ow": "U"}

#: Closures: the mouth is fully shut for the whole phone, whatever comes next.
CLOSURES = frozenset(p for p, v in PHONE_VISEME.items() if v == "PP")

#: How long before a phone's end the mouth starts moving to the next phone's shape (at most half the phone).
BLEND_S = 0.035


def viseme_of(phone: str) -> str:
    """Festival phone → viseme name; a clear error for a phone festival's US voices do not emit."""
    key = phone.strip().lower()
    try:
        return PHONE_VISEME[key]
    except KeyError:
        raise ValueError(f"unknown festival phone {phone!r}; expected one of {sorted(PHONE_VISEME)}") from None


def shape_of(phone: str) -> MouthShape:
    """The mouth shape a phone holds (a diphthong's first vowel)."""
    return VISEMES[viseme_of(phone)]


def _held(phone: SpokenPhone, t: float) -> MouthShape:
    """The shape of ``phone`` at ``t`` inside it, before any blend towards the next phone."""
    shape = shape_of(phone.phone)
    glide = GLIDE_TO.get(phone.phone.strip().lower())
    if glide is None:
        return shape
    dur = max(phone.end - phone.start, 1e-6)
    x = (t - phone.start) / dur
    if x <= 0.5:
        return shape
    x = (x - 0.5) * 2.0
    return shape.towards(VISEMES[glide], x * x * (3.0 - 2.0 * x))  # smoothstep


def _closed(shape: MouthShape) -> MouthShape:
    return MouthShape(0.0, shape.width, shape.round)


def mouth_at(phones: Sequence[SpokenPhone], t: float, *, frame_s: float | None = None) -> MouthShape:
    """The mouth at ``t`` seconds from the phrase start, coarticulated; ``REST`` outside the phones.

    Inside phone i the mouth holds i's shape; over the last ``BLEND_S`` of i (at most half of it) it
    moves linearly to phone i+1's starting shape. A closure (m, b, p) is fully shut throughout, and
    the phone before it closes towards it. ``frame_s``: a frame's period; when given, a closure whose
    middle lies in ``[t - frame_s / 2, t + frame_s / 2)`` also shuts this frame's mouth, so a short
    m/b/p that falls between two frames is still seen, on the frame nearest to it.
    """
    if not phones:
        return REST
    ends = [p.end for p in phones] if not isinstance(phones, _Timeline) else phones.ends
    i = bisect.bisect_right(ends, t)
    if i >= len(phones) or t < phones[i].start:
        shape = REST
    else:
        shape = _phone_shape(phones, i, t)
    if frame_s is not None and shape.open > 0.0:
        half = frame_s / 2.0
        j = bisect.bisect_right(ends, t - half)
        while j < len(phones) and phones[j].start < t + half:
            mid = (phones[j].start + phones[j].end) / 2.0
            if phones[j].phone.strip().lower() in CLOSURES and t - half <= mid < t + half:
                return _closed(shape_of(phones[j].phone))
            j += 1
    return shape


def _phone_shape(phones: Sequence[SpokenPhone], i: int, t: float) -> MouthShape:
    cur = phones[i]
    held = _held(cur, t)
    if cur.phone.strip().lower() in CLOSURES:
        return _closed(held)
    blend = min(BLEND_S, (cur.end - cur.start) / 2.0)
    if blend <= 0.0 or t < cur.end - blend:
        return held
    nxt = phones[i + 1] if i + 1 < len(phones) and phones[i + 1].start - cur.end < 1e-3 else None
    target = REST if nxt is None else _held(nxt, nxt.start)
    return held.towards(target, (t - (cur.end - blend)) / blend)


class _Timeline(tuple):  # type: ignore[type-arg]
    """Phones with their end times precomputed, for many ``mouth_at`` calls on one phrase."""

    ends: list[float]


def timeline(phones: Sequence[SpokenPhone]) -> Sequence[SpokenPhone]:
    """``phones`` checked (known, in order) and ready for repeated ``mouth_at`` calls (one per frame)."""
    out = _Timeline(phones)
    last = float("-inf")
    for p in out:
        viseme_of(p.phone)
        if p.end < p.start or p.start < last - 1e-6:
            raise ValueError(f"phones must be in time order with end >= start, got {p!r}")
        last = p.start
    out.ends = [p.end for p in out]
    return out
