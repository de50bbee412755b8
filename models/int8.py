"""Int8 copies of Linear layers for the streaming decoder and encoder (CPU).

Streaming re-decodes a short window every 0.15 s; most of a decode is weight reads, which int8
cuts by 4x. Two kinds:

* :class:`RowInt8Linear` scales every input row on its own and multiplies in integers
  (``torch._int_mm``, exact int32 accumulation), so a row's result is the same bit for bit
  whatever was batched with it: the decoder can feed a forced prefix and a draft in one call
  and still decode exactly as if each token had been fed alone.
* torch's dynamic-int8 Linear (``quantize_dynamic``) scales the whole input per call; it is
  used where a call is one whole unit anyway (the encoder's window).
"""

from __future__ import annotations

import copy
import logging
import warnings

import torch

log = logging.getLogger(__name__)


class RowInt8Linear(torch.nn.Module):
    """``y = x W^T + b`` with W int8 per output channel and x int8 per row (symmetric)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        # Kept (out, in); the kernel reads its transpose ~2x faster than a transposed copy.
        self.register_buffer("weight", torch.round(w / scale[:, None]).to(torch.int8))
        self.register_buffer("weight_scale", scale)
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @classmethod
    def stacked(cls, parts: list[RowInt8Linear]) -> RowInt8Linear:
        """One layer whose output is ``torch.cat([p(x) for p in parts], -1)``, bit for bit: each row
        of ``x`` is quantised once for all of them and every output channel keeps its own scale
        (the decoder's query, key and value in one call: 2.1x faster for one row)."""
        out = cls.__new__(cls)
        torch.nn.Module.__init__(out)
        out.register_buffer("weight", torch.cat([p.weight for p in parts]))
        out.register_buffer("weight_scale", torch.cat([p.weight_scale for p in parts]))
        biases = [p.bias if p.bias is not None else torch.zeros(p.out_features) for p in parts]
        out.register_buffer("bias", None if all(p.bias is None for p in parts) else torch.cat(biases))
        out.in_features, out.out_features = parts[0].in_features, sum(p.out_features for p in parts)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A decode makes thousands of these calls with a row or a few: each op here is mostly call
        # overhead, so the per-row scale 127 / max|x| is made in place (the same float ops as
        # ``127.0 / t``, which torch computes as ``t.reciprocal() * 127.0``) and 2-D input is not reshaped.
        shape = x.shape
        flat = x.dim() == 2
        if not flat:
            x = x.reshape(-1, shape[-1])
        inv = x.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).reciprocal_().mul_(127.0)  # per-row scale
        q = (x * inv).round_().to(torch.int8)
        y = torch._int_mm(q, self.weight.t()).float()  # exact int32 sums
        y.mul_(self.weight_scale).div_(inv)
        if self.bias is not None:
            y.add_(self.bias)
        return y if flat else y.reshape(*shape[:-1], self.out_features)

def _dynamic_int8(linear: torch.nn.Linear) -> torch.nn.Module:
    plain = torch.nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    plain.load_state_dict(linear.state_dict())
    return torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(plain), {torch.nn.Linear}, dtype=torch.qint8)[0]


def int8_copy(module: torch.nn.Module, rowwise: bool = False) -> torch.nn.Module | None:
    """A copy of ``module`` with every Linear (whisper's subclass too) in int8: :class:`RowInt8Linear`
    when ``rowwise``, else torch's dynamic int8. None where this torch lacks the kernels (the
    caller keeps the exact fp32 module)."""
    make = RowInt8Linear if rowwise else _dynamic_int8

    def swap(parent: torch.nn.Module) -> None:
        for name, child in parent.named_children():
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, make(child))
            else:
                swap(child)

    try:
        out = copy.deepcopy(module)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's deprecation notice for eager quantisation
            swap(out)
            if rowwise:  # the integer kernel exists on this build: one call to find out
                RowInt8Linear(torch.nn.Linear(8, 8))(torch.ones(1, 8))
                _stack_attention(out)
        return out.eval()
    except Exception as exc:  # noqa: BLE001 - any failure: the caller keeps the exact fp32 module
        log.warning("int8 Linear unavailable (%s); using fp32", exc)
        return None


def _stack_attention(module: torch.nn.Module) -> None:
    """Give whisper's attention layers the stacked copies :class:`models.whisper_decoder.DecoderPass`
    calls instead of separate Linears (the same results, one input quantisation and one kernel
    call): ``attn.qkv`` (query, key, value of a new token) and ``cross_attn.kv`` (key and value
    of the audio frames, once per window)."""
    def row_int8(layer: torch.nn.Module | None, names: tuple[str, ...]) -> list[RowInt8Linear] | None:
        parts = [getattr(layer, n, None) for n in names]
        return parts if all(isinstance(p, RowInt8Linear) for p in parts) else None

    for block in module.modules():
        if qkv := row_int8(getattr(block, "attn", None), ("query", "key", "value")):
            block.attn.qkv = RowInt8Linear.stacked(qkv)
        if kv := row_int8(getattr(block, "cross_attn", None), ("key", "value")):
            block.cross_attn.kv = RowInt8Linear.stacked(kv)


def int8_projection(weight: torch.Tensor) -> torch.nn.Module | None:
    """A dynamic-int8 copy of a (tied) vocabulary projection ``x @ weight.T``, or None. (Dynamic:
    for 51,864 outputs its kernel is ~5x faster than the integer matmul of RowInt8Linear; it is
    applied to one row at a time.)"""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lin.weight.data = weight.detach()
    return int8_copy(torch.nn.Sequential(lin))
