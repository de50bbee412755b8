"""The response stage: when the user's turn ends, answer it, paced at the current load's policy.

A turn ends at the turn detector's decision (``app.live.turns``: silence after words that can end a
sentence) or, without one, at the ASR's endpoint. A responder with a network TTFT gets the request at
the pause already, and an instant one whose answer is spoken a little later (``speak``): a prefetch,
whose tokens, and the speech already synthesized from them, are held until the turn really ends. Each
answer is metered for LST (docs/LST.md) and streamed as ``response`` events.

Where the session speaks its answers (``app.live.answer``), the responder's raw tokens are read as
they arrive and teed to the synthesizer before the pacer, the answer lasts until its audio has
played, and ``response_end`` says how it ended and what was spoken. The conversation history the
responder sees keeps only that: what the user said and the delivered prefix of each answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from alignment.clock import SessionClock
from alignment.lst import LSTMeter
from alignment.pacing import TokenPacer
from alignment.types import AnswerEnd, AnswerOutcome, AudioChunk, LoadEstimate, TokenRatePolicy, WordToken
from app.live.answer_lst import ConversationTrace, MeteredAnswer
from app.live.events import LSTEvent, ResponseEndEvent, ResponseEvent
from app.live.observe import SessionObserver
from app.live.stages import Pacer, Responder, Stage, StageHost, attempt
from app.live.turns import TurnDetector, looks_unfinished
from models.responders import Conversation

if TYPE_CHECKING:
    from app.live.answer import Answer, AnswerPlayer

#: A turn's words "reach" its end of speech when the last one ends this close to it (ASR word ends
#: fall a little before the VAD's end of speech; a word still missing leaves a larger gap).
HEARD_SLACK_S = 0.35


class Responses:
    """One session's turns and the answers to them."""

    def __init__(self, host: StageHost, responder: Responder, turns: TurnDetector | None, clock: SessionClock,
                 make_pacer: Callable[[TokenRatePolicy], Pacer] | None, lst: LSTMeter | None,
                 observer: SessionObserver, player: AnswerPlayer | None = None, history_turns: int = 8,
                 trace: ConversationTrace | None = None) -> None:
        """``player``: speaks the answers (None: text only); ``trace``: the session's conversation trace
        (``app.live.answer_lst``). The load reaches it by one route, :meth:`set_load`."""
        self.host, self.responder, self.turns, self.clock = host, responder, turns, clock
        self.make_pacer, self.lst, self.observer = make_pacer, lst, observer
        self.player, self.trace = player, trace
        self._load: LoadEstimate | None = None  # the controller's latest estimate (None: it has not spoken)
        self.history: deque[tuple[str, str]] = deque(maxlen=max(history_turns, 0))  # (user, delivered answer)
        self._cut: AnswerEnd | None = None  # why the answer now being cancelled ends
        self._interval: float | None = None  # the pace's interval at the last answer's end (it glides on)
        self._response_task: asyncio.Task[None] | None = None
        self._pacer: Pacer | None = None  # the pacer of the answer now being shown
        # words heard since the last answered turn, and a prefetched response
        self._turn_words: dict[tuple[int, int], tuple[float, float, str]] = {}  # key → (start, end, text)
        self._answered_until = -math.inf  # speech end (pts) of the last turn answered
        self._unanswered_end: float | None = None  # a turn ended before its words came: answer when they do
        self._prefetch: tuple[asyncio.Task[None], asyncio.Event, float, str] | None = None  # task, gate, pts, text
        self._pause_pts: float | None = None  # speech end of the pause now running (turn not over yet)
        self._prefetch_due = False  # this pause has lasted long enough for a prefetch (``prefetch_at``)

    def set_load(self, estimate: LoadEstimate) -> None:
        """The controller's new estimate (``app.live.au`` calls it): the answer being shown follows its
        policy from the next word, the next answer starts at it, and the responder sees the load."""
        self._load = estimate
        pacer = self._pacer
        if pacer is not None:
            attempt(self.host, Stage.RESPONSE, lambda: pacer.set_policy(estimate.policy))

    @property
    def policy(self) -> TokenRatePolicy | None:
        """The current load's policy (None before the controller has spoken)."""
        return self._load.policy if self._load is not None else None

    # --- turns ------------------------------------------------------------------------------------

    def heard(self, tok: WordToken) -> None:
        """A word of the user's (interim or final): part of the turn now running."""
        if self.turns is None or tok.start < self._answered_until - 0.05:
            return
        self._turn_words[(tok.utterance, tok.index)] = (tok.start, tok.end, tok.text)
        if self._unanswered_end is not None and self._heard_until(self._unanswered_end):
            self._end_turn(self._unanswered_end)
        elif self._pause_pts is not None and self._prefetch_due and (
                self._prefetch is None or self._prefetch[3] != self._turn_text(self._pause_pts)):
            self._prefetch_response(self._pause_pts)  # the words reached the pause, or changed: (re)send

    def utterance_end(self, pts: float, text: str, utterance: int) -> None:
        """The ASR's endpoint: answers unless the turn detector did (or is still deciding)."""
        if Stage.RESPONSE in self.host.degraded:
            return
        if self.turns is not None:
            # Only for a turn that ended before its words were heard (an utterance inside it, or it).
            pending = self._unanswered_end
            if pending is None or not self._answered_until < pts <= pending + 0.5 or not text.strip():
                return
            if pts >= pending - 0.05:
                self._unanswered_end = None
            self._answered_until = pts
            self._turn_words = {k: w for k, w in self._turn_words.items() if w[0] >= pts}  # the next turn's
        self._start_response(text, pts, utterance, None)

    def audio(self, chunk: AudioChunk) -> None:
        """The user's audio, for the turn detector."""
        if self.turns is None or Stage.RESPONSE in self.host.degraded:
            return
        for ev in self.turns.feed(chunk, self._turn_text()):
            if ev.kind in ("pause", "speak"):
                self._pause_pts = ev.pts
                if ev.kind == self.prefetch_at and not self._prefetch_due:
                    self._prefetch_due = True
                    self._prefetch_response(ev.pts)
            elif ev.kind == "resume":
                self._pause_pts, self._prefetch_due = None, False
                self._drop_prefetch()
            else:
                self._pause_pts, self._prefetch_due = None, False
                self._end_turn(ev.pts)

    def _turn_text(self, until: float = math.inf) -> str:
        """The turn's words (interims included) that start before ``until``."""
        return " ".join(text for start, _, text in sorted(self._turn_words.values()) if start < until)

    def _turn_utterance(self) -> int:
        return max((u for u, _ in self._turn_words), default=0)

    def _heard_until(self, pts: float) -> bool:
        """The words spoken before ``pts`` reach it (the ASR has caught up with this end of speech)."""
        ends = [end for start, end, _ in self._turn_words.values() if start < pts]
        return bool(ends) and max(ends) >= pts - HEARD_SLACK_S

    @property
    def prefetch_at(self) -> str | None:
        """The turn event at which an answer starts ahead of the turn's end (held until then; the hold is
        reported, docs/LST.md): ``pause`` for a responder with a network TTFT, which overlaps it with the
        rest of the silence; ``speak`` for an instant one whose answer is spoken (its first phrase's
        synthesis overlaps it); None otherwise."""
        if self.responder.prefetch:
            return "pause"
        return "speak" if self.player is not None else None

    def _prefetch_response(self, pts: float) -> None:
        """Speech paused after words that can end a sentence: send the request now, hold its tokens
        and its speech until the turn is over."""
        text = self._turn_text(pts)
        self._drop_prefetch()
        if self.prefetch_at is None or not text or looks_unfinished(text) or not self._heard_until(pts):
            return
        gate = asyncio.Event()
        task = self.host.spawn(self._respond(text, pts, self._turn_utterance(), gate), Stage.RESPONSE_PREFETCH)
        self._prefetch = (task, gate, pts, text)
        self._count_prefetch(wasted=False)

    def _drop_prefetch(self) -> None:
        if self._prefetch is not None:
            self._prefetch[0].cancel()
            self._prefetch = None
            self._count_prefetch(wasted=True)

    def _count_prefetch(self, wasted: bool) -> None:
        """LST v3 reports the prefetch waste: requests sent at a pause, then discarded."""
        if self.lst is not None:
            self.lst.prefetch(wasted=wasted)

    def _end_turn(self, pts: float) -> None:
        """The turn is over: release the prefetched answer or start one, once its words are heard
        (until then the first token that reaches the end, or the ASR's endpoint, answers)."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None and abs(prefetch[2] - pts) < 1e-6 and not prefetch[0].done():
            self._interrupt_answer()
            self._response_task = prefetch[0]
            prefetch[1].set()
        else:
            if prefetch is not None:
                prefetch[0].cancel()
                self._count_prefetch(wasted=True)
            if not self._heard_until(pts):
                self._unanswered_end = pts
                return
            self._start_response(self._turn_text(pts), pts, self._turn_utterance(), None)
        self._unanswered_end = None
        self._answered_until = pts
        self._turn_words = {k: w for k, w in self._turn_words.items() if w[0] >= pts}  # the next turn's

    # --- answers ----------------------------------------------------------------------------------

    def _interrupt_answer(self, reason: AnswerEnd = AnswerEnd.BARGE_IN) -> bool:
        if self._response_task is not None and not self._response_task.done():
            self._cut = reason
            self._response_task.cancel()  # a new turn interrupts the previous answer
            return True
        return False

    def barge_in(self) -> bool:
        """The user spoke over the answer: its audio and avatar stop now, its text stream ends."""
        if self.player is not None:
            self.player.stop()
        return self._interrupt_answer(AnswerEnd.BARGE_IN)

    def _start_response(self, text: str, pts: float, utterance: int, gate: asyncio.Event | None) -> None:
        self._interrupt_answer()
        self._response_task = self.host.spawn(self._respond(text, pts, utterance, gate), Stage.RESPONSE)

    async def _respond(self, text: str, speech_end_pts: float, utterance: int, gate: asyncio.Event | None) -> None:
        """Answer one turn: responder words paced at the current load's policy, LST-metered.

        With a ``gate`` (a prefetch) the request goes out now and its first word waits for the gate,
        before pacing, so the pace starts when the words may be shown. Each ``response`` event
        carries what its word measured (``ttft_ms`` and ``turn_ms`` on the first, ``itl_ms`` on the
        rest), so a client can keep the raw samples (``synchrony certify``). Where answers are
        spoken, the words are read eagerly and teed to the synthesizer as they arrive. The live
        ``max_tokens`` is enforced here only, by the pacer (``TokenPacer.pace``; ``set_load`` keeps its
        policy current); the responder gets the starting policy's as its request's limit.
        """
        policy = self.policy or _level0_policy()
        speech_end = self.clock.wall_of(speech_end_pts)
        pacer = (self.make_pacer or TokenPacer)(policy)
        pacer.continue_from(self._interval)  # a new rate glides from the last answer's (alignment.pacing)
        since = speech_end if speech_end is not None else time.monotonic()
        metered = MeteredAnswer(self.responder, policy, self.lst, self.trace, utterance, speech_end)
        player = self.player
        voice: Answer | None = None
        heard: list[str] = []  # words read from the responder (and teed to the voice)
        shown: list[str] = []  # words paced out to the client
        reason: AnswerEnd | None = AnswerEnd.BARGE_IN if gate is None else None  # if cancelled
        released = gate is None  # a prefetch is under way (not dropped) once its gate opens

        def speak(word: str) -> None:  # synthesized now, heard once released (a prefetch's first phrase is ready)
            nonlocal voice
            if voice is None and player is not None:
                voice = player.prepare(utterance, speech_end_pts, lambda: self.policy or policy, metered.turn)
            if voice is not None:
                voice.feed(" " + word if heard else word)
            heard.append(word)

        def release() -> None:
            nonlocal reason, released
            released, reason = True, AnswerEnd.BARGE_IN  # shown from now on: a cancel cuts the answer short
            self._pacer = pacer  # the answer now being shown follows load changes
            if voice is not None and player is not None:
                player.release(voice)

        words = self._read(metered, text, speak)
        source = _gated(words if player is None else _eager(words), gate, release)
        try:
            async for tok in pacer.pace(source):
                # the first word's LST timing only now: an answer still streaming keeps its own ITLs
                timing = metered.shown(tok)
                if timing is not None:
                    self.observer.response_token(timing)
                shown.append(tok.text)
                self.host.emit(ResponseEvent(utterance, tok.index, tok.text, (tok.emitted - since) * 1000, timing,
                                             completion=metered.times.completion_id if tok.index == 0 else None))
            reason = metered.reason(pacer.policy.max_tokens)
            metered.end(reason, keep_turn=voice is not None)  # a spoken answer's turn lasts until it has played
            if self.lst is not None and metered.delivered:
                self.host.emit(LSTEvent(self.lst.snapshot()))
            if voice is not None:
                voice.close_input()
                await voice.finished.wait()
        except asyncio.CancelledError:
            if reason is not None:
                reason = self._cut or reason
            self._cut = None
            if voice is not None:
                voice.stop()
            if heard and released:  # an answer was under way (not a prefetch dropped before its release)
                self._answered(text, voice, reason or AnswerEnd.BARGE_IN, shown)
            raise
        except Exception as exc:  # noqa: BLE001
            reason = AnswerEnd.ERROR
            if voice is not None:
                voice.stop()
            self.host.fail_stage(Stage.RESPONSE, exc)
        finally:
            metered.end(reason)
            metered.close_turn()
            if metered.delivered:  # a discarded prefetch paced nothing: the glide goes on from the last answer
                self._interval = pacer.interval_s
            if self._pacer is pacer:
                self._pacer = None
        if (heard and released) or reason is AnswerEnd.ERROR:
            self._answered(text, voice, reason or AnswerEnd.ERROR, shown)

    async def _read(self, metered: MeteredAnswer, text: str, tee: Callable[[str], None]) -> AsyncIterator[str]:
        """The responder's words for ``text`` in this conversation, each handed to ``tee`` as it is read."""
        async for word in metered.words(text, context=Conversation(tuple(self.history), self._load)):
            tee(word)
            yield word

    def _answered(self, user: str, voice: Answer | None, reason: AnswerEnd, shown: list[str]) -> None:
        """An answer ended: keep what was delivered in the history, say how it ended."""
        if voice is not None and not voice.failed:
            outcome = voice.outcome(reason)
        else:  # text only (no speech, or the synthesizer failed): the words shown
            words = " ".join(shown).split()
            outcome = AnswerOutcome(voice.id if voice is not None else -1, reason, len(words), " ".join(words))
        if self.history.maxlen:
            self.history.append((user, outcome.text))
        if self.player is not None:
            if voice is None:
                return
            self.observer.answer_ended(str(reason))
            self.host.emit(ResponseEndEvent(outcome))


async def _gated(words: AsyncIterator[str], gate: asyncio.Event | None, release: Callable[[], None],
                 ) -> AsyncIterator[str]:
    """``words``, the first held until ``gate`` opens (a prefetch; none: at once); ``release`` before each."""
    async for word in words:
        if gate is not None and not gate.is_set():
            await gate.wait()
        release()
        yield word


async def _eager(tokens: AsyncIterator[str]) -> AsyncIterator[str]:
    """Pull ``tokens`` as fast as they come (a task of its own) and hand them on at the consumer's pace."""
    queue: asyncio.Queue[tuple[str | None, BaseException | None]] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for tok in tokens:
                queue.put_nowait((tok, None))
            queue.put_nowait((None, None))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised in the consumer
            queue.put_nowait((None, exc))

    task = asyncio.ensure_future(pump())
    try:
        while True:
            tok, exc = await queue.get()
            if exc is not None:
                raise exc
            if tok is None:
                return
            yield tok
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _level0_policy() -> TokenRatePolicy:
    """The policy before the controller has spoken (or without one): level 0's."""
    from models.controller import policy_for_level  # torch: loaded by warm-up, not by importing the server

    return policy_for_level(0)
