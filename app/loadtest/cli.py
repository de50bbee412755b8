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
import os
import sys
from dataclasses import replace
from pathlib import Path

from alignment.json_types import JsonObject
from app.loadtest.config import (
    DEFAULT_MIC_NOISE_DBFS,
    DEFAULT_TEXT,
    DEFAULT_VOICE,
    EXIT_BOUND,
    EXIT_OK,
    EXIT_SERVER,
    EXIT_USAGE,
    MAX_PEERS,
    MAX_ROUNDS,
    MAX_WORKERS,
    RoundConfig,
)
from app.loadtest.records import MachineInfo, RunInfo
from app.loadtest.rounds import run_plan
from app.loadtest.spawn import SpawnedServer, check_loopback_url, local_server_pid
from app.loadtest.verdict import RECALL_BOUND


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
    p.add_argument("--decode-answer", action="store_true", help="decode the spoken answer's audio and avatar "
                   "and measure them per answer: voice-to-voice, barge-in stop, lip-sync (by default its packets "
                   "are only counted)")
    p.add_argument("--no-answer-video", dest="answer_video", action="store_false", help="do not offer the "
                   "avatar's video m-line (the answer comes back as audio and text only)")
    p.add_argument("--voice", default=DEFAULT_VOICE, help="the peers' voice: festival:<voice> or an espeak-ng "
                   "voice (default %(default)s; answers speak festival slt_hts)")
    p.add_argument("--mic-noise-dbfs", type=_dbfs_or_none, default=DEFAULT_MIC_NOISE_DBFS,
                   help="the peers' microphone noise floor, RMS dBFS (default %(default)s, as a live mic carries); "
                   "'none' sends digital silence between utterances, as a muted or gated sender does")
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


def _dbfs_or_none(text: str) -> float | None:
    """``--mic-noise-dbfs``: a level below full scale, or 'none'."""
    if text.strip().lower() == "none":
        return None
    level = float(text)
    if not -120.0 <= level <= -20.0:
        raise argparse.ArgumentTypeError("a noise floor is -120..-20 dBFS, or 'none'")
    return level


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
    server_info: JsonObject = {}
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
                          min_recall=args.min_recall, require_lst=args.require_lst, voice=args.voice,
                          mic_noise_dbfs=args.mic_noise_dbfs, answer_video=args.answer_video,
                          decode_answer=args.decode_answer)
        report = run_plan(args, cfg, pid, server)
    finally:
        if server is not None:
            server.stop()
    report = replace(report, run=RunInfo(command, url, pid, server_info, machine_info()))
    doc = report.to_json()
    json_path, html_path = loadreport.write_report(doc, out_dir)
    print(loadreport.text_summary(doc))
    print(f"report: {json_path}  {html_path}")
    return EXIT_OK if report.result.ok else EXIT_BOUND


def machine_info() -> MachineInfo:
    """The machine the report was made on (cores, load, memory), so its figures can be read for what they are."""
    import platform

    import psutil

    return MachineInfo(os.cpu_count(), [round(x, 2) for x in os.getloadavg()], platform.python_version(),
                       round(psutil.virtual_memory().total / 2**30, 1))


if __name__ == "__main__":
    sys.exit(main())
