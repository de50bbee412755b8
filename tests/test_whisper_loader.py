"""Whisper loading: the bundled CTranslate2 tiny.en converted in memory, and the variable-length encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import whisper
from whisper.model import AudioEncoder

from alignment.text import agreement_key
from models import whisper_loader
from models.whisper_loader import WhisperLoadError, load_whisper, mel_for, read_ct2_variables

OPTS = whisper.DecodingOptions(language="en", without_timestamps=True, fp16=False)


def _words(text: str) -> list[str]:
    return [w for w in (agreement_key(t) for t in text.split()) if w]


def _decode(model, audio: np.ndarray, context_s: float | None) -> str:
    with torch.inference_mode():
        return whisper.decode(model, mel_for(audio, context_s), OPTS).text


def test_resolves_bundled_model_once_per_process(whisper_model):
    assert isinstance(whisper_model, whisper.model.Whisper)
    assert load_whisper() is whisper_model
    assert not whisper_model.training
    assert next(whisper_model.parameters()).dtype == torch.float32
    assert whisper_model.dims.n_audio_state == 384 and whisper_model.dims.n_text_layer == 4
    assert int(whisper_model.alignment_heads.to_dense().sum()) == 8  # from the bundled config


def test_bundled_weights_transcribe_espeak_speech(whisper_model, speech):
    said = set(_words(_decode(whisper_model, speech.samples, None)))
    truth = [agreement_key(w.text) for w in speech.words]
    hits = sum(w in said for w in truth)
    assert hits >= len(truth) - 1, (said, truth)


def test_variable_length_encoder_matches_padded_decoding(whisper_model, speech):
    padded = _words(_decode(whisper_model, speech.samples, None))
    short = _words(_decode(whisper_model, speech.samples, speech.duration + 0.5))
    assert short == padded
    # With the full 30-s window the variable-length encoder is the stock encoder.
    mel = mel_for(speech.samples, None)[None]
    with torch.inference_mode():
        ours = whisper_model.encoder(mel)
        stock = AudioEncoder.forward(whisper_model.encoder, mel)
    assert torch.allclose(ours, stock)
    with torch.inference_mode():
        assert whisper_model.encoder(mel_for(speech.samples, 4.0)[None]).shape[1] == 200


def test_ct2_layout_key_projection_has_zero_bias():
    bundled = whisper_loader.bundled_model_dir()
    assert bundled is not None
    v = read_ct2_variables(bundled / "model.bin")
    assert v["encoder/conv1/weight"].shape == (384, 80, 3)
    qkv_bias = np.asarray(v["encoder/layer_0/self_attention/linear_0/bias"], np.float32)
    assert qkv_bias.shape == (1152,)
    assert not qkv_bias[384:768].any()  # what the conversion drops is really zero
    assert qkv_bias[:384].any()


def test_missing_explicit_path_is_a_clear_error(tmp_path):
    with pytest.raises(WhisperLoadError, match="no Whisper model"):
        load_whisper(str(tmp_path / "nope.pt"))
    with pytest.raises(WhisperLoadError, match="no model.bin"):
        load_whisper(str(tmp_path))


def test_mel_context_is_even_and_bounded():
    audio = np.zeros(16_000, np.float32)
    assert mel_for(audio, 1.5).shape == (80, 150)
    assert mel_for(audio, None).shape == (80, 3000)
    assert mel_for(np.zeros(40 * 16_000, np.float32), 1.0).shape == (80, 3000)


def test_word_timing_dtw_runs_serial_with_the_same_path(whisper_model):
    """openai-whisper's DTW is compiled without ``parallel`` (its spare threads spun in every ASR
    lane), and finds the same path as the parallel build on the same costs."""
    import numba
    import whisper.timing as wt

    assert whisper_loader.cache_word_timing_dtw()
    assert not wt.dtw_cpu.targetoptions.get("parallel")
    parallel = numba.jit(nopython=True, parallel=True)(wt.dtw_cpu.py_func)
    rng = np.random.default_rng(7)
    for shape in ((12, 40), (30, 150), (1, 5)):
        x = rng.standard_normal(shape).astype(np.float64)
        assert np.array_equal(wt.dtw_cpu(x), parallel(x)), shape
