"""Face action units from camera frames: MediaPipe FaceLandmarker blendshapes -> 12 FACS AUs.

MediaPipe >= 0.10.30 has no ``mp.solutions``; the Tasks API needs the ``face_landmarker.task``
bundle (face detector + 478 landmarks + 52 ARKit-style blendshapes) from ``assets/``. Each
blendshape activation maps onto the FACS action unit it animates (see docs/AU_MAPPING.md for the
table, sources and judgement calls). Besides the AUs, every observation carries a geometric mouth
openness from the inner-lip landmarks: the sync validator correlates it with the speech envelope as
evidence that does not come from the pipeline's own timestamps.

One ``FaceAUExtractor`` per session or thread (a MediaPipe graph is not meant to be shared); the
model file is read once per process and shared as bytes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from alignment.types import AU_NAMES, AUSample, VideoFrame

#: Where the bundled model lives; ``SYNCHRONY_FACE_MODEL`` overrides it.
DEFAULT_MODEL_PATH = Path(__file__).resolve().parents[1] / "assets" / "face_landmarker.task"
#: Frames larger than this (longest side, pixels) are downscaled before detection, for speed.
DEFAULT_MAX_SIDE = 640
_MIN_SIDE = 16  # smaller frames cannot hold a detectable face: reported as no face

RunningMode = Literal["image", "video"]


class FaceModelMissing(FileNotFoundError):
    """The face landmarker bundle is not where it was expected."""


# Blendshape sources of each AU; bilateral pairs are averaged. AU25 (lips part) is derived below.
AU_BLENDSHAPES: Mapping[str, tuple[str, ...]] = {
    "AU1": ("browInnerUp",),
    "AU2": ("browOuterUpLeft", "browOuterUpRight"),
    "AU4": ("browDownLeft", "browDownRight"),
    "AU6": ("cheekSquintLeft", "cheekSquintRight"),
    "AU7": ("eyeSquintLeft", "eyeSquintRight"),
    "AU9": ("noseSneerLeft", "noseSneerRight"),
    "AU12": ("mouthSmileLeft", "mouthSmileRight"),
    "AU15": ("mouthFrownLeft", "mouthFrownRight"),
    "AU17": ("mouthShrugLower",),
    "AU20": ("mouthStretchLeft", "mouthStretchRight"),
    "AU25": ("jawOpen", "mouthClose", "mouthLowerDownLeft", "mouthLowerDownRight",
             "mouthUpperUpLeft", "mouthUpperUpRight"),
    "AU26": ("jawOpen",),
}

# Inner-lip landmark pairs (upper, lower) of the 478-point mesh, centre and either side of it,
# and the outer eye corners used to normalise the gap by face size.
_INNER_LIP_PAIRS = ((13, 14), (82, 87), (312, 317))
_EYE_CORNERS = (33, 263)


def blendshapes_to_au(scores: Mapping[str, float]) -> tuple[float, ...]:
    """The 12 AU intensities in ``AU_NAMES`` order from named blendshape scores (missing = 0)."""

    def mean(*names: str) -> float:
        return float(sum(scores.get(n, 0.0) for n in names) / len(names))

    values = []
    for name in AU_NAMES:
        if name == "AU25":
            # Lips apart: the jaw opening that mouthClose does not cancel, or lips pulled apart
            # by the lower/upper lip depressors/raisers with the jaw still.
            lips = max(
                scores.get("jawOpen", 0.0) - scores.get("mouthClose", 0.0),
                mean("mouthLowerDownLeft", "mouthLowerDownRight"),
                mean("mouthUpperUpLeft", "mouthUpperUpRight"),
            )
            values.append(lips)
        else:
            values.append(mean(*AU_BLENDSHAPES[name]))
    return tuple(float(np.clip(v, 0.0, 1.0)) for v in values)


def mouth_openness(landmarks: np.ndarray, width: int, height: int) -> float:
    """Inner-lip gap over the outer-eye-corner distance, in [0, 1] (0 = lips together).

    Landmarks are normalised (x by width, y by height), so both distances are taken in pixels
    of the analysed image; the ratio is independent of face size and frame resolution.
    """
    scale = np.array([width, height], np.float32)
    pts = landmarks[:, :2] * scale
    gap = np.mean([np.linalg.norm(pts[a] - pts[b]) for a, b in _INNER_LIP_PAIRS])
    eyes = float(np.linalg.norm(pts[_EYE_CORNERS[0]] - pts[_EYE_CORNERS[1]]))
    if eyes <= 1e-6:
        return 0.0
    return float(np.clip(gap / eyes, 0.0, 1.0))


@dataclass(frozen=True)
class FaceObservation:
    """Everything the extractor saw in one frame: AUs, mouth openness and the raw face mesh."""

    au: AUSample
    mouth_open: float  # inner-lip gap / eye-corner distance, 0..1; 0 when no face
    landmarks: np.ndarray | None = field(default=None, repr=False, compare=False)  # (478, 3) normalised
    blendshapes: Mapping[str, float] = field(default_factory=dict, repr=False, compare=False)

    @property
    def pts(self) -> float:
        return self.au.pts

    @property
    def face(self) -> bool:
        return self.au.face


# --- model bytes, loaded once per process -------------------------------------------------------

_MODEL_LOCK = threading.Lock()
_MODEL_CACHE: dict[Path, bytes] = {}
_STDERR_LOCK = threading.Lock()


def resolve_model_path(model_path: str | os.PathLike[str] | None = None) -> Path:
    """Explicit path, else ``$SYNCHRONY_FACE_MODEL``, else the bundled ``assets/face_landmarker.task``."""
    chosen = model_path or os.environ.get("SYNCHRONY_FACE_MODEL") or DEFAULT_MODEL_PATH
    return Path(chosen).expanduser().resolve()


def load_model_bytes(model_path: str | os.PathLike[str] | None = None) -> bytes:
    """The .task bundle's bytes, read from disk once per process per path."""
    path = resolve_model_path(model_path)
    with _MODEL_LOCK:
        data = _MODEL_CACHE.get(path)
        if data is None:
            if not path.is_file():
                raise FaceModelMissing(
                    f"face landmarker model not found at {path} "
                    "(expected MediaPipe face_landmarker.task in assets/ or $SYNCHRONY_FACE_MODEL)"
                )
            data = path.read_bytes()
            _MODEL_CACHE[path] = data
    return data


@contextlib.contextmanager
def _quiet_stderr(enabled: bool = True) -> Iterator[None]:
    """Silence MediaPipe's C++ logging (glog/absl/TFLite write to fd 2 while a graph starts)."""
    if not enabled:
        yield
        return
    with _STDERR_LOCK:
        try:
            saved = os.dup(2)
        except OSError:
            yield
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)


# Live extractors, closed at interpreter exit before MediaPipe's own __del__ would run half torn down.
_LIVE: weakref.WeakSet[FaceAUExtractor] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for extractor in list(_LIVE):
        extractor.close()


def _to_rgb(image: np.ndarray) -> np.ndarray:
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        raise ValueError(f"frame image must be uint8 RGB, got dtype {arr.dtype}")
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    elif arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise ValueError(f"frame image must be (h, w, 3) RGB, got shape {arr.shape}")
    return np.ascontiguousarray(arr[:, :, :3])


def _downscale(rgb: np.ndarray, max_side: int) -> np.ndarray:
    h, w = rgb.shape[:2]
    longest = max(h, w)
    if longest <= max_side:
        return rgb
    import cv2  # ships with mediapipe (opencv-contrib-python)

    scale = max_side / longest
    size = (max(int(round(w * scale)), 1), max(int(round(h * scale)), 1))
    return np.ascontiguousarray(cv2.resize(rgb, size, interpolation=cv2.INTER_AREA))


class FaceAUExtractor:
    """Camera frames -> ``AUSample`` / ``FaceObservation`` with one MediaPipe FaceLandmarker.

    ``running_mode="video"`` tracks the face between frames (frames must come in pts order, as they
    do in a session); ``"image"`` treats every frame on its own. Video mode smooths landmarks over
    time, which delays ``mouth_open`` by about a quarter frame (~9 ms at 25 fps, bench/faces.py):
    prefer image mode where lip motion is used as sync evidence. Calls are serialised by a lock,
    but for throughput give each session or thread its own extractor.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        running_mode: RunningMode = "image",
        max_side: int = DEFAULT_MAX_SIDE,
        min_confidence: float = 0.5,
        quiet: bool = True,
    ) -> None:
        self._lock = threading.Lock()
        self._closed = True  # until the landmarker exists: a half-built extractor has nothing to close
        if running_mode not in ("image", "video"):
            raise ValueError(f"running_mode must be 'image' or 'video', got {running_mode!r}")
        if max_side < 64:
            raise ValueError(f"max_side must be at least 64 pixels, got {max_side}")
        data = load_model_bytes(model_path)
        from mediapipe.tasks.python import vision
        from mediapipe.tasks.python.core.base_options import BaseOptions

        mode = vision.RunningMode.VIDEO if running_mode == "video" else vision.RunningMode.IMAGE
        options = vision.FaceLandmarkerOptions(
            base_options=BaseOptions(model_asset_buffer=data),
            running_mode=mode,
            num_faces=1,
            min_face_detection_confidence=min_confidence,
            min_face_presence_confidence=min_confidence,
            min_tracking_confidence=min_confidence,
            output_face_blendshapes=True,
        )
        with _quiet_stderr(quiet):
            try:
                self._landmarker = vision.FaceLandmarker.create_from_options(options)
            except (RuntimeError, ValueError) as exc:
                raise RuntimeError(f"could not load the face landmarker model: {exc}") from exc
        self.running_mode: RunningMode = running_mode
        self.max_side = int(max_side)
        self._last_ts_ms = -1
        self._closed = False
        _LIVE.add(self)

    # --- public API ---------------------------------------------------------------------------

    def extract(self, frame: VideoFrame) -> AUSample:
        """The 12 AU intensities for one frame (``face=False`` and zeros when no face is found)."""
        return self.extract_full(frame).au

    def extract_full(self, frame: VideoFrame) -> FaceObservation:
        """AUs, mouth openness, landmarks and blendshapes for one frame."""
        if self._closed:
            raise RuntimeError("FaceAUExtractor is closed")
        rgb = _to_rgb(frame.image)
        if min(rgb.shape[:2]) < _MIN_SIDE:
            return _no_face(frame.pts)
        rgb = _downscale(rgb, self.max_side)
        import mediapipe as mp

        image = mp.Image(image_format=mp.ImageFormat.SRGB, data=rgb)
        with self._lock:
            if self._closed:
                raise RuntimeError("FaceAUExtractor is closed")
            if self.running_mode == "video":
                ts = max(int(round(frame.pts * 1000.0)), self._last_ts_ms + 1)
                self._last_ts_ms = ts
                result = self._landmarker.detect_for_video(image, ts)
            else:
                result = self._landmarker.detect(image)
        if not result.face_landmarks:
            return _no_face(frame.pts)
        landmarks = np.array([(p.x, p.y, p.z) for p in result.face_landmarks[0]], np.float32)
        scores = (
            {c.category_name: float(c.score) for c in result.face_blendshapes[0]}
            if result.face_blendshapes
            else {}
        )
        au = AUSample(frame.pts, blendshapes_to_au(scores), True)
        mouth = mouth_openness(landmarks, rgb.shape[1], rgb.shape[0])
        return FaceObservation(au, mouth, landmarks, scores)

    def close(self) -> None:
        """Release the MediaPipe graph (idempotent; also done at interpreter exit)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(Exception):
                self._landmarker.close()

    def __enter__(self) -> FaceAUExtractor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _no_face(pts: float) -> FaceObservation:
    return FaceObservation(AUSample(pts, (0.0,) * len(AU_NAMES), False), 0.0)
