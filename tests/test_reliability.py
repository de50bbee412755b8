"""Reliability of the live server, fast versions of bench/soak.py's figures (real models, real aiortc).

* a peer that vanishes (its sockets close: no DELETE, no DTLS close, no consent answers) is reaped
  within the media timeout, and its AU thread, ASR stream, tasks and threads are gone;
* connect/disconnect cycles leave no session, stream, task or thread behind;
* a peer sending absurdly large camera frames degrades only its own session, with a logged reason,
  while another session keeps producing face AUs;
* a lossy, jittery link (5 % loss) keeps the session up with every queue within its bound;
* offers the server cannot negotiate are 400s that leave nothing behind; foreign origins are 403.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import statistics
import subprocess
import sys
import time

import httpx
import numpy as np

from app.live.reliability import LoopLag, ResourceSnapshot, heap_mb, lower_thread_priority, snapshot
from app.live.server import ServerConfig, create_app, running_server
from app.loadtest.peer import WhipPeer
from tests.live_fixtures import live_stages, whip_offer  # noqa: F401 - shared session fixture


def own_threads(snap: ResourceSnapshot) -> int:
    """Threads other than asyncio's default executor and the sessions' render pool (pools that grow
    lazily to a fixed size)."""
    return sum(1 for n in snap.thread_names if not n.startswith(("asyncio_", "render_")))


async def settle(app, timeout: float = 15.0, baseline: ResourceSnapshot | None = None) -> ResourceSnapshot:
    """Wait until no session and no ASR stream is left (and, given a baseline, threads are back)."""
    deadline = time.monotonic() + timeout
    while True:
        snap = snapshot(app)
        done = snap.sessions == 0 and snap.asr_streams == 0
        if baseline is not None:
            done = done and own_threads(snap) <= own_threads(baseline) and snap.tasks <= baseline.tasks
        if done or time.monotonic() > deadline:
            return snapshot(app, collect=True)
        await asyncio.sleep(0.1)


def _vanish(peer: WhipPeer) -> int:
    """Make ``peer`` disappear from the network: close its UDP sockets, say nothing. Returns sockets closed."""
    conns = {id(t.sender.transport.transport._connection): t.sender.transport.transport._connection
             for t in peer.pc.getTransceivers() if t.sender.transport is not None}
    if peer.pc.sctp is not None:
        conn = peer.pc.sctp.transport.transport._connection
        conns[id(conn)] = conn
    closed = 0
    for conn in conns.values():
        for protocol in list(conn._protocols):
            protocol.transport.close()
            closed += 1
    return closed


async def _metric(base: str, name: str) -> str:
    async with httpx.AsyncClient(base_url=base) as c:
        return next((ln for ln in (await c.get("/metrics")).text.splitlines() if ln.startswith(name)), "")


async def test_vanished_peer_is_reaped_and_frees_its_resources(live_stages, av_clip):  # noqa: F811
    app = create_app(ServerConfig.in_process(ui=False, media_timeout_s=2.0), stages=live_stages)
    async with running_server(app) as base:
        before = await settle(app)
        peer = WhipPeer(f"{base}/whip", av_clip, loop=True)
        await peer.connect()
        session = app.state.sessions[peer.session_id]
        await peer.wait_for("au", timeout=30)
        await peer.wait_frames(3, timeout=30)
        during = snapshot(app)
        assert during.sessions == 1 and during.asr_streams == 1 and session.threads_alive()
        assert f"au-{session.id}" in during.thread_names
        assert _vanish(peer) >= 1
        t0 = time.monotonic()
        while peer.session_id in app.state.sessions and time.monotonic() - t0 < 15:
            await asyncio.sleep(0.05)
        reaped_s = time.monotonic() - t0
        after = await settle(app)
        print(f"reaped {reaped_s:.2f} s after the peer vanished ({session.end_reason}); "
              f"during {during.threads} threads/{during.tasks} tasks, after {after.threads}/{after.tasks}")
        assert peer.session_id not in app.state.sessions
        assert reaped_s <= 2.0 + 3.0, reaped_s
        assert session.end_reason in ("media timeout", "connection failed", "connection closed")
        assert not session.threads_alive() and not session.running_tasks
        assert after.asr_streams == 0 and f"au-{session.id}" not in after.thread_names
        assert "synchrony_sessions 0.0" in await _metric(base, "synchrony_sessions ")
        await peer.close(delete=False)
        final = await settle(app, baseline=before)
        assert final.tasks <= before.tasks and own_threads(final) <= own_threads(before), (before, final)


async def test_connect_disconnect_cycles_leave_nothing_behind(live_stages, av_clip):  # noqa: F811
    app = create_app(ServerConfig.in_process(ui=False, max_sessions=2), stages=live_stages)

    async def cycle() -> None:
        peer = WhipPeer(f"{base}/whip", av_clip, loop=True)
        await peer.connect()
        await peer.wait_for("hello", timeout=20)
        await peer.wait_frames(2, timeout=30)
        assert await peer.close() == 200

    async with running_server(app) as base:
        await asyncio.gather(cycle(), cycle())  # warm: codecs, graphs, executor threads
        before = await settle(app)
        for _ in range(2):
            await asyncio.gather(cycle(), cycle())
        after = await settle(app, baseline=before)
        print(f"4 cycles: RSS {before.rss_mb:.1f} → {after.rss_mb:.1f} MB (test process, peers included); "
              f"tasks {before.tasks} → {after.tasks}, threads {before.threads} → {after.threads}")
        assert after.sessions == 0 and after.asr_streams == 0 and after.camera_frames == 0
        assert after.tasks <= before.tasks
        assert own_threads(after) <= own_threads(before), sorted(set(after.thread_names) - set(before.thread_names))
        ended = await _metric(base, 'synchrony_sessions_ended_total{reason="client DELETE"}')
        assert ended.endswith(" 6.0"), ended


def _big_frames() -> list[np.ndarray]:
    """2048×1152 (2.4 MP, over the 1080p limit), smooth so the peer's VP8 encoder stays cheap."""
    h, w = 1152, 2048
    ramp = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
    return [np.broadcast_to(ramp + 20 * k, (h, w, 3)).clip(0, 255).astype(np.uint8) for k in range(2)]


async def test_absurd_frame_size_degrades_only_that_session(live_stages, av_clip, caplog):  # noqa: F811
    from dataclasses import replace

    stages = replace(live_stages, asr_worker=None)  # AU path only: keeps the test fast
    app = create_app(ServerConfig.in_process(ui=False), stages=stages)
    async with running_server(app) as base:
        good = WhipPeer(f"{base}/whip", av_clip, loop=True)
        bad = WhipPeer(f"{base}/whip", frames=_big_frames(), fps=5, audio=av_clip.audio, loop=True)
        with caplog.at_level(logging.ERROR, logger="synchrony.session"):
            await good.connect()
            await bad.connect()
            err = await bad.wait_for("error", timeout=40)
        assert err["stage"] == "video" and "2048x1152" in err["message"] and err["fatal"] is False
        assert any(bad.session_id in r.getMessage() and "2048x1152" in r.getMessage() for r in caplog.records)
        # The faulty session lives on, degraded; the other one keeps seeing the face.
        n_au = len(good.of_type("au"))
        try:
            await good.wait_for("au", lambda m: m["face"] and len(good.of_type("au")) > n_au + 5, timeout=30)
        finally:
            aus = good.of_type("au")
            print(f"good session: {n_au} AU events before, {len(aus)} after, faces {sum(m['face'] for m in aus)}; "
                  f"bad: {len(bad.of_type('au'))} AU events, errors {bad.of_type('error')}")
        assert not good.of_type("error")
        assert bad.session_id in app.state.sessions and good.session_id in app.state.sessions
        assert app.state.sessions[bad.session_id].degraded.keys() == {"video"}
        assert app.state.sessions[good.session_id].degraded == {}
        assert snapshot(app).camera_frames <= 64  # none of the big frames were kept
        assert (await _metric(base, 'synchrony_drops_total{stage="video_oversized"}')).split()[-1] != "0.0"
        await good.close()
        await bad.close()


async def test_lossy_jittery_link_keeps_the_session_bounded(live_stages, av_clip):  # noqa: F811
    from app.loadtest.netem import NetemLink, parse_profile

    app = create_app(ServerConfig.in_process(ui=False), stages=live_stages)
    async with running_server(app) as base:
        peer = WhipPeer(f"{base}/whip", av_clip, loop=True, keep_frames=1)
        link = NetemLink(parse_profile("loss=5%,delay=40ms,jitter=20ms"), seed=7)
        peer.pc.on("icegatheringstatechange", lambda: link.attach_pc(peer.pc))
        await peer.connect(timeout=30)
        samples: list[ResourceSnapshot] = []
        events: list[int] = []
        for _ in range(8):
            await asyncio.sleep(1.5)
            samples.append(snapshot(app))
            events.append(len(peer.events))
        stats = link.stats()
        await peer.wait_for("token", lambda m: m["final"], timeout=30)
        print(f"loss up {stats['up']['loss_rate']:.3f} down {stats['down']['loss_rate']:.3f}; RSS "
              f"{samples[0].rss_mb:.0f} → {samples[-1].rss_mb:.0f} MB; ASR queue max "
              f"{max(s.asr_queued_s for s in samples):.2f} s; tasks {[s.tasks for s in samples]}")
        assert stats["up"]["dropped"] > 0 and stats["down"]["dropped"] > 0  # the link really lost packets
        assert peer.pc.connectionState == "connected" and all(s.sessions == 1 for s in samples)
        assert events == sorted(events) and events[-1] > events[len(events) // 2]  # still flowing
        assert max(s.asr_queued_s for s in samples) <= 5.1 and max(s.camera_frames for s in samples) <= 64
        assert max(s.tokens_held for s in samples) <= 400 and max(s.channel_buffered for s in samples) <= 1 << 20
        assert max(s.camera_frames for s in samples) > 0 and max(s.tokens_held for s in samples) > 0  # read, not 0
        # Transient tasks (a close, a send) come and go; a leak keeps the count up through the second half.
        assert statistics.median(s.tasks for s in samples[4:]) <= max(s.tasks for s in samples[:4]) + 2
        assert not app.state.sessions[peer.session_id].degraded
        await peer.close()


async def test_unnegotiable_offers_are_400_and_leave_nothing_behind():
    import re

    sdp = await whip_offer()
    app = create_app(ServerConfig.in_process(ui=False, stages=()))
    async with running_server(app) as base, httpx.AsyncClient(base_url=base) as c:
        before = await settle(app)
        h = {"Content-Type": "application/sdp"}
        no_video_codec = re.sub(r"a=rtpmap:(\d+) (VP8|H264|rtx)/90000", r"a=rtpmap:\1 AV1X/90000", sdp)
        resp = await c.post("/whip", content=no_video_codec, headers=h)
        assert resp.status_code == 400 and "no codec this server decodes" in resp.text and "vp8" in resp.text
        for bad in (sdp + sdp[sdp.index("m=audio"):],  # a duplicated media section
                    sdp.replace("a=group:BUNDLE", "a=group:BUNDLE x y z"),  # BUNDLE names missing mids
                    sdp.replace("a=mid:0", "a=mid:5")):  # mids no longer match BUNDLE
            resp = await c.post("/whip", content=bad, headers=h)
            assert resp.status_code == 400 and resp.text.startswith("cannot use this SDP offer"), resp.text
            assert "Traceback" not in resp.text
        after = await settle(app, baseline=before)
        assert after.sessions == 0 and after.tasks <= before.tasks and own_threads(after) <= own_threads(before)
        assert 'synchrony_whip_rejected_total{status="400"} 4.0' in (await c.get("/metrics")).text


async def test_origin_check():
    """Same origin, listed origins and clients without Origin pass; any other page is refused."""
    sdp = await whip_offer()
    app = create_app(ServerConfig.in_process(ui=False, stages=(), allowed_origins=("https://app.example",)))
    async with running_server(app) as base, httpx.AsyncClient(base_url=base) as c:
        for origin, status in ((None, 201), ("https://app.example", 201), (base, 201),
                               ("https://evil.example", 403), ("null", 403), (base.replace("127.0.0.1", "x"), 403)):
            headers = {"Content-Type": "application/sdp"}
            if origin is not None:
                headers["Origin"] = origin
            resp = await c.post("/whip", content=sdp, headers=headers)
            assert resp.status_code == status, (origin, resp.text)
            if status == 403:
                assert "not allowed" in resp.text
                continue
            foreign = await c.delete(resp.headers["Location"], headers={"Origin": "https://evil.example"})
            assert foreign.status_code == 403
            assert (await c.delete(resp.headers["Location"], headers=headers)).status_code == 200


def test_serve_bounds_native_memory_pools_before_starting():
    """What `synchrony serve` calls first: glibc accepts the arena cap and oneDNN's cache gets a
    bound unless the environment already set one (run in a child so this process is untouched)."""
    code = ("import os; from app.live.reliability import bound_native_memory; "
            "print(bound_native_memory(), os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])")
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["True", "32"]
    env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "1024"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["True", "1024"]


def test_loop_lag_keeps_the_window_maximum():
    lag = LoopLag(window_s=10.0, stall_s=0.25)
    lag.record(0.05, now=100.0)
    lag.record(0.40, now=101.0)
    lag.record(0.10, now=102.0)
    assert lag.stalls == 1 and lag.max_s(now=102.0) == 0.40
    lag.record(0.02, now=111.5)
    assert lag.max_s(now=111.5) == 0.10  # 0.40 (t=101) has left the 10-s window; 0.10 (t=102) has not
    assert lag.max_s(now=112.5) == 0.02
    assert LoopLag().max_s() == 0.0


async def test_a_blocked_event_loop_shows_on_the_metrics():
    app = create_app(ServerConfig.in_process(ui=False, warmup=False))
    async with running_server(app) as base:
        await asyncio.sleep(0.3)
        time.sleep(0.4)  # a CPU-bound call on the loop, the bug this gauge exists to catch
        await asyncio.sleep(0.2)
        lag = float((await _metric(base, "synchrony_event_loop_lag_max_seconds")).split()[-1])
        stalls = float((await _metric(base, "synchrony_event_loop_stall_count")).split()[-1])
    assert 0.3 <= lag < 2.0 and stalls >= 1


def test_lowered_thread_priority_is_per_thread_and_inherited():
    """The AU worker's call: its own nice value and its children's go up, the caller's does not."""
    import threading

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: dict[str, int] = {}

    def child() -> None:
        seen["child"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def worker() -> None:
        assert lower_thread_priority(5)
        seen["worker"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        t = threading.Thread(target=child)
        t.start()
        t.join()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"worker": min(base + 5, 19), "child": min(base + 5, 19)}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    assert not lower_thread_priority(0)


def test_a_send_on_a_closed_transport_is_not_logged_as_an_error(caplog):
    """aiortc's fire-and-forget SCTP send failing after the peer left is a debug line; other task errors stay errors."""
    from app.live.reliability import quiet_closed_transport_errors

    async def fails(exc: Exception) -> None:
        raise exc

    async def scenario() -> None:
        quiet_closed_transport_errors(asyncio.get_running_loop())
        for exc in (ConnectionError("Cannot send encrypted data, not connected"), ValueError("a real bug")):
            task = asyncio.ensure_future(fails(exc))
            await asyncio.sleep(0.01)
            del task  # never retrieved: asyncio reports it when the task is collected
            gc.collect()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(scenario())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "a real bug" in str(errors[0].exc_info[1] if errors[0].exc_info else errors[0].msg)
    assert any("closed transport" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


def test_heap_figures_tell_live_native_memory():
    """glibc's own account, which the soak prints beside RSS: 64 MB held by numpy shows as live
    memory (in an arena or mapped on its own, as glibc chose) while held and leaves when freed."""
    def live(h: dict[str, float]) -> float:
        return h["in_use_mb"] + h["mmapped_mb"]

    before = heap_mb()
    assert before is not None, "glibc 2.33+ (Debian 12 has 2.36) gives mallinfo2"
    block = np.ones(64 * 1024 * 1024 // 8)
    held = heap_mb()
    del block
    after = heap_mb()
    assert live(held) - live(before) >= 60
    assert live(held) - live(after) >= 60
    assert before["in_use_mb"] > 0 and set(before) == {"in_use_mb", "free_mb", "mmapped_mb", "arena_mb"}
