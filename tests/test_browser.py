"""The page in a real headless Chromium: fake camera (talking-face y4m) and microphone (a speech wav).

Chromium plays the generated files as its camera and microphone, the page's script posts a WHIP
offer to our server, and the page must show the recognised words, live AU values and play the
returned video. With a server that speaks its answers (festival), the page must also play the answer
out loud (its element's audio, read through WebAudio in the page, is not silent), show the avatar with a
moving mouth (its frames sampled into a canvas: the dark pixels of the mouth come and go), light the
spoken words and keep the microphone's echo cancellation on. Screenshots are saved under the test's tmp
dir, and to docs/ when ``SYNCHRONY_SCREENSHOT=1`` (so ordinary runs leave the tree clean).
"""

from __future__ import annotations

import base64
import dataclasses
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


CHROMIUM_ARGS = [
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
    "--disable-features=WebRtcHideLocalIpsWithMdns", "--allow-loopback-in-peer-connection",
    "--no-sandbox", "--disable-gpu",
    "--disable-background-networking", "--disable-component-update", "--no-first-run",
    "--autoplay-policy=no-user-gesture-required",
]


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
    app = create_app(ServerConfig.in_process(), stages=live_stages)
    args = [*CHROMIUM_ARGS, f"--use-file-for-fake-video-capture={y4m}", f"--use-file-for-fake-audio-capture={wav}"]
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


# --- the spoken answer -------------------------------------------------------------------------------

_LISTEN = """async ms => {
    // The answer element's audio through WebAudio: its RMS every 50 ms, in dBFS.
    const el = document.getElementById('sy-answer');
    const ctx = new AudioContext();
    await ctx.resume();
    const src = ctx.createMediaStreamSource(el.srcObject);
    const an = ctx.createAnalyser();
    an.fftSize = 2048;
    src.connect(an);
    const buf = new Float32Array(an.fftSize);
    const out = [];
    for (let t = 0; t < ms; t += 50) {
        an.getFloatTimeDomainData(buf);
        let s = 0;
        for (const x of buf) s += x * x;
        out.push(10 * Math.log10(s / buf.length + 1e-20));
        await new Promise(r => setTimeout(r, 50));
    }
    ctx.close();
    return out;
}"""

_WATCH = """async ([ms, w, h]) => {
    // The answer element's video into a canvas every 62 ms: the frames' luma, base64.
    const el = document.getElementById('sy-answer');
    const c = document.createElement('canvas');
    c.width = w; c.height = h;
    const g = c.getContext('2d', { willReadFrequently: true });
    const out = [];
    for (let t = 0; t < ms; t += 62) {
        g.drawImage(el, 0, 0, w, h);
        const d = g.getImageData(0, 0, w, h).data;
        const y = new Uint8Array(w * h);
        for (let i = 0; i < w * h; i++) y[i] = (77 * d[4 * i] + 150 * d[4 * i + 1] + 29 * d[4 * i + 2]) >> 8;
        let bin = '';
        for (let i = 0; i < y.length; i++) bin += String.fromCharCode(y[i]);
        out.push(btoa(bin));
        await new Promise(r => setTimeout(r, 62));
    }
    return out;
}"""


@pytest.fixture(scope="module")
def speaking_stages(live_stages):  # noqa: F811
    """The shared stages with the answer's voice (festival slt_hts, the avatar) and the assistant responder."""
    from app.live.warmup import WarmState, _warm_voice
    from models.responders import AssistantResponder

    state = WarmState()
    _warm_voice(ServerConfig.in_process(ui=False, tts="festival"), state)
    return dataclasses.replace(live_stages, voice=state.stages.voice, make_responder=AssistantResponder)


@pytest.fixture(scope="module")
def user_speech(tmp_path_factory):
    """The fake microphone: a question in festival's kal_diphone (not the answers' voice), then 9 s of
    silence for the answer to play in; Chromium loops it."""
    from app.loadtest import festival

    if not festival.available("kal_diphone"):
        pytest.skip("festival voice kal_diphone is not installed (make system)")
    speech = festival.synthesize_festival("what is the weather like today", "kal_diphone", lead_in_s=0.8).samples
    audio = np.concatenate([speech, np.zeros(9 * 16_000, np.float32)])
    wav = tmp_path_factory.mktemp("chromium-answer") / "question.wav"
    testmedia.write_wav(wav, testmedia.resample(audio, 16_000, 48_000), rate=48_000)
    return wav


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed (make system)")
async def test_page_speaks_the_answer_with_a_moving_mouth(speaking_stages, fake_media, user_speech, tmp_path):
    from playwright.async_api import async_playwright

    from app.loadtest import answers as ans

    y4m, _ = fake_media
    app = create_app(ServerConfig.in_process(tts="festival"), stages=speaking_stages)
    args = [*CHROMIUM_ARGS, f"--use-file-for-fake-video-capture={y4m}",
            f"--use-file-for-fake-audio-capture={user_speech}"]
    async with running_server(app) as base, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 1180})
            logs: list[str] = []
            page.on("console", lambda msg: logs.append(msg.text))
            await page.goto(f"{base}/", wait_until="domcontentloaded")
            await page.wait_for_function("window.synchrony !== undefined", timeout=60_000)
            assert await page.get_attribute("#sy-app", "data-answers") == "1"
            await page.click("#sy-start")
            await page.wait_for_function("window.synchrony.local() !== null", timeout=30_000)
            settings = await page.evaluate("window.synchrony.local().getAudioTracks()[0].getSettings()")
            assert settings.get("echoCancellation") is True, settings  # on for the whole session
            await page.wait_for_function("window.synchrony.answer() !== null", timeout=90_000)
            hello = await page.inner_text("#sy-answer-voice")
            assert "slt_hts" in hello, hello
            levels = await page.evaluate(_LISTEN, 2500)
            w, h = 160, 120
            shots = await page.evaluate(_WATCH, [3000, w, h])
            await page.wait_for_selector("#sy-answer-text .sy-spoken", timeout=10_000)
            clock = await page.get_attribute("#sy-answer-text", "data-clock")
            shot = (ROOT / "docs" / "screenshot-answer.png" if os.environ.get("SYNCHRONY_SCREENSHOT")
                    else tmp_path / "answer.png")
            await page.screenshot(path=str(shot), full_page=True)
            await page.wait_for_function("document.getElementById('sy-answer-state').dataset.reason !== undefined",
                                         timeout=60_000)
            state = await page.inner_text("#sy-answer-state")
            muted = await page.evaluate("document.getElementById('sy-answer').muted")
            await page.click("#sy-stop")
            await page.wait_for_timeout(300)
        finally:
            await browser.close()
    assert not muted
    loud = [x for x in levels if x >= ans.LOUD_DBFS]
    assert len(loud) >= 5, (max(levels), logs[-5:])  # the answer is heard, not silent
    lumas = [np.frombuffer(base64.b64decode(s), np.uint8).reshape(h, w).astype(np.float32) for s in shots]
    assert max(float(y.std()) for y in lumas) > 10, "the answer element shows no picture"
    box = ans.mouth_box(lumas)
    opening = np.array([ans.mouth_opening(y, box) for y in lumas])
    assert box[1] <= 0.85 * h  # found on the face, above the caption row
    assert opening.std() > 0.03 and np.ptp(opening) > 0.1, (box, opening.round(2).tolist())  # the mouth moves
    assert state.startswith("answer ended:"), state
    print(f"karaoke timed by the {clock} clock; answer level max {max(levels):.1f} dBFS")
    assert app.state.sessions == {}
