"""The words stage: audio → the shared ASR → tokens placed on output frames → the Level-3 check.

Three parts, one per job: :class:`Transcript` owns the session's ASR stream and places each token
on the output frames that can still carry it (``alignment.frames.place_token``); :class:`OffsetFeed`
gives the A/V offset estimator its independent evidence (every frame's marker flash, the mouth of
the frames the AU stage analysed, the audio); :class:`SyncStage` checks each final word with it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

import av
import numpy as np

from alignment.evidence import OffsetEstimate, VisualObservation
from alignment.frames import TokenFrames, frame_pts, place_token
from alignment.types import AudioChunk, WordToken
from app.live.events import SyncEvent
from app.live.observe import SessionObserver
from app.live.stages import ASRStream, OffsetEstimator, Stage, StageHost, Validator, attempt

T = TypeVar("T")


class Transcript:
    """The session's ASR stream and where each of its tokens is shown."""

    def __init__(self, host: StageHost) -> None:
        self.host = host
        self.stream: ASRStream | None = None
        self._tokens: dict[tuple[int, int], TokenFrames] = {}  # (utterance, index) -> placed token
        self._frame_words: dict[int, list[WordToken]] = {}  # frame -> words new on it

    def push(self, chunk: AudioChunk) -> bool:
        """Audio to the ASR; False when there is no stream (or it failed)."""
        if self.stream is None or Stage.ASR in self.host.degraded:
            return False
        try:
            self.stream.push(chunk)
        except Exception as exc:  # noqa: BLE001
            self.host.fail_stage(Stage.ASR, exc)
        return True

    async def run(self, stream: ASRStream, on_token: Callable[[WordToken], None],
                  on_end: Callable[[float, str, int], None]) -> None:
        """Hand each ASR event on: a token, or an utterance's end (pts, text, utterance)."""
        from models.asr import UtteranceEnd

        try:
            async for ev in stream.events():
                if isinstance(ev, WordToken):
                    on_token(ev)
                elif isinstance(ev, UtteranceEnd):
                    on_end(float(ev.pts), str(ev.text), ev.utterance)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            self.host.fail_stage(Stage.ASR, exc)

    def held(self) -> tuple[int, int]:
        """(placed tokens, frames with words) held now; pruning keeps both bounded."""
        return len(self._tokens), len(self._frame_words)

    def place(self, tok: WordToken, next_frame: int) -> TokenFrames:
        """Place ``tok`` (a revision replaces its earlier self) on the frames not sent yet."""
        key = (tok.utterance, tok.index)
        prev = self._tokens.get(key)
        placed = place_token(tok, next_frame, prev)
        if prev is not None:
            for k in prev.frames:
                words = self._frame_words.get(k)
                if words and prev.token in words:
                    words.remove(prev.token)
        self._tokens[key] = placed
        return placed

    def show(self, placed: TokenFrames) -> None:
        """Draw the word on its frames as new."""
        for k in placed.frames:
            self._frame_words.setdefault(k, []).append(placed.token)

    def new_words(self, k: int) -> tuple[WordToken, ...]:
        """Words new on frame ``k`` (each frame asks once)."""
        return tuple(self._frame_words.pop(k, ()))

    def placed(self) -> Iterable[TokenFrames]:
        return self._tokens.values()

    def prune(self, k: int) -> None:
        """Forget per-frame words for frames already sent and tokens of old utterances."""
        for old in [i for i in self._frame_words if i < k]:
            del self._frame_words[old]
        if len(self._tokens) > 400:
            keep = sorted(self._tokens.items(), key=lambda kv: kv[1].token.start)[-200:]
            self._tokens = dict(keep)


def flash_of(frame: av.VideoFrame) -> float:
    """Marker-patch brightness of a decoded frame, read from its luma plane (no colour conversion)."""
    from alignment.evidence import flash_score

    if frame.format.name in ("yuv420p", "yuvj420p", "nv12"):
        plane = frame.planes[0]
        luma = np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)[:, : plane.width]
        return float(flash_score(luma))
    return float(flash_score(frame.to_ndarray(format="gray")))


class OffsetFeed:
    """The A/V offset estimator's evidence, in pts order; gone (None) once it failed."""

    def __init__(self, host: StageHost, estimator: OffsetEstimator | None) -> None:
        self.host = host
        self.estimator = estimator
        self._flash_pending: deque[tuple[float, float]] = deque(maxlen=256)  # (pts, flash) awaiting AUs
        self._estimate: tuple[float, OffsetEstimate] | None = None  # (wall, estimate), refreshed ≤ 1/s
        self._last_final_start: float | None = None  # the word before, for the onset check

    @property
    def active(self) -> bool:
        return self.estimator is not None

    def camera_frame(self, t: float, frame: av.VideoFrame, faces_running: bool) -> None:
        """Every frame's flash (a one-frame flash must not be skipped); without face analysis the
        frames go to the estimator at once, else with the mouth of the frame analysed next."""
        if self.estimator is None:
            return
        self._flash_pending.append((t, flash_of(frame)))
        if not faces_running:
            self.visual(t, None)

    def audio(self, chunk: AudioChunk) -> None:
        if self.estimator is not None:
            self._feed(self.estimator.push_audio, chunk)

    def visual(self, upto: float, mouth: float | None) -> None:
        """Every frame up to ``upto`` in pts order: flash scores for all, mouth openness for the
        frame the AU stage processed (frames it skipped carry none)."""
        while (est := self.estimator) is not None and self._flash_pending \
                and self._flash_pending[0][0] <= upto + 1e-6:
            pts, flash = self._flash_pending.popleft()
            here = abs(pts - upto) <= 1e-6
            self._feed(est.push_visual, VisualObservation(pts, mouth if here else None, flash))

    def _feed(self, push: Callable[[T], None], item: T) -> None:
        try:
            push(item)
        except Exception as exc:  # noqa: BLE001
            self.host.fail_stage(Stage.SYNC, exc)
            self.estimator = None

    def evidence(self, start: float) -> tuple[OffsetEstimate | None, float | None]:
        """The current offset estimate (its lip search costs ~10 ms: ≤ 1/s) and the acoustic onset
        near a final word's ``start``."""
        est = self.estimator
        if est is None:
            return None, None
        now = time.monotonic()
        if self._estimate is None or now - self._estimate[0] > 1.0:
            got = attempt(self.host, Stage.SYNC, est.estimate)
            self._estimate = (now, got) if got is not None else None
        estimate = self._estimate[1] if self._estimate is not None else None
        previous = self._last_final_start
        onset = attempt(self.host, Stage.SYNC, lambda: est.acoustic_onset(start, previous))
        return estimate, onset

    def final_word(self, start: float) -> None:
        self._last_final_start = start


class SyncStage:
    """Level-3 per final word: audio, video and text times within 50 ms, against the evidence."""

    def __init__(self, host: StageHost, validator: Validator, feed: OffsetFeed, observer: SessionObserver) -> None:
        self.host, self.validator, self.feed, self.observer = host, validator, feed, observer
        self.total = 0
        self.passed = 0
        self.last_ok: bool | None = None

    def check(self, placed: TokenFrames) -> None:
        if Stage.SYNC in self.host.degraded:
            return
        estimate, onset = self.feed.evidence(placed.token.start)
        self.feed.final_word(placed.token.start)
        check = attempt(self.host, Stage.SYNC, lambda: self.validator.check_estimate(
            placed.token, frame_pts(placed.frames[0]), estimate, onset))
        if check is None:
            return
        self.total += 1
        self.passed += int(check.ok)
        self.last_ok = check.ok
        self.observer.sync_checked(check)
        self.host.emit(SyncEvent(check))
