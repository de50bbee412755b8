"""Placing live tokens on output frames: on time, late (frames already sent), and revisions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from alignment.frames import TOLERANCE_S, TokenFrames, frame_pts, frames_for_time, place_token
from alignment.types import WordToken


def word(text: str, start: float) -> WordToken:
    return WordToken(text, start, start + 0.3, final=False)


def live(tok: WordToken, prev: WordToken | None, prev_frames: tuple[int, ...],
         next_frame: int) -> tuple[tuple[int, ...], bool]:
    """``place_token`` live: frames before ``next_frame`` were sent; ``prev`` shown on ``prev_frames``."""
    placed = place_token(tok, next_frame, TokenFrames(prev, prev_frames) if prev is not None else None)
    return placed.frames, placed.late


def test_on_time_token_gets_its_ideal_frames():
    tok = word("hello", 1.0)  # frame 16 exactly
    frames, late = live(tok, None, (), next_frame=10)
    assert frames == frames_for_time(1.0) == (16,)
    assert not late


def test_token_after_its_frames_went_out_is_drawn_on_the_next_frame():
    tok = word("late", 1.0)
    frames, late = live(tok, None, (), next_frame=20)
    assert frames == (20,) and late


def test_half_sent_pair_keeps_the_frame_still_to_come():
    tok = word("edge", 1.03)  # frames 16 and 17 are both within 40 ms
    assert frames_for_time(1.03) == (16, 17)
    frames, late = live(tok, None, (), next_frame=17)
    assert frames == (17,) and late
    assert abs(frame_pts(17) - tok.start) <= TOLERANCE_S


def test_revision_of_a_word_on_screen_keeps_its_frames_but_a_new_word_moves():
    first = word("quick", 1.0)
    final = WordToken("quick", 1.02, 1.3, final=True)
    assert live(final, first, (16,), next_frame=30) == ((16,), False)
    changed = WordToken("quack", 1.02, 1.3, final=True)
    frames, late = live(changed, first, (16,), next_frame=30)
    assert frames == (30,) and late


def test_revision_shown_far_from_its_start_is_placed_anew():
    """An interim put ``you`` at 4.109 s (a repeated sentence at one instant); its final starts at
    5.3765 s: kept there, the final would be drawn 1.25 s early and fail Level-3."""
    interim = word("you", 4.109)
    final = WordToken("you", 5.3765, 5.48, final=True)
    frames, late = live(final, interim, frames_for_time(4.109), next_frame=69)
    assert frames == frames_for_time(5.3765) and not late
    sent = live(final, interim, frames_for_time(4.109), next_frame=90)  # its own frames went out too
    assert sent == ((90,), True)


@given(start=st.floats(0.0, 60.0), next_frame=st.integers(0, 1200))
def test_frames_are_never_in_the_past_and_late_means_missed(start, next_frame):
    frames, late = live(word("w", start), None, (), next_frame)
    assert frames and all(k >= next_frame for k in frames)
    ideal = frames_for_time(start)
    assert late == (frames[0] != ideal[0])
    if not late:
        assert all(abs(frame_pts(k) - start) <= TOLERANCE_S + 1e-9 for k in frames)


# --- wire events: the exact objects (keys, key order, rounding) docs/WIRE.md promises -------------


def _keys_and_values(event: object) -> list[tuple[str, object]]:
    return list(event.to_wire().items())  # type: ignore[attr-defined]


def test_token_event_is_the_wire_object():
    from app.live.events import TokenEvent

    tok = WordToken("hello", 1.234567, 1.5, final=True, utterance=2, index=3)
    placed = place_token(tok, 10)
    assert _keys_and_values(TokenEvent(placed)) == [
        ("type", "token"), ("text", "hello"), ("start", 1.2346), ("end", 1.5), ("final", True), ("frames", [20]),
        ("utterance", 2), ("index", 3), ("late", False)]


def test_au_load_hello_error_events_are_the_wire_objects():
    from alignment.types import AU_NAMES, AUSample, LoadEstimate, TokenRatePolicy
    from app.live.events import AUEvent, ErrorEvent, HelloEvent, LoadEvent
    from app.live.stages import Stage

    sample = AUSample(0.123456, tuple(0.123456 for _ in AU_NAMES), True)
    assert _keys_and_values(AUEvent(sample)) == [("type", "au"), ("pts", 0.1235), ("au", sample.as_dict()),
                                                 ("face", True)]
    est = LoadEstimate(2.00004, 1, (0.111111, 0.5, 0.2, 0.188889), TokenRatePolicy(8.12345, 128, 0.61234))
    assert _keys_and_values(LoadEvent(est)) == [
        ("type", "load"), ("pts", 2.0), ("level", 1), ("probs", [0.1111, 0.5, 0.2, 0.1889]),
        ("policy", {"tokens_per_s": 8.123, "max_tokens": 128, "temperature": 0.612})]
    hello = HelloEvent("s1", 16, 1.5, (Stage.VIDEO, Stage.TOKEN, Stage.AU), {"lst": "disabled by configuration"})
    assert _keys_and_values(hello) == [
        ("type", "hello"), ("session", "s1"), ("version", 2), ("fps", 16), ("output_delay_s", 1.5),
        ("stages", ["au", "token", "video"]), ("missing", {"lst": "disabled by configuration"}),
        ("answer", {"audio": False, "video": False, "voice": ""})]
    assert _keys_and_values(ErrorEvent(Stage.RENDER, "RuntimeError: boom")) == [
        ("type", "error"), ("stage", "render"), ("message", "RuntimeError: boom"), ("fatal", False)]
    assert type(ErrorEvent(Stage.RENDER, "x").to_wire()["stage"]) is str


def test_response_and_lst_events_are_the_wire_objects():
    from alignment.lst import TokenTiming
    from app.live.events import LSTEvent, ResponseEvent

    first = ResponseEvent(1, 0, "Hi", 123.456789, TokenTiming(ttft_s=0.0123456, turn_s=0.2))
    assert _keys_and_values(first) == [("type", "response"), ("utterance", 1), ("index", 0), ("text", "Hi"),
                                       ("ms_after_utterance", 123.5), ("ttft_ms", 12.346), ("turn_ms", 200.0)]
    later = ResponseEvent(1, 1, "there", 200.04, TokenTiming(itl_s=0.05))
    assert list(later.to_wire())[-1] == "itl_ms"
    assert "itl_ms" not in ResponseEvent(1, 1, "x", 1.0).to_wire()
    assert _keys_and_values(LSTEvent({"lst_version": 2, "tier": "gold"})) == [
        ("type", "lst"), ("lst_version", 2), ("tier", "gold")]


def test_session_holds_no_token_callback():
    """A word flows one way: the words stage places, shows and emits it and hands it on; the session
    only builds the stages, each with the next ones it feeds (nothing wired afterwards)."""
    import ast
    import inspect

    from app.live import session
    from app.live.au import FaceAnalysis

    tree = ast.parse(inspect.getsource(session))
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    called = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert not {"_on_token", "_on_utterance_end", "_set_policy"} & defined
    assert not {"place", "show", "heard", "utterance_end", "check", "set_load"} & called
    assert "TokenEvent" not in inspect.getsource(session)
    assigned = {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets  # on another object
                if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self")}
    assert not {a for a in assigned if a.startswith("on_")}
    assert not [a for a in inspect.signature(FaceAnalysis).parameters if a.startswith("on_")]
    assert not hasattr(session.Session, "_latest_load")


def test_transcript_places_shows_and_emits_its_tokens():
    import asyncio

    from alignment.clock import SessionClock
    from app.live import tracing
    from app.live.answer_lst import ConversationTrace
    from app.live.observe import MetricsObserver
    from app.live.server_metrics import ServerMetrics
    from app.live.words import ShownWords, Transcript
    from models.asr import UtteranceEnd

    class Host:
        id, degraded = "t", {}

        def __init__(self) -> None:
            self.events: list[object] = []

        def emit(self, event: object) -> bool:
            self.events.append(event)
            return True

    class Stream:
        def push(self, chunk: object) -> None: ...
        def close(self) -> None: ...

        async def events(self):  # noqa: ANN202
            yield WordToken("hello", 1.0, 1.3, final=True, utterance=0, index=0)
            yield UtteranceEnd(1.6, 0, "hello")

    class Output:
        next_index = 0

    host, shown = Host(), ShownWords()
    words = Transcript(host, Stream(), shown, Output(), SessionClock(), MetricsObserver(ServerMetrics()),  # type: ignore[arg-type]
                       ConversationTrace(tracing.NO_SPAN))
    asyncio.run(words.run())
    [event] = host.events
    assert event.type == "token" and event.placed.frames == (16,)  # type: ignore[attr-defined]
    assert shown.new_words(16)[0].text == "hello" and shown.held() == (1, 0)
