"""Simulated echo scenes for the barge-in tests and bench: rooms, coughs, noise bursts, voices.

A room response is a direct path (bulk delay = network + playout + room, 30-500 ms), a loudspeaker
band-pass, an attenuation and an exponentially decaying reverberant tail (RT60 0.2-0.6 s), drawn
from a seeded RNG. A scene plays the answer (festival slt_hts) from ``answer_pts``, adds its echo
to the mic, and optionally a user's speech or a noise event at a known onset.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.signal import butter, fftconvolve, lfilter

from alignment.types import SAMPLE_RATE

SR = SAMPLE_RATE

#: Sentences and voices are split: tuning used TUNE_*, the reported figures use HELD_*.
TUNE_ANSWERS = (
    "the meeting has been moved to thursday afternoon at three",
    "you can find the report in the shared folder under finance",
    "it will be sunny tomorrow with a light breeze from the west",
)
TUNE_USERS = (("kal_diphone", "wait a moment please"), ("espeak", "stop stop i have a question"))
HELD_ANSWERS = (
    "the train to boston leaves from platform nine every hour on the hour",
    "your package was delivered this morning and left at the front door",
    "i have added the dentist appointment to your calendar for next monday",
    "the recipe needs two cups of flour one egg and a pinch of salt",
)
HELD_USERS = (("ked_diphone", "no that is not what i meant"), ("kal_diphone", "hold on let me check"),
              ("espeak", "sorry can you repeat that"), ("human", "heath_ledger.mp3"))


@dataclass(frozen=True)
class Room:
    delay_s: float
    rt60_s: float
    gain: float  # direct-path amplitude
    h: np.ndarray

    def apply(self, x: np.ndarray) -> np.ndarray:
        return fftconvolve(x, self.h)[: x.size].astype(np.float32)


def make_room(rng: np.random.Generator, delay_s: float | None = None) -> Room:
    """A random echo path: bulk delay, band-pass, attenuation, reverberant tail."""
    delay = float(rng.uniform(0.03, 0.45)) if delay_s is None else delay_s
    rt60 = float(rng.uniform(0.2, 0.6))
    gain = float(10 ** (rng.uniform(-20, -3) / 20))
    n_tail = int(min(rt60 * 1.2, 0.8) * SR)
    t = np.arange(n_tail) / SR
    tail = rng.standard_normal(n_tail) * 10 ** (-3 * t / rt60)
    b, a = butter(2, float(rng.uniform(2500, 6000)) / (SR / 2))
    tail = lfilter(b, a, tail)
    tail *= 10 ** (rng.uniform(-12, -4) / 20) / np.sqrt(np.sum(tail[: SR // 50] ** 2) + 1e-12) * 0.3
    h = np.zeros(int(delay * SR) + n_tail + 8)
    d0 = int(delay * SR)
    h[d0] = 1.0
    early = d0 + 1 + rng.integers(16, 160, size=4)
    h[early] += rng.uniform(-0.4, 0.4, size=4)
    h[d0 + 8 : d0 + 8 + n_tail] += tail
    bh, ah = butter(2, [float(rng.uniform(120, 300)), float(rng.uniform(5000, 7500))], btype="band", fs=SR)
    h = lfilter(bh, ah, h) * gain
    return Room(delay, rt60, gain, h.astype(np.float32))


def noise_event(rng: np.random.Generator, kind: str) -> np.ndarray:
    """A cough-like burst, a click train, a door-slam-like transient or filtered noise."""
    if kind == "cough":
        n = int(rng.uniform(0.15, 0.35) * SR)
        env = np.exp(-np.arange(n) / (0.06 * SR)) * (1 - np.exp(-np.arange(n) / (0.005 * SR)))
        b, a = butter(2, [300, 3500], btype="band", fs=SR)
        x = lfilter(b, a, rng.standard_normal(n)) * env
    elif kind == "click":
        x = np.zeros(int(0.3 * SR))
        for i in rng.integers(0, x.size - 40, size=5):
            x[i : i + 40] += rng.standard_normal(40) * np.hanning(40)
    elif kind == "door":
        n = int(0.5 * SR)
        t = np.arange(n) / SR
        x = rng.standard_normal(n) * np.exp(-t / 0.05) + np.sin(2 * np.pi * 70 * t) * np.exp(-t / 0.12)
        b, a = butter(2, 1500 / (SR / 2))
        x = lfilter(b, a, x)
    else:
        n = int(rng.uniform(0.2, 0.5) * SR)
        lo = float(rng.uniform(200, 2000))
        b, a = butter(2, [lo, lo * 3], btype="band", fs=SR)
        x = lfilter(b, a, rng.standard_normal(n)) * np.hanning(n)
    x = x / (np.max(np.abs(x)) + 1e-12) * float(rng.uniform(0.1, 0.5))
    return x.astype(np.float32)


@lru_cache(maxsize=64)
def voice(name: str, text: str) -> tuple[np.ndarray, float]:
    """Speech samples and the first word's onset (s) for ``name`` in festival / espeak / a human clip."""
    if name == "espeak":
        from alignment.espeak import synthesize_speech

        sp = synthesize_speech(text)
        return sp.samples, sp.words[0].start
    if name == "human":
        import json
        from pathlib import Path

        import gradio

        from app.offline.media_io import decode_media

        rec = decode_media(Path(gradio.__file__).parent / "media_assets" / "audio" / text)
        meta = json.loads((Path(__file__).parent / "data" / "human_onsets.json").read_text())
        clip = next(c for c in meta["clips"] if c["source"].endswith(text))
        onset = clip["words"][0]["onset"]
        return rec.audio[: int((onset + 2.5) * SR)].astype(np.float32), onset
    from app.loadtest.festival import synthesize_festival

    sp = synthesize_festival(text, name)
    return sp.samples, sp.words[0].start


@dataclass(frozen=True)
class Scene:
    played: np.ndarray  # the answer as sent, from answer_pts
    mic: np.ndarray  # from pts 0
    echo: np.ndarray  # the echo part of mic alone
    answer_pts: float
    onset: float | None  # true pts of the user's speech or noise onset
    room: Room
    #: Per 20 ms frame (when it went out, the pts ``played`` is told, 16 kHz samples), where the answer is not
    #: simply played from ``answer_pts`` on: the peer scene's frames as the server sends and stamps them.
    sends: tuple[tuple[float, float, np.ndarray], ...] | None = None


def make_scene(rng: np.random.Generator, answer: str, user: tuple[str, str] | None = None,
               noise: str | None = None, at_s: float | None = None, answer_pts: float = 0.5,
               user_db: float | None = None, echoes: bool = True) -> Scene:
    """The mic of a session hearing ``answer``'s echo and, from ``at_s`` into the answer, a user or a noise.
    ``echoes=False``: no echo comes back (headphones, the browser's own echo cancellation); the answer still
    plays, at the same level."""
    ans, _ = voice("slt_hts", answer)
    ans = ans / (np.max(np.abs(ans)) + 1e-12) * 0.5
    room = make_room(rng)
    total = answer_pts + ans.size / SR + 1.5
    mic = np.zeros(int(total * SR), np.float32)
    a0 = int(answer_pts * SR)
    echo = np.zeros_like(mic)
    echo[a0 : a0 + ans.size] = ans
    echo = room.apply(echo) if echoes else np.zeros_like(mic)
    mic += echo
    mic += rng.standard_normal(mic.size).astype(np.float32) * 10 ** (-65 / 20)
    onset = None
    at = float(rng.uniform(0.8, max(ans.size / SR - 1.0, 1.0))) if at_s is None else at_s
    if user is not None:
        sp, first = voice(*user)
        sp = sp / (np.max(np.abs(sp)) + 1e-12) * 10 ** ((user_db if user_db is not None else rng.uniform(-12, -4)) / 20)
        start = int((answer_pts + at - first) * SR)
        seg = sp[: max(mic.size - start, 0)]
        mic[start : start + seg.size] += seg
        onset = answer_pts + at
    elif noise is not None:
        x = noise_event(rng, noise)
        start = int((answer_pts + at) * SR)
        mic[start : start + x.size] += x[: mic.size - start]
        onset = answer_pts + at
    return Scene(ans.astype(np.float32), mic, echo, answer_pts, onset, room)


def make_peer_scene(rng: np.random.Generator, answer: str, bulk_s: float = 0.1, jitter_s: float = 0.008,
                    room_seed: int = 0, answer_pts: float = 0.5, stall_p: float = 0.0,
                    stall_s: tuple[float, float] = (0.03, 0.2), stamp_sent: bool = False,
                    user: tuple[str, str] | None = None, at_s: float | None = None,
                    user_db: float = 0.0) -> Scene:
    """The load-test peer's echo path (app/loadtest/answers.EchoPath, the room of ``bench/voice.py --seed``):
    each received 20 ms frame arrives after ``bulk_s`` of network, plus a per-frame jitter up to ``jitter_s``, is
    played out by the peer's jitter buffer (EchoPath) and mixed back into the mic through the sparse tap response.
    ``stall_p``: chance per frame that the server's event loop stalls (``stall_s`` long) before sending it: the
    frames due meanwhile go out in a burst at its end. ``played`` is told each frame's scheduled pts, or with
    ``stamp_sent`` the instant it really went out (``Scene.sends``). ``user``: a voice (as ``make_scene``)
    starting ``at_s`` after the answer's first frame reached the peer, its peak ``user_db`` from the answer's."""
    from scipy.signal import resample_poly

    from app.loadtest.answers import EchoPath, RoomResponse

    ans, _ = voice("slt_hts", answer)
    ans = (ans / (np.max(np.abs(ans)) + 1e-12) * 0.5).astype(np.float32)
    room_resp = RoomResponse.seeded(room_seed)
    path = EchoPath(room_resp)
    up = resample_poly(ans, 3, 1).astype(np.float32)
    total = answer_pts + ans.size / SR + 1.5
    n48 = int(total * 48_000) // 960 * 960
    played_at, free_at = [], 0.0
    sends: list[tuple[float, float, np.ndarray]] = []
    for k in range(up.size // 960):
        sched = answer_pts + k * 0.02
        if stall_p and rng.random() < stall_p:
            free_at = max(free_at, sched) + float(rng.uniform(*stall_s))
        sent = max(sched, free_at)
        sends.append((sent, sent if stamp_sent else sched, ans[k * 320 : (k + 1) * 320]))
        played_at.append((sent + bulk_s + float(rng.uniform(0, jitter_s)), up[k * 960 : (k + 1) * 960]))
    played_at.sort(key=lambda p: p[0])
    echo48 = np.zeros(n48, np.float32)
    j = 0
    for f in range(0, n48, 960):
        t = f / 48_000
        while j < len(played_at) and played_at[j][0] <= t:  # frames arrived before this mic frame is sent
            path.played(*played_at[j])
            j += 1
        echo48[f : f + 960] = path.echo(t, 960)
    echo = resample_poly(echo48, 1, 3).astype(np.float32)
    mic = echo + rng.standard_normal(echo.size).astype(np.float32) * 10 ** (-65 / 20)
    d0 = bulk_s + room_resp.taps[0][0]
    onset = None
    if user is not None:
        sp, first = voice(*user)
        sp = sp / (np.max(np.abs(sp)) + 1e-12) * np.max(np.abs(ans)) * 10 ** (user_db / 20)
        onset = answer_pts + bulk_s + (float(rng.uniform(0.5, 1.5)) if at_s is None else at_s)
        start = int((onset - first) * SR)
        seg = sp[max(-start, 0) : max(mic.size - start, 0)]
        mic[max(start, 0) : max(start, 0) + seg.size] += seg.astype(np.float32)
    room = Room(d0, 0.0, room_resp.taps[0][1], np.zeros(1, np.float32))
    return Scene(ans, mic, echo, answer_pts, onset, room, tuple(sends))
