"""Small frozen records that flow between pipeline stages.

Every record carries a presentation time (``pts``, seconds) on the session clock: zero is the
first media the session received. Processing time never leaks into pts; latency is measured
separately as wall time at emission minus pts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

#: The 12 FACS action units synchrony reports, in a fixed order (the controller's input order).
AU_NAMES: tuple[str, ...] = (
    "AU1", "AU2", "AU4", "AU6", "AU7", "AU9", "AU12", "AU15", "AU17", "AU20", "AU25", "AU26",
)

SAMPLE_RATE = 16_000  # Hz, mono float32 in [-1, 1] everywhere inside the pipeline


@dataclass(frozen=True)
class AudioChunk:
    """A run of 16 kHz mono samples whose first sample is presented at ``pts``."""

    pts: float
    samples: np.ndarray = field(repr=False)

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE

    @property
    def end(self) -> float:
        return self.pts + self.duration


@dataclass(frozen=True)
class VideoFrame:
    """One RGB camera frame (H, W, 3 uint8) presented at ``pts``."""

    pts: float
    image: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class AUSample:
    """Action-unit intensities in [0, 1] for one camera frame; ``face`` is False when none was seen."""

    pts: float
    au: tuple[float, ...]  # ordered as AU_NAMES
    face: bool

    def as_dict(self) -> dict[str, float]:
        return {name: round(float(v), 4) for name, v in zip(AU_NAMES, self.au, strict=True)}

    def vector(self) -> np.ndarray:
        return np.asarray(self.au, dtype=np.float32)


@dataclass(frozen=True)
class WordToken:
    """A recognised word with its start and end on the session clock.

    ``final`` tokens never change again; interim tokens may be revised by later ones with the
    same ``utterance`` and ``index``.
    """

    text: str
    start: float
    end: float
    final: bool = True
    probability: float = 1.0
    utterance: int = 0
    index: int = 0


@dataclass(frozen=True)
class TokenRatePolicy:
    """How the response stream should flow for the current cognitive load."""

    tokens_per_s: float
    max_tokens: int
    temperature: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "tokens_per_s": round(self.tokens_per_s, 3),
            "max_tokens": self.max_tokens,
            "temperature": round(self.temperature, 3),
        }


@dataclass(frozen=True)
class LoadEstimate:
    """The controller's cognitive-load level (0-3) with class probabilities and the policy it implies."""

    pts: float
    level: int
    probs: tuple[float, float, float, float]
    policy: TokenRatePolicy


@dataclass(frozen=True)
class SyncCheck:
    """Level-3 verdict for one token: audio, video and text times pairwise within the tolerance.

    ``evidence`` names what the video time rests on: ``"markers"`` (flash/click sync markers),
    ``"lips"`` (lip motion vs speech envelope), or ``"assigned"`` (only the pipeline's own pts,
    which proves nothing by itself). The audio time is the aligner's; where the word follows
    silence it is also checked against the acoustic onset, and ``ok`` needs that check too.
    """

    token: str
    pts: float
    audio: float
    video: float
    text: float
    max_delta_ms: float
    ok: bool
    evidence: str = "assigned"
    #: The word's acoustic onset (session s) where it follows silence (alignment.onsets), and the
    #: placed start minus it (ms); None when the audio gives no such evidence.
    audio_onset: float | None = None
    audio_error_ms: float | None = None


# --- the spoken answer (issue 35) ---------------------------------------------------------------


@dataclass(frozen=True)
class SpokenWord:
    """One word of a synthesized phrase: seconds from the phrase audio's first sample."""

    text: str
    start: float
    end: float


@dataclass(frozen=True)
class SpokenPhone:
    """One phone of a synthesized phrase (festival's US English phone set; ``pau`` is silence)."""

    phone: str
    start: float
    end: float


@dataclass(frozen=True)
class SpokenPhrase:
    """A synthesized phrase of an answer: its audio with the time of every word and phone in it.

    Times are relative to the first sample of ``audio``; the player puts the phrase on the session
    clock when it starts playing it.
    """

    text: str
    audio: np.ndarray = field(repr=False)  # mono float32 in [-1, 1]
    sample_rate: int
    words: tuple[SpokenWord, ...]
    phones: tuple[SpokenPhone, ...] = ()

    @property
    def duration(self) -> float:
        return len(self.audio) / self.sample_rate


class AnswerEnd(StrEnum):
    """Why an answer ended. Every reason but ``done`` is an answer cut short."""

    DONE = "done"
    BARGE_IN = "barge_in"  # the user spoke over it (or started a new turn)
    MAX_TOKENS = "max_tokens"  # the load policy's limit was reached (or lowered under it)
    ERROR = "error"  # the responder or the synthesizer failed


@dataclass(frozen=True)
class AnswerOutcome:
    """How one answer ended: the single definition of an answer cut short, shared by the spoken
    answer (``response_end``), the conversation history and LST's SEQ-Integrity.

    What was delivered is always a prefix of the responder's answer that ends on a word boundary:
    ``words`` whole words (spoken aloud where speech is on, shown as text otherwise), and ``text``
    exactly those words joined by single spaces. That prefix, and nothing after it, is what the
    conversation history keeps.
    """

    answer: int  # the answer's id: the utterance it answers
    reason: AnswerEnd
    words: int
    text: str
    spoken_until: float | None = None  # session clock: end of the last spoken word's audio

    @property
    def cut_short(self) -> bool:
        return self.reason is not AnswerEnd.DONE
