"""The SVD avatar on CPU: real festival phrases planned per frame, real drawings, the tiny random SVD pipeline.

A hook on the UNet's forward reads what the denoiser is actually given: channels 4-7 of frame i must
be the VAE latent of frame i's own drawing (the stock pipeline would give every frame one image's).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from alignment.frames import FPS, TOLERANCE_S, frame_pts, frames_for_time
from alignment.types import SpokenPhone, SpokenPhrase, SpokenWord
from models.avatar_plan import plan_answer
from models.render import RendererUnavailable
from models.tts import festival
from models.visemes import REST, mouth_at, timeline

torch = pytest.importorskip("torch")

GEN = (64, 64)
CLIP = 8
#: No noise augmentation and one Euler step: the conditioning latents are exactly the drawings'.
EXACT = dict(steps=1, noise_aug_strength=0.0)

from tests.test_svd import _one_torch_thread  # noqa: E402, F401  (autouse: one torch thread, as there)

needs_festival = pytest.mark.skipif(not festival.available(), reason="festival slt_hts not installed")


@pytest.fixture(scope="module")
def pipe():
    from tests.test_svd import _tiny_pipeline

    p = _tiny_pipeline()
    p.set_progress_bar_config(disable=True)
    return p.to("cpu")


@pytest.fixture(scope="module")
def phrases() -> list[SpokenPhrase]:
    """Two phrases of an answer, spoken by the answer voice (festival, with word and phone times)."""
    async def say() -> list[SpokenPhrase]:
        tts = festival.FestivalTTS(processes=1)
        try:
            rate = festival.NATURAL_WPM[tts.voice]
            return [await tts.synthesize("Maybe we could meet by the lake.", rate),
                    await tts.synthesize("About five o'clock.", rate)]
        finally:
            await tts.aclose()

    if not festival.available():
        pytest.skip("festival slt_hts not installed")
    return asyncio.run(say())


def _expected_latent(pipe, drawing: np.ndarray):
    """What the stock pipeline feeds the UNet for one reference image (preprocess, VAE mode)."""
    from PIL import Image

    h, w = drawing.shape[:2]
    image = pipe.video_processor.preprocess(Image.fromarray(drawing), height=h, width=w)
    with torch.no_grad():
        return pipe.vae.encode(image).latent_dist.mode()[0]


# --- the plan (pure) ---------------------------------------------------------------------------------

@needs_festival
def test_each_word_first_shows_on_the_frame_within_40_ms_of_its_start(phrases):
    t0 = 0.53
    gap = 0.4  # the player left a gap before the second phrase
    starts = [t0, t0 + phrases[0].duration + gap]
    plan = plan_answer(phrases, t0, starts)
    words = [(s + w.start, w.text) for s, ph in zip(starts, phrases, strict=True) for w in ph.words]
    assert [t.token.text for t in plan.tokens] == [text for _, text in words]
    assert plan.first_frame == frames_for_time(t0)[0] and [f.index for f in plan.frames] == list(
        range(plan.first_frame, plan.last_frame + 1))
    for (start, text), item in zip(words, plan.tokens, strict=True):
        carrying = [f.index for f in plan.frames if item.token in f.tokens]
        first = carrying[0]
        assert abs(frame_pts(first) - start) <= TOLERANCE_S + 1e-9
        assert first == frames_for_time(start)[0] and tuple(carrying) == frames_for_time(start)
        # The caption shows the word from that frame on, highlighted there, and not on the frame before.
        here = plan.condition(first)
        assert here.caption[here.highlight] == here.caption[-1] == text
        assert plan.condition(first - 1).caption[-1:] != (text,)  # no word repeats in these phrases
    # Mouth per frame: the phrase's mouth_at at that pts (REST in the gap and outside the answer).
    for f in plan.frames:
        ph, s = (phrases[1], starts[1]) if f.pts >= starts[1] else (phrases[0], starts[0])
        inside = s <= f.pts < s + ph.duration
        want = mouth_at(timeline(ph.phones), f.pts - s, frame_s=1 / FPS) if inside else REST
        assert f.mouth == want
    assert any(f.mouth.open > 0.5 for f in plan.frames) and any(f.mouth.open == 0 for f in plan.frames)
    after, before = plan.condition(plan.last_frame + 5), plan.condition(plan.first_frame - 1)
    assert after.mouth == REST and after.tokens == () and after.caption == plan.frames[-1].caption
    assert before.mouth == REST and before.caption == () and before.highlight is None
    # A phrase more (the player plans as phrases start) changes no frame before it can carry its first word,
    # so the clips made for the first phrase stay valid (SVDAvatar.play keeps them).
    alone = plan_answer(phrases[0], t0)
    for both in (plan, plan_answer(phrases, t0)):  # with the gap, and back to back
        second = both.tokens[len(phrases[0].words)].frames[0]
        assert all(alone.condition(k) == both.condition(k) for k in range(plan.first_frame, second))


def test_bad_answers_are_clear_errors():
    phones = (SpokenPhone("pau", 0.0, 0.1), SpokenPhone("hh", 0.1, 0.2), SpokenPhone("ay", 0.2, 0.4))
    ok = SpokenPhrase("Hi.", np.zeros(6400, np.float32), 16000, (SpokenWord("Hi.", 0.1, 0.4),), phones)
    assert plan_answer(ok, 1.0).tokens[0].token.start == pytest.approx(1.1)
    with pytest.raises(ValueError, match="empty answer"):
        plan_answer([], 0.0)
    with pytest.raises(ValueError, match="has no phones"):
        plan_answer(replace(ok, phones=()), 0.0)
    with pytest.raises(ValueError, match="has no words"):
        plan_answer(replace(ok, words=()), 0.0)
    with pytest.raises(ValueError, match="session time >= 0"):
        plan_answer(ok, float("nan"))
    with pytest.raises(ValueError, match="2 phrases but 1 start"):
        plan_answer([ok, ok], 0.0, [0.0])
    with pytest.raises(ValueError, match="end before the next"):
        plan_answer([ok, ok], 0.0, [0.0, 0.1])
    with pytest.raises(ValueError, match="unknown festival phone"):
        plan_answer(replace(ok, phones=(SpokenPhone("qq", 0.0, 0.4),)), 0.0)


def test_missing_model_and_bad_references_are_clear(pipe, tmp_path):
    from models.svd_avatar import SVDAvatar, generate_conditioned_clip
    from models.svd_conditioning import SVDSettings, build_window, condition_clip

    with pytest.raises(RendererUnavailable, match="--svd-model"):
        SVDAvatar()
    with pytest.raises(RendererUnavailable, match="model_index.json"):
        SVDAvatar(tmp_path)
    with pytest.raises(RendererUnavailable, match="local Hugging Face cache"):
        SVDAvatar("synchrony-tests/no-such-svd-model")
    cond = condition_clip(build_window(0, CLIP, []), 0, SVDSettings(**EXACT))
    with pytest.raises(ValueError, match="uint8 RGB frames"):
        generate_conditioned_clip(pipe, np.zeros((CLIP, 64, 64), np.uint8), cond)
    with pytest.raises(ValueError, match="multiple of 8"):
        generate_conditioned_clip(pipe, np.zeros((CLIP, 60, 64, 3), np.uint8), cond)


# --- the generation ----------------------------------------------------------------------------------

def _clip_with_closed_and_open(plan):
    for n in plan.clip_indices(CLIP):
        opens = [plan.condition(k).mouth.open for k in range(n * CLIP, (n + 1) * CLIP)]
        if min(opens) == 0.0 and max(opens) > 0.5:
            return n, opens
    raise AssertionError("no clip with both a closed and an open mouth")


@needs_festival
@pytest.mark.parametrize("guided", [False, True])
def test_unet_sees_each_frames_own_drawing(pipe, phrases, guided):
    """Channels 4-7 of frame i are frame i's drawing's VAE latent; closed and open mouths differ."""
    from PIL import Image

    from models.avatar import AvatarRenderer
    from models.svd_avatar import make_avatar_clip
    from models.svd_conditioning import SVDSettings

    plan = plan_answer(phrases[0], 0.5)
    n, opens = _clip_with_closed_and_open(plan)
    avatar = AvatarRenderer(GEN)
    settings = SVDSettings(**EXACT, max_guidance_scale=3.0 if guided else 1.0)
    seen = []
    hook = pipe.unet.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append((args[0].detach().clone(), kwargs["encoder_hidden_states"].clone())),
        with_kwargs=True)
    try:
        clip = make_avatar_clip(pipe, avatar, plan, n, CLIP, settings)
    finally:
        hook.remove()
    assert clip.frames.shape == (CLIP, GEN[1], GEN[0], 3) and clip.frames.dtype == np.uint8
    assert len(seen) == 1  # one Euler step
    sample, embeddings = seen[0]
    assert sample.shape[:3] == (2 if guided else 1, CLIP, 8)
    cond = sample[-1, :, 4:8]
    for i, k in enumerate(range(n * CLIP, (n + 1) * CLIP)):
        c = plan.condition(k)
        drawing = avatar.draw(c.mouth, c.caption, c.highlight, t=frame_pts(k))
        torch.testing.assert_close(cond[i], _expected_latent(pipe, drawing), atol=1e-5, rtol=1e-4)
    if guided:  # the unconditional half gets zeros, as in the stock pipeline
        assert torch.count_nonzero(sample[0, :, 4:8]) == 0
    closed, opened = int(np.argmin(opens)), int(np.argmax(opens))
    assert (cond[closed] - cond[opened]).abs().max() > 1e-3
    if not guided:  # the control: the stock pipeline repeats one latent, so the check above tells them apart
        from models.svd import generate_clip

        stock = []
        hook = pipe.unet.register_forward_pre_hook(lambda _m, args: stock.append(args[0].detach().clone()))
        try:
            generate_clip(pipe, avatar.draw(plan.condition(n * CLIP).mouth), clip.conditioning, CLIP, GEN)
        finally:
            hook.remove()
        assert torch.equal(stock[0][0, closed, 4:8], stock[0][0, opened, 4:8])
    # The CLIP embedding is the neutral face's, for every frame.
    with torch.no_grad():
        neutral = pipe._encode_image(Image.fromarray(avatar.draw(REST)), "cpu", 1, guided)
    torch.testing.assert_close(embeddings, neutral)


@needs_festival
def test_svd_avatar_serves_generated_frames_and_draws_the_rest(pipe, phrases):
    from models.svd_avatar import SVDAvatar
    from models.svd_conditioning import SVDSettings

    plan = plan_answer(phrases[0], 0.5)
    avatar = SVDAvatar(pipeline=pipe, gen_size=GEN, size=(96, 64), clip_frames=CLIP,
                       settings=SVDSettings(steps=1, max_guidance_scale=1.0), ahead_clips=1)
    try:
        assert avatar.frame(0).shape == (64, 96, 3)  # no answer: the resting face, drawn on the CPU
        avatar.play(plan)
        first = plan.first_frame
        frame = avatar.frame(first, wait_s=300)
        report = avatar.report()
        assert frame.shape == (64, 96, 3) and report.frames_svd == 1 and report.clips == 1
        avatar.play(plan)  # the same answer again (a phrase more would extend it): the clip stays valid
        avatar.frame(first + 1 if (first + 1) % CLIP else first, wait_s=0)
        assert avatar.report().frames_svd == 2 and avatar.report().clips == 1
        avatar.stop()  # barge-in: the rest of the frames rest
        rest = avatar.frame(first + CLIP)
        assert rest.shape == (64, 96, 3) and avatar.report().frames_cpu == 2 and avatar.report().message is None
        assert all(r > 0 for r in avatar.report().rtf_per_clip)
    finally:
        avatar.close()
    with pytest.raises(RuntimeError, match="closed"):
        avatar.frame(0)
