"""The report of an offline run: everything it found as JSON (report.json), and a few lines for a person."""

from __future__ import annotations

from alignment.frames import FPS
from alignment.json_types import JsonObject
from alignment.types import AU_NAMES
from app.offline.media_io import DecodedMedia
from app.offline.stages import Heard, Synced


def build_report(
    media: DecodedMedia,
    heard: Heard,
    synced: Synced,
    timings: dict[str, float],
    wall: float,
    n_frames: int,
    warnings: list[str],
) -> JsonObject:
    """Everything the run found, JSON-ready; times in seconds on the session clock."""
    tokens, faces = heard.tokens, heard.faces
    loads, checks, offset = synced.loads, synced.checks, synced.offset
    passed = sum(c.ok for c in checks)
    return {
        "input": str(media.path),
        "duration_s": round(media.duration, 3),
        "partial": not (media.has_audio and media.has_video),
        "warnings": warnings,
        "streams": {"audio": media.has_audio, "video": media.has_video, "video_fps": round(media.video_fps, 3)},
        "output": {"fps": FPS, "frames": n_frames, "tolerance_ms": 40},
        "tokens": [
            {"text": item.token.text, "start": round(item.token.start, 3), "end": round(item.token.end, 3),
             "final": item.token.final, "utterance": item.token.utterance, "frames": list(item.frames)}
            for item in synced.attached
        ],
        "transcript": " ".join(t.text for t in tokens),
        "aus": {
            "names": list(AU_NAMES),
            "frames": [{"pts": round(s.pts, 3), "face": s.face, "au": [round(v, 4) for v in s.au]}
                       for s in (faces.samples if faces else ())],
        },
        "load": [{"pts": round(e.pts, 3), "level": e.level, "probs": [round(p, 3) for p in e.probs],
                  "policy": e.policy.as_dict()} for e in loads],
        "sync": {
            "av_offset_ms": None if offset is None else round(offset * 1000, 1),
            "evidence": synced.evidence,
            "confidence": round(synced.confidence, 3),
            "checked": len(checks),
            "passed": passed,
            "pass_rate": round(passed / len(checks), 4) if checks else None,
            "checks": [{"token": c.token, "audio": round(c.audio, 3), "video": round(c.video, 3),
                        "text": round(c.text, 3), "max_delta_ms": round(c.max_delta_ms, 1), "ok": c.ok,
                        "evidence": c.evidence} for c in checks],
        },
        "timings_s": {k: round(v, 3) for k, v in timings.items()} | {"wall": round(wall, 3)},
        "realtime_factor": round(media.duration / wall, 2) if wall > 0 else None,
    }


def summary(report: JsonObject) -> str:
    """A few human lines about a report."""
    sync = report["sync"]
    lines = [
        f"{report['input']}: {report['duration_s']:.1f} s analysed in {report['timings_s']['wall']:.1f} s "
        f"({report['realtime_factor']}x real time)",
        f"words: {len(report['tokens'])}  \"{report['transcript'][:100]}\"",
        f"output: {report['output']['frames']} frames at {report['output']['fps']} fps; "
        f"faces seen in {sum(f['face'] for f in report['aus']['frames'])}/{len(report['aus']['frames'])} frames",
    ]
    if sync["checked"]:
        off = "n/a" if sync["av_offset_ms"] is None else f"{sync['av_offset_ms']:+.0f} ms"
        lines.append(f"Level-3: {sync['passed']}/{sync['checked']} tokens in sync "
                     f"(A/V offset {off}, evidence: {sync['evidence']})")
    lst = report.get("lst")
    if lst and lst.get("responses"):
        lines.append(f"LST (replayed caption stream): TTFT p99 {lst['ttft_ms_p99']} ms, "
                     f"ITL max {lst['itl_ms_max']} ms, jitter {lst['jitter_ms']} ms, tier {lst['tier']}")
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)
