"""Decoded camera frames as RGB arrays, with one libswscale context per thread.

``av.VideoFrame.to_ndarray(format=...)`` keeps its converter on the frame, so every new camera
frame builds a libswscale context (most of the conversion's cost) and frees it again when the frame
is dropped, on the event loop. A converter kept per thread is built once and reused for every
frame of that size; it gives the same pixels. Per thread, not per frame, also means two threads
never share one: the face analysis and the render thread convert the same frame at once safely.
Each converts on its own thread (``threads=1``): libswscale's own slice threads cost more than they
save on frames this small, and a context that has them hangs any child forked from the server (a
fork clears the other threads' locals, and freeing their contexts waits for threads that are gone).
"""

from __future__ import annotations

import threading

import av
import numpy as np
from av.video.reformatter import VideoReformatter

_LOCAL = threading.local()


def _reformatter() -> VideoReformatter:
    r = getattr(_LOCAL, "reformatter", None)
    if r is None:
        r = _LOCAL.reformatter = VideoReformatter()
    return r


def rgb(frame: av.VideoFrame, size: tuple[int, int] | None = None) -> np.ndarray:
    """``frame`` as an (h, w, 3) uint8 RGB array, scaled to ``size`` (w, h) when given."""
    width, height = size if size is not None else (None, None)
    return _reformatter().reformat(frame, width=width, height=height, format="rgb24", threads=1).to_ndarray()
