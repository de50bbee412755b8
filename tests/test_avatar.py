"""The answer's avatar: festival phones → visemes → mouth shapes → drawn frames, checked on the pixels.

Festival is real (the answer voice, cmu_us_slt_arctic_hts); the mouth is measured on the drawn frames
by a pixel count written here, independent of the renderer's geometry (dark pixels in the lower
middle of the frame), and compared with the utterance's own audio envelope.
"""

from __future__ import annotations

import subprocess
import tempfile
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from alignment.types import SpokenPhone
from app.loadtest import festival
from models.avatar import AvatarRenderer, blink_at, drawn_mouth_open
from models.visemes import BLEND_S, PHONE_VISEME, REST, VISEMES, MouthShape, mouth_at, timeline, viseme_of

FPS = 16
needs_festival = pytest.mark.skipif(not festival.available("slt_hts"), reason="festival slt_hts not installed")

_PHONES_SCM = """(voice_cmu_us_slt_arctic_hts)
(Parameter.set 'Duration_Stretch 1)
(set! utt (utt.synth (Utterance Text "{text}")))
(utt.save.wave utt "{wav}" 'riff)
(mapcar (lambda (s) (format t "PHONE\\t%s\\t%f\\t%f\\n"
                           (item.name s) (item.feat s "segment_start") (item.feat s "end")))
  (utt.relation.items utt 'Segment))
(mapcar (lambda (p) (format t "SET\\t%s\\n" (car p))) (car (cdr (car (PhoneSet.description '(phones))))))
"""


def _say(text: str) -> tuple[np.ndarray, int, list[SpokenPhone], list[str]]:
    """Festival's answer voice: audio, its rate, every phone with its times, and the voice's phone set."""
    with tempfile.TemporaryDirectory(prefix="avatar-") as tmp:
        wav, scm = Path(tmp) / "say.wav", Path(tmp) / "say.scm"
        scm.write_text(_PHONES_SCM.format(text=text, wav=wav))
        out = subprocess.run(["festival", "--batch", str(scm)], capture_output=True, text=True, check=True,
                             timeout=120).stdout
        with wave.open(str(wav), "rb") as fh:
            rate = fh.getframerate()
            pcm = np.frombuffer(fh.readframes(fh.getnframes()), dtype=np.int16)
    rows = [line.split("\t") for line in out.splitlines()]
    phones = [SpokenPhone(r[1], float(r[2]), float(r[3])) for r in rows if r[0] == "PHONE" and len(r) == 4]
    phone_set = [r[1] for r in rows if r[0] == "SET" and len(r) == 2]
    return pcm.astype(np.float32) / 32768.0, rate, phones, phone_set


@pytest.fixture(scope="module")
def utterance():
    return _say("Maybe we could meet by the lake on Monday, about five o'clock, if the weather is fine.")


def _dark_area(frame: np.ndarray) -> int:
    """The test's own mouth measure: dark pixels (luma < 50) in the lower middle of the face area."""
    h, w = frame.shape[:2]
    region = frame[int(0.45 * h):int(0.80 * h), int(0.30 * w):int(0.70 * w)].astype(np.float32)
    luma = region @ np.array([0.299, 0.587, 0.114], np.float32)
    return int(np.count_nonzero(luma < 50))


def _ph(*spec: tuple[str, float]) -> list[SpokenPhone]:
    """Phones back to back from (phone, duration) pairs, starting at 0."""
    out, t = [], 0.0
    for phone, dur in spec:
        out.append(SpokenPhone(phone, t, t + dur))
        t += dur
    return out


# --- the table ------------------------------------------------------------------------------------

@needs_festival
def test_every_phone_the_voice_emits_has_a_viseme(utterance):
    """The voice's whole phone set (asked of festival) and every phone of a real utterance map."""
    _, _, phones, phone_set = utterance
    assert len(phone_set) > 40 and "pau" in phone_set
    for phone in set(phone_set) | {p.phone for p in phones}:
        assert viseme_of(phone) in VISEMES
    assert set(PHONE_VISEME.values()) <= set(VISEMES)


def test_unknown_phone_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown festival phone 'qq'"):
        viseme_of("qq")
    with pytest.raises(ValueError, match="time order"):
        timeline([SpokenPhone("aa", 0.2, 0.3), SpokenPhone("m", 0.0, 0.1)])
    with pytest.raises(ValueError, match="open must be in"):
        MouthShape(1.5, 0.5, 0.5)


def test_bilabials_close_the_mouth():
    phones = _ph(("aa", 0.2), ("m", 0.08), ("aa", 0.2), ("b", 0.06), ("iy", 0.2), ("p", 0.07), ("ow", 0.2))
    for closure in (p for p in phones if p.phone in ("m", "b", "p")):
        for x in (0.01, 0.5, 0.99):  # all through the closure, its end included (no early release)
            assert mouth_at(phones, closure.start + x * (closure.end - closure.start)).open == 0.0
    r = AvatarRenderer()
    m = phones[1]
    assert _dark_area(r.draw(mouth_at(phones, (m.start + m.end) / 2))) == 0
    assert _dark_area(r.draw(mouth_at(phones, 0.1))) > 200


def test_a_short_closure_between_two_frames_still_shuts_one():
    """A 30 ms 'p' between frames 4 and 5 (0.25 s, 0.3125 s) is missed by point sampling, not per frame."""
    phones = _ph(("aa", 0.26), ("p", 0.03), ("aa", 0.3))
    assert all(mouth_at(phones, k / FPS).open > 0 for k in range(2, 8))
    shut = [k for k in range(2, 8) if mouth_at(phones, k / FPS, frame_s=1 / FPS).open == 0.0]
    assert shut == [4] or shut == [5]


def test_open_vowels_open_the_mouth_more_than_closed_ones():
    r = AvatarRenderer()
    open_, closed = ("aa", "ae", "ao", "aw", "ay"), ("iy", "ih", "uw", "uh")
    area = {v: _dark_area(r.draw(mouth_at(_ph((v, 0.3)), 0.1))) for v in open_ + closed}
    shape = {v: mouth_at(_ph((v, 0.3)), 0.1).open for v in open_ + closed}
    assert min(shape[v] for v in open_) > max(shape[v] for v in closed)
    assert min(area[v] for v in open_) > 1.25 * max(area[v] for v in closed), area


def test_coarticulation_blends_into_the_next_phone_and_rests_in_silence():
    phones = _ph(("pau", 0.2), ("aa", 0.2), ("m", 0.1), ("pau", 0.3))
    aa = phones[1]
    held = mouth_at(phones, aa.start + 0.01)
    assert held == VISEMES["aa"] and mouth_at(phones, aa.end - BLEND_S - 0.001) == held
    closing = [mouth_at(phones, aa.end - BLEND_S + f * BLEND_S).open for f in (0.25, 0.5, 0.75)]
    assert held.open > closing[0] > closing[1] > closing[2] > 0.0  # the lips move towards the 'm'
    assert mouth_at(phones, 0.05) == REST and mouth_at(phones, 0.75) == REST  # silence, and after the phrase
    assert mouth_at(phones, -1.0) == REST and mouth_at([], 0.3) == REST
    assert 0.0 < mouth_at(phones, aa.start - 0.01).open < held.open  # opening just before speech
    ay = _ph(("ay", 0.3))
    assert mouth_at(ay, 0.05) == VISEMES["aa"] and mouth_at(ay, 0.26).width > VISEMES["aa"].width  # a → i


# --- the drawing ----------------------------------------------------------------------------------

def test_frames_have_the_size_and_type_asked_for():
    for size in ((320, 240), (640, 360), (96, 64)):
        frame = AvatarRenderer(size).draw(VISEMES["aa"], ("hello", "there"), 1, t=0.5)
        assert frame.shape == (size[1], size[0], 3) and frame.dtype == np.uint8 and frame.flags.writeable
    for bad in ((321, 240), (32, 24), ("a", 2), 5):
        with pytest.raises(ValueError):
            AvatarRenderer(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="MouthShape"):
        AvatarRenderer().draw("aa")  # type: ignore[arg-type]


def test_draw_is_deterministic_and_thread_safe():
    r = AvatarRenderer()
    shapes = [mouth_at(_ph(("aa", 0.2), ("m", 0.1), ("uw", 0.2)), k / FPS) for k in range(8)]
    args = [(s, ("one", "two", "three"), k % 3, k / FPS) for k, s in enumerate(shapes)]
    serial = [r.draw(s, c, h, t=t) for s, c, h, t in args]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda a: r.draw(a[0], a[1], a[2], t=a[3]), args * 4))
    for k, frame in enumerate(parallel):
        assert np.array_equal(frame, serial[k % len(args)])
    assert np.array_equal(AvatarRenderer().draw(shapes[3], t=9.0), r.draw(shapes[3], t=9.0))


def test_nothing_but_the_blink_depends_on_time():
    """No timecode, flash or other marker: outside a blink, frames at different times are identical."""
    r = AvatarRenderer()
    times = [k / FPS for k in range(16 * 20)]
    awake = [t for t in times if blink_at(t) == 1.0]
    blinks = [t for t in times if blink_at(t) < 0.5]
    assert len(awake) > 0.9 * len(times) and 4 <= len(blinks) <= 20  # about one blink every 3.6 s
    base = r.draw(REST, t=awake[0])
    assert all(np.array_equal(r.draw(REST, t=t), base) for t in awake[1::37])
    assert not np.array_equal(r.draw(REST, t=blinks[0]), base)
    assert np.array_equal(r.draw(REST, t=None), base)


def test_caption_highlight_is_drawn_in_the_caption_row_only():
    r = AvatarRenderer()
    words = ("the", "lake", "on", "monday")
    plain, one, two = r.draw(REST, words), r.draw(REST, words, 1), r.draw(REST, words, 2)
    row = int(0.85 * 240)
    assert not np.array_equal(one, two) and not np.array_equal(plain, one)
    assert np.array_equal(one[:row], two[:row]) and np.array_equal(plain[:row], r.draw(REST)[:row])
    long = tuple(f"word{i}" for i in range(40))
    assert r.draw(REST, long, 39).shape == (240, 320, 3)  # too long for the row: the words up to 39 fit
    assert r.draw(REST, ("café", "naïve", "日本"), 2).shape == (240, 320, 3)


def test_drawn_mouth_open_reads_the_renderer_mouth():
    r = AvatarRenderer((640, 360))
    values = [drawn_mouth_open(r.draw(MouthShape(o, 0.5, 0.1)), r.mouth_box()) for o in (0.0, 0.3, 0.6, 0.9)]
    assert values[0] == 0.0 and values == sorted(values) and values[-1] > 0.2
    with pytest.raises(ValueError, match="outside"):
        drawn_mouth_open(r.draw(REST), (1000, 1000, 1100, 1100))


# --- a real utterance: the drawn mouth moves with the voice ---------------------------------------

def _envelope(audio: np.ndarray, rate: int, t: float, half_s: float = 0.025) -> float:
    c, half = int(round(t * rate)), int(half_s * rate)
    seg = audio[max(c - half, 0):max(c + half, 0)]
    return float(np.sqrt(np.mean(seg * seg))) if seg.size else 0.0


@needs_festival
def test_drawn_mouth_follows_the_audio_envelope_at_zero_lag(utterance):
    """16 fps frames of a festival utterance: the dark mouth area, measured on the pixels, correlates
    with the audio's RMS envelope best at zero lag (not at ±120 ms, not with the frames shifted)."""
    audio, rate, phones, _ = utterance
    tl = timeline(phones)
    r = AvatarRenderer((320, 240))
    n = int(len(audio) / rate * FPS)
    area = np.array([_dark_area(r.draw(mouth_at(tl, k / FPS, frame_s=1 / FPS), t=k / FPS)) for k in range(n)],
                    np.float64)
    assert area.max() > 0 and (area == 0).mean() > 0.1  # opens, and closes (pauses, closures)

    def corr(lag: float) -> float:
        env = np.array([_envelope(audio, rate, k / FPS + lag) for k in range(n)])
        return float(np.corrcoef(area, env)[0, 1])

    at = {lag: corr(lag) for lag in (-0.12, 0.0, 0.12)}
    print("mouth area vs envelope, r by lag:", {k: round(v, 3) for k, v in at.items()})
    assert at[0.0] > 0.3, at
    assert at[0.0] > at[-0.12] + 0.1 and at[0.0] > at[0.12] + 0.1, at
