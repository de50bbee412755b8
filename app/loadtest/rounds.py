"""`synchrony loadtest`: N simulated WebRTC peers against a live server, with optional network faults.

Each peer is an ``app.loadtest.peer.WhipPeer`` sending a real generated A/V stream (talking face, espeak
speech with exact word times, flash/click sync markers, optionally an injected A/V offset), looped,
and recording what comes back: events (tokens, sync, response, lst) and the returned video, in which
it looks for the flashes. ``app.loadtest.netem`` impairs each peer's datagrams both ways if asked.

Peers are spread over worker processes (one asyncio loop each), so the clients use both cores the
way real remote clients would not; the report shows the client CPU next to the server's so the
reader can judge. Everything is bounded: peer count (``--peers`` ≤ ``MAX_PEERS``), every wait has a
deadline, a ramp (``--find-max``) has a maximum number of rounds, and the run stops by itself.

Only loopback targets are accepted: this tool generates load, and must not be pointed elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import multiprocessing as mp
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from alignment.lst import judge_samples, tier_rank
from alignment.rounding import ms_or_none as _ms
from alignment.rounding import round_or_none as _r
from app.loadtest import metrics as lm

log = logging.getLogger("synchrony.loadtest")

MAX_PEERS = 64
MAX_WORKERS = 8
MAX_ROUNDS = 16
EXIT_OK, EXIT_BOUND, EXIT_USAGE, EXIT_SERVER = 0, 1, 2, 3

#: The bounds a round must meet to count as "sustained".
P95_BOUND_MS = 1000.0
L3_BOUND = 0.99
RECALL_BOUND = 0.0  # off by default (the task's bounds are p95 and Level-3); --min-recall turns it on

DEFAULT_TEXT = "please call me back when you have a moment"  # tiny.en hears espeak say this right


# --- configuration ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PeerSpec:
    """One simulated peer: which worker runs it, when it starts, its A/V offset and network."""

    index: int
    worker: int
    start_s: float
    offset_ms: float = 0.0
    netem: str = "clean"


@dataclass(frozen=True)
class RoundConfig:
    """What every peer of one round shares."""

    url: str
    duration_s: float = 20.0
    connect_timeout_s: float = 20.0
    text: str = DEFAULT_TEXT
    video_size: tuple[int, int] = (640, 360)
    fps: float = 25.0
    seed: int = 0
    token: str | None = None
    max_duration_s: float = 0.0  # > duration_s: keep streaming until min_sync_checks evidence checks came
    min_sync_checks: int = 0
    settle_s: float = 0.0  # words starting before this (peer clock) are not scored
    pre_encode: bool = True  # replay VP8 and Opus encoded once per worker (False: encode per frame, per peer)
    decode_video: bool = False  # decode the returned video and time its flashes (False: count its RTP frames)
    allow_refusals: bool = False  # a peer refused with 503 + Retry-After does not fail the round
    min_recall: float = RECALL_BOUND
    require_lst: str | None = None  # also require this LST tier (alignment.lst) of the round's responses
    tail_s: float = 3.0  # words ending in the last tail_s are not scored: their tokens may still be on the way


def check_loopback_url(url: str) -> str:
    """The WHIP endpoint URL if its host is loopback; ValueError otherwise (this tool makes load)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {parts.hostname!r}: {exc}") from exc
    addrs = {info[4][0] for info in infos}
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        raise ValueError(f"refusing non-loopback target {parts.hostname!r} ({', '.join(sorted(addrs))}): "
                         "load tests only run against this machine")
    path = parts.path if parts.path.rstrip("/").endswith("whip") else parts.path.rstrip("/") + "/whip"
    return f"{parts.scheme}://{parts.netloc}{path}"


def base_url(whip_url: str) -> str:
    parts = urlsplit(whip_url)
    return f"{parts.scheme}://{parts.netloc}"


# --- the clip each peer sends -------------------------------------------------------------------

def make_loop_clip(text: str, offset_ms: float, size: tuple[int, int], fps: float) -> Any:
    """A talking-face clip with sync markers whose audio and video loop seamlessly.

    Its duration is a whole number of video frames and of 20 ms audio frames, so looping it never
    drifts audio against video. Markers: one in the lead-in, one in the tail, each at the start of
    a frame's exposure cell, so a clean clip's flash lights exactly one frame fully.
    """
    from alignment.types import SAMPLE_RATE
    from app.loadtest import testmedia

    step = int(SAMPLE_RATE / fps)  # samples per video frame (640 at 25 fps: also 2 × 20 ms)
    speech = testmedia.synthesize_speech(text, lead_in_s=0.6)
    total = int(np.ceil((len(speech.samples) + 0.6 * SAMPLE_RATE) / step) * step)
    tail_s = (total - len(speech.samples) + 0.5) / SAMPLE_RATE
    half = 0.5 / fps
    markers = (round(6 / fps - half, 6), round((total - 8 * step) / SAMPLE_RATE - half, 6))  # 0.22 s, end − 0.34 s
    clip = testmedia.make_av_clip(text, fps=fps, size=size, lead_in_s=0.6, tail_s=tail_s, markers=markers,
                                  av_offset_s=offset_ms / 1000.0)
    audio = clip.audio[:total]
    if len(audio) < total:
        audio = np.concatenate([audio, np.zeros(total - len(audio), np.float32)])
    n_frames = total // step
    frames = list(clip.frames[:n_frames])
    while len(frames) < n_frames:
        frames.append(frames[-1])
    return replace(clip, audio=audio, frames=frames)


# --- one peer -----------------------------------------------------------------------------------

def _flash_region_mean(frame: Any) -> float:
    """Mean luma of the top-left corner strip the renderer leaves uncovered (where flashes are)."""
    plane = frame.planes[0]
    h, w = frame.height, frame.width
    rows, cols = max(int(h * 0.012), 2), max(int(w * 0.06), 8)
    y = np.frombuffer(bytes(plane), np.uint8).reshape(-1, plane.line_size)[:rows, :cols]
    return float(y.mean())


def encode_vp8_loop(frames: list[np.ndarray], fps: float, bitrate: int = 800_000, gop: int = 25) -> list[Any]:
    """The clip's frames encoded once as VP8 (a keyframe every ``gop`` frames, the first one too).

    ``--pre-encode`` sends these instead of encoding every frame per peer. Measured here it saved
    little client CPU (2 peers, 20 s: 3.1 vs 3.4 CPU-s per worker), so real per-frame encoding,
    which also answers keyframe requests, is the default.
    """
    import av

    ctx = av.CodecContext.create("libvpx", "w")
    h, w = frames[0].shape[:2]
    ctx.width, ctx.height, ctx.pix_fmt = w, h, "yuv420p"
    ctx.time_base = Fraction(1, int(round(fps)))
    ctx.framerate = Fraction(int(round(fps)), 1)
    ctx.bit_rate, ctx.gop_size, ctx.thread_count = bitrate, gop, 1
    ctx.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0", "auto-alt-ref": "0"}
    packets = []
    for i, img in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
        frame.pts = i
        packets += ctx.encode(frame)
    packets += ctx.encode(None)
    if len(packets) != len(frames) or not packets[0].is_keyframe:
        raise RuntimeError(f"VP8 pre-encoding gave {len(packets)} packets for {len(frames)} frames")
    return [bytes(p) for p in packets]


def encode_opus_loop(samples16k: np.ndarray) -> list[bytes]:
    """The clip's audio as the 20 ms Opus packets aiortc's sender would make of it, once.

    Encoded by aiortc's own ``OpusEncoder`` over three passes of the loop; the middle pass's packets
    are kept (packet k carries clip frame k), so the encoder state runs on across the loop point
    as it does for a peer that encodes live.
    """
    import av
    from aiortc.codecs.opus import OpusEncoder

    from app.loadtest.peer import AUDIO_FRAME, AUDIO_RATE, ClipAudioTrack

    pcm = ClipAudioTrack(samples16k, None)._pcm  # type: ignore[arg-type]
    n = len(pcm) // AUDIO_FRAME
    if n < 1 or n * AUDIO_FRAME != len(pcm):
        raise ValueError(f"the loop must be whole 20 ms frames ({len(pcm)} samples at 48 kHz)")
    encoder = OpusEncoder()
    by_frame: dict[int, bytes] = {}
    for i in range(3 * n):
        chunk = pcm[(i % n) * AUDIO_FRAME : (i % n + 1) * AUDIO_FRAME]
        frame = av.AudioFrame.from_ndarray(chunk[None, :], format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = AUDIO_RATE, i * AUDIO_FRAME, Fraction(1, AUDIO_RATE)
        payloads, ts = encoder.encode(frame)
        for j, payload in enumerate(payloads):
            by_frame[ts // AUDIO_FRAME + j] = payload
    packets = [by_frame.get(n + k) for k in range(n)]
    if any(p is None for p in packets):
        raise RuntimeError("Opus pre-encoding lost frames of the loop")
    return packets  # type: ignore[return-value]


def _make_encoded_track_class() -> type:
    """A track that replays pre-encoded packets in real time, looping (aiortc only packetizes them)."""
    import av
    from aiortc import MediaStreamTrack
    from aiortc.mediastreams import MediaStreamError

    class EncodedLoopTrack(MediaStreamTrack):
        def __init__(self, kind: str, packets: list[bytes], rate: float, clock: int, start: Any) -> None:
            super().__init__()
            self.kind = kind
            self._packets = packets
            self._fps = float(rate)  # packets per second (video: frames; audio: 50 of 20 ms)
            self._clock = clock
            self._start = start
            self._n = 0
            self.sent: deque[tuple[float, float]] = deque(maxlen=20_000)  # (clip time, wall), as WhipPeer's

        async def recv(self) -> Any:
            if self.readyState != "live":
                raise MediaStreamError
            t = self._n / self._fps
            await self._start.sleep_until(t)
            packet = av.Packet(self._packets[self._n % len(self._packets)])
            packet.pts = int(round(t * self._clock))
            packet.time_base = Fraction(1, self._clock)
            if self.kind == "video":
                self.sent.append((t, time.monotonic()))
            self._n += 1
            return packet

    return EncodedLoopTrack


def _make_peer_class() -> type:
    """A WhipPeer for load: pre-encoded media out; the returned video counted from its RTP packets,
    or decoded and watched for flashes when asked (imported lazily: aiortc is heavy)."""
    from aiortc.mediastreams import MediaStreamError

    from app.loadtest.peer import AUDIO_RATE, WhipPeer

    class MeasuredPeer(WhipPeer):
        """Records the arrival wall time of every returned video frame and, decoding, every flash."""

        flash_threshold = 80.0  # luma of the corner strip; dark there otherwise

        def __init__(self, *args: Any, vp8_packets: list[bytes] | None = None,
                     opus_packets: list[bytes] | None = None, decode_video: bool = False, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            track_class = _make_encoded_track_class()
            if vp8_packets is not None and self.video_track is not None:
                self.video_track = track_class("video", vp8_packets, self.video_track._fps, 90_000, self._start)
            if opus_packets is not None and self.audio_track is not None:
                self.audio_track = track_class("audio", opus_packets, 50.0, AUDIO_RATE, self._start)
            self.decode_video = decode_video
            self.flash_walls: list[float] = []
            self.frame_walls: list[float] = []
            self._lit = False

        def _on_track(self, track: Any) -> None:
            receiver = next((t.receiver for t in self.pc.getTransceivers() if t.receiver.track is track), None)
            if track.kind == "video" and not self.decode_video and receiver is not None:
                receiver._handle_rtp_packet = self._count_rtp  # looked up per instance: nothing decoded
                return
            super()._on_track(track)

        async def _count_rtp(self, packet: Any, arrival_time_ms: int) -> None:
            """A returned video frame is complete at its marker packet (RFC 3550; VP8 and H.264)."""
            if packet.marker and packet.payload:
                self._frame_arrived(time.monotonic())

        def _frame_arrived(self, now: float) -> None:
            if self.first_frame_wall is None:
                self.first_frame_wall = now
            self.frames_received += 1
            if len(self.frame_walls) < 100_000:
                self.frame_walls.append(now)

        async def _read_video(self, track: Any) -> None:
            try:
                while True:
                    frame = await track.recv()
                    now = time.monotonic()
                    self._frame_arrived(now)
                    self.last_frames.append(frame)
                    lit = _flash_region_mean(frame) > self.flash_threshold
                    if lit and not self._lit and len(self.flash_walls) < 10_000:
                        self.flash_walls.append(now)
                    self._lit = lit
            except (MediaStreamError, asyncio.CancelledError):
                return

    return MeasuredPeer


async def run_peer(spec: PeerSpec, cfg: RoundConfig, clip: Any, truth: lm.ClipTruth,
                   vp8_packets: list[bytes] | None = None, opus_packets: list[bytes] | None = None) -> dict[str, Any]:
    """Connect, stream for ``cfg.duration_s``, close; return what this peer measured (JSON-safe)."""
    from app.loadtest.netem import NetemLink, parse_profile
    from app.loadtest.peer import WhipError

    result: dict[str, Any] = {"index": spec.index, "worker": spec.worker, "offset_ms": spec.offset_ms,
                              "netem": spec.netem, "connected": False, "error": None}
    await asyncio.sleep(spec.start_s)
    cls = _make_peer_class()
    peer = cls(cfg.url, clip, token=cfg.token, loop=True, vp8_packets=vp8_packets, opus_packets=opus_packets,
               decode_video=cfg.decode_video)
    profile = parse_profile(spec.netem)
    link = None
    if not profile.is_clean:
        link = NetemLink(profile, seed=cfg.seed * 1009 + spec.index)
        # The ICE transports exist once gathering starts (inside connect): hook them before media flows.
        peer.pc.on("icegatheringstatechange", lambda: link.attach_pc(peer.pc))
    t_connect = time.monotonic()
    try:
        await asyncio.wait_for(peer.connect(timeout=cfg.connect_timeout_s), cfg.connect_timeout_s + 5)
        result["connected"] = True
        result["location"] = peer.location  # behind a cluster ingress, it names the node (/whip/<node>/<session>)
        result["connect_ms"] = round((time.monotonic() - t_connect) * 1000, 1)
        if vp8_packets is not None:
            codec = _video_codec(peer.pc)
            if codec != "video/VP8":
                raise RuntimeError(f"pre-encoded video needs VP8, the server chose {codec}")
        start = time.monotonic()
        end, hard_end = start + cfg.duration_s, start + max(cfg.duration_s, cfg.max_duration_s)
        while peer.pc.connectionState not in ("failed", "closed"):
            now = time.monotonic()
            if now >= hard_end or (now >= end and _evidence_checks(peer) >= cfg.min_sync_checks):
                break
            await asyncio.sleep(0.25)
        if peer.pc.connectionState in ("failed", "closed"):
            result["error"] = f"connection {peer.pc.connectionState} during the run"
    except WhipError as exc:
        result["error"] = f"WHIP {exc.status}: {exc.detail[:200]}"
        if exc.status == 503:
            result["refused"] = {"status": 503, "retry_after": exc.retry_after}
    except TimeoutError as exc:
        stage = "streaming" if result["connected"] else f"connect (limit {cfg.connect_timeout_s:.0f} s)"
        result["error"] = f"timeout during {stage}: {exc}".rstrip(": ")[:300]
    except (OSError, ConnectionError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[:300]
    except Exception as exc:  # noqa: BLE001 - one peer failing must not end the others' run
        result["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        t_end = time.monotonic()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(peer.close(), 10)
    if link is not None:
        result["netem_stats"] = link.stats()
    t0 = peer.t0_wall
    if not result["connected"] or t0 is None:
        return result
    result.update(peer_figures(peer, truth, t0, t_end, cfg, spec))
    return result


def _video_codec(pc: Any) -> str | None:
    """The negotiated video codec's MIME type (aiortc keeps it on the transceiver)."""
    for t in pc.getTransceivers():
        if t.kind == "video" and getattr(t, "_codecs", None):
            return str(t._codecs[0].mimeType)
    return None


def _evidence_checks(peer: Any) -> int:
    """Sync checks so far whose video time rests on evidence (markers or lips), not assigned pts."""
    return sum(1 for e in peer.events if e.type == "sync" and e.message.get("evidence", "assigned") != "assigned")


def peer_figures(peer: Any, truth: lm.ClipTruth, t0: float, t_end: float, cfg: RoundConfig,
                 spec: PeerSpec) -> dict[str, Any]:
    """Turn one peer's raw record into figures on its own clock (zero = clip time zero sent)."""
    run_s = t_end - t0
    until = run_s - cfg.tail_s
    events = [(e.wall - t0, e.message) for e in peer.events]
    counts: dict[str, int] = {}
    for _, m in events:
        counts[str(m.get("type"))] = counts.get(str(m.get("type")), 0) + 1
    tokens = [(t, m) for t, m in events if m.get("type") == "token"]
    words, lag, unmatched = lm.match_tokens(truth, tokens, until)
    syncs = [m for _, m in events if m.get("type") == "sync"]
    responses = [(t, m) for t, m in events if m.get("type") == "response"]
    hello = next((m for _, m in events if m.get("type") == "hello"), None)
    lst = [m for _, m in events if m.get("type") == "lst"]
    lags = lm.flash_lags(truth, [w - t0 for w in peer.flash_walls], run_s)
    frames = [w - t0 for w in peer.frame_walls]
    scored = [w for w in words if w.start >= cfg.settle_s]
    return {
        "run_s": round(run_s, 3),
        "events": counts,
        "hello": {k: hello.get(k) for k in ("version", "fps", "output_delay_s", "stages")} if hello else None,
        "clock_lag_ms": None if lag is None else round(lag * 1000, 1),
        "unmatched_tokens": unmatched,
        "latency": lm.summarise_latencies(words, cfg.settle_s),
        "words": [[round(w.start, 3), round(w.end, 3), _r(w.first_s), _r(w.final_s), w.text, w.matched_by]
                  for w in scored],
        "tokens": [[_r(t), m.get("text"), m.get("start"), m.get("end"), bool(m.get("final")), m.get("utterance"),
                    m.get("index")] for t, m in tokens[:5000]],
        "responses": lm.ttft_and_itl(truth, responses, until),
        "level3": lm.level3(syncs),
        "sync_timeline": [[_r(t), m.get("max_delta_ms"), bool(m.get("ok"))] for t, m in events
                          if m.get("type") == "sync"],
        "lst_last": lst[-1] if lst else None,
        # server-measured LST samples (wire: response.ttft_ms / itl_ms), for --require-lst
        "lst_ttft_ms": [m["ttft_ms"] for _, m in responses if isinstance(m.get("ttft_ms"), (int, float))],
        "lst_itl_ms": [m["itl_ms"] for _, m in responses if isinstance(m.get("itl_ms"), (int, float))],
        "frames_received": peer.frames_received,
        "video_decoded": peer.decode_video,
        "video_fps": round(len(frames) / (frames[-1] - frames[0]), 2) if len(frames) > 1 else None,
        "first_video_ms": None if peer.first_frame_wall is None else round((peer.first_frame_wall - t0) * 1000, 1),
        "frames_per_s": np.bincount(np.asarray([int(f) for f in frames if f >= 0], int)).tolist() if frames else [],
        "flashes_seen": len(peer.flash_walls),
        "flash_lag_ms": [round(x * 1000, 1) for x in lags],
        "flash_lag_ms_p50": None if not lags else round(float(np.median(lags)) * 1000, 1),
    }


# --- worker processes ---------------------------------------------------------------------------

def _worker_main(worker: int, specs: list[PeerSpec], cfg: RoundConfig, out: Any) -> None:
    """One worker process: run its peers in one asyncio loop and put their results on ``out``."""
    logging.basicConfig(level=logging.WARNING)
    try:
        setup: list[float] = []
        results = asyncio.run(_run_peers(specs, cfg, setup))
        out.put({"worker": worker, "peers": results, "cpu_s": _own_cpu_s(), "cpu_setup_s": setup[0]})
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        out.put({"worker": worker, "error": f"{type(exc).__name__}: {exc}", "peers": []})


def _own_cpu_s() -> float:
    t = os.times()
    return round(t.user + t.system, 2)


async def _run_peers(specs: list[PeerSpec], cfg: RoundConfig, setup_cpu: list[float]) -> list[dict[str, Any]]:
    """Build the clips (and their encodings), then run the peers; ``setup_cpu`` gets the CPU spent
    before the first peer starts, so the peers' own cost can be told from it."""
    loop = asyncio.get_running_loop()
    clips: dict[float, tuple[Any, lm.ClipTruth, list[bytes] | None, list[bytes] | None]] = {}
    for offset in sorted({s.offset_ms for s in specs}):
        clip = await loop.run_in_executor(None, make_loop_clip, cfg.text, offset, cfg.video_size, cfg.fps)
        vp8 = opus = None
        if cfg.pre_encode:
            vp8 = await loop.run_in_executor(None, encode_vp8_loop, clip.frames, cfg.fps)
            opus = await loop.run_in_executor(None, encode_opus_loop, clip.audio)
        clips[offset] = (clip, lm.clip_truth(clip), vp8, opus)
    setup_cpu.append(_own_cpu_s())
    tasks = [run_peer(s, cfg, *clips[s.offset_ms]) for s in specs]
    return list(await asyncio.gather(*tasks))


class CpuSampler:
    """Samples CPU % of the server process tree and of the load-test workers every ``period_s``."""

    def __init__(self, server_pid: int | None, period_s: float = 0.5, max_samples: int = 20_000,
                 readyz_url: str | None = None) -> None:
        """``readyz_url``: also record the server's degradation level (``/readyz``) once a second."""
        import psutil

        self._psutil = psutil
        self.server = psutil.Process(server_pid) if server_pid else None
        self.workers: list[Any] = []
        self.period_s = period_s
        self.max_samples = max_samples
        self.samples: list[tuple[float, float | None, float, float]] = []  # (t, server %, clients %, machine %)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._t0 = time.monotonic()
        self._tree: dict[int, Any] = {}
        self.readyz_url = readyz_url
        self.degradation: list[tuple[float, int]] = []  # (t, level) whenever the level changed

    def _tree_percent(self) -> float | None:
        if self.server is None:
            return None
        try:
            procs = [self.server, *self.server.children(recursive=True)]
        except self._psutil.Error:
            return None
        total = 0.0
        for p in procs:
            cached = self._tree.setdefault(p.pid, p)
            with contextlib.suppress(self._psutil.Error):
                total += cached.cpu_percent(None)
        return total

    def _workers_percent(self) -> float:
        total = 0.0
        for p in self.workers:
            with contextlib.suppress(self._psutil.Error):
                total += p.cpu_percent(None)
        return total

    def _run(self) -> None:
        self._tree_percent()
        self._psutil.cpu_percent(None)
        while not self._stop.wait(self.period_s) and len(self.samples) < self.max_samples:
            self.samples.append((round(time.monotonic() - self._t0, 2), _round1(self._tree_percent()),
                                 round(self._workers_percent(), 1), self._psutil.cpu_percent(None)))
            if self.readyz_url and len(self.samples) % max(int(round(1.0 / self.period_s)), 1) == 0:
                self._poll_degradation()

    def _poll_degradation(self) -> None:
        import httpx

        try:
            level = httpx.get(self.readyz_url, timeout=1.0).json().get("degradation", {}).get("level")
        except (httpx.HTTPError, ValueError, AttributeError):
            return
        if isinstance(level, int) and (not self.degradation or self.degradation[-1][1] != level):
            self.degradation.append((round(time.monotonic() - self._t0, 1), level))

    def add_worker(self, pid: int) -> None:
        with contextlib.suppress(self._psutil.Error):
            p = self._psutil.Process(pid)
            p.cpu_percent(None)
            self.workers.append(p)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, float | None, float, float]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return list(self.samples)


def _round1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def plan_peers(n: int, workers: int, stagger_s: float, offsets: dict[int, float], netem: str,
               netem_peers: set[int] | None = None) -> list[PeerSpec]:
    """Spread ``n`` peers round-robin over ``workers``; peer i starts ``i·stagger_s`` after the round."""
    return [PeerSpec(i, i % workers, round(i * stagger_s, 3), offsets.get(i, 0.0),
                     netem if netem_peers is None or i in netem_peers else "clean") for i in range(n)]


def run_round(specs: list[PeerSpec], cfg: RoundConfig, server_pid: int | None) -> dict[str, Any]:
    """Run one round of peers in worker processes; returns per-peer results, aggregates and CPU."""
    ctx = mp.get_context("spawn")
    workers = sorted({s.worker for s in specs})
    out = ctx.Queue(maxsize=len(workers) + 1)
    sampler = CpuSampler(server_pid, readyz_url=base_url(cfg.url) + "/readyz").start()
    procs = []
    t_start = time.monotonic()
    for w in workers:
        p = ctx.Process(target=_worker_main, args=(w, [s for s in specs if s.worker == w], cfg, out),
                        name=f"loadtest-worker-{w}", daemon=True)
        p.start()
        sampler.add_worker(p.pid)
        procs.append(p)
    # Deadline: the last peer's start + connect + run + close, plus time to build clips and report.
    run_s = max(cfg.duration_s, cfg.max_duration_s)
    deadline = t_start + max(s.start_s for s in specs) + cfg.connect_timeout_s + run_s + 60.0
    results: list[dict[str, Any]] = []
    worker_cpu: dict[int, float] = {}
    setup_cpu: dict[int, float] = {}
    errors: list[str] = []
    pending = set(workers)
    while pending and time.monotonic() < deadline:
        try:
            msg = out.get(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        pending.discard(msg["worker"])
        results.extend(msg["peers"])
        if "cpu_s" in msg:
            worker_cpu[msg["worker"]] = msg["cpu_s"]
            setup_cpu[msg["worker"]] = msg.get("cpu_setup_s", 0.0)
        if msg.get("error"):
            errors.append(f"worker {msg['worker']}: {msg['error']}")
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
    if pending:
        errors.append(f"workers {sorted(pending)} gave no result before the deadline (terminated)")
    cpu = sampler.stop()
    wall = time.monotonic() - t_start
    seen = {r["index"] for r in results}
    for s in specs:
        if s.index not in seen:
            results.append({"index": s.index, "worker": s.worker, "offset_ms": s.offset_ms, "netem": s.netem,
                            "connected": False, "error": "no result (worker failed or timed out)"})
    results.sort(key=lambda r: r["index"])
    agg = aggregate(results, cfg.min_recall, cfg.allow_refusals, cfg.require_lst)
    agg["client_cpu_per_peer"] = client_cpu_per_peer(results, worker_cpu, setup_cpu)
    agg["degradation"] = sampler.degradation  # [t, level] at each change of the server's degradation level
    return {"peers": results, "aggregate": agg, "cpu": cpu, "errors": errors,
            "wall_s": round(wall, 1), "worker_cpu_s": worker_cpu, "worker_setup_cpu_s": setup_cpu}


def client_cpu_per_peer(results: list[dict[str, Any]], worker_cpu: dict[int, float],
                        setup_cpu: dict[int, float]) -> float | None:
    """The load generator's own cost: workers' CPU after their clips were built, per second a peer
    streamed (cores per peer; connecting and closing included, clip building not)."""
    streamed = sum(r.get("run_s", 0.0) for r in results if r.get("connected"))
    if not worker_cpu or streamed <= 0:
        return None
    spent = sum(worker_cpu[w] - setup_cpu.get(w, 0.0) for w in worker_cpu)
    return round(spent / streamed, 4)


def aggregate(results: list[dict[str, Any]], min_recall: float = RECALL_BOUND,
              allow_refusals: bool = False, require_lst: str | None = None) -> dict[str, Any]:
    """Round figures: pooled word→token latency, Level-3 pass over clean peers, offset detection.

    With ``allow_refusals`` a peer the server refused with 503 + Retry-After (full) is counted as
    refused, not failed: the bounds then hold over the admitted peers.
    """
    first, final = [], []
    words = matched = by_text = 0
    l3_ok = l3_n = 0
    ttft: list[float] = []
    jitter: list[float] = []
    for r in results:
        for w in r.get("words", []):
            words += 1
            by_text += len(w) > 5 and w[5] == "text"
            if w[2] is not None:
                matched += 1
                first.append(w[2] - w[1])
            if w[3] is not None:
                final.append(w[3] - w[1])
        l3 = r.get("level3") or {}
        if not r.get("offset_ms") and l3.get("checks"):
            l3_ok += l3["ok"]
            l3_n += l3["checks"]
        resp = r.get("responses") or {}
        ttft.extend(resp.get("ttft_ms") or [])
        if resp.get("jitter_ms_max") is not None:
            jitter.append(resp["jitter_ms_max"])
    timeline = latency_windows([(w[1], w[2] - w[1]) for r in results for w in r.get("words", []) if w[2] is not None])
    injected = [r for r in results if r.get("offset_ms")]
    clean = [r for r in results if not r.get("offset_ms") and r.get("connected")]
    refused = [r["index"] for r in results if (r.get("refused") or {}).get("retry_after")]
    agg = {
        "peers": len(results),
        "connected": sum(bool(r.get("connected")) for r in results),
        "refused": refused,
        "failed": [r["index"] for r in results if r.get("error") and not (allow_refusals and r["index"] in refused)],
        "words": words,
        "matched": matched,
        "recall": round(matched / words, 4) if words else None,
        "recall_text": round(by_text / words, 4) if words else None,
        "latency_ms_p50": _ms(lm.quantile(first, 0.5)),
        "latency_ms_p95": _ms(lm.quantile(first, 0.95)),
        "final_latency_ms_p95": _ms(lm.quantile(final, 0.95)),
        "level3_checks": l3_n,
        "level3_pass_rate": round(l3_ok / l3_n, 4) if l3_n else None,
        "ttft_ms_p50": _round1(lm.quantile(ttft, 0.5)),
        "ttft_ms_p99": _round1(lm.quantile(ttft, 0.99)),
        "jitter_ms_max": max(jitter) if jitter else None,
        "offset_peers_flagged": sum(bool((r.get("level3") or {}).get("flagged")) for r in injected),
        "offset_peers": len(injected),
        "clean_peers_flagged": sum(bool((r.get("level3") or {}).get("flagged")) for r in clean),
        "latency_by_window": timeline,
    }
    agg["lst"] = judge_samples([x for r in results for x in r.get("lst_ttft_ms", [])],
                               [r.get("lst_itl_ms", []) for r in results])
    agg["bounds"] = check_bounds(agg, min_recall, allow_refusals, require_lst)
    return agg


def latency_windows(points: list[tuple[float, float]], window_s: float = 3.0) -> list[list[float | int | None]]:
    """Word→token latency pooled over peers in windows of peer-clock time: [start s, words, p50 ms, p95 ms].

    Shows how a time-varying network (stepwise delay, first-frame blocking) moves the latency.
    """
    if not points:
        return []
    out = []
    for k in range(int(max(t for t, _ in points) // window_s) + 1):
        lat = [x for t, x in points if k * window_s <= t < (k + 1) * window_s]
        out.append([k * window_s, len(lat), _ms(lm.quantile(lat, 0.5)), _ms(lm.quantile(lat, 0.95))])
    return out


def check_bounds(agg: dict[str, Any], min_recall: float = RECALL_BOUND, allow_refusals: bool = False,
                 require_lst: str | None = None) -> dict[str, Any]:
    """Which sustain bounds a round met: p95 word→token, Level-3 pass, all connected (+ recall, LST tier
    if asked).

    p95 counts only words that got a token; ``min_recall`` > 0 also stops a server from passing by
    dropping words. With ``allow_refusals``, every peer must be admitted and stay connected, or be
    refused with 503 + Retry-After, and at least one must be admitted. ``require_lst``: the round's
    LST tier (``agg["lst"]``: the server-measured TTFT and ITL samples its ``response`` events
    carried, judged by ``alignment.lst``) is at least this.
    """
    p95, l3, recall = agg["latency_ms_p95"], agg["level3_pass_rate"], agg["recall"]
    if allow_refusals:
        connected = (0 < agg["connected"] and agg["connected"] + len(agg.get("refused", ())) == agg["peers"]
                     and not agg["failed"])
        name = "every peer admitted and connected, or refused with 503 + Retry-After"
    else:
        connected, name = agg["connected"] == agg["peers"] and not agg["failed"], "all peers connected"
    checks = {
        f"p95 word->token <= {P95_BOUND_MS:.0f} ms": p95 is not None and p95 <= P95_BOUND_MS,
        f"Level-3 pass >= {L3_BOUND:.0%}": l3 is not None and l3 >= L3_BOUND,
        name: connected,
    }
    if min_recall > 0:
        checks[f"word recall >= {min_recall:.0%}"] = recall is not None and recall >= min_recall
    if require_lst:
        lst = agg.get("lst") or {}
        checks[f"LST tier >= {require_lst}"] = tier_rank(lst.get("tier", "none")) >= tier_rank(require_lst)
    return {"ok": all(checks.values()), "checks": checks}


# --- server -------------------------------------------------------------------------------------

class SpawnedServer:
    """``synchrony serve`` in a subprocess on 127.0.0.1 and a free port, logging to a file."""

    def __init__(self, max_sessions: int, log_path: Path, extra: list[str] | None = None,
                 code_dir: Path | None = None) -> None:
        """``code_dir``: run the server from that source tree (a benchmark's baseline), not this one."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/whip"
        self.log_path = log_path
        cmd = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", "serve",
               "--host", "127.0.0.1", "--port", str(self.port), "--max-sessions", str(max_sessions),
               *(extra or [])]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = None if code_dir is None else {**os.environ, "PYTHONPATH": str(code_dir)}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     cwd=None if code_dir is None else str(code_dir))

    def wait_ready(self, timeout_s: float = 180.0) -> dict[str, Any]:
        import httpx

        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                r = httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2.0)
                if r.status_code == 200:
                    return r.json()
                last = r.text[:200]
            except httpx.HTTPError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise TimeoutError(f"server not ready within {timeout_s:.0f} s ({last}); log: {self.log_path}")

    def exit_code(self) -> int | None:
        """None while the server runs; its exit code once it has ended (negative: killed by a signal)."""
        return self.proc.poll()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()


def scrape_metrics(whip_url: str, max_lines: int = 400) -> dict[str, float]:
    """The server's counters after a round (``GET /metrics``: drops, stage errors, Level-3 checks ...).

    Histogram buckets are left out; a server without the endpoint gives ``{}``.
    """
    import httpx

    try:
        text = httpx.get(base_url(whip_url) + "/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if (line.startswith("#") or "_bucket{" in line or "_created" in line or " " not in line
                or len(out) >= max_lines):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def scrape_lst(whip_url: str) -> dict[str, Any] | None:
    """The server's pooled LST figures (``GET /metrics/lst``), None if it has none."""
    import httpx

    try:
        r = httpx.get(base_url(whip_url) + "/metrics/lst", timeout=5.0)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def local_server_pid(url: str) -> int | None:
    """The pid listening on the URL's port on this machine, if psutil may see it."""
    import psutil

    port = urlsplit(url).port or 80
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return int(c.pid)
    except (psutil.Error, PermissionError):
        return None
    return None


# --- command line -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="synchrony loadtest", description=__doc__.splitlines()[0])
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="WHIP endpoint of a running server (loopback only), e.g. "
                        "http://127.0.0.1:8000/whip")
    target.add_argument("--spawn-server", action="store_true", help="start `synchrony serve` on 127.0.0.1 first")
    p.add_argument("--peers", type=int, default=2, help=f"simulated peers (1..{MAX_PEERS}; start of the ramp "
                   "with --find-max)")
    p.add_argument("--workers", type=int, default=2, help=f"worker processes (1..{MAX_WORKERS})")
    p.add_argument("--duration", type=float, default=20.0, help="seconds each peer streams (5..600)")
    p.add_argument("--max-duration", type=float, default=0.0, help="stream up to this long while waiting for "
                   "--min-sync-checks evidence-based sync checks per peer")
    p.add_argument("--min-sync-checks", type=int, default=0, help="see --max-duration")
    p.add_argument("--stagger", type=float, default=0.5, help="seconds between peer starts")
    p.add_argument("--netem", action="append", help="network impairment for every peer (repeat: one scenario "
                   "after another): a scenario "
                   "(clean, loss5, burst5, link-jitter, stepwise, first-frame-block, ...) or key=value pairs, "
                   "e.g. loss=5%%,delay=40ms")
    p.add_argument("--offset-ms", type=float, default=0.0, help="inject this A/V offset (video late +) ...")
    p.add_argument("--offset-peers", type=int, default=0, help="... into this many peers (the last ones)")
    p.add_argument("--find-max", action="store_true", help="ramp peers until a bound breaks; report the most "
                   "sustained")
    p.add_argument("--step", type=int, default=2, help="peers added per ramp round")
    p.add_argument("--keep-going", action="store_true", help="--find-max: ramp on to --max-peers after a "
                   "bound breaks (the whole curve; peers_sustained still stops at the first break)")
    p.add_argument("--max-peers", type=int, default=16, help="stop the ramp here")
    p.add_argument("--max-sessions", type=int, default=0, help="--spawn-server: session limit (default: enough)")
    p.add_argument("--server-arg", action="append", default=[], help="extra argument for the spawned server")
    p.add_argument("--min-recall", type=float, default=RECALL_BOUND, help="also require this word recall "
                   "(0..1) for a round to pass (default: not required)")
    p.add_argument("--pre-encode", action=argparse.BooleanOptionalAction, default=True,
                   help="replay VP8 (fixed bitrate, keyframe every 1 s, ignores PLI) and Opus encoded once per "
                   "worker (default); --no-pre-encode encodes every frame per peer, as a real client does")
    p.add_argument("--decode-video", action="store_true", help="decode the returned video and time the sync "
                   "markers' flashes in it (flash_lag_ms); by default its frames are counted from RTP packets")
    p.add_argument("--allow-refusals", action="store_true", help="peers the server refuses with 503 + "
                   "Retry-After (full) do not fail a round; the bounds hold over the admitted ones")
    p.add_argument("--require-lst", choices=("bronze", "silver", "gold"), default=None,
                   help="also require this LST tier of each round's responses (server-measured TTFT and ITL)")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the sentence every peer speaks (looped)")
    p.add_argument("--video-size", default="640x360", help="WxH of the video peers send")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token", default=os.environ.get("SYNCHRONY_TOKEN"), help="bearer token for /whip")
    p.add_argument("--out", default="loadtest-out", help="directory for report.json and report.html")
    return p


def spawn_args(args: argparse.Namespace) -> list[str]:
    """Extra ``serve`` arguments for ``--spawn-server``: every peer is admitted (``--admission fixed``,
    to measure what the machine sustains) unless the run checks admission (``--allow-refusals``) or
    ``--server-arg`` sets it."""
    if args.allow_refusals or any(a.startswith("--admission") for a in args.server_arg):
        return list(args.server_arg)
    return ["--admission", "fixed", *args.server_arg]


def _validate(args: argparse.Namespace) -> None:
    from app.loadtest.netem import parse_profile

    if not 1 <= args.peers <= MAX_PEERS:
        raise ValueError(f"--peers must be 1..{MAX_PEERS}")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise ValueError(f"--workers must be 1..{MAX_WORKERS}")
    if not 5.0 <= args.duration <= 600.0:
        raise ValueError("--duration must be 5..600 s")
    if not (args.max_duration == 0 or args.duration <= args.max_duration <= 600.0) or args.min_sync_checks < 0:
        raise ValueError("--max-duration must be 0 or --duration..600 s; --min-sync-checks >= 0")
    if not 0.0 <= args.stagger <= 10.0:
        raise ValueError("--stagger must be 0..10 s")
    if not 0 <= args.offset_peers <= args.peers:
        raise ValueError("--offset-peers must be 0..--peers")
    if args.find_max and not (1 <= args.step and args.peers <= args.max_peers <= MAX_PEERS):
        raise ValueError(f"--find-max needs --step >= 1 and --peers <= --max-peers <= {MAX_PEERS}")
    if not 0.0 <= args.min_recall <= 1.0:
        raise ValueError("--min-recall must be 0..1")
    if abs(args.offset_ms) > 2000:
        raise ValueError("--offset-ms must be within ±2000")
    args.netem = args.netem or ["clean"]
    if len(args.netem) > MAX_ROUNDS:
        raise ValueError(f"at most {MAX_ROUNDS} --netem scenarios")
    for spec in args.netem:
        parse_profile(spec)
    w, h = (int(x) for x in args.video_size.lower().split("x", 1))
    if not (64 <= w <= 1920 and 64 <= h <= 1080 and w % 2 == 0 and h % 2 == 0):
        raise ValueError("--video-size must be even WxH between 64x64 and 1920x1080")
    args.size = (w, h)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``synchrony loadtest``; returns 0 if the bounds held, 1 if not, 2/3 on errors."""
    from app.loadtest import report as loadreport

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _validate(args)
        url = None if args.spawn_server else check_loopback_url(args.url)
    except ValueError as exc:
        print(f"synchrony loadtest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "synchrony loadtest " + " ".join(sys.argv[1:] if argv is None else argv)
    server = None
    server_info: dict[str, Any] = {}
    try:
        if args.spawn_server:
            top = args.max_peers if args.find_max else args.peers
            server = SpawnedServer(args.max_sessions or top + 2, out_dir / "server.log", spawn_args(args))
            print(f"starting server on 127.0.0.1:{server.port} (log: {server.log_path}) ...", flush=True)
            try:
                server_info = server.wait_ready()
            except (RuntimeError, TimeoutError) as exc:
                print(f"synchrony loadtest: {exc}", file=sys.stderr)
                return EXIT_SERVER
            url, pid = server.url, server.proc.pid
        else:
            pid = local_server_pid(url)
        cfg = RoundConfig(url=url, duration_s=args.duration, text=args.text, video_size=args.size,
                          seed=args.seed, token=args.token, max_duration_s=args.max_duration,
                          min_sync_checks=args.min_sync_checks, pre_encode=args.pre_encode,
                          decode_video=args.decode_video, allow_refusals=args.allow_refusals,
                          min_recall=args.min_recall, require_lst=args.require_lst)
        report = run_plan(args, cfg, pid, server)
    finally:
        if server is not None:
            server.stop()
    report.update({"command": command, "url": url, "server_pid": pid, "server_ready": server_info,
                   "machine": machine_info()})
    json_path, html_path = loadreport.write_report(report, out_dir)
    print(loadreport.text_summary(report))
    print(f"report: {json_path}  {html_path}")
    return EXIT_OK if report["result"]["ok"] else EXIT_BOUND


def run_plan(args: argparse.Namespace, cfg: RoundConfig, pid: int | None,
             server: SpawnedServer | None = None) -> dict[str, Any]:
    """For each ``--netem`` scenario: one round, or a ramp (``--find-max``); at most ``MAX_ROUNDS`` in all."""
    rounds: list[dict[str, Any]] = []
    results = {}
    for netem in args.netem:
        results[netem] = _run_scenario(args, cfg, pid, netem, rounds, server)
        if server is not None and server.exit_code() is not None:
            break  # nothing left to measure
    result = next(iter(results.values())) if len(results) == 1 else {
        "ok": all(r["ok"] for r in results.values()), "scenarios": results}
    return {"config": {**asdict(cfg), "peers": args.peers, "workers": args.workers, "netem": args.netem,
                       "offset_ms": args.offset_ms, "offset_peers": args.offset_peers,
                       "find_max": args.find_max, "stagger_s": args.stagger},
            "rounds": rounds, "result": result,
            "bounds": {"p95_word_to_token_ms": P95_BOUND_MS, "level3_pass": L3_BOUND, "recall": cfg.min_recall,
                       "lst_tier": cfg.require_lst}}


def _run_scenario(args: argparse.Namespace, cfg: RoundConfig, pid: int | None, netem: str,
                  rounds: list[dict[str, Any]], server: SpawnedServer | None = None) -> dict[str, Any]:
    """One netem scenario: a round or a ramp; appends its rounds to ``rounds``, returns its verdict."""
    sustained = 0
    broken = False
    n = args.peers
    mine: list[dict[str, Any]] = []
    while len(rounds) < MAX_ROUNDS:
        offsets = {i: args.offset_ms for i in range(n - args.offset_peers, n)} if args.offset_peers else {}
        specs = plan_peers(n, min(args.workers, n), args.stagger, offsets, netem)
        print(f"round: {n} peers, netem={netem}, {cfg.duration_s:.0f} s ...", flush=True)
        load_before = [round(x, 2) for x in os.getloadavg()]
        rnd = run_round(specs, replace(cfg, seed=cfg.seed + len(rounds)), pid)
        rnd["load_avg_before"], rnd["load_avg_after"] = load_before, [round(x, 2) for x in os.getloadavg()]
        rnd["n_peers"], rnd["netem"] = n, netem
        rnd["server_metrics"] = scrape_metrics(cfg.url)
        rnd["server_lst"] = scrape_lst(cfg.url)
        rounds.append(rnd)
        mine.append(rnd)
        agg = rnd["aggregate"]
        print(f"  p95 word->token {agg['latency_ms_p95']} ms, Level-3 pass {agg['level3_pass_rate']}, "
              f"recall {agg['recall']}, connected {agg['connected']}/{agg['peers']}: "
              f"{'PASS' if agg['bounds']['ok'] else 'FAIL'}", flush=True)
        died = server.exit_code() if server is not None else None
        if died is not None:
            rnd["server_exit_code"] = died
            rnd["errors"].append(f"the spawned server exited with code {died} during this round "
                                 f"(negative: killed by signal {-died}); see {server.log_path}")
            print(f"  the server exited with code {died}: stopping (log: {server.log_path})", flush=True)
        if not args.find_max or died is not None or (not agg["bounds"]["ok"] and not args.keep_going):
            break
        broken = broken or not agg["bounds"]["ok"]
        if not broken:
            sustained = n  # this round and every smaller one held
        if n >= args.max_peers:
            break
        n = min(n + args.step, args.max_peers)
        time.sleep(2.0)  # let the server tear the previous sessions down
    exits = [r["server_exit_code"] for r in mine if "server_exit_code" in r]
    if args.find_max:
        broke = next((r for r in mine if not r["aggregate"]["bounds"]["ok"]), None)
        return {"ok": sustained > 0, "netem": netem, "peers_sustained": sustained,
                **({"server_exit_code": exits[0]} if exits else {}),
                "bound_broke_at": None if broke is None else broke["n_peers"],
                "failed_checks": [] if broke is None else
                [k for k, v in broke["aggregate"]["bounds"]["checks"].items() if not v],
                "curve": [[r["n_peers"], r["aggregate"]["latency_ms_p95"], r["aggregate"]["level3_pass_rate"],
                           r["aggregate"]["connected"]] for r in mine]}
    agg = mine[0]["aggregate"]
    ok = agg["bounds"]["ok"] if not args.offset_peers else (
        agg["offset_peers_flagged"] == agg["offset_peers"] and agg["clean_peers_flagged"] == 0)
    result = {"ok": ok and not exits, "netem": netem, "bounds": agg["bounds"],
              **({"server_exit_code": exits[0]} if exits else {})}
    if args.offset_peers:
        result["detection"] = {"offset_ms": args.offset_ms, "flagged": agg["offset_peers_flagged"],
                               "of": agg["offset_peers"], "clean_flagged": agg["clean_peers_flagged"]}
    return result


def machine_info() -> dict[str, Any]:
    import platform

    import psutil

    return {"cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1)}


if __name__ == "__main__":
    sys.exit(main())
