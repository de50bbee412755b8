"""A lean greedy-decoding pass over openai-whisper's text decoder weights.

Streaming re-decodes a short window every 0.15 s, a few tokens at a time. Through whisper's own
modules a decoder call cost 6.6 ms on average in a streaming profile (tiny.en, one core), part of
it overhead: module calls, forward hooks that grow the key/value cache by ``torch.cat``, hooks
that copy out the cross-attention. :class:`DecoderPass` computes the same function with plain
tensor ops, a preallocated key/value cache that is cut back by a length, and cross-attention keys
and values projected once per audio window; the cross-attention logits of every fed position are
kept (the word-timing DTW reads them): 5.3 ms a call in the same profile. What is left is mostly
weight reads (33 MB of fp32 Linear weights a step; alone, a one-token step takes 3.7 ms), so
streaming passes an int8 copy of the blocks (:class:`models.int8.RowInt8Linear`: each row scaled
on its own, so a row's result never depends on what was batched with it) where that copy is the
faster one on the CPU (:func:`models.int8.rowwise_int8_pays`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from whisper.model import TextDecoder


class _Layer(NamedTuple):
    """One block's weights as the calls a step makes (bound once: a step is mostly call overhead)."""

    attn_ln: tuple
    qkv: Callable[[torch.Tensor], Sequence[torch.Tensor]]
    out: Callable[[torch.Tensor], torch.Tensor]
    cross_ln: tuple
    cross_query: Callable[[torch.Tensor], torch.Tensor]
    cross_out: Callable[[torch.Tensor], torch.Tensor]
    mlp_ln: tuple
    fc1: Callable[[torch.Tensor], torch.Tensor]
    fc2: Callable[[torch.Tensor], torch.Tensor]
    ck: torch.Tensor  # cross-attention keys of the audio (heads, frames, d), scaled
    cv: torch.Tensor  # and values


def _ln(m: torch.nn.LayerNorm) -> tuple:
    return m.weight.shape, m.weight, m.bias, m.eps


def _layer(b: torch.nn.Module, n_state: int, ck: torch.Tensor, cv: torch.Tensor) -> _Layer:
    a, c = b.attn, b.cross_attn
    stacked = getattr(a, "qkv", None)  # an int8 copy's stacked query, key and value (models.int8)
    if stacked is not None:
        fwd = stacked.forward

        def qkv(y: torch.Tensor) -> Sequence[torch.Tensor]:
            return fwd(y).split(n_state, -1)
    else:
        def qkv(y: torch.Tensor) -> Sequence[torch.Tensor]:
            return a.query(y), a.key(y), a.value(y)
    return _Layer(_ln(b.attn_ln), qkv, a.out.forward, _ln(b.cross_attn_ln), c.query.forward, c.out.forward,
                  _ln(b.mlp_ln), b.mlp[0].forward, b.mlp[2].forward, ck, cv)


class DecoderPass:
    """One decode of one audio window: feed tokens, get final-layer hidden states.

    ``feed`` appends positions (self-attention is causal over everything fed so far) and returns
    their hidden states after the decoder's last layer norm, before the vocabulary projection;
    ``truncate(n)`` forgets every position from ``n`` on (a rejected draft). Values match
    ``TextDecoder.forward`` up to float rounding (tests/test_whisper_decoder.py).
    """

    def __init__(self, decoder: TextDecoder, feats: torch.Tensor, max_len: int,
                 blocks: Sequence[torch.nn.Module] | None = None) -> None:
        self.dec = decoder
        blocks = list(decoder.blocks if blocks is None else blocks)  # e.g. an int8 copy of them
        first = blocks[0].attn
        self.n_head = first.n_head
        n_state = decoder.positional_embedding.shape[1]
        self.d_head = n_state // self.n_head
        self.scale = self.d_head**-0.5  # whisper scales q and k by d**-0.25 each
        self.max_len = min(max_len, decoder.positional_embedding.shape[0])
        audio = feats.reshape(-1, n_state)  # (frames, state): one window, batch 1
        self.layers = []
        self.n_state = n_state
        for b in blocks:
            ca = b.cross_attn
            kv = getattr(ca, "kv", None)  # an int8 copy's stacked key and value (models.int8)
            k, v = kv(audio).split(n_state, -1) if kv is not None else (ca.key(audio), ca.value(audio))
            k = k.reshape(-1, self.n_head, self.d_head).transpose(0, 1)
            v = v.reshape(-1, self.n_head, self.d_head).transpose(0, 1)
            self.layers.append(_layer(b, n_state, (k * self.scale).contiguous(), v.contiguous()))
        self.k = torch.zeros(len(blocks), self.n_head, self.max_len, self.d_head)
        self.v = torch.zeros_like(self.k)
        self.length = 0
        # Cross-attention logits per layer, one (heads, positions, frames) tensor per feed.
        self._qk: list[list[torch.Tensor]] = [[] for _ in blocks]

    def feed(self, tokens: list[int], rowwise: bool = False) -> torch.Tensor:
        """Hidden states (len(tokens), state) of ``tokens`` appended after what was fed.

        ``rowwise``: every position's attention is computed as a one-token feed computes it (the
        int8 Linears are batch-invariant already), so each row equals, bit for bit, what feeding
        the tokens one at a time gives; the layers' weights are still read once for all of them.
        """
        n, start = len(tokens), self.length
        end = start + n
        if end > self.max_len:
            raise ValueError(f"decoder context full: {end} > {self.max_len} positions")
        dec, h, d = self.dec, self.n_head, self.d_head
        x = dec.token_embedding(torch.tensor(tokens)) + dec.positional_embedding[start:end]
        mask = None
        if n > 1 and not rowwise:  # causal within the new positions; everything before them is visible
            mask = torch.full((n, end), float("-inf")).triu_(start + 1)
        for i, lay in enumerate(self.layers):
            y = F.layer_norm(x, *lay.attn_ln)
            q, k, v = lay.qkv(y)
            self.k[i, :, start:end] = k.reshape(n, h, d).transpose(0, 1)
            self.v[i, :, start:end] = v.reshape(n, h, d).transpose(0, 1)
            if rowwise and n > 1:
                o = torch.cat([self._self_attention(i, q[j : j + 1], start + j + 1) for j in range(n)])
            else:
                o = self._self_attention(i, q, end, mask)
            x = x + lay.out(o)

            y = F.layer_norm(x, *lay.cross_ln)
            q = lay.cross_query(y)
            if rowwise and n > 1:
                o = torch.cat([self._cross_attention(i, q[j : j + 1], lay.ck, lay.cv) for j in range(n)])
            else:
                o = self._cross_attention(i, q, lay.ck, lay.cv)
            x = x + lay.cross_out(o)

            y = F.layer_norm(x, *lay.mlp_ln)
            x = x + lay.fc2(F.gelu(lay.fc1(y)))
        self.length = end
        return F.layer_norm(x, dec.ln.weight.shape, dec.ln.weight, dec.ln.bias, dec.ln.eps)

    def _self_attention(self, i: int, q: torch.Tensor, end: int, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Layer ``i``'s self-attention output of the queries ``q`` (rows, state) over positions
        ``[0, end)`` of the cache."""
        n, h, d = q.shape[0], self.n_head, self.d_head
        q = q.reshape(n, h, d).transpose(0, 1)
        att = (q * self.scale) @ self.k[i, :, :end].transpose(-1, -2)
        if mask is not None:
            att = att + mask
        return (att.softmax(-1) @ self.v[i, :, :end]).transpose(0, 1).reshape(n, h * d)

    def _cross_attention(self, i: int, q: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor) -> torch.Tensor:
        """Layer ``i``'s cross-attention output of the queries ``q``; keeps their logits (word DTW)."""
        n, h, d = q.shape[0], self.n_head, self.d_head
        att = q.view(n, h, d).transpose(0, 1) @ ck.transpose(-1, -2)  # (heads, n, frames); ck carries the scale
        self._qk[i].append(att)
        return (att.softmax(-1) @ cv).transpose(0, 1).reshape(n, h * d)

    def truncate(self, n: int) -> None:
        """Forget positions ``n`` and later (their keys, values and cross-attention)."""
        if n >= self.length:
            return
        self.length = n
        self._qk = [[torch.cat(rows, dim=1)[:, :n]] if rows else [] for rows in self._qk]

    def cross_attention(self) -> list[torch.Tensor]:
        """Per layer, the cross-attention logits (heads, positions fed, frames)."""
        return [torch.cat(rows, dim=1) if rows else torch.zeros(0) for rows in self._qk]

