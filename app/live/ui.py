"""The browser page at ``/``: Gradio 6 layout plus a small WebRTC client script talking to ``/whip``.

Not fastrtc: it pins ``gradio < 6`` and brings its own signaling, and we want one signaling path for
every client (browser, aiortc peers, load tester). The live panel is plain HTML driven by
``app/live/static/synchrony.js``: it opens the camera and microphone, posts a WHIP offer (with the
``events`` DataChannel and the avatar's recvonly video m-line, wire v2), plays the returned video and
the spoken answer (one stream, so the browser lip-syncs it), and draws the events. Gradio shows the
server's readiness and cold-start figures.

When the server speaks its answers the page opens the microphone with echo cancellation on
(``data-answers``): Chrome cannot turn it on later in a track's life.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI

from app.live.config import ServerConfig

if TYPE_CHECKING:
    import gradio as gr

#: The server's readiness (``/readyz``'s body), shown on the page.
Readiness = Callable[[], dict[str, object]]

#: How often Gradio's queue looks for work while it has none, and for progress to send (its defaults on Windows).
#: On Linux it looks every 1 ms and 10 ms: over a thousand wake-ups a second of the event loop that carries every
#: session's media, idle or not. The page sends Gradio one event (the readiness, on load), which now waits
#: at most 50 ms.
QUEUE_IDLE_POLL_S = 0.05
QUEUE_PROGRESS_POLL_S = 0.1

_PANEL = """
<div id="sy-app" data-auth="{auth}" data-answers="{answers}">
  <div class="sy-bar">
    <button id="sy-start" class="sy-btn">Start camera &amp; microphone</button>
    <button id="sy-stop" class="sy-btn sy-secondary" disabled>Stop</button>
    <form id="sy-token-form" onsubmit="return false"><input id="sy-token" class="sy-token" type="password"
      placeholder="access token" autocomplete="off" /></form>
    <span id="sy-status" class="sy-status">idle</span>
  </div>
  <div class="sy-videos">
    <figure><video id="sy-local" autoplay playsinline muted></video><figcaption>your camera</figcaption></figure>
    <figure><video id="sy-remote" autoplay playsinline muted></video>
      <figcaption>returned 16 fps video (captions on their frames)</figcaption></figure>
    <figure id="sy-answer-fig" class="sy-audio-only"><video id="sy-answer" autoplay playsinline></video>
      <figcaption>the answer, spoken (voice + avatar, lip-synced)</figcaption></figure>
  </div>
  <div class="sy-grid">
    <section class="sy-card sy-wide sy-answer-card"><h3>Spoken answer <small id="sy-answer-voice">–</small></h3>
      <div id="sy-answer-text" class="sy-answer-text"><span class="sy-empty">the answer's words light up as
        they are spoken</span></div>
      <div id="sy-answer-state" class="sy-note">no answer yet</div>
      <div id="sy-warnings" class="sy-warnings"></div>
    </section>
    <section class="sy-card sy-wide"><h3>Transcript <small>word · start–end (s, session clock)</small></h3>
      <div id="sy-transcript" class="sy-transcript"><span class="sy-empty">speak, and the words appear here</span></div>
    </section>
    <section class="sy-card"><h3>Action units</h3><div id="sy-aus" class="sy-aus"></div>
      <div id="sy-face" class="sy-note">no face yet</div></section>
    <section class="sy-card"><h3>Cognitive load</h3>
      <div class="sy-big"><span id="sy-load">–</span></div>
      <div id="sy-policy" class="sy-note">token rate –</div>
      <h3>Level-3 sync</h3><div id="sy-sync" class="sy-badge sy-unknown">waiting for words</div>
      <div id="sy-sync-note" class="sy-note"></div></section>
    <section class="sy-card"><h3>Response stream (LST)</h3>
      <div id="sy-response" class="sy-response"></div>
      <table class="sy-lst"><tr><td>TTFT p99</td><td id="sy-ttft">–</td></tr>
        <tr><td>ITL max</td><td id="sy-itl">–</td></tr><tr><td>jitter σ8</td><td id="sy-jitter">–</td></tr>
        <tr><td>tier</td><td id="sy-tier">–</td></tr></table></section>
  </div>
</div>
"""


def speaks_answers(config: ServerConfig) -> bool:
    """Whether sessions of this server speak their answers (then the page keeps echo cancellation on)."""
    return config.tts != "off"


def build_ui(config: ServerConfig, ready: Readiness | None = None) -> gr.Blocks:
    """The Gradio ``Blocks`` of the page; ``ready()`` returns the server's readiness dict."""
    import gradio as gr

    auth = "1" if config.auth_token else "0"
    answers = "1" if speaks_answers(config) else "0"
    with gr.Blocks(title="synchrony — live alignment") as demo:
        gr.Markdown(
            "## synchrony · live\n"
            "Camera → face action units → load controller; microphone → streaming Whisper → words on "
            "16 fps output frames (±40 ms); Level-3 audio/video/text sync within 50 ms; the answer is spoken "
            "back with an avatar, its words lit as they play; speak over it to interrupt."
        )
        gr.HTML(_PANEL.format(auth=auth, answers=answers), elem_id="sy-panel", js_on_load=None)
        with gr.Accordion("Server readiness and cold start", open=False):
            status = gr.JSON(label="/readyz")
        if ready is not None:
            demo.load(lambda: json.loads(json.dumps(ready(), default=str)), outputs=status)
    return demo


def mount_ui(app: FastAPI, config: ServerConfig, ready: Readiness | None = None) -> FastAPI:
    """Mount the page at ``/`` on ``app`` (API routes must be registered before this)."""
    import gradio as gr

    head = ('<link rel="stylesheet" href="/static/synchrony.css">'
            '<script src="/static/synchrony.js" defer></script>')
    demo = build_ui(config, ready)
    mounted = gr.mount_gradio_app(app, demo, path="/", head=head, ssr_mode=False, footer_links=[])
    queue = demo._queue  # gradio is pinned (pyproject.toml); tests/test_server.py counts the loop's wake-ups
    queue.sleep_when_free = QUEUE_IDLE_POLL_S
    queue.progress_update_sleep_when_free = QUEUE_PROGRESS_POLL_S
    return mounted
