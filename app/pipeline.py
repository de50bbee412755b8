"""The pipeline's stages, built in one place for both rooms.

The live server's warm-up (``app.live.warmup``) and offline analysis (``app.offline.analyze``) get
every model here, so the two run the same weights with the same settings and cannot drift apart.
Model modules are imported inside each function: a stage whose dependency is missing fails alone,
when it is built, and the rest of the pipeline still loads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    from whisper.model import Whisper

    from models.asr import ASRWorker
    from models.controller import LoadController
    from models.faces import FaceAUExtractor, RunningMode
    from models.responders import Responder
    from models.video import FrameRenderer


# --- faces and the load controller ----------------------------------------------------------------

def face_extractor(running_mode: RunningMode = "image") -> FaceAUExtractor:
    """MediaPipe's face landmarker with blendshapes → AUs: ``image`` mode for single frames and
    offline lips (no tracking lag), ``video`` for a live session's frames in pts order."""
    from models.faces import FaceAUExtractor

    return FaceAUExtractor(running_mode=running_mode)


def live_face_extractors() -> Callable[[], FaceAUExtractor]:
    """One tracker per live session: frames come in pts order, so ``video`` mode tracks between them."""
    return partial(face_extractor, "video")


def load_controller() -> LoadController:
    """The LSTM load controller with its shipped weights."""
    from models.controller import LoadController

    return LoadController()


# --- speech -------------------------------------------------------------------------------------

def asr_worker(whisper_path: str | None, lanes: int, processes: bool = False,
               started_lanes: Sequence[tuple[Connection, BaseProcess]] = ()) -> ASRWorker:
    """One shared streaming-ASR worker with ``lanes`` decode threads (a model copy each; ``processes``:
    each decoding in a child process of its own, see ``models.asr.worker``, the first ones
    ``started_lanes`` if given)."""
    from models.asr import ASRWorker

    if processes:
        return ASRWorker(lanes=lanes, processes=True, whisper_path=whisper_path, started_lanes=started_lanes)
    model = None
    if whisper_path:
        from models.whisper_loader import load_whisper

        model = load_whisper(whisper_path)
    return ASRWorker(model=model, lanes=lanes)


def warm_asr_stream(worker: ASRWorker, speech: np.ndarray) -> None:
    """Run the streaming path once on ``speech`` (VAD, incremental decode, finalisation) in every
    decode lane, so no session pays for its first use."""
    worker.warm_streams(speech)


def offline_whisper(path: str | None) -> Whisper:
    """The Whisper model with openai-whisper's numba DTW compiled (seconds on its first use), so
    the timed ``asr`` stage, and the replayed TTFT built on it, measure steady-state compute."""
    import torch
    from whisper.timing import dtw

    from models.whisper_loader import load_whisper

    model = load_whisper(path)
    dtw(torch.zeros(4, 4))
    return model


# --- output frames and the response -----------------------------------------------------------

def renderer(backend: str, svd_model: str | None = None, *, realtime: bool = True,
             **svd_options: object) -> FrameRenderer:
    """The output-frame source by name. ``svd`` gets its weights and whether it may fall behind
    playout (live: never waits for a clip; offline: waits for each one)."""
    from models.video import create_renderer

    if backend != "svd":
        return create_renderer(backend)
    options: dict[str, object] = {"model": svd_model} if svd_model else {}
    if not realtime:
        options["realtime"] = False
    return create_renderer("svd", **options, **svd_options)


def responders(name: str, llm_url: str | None) -> Callable[[], Responder]:
    """A factory of one responder per session (``caption``, or ``openai`` against ``llm_url``)."""
    from models.responders import make_responder

    options: dict[str, object] = {"base_url": llm_url} if llm_url else {}
    return partial(make_responder, name, **options)
