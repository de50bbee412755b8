"""The lean decoder pass computes what whisper's TextDecoder computes, on the real tiny.en weights."""

from __future__ import annotations

import copy

import pytest
import torch

from models.int8 import RowInt8Linear, int8_copy, int8_projection
from models.whisper_decoder import DecoderPass
from models.whisper_loader import mel_for


@pytest.fixture(scope="module")
def window(whisper_model, speech):
    """Encoded audio of the fixture sentence and its greedy tokens from whisper's own decoder."""
    import whisper.tokenizer

    tok = whisper.tokenizer.get_tokenizer(False, language="en", task="transcribe")
    with torch.inference_mode():
        feats = whisper_model.encoder(mel_for(speech.samples, speech.duration + 0.5)[None])
        sot = list(tok.sot_sequence_including_notimestamps)
        tokens = list(sot)
        for _ in range(12):  # greedy, whisper's decoder, no cache, up to the end of text
            nxt = int(whisper_model.decoder(torch.tensor([tokens]), feats)[0, -1].argmax())
            if nxt == tok.eot:
                break
            tokens.append(nxt)
    return feats, tokens, tok, len(sot)


def _reference(whisper_model, feats, tokens):
    """Logits and per-layer cross-attention logits of whisper's decoder over ``tokens``."""
    qks: list[torch.Tensor] = []
    hooks = [b.cross_attn.register_forward_hook(lambda _m, _i, out: qks.append(out[1][0]))
             for b in whisper_model.decoder.blocks]
    try:
        with torch.inference_mode():
            from whisper.model import disable_sdpa

            with disable_sdpa():
                logits = whisper_model.decoder(torch.tensor([tokens]), feats)[0]
    finally:
        for h in hooks:
            h.remove()
    return logits, qks


def test_one_pass_matches_whisper_logits_and_cross_attention(whisper_model, window):
    feats, tokens, tok, n_sot = window
    assert tok.decode(tokens[n_sot:]).lower().startswith(" please send")  # the window is real speech
    ref_logits, ref_qk = _reference(whisper_model, feats, tokens)
    emb = whisper_model.decoder.token_embedding.weight
    with torch.inference_mode():
        state = DecoderPass(whisper_model.decoder, feats, max_len=64)
        logits = state.feed(tokens) @ emb.T
    assert torch.allclose(logits, ref_logits, atol=2e-3, rtol=0)
    assert [int(i) for i in logits.argmax(-1)] == [int(i) for i in ref_logits.argmax(-1)]
    for got, want in zip(state.cross_attention(), ref_qk, strict=True):
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=2e-3, rtol=0)


def _passes(whisper_model, feats, tokens, blocks=None):
    """Hidden states and cross-attention of ``tokens`` fed at once, one at a time, and after a
    wrong draft was cut back."""
    def new() -> DecoderPass:
        return DecoderPass(whisper_model.decoder, feats, max_len=64, blocks=blocks)

    with torch.inference_mode():
        whole = new()
        h_all = whole.feed(tokens)
        steps = new()
        h_steps = torch.cat([steps.feed(tokens[:4])] + [steps.feed([t]) for t in tokens[4:]])
        cut = new()
        cut.feed(tokens[:6] + [tokens[6] + 1, 50256, 11])  # a wrong draft after six tokens
        cut.truncate(6)
        h_cut = torch.cat([h_all[:6], cut.feed(tokens[6:])])
    return (h_all, h_steps, h_cut), (whole.cross_attention(), steps.cross_attention(), cut.cross_attention())


def test_stepwise_feeding_and_truncation_equal_one_pass(whisper_model, window):
    """Feeding one token at a time, or cutting back a rejected draft and feeding again, gives the
    hidden states and cross-attention that feeding everything at once gives."""
    feats, tokens, _, _ = window
    (h_all, h_steps, h_cut), (qk_all, qk_steps, qk_cut) = _passes(whisper_model, feats, tokens)
    assert torch.allclose(h_steps, h_all, atol=1e-4)
    assert torch.allclose(h_cut, h_all, atol=1e-4)
    for a, b, c in zip(qk_all, qk_steps, qk_cut, strict=True):
        assert a.shape == b.shape == c.shape == (a.shape[0], len(tokens), feats.shape[1])
        assert torch.allclose(a, b, atol=1e-4) and torch.allclose(a, c, atol=1e-4)


def test_int8_blocks_choose_the_fp32_tokens_however_fed(whisper_model, window):
    """The int8 copy of the blocks (streaming) picks the tokens the fp32 decoder picks, fed at
    once, step by step or after a cut-back draft. Its values are another computation: a float
    rounding difference upstream can flip an int8 rounding, so they are not compared exactly."""
    feats, tokens, _, _ = window
    emb = whisper_model.decoder.token_embedding.weight
    blocks = int8_copy(whisper_model.decoder.blocks, rowwise=True)
    assert blocks is not None and any(isinstance(m, RowInt8Linear) for m in blocks.modules())
    with torch.inference_mode():
        exact = DecoderPass(whisper_model.decoder, feats, max_len=64).feed(tokens) @ emb.T
        hidden, _ = _passes(whisper_model, feats, tokens, blocks)
    want = [int(i) for i in exact.argmax(-1)]
    for h in hidden:
        assert [int(i) for i in (h @ emb.T).argmax(-1)] == want
    assert not torch.allclose(hidden[0] @ emb.T, exact, atol=1e-4)  # it really is another computation


def test_a_full_context_is_a_clear_error(whisper_model, window):
    feats, tokens, _, _ = window
    state = DecoderPass(whisper_model.decoder, feats, max_len=len(tokens))
    with torch.inference_mode():
        state.feed(tokens)
        with pytest.raises(ValueError, match="context full"):
            state.feed([tokens[-1]])


def test_row_int8_rows_do_not_depend_on_their_batch():
    """RowInt8Linear scales each row on its own and accumulates in integers: a row batched with
    others comes out bit for bit as alone, and close to the fp32 layer."""
    torch.manual_seed(0)
    fp32 = torch.nn.Linear(384, 1536)
    lin = RowInt8Linear(fp32)
    x = torch.randn(9, 384)
    x[3] *= 40  # a loud row must not change how its neighbours round
    with torch.inference_mode():
        batched = lin(x)
        alone = torch.cat([lin(r[None]) for r in x])
        assert torch.equal(batched, alone)
        exact = fp32(x)
        rel = (batched - exact).abs().amax(1) / exact.abs().amax(1)
    assert float(rel.max()) < 0.03


def test_stacked_int8_projections_equal_the_separate_ones(whisper_model, window):
    """The int8 copy gives each attention its query/key/value stacked into one layer; the stacked
    layer and a DecoderPass that uses it compute exactly what the separate layers compute."""
    torch.manual_seed(0)
    parts = [RowInt8Linear(torch.nn.Linear(384, 384, bias=b)) for b in (True, False, True)]
    x = torch.randn(7, 384)
    with torch.inference_mode():
        assert torch.equal(RowInt8Linear.stacked(parts)(x), torch.cat([p(x) for p in parts], -1))
    feats, tokens, _, _ = window
    blocks = int8_copy(whisper_model.decoder.blocks, rowwise=True)
    assert blocks is not None and all(hasattr(b.attn, "qkv") and hasattr(b.cross_attn, "kv") for b in blocks)
    separate = copy.deepcopy(blocks)
    for m in separate.modules():
        for name in ("qkv", "kv"):
            if hasattr(m, name):
                delattr(m, name)
    with torch.inference_mode():
        a = DecoderPass(whisper_model.decoder, feats, max_len=64, blocks=blocks)
        b = DecoderPass(whisper_model.decoder, feats, max_len=64, blocks=separate)
        assert torch.equal(a.feed(tokens), b.feed(tokens))
        assert all(torch.equal(p, q) for p, q in zip(a.cross_attention(), b.cross_attention(), strict=True))


def test_rowwise_feeding_equals_one_token_feeds_bit_for_bit(whisper_model, window):
    """A ``rowwise`` feed of several tokens (int8 blocks) gives every row, and its cross-attention,
    exactly what feeding those tokens one at a time gives: a verified guess changes no bit."""
    feats, tokens, _, _ = window
    blocks = int8_copy(whisper_model.decoder.blocks, rowwise=True)
    with torch.inference_mode():
        steps = DecoderPass(whisper_model.decoder, feats, max_len=64, blocks=blocks)
        rows = DecoderPass(whisper_model.decoder, feats, max_len=64, blocks=blocks)
        steps.feed(tokens[:4])
        rows.feed(tokens[:4])
        h_steps = torch.cat([steps.feed([t]) for t in tokens[4:]])
        h_rows = rows.feed(tokens[4:], rowwise=True)
        assert torch.equal(h_rows, h_steps)
        assert all(torch.equal(a, b) for a, b in zip(rows.cross_attention(), steps.cross_attention(), strict=True))


def test_int8_projection_rows_equal_one_row_calls(whisper_model):
    """The int8 vocabulary projection computes each row of a batch exactly as a one-row call (its
    own dynamic scale and zero point), whatever the rows' ranges and signs."""
    proj = int8_projection(whisper_model.decoder.token_embedding.weight)
    assert proj is not None
    torch.manual_seed(0)
    x = torch.randn(7, 384) * torch.tensor([[0.05], [1.0], [3.0], [9.0], [1.0], [1.0], [0.5]])
    x[4] = x[4].abs()  # no negative value
    x[5] = -x[5].abs() - 2.0  # no positive value
    x[6] = whisper_model.decoder.ln(x[6])
    with torch.inference_mode():
        batched = proj(x)
        alone = torch.cat([proj(r[None]) for r in x])
    assert torch.equal(batched, alone)
    exact = x[6] @ whisper_model.decoder.token_embedding.weight.T  # a decoder-like row
    assert float((batched[6] - exact).abs().amax() / exact.abs().amax()) < 0.15  # approximate; _pick re-scores
