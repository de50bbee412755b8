"""End-of-turn decisions (app/live/turns.py) on generated speech through the real Silero VAD."""

from __future__ import annotations

import numpy as np
import pytest

from alignment.types import SAMPLE_RATE, AudioChunk
from app.live.turns import TurnConfig, TurnDetector, end_silence, looks_unfinished
from app.loadtest import testmedia
from tests.live_fixtures import live_stages  # noqa: F401 - pytest fixture


def _speech(text: str) -> np.ndarray:
    audio = testmedia.synthesize_speech(text).samples
    voiced = np.flatnonzero(np.abs(audio) > 1e-3)
    return audio[: int(voiced[-1]) + 1]


def _silence(s: float) -> np.ndarray:
    return np.zeros(int(s * SAMPLE_RATE), np.float32)


def _run(audio: np.ndarray, text_at: callable, config: TurnConfig | None = None) -> list[tuple[str, float, float]]:
    """Feed 20 ms chunks; returns (kind, pts, time of the decision) per event."""
    det, out, step = TurnDetector(config), [], 320
    for i in range(0, len(audio), step):
        t = i / SAMPLE_RATE
        for ev in det.feed(AudioChunk(t, audio[i:i + step]), text_at(t)):
            out.append((ev.kind, ev.pts, t + step / SAMPLE_RATE))
    return out


def test_a_finished_sentence_pauses_then_ends_at_the_short_silence():
    first = _speech("please send me the report")
    audio = np.concatenate([_silence(0.3), first, _silence(1.0)])
    end_true = 0.3 + len(first) / SAMPLE_RATE
    events = _run(audio, lambda t: "please send me the report")
    kinds = [k for k, _, _ in events]
    assert kinds == ["pause", "speak", "end"], events
    (_, pause_pts, pause_at), (_, speak_pts, speak_at), (_, end_pts, end_at) = events
    assert pause_pts == speak_pts == end_pts and abs(end_pts - end_true) < 0.1  # the VAD's end of speech
    assert 0.08 <= pause_at - pause_pts <= 0.2  # prefetch after ~0.1 s of silence
    config = TurnConfig()
    assert config.speak_s - 0.01 <= speak_at - speak_pts <= config.speak_s + 0.1 < end_at - end_pts  # synthesis
    assert config.end_s - 0.01 <= end_at - end_pts <= config.end_s + 0.1  # the turn is over after end_s of silence


def test_a_hesitation_after_an_unfinished_word_is_not_an_end():
    part1, part2 = _speech("i would like to"), _speech("order a pizza")
    audio = np.concatenate([_silence(0.3), part1, _silence(0.45), part2, _silence(1.0)])
    resume_t = 0.3 + len(part1) / SAMPLE_RATE + 0.45

    def text(t: float) -> str:
        return "i would like to" if t < resume_t + 0.3 else "i would like to order a pizza"

    events = _run(audio, text)
    assert [k for k, _, _ in events] == ["pause", "speak", "resume", "pause", "speak", "end"], events
    # the same 0.45 s hesitation after a word that can end a sentence is taken for the end
    events = _run(audio, lambda t: "i would like to order")
    assert [k for k, _, _ in events][:3] == ["pause", "speak", "end"], events


def test_a_short_pause_inside_a_sentence_is_not_spoken_ahead():
    """A short gap between words (0.2 s of zeros; the VAD hears ~0.13 s of it): a network responder may
    prefetch there (``pause``), but no answer is synthesized ahead (``speak`` waits for 0.2 s of silence),
    so a spoken answer wastes no CPU on it."""
    part1, part2 = _speech("please call me back"), _speech("when you have a moment")
    audio = np.concatenate([_silence(0.3), part1, _silence(0.2), part2, _silence(1.0)])
    kinds = [k for k, _, _ in _run(audio, lambda t: "please call me back")]
    assert kinds[:2] == ["pause", "resume"] and kinds[2:] == ["pause", "speak", "end"], kinds


def test_config_and_wordlist():
    assert looks_unfinished("I went to the") and looks_unfinished("and um")
    assert not looks_unfinished("call me back.") and not looks_unfinished("")
    cfg = TurnConfig()
    assert end_silence("to the", cfg) == cfg.unfinished_end_s and end_silence("the station", cfg) == cfg.end_s
    with pytest.raises(ValueError):
        TurnConfig(pause_s=0.3, end_s=0.2)
    with pytest.raises(ValueError):
        TurnConfig(speak_s=0.4)


async def test_live_session_prefetches_an_openai_answer_and_reports_both_figures(live_stages, av_clip):  # noqa: F811
    """A real peer speaks one sentence to a live server whose responder is the OpenAI stand-in (TTFT
    100 ms): the answer comes, its first token carries LST TTFT (request → token) and turn latency."""
    import dataclasses

    from app.live.server import ServerConfig, create_app, running_server
    from app.loadtest.llm_standin import StandInLLM
    from app.loadtest.peer import WhipPeer
    from models.responders import OpenAIResponder

    llm = await StandInLLM(ttft_s=0.1).start()
    stages = dataclasses.replace(live_stages, make_responder=lambda: OpenAIResponder(base_url=llm.base_url))
    app = create_app(ServerConfig.in_process(ui=False, output_delay_s=0.9), stages=stages)
    try:
        async with running_server(app) as base:
            peer = WhipPeer(f"{base}/whip", av_clip)  # the sentence, then silence
            await peer.connect()
            try:
                first = await peer.wait_for("response", lambda m: "ttft_ms" in m, timeout=60)
            finally:
                await peer.close()
    finally:
        await llm.stop()
    assert llm.requests >= 1
    assert first["ttft_ms"] >= 90  # the stand-in's own 100 ms (less a timer tick), plus any hold
    assert first["turn_ms"] > first["ttft_ms"] and first["text"] == "Sure,"
    heard = [(round(e.wall - peer.t0_wall, 2), e.message["text"], e.message["final"]) for e in peer.events
             if e.type == "token"]
    print(f"LST TTFT {first['ttft_ms']:.0f} ms, turn latency {first['turn_ms']:.0f} ms; tokens {heard}")
