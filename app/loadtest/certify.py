"""``synchrony certify`` and ``synchrony verify``: an LST certification run and its signed report.

certify streams a workload to a server over real WebRTC (one ``WhipPeer`` per network strategy),
keeps every raw LST sample (``app.loadtest.cells``: TTFT at the server, ITL at the receiving peer,
SEQ-Integrity against the stand-in's log) and writes ``certificate.json`` (samples as Merkle leaves,
root + verdict signed with the operator's Ed25519 key; ``app.loadtest.certificate``) and
``certificate.html``. The workload: turns spoken by a talking face, each in a mutation context
(plain, cut short, tool call, insertion, and the load step and truncation driven through the face:
``app.loadtest.stepclip``; the first pass on a fresh server is the cold start), under every
``--netem`` strategy (``cells.NETWORKS``), for every ``--responder`` (``openai`` talks to the local
stand-in, ``app.loadtest.llm_standin``). Each answer is paced by the server's own load controller.

verify recomputes the leaves, the root and the verdict and checks the signature; exit 0 valid, 1
not (with the reasons), 2 unreadable input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from alignment.lst import LST_VERSION, TIER_NAMES, tier_rank
from alignment.types import SAMPLE_RATE
from app.loadtest import certificate, stepclip
from app.loadtest.cells import CONTEXTS, NETWORKS, Sample, netem_spec, samples_v3
from app.loadtest.certificate import JSONObject

if TYPE_CHECKING:
    from app.loadtest.llm_standin import StandInLLM
    from app.loadtest.peer import ReceivedEvent
    from app.loadtest.testmedia import AVClip

EXIT_OK, EXIT_BELOW, EXIT_USAGE, EXIT_SERVER = 0, 1, 2, 3


@dataclass(frozen=True)
class Turn:
    """One user turn of the workload: ``cut`` keeps only this fraction of the speech (cut short);
    ``context``: the mutation context its answer belongs to (``cells.CONTEXTS``); ``strain``: the
    face strains to this amount (``app.loadtest.stepclip``) ``strain_after_s`` after the turn's
    speech ends, while its answer streams, and stays so until the next strain or the clip's end."""

    name: str
    text: str
    pause_s: float  # silence after it
    cut: float | None = None
    context: str = "plain"
    strain: float | None = None
    strain_after_s: float = 0.8


STANDARD_TURNS = (
    Turn("plain", "please call me back when you have a moment", 2.5),
    Turn("cut short", "could you tell me where the nearest train station is from here", 2.5, cut=0.5),
    Turn("tool call", "what is the weather going to be like tomorrow morning", 2.5, context="tool calls"),
    Turn("answered", "tell me something about the history of the old river bridge", 0.9, context="insertion"),
    Turn("inserted while answering", "and should I take an umbrella", 2.5, context="insertion"),
    Turn("long", "I would like to book a table for four people on friday evening somewhere near the river "
                 "and if there is nothing left after seven then saturday would also be fine", 3.0),
    # the controller reads level 2 mid-answer (rate 12 → 5 tok/s, max_tokens 96: no cut), then level 3
    # mid the long answer the stand-in gives to "everything" (max_tokens 48 < its ~60 words: cut)
    Turn("load step", "could you read me the first lines of the letter from the bank", 3.0, context="load step",
         strain=0.6),
    Turn("truncated", "now tell me everything about the train times to the coast", 6.0, context="truncation",
         strain=1.0, strain_after_s=1.5),
)
QUICK_TURNS = STANDARD_TURNS[:2]
#: The two contexts driven through the face, after one plain turn (the controller's 5 s baseline).
STEP_TURNS = tuple(t for t in STANDARD_TURNS if t.name in ("plain", "load step", "truncated"))
WORKLOADS = {"standard": STANDARD_TURNS, "quick": QUICK_TURNS, "steps": STEP_TURNS}


@dataclass(frozen=True)
class Workload:
    clip: AVClip
    turns: tuple[Turn, ...]
    speech_ends: tuple[float, ...]  # clip time at which each turn's speech ends
    strains: tuple[tuple[float, float], ...] = ()  # (clip time, amount): the face strains from then on


def workload_clip(turns: tuple[Turn, ...], fps: float = 25.0, size: tuple[int, int] = (640, 360)) -> Workload:
    """The turns spoken one after another over a talking face (mouth following the speech)."""
    from app.loadtest import testmedia

    parts, ends, words = [np.zeros(int(0.6 * SAMPLE_RATE), np.float32)], [], []
    strains: list[tuple[float, float]] = []  # (clip time, amount) from which the face strains
    t = 0.6
    for turn in turns:
        speech = testmedia.synthesize_speech(turn.text)
        audio = speech.samples
        voiced = np.flatnonzero(np.abs(audio) > 1e-3)
        length = int(voiced[-1]) + 1 if voiced.size else len(audio)
        if turn.cut is not None:
            length = int(length * turn.cut)
            fade = min(int(0.01 * SAMPLE_RATE), length)
            audio = audio[:length].copy()
            audio[length - fade:] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
        audio = audio[:length]
        words += [testmedia.TimedWord(w.text, w.start + t) for w in speech.words if w.start * SAMPLE_RATE < length]
        ends.append(t + length / SAMPLE_RATE)
        if turn.strain is not None:
            strains.append((ends[-1] + turn.strain_after_s, turn.strain))
        parts += [audio, np.zeros(int(turn.pause_s * SAMPLE_RATE), np.float32)]
        t += (length + int(turn.pause_s * SAMPLE_RATE)) / SAMPLE_RATE
    audio = np.concatenate(parts).astype(np.float32)
    n_frames = int(len(audio) / SAMPLE_RATE * fps)
    times = np.arange(n_frames) / fps
    env = testmedia.speech_envelope(audio, times)
    amounts = np.zeros(n_frames)
    for at, amount in strains:
        amounts[times >= at] = amount
    frames = stepclip.face_frames(env, amounts, size)
    clip = testmedia.AVClip(audio, frames, fps, tuple(words), " / ".join(tt.text for tt in turns), (), 0.0)
    return Workload(clip, turns, tuple(ends), tuple(strains))


def turn_at(workload: Workload, clip_t: float) -> Turn:
    """The turn whose speech ended last before clip time ``clip_t`` (the clip loops)."""
    t = clip_t % workload.clip.duration
    before = [i for i, end in enumerate(workload.speech_ends) if end <= t]
    return workload.turns[before[-1] if before else -1]


async def run_scenario(url: str, workload: Workload, netem: str, loops: int, seed: int,
                       token: str | None = None) -> tuple[list[ReceivedEvent], float | None, str | None, JSONObject]:
    """One peer streams the workload ``loops`` times under ``netem``; returns its events, t0, session, info."""
    from app.loadtest.netem import NetemLink, parse_profile
    from app.loadtest.peer import WhipPeer

    peer = WhipPeer(url, workload.clip, token=token, loop=True)
    profile = parse_profile(netem)
    link = None
    if not profile.is_clean:
        link = NetemLink(profile, seed=seed)
        peer.pc.on("icegatheringstatechange", lambda: link.attach_pc(peer.pc))
    info: JSONObject = {"netem": netem, "error": None}
    try:
        await asyncio.wait_for(peer.connect(timeout=20.0), 25.0)
        run_s = loops * workload.clip.duration
        end = time.monotonic() + run_s
        while time.monotonic() < end and peer.pc.connectionState not in ("failed", "closed"):
            await asyncio.sleep(0.25)
        if peer.pc.connectionState in ("failed", "closed"):
            info["error"] = f"connection {peer.pc.connectionState} during the run"
    except Exception as exc:  # noqa: BLE001 - the report says what went wrong; other scenarios go on
        info["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(peer.close(), 10)
    if link is not None:
        info["netem_stats"] = link.stats()
    info["events"] = len(peer.events)
    return peer.events, peer.t0_wall, peer.session_id, info


async def certify_run(args: argparse.Namespace, out_dir: Path) -> tuple[JSONObject, list[Sample]]:
    """Every responder × network strategy; returns the header and the samples (raises ValueError on no server)."""
    from app.loadtest.llm_standin import StandInLLM

    workload = await asyncio.to_thread(workload_clip, WORKLOADS[args.workload])
    samples: list[Sample] = []
    runs: list[JSONObject] = []
    standin = None
    responders = args.responder if args.spawn_server else ["server"]  # --url: whatever it runs
    try:
        for responder in responders:
            if responder == "openai" and standin is None:
                standin = await StandInLLM(ttft_s=args.standin_ttft_ms / 1000.0).start()
            for k, network in enumerate(args.netem):
                got, info = await _one_run(args, out_dir, workload, responder, network, k, standin)
                samples += got
                runs.append(info)
    finally:
        if standin is not None:
            await standin.stop()
    header = {
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "synchrony certify " + " ".join(args.argv),
        "server": args.url if not args.spawn_server else "spawned on 127.0.0.1 (synchrony serve), fresh per run",
        "workload": {"name": args.workload, "loops": args.loops, "clip_s": round(workload.clip.duration, 3),
                     "turns": [{"name": t.name, "text": t.text, "pause_s": t.pause_s, "cut": t.cut,
                                "context": t.context} for t in workload.turns],
                     "responders": responders, "netem": args.netem,
                     "networks": {n: netem_spec(n) for n in args.netem}, "contexts": list(CONTEXTS),
                     "standin_ttft_ms": args.standin_ttft_ms if "openai" in responders else None},
        "runs": runs,
        "machine": {"cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()]},
        "lst_definitions": f"alignment/lst.py (docs/LST.md), version {LST_VERSION}",
        "lst_version": LST_VERSION,
        "judged": {"ttft": "at the server (request written → first content read)",
                   "itl": "at the receiving peer (arrival gaps of an answer's words)",
                   "seq": "at the receiving peer, against the stand-in LLM's log (openai only)"},
    }
    return header, samples


async def _one_run(args: argparse.Namespace, out_dir: Path, workload: Workload, responder: str, network: str,
                   k: int, standin: StandInLLM | None) -> tuple[list[Sample], JSONObject]:
    """One peer streams the workload to a server (a fresh one with ``--spawn-server``)."""
    from app.loadtest.spawn import SpawnedServer

    server, url = None, args.url
    if args.spawn_server:
        extra = ["--responder", responder] + (["--llm-url", standin.base_url] if responder == "openai" else [])
        log_name = f"server-{responder}-{network.replace('+', '-').replace('=', '').replace(',', '_')[:40]}.log"
        server = SpawnedServer(2, out_dir / log_name, extra)
        print(f"starting a fresh server, {responder} responder (log: {server.log_path}) ...", flush=True)
        try:
            await asyncio.to_thread(server.wait_ready)
        except (RuntimeError, TimeoutError) as exc:
            server.stop()
            raise ValueError(str(exc)) from None
        url = server.url
    log_from = len(standin.log) if standin is not None else 0
    try:
        print(f"  {responder} / {network}: {args.loops} × {workload.clip.duration:.1f} s ...", flush=True)
        events, t0, session, info = await run_scenario(url, workload, netem_spec(network), args.loops, args.seed + k,
                                                       args.token)
        info["server_lst"] = await asyncio.to_thread(_server_lst, url, args.token)
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
    await asyncio.sleep(0.2)  # the stand-in logs a completion when its stream closes
    log = list(standin.log[log_from:]) if standin is not None and responder == "openai" else None

    def context_at(clip_t: float) -> tuple[str, str]:
        turn = turn_at(workload, clip_t)
        return turn.name, turn.context

    cold_until = workload.clip.duration if args.spawn_server else None
    got = [] if t0 is None else samples_v3(events, t0, context_at, network, responder, session or "?", cold_until,
                                            log)
    info = {"responder": responder, **info, "netem": network, "netem_spec": netem_spec(network),
            "samples": len(got), "load_avg": [round(x, 2) for x in os.getloadavg()],
            "load_levels": [] if t0 is None else _level_changes(events, t0)}
    lst = info.get("server_lst") or {}
    print(f"    the server's controller (load events): level changes at client s {info['load_levels'][:12]}")
    print(f"    {len(got)} samples; server: turn-hold p99 {lst.get('hold_ms_p99')} ms, prefetch waste "
          f"{lst.get('prefetch_wasted')} of {lst.get('prefetch_requests')}, own SEQ check {lst.get('seq_integrity')}"
          f"{'; ' + info['error'] if info['error'] else ''}", flush=True)
    return got, info


def _level_changes(events: list[ReceivedEvent], t0: float) -> list[tuple[float, int]]:
    """(client s, level) at each change of the level in the server's ``load`` events: the steps the
    controller read from the face, as the session saw them."""
    out: list[tuple[float, int]] = []
    for ev in events:
        level = ev.message.get("level") if ev.type == "load" else None
        if isinstance(level, int) and (not out or out[-1][1] != level):
            out.append((round(ev.wall - t0, 2), level))
    return out[:500]


def _server_lst(url: str, token: str | None) -> JSONObject:
    """The server's own LST v3 extras after a run: turn-hold, prefetch waste, its SEQ self-check."""
    from app.loadtest.probe import fetch_lst, lst_url

    try:
        snap = fetch_lst(lst_url(url), 5.0, token)
    except ValueError as exc:
        return {"error": str(exc)[:200]}
    keys = ("lst_version", "hold_ms_p50", "hold_ms_p99", "prefetch_requests", "prefetch_wasted", "prefetch_waste",
            "seq_answers", "seq_integrity", "ttft_ms_p99", "tier")
    return {k: snap.get(k) for k in keys}


# --- HTML ---------------------------------------------------------------------------------------

def render_html(report: JSONObject) -> str:
    """A self-contained page: the verdict, per-scenario figures, plots of every raw sample."""
    from html import escape

    v = report["verdict"]
    groups = {**v["by_scenario"], **v.get("by_cell", {})}
    rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{s['ttft_ms_p99']}</td><td>{s['jitter_ms']}</td><td>{s['itl_ms_max']}</td>"
        f"<td>{s['turn_ms_p50']}</td><td>{s['turn_ms_p95']}</td><td>{s['responses']}</td>"
        f"<td>{s.get('seq_integrity')} ({s.get('seq_answers', 0)})</td><td>{s['tier']}</td></tr>"
        for name, s in groups.items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>LST certificate</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}}td,th{{padding:2px 8px;text-align:right}}
code{{word-break:break-all}}</style></head><body>
<h1>LST certificate: tier {escape(v['tier'])}</h1>
<p>LST TTFT p99 {v['ttft_ms_p99']} ms (request written → first content read, at the server), worst jitter σ8
{v['jitter_ms']} ms, ITLmax {v['itl_ms_max']} ms (at the receiving peer), over {v['responses']} responses and
{v['intervals']} intervals. Turn latency (end of speech → first word) p50 {v['turn_ms_p50']} ms, p95
{v['turn_ms_p95']} ms. SEQ-Integrity {v.get('seq_integrity')} over {v.get('seq_answers', 0)} answers.
Definitions v{v.get('lst_version')}.</p>
<p>{len(report['samples'])} samples; Merkle root <code>{report['merkle_root']}</code>, signed (Ed25519) by
<code>{report['signature']['public_key']}</code>. Check it:
<code>synchrony verify certificate.json --pubkey KEY.pub</code>.</p>
<p>{escape(report['header']['command'])} — {escape(report['header']['created_utc'])}</p>
<table><tr><th>run / cell</th><th>TTFT99 ms</th><th>jitter ms</th><th>ITLmax ms</th><th>turn p50</th>
<th>turn p95</th><th>responses</th><th>SEQ (answers)</th><th>tier</th></tr>{rows}</table>
<h2>LST TTFT and turn latency per response</h2>{_ttft_svg(report['samples'])}
<h2>Inter-token intervals</h2>{_itl_svg(report['samples'])}
</body></html>"""


def _ttft_svg(samples: list[Sample]) -> str:
    from app.loadtest.report import figure_svg, new_figure

    fig, ax = new_figure()
    first = [s for s in samples if s["kind"] == "ttft"]
    for scenario in sorted({s["scenario"] for s in first}):
        mine = [s for s in first if s["scenario"] == scenario]
        ax.plot([s["client_s"] for s in mine], [s["ms"] for s in mine], "o", ms=4, label=f"LST TTFT {scenario}")
        turns = [s for s in mine if s.get("turn_ms") is not None]
        ax.plot([s["client_s"] for s in turns], [s["turn_ms"] for s in turns], "x", ms=4, label=f"turn {scenario}")
    for limit in (65, 120, 200):
        ax.axhline(limit, lw=0.5, ls="--", color="grey")
    ax.set_xlabel("client time (s)")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    return figure_svg(fig)


def _itl_svg(samples: list[Sample]) -> str:
    from app.loadtest.report import figure_svg, new_figure

    fig, ax = new_figure()
    itl = [s for s in samples if s["kind"] == "itl"]
    for scenario in sorted({s["scenario"] for s in itl}):
        mine = [s for s in itl if s["scenario"] == scenario]
        ax.plot([s["client_s"] for s in mine], [s["ms"] for s in mine], ".", ms=3, label=scenario)
    ax.set_xlabel("client time (s)")
    ax.set_ylabel("ITL (ms)")
    ax.legend(fontsize=7)
    return figure_svg(fig)


# --- command line -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="synchrony certify", description=__doc__.splitlines()[0])
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="WHIP endpoint of a running server (loopback only)")
    target.add_argument("--spawn-server", action="store_true", help="start `synchrony serve` per --responder")
    p.add_argument("--responder", action="append", choices=("caption", "openai"),
                   help="--spawn-server: responders to certify, one server each (default: caption)")
    p.add_argument("--standin-ttft-ms", type=float, default=100.0, help="the openai stand-in's own TTFT")
    p.add_argument("--netem", action="append",
                   help=f"network strategy ({', '.join(NETWORKS)}, or any netem spec; repeat; default: clean)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="standard")
    p.add_argument("--loops", type=int, default=2, help="times the workload clip is streamed per scenario (1..20)")
    p.add_argument("--key", required=True, help="Ed25519 signing key (PEM); created with KEY.pub beside it if absent")
    p.add_argument("--out", default="certify-out", help="directory for certificate.json and certificate.html")
    p.add_argument("--require", choices=TIER_NAMES[1:], default=None, help="exit 1 if the verdict is below this tier")
    p.add_argument("--token", default=os.environ.get("SYNCHRONY_TOKEN"), help="bearer token for /whip")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str]) -> int:
    from app.loadtest.netem import parse_profile
    from app.loadtest.spawn import check_loopback_url

    args = build_parser().parse_args(argv)
    args.argv = list(argv)
    args.netem = args.netem or ["clean"]
    args.responder = args.responder or ["caption"]
    try:
        if not 1 <= args.loops <= 20:
            raise ValueError("--loops must be 1..20")
        for spec in args.netem:
            parse_profile(netem_spec(spec))
        if args.url:
            check_loopback_url(args.url)
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        key, made = certificate.load_or_create_key(Path(args.key))
    except (ValueError, OSError) as exc:
        print(f"synchrony certify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if made:
        pub = certificate.public_key_path(Path(args.key))
        print(f"new signing key {args.key} (keep it private); public key: {pub}")
    try:
        header, samples = asyncio.run(certify_run(args, out_dir))
    except ValueError as exc:
        print(f"synchrony certify: {exc}", file=sys.stderr)
        return EXIT_SERVER
    report = certificate.build_report(header, samples, key)
    json_path, html_path = out_dir / "certificate.json", out_dir / "certificate.html"
    json_path.write_text(json.dumps(report, indent=1))
    html_path.write_text(render_html(report))
    v = report["verdict"]
    for name, cell in {**v["by_scenario"], **v.get("by_cell", {})}.items():
        print(f"  {name}: TTFT99 {cell['ttft_ms_p99']} ms, σ8 {cell['jitter_ms']} ms, {cell['responses']} responses, "
              f"SEQ {cell.get('seq_integrity')} ({cell.get('seq_answers', 0)}), tier {cell['tier']}")
    print(f"LST TTFT p99 {v['ttft_ms_p99']} ms (server), jitter σ8 (worst, at the peer) {v['jitter_ms']} ms, ITLmax "
          f"{v['itl_ms_max']} ms, turn latency p50 {v['turn_ms_p50']} / p95 {v['turn_ms_p95']} ms over "
          f"{v['responses']} responses, SEQ-Integrity {v.get('seq_integrity')} over {v.get('seq_answers', 0)} "
          f"answers: tier {v['tier']}")
    print(f"report: {json_path}  {html_path}  ({len(samples)} samples, root {report['merkle_root'][:16]}…)")
    if not samples:
        print("synchrony certify: no response was measured; the report certifies nothing", file=sys.stderr)
        return EXIT_SERVER
    if args.require and tier_rank(v["tier"]) < tier_rank(args.require):
        print(f"FAIL: tier {v['tier']} is below the required {args.require}")
        return EXIT_BELOW
    return EXIT_OK


def verify_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="synchrony verify", description="check a certificate.json against a public key")
    p.add_argument("report", help="certificate.json written by synchrony certify")
    p.add_argument("--pubkey", required=True, help="the signer's Ed25519 public key (PEM, KEY.pub)")
    args = p.parse_args(argv)
    try:
        public = certificate.load_public_key(Path(args.pubkey))
        report = json.loads(Path(args.report).read_text())
        if not isinstance(report, dict):
            raise ValueError("the report is not a JSON object")
    except (OSError, ValueError) as exc:
        print(f"synchrony verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    result = certificate.verify_report(report, public)
    if result.ok:
        v = report["verdict"]
        print(f"OK: {len(report['samples'])} samples, root {report['merkle_root'][:16]}…, signature valid; "
              f"tier {v['tier']} (TTFT99 {v['ttft_ms_p99']} ms, jitter {v['jitter_ms']} ms)")
        return EXIT_OK
    for problem in result.problems:
        print(f"FAILED: {problem}")
    return EXIT_BELOW
