"""models.faces on the real MediaPipe model and the real portrait (app.loadtest.testmedia)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from alignment.types import AU_NAMES, VideoFrame
from app.loadtest import testmedia
from models.faces import FaceAUExtractor, FaceModelMissing, blendshapes_to_au


@pytest.fixture(scope="module")
def extractor():
    ex = FaceAUExtractor()
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def mouth_frames():
    """The talking-face frame with the mouth closed, half open and fully open."""
    return testmedia.talking_face_frames(np.array([0.0, 0.5, 1.0]))


def test_portrait_face_found_and_aus_in_range(extractor, mouth_frames):
    obs = extractor.extract_full(VideoFrame(0.5, mouth_frames[0]))
    assert obs.face and obs.pts == 0.5
    assert len(obs.au.au) == len(AU_NAMES)
    values = obs.au.vector()
    assert np.all(np.isfinite(values)) and values.min() >= 0.0 and values.max() <= 1.0
    assert values.max() > 0.0  # a real face activates something
    assert 0.0 <= obs.mouth_open <= 1.0
    assert obs.landmarks is not None and obs.landmarks.shape == (478, 3)
    assert len(obs.blendshapes) >= 50 and "jawOpen" in obs.blendshapes
    # The raw photo (not the letterboxed frame) works too: any frame size.
    assert extractor.extract(VideoFrame(0.0, testmedia.portrait())).face


def test_open_mouth_raises_au25_au26_and_mouth_open(extractor, mouth_frames):
    closed, _, opened = (extractor.extract_full(VideoFrame(i / 25, f)) for i, f in enumerate(mouth_frames))
    c, o = closed.au.as_dict(), opened.au.as_dict()
    assert o["AU25"] > c["AU25"] + 0.1, (c, o)
    assert o["AU26"] > c["AU26"] + 0.03, (c, o)
    assert opened.mouth_open > closed.mouth_open + 0.05, (closed.mouth_open, opened.mouth_open)


def test_blank_and_tiny_frames_have_no_face(extractor):
    for image in (np.zeros((360, 640, 3), np.uint8), np.full((8, 8, 3), 128, np.uint8)):
        obs = extractor.extract_full(VideoFrame(1.0, image))
        assert not obs.face and obs.au.face is False
        assert obs.au.au == (0.0,) * len(AU_NAMES) and obs.mouth_open == 0.0 and obs.landmarks is None


def test_large_grey_and_rgba_frames(extractor, mouth_frames):
    """Large frames are downscaled (same answer as the small one); grey and RGBA are accepted."""
    small = extractor.extract_full(VideoFrame(0.0, mouth_frames[2]))
    big_img = np.asarray(Image.fromarray(mouth_frames[2]).resize((1920, 1080), Image.Resampling.BICUBIC))
    big = extractor.extract_full(VideoFrame(0.0, big_img))
    assert big.face
    assert abs(big.mouth_open - small.mouth_open) < 0.03
    assert np.max(np.abs(big.au.vector() - small.au.vector())) < 0.15
    grey = np.asarray(Image.fromarray(mouth_frames[0]).convert("L"))
    assert extractor.extract(VideoFrame(0.0, grey)).face
    rgba = np.dstack([mouth_frames[0], np.full(mouth_frames[0].shape[:2], 255, np.uint8)])
    assert extractor.extract(VideoFrame(0.0, rgba)).face


def test_bad_frames_raise_clear_errors(extractor):
    with pytest.raises(ValueError, match="uint8"):
        extractor.extract(VideoFrame(0.0, np.zeros((64, 64, 3), np.float32)))
    with pytest.raises(ValueError, match="shape"):
        extractor.extract(VideoFrame(0.0, np.zeros((64, 64, 2), np.uint8)))


@pytest.mark.parametrize("mode", ["image", "video"])
def test_mouth_follows_speech_envelope(mode):
    """Lip evidence: over generated speech, mouth openness tracks the audio envelope, without lag.

    The face is drawn from the envelope at each frame's own time, so the true lag is zero.
    """
    speech = testmedia.synthesize_speech("we open the window at noon", lead_in_s=0.3)
    times = np.arange(0.0, speech.duration, 1 / 25)
    envelope = testmedia.speech_envelope(speech.samples, times)
    frames = testmedia.talking_face_frames(envelope)
    with FaceAUExtractor(running_mode=mode) as ex:
        obs = [ex.extract_full(VideoFrame(float(t), f)) for t, f in zip(times, frames, strict=True)]
    assert all(o.face for o in obs)
    mouth = np.array([o.mouth_open for o in obs])
    jaw = np.array([o.au.as_dict()["AU26"] for o in obs])
    corr = {
        lag: float(np.corrcoef(mouth[max(lag, 0) : len(mouth) + min(lag, 0)],
                               envelope[max(-lag, 0) : len(envelope) + min(-lag, 0)])[0, 1])
        for lag in (-2, -1, 0, 1, 2)
    }
    r_jaw = float(np.corrcoef(jaw, envelope)[0, 1])
    print(f"{mode}: corr(mouth_open, envelope) by frame lag {corr}; corr(AU26, envelope)={r_jaw:.3f}")
    assert max(corr, key=corr.get) == 0  # best aligned with no lag
    assert corr[0] > (0.9 if mode == "image" else 0.8)
    assert r_jaw > 0.5


def test_video_mode_accepts_repeated_and_backward_pts(mouth_frames):
    with FaceAUExtractor(running_mode="video") as ex:
        a = ex.extract(VideoFrame(1.0, mouth_frames[0]))
        b = ex.extract(VideoFrame(1.0, mouth_frames[0]))
        c = ex.extract(VideoFrame(0.5, mouth_frames[0]))
    assert a.face and b.face and c.face
    assert c.pts == 0.5  # the sample keeps the caller's pts; only MediaPipe's timestamp is bumped


def test_image_mode_is_deterministic(extractor, mouth_frames):
    a = extractor.extract_full(VideoFrame(0.0, mouth_frames[1]))
    b = extractor.extract_full(VideoFrame(0.0, mouth_frames[1]))
    assert a.au == b.au and a.mouth_open == b.mouth_open


def test_blendshape_mapping():
    scores = {"browInnerUp": 0.7, "mouthSmileLeft": 0.2, "mouthSmileRight": 0.6, "jawOpen": 0.5,
              "mouthClose": 0.4, "mouthLowerDownLeft": 0.3, "mouthLowerDownRight": 0.1, "noseSneerLeft": 2.0}
    au = dict(zip(AU_NAMES, blendshapes_to_au(scores), strict=True))
    assert au["AU1"] == pytest.approx(0.7)
    assert au["AU12"] == pytest.approx(0.4)  # bilateral pairs are averaged
    assert au["AU26"] == pytest.approx(0.5)
    assert au["AU25"] == pytest.approx(0.2)  # lower-lip depressor beats jawOpen cancelled by mouthClose
    assert au["AU9"] == 1.0  # clipped to [0, 1]
    assert au["AU2"] == au["AU4"] == au["AU15"] == 0.0
    assert blendshapes_to_au({}) == (0.0,) * len(AU_NAMES)


def test_missing_model_and_bad_options(tmp_path):
    with pytest.raises(FaceModelMissing) as info:
        FaceAUExtractor(model_path=tmp_path / "nope.task")
    message = str(info.value)
    assert "nope.task" in message and "\n" not in message
    with pytest.raises(ValueError, match="running_mode"):
        FaceAUExtractor(running_mode="live")  # type: ignore[arg-type]


def test_closed_extractor_refuses_work(mouth_frames):
    ex = FaceAUExtractor()
    ex.close()
    ex.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        ex.extract(VideoFrame(0.0, mouth_frames[0]))


def test_quiet_start_and_clean_exit():
    """No MediaPipe log spam on start and no 'Exception ignored in __del__' at interpreter exit."""
    code = (
        "import numpy as np\n"
        "from alignment.types import VideoFrame\n"
        "from app.loadtest.testmedia import talking_face_frames\n"
        "from models.faces import FaceAUExtractor\n"
        "ex = FaceAUExtractor(running_mode='video')\n"
        "ex2 = FaceAUExtractor()\n"
        "print(ex.extract(VideoFrame(0.0, talking_face_frames(np.array([0.0]))[0])).face)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
    assert "Exception ignored" not in proc.stderr, proc.stderr
    assert "inference_feedback_manager" not in proc.stderr and "XNNPACK" not in proc.stderr, proc.stderr


def test_one_extractor_per_thread_matches_sequential(extractor, mouth_frames):
    """Sessions in parallel threads, each with its own extractor, see what one extractor sees."""
    from concurrent.futures import ThreadPoolExecutor

    from models.faces import load_model_bytes

    assert load_model_bytes() is load_model_bytes()  # the .task bytes are read once per process
    expected = [extractor.extract(VideoFrame(0.0, f)).au for f in mouth_frames]

    def session(_: int) -> list[tuple[float, ...]]:
        with FaceAUExtractor() as ex:
            return [ex.extract(VideoFrame(0.0, f)).au for f in mouth_frames]

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(session, range(2)))
    for got in results:
        assert np.allclose(got, expected, atol=1e-4)
