"""The stages of an offline run, each over the whole recording: face AUs, the load controller, the A/V
offset, Level-3 per word, and the output frames. ``app.offline.analyze`` runs them in order and
times each; the models come from ``app.pipeline``, as the live server's do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from alignment.frames import TokenFrames, attach_tokens, frame_pts, tokens_by_frame
from alignment.types import AUSample, LoadEstimate, SyncCheck, VideoFrame, WordToken
from app import pipeline
from app.offline.media_io import DecodedMedia
from app.offline.progress import Progress

if TYPE_CHECKING:
    from models.video import FrameRenderer


@dataclass(frozen=True)
class FaceTrack:
    """Per-frame AUs and mouth openness of the input video."""

    samples: tuple[AUSample, ...]
    mouth_open: tuple[float, ...]


@dataclass(frozen=True)
class Heard:
    """What the recording says (timed words) and shows (AUs per frame; None without video)."""

    tokens: list[WordToken]
    faces: FaceTrack | None


@dataclass(frozen=True)
class Synced:
    """The words on the output frames and their Level-3 checks, with what the checks rest on."""

    loads: list[LoadEstimate]
    attached: list[TokenFrames]
    offset: float | None  # visual content relative to the audio, s (None: no evidence)
    evidence: str
    confidence: float
    checks: list[SyncCheck]


def extract_faces(frames: tuple[VideoFrame, ...], progress: Progress | None = None) -> FaceTrack:
    """AUs and mouth openness for every input frame (image mode: lips are sync evidence, no smoothing lag)."""
    samples: list[AUSample] = []
    mouth: list[float] = []
    with pipeline.face_extractor("image") as extractor:  # image mode: no tracking lag in lips
        for frame in frames:
            obs = extractor.extract_full(frame)
            samples.append(obs.au)
            mouth.append(obs.mouth_open)
            if progress:
                progress.advance()
    return FaceTrack(tuple(samples), tuple(mouth))


def run_controller(samples: tuple[AUSample, ...]) -> list[LoadEstimate]:
    """The load controller over the AU stream, as it would have run live."""
    controller = pipeline.load_controller()
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


def _current_utterance(shown: list[WordToken]) -> list[WordToken]:
    if not shown:
        return []
    last = shown[-1].utterance
    return [t for t in shown if t.utterance == last][-12:]
