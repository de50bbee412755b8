"""The load test's report: ``report.json`` (everything) and ``report.html`` (one self-contained page).

Both are drawn from the report's JSON document (``LoadReport.to_json()``), the one the page is archived
next to, so an old report.json can be drawn again. The page has no external references (no CDN, no
fonts, no scripts): charts are inline SVG drawn by matplotlib, so it opens anywhere, offline.
"""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from alignment.json_types import JsonObject

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def write_report(report: JsonObject, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.html`` into ``out_dir``; return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "report.json"
    json_path.write_text(json.dumps(report, indent=1, default=_json_default))
    html_path = out / "report.html"
    html_path.write_text(render_html(report))
    return json_path, html_path


def _json_default(obj: object) -> object:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.1f} %"


def text_summary(report: JsonObject) -> str:
    """A few lines for the terminal: per round the headline figures and PASS/FAIL."""
    lines = [f"command: {report.get('command', '')}"]
    for rnd in report.get("rounds", []):
        a = rnd["aggregate"]
        cpu = [s[1] for s in rnd.get("cpu", []) if s[1] is not None]
        lines.append(
            f"{rnd.get('n_peers', a['peers'])} peers, netem {rnd.get('netem', 'clean')}: "
            f"word->token p50 {a['latency_ms_p50']} ms, "
            f"p95 {a['latency_ms_p95']} ms (bound 1000), final p95 {a['final_latency_ms_p95']} ms, "
            f"recall {a['recall']}, Level-3 pass {a['level3_pass_rate']} over {a['level3_checks']} checks, "
            f"turn latency p50 {a['turn_ms_p50']} ms (client: end of speech → first word), "
            f"server CPU mean {np.mean(cpu) if cpu else float('nan'):.0f} %, "
            f"client CPU mean {np.mean([s[2] for s in rnd.get('cpu', [])] or [float('nan')]):.0f} % "
            f"({_pct(a.get('client_cpu_per_peer'))} of a core per peer), "
            + (f"with every session live: server {steady['server']} %, clients {steady['clients']} %, machine "
               f"{steady['machine']} % of {steady['cores'] * 100} %, " if (steady := a.get("cpu_all_live")) else "")
            + f"load avg {rnd.get('load_avg_before', ['?'])[0]}→{rnd.get('load_avg_after', ['?'])[0]}, "
            f"connected {a['connected']}/{a['peers']}"
            + (f", refused (503) {len(a['refused'])}" if a.get("refused") else "")
            + (f", degradation level by time {a['degradation']}" if a.get("degradation") else "")
            + f": {'PASS' if a['bounds']['ok'] else 'FAIL'}"
        )
        ans = a.get("answer") or {}
        if ans.get("answers") is not None:
            lines.append(
                f"  spoken answers: {ans['answers']} ({ans['starts']} started), voice-to-voice p50 "
                f"{ans['voice_to_voice_ms_p50']} ms p95 {ans['voice_to_voice_ms_p95']} ms; barge-ins "
                f"{ans['barge_ins']}: stop p50 {ans['stop_ms_p50']} ms p99 {ans['stop_ms_p99']} ms; false "
                f"interruptions {ans['false_interruptions']} ({_pct(ans['false_interruption_rate'])}); lip-sync "
                f"p50 {ans['lip_sync_ms_p50']} ms, |offset| p95 {ans['lip_sync_abs_ms_p95']} ms")
        elif ans:
            lines.append(f"  spoken answers (counted, not decoded): {ans.get('starts')} started, "
                         f"{ans.get('audio_packets')} audio packets, {ans.get('avatar_frames')} avatar frames")
        for p in rnd["peers"]:
            if p.get("offset_ms"):
                l3 = p.get("level3") or {}
                lines.append(f"  peer {p['index']} offset {p['offset_ms']:+.0f} ms: flagged={l3.get('flagged')} "
                             f"pass {l3.get('pass_rate')} video-audio p50 {l3.get('video_minus_audio_ms_p50')} ms")
    res = report.get("result", {})
    lines.append(f"result: {json.dumps(res)}  => {'PASS' if res.get('ok') else 'FAIL'}")
    return "\n".join(lines)


# --- charts -------------------------------------------------------------------------------------

def figure_svg(fig: Figure) -> str:
    """The figure as inline SVG text (then closed): the page must carry its charts, not link them."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)  # RDF boilerplate, no content
    return text[text.find("<svg"):]


def new_figure(w: float = 7.0, h: float = 3.2) -> tuple[Figure, Axes]:
    """A headless matplotlib figure whose SVG keeps its text as text (smaller, searchable)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, searchable
    return plt.subplots(figsize=(w, h))


def latency_cdf_svg(rnd: JsonObject) -> str:
    """CDF of word→token latency, one line per peer plus all peers pooled."""
    fig, ax = new_figure()
    pooled = []
    for p in rnd["peers"]:
        lat = sorted((w[2] - w[1]) * 1000 for w in p.get("words", []) if w[2] is not None)
        if lat:
            pooled.extend(lat)
            label = f"peer {p['index']}" + (f" ({p['offset_ms']:+.0f} ms)" if p.get("offset_ms") else "")
            ax.step(lat, np.arange(1, len(lat) + 1) / len(lat), where="post", lw=0.9, alpha=0.6, label=label)
    if pooled:
        pooled.sort()
        ax.step(pooled, np.arange(1, len(pooled) + 1) / len(pooled), where="post", lw=2.2, color="k", label="all")
    ax.axvline(1000, color="r", ls="--", lw=1, label="bound (p95 ≤ 1 s)")
    ax.axhline(0.95, color="grey", ls=":", lw=1)
    ax.set_xlabel("word end → first token arrival (ms)")
    ax.set_ylabel("fraction of words")
    ax.set_ylim(0, 1.02)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2, loc="lower right")
    ax.grid(alpha=0.3)
    return figure_svg(fig)


def timelines_svg(rnd: JsonObject) -> str:
    """Per peer over its own clock: token latency, Level-3 max delta, returned video frames per second."""
    peers = [p for p in rnd["peers"] if p.get("connected")]
    if not peers:
        return "<p>no peer connected</p>"
    fig, axes = new_figure(7.0, 6.0)
    fig.clf()
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True)
    for p in peers:
        label = f"peer {p['index']}"
        pts = [(w[1], (w[2] - w[1]) * 1000) for w in p.get("words", []) if w[2] is not None]
        if pts:
            ax1.plot(*zip(*pts, strict=True), ".", ms=3, label=label)
        sync = [(t, d) for t, d, _ in p.get("sync_timeline", []) if t is not None and d is not None]
        if sync:
            ax2.plot(*zip(*sync, strict=True), ".", ms=3, label=label)
        fps = p.get("frames_per_s") or []
        if fps:
            ax3.plot(np.arange(len(fps)) + 0.5, fps, lw=0.9, label=label)
    ax1.axhline(1000, color="r", ls="--", lw=1)
    ax1.set_ylabel("word→token ms")
    ax2.axhline(50, color="r", ls="--", lw=1)
    ax2.set_ylabel("Level-3 max Δ ms")
    ax3.set_ylabel("frames back /s")
    ax3.set_xlabel("peer clock (s since its first media)")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
    if ax1.get_legend_handles_labels()[0]:
        ax1.legend(fontsize=7, ncol=4, loc="upper left")
    return figure_svg(fig)


def cpu_svg(rnd: JsonObject) -> str:
    """CPU % over the round: server process tree, load-test workers, whole machine (100 % = one core)."""
    cpu = rnd.get("cpu") or []
    if not cpu:
        return "<p>no CPU samples</p>"
    fig, ax = new_figure(7.0, 2.6)
    t = [s[0] for s in cpu]
    if any(s[1] is not None for s in cpu):
        ax.plot(t, [s[1] if s[1] is not None else np.nan for s in cpu], label="server (process tree)")
    ax.plot(t, [s[2] for s in cpu], label="load-test workers")
    ncpu = max(1, int(rnd.get("ncpu", 2)))
    ax.plot(t, [s[3] * ncpu for s in cpu], label="whole machine", color="grey", lw=0.8)
    ax.set_ylabel("CPU % (100 = one core)")
    ax.set_xlabel("s since round start")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return figure_svg(fig)


def ramp_svg(report: JsonObject) -> str:
    rounds = report.get("rounds", [])
    if len(rounds) < 2:
        return ""
    fig, ax = new_figure(7.0, 2.6)
    n = [r["n_peers"] for r in rounds]
    ax.plot(n, [r["aggregate"]["latency_ms_p95"] or np.nan for r in rounds], "o-", label="p95 word→token ms")
    ax.axhline(1000, color="r", ls="--", lw=1)
    ax2 = ax.twinx()
    ax2.plot(n, [(r["aggregate"]["level3_pass_rate"] or 0) * 100 for r in rounds], "s-", color="g",
             label="Level-3 pass %")
    ax2.set_ylim(0, 101)
    ax.set_xlabel("peers")
    ax.set_ylabel("p95 ms")
    ax2.set_ylabel("Level-3 pass %")
    ax.grid(alpha=0.3)
    return figure_svg(fig)


# --- page ---------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:8px 0 16px;font-size:12px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}
td.l,th.l{text-align:left}.pass{color:#070;font-weight:bold}.fail{color:#b00;font-weight:bold}
code{background:#f6f6f6;padding:1px 4px}svg{max-width:100%;height:auto}
"""


def _cell(v: object) -> str:
    if v is None:
        return "<td>—</td>"
    if isinstance(v, bool):
        return f"<td class={'pass' if v else 'fail'}>{'yes' if v else 'no'}</td>"
    if isinstance(v, float):
        return f"<td>{v:.4g}</td>"
    return f"<td class=l>{html.escape(str(v))}</td>"


def _peer_table(rnd: JsonObject) -> str:
    cols = ["peer", "worker", "offset ms", "netem", "connected", "words", "recall", "p50 ms", "p95 ms",
            "final p95 ms", "turn latency p50 ms", "jitter σ8 max ms", "L3 checks", "L3 pass", "video−audio ms",
            "flagged", "evidence", "flash lag ms", "frames back", "fps back", "loss up/down", "answers",
            "voice→voice p50 ms", "voice→voice p95 ms", "barge-ins", "stop p50 ms", "stop p99 ms",
            "false interruptions", "lip-sync p50 ms", "|lip-sync| p95 ms", "answer packets", "error"]
    rows = []
    for p in rnd["peers"]:
        lat, l3, resp = p.get("latency") or {}, p.get("level3") or {}, p.get("responses") or {}
        ns = p.get("netem_stats")
        loss = f"{ns['up']['loss_rate']:.3f}/{ns['down']['loss_rate']:.3f}" if ns else None
        vals = [p["index"], p.get("worker"), p.get("offset_ms"), p.get("netem"), p.get("connected"),
                lat.get("words"), lat.get("recall"), lat.get("latency_ms_p50"), lat.get("latency_ms_p95"),
                lat.get("final_latency_ms_p95"), resp.get("turn_ms_p50"), resp.get("jitter_ms_max"),
                l3.get("checks"), l3.get("pass_rate"), l3.get("video_minus_audio_ms_p50"), l3.get("flagged"),
                ", ".join(f"{k}:{v}" for k, v in (l3.get("evidence") or {}).items()) or None,
                p.get("flash_lag_ms_p50"), p.get("frames_received"), p.get("video_fps"), loss,
                *_answer_cells(p.get("answer") or {}), p.get("error")]
        rows.append("<tr>" + "".join(_cell(v) for v in vals) + "</tr>")
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _answer_cells(a: JsonObject) -> list[object]:
    return [a.get("answers", a.get("starts")), a.get("voice_to_voice_ms_p50"), a.get("voice_to_voice_ms_p95"),
            a.get("barge_ins"), a.get("stop_ms_p50"), a.get("stop_ms_p99"), a.get("false_interruptions"),
            a.get("lip_sync_ms_p50"), a.get("lip_sync_abs_ms_p95"), a.get("audio_packets")]


def _aggregate_table(rnd: JsonObject) -> str:
    a = rnd["aggregate"]
    rows = "".join(f"<tr><th class=l>{html.escape(k)}</th>{_cell(v)}</tr>" for k, v in a.items()
                   if k not in ("bounds", "latency_by_window", "answer"))
    rows += "".join(f"<tr><th class=l>answer: {html.escape(k)}</th>{_cell(v)}</tr>"
                    for k, v in (a.get("answer") or {}).items())
    windows = a.get("latency_by_window") or []
    if windows:
        cells = ", ".join(f"{w[0]:.0f} s: {w[2]}/{w[3]} ms (n={w[1]})" for w in windows)
        rows += f"<tr><th class=l>p50/p95 word→token by 3 s window</th><td class=l>{html.escape(cells)}</td></tr>"
    checks = "".join(f"<tr><th class=l>{html.escape(k)}</th>{_cell(v)}</tr>"
                     for k, v in a["bounds"]["checks"].items())
    return f"<table>{rows}{checks}</table>"


def render_html(report: JsonObject) -> str:
    """The whole page as one string."""
    res = report.get("result", {})
    parts = [
        "<!doctype html><html><head><meta charset=utf-8><title>synchrony load test</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>synchrony load test</h1>",
        f"<p><code>{html.escape(str(report.get('command', '')))}</code></p>",
        f"<p>result: <span class={'pass' if res.get('ok') else 'fail'}>{'PASS' if res.get('ok') else 'FAIL'}"
        f"</span> <code>{html.escape(json.dumps(res, default=_json_default))}</code></p>",
        f"<p>machine: <code>{html.escape(json.dumps(report.get('machine', {})))}</code> — "
        f"server: <code>{html.escape(str(report.get('url')))}</code></p>",
    ]
    ramp = ramp_svg(report)
    if ramp:
        parts += ["<h2>Ramp</h2>", ramp]
    for i, rnd in enumerate(report.get("rounds", [])):
        rnd = {**rnd, "ncpu": (report.get("machine") or {}).get("cpus", 2)}
        parts += [
            f"<h2>Round {i + 1}: {rnd.get('n_peers', len(rnd['peers']))} peers, "
            f"netem {html.escape(str(rnd.get('netem', 'clean')))}</h2>",
            f"<p>machine load average (1 min) before/after: {rnd.get('load_avg_before', ['?'])[0]} / "
            f"{rnd.get('load_avg_after', ['?'])[0]}; round wall time {rnd.get('wall_s')} s</p>",
            _aggregate_table(rnd),
            "<h3>Peers</h3>", _peer_table(rnd),
            "<h3>Word → token latency (CDF)</h3>", latency_cdf_svg(rnd),
            "<h3>Per-peer timelines</h3>", timelines_svg(rnd),
            "<h3>CPU</h3>", cpu_svg(rnd),
        ]
        metrics = {k: v for k, v in (rnd.get("server_metrics") or {}).items()
                   if any(w in k for w in ("drops", "errors", "rejected", "sync_checks", "sessions_ended"))}
        if metrics:
            parts += ["<h3>Server counters after the round</h3>", "<table>" + "".join(
                f"<tr><th class=l>{html.escape(k)}</th>{_cell(v)}</tr>" for k, v in sorted(metrics.items()))
                + "</table>"]
        if rnd.get("errors"):
            parts.append("<p class=fail>" + "<br>".join(html.escape(e) for e in rnd["errors"]) + "</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
