"""Int8 copies of Linear layers for the streaming decoder and encoder (CPU).

Streaming re-decodes a short window every 0.15 s, and most of a decode is weight reads, which int8
cuts by 4x. :class:`RowInt8Linear` scales every input row on its own and multiplies in integers
(``torch._int_mm``, exact int32 sums), so a row's result is the same bit for bit whatever was batched
with it: the decoder can feed a forced prefix and a draft in one call. torch's dynamic-int8 Linear
(``quantize_dynamic``) scales the whole input per call; it serves the encoder, whose window is one
unit anyway. The integer kernel is fast only where the CPU multiplies int8 natively (AVX-512 VNNI,
AMX): :func:`rowwise_int8_pays` measures which on the CPU at hand, once per process.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
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
        # ``127.0 / t``, which torch computes as ``t.reciprocal() * 127.0``), the kernel's
        # transposed view of the weight is made once and 2-D input is not reshaped.
        shape = x.shape
        flat = x.dim() == 2
        if not flat:
            x = x.reshape(-1, shape[-1])
        inv = x.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).reciprocal_().mul_(127.0)  # per-row scale
        q = (x * inv).round_().to(torch.int8)
        cached = self.__dict__.get("_weight_t")
        if cached is None or cached[0] is not self.weight:
            cached = self.__dict__["_weight_t"] = (self.weight, self.weight.t())
        y = torch._int_mm(q, cached[1]).float()  # exact int32 sums
        y.mul_(self.weight_scale).div_(inv)
        if self.bias is not None:
            y.add_(self.bias)
        return y if flat else y.reshape(*shape[:-1], self.out_features)


@functools.cache
def rowwise_int8_pays(in_features: int = 384, out_features: int = 1536, rows: int = 4) -> bool:
    """Whether :class:`RowInt8Linear` beats the fp32 Linear it copies on this CPU, at a decoder
    step's shape (a few rows; tiny.en's MLP), on one thread as the decoder runs.

    Measured, not read from the CPU's flags: ``torch._int_mm`` picks its kernel inside torch, and
    the gap is large either way (docs/asr-measurements.md). The best of several interleaved rounds
    is compared, so a busy machine slows both alike. Once per process (the ASR lanes inherit it by
    fork).
    """
    lin = torch.nn.Linear(in_features, out_features)
    try:
        row = RowInt8Linear(lin)
        x = torch.randn(rows, in_features)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                best = {"int8": float("inf"), "fp32": float("inf")}
                for _ in range(7):
                    for name, layer in (("int8", row), ("fp32", lin)):
                        t0 = time.perf_counter()
                        for _ in range(10):
                            layer(x)
                        best[name] = min(best[name], time.perf_counter() - t0)
        finally:
            torch.set_num_threads(threads)
    except Exception as exc:  # noqa: BLE001 - no integer kernel on this build: fp32 it is
        log.info("int8 row kernel unavailable (%s): the decoder stays fp32", exc)
        return False
    pays = best["int8"] < best["fp32"]
    # Worth an operator's notice when it loses: this CPU decodes slower than the ones it was tuned on.
    log.log(logging.INFO if pays else logging.WARNING,
            "int8 row kernel %.0f us vs fp32 %.0f us a call (%d rows, %dx%d) on this CPU: streaming decoder %s",
            best["int8"] * 1e5, best["fp32"] * 1e5, rows, in_features, out_features, "int8" if pays else "fp32")
    return pays


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


class RowwiseDynamicInt8(torch.nn.Module):
    """torch's dynamic-int8 Linear (fbgemm) applied to every input row as if that row were its own
    call, bit for bit, but with one weight read for all of them.

    A dynamic call quantises its whole input with one (asymmetric, 7-bit) scale, so rows batched
    together would come out differently than alone. Here each row gets the scale and zero point
    a one-row call would choose and is quantised as that call would; the integer sums of all
    rows come from one fbgemm call on the quantised values themselves (integers 0..127, plus a
    row that pins that call's own scale to 1 and zero point to 0, so it quantises nothing away),
    and each row's sums are scaled back as fbgemm scales a one-row call's.
    """

    def __init__(self, dynamic: torch.nn.Module) -> None:
        super().__init__()
        self.dynamic = dynamic
        weight, bias = dynamic._packed_params._weight_bias()
        if weight.qscheme() != torch.per_tensor_affine or weight.q_zero_point() != 0 or bias is not None:
            raise ValueError("RowwiseDynamicInt8 needs a symmetric per-tensor int8 weight and no bias")
        self.register_buffer("weight_scale", torch.tensor(weight.q_scale(), dtype=torch.float32))
        # sum_k w[j, k]: a row's zero point times this is what its sums carry on top of (q - zp) w
        self.register_buffer("col_sums", weight.int_repr().sum(1, dtype=torch.int32).float())
        pin = torch.zeros(1, dynamic.in_features)
        pin[0, 0] = float(_QMAX)
        self.register_buffer("pin", pin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return self.dynamic(x)
        qs, zps, scales = [], [], []
        for row in x:  # the parameters and rounding of a one-row call (7 bits: reduce_range)
            scale, zp = torch._choose_qparams_per_tensor(row, reduce_range=True)
            qs.append(torch.quantize_per_tensor(row, scale, zp, torch.quint8).int_repr())
            zps.append(zp)
            scales.append(scale)
        q = torch.stack(qs).clamp_(max=_QMAX).float()
        # The integer sums come back as fl(sum * w_scale); every |sum| < 2**24, so this division
        # recovers them exactly, and so does the float arithmetic on them below.
        sums = self.dynamic(torch.cat([q, self.pin]))[:-1].div_(self.weight_scale).round_()
        sums.sub_(torch.tensor(zps, dtype=torch.float32)[:, None] * self.col_sums)
        # fbgemm scales a row's sums by one float multiplier, input scale * weight scale.
        return sums.mul_((torch.tensor(scales, dtype=torch.float32) * self.weight_scale)[:, None])


_QMAX = 127  # 7-bit activations (reduce_range): u8 x s8 pairs cannot saturate fbgemm's int16 sums


def int8_projection(weight: torch.Tensor) -> RowwiseDynamicInt8 | None:
    """A dynamic-int8 copy of a (tied) vocabulary projection ``x @ weight.T`` that computes each
    row as a one-row call would (:class:`RowwiseDynamicInt8`), or None. (Dynamic: for 51,864
    outputs its kernel is ~5x faster than the integer matmul of RowInt8Linear; a one-row call's
    result must not depend on what other rows are projected with it.)"""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lin.weight.data = weight.detach()
    dynamic = int8_copy(torch.nn.Sequential(lin))
    return None if dynamic is None else RowwiseDynamicInt8(dynamic[0]).eval()
