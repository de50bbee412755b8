"""`synchrony cluster` on a local two-node Ray cluster (two raylets on this machine, each with its own
resources and its own synchrony server): the real models on every node, the real aiortc stack over
loopback, sessions placed through the ingress, a full cluster refusing, and a node removed mid-run.
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from app.cluster.placement import LOST, READY, NodeView, node_capacity, placement_order
from app.cluster.registry import RegistryConfig
from app.live.server import ServerConfig, create_app, running_server
from app.loadtest.peer import WhipError, WhipPeer
from tests.live_fixtures import whip_offer

TOKEN = "s3cret"
#: One session per node (max_sessions; a node reporting a measured `capacity` would use that), one
#: decode lane: two full servers share this machine's two cores with the test's own peers.
CONFIG = RegistryConfig(server=ServerConfig.in_process(ui=False, max_sessions=1, asr_lanes=1, auth_token=TOKEN),
                        node_host="127.0.0.1", poll_interval_s=0.25)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def ray_cluster():
    """Two synchrony nodes (1 CPU each) and a head that runs none; this process is the driver."""
    import ray

    from app.cluster.local import start_local_cluster, stop_local_cluster
    from app.cluster.registry import NAMESPACE

    cluster = start_local_cluster(nodes=2, cpus_per_node=1)
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    yield cluster
    stop_local_cluster(cluster)


def test_placement_prefers_the_most_free_room_and_skips_full_or_unready_nodes():
    nodes = [NodeView("a", "u", READY, sessions=1, capacity=2), NodeView("b", "u", READY, sessions=0, capacity=2),
             NodeView("c", "u", READY, sessions=0, capacity=1, placed=1), NodeView("d", "u", LOST, capacity=4),
             NodeView("e", "u", "warming", capacity=4)]
    assert [n.key for n in placement_order(nodes)] == ["b", "a"]
    assert node_capacity({"capacity": 3, "max_sessions": 8}) == 3  # the capacity work's figure wins
    assert node_capacity({"max_sessions": 8}) == 8


def test_pinned_local_nodes_get_disjoint_cores_and_their_children_follow():
    """``--pin-nodes``: each node's processes (and what they started) on cores of their own."""
    import os
    import subprocess
    import sys

    from app.cluster.local import node_cores, pin_processes

    cores = sorted(os.sched_getaffinity(0))
    assert node_cores(len(cores) + 1, 1) is None  # not enough cores: no pinning
    split = node_cores(len(cores), 1)
    assert split is not None and all(len(c) == 1 for c in split) and set().union(*split) == set(cores)
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen("
                               "[sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"])
    try:
        import psutil

        deadline = time.monotonic() + 10
        while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        pin_processes([parent.pid], split[-1])
        procs = [psutil.Process(parent.pid), *psutil.Process(parent.pid).children(recursive=True)]
        assert len(procs) == 2 and all(set(p.cpu_affinity()) == split[-1] for p in procs)
    finally:
        for p in psutil.Process(parent.pid).children(recursive=True):
            p.kill()
        parent.kill()
        parent.wait()


async def test_bad_input_through_the_ingress_gets_the_single_servers_answers(ray_cluster):
    """Every refusal a single server gives, the ingress gives too (status, text, headers), before any
    node is ready; and a good offer while no node is ready is a 503 with Retry-After."""
    from app.cluster.ingress import create_ingress_app

    sdp = await whip_offer()
    no_channel = re.sub(r"m=application.*", "", sdp, flags=re.S)
    post = {"Content-Type": "application/sdp", **AUTH}
    cases = [
        ("POST", "/whip", {"content": sdp, "headers": {"Content-Type": "application/sdp"}}),
        ("POST", "/whip", {"content": sdp, "headers": {**AUTH, "Content-Type": "application/json"}}),
        ("POST", "/whip", {"content": b"\xff\xfe not sdp", "headers": post}),
        ("POST", "/whip", {"content": "v=0\r\nthis is not sdp", "headers": post}),
        ("POST", "/whip", {"content": sdp[: len(sdp) // 3], "headers": post}),
        ("POST", "/whip", {"content": no_channel, "headers": post}),
        ("POST", "/whip", {"content": sdp + "a=x:" + "y" * 70_000 + "\r\n", "headers": post}),
        ("POST", "/whip", {"content": sdp, "headers": {**post, "Origin": "http://elsewhere.example"}}),
        ("DELETE", "/whip/nope", {"headers": AUTH}),
        ("PATCH", "/whip/nope", {"headers": AUTH}),
    ]
    single = create_app(ServerConfig.in_process(ui=False, stages=(), auth_token=TOKEN))
    async with running_server(single) as single_base, running_server(create_ingress_app(CONFIG)) as base, \
            httpx.AsyncClient(base_url=single_base) as one, httpx.AsyncClient(base_url=base) as ingress:
        readyz = await ingress.get("/readyz")
        assert readyz.status_code == 503 and readyz.json()["ready"] is False  # the nodes are still warming
        resp = await ingress.post("/whip", content=sdp, headers=post)
        assert resp.status_code == 503 and resp.headers["Retry-After"] == "2", resp.text
        for method, path, kwargs in cases:
            want = await one.request(method, path, **kwargs)
            got = await ingress.request(method, path, **kwargs)
            assert 400 <= want.status_code < 500, (method, path, want.status_code)
            assert (got.status_code, got.text) == (want.status_code, want.text), (method, path)
            for header in ("WWW-Authenticate", "Allow"):
                assert got.headers.get(header) == want.headers.get(header)
            assert "Traceback" not in got.text and len(got.text) < 300
        metrics = (await ingress.get("/metrics")).text
        assert 'synchrony_cluster_whip_rejected_total{status="400"} 4.0' in metrics


def _node_key(peer: WhipPeer) -> str:
    return peer.location.rstrip("/").split("/")[-2]


async def _wait_ready_nodes(client: httpx.AsyncClient, n: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = (await client.get("/readyz")).json()
        if body["nodes_ready"] >= n:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"{body['nodes_ready']} of {n} nodes ready after {timeout} s: {body['nodes']}")
        await asyncio.sleep(0.25)


async def _wait_state(client: httpx.AsyncClient, key: str, states: tuple[str, ...], timeout: float) -> float:
    t0 = time.monotonic()
    while (await client.get("/readyz")).json()["nodes"][key]["state"] not in states:
        assert time.monotonic() - t0 < timeout, f"node {key} not {states} within {timeout} s"
        await asyncio.sleep(0.1)
    return time.monotonic() - t0


async def test_sessions_spread_fill_and_survive_a_node_removal(ray_cluster, av_clip, monkeypatch):
    """Two sessions land on the two nodes (visible per node in /metrics), a third is refused (503);
    removing one node ends only its session, the other keeps producing words, the ingress stops
    placing there at once and new sessions land on the node that is left."""
    import aioice.ice

    import app.live.webrtc
    from app.cluster.ingress import create_ingress_app

    # The clients notice a vanished node through ICE consent (RFC 7675: 30 s without an answered
    # check). These peers check every second and give up after 3 s, so the test need not wait 30 s.
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 1)
    monkeypatch.setattr(app.live.webrtc, "CONSENT_EXPIRY_S", 3.0)
    app_ = create_ingress_app(CONFIG)  # a second ingress: it finds the node servers the first one started
    async with running_server(app_) as base, httpx.AsyncClient(base_url=base) as ingress:
        ready = await _wait_ready_nodes(ingress, 2, timeout=150)
        assert ready["capacity"] == 2 and len(ready["nodes"]) == 2
        assert all(node["missing"] == {} for node in ready["nodes"].values())  # every stage runs on every node
        a = WhipPeer(f"{base}/whip", av_clip, loop=True, token=TOKEN)
        b = WhipPeer(f"{base}/whip", av_clip, loop=True, token=TOKEN)
        await asyncio.gather(a.connect(), b.connect())  # at once: they still land on different nodes
        ka, kb = _node_key(a), _node_key(b)
        assert {ka, kb} == set(ready["nodes"])  # one session on each node
        metrics = (await ingress.get("/metrics")).text
        for key in (ka, kb):
            assert f'synchrony_sessions{{node="{key}"}} 1.0' in metrics
            assert f'synchrony_cluster_placements_total{{node="{key}"}} 1.0' in metrics
        with pytest.raises(WhipError) as full:
            await WhipPeer(f"{base}/whip", av_clip, token=TOKEN).connect()
        assert full.value.status == 503 and full.value.retry_after == "5" and "cluster full" in full.value.detail

        # Each node runs the whole pipeline with its own models: faces and words come back on both.
        for peer in (a, b):
            await peer.wait_for("au", lambda m: m["face"], timeout=30)
            await peer.wait_for("token", timeout=60)
        lst = (await ingress.get("/metrics/lst")).json()
        assert set(lst["per_node"]) == {ka, kb}

        node_a = next(n for n in ray_cluster.worker_nodes if n.node_id.startswith(ka))
        removed = time.monotonic()
        ray_cluster.remove_node(node_a, allow_graceful=False)
        frames_a, events_b = a.frames_received, len(b.events)
        stopped_s = await _wait_state(ingress, ka, ("unreachable", LOST), timeout=5)
        print(f"ingress stopped placing on the removed node after {stopped_s:.2f} s")

        # The other node's session goes on: new AU events and a new word after the removal.
        await _wait(lambda: len(b.events) > events_b + 30, timeout=20, what="events from the remaining node")
        words_b = len(b.of_type("token"))
        await _wait(lambda: len(b.of_type("token")) > words_b, timeout=45, what="a word from the remaining node")

        # The removed node's client sees its session end: no more video, then the connection closes.
        await _wait(lambda: a.pc.connectionState in ("failed", "closed"), timeout=30, what="a's connection to end")
        print(f"the removed node's client saw its session end {time.monotonic() - removed:.1f} s after the removal")
        assert a.frames_received - frames_a <= 16  # at most what was already in flight

        # New sessions go to the node that is left, and only there.
        assert await b.close() == 200
        c = WhipPeer(f"{base}/whip", av_clip, token=TOKEN)
        await c.connect()
        assert _node_key(c) == kb
        with pytest.raises(WhipError) as full:
            await WhipPeer(f"{base}/whip", av_clip, token=TOKEN).connect()
        assert full.value.status == 503
        assert await c.close() == 200
        await _wait_state(ingress, ka, (LOST,), timeout=40)  # Ray confirms the node is gone: never again
        assert await a.close() == 404  # DELETE through the ingress: the session is gone with its node
        ready = (await ingress.get("/readyz")).json()
        assert ready["nodes_ready"] == 1 and ready["capacity"] == 1
        metrics = (await ingress.get("/metrics")).text
        assert 'synchrony_cluster_nodes{state="lost"} 1.0' in metrics
        assert f'synchrony_cluster_placements_total{{node="{ka}"}} 1.0' in metrics


async def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def test_cluster_metrics_label_every_node_and_keep_families_together():
    from app.cluster.aggregate import merge_metrics, with_node_label

    assert with_node_label('m{a="b c"} 1.0', "n1") == 'm{node="n1",a="b c"} 1.0'
    assert with_node_label("m 2.0", "n1") == 'm{node="n1"} 2.0'
    node = "# HELP s live\n# TYPE s gauge\ns 1.0\n# HELP e ended\n# TYPE e counter\ne_total{reason=\"x\"} 3.0\n"
    text = merge_metrics("# HELP own x\n# TYPE own gauge\nown 1.0\n", {"n1": node, "n2": node})
    lines = text.splitlines()
    assert lines[:3] == ["# HELP own x", "# TYPE own gauge", "own 1.0"]
    assert lines[3:] == ["# HELP s live", "# TYPE s gauge", 's{node="n1"} 1.0', 's{node="n2"} 1.0',
                         "# HELP e ended", "# TYPE e counter", 'e_total{node="n1",reason="x"} 3.0',
                         'e_total{node="n2",reason="x"} 3.0']


def test_cluster_lst_takes_the_worst_node():
    from app.cluster.aggregate import merge_lst

    fast = {"ttft_ms_p99": 60.0, "itl_ms_max": 90.0, "jitter_ms": 2.0, "sessions": 1, "per_session": {"s1": {}}}
    slow = {"ttft_ms_p99": 150.0, "itl_ms_max": 70.0, "jitter_ms": None, "sessions": 2, "per_session": {"s2": {}}}
    merged = merge_lst({"a": fast, "b": slow})
    assert (merged["ttft_ms_p99"], merged["itl_ms_max"], merged["jitter_ms"]) == (150.0, 90.0, 2.0)
    assert merged["tier"] == "bronze" and merged["sessions"] == 3  # gold on node a alone, bronze for the cluster
    assert set(merged["per_session"]) == {"a/s1", "b/s2"} and "per_session" not in merged["per_node"]["a"]


def test_cluster_command_refuses_bad_options_in_one_line():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "app.cli", "cluster", "--local-nodes", "99"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "--local-nodes must be 0..8" in proc.stderr
    assert "Traceback" not in proc.stderr
