"""End-of-turn decisions for one live session, in real time, beside the ASR.

The ASR's endpoint (``models.asr.UtteranceEnd``) comes ~0.5 s after the user stopped (its queue, the
VAD's silence wait, a final decode). A turn's end needs only the silence and the words heard so far, so
each session runs this small detector on its audio as it arrives (a Silero VAD window, ~0.1 ms):

* ``pause``: speech stopped ``pause_s`` ago — the responder's request may start now (prefetch), its
  tokens held back until the turn is over, so its own TTFT overlaps the rest of the silence;
* ``speak``: speech stopped ``speak_s`` ago — a spoken answer may be synthesized now, held until the
  turn is over; later than ``pause``: synthesis is CPU work, which a sentence's 0.1-0.2 s pauses would waste;
* ``resume``: speech came back before the turn was over — drop the prefetched request;
* ``end``: the silence is long enough for what was said: ``end_s`` after words that can end a
  sentence, ``unfinished_end_s`` after a word that rarely ends one ("to", "the", "and", ...), so a
  hesitation inside a sentence is not taken for its end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from alignment.types import AudioChunk
from models.vad import StreamingVAD, VADConfig

#: Words after which an English sentence is rarely over: a pause here is a hesitation.
UNFINISHED = frozenset("""
a an the my your his her its our their this that these those some any every no
to of in on at for with from by about into onto over under after before between through during
and or but so because if when while although though than as
i we you he she they it me us them
is are was were be been am do does did have has had will would could should can may might must shall
um uh er erm like
""".split())


@dataclass(frozen=True)
class TurnConfig:
    """Silence (s) that starts a prefetch, ends a turn, and ends one whose last word is unfinished."""

    pause_s: float = 0.1
    end_s: float = 0.3  # a little over the ASR's endpoint silence (0.25 s): never cuts a turn the ASR would not
    unfinished_end_s: float = 0.6
    vad_threshold: float = 0.5
    speak_s: float = 0.2  # festival's first phrase takes ~50-100 ms: ready by end_s

    def __post_init__(self) -> None:
        if not 0 < self.pause_s <= self.end_s <= self.unfinished_end_s:
            raise ValueError(f"need 0 < pause_s <= end_s <= unfinished_end_s, got {self}")
        if not self.pause_s <= self.speak_s <= self.end_s:
            raise ValueError(f"need pause_s <= speak_s <= end_s, got {self}")


@dataclass(frozen=True)
class TurnEvent:
    """``pts``: where the user's speech stopped (pause, end) or started again (resume)."""

    kind: Literal["pause", "speak", "resume", "end"]
    pts: float


def looks_unfinished(text: str) -> bool:
    """True when the last word heard is one a sentence rarely ends on."""
    words = re.findall(r"[a-z']+", text.lower())
    return bool(words) and words[-1] in UNFINISHED


def end_silence(text: str, config: TurnConfig) -> float:
    return config.unfinished_end_s if looks_unfinished(text) else config.end_s


class TurnDetector:
    """One session's turn state; ``feed`` each audio chunk with the words heard so far this turn."""

    def __init__(self, config: TurnConfig | None = None) -> None:
        self.config = config or TurnConfig()
        self._vad = StreamingVAD(VADConfig(threshold=self.config.vad_threshold, min_silence_s=self.config.pause_s))
        self._started = False
        self._paused_at: float | None = None  # speech end of the pause now running
        self._spoke = False  # ``speak`` was said for this pause

    def feed(self, chunk: AudioChunk, text: str) -> list[TurnEvent]:
        if not self._started:
            self._vad.reset(chunk.pts)
            self._started = True
        out: list[TurnEvent] = []
        for ev in self._vad.feed(chunk.samples):
            if ev.kind == "end":
                self._paused_at, self._spoke = ev.pts, False
                out.append(TurnEvent("pause", ev.pts))
            elif self._paused_at is not None:
                self._paused_at = None
                out.append(TurnEvent("resume", ev.pts))
        if self._paused_at is None:
            return out
        silent = self._vad.pts - self._paused_at
        if not self._spoke and silent >= self.config.speak_s - 1e-9:
            self._spoke = True
            out.append(TurnEvent("speak", self._paused_at))
        if silent >= end_silence(text, self.config) - 1e-9:
            out.append(TurnEvent("end", self._paused_at))
            self._paused_at = None
        return out
