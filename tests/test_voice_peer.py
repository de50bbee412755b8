"""The measuring peer (app.loadtest.peer.VoicePeer) against a real speaking server over loopback.

Real festival (the peer speaks kal_diphone, the answers slt_hts), real Whisper tiny, real aiortc: the
peer says a sentence, measures the answer it gets (voice-to-voice from its own end of speech, the avatar's
mouth from the received pixels on the sender-report clock), then speaks over the next answer and times
how long that answer's audio still arrived. The figures' sizes are not judged here (bench/voice.py does);
that each is measured, and measured from what was received, is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np
import pytest

from app.live.server import ServerConfig, create_app, running_server
from app.live.warmup import WarmState
from app.loadtest import festival
from tests.live_fixtures import live_stages  # noqa: F401 - shared session fixture

pytestmark = pytest.mark.skipif(not (festival.available("kal_diphone") and festival.available("slt_hts")),
                                reason="festival voices kal_diphone and slt_hts are not installed (make system)")


@pytest.fixture(scope="module")
def speaking_stages(live_stages):  # noqa: F811
    from app.live.warmup import _warm_voice
    from models.responders import AssistantResponder

    state = WarmState()
    _warm_voice(ServerConfig.in_process(ui=False, tts="festival"), state)
    return dataclasses.replace(live_stages, voice=state.stages.voice, make_responder=AssistantResponder)


async def _until(cond, timeout: float):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        await asyncio.sleep(0.02)
    return None


async def test_voice_peer_measures_voice_to_voice_lip_sync_and_barge_in(speaking_stages):
    from app.loadtest import answers as ans
    from app.loadtest.peer import VoicePeer
    from app.talking_face import talking_face_frames

    first = festival.synthesize_festival("what is the weather like today", "kal_diphone").samples
    second = festival.synthesize_festival("hold on please tell me about the moon instead", "kal_diphone").samples
    app = create_app(ServerConfig.in_process(ui=False, tts="festival"), stages=speaking_stages)
    async with running_server(app) as base:
        echo = ans.EchoPath(ans.RoomResponse.seeded(1))
        peer = VoicePeer(f"{base}/whip", talking_face_frames(np.zeros(8), (320, 180)), fps=16.0, echo=echo,
                         decode_camera=False)
        await peer.connect()
        try:
            hello = await peer.wait_for("hello", timeout=10)
            assert hello["version"] == 2 and hello["answer"]["audio"] and hello["answer"]["video"]
            await asyncio.sleep(1.0)
            utt = peer.say(first, "what is the weather like today")
            await peer.wait_for("response_end", timeout=60)
            await asyncio.sleep(0.5)
            # Speak over the second answer, 0.8 s after its audio starts arriving.
            again = peer.say(first, "what is the weather like today")
            t0 = peer.t0_wall
            loud = await _until(lambda: ans.first_loud(peer.answer.packets, t0 + again.end), 30)
            assert loud is not None, "no answer audio arrived"
            await asyncio.sleep(0.8)
            peer.say(second, "hold on", barge_in=True)
            await asyncio.sleep(6.0)
        finally:
            await peer.close()
    figs = peer.figures()
    print(figs)
    assert len(figs) >= 2, figs
    one = figs[0]
    assert one["reason"] == "done" and one["audible"] and one["utterance_index"] == 0, one
    assert one["voice_to_voice_ms"] is not None and 0 < one["voice_to_voice_ms"] < 5000
    assert not peer.answer.errors, peer.answer.errors
    assert peer.answer.avatar_frames > 16, "no avatar frames came back"
    assert peer.answer.box is not None and len(peer.answer.mouth) > 16  # the mouth was found in the pixels
    assert one["lip_sync_ms"] is not None and abs(one["lip_sync_ms"]) <= 300
    cut = next(f for f in figs if f["barge_in"])  # the answer the peer spoke over (its stop, timed)
    assert cut["utterance_index"] == 1 and not cut["false_interruption"], cut
    # Timed from what was received, whether the server cut the answer or not (whether it should have is
    # judged by tests/test_answer.py and bench/voice.py): a cut answer's audio stops within the 6 s
    # the peer listened on; one that ran to its end was heard for as long as it went on arriving.
    assert cut["stop_ms"] is not None and 0 < cut["stop_ms"] < 6500, cut
    if cut["reason"] == "barge_in":
        assert cut["stop_ms"] < 4000 and cut["fired_ms"] is not None, cut
    assert utt.end > utt.onset
