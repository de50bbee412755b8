"""Word-timing refinement (placeholder pass-through until the refinement lands in this module)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from alignment.types import WordToken


def refine_word_times(
    audio: np.ndarray, audio_start_pts: float, words: Sequence[WordToken], lookahead_s: float | None = None
) -> list[WordToken]:
    """Return ``words`` with refined start/end times (currently unchanged)."""
    return list(words)
