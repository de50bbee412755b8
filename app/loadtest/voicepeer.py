"""The peer's ears and eyes on the spoken answer, and a microphone that speaks on cue.

:class:`AnswerListener` takes the answer's two tracks from a ``WhipPeer``. It always counts their
packets; with ``decode=True`` it also reads each 20 ms audio frame's level and samples and the mouth
opening off each avatar frame (``app.loadtest.answers``), both on one clock through their RTCP sender
reports (aiortc does no lip-sync; the peer does what a browser does).

:class:`ScriptedMic` is the peer's microphone: silence, the utterances it is told to ``say`` at known
instants (their true onset and end are returned) and, given an ``answers.EchoPath``, the answer it
received played back into it through a room response.

:func:`answer_figures`: per answer, voice-to-voice, barge-in stop latency (and when the detector fired),
lip-sync offset, false interruptions; :func:`echo_tokens`: words heard from the answer's echo.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from alignment.clock import SessionClock
from alignment.types import SAMPLE_RATE
from app.loadtest import answers as ans

AUDIO_RATE = 48_000
AUDIO_FRAME = 960
#: Avatar frames kept (as luma) until the mouth box is found; the box is found once, from these.
BOX_FRAMES = 48
#: An answer's lip-sync offset counts from at least 1 s of its frames, best correlation at least 0.3: an
#: answer cut after a word or two gives a lag of best fit, not evidence of an offset.
MIN_LIP_FRAMES = 16
MIN_LIP_CORR = 0.3


@dataclass(frozen=True)
class Utterance:
    """One thing the peer said: its text and true onset / end of speech (peer clock, s since t0)."""

    text: str
    onset: float
    end: float
    barge_in: bool = False  # said on purpose during an answer
    sent_at: float | None = None  # its first sent sample (before ``onset`` when sound preceded its first phone)


@dataclass
class MouthSample:
    wall: float
    media: float | None
    opening: float


class AnswerListener:
    """Counts, and when asked decodes and measures, the answer's audio and avatar tracks."""

    def __init__(self, decode: bool = True, echo: ans.EchoPath | None = None, keep_audio_s: float = 900.0,
                 t0: Any = None) -> None:
        """``t0``: a callable giving the peer's clip-zero wall time (the echo path is on that clock)."""
        self.decode = decode
        self.echo = echo
        self._t0 = t0
        self.clock = SessionClock(reference="audio")
        self.audio_packets = 0
        self.audio_bytes = 0
        self.avatar_frames = 0
        self.packets: list[ans.Packet] = []
        self.audio16k: deque[tuple[float, np.ndarray]] = deque(maxlen=int(keep_audio_s / ans.FRAME_S))
        self.envelope: deque[tuple[float, float]] = deque(maxlen=int(2 * keep_audio_s / ans.FRAME_S))
        self.mouth: list[MouthSample] = []
        self.box: tuple[int, int, int, int] | None = None
        self.last_avatar: av.VideoFrame | None = None
        self._pending: list[tuple[float, float | None, np.ndarray]] = []
        self._arrivals: dict[int, float] = {}
        self._arrival_order: deque[int] = deque()
        self.tasks: list[asyncio.Task] = []
        self.errors: list[str] = []  # a reader that failed says why here (a task's exception is otherwise lost)

    # --- wiring -------------------------------------------------------------------------------

    def attach_audio(self, track: MediaStreamTrack, receiver: Any) -> None:
        from app.live.webrtc import hook_receiver

        tclock = self.clock.track("audio", AUDIO_RATE)
        original = receiver._handle_rtp_packet

        async def counted(packet: Any, arrival_time_ms: int) -> None:
            if packet.payload:
                self.audio_packets += 1
                self.audio_bytes += len(packet.payload)
                if self.decode:
                    self._arrived(int(packet.timestamp), time.monotonic())
                    await original(packet, arrival_time_ms)

        receiver._handle_rtp_packet = counted
        if self.decode:
            hook_receiver(receiver, tclock)  # wraps ``counted``: first arrival + sender reports
            self.tasks.append(asyncio.ensure_future(self._read_audio(track, receiver, tclock)))

    def attach_avatar(self, track: MediaStreamTrack, receiver: Any) -> None:
        from app.live.webrtc import hook_receiver

        tclock = self.clock.track("avatar", 90_000)
        if not self.decode:
            async def count(packet: Any, arrival_time_ms: int) -> None:
                if packet.marker and packet.payload:
                    self.avatar_frames += 1

            receiver._handle_rtp_packet = count
            return
        hook_receiver(receiver, tclock)
        self.tasks.append(asyncio.ensure_future(self._read_avatar(track, receiver, tclock)))

    def _arrived(self, rtp: int, wall: float) -> None:
        if rtp not in self._arrivals:
            self._arrivals[rtp] = wall
            self._arrival_order.append(rtp)
            if len(self._arrival_order) > 2000:
                self._arrivals.pop(self._arrival_order.popleft(), None)

    # --- reading ------------------------------------------------------------------------------

    async def _read_audio(self, track: MediaStreamTrack, receiver: Any, tclock: Any) -> None:
        from app.live.ingest import CODEC_DELAY_S
        from app.live.webrtc import set_origin

        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        try:
            while True:
                frame = await track.recv()
                now = time.monotonic()
                set_origin(receiver, tclock)
                pts = int(frame.pts)
                rtp = None if tclock.origin is None else (tclock.origin + pts) % (1 << 32)
                wall = self._arrivals.get(rtp, now) if rtp is not None else now
                media = tclock.time(pts, wall) - CODEC_DELAY_S.get(frame.sample_rate, 0.0)
                pcm = frame.to_ndarray().astype(np.float32).reshape(-1, len(frame.layout.channels)).mean(axis=1)
                pcm /= 32768.0
                level = ans.dbfs(pcm)
                self.packets.append(ans.Packet(wall, round(level, 2), media))
                half = len(pcm) // 2
                self.envelope.append((media + 0.005, float(np.sqrt(np.mean(pcm[:half] ** 2))) if half else 0.0))
                self.envelope.append((media + 0.015, float(np.sqrt(np.mean(pcm[half:] ** 2))) if half else 0.0))
                out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
                if out:  # "flt": float32 in [-1, 1]
                    self.audio16k.append((wall, np.concatenate(out).astype(np.float32, copy=False)))
                if self.echo is not None and self._t0 is not None and self._t0() is not None:
                    self.echo.played(now - self._t0(), pcm)  # arrived now; EchoPath plays it out
        except (MediaStreamError, asyncio.CancelledError):
            return
        except Exception as exc:  # noqa: BLE001 - a measuring peer reports, it does not crash the run
            self.errors.append(f"answer audio: {type(exc).__name__}: {exc}")

    async def _read_avatar(self, track: MediaStreamTrack, receiver: Any, tclock: Any) -> None:
        from app.live.webrtc import set_origin

        try:
            while True:
                frame = await track.recv()
                now = time.monotonic()
                set_origin(receiver, tclock)
                media = tclock.time(int(frame.pts), now)
                self.avatar_frames += 1
                self.last_avatar = frame
                y = _luma_plane(frame)
                if self.box is None:
                    self._pending.append((now, media, y))
                    self._find_box()
                else:
                    self.mouth.append(MouthSample(now, media, ans.mouth_opening(y, self.box)))
        except (MediaStreamError, asyncio.CancelledError):
            return
        except Exception as exc:  # noqa: BLE001 - a measuring peer reports, it does not crash the run
            self.errors.append(f"avatar: {type(exc).__name__}: {exc}")

    def _find_box(self) -> None:
        """Once the answer has played long enough for the mouth to move, find the box from the pixels."""
        loud = sum(p.loud for p in self.packets)
        if len(self._pending) > 4 * BOX_FRAMES:  # long idle before any answer: keep the latest only
            self._pending = self._pending[-BOX_FRAMES:]
        if loud < 50 or len(self._pending) < BOX_FRAMES:
            return
        lumas = [y for _, _, y in self._pending[-BOX_FRAMES:]]
        box = ans.mouth_box(lumas)
        if box[1] - box[0] < 3:
            return
        self.box = box
        for wall, media, y in self._pending:
            self.mouth.append(MouthSample(wall, media, ans.mouth_opening(y, box)))
        self._pending = []

    async def aclose(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _luma_plane(frame: av.VideoFrame) -> np.ndarray:
    """The frame's luma as a 2-D uint8 array (yuv420p: the Y plane, no colour conversion)."""
    if frame.format.name != "yuv420p":
        frame = frame.reformat(format="yuv420p")
    plane = frame.planes[0]
    return np.frombuffer(bytes(plane), np.uint8).reshape(-1, plane.line_size)[: frame.height, : frame.width]


class ScriptedMic(MediaStreamTrack):
    """48 kHz mono 20 ms frames: silence, the utterances scheduled by :meth:`say`, and the echo.

    ``noise_dbfs``: a white noise floor at that RMS level, as a real microphone has; without it the silence is
    digital (zeros), as a gated sender's is."""

    kind = "audio"

    def __init__(self, start: Any, echo: ans.EchoPath | None = None, noise_dbfs: float | None = None) -> None:
        super().__init__()
        self._start = start
        self.echo = echo
        self._noise = None if noise_dbfs is None else 10 ** (noise_dbfs / 20)
        self._rng = np.random.default_rng(0)
        self._n = 0
        self._queue: list[tuple[int, np.ndarray]] = []

    @property
    def now_s(self) -> float:
        """The peer-clock time of the next frame to be sent."""
        return self._n * AUDIO_FRAME / AUDIO_RATE

    def say(self, samples16k: np.ndarray, text: str = "", at_s: float | None = None,
            barge_in: bool = False, phones: tuple[float, float] | None = None) -> Utterance:
        """Schedule 16 kHz speech to start at peer time ``at_s`` (default: 60 ms from now); its truth.

        The samples are trimmed to their speech first (``answers.speech_span``: 5 ms windows within 40 dB
        of the loudest), so onset and end of speech are where the sound starts and stops. ``phones``: where
        the synthesizer's first phone starts and its last one ends (s into ``samples16k``); the truth stays
        within them (``speech_span``'s ``within``), the audio sent does not change.
        """
        from app.loadtest.testmedia import resample

        x = np.asarray(samples16k, np.float32)
        span = ans.speech_span(x, SAMPLE_RATE)
        if span is None:
            raise ValueError("nothing to say: the samples are silent")
        first, stop = span if phones is None else ans.span_within(span, phones, SAMPLE_RATE)
        x = x[span[0] : span[1]]
        pcm = resample(x, SAMPLE_RATE, AUDIO_RATE).astype(np.float32)
        earliest = (self._n + 3) * AUDIO_FRAME
        begin = max(int(round((at_s if at_s is not None else self.now_s + 0.06) * AUDIO_RATE)), earliest)
        self._queue.append((begin, pcm))
        sent = begin / AUDIO_RATE
        return Utterance(text, sent + (first - span[0]) / SAMPLE_RATE, sent + (stop - span[0]) / SAMPLE_RATE,
                         barge_in, sent)

    @property
    def speaking_until(self) -> float:
        """Peer time at which the last scheduled utterance ends."""
        return max((b + len(p)) / AUDIO_RATE for b, p in self._queue) if self._queue else 0.0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        pts = self._n * AUDIO_FRAME
        await self._start.sleep_until(pts / AUDIO_RATE)
        chunk = np.zeros(AUDIO_FRAME, np.float32)
        keep = []
        for begin, pcm in self._queue:
            lo, hi = pts - begin, pts - begin + AUDIO_FRAME
            if hi <= 0:
                keep.append((begin, pcm))
                continue
            if lo < len(pcm):
                seg = pcm[max(lo, 0) : hi]
                chunk[max(-lo, 0) : max(-lo, 0) + len(seg)] += seg
                keep.append((begin, pcm))
        self._queue = keep
        if self.echo is not None:
            chunk += self.echo.echo(pts / AUDIO_RATE, AUDIO_FRAME)
        if self._noise is not None:
            chunk += (self._noise * self._rng.standard_normal(AUDIO_FRAME)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray((np.clip(chunk, -1, 1) * 32767).astype(np.int16)[None, :],
                                           format="s16", layout="mono")
        frame.sample_rate = AUDIO_RATE
        frame.pts = pts
        frame.time_base = fractions.Fraction(1, AUDIO_RATE)
        self._n += 1
        return frame


# --- per-answer figures -------------------------------------------------------------------------------


@dataclass
class AnswerRecord:
    """One answer as the peer saw it (peer clock s, except ``*_wall``)."""

    index: int
    answer: Any
    start_wall: float  # answer_start's arrival
    end_wall: float | None = None  # response_end's arrival
    reason: str | None = None
    text: str = ""
    words: list[str] = field(default_factory=list)
    speech_end: float | None = None  # server's, session clock
    server_latency_ms: float | None = None


def answers_of(events: list[Any]) -> list[AnswerRecord]:
    """The answers in a peer's event list (``ReceivedEvent``s), in order of their ``answer_start``."""
    out: dict[Any, AnswerRecord] = {}
    for e in events:
        m = e.message
        kind = m.get("type")
        key = m.get("answer")
        if kind == "answer_start" and key not in out:
            out[key] = AnswerRecord(len(out), key, e.wall, speech_end=_num(m.get("speech_end")),
                                    server_latency_ms=_num(m.get("voice_latency_ms")))
        elif kind == "answer_word" and key in out:
            out[key].words.append(str(m.get("text", "")))
        elif kind == "response_end" and key in out:
            rec = out[key]
            rec.end_wall, rec.reason, rec.text = e.wall, str(m.get("reason")), str(m.get("text") or "")
    return list(out.values())


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) else None


def answer_figures(listener: AnswerListener, events: list[Any], said: list[Utterance], t0: float,
                   lead_s: float = 0.3) -> list[dict[str, Any]]:
    """Per answer: voice-to-voice, barge-in stop, lip-sync, and whether it was cut by nobody.

    An answer's audio is what arrived from ``lead_s`` before its ``answer_start`` until ``lead_s`` before
    the next one's. Its utterance is the one whose true end is nearest the server's ``speech_end``
    (session clock ≈ peer clock on loopback; within 1 s): ``_answered``.
    """
    records = answers_of(events)
    out = []
    for i, rec in enumerate(records):
        lo = rec.start_wall - lead_s
        hi = records[i + 1].start_wall - lead_s if i + 1 < len(records) else math.inf
        first = ans.first_loud(listener.packets, lo, hi)
        fig: dict[str, Any] = {"answer": rec.answer, "reason": rec.reason, "words": len(rec.words),
                               "server_voice_latency_ms": rec.server_latency_ms, "voice_to_voice_ms": None,
                               "stop_ms": None, "fired_ms": None, "barge_in": False, "false_interruption": False,
                               "lip_sync_ms": None, "lip_corr": None, "audible": first is not None,
                               "utterance": None, "utterance_index": None}
        utt = _answered(rec, said, None if first is None else first.wall - t0)
        if utt is not None and first is not None:
            fig["voice_to_voice_ms"] = round((first.wall - (t0 + utt.end)) * 1000.0, 1)
            fig["utterance"] = utt.text
            fig["utterance_index"] = next(k for k, u in enumerate(said) if u is utt)
        end = rec.end_wall if rec.end_wall is not None else hi
        onsets = [u for u in said if first is not None and first.wall - t0 < u.onset < end - t0 + 0.5
                  and u is not utt]
        if onsets:
            onset = t0 + onsets[0].onset
            fig["barge_in"] = True
            stop = ans.stop_latency(onset, listener.packets, hi)
            fig["stop_ms"] = None if stop is None else round(stop * 1000.0, 1)
            if rec.reason == "barge_in" and rec.end_wall is not None:  # the detector fired: response_end arrived
                fig["fired_ms"] = round((rec.end_wall - onset) * 1000.0, 1)
        elif rec.reason == "barge_in":
            fig["false_interruption"] = True
        lip = lip_sync(listener, lo, hi)
        if lip is not None and lip.correlation >= MIN_LIP_CORR:  # weaker: no evidence of an offset
            fig["lip_sync_ms"], fig["lip_corr"] = lip.offset_ms, lip.correlation
        out.append(fig)
    return out


def _answered(rec: AnswerRecord, said: list[Utterance], first_s: float | None) -> Utterance | None:
    """The utterance an answer answers: the one whose true end is nearest the server's ``speech_end``
    (within 1 s); without a ``speech_end``, the last one that ended at most 3 s before the answer's audio.
    None for an answer to nothing the peer said (its own echo, heard as speech)."""
    if rec.speech_end is not None:
        near = min(said, key=lambda u: abs(u.end - rec.speech_end), default=None)
        return near if near is not None and abs(near.end - rec.speech_end) <= 1.0 else None
    if first_s is None:
        return None
    before = [u for u in said if u.end <= first_s]
    return before[-1] if before and first_s - before[-1].end <= 3.0 else None


def lip_sync(listener: AnswerListener, lo_wall: float, hi_wall: float) -> ans.LipSync | None:
    """The lip-sync offset of the answer whose audio arrived in ``[lo_wall, hi_wall)``."""
    media = [p.media for p in listener.packets if lo_wall <= p.wall < hi_wall and p.media is not None and p.loud]
    if not media:
        return None
    a, b = min(media) - 0.3, max(media) + 0.3
    env = [(t, v) for t, v in listener.envelope if a <= t <= b]
    mouth = [(s.media, s.opening) for s in listener.mouth if s.media is not None and a <= s.media <= b]
    if len(env) < 8 or len(mouth) < MIN_LIP_FRAMES:
        return None
    env_t, env_v = (np.asarray(x) for x in zip(*sorted(env), strict=True))
    k = 4  # 40 ms of 10 ms hops: one frame's worth of sound
    smooth = np.sqrt(np.convolve(env_v**2, np.ones(k) / k, mode="same"))
    mt, mv = (np.asarray(x) for x in zip(*sorted(mouth), strict=True))
    return ans.lip_sync_offset(env_t, smooth, mt, mv)


def answer_audio(listener: AnswerListener, lo_wall: float, hi_wall: float) -> np.ndarray:
    """The 16 kHz audio received in ``[lo_wall, hi_wall)``, in arrival order."""
    parts = [x for w, x in listener.audio16k if lo_wall <= w < hi_wall]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def final_words(events: list[Any]) -> list[tuple[float, str]]:
    """The user ``token`` finals among ``events``: (start, the word's :func:`agreement_key`)."""
    from alignment.text import agreement_key

    return [(float(m["start"]), agreement_key(str(m.get("text", "")))) for e in events
            if (m := e.message).get("type") == "token" and m.get("final")
            and isinstance(m.get("start"), (int, float))]


def echo_tokens(events: list[Any], said: list[Utterance], margin_s: float = 0.5) -> int:
    """User ``token`` events (finals) whose start lies in none of the peer's utterances (± margin):
    words the server heard that the peer never said — its answer's echo, or noise."""
    return sum(not any(u.onset - margin_s <= t <= u.end + margin_s for u in said) for t, _ in final_words(events))


def heard_words(events: list[Any], said: list[Utterance], margin_s: float = 0.5) -> tuple[int, int]:
    """(words the server finalised, words said) over the utterances said over an answer (``barge_in``):
    how much of a user's speech over the answer survives the echo removal."""
    from alignment.text import agreement_key

    finals = final_words(events)
    heard = total = 0
    for u in said:
        if not u.barge_in:
            continue
        words = [agreement_key(w) for w in u.text.split()]
        got = [w for t, w in finals if u.onset - margin_s <= t <= u.end + margin_s]
        total += len(words)
        heard += sum(min(words.count(w), got.count(w)) for w in set(words))
    return heard, total
