"""The live server over loopback with the real aiortc stack: WHIP happy path, refusals, DELETE, reaping."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from aiortc import RTCPeerConnection

from app.live.offer import check_offer
from app.live.server import ServerConfig, create_app, running_server
from app.loadtest.peer import WhipPeer
from tests.live_fixtures import live_stages  # noqa: F401 - shared session fixture

ROOT = Path(__file__).resolve().parents[1]
NO_MODELS = ServerConfig.in_process(ui=False, stages=())


async def offer_sdp(datachannel: bool = True, video: bool = True) -> str:
    """A real aiortc offer (audio + video sendrecv + the events channel), for refusal tests."""
    pc = RTCPeerConnection()
    if datachannel:
        pc.createDataChannel("events")
    pc.addTransceiver("audio", direction="sendrecv")
    if video:
        pc.addTransceiver("video", direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


async def wait_ready(client: httpx.AsyncClient, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        resp = await client.get("/readyz")
        if resp.status_code == 200 or time.monotonic() > deadline:
            return resp.json()
        assert resp.status_code == 503 and resp.json()["ready"] is False
        await asyncio.sleep(0.05)


async def test_an_idle_server_with_the_page_leaves_its_event_loop_asleep():
    """Gradio's queue looked for work every 1 ms on the loop that carries every session's media: ~1,800 wake-ups a
    second with nobody connected. The page still loads."""
    app = create_app(ServerConfig.in_process(ui=True, stages=()))
    async with running_server(app) as base:
        async with httpx.AsyncClient(base_url=base) as client:
            assert (await client.get("/")).status_code == 200
        await asyncio.sleep(0.5)
        selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
        select, wakeups = selector.select, 0

        def counted(timeout: float | None = None) -> list:
            nonlocal wakeups
            wakeups += 1
            return select(timeout)

        selector.select = counted
        try:
            await asyncio.sleep(1.0)
        finally:
            selector.select = select
    assert wakeups < 300, wakeups


async def test_offer_checks_name_what_is_wrong():
    sdp = await offer_sdp()
    check_offer(sdp)  # a real offer passes
    with pytest.raises(ValueError, match="v=0"):
        check_offer("hello")
    with pytest.raises(ValueError, match="DataChannel"):
        check_offer(await offer_sdp(datachannel=False))
    with pytest.raises(ValueError, match="video"):
        check_offer(await offer_sdp(video=False))
    with pytest.raises(ValueError, match="truncated|codecs|section"):
        check_offer(sdp[: len(sdp) // 3])
    with pytest.raises(ValueError, match="recvonly"):
        check_offer(sdp.replace("a=sendrecv", "a=recvonly"))


async def test_refusals_are_clear_and_never_tracebacks():
    sdp = await offer_sdp()
    app = create_app(ServerConfig.in_process(ui=False, stages=(), max_sdp_bytes=8192))
    async with running_server(app) as base, httpx.AsyncClient(base_url=base) as client:
        cases = [
            (415, {"content": sdp, "headers": {"Content-Type": "application/json"}}, "application/sdp"),
            (400, {"content": b"\xff\xfe not sdp", "headers": {"Content-Type": "application/sdp"}}, "UTF-8"),
            (400, {"content": "v=0\r\nthis is not sdp", "headers": {"Content-Type": "application/sdp"}}, "malformed"),
            (400, {"content": sdp[: len(sdp) // 3], "headers": {"Content-Type": "application/sdp"}}, ""),
            (413, {"content": sdp + "a=x:" + "y" * 9000 + "\r\n", "headers": {"Content-Type": "application/sdp"}},
             "larger"),
        ]
        for status, kwargs, words in cases:
            resp = await client.post("/whip", **kwargs)
            assert resp.status_code == status, (status, resp.text)
            assert words in resp.text
            assert "Traceback" not in resp.text and len(resp.text) < 300
        assert (await client.delete("/whip/nope")).status_code == 404
        assert (await client.get("/healthz")).json()["status"] == "ok"
        ready = await wait_ready(client)
        assert ready["ready"] is True and ready["cold_start"] == {}
        metrics = (await client.get("/metrics")).text
        assert 'synchrony_whip_rejected_total{status="415"} 1.0' in metrics
        assert 'synchrony_whip_rejected_total{status="400"} 3.0' in metrics
        assert (await client.get("/metrics/lst")).status_code == 503  # no LST stage configured


async def test_bearer_token_required_when_configured():
    sdp = await offer_sdp()
    app = create_app(ServerConfig.in_process(ui=False, stages=(), auth_token="s3cret"))
    async with running_server(app) as base, httpx.AsyncClient(base_url=base) as client:
        resp = await client.post("/whip", content=sdp, headers={"Content-Type": "application/sdp"})
        assert resp.status_code == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
        resp = await client.post("/whip", content=sdp, headers={"Content-Type": "application/sdp",
                                                                 "Authorization": "Bearer wrong"})
        assert resp.status_code == 401
        await wait_ready(client)
        peer = WhipPeer(f"{base}/whip", frames=[_black()], fps=10, audio=_silence(), token="s3cret")
        await peer.connect()
        assert await peer.close() == 200


async def test_full_server_says_503_with_retry_after_and_delete_frees_a_slot():
    app = create_app(ServerConfig.in_process(ui=False, stages=(), max_sessions=1))
    async with running_server(app) as base:
        await wait_ready(httpx.AsyncClient(base_url=base))
        first = WhipPeer(f"{base}/whip", frames=[_black()], fps=10, audio=_silence())
        await first.connect()
        hello = await first.wait_for("hello", timeout=10)
        assert hello["version"] >= 1 and hello["session"] == first.session_id
        second = WhipPeer(f"{base}/whip", frames=[_black()], fps=10, audio=_silence())
        with pytest.raises(Exception) as info:
            await second.connect()
        assert getattr(info.value, "status", None) == 503 and info.value.retry_after
        assert await first.close() == 200
        assert app.state.sessions == {}
        third = WhipPeer(f"{base}/whip", frames=[_black()], fps=10, audio=_silence())
        await third.connect()
        await third.close()


async def test_a_session_that_fails_to_build_gives_its_slot_back(monkeypatch: pytest.MonkeyPatch):
    """A fault while building a session is a plain 500, and the slot it held is free again."""
    import app.live.routes as routes

    real, calls = routes.Session, []

    def failing_once(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(routes, "Session", failing_once)
    app = create_app(ServerConfig.in_process(ui=False, stages=(), max_sessions=1))
    async with running_server(app) as base:
        client = httpx.AsyncClient(base_url=base)
        await wait_ready(client)
        resp = await client.post("/whip", content=await offer_sdp(), headers={"Content-Type": "application/sdp"})
        assert resp.status_code == 500 and "Traceback" not in resp.text
        peer = WhipPeer(f"{base}/whip", frames=[_black()], fps=10, audio=_silence())
        await peer.connect()  # the one slot is free: max_sessions=1 admits it
        assert await peer.close() == 200


async def test_happy_path_events_and_returned_video(live_stages, av_clip):  # noqa: F811
    """A talking-face clip in; AU, token and sync events and a 16 fps video out; DELETE ends it."""
    app = create_app(ServerConfig.in_process(ui=False, output_delay_s=0.9), stages=live_stages)
    async with running_server(app) as base:
        peer = WhipPeer(f"{base}/whip", av_clip, loop=True)  # looped: a starved ASR gets another pass
        await peer.connect()
        session = app.state.sessions[peer.session_id]
        au = await peer.wait_for("au", lambda m: m["face"], timeout=20)
        assert set(au["au"]) >= {"AU1", "AU12", "AU26"} and 0 <= au["au"]["AU26"] <= 1
        expected = {_norm(w.text) for w in av_clip.words if len(w.text) > 2}
        try:
            final = await peer.wait_for("token", lambda m: m["final"] and _norm(m["text"]) in expected, timeout=90)
        except TimeoutError:
            heard = [(m["text"], m["final"]) for m in peer.of_type("token")]
            raise AssertionError(f"no expected final word; heard {heard}; asr {live_stages.asr_worker.stats()}, "
                                 f"degraded {session.degraded}") from None
        assert final["frames"] and final["end"] >= final["start"] >= 0
        # The utterance ends (the clip falls silent): the caption responder answers, paced and metered.
        response = await peer.wait_for("response", timeout=30)
        assert response["text"] and response["ms_after_utterance"] >= 0
        lst_event = await peer.wait_for("lst", timeout=30)
        assert lst_event["ttft_ms_p99"] is not None and lst_event["tier"] in ("gold", "silver", "bronze", "none")
        await peer.wait_frames(16, timeout=20)
        image = peer.frame_images()[-1]
        assert image.shape == (360, 640, 3) and image.std() > 10  # a picture, not a blank frame
        # The AU stage keeps up with the camera (≥ 15 fps in real time, latest frame wins).
        span = peer.events[-1].wall - peer.events[0].wall
        if span > 2:
            aus = [e for e in peer.events if e.type == "au"]
            rate = len(aus) / (aus[-1].wall - aus[0].wall)
            print(f"AU events: {rate:.1f}/s over {len(aus)}")
        assert session.threads_alive()
        # Both tracks are on the sender's clock (RTCP SRs seen), and the flash/click markers the clip
        # carries (no A/V offset) say audio and video agree on that one timeline.
        assert session.clock.modes() == {"audio": "sender", "video": "sender"}
        marker_checks = [m for m in peer.of_type("sync") if m["evidence"] == "markers"]
        print("A/V offsets by markers (ms):", [round(1000 * (m["video"] - m["audio"])) for m in marker_checks])
        assert all(abs(m["video"] - m["audio"]) <= 0.040 for m in marker_checks)
        async with httpx.AsyncClient(base_url=base) as client:
            metrics = (await client.get("/metrics")).text
            lst = (await client.get("/metrics/lst")).json()
        assert 'synchrony_stage_latency_seconds_count{stage="au"}' in metrics
        assert peer.session_id in lst["per_session"] and lst["tier"] in ("gold", "silver", "bronze", "none")
        assert await peer.close() == 200
        assert peer.session_id not in app.state.sessions
        assert not session.threads_alive()


async def test_stage_failure_degrades_only_that_stage(live_stages, av_clip):  # noqa: F811
    """A renderer that raises: the session reports an error event and keeps sending camera frames."""
    from dataclasses import replace

    class ExplodingRenderer:
        name = "exploding"

        def render(self, request):
            raise RuntimeError("renderer blew up")

        def close(self):
            pass

    stages = replace(live_stages, renderer=ExplodingRenderer(), asr_worker=None)
    app = create_app(ServerConfig.in_process(ui=False), stages=stages)
    async with running_server(app) as base:
        peer = WhipPeer(f"{base}/whip", av_clip)
        await peer.connect()
        err = await peer.wait_for("error", timeout=20)
        assert err["stage"] == "render" and "blew up" in err["message"]
        before = peer.frames_received
        await peer.wait_for("au", timeout=20)
        await peer.wait_frames(before + 8, timeout=20)
        assert peer.session_id in app.state.sessions
        await peer.close()


async def test_vanished_peer_is_reaped():
    """A client killed with SIGKILL (no DELETE, no DTLS close): its session, tasks and thread go."""
    app = create_app(ServerConfig.in_process(ui=False, stages=(), media_timeout_s=2.0))
    async with running_server(app) as base:
        await wait_ready(httpx.AsyncClient(base_url=base))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "app.loadtest.peer", f"{base}/whip", cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            sid = line.decode().strip().rsplit("/", 1)[-1]
            assert sid in app.state.sessions
            session = app.state.sessions[sid]
            deadline = time.monotonic() + 20
            while session.output.sent < 5 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert session.output.sent >= 5
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        t0 = time.monotonic()
        while sid in app.state.sessions and time.monotonic() - t0 < 15:
            await asyncio.sleep(0.1)
        assert sid not in app.state.sessions
        assert session.end_reason in ("media timeout", "connection failed", "connection closed")
        assert not session.running_tasks
        metrics = (await httpx.AsyncClient().get(f"{base}/metrics")).text
        assert "synchrony_sessions 0.0" in metrics


def _black():
    import numpy as np

    return np.zeros((120, 160, 3), np.uint8)


def _silence():
    import numpy as np

    return np.zeros(16000, np.float32)


def _norm(word: str) -> str:
    return "".join(ch for ch in word.lower() if ch.isalpha())
