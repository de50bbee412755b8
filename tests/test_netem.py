"""app.loadtest.netem: seeded impairment decisions, and proof over loopback that they are what actually happens."""

from __future__ import annotations

import asyncio
import math
import struct
import time

import pytest
from scipy import stats

from app.loadtest.netem import (
    SCENARIOS,
    DelayStep,
    GilbertElliott,
    Impairment,
    NetemLink,
    NetemProfile,
    parse_profile,
)


def _run(profile: NetemProfile, n: int, seed: int = 0, spacing_s: float = 0.01) -> list:
    imp = Impairment(profile, seed=seed)
    return [imp.decide(i * spacing_s, 1200) for i in range(n)]


def test_same_seed_same_fate_other_seed_differs():
    profile = NetemProfile(loss=0.1, delay_ms=20, jitter_ms=10, reorder=0.05)
    a, b, c = _run(profile, 2000, 7), _run(profile, 2000, 7), _run(profile, 2000, 8)
    assert a == b
    assert [v.delay_s for v in a] != [v.delay_s for v in c]


def test_random_loss_rate_within_binomial_bounds():
    n, p = 20_000, 0.05
    verdicts = _run(NetemProfile(loss=p), n, seed=3)
    dropped = sum(v.delay_s is None for v in verdicts)
    sigma = math.sqrt(n * p * (1 - p))
    print(f"random loss: {dropped}/{n} = {dropped / n:.4f} (target {p})")
    assert abs(dropped - n * p) < 4 * sigma


def test_gilbert_elliott_mean_loss_and_burst_length():
    ge = GilbertElliott(p_gb=0.0125, p_bg=0.25)
    n = 40_000
    verdicts = _run(NetemProfile(burst=ge), n, seed=5)
    lost = [v.delay_s is None for v in verdicts]
    rate = sum(lost) / n
    bursts, run = [], 0
    for x in lost:
        if x:
            run += 1
        elif run:
            bursts.append(run)
            run = 0
    mean_burst = sum(bursts) / len(bursts)
    print(f"GE loss {rate:.4f} (target {ge.mean_loss:.4f}), mean burst {mean_burst:.2f} (target 4)")
    assert abs(rate - ge.mean_loss) < 0.012
    assert 3.0 < mean_burst < 5.0  # clearly bursty: independent 5 % loss would give ~1.05


def test_delay_and_jitter_distribution():
    # Packets 50 ms apart so FIFO never binds: the applied delay is the drawn one, uniform 30..70 ms.
    verdicts = _run(NetemProfile(delay_ms=50, jitter_ms=20), 3000, seed=1, spacing_s=0.05)
    delays = [v.delay_s * 1000 for v in verdicts]
    assert 30.0 - 1e-9 <= min(delays) and max(delays) <= 70.0 + 1e-9
    ks = stats.kstest(delays, stats.uniform(loc=30, scale=40).cdf)
    print(f"delay mean {sum(delays) / len(delays):.2f} ms, KS p={ks.pvalue:.3f}")
    assert ks.pvalue > 0.001


def test_fifo_never_reorders_but_reorder_does():
    fifo = Impairment(NetemProfile(delay_ms=50, jitter_ms=40), seed=2)
    arrivals = [i * 0.002 + fifo.decide(i * 0.002).delay_s for i in range(2000)]
    assert all(b >= a - 1e-9 for a, b in zip(arrivals, arrivals[1:], strict=False))
    assert fifo.stats.reordered == 0
    imp = Impairment(NetemProfile(delay_ms=10, reorder=0.1, reorder_gap_ms=30), seed=2)
    for i in range(2000):
        imp.decide(i * 0.002)
    assert 100 < imp.stats.reordered < 400  # ~10 % held back 30 ms overtaken by later ones


def test_stepwise_degradation_and_first_frame_block():
    steps = NetemProfile(steps=(DelayStep(0.0, 50), DelayStep(3.0, 200), DelayStep(6.0, 1200)))
    imp = Impairment(steps)
    got = {t: imp.decide(t).delay_s * 1000 for t in (0.5, 2.9, 3.1, 5.0, 6.5, 9.0)}
    assert got[0.5] == pytest.approx(50) and got[2.9] == pytest.approx(50)
    assert got[3.1] == pytest.approx(200) and got[5.0] == pytest.approx(200)
    assert got[6.5] == pytest.approx(1200) and got[9.0] == pytest.approx(1200)
    block = Impairment(NetemProfile(block_first_s=2.0))
    assert block.decide(0.0, media=False).delay_s == 0.0  # the DTLS handshake is not blocked
    arrivals = [t + block.decide(t).delay_s for t in (0.0, 0.5, 1.9, 2.5)]
    assert arrivals == pytest.approx([2.0, 2.0, 2.0, 2.5])


def test_link_jitter_stays_in_range_and_wanders():
    imp = Impairment(SCENARIOS["link-jitter"], seed=4)
    delays = [imp.decide(i * 0.02).delay_s * 1000 for i in range(1000)]  # 20 s
    assert min(delays) >= 10.0 - 1e-6
    assert max(delays) > 300.0
    # FIFO: a drop in the link delay drains the queue instead of letting packets overtake.
    assert imp.stats.reordered == 0


def test_parse_profile():
    p = parse_profile("loss=5%,delay=40ms,jitter=0.01s")
    assert p == NetemProfile(loss=0.05, delay_ms=40, jitter_ms=10)
    assert parse_profile("loss5,delay=20ms") == NetemProfile(loss=0.05, delay_ms=20)
    assert parse_profile("steps=0:50ms/3s:200ms").steps == (DelayStep(0.0, 50), DelayStep(3.0, 200))
    assert parse_profile("burst=1%/25%").burst == GilbertElliott(0.01, 0.25)
    for bad in ("loss=2", "nonsense", "delay=fast", "jitter=-3ms"):
        with pytest.raises(ValueError):
            parse_profile(bad)


async def _connected_pair():
    from aioice import Connection

    a = Connection(ice_controlling=True, use_ipv6=False)
    b = Connection(ice_controlling=False, use_ipv6=False)
    await asyncio.gather(a.gather_candidates(), b.gather_candidates())
    for x, y in ((a, b), (b, a)):
        for c in y.local_candidates:
            await x.add_remote_candidate(c)
        await x.add_remote_candidate(None)
        x.remote_username, x.remote_password = y.local_username, y.local_password
    await asyncio.wait_for(asyncio.gather(a.connect(), b.connect()), 10)
    return a, b


async def test_loopback_applies_exactly_the_decided_fate_both_ways():
    a, b = await _connected_pair()
    verdicts: dict[str, dict[int, float | None]] = {"up": {}, "down": {}}
    link = NetemLink(NetemProfile(loss=0.2, delay_ms=30, jitter_ms=10), seed=11,
                     on_verdict=lambda d, v: verdicts[d].__setitem__(v.index, v.delay_s))
    link.attach_connection(a)
    n = 300
    sent: dict[str, dict[int, float]] = {"up": {}, "down": {}}
    got: dict[str, dict[int, float]] = {"up": {}, "down": {}}

    async def receive(conn, direction: str) -> None:
        while True:
            data = await conn.recv()
            got[direction][struct.unpack("!I", data[:4])[0]] = time.monotonic()

    readers = [asyncio.create_task(receive(b, "up")), asyncio.create_task(receive(a, "down"))]
    try:
        for i in range(n):
            for conn, direction in ((a, "up"), (b, "down")):
                sent[direction][i] = time.monotonic()
                await conn.send(struct.pack("!I", i) + bytes(200))
            await asyncio.sleep(0.003)
        await asyncio.sleep(0.3)
    finally:
        for r in readers:
            r.cancel()
        await asyncio.gather(a.close(), b.close(), return_exceptions=True)
    for direction in ("up", "down"):
        # Datagram index == sequence number: nothing but our datagrams crossed the hook.
        decided = {i for i, d in verdicts[direction].items() if d is not None}
        assert len(verdicts[direction]) == n
        assert set(got[direction]) == decided, direction
        loss = 1 - len(decided) / n
        errors = sorted((got[direction][i] - sent[direction][i]) - verdicts[direction][i] for i in decided)
        print(f"{direction}: loss {loss:.3f}, delay error median {errors[len(errors) // 2] * 1000:.2f} ms")
        assert 0.1 < loss < 0.3
        assert errors[0] > -0.002  # never early
        assert errors[len(errors) // 2] < 0.015  # and on time (the machine is shared: loose bound)
    assert link.stats()["up"]["offered"] == n and link.stats()["down"]["offered"] == n


async def test_attach_pc_impairs_a_real_peer_connection_both_ways():
    from aiortc import RTCConfiguration, RTCPeerConnection

    cfg = RTCConfiguration(iceServers=[])
    pc1, pc2 = RTCPeerConnection(cfg), RTCPeerConnection(cfg)
    channel = pc1.createDataChannel("events")
    link = NetemLink(NetemProfile(delay_ms=100))
    echoed: asyncio.Queue[float] = asyncio.Queue(maxsize=16)

    @pc2.on("datachannel")
    def on_channel(ch) -> None:
        ch.on("message", lambda m: ch.send(m))

    channel.on("message", lambda m: echoed.put_nowait(time.monotonic() - float(m)))
    try:
        await pc1.setLocalDescription(await pc1.createOffer())
        assert link.attach_pc(pc1) == 1  # bundled: one ICE connection
        await pc2.setRemoteDescription(pc1.localDescription)
        await pc2.setLocalDescription(await pc2.createAnswer())
        await pc1.setRemoteDescription(pc2.localDescription)
        opened = asyncio.Event()
        channel.on("open", opened.set)
        if channel.readyState != "open":
            await asyncio.wait_for(opened.wait(), 15)
        rtts = []
        for _ in range(3):
            channel.send(repr(time.monotonic()))
            rtts.append(await asyncio.wait_for(echoed.get(), 5))
        print(f"datachannel RTT with 100 ms each way: {[round(r * 1000) for r in rtts]} ms")
        assert min(rtts) >= 0.195  # 100 ms up + 100 ms down
        assert link.stats()["up"]["delivered"] > 0 and link.stats()["down"]["delivered"] > 0
    finally:
        await asyncio.gather(pc1.close(), pc2.close())
