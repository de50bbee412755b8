"""Rounding for reports and wire messages, where None means "not measured" and must stay None."""

from __future__ import annotations


def round_or_none(x: float | None, digits: int) -> float | None:
    """``round(x, digits)``, letting None (no figure) through."""
    return None if x is None else round(x, digits)


def to_ms(x: float | None) -> float | None:
    """Seconds as milliseconds to 0.1 ms (None stays None): how every latency in a report is written."""
    return None if x is None else round(x * 1000.0, 1)
