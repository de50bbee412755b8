"""Driving the simulated peers: one asyncio loop of peers per worker process, each peer measured.

A peer is an ``app.loadtest.peer.WhipPeer`` sending the looped clip (``app.loadtest.loopclip``) and
recording what comes back: events (tokens, sync, response, lst) and the returned video, in which it
looks for the flashes. ``app.loadtest.netem`` impairs each peer's datagrams both ways if asked.
Every wait has a deadline, and one peer failing never ends the others' run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections import deque
from fractions import Fraction
from typing import TYPE_CHECKING, Protocol

import numpy as np

from app.loadtest import metrics as lm
from app.loadtest.config import PeerSpec, RoundConfig
from app.loadtest.loopclip import encode_opus_loop, encode_vp8_loop, make_loop_clip
from app.loadtest.records import AnswerSummary, PeerFigures, PeerResult, Refusal, WorkerReport

if TYPE_CHECKING:
    import multiprocessing.queues

    import av
    from aiortc import MediaStreamTrack, RTCPeerConnection
    from aiortc.rtp import RtpPacket

    from app.loadtest.peer import ReceivedEvent, WhipPeer, _Start
    from app.loadtest.testmedia import AVClip
    from app.loadtest.voicepeer import AnswerListener


class MeasuredRecord(Protocol):
    """What the figures read of a measured peer (``_make_peer_class``'s peer, or a recorded one)."""

    events: list[ReceivedEvent]
    flash_walls: list[float]
    frame_walls: list[float]
    frames_received: int
    decode_video: bool
    first_frame_wall: float | None
    answer: AnswerListener


def _flash_region_mean(frame: av.VideoFrame) -> float:
    """Mean luma of the top-left corner strip the renderer leaves uncovered (where flashes are)."""
    plane = frame.planes[0]
    h, w = frame.height, frame.width
    rows, cols = max(int(h * 0.012), 2), max(int(w * 0.06), 8)
    y = np.frombuffer(bytes(plane), np.uint8).reshape(-1, plane.line_size)[:rows, :cols]
    return float(y.mean())


def _make_encoded_track_class() -> type[MediaStreamTrack]:
    """A track that replays pre-encoded packets in real time, looping (aiortc only packetizes them)."""
    import av
    from aiortc import MediaStreamTrack
    from aiortc.mediastreams import MediaStreamError

    class EncodedLoopTrack(MediaStreamTrack):
        def __init__(self, kind: str, packets: list[bytes], rate: float, clock: int, start: _Start) -> None:
            super().__init__()
            self.kind = kind
            self._packets = packets
            self._fps = float(rate)  # packets per second (video: frames; audio: 50 of 20 ms)
            self._clock = clock
            self._start = start
            self._n = 0
            self.sent: deque[tuple[float, float]] = deque(maxlen=20_000)  # (clip time, wall), as WhipPeer's

        async def recv(self) -> av.Packet:
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


def _make_peer_class() -> type[WhipPeer]:
    """A WhipPeer for load: pre-encoded media out; the returned video counted from its RTP packets,
    or decoded and watched for flashes when asked (imported lazily: aiortc is heavy)."""
    from aiortc.mediastreams import MediaStreamError

    from app.loadtest.peer import AUDIO_RATE, WhipPeer

    class MeasuredPeer(WhipPeer):
        """Records the arrival wall time of every returned video frame and, decoding, every flash."""

        flash_threshold = 80.0  # luma of the corner strip; dark there otherwise

        def __init__(self, *args: object, vp8_packets: list[bytes] | None = None,
                     opus_packets: list[bytes] | None = None, decode_video: bool = False, **kwargs: object) -> None:
            kwargs.setdefault("answer_video", True)
            kwargs.setdefault("decode_answer", False)  # count the answer's packets; decode when asked
            self._vp8, self._opus = vp8_packets, opus_packets  # read by the track factories below
            self._encoded = _make_encoded_track_class()
            super().__init__(*args, **kwargs)
            self.decode_video = decode_video
            self.flash_walls: list[float] = []
            self.frame_walls: list[float] = []
            self._lit = False

        def _audio_track(self, samples16k: np.ndarray, loop: bool) -> MediaStreamTrack:
            """Pre-encoded Opus when given (the raw track, never sent, is not built: its 48 kHz PCM)."""
            if self._opus is None:
                return super()._audio_track(samples16k, loop)
            return self._encoded("audio", self._opus, 50.0, AUDIO_RATE, self._start)

        def _video_track(self, frames: list[np.ndarray], fps: float, loop: bool) -> MediaStreamTrack:
            """Pre-encoded VP8 when given (the raw track, never sent, is not built: its YUV frames)."""
            if self._vp8 is None:
                return super()._video_track(frames, fps, loop)
            return self._encoded("video", self._vp8, fps, 90_000, self._start)

        def _on_track(self, track: MediaStreamTrack) -> None:
            transceiver = self._receiver_of(track)
            if track.kind == "audio" or (transceiver is not None and transceiver is self._avatar_transceiver):
                super()._on_track(track)  # the answer: counted, or decoded and measured (decode_answer)
                return
            receiver = None if transceiver is None else transceiver.receiver
            if track.kind == "video" and not self.decode_video and receiver is not None:
                receiver._handle_rtp_packet = self._count_rtp  # looked up per instance: nothing decoded
                return
            super()._on_track(track)

        async def _count_rtp(self, packet: RtpPacket, arrival_time_ms: int) -> None:
            """A returned video frame is complete at its marker packet (RFC 3550; VP8 and H.264)."""
            if packet.marker and packet.payload:
                self._frame_arrived(time.monotonic())

        def _frame_arrived(self, now: float) -> None:
            if self.first_frame_wall is None:
                self.first_frame_wall = now
            self.frames_received += 1
            if len(self.frame_walls) < 100_000:
                self.frame_walls.append(now)

        async def _read_video(self, track: MediaStreamTrack) -> None:
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


async def run_peer(spec: PeerSpec, cfg: RoundConfig, clip: AVClip, truth: lm.ClipTruth,
                   vp8_packets: list[bytes] | None = None, opus_packets: list[bytes] | None = None) -> PeerResult:
    """Connect, stream for ``cfg.duration_s``, close; return what this peer measured."""
    from app.loadtest.netem import NetemLink, parse_profile
    from app.loadtest.peer import WhipError

    await asyncio.sleep(spec.start_s)
    cls = _make_peer_class()
    peer = cls(cfg.url, clip, token=cfg.token, loop=True, vp8_packets=vp8_packets, opus_packets=opus_packets,
               decode_video=cfg.decode_video, answer_video=cfg.answer_video, decode_answer=cfg.decode_answer)
    profile = parse_profile(spec.netem)
    link = None
    if not profile.is_clean:
        link = NetemLink(profile, seed=cfg.seed * 1009 + spec.index)
        # The ICE transports exist once gathering starts (inside connect): hook them before media flows.
        peer.pc.on("icegatheringstatechange", lambda: link.attach_pc(peer.pc))
    connected = False
    error: str | None = None
    refused: Refusal | None = None
    connect_ms: float | None = None
    t_connect = time.monotonic()
    try:
        await asyncio.wait_for(peer.connect(timeout=cfg.connect_timeout_s), cfg.connect_timeout_s + 5)
        connected = True
        connect_ms = round((time.monotonic() - t_connect) * 1000, 1)
        if vp8_packets is not None:
            codec = _video_codec(peer.pc)
            if codec != "video/VP8":
                raise RuntimeError(f"pre-encoded video needs VP8, the server chose {codec}")
        error = await _stream(peer, cfg)
    except WhipError as exc:
        error = f"WHIP {exc.status}: {exc.detail[:200]}"
        if exc.status == 503:
            refused = Refusal(503, exc.retry_after)
    except TimeoutError as exc:
        stage = "streaming" if connected else f"connect (limit {cfg.connect_timeout_s:.0f} s)"
        error = f"timeout during {stage}: {exc}".rstrip(": ")[:300]
    except Exception as exc:  # noqa: BLE001 - one peer failing must not end the others' run
        error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        t_end = time.monotonic()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(peer.close(), 10)
    t0 = peer.t0_wall
    figures = peer_figures(peer, truth, t0, t_end, cfg) if connected and t0 is not None else None
    return PeerResult(spec.index, spec.worker, spec.offset_ms, spec.netem, connected, error,
                      peer.location if connected else None, connect_ms, refused,
                      None if link is None else link.stats(), figures)


async def _stream(peer: WhipPeer, cfg: RoundConfig) -> str | None:
    """Stream until the run's end (and enough evidence-based sync checks) or the connection dies."""
    start = time.monotonic()
    end, hard_end = start + cfg.duration_s, start + max(cfg.duration_s, cfg.max_duration_s)
    while peer.pc.connectionState not in ("failed", "closed"):
        now = time.monotonic()
        if now >= hard_end or (now >= end and _evidence_checks(peer) >= cfg.min_sync_checks):
            break
        await asyncio.sleep(0.25)
    if peer.pc.connectionState in ("failed", "closed"):
        return f"connection {peer.pc.connectionState} during the run"
    return None


def _video_codec(pc: RTCPeerConnection) -> str | None:
    """The negotiated video codec's MIME type (aiortc keeps it on the transceiver)."""
    for t in pc.getTransceivers():
        if t.kind == "video" and getattr(t, "_codecs", None):
            return str(t._codecs[0].mimeType)
    return None


def _evidence_checks(peer: WhipPeer) -> int:
    """Sync checks so far whose video time rests on evidence (markers or lips), not assigned pts."""
    return sum(1 for e in peer.events if e.type == "sync" and e.message.get("evidence", "assigned") != "assigned")


def peer_figures(peer: MeasuredRecord, truth: lm.ClipTruth, t0: float, t_end: float, cfg: RoundConfig) -> PeerFigures:
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
    return PeerFigures(
        run_s=round(run_s, 3),
        events=counts,
        hello={k: hello.get(k) for k in ("version", "fps", "output_delay_s", "stages")} if hello else None,
        clock_lag_ms=None if lag is None else round(lag * 1000, 1),
        unmatched_tokens=unmatched,
        latency=lm.summarise_latencies(words, cfg.settle_s),
        words=[(round(w.start, 3), round(w.end, 3), lm.round_or_none(w.first_s, 3),
                lm.round_or_none(w.final_s, 3), w.text, w.matched_by) for w in scored],
        tokens=[(lm.round_or_none(t, 3), m.get("text"), m.get("start"), m.get("end"), bool(m.get("final")),
                 m.get("utterance"), m.get("index")) for t, m in tokens[:5000]],
        responses=lm.turn_latency_and_itl(truth, responses, until),
        level3=lm.level3(syncs),
        sync_timeline=[(lm.round_or_none(t, 3), m.get("max_delta_ms"), bool(m.get("ok"))) for t, m in events
                       if m.get("type") == "sync"],
        lst_last=lst[-1] if lst else None,
        lst_ttft_ms=[m["ttft_ms"] for _, m in responses if isinstance(m.get("ttft_ms"), (int, float))],
        lst_itl_ms=[m["itl_ms"] for _, m in responses if isinstance(m.get("itl_ms"), (int, float))],
        frames_received=peer.frames_received,
        video_decoded=peer.decode_video,
        video_fps=round(len(frames) / (frames[-1] - frames[0]), 2) if len(frames) > 1 else None,
        first_video_ms=None if peer.first_frame_wall is None else round((peer.first_frame_wall - t0) * 1000, 1),
        frames_per_s=np.bincount(np.asarray([int(f) for f in frames if f >= 0], int)).tolist() if frames else [],
        flashes_seen=len(peer.flash_walls),
        flash_lag_ms=[round(x * 1000, 1) for x in lags],
        flash_lag_ms_p50=None if not lags else round(float(np.median(lags)) * 1000, 1),
        answer=answer_summary(peer, truth, t0, until),
    )


def answer_summary(peer: MeasuredRecord, truth: lm.ClipTruth, t0: float, until: float) -> AnswerSummary:
    """The spoken answers as this peer received them: packets counted always; voice-to-voice, barge-in
    and lip-sync per answer when it decoded them (``decode_answer``). Each loop of the clip is one
    utterance; the next loop's first word, when it starts while an answer plays, is a barge-in."""
    from app.loadtest.voicepeer import Utterance, answer_figures

    listener = peer.answer
    counted = AnswerSummary(listener.decode, listener.audio_packets, listener.audio_bytes, listener.avatar_frames,
                            sum(e.type == "answer_start" for e in peer.events))
    if not listener.decode or not truth.words or truth.period_s <= 0:
        return counted
    onset = truth.speech_onset if truth.speech_onset is not None else truth.words[0].start
    said = [Utterance(" ".join(w.text for w in truth.words), r * truth.period_s + onset,
                      r * truth.period_s + truth.utterance_end) for r in range(int(until // truth.period_s) + 1)]
    per = answer_figures(listener, peer.events, said, t0)
    rows = [(f.get("reason"), f.get("voice_to_voice_ms"), f.get("stop_ms"), f.get("lip_sync_ms"),
             f.get("false_interruption")) for f in per[:500]]
    return dataclasses.replace(counted, stats=lm.answer_stats(per), per_answer=rows)


def worker_main(worker: int, specs: list[PeerSpec], cfg: RoundConfig,
                out: multiprocessing.queues.Queue[WorkerReport]) -> None:
    """One worker process: run its peers in one asyncio loop and put their results on ``out``."""
    logging.basicConfig(level=logging.WARNING)
    try:
        setup: list[float] = []
        results = asyncio.run(_run_peers(specs, cfg, setup))
        out.put(WorkerReport(worker, results, _own_cpu_s(), setup[0]))
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        out.put(WorkerReport(worker, [], error=f"{type(exc).__name__}: {exc}"))


def _own_cpu_s() -> float:
    t = os.times()
    return round(t.user + t.system, 2)


async def _run_peers(specs: list[PeerSpec], cfg: RoundConfig, setup_cpu: list[float]) -> list[PeerResult]:
    """Build the clips (and their encodings), then run the peers; ``setup_cpu`` gets the CPU spent
    before the first peer starts (clips, and the HTTP client's imports), so the peers' own cost can be
    told from it."""
    from app.loadtest.peer import warm_http_client

    loop = asyncio.get_running_loop()
    clips: dict[float, tuple[AVClip, lm.ClipTruth, list[bytes] | None, list[bytes] | None]] = {}
    for offset in sorted({s.offset_ms for s in specs}):
        clip = await loop.run_in_executor(None, make_loop_clip, cfg.text, offset, cfg.video_size, cfg.fps,
                                          cfg.voice, cfg.mic_noise_dbfs)
        vp8 = opus = None
        if cfg.pre_encode:
            vp8 = await loop.run_in_executor(None, encode_vp8_loop, clip.frames, cfg.fps)
            opus = await loop.run_in_executor(None, encode_opus_loop, clip.audio)
        clips[offset] = (clip, lm.clip_truth(clip), vp8, opus)
    warm_http_client()
    setup_cpu.append(_own_cpu_s())
    tasks = [run_peer(s, cfg, *clips[s.offset_ms]) for s in specs]
    return list(await asyncio.gather(*tasks))
