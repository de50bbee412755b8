"""One answer's LST bookkeeping on the delivery path: timing, SEQ-Integrity, the trace.

``app.live.response`` calls it at four points: ``words`` (the responder's pieces as whole words,
with ``RequestTimes`` filled in and ``traceparent`` on the request), ``shown`` (each paced word
handed to the DataChannel), and ``end`` (once, however the answer ended). From these it meters
LST v3 (TTFT = request written → first content read; the turn-hold inside the turn latency),
judges the answer's SEQ-Integrity against everything the responder sent (``alignment.seq``) and
closes the ``llm`` and ``turn`` spans (``app.live.tracing``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from alignment.lst import LSTMeter, TokenTiming
from alignment.pacing import PacedToken
from alignment.seq import SentAnswer, SeqVerdict, check_answer, words_of
from alignment.types import AnswerEnd, TokenRatePolicy
from app.live import tracing
from app.live.stages import Responder
from models.responders import RequestTimes

#: An ASR final belongs to the turn whose end of speech is this close to its own (s).
_SAME_TURN_S = 1.0


class ConversationTrace:
    """A session's trace: its root span, a ``turn`` span per answer, ``asr`` spans under them."""

    def __init__(self, root: tracing._NoSpan) -> None:
        self.root = root
        self._turns: list[tuple[float, tracing._NoSpan]] = []  # (speech end, turn span), the last few
        self._finals: list[tuple[float, float]] = []  # ASR finals not yet matched: (speech end, final)

    def turn(self, answer: int, speech_end: float | None) -> tracing._NoSpan:
        span = tracing.turn_span(self.root, answer, speech_end)
        if speech_end is not None:
            self._turns = [*self._turns[-3:], (speech_end, span)]
            for pending in [f for f in self._finals if abs(f[0] - speech_end) < _SAME_TURN_S]:
                self._finals.remove(pending)
                span.child("asr", start=pending[0]).end(pending[1])
        return span

    def asr_final(self, speech_end: float | None, final_at: float) -> None:
        """The ASR's final for speech that ended at ``speech_end``: a child of its turn (now or
        when that turn's answer begins)."""
        if speech_end is None or self.root is tracing.NO_SPAN:
            return
        for end, span in reversed(self._turns):
            if abs(end - speech_end) < _SAME_TURN_S:
                span.child("asr", start=speech_end).end(final_at)
                return
        self._finals = [*self._finals[-3:], (speech_end, final_at)]

    def event(self, name: str, attrs: tracing.Attrs | None = None) -> None:
        self.root.event(name, attrs)


class MeteredAnswer:
    """One answer's LST meter, SEQ-Integrity check and spans (see the module docstring)."""

    def __init__(self, responder: Responder, policy: TokenRatePolicy, lst: LSTMeter | None,
                 trace: ConversationTrace | None, answer: int, speech_end: float | None) -> None:
        self.responder, self.policy, self.lst, self.speech_end = responder, policy, lst, speech_end
        self.times = RequestTimes()
        self.delivered: list[tuple[int, str]] = []
        self.started = time.monotonic()
        self.turn = trace.turn(answer, speech_end) if trace is not None else tracing.NO_SPAN
        self.llm = tracing.llm_span(self.turn, getattr(responder, "model", ""), policy,
                                    getattr(responder, "name", "responder"))
        self.verdict: SeqVerdict | None = None
        self._ended = False

    def words(self, text: str, **options: object) -> AsyncIterator[str]:
        """The responder's answer to ``text`` as whole words (a split last word withheld);
        ``options`` go to ``Responder.tokens`` too (e.g. the conversation's context)."""
        raw = self.responder.tokens(text, self.policy, times=self.times, headers=self.llm.headers(),
                                    **options)  # type: ignore[arg-type]
        return words_of(raw, complete=lambda: self.times.finish_reason != "length",
                        joined=not getattr(self.responder, "word_tokens", False))

    def shown(self, tok: PacedToken) -> TokenTiming | None:
        """A paced word went to the client: its LST timing (None without a meter)."""
        first = not self.delivered
        self.delivered.append((tok.index, tok.text))
        if self.lst is None:
            return None
        if first:
            self.lst.begin_response(self.times.sent or self.started, self.speech_end, self.times.first)
        return self.lst.token(tok.emitted)

    def reason(self, max_tokens: int) -> AnswerEnd:
        """How an answer that ran to its end ended: ``max_tokens`` when a limit cut it, else ``done``."""
        if self.times.finish_reason == "length" or len(self.delivered) >= max_tokens:
            return AnswerEnd.MAX_TOKENS
        return AnswerEnd.DONE

    def end(self, reason: AnswerEnd | None, keep_turn: bool = False) -> None:
        """The answer ended (``None``: a prefetched request discarded before it was shown);
        ``keep_turn``: its turn span stays open (the spoken answer still plays) until ``close_turn``."""
        if self._ended:
            return
        self._ended = True
        if reason is not None:
            joiner = " " if getattr(self.responder, "word_tokens", False) else ""
            sent = SentAnswer(joiner.join(self.times.content), tuple(self.times.tool_calls))
            self.verdict = check_answer(self.delivered, sent, done=reason is AnswerEnd.DONE)
            if self.lst is not None:
                if self.delivered:
                    self.lst.response_end()
                self.lst.answer_integrity(self.verdict.kept)
        tracing.end_llm_span(self.llm, self.times, len(self.delivered))
        if reason is AnswerEnd.BARGE_IN:
            self.turn.event("barge_in", {"synchrony.words_delivered": len(self.delivered)})
        self.turn.set({"synchrony.answer_end": str(reason) if reason is not None else "prefetch_discarded",
                       "synchrony.seq_kept": bool(self.verdict.kept) if self.verdict else True})
        if not keep_turn:
            self.turn.end()

    def close_turn(self) -> None:
        self.turn.end()
