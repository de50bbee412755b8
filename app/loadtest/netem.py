"""Userspace network impairment for one WebRTC peer: seeded loss, burst loss, delay, jitter, reordering.

The kernel's netem qdisc is not available here, so load-test peers impair their own datagrams at
aioice's ``Connection.sendto`` / ``data_received`` (every DTLS, SRTP and SCTP datagram passes there;
replacing them on the instance impairs both directions of that peer only). STUN is left alone, so a
lossy link stays "connected" the way a real one does while ICE keeps working.

Every decision comes from a ``random.Random`` seeded by (seed, direction), advanced once per
datagram: runs are reproducible. Time-varying profiles (stepwise degradation, link jitter,
first-frame blocking) use link time: seconds since the first RTP/RTCP datagram in either direction
(RFC 7983), so the DTLS handshake before it is never "first-frame blocked".
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import aioice
    from aiortc import RTCPeerConnection

import app.live.webrtc  # noqa: F401  (patches aioice internals: the version pin)

#: How many per-packet delays each direction keeps for reports (the counters are exact regardless).
MAX_DELAY_SAMPLES = 50_000


@dataclass(frozen=True)
class GilbertElliott:
    """Two-state burst loss: Good→Bad with ``p_gb`` per packet, Bad→Good with ``p_bg``.

    The stationary loss is ``(p_gb·loss_bad + p_bg·loss_good) / (p_gb + p_bg)``; the mean burst length
    in the Bad state is ``1 / p_bg`` packets.
    """

    p_gb: float
    p_bg: float
    loss_good: float = 0.0
    loss_bad: float = 1.0

    @property
    def mean_loss(self) -> float:
        total = self.p_gb + self.p_bg
        if total <= 0:
            return self.loss_good
        return (self.p_gb * self.loss_bad + self.p_bg * self.loss_good) / total


@dataclass(frozen=True)
class DelayStep:
    """From ``at_s`` seconds of link time on, the base delay is ``delay_ms``."""

    at_s: float
    delay_ms: float


@dataclass(frozen=True)
class NetemProfile:
    """What happens to each datagram in one direction.

    * ``loss``: independent (Bernoulli) drop probability; ``burst`` adds Gilbert-Elliott burst loss.
    * ``delay_ms`` + ``jitter_ms``: base delay plus a uniform draw in ``[-jitter, +jitter]`` (clipped at 0).
    * ``steps``: stepwise base delay (overrides ``delay_ms`` from each step's time on).
    * ``link_jitter_ms``: ``(lo, hi)``: the base delay is redrawn uniformly in ``[lo, hi]`` every
      ``link_jitter_period_s`` (a link whose queueing delay wanders).
    * ``reorder``: probability a datagram is held back ``reorder_gap_ms`` more, so later ones overtake it.
      With ``reorder == 0`` the link is FIFO: jitter delays a datagram but never lets a later one pass.
    * ``block_first_s``: nothing is delivered before this much link time (first-frame blocking:
      media, RTCP and the DataChannel alike); the held datagrams are released together then.
    * ``max_in_flight``: bound on datagrams held at once; beyond it they are dropped and counted.
    """

    loss: float = 0.0
    burst: GilbertElliott | None = None
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    steps: tuple[DelayStep, ...] = ()
    link_jitter_ms: tuple[float, float] | None = None
    link_jitter_period_s: float = 0.5
    reorder: float = 0.0
    reorder_gap_ms: float = 30.0
    block_first_s: float = 0.0
    max_in_flight: int = 4096

    def __post_init__(self) -> None:
        for name in ("loss", "reorder"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {v}")
        for name in ("delay_ms", "jitter_ms", "reorder_gap_ms", "block_first_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.burst is not None:
            for name in ("p_gb", "p_bg", "loss_good", "loss_bad"):
                v = getattr(self.burst, name)
                if not 0.0 <= v <= 1.0:
                    raise ValueError(f"burst.{name} must be a probability in [0, 1], got {v}")
        if self.link_jitter_ms is not None:
            lo, hi = self.link_jitter_ms
            if not 0 <= lo <= hi:
                raise ValueError(f"link_jitter_ms needs 0 <= lo <= hi, got {self.link_jitter_ms}")
            if self.link_jitter_period_s <= 0:
                raise ValueError("link_jitter_period_s must be > 0")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")

    @property
    def is_clean(self) -> bool:
        return self == NetemProfile(max_in_flight=self.max_in_flight)

    def describe(self) -> dict[str, object]:
        """The non-default settings, for reports."""
        base = asdict(NetemProfile())
        return {k: v for k, v in asdict(self).items() if v != base[k]}


#: Named scenarios for the load test (``--netem NAME``), including the delay-mutation ones.
SCENARIOS: dict[str, NetemProfile] = {
    "clean": NetemProfile(),
    "loss1": NetemProfile(loss=0.01),
    "loss5": NetemProfile(loss=0.05),
    "burst5": NetemProfile(burst=GilbertElliott(p_gb=0.0125, p_bg=0.25)),  # 5 %, mean burst 4 packets
    "delay100": NetemProfile(delay_ms=100.0, jitter_ms=10.0),
    "reorder": NetemProfile(delay_ms=20.0, reorder=0.05, reorder_gap_ms=30.0),
    "link-jitter": NetemProfile(link_jitter_ms=(10.0, 500.0), link_jitter_period_s=0.5),
    "stepwise": NetemProfile(steps=(DelayStep(0.0, 50.0), DelayStep(3.0, 200.0), DelayStep(6.0, 1200.0))),
    "first-frame-block": NetemProfile(block_first_s=2.0),
}

_NUM = r"([0-9]*\.?[0-9]+)"


def _ms(text: str) -> float:
    m = re.fullmatch(_NUM + r"\s*(ms|s)?", text.strip())
    if not m:
        raise ValueError(f"not a duration: {text!r} (e.g. 40ms, 1.5s)")
    v = float(m.group(1))
    return v * 1000.0 if m.group(2) == "s" else v


def _prob(text: str) -> float:
    m = re.fullmatch(_NUM + r"\s*(%)?", text.strip())
    if not m:
        raise ValueError(f"not a probability: {text!r} (e.g. 5% or 0.05)")
    v = float(m.group(1))
    return v / 100.0 if m.group(2) else v


def parse_profile(spec: str) -> NetemProfile:
    """A scenario name, or ``key=value`` pairs joined by commas, optionally on top of a scenario.

    Keys: ``loss``, ``delay``, ``jitter``, ``reorder``, ``gap``, ``block``, ``burst`` (``p_gb/p_bg``),
    ``steps`` (``0:50ms/3s:200ms/6s:1200ms``), ``link`` (``10ms-500ms``), ``period``.
    Example: ``loss5,delay=40ms`` or ``loss=2%,jitter=15ms``.
    """
    spec = spec.strip()
    if not spec:
        return NetemProfile()
    profile = NetemProfile()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            if part not in SCENARIOS:
                raise ValueError(f"unknown netem scenario {part!r}; known: {', '.join(SCENARIOS)}")
            profile = SCENARIOS[part]
            continue
        key, value = (s.strip() for s in part.split("=", 1))
        if key == "loss":
            profile = replace(profile, loss=_prob(value))
        elif key == "delay":
            profile = replace(profile, delay_ms=_ms(value))
        elif key == "jitter":
            profile = replace(profile, jitter_ms=_ms(value))
        elif key == "reorder":
            profile = replace(profile, reorder=_prob(value))
        elif key == "gap":
            profile = replace(profile, reorder_gap_ms=_ms(value))
        elif key == "block":
            profile = replace(profile, block_first_s=_ms(value) / 1000.0)
        elif key == "period":
            profile = replace(profile, link_jitter_period_s=_ms(value) / 1000.0)
        elif key == "burst":
            p_gb, p_bg = (_prob(x) for x in value.split("/", 1))
            profile = replace(profile, burst=GilbertElliott(p_gb, p_bg))
        elif key == "link":
            lo, hi = (_ms(x) for x in value.split("-", 1))
            profile = replace(profile, link_jitter_ms=(lo, hi))
        elif key == "steps":
            steps = []
            for item in value.split("/"):
                at, d = item.split(":", 1)
                steps.append(DelayStep(_ms(at) / 1000.0 if at.strip() not in ("0", "") else 0.0, _ms(d)))
            profile = replace(profile, steps=tuple(sorted(steps, key=lambda s: s.at_s)))
        else:
            raise ValueError(f"unknown netem key {key!r} in {spec!r}")
    return profile


@dataclass(frozen=True)
class Verdict:
    """The fate of one datagram: dropped (``delay_s is None``) or delivered after ``delay_s``."""

    index: int
    t: float  # link time: seconds since the link's first media datagram
    delay_s: float | None
    reason: str = ""  # "loss", "burst", "overflow" for drops


@dataclass
class DirectionStats:
    """Exact counters for one direction, plus a bounded sample of applied delays (ms)."""

    offered: int = 0
    delivered: int = 0
    dropped_loss: int = 0
    dropped_burst: int = 0
    dropped_overflow: int = 0
    reordered: int = 0
    bytes_offered: int = 0
    delays_ms: list[float] = field(default_factory=list)

    @property
    def dropped(self) -> int:
        return self.dropped_loss + self.dropped_burst + self.dropped_overflow

    @property
    def loss_rate(self) -> float:
        return self.dropped / self.offered if self.offered else 0.0

    def summary(self) -> dict[str, float | int]:
        d = sorted(self.delays_ms)

        def q(p: float) -> float:
            return round(d[min(int(p * len(d)), len(d) - 1)], 2) if d else 0.0

        return {
            "offered": self.offered, "delivered": self.delivered, "dropped": self.dropped,
            "dropped_loss": self.dropped_loss, "dropped_burst": self.dropped_burst,
            "dropped_overflow": self.dropped_overflow, "reordered": self.reordered,
            "loss_rate": round(self.loss_rate, 5), "delay_ms_p50": q(0.5), "delay_ms_p95": q(0.95),
            "delay_ms_max": round(d[-1], 2) if d else 0.0,
        }


class Impairment:
    """Decides the fate of each datagram in one direction; pure apart from its seeded RNG.

    ``decide(t)`` is called once per datagram in send order with the link time ``t``; the
    result does not depend on wall-clock scheduling, only on (profile, seed, direction, t, media).
    ``media=False`` (handshake datagrams before the first RTP) is exempt from first-frame blocking.
    """

    def __init__(self, profile: NetemProfile, seed: int = 0, direction: str = "up") -> None:
        self.profile = profile
        self._rng = random.Random(f"synchrony-netem:{seed}:{direction}")
        self._link_rng = random.Random(f"synchrony-netem-link:{seed}:{direction}")
        self._bad = False
        self._last_delivery = -math.inf
        self._overtakable: dict[int, float] = {}  # index -> arrival, datagrams still in flight
        self._link_slot = -1
        self._link_delay_ms = 0.0
        self._index = 0
        self.in_flight = 0
        self.stats = DirectionStats()

    def _base_delay_ms(self, t: float) -> float:
        p = self.profile
        base = p.delay_ms
        for step in p.steps:
            if t >= step.at_s:
                base = step.delay_ms
        if p.link_jitter_ms is not None:
            slot = int(t // p.link_jitter_period_s)
            while self._link_slot < slot:  # one draw per elapsed period, so draws don't depend on traffic
                self._link_slot += 1
                self._link_delay_ms = self._link_rng.uniform(*p.link_jitter_ms)
            base += self._link_delay_ms
        return base

    def decide(self, t: float, size: int = 0, media: bool = True) -> Verdict:
        p = self.profile
        rng = self._rng
        index = self._index
        self._index += 1
        st = self.stats
        st.offered += 1
        st.bytes_offered += size
        # Draw every random number every time, so one datagram's fate never shifts another's.
        u_loss, u_state, u_burst, u_jit, u_re = (rng.random() for _ in range(5))
        base_ms = self._base_delay_ms(t)
        if p.burst is not None:
            if self._bad:
                self._bad = u_state >= p.burst.p_bg
            else:
                self._bad = u_state < p.burst.p_gb
        if u_loss < p.loss:
            st.dropped_loss += 1
            return Verdict(index, t, None, "loss")
        if p.burst is not None and u_burst < (p.burst.loss_bad if self._bad else p.burst.loss_good):
            st.dropped_burst += 1
            return Verdict(index, t, None, "burst")
        if self.in_flight >= p.max_in_flight:
            st.dropped_overflow += 1
            return Verdict(index, t, None, "overflow")
        delay_ms = max(base_ms + (2.0 * u_jit - 1.0) * p.jitter_ms, 0.0)
        if u_re < p.reorder:
            delay_ms += p.reorder_gap_ms
        arrival = t + delay_ms / 1000.0
        if media and p.block_first_s > 0 and arrival < p.block_first_s:
            arrival = p.block_first_s
        if p.reorder == 0.0:  # FIFO link: nobody overtakes
            arrival = max(arrival, self._last_delivery)
        else:  # RFC 4737 view: an earlier datagram is reordered once a later one arrives before it
            pending = self._overtakable
            for j in [j for j, a in pending.items() if a <= t or a > arrival]:
                if pending.pop(j) > arrival:
                    st.reordered += 1
            pending[index] = arrival
        self._last_delivery = arrival
        delay_s = arrival - t
        st.delivered += 1
        if len(st.delays_ms) < MAX_DELAY_SAMPLES:
            st.delays_ms.append(delay_s * 1000.0)
        return Verdict(index, t, delay_s)


class NetemLink:
    """Both directions of one peer's link: hook it into aioice connections or a whole RTCPeerConnection.

    ``up`` is what the peer sends, ``down`` what it receives. ``on_verdict`` (if given) sees every
    decision with its direction, for tests and timelines.
    """

    def __init__(
        self,
        profile: NetemProfile,
        seed: int = 0,
        down: NetemProfile | None = None,
        on_verdict: Callable[[str, Verdict], None] | None = None,
    ) -> None:
        self.up = Impairment(profile, seed, "up")
        self.down = Impairment(down if down is not None else profile, seed, "down")
        self._t0: float | None = None
        self._on_verdict = on_verdict
        self._hooked: list[aioice.Connection] = []
        self._pending: set[asyncio.Task] = set()

    def _now(self, data: bytes) -> tuple[float, bool]:
        """Link time and whether the link carries media yet (this datagram or an earlier one is RTP)."""
        now = time.monotonic()
        if self._t0 is None:
            if not (data and 128 <= data[0] <= 191):
                return 0.0, False
            self._t0 = now
        return now - self._t0, True

    def stats(self) -> dict[str, dict[str, float | int]]:
        return {"up": self.up.stats.summary(), "down": self.down.stats.summary()}

    def attach_connection(self, conn: aioice.Connection) -> None:
        """Impair an ``aioice.Connection`` (both directions). Idempotent per connection."""
        if any(c is conn for c in self._hooked):
            return
        orig_sendto: Callable[[bytes, int], Awaitable[None]] = conn.sendto
        orig_received: Callable[[bytes, int], None] = conn.data_received
        link = self

        async def sendto(data: bytes, component: int) -> None:
            t, media = link._now(data)
            verdict = link.up.decide(t, len(data), media)
            if link._on_verdict is not None:
                link._on_verdict("up", verdict)
            if verdict.delay_s is None:
                return
            if verdict.delay_s <= 0.0:
                await orig_sendto(data, component)
                return
            link.up.in_flight += 1
            loop = asyncio.get_running_loop()
            loop.call_later(verdict.delay_s, link._send_later, orig_sendto, data, component)

        def data_received(data: bytes, component: int) -> None:
            t, media = link._now(data)
            verdict = link.down.decide(t, len(data), media)
            if link._on_verdict is not None:
                link._on_verdict("down", verdict)
            if verdict.delay_s is None:
                return
            if verdict.delay_s <= 0.0:
                orig_received(data, component)
                return
            link.down.in_flight += 1
            loop = asyncio.get_running_loop()
            loop.call_later(verdict.delay_s, link._receive_later, orig_received, data, component)

        conn.sendto = sendto
        conn.data_received = data_received
        self._hooked.append(conn)

    def _send_later(self, orig: Callable[[bytes, int], Awaitable[None]], data: bytes, component: int) -> None:
        self.up.in_flight -= 1
        task = asyncio.ensure_future(orig(data, component))
        self._pending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task) -> None:
        self._pending.discard(task)
        if not task.cancelled():
            task.exception()  # a link closed meanwhile: the datagram is lost, as on a real network

    def _receive_later(self, orig: Callable[[bytes, int], None], data: bytes, component: int) -> None:
        self.down.in_flight -= 1
        orig(data, component)

    def attach_pc(self, pc: RTCPeerConnection) -> int:
        """Impair every ICE connection of an aiortc ``RTCPeerConnection``; returns how many were hooked.

        Call it after ``setLocalDescription`` (the transports exist then) and before media flows.
        """
        conns = []
        for transceiver in pc.getTransceivers():
            dtls = transceiver.sender.transport
            if dtls is not None:
                conns.append(dtls.transport._connection)
        if pc.sctp is not None:
            conns.append(pc.sctp.transport.transport._connection)
        before = len(self._hooked)
        for conn in conns:
            self.attach_connection(conn)
        return len(self._hooked) - before
