"""The spoken answer: responder tokens → phrases → speech → an audio track and an avatar track.

Per session one :class:`AnswerPlayer`. The synthesizer reads the responder's raw tokens as they
arrive (teed before the pacer, so the paced ``response`` text LST judges is untouched); a phrase
chunker cuts them into phrases, each spoken at the rate of the load policy read at its boundary. A
new answer replaces the one playing, never queues behind it.

The two tracks share one MediaStream (one ``msid``, so a browser lip-syncs them): 48 kHz audio with
silence between answers, and, when the client offered a second video m-line, the 16 fps avatar. Both
are stamped from the session clock and paced on absolute deadlines, one frame at a time to the
encoder. What they hand on is recorded (the audio at 16 kHz, the mouth drawn per frame), and each
spoken word gets a Level-3 check (``answer_sync``) on that record, evidence the synthesizer's own
word times did not make.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import av
import numpy as np
from aiortc import MediaStreamTrack

from alignment.clock import SessionClock
from alignment.types import SAMPLE_RATE, AnswerEnd, AnswerOutcome, SpokenPhone, SpokenPhrase, TokenRatePolicy
from app.live import tracing
from app.live.answer_audio import (
    AUDIO_RATE,
    KEEP_AUDIO_S,
    MAX_LAG_S,
    Paced,
    envelope_lag,
    resample_16k,
    room_noise,
    to_pcm48,
)
from app.live.events import AnswerStartEvent, AnswerSyncEvent, AnswerWordEvent, WarningEvent
from app.live.stages import AnswerConfig, Avatar, Mouth, Stage, StageHost, Voice

if TYPE_CHECKING:
    from app.live.observe import SessionObserver

log = logging.getLogger("synchrony.answer")

FRAME_SAMPLES = 960  # 20 ms at 48 kHz
FRAME_S = FRAME_SAMPLES / AUDIO_RATE
AVATAR_FPS = 16
VIDEO_CLOCK = 90_000
DECIMATE = AUDIO_RATE // SAMPLE_RATE
#: Level-3 tolerance between the answer word's audio, video and text times.
SYNC_TOLERANCE_MS = 50.0
#: A word is checked once this long after its end has been sent (the frames around it are drawn).
SYNC_AFTER_S = 0.3
#: Drawn mouths kept for the checks (frames).
KEEP_FRAMES = 160
#: Silence kept before an answer's first frame in the record of what was sent (the onset check
#: wants ``alignment.onsets.MIN_SILENCE_S`` of it).
SILENCE_BEFORE_S = 0.2
#: After the synthesizer failed, answers are text only for this long before it is tried again.
TTS_RETRY_S = 30.0
#: The avatar waits up to this many 5 ms steps for the audio frame that covers its frame's time.
AUDIO_WAIT_STEPS = 8
#: At rest (no answer playing) the avatar sends every IDLE_EVERY-th frame of its 16 fps grid (the
#: same face each time); it checks every frame, so an answer's first mouth is on time.
IDLE_EVERY = 4
#: The barge-in detector is told when audio really went out; a lateness is taken up only when it changes by
#: more than this (a few ms of wake-up jitter would cut the echo reference into gaps and overlaps).
LATE_STEP_S = 0.01


# --- one answer --------------------------------------------------------------------------------------


@dataclass
class _Word:
    index: int  # in the answer
    text: str
    start: float  # session s
    end: float
    placed: bool = False  # start and end are on the session clock (its phrase started playing)
    sent: bool = False  # its answer_word event is out
    spoken: bool = False  # its audio was fully handed to the track
    checked: bool = False


@dataclass
class _Phrase:
    source: SpokenPhrase
    pcm: np.ndarray  # int16, 48 kHz
    first_word: int  # answer index of its first word
    phones: Sequence[SpokenPhone] = ()  # ready for the avatar's mouth
    start: float | None = None  # session s of its first sample, once playing
    offset: int = 0  # samples already handed on
    words: list[_Word] = field(default_factory=list)

    @property
    def end(self) -> float | None:
        return None if self.start is None else self.start + len(self.pcm) / AUDIO_RATE


class Answer:
    """One spoken answer: its phrases as they are synthesized, and what has been played of them."""

    def __init__(self, player: AnswerPlayer, answer_id: int, speech_end: float | None,
                 policy: Callable[[], TokenRatePolicy], turn: tracing._NoSpan = tracing.NO_SPAN) -> None:
        """``turn``: the turn's span; the answer's ``tts`` and ``playback`` spans go under it."""
        self.player, self.id, self.speech_end, self._policy = player, answer_id, speech_end, policy
        self.turn, self._tts, self._playback = turn, tracing.NO_SPAN, tracing.NO_SPAN
        self.queue: deque[_Phrase] = deque()
        self.words: list[_Word] = []  # every word synthesized so far, in order
        self._cursor = 0  # the first word not yet fully handed on
        self._pieces: asyncio.Queue[str | None] = asyncio.Queue()
        self._chunker = player.voice.make_chunker()
        self._input_done = self._synth_done = self.stopped = False
        self.failed = False  # the synthesizer failed: the rest of the answer is text only
        self.started_wall: float | None = None
        self.finished = asyncio.Event()
        self._task = player.host.spawn(self._synthesize(), Stage.ANSWER)

    # --- input: the responder's raw pieces ----------------------------------------------------

    def feed(self, piece: str) -> None:
        if not self.stopped and not self._input_done:
            self._pieces.put_nowait(piece)

    def close_input(self) -> None:
        if not self._input_done:
            self._input_done = True
            self._pieces.put_nowait(None)

    async def _synthesize(self) -> None:
        """Pieces → phrases → speech, one phrase at a time (the rate read at each phrase boundary)."""
        voice = self.player.voice
        try:
            while not self.stopped:
                piece = await self._pieces.get()
                phrases = self._chunker.flush() if piece is None else self._chunker.feed(piece)
                for text in phrases:
                    if self.stopped or self.failed:
                        break
                    await self._speak(voice, text)
                if piece is None:
                    break
        finally:
            self._tts.end()
            self._synth_done = True
            self._maybe_finished()

    async def _speak(self, voice: Voice, text: str) -> None:
        if self.player.tts_down:  # failed moments ago: do not make every answer wait for it again
            self.failed = True
            return
        wpm = voice.wpm(self._policy())
        if self._tts is tracing.NO_SPAN:  # first phrase → last phrase synthesized
            self._tts = self.turn.child("tts", {"synchrony.tts.wpm": float(wpm)})
        try:
            phrase = await asyncio.wait_for(voice.synthesizer.synthesize(text, wpm), self.player.synth_timeout_s)
            pcm = await asyncio.get_running_loop().run_in_executor(None, to_pcm48, phrase)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any TTS failure: the answer goes on as text
            self.failed = True
            why = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            self.player.tts_failed(f"speech synthesis failed ({why}); answers continue as text")
            return
        if self.stopped:
            return
        first = len(self.words)
        phones = voice.prepare(phrase.phones) if voice.prepare is not None and phrase.phones else phrase.phones
        item = _Phrase(phrase, pcm, first, phones)
        for i, w in enumerate(phrase.words):
            item.words.append(_Word(first + i, w.text, w.start, w.end))  # relative until scheduled
        self.words.extend(item.words)
        self.queue.append(item)

    # --- playback (called by the audio track, on the loop) ------------------------------------

    def next_samples(self, t: float) -> np.ndarray | None:
        """The 20 ms of answer audio that start at session time ``t`` (None: nothing to play now)."""
        if self.stopped:
            return None
        out: np.ndarray | None = None
        filled = 0
        while self.queue and filled < FRAME_SAMPLES:
            ph = self.queue[0]
            if ph.start is None:
                ph.start = t + filled / AUDIO_RATE
                for w in ph.words:
                    w.start, w.end, w.placed = ph.start + w.start, ph.start + w.end, True
                self.player.phrase_started(self, ph)
            take = min(FRAME_SAMPLES - filled, len(ph.pcm) - ph.offset)
            if out is None:
                out = np.zeros(FRAME_SAMPLES, np.int16)
            out[filled:filled + take] = ph.pcm[ph.offset:ph.offset + take]
            ph.offset += take
            filled += take
            if ph.offset >= len(ph.pcm):
                self.queue.popleft()
                if not self.queue:
                    break  # the next phrase starts on a frame of its own
        end = t + FRAME_S
        while self._cursor < len(self.words) and self.words[self._cursor].placed:
            w = self.words[self._cursor]
            if not w.sent and w.start < end:
                w.sent = True
                self.player.word_sent(self, w)
            if w.end > end + 1e-9:
                break
            w.spoken = True
            self._cursor += 1
        if out is not None and self.started_wall is None:
            self.started_wall = time.monotonic()
            self._playback = self.turn.child("playback")  # first audio out → end or barge-in
            self.player.answer_started(self, t)
        self._maybe_finished()
        return out

    def _maybe_finished(self) -> None:
        if self._synth_done and not self.queue and not self.finished.is_set():
            self._playback.end()
            self.finished.set()

    @property
    def playing(self) -> bool:
        return not self.stopped and (bool(self.queue) or not self._synth_done)

    # --- the end ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop now: the next frame is silence (barge-in, a new answer, the session ending)."""
        if self.stopped:
            return
        self.stopped = True
        if not self.finished.is_set():
            self._playback.set({"synchrony.playback.stopped": True})
        self._playback.end()
        self.queue.clear()
        self._task.cancel()
        self.finished.set()

    def outcome(self, reason: AnswerEnd) -> AnswerOutcome:
        """What was spoken: the words whose audio was fully handed to the track."""
        spoken = [w for w in self.words if w.spoken]
        text = " ".join(w.text for w in spoken)
        return AnswerOutcome(self.id, reason, len(spoken), text, spoken[-1].end if spoken else None)


# --- the player --------------------------------------------------------------------------------------


class AnswerPlayer:
    """One session's spoken answers: the answer now playing, the two tracks' content, the checks."""

    synth_timeout_s = 8.0

    def __init__(self, host: StageHost, clock: SessionClock, voice: Voice, config: AnswerConfig,
                 observer: SessionObserver, on_played: Callable[[float, np.ndarray], None] | None = None) -> None:
        self.host, self.clock, self.voice, self.config, self.observer = host, clock, voice, config, observer
        self.on_played = on_played  # the barge-in detector's view of what was sent (16 kHz)
        self.current: Answer | None = None
        self._warned = False
        self._down_until = -math.inf
        self.audio_track = AnswerAudioTrack(self)
        self.avatar_track: AvatarTrack | None = None
        # what was handed on, for the answer's Level-3
        self._sent_audio = np.zeros(int(KEEP_AUDIO_S * SAMPLE_RATE), np.float32)
        self._sent_t0: float | None = None  # session s of _sent_audio[0]
        self._sent_n = 0  # samples written since _sent_t0 (ring not yet full while < len)
        self._drawn: deque[tuple[float, float]] = deque(maxlen=KEEP_FRAMES)  # (pts, mouth open drawn)
        self._recent: deque[tuple[Answer, _Phrase]] = deque(maxlen=8)  # phrases started, for the mouth
        self._pending_checks: deque[tuple[Answer, _Word]] = deque()
        self.rtp_origin: Callable[[], int | None] = lambda: None  # the audio sender's, once known

    def enable_avatar(self) -> AvatarTrack | None:
        """The avatar track (only when the model is there)."""
        if self.voice.avatar is not None and self.voice.mouth_at is not None and self.avatar_track is None:
            self.avatar_track = AvatarTrack(self)
        return self.avatar_track

    @property
    def answering(self) -> bool:
        a = self.current
        return a is not None and a.playing

    def begin(self, answer_id: int, speech_end: float | None, policy: Callable[[], TokenRatePolicy],
              turn: tracing._NoSpan = tracing.NO_SPAN) -> Answer:
        """A new answer replaces the one playing (which stops at once); ``turn``: its span."""
        answer = self.prepare(answer_id, speech_end, policy, turn)
        self.release(answer)
        return answer

    def prepare(self, answer_id: int, speech_end: float | None, policy: Callable[[], TokenRatePolicy],
                turn: tracing._NoSpan = tracing.NO_SPAN) -> Answer:
        """A new answer, synthesized from now on but silent until :meth:`release`: a prefetched
        answer's first phrase is ready when the turn ends, instead of being synthesized then."""
        return Answer(self, answer_id, speech_end, policy, turn)

    def release(self, answer: Answer) -> None:
        """``answer`` plays from the next frame on, replacing the one playing (which stops at once)."""
        if self.current is answer:
            return
        if self.current is not None:
            self.current.stop()
        self.current = answer

    def stop(self) -> Answer | None:
        """Stop the answer playing (barge-in): the next audio frame is silence, the next face idle."""
        a = self.current
        if a is not None:
            a.stop()
        return a

    def summary(self) -> dict[str, object]:
        return {"audio_frames": self.audio_track.sent, "voiced_frames": self.audio_track.sent_voice,
                "avatar_frames": self.avatar_track.sent if self.avatar_track is not None else None,
                "speaking_frames": self.avatar_track.drawn if self.avatar_track is not None else None}

    def close(self) -> None:
        self.stop()
        self.audio_track.stop()
        if self.avatar_track is not None:
            self.avatar_track.stop()

    @property
    def tts_down(self) -> bool:
        return time.monotonic() < self._down_until

    def tts_failed(self, message: str) -> None:
        """One ``warning`` per session: the answers go on as text (the synthesizer is tried again
        after ``TTS_RETRY_S``)."""
        self._down_until = time.monotonic() + TTS_RETRY_S
        self.observer.stage_failed(Stage.TTS)
        if not self._warned:
            self._warned = True
            log.warning("session %s: %s", self.host.id, message)
            self.host.emit(WarningEvent(Stage.TTS, message))

    # --- called as audio is handed on ---------------------------------------------------------------

    def audio_at(self, t: float, sent: float | None = None) -> np.ndarray | None:
        """The answer's 20 ms frame at session time ``t``; ``sent``: when it really goes out (session s), what
        the barge-in detector is told, so that a stall followed by a burst does not move the echo off it."""
        a = self.current
        pcm = a.next_samples(t) if a is not None else None
        if pcm is not None or (a is not None and a.playing):
            self._record_audio(t, pcm, t if sent is None else sent)
        self._run_checks(t)
        return pcm

    def _record_audio(self, t: float, pcm: np.ndarray | None, sent: float) -> None:
        n = FRAME_SAMPLES // DECIMATE
        x = np.zeros(n, np.float32) if pcm is None else (
            pcm.reshape(n, DECIMATE).astype(np.float32).mean(axis=1) / 32768.0)
        ring = self._sent_audio
        if self._sent_t0 is None or abs(self._sent_t0 + self._sent_n / SAMPLE_RATE - t) > 1e-4:
            # A gap (idle between answers): a fresh record, opening on the digital silence the track
            # sent meanwhile, so an answer's first word rises out of silence as its later ones can.
            ring[:] = 0.0
            self._sent_n = min(int(SILENCE_BEFORE_S * SAMPLE_RATE), len(ring) - n)
            self._sent_t0 = t - self._sent_n / SAMPLE_RATE
        if self._sent_n + n > len(ring):
            shift = self._sent_n + n - len(ring)
            ring[:-shift] = ring[shift:]
            self._sent_t0 += shift / SAMPLE_RATE
            self._sent_n -= shift
        ring[self._sent_n:self._sent_n + n] = x
        self._sent_n += n
        if self.on_played is not None:
            self.on_played(sent, x)

    def answer_started(self, a: Answer, t: float) -> None:
        speech_end_wall = self.clock.wall_of(a.speech_end) if a.speech_end is not None else None
        latency = None if speech_end_wall is None or a.started_wall is None else a.started_wall - speech_end_wall
        if latency is not None:
            self.observer.voice_latency(latency)
        self.host.emit(AnswerStartEvent(a.id, t, a.speech_end, None if latency is None else latency * 1000))

    def phrase_started(self, a: Answer, ph: _Phrase) -> None:
        self._recent.append((a, ph))

    def word_sent(self, a: Answer, w: _Word) -> None:
        base = self.audio_track.rtp_base
        rtp = None
        if base is not None:
            rtp = int(round((w.start - base) * AUDIO_RATE))
            origin = self.rtp_origin()
            if origin is not None:
                rtp = (rtp + origin) & 0xFFFFFFFF
        self.host.emit(AnswerWordEvent(a.id, w.index, w.text, w.start, w.end, rtp))
        self._pending_checks.append((a, w))

    # --- the avatar's mouth -------------------------------------------------------------------------

    def mouth_at(self, t: float) -> Mouth | None:
        """The mouth at session time ``t`` (None: at rest)."""
        mouth_at = self.voice.mouth_at
        if mouth_at is None:
            return None
        for a, ph in reversed(self._recent):
            if a.stopped or ph.start is None:
                continue
            end = ph.start + ph.offset / AUDIO_RATE  # only what was actually handed to the audio track
            if ph.start <= t < end:
                return mouth_at(ph.phones, t - ph.start)
        return None

    def drawn(self, pts: float, mouth: Mouth | None) -> None:
        self._drawn.append((pts, 0.0 if mouth is None else float(mouth.open)))

    # --- Level-3 on the answer ----------------------------------------------------------------------

    def _run_checks(self, now: float) -> None:
        while self._pending_checks:
            a, w = self._pending_checks[0]
            if a.stopped and not w.spoken:
                self._pending_checks.popleft()
                continue
            if w.end + SYNC_AFTER_S > now:
                return
            self._pending_checks.popleft()
            if w.spoken:
                self._check(a, w)

    def _check(self, a: Answer, w: _Word) -> None:
        audio = self._audio_time(a, w)
        video = self._video_time(a, w) if self.avatar_track is not None else None
        times = [x for x in (audio, video, w.start) if x is not None]
        delta = (max(times) - min(times)) * 1000 if len(times) > 1 else math.inf
        ok = audio is not None and (video is not None or self.avatar_track is None) and delta <= SYNC_TOLERANCE_MS
        self.observer.answer_sync_checked(ok)
        self.host.emit(AnswerSyncEvent(a.id, w.index, w.text, audio, video, w.start, delta, ok))

    def _phrase_of(self, a: Answer, w: _Word) -> _Phrase | None:
        for b, ph in self._recent:
            if b is a and ph.words and ph.words[0].index <= w.index <= ph.words[-1].index:
                return ph
        return None

    def _audio_time(self, a: Answer, w: _Word) -> float | None:
        """Where the word's sound lies in the audio actually handed to the track: its onset after
        silence where there is one, else where the word's own sound matches the sent envelope."""
        from alignment.onsets import onset_after_silence

        if self._sent_t0 is None:
            return None
        sent = self._sent_audio[:self._sent_n]
        prev = a.words[w.index - 1].start if w.index > 0 else None
        onset = onset_after_silence(sent + room_noise()[:self._sent_n], self._sent_t0, w.start, prev)
        if onset is not None:
            return onset
        ph = self._phrase_of(a, w)
        if ph is None or ph.start is None:
            return None
        src = ph.source.audio if ph.source.sample_rate == SAMPLE_RATE else resample_16k(ph.source.audio,
                                                                                    ph.source.sample_rate)
        lag = envelope_lag(sent, self._sent_t0, src, ph.start, w.start, w.end)
        return None if lag is None else w.start + lag

    def _video_time(self, a: Answer, w: _Word) -> float | None:
        """When the DRAWN mouth opens for the word: the shift that best fits the mouths drawn on
        the frames around it to the mouth its phones ask for, added to the word's start."""
        ph = self._phrase_of(a, w)
        mouth_at = self.voice.mouth_at
        if ph is None or ph.start is None or mouth_at is None:
            return None
        lo, hi = w.start - MAX_LAG_S, w.end + MAX_LAG_S
        frames = [(pts, o) for pts, o in self._drawn if lo <= pts <= hi]
        if len(frames) < 3:
            return None
        pts = np.array([p for p, _ in frames])
        drawn = np.array([o for _, o in frames])
        if float(np.ptp(drawn)) < 0.05:
            return None
        phones, dur = ph.phones, len(ph.pcm) / AUDIO_RATE
        grid = np.arange(lo - MAX_LAG_S, hi + MAX_LAG_S + 1e-9, 0.005)  # the mouth its phones ask for
        want = np.array([mouth_at(phones, r).open if 0 <= r < dur else 0.0 for r in grid - ph.start])
        lags = np.arange(-MAX_LAG_S, MAX_LAG_S + 1e-9, 0.005)
        costs = np.array([float(np.mean((drawn - np.interp(pts - lag, grid, want)) ** 2)) for lag in lags])
        best = lags[int(np.argmin(np.round(costs, 9) + 1e-6 * np.abs(lags)))]
        return w.start + float(best)


# --- the tracks --------------------------------------------------------------------------------------


class AnswerAudioTrack(MediaStreamTrack):
    """The answer's audio: 48 kHz mono s16, 20 ms frames, pts = session time in samples.

    Its pts never jump (Opus's RTP timestamps count samples, not pts): a late wake-up sends the
    next frame at once, the grid is never skipped.
    """

    kind = "audio"

    def __init__(self, player: AnswerPlayer) -> None:
        super().__init__()
        self.player = player
        self._pace = Paced(player.clock, FRAME_S, skip=False)
        self._silence = np.zeros(FRAME_SAMPLES, np.int16)
        self.rtp_base: float | None = None  # session s of RTP timestamp 0 (before the origin)
        self.handed_until = -math.inf  # session s: the end of the last frame handed on
        self.sent = 0
        self.sent_voice = 0  # frames with answer audio
        self.late = 0.0  # how far behind its schedule the track sends (s), in steps of LATE_STEP_S

    async def recv(self) -> av.AudioFrame:
        t = await self._pace.next(self)
        if self.rtp_base is None:
            self.rtp_base = t
        zero = self.player.clock.zero_wall
        late = max(0.0, time.monotonic() - zero - t) if zero is not None else 0.0
        if abs(late - self.late) > LATE_STEP_S:  # a stall (or the burst catching up after it)
            self.late = late
        pcm = self.player.audio_at(t, t + self.late)
        self.handed_until = t + FRAME_S
        if pcm is not None:
            self.sent_voice += 1
        frame = av.AudioFrame.from_ndarray((self._silence if pcm is None else pcm)[None, :], format="s16",
                                           layout="mono")
        frame.sample_rate = AUDIO_RATE
        frame.pts = int(round(t * AUDIO_RATE))
        frame.time_base = Fraction(1, AUDIO_RATE)
        self.sent += 1
        return frame

    def rtp_of(self, t: float) -> int | None:
        """The encoder's timestamp (before the sender's origin) of session time ``t``."""
        return None if self.rtp_base is None else int(round((t - self.rtp_base) * AUDIO_RATE))


class AvatarTrack(MediaStreamTrack):
    """The avatar: 16 fps, frame k at session time k/16 (90 kHz pts), the mouth of the phone whose
    audio plays at that instant, drawn in the render pool; the idle face is drawn once."""

    kind = "video"

    def __init__(self, player: AnswerPlayer) -> None:
        super().__init__()
        self.player = player
        self._pace = Paced(player.clock, 1.0 / AVATAR_FPS, skip=True)
        self._idle: av.VideoFrame | None = None
        self._resting = False
        self.sent = 0
        self.drawn = 0  # frames drawn with a speaking mouth

    async def recv(self) -> av.VideoFrame:
        from app.live.output import _RENDER_POOL, to_yuv420p

        t = await self._pace.next(self)
        while self._resting and not self.player.answering and round(t * AVATAR_FPS) % IDLE_EVERY:
            t = await self._pace.next(self)  # at rest: the idle face at 1/IDLE_EVERY of the rate
        # The mouth at t follows the audio handed on up to t: the audio frame that covers t is due
        # at the same instant, so wait for it (a few ms) rather than draw a mouth that is not yet heard.
        for _ in range(AUDIO_WAIT_STEPS):
            if self.player.audio_track.handed_until >= t + FRAME_S - 1e-6 or self.readyState != "live":
                break
            await asyncio.sleep(0.005)
        mouth = self.player.mouth_at(t - self.player.config.avatar_shift_s)
        avatar = self.player.voice.avatar
        assert avatar is not None
        if mouth is None:
            if self._idle is None:
                rest = self.player.voice.rest
                image = await asyncio.get_running_loop().run_in_executor(_RENDER_POOL, draw_avatar, avatar, rest)
                self._idle = to_yuv420p(image)
            frame = self._idle
        else:
            image = await asyncio.get_running_loop().run_in_executor(_RENDER_POOL, draw_avatar, avatar, mouth, t)
            frame = to_yuv420p(image)
            self.drawn += 1
        self.player.drawn(t, mouth)
        self._resting = mouth is None
        frame.pts = int(round(t * VIDEO_CLOCK))
        frame.time_base = Fraction(1, VIDEO_CLOCK)
        self.sent += 1
        return frame

    def rtp_of(self, t: float) -> int:
        return int(round(t * VIDEO_CLOCK))


def draw_avatar(avatar: Avatar, mouth: Mouth | None, t: float | None = None) -> np.ndarray:
    if mouth is None:
        from models.visemes import REST

        mouth = REST
    return avatar.draw(mouth, t=t)
