"""The page in a real headless Chromium: fake camera (talking-face y4m) and microphone (espeak wav).

Chromium plays the generated files as its camera and microphone, the page's script posts a WHIP
offer to our server, and the page must show the recognised words, live AU values and play the
returned video. A screenshot of the result is saved under the test's tmp dir, and to
docs/screenshot.png when ``SYNCHRONY_SCREENSHOT=1`` (so ordinary runs leave the tree clean).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.live.server import ServerConfig, create_app, running_server
from app.loadtest import testmedia
from tests.live_fixtures import live_stages  # noqa: F401 - shared session fixture

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def write_y4m(path: Path, frames: list[np.ndarray], fps: int) -> Path:
    """Frames as a YUV4MPEG2 (I420) file: what Chromium's fake capture device reads."""
    import av

    h, w = frames[0].shape[:2]
    with open(path, "wb") as fh:
        fh.write(f"YUV4MPEG2 W{w} H{h} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
        for img in frames:
            yuv = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
            fh.write(b"FRAME\n")
            fh.write(yuv.to_ndarray().tobytes())
    return path


@pytest.fixture(scope="module")
def fake_media(tmp_path_factory, av_clip):
    d = tmp_path_factory.mktemp("chromium-media")
    y4m = write_y4m(d / "face.y4m", av_clip.frames, int(av_clip.fps))
    wav = d / "speech.wav"
    testmedia.write_wav(wav, testmedia.resample(av_clip.audio, 16_000, 48_000), rate=48_000)
    return y4m, wav


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed (make system)")
async def test_page_shows_words_aus_and_returned_video(live_stages, fake_media, av_clip, tmp_path):  # noqa: F811
    from playwright.async_api import async_playwright

    y4m, wav = fake_media
    expected = {"".join(ch for ch in w.text.lower() if ch.isalpha()) for w in av_clip.words if len(w.text) > 2}
    app = create_app(ServerConfig(), stages=live_stages)
    args = [
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-video-capture={y4m}", f"--use-file-for-fake-audio-capture={wav}",
        "--disable-features=WebRtcHideLocalIpsWithMdns", "--allow-loopback-in-peer-connection",
        "--no-sandbox", "--disable-gpu",
        "--disable-background-networking", "--disable-component-update", "--no-first-run",
        "--autoplay-policy=no-user-gesture-required",
    ]
    async with running_server(app) as base, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 1080})
            logs: list[str] = []
            page.on("console", lambda msg: logs.append(msg.text))
            await page.goto(f"{base}/", wait_until="domcontentloaded")
            await page.wait_for_selector("#sy-start", timeout=60_000)
            await page.wait_for_function("window.synchrony !== undefined", timeout=30_000)
            await page.click("#sy-start")
            await page.wait_for_function(
                "[...document.querySelectorAll('.sy-au-val')].some(e => parseFloat(e.dataset.value) > 0.02)",
                timeout=60_000,
            )
            # The fake devices loop the clip, so a word missed on one pass can be heard on the next.
            await page.wait_for_function(
                """expected => {
                    const norm = s => s.toLowerCase().replace(/[^a-z]/g, "");
                    const heard = new Set([...document.querySelectorAll('#sy-transcript .sy-final')]
                        .map(e => norm(e.dataset.text)));
                    return expected.filter(w => heard.has(w)).length >= 2;
                }""",
                arg=sorted(expected), timeout=120_000,
            )
            await page.wait_for_function(
                "(() => { const v = document.getElementById('sy-remote');"
                " return v.videoWidth > 0 && v.currentTime > 1.0 && !v.paused; })()",
                timeout=60_000,
            )
            finals = page.locator("#sy-transcript .sy-final")
            words = [await finals.nth(i).get_attribute("data-text") for i in range(await finals.count())]
            heard = {"".join(ch for ch in w.lower() if ch.isalpha()) for w in words}
            assert len(heard & expected) >= 2, (words, logs[-5:])
            times = await page.locator("#sy-transcript .sy-final sub").all_inner_texts()
            assert all("–" in t for t in times)  # each word shows its start–end
            remote = await page.evaluate(
                "(() => { const v = document.getElementById('sy-remote');"
                " return [v.videoWidth, v.videoHeight, v.currentTime]; })()"
            )
            assert remote[0] == 640 and remote[1] == 360
            face = await page.locator("#sy-face").inner_text()
            assert face.startswith("face at")
            await page.wait_for_timeout(1500)  # let the returned video show the latest captions
            shot = ROOT / "docs" / "screenshot.png" if os.environ.get("SYNCHRONY_SCREENSHOT") else tmp_path / "page.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 50_000  # a rendered page, not a blank one
            await page.click("#sy-stop")
            await page.wait_for_timeout(300)
        finally:
            await browser.close()
    assert app.state.sessions == {}
