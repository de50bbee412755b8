"""Replay set: the live session's event stream on three fixed clips, canonical and comparable bit for bit.

Why: a behaviour-preserving restructuring of the live path (session, server, ASR) must leave every
event the client sees unchanged. This bench runs the REAL ``app.live.session.Session`` in process
(no network, no codec) with the warmed stages the test suite uses, on three generated clips (face
video + speech: two espeak-ng voices, one festival voice), captures every event it emits on its
``events`` data channel, and writes / compares a canonical JSON of them.

How it is made deterministic (media time, not wall clock):

* both track clocks are anchored at one instant before any media (``on_first_packet(0, t0)``), so
  audio and video pts are exactly the clip's media times;
* audio (20 ms frames) and video (25 fps) are released one frame at a time in media-time order
  (audio first on a tie), and the next frame only goes out when the session is quiet: the frame
  has been read, the ASR worker has fed it or holds it (one 20 ms chunk per feed, held ones
  included, so the decode schedule is a function of the audio alone) and its events have been
  handled, the AU thread has taken the camera frame (nothing is lost to the latest-wins mailbox)
  and, when its pts-based frame-rate limiter takes it, emitted its ``au`` / ``load``; and no
  response is being streamed;
* the sync stage refreshes its A/V offset estimate at most once per wall second: the next audio
  frame is held until 1.05 s after the last ``sync`` event, so every batch of final words
  refreshes it (finals of one ASR batch are checked in one loop turn and share it);
* the output video track is not pulled (no peer): ``output.next_index`` stays 0, so every token is
  placed on its ideal frames and ``late`` is always false — the late path is not covered here;
* the stream is cut when the clip's last frame has been handled and the last answer has finished;
  what the session emits while closing is not part of it;
* the three clips run one after another, one session each (libespeak-ng keeps state between
  syntheses, and the word-timing reference is synthesised per emission: sessions run together
  would shift each other's times by a millisecond or so). Stages are warmed by the server's own
  ``app.live.warmup.warm_up(ServerConfig.in_process(ui=False), ...)``, every default stage, so ``hello``
  lists nothing missing.

Determinism is shown by tests/test_replay_events.py (one clip twice in one process, no golden file:
another CPU may decode other floats) and by ``--write`` then ``--check`` twice.

What is compared: every event, in order, key order included, floats as emitted — except the wall
clock measurements named in ``WALL_CLOCK_FIELDS``, whose values become ``"~"`` (key kept, in place).

Seams it leans on (private names; if a refactor renames them this bench fails loudly, it does not
pass silently): ``Session.faces.frame_waiting`` (the AU mailbox), ``ASRWorker._cond`` / ``_streams`` and
``ASRStream.settled`` / ``_events``; plus ``Session.hook`` / ``attach`` /
``running_tasks`` / ``clock`` and the peer connection's ``track`` / ``datachannel`` events.

Usage::

    python bench/replay_events.py --write   # (re)write bench/data/replay_events.json
    python bench/replay_events.py [--check] # rerun and compare; exit 1 on any difference
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DATA = ROOT / "bench" / "data" / "replay_events.json"

#: Wall-clock measurements (latencies, paced emission times and what is derived from them): they
#: change from run to run, so their values are replaced by "~" (the key stays, in its place).
WALL_CLOCK_FIELDS: dict[str, tuple[str, ...]] = {
    # ms from the end of speech / previous token to this token's paced emission (wall clock)
    "response": ("ms_after_utterance", "ttft_ms", "hold_ms", "turn_ms", "itl_ms"),
    # LST figures are percentiles/σ of those same wall-clock intervals; the tier follows from them
    "lst": ("ttft_ms_p99", "ttft_ms_p50", "turn_ms_p50", "turn_ms_p95", "turn_ms_p99", "itl_ms_max",
            "itl_ms_last", "jitter_ms", "jitter_ms_last8", "tier", "hold_ms_p50", "hold_ms_p99"),
}
WALL = "~"
SYNC_REFRESH_GAP_S = 1.05  # > the session's 1 s estimate refresh period
WAIT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ClipSpec:
    """One clip of the replay set: fixed text, voice and (optional) noise seed."""

    name: str
    text: str
    voice: str
    lead_in_s: float
    tail_s: float
    markers: tuple[float, ...] = ()
    noise_snr_db: float | None = None
    seed: int = 0


#: Two sentences each (two utterances, two answers) and long enough (≈ 8 s) for the load controller's
#: 5 s baseline + 1.4 s window to speak: every event kind shows up.
CLIPS: tuple[ClipSpec, ...] = (
    ClipSpec("espeak-us-markers",
             "please call me back when you have a moment. i will be in the office until five this evening",
             "en-us", 0.5, 2.0, markers=(0.25, 4.0)),
    ClipSpec("festival-slt",
             "the meeting moved to thursday afternoon so please bring the budget and the new schedule with you",
             "festival:slt_hts", 0.6, 2.0),
    ClipSpec("espeak-rp-noise",
             "send the report to my office before noon. then we can talk about the plan for next week",
             "en-gb-x-rp", 0.4, 2.0, noise_snr_db=30.0, seed=7),
)


def build_clip(spec: ClipSpec) -> Any:
    """The clip's audio and frames (app.loadtest.testmedia), fully determined by the spec."""
    from app.loadtest import testmedia

    speech = testmedia.speak(spec.text, spec.voice, lead_in_s=spec.lead_in_s)
    clip = testmedia.make_av_clip(speech=speech, tail_s=spec.tail_s, markers=spec.markers)
    if spec.noise_snr_db is not None:
        clip.audio[:] = testmedia.add_noise(clip.audio, spec.noise_snr_db, seed=spec.seed)
    return clip


def canonical(event: dict[str, Any]) -> dict[str, Any]:
    """The event with its wall-clock values replaced (key order kept)."""
    wall = WALL_CLOCK_FIELDS.get(str(event.get("type")), ())
    return {k: (WALL if k in wall else v) for k, v in event.items()}


# --- in-process media ---------------------------------------------------------------------------


class _NoWait:
    """A clip start that never sleeps: frames are released by the replay, not by the wall clock."""

    wall = 0.0

    def get(self) -> float:
        return 0.0

    async def sleep_until(self, t: float) -> None:
        return None


class GatedTrack:
    """A media track whose ``recv`` hands out the frames the replay releases, one at a time."""

    def __init__(self, kind: str) -> None:
        from aiortc import MediaStreamTrack

        gate = self

        class _Track(MediaStreamTrack):
            async def recv(self) -> Any:
                return await gate._recv()

        _Track.kind = kind
        self.track = _Track()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.waiting = asyncio.Event()  # set while the reader waits for the next frame

    async def _recv(self) -> Any:
        from aiortc.mediastreams import MediaStreamError

        self.waiting.set()
        item = await self._queue.get()
        self.waiting.clear()
        if item is None:
            raise MediaStreamError
        return item

    def release(self, frame: Any) -> None:
        self.waiting.clear()
        self._queue.put_nowait(frame)

    async def consumed(self) -> None:
        """The reader took the frame, handled it, and is back waiting for the next one."""
        await asyncio.wait_for(self.waiting.wait(), WAIT_TIMEOUT_S)


class CaptureChannel:
    """Stands in for the ``events`` data channel: keeps every message the session sends."""

    label = "events"
    readyState = "open"
    bufferedAmount = 0

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.last_sync_wall = -float("inf")

    def send(self, data: str) -> None:
        ev = json.loads(data)
        self.events.append(ev)
        if ev.get("type") == "sync":
            self.last_sync_wall = time.monotonic()

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e.get("type") == kind)

    def close(self) -> None:
        self.readyState = "closed"


# --- quiescence -----------------------------------------------------------------------------------


async def _until(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"replay: waited {WAIT_TIMEOUT_S:.0f} s for {what}")
        await asyncio.sleep(0.001)


def _asr_idle(worker: Any, session_id: str) -> bool:
    """This session's ASR stream has no audio due or being fed (only held audio), and its events were handled."""
    with worker._cond:
        s = worker._streams.get(session_id)
        return s is None or (s.settled and s._events.empty())


def _responding(session: Any) -> bool:
    return any(t.get_name().split(":", 1)[-1].startswith("response") for t in session.running_tasks)


# --- one clip -------------------------------------------------------------------------------------


async def replay_clip(spec: ClipSpec, clip: Any, stages: Any, session_id: str) -> list[dict[str, Any]]:
    """Every event the live session emits on ``clip``, released in media time (see module doc)."""
    from aiortc import RTCPeerConnection

    from app.live.au import FrameRate
    from app.live.server_metrics import ServerMetrics
    from app.live.session import Session, SessionConfig
    from app.loadtest.peer import ClipAudioTrack, ClipVideoTrack

    config = SessionConfig()
    pc = RTCPeerConnection()
    session = Session(session_id, pc, stages, config, ServerMetrics())
    session.hook()
    t0 = time.monotonic()
    session.clock.track("audio", 48_000).on_first_packet(0, t0)  # one anchor: pts = media time
    session.clock.track("video", 90_000).on_first_packet(0, t0)
    audio, video = GatedTrack("audio"), GatedTrack("video")
    pc.emit("track", audio.track)
    pc.emit("track", video.track)
    session.attach()
    channel = CaptureChannel()
    pc.emit("datachannel", channel)

    start = _NoWait()
    src_audio = ClipAudioTrack(clip.audio, start)  # type: ignore[arg-type]
    src_video = ClipVideoTrack(clip.frames, clip.fps, start)  # type: ignore[arg-type]
    n_audio = -(-len(clip.audio) * 3 // 960)  # 20 ms frames of 48 kHz audio, the last one padded
    # (media time in µs, audio before video on a tie)
    schedule = sorted([(i * 20_000, 0) for i in range(n_audio)]
                      + [(round(k * 1e6 / clip.fps), 1) for k in range(len(clip.frames))])
    rate = FrameRate(config.au_max_fps)
    faces = stages.make_faces is not None
    worker = stages.asr_worker
    await audio.consumed()
    await video.consumed()
    try:
        for _, is_video in schedule:
            if is_video:
                frame = await src_video.recv()
                t = frame.pts / 90_000  # the pts the session's clock gives it (anchored at 0)
                before = channel.count("au")
                video.release(frame)
                await video.consumed()
                if faces:
                    await _until(lambda: not session.faces.frame_waiting or session.closed,
                                 "the AU thread to take a frame")
                    if rate.take(t):
                        await _until(lambda b=before: channel.count("au") > b or "au" in session.degraded
                                     or session.closed, "an au event")
            else:
                gap = channel.last_sync_wall + SYNC_REFRESH_GAP_S - time.monotonic()
                if gap > 0:
                    await asyncio.sleep(gap)
                audio.release(await src_audio.recv())
                await audio.consumed()
                if worker is not None:
                    await _until(lambda: _asr_idle(worker, session_id), "the ASR worker")
            await asyncio.sleep(0)
            await _until(lambda: not _responding(session), "the answer to finish")
        events = list(channel.events)
    finally:
        channel.close()
        audio.release(None)
        video.release(None)
        await session.close("replay done")
    return events


def replay_all(specs: tuple[ClipSpec, ...] = CLIPS, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Warm every stage once, as ``synchrony serve`` does (the in-process preset, no UI), and replay
    every clip; the server's own warm-up, so a change there shows here too."""
    from app.live.server import ServerConfig
    from app.live.warmup import WarmState, warm_up

    # The clips first: libespeak-ng's output depends on what it synthesised before, so clips made
    # after the warm-up would change with whatever the warm-up speaks.
    c0 = time.monotonic()
    clips = [build_clip(spec) for spec in specs]
    log(f"  built {len(clips)} clips in {time.monotonic() - c0:.1f} s")
    c0 = time.monotonic()
    state = WarmState()
    warm_up(ServerConfig.in_process(ui=False), state)
    worker = state.stages.asr_worker
    log(f"  warmed the stages in {time.monotonic() - c0:.1f} s")

    async def run_all() -> list[list[dict[str, Any]]]:
        # One clip after another: libespeak-ng keeps state from one synthesis to the next, and the
        # word-timing reference is synthesised per emission, so sessions running together would
        # make each other's references (and times, by a millisecond or so) depend on their
        # interleaving.
        return [await replay_clip(spec, clip, state.stages, f"replay-{i}")
                for i, (spec, clip) in enumerate(zip(specs, clips, strict=True))]

    c0 = time.monotonic()
    try:
        streams = asyncio.run(run_all())
    finally:
        if worker is not None:
            worker.stop()
    log(f"  replayed {len(specs)} clips in {time.monotonic() - c0:.1f} s")
    out: dict[str, Any] = {}
    for spec, clip, events in zip(specs, clips, streams, strict=True):
        out[spec.name] = {"text": spec.text, "voice": spec.voice, "duration_s": round(clip.duration, 4),
                          "events": [canonical(e) for e in events]}
        log(f"  {spec.name}: {len(events)} events")
    return out


def dumps(data: dict[str, Any]) -> str:
    """The canonical JSON text: stable (key order as emitted), one event per line so a changed event
    is one changed line in a diff, newline-terminated."""
    lines = ["{"]
    for i, (name, clip) in enumerate(data.items()):
        head = {k: v for k, v in clip.items() if k != "events"}
        lines.append(f" {json.dumps(name)}: {{")
        lines += [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
        lines.append('  "events": [')
        events = clip["events"]
        lines += [f"   {json.dumps(e, ensure_ascii=False)}{',' if j < len(events) - 1 else ''}"
                  for j, e in enumerate(events)]
        lines.append("  ]")
        lines.append(" }" + ("," if i < len(data) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def compare(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Print per clip: events, kinds, identical; the first differing event on a difference."""
    same_all = True
    for name in [*new, *(n for n in old if n not in new)]:
        a, b = old.get(name, {}).get("events"), new.get(name, {}).get("events")
        if a is None or b is None:
            print(f"{name}: only in {'baseline' if b is None else 'this run'}")
            same_all = False
            continue
        kinds: dict[str, int] = {}
        for e in b:
            kinds[str(e.get("type"))] = kinds.get(str(e.get("type")), 0) + 1
        same = json.dumps(a) == json.dumps(b)
        same_all &= same
        print(f"{name}: {len(b)} events (baseline {len(a)}), kinds {kinds}, identical: {'yes' if same else 'no'}")
        if not same:
            i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if json.dumps(x) != json.dumps(y)),
                     min(len(a), len(b)))
            print(f"  first difference at event {i}:")
            print(f"    baseline: {json.dumps(a[i]) if i < len(a) else '(none)'}")
            print(f"    this run: {json.dumps(b[i]) if i < len(b) else '(none)'}")
    return same_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write the baseline ({DATA.relative_to(ROOT)})")
    mode.add_argument("--check", action="store_true", help="rerun and compare with the baseline (default)")
    parser.add_argument("--data", type=Path, default=DATA, help="baseline file")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    print("replaying the live session on the replay set ...")
    new = replay_all()
    text = dumps(new)
    print(f"ran in {time.monotonic() - t0:.1f} s; sha256 {digest(text)}")
    if args.write:
        args.data.parent.mkdir(parents=True, exist_ok=True)
        args.data.write_text(text)
        print(f"wrote {args.data}")
        return 0
    if not args.data.exists():
        print(f"no baseline at {args.data}: run with --write first")
        return 1
    old_text = args.data.read_text()
    print(f"baseline sha256 {digest(old_text)}")
    ok = compare(json.loads(old_text), new)
    print("IDENTICAL" if ok else "DIFFERENT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
