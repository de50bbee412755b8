"""Warmed live stages shared by the server and browser tests (loaded once per test run)."""

from __future__ import annotations

import pytest

_CACHE: dict[str, object] = {}


@pytest.fixture(scope="session")
def live_stages(whisper_model):
    """Every stage warmed once for the whole test run (ASR on the shared Whisper model)."""
    if "stages" not in _CACHE:
        from app.live.server import ServerConfig
        from app.live.warmup import WarmState, warm_up
        from models.asr import ASRWorker

        state = WarmState()
        warm_up(ServerConfig.in_process(ui=False, stages=("faces", "controller", "render", "sync", "response", "lst")),
                state)
        worker = ASRWorker(model=whisper_model)
        worker.warmup()
        state.stages.asr_worker = worker
        _CACHE["stages"] = state.stages
    yield _CACHE["stages"]
    _CACHE["stages"].asr_worker.stop()  # idempotent; no inference left running at interpreter exit


async def whip_offer() -> str:
    """A real aiortc offer as a WHIP client sends it: sendrecv audio and video, DataChannel `events`."""
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    pc.createDataChannel("events")
    pc.addTransceiver("audio", direction="sendrecv")
    pc.addTransceiver("video", direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp
