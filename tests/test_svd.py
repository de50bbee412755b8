"""models.svd on CPU with a tiny randomly initialised SVD pipeline, saved and loaded like --svd-model PATH.

Random weights make noise-like pictures, but every part of the path is real: CLIP image encoder,
VAE encode/decode, the spatio-temporal UNet under the conditioning we compute, the Euler scheduler,
the rolling schedule, the overlay on top and the RTF-driven fallback.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from alignment.frames import FPS, attach_tokens, frame_pts, tokens_by_frame
from alignment.types import AU_NAMES, AUSample, LoadEstimate, TokenRatePolicy, WordToken
from models.video import RendererUnavailable, RenderRequest, create_renderer

torch = pytest.importorskip("torch")

GEN = (64, 64)
CLIP = 8


def _tiny_pipeline():
    from diffusers import (
        AutoencoderKLTemporalDecoder,
        EulerDiscreteScheduler,
        StableVideoDiffusionPipeline,
        UNetSpatioTemporalConditionModel,
    )
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(0)
    unet = UNetSpatioTemporalConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, in_channels=8, out_channels=4,
        down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
        up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
        cross_attention_dim=32, num_attention_heads=(2, 4), addition_time_embed_dim=16,
        projection_class_embeddings_input_dim=3 * 16, num_frames=CLIP,
    )
    # The scheduler settings of stabilityai/stable-video-diffusion-img2vid(-xt).
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", interpolation_type="linear",
        num_train_timesteps=1000, prediction_type="v_prediction", sigma_max=700.0, sigma_min=0.002,
        steps_offset=1, timestep_spacing="leading", timestep_type="continuous", use_karras_sigmas=True,
    )
    vae = AutoencoderKLTemporalDecoder(
        block_out_channels=(32, 32), in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
    )
    encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(
        hidden_size=32, projection_dim=32, num_hidden_layers=2, num_attention_heads=4, image_size=224,
        intermediate_size=37, patch_size=32,
    ))
    processor = CLIPImageProcessor(crop_size=224, size=224)
    return StableVideoDiffusionPipeline(vae=vae, image_encoder=encoder, unet=unet, scheduler=scheduler,
                                        feature_extractor=processor)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """One intra-op thread: on 2 shared cores it was 3-6x faster than two spinning threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


#: One Euler step without classifier-free guidance: the cheapest call that still runs every stage.
FAST = dict(steps=1, max_guidance_scale=1.0)


@pytest.fixture(scope="session")
def svd_dir(tmp_path_factory):
    """A tiny pipeline written to disk: the directory a user would pass as --svd-model PATH."""
    path = tmp_path_factory.mktemp("svd") / "tiny-svd"
    _tiny_pipeline().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_pipe(svd_dir):
    from models.svd import load_svd_pipeline

    return load_svd_pipeline(svd_dir, device="cpu")


def _words(speech) -> list[WordToken]:
    """Ground-truth tokens from espeak-ng onsets; a word ends where the next starts (last: +0.3 s)."""
    starts = [w.start for w in speech.words]
    ends = starts[1:] + [starts[-1] + 0.3]
    rows = zip(speech.words, starts, ends, strict=True)
    return [WordToken(w.text, s, e, index=i) for i, (w, s, e) in enumerate(rows)]


def _request(k: int, camera, caption=(), new=(), au=None, load=None, sync_ok=None, size=(96, 64)):
    return RenderRequest(index=k, pts=frame_pts(k), camera=camera, caption=tuple(caption),
                         new_words=tuple(new), au=au, load=load, sync_ok=sync_ok, size=size)


# --- conditioning (pure) -------------------------------------------------------------------------

def test_conditioning_follows_speech_mouth_and_load(speech):
    from models.svd_conditioning import SVDSettings, build_window, condition_clip

    words = _words(speech)
    settings = SVDSettings(steps=3, seed=7)
    silent = build_window(0, CLIP, words)  # 0 .. 0.48 s: inside the 0.5 s lead-in
    first = int(words[0].start * FPS)
    talking = build_window(first, CLIP, words)
    assert silent.speech == 0.0 and silent.words == ()
    assert talking.speech > 0.8 and talking.words[0] == words[0].text
    c_silent, c_talk = condition_clip(silent, 0, settings), condition_clip(talking, 1, settings)
    assert c_silent.motion_bucket_id == settings.motion_min
    assert c_talk.motion_bucket_id > c_silent.motion_bucket_id + 100
    assert (c_silent.fps, c_talk.fps) == (FPS, FPS)
    assert (c_silent.seed, c_talk.seed) == (7, 8) and c_talk.num_inference_steps == 3

    # An open mouth adds motion; a high cognitive load calms it (monotone, like the controller).
    open_mouth = AUSample(talking.start + 0.1, tuple(1.0 if n in ("AU25", "AU26") else 0.0 for n in AU_NAMES),
                          True)
    with_face = build_window(first, CLIP, words, aus=[open_mouth])
    assert with_face.mouth == 1.0
    assert condition_clip(with_face, 1, settings).motion_bucket_id >= c_talk.motion_bucket_id
    motions = []
    for level in range(4):
        load = LoadEstimate(0.0, level, (0.25,) * 4, TokenRatePolicy(3.0, 40, 0.7))
        motions.append(condition_clip(build_window(first, CLIP, words, load=load), 1, settings).motion_bucket_id)
    assert motions == sorted(motions, reverse=True) and motions[0] > motions[3]


def test_bad_settings_and_inputs_are_clear(svd_dir, tiny_pipe, tmp_path):
    from models.svd import SVDRenderer
    from models.svd_conditioning import SVDSettings

    with pytest.raises(ValueError, match="motion_min"):
        SVDSettings(motion_min=200, motion_max=100)
    with pytest.raises(RendererUnavailable, match="--svd-model"):
        create_renderer("svd")
    with pytest.raises(RendererUnavailable, match="model_index.json"):
        create_renderer("svd", model=tmp_path)
    with pytest.raises(RendererUnavailable, match="local Hugging Face cache"):
        create_renderer("svd", model="synchrony-tests/no-such-svd-model")
    with pytest.raises(ValueError, match="multiple of 8"):
        SVDRenderer(pipeline=tiny_pipe, gen_size=(60, 64))
    (tmp_path / "avatar.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot be read"):
        SVDRenderer(pipeline=tiny_pipe, avatar=tmp_path / "avatar.png", gen_size=GEN)


# --- the whole path ------------------------------------------------------------------------------

def test_offline_clips_pts_alignment_and_level3(svd_dir, av_clip):
    """Load through --svd-model PATH, render a talking-face clip offline, check pts, tokens and sync."""
    from models.svd_conditioning import SVDSettings

    words = [WordToken(w.text, w.start, w.start + 0.2, index=i) for i, w in enumerate(av_clip.words)]
    n_frames = 3 * CLIP
    t0 = words[0].start - 0.3  # start the session just before the speech so clips differ
    shift = int(round(t0 * FPS))
    words = [replace(w, start=w.start - shift / FPS, end=w.end - shift / FPS) for w in words]
    attached = attach_tokens(words, n_frames)
    by_frame = tokens_by_frame(attached)

    renderer = create_renderer("svd", model=str(svd_dir), device="cpu", gen_size=GEN, clip_frames=CLIP,
                               settings=SVDSettings(**FAST), realtime=False, size=(96, 64))
    try:
        renderer.plan(words)
        frames, sources = [], []
        for k in range(n_frames):
            src = min(int((k / FPS + shift / FPS) * av_clip.fps), len(av_clip.frames) - 1)
            shown = [w for w in words if w.start <= frame_pts(k) + 0.04]
            frames.append(renderer.render(_request(k, av_clip.frames[src], shown, by_frame.get(k, ()))))
            sources.append(renderer.last_source)
        report = renderer.report()
    finally:
        renderer.close()

    assert renderer.name == "svd" and sources == ["svd"] * n_frames
    assert all(f.shape == (64, 96, 3) and f.dtype == np.uint8 for f in frames)
    assert len(report.clips) == 3 and not report.fallback and report.late_frames == 0
    for i, clip in enumerate(report.clips):
        assert clip.first_frame == i * CLIP and clip.window.own
        assert clip.window.start == pytest.approx(max(frame_pts(i * CLIP) - 0.04, 0.0))
        assert clip.conditioning.fps == FPS and clip.rtf > 0
    # Clip 0 starts in silence, clip 1 is all speech: the motion conditioning follows the words.
    assert report.clips[1].window.speech > report.clips[0].window.speech
    assert report.clips[1].conditioning.motion_bucket_id > report.clips[0].conditioning.motion_bucket_id
    # Generated pictures move from frame to frame (a diffusion video, not the camera frame repeated).
    diffs = [np.abs(frames[k + 1][:40].astype(int) - frames[k][:40].astype(int)).mean() for k in range(CLIP - 1)]
    assert max(diffs) > 1.0
    # Token ↔ frame alignment and Level-3, unchanged, on the generated frames: each token's first
    # carrying frame is an SVD frame within ±40 ms of its onset, and audio/video/text agree within
    # 50 ms with the A/V offset taken from the input's flash/click markers (independent evidence).
    from alignment.evidence import estimate_offset
    from alignment.sync import Level3Validator
    from alignment.types import VideoFrame

    evidence = estimate_offset(av_clip.audio, 0.0,
                               [VideoFrame(i / av_clip.fps, f) for i, f in enumerate(av_clip.frames)])
    assert evidence.source == "markers"
    validator = Level3Validator()
    checked = [item for item in attached if item.frames]
    assert len(checked) >= 4
    for item in checked:
        assert abs(item.first_frame_pts - item.token.start) <= 0.040 + 1e-9
        assert sources[item.frames[0]] == "svd"
        verdict = validator.check_estimate(item.token, item.first_frame_pts, evidence)
        assert verdict.ok and verdict.evidence == "markers", verdict
        # Had the clip been presented one clip late, Level-3 would say so.
        late = validator.check_estimate(item.token, item.first_frame_pts + CLIP / FPS, evidence)
        assert not late.ok
    assert report.rtf_mean == pytest.approx(
        sum(c.n_frames for c in report.clips) / FPS / sum(c.gen_s for c in report.clips))


def test_realtime_keeps_ahead_then_falls_back(tiny_pipe):
    """Clip n+1 is generated while clip n plays; a required RTF it cannot meet switches to the overlay."""
    from models.svd import SVDRenderer, generate_clip
    from models.svd_conditioning import SVDSettings, build_window, condition_clip

    clip = 4
    settings = SVDSettings(**FAST)
    camera = (np.random.default_rng(0).random((48, 80, 3)) * 255).astype(np.uint8)
    cond = condition_clip(build_window(0, clip, []), 0, settings)
    gen_s = 0.0
    for _ in range(2):  # warm up, then take the slower of two (the machine is shared)
        t = time.perf_counter()
        generate_clip(tiny_pipe, camera, cond, clip, GEN)
        gen_s = max(gen_s, time.perf_counter() - t)
    period = 3.0 * gen_s / clip  # playout this slow leaves the worker time to stay one clip ahead

    renderer = SVDRenderer(pipeline=tiny_pipe, gen_size=GEN, clip_frames=clip, settings=settings,
                           realtime=True, min_rtf=1e6, fallback_after=3, size=(96, 64))
    sources, shown_at = [], []
    try:
        start = time.perf_counter()
        for k in range(4 * clip):
            time.sleep(max(start + k * period - time.perf_counter(), 0.0))
            shown_at.append(time.perf_counter())
            frame = renderer.render(_request(k, camera))
            assert frame.shape == (64, 96, 3)
            sources.append(renderer.last_source)
        report = renderer.report()
    finally:
        renderer.close()

    print(f"tiny SVD on CPU: {clip}-frame {GEN[0]}x{GEN[1]} clip in {gen_s:.3f} s; "
          f"RTF per clip {[round(c.rtf, 3) for c in report.clips]}; sources {sources}")
    # Clip 0 cannot exist before the first request: the overlay covers its start (counted late).
    assert sources[0] == "overlay" and report.late_frames >= 1
    # Clip 1 was generated while clip 0 played, and was ready when its first frame was due.
    c1 = next(c for c in report.clips if c.index == 1)
    assert sources[clip] == "svd"
    assert c1.started + c1.gen_s <= shown_at[clip]
    # Three measured clips all below the (unreachable) required RTF: fallback with a clear message,
    # and every later frame comes from the overlay.
    assert report.fallback and len(report.clips) == 3
    assert "cannot keep up" in report.message and "overlay" in report.message
    assert sources[-clip:] == ["overlay"] * clip
    assert report.frames_svd + report.frames_overlay == 4 * clip
    assert all(0 < c.rtf == pytest.approx(clip / FPS / c.gen_s) for c in report.clips)


def test_avatar_reference_and_no_reference(tiny_pipe, tmp_path):
    """Without a camera frame or avatar there is nothing to animate; an avatar file is used as given."""
    from PIL import Image

    from app.loadtest.testmedia import portrait
    from models.svd import SVDRenderer

    Image.fromarray(portrait()).save(tmp_path / "avatar.png")
    renderer = SVDRenderer(pipeline=tiny_pipe, gen_size=GEN, clip_frames=CLIP, realtime=False, size=(96, 64))
    try:
        renderer.render(_request(0, None))
        assert renderer.last_source == "overlay" and not renderer.report().clips
    finally:
        renderer.close()
    # Default guidance (classifier-free, 1 → 3 across the clip) with one step.
    renderer = SVDRenderer(pipeline=tiny_pipe, avatar=tmp_path / "avatar.png", gen_size=GEN, clip_frames=CLIP,
                           steps=1, realtime=False, captions=False, size=(96, 64))
    try:
        frame = renderer.render(_request(0, None))
        assert renderer.last_source == "svd" and frame.shape == (64, 96, 3)
        assert renderer.report().clips[0].window.own is False
        renderer.render(_request(3, None))
        # A lower index starts a new stream: clip 0 is generated again, nothing of the old one is shown.
        again = renderer.render(_request(0, None))
        assert renderer.last_source == "svd" and again.shape == (64, 96, 3)
        assert [c.index for c in renderer.report().clips].count(0) == 2
        assert renderer.report().frames_svd == 3
    finally:
        renderer.close()
    with pytest.raises(RuntimeError, match="closed"):
        renderer.render(_request(1, None))


def test_analyze_with_the_svd_backend(svd_dir, tmp_path):
    """`analyze --video-backend svd`: generated frames at 16 fps, words still attached and Level-3 checked."""
    import json

    from app.loadtest import testmedia
    from app.offline.analyze import AnalyzeOptions, analyze
    from app.offline.media_io import decode_media
    from models.svd_conditioning import SVDSettings

    clip = testmedia.make_av_clip(text="call me", lead_in_s=0.3, tail_s=0.4, size=(160, 96), markers=(0.1,))
    path = testmedia.write_av_file(tmp_path / "in.mp4", clip)
    options = AnalyzeOptions(out_dir=tmp_path / "out", progress=False, video_backend="svd", svd_model=str(svd_dir),
                             svd_options=dict(gen_size=GEN, clip_frames=CLIP, settings=SVDSettings(**FAST)))
    report, code = analyze(path, options)
    assert code == 0
    renderer = report["renderer"]
    assert renderer["backend"] == "svd" and not renderer["fallback"]
    assert renderer["frames_svd"] == report["output"]["frames"] and renderer["frames_overlay"] == 0
    assert report["tokens"] and all(t["frames"] for t in report["tokens"])
    assert report["sync"]["checked"] == len(report["tokens"])
    out = decode_media(tmp_path / "out" / "annotated.mp4")
    assert out.video_fps == pytest.approx(16, abs=0.01) and abs(len(out.frames) - report["output"]["frames"]) <= 1
    assert json.loads((tmp_path / "out" / "report.json").read_text())["renderer"] == report["renderer"]


def test_analyze_refuses_a_missing_svd_model(tmp_path, capsys):
    from app.cli import main
    from app.loadtest import testmedia

    clip = testmedia.make_av_clip(text="hi", lead_in_s=0.2, tail_s=0.2, size=(160, 96))
    path = testmedia.write_av_file(tmp_path / "in.mp4", clip)
    code = main(["analyze", str(path), "--out", str(tmp_path / "o"), "--video-backend", "svd",
                 "--svd-model", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("synchrony analyze:") and "\n" not in err
