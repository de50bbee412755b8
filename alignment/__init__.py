"""Timing core of synchrony: one session clock, token/frame alignment, Level-3 sync, LST metrics."""
