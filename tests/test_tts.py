"""The answer's speech: normalisation, chunking, the rate map, festival's pool, the OpenAI-compatible client.

Real parts throughout: festival's HTS voice (resident processes), PocketSphinx's forced aligner as
the independent measure of word onsets, and an OpenAI-compatible stand-in on loopback that speaks
with espeak-ng, whose word events are exact.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alignment.forced import aligner
from alignment.types import SpokenPhrase, TokenRatePolicy
from app.loadtest.tts_standin import StandInTTS
from models.controller import POLICIES
from models.tts import (
    ANSWER_VOICE,
    FestivalTTS,
    NormalizedWord,
    OpenAITTS,
    PhraseChunker,
    SpeechSynthesizer,
    TTSError,
    make_synthesizer,
    normalize_text,
    speaking_rate_wpm,
)
from models.tts import festival as festival_tts
from models.tts.base import display_words
from models.tts.normalize import bare
from models.tts.rate import FASTEST_WPM, SLOWEST_WPM

needs_festival = pytest.mark.skipif(not festival_tts.available(ANSWER_VOICE), reason="festival HTS voice missing")

#: Festival's word onsets against the forced aligner's on the same audio: most within ±40 ms (the
#: frame tolerance), and the median error well inside it. The aligner's own misses (vowel-to-vowel
#: boundaries, a first word pulled into its padding) make the rest.
ONSET_TOLERANCE_MS = 40.0
ONSET_SHARE = 0.85
ONSET_MEDIAN_MS = 20.0


def spoken(text: str) -> list[tuple[str, tuple[str, ...]]]:
    return [(w.original, w.spoken) for w in normalize_text(text)]


# --- normalisation --------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("42", [("42", ("forty", "two"))]),
    ("It is 3.14.", [("It", ("It",)), ("is", ("is",)), ("3.14.", ("three", "point", "one", "four."))]),
    ("1,000,000", [("1,000,000", ("one", "million"))]),
    ("-7", [("-7", ("minus", "seven"))]),
    ("the 21st", [("the", ("the",)), ("21st", ("twenty", "first"))]),
    ("3rd", [("3rd", ("third",))]),
    ("in 1990", [("in", ("in",)), ("1990", ("nineteen", "ninety"))]),
    ("2005", [("2005", ("two", "thousand", "five"))]),
    ("2024", [("2024", ("twenty", "twenty", "four"))]),
    ("1905", [("1905", ("nineteen", "oh", "five"))]),
    ("45%", [("45%", ("forty", "five", "percent"))]),
    ("$5", [("$5", ("five", "dollars"))]),
    ("$1.01", [("$1.01", ("one", "dollar", "and", "one", "cent"))]),
    ("€2.5m", [("€2.5m", ("two", "point", "five", "million", "euros"))]),
    ("10:30", [("10:30", ("ten", "thirty"))]),
    ("10:05", [("10:05", ("ten", "oh", "five"))]),
    ("7:00", [("7:00", ("seven", "o'clock"))]),
    ("9am", [("9am", ("nine", "A", "M"))]),
    ("1/2", [("1/2", ("one", "half"))]),
    ("Dr. Lee", [("Dr.", ("doctor",)), ("Lee", ("Lee",))]),
    ("Mr. Li", [("Mr.", ("mister",)), ("Li", ("Li",))]),
    ("e.g. this", [("e.g.", ("for", "example")), ("this", ("this",))]),
    ("and so on, etc.", [("and", ("and",)), ("so", ("so",)), ("on,", ("on,",)), ("etc.", ("et", "cetera."))]),
    ("R&D", [("R&D", ("R", "and", "D"))]),
    ("salt & pepper", [("salt", ("salt",)), ("&", ("and",)), ("pepper", ("pepper",))]),
    ("2+2", [("2+2", ("two", "plus", "two"))]),
    ("me@example.com", [("me@example.com", ("me", "at", "example", "dot", "com"))]),
    ("well-known", [("well-known", ("well", "known"))]),
    ("don't", [("don't", ("don't",))]),
    ("café", [("café", ("cafe",))]),
    ("5 km", [("5", ("five",)), ("km", ("kilometers",))]),
    ("No. 5", [("No.", ("number",)), ("5", ("five",))]),
])
def test_normalize_reads_numbers_abbreviations_and_symbols(text, expected):
    assert spoken(text) == expected


def test_normalize_strips_markdown_and_emoji_but_keeps_display_punctuation():
    text = "## Plan\n- **Step one:** see [the docs](https://x.org) 😀👍🏽\n1. `run` it, _then_ rest."
    assert spoken(text) == [
        ("Plan", ("Plan",)), ("Step", ("Step",)), ("one:", ("one:",)), ("see", ("see",)), ("the", ("the",)),
        ("docs", ("docs",)), ("run", ("run",)), ("it,", ("it,",)), ("then", ("then",)), ("rest.", ("rest.",)),
    ]


def test_normalize_gives_nothing_to_say_for_symbols_alone():
    assert spoken("— 😀 …") == [("—", ()), ("…", ())]
    assert normalize_text("") == ()
    with pytest.raises(TypeError):
        normalize_text(42)  # type: ignore[arg-type]


def test_spoken_tokens_are_plain_words_a_synthesizer_cannot_reread():
    text = "At 10:30 on 3/4, 12.5% of $1,200 (R&D) went to Dr. Ng's lab at MIT... 🚀 #1!"
    for w in normalize_text(text):
        for s in w.spoken:
            assert bare(s).replace("'", "").isalpha() and bare(s).isascii(), (w, s)


def test_display_words_span_their_spoken_tokens():
    words = normalize_text("it is 42 now")
    spans = [(0.0, 0.1), (0.1, 0.2), (0.2, 0.4), (0.4, 0.6), None]
    got = display_words(words, spans)
    assert [(w.text, w.start, w.end) for w in got] == [("it", 0.0, 0.1), ("is", 0.1, 0.2), ("42", 0.2, 0.6)]
    with pytest.raises(ValueError):
        display_words(words, spans[:-1])
    assert NormalizedWord("42", ("forty", "two")) == words[2]


# --- chunking -------------------------------------------------------------------------------------


def chunk(pieces: list[str], **kw) -> list[tuple[int, str]]:
    """(index of the piece that completed it, phrase); flushed phrases get index len(pieces)."""
    c = PhraseChunker(**kw)
    out = [(i, p) for i, piece in enumerate(pieces) for p in c.feed(piece)]
    return out + [(len(pieces), p) for p in c.flush()]


def test_chunker_cuts_at_sentence_ends_and_never_inside_a_word():
    pieces = ["Hello", ".", " The", " synchron", "y", " of", " lips", " and", " speech", " is", " hard", ".",
              " Yes", "!"]
    assert [p for _, p in chunk(pieces)] == ["Hello.", "The synchrony of lips and speech is hard.", "Yes!"]


def test_chunker_emits_the_first_phrase_early():
    pieces = ["Well", ",", " the", " answer", " depends", " on", " a", " few", " things", " you", " said"]
    got = chunk(pieces)
    # "Well, the answer ..." has 1 word at its comma: too short; the first phrase is cut at 6 words,
    # as soon as the 7th word begins, long before the text ends.
    assert got[0] == (7, "Well, the answer depends on a")
    assert [p for _, p in got][1:] == ["few things you said"]


def test_chunker_cuts_at_clauses_once_long_enough():
    text = "First of all, we check. Then, if it fits, we go on to see what else, if anything, is needed"
    got = [p for _, p in chunk([" " + w for w in text.split()])]
    assert got == ["First of all,", "we check.", "Then, if it fits,", "we go on to see what else,",
                   "if anything, is needed"]


def test_chunker_knows_abbreviations_decimals_and_list_numbers():
    pieces = ["Dr", ".", " Smith", " said", " 3", ".", "5", " percent", " e", ".", "g", ".", " here", ".", "\n",
              "1", ".", " Next", " item", "."]
    got = [p for _, p in chunk(pieces, first_max_words=20)]
    assert got == ["Dr. Smith said 3.5 percent e.g. here.", "1. Next item."]


def test_chunker_cuts_long_clauses_at_max_words():
    words = [f" w{i}" for i in range(40)]
    got = [p for _, p in chunk(words, max_words=10, first_max_words=4)]
    assert [len(p.split()) for p in got] == [4, 10, 10, 10, 6]


def test_chunker_rejects_bad_input():
    with pytest.raises(TypeError):
        PhraseChunker().feed(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PhraseChunker(max_words=0)
    assert PhraseChunker().flush() == []


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_chunker_keeps_every_word_whole_however_the_text_is_split(data):
    text = data.draw(st.sampled_from([
        "Sure, I can help. The meeting is at 10:30, e.g. tomorrow! Is that ok? Thanks",
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen",
        "Hmm... well; it depends: on this, that, and the other thing.\n\n- a list item\n- another one",
    ]))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(text) - 1), max_size=30)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    phrases = [p for _, p in chunk(pieces)]
    assert " ".join(phrases).split() == text.split()
    assert all(p == p.strip() and p for p in phrases)


# --- speaking rate --------------------------------------------------------------------------------


def test_speaking_rate_is_monotone_in_load_within_the_documented_range():
    rates = [speaking_rate_wpm(p) for p in POLICIES]
    assert rates == sorted(rates, reverse=True)
    assert rates[0] == FASTEST_WPM == 175.0 and rates[-1] == SLOWEST_WPM == 125.0
    assert speaking_rate_wpm(TokenRatePolicy(100.0, 10, 0.5)) == FASTEST_WPM
    assert speaking_rate_wpm(TokenRatePolicy(0.5, 10, 0.5)) == SLOWEST_WPM
    with pytest.raises(ValueError):
        speaking_rate_wpm(TokenRatePolicy(0.0, 10, 0.5))


# --- festival -------------------------------------------------------------------------------------


@pytest.fixture
async def festival():
    tts = FestivalTTS()
    yield tts
    await tts.aclose()


def check_times(phrase: SpokenPhrase) -> None:
    """Words and phones monotone, inside the audio; phones tile it without gaps."""
    duration = phrase.duration
    assert phrase.words and phrase.phones
    for seq in (phrase.words, phrase.phones):
        for a, b in zip(seq, seq[1:], strict=False):
            assert a.start <= a.end <= b.start + 1e-9 and a.start <= b.start
        assert 0.0 <= seq[0].start and seq[-1].end <= duration + 1e-6
    for a, b in zip(phrase.phones, phrase.phones[1:], strict=False):
        assert abs(a.end - b.start) < 1e-6
    starts = [p.start for p in phrase.phones]
    for w in phrase.words:  # every word starts on a phone boundary
        assert min(abs(w.start - s) for s in starts) < 1e-6


@needs_festival
async def test_festival_speaks_display_words_with_word_and_phone_times(festival):
    text = "Hello world, it is 42 degrees at 10:30. 😀"
    phrase = await festival.synthesize(text, 160.0)
    assert isinstance(festival, SpeechSynthesizer)
    assert phrase.text == text and phrase.sample_rate == 16000 and phrase.audio.dtype == np.float32
    assert [w.text for w in phrase.words] == ["Hello", "world,", "it", "is", "42", "degrees", "at", "10:30."]
    check_times(phrase)
    assert {p.phone for p in phrase.phones} >= {"pau", "hh", "f", "ao", "r", "t", "iy"}
    # "42" spans "forty two": f ao r t iy t uw, and no other word's phones.
    w42 = phrase.words[4]
    inside = [p.phone for p in phrase.phones if w42.start - 1e-6 <= p.start and p.end <= w42.end + 1e-6]
    assert inside == ["f", "ao", "r", "t", "iy", "t", "uw"]
    # Speech where the words are, near-silence before the first one.
    lead = phrase.audio[: int(phrase.words[0].start * 16000)]
    assert np.abs(lead).max(initial=0.0) < 0.05 < np.abs(phrase.audio).max()


@needs_festival
async def test_festival_onsets_agree_with_the_forced_aligner(festival):
    errors = []
    for text in ("Your order of 3 books will cost $42.50 including shipping.",
                 "Turn left at the next corner, then walk straight for two blocks.",
                 "The museum opened in 1995 and now has over two million visitors a year."):
        for wpm in (175.0, 125.0):
            phrase = await festival.synthesize(text, wpm)
            words = normalize_text(text)
            found = aligner().align(phrase.audio, [bare(s) for w in words for s in w.spoken])
            assert found is not None
            ref = display_words(words, [None if a is None else (a.start, a.end) for a in found])
            assert [w.text for w in ref] == [w.text for w in phrase.words]
            errors += [abs(a.start - b.start) * 1000.0 for a, b in zip(phrase.words, ref, strict=True)]
    errors_ms = np.array(errors)
    assert np.mean(errors_ms <= ONSET_TOLERANCE_MS) >= ONSET_SHARE, errors_ms.round()
    assert np.median(errors_ms) <= ONSET_MEDIAN_MS


@needs_festival
async def test_festival_speaks_at_the_asked_rate(festival):
    text = "Please remember to bring your passport and your ticket to the station."
    fast = await festival.synthesize(text, 175.0)
    slow = await festival.synthesize(text, 125.0)
    n = sum(len(w.spoken) for w in normalize_text(text))
    for phrase, wpm in ((fast, 175.0), (slow, 125.0)):
        heard = n / (phrase.words[-1].end - phrase.words[0].start) * 60.0
        assert heard == pytest.approx(wpm, rel=0.15)
    assert slow.duration > fast.duration * 1.2


@needs_festival
async def test_festival_restarts_a_killed_process():
    tts = FestivalTTS(processes=1)
    try:
        first = await tts.synthesize("The first phrase.", 160.0)
        (pid,) = tts.pids
        os.kill(pid, signal.SIGKILL)
        second = await tts.synthesize("The next phrase still comes.", 160.0)
        assert [w.text for w in second.words] == ["The", "next", "phrase", "still", "comes."]
        assert tts.pids != (pid,) and tts.restarts == 1
        assert first.words and second.duration > 1.0
    finally:
        await tts.aclose()
    assert tts.pids == ()


@needs_festival
async def test_festival_phrase_survives_its_process_dying_midway():
    tts = FestivalTTS(processes=1)
    try:
        await tts.synthesize("Warm.", 160.0)
        (pid,) = tts.pids
        text = "This phrase is long enough that its process is killed while it is being spoken. " * 3
        task = asyncio.create_task(tts.synthesize(text, 160.0))
        await asyncio.sleep(0.03)
        os.kill(pid, signal.SIGKILL)
        phrase = await task
        assert [w.text for w in phrase.words] == text.split() and tts.restarts == 1
        check_times(phrase)
    finally:
        await tts.aclose()


@needs_festival
async def test_festival_times_out_then_serves_the_next_phrase():
    tts = FestivalTTS(processes=1, timeout_s=0.01)
    try:
        await tts.synthesize("warm", 160.0)  # the voice loads outside the request's deadline
    except TTSError:
        pass
    try:
        with pytest.raises(TTSError, match="timed out"):
            await tts.synthesize("A phrase far too long to speak in ten milliseconds, " * 4, 160.0)
        tts.timeout_s = 10.0
        phrase = await tts.synthesize("Back again.", 160.0)
        assert [w.text for w in phrase.words] == ["Back", "again."]
    finally:
        await tts.aclose()


@needs_festival
async def test_festival_pool_serves_concurrent_sessions(festival):
    texts = [f"Session {i} asked about item number {i * 7}." for i in range(6)]
    random.Random(3).shuffle(texts)
    await festival.warm()
    phrases = await asyncio.gather(*(festival.synthesize(t, 150.0 + 5 * i) for i, t in enumerate(texts)))
    for text, phrase in zip(texts, phrases, strict=True):
        assert phrase.text == text
        assert [w.text for w in phrase.words] == text.split()
        check_times(phrase)
    assert len(festival.pids) == 2 and festival.restarts == 0 and festival.cpu_seconds() > 0


@needs_festival
async def test_festival_bad_input_is_a_clear_error(festival):
    empty = await festival.synthesize("😀 —", 160.0)
    assert empty.words == () and empty.duration == 0.0
    with pytest.raises(ValueError, match="wpm"):
        await festival.synthesize("hello", -1.0)
    with pytest.raises(TTSError, match="too long"):
        await festival.synthesize("word " * 1000, 160.0)
    quoted = await festival.synthesize('He said "hi\\" (loudly) ;-)', 160.0)
    assert [w.text for w in quoted.words] == ["He", "said", '"hi\\"', "(loudly)"]
    with pytest.raises(ValueError):
        FestivalTTS(voice="nobody")


# --- an OpenAI-compatible endpoint ----------------------------------------------------------------


@pytest.fixture
async def standin():
    server = await StandInTTS().start()
    yield server
    await server.stop()


async def test_openai_tts_times_words_by_forced_alignment(standin):
    tts = OpenAITTS(standin.base_url)
    await tts.warm()
    text = "Please send the report to my office before noon, thank you."
    phrase = await tts.synthesize(text, 160.0)
    assert [w.text for w in phrase.words] == text.split()
    check_times(phrase)
    truth = standin.last_truth  # espeak-ng's exact onsets: the aligner never saw this voice's timing
    assert [t.text for t in truth] == [w.text.strip(",.") for w in phrase.words]
    errors_ms = np.array([abs(w.start - t.start) * 1000.0 for w, t in zip(phrase.words, truth, strict=True)])
    assert np.mean(errors_ms <= ONSET_TOLERANCE_MS) >= ONSET_SHARE, errors_ms.round()
    assert {"p", "l", "iy", "s", "n", "uw"} <= {p.phone for p in phrase.phones}
    await tts.aclose()


async def test_openai_tts_maps_numbers_to_display_words(standin):
    phrase = await OpenAITTS(standin.base_url).synthesize("It costs $5 at 10:30.", 160.0)
    assert [w.text for w in phrase.words] == ["It", "costs", "$5", "at", "10:30."]
    check_times(phrase)


@pytest.mark.parametrize(("mode", "message"), [
    ("slow", "timed out"), ("garbage", "not audio"), ("error", "HTTP 500"),
])
async def test_openai_tts_failures_are_tts_errors(mode, message):
    server = await StandInTTS(mode=mode, delay_s=5.0).start()
    try:
        tts = OpenAITTS(server.base_url, timeout_s=0.5)
        with pytest.raises(TTSError, match=message) as info:
            await tts.synthesize("Hello there.", 160.0)
        assert server.base_url in str(info.value)
    finally:
        await server.stop()


async def test_openai_tts_down_is_a_tts_error():
    server = await StandInTTS().start()
    url = server.base_url
    await server.stop()
    with pytest.raises(TTSError, match="unreachable"):
        await OpenAITTS(url, timeout_s=2.0).synthesize("Hello there.", 160.0)


def test_make_synthesizer_by_name():
    tts = make_synthesizer("openai", base_url="http://127.0.0.1:9/v1", voice="nova")
    assert isinstance(tts, OpenAITTS) and tts.name == "openai" and tts.voice == "nova"
    with pytest.raises(ValueError, match="base_url"):
        make_synthesizer("openai")
    with pytest.raises(ValueError, match="unknown synthesizer"):
        make_synthesizer("nope")
    if festival_tts.available(ANSWER_VOICE):
        fest = make_synthesizer("festival", processes=1)
        assert isinstance(fest, FestivalTTS) and fest.name == "festival"
        asyncio.run(fest.aclose())
