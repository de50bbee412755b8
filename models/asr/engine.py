"""The ASR engine: decode a short window of 16 kHz audio into timed words.

:class:`Engine` is what the offline and streaming layers need; :class:`WhisperEngine` is the one
we ship (openai-whisper weights, a variable audio context, cross-attention DTW word times).

Greedy decoding projects onto the vocabulary with an int8 copy of the embedding and re-scores
the best candidates in fp32. Streaming runs int8 copies of the encoder and the decoder blocks (it
re-decodes its window every step; the blocks' copy only where its integer kernel is the faster one
on this CPU); offline keeps the fp32 model.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from whisper.model import Whisper

from alignment.text import agreement_key
from alignment.types import SAMPLE_RATE
from models.int8 import int8_copy, int8_projection, rowwise_int8_pays
from models.whisper_decoder import DecoderPass
from models.whisper_loader import load_whisper, mel_for, model_lock

CONTEXT_PAD_S = 0.5  # audio context = length of audio present + this (DESIGN: best WER)


def check_audio(audio: np.ndarray) -> np.ndarray:
    """``audio`` as float32 mono samples, or a clear error (engines take 1-D float 16 kHz audio)."""
    arr = np.asarray(audio)
    if arr.ndim != 1:
        raise ValueError(f"audio must be 1-D mono 16 kHz samples, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"audio must be float samples in [-1, 1], got dtype {arr.dtype}")
    arr = arr.astype(np.float32, copy=False)
    if arr.size and not np.all(np.isfinite(arr)):
        raise ValueError("audio contains NaN or infinite samples")
    return arr


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
        return agreement_key(self.raw)


#: A word shorter than this, or that close to another's start, is at one instant.
INSTANT_S = 1e-3


def _at_one_instant(a: DecodedWord, b: DecodedWord) -> bool:
    """Both words have no duration and start together: the DTW found no audio for them."""
    return a.end - a.start < INSTANT_S and b.end - b.start < INSTANT_S and abs(b.start - a.start) < INSTANT_S


def audible_prefix(words: Sequence[DecodedWord]) -> int:
    """How many of ``words`` come before the first two that the word DTW put at one instant with no
    duration. The DTW does that to text it finds no audio for: tiny.en, forced through a carried
    sentence or past the end of the speech, now and then says it all again."""
    return next((i for i in range(len(words) - 1) if _at_one_instant(words[i], words[i + 1])), len(words))


def without_unheard_tail(words: list[DecodedWord]) -> list[DecodedWord]:
    """``words`` less a trailing run of them at one instant (:func:`audible_prefix`): a decode's last
    word said again, or its whole text, with no audio left for it. A run with heard words after it stays."""
    k = audible_prefix(words)
    if k < len(words) and all(_at_one_instant(words[k], w) for w in words[k + 1 :]):
        return words[:k]
    return words


class Engine(Protocol):
    """One Whisper backend: decode a short window of 16 kHz audio into timed words.

    The returned words start with ``prefix`` exactly (the streaming policy forces its committed
    words through the decoder and reads what follows them).
    """

    name: str

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
    (tokenizer work) is paid once, a one-token step costs no module or hook overhead,
    the committed prefix is fed in one forward pass, only the positions that are sampled are
    projected onto the vocabulary, and the word DTW reuses the cross-attention of the decode
    itself (no second decoder pass).
    """

    name = "whisper"

    def __init__(
        self, model: Whisper | None = None, context_pad_s: float = CONTEXT_PAD_S, threads: int = 1,
        int8: bool = False, int8_decoder: bool | None = None,
    ) -> None:
        import whisper.timing  # noqa: F401 - imports numba, which resets this thread's torch threads
        import whisper.tokenizer

        # torch's intra-op thread count is per calling thread (OpenMP), so this binds only the
        # threads that decode. One thread: on shared cores more threads mostly wait at barriers,
        # and the worker serialises decodes anyway (docs/asr-measurements.md).
        self.threads = threads

        self.model = model if model is not None else load_whisper()
        self.lock = model_lock(self.model)
        # Streaming re-decodes its window every step: int8 Linear layers cut the encoder's and a
        # decoder step's cost without a WER change beyond noise (docs/asr-measurements.md).
        # Offline keeps the exact fp32 model.
        self.int8 = int8
        self.encoder = (int8_copy(self.model.encoder) if int8 else None) or self.model.encoder
        # Only the blocks: a copy of the whole decoder would duplicate the 80 MB token embedding.
        # Their int8 kernel is slower than fp32 on CPUs without native int8 products: measured
        # unless ``int8_decoder`` says which.
        if int8_decoder is None:
            int8_decoder = int8 and rowwise_int8_pays()
        self.decoder_blocks = ((int8_copy(self.model.decoder.blocks, rowwise=True) if int8_decoder else None)
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
                text, probs, layers, first_row, sot_row, avg_lp = self._decode_tokens(
                    feats, prefix_tokens, prompt, dur, draft_tokens, expect_words
                )
                # Whisper's own no-speech rule, on every window: the new words go (a forced prefix
                # stays). Its probability takes an fp32 projection (80 MB of weights): only made when
                # the new text is unsure.
                silent = len(text) > len(prefix_tokens) and avg_lp < -1.0 and self._no_speech(sot_row) > 0.6
                if silent and not prefix_tokens:
                    return []
                words = self._align(layers, first_row, text, probs, num_frames)
                if silent:
                    words = words[: len(prefix)]
        finally:
            torch.set_num_threads(prev_threads)
        # Words aligned to the very end of the audio are continuations the model made up; not the
        # one a caller expects there (the DTW puts a new word after a long forced prefix at the end).
        n_keep = len(words)
        while n_keep > len(prefix) + expect_words and words[n_keep - 1].start >= dur - 0.06:
            n_keep -= 1
        return words[:n_keep]

    def _approx_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits of hidden states (rows, state) from an int8 copy of the embedding.

        The fp32 projection reads 80 MB of weights per sampled token; :meth:`_pick` re-scores
        the best candidates exactly, so greedy choices do not depend on the int8 error. Each
        row comes out as if projected alone (:class:`models.int8.RowwiseDynamicInt8`), so a
        token's logits do not depend on which rows were verified with it.
        """
        if self._proj_q is None:
            emb = self.model.decoder.token_embedding.weight
            return torch.stack([row @ emb.T for row in rows])
        return self._proj_q(rows)

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

    def _no_speech(self, sot_row: torch.Tensor) -> float:
        """Whisper's no-speech probability, from the hidden state of ``<|startoftranscript|>``."""
        emb = self.model.decoder.token_embedding.weight
        return float((sot_row @ emb.T).float().softmax(-1)[self.tokenizer.no_speech])

    def _starts_word(self, token: int) -> bool:
        """The token opens a new word (a leading space and a letter or digit), not punctuation."""
        return bool(self._spelling(token)) and self.tokenizer.decode([token]).startswith(" ")

    def _spelling(self, token: int) -> str:
        key = self._spellings.get(token)
        if key is None:
            key = self._spellings[token] = agreement_key(self.tokenizer.decode([token]))
        return key

    def _decode_tokens(
        self, feats: torch.Tensor, prefix_tokens: list[int], prompt: str, dur: float,
        draft_tokens: Sequence[int] = (), expect_words: bool = False,
    ) -> tuple[list[int], list[float], list[torch.Tensor], int, torch.Tensor, float]:
        """Greedy decoding with a key/value cache, capturing cross-attention for the word DTW.

        ``draft_tokens`` (the previous hypothesis) are fed with the prefix in one forward pass and
        verified greedily from the logits of that pass: accepted tokens cost no sequential step,
        and at the first mismatch the cache is cut back and greedy decoding goes on from there.
        Each later token is fed with a guess of the tokens after it (:func:`_guess`), verified
        the same way; those rows are computed as one-token steps compute them (``rowwise``), so
        a guess changes nothing but the number of weight reads. The result is the plain greedy
        decode.

        Returns text tokens (prefix + new), their probabilities (1.0 for the forced prefix), the
        per-layer cross-attention logits of every fed position, the row of ``<|notimestamps|>``,
        the hidden state of ``<|startoftranscript|>`` (Whisper's no-speech probability is read from
        it) and the mean log-probability of the new tokens.
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
        state = DecoderPass(self.model.decoder, feats, max_len=len(tokens) + max(budget, 0) + 1,
                            blocks=self.decoder_blocks)
        out: list[int] = []
        probs: list[float] = []
        sum_lp = 0.0
        n0 = len(tokens)
        h = state.feed(tokens + draft)
        sot_row = h[sot_index]  # causal: the same with or without a prefix after it
        ahead = draft  # tokens fed past the text, to verify: rows[k] predicts ahead[k] (and rows[-1] the next)
        rows = h[n0 - 1 :]
        logits = self._approx_logits(rows)
        j = 0  # the row the next token is picked from
        word_started = not expect_words
        for i in range(max(budget, 0)):
            hold = not word_started and i < 3  # expected speech: the text may not end yet
            nxt, lp, p_spelled = self._pick(rows[j], logits[j], blank=i == 0 and not prefix_tokens, no_eot=hold)
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
            if j < len(ahead) and nxt == ahead[j]:
                j += 1  # verified: its successor's row was computed with it
                continue
            # Forget what was fed past the verified tokens; feed this token with a guess of what follows.
            state.truncate(n0 + i)
            ahead = _before_cut(prefix_tokens + out, _guess(prefix_tokens + out, min(_GUESS, budget - i - 1)))
            rows = state.feed([nxt, *ahead], rowwise=True)
            logits = self._approx_logits(rows)
            j = 0
        layers = state.cross_attention()  # each (heads, fed positions, frames)
        text = prefix_tokens + out
        token_probs = [1.0] * len(prefix_tokens) + probs
        return text, token_probs, layers, len(initial) - 1, sot_row, sum_lp / max(len(out), 1)

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
            if t.word and agreement_key(t.word)
        ]


_RESCORE = 8  # candidates re-scored in fp32 after the int8 vocabulary projection
_GUESS = 6  # tokens guessed ahead after a sampled token (verified in the same decoder pass)


def _guess(tokens: list[int], n: int) -> list[int]:
    """The ``n`` tokens that followed the last token's previous occurrence, continued periodically
    when that run reaches the end (``a b c a`` -> ``b c a b ...``); [] when it has none.

    tiny.en often says again what it just said: at the end of a partial window it loops (a word
    or a full stop four times, which :func:`_loop_cut` then cuts) or repeats the forced prefix.
    """
    last = len(tokens) - 1
    if n <= 0 or last < 1:
        return []
    try:
        at = last - 1 - tokens[last - 1 :: -1].index(tokens[last])
    except ValueError:
        return []
    period = last - at
    return [tokens[at + 1 + k % period] for k in range(n)]


def _before_cut(tokens: list[int], guess: list[int]) -> list[int]:
    """``guess`` up to the token before the one that would make ``tokens`` a loop: decoding stops
    at that token, so no row after it is read."""
    for m in range(1, len(guess) + 1):
        if _loop_cut(tokens + guess[:m]) < len(tokens) + m:
            return guess[: m - 1]
    return guess


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



_ENGINES: dict[tuple[str, int, bool], Engine] = {}
_ENGINES_LOCK = threading.Lock()


def get_engine(engine: str | Engine = "whisper", model: Whisper | None = None, int8: bool = False) -> Engine:
    """An engine by name (``"whisper"``), one instance per process, model and precision; an
    :class:`Engine` instance is returned as it is."""
    if not isinstance(engine, str):
        return engine
    if engine != "whisper":
        raise ValueError(f"unknown ASR engine {engine!r}; choose 'whisper' (or pass an Engine)")
    key = (engine, id(model) if model is not None else 0, int8)
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = WhisperEngine(model, int8=int8)
        return _ENGINES[key]
