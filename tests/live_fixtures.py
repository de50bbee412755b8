"""Warmed live stages shared by the server and browser tests (loaded once per test run)."""

from __future__ import annotations

import pytest

_CACHE: dict[str, object] = {}


@pytest.fixture(scope="session")
def live_stages(whisper_model):
    """Every stage warmed once for the whole test run (ASR on the shared Whisper model)."""
    if "stages" not in _CACHE:
        from app.server import ServerConfig, WarmState, warm_up
        from models.asr import ASRWorker

        state = WarmState()
        warm_up(ServerConfig(ui=False, stages=("faces", "controller", "render", "sync", "response", "lst")),
                state)
        worker = ASRWorker(model=whisper_model)
        worker.warmup()
        state.stages.asr_worker = worker
        _CACHE["stages"] = state.stages
    yield _CACHE["stages"]
    _CACHE["stages"].asr_worker.stop()  # idempotent; no inference left running at interpreter exit
