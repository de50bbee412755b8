"""The words stage: audio → the shared ASR → tokens placed on the output frames that can still carry them.

:class:`Transcript` owns the session's ASR stream and everything a token does next: it places the token
on the output frames not sent yet (``alignment.frames.place_token``), shows it there (:class:`ShownWords`,
which the returned video reads), emits its ``token`` event and hands it on: to the turns (``Responses``)
and, when final, to the Level-3 check (``app.live.level3``). The session only builds it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Protocol

from alignment.clock import SessionClock
from alignment.frames import TokenFrames, place_token
from alignment.types import AudioChunk, WordToken
from app.live.answer_lst import ConversationTrace
from app.live.events import TokenEvent
from app.live.level3 import SyncStage
from app.live.observe import SessionObserver
from app.live.stages import ASRStream, Stage, StageHost

log = logging.getLogger("synchrony.session")


class NextFrame(Protocol):
    """The returned video (``app.live.output.OutputTrack``): the first frame not sent yet."""

    @property
    def next_index(self) -> int: ...


class Turns(Protocol):
    """Where the user's words go next (``app.live.response.Responses``): the turns and their answers."""

    def heard(self, tok: WordToken) -> None: ...
    def utterance_end(self, pts: float, text: str, utterance: int) -> None: ...


class ShownWords:
    """Where each token is shown: the placed tokens and the words new on each output frame."""

    def __init__(self) -> None:
        self._tokens: dict[tuple[int, int], TokenFrames] = {}  # (utterance, index) -> placed token
        self._frame_words: dict[int, list[WordToken]] = {}  # frame -> words new on it

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


class Transcript:
    """The session's ASR stream, and each of its tokens placed, shown, emitted and handed on."""

    def __init__(self, host: StageHost, stream: ASRStream, shown: ShownWords, output: NextFrame,
                 clock: SessionClock, observer: SessionObserver, trace: ConversationTrace, *,
                 responses: Turns | None = None, sync: SyncStage | None = None) -> None:
        """``output``: the returned video, whose next frame is the first a token may still go on;
        ``responses``: the turns and answers (None: no responder); ``sync``: Level-3 (None: none)."""
        self.host, self.shown, self.output, self.clock = host, shown, output, clock
        self.observer, self.trace, self.responses, self.sync = observer, trace, responses, sync
        self._stream: ASRStream | None = stream
        self._events = stream

    def push(self, chunk: AudioChunk) -> bool:
        """Audio to the ASR; False when there is no stream (closed, or it failed)."""
        if self._stream is None or Stage.ASR in self.host.degraded:
            return False
        try:
            self._stream.push(chunk)
        except Exception as exc:  # noqa: BLE001
            self.host.fail_stage(Stage.ASR, exc)
        return True

    async def run(self) -> None:
        """Each ASR event through the stage: a token, or an utterance's end."""
        from models.asr import UtteranceEnd

        try:
            async for ev in self._events.events():
                if isinstance(ev, WordToken):
                    self._token(ev)
                elif isinstance(ev, UtteranceEnd):
                    self._utterance_end(float(ev.pts), str(ev.text), ev.utterance)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            self.host.fail_stage(Stage.ASR, exc)

    def _token(self, tok: WordToken) -> None:
        placed = self.shown.place(tok, self.output.next_index)
        if self.responses is not None:
            self.responses.heard(tok)
        self.shown.show(placed)
        wall_end = self.clock.wall_of(tok.end)
        if wall_end is not None:
            self.observer.token_placed(placed, time.monotonic() - wall_end)
        self.host.emit(TokenEvent(placed))
        if tok.final and self.sync is not None:
            self.sync.check(placed)

    def _utterance_end(self, pts: float, text: str, utterance: int) -> None:
        self.trace.asr_final(self.clock.wall_of(pts), time.monotonic())
        if self.responses is not None:
            self.responses.utterance_end(pts, text, utterance)

    def close(self) -> None:
        """No more audio: the stream flushes, then its events end."""
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("session %s: closing the ASR stream: %s", self.host.id, exc)
