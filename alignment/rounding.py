"""Rounding for reports and wire messages, where None means "not measured" and must stay None."""

from __future__ import annotations


def round_or_none(x: float | None, ndigits: int = 3) -> float | None:
    """``x`` rounded to ``ndigits``; None stays None."""
    return None if x is None else round(x, ndigits)


def ms_or_none(seconds: float | None) -> float | None:
    """Seconds as milliseconds to 0.1 ms; None stays None."""
    return None if seconds is None else round(seconds * 1000.0, 1)
