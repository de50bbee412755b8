"""Shared fixtures: real models and generated media, built once per test session."""

from __future__ import annotations

import pytest

from app.loadtest import testmedia


@pytest.fixture(scope="session")
def whisper_model():
    from models.whisper_loader import load_whisper

    return load_whisper()


@pytest.fixture(scope="session")
def speech():
    """A sentence of espeak-ng speech with exact word onsets, 0.5 s of silence before it."""
    return testmedia.synthesize_speech("please send the report to my office before noon", lead_in_s=0.5)


@pytest.fixture(scope="session")
def av_clip():
    """A talking-face clip with speech, sync markers, and no A/V offset."""
    return testmedia.make_av_clip(text="please call me back when you have a moment", tail_s=1.2, markers=(0.25, 3.6))


@pytest.fixture(scope="session")
def av_file(tmp_path_factory, av_clip):
    return testmedia.write_av_file(tmp_path_factory.mktemp("media") / "clip.mp4", av_clip)
