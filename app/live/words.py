"""The words stage: audio → the shared ASR → tokens placed on the output frames that can still carry them.

:class:`Transcript` owns the session's ASR stream and places each token on the output frames that can
still carry it (``alignment.frames.place_token``); the Level-3 check of each final word is the next
stage (``app.live.level3``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from alignment.frames import TokenFrames, place_token
from alignment.types import AudioChunk, WordToken
from app.live.stages import ASRStream, Stage, StageHost


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
