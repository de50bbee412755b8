"""The answer's speaking rate from the load policy: a loaded listener hears slower speech.

The controller's policy already slows the text stream as cognitive load rises (tokens/s 12, 8,
5, 3 at levels 0-3); the voice follows the same signal. The map is log-linear in tokens/s (each
halving of the token rate takes the same number of words per minute off), clamped to
``[SLOWEST_WPM, FASTEST_WPM]`` = 125-175 wpm: 175 is a brisk conversational rate, 125 still
sounds natural rather than drawn out. Level 0 → 175, 1 → 160, 2 → 143, 3 → 125 (docs/SPEECH.md).
"""

from __future__ import annotations

import math

from alignment.types import TokenRatePolicy

FASTEST_WPM = 175.0
SLOWEST_WPM = 125.0
#: The token rates that span the range: the controller's level 0 and level 3 (models.controller.POLICIES).
FAST_TOKENS_PER_S = 12.0
SLOW_TOKENS_PER_S = 3.0


def speaking_rate_wpm(policy: TokenRatePolicy) -> float:
    """Words per minute for the answer's voice under ``policy``; monotone in ``tokens_per_s``."""
    tps = float(policy.tokens_per_s)
    if not math.isfinite(tps) or tps <= 0:
        raise ValueError(f"a token rate must be a positive number, got {policy.tokens_per_s!r}")
    x = math.log(tps / SLOW_TOKENS_PER_S) / math.log(FAST_TOKENS_PER_S / SLOW_TOKENS_PER_S)
    return SLOWEST_WPM + (FASTEST_WPM - SLOWEST_WPM) * min(max(x, 0.0), 1.0)
