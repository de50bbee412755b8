"""The session clock: every incoming track's RTP time mapped onto one timeline, in seconds.

Each track has its own RTP clock with a random origin, so two mappings put them on one timeline:
until a track's first RTCP sender report (SR), the arrival of its first packet anchors its RTP time
(``arrival`` mode, good to network jitter); once it has an SR, ``ntp(rtp) = sr_ntp + (rtp - sr_rtp)
/ rate`` puts it on the sender's capture clock (``sender`` mode), which makes audio and video agree.

Zero is the pts of the first media received. The reference track (audio: word times are what the
product promises) keeps the time its first packet's arrival gave it; the sender-clock offset is
chosen so that it stays continuous and the other tracks join it on the sender clock. Until the
reference has an SR, the first track that has one holds the offset (later moves are ``steps``):
anchoring on whichever SR came first let video's encode delay shift every audio time.

Pure arithmetic, no I/O: the server feeds it arrival times and SRs, tests feed it numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

_WRAP = 1 << 32


@dataclass(frozen=True)
class SenderReport:
    """One RTCP SR: the sender's NTP time (s) at RTP timestamp ``rtp`` (raw 32-bit) of a track."""

    ntp: float
    rtp: int


def ntp_to_seconds(ntp64: int) -> float:
    """A 64-bit NTP timestamp (32.32 fixed point) in seconds."""
    return (ntp64 >> 32) + (ntp64 & 0xFFFFFFFF) / 2**32


def rtp_diff(a: int, b: int) -> int:
    """``a - b`` for 32-bit RTP timestamps, taking the shortest way round the wrap."""
    d = (a - b) % _WRAP
    return d - _WRAP if d >= _WRAP // 2 else d


class TrackClock:
    """One track's RTP clock; owned by a :class:`SessionClock`."""

    def __init__(self, session: SessionClock, name: str, rate: int) -> None:
        self.session = session
        self.name = name
        self.rate = rate
        self.origin: int | None = None  # raw RTP timestamp that aiortc's frame.pts counts from
        self.first_pts: int | None = None
        self.first_arrival: float | None = None
        self.sr: SenderReport | None = None
        self.last_time: float | None = None
        self.last_pts_seen = 0
        self.sender_offset: float | None = None  # sender NTP s at aiortc pts 0
        self._pending_sr: SenderReport | None = None

    @property
    def mode(self) -> str:
        return "sender" if self.sender_offset is not None and self.session.ntp_zero is not None else "arrival"

    def on_first_packet(self, rtp: int, arrival: float) -> None:
        """The track's first RTP packet arrived at wall ``arrival``: the arrival-mode anchor.

        Packet arrival is earlier and steadier than decoded-frame arrival (a receiver's jitter
        buffer holds the first audio packets back), so it is preferred when it can be observed.
        """
        if self.first_pts is not None:
            return
        self.set_origin(rtp)
        self.first_pts = rtp_diff(rtp % _WRAP, self.origin) if self.origin is not None else 0
        self.first_arrival = arrival
        self.session._first_media(arrival)

    def set_origin(self, rtp: int) -> None:
        """The raw RTP timestamp of the track's first packet (frame.pts 0 in aiortc)."""
        if self.origin is None:
            self.origin = rtp % _WRAP

    def on_sender_report(self, report: SenderReport) -> None:
        """Adopt a sender report; the first one on the session fixes the sender-clock offset.

        A sender may stamp its SR with the send time of a packet rather than the capture time of its
        RTP timestamp (aiortc does: encode time leaks in), so of all reports the one giving the
        earliest capture time for RTP zero is kept — the least-delayed one.
        """
        self._pending_sr = report
        if self.origin is None or self.first_pts is None:
            return
        self._pending_sr = None
        offset = report.ntp - rtp_diff(report.rtp, self.origin) / self.rate
        if self.sender_offset is not None and offset >= self.sender_offset:
            return
        before = self.session.current_times()
        self.sender_offset = offset
        self.sr = report
        if self.session.ntp_zero is None or self.name == self.session.reference:
            # Keep this track continuous: its first frame keeps the session time it had.
            self.session.ntp_zero = self._ntp(self.first_pts) - self._arrival_time(self.first_pts)
        self.session.count_steps(before)

    def time(self, pts: int, arrival: float | None) -> float:
        """Session seconds of the frame whose aiortc pts (RTP units from the first packet) is ``pts``.

        ``arrival`` is the wall time the frame arrived (monotonic s); needed for the first frame.
        """
        if self.first_pts is None:
            if arrival is None:
                raise ValueError(f"first {self.name} frame needs its arrival time")
            self.first_pts = pts
            self.first_arrival = arrival
            self.session._first_media(arrival)
        self.last_pts_seen = pts
        if self._pending_sr is not None and self.origin is not None:
            self.on_sender_report(self._pending_sr)
        t = self.last_time = self.map(pts)
        return t

    def map(self, pts: int) -> float:
        """Session seconds of ``pts`` under the mapping in force now (no side effects)."""
        if self.mode == "sender" and self.origin is not None:
            return self._ntp(pts) - self.session.ntp_zero  # type: ignore[operator]
        return self._arrival_time(pts)

    def _arrival_time(self, pts: int) -> float:
        assert self.first_arrival is not None and self.first_pts is not None
        zero = self.session.zero_wall
        assert zero is not None
        return self.first_arrival - zero + (pts - self.first_pts) / self.rate

    def _ntp(self, pts: int) -> float:
        assert self.sender_offset is not None
        return self.sender_offset + pts / self.rate


class SessionClock:
    """Maps every track of one session onto seconds since the first media received."""

    def __init__(self, reference: str = "audio") -> None:
        self.reference = reference  # the track whose arrival-anchored time the others join
        self.zero_wall: float | None = None  # arrival wall time of the first media
        self.ntp_zero: float | None = None  # sender NTP seconds at session time zero
        self.steps = 0  # times a track's mapping moved by > 1 ms when an SR arrived
        self._tracks: dict[str, TrackClock] = {}

    def track(self, name: str, rate: int) -> TrackClock:
        """The clock of track ``name`` (created on first use) with RTP ``rate`` Hz."""
        clock = self._tracks.get(name)
        if clock is None:
            clock = self._tracks[name] = TrackClock(self, name, rate)
        return clock

    @property
    def started(self) -> bool:
        return self.zero_wall is not None

    def wall_of(self, t: float) -> float | None:
        """The local wall time (arrival basis) at which session time ``t`` was received."""
        return None if self.zero_wall is None else self.zero_wall + t

    def modes(self) -> dict[str, str]:
        return {name: c.mode for name, c in self._tracks.items()}

    def current_times(self) -> dict[str, float]:
        """Each track's time for the last pts it saw, under the mapping in force now."""
        return {name: c.map(c.last_pts_seen) for name, c in self._tracks.items() if c.last_time is not None}

    def count_steps(self, before: dict[str, float]) -> None:
        """Count the tracks a new mapping moved by more than 1 ms."""
        after = self.current_times()
        self.steps += sum(abs(after[name] - t) > 1e-3 for name, t in before.items() if name in after)

    def _first_media(self, arrival: float) -> None:
        if self.zero_wall is None:
            self.zero_wall = arrival
