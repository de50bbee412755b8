"""`synchrony analyze`: the whole pipeline on a recorded file, processed as if live on one session clock.

Stages (each timed in the report): decode → face AUs per video frame (MediaPipe) and Whisper word
tokens (timing-refined) in parallel → load controller over the AU stream → tokens attached to
16 fps output frames (±40 ms) → A/V offset from independent evidence (sync markers, lip motion) →
Level-3 per token → report.json and annotated.mp4.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from alignment.frames import FPS, attach_tokens, frame_count, frame_pts, tokens_by_frame
from alignment.types import AU_NAMES, AUSample, LoadEstimate, SyncCheck, VideoFrame, WordToken
from app.offline.media_io import DecodedMedia, decode_media, write_annotated
from app.offline.progress import Progress
from app.offline.replay import replay_lst

if TYPE_CHECKING:
    from models.video import FrameRenderer

T = TypeVar("T")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_PARTIAL = 3


@dataclass(frozen=True)
class AnalyzeOptions:
    """What to run and where to write it."""

    out_dir: Path = Path("out")
    whisper_path: str | None = None
    write_video: bool = True
    progress: bool | None = None  # None: only on a terminal
    record_au_csv: bool = False
    video_backend: str = "overlay"  # or "svd" (needs --svd-model; slow without a GPU)
    svd_model: str | None = None
    svd_options: dict[str, Any] = field(default_factory=dict)  # SVDRenderer keywords (gen_size, steps, ...)


@dataclass
class StageClock:
    """Wall time per stage, in seconds."""

    seconds: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, fn: Callable[[], T]) -> T:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


@dataclass(frozen=True)
class FaceTrack:
    """Per-frame AUs and mouth openness of the input video."""

    samples: tuple[AUSample, ...]
    mouth_open: tuple[float, ...]


def extract_faces(frames: tuple[VideoFrame, ...], progress: Progress | None = None) -> FaceTrack:
    """AUs and mouth openness for every input frame (image mode: lips are sync evidence, no smoothing lag)."""
    from models.faces import FaceAUExtractor

    samples: list[AUSample] = []
    mouth: list[float] = []
    with FaceAUExtractor(running_mode="image") as extractor:  # image mode: no tracking lag in lips
        for frame in frames:
            obs = extractor.extract_full(frame)
            samples.append(obs.au)
            mouth.append(obs.mouth_open)
            if progress:
                progress.advance()
    return FaceTrack(tuple(samples), tuple(mouth))


def _load_warm_whisper(path: str | None) -> Any:
    """The Whisper model with openai-whisper's numba DTW compiled (5-15 s on its first use), so the
    `asr` stage time, and the replayed TTFT built on it, measure steady-state compute."""
    import torch
    from whisper.timing import dtw

    from models.whisper_loader import load_whisper

    model = load_whisper(path)
    dtw(torch.zeros(4, 4))
    return model


def run_controller(samples: tuple[AUSample, ...]) -> list[LoadEstimate]:
    """The load controller over the AU stream, as it would have run live."""
    from models.controller import LoadController

    controller = LoadController()
    estimates = []
    for sample in samples:
        est = controller.step(sample)
        if est is not None:
            estimates.append(est)
    return estimates


def estimate_av_offset(media: DecodedMedia, faces: FaceTrack | None) -> tuple[float | None, str, float]:
    """Offset of the visual content relative to the audio, from markers first, then lips."""
    from alignment.evidence import estimate_offset

    if not media.has_audio or not media.has_video:
        return None, "assigned", 0.0
    result = estimate_offset(
        audio=media.audio,
        audio_pts=media.audio_pts,
        frames=media.frames,
        mouth_open=[m if s.face else None for s, m in zip(faces.samples, faces.mouth_open, strict=True)]
        if faces else None,
    )
    if result.offset_s is None or result.source is None:
        return None, "assigned", 0.0
    return result.offset_s, result.source, result.confidence


def level3(
    tokens: list[WordToken], first_frame: dict[int, float | None], offset: float | None, evidence: str,
    audio: np.ndarray | None = None, audio_pts: float = 0.0,
) -> list[SyncCheck]:
    """Level-3 per token; with ``audio``, words that follow silence are also checked against their
    acoustic onset (evidence the aligner did not make)."""
    from alignment.onsets import onset_after_silence
    from alignment.sync import Level3Validator

    validator = Level3Validator()
    checks = []
    for i, tok in enumerate(tokens):
        onset = None
        if audio is not None:
            onset = onset_after_silence(audio, audio_pts, tok.start, tokens[i - 1].start if i else None)
        checks.append(validator.check(tok, first_frame[i], offset, evidence, onset))
    return checks


def _latest_frame_at(frames: tuple[VideoFrame, ...], pts: float, start: int) -> int:
    """Index of the last input frame with pts ≤ ``pts``, searching forward from ``start``."""
    i = start
    while i + 1 < len(frames) and frames[i + 1].pts <= pts + 1e-6:
        i += 1
    return i


def render_frames(
    media: DecodedMedia,
    n_frames: int,
    tokens: list[WordToken],
    faces: FaceTrack | None,
    loads: list[LoadEstimate],
    sync_by_token: dict[int, bool],
    renderer: FrameRenderer,
    progress: Progress | None = None,
) -> Iterator[np.ndarray]:
    """Output frames at 16 fps: the latest camera frame with captions, AU bars, load and sync badges."""
    from models.video import RenderRequest

    attached = attach_tokens(tokens, n_frames)
    by_frame = tokens_by_frame(attached)
    first_of = {id(item.token): item.frames[0] for item in attached if item.frames}
    src = 0
    load_i = -1
    try:
        for k in range(n_frames):
            pts = frame_pts(k)
            camera = au = None
            if media.frames:
                src = _latest_frame_at(media.frames, pts, src)
                if media.frames[src].pts <= pts + 1e-6:
                    camera = media.frames[src].image
                    au = faces.samples[src] if faces else None
            while load_i + 1 < len(loads) and loads[load_i + 1].pts <= pts:
                load_i += 1
            shown = [t for t in tokens if id(t) in first_of and first_of[id(t)] <= k]
            caption = tuple(_current_utterance(shown))
            sync_states = [sync_by_token[i] for i, t in enumerate(tokens) if id(t) in first_of
                           and first_of[id(t)] <= k and i in sync_by_token]
            request = RenderRequest(
                index=k,
                pts=pts,
                camera=camera,
                caption=caption,
                new_words=tuple(by_frame.get(k, ())),
                au=au,
                load=loads[load_i] if load_i >= 0 else None,
                sync_ok=sync_states[-1] if sync_states else None,
            )
            yield renderer.render(request)
            if progress:
                progress.advance()
    finally:
        renderer.close()


def make_renderer(options: AnalyzeOptions) -> FrameRenderer:
    """The output-frame source: the overlay, or SVD generating offline (never falls behind playout)."""
    from models.video import create_renderer

    if options.video_backend != "svd":
        return create_renderer("overlay")
    return create_renderer("svd", model=options.svd_model, realtime=False, **options.svd_options)


def _current_utterance(shown: list[WordToken]) -> list[WordToken]:
    if not shown:
        return []
    last = shown[-1].utterance
    return [t for t in shown if t.utterance == last][-12:]


def analyze(path: str | Path, options: AnalyzeOptions) -> tuple[dict[str, Any], int]:
    """Run the pipeline on ``path``; write report.json (and annotated.mp4); return (report, exit code).

    Raises app.offline.media_io.MediaError when the input is not usable media at all.
    """
    clock = StageClock()
    t_start = time.perf_counter()
    media = clock.run("decode", lambda: decode_media(path))
    renderer = make_renderer(options) if options.write_video else None  # fail fast on a bad --svd-model
    warnings: list[str] = []
    if not media.has_audio:
        warnings.append("no audio stream: no words, no Level-3 checks")
    if not media.has_video:
        warnings.append("no video stream: no AUs, no load estimates; output frames show captions only")

    duration = media.duration
    n_frames = frame_count(duration)
    face_progress = Progress("faces", len(media.frames), options.progress)

    def faces_stage() -> FaceTrack | None:
        return clock.run("faces", lambda: extract_faces(media.frames, face_progress)) if media.has_video else None

    def asr_stage() -> list[WordToken]:
        from models.asr import transcribe_words

        if not media.has_audio:
            return []
        model = clock.run("asr_load", lambda: _load_warm_whisper(options.whisper_path))
        return clock.run("asr", lambda: transcribe_words(media.audio, t0=media.audio_pts, model=model))

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="analyze") as pool:
        faces_future = pool.submit(faces_stage)
        tokens = pool.submit(asr_stage).result()
        faces = faces_future.result()
    face_progress.close()

    if faces is not None and not any(s.face for s in faces.samples):
        warnings.append("no face in view: AUs are zero and the controller holds level 0")
    loads = clock.run("controller", lambda: run_controller(faces.samples)) if faces else []
    if faces is not None and not loads and any(s.face for s in faces.samples):
        warnings.append("too short for a load estimate: the controller learns a neutral baseline first")
    attached = clock.run("align", lambda: attach_tokens(tokens, n_frames))
    first_frame = {i: item.first_frame_pts for i, item in enumerate(attached)}
    offset, evidence, confidence = clock.run("evidence", lambda: estimate_av_offset(media, faces))
    checks = clock.run("level3", lambda: level3(tokens, first_frame, offset, evidence,
                                                media.audio if media.has_audio else None, media.audio_pts))

    options.out_dir.mkdir(parents=True, exist_ok=True)
    renderer_report: dict[str, Any] = {"backend": "overlay"}
    if renderer is not None and n_frames:
        render_progress = Progress("render", n_frames, options.progress)
        sync_by_token = {i: c.ok for i, c in enumerate(checks)}
        if hasattr(renderer, "plan"):
            renderer.plan(tokens)  # SVD: each clip is conditioned on its own words' window
        frames = render_frames(media, n_frames, tokens, faces, loads, sync_by_token, renderer, render_progress)
        clock.run(
            "render+encode",
            lambda: write_annotated(options.out_dir / "annotated.mp4", frames, FPS,
                                    media.audio if media.has_audio else None, media.audio_pts),
        )
        render_progress.close()
        if hasattr(renderer, "report"):
            renderer_report = renderer.report().as_dict()
    elif renderer is not None:
        renderer.close()
    if options.record_au_csv and faces:
        from models.controller_training import AUSessionRecorder

        recorder = AUSessionRecorder(options.out_dir / "au_session.csv", session=media.path.stem)
        for sample in faces.samples:
            recorder.record(sample, None)
        recorder.close()

    wall = time.perf_counter() - t_start
    report = build_report(media, tokens, attached, faces, loads, checks, offset, evidence, confidence,
                          clock, wall, n_frames, warnings)
    report["renderer"] = renderer_report
    report["lst"] = replay_lst(tokens, loads, clock.seconds.get("asr", 0.0))
    (options.out_dir / "report.json").write_text(json.dumps(report, indent=1))
    partial = not (media.has_audio and media.has_video)
    return report, EXIT_PARTIAL if partial else EXIT_OK


def build_report(
    media: DecodedMedia,
    tokens: list[WordToken],
    attached: list,
    faces: FaceTrack | None,
    loads: list[LoadEstimate],
    checks: list[SyncCheck],
    offset: float | None,
    evidence: str,
    confidence: float,
    clock: StageClock,
    wall: float,
    n_frames: int,
    warnings: list[str],
) -> dict[str, Any]:
    """Everything the run found, JSON-ready; times in seconds on the session clock."""
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
            for item in attached
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
            "evidence": evidence,
            "confidence": round(confidence, 3),
            "checked": len(checks),
            "passed": passed,
            "pass_rate": round(passed / len(checks), 4) if checks else None,
            "checks": [{"token": c.token, "audio": round(c.audio, 3), "video": round(c.video, 3),
                        "text": round(c.text, 3), "max_delta_ms": round(c.max_delta_ms, 1), "ok": c.ok,
                        "evidence": c.evidence} for c in checks],
        },
        "timings_s": {k: round(v, 3) for k, v in clock.seconds.items()} | {"wall": round(wall, 3)},
        "realtime_factor": round(media.duration / wall, 2) if wall > 0 else None,
    }


def summary(report: dict[str, Any]) -> str:
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
