"""The load test's records: what a peer measured, what a round pooled, what a run reports.

Frozen dataclasses between the stages (a worker process → the round → the plan → the report); each writes
itself as the JSON object the report has always had (``to_json()``: same keys, same order), so
report.json, the tests and the docs that read it see no change. ``verdict.aggregate`` (the round's
bounds) still reads the peers' JSON form. The figures per peer come from ``app.loadtest.metrics``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from alignment.json_types import JsonObject
from app.loadtest.config import RoundConfig
from app.loadtest.cpusampler import CpuSample, SteadyCpu
from app.loadtest.metrics import AnswerStats, LatencySummary, Level3Figures, Record, TurnFigures

#: One heard word: [truth start, truth end, first token arrival, final arrival, text, matched by] (peer clock, s).
WordRow = tuple[float, float, float | None, float | None, str, str]
#: One token event: [arrival, text, start, end, final, utterance, index] (arrival on the peer clock).
TokenRow = tuple[float | None, object, object, object, bool, object, object]
#: One Level-3 check: [arrival, max delta ms, ok].
SyncRow = tuple[float | None, object, bool]
#: One spoken answer: [reason, voice-to-voice ms, stop ms, lip-sync ms, false interruption].
AnswerRow = tuple[object, object, object, object, object]


@dataclass(frozen=True)
class AnswerSummary:
    """The spoken answers as one peer received them: counted always, measured when it decoded them."""

    decoded: bool
    audio_packets: int
    audio_bytes: int
    avatar_frames: int
    starts: int
    stats: AnswerStats | None = None  # with per-answer rows, when decoded against the clip's truth
    per_answer: list[AnswerRow] = field(default_factory=list)

    def to_json(self) -> JsonObject:
        out: JsonObject = {"decoded": self.decoded, "audio_packets": self.audio_packets,
                           "audio_bytes": self.audio_bytes, "avatar_frames": self.avatar_frames, "starts": self.starts}
        if self.stats is not None:
            out.update(self.stats.to_json())
            out["per_answer"] = [list(r) for r in self.per_answer]
        return out


@dataclass(frozen=True)
class PeerFigures:
    """What one connected peer measured, on its own clock (zero = clip time zero sent)."""

    run_s: float
    events: dict[str, int]  # events received, by type
    hello: JsonObject | None  # the server's hello message (version, fps, output_delay_s, stages)
    clock_lag_ms: float | None
    unmatched_tokens: int
    latency: LatencySummary
    words: list[WordRow]
    tokens: list[TokenRow]
    responses: TurnFigures
    level3: Level3Figures
    sync_timeline: list[SyncRow]
    lst_last: JsonObject | None  # the last ``lst`` event as it came
    lst_ttft_ms: list[float]  # server-measured LST samples (wire: response.ttft_ms / itl_ms), for --require-lst
    lst_itl_ms: list[float]
    frames_received: int
    video_decoded: bool
    video_fps: float | None
    first_video_ms: float | None
    frames_per_s: list[int]
    flashes_seen: int
    flash_lag_ms: list[float]
    flash_lag_ms_p50: float | None
    answer: AnswerSummary

    def to_json(self) -> JsonObject:
        out: JsonObject = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(latency=self.latency.to_json(), responses=self.responses.to_json(), level3=self.level3.to_json(),
                   answer=self.answer.to_json(), words=[list(w) for w in self.words],
                   tokens=[list(t) for t in self.tokens], sync_timeline=[list(s) for s in self.sync_timeline])
        return out


@dataclass(frozen=True)
class Refusal(Record):
    """The server was full: 503 and when to retry."""

    status: int
    retry_after: str | None


@dataclass(frozen=True)
class PeerResult:
    """One peer's run: who it was, whether it connected, and (connected) its figures."""

    index: int
    worker: int
    offset_ms: float
    netem: str
    connected: bool = False
    error: str | None = None
    location: str | None = None  # behind a cluster ingress, it names the node (/whip/<node>/<session>)
    connect_ms: float | None = None
    refused: Refusal | None = None
    netem_stats: dict[str, dict[str, float | int]] | None = None
    figures: PeerFigures | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"index": self.index, "worker": self.worker, "offset_ms": self.offset_ms,
                           "netem": self.netem, "connected": self.connected, "error": self.error}
        if self.connected:
            out["location"], out["connect_ms"] = self.location, self.connect_ms
        if self.refused is not None:
            out["refused"] = self.refused.to_json()
        if self.netem_stats is not None:
            out["netem_stats"] = self.netem_stats
        if self.figures is not None:
            out.update(self.figures.to_json())
        return out


@dataclass(frozen=True)
class WorkerReport:
    """What one worker process sends back: its peers' results and its CPU (or why it failed)."""

    worker: int
    peers: list[PeerResult]
    cpu_s: float | None = None
    cpu_setup_s: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class DecodedAnswers(Record):
    """The round's spoken-answer figures pooled over the peers that decoded their answers."""

    answers: int
    voice_to_voice_ms_p50: float | None
    voice_to_voice_ms_p95: float | None
    barge_ins: int
    stop_ms_p50: float | None
    stop_ms_p99: float | None
    false_interruptions: int
    false_interruption_rate: float | None
    lip_sync_ms_p50: float | None
    lip_sync_abs_ms_p95: float | None


@dataclass(frozen=True)
class PooledAnswers:
    """The round's spoken answers: counts over every connected peer, figures over those that decoded."""

    starts: int
    audio_packets: int
    avatar_frames: int
    decoded: DecodedAnswers | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"starts": self.starts, "audio_packets": self.audio_packets,
                           "avatar_frames": self.avatar_frames}
        return out if self.decoded is None else {**out, **self.decoded.to_json()}


@dataclass(frozen=True)
class RoundResult:
    """One round of peers: their results, the pooled figures and the CPU beside them.

    ``aggregate`` is ``app.loadtest.verdict.aggregate``'s figures and bounds; the round adds the client's
    cost, the degradation levels, the steady CPU and the pooled answers to it in the JSON."""

    peers: list[PeerResult]
    aggregate: JsonObject
    answer: PooledAnswers = PooledAnswers(0, 0, 0)
    client_cpu_per_peer: float | None = None
    degradation: list[tuple[float, int]] = field(default_factory=list)  # [t, level] at each change
    cpu_all_live: SteadyCpu | None = None
    cpu: list[CpuSample] = field(default_factory=list)
    sessions: list[tuple[float, int]] = field(default_factory=list)  # [t, live sessions] at each change
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    worker_cpu_s: dict[int, float] = field(default_factory=dict)
    worker_setup_cpu_s: dict[int, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.aggregate["bounds"]["ok"])

    def to_json(self) -> JsonObject:
        agg = {**self.aggregate, "client_cpu_per_peer": self.client_cpu_per_peer, "degradation": self.degradation,
               "cpu_all_live": None if self.cpu_all_live is None else self.cpu_all_live.to_json(),
               "answer": self.answer.to_json()}
        return {"peers": [p.to_json() for p in self.peers], "aggregate": agg, "cpu": self.cpu,
                "sessions": self.sessions, "errors": self.errors, "wall_s": self.wall_s,
                "worker_cpu_s": self.worker_cpu_s, "worker_setup_cpu_s": self.worker_setup_cpu_s}


@dataclass(frozen=True)
class PlanRound:
    """A round as the plan ran it: the round, the machine's load around it, and the server after it."""

    round: RoundResult
    n_peers: int
    netem: str
    load_avg_before: list[float]
    load_avg_after: list[float]
    server_metrics: dict[str, float]
    server_lst: JsonObject | None  # GET /metrics/lst as the server answered
    server_exit_code: int | None = None

    def to_json(self) -> JsonObject:
        out = {**self.round.to_json(), "load_avg_before": self.load_avg_before, "load_avg_after": self.load_avg_after,
               "n_peers": self.n_peers, "netem": self.netem, "server_metrics": self.server_metrics,
               "server_lst": self.server_lst}
        return out if self.server_exit_code is None else {**out, "server_exit_code": self.server_exit_code}


@dataclass(frozen=True)
class Detection(Record):
    """Offset detection: peers sent with an injected A/V offset, how many were flagged, clean ones flagged."""

    offset_ms: float
    flagged: int
    of: int
    clean_flagged: int


@dataclass(frozen=True)
class RoundVerdict:
    """One netem scenario run as a single round."""

    ok: bool
    netem: str
    bounds: JsonObject  # verdict.check_bounds: {"ok", "checks"}
    server_exit_code: int | None = None
    detection: Detection | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"ok": self.ok, "netem": self.netem, "bounds": self.bounds}
        if self.server_exit_code is not None:
            out["server_exit_code"] = self.server_exit_code
        if self.detection is not None:
            out["detection"] = self.detection.to_json()
        return out


@dataclass(frozen=True)
class RampVerdict:
    """One netem scenario run as a ramp (``--find-max``): the most peers every bound held for."""

    ok: bool
    netem: str
    peers_sustained: int
    bound_broke_at: int | None
    failed_checks: list[str]
    curve: list[tuple[int, float | None, float | None, int]]  # [peers, p95 ms, Level-3 pass, connected]
    server_exit_code: int | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"ok": self.ok, "netem": self.netem, "peers_sustained": self.peers_sustained}
        if self.server_exit_code is not None:
            out["server_exit_code"] = self.server_exit_code
        out.update(bound_broke_at=self.bound_broke_at, failed_checks=self.failed_checks,
                   curve=[list(c) for c in self.curve])
        return out


ScenarioVerdict = RoundVerdict | RampVerdict


@dataclass(frozen=True)
class ScenarioSet:
    """Several netem scenarios: ok when every one is."""

    scenarios: dict[str, ScenarioVerdict]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.scenarios.values())

    def to_json(self) -> JsonObject:
        return {"ok": self.ok, "scenarios": {k: v.to_json() for k, v in self.scenarios.items()}}


@dataclass(frozen=True)
class PlanSettings(Record):
    """The plan's own settings beside the round config (peers, workers, scenarios, offsets, ramp)."""

    peers: int
    workers: int
    netem: list[str]
    offset_ms: float
    offset_peers: int
    find_max: bool
    stagger_s: float


@dataclass(frozen=True)
class PlanBounds(Record):
    """The bounds a round is judged by."""

    p95_word_to_token_ms: float
    level3_pass: float
    recall: float
    lst_tier: str | None


@dataclass(frozen=True)
class MachineInfo(Record):
    """The machine the report was made on, so its figures can be read for what they are."""

    cpus: int | None
    load_avg: list[float]
    python: str
    memory_gb: float


@dataclass(frozen=True)
class RunInfo:
    """How the run was made: the command, the server (and its /readyz at start) and the machine."""

    command: str
    url: str | None
    server_pid: int | None
    server_ready: JsonObject  # GET /readyz of a spawned server, as it answered
    machine: MachineInfo

    def to_json(self) -> JsonObject:
        return {"command": self.command, "url": self.url, "server_pid": self.server_pid,
                "server_ready": self.server_ready, "machine": self.machine.to_json()}


@dataclass(frozen=True)
class LoadReport:
    """Everything ``report.json`` holds: the config, every round, the result, the bounds, the run."""

    round_config: RoundConfig
    plan: PlanSettings
    rounds: list[PlanRound]
    result: ScenarioVerdict | ScenarioSet
    bounds: PlanBounds
    run: RunInfo | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"config": {**asdict(self.round_config), **self.plan.to_json()},
                           "rounds": [r.to_json() for r in self.rounds], "result": self.result.to_json(),
                           "bounds": self.bounds.to_json()}
        return out if self.run is None else {**out, **self.run.to_json()}
