"""Serving other machines, with real parts: TLS, the token, TURN (Debian's coturn), abuse limits.

The browser and TURN tests run in a network namespace the test makes (``tests/netns.py``): the server
at a non-loopback address there, Chromium and coturn inside it, nothing outside it reached. Where
namespaces cannot be made (not root) they skip and say why; the rest runs on loopback.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import time
from fractions import Fraction
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
from fastapi import Request

from app.cli import UsageError, check_exposure, main
from app.live.config import ServerConfig
from app.live.ice import IceServer, link_headers, parse_ice_server, turn_rest_credentials, with_credentials
from app.live.limits import FrameCap, vp8_keyframe_size
from app.live.offer import cap_bitrate
from app.live.ratelimit import OfferRateLimit
from app.live.server import Tls, create_app, running_server
from app.loadtest.peer import WhipPeer, parse_ice_links
from tests import netns
from tests.live_fixtures import live_stages, whip_offer  # noqa: F401 - shared session fixture

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TURNSERVER = shutil.which("turnserver")
NO_MODELS = {"ui": False, "stages": ()}


def _black() -> np.ndarray:
    return np.zeros((120, 160, 3), np.uint8)


def _silence() -> np.ndarray:
    return np.zeros(16000, np.float32)


def _norm(word: str) -> str:
    return "".join(ch for ch in word.lower() if ch.isalpha())


@pytest.fixture(scope="module")
def ns():
    reason = netns.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with netns.namespace() as space:
        yield space


# --- the parts, one by one ---------------------------------------------------------------------------


def test_ice_server_urls_and_short_lived_turn_credentials():
    assert parse_ice_server("stun:stun.example.net") == IceServer("stun:stun.example.net")
    turn = parse_ice_server("turn:alice:pa:ss@turn.example.net:3478?transport=udp")
    assert turn == IceServer("turn:turn.example.net:3478?transport=udp", "alice", "pa:ss")
    assert parse_ice_server("turns:[2001:db8::1]:5349?transport=tcp").url == "turns:[2001:db8::1]:5349?transport=tcp"
    for bad in ("http://x", "stun:u:p@host", "turn:host:99999", "stun:host?transport=udp", ""):
        with pytest.raises(ValueError):
            parse_ice_server(bad)
    # coturn's use-auth-secret scheme: username "<expiry>:<name>", password base64(HMAC-SHA1(secret, username));
    # the figure is `echo -n 1000600:abc | openssl dgst -sha1 -hmac s3cret -binary | base64`
    user, password = turn_rest_credentials("s3cret", 600, "abc", now=1_000_000)
    assert user == "1000600:abc" and password == "Pu0wa17AQu9qo1HazK727+m0zHw="
    minted = with_credentials((parse_ice_server("stun:s"), parse_ice_server("turn:t"), turn), "s3cret", 60)
    assert minted[0].username is None and minted[2] == turn  # fixed credentials are kept
    assert minted[1].username.endswith(":synchrony") and int(minted[1].username.split(":")[0]) > time.time()


def test_link_headers_follow_rfc_9725_and_round_trip():
    servers = (IceServer("stun:s.example:3478"), IceServer("turn:t.example?transport=udp", 'u"1', "c,2"))
    values = link_headers(servers)
    assert values[0] == '<stun:s.example:3478>; rel="ice-server"'
    assert values[1] == ('<turn:t.example?transport=udp>; rel="ice-server"; username="u\\"1"; credential="c,2"; '
                         'credential-type="password"')
    back = parse_ice_links([", ".join(values)])
    assert back == [{"urls": "stun:s.example:3478"},
                    {"urls": "turn:t.example?transport=udp", "username": 'u"1', "credential": "c,2"}]


def test_offer_rate_limit_per_address():
    limit = OfferRateLimit(rate_per_s=2.0, burst=3)
    assert [limit.retry_after("a", now=0.0) for _ in range(3)] == [None, None, None]
    assert limit.retry_after("a", now=0.0) == 1
    assert limit.retry_after("b", now=0.0) is None  # another address has its own bucket
    assert limit.retry_after("a", now=0.5) is None  # one token back after 1/rate s
    assert limit.retry_after("a", now=0.6) == 1
    assert OfferRateLimit(0, 1).retry_after("a") is None  # 0: no limit
    small = OfferRateLimit(1.0, 1, max_clients=2)
    for addr in ("x", "y", "z"):
        small.retry_after(addr, now=0.0)
    assert len(small._buckets) == 2


def test_camera_caps_rate_and_size_and_vp8_header_size():
    cap = FrameCap((1280, 720), 30.0)
    kept = sum(cap.take(i / 60) for i in range(120))  # 2 s at 60 fps
    assert 58 <= kept <= 62
    cap30 = FrameCap((1280, 720), 30.0)
    jitter = random.Random(1)
    assert all(cap30.take(i / 30 + jitter.uniform(-0.004, 0.004)) for i in range(60))  # 30 fps passes whole
    big = av.VideoFrame.from_ndarray(np.zeros((1080, 1920, 3), np.uint8), format="rgb24")
    small = cap.fit(big)
    assert (small.width, small.height) == (1280, 720)
    odd = cap.fit(av.VideoFrame.from_ndarray(np.zeros((1000, 1000, 3), np.uint8), format="rgb24"))
    assert (odd.width, odd.height) == (720, 720)
    assert cap.fit(small) is small
    enc = av.CodecContext.create("libvpx", "w")
    enc.width, enc.height, enc.pix_fmt = 352, 288, "yuv420p"
    enc.time_base = Fraction(1, 30)
    frame = av.VideoFrame.from_ndarray(np.zeros((288, 352, 3), np.uint8), format="rgb24").reformat(format="yuv420p")
    packets = enc.encode(frame) + enc.encode(None)
    assert vp8_keyframe_size(bytes(packets[0])) == (352, 288)
    assert vp8_keyframe_size(b"\x01" + bytes(20)) is None  # an inter frame carries no size


async def test_answer_caps_the_camera_bitrate():
    sdp = await whip_offer()
    capped = cap_bitrate(sdp.replace("\r\n", "\r\n", 1), 2500)
    video = capped.split("m=video", 1)[1].split("m=", 1)[0]
    assert "b=AS:2500" in video and "b=AS" not in capped.split("m=video", 1)[0]


def test_forwarded_headers_only_from_trusted_proxies():
    from fastapi import FastAPI

    from app.live.proxy import PREFIX_KEY, ForwardedHeaders

    app = FastAPI()

    @app.get("/who")
    async def who(request: Request) -> dict[str, object]:
        return {"client": request.client.host, "host": request.headers["host"], "scheme": request.url.scheme,
                "prefix": request.scope.get(PREFIX_KEY)}

    app.add_middleware(ForwardedHeaders, allowed=("10.0.0.0/8",))
    headers = {"X-Forwarded-For": "203.0.113.7, 10.1.1.1", "X-Forwarded-Proto": "https",
               "X-Forwarded-Host": "sync.example", "X-Forwarded-Prefix": "/live/"}

    async def ask(client_addr: str) -> dict[str, object]:
        transport = httpx.ASGITransport(app=app, client=(client_addr, 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://internal:8000") as c:
            return (await c.get("/who", headers=headers)).json()

    trusted = asyncio.run(ask("10.9.9.9"))
    assert trusted == {"client": "203.0.113.7", "host": "sync.example", "scheme": "https", "prefix": "/live"}
    untrusted = asyncio.run(ask("198.51.100.1"))
    assert untrusted == {"client": "198.51.100.1", "host": "internal:8000", "scheme": "http", "prefix": None}


def test_serve_refuses_a_public_address_without_a_token(capsys, monkeypatch):
    monkeypatch.delenv("SYNCHRONY_TOKEN", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "without a token" in err and "--auth-token" in err and "--no-auth" in err and "Traceback" not in err
    assert main(["cluster", "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "without a token" in capsys.readouterr().err
    assert main(["serve", "--host", "0.0.0.0", "--no-auth", "--auth-token", "x"]) == 2
    assert main(["serve", "--protect-metrics"]) == 2
    assert main(["serve", "--ice-server", "http://nope"]) == 2
    assert "--ice-server" in capsys.readouterr().err
    assert main(["serve", "--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"]) == 2
    assert "does not exist" in capsys.readouterr().err
    check_exposure("127.0.0.1", ServerConfig(), no_auth=False, command="serve")  # loopback: no token needed
    check_exposure("0.0.0.0", ServerConfig(auth_token="t"), no_auth=False, command="serve")
    check_exposure("0.0.0.0", ServerConfig(), no_auth=True, command="serve")
    assert "WARNING" in capsys.readouterr().err
    with pytest.raises(UsageError):
        check_exposure("192.0.2.1", ServerConfig(), no_auth=False, command="serve")


def test_a_taken_port_is_one_line_before_anything_starts(capsys):
    """Another server on the port (``make run`` twice): one line saying so, exit 2, and no model, lane or Ray
    node started to be torn down again."""
    import socket

    from app.live import asr_prestart

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main(["serve", "--port", port]) == 2
        err = capsys.readouterr().err
        assert f"cannot listen on 127.0.0.1:{port}" in err and "choose another --port" in err
        assert "Traceback" not in err and not asr_prestart._started and not asr_prestart._starting
        assert main(["cluster", "--port", port, "--local-nodes", "1"]) == 2
        assert "choose another --port" in capsys.readouterr().err
    assert main(["serve", "--host", "192.0.2.1", "--no-auth", "--port", port]) == 2  # TEST-NET: not this machine
    assert "not an address of this machine" in capsys.readouterr().err


@pytest.mark.parametrize("when", ["starting", "ready"])
def test_serve_stops_cleanly_when_a_service_manager_stops_it(tmp_path, when):
    """``synchrony serve`` stopped with SIGTERM (systemd, ``docker stop``), while it starts (models warming up,
    uvicorn not yet serving) or once ready: it shuts down with no traceback, and leaves no ASR lane, no festival
    process and no work directory behind."""
    import signal
    import socket
    import subprocess
    import sys

    import psutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)], env=env,
                            cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    head = []
    try:
        if when == "starting":  # the line uvicorn's start follows; the warm-up thread is running
            for line in proc.stdout:
                head.append(line)
                if "serving on" in line:
                    break
        else:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            else:
                pytest.fail(f"never ready: {proc.poll()=}")
            assert list(tmp_path.glob("synchrony-festival-*"))
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children  # the ASR lanes start first
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        proc.kill()
    out = "".join(head) + out
    assert proc.returncode in (0, -signal.SIGTERM), out  # uvicorn re-raises the signal once shut down
    assert "Traceback" not in out and "Error" not in out, out
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not list(tmp_path.glob("synchrony-*"))  # (gradio keeps its cache there by design)


async def test_metrics_can_ask_for_the_token_and_options_names_ice_servers():
    config = ServerConfig.in_process(**NO_MODELS, auth_token="tok", metrics_auth=True,
                                     ice_servers=(IceServer("stun:192.0.2.1:3478"), IceServer("turn:192.0.2.1:3478")),
                                     turn_secret="s3cret")
    async with running_server(create_app(config)) as base, httpx.AsyncClient(base_url=base) as client:
        auth = {"Authorization": "Bearer tok"}
        for path in ("/metrics", "/metrics/lst"):
            assert (await client.get(path)).status_code == 401
        assert (await client.get("/metrics", headers=auth)).status_code == 200
        assert (await client.get("/healthz")).status_code == 200  # health stays open for probes
        assert (await client.options("/whip")).status_code == 401
        resp = await client.options("/whip", headers=auth)
        assert resp.status_code == 204
        links = parse_ice_links(resp.headers.get_list("link"))
        assert links[0] == {"urls": "stun:192.0.2.1:3478"}
        assert links[1]["urls"] == "turn:192.0.2.1:3478" and links[1]["username"].endswith(":client")


async def test_https_serves_page_whip_and_metrics(tmp_path):
    cert, key = netns.self_signed(tmp_path, "127.0.0.1")
    app = create_app(ServerConfig.in_process(stages=()))
    async with running_server(app, tls=Tls(cert, key)) as base:
        assert base.startswith("https://")
        async with httpx.AsyncClient(base_url=base, verify=str(cert)) as client:
            assert (await client.get("/metrics")).status_code == 200
            assert "synchrony.js" in (await client.get("/")).text
        with pytest.raises(httpx.ConnectError):  # an untrusted certificate is refused by default
            async with httpx.AsyncClient(base_url=base) as client:
                await client.get("/healthz")
        peer = WhipPeer(f"{base}/whip", frames=[_black()], fps=10, audio=_silence(), cafile=str(cert))
        await peer.connect()
        await peer.wait_frames(3, timeout=20)
        assert await peer.close() == 200


# --- abuse ---------------------------------------------------------------------------------------------


async def test_an_offer_flood_gets_429_while_the_admitted_session_keeps_its_pace():
    """200 offers in 2 s from one address: past the burst, 429 + Retry-After; the session already
    admitted keeps getting its 16 fps video."""
    config = ServerConfig.in_process(**NO_MODELS, max_sessions=1, offer_rate_per_s=1.0, offer_burst=10)
    app = create_app(config)
    sdp = await whip_offer()
    async with running_server(app) as base:
        peer = WhipPeer(f"{base}/whip", frames=[_black()], fps=15, audio=_silence())
        await peer.connect()
        await peer.wait_frames(16, timeout=20)
        before, t0 = peer.frames_received, time.monotonic()
        async with httpx.AsyncClient(base_url=base, timeout=10,
                                     limits=httpx.Limits(max_connections=50)) as client:

            async def offer(i: int) -> httpx.Response:
                await asyncio.sleep(i * 0.01)
                return await client.post("/whip", content=sdp, headers={"Content-Type": "application/sdp"})

            answers = await asyncio.gather(*(offer(i) for i in range(200)))
        flood_s = time.monotonic() - t0
        await asyncio.sleep(1.0)
        rate = (peer.frames_received - before) / (time.monotonic() - t0)
        statuses = [r.status_code for r in answers]
        limited = [r for r in answers if r.status_code == 429]
        print(f"flood of 200 in {flood_s:.2f} s: {statuses.count(429)} x 429, {statuses.count(503)} x 503; "
              f"admitted session's returned video {rate:.1f} fps")
        assert set(statuses) <= {429, 503}, statuses
        assert len(limited) >= 185
        assert all(int(r.headers["Retry-After"]) >= 1 and "too many offers" in r.text for r in limited)
        assert peer.session_id in app.state.sessions and rate >= 12
        assert await peer.close() == 200
        async with httpx.AsyncClient(base_url=base) as client:
            metrics = (await client.get("/metrics")).text
        assert re.search(r'synchrony_whip_rejected_total\{status="429"\} (\d+)', metrics)


def _video_pt(peer: WhipPeer) -> int:
    m = re.search(r"m=video \d+ \S+ (\d+)", peer.pc.remoteDescription.sdp)
    assert m is not None
    return int(m.group(1))


async def _send_garbage(peer: WhipPeer, seconds: float, rate: int = 60) -> None:
    """Replace the peer's camera with RTP packets of random payload (valid SRTP, its SSRC and codec)."""
    from aiortc.rtp import RtpPacket

    tr = next(t for t in peer.pc.getTransceivers() if t.kind == "video")
    sender = tr.sender
    sender.replaceTrack(None)
    await asyncio.sleep(0.2)
    pt, ext = _video_pt(peer), sender._RTCRtpSender__rtp_header_extensions_map
    rng = random.Random(7)
    # continue the stream the receiver knows (a jump in sequence numbers would be dropped as stale)
    history = {p.sequence_number: p for p in sender._RTCRtpSender__rtp_history.values()}
    last = next(history[s] for s in history if (s + 1) & 0xFFFF not in history)
    seq, ts = (last.sequence_number + 1) & 0xFFFF, (last.timestamp + 90_000 // rate) & 0xFFFFFFFF
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and peer.pc.connectionState == "connected":
        packet = RtpPacket(payload_type=pt, sequence_number=seq, timestamp=ts, ssrc=sender._ssrc, marker=1,
                           payload=rng.randbytes(rng.randrange(20, 1000)))
        packet.extensions.mid = tr.mid
        await sender.transport._send_rtp(packet.serialize(ext))
        seq, ts = (seq + 1) & 0xFFFF, (ts + 90_000 // rate) & 0xFFFFFFFF
        await asyncio.sleep(1 / rate)


async def test_garbage_rtp_closes_only_its_own_session():
    app = create_app(ServerConfig.in_process(**NO_MODELS, max_sessions=2))
    async with running_server(app) as base:
        good = WhipPeer(f"{base}/whip", frames=[_black()], fps=15, audio=_silence())
        bad = WhipPeer(f"{base}/whip", frames=[_black()], fps=15, audio=_silence())
        await good.connect()
        await bad.connect()
        await bad.wait_frames(5, timeout=20)
        sender = asyncio.create_task(_send_garbage(bad, 15.0))
        try:
            err = await bad.wait_for("error", timeout=15)
        finally:
            sender.cancel()
        assert err["stage"] == "video-in" and "not decodable media" in err["message"], err
        deadline = time.monotonic() + 5
        while bad.session_id in app.state.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert bad.session_id not in app.state.sessions
        before = good.frames_received
        await good.wait_frames(before + 16, timeout=10)
        assert good.session_id in app.state.sessions
        async with httpx.AsyncClient(base_url=base) as client:
            assert (await client.get("/healthz")).json() == {"status": "ok", "sessions": 1}
            assert 'synchrony_sessions_ended_total{reason="media rejected"}' in (await client.get("/metrics")).text
        assert await good.close() == 200
        await bad.close()


async def test_a_lossy_sender_is_not_mistaken_for_garbage(av_clip):
    """At 10 % loss both ways, NACKed packets come back as RTX and frames break until the next key frame:
    none of that is garbage, so the session keeps running and gets no ``error``. (The RTX miscount closed
    sessions only on a starved server, where retransmissions pile up: bench/soak.py's lossy round shows it.)"""
    from app.loadtest.netem import NetemLink, NetemProfile

    app = create_app(ServerConfig.in_process(**NO_MODELS, max_sessions=1))
    async with running_server(app) as base:
        peer = WhipPeer(f"{base}/whip", av_clip, loop=True)
        link = NetemLink(NetemProfile(loss=0.10, delay_ms=40, jitter_ms=20), seed=7)
        peer.pc.on("icegatheringstatechange", lambda: link.attach_pc(peer.pc))
        await peer.connect()
        await asyncio.sleep(15.0)
        errors = [e.message for e in peer.events if e.message.get("type") == "error"]
        assert not errors, errors
        assert peer.session_id in app.state.sessions
        assert await peer.close() == 200


# --- in a namespace: a non-loopback address, a real browser, a real TURN server ---------------------


def _chromium_args(y4m: Path, wav: Path, extra: tuple[str, ...] = ()) -> list[str]:
    return ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-video-capture={y4m}", f"--use-file-for-fake-audio-capture={wav}",
            "--disable-features=WebRtcHideLocalIpsWithMdns", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--no-first-run",
            "--autoplay-policy=no-user-gesture-required", *extra]


@pytest.fixture(scope="module")
def fake_media(tmp_path_factory, av_clip):
    from app.loadtest import testmedia
    from tests.test_browser import write_y4m

    d = tmp_path_factory.mktemp("deploy-media")
    y4m = write_y4m(d / "face.y4m", av_clip.frames, int(av_clip.fps))
    wav = d / "speech.wav"
    testmedia.write_wav(wav, testmedia.resample(av_clip.audio, 16_000, 48_000), rate=48_000)
    return y4m, wav


needs_browser = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed (make system)")
needs_coturn = pytest.mark.skipif(TURNSERVER is None, reason="coturn is not installed (make system)")


@needs_browser
async def test_plain_http_at_a_network_address_says_why_there_is_no_camera(ns, fake_media):
    from playwright.async_api import async_playwright

    with netns.inside(ns):
        async with running_server(create_app(ServerConfig.in_process(stages=())), ns.server_ip) as base, \
                async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=_chromium_args(*fake_media))
            try:
                page = await browser.new_page()
                await page.goto(f"{base}/", wait_until="domcontentloaded")
                await page.wait_for_function("window.synchrony !== undefined", timeout=60_000)
                assert await page.evaluate("window.isSecureContext") is False
                text = await page.inner_text("#sy-status")
                assert "plain HTTP" in text and "HTTPS" in text and ns.server_ip in text, text
                await page.click("#sy-start")  # still says why, and opens nothing
                assert "plain HTTP" in await page.inner_text("#sy-status")
                assert await page.evaluate("window.synchrony.pc()") is None
            finally:
                await browser.close()


@needs_browser
@needs_coturn
async def test_https_page_at_a_network_address_through_turn_relay(ns, live_stages, fake_media, av_clip,  # noqa: F811
                                                                  tmp_path):
    """Chromium over HTTPS at a non-loopback address: the camera and microphone open, the media goes
    through coturn (relay only, short-lived credentials from the shared secret), and the page gets
    words, AUs and Level-3 checks."""
    from playwright.async_api import async_playwright

    cert, key = netns.self_signed(tmp_path, ns.server_ip)
    secret = os.urandom(8).hex()
    expected = {_norm(w.text) for w in av_clip.words if len(w.text) > 2}
    with netns.inside(ns):
        turn = netns.Coturn(ns.server_ip, secret, tmp_path)
        turn.start()
        config = ServerConfig.in_process(auth_token="tok", ice_servers=(parse_ice_server(turn.url),),
                                         turn_secret=secret)
        app = create_app(config, stages=live_stages)
        try:
            async with running_server(app, ns.server_ip, tls=Tls(cert, key)) as base, async_playwright() as pw:
                extra = (f"--ignore-certificate-errors-spki-list={netns.spki_hash(cert)}",)
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=_chromium_args(*fake_media, extra))
                try:
                    page = await browser.new_page(viewport={"width": 1280, "height": 1080})
                    await page.goto(f"{base}/?ice=relay", wait_until="domcontentloaded")
                    await page.wait_for_function("window.synchrony !== undefined", timeout=60_000)
                    assert await page.evaluate("window.isSecureContext") is True
                    await page.click("#sy-start")  # no token yet: the page asks for it
                    assert "access token" in await page.inner_text("#sy-status")
                    await page.fill("#sy-token", "tok")
                    await page.click("#sy-start")
                    await page.wait_for_function(
                        "[...document.querySelectorAll('.sy-au-val')].some(e => parseFloat(e.dataset.value) > 0.02)",
                        timeout=60_000)
                    await page.wait_for_function(
                        """expected => {
                            const norm = s => s.toLowerCase().replace(/[^a-z]/g, "");
                            const heard = new Set([...document.querySelectorAll('#sy-transcript .sy-final')]
                                .map(e => norm(e.dataset.text)));
                            return expected.filter(w => heard.has(w)).length >= 2;
                        }""", arg=sorted(expected), timeout=120_000)
                    await page.wait_for_function(
                        "document.getElementById('sy-sync-note').textContent.includes('passed')", timeout=60_000)
                    pairs = await page.evaluate("""(async () => {
                        const stats = await window.synchrony.pc().getStats(), out = [];
                        stats.forEach(r => { if (r.type === 'candidate-pair' && r.nominated && r.state === 'succeeded')
                            out.push(stats.get(r.localCandidateId).candidateType); });
                        return out; })()""")
                    assert pairs and set(pairs) == {"relay"}, pairs
                    await page.click("#sy-stop")
                    await page.wait_for_timeout(300)
                finally:
                    await browser.close()
            assert turn.allocations() >= 1, turn.log_tail()
        finally:
            turn.stop()
    assert app.state.sessions == {}


@needs_coturn
async def test_aiortc_peer_forced_to_relay_gets_words_aus_and_sync(ns, live_stages, av_clip, tmp_path):  # noqa: F811
    secret = os.urandom(8).hex()
    expected = {_norm(w.text) for w in av_clip.words if len(w.text) > 2}
    with netns.inside(ns):
        turn = netns.Coturn(ns.server_ip, secret, tmp_path)
        turn.start()
        try:
            config = ServerConfig.in_process(ui=False, output_delay_s=0.9,
                                             ice_servers=(parse_ice_server(turn.url),), turn_secret=secret)
            app = create_app(config, stages=live_stages)
            async with running_server(app, ns.server_ip) as base:
                peer = WhipPeer(f"{base}/whip", av_clip, loop=True, relay=True)
                await peer.connect(timeout=20)
                assert peer.ice_servers and peer.ice_servers[0]["urls"] == turn.url
                conn = next(t for t in peer.pc.getTransceivers()).sender.transport.transport._connection
                assert {p.local_candidate.type for p in conn._nominated.values()} == {"relay"}
                au = await peer.wait_for("au", lambda m: m["face"], timeout=30)
                assert 0 <= au["au"]["AU26"] <= 1
                final = await peer.wait_for("token", lambda m: m["final"] and _norm(m["text"]) in expected,
                                            timeout=120)
                assert final["frames"]
                sync = await peer.wait_for("sync", timeout=60)
                assert "max_delta_ms" in sync
                assert await peer.close() == 200
            assert turn.allocations() >= 2, turn.log_tail()  # the peer's and the server's own agent's
        finally:
            turn.stop()


async def test_cluster_ingress_limits_offers_and_names_ice_servers():
    """The ingress (no nodes here: its registry watches nothing) answers as a single server does:
    429 past the burst, OPTIONS with the Link headers, protected metrics."""
    from app.cluster.ingress import create_ingress_app
    from app.cluster.registry import NodeRegistry, RegistryConfig

    class NoNodes(NodeRegistry):
        async def run(self, client: httpx.AsyncClient) -> None:
            await asyncio.Event().wait()

    server = ServerConfig.in_process(**NO_MODELS, auth_token="tok", metrics_auth=True, offer_rate_per_s=0.5,
                                     offer_burst=2, ice_servers=(IceServer("turn:192.0.2.1:3478"),),
                                     turn_secret="s3cret")
    config = RegistryConfig(server=server)
    sdp = await whip_offer()
    auth = {"Authorization": "Bearer tok"}
    async with running_server(create_ingress_app(config, NoNodes(config))) as base, \
            httpx.AsyncClient(base_url=base) as client:
        posts = [await client.post("/whip", content=sdp, headers={"Content-Type": "application/sdp", **auth})
                 for _ in range(4)]
        assert [r.status_code for r in posts] == [503, 503, 429, 429]  # no node is ready; then limited
        assert int(posts[2].headers["Retry-After"]) >= 1
        links = parse_ice_links((await client.options("/whip", headers=auth)).headers.get_list("link"))
        assert links[0]["urls"] == "turn:192.0.2.1:3478" and links[0]["username"].endswith(":client")
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/metrics", headers=auth)).status_code == 200
