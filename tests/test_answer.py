"""The spoken answer over the real aiortc stack (loopback): audio and avatar back in one MediaStream,
answer words in order, barge-in, a TTS that is down, and Level-3 on the answer (it catches an
injected 80 ms shift between the avatar and the audio)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from app.live.server import ServerConfig, create_app, running_server
from app.live.warmup import WarmState
from app.live.webrtc import share_transport
from app.loadtest.peer import WhipPeer
from tests.live_fixtures import live_stages  # noqa: F401 - shared session fixture

_VOICES: dict[str, object] = {}


@pytest.fixture(scope="module")
def voice():
    """The answer's voice as ``synchrony serve`` warms it (festival, the avatar where it is built)."""
    from app.live.warmup import _warm_voice

    if "voice" not in _VOICES:
        state = WarmState()
        _warm_voice(ServerConfig.in_process(ui=False, tts="festival"), state)
        _VOICES["voice"] = state.stages.voice
        _VOICES["missing"] = dict(state.stages.missing)
    return _VOICES["voice"]


class AnswerPeer(WhipPeer):
    """A WHIP peer that (optionally) offers the avatar's video m-line and keeps what comes back on
    the answer's tracks: the decoded audio (48 kHz mono) and the avatar frames."""

    def __init__(self, *args: object, avatar: bool = True, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.avatar = avatar
        self.audio = np.zeros(0, np.float32)
        self.avatar_frames: list[tuple[float, np.ndarray]] = []  # (pts s, RGB)
        self.reports: dict[str, list[tuple[float, int]]] = {}  # sender reports of the answer's tracks
        create_offer = self.pc.createOffer

        async def offer():  # the avatar's m-line after the camera's (the server takes the second video)
            if self.avatar:
                self.pc.addTransceiver("video", direction="recvonly")
            return await create_offer()

        self.pc.createOffer = offer
        set_remote = self.pc.setRemoteDescription

        async def set_answer(description):  # aiortc's own client has the server's second-m-line snag
            await set_remote(description)
            videos = [t for t in self.pc.getTransceivers() if t.kind == "video"]
            if len(videos) > 1:
                share_transport(videos[1], videos[0])
                self._hook_reports("video", videos[1].receiver)
            audio = next(t for t in self.pc.getTransceivers() if t.kind == "audio")
            self._hook_reports("audio", audio.receiver)

        self.pc.setRemoteDescription = set_answer

    def _hook_reports(self, kind: str, receiver) -> None:
        """Keep the sender reports of the answer's tracks: (NTP s, RTP timestamp)."""
        from aiortc.rtp import RtcpSrPacket

        from alignment.clock import ntp_to_seconds

        self.reports.setdefault(kind, [])
        original = receiver._handle_rtcp_packet

        async def handle(packet):
            if isinstance(packet, RtcpSrPacket):
                info = packet.sender_info
                self.reports[kind].append((ntp_to_seconds(info.ntp_timestamp), info.rtp_timestamp))
            await original(packet)

        receiver._handle_rtcp_packet = handle

    def _on_track(self, track: MediaStreamTrack) -> None:
        videos = [t for t in self.pc.getTransceivers() if t.kind == "video"]
        if track.kind == "audio":
            self._tasks.append(asyncio.ensure_future(self._read_audio(track)))
        elif len(videos) > 1 and videos[1].receiver.track is track:
            self._tasks.append(asyncio.ensure_future(self._read_avatar(track)))
        else:
            super()._on_track(track)

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                pcm = frame.to_ndarray().astype(np.float32).reshape(-1, len(frame.layout.channels)).mean(axis=1)
                self.audio = np.concatenate([self.audio, pcm / 32768.0])
        except (MediaStreamError, asyncio.CancelledError):
            return

    async def _read_avatar(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                if len(self.avatar_frames) < 2000:
                    self.avatar_frames.append((float(frame.pts * frame.time_base), frame.to_ndarray(format="rgb24")))
        except (MediaStreamError, asyncio.CancelledError):
            return


def _mouth_opens(peer: AnswerPeer, voice) -> np.ndarray:
    """How open the mouth is on each received avatar frame, measured on the decoded pixels."""
    from models.avatar import drawn_mouth_open

    box = voice.avatar.mouth_box()
    return np.array([drawn_mouth_open(img, box) for _, img in peer.avatar_frames])


def _speaking_stages(stages, voice, **changes):
    from models.responders import AssistantResponder

    return dataclasses.replace(stages, voice=voice, make_responder=AssistantResponder, **changes)


def _msids(sdp: str) -> dict[str, str]:
    """m-line kind + index → its msid stream id."""
    out, kind, n = {}, None, {"audio": 0, "video": 0}
    for line in sdp.splitlines():
        if line.startswith("m="):
            kind = line[2:].split()[0]
            if kind in n:
                n[kind] += 1
        elif line.startswith("a=msid:") and kind in n:
            out[f"{kind}{n[kind]}"] = line[len("a=msid:"):].split()[0]
    return out


async def test_answer_is_spoken_with_avatar_in_one_stream(live_stages, voice, av_clip):  # noqa: F811
    """A peer offering the avatar m-line: hello v2, audio that is not silent, one msid for both
    answer tracks, answer words in order inside the answer, response_end done."""
    app = create_app(ServerConfig.in_process(ui=False, tts="festival"), stages=_speaking_stages(live_stages, voice))
    async with running_server(app) as base:
        peer = AnswerPeer(f"{base}/whip", av_clip)
        await peer.connect()
        hello = await peer.wait_for("hello", timeout=10)
        assert hello["version"] == 2 and hello["answer"]["audio"]
        ids = _msids(peer.pc.remoteDescription.sdp)
        if hello["answer"]["video"]:
            assert ids["audio1"] == ids["video2"] != ids["video1"], ids
        start = await peer.wait_for("answer_start", timeout=90)
        end = await peer.wait_for("response_end", timeout=60)
        words = [m for m in peer.of_type("answer_word") if m["answer"] == end["answer"]]
        assert [w["index"] for w in words] == list(range(len(words))) and words
        assert all(w["start"] >= start["pts"] - 1e-3 and w["end"] >= w["start"] for w in words)
        assert all(b["start"] >= a["end"] - 1e-3 for a, b in zip(words, words[1:], strict=False))
        assert end["reason"] == "done" and end["words"] == len(words)
        assert end["text"] == " ".join(w["text"] for w in words)
        await asyncio.sleep(0.5)
        level = 20 * np.log10(np.sqrt(np.mean(peer.audio ** 2)) + 1e-12)
        print(f"answer: {end['text']!r}; voice latency {start['voice_latency_ms']} ms; audio {level:.1f} dBFS "
              f"over {len(peer.audio) / 48000:.1f} s; avatar frames {len(peer.avatar_frames)}")
        assert np.abs(peer.audio).max() > 0.05
        syncs = peer.of_type("answer_sync")
        print("answer_sync:", [(s["text"], s["max_delta_ms"], s["ok"]) for s in syncs])
        print("failed:", [s for s in syncs if not s["ok"]])
        assert hello["answer"]["video"]
        opens = _mouth_opens(peer, voice)
        print(f"drawn mouth open (received frames): max {opens.max():.3f}, frames open {np.mean(opens > 0.01):.0%}")
        assert opens.max() > 0.02 and np.mean(opens > 0.01) > 0.1 and np.mean(opens < 0.005) > 0.05
        assert syncs and np.mean([s["ok"] for s in syncs]) >= 0.9
        # Sender reports on the media clock: NTP - RTP/rate is one constant per track, not the send jitter.
        for kind, rate in (("audio", 48000), ("video", 90000)):
            reports = [(ntp, rtp) for ntp, rtp in peer.reports[kind]][1:]  # the first may be aiortc's own
            spread = np.ptp([ntp - ((rtp - reports[0][1]) % 2**32) / rate for ntp, rtp in reports]) * 1000
            print(f"{kind}: {len(reports)} sender reports, NTP-RTP spread {spread:.2f} ms")
            assert len(reports) >= 3 and spread < 2.0
        await peer.close()


async def _one_answer(app, peer: AnswerPeer, timeout: float = 90.0) -> tuple[dict, dict]:
    await peer.connect()
    hello = await peer.wait_for("hello", timeout=10)
    end = await peer.wait_for("response_end", timeout=timeout)
    await asyncio.sleep(0.5)  # the last checks (0.3 s after the last word)
    return hello, end


async def test_injected_avatar_shift_fails_the_answer_level3(live_stages, voice, av_clip):  # noqa: F811
    """The avatar drawn 80 ms behind the audio it is stamped with (the send path): answer_sync fails."""
    app = create_app(ServerConfig.in_process(ui=False, tts="festival", avatar_shift_s=0.08),
                     stages=_speaking_stages(live_stages, voice))
    async with running_server(app) as base:
        peer = AnswerPeer(f"{base}/whip", av_clip)
        hello, end = await _one_answer(app, peer)
        syncs = [s for s in peer.of_type("answer_sync") if s["answer"] == end["answer"]]
        print("shifted answer_sync:", [(s["text"], s["max_delta_ms"], s["ok"]) for s in syncs])
        assert hello["answer"]["video"] and syncs
        assert np.mean([s["ok"] for s in syncs]) <= 0.1
        shifts = [s["video"] - s["audio"] for s in syncs if s["video"] is not None and s["audio"] is not None]
        assert np.median(shifts) == pytest.approx(0.08, abs=0.02)
        await peer.close()


async def test_without_the_avatar_mline_the_answer_is_audio_and_text(live_stages, voice, av_clip):  # noqa: F811
    app = create_app(ServerConfig.in_process(ui=False, tts="festival"), stages=_speaking_stages(live_stages, voice))
    async with running_server(app) as base:
        peer = AnswerPeer(f"{base}/whip", av_clip, avatar=False)
        hello, end = await _one_answer(app, peer)
        assert hello["answer"] == {"audio": True, "video": False, "voice": voice.name}
        assert not peer.avatar_frames and len([m for m in peer.pc.getTransceivers() if m.kind == "video"]) == 1
        assert end["reason"] == "done" and end["words"] > 3 and peer.of_type("response")
        assert np.abs(peer.audio).max() > 0.05
        syncs = peer.of_type("answer_sync")
        assert syncs and all(s["video"] is None for s in syncs) and np.mean([s["ok"] for s in syncs]) >= 0.9
        await peer.close()


@pytest.mark.parametrize("failure", ["down", "garbage"])
async def test_tts_failing_gives_one_warning_and_text_answers(live_stages, voice, av_clip, failure):  # noqa: F811
    """A synthesizer that cannot be reached, or answers bytes that are no audio: one warning, the
    answer as text, the session lives on."""
    from app.loadtest.tts_standin import StandInTTS
    from models.tts import make_synthesizer

    standin = await StandInTTS(mode="garbage").start() if failure == "garbage" else None
    url = standin.base_url if standin is not None else "http://127.0.0.1:9/v1"
    down = dataclasses.replace(voice, synthesizer=make_synthesizer("openai", base_url=url))
    app = create_app(ServerConfig.in_process(ui=False, tts="openai"), stages=_speaking_stages(live_stages, down))
    async with running_server(app) as base:
        peer = AnswerPeer(f"{base}/whip", av_clip)
        hello, end = await _one_answer(app, peer)
        warnings = peer.of_type("warning")
        assert len(warnings) == 1 and warnings[0]["stage"] == "tts" and "text" in warnings[0]["message"]
        text = " ".join(m["text"] for m in peer.of_type("response") if m["utterance"] == end["answer"])
        assert end["reason"] == "done" and end["text"] == text and end["words"] == len(text.split()) > 3
        assert not peer.of_type("answer_word") and peer.session_id in app.state.sessions
        print(f"{failure}: {warnings[0]['message']}")
        await peer.close()
    if standin is not None:
        await standin.stop()


async def test_a_new_turn_cuts_the_answer_at_what_was_spoken(live_stages, voice, av_clip):  # noqa: F811
    """The user speaks again while the answer plays (the clip loops): the answer stops, response_end
    says barge_in with a prefix of it ending on a word whose audio was sent, and the next answer's
    history holds only that prefix."""
    app = create_app(ServerConfig.in_process(ui=False, tts="festival"), stages=_speaking_stages(live_stages, voice))
    async with running_server(app) as base:
        peer = AnswerPeer(f"{base}/whip", av_clip, loop=True)
        await peer.connect()
        cut = await peer.wait_for("response_end", lambda m: m["reason"] == "barge_in", timeout=120)
        words = [m for m in peer.of_type("answer_word") if m["answer"] == cut["answer"]]
        spoken = [w["text"] for w in words][:cut["words"]]
        assert cut["text"] == " ".join(spoken) and cut["words"] < len(words) + 1
        if cut["words"]:
            assert cut["last_word"] == spoken[-1]
            assert cut["spoken_until"] == pytest.approx(words[cut["words"] - 1]["end"], abs=1e-3)
        later = [m for m in peer.of_type("response") if m["utterance"] == cut["answer"]]
        session = app.state.sessions[peer.session_id]
        await peer.wait_for("answer_start", lambda m: m["answer"] > cut["answer"], timeout=60)
        assert session.responses.history[-1][1] == cut["text"] or len(session.responses.history) > 1
        assert [h for h in session.responses.history if h[1] == cut["text"]]
        print(f"cut after {cut['words']} words ({cut['text']!r}); {len(later)} response tokens shown")
        await peer.close()


async def test_barge_in_detector_stops_the_answer(live_stages, voice, av_clip):  # noqa: F811
    """With the barge-in detector (models.bargein): the user's speech over the answer stops it at
    its onset, counted in /metrics; the answer's own audio never reaches the ASR as user words."""
    pytest.importorskip("models.bargein")
    import httpx

    from models.bargein import BargeInDetector

    stages = _speaking_stages(live_stages, voice, make_bargein=BargeInDetector)
    app = create_app(ServerConfig.in_process(ui=False, tts="festival"), stages=stages)
    async with running_server(app) as base:
        peer = AnswerPeer(f"{base}/whip", av_clip, loop=True)
        await peer.connect()
        cut = await peer.wait_for("response_end", lambda m: m["reason"] == "barge_in", timeout=120)
        period = len(av_clip.audio) / 16000
        onsets = [n * period + av_clip.words[0].start for n in range(1, 20)]
        until = cut["spoken_until"] or 0.0
        print(f"barge-in: spoken until {until:.3f}; user onsets {[round(o, 2) for o in onsets[:4]]}")
        # cut at the user's onset: the last word fully sent ends at most a word before it, and the
        # detection takes a few hundred ms at most
        assert any(-0.8 <= until - o <= 0.6 for o in onsets) or cut["words"] == 0
        metrics = (await httpx.AsyncClient().get(f"{base}/metrics")).text
        assert "synchrony_barge_ins_total 1.0" in metrics or "synchrony_barge_ins_total 2.0" in metrics
        await peer.close()


async def test_a_prepared_answer_is_synthesized_silently_and_plays_at_once_when_released(voice):
    """A prefetched spoken answer: its first phrase is synthesized while the turn may still go on, the
    track sends nothing of it (the answer playing goes on), and once released its voice starts in
    the first frame: the synthesis is not in the voice-to-voice latency."""
    from alignment.clock import SessionClock
    from alignment.types import TokenRatePolicy
    from app.live.answer import FRAME_S, AnswerPlayer
    from app.live.stages import AnswerConfig
    from app.live.warm_answer import _LocalHost, _Quiet
    from models.tts.festival import LEAD_SILENCE_S

    clock = SessionClock()
    clock.zero_wall = asyncio.get_running_loop().time()
    player = AnswerPlayer(_LocalHost(), clock, voice, AnswerConfig(), _Quiet())
    policy = TokenRatePolicy(8.0, 64, 0.5)
    playing = player.begin(1, None, lambda: policy)
    playing.feed("One moment please.")
    held = player.prepare(2, None, lambda: policy)
    for i, word in enumerate("I heard you. Tell me more.".split()):
        held.feed(word if i == 0 else " " + word)
    held.close_input()
    for _ in range(400):
        if held.queue and playing.queue:
            break
        await asyncio.sleep(0.01)
    assert held.queue, "the held answer's first phrase was not synthesized"
    assert player.current is playing and not held.started_wall
    player.release(held)
    assert playing.stopped and player.current is held
    frames = [player.audio_at(k * FRAME_S) for k in range(8)]
    assert all(f is not None for f in frames)
    peaks = [float(np.abs(f.astype(np.float32)).max()) / 32768.0 for f in frames]
    voiced = next((k for k, peak in enumerate(peaks) if peak > 0.05), None)
    # the voice rises right after festival's lead silence: nothing was left to synthesize
    assert voiced is not None and voiced * FRAME_S <= LEAD_SILENCE_S + 0.06, f"the voice starts late: peaks {peaks}"
    assert held.started_wall is not None and held.words[0].start < LEAD_SILENCE_S + FRAME_S
    player.close()
