"""models.video: the RenderRequest contract, create_renderer and the overlay renderer's pixels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alignment.types import AUSample, LoadEstimate, TokenRatePolicy, WordToken
from app.loadtest import testmedia
from models.video import (
    FrameRenderer,
    OverlayRenderer,
    RendererUnavailable,
    RenderRequest,
    create_renderer,
    fit_frame,
)

WORDS = tuple(
    WordToken(text, 0.5 + 0.3 * i, 0.75 + 0.3 * i, index=i)
    for i, text in enumerate("please send the report to my office".split())
)
HIGHLIGHT = np.array([255, 211, 77])


@pytest.fixture(scope="module")
def camera():
    return testmedia.talking_face_frames(np.array([0.4]))[0]


@pytest.fixture(scope="module")
def renderer():
    r = create_renderer("overlay")
    yield r
    r.close()


def request(camera, caption=WORDS, new=WORDS[-1:], au=None, load=None, sync_ok=True, size=(640, 360)):
    au = au if au is not None else AUSample(1.0, tuple(np.linspace(0.1, 0.9, 12)), True)
    return RenderRequest(20, 1.25, camera, caption, new, au, load, sync_ok, size=size)


def caption_band(img: np.ndarray) -> np.ndarray:
    h = img.shape[0]
    return img[int(h * 0.88) :].astype(int)


def count_colour(img: np.ndarray, colour: np.ndarray, tol: int = 30) -> int:
    return int(np.sum(np.all(np.abs(img.astype(int) - colour) <= tol, axis=-1)))


def test_create_renderer_gives_overlay(renderer):
    assert isinstance(renderer, OverlayRenderer) and isinstance(renderer, FrameRenderer)
    assert renderer.name == "overlay"
    with pytest.raises(ValueError, match="overlay"):
        create_renderer("vhs")


def test_svd_unavailable_is_a_clear_error():
    with pytest.raises(RendererUnavailable, match="svd"):
        create_renderer("svd")  # no weights given


def test_output_size_dtype_and_determinism(renderer, camera):
    img = renderer.render(request(camera))
    assert img.shape == (360, 640, 3) and img.dtype == np.uint8
    assert np.array_equal(img, renderer.render(request(camera)))


@pytest.mark.parametrize("size", [(321, 177), (1280, 720), (360, 640), (97, 45), (16, 16)])
def test_odd_sizes_and_no_camera(renderer, camera, size):
    for cam in (camera, None):
        img = renderer.render(request(cam, size=size))
        assert img.shape == (size[1], size[0], 3) and img.dtype == np.uint8


def test_caption_is_drawn(renderer, camera):
    with_words = caption_band(renderer.render(request(camera)))
    without = caption_band(renderer.render(request(camera, caption=(), new=())))
    changed = np.any(with_words != without, axis=-1).mean()
    assert changed > 0.03, changed
    # The new word is highlighted; without new words there is no highlight colour.
    assert count_colour(with_words, HIGHLIGHT) > 20
    quiet = caption_band(renderer.render(request(camera, new=())))
    assert count_colour(quiet, HIGHLIGHT) < count_colour(with_words, HIGHLIGHT) // 4


def test_new_word_shows_before_caption_catches_up(renderer, camera):
    img = renderer.render(request(camera, caption=(), new=WORDS[:1]))
    assert count_colour(caption_band(img), HIGHLIGHT) > 20


def test_long_caption_keeps_newest_words(renderer, camera):
    many = tuple(WordToken(f"word{i}", i * 0.2, i * 0.2 + 0.1, index=i) for i in range(60))
    img = renderer.render(request(camera, caption=many, new=many[-1:]))
    band = caption_band(img)
    cols = np.where(np.all(np.abs(band - HIGHLIGHT) <= 30, axis=-1).any(axis=0))[0]
    assert cols.size and cols.max() > img.shape[1] * 0.7  # the newest word is at the right, not cut off


def test_camera_letterboxed_and_background_when_none(renderer, camera):
    tall = np.full((400, 200, 3), 200, np.uint8)
    framed = fit_frame(tall, (640, 360))
    assert framed.shape == (360, 640, 3)
    assert np.all(framed[:, :100] == framed[0, 0]) and np.all(framed[180, 320] == 200)
    blank = fit_frame(None, (640, 360))
    assert np.all(blank == blank[0, 0])
    img = renderer.render(request(None, caption=()))
    middle = img[150:200, 200:260]
    assert middle.std() < 10  # neutral background, not noise


def test_au_bars_follow_values(renderer, camera):
    low = renderer.render(request(camera, au=AUSample(1.0, (0.05,) * 12, True)))
    high = renderer.render(request(camera, au=AUSample(1.0, (0.95,) * 12, True)))
    bar = np.array([86, 196, 214])
    panel = (slice(40, 230), slice(500, 640))
    assert count_colour(high[panel], bar, 12) > 4 * count_colour(low[panel], bar, 12)
    none = renderer.render(request(camera, au=AUSample(1.0, (0.9,) * 12, False)))
    assert count_colour(none[panel], bar, 12) == 0  # no face: no bars


def test_sync_badge_and_load(renderer, camera):
    corner = (slice(0, 40), slice(520, 640))
    green, red = np.array([40, 160, 88]), np.array([200, 52, 52])
    ok = renderer.render(request(camera, sync_ok=True))[corner]
    fail = renderer.render(request(camera, sync_ok=False))[corner]
    unknown = renderer.render(request(camera, sync_ok=None))[corner]
    assert count_colour(ok, green, 10) > 100 and count_colour(ok, red, 10) == 0
    assert count_colour(fail, red, 10) > 100 and count_colour(fail, green, 10) == 0
    assert count_colour(unknown, green, 10) == count_colour(unknown, red, 10) == 0
    policy = TokenRatePolicy(3.5, 40, 0.5)
    calm = renderer.render(request(camera, load=LoadEstimate(1.0, 0, (1, 0, 0, 0), policy)))
    busy = renderer.render(request(camera, load=LoadEstimate(1.0, 3, (0, 0, 0, 1), policy)))
    panel = (slice(30, 80), slice(0, 170))
    assert not np.array_equal(calm[panel], busy[panel])
    red_segment = np.array([226, 74, 70])
    assert count_colour(busy[panel], red_segment, 10) > count_colour(calm[panel], red_segment, 10)


def test_bad_input_is_a_clear_error(renderer, camera):
    with pytest.raises(ValueError, match="uint8"):
        renderer.render(request(camera.astype(np.float32)))
    with pytest.raises(ValueError, match="size"):
        renderer.render(request(camera, size=(0, 360)))
    grey = renderer.render(request(camera[:, :, 0]))
    assert grey.shape == (360, 640, 3)


@settings(max_examples=30, deadline=None)
@given(
    w=st.integers(16, 900),
    h=st.integers(16, 600),
    texts=st.lists(st.text(min_size=0, max_size=12), max_size=8),
    values=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=12, max_size=12),
    level=st.integers(-2, 6),
    sync_ok=st.sampled_from([True, False, None]),
)
def test_any_request_renders(w, h, texts, values, level, sync_ok):
    """Whatever the words, AU values or output size, the renderer returns a frame of that size."""
    words = tuple(WordToken(t, i * 0.1, i * 0.1 + 0.05, index=i) for i, t in enumerate(texts))
    load = LoadEstimate(0.0, level, (0.25, 0.25, 0.25, 0.25), TokenRatePolicy(2.0, 10, 0.5))
    req = RenderRequest(3, 0.1875, None, words, words[-1:], AUSample(0.0, tuple(values), True), load, sync_ok,
                        size=(w, h))
    img = OverlayRenderer().render(req)
    assert img.shape == (h, w, 3) and img.dtype == np.uint8
