"""`synchrony analyze`: the whole pipeline on a recorded file, processed as if live on one session clock.

Stages (each timed in the report): decode → face AUs per video frame (MediaPipe) and Whisper word
tokens (timing-refined) in parallel → load controller over the AU stream → tokens attached to
16 fps output frames (±40 ms) → A/V offset from independent evidence (sync markers, lip motion) →
Level-3 per token → report.json and annotated.mp4.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from alignment.frames import FPS, attach_tokens, frame_count
from alignment.json_types import JsonObject
from alignment.types import WordToken
from app import pipeline
from app.exit_codes import EXIT_BAD_INPUT, EXIT_ERROR, EXIT_OK, EXIT_PARTIAL
from app.offline.media_io import DecodedMedia, decode_media, write_annotated
from app.offline.progress import Progress
from app.offline.replay import replay_lst
from app.offline.report import build_report
from app.offline.stages import (
    FaceTrack,
    Heard,
    Synced,
    estimate_av_offset,
    extract_faces,
    level3,
    render_frames,
    run_controller,
)

if TYPE_CHECKING:
    from models.video import FrameRenderer

__all__ = ["EXIT_BAD_INPUT", "EXIT_ERROR", "EXIT_OK", "EXIT_PARTIAL", "AnalyzeOptions", "analyze"]

T = TypeVar("T")


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
    svd_options: dict[str, object] = field(default_factory=dict)  # SVDRenderer keywords (gen_size, steps, ...)


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


def make_renderer(options: AnalyzeOptions) -> FrameRenderer:
    """The output-frame source: the overlay, or SVD generating offline (never falls behind playout)."""
    backend = "svd" if options.video_backend == "svd" else "overlay"
    return pipeline.renderer(backend, options.svd_model, realtime=False, **options.svd_options)


def analyze(path: str | Path, options: AnalyzeOptions) -> tuple[JsonObject, int]:
    """Run the pipeline on ``path``; write report.json (and annotated.mp4); return (report, exit code).

    Raises app.offline.media_io.MediaError when the input is not usable media at all.
    """
    clock = StageClock()
    t_start = time.perf_counter()
    media = clock.run("decode", lambda: decode_media(path))
    renderer = make_renderer(options) if options.write_video else None  # fail fast on a bad --svd-model
    warnings = _stream_warnings(media)
    n_frames = frame_count(media.duration)
    heard = _hear(media, options, clock)
    synced = _sync(media, heard, n_frames, clock, warnings)

    options.out_dir.mkdir(parents=True, exist_ok=True)
    renderer_report: JsonObject = {"backend": "overlay"}
    if renderer is not None and n_frames:
        renderer_report = _write_video(media, heard, synced, n_frames, renderer, options, clock)
    elif renderer is not None:
        renderer.close()
    if options.record_au_csv and heard.faces:
        _record_aus(heard.faces, media, options.out_dir)

    wall = time.perf_counter() - t_start
    report = build_report(media, heard, synced, clock.seconds, wall, n_frames, warnings)
    report["renderer"] = renderer_report
    report["lst"] = replay_lst(heard.tokens, synced.loads, clock.seconds.get("asr", 0.0))
    (options.out_dir / "report.json").write_text(json.dumps(report, indent=1))
    partial = not (media.has_audio and media.has_video)
    return report, EXIT_PARTIAL if partial else EXIT_OK


def _stream_warnings(media: DecodedMedia) -> list[str]:
    warnings: list[str] = []
    if not media.has_audio:
        warnings.append("no audio stream: no words, no Level-3 checks")
    if not media.has_video:
        warnings.append("no video stream: no AUs, no load estimates; output frames show captions only")
    return warnings


def _hear(media: DecodedMedia, options: AnalyzeOptions, clock: StageClock) -> Heard:
    """Face AUs and Whisper's words, side by side (two threads: the models release the GIL)."""
    face_progress = Progress("faces", len(media.frames), options.progress)

    def faces_stage() -> FaceTrack | None:
        return clock.run("faces", lambda: extract_faces(media.frames, face_progress)) if media.has_video else None

    def asr_stage() -> list[WordToken]:
        from models.asr import transcribe_words

        if not media.has_audio:
            return []
        model = clock.run("asr_load", lambda: pipeline.offline_whisper(options.whisper_path))
        return clock.run("asr", lambda: transcribe_words(media.audio, t0=media.audio_pts, model=model))

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="analyze") as pool:
        faces_future = pool.submit(faces_stage)
        tokens = pool.submit(asr_stage).result()
        faces = faces_future.result()
    face_progress.close()
    return Heard(tokens, faces)


def _sync(media: DecodedMedia, heard: Heard, n_frames: int, clock: StageClock, warnings: list[str]) -> Synced:
    """The load controller over the AUs, the words on their frames, the A/V offset and Level-3."""
    tokens, faces = heard.tokens, heard.faces
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
    return Synced(loads, attached, offset, evidence, confidence, checks)


def _write_video(media: DecodedMedia, heard: Heard, synced: Synced, n_frames: int, renderer: FrameRenderer,
                 options: AnalyzeOptions, clock: StageClock) -> JsonObject:
    """annotated.mp4 (the renderer's frames with the input audio); the renderer's own report."""
    from models.svd import SVDRenderer

    render_progress = Progress("render", n_frames, options.progress)
    sync_by_token = {i: c.ok for i, c in enumerate(synced.checks)}
    svd = renderer if isinstance(renderer, SVDRenderer) else None
    if svd is not None:
        svd.plan(heard.tokens)  # each clip is conditioned on its own words' window
    frames = render_frames(media, n_frames, heard.tokens, heard.faces, synced.loads, sync_by_token, renderer,
                           render_progress)
    clock.run(
        "render+encode",
        lambda: write_annotated(options.out_dir / "annotated.mp4", frames, FPS,
                                media.audio if media.has_audio else None, media.audio_pts),
    )
    render_progress.close()
    return svd.report().as_dict() if svd is not None else {"backend": "overlay"}


def _record_aus(faces: FaceTrack, media: DecodedMedia, out_dir: Path) -> None:
    """au_session.csv, in the format ``synchrony train-controller`` reads."""
    from models.controller_training import AUSessionRecorder

    recorder = AUSessionRecorder(out_dir / "au_session.csv", session=media.path.stem)
    for sample in faces.samples:
        recorder.record(sample, None)
    recorder.close()
