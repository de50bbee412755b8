"""Whisper speech recognition: offline word transcription, per-session streaming, a shared worker.

* :func:`transcribe_words` — offline: Silero VAD cuts utterances, each is decoded with an audio
  context of its own length + 0.5 s (not 30 s of padding), word times come from cross-attention
  DTW and are then refined by :func:`alignment.timing.refine_word_times`.
* :class:`StreamingASR` — one session: VAD gates compute and endpoints utterances; the current
  utterance window is re-decoded every ``step_s`` of new speech with the committed words forced
  as a decoder prefix (not re-decoded) and the last hypothesis verified as a draft in one batched
  pass; a window opens on the previous utterance's last words (audio and forced text) when the
  pause was short; LocalAgreement-2 (a word seen at the same position in two consecutive
  hypotheses) turns interims into finals, with a probability guard (an unsure word waits for
  more audio after it, and is decoded again the moment that wait ends); at an endpoint every
  pending word is finalised at once and an :class:`UtteranceEnd` carries the VAD end of speech.
* :class:`ASRWorker` — many sessions: bounded per-session audio queues (a full queue drops the
  oldest audio and counts it), earliest-deadline-first scheduling on ``lanes`` worker threads (a model copy
  each), an async event stream per session.

Greedy decoding projects onto the vocabulary with an int8 copy of the embedding and re-scores
the best candidates in fp32. Streaming runs int8 copies of the encoder and the decoder blocks (it
re-decodes its window every step); offline keeps the fp32 model.

Engines sit behind :class:`Engine`: ``"whisper"`` (openai-whisper, variable audio context,
default) and ``"faster-whisper"`` (CTranslate2 on the bundled directory, 30-s padded).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import torch

from alignment.timing import end_by_next_start, refine_word_times
from alignment.types import SAMPLE_RATE, AudioChunk, WordToken
from models.int8 import int8_copy, int8_projection
from models.vad import StreamingVAD, VADConfig, VADEvent, speech_segments
from models.whisper_decoder import DecoderPass
from models.whisper_loader import load_whisper, mel_for, model_lock

log = logging.getLogger(__name__)

CONTEXT_PAD_S = 0.5  # audio context = length of audio present + this (DESIGN: best WER)
MAX_WINDOW_S = 20.0  # a streaming window is re-based once it grows past this
_PUNCT = re.compile(r"[^\w']+")


# --- records -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class UtteranceEnd:
    """The user stopped speaking at ``pts`` (VAD end of speech); ``text`` is the final utterance."""

    pts: float
    utterance: int
    text: str


ASREvent = WordToken | UtteranceEnd


@dataclass(frozen=True)
class DecodedWord:
    """A word from one decode, times relative to the decoded audio's first sample.

    ``raw`` keeps Whisper's leading space and punctuation so it can be re-tokenised exactly.
    """

    raw: str
    start: float
    end: float
    probability: float

    @property
    def text(self) -> str:
        return self.raw.strip()

    @property
    def key(self) -> str:
        """Comparison form: lower case, punctuation removed."""
        return normalize_word(self.raw)


def normalize_word(word: str) -> str:
    """Lower case without punctuation (for agreement and WER)."""
    return _PUNCT.sub("", word.lower())


# --- engines -------------------------------------------------------------------------------------


class Engine(Protocol):
    """One Whisper backend: decode a short window of 16 kHz audio into timed words."""

    name: str
    forces_prefix: bool  # True: the returned words start with ``prefix`` exactly

    def transcribe(
        self, audio: np.ndarray, prefix: Sequence[str] = (), prompt: str = "", draft: Sequence[str] = (),
        expect_words: bool = False,
    ) -> list[DecodedWord]:
        """Words of ``audio`` (times relative to its start); ``prefix`` = raw committed words.

        ``draft`` (raw words expected after the prefix, e.g. the last hypothesis) is a speed hint
        only: the result must not depend on it. ``expect_words``: the audio holds speech after
        the prefix, so the text may not end before a new word (an engine may ignore it).
        """
        ...


class WhisperEngine:
    """openai-whisper greedy decoding over the audio present (+0.5 s), DTW word times.

    Decoding is a small greedy loop over :class:`models.whisper_decoder.DecoderPass` (plain tensor
    ops, a preallocated key/value cache) rather than ``whisper.decode`` so the per-call set-up
    (~0.2 s of tokenizer work) is paid once, a one-token step costs no module or hook overhead,
    the committed prefix is fed in one forward pass, only the positions that are sampled are
    projected onto the vocabulary, and the word DTW reuses the cross-attention of the decode
    itself (no second decoder pass).
    """

    name = "whisper"
    forces_prefix = True

    def __init__(
        self, model=None, context_pad_s: float = CONTEXT_PAD_S, threads: int = 1,  # noqa: ANN001
        int8: bool = False,
    ) -> None:
        import whisper.timing  # noqa: F401 - imports numba, which resets this thread's torch threads
        import whisper.tokenizer

        # torch's intra-op thread count is per calling thread (OpenMP), so this binds only the
        # threads that decode. One thread: on 2 shared cores under load, 2 threads measured ~10x
        # slower per decode (barrier waits), and the worker serialises decodes anyway.
        self.threads = threads

        self.model = model if model is not None else load_whisper()
        self.lock = model_lock(self.model)
        # Streaming re-decodes its window every step: int8 Linear layers halve the encoder's cost
        # and a one-token decoder step's (3.7 -> 1.7 ms); WER moved within its noise on 1,480
        # held-out words (bench/asr_stream.py --held-out). Offline keeps the exact fp32 model.
        self.int8 = int8
        self.encoder = (int8_copy(self.model.encoder) if int8 else None) or self.model.encoder
        # Only the blocks: a copy of the whole decoder would duplicate the 80 MB token embedding.
        self.decoder_blocks = ((int8_copy(self.model.decoder.blocks, rowwise=True) if int8 else None)
                               or self.model.decoder.blocks)
        self.context_pad_s = context_pad_s
        dims = self.model.dims
        self.tokenizer = whisper.tokenizer.get_tokenizer(
            self.model.is_multilingual, num_languages=self.model.num_languages, language="en",
            task="transcribe",
        )
        tok = self.tokenizer
        self._sot_seq = list(tok.sot_sequence_including_notimestamps)
        suppress = set(tok.non_speech_tokens)
        mask = torch.zeros(dims.n_vocab, dtype=torch.bool)
        mask[list(suppress)] = True
        mask[tok.eot + 1 :] = True  # every special and timestamp token; eot stays allowed
        self._suppress = mask
        self._blank = [*tok.encode(" "), tok.eot]
        self.n_text_ctx = dims.n_text_ctx
        self._proj_q = int8_projection(self.model.decoder.token_embedding.weight)
        self._spellings: dict[int, str] = {}

    # The model is shared: every forward pass below runs under ``self.lock``.
    def transcribe(
        self, audio: np.ndarray, prefix: Sequence[str] = (), prompt: str = "", draft: Sequence[str] = (),
        expect_words: bool = False,
    ) -> list[DecodedWord]:
        audio = np.asarray(audio, np.float32).reshape(-1)
        if audio.size < SAMPLE_RATE // 10:
            return []
        dur = audio.size / SAMPLE_RATE
        expect_words = expect_words and bool(prefix)
        num_frames = audio.size // 160
        prefix_tokens = self.tokenizer.encode("".join(prefix)) if prefix else []
        draft_tokens = self.tokenizer.encode("".join(draft)) if draft else []
        prev_threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            mel = mel_for(audio, dur + self.context_pad_s, self.model.dims.n_mels)
            num_frames = min(num_frames, mel.shape[-1])
            with self.lock, torch.inference_mode():
                feats = self.encoder(mel.unsqueeze(0))
                text, probs, layers, first_row, no_speech, avg_lp = self._decode_tokens(
                    feats, prefix_tokens, prompt, dur, draft_tokens, expect_words
                )
                if not prefix_tokens and no_speech > 0.6 and avg_lp < -1.0:
                    return []  # Whisper's own no-speech rule
                words = self._align(layers, first_row, text, probs, num_frames)
        finally:
            torch.set_num_threads(prev_threads)
        # Words aligned to the very end of the audio are continuations the model made up; not the
        # one a caller expects there (the DTW puts a new word after a long forced prefix at the end).
        n_keep = len(words)
        while n_keep > len(prefix) + expect_words and words[n_keep - 1].start >= dur - 0.06:
            n_keep -= 1
        return words[:n_keep]

    def _approx_logits(self, row: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits of one hidden state from an int8 copy of the embedding (~10x cheaper).

        The fp32 projection reads 80 MB of weights per sampled token; :meth:`_pick` re-scores
        the best candidates exactly, so greedy choices do not depend on the int8 error. Rows are
        projected one at a time, only when the greedy loop reaches them.
        """
        if self._proj_q is None:
            return row @ self.model.decoder.token_embedding.weight.T
        return self._proj_q(row[None])[0]

    def _pick(self, hrow: torch.Tensor, approx: torch.Tensor, blank: bool, no_eot: bool = False,
              ) -> tuple[int, float, float]:
        """Greedy token, its log-probability (exact logits for the top candidates) and the
        probability of its spelling: the candidates that read the same without case, space
        and punctuation (" The" / " the" / "The") summed. tiny.en splits its belief over such
        variants at a sentence start, which made a correct first word look unsure."""
        step = approx.float().masked_fill_(self._suppress, -np.inf)  # approx is this step's own
        if blank:
            step[self._blank] = -np.inf
        if no_eot:
            step[self.tokenizer.eot] = -np.inf
        top = step.topk(_RESCORE).indices
        exact = self.model.decoder.token_embedding.weight[top] @ hrow
        step[top] = exact.float()
        lse = torch.logsumexp(step, -1)
        best_i = int(exact.argmax())
        best = int(top[best_i])
        lp = float(step[best] - lse)
        spelled = self._spelling(best)
        p_top = torch.exp(step[top] - lse).tolist()
        p_same = sum(p for c, p in zip(top.tolist(), p_top, strict=True) if spelled and self._spelling(c) == spelled)
        return best, lp, max(p_same, float(np.exp(lp)))

    def _starts_word(self, token: int) -> bool:
        """The token opens a new word (a leading space and a letter or digit), not punctuation."""
        return bool(self._spelling(token)) and self.tokenizer.decode([token]).startswith(" ")

    def _spelling(self, token: int) -> str:
        key = self._spellings.get(token)
        if key is None:
            key = self._spellings[token] = normalize_word(self.tokenizer.decode([token]))
        return key

    def _decode_tokens(
        self, feats: torch.Tensor, prefix_tokens: list[int], prompt: str, dur: float,
        draft_tokens: Sequence[int] = (), expect_words: bool = False,
    ) -> tuple[list[int], list[float], list[torch.Tensor], int, float, float]:
        """Greedy decoding with a key/value cache, capturing cross-attention for the word DTW.

        ``draft_tokens`` (the previous hypothesis) are fed with the prefix in one forward pass and
        verified greedily from the logits of that pass: accepted tokens cost no sequential step,
        and at the first mismatch the cache is cut back and greedy decoding goes on from there.
        The result is the plain greedy decode; only the number of weight reads changes.

        Returns text tokens (prefix + new), their probabilities (1.0 for the forced prefix), the
        per-layer cross-attention logits of every fed position, the row of ``<|notimestamps|>``,
        the no-speech probability and the mean log-probability of the new tokens.
        """
        tok = self.tokenizer
        initial: list[int] = []
        if prompt.strip():
            initial = [tok.sot_prev, *tok.encode(" " + prompt.strip())[-(self.n_text_ctx // 2 - 1) :]]
        sot_index = len(initial)
        initial += self._sot_seq
        tokens = initial + prefix_tokens
        budget = min(int(dur * 8) + 8, self.n_text_ctx // 2, self.n_text_ctx - len(tokens) - 1)
        draft = list(draft_tokens)[: max(budget, 0)]
        emb = self.model.decoder.token_embedding.weight
        state = DecoderPass(self.model.decoder, feats, max_len=len(tokens) + max(budget, 0) + 1,
                            blocks=self.decoder_blocks)
        out: list[int] = []
        probs: list[float] = []
        sum_lp = 0.0
        n0 = len(tokens)
        no_speech = 0.0
        h = state.feed(tokens + draft)
        rows = h[n0 - 1 :]  # hidden states that predict draft[0], ..., draft[-1], the next
        if not prefix_tokens:  # no-speech is only judged without a prefix
            no_speech = float((h[sot_index] @ emb.T).float().softmax(-1)[tok.no_speech])
        hrow = rows[0]
        step = self._approx_logits(hrow)
        in_draft = True
        word_started = not expect_words
        for i in range(max(budget, 0)):
            hold = not word_started and i < 3  # expected speech: the text may not end yet
            nxt, lp, p_spelled = self._pick(hrow, step, blank=i == 0 and not prefix_tokens, no_eot=hold)
            if nxt == tok.eot:
                break
            word_started = word_started or self._starts_word(nxt)
            sum_lp += lp
            out.append(nxt)
            probs.append(p_spelled)
            keep = _loop_cut(prefix_tokens + out) - len(prefix_tokens)  # repeats of the prefix too
            if keep < len(out):
                del out[max(keep, 0) :], probs[max(keep, 0) :]
                break
            if in_draft and i < len(draft) and nxt == draft[i]:
                hrow = rows[i + 1]  # computed in the batched pass; projected only when reached
                step = self._approx_logits(hrow)
                continue
            if in_draft:  # leave the draft: forget what was fed past the accepted tokens
                in_draft = False
                state.truncate(n0 + i)
            hrow = state.feed([nxt])[-1]
            step = self._approx_logits(hrow)
        layers = state.cross_attention()  # each (heads, fed positions, frames)
        text = prefix_tokens + out
        token_probs = [1.0] * len(prefix_tokens) + probs
        return text, token_probs, layers, len(initial) - 1, no_speech, sum_lp / max(len(out), 1)

    def _align(
        self, layers: list[torch.Tensor], first_row: int, text_tokens: list[int], token_probs: list[float],
        num_frames: int,
    ) -> list[DecodedWord]:
        """Cross-attention DTW as in whisper.timing.find_alignment, on the decode's own attention."""
        from whisper.timing import TOKENS_PER_SECOND, WordTiming, dtw, median_filter, merge_punctuations

        tok = self.tokenizer
        if not text_tokens:
            return []
        rows = slice(first_row, first_row + len(text_tokens) + 1)  # <|notimestamps|> + text tokens
        heads = self.model.alignment_heads.indices().T
        weights = torch.stack([layers[int(layer)][int(head), rows] for layer, head in heads])
        if weights.shape[1] < len(text_tokens) + 1:
            return []
        weights = weights[:, :, : max(num_frames // 2, 1)].float().softmax(-1)
        std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
        weights = median_filter((weights - mean) / (std + 1e-9), 7)
        text_idx, time_idx = dtw(-weights.mean(0).double())
        words, word_tokens = tok.split_to_word_tokens(text_tokens + [tok.eot])
        if len(word_tokens) <= 1:
            return []
        bounds = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
        jumps = np.pad(np.diff(text_idx), (1, 0), constant_values=1).astype(bool)
        jump_times = time_idx[jumps] / TOKENS_PER_SECOND
        timings = [
            WordTiming(w, t, float(jump_times[b0]), float(jump_times[b1]), float(np.mean(token_probs[b0:b1])))
            for w, t, b0, b1 in zip(words[:-1], word_tokens[:-1], bounds[:-1], bounds[1:], strict=True)
        ]
        merge_punctuations(timings, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
        return [
            DecodedWord(t.word, t.start, max(t.end, t.start), t.probability)
            for t in timings
            if t.word and normalize_word(t.word)
        ]


_RESCORE = 8  # candidates re-scored in fp32 after the int8 vocabulary projection


def _loop_cut(tokens: list[int]) -> int:
    """Length to keep when greedy decoding has started to loop, else ``len(tokens)``.

    A span of 4+ tokens repeated back to back, or a 1-3 token span repeated four times, is a loop
    (tiny.en does this on short contexts); the repeats are cut, the first occurrence kept.
    """
    n = len(tokens)
    for k in range(1, n // 2 + 1):
        reps = 2 if k >= 4 else 4
        if n >= k * reps and all(tokens[n - k * (r + 1) : n - k * r] == tokens[n - k :] for r in range(reps)):
            return n - k * (reps - 1)
    return n


class FasterWhisperEngine:
    """faster-whisper (CTranslate2, int8) on the bundled tiny.en directory; pads every call to 30 s."""

    name = "faster-whisper"
    forces_prefix = False

    def __init__(self, model_dir: str | None = None, compute_type: str = "int8", cpu_threads: int = 1) -> None:
        from faster_whisper import WhisperModel

        from models.whisper_loader import bundled_model_dir

        path = model_dir or bundled_model_dir()
        if path is None:
            raise RuntimeError("faster-whisper engine needs a CTranslate2 model directory")
        self.model = WhisperModel(str(path), device="cpu", compute_type=compute_type, cpu_threads=cpu_threads)
        self.lock = threading.Lock()

    def transcribe(
        self, audio: np.ndarray, prefix: Sequence[str] = (), prompt: str = "", draft: Sequence[str] = (),
        expect_words: bool = False,  # no prefix forcing here, so nothing to hold
    ) -> list[DecodedWord]:
        audio = np.asarray(audio, np.float32).reshape(-1)
        if audio.size < SAMPLE_RATE // 10:
            return []
        with self.lock:
            segments, _info = self.model.transcribe(
                audio, language="en", beam_size=1, best_of=1, temperature=0.0, word_timestamps=True,
                condition_on_previous_text=False, initial_prompt=prompt or None, vad_filter=False,
            )
            return [
                DecodedWord(w.word, float(w.start), float(w.end), float(w.probability))
                for seg in segments
                for w in (seg.words or [])
                if normalize_word(w.word)
            ]


_ENGINES: dict[tuple[str, int, bool], Engine] = {}
_ENGINES_LOCK = threading.Lock()


def get_engine(engine: str | Engine = "whisper", model=None, int8: bool = False) -> Engine:  # noqa: ANN001
    """An engine by name (``"whisper"`` | ``"faster-whisper"``), one instance per process, model
    and precision (``int8`` applies to ``"whisper"``; faster-whisper is int8 anyway)."""
    if not isinstance(engine, str):
        return engine
    if engine not in ("whisper", "faster-whisper"):
        raise ValueError(f"unknown ASR engine {engine!r}; choose 'whisper' or 'faster-whisper'")
    int8 = int8 and engine == "whisper"
    key = (engine, id(model) if model is not None else 0, int8)
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = (WhisperEngine(model, int8=int8) if engine == "whisper"
                             else FasterWhisperEngine())
        return _ENGINES[key]


# --- offline -------------------------------------------------------------------------------------


def _check_audio(audio: np.ndarray) -> np.ndarray:
    arr = np.asarray(audio)
    if arr.ndim != 1:
        raise ValueError(f"audio must be 1-D mono 16 kHz samples, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"audio must be float samples in [-1, 1], got dtype {arr.dtype}")
    arr = arr.astype(np.float32, copy=False)
    if arr.size and not np.all(np.isfinite(arr)):
        raise ValueError("audio contains NaN or infinite samples")
    return arr


def transcribe_words(
    audio: np.ndarray,
    t0: float = 0.0,
    model=None,  # noqa: ANN001 - an openai-whisper model; default: load_whisper()
    refine: bool = True,
    engine: str | Engine = "whisper",
    pad_s: float = 0.2,
) -> list[WordToken]:
    """All words in ``audio`` (t0 = pts of ``audio[0]``), final, on the session clock.

    Each VAD utterance (padded by ``pad_s``, split at 25 s) is decoded on its own with a variable
    audio context; word times come from cross-attention DTW, then the timing refinement.
    """
    audio = _check_audio(audio)
    if audio.size < SAMPLE_RATE // 10:
        return []
    eng = get_engine(engine, model)
    segs = speech_segments(audio, VADConfig(min_silence_s=0.3))
    pieces: list[tuple[int, int]] = []
    for s, e in segs:
        a = max(int((s - pad_s) * SAMPLE_RATE), 0)
        b = min(int((e + pad_s) * SAMPLE_RATE), audio.size)
        while b - a > 25 * SAMPLE_RATE:
            pieces.append((a, a + 25 * SAMPLE_RATE))
            a += 25 * SAMPLE_RATE
        if b > a:
            pieces.append((a, b))
    words: list[WordToken] = []
    for utt, (a, b) in enumerate(pieces):
        for i, w in enumerate(eng.transcribe(audio[a:b])):
            base = t0 + a / SAMPLE_RATE
            words.append(WordToken(w.text, base + w.start, base + w.end, True, w.probability, utt, i))
    if refine and words:
        words = end_by_next_start(refine_word_times(audio, t0, words))
    return words


# --- streaming -----------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class StreamingConfig:
    """Streaming knobs (defaults chosen on espeak speech with tiny.en; see bench/asr_stream.py).

    Final-word latency is roughly ``right_context_s`` + up to two ``step_s`` + one decode for
    words inside an utterance, and ``min_silence_s`` + one decode for its last word. Words the
    model is unsure of (``guard_prob``; tiny.en's misheard words mostly are) wait for
    ``guard_s`` of audio after them, and a decode is scheduled for the moment that wait ends
    (``guard_decode``) rather than the next step after it (up to ``step_s`` later).
    An utterance that follows within ``carry_gap_s`` starts its window on the last ``carry_s``
    of the previous one's final words (their audio before the pre-roll, the pause cut out; their
    text forced as the prefix): the context offline decoding has. Without it tiny.en garbled
    utterance starts (streaming WER 18.5 / 24.2 % vs 16.2 / 16.1 % offline on two 8-session
    sets; with it 15.9 / 15.2 %), and that is what lets ``step_s`` be 0.15 s, ``min_commit_s``
    0.3 s and ``guard_prob`` 0.5. Forced through the carried words, tiny.en tends to end the text
    for the first decodes of the new speech, so once ``expect_after_s`` of it is heard the decode
    may not end before a new word: the first word agrees a step sooner (bench/asr_stream.py
    --held-out, two voice sets: floor p95 -14 / -39 ms, WER gap -0.1 / -0.4 points).
    """

    step_s: float = 0.15  # re-decode after this much new speech audio
    min_silence_s: float = 0.25  # VAD silence that ends an utterance
    vad_threshold: float = 0.5
    pre_roll_s: float = 0.25  # audio kept before the VAD start
    tail_s: float = 0.15  # audio kept after the VAD end when finalising
    lookahead_s: float = 0.1  # refinement may look this far past a word's estimated end (bounded)
    refine_context: int = 2  # final words of the utterance that lead the refinement's reference
    agreement: int = 2  # LocalAgreement-n
    min_commit_s: float = 0.3  # no finals before the utterance has this much audio (junk guard)
    right_context_s: float = 0.05  # a word becomes final only with this much audio after it
    guard_prob: float = 0.5  # an agreed word below this probability ...
    guard_s: float = 0.5  # ... becomes final only with this much audio after it
    guard_decode: bool = True  # decode when a held word's guard ends, not on the next step after it
    expect_after_s: float | None = 0.15  # a carried window with this much new speech must go on (None: off)
    end_min_prob: float = 0.2  # at an endpoint, trailing words below this are the model hearing silence
    stable_s: float | None = None  # also final without agreement: this much audio after it and ...
    stable_prob: float = 0.9  # ... at least this probability (time-based commit)
    max_window_s: float = MAX_WINDOW_S  # past this, re-base the window at a final word boundary
    context_s: float = 0.0  # audio of final words kept in a re-based window (acoustic context)
    carry_s: float = 2.0  # the next utterance's window starts with this much of the last one's words ...
    carry_gap_s: float = 2.0  # ... when the pause between them is at most this long
    max_gap_s: float = 1.0  # a pts gap up to this is filled with silence; longer restarts the stream
    int8: bool = True  # int8 copies of the encoder and decoder blocks (WhisperEngine; models.int8)
    refine: bool = True
    vad_gate: bool = True  # False: decode every step regardless of speech, no endpoints (baselines)

    def __post_init__(self) -> None:
        if (self.step_s <= 0 or self.agreement < 1 or self.max_window_s < 2 or self.context_s < 0
                or self.refine_context < 0):
            raise ValueError(f"invalid streaming config {self}")


class StreamingASR:
    """Per-session streaming recogniser. Not thread-safe; one caller at a time (the worker).

    ``feed(chunk)`` and ``flush()`` return :data:`ASREvent` lists in emission order: interim
    WordTokens (``final=False``; a later token with the same ``utterance`` and ``index`` replaces
    it; interims past the last index of a later hypothesis are stale), final WordTokens (never
    change), and :class:`UtteranceEnd` after each utterance's finals.
    """

    def __init__(
        self,
        engine: str | Engine = "whisper",
        config: StreamingConfig | None = None,
        model=None,  # noqa: ANN001
    ) -> None:
        self.config = config or StreamingConfig()
        self.engine = get_engine(engine, model, int8=self.config.int8)
        cfg = self.config
        self._vad = StreamingVAD(VADConfig(threshold=cfg.vad_threshold, min_silence_s=cfg.min_silence_s))
        self._buf = _AudioBuffer(max(cfg.max_window_s, MAX_WINDOW_S) + cfg.pre_roll_s + cfg.min_silence_s + 3.0)
        self._started = False
        self._pos = 0.0  # pts of the next expected sample
        self._utt = -1
        self._in_utt = False
        self._win_start = 0.0
        self._committed: list[DecodedWord] = []  # finals in the current window (window-relative)
        self._n_final = 0  # finals emitted in the current utterance
        self._refined: list[WordToken] = []  # this utterance's last final tokens (refinement context)
        self._prompt = ""  # finals of this utterance before the current window
        self._hyp: list[DecodedWord] = []  # last hypothesis after the committed words
        self._hyp_history: deque[list[str]] = deque(maxlen=max(self.config.agreement - 1, 1))
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

    # -- input ---------------------------------------------------------------------------------

    def feed(self, chunk: AudioChunk) -> list[ASREvent]:
        """Consume one chunk; decode at most once; return the events it produced."""
        samples = _check_audio(chunk.samples)
        events: list[ASREvent] = []
        if not self._started:
            self._started = True
            self._pos = chunk.pts
            self._vad.reset(chunk.pts)
            self._buf.reset(chunk.pts)
        gap = chunk.pts - self._pos
        if gap > self.config.max_gap_s:
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
        if not self.config.vad_gate and not self._in_utt:
            events += self._on_vad(VADEvent("start", self._pos))
        self._buf.append(samples)
        self._pos += samples.size / SAMPLE_RATE
        if self.config.vad_gate:
            for ev in self._vad.feed(samples):
                events += self._on_vad(ev)
        if self._in_utt:
            if self._heard - self._decoded_until >= self.config.step_s - 1e-9 or self._heard >= self._guard_end:
                events += self._decode_step()
        else:
            self._buf.trim_before(self._buf.end - self.config.pre_roll_s)
        return events

    def flush(self) -> list[ASREvent]:
        """End of input: finalise the open utterance, if any."""
        events: list[ASREvent] = []
        if not self.config.vad_gate:
            return self._on_vad(VADEvent("end", self._pos)) if self._in_utt else []
        for ev in self._vad.flush():
            events += self._on_vad(ev)
        return events

    @property
    def _heard(self) -> float:
        """Pts up to which audio has been classified (VAD) or, ungated, received."""
        return self._vad.pts if self.config.vad_gate else self._pos

    def _end_stream(self) -> list[ASREvent]:
        return self.flush()

    # -- utterances ------------------------------------------------------------------------------

    def _on_vad(self, ev: VADEvent) -> list[ASREvent]:
        cfg = self.config
        if ev.kind == "start":
            if self._in_utt:
                return []
            self._in_utt = True
            self._utt += 1
            self._committed, self._hyp, self._prompt = [], [], ""
            self._lead_audio = np.zeros(0, np.float32)
            if self._carry is not None and ev.pts - self._speech_end <= cfg.carry_gap_s:
                # Acoustic and textual context: the last words heard (forced as the prefix), then
                # the pre-roll; the rest of the pause is left out (it costs encoder time only).
                self._lead_audio, self._committed = self._carry
            self._carry = None
            self._win_start = max(ev.pts - cfg.pre_roll_s, self._buf.start) - self._lead
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
        audio_end = min(end + cfg.tail_s, self._buf.end)
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
        after = self.config.expect_after_s
        expect = (after is not None and self._lead > 0 and audio_end - self._utt_start >= after
                  and not self._live_finals)
        words = self.engine.transcribe(audio, prefix=prefix, prompt=self._prompt, draft=draft,
                                       expect_words=expect)
        if not self.engine.forces_prefix:
            words = _after_committed(words, self._committed)
        else:
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
        # Words that end before this utterance's speech began re-hear the carried context.
        onset = self._utt_start - self._win_start - 0.05
        while words and words[0].end <= onset:
            words = words[1:]
        self.decode_s += time.perf_counter() - t
        self.decode_count += 1
        self._decoded_until = audio_end
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
        if len(self._hyp_history) < max(cfg.agreement - 1, 1) and cfg.agreement > 1:
            n_agree = 0
        if cfg.agreement <= 1:
            n_agree = len(new)
        heard = self._heard - self._win_start
        if self._heard - self._utt_start < cfg.min_commit_s:
            n_agree = 0
        while n_agree and new[n_agree - 1].end > heard - cfg.right_context_s:
            n_agree -= 1
        self._guard_end = float("inf")
        for i in range(n_agree):  # an unsure word needs more audio after it (misheard words are)
            if new[i].probability < cfg.guard_prob and new[i].end > heard - cfg.guard_s:
                n_agree = i
                if cfg.guard_decode:  # (at least 50 ms on: a drifting word end cannot make every chunk decode)
                    self._guard_end = max(self._win_start + new[i].end + cfg.guard_s, self._heard + 0.05)
                break
        if cfg.stable_s is not None and self._heard - self._utt_start >= cfg.min_commit_s:
            # Time-based commit: a confident word with this much audio after it rarely changes.
            while (n_agree < len(new) and new[n_agree].end <= heard - cfg.stable_s
                   and new[n_agree].probability >= cfg.stable_prob):
                n_agree += 1
        # Mid-utterance, a full stop seen on a partial window is not the end of a sentence.
        finals = [replace(w, raw=w.raw.rstrip(".?!") or w.raw) for w in new[:n_agree]]
        self._hyp = new[n_agree:]
        self._hyp_history.append([w.key for w in self._hyp])
        events = self._emit_finals(finals)
        base = self._win_start
        for i, w in enumerate(self._hyp):
            events.append(WordToken(w.text, base + w.start, base + w.end, False, w.probability,
                                    self._utt, self._n_final + i))
        return events

    def _finalise(self, audio_end: float, speech_end: float) -> list[ASREvent]:
        """Every pending word of the utterance becomes final (one more decode if audio is new).

        The model talking over silence is dropped: words that start after the VAD end of speech,
        trailing words below ``end_min_prob``, and trailing words that repeat the ones before them.
        """
        if audio_end - self._decoded_until > 0.05 or not self._hyp:
            # tiny.en now and then ends the text at once for one particular context length (the
            # same words come back with a little more silence): retry once, then keep what was heard.
            pending = self._decode(audio_end) or self._decode(audio_end, extra_silence_s=0.3) or self._hyp
        else:
            pending = self._hyp
        pending = _heard_words(self._live_finals, pending, speech_end - self._win_start, self.config.end_min_prob)
        self._hyp = []
        self._hyp_history.clear()
        return self._emit_finals(pending)

    def _emit_finals(self, words: list[DecodedWord]) -> list[ASREvent]:
        if not words:
            return []
        base = self._win_start
        toks = [
            WordToken(w.text, base + w.start, base + w.end, True, w.probability, self._utt, self._n_final + i)
            for i, w in enumerate(words)
        ]
        if self.config.refine:
            # The utterance's last final words lead the reference: a one-word reference (most
            # finals come one or two at a time) matched any similar stretch of the audio.
            context = [t for t in self._refined[-self.config.refine_context :]
                       if t.start >= self._buf.start] if self.config.refine_context else []
            audio = self._buf.slice(self._buf.start, self._buf.end)
            refined = end_by_next_start(refine_word_times(audio, self._buf.start, context + toks,
                                                          lookahead_s=self.config.lookahead_s,
                                                          context=len(context)))
            toks = [replace(t, final=True) for t in refined[len(context) :]]
            self._refined = (self._refined + toks)[-max(self.config.refine_context, 1) :]
        self._committed.extend(words)
        self._n_final += len(words)
        if self._lead > 0 and self._repeats_carry():
            self._drop_lead()
        self._utt_text.extend(w.text for w in words)
        return list(toks)

    def _rebase(self) -> None:
        """Window too long: move its start to a final word boundary so a step costs O(1).

        Finals ending in the last ``context_s`` stay in the window (acoustic context, forced as
        the prefix); earlier ones move into the text prompt and their audio is dropped.
        """
        words = self._committed
        if not words:
            return
        keep_from = words[-1].end - self.config.context_s
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
        two final words repeat two carried ones, or a fallback starts with carried words. (Dropped
        on every fallback instead, it cost 2-4 points of WER on ordinary speech.) Returns the
        shift of window times.
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


def _heard_words(final: list[DecodedWord], pending: list[DecodedWord], speech_end: float,
                 min_prob: float) -> list[DecodedWord]:
    """``pending`` (an utterance's last words, decoded at its endpoint, after its ``final`` words)
    without what the model said over the silence after the speech.

    Dropped: words that start at or after ``speech_end``; trailing words below ``min_prob``; and a
    trailing run of 2+ words that repeats the words just before it with no speech left to say it
    in (under 0.1 s a word between the first copy's end and ``speech_end``). tiny.en, forced
    through the final words and then hearing silence, sometimes says them again (``... Sundays and
    holidays`` + ``and holidays.``) or adds a word at p < 0.2; a speaker who repeats a phrase has
    the audio for it. In two 32-session runs (2,318 reference words) these rules dropped 13
    words: 12 never spoken (`` building``, `` land``, `` and`` after ``... and holidays``) and one
    spoken (`` paper`` at p 0.13).
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
    core = re.sub(r"[^\w']+", "", raw)
    return " " + core if core else raw


def _after_committed(words: list[DecodedWord], committed: list[DecodedWord]) -> list[DecodedWord]:
    """For engines that cannot force a prefix: the words after the committed ones.

    Words that start before the last committed word ended (less 0.1 s) are dropped, then any
    1-5 word overlap between the committed tail and the new head is removed (as in
    whisper_streaming's hypothesis buffer).
    """
    if not committed:
        return words
    cut = committed[-1].end - 0.1
    new = [w for w in words if w.start > cut]
    for n in range(min(5, len(committed), len(new)), 0, -1):
        if [w.key for w in committed[-n:]] == [w.key for w in new[:n]]:
            return new[n:]
    return new


# --- shared worker -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerStats:
    """A snapshot of the worker: queued audio, drops, decode cost."""

    streams: int
    queue_depth: int  # chunks waiting, all streams
    queued_s: float  # audio seconds waiting, all streams
    dropped_chunks: int
    dropped_s: float
    decodes: int
    decode_ms_mean: float
    decode_ms_last: float
    events_dropped: int
    oldest_wait_s: float = 0.0  # how long the oldest audio no lane has taken yet has waited (0: none)


class ASRStream:
    """One session's handle on an :class:`ASRWorker` (create with ``worker.open(session_id)``)."""

    def __init__(self, worker: ASRWorker, session_id: str, asr: StreamingASR, max_queue_s: float,
                 max_events: int, loop: asyncio.AbstractEventLoop | None) -> None:
        self.worker = worker
        self.session_id = session_id
        self.asr = asr
        self.max_queue_s = max_queue_s
        self._max_queue_n = int(round(max_queue_s * SAMPLE_RATE))  # samples, so no float drift
        self._chunks: deque[AudioChunk] = deque()
        self._queued_n = 0
        self.dropped_chunks = 0
        self._dropped_n = 0
        self.events_dropped = 0
        self._loop = loop
        self._events: asyncio.Queue[ASREvent | None] = asyncio.Queue(maxsize=max_events)
        self.closed = False
        self.finished = False
        self.busy = False  # a worker lane is feeding it (lanes never feed one stream at once)
        self.waiting_since = float("inf")  # monotonic time its oldest queued audio (or close) arrived

    # Called on the event loop (or any thread): never blocks.
    def push(self, chunk: AudioChunk) -> None:
        """Queue audio for recognition; a full queue drops the oldest audio and counts it."""
        if self.closed:
            raise RuntimeError(f"ASR stream {self.session_id!r} is closed")
        with self.worker._cond:
            if not self._chunks:
                self.waiting_since = min(self.waiting_since, time.monotonic())
            self._chunks.append(chunk)
            self._queued_n += len(chunk.samples)
            while self._queued_n > self._max_queue_n and len(self._chunks) > 1:
                old = self._chunks.popleft()
                self._queued_n -= len(old.samples)
                self.dropped_chunks += 1
                self._dropped_n += len(old.samples)
            self.worker._cond.notify()

    @property
    def dropped_s(self) -> float:
        """Seconds of audio this stream's full queue has dropped."""
        return self._dropped_n / SAMPLE_RATE

    def close(self) -> None:
        """No more audio: the worker flushes this stream, then the event iterator ends."""
        with self.worker._cond:
            self.closed = True
            self.waiting_since = min(self.waiting_since, time.monotonic())
            self.worker._cond.notify()

    async def events(self) -> AsyncIterator[ASREvent]:
        """Every event of this stream until it is closed and flushed."""
        while True:
            ev = await self._events.get()
            if ev is None:
                return
            yield ev

    def _take(self, max_chunks: int) -> list[AudioChunk]:
        out: list[AudioChunk] = []
        while self._chunks and len(out) < max_chunks:
            c = self._chunks.popleft()
            self._queued_n -= len(c.samples)
            out.append(c)
        self.waiting_since = time.monotonic() if self._chunks or self.closed else float("inf")
        return out

    def _deliver(self, items: list[ASREvent | None]) -> None:
        def put() -> None:
            for ev in items:
                while True:
                    try:
                        self._events.put_nowait(ev)
                        break
                    except asyncio.QueueFull:
                        self._events.get_nowait()  # drop the oldest undelivered event
                        self.events_dropped += 1

        if self._loop is None or self._loop.is_closed():
            put()
        else:
            self._loop.call_soon_threadsafe(put)


def _engine_copy(engine: Engine) -> Engine:
    """An engine with its own copy of the weights, for a second worker lane."""
    if isinstance(engine, WhisperEngine):
        import copy

        return WhisperEngine(copy.deepcopy(engine.model), engine.context_pad_s, engine.threads, engine.int8)
    if isinstance(engine, FasterWhisperEngine):
        return FasterWhisperEngine()
    return engine  # an unknown engine is shared (its own locking decides)


def _merge_contiguous(chunks: list[AudioChunk]) -> list[AudioChunk]:
    """Join chunks that follow each other without a gap, so a turn decodes once, not per chunk."""
    out: list[AudioChunk] = []
    run: list[AudioChunk] = []
    for c in chunks:
        if run and abs(c.pts - run[-1].end) > 0.5 / SAMPLE_RATE:
            out.append(join_chunks(run))
            run = []
        run.append(c)
    if run:
        out.append(join_chunks(run))
    return out


def join_chunks(run: list[AudioChunk]) -> AudioChunk:
    """One chunk holding ``run`` (assumed contiguous), starting at the first one's pts."""
    if len(run) == 1:
        return run[0]
    return AudioChunk(run[0].pts, np.concatenate([np.asarray(c.samples, np.float32) for c in run]))


class ASRWorker:
    """Many sessions on ``lanes`` worker threads, earliest deadline first, bounded queues.

    Each turn takes one session's queued chunks (at most ``max_chunks_per_turn``), feeds them to
    its :class:`StreamingASR` (which decodes at most once per feed), and hands events to that
    session's asyncio queue on its event loop. With ``lanes`` > 1 each lane is a thread with its
    own copy of the model (forward passes on one model are serialised), so decodes of different
    sessions run on separate cores; a session is served by one lane at a time, by whichever is
    free (the streaming state is engine-independent: the copies hold the same weights).
    """

    def __init__(
        self,
        engine: str | Engine = "whisper",
        config: StreamingConfig | None = None,
        max_queue_s: float = 5.0,
        max_events: int = 512,
        max_streams: int = 64,
        max_chunks_per_turn: int = 10_000,
        model=None,  # noqa: ANN001
        autostart: bool = True,
        lanes: int = 1,
    ) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be >= 1, got {lanes}")
        self.config = config or StreamingConfig()
        self._stream_config = self.config  # new streams' config (``set_step_s`` may change its step)
        self.engine = get_engine(engine, model, int8=self.config.int8)
        self.engines: list[Engine] = [self.engine] + [_engine_copy(self.engine) for _ in range(lanes - 1)]
        self.max_queue_s = max_queue_s
        self.max_events = max_events
        self.max_streams = max_streams
        self.max_chunks_per_turn = max_chunks_per_turn
        self._streams: dict[str, ASRStream] = {}
        self._order: deque[str] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._decodes = 0
        self._decode_s = 0.0
        self._closed_drops = (0, 0, 0)  # chunks, samples, events dropped by streams now closed
        self._last_ms = 0.0
        self._threads = [
            threading.Thread(target=self._run, args=(eng,), name=f"asr-worker-{i}", daemon=True)
            for i, eng in enumerate(self.engines)
        ]
        if autostart:
            self.start()

    def start(self) -> None:
        """Start the worker threads (done by the constructor unless ``autostart=False``)."""
        for t in self._threads:
            if not t.is_alive() and t.ident is None:
                t.start()

    def warmup(self) -> float:
        """Run one real inference (encoder, decoder, alignment); return its wall seconds."""
        from app.loadtest.testmedia import EspeakUnavailable, synthesize_speech

        try:
            audio = synthesize_speech("warm up", lead_in_s=0.1).samples
        except EspeakUnavailable:
            rng = np.random.default_rng(0)
            audio = (0.05 * rng.standard_normal(SAMPLE_RATE)).astype(np.float32)
        t = time.perf_counter()
        for eng in self.engines:
            eng.transcribe(audio)
        return time.perf_counter() - t

    def open(self, session_id: str) -> ASRStream:
        """A new session stream; call from the event loop that will iterate its events."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._cond:
            if self._stop:
                raise RuntimeError("ASR worker is stopped")
            if session_id in self._streams:
                raise ValueError(f"ASR session {session_id!r} is already open")
            if len(self._streams) >= self.max_streams:
                raise RuntimeError(f"ASR worker is full ({self.max_streams} sessions)")
            stream = ASRStream(self, session_id, StreamingASR(self.engine, self._stream_config), self.max_queue_s,
                               self.max_events, loop)
            self._streams[session_id] = stream
            self._order.append(session_id)
            return stream

    def set_step_s(self, step_s: float | None) -> None:
        """Re-decode every ``step_s`` of new speech from now on, in every stream (None: the configured
        step); a server sheds decodes this way under overload (``app.live.degrade``)."""
        from dataclasses import replace

        with self._cond:
            self._stream_config = self.config if step_s is None else replace(self.config, step_s=step_s)
            for s in self._streams.values():
                s.asr.config = replace(s.asr.config, step_s=self._stream_config.step_s)

    def stats(self) -> WorkerStats:
        with self._cond:
            streams = list(self._streams.values())
            return WorkerStats(
                streams=len(streams),
                queue_depth=sum(len(s._chunks) for s in streams),
                queued_s=sum(s._queued_n for s in streams) / SAMPLE_RATE,
                dropped_chunks=self._closed_drops[0] + sum(s.dropped_chunks for s in streams),
                dropped_s=(self._closed_drops[1] + sum(s._dropped_n for s in streams)) / SAMPLE_RATE,
                decodes=self._decodes,
                decode_ms_mean=round(1000 * self._decode_s / max(self._decodes, 1), 2),
                decode_ms_last=round(self._last_ms, 2),
                events_dropped=self._closed_drops[2] + sum(s.events_dropped for s in streams),
                oldest_wait_s=max((time.monotonic() - s.waiting_since for s in streams if s._chunks), default=0.0),
            )

    def stop(self) -> None:
        """Stop the thread (pending audio is discarded); streams' iterators end."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=10)
        for s in list(self._streams.values()):
            s._deliver([None])

    def _next(self) -> tuple[ASRStream, list[AudioChunk], bool] | None:
        """Earliest deadline first: the free session whose audio (or close) has waited longest,
        ties in round-robin order (under the lock). Against plain round-robin this cut the
        4-stream p95 on one core from ~2.2 s to ~1.5 s (bench/asr_stream.py, CPU clock)."""
        best: ASRStream | None = None
        for sid in self._order:
            s = self._streams[sid]
            if s.busy or not (s._chunks or (s.closed and not s.finished)):
                continue
            if best is None or s.waiting_since < best.waiting_since:
                best = s
        if best is None:
            return None
        self._order.remove(best.session_id)
        self._order.append(best.session_id)
        best.busy = True
        if best._chunks:
            return best, best._take(self.max_chunks_per_turn), False
        return best, [], True

    def _run(self, engine: Engine) -> None:
        while True:
            with self._cond:
                job = self._next()
                while job is None and not self._stop:
                    self._cond.wait()
                    job = self._next()
                if self._stop:
                    return
            assert job is not None
            stream, chunks, closing = job
            try:
                events: list[ASREvent | None] = []
                stream.asr.engine = engine
                before_n, before_s = stream.asr.decode_count, stream.asr.decode_s
                for c in _merge_contiguous(chunks):
                    events += stream.asr.feed(c)
                if closing:
                    events += stream.asr.flush()
                    events.append(None)
                n = stream.asr.decode_count - before_n
                if n:
                    spent = stream.asr.decode_s - before_s
                    with self._cond:
                        self._decodes += n
                        self._decode_s += spent
                        self._last_ms = 1000 * spent / n
            except Exception:  # a bad stream must not take the worker down
                log.exception("ASR failed for session %s; closing it", stream.session_id)
                events = [None]
                closing = True
            if closing:  # unregister before the end-of-stream marker reaches the consumer
                with self._cond:
                    stream.finished = True
                    if self._streams.pop(stream.session_id, None) is not None:
                        c, n, e = self._closed_drops
                        self._closed_drops = (c + stream.dropped_chunks, n + stream._dropped_n,
                                              e + stream.events_dropped)
                    if stream.session_id in self._order:
                        self._order.remove(stream.session_id)
            if events:
                stream._deliver(events)
            with self._cond:
                stream.busy = False
                self._cond.notify_all()  # another lane may be waiting for this stream's audio
