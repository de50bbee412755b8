"""Streaming recognition policy for one session: when to decode, which words become final.

VAD gates compute and endpoints utterances; the current utterance window is re-decoded every
``step_s`` of new speech with the committed words forced as a decoder prefix (not re-decoded)
and the last hypothesis verified as a draft in one batched pass; a window opens on the previous
utterance's last words (audio and forced text) when the pause was short; LocalAgreement-2 (a
word seen at the same position in two consecutive hypotheses) turns interims into finals, with a
probability guard (an unsure word waits for more audio after it, and is decoded again the moment
that wait ends); at an endpoint every pending word is finalised at once and an
:class:`UtteranceEnd` carries the VAD end of speech.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

import numpy as np
from whisper.model import Whisper

from alignment.blas import single_threaded_blas
from alignment.forced import aligner
from alignment.support import judge, refuse_unheard_repeats
from alignment.text import without_punctuation
from alignment.timing import align_words, end_by_next_start
from alignment.types import SAMPLE_RATE, AudioChunk, WordToken
from models.asr.engine import DecodedWord, Engine, audible_prefix, check_audio, get_engine
from models.vad import StreamingVAD, VADConfig, VADEvent

MAX_WINDOW_S = 20.0  # a streaming window is re-based once it grows past this


@dataclass(frozen=True)
class UtteranceEnd:
    """The user stopped speaking at ``pts`` (VAD end of speech); ``text`` is the final utterance."""

    pts: float
    utterance: int
    text: str


ASREvent = WordToken | UtteranceEnd


class _AudioBuffer:
    """Recent audio of one stream with its pts; trimmed from the front, never grows past capacity."""

    def __init__(self, capacity_s: float) -> None:
        self._data = np.zeros(int(capacity_s * SAMPLE_RATE), np.float32)
        self._len = 0
        self.start = 0.0  # pts of the first held sample

    @property
    def end(self) -> float:
        return self.start + self._len / SAMPLE_RATE

    def reset(self, pts: float) -> None:
        self._len, self.start = 0, pts

    def append(self, samples: np.ndarray) -> None:
        n = samples.size
        cap = self._data.size
        if n >= cap:
            self.start = self.end + (n - cap) / SAMPLE_RATE
            self._data[:] = samples[-cap:]
            self._len = cap
            return
        if self._len + n > cap:
            self.trim_before(self.start + (self._len + n - cap) / SAMPLE_RATE)
        self._data[self._len : self._len + n] = samples
        self._len += n

    def trim_before(self, pts: float) -> None:
        k = min(max(int(round((pts - self.start) * SAMPLE_RATE)), 0), self._len)
        if k:
            self._data[: self._len - k] = self._data[k : self._len]
            self._len -= k
            self.start += k / SAMPLE_RATE

    def slice(self, a: float, b: float) -> np.ndarray:
        i = min(max(int(round((a - self.start) * SAMPLE_RATE)), 0), self._len)
        j = min(max(int(round((b - self.start) * SAMPLE_RATE)), i), self._len)
        return self._data[i:j].copy()


# The recipe's constants (defaults chosen on espeak speech with tiny.en; docs/asr-measurements.md).
# Final-word latency is roughly RIGHT_CONTEXT_S + up to two steps + one decode inside an utterance,
# and MIN_SILENCE_S + one decode for its last word.
MIN_SILENCE_S = 0.25  # VAD silence that ends an utterance
VAD_THRESHOLD = 0.5
PRE_ROLL_S = 0.25  # audio kept before the VAD start
TAIL_S = 0.15  # audio kept after the VAD end when finalising
LOOKAHEAD_S = 0.1  # refinement may look this far past a word's estimated end (bounded)
REFINE_CONTEXT = 2  # final words of the utterance that lead the refinement's reference
REFINE_FOLLOW = 1  # interim words after the finals that close the forced alignment's text
AGREEMENT = 2  # LocalAgreement-n
MIN_COMMIT_S = 0.3  # no finals before the utterance has this much audio (junk guard)
RIGHT_CONTEXT_S = 0.05  # a word becomes final only with this much audio after it
GUARD_PROB = 0.5  # an agreed word below this probability waits for its guard (StreamingConfig.guard_s)
HOLD_REPEATS = True  # a word repeating the one before it waits for its guard as an unsure one
# A carried window with this much new speech must go on (None: off): forced through the carried words,
# tiny.en tends to end the text for the first decodes of the new speech; so the first word agrees a step sooner.
EXPECT_AFTER_S: float | None = 0.15
END_MIN_PROB = 0.2  # at an endpoint, trailing words below this are the model hearing silence
CONTEXT_S = 0.0  # audio of final words kept in a re-based window (acoustic context)
CARRY_GAP_S = 2.0  # an utterance within this pause of the last one opens on its carried words
MAX_GAP_S = 1.0  # a pts gap up to this is filled with silence; longer restarts the stream


@dataclass(frozen=True)
class StreamingConfig:
    """The knobs of streaming recognition that the product or a benchmark's recipe sets; the rest of the
    recipe is the module's constants above.

    ``step_s``: re-decode after this much new speech (the overload order raises it). Words the model is
    unsure of wait for ``guard_s`` of audio after them, with a decode scheduled for the moment that wait
    ends (``guard_decode``) rather than the next step. An utterance that follows a short pause opens its
    window on the last ``carry_s`` of the previous one's final words (their audio, the pause cut out; their
    text forced as the prefix): the context offline decoding has, without which tiny.en garbled utterance
    starts. Past ``max_window_s`` the window is re-based at a final word boundary. ``int8``: int8 copies
    of the encoder and decoder blocks (models.int8); ``refine``: forced-alignment word times.
    """

    step_s: float = 0.15
    guard_s: float = 0.5
    guard_decode: bool = True
    carry_s: float = 2.0
    max_window_s: float = MAX_WINDOW_S
    int8: bool = True
    refine: bool = True

    def __post_init__(self) -> None:
        if self.step_s <= 0 or self.max_window_s < 2 or self.guard_s < 0 or self.carry_s < 0:
            raise ValueError(f"invalid streaming config {self}")


class StreamingASR:
    """Per-session streaming recogniser. Not thread-safe; one caller at a time (the worker).

    ``feed(chunk)`` and ``flush()`` return :data:`ASREvent` lists in emission order: interim
    WordTokens (``final=False``; a later token with the same ``utterance`` and ``index`` replaces
    it; interims past the last index of a later hypothesis are stale), final WordTokens (never
    change), and :class:`UtteranceEnd` after each utterance's finals.

    ``_on_audio`` / ``_heard`` / ``flush`` (the VAD gate) and ``_after_prefix`` (the forced prefix)
    are the seams bench/asr_engines.py's baseline overrides to compare with the usual recipe.
    """

    def __init__(
        self,
        engine: str | Engine = "whisper",
        config: StreamingConfig | None = None,
        model: Whisper | None = None,
    ) -> None:
        self.config = config or StreamingConfig()
        self.engine = get_engine(engine, model, int8=self.config.int8)
        cfg = self.config
        self._vad = StreamingVAD(VADConfig(threshold=VAD_THRESHOLD, min_silence_s=MIN_SILENCE_S))
        self._buf = _AudioBuffer(max(cfg.max_window_s, MAX_WINDOW_S) + PRE_ROLL_S + MIN_SILENCE_S + 3.0)
        self._started = False
        self._pos = 0.0  # pts of the next expected sample
        self._utt = -1
        self._in_utt = False
        self._win_start = 0.0
        self._committed: list[DecodedWord] = []  # finals in the current window (window-relative)
        self._n_final = 0  # finals emitted in the current utterance
        self._refined: list[WordToken] = []  # this utterance's last final tokens (refinement context)
        self.unsupported = 0  # words the audio did not back: held as interims, or dropped at an endpoint
        self.repeats_unheard = 0  # refusals of a repeat whose second copy the audio did not hold (per decode)
        self._prompt = ""  # finals of this utterance before the current window
        self._hyp: list[DecodedWord] = []  # last hypothesis after the committed words
        self._hyp_history: deque[list[str]] = deque(maxlen=max(AGREEMENT - 1, 1))
        self._decoded_until = 0.0
        self._guard_end = float("inf")  # pts where the held word's guard ends: decode then
        self._utt_start = 0.0
        self._utt_text: list[str] = []
        # The window may open on carried audio (the last utterance's final words, the pause cut out):
        # window time t >= _lead is session time _win_start + t; before _lead it is the carry.
        self._lead_audio = np.zeros(0, np.float32)
        self._carry: tuple[np.ndarray, list[DecodedWord]] | None = None  # for the next utterance
        self._speech_end = -1e9  # pts where the last utterance's speech ended
        self.decode_count = 0
        self.decode_s = 0.0
        single_threaded_blas()

    # -- input ---------------------------------------------------------------------------------

    def feed(self, chunk: AudioChunk) -> list[ASREvent]:
        """Consume one chunk; decode at most once; return the events it produced."""
        samples = check_audio(chunk.samples)
        events: list[ASREvent] = []
        if not self._started:
            self._started = True
            self._pos = chunk.pts
            self._vad.reset(chunk.pts)
            self._buf.reset(chunk.pts)
        gap = chunk.pts - self._pos
        if gap > MAX_GAP_S:
            events += self._end_stream()
            self._pos = chunk.pts
            self._vad.reset(chunk.pts)
            self._buf.reset(chunk.pts)
            self._carry = None
        elif gap > 0.5 / SAMPLE_RATE:
            samples = np.concatenate([np.zeros(int(round(gap * SAMPLE_RATE)), np.float32), samples])
        elif gap < -0.5 / SAMPLE_RATE:
            samples = samples[min(int(round(-gap * SAMPLE_RATE)), samples.size) :]
        if samples.size == 0:
            return events
        events += self._on_audio(samples)
        if self._in_utt:
            if self._heard - self._decoded_until >= self.config.step_s - 1e-9 or self._heard >= self._guard_end:
                events += self._decode_step()
        else:
            self._buf.trim_before(self._buf.end - PRE_ROLL_S)
        return events

    def quiet_until(self) -> float:
        """The pts before which more audio can neither emit an event nor start a decode.

        Events come only from the VAD (an utterance's start emits none; its end needs
        ``MIN_SILENCE_S`` of silence) and from decodes (``step_s`` of heard speech after the last
        one, or a held word's guard end), and audio is heard no sooner than it is fed. A worker may
        therefore hold chunks that end before this and feed them later, one at a time, with the
        same results: it wakes for a stream about once a decode rather than once a 20 ms chunk.
        """
        if not self._started:
            return -float("inf")
        cfg, eps = self.config, 1e-9
        if not self._in_utt:  # the earliest start is the next VAD window's, padded back
            return self._heard - self._vad.config.speech_pad_s + cfg.step_s - eps
        silence = self._vad.silence_start
        vad_end = (self._heard if silence is None else silence) + self._vad.config.min_silence_s
        return min(self._decoded_until + cfg.step_s, self._guard_end, vad_end) - eps

    def flush(self) -> list[ASREvent]:
        """End of input: finalise the open utterance, if any."""
        events: list[ASREvent] = []
        for ev in self._vad.flush():
            events += self._on_vad(ev)
        return events

    def _on_audio(self, samples: np.ndarray) -> list[ASREvent]:
        """Hold the new audio; the VAD opens and closes utterances over it."""
        self._buf.append(samples)
        self._pos += samples.size / SAMPLE_RATE
        events: list[ASREvent] = []
        for ev in self._vad.feed(samples):
            events += self._on_vad(ev)
        return events

    @property
    def _heard(self) -> float:
        """Pts up to which audio has been classified (by the VAD)."""
        return self._vad.pts

    def _end_stream(self) -> list[ASREvent]:
        return self.flush()

    # -- utterances ------------------------------------------------------------------------------

    def _on_vad(self, ev: VADEvent) -> list[ASREvent]:
        if ev.kind == "start":
            if self._in_utt:
                return []
            self._in_utt = True
            self._utt += 1
            self._committed, self._hyp, self._prompt = [], [], ""
            self._lead_audio = np.zeros(0, np.float32)
            if self._carry is not None and ev.pts - self._speech_end <= CARRY_GAP_S:
                # Acoustic and textual context: the last words heard (forced as the prefix), then
                # the pre-roll; the rest of the pause is left out (it costs encoder time only).
                self._lead_audio, self._committed = self._carry
            self._carry = None
            self._win_start = max(ev.pts - PRE_ROLL_S, self._buf.start) - self._lead
            self._hyp_history.clear()
            self._n_final = 0
            self._refined = []
            self._utt_text = []
            self._decoded_until = ev.pts
            self._guard_end = float("inf")
            self._utt_start = ev.pts
            return []
        if not self._in_utt:
            return []
        end = ev.pts
        audio_end = min(end + TAIL_S, self._buf.end)
        events = self._finalise(audio_end, end)
        self._in_utt = False
        events.append(UtteranceEnd(end, self._utt, " ".join(self._utt_text)))
        self._speech_end = end
        self._carry = self._carry_out(audio_end)
        # Only up to the end of speech: a big chunk may already hold the next utterance.
        self._buf.trim_before(end)
        return events

    def _decode(self, audio_end: float, extra_silence_s: float = 0.0) -> list[DecodedWord]:
        """Decode the window up to ``audio_end`` (plus ``extra_silence_s`` of zeros); return the words
        after the committed ones."""
        audio = self._buf.slice(self._win_start + self._lead, audio_end)
        if self._lead_audio.size:
            audio = np.concatenate([self._lead_audio, audio])
        if extra_silence_s > 0:
            audio = np.concatenate([audio, np.zeros(int(extra_silence_s * SAMPLE_RATE), np.float32)])
        # Punctuation is left out of the forced prefix: a forced full stop invites end-of-text.
        prefix = [_bare(w.raw) for w in self._committed]
        t = time.perf_counter()
        draft = [w.raw for w in self._hyp]
        # An utterance opening on carried words: tiny.en, forced through them, tends to end the text
        # there although new speech follows; it may not, once that speech is long enough for a word.
        after = EXPECT_AFTER_S
        expect = (after is not None and self._lead > 0 and audio_end - self._utt_start >= after
                  and not self._live_finals)
        words = self.engine.transcribe(audio, prefix=prefix, prompt=self._prompt, draft=draft,
                                       expect_words=expect)
        words = self._after_prefix(words, audio)
        # Words that end before this utterance's speech began re-hear the carried context.
        onset = self._utt_start - self._win_start - 0.05
        while words and words[0].end <= onset:
            words = words[1:]
        self.decode_s += time.perf_counter() - t
        self.decode_count += 1
        self._decoded_until = audio_end
        return words

    def _after_prefix(self, words: list[DecodedWord], audio: np.ndarray) -> list[DecodedWord]:
        """The decoded words after the forced committed ones; when the prefix ended the text
        although speech went on, the rest of the window decoded unprefixed."""
        words = words[len(self._committed) :]
        done = self._committed[-1].end if self._committed else 0.0
        # Sooner with a carry: the new speech repeating the carried words stops the model.
        if not words and self._committed and audio.size / SAMPLE_RATE - done > (0.3 if self._lead else 0.6):
            # The prefix ended the text although speech went on: decode the rest unprefixed.
            cut = max(done - 0.1, 0.0)
            prompt = (self._prompt + "".join(w.raw for w in self._committed)).strip()
            rest = self.engine.transcribe(audio[int(cut * SAMPLE_RATE) :], prompt=prompt)
            words = [replace(w, start=w.start + cut, end=w.end + cut) for w in rest if w.start + cut >= done - 0.05]
            carried = {w.key for w in self._committed if w.start < self._lead}
            if len(words) >= 2 and all(w.key in carried for w in words[:2]):
                # The new speech repeats the carried words, and the forced carry made the
                # model stop: drop the carry for the rest of this utterance.
                shift = self._drop_lead()
                words = [replace(w, start=w.start - shift, end=w.end - shift) for w in words]
        return words

    def _decode_step(self) -> list[ASREvent]:
        cfg = self.config
        if self._heard - self._win_start > cfg.max_window_s:
            self._rebase()
        new = self._decode(self._heard)
        keys = [w.key for w in new]
        n_agree = len(new)
        for old in self._hyp_history:
            n = 0
            while n < min(len(old), len(keys)) and old[n] == keys[n]:
                n += 1
            n_agree = min(n_agree, n)
        if len(self._hyp_history) < max(AGREEMENT - 1, 1) and AGREEMENT > 1:
            n_agree = 0
        if AGREEMENT <= 1:
            n_agree = len(new)
        heard = self._heard - self._win_start
        if self._heard - self._utt_start < MIN_COMMIT_S:
            n_agree = 0
        while n_agree and new[n_agree - 1].end > heard - RIGHT_CONTEXT_S:
            n_agree -= 1
        self._guard_end = float("inf")
        # A word that repeats the one before it is held as an unsure one: tiny.en, given a window that
        # ends inside a long word, hears it twice, and the next decode (forced through the first
        # copy) agrees on the second; with more audio after it the model hears one word. A real
        # repetition ("bye bye") has the audio for both and is final once its guard ends.
        before = [self._committed[-1].key if self._committed else None, *keys]
        for i in range(n_agree):  # an unsure word needs more audio after it (misheard words are)
            unsure = new[i].probability < GUARD_PROB or (HOLD_REPEATS and new[i].key == before[i])
            if unsure and new[i].end > heard - cfg.guard_s:
                n_agree = i
                if cfg.guard_decode:  # (at least 50 ms on: a drifting word end cannot make every chunk decode)
                    self._guard_end = max(self._win_start + new[i].end + cfg.guard_s, self._heard + 0.05)
                break
        # Mid-utterance, a full stop seen on a partial window is not the end of a sentence.
        finals = [replace(w, raw=w.raw.rstrip(".?!") or w.raw) for w in new[:n_agree]]
        events, n_final = self._emit_finals(finals, new[n_agree : n_agree + REFINE_FOLLOW])
        # Agreed words the audio does not back (yet) stay interim, and so do the words after them.
        self._hyp = new[n_final:]
        self._hyp_history.append([w.key for w in self._hyp])
        base = self._win_start
        # Not the text the DTW found no audio for: shown, a whole sentence would flash on one frame.
        for i, w in enumerate(self._hyp[: audible_prefix(self._hyp)]):
            events.append(WordToken(w.text, base + w.start, base + w.end, False, w.probability,
                                    self._utt, self._n_final + i))
        return events

    def _finalise(self, audio_end: float, speech_end: float) -> list[ASREvent]:
        """Every pending word of the utterance the audio supports becomes final (one more decode if
        audio is new); the others are dropped.

        The model talking over silence is dropped: words that start after the VAD end of speech,
        trailing words below ``END_MIN_PROB``, and trailing words that repeat the ones before them.
        """
        if audio_end - self._decoded_until > 0.05 or not self._hyp:
            # tiny.en now and then ends the text at once for one particular context length (the
            # same words come back with a little more silence): retry once, then keep what was heard.
            pending = self._decode(audio_end) or self._decode(audio_end, extra_silence_s=0.3) or self._hyp
        else:
            pending = self._hyp
        pending = _heard_words(self._live_finals, pending, speech_end - self._win_start, END_MIN_PROB)
        self._hyp = []
        self._hyp_history.clear()
        return self._emit_finals(pending, [], at_end=True, speech_end=speech_end)[0]

    def _emit_finals(self, words: list[DecodedWord], following: list[DecodedWord], at_end: bool = False,
                     speech_end: float | None = None) -> tuple[list[ASREvent], int]:
        """Refine ``words`` (agreed, or the last ones at an endpoint) and make final those the audio
        supports (:mod:`alignment.support`): mid-utterance the words up to the first unsupported one
        (it stays interim, and may be backed by more audio), at an endpoint every supported word (the
        rest are dropped). ``following``: the interim words heard after them. Returns the events
        and how many of ``words`` were settled (made final or dropped). ``speech_end``: the VAD end
        of speech, at an endpoint."""
        if not words:
            return [], 0
        base = self._win_start
        toks = [
            WordToken(w.text, base + w.start, base + w.end, True, w.probability, self._utt, 0)
            for w in words
        ]
        if self.config.refine:
            toks, supported = self._refined_and_supported(toks, following, speech_end)
            n_settled = len(words) if at_end else next((i for i, ok in enumerate(supported) if not ok), len(words))
            keep = [i for i in range(n_settled) if supported[i]]
            self.unsupported += n_settled - len(keep) + (not at_end and n_settled < len(words))
        else:
            n_settled, keep = len(words), list(range(len(words)))
        toks = [replace(toks[i], index=self._n_final + k) for k, i in enumerate(keep)]
        if self.config.refine:
            self._refined = (self._refined + toks)[-max(REFINE_CONTEXT, 1) :]
        kept = [words[i] for i in keep]
        self._committed.extend(kept)
        self._n_final += len(kept)
        if self._lead > 0 and self._repeats_carry():
            self._drop_lead()
        self._utt_text.extend(w.text for w in kept)
        return list(toks), n_settled

    def _refined_and_supported(self, toks: list[WordToken], following: list[DecodedWord],
                               speech_end: float | None = None) -> tuple[list[WordToken], list[bool]]:
        """``toks`` refined by forced alignment, and whether the audio supports each.

        The utterance's last final words lead the alignment (a one- or two-word text matches any
        similar stretch of the audio); the next interim words follow (the look-ahead audio often
        holds the next word's start, which a text ending at the last final word would stretch that
        word over). Where that finds no path, the words are aligned alone once more: a wrong
        interim word after them must not cost them their evidence.
        """
        base = self._win_start
        context = [t for t in self._refined[-REFINE_CONTEXT:]
                   if t.start >= self._buf.start] if REFINE_CONTEXT else []
        follow = [WordToken(w.text, base + w.start, base + w.end, False, w.probability, self._utt, 0)
                  for w in following]
        audio = self._buf.slice(self._buf.start, self._buf.end)
        got = align_words(audio, self._buf.start, context + toks + follow, lookahead_s=LOOKAHEAD_S,
                          context=len(context), follow=len(follow))
        refined, placed = list(got.words[len(context) :]), list(got.placed[len(context) :])
        # No path for them all: the words alone, then ever shorter runs of their first words (a
        # made-up word after a real one must not cost the real one its evidence).
        for k in range(len(toks), max(len(toks) - _PREFIX_TRIES, 0), -1):
            if all(placed[:k]):
                break
            if k == len(toks) and not (context or follow):
                continue  # that alignment was the one above
            alone = align_words(audio, self._buf.start, toks[:k], lookahead_s=LOOKAHEAD_S)
            if sum(alone.placed) > sum(placed):
                refined = list(alone.words) + refined[k:]
                placed = list(alone.placed) + [False] * (len(toks) - k)
        refined = [replace(t, final=True) for t in end_by_next_start(context + refined)[len(context) :]]
        since = max(self._buf.start, refined[0].start - _FLOOR_AUDIO_S)
        previous = self._refined[-1] if self._refined else None
        verdict = judge(self._buf.slice(since, self._buf.end), since, refined, placed, before=self._utt_text,
                        previous_start=previous.start if previous else None,
                        previous_end=previous.end if previous else None,
                        speech_end=speech_end)
        prior = [t for t in self._refined if t.utterance == self._utt]
        supported, unheard = refuse_unheard_repeats(audio, self._buf.start, prior, refined, verdict.supported,
                                                    aligner().fit)
        self.repeats_unheard += unheard
        return refined, supported

    def _rebase(self) -> None:
        """Window too long: move its start to a final word boundary so a step costs O(1).

        Finals ending in the last ``CONTEXT_S`` stay in the window (acoustic context, forced as
        the prefix); earlier ones move into the text prompt and their audio is dropped.
        """
        words = self._committed
        if not words:
            return
        keep_from = words[-1].end - CONTEXT_S
        k = next((i for i, w in enumerate(words) if w.start >= keep_from), len(words))
        if k == 0:
            return  # every final is recent: nothing to move out yet
        shift = words[k - 1].end
        self._prompt = (self._prompt + "".join(w.raw for w in words[:k])).strip()[-400:]
        self._committed = [replace(w, start=w.start - shift, end=w.end - shift) for w in words[k:]]
        self._hyp = [replace(w, start=w.start - shift, end=w.end - shift) for w in self._hyp]
        self._lead_audio = self._lead_audio[min(int(round(shift * SAMPLE_RATE)), self._lead_audio.size) :]
        self._win_start += shift
        self._buf.trim_before(self._win_start + self._lead)

    @property
    def _live_finals(self) -> list[DecodedWord]:
        """This utterance's final words, without the carried ones that open its window."""
        return [w for w in self._committed if w.start >= self._lead]

    @property
    def _lead(self) -> float:
        """Seconds of carried audio at the start of the window."""
        return self._lead_audio.size / SAMPLE_RATE

    def _drop_lead(self) -> float:
        """Open the window at the pre-roll again, without the carried words and their audio.

        tiny.en ends the text right after a forced carried prefix when the new speech repeats
        it (a looped test sentence, a user saying the same thing twice); each decode would then
        need the unprefixed fallback, so the carry goes for the rest of the utterance as soon as
        two final words repeat two carried ones, or a fallback starts with carried words (dropped on
        every fallback instead, it cost WER on ordinary speech). Returns the shift of window times.
        """
        shift = self._lead
        self._committed = [replace(w, start=w.start - shift, end=w.end - shift)
                           for w in self._committed if w.start >= shift]
        self._hyp = [replace(w, start=w.start - shift, end=w.end - shift) for w in self._hyp]
        self._win_start += shift
        self._lead_audio = np.zeros(0, np.float32)
        return shift

    def _repeats_carry(self) -> bool:
        """The last two final words of this utterance are two consecutive carried words."""
        carried = [w.key for w in self._committed if w.start < self._lead]
        live = [w.key for w in self._live_finals][-2:]
        return len(live) == 2 and any(carried[i : i + 2] == live for i in range(len(carried) - 1))

    def _carry_out(self, audio_end: float) -> tuple[np.ndarray, list[DecodedWord]] | None:
        """The last ``carry_s`` of this utterance's final words, their audio (to 0.1 s past the last
        one) and their times relative to it: the next utterance's window opens on them."""
        words = self._live_finals
        if self.config.carry_s <= 0 or not words:
            return None
        last = words[-1].end
        words = [w for w in words if w.start >= last - self.config.carry_s] or words[-1:]
        a, b = words[0].start, min(last + 0.1, audio_end - self._win_start)
        audio = self._buf.slice(self._win_start + a, self._win_start + b)
        if audio.size == 0:
            return None
        return audio, [replace(w, start=w.start - a, end=min(w.end - a, b - a)) for w in words]


_PREFIX_TRIES = 6  # shorter runs aligned at most, when a run of new finals finds no path
_FLOOR_AUDIO_S = 3.0  # audio before a word that its support check reads the noise floor from


def _heard_words(final: list[DecodedWord], pending: list[DecodedWord], speech_end: float,
                 min_prob: float) -> list[DecodedWord]:
    """``pending`` (an utterance's last words, decoded at its endpoint, after its ``final`` words)
    without what the model said over the silence after the speech.

    Dropped: words that start at or after ``speech_end``; trailing words below ``min_prob``; and a
    trailing run of 2+ words that repeats the words just before it with no speech left to say it
    in (under 0.1 s a word between the first copy's end and ``speech_end``). tiny.en, forced
    through the final words and then hearing silence, sometimes says them again (``... Sundays and
    holidays`` + ``and holidays.``) or adds a word at p < 0.2; a speaker who repeats a phrase has
    the audio for it. What these rules dropped when they were chosen: docs/asr-measurements.md.
    """
    kept = [w for w in pending if w.start < speech_end]
    while kept and kept[-1].probability < min_prob:
        kept.pop()
    words = final + kept
    keys = [w.key for w in words]
    for n in range(len(kept), 1, -1):
        if keys[-n:] == keys[-2 * n : -n] and speech_end - words[-n - 1].end < 0.1 * n:
            return kept[:-n]
    return kept


def _bare(raw: str) -> str:
    """A raw Whisper word without punctuation, keeping its leading space, case and apostrophes."""
    core = without_punctuation(raw)
    return " " + core if core else raw
