"""The session's wire events (docs/WIRE.md), one frozen record per ``type``.

Each record holds what the stage produced and ``to_wire()`` gives the JSON object a client reads:
the keys, their order and their rounding are the contract, so they are written out here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from alignment.frames import TokenFrames
from alignment.sync import sync_event
from alignment.types import AnswerOutcome, AUSample, LoadEstimate, SyncCheck
from app.live.stages import Stage, Wire

if TYPE_CHECKING:
    from alignment.lst import TokenTiming

WIRE_VERSION = 2


def _t(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


@dataclass(frozen=True)
class HelloEvent:
    session: str
    fps: int
    output_delay_s: float
    stages: tuple[Stage, ...]
    missing: Mapping[str, str]
    answer_audio: bool = False  # the answer is spoken on the audio m-line
    answer_video: bool = False  # ... and its avatar sent on the second video m-line
    voice: str = ""
    type: str = "hello"

    def to_wire(self) -> Wire:
        return {"type": "hello", "session": self.session, "version": WIRE_VERSION, "fps": self.fps,
                "output_delay_s": self.output_delay_s, "stages": sorted(str(s) for s in self.stages),
                "missing": self.missing,
                "answer": {"audio": self.answer_audio, "video": self.answer_video, "voice": self.voice}}


@dataclass(frozen=True)
class AUEvent:
    sample: AUSample
    type: str = "au"

    def to_wire(self) -> Wire:
        return {"type": "au", "pts": round(self.sample.pts, 4), "au": self.sample.as_dict(), "face": self.sample.face}


@dataclass(frozen=True)
class LoadEvent:
    estimate: LoadEstimate
    type: str = "load"

    def to_wire(self) -> Wire:
        e = self.estimate
        return {"type": "load", "pts": round(e.pts, 4), "level": e.level,
                "probs": [round(float(p), 4) for p in e.probs], "policy": e.policy.as_dict()}


@dataclass(frozen=True)
class TokenEvent:
    placed: TokenFrames
    type: str = "token"

    def to_wire(self) -> Wire:
        tok = self.placed.token
        return {"type": "token", "text": tok.text, "start": round(tok.start, 4), "end": round(tok.end, 4),
                "final": tok.final, "frames": list(self.placed.frames), "utterance": tok.utterance,
                "index": tok.index, "late": self.placed.late}


@dataclass(frozen=True)
class SyncEvent:
    check: SyncCheck
    type: str = "sync"

    def to_wire(self) -> Wire:
        return sync_event(self.check)


@dataclass(frozen=True)
class ResponseEvent:
    """One paced response word; ``timing``: what it measured (None without the LST stage);
    ``completion``: on the first word, the responder's completion id (SEQ-Integrity's key)."""

    utterance: int
    index: int
    text: str
    ms_after_utterance: float
    timing: TokenTiming | None = None
    completion: str | None = None
    type: str = "response"

    def to_wire(self) -> Wire:
        out: Wire = {"type": "response", "utterance": self.utterance, "index": self.index, "text": self.text,
                     "ms_after_utterance": round(self.ms_after_utterance, 1)}
        t = self.timing
        if t is not None:
            out.update({k: round(v * 1000, 3) for k, v in (("ttft_ms", t.ttft_s), ("turn_ms", t.turn_s),
                                                           ("hold_ms", t.hold_s), ("itl_ms", t.itl_s))
                        if v is not None})
        if self.completion is not None:
            out["completion"] = self.completion
        return out


@dataclass(frozen=True)
class LSTEvent:
    """The session's LST figures after a response (``alignment.lst.LSTMeter.snapshot``)."""

    figures: Mapping[str, object]
    type: str = "lst"

    def to_wire(self) -> Wire:
        return {"type": "lst", **self.figures}


@dataclass(frozen=True)
class ErrorEvent:
    stage: Stage
    message: str
    type: str = "error"

    def to_wire(self) -> Wire:
        return {"type": "error", "stage": str(self.stage), "message": self.message, "fatal": False}


# --- the spoken answer (wire version 2) ------------------------------------------------------------


@dataclass(frozen=True)
class AnswerStartEvent:
    """The answer's first audio sample was handed to the track (``pts``)."""

    answer: int
    pts: float
    speech_end: float | None
    voice_latency_ms: float | None  # server side: the user's end of speech → that moment (wall)
    type: str = "answer_start"

    def to_wire(self) -> Wire:
        return {"type": "answer_start", "answer": self.answer, "pts": _t(self.pts), "speech_end": _t(self.speech_end),
                "voice_latency_ms": None if self.voice_latency_ms is None else round(self.voice_latency_ms, 1)}


@dataclass(frozen=True)
class AnswerWordEvent:
    """A spoken word, sent when its audio is handed to the track (before it plays)."""

    answer: int
    index: int
    text: str
    start: float
    end: float
    rtp_start: int | None  # the answer audio's RTP timestamp of ``start`` (48 kHz)
    type: str = "answer_word"

    def to_wire(self) -> Wire:
        return {"type": "answer_word", "answer": self.answer, "index": self.index, "text": self.text,
                "start": _t(self.start), "end": _t(self.end), "rtp_start": self.rtp_start}


@dataclass(frozen=True)
class AnswerSyncEvent:
    """Level-3 of one spoken word: audio (found in the sent audio), video (the drawn mouth), text."""

    answer: int
    index: int
    text: str
    audio: float | None
    video: float | None
    text_time: float
    max_delta_ms: float
    ok: bool
    type: str = "answer_sync"

    def to_wire(self) -> Wire:
        delta = round(self.max_delta_ms, 1) if self.max_delta_ms != float("inf") else None
        return {"type": "answer_sync", "answer": self.answer, "index": self.index, "text": self.text,
                "audio": _t(self.audio), "video": _t(self.video), "text_time": _t(self.text_time),
                "max_delta_ms": delta, "ok": self.ok}


@dataclass(frozen=True)
class ResponseEndEvent:
    """How an answer ended (``alignment.types.AnswerOutcome``), and its last word delivered."""

    outcome: AnswerOutcome
    type: str = "response_end"

    def to_wire(self) -> Wire:
        o = self.outcome
        words = o.text.split()
        return {"type": "response_end", "answer": o.answer, "reason": str(o.reason), "words": o.words,
                "text": o.text, "last_word": words[-1] if words else None, "spoken_until": _t(o.spoken_until)}


@dataclass(frozen=True)
class WarningEvent:
    """Something degraded that the session works around (the TTS is down: answers go on as text)."""

    stage: Stage
    message: str
    type: str = "warning"

    def to_wire(self) -> Wire:
        return {"type": "warning", "stage": str(self.stage), "message": self.message}
