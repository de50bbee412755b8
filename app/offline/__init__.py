"""Offline analysis: a recording in, an annotated video and a report out."""
