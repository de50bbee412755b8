"""OpenTelemetry traces: off (and the SDK never imported) without OTEL_*; on, a conversation's
spans reach a real OTLP/HTTP receiver on loopback that decodes the protobuf; a collector that is
down costs dropped spans only."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from alignment.types import AnswerEnd, TokenRatePolicy
from app.live import tracing
from app.live.answer_lst import ConversationTrace, MeteredAnswer
from app.loadtest.llm_standin import StandInLLM
from models.responders import OpenAIResponder
from tests.live_fixtures import live_stages  # noqa: F401 - pytest fixture

WHIP_TRACE = "0af7651916cd43dd8448eb211c80319c"
WHIP_PARENT = f"00-{WHIP_TRACE}-b7ad6b7169203331-01"


class Collector:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf ExportTraceServiceRequest in."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.spans: list = []
        self.content_types: list[str] = []
        pb = trace_service_pb2
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.content_types.append(self.headers.get("Content-Type", ""))
                req = pb.ExportTraceServiceRequest()
                req.ParseFromString(body)
                for rs in req.resource_spans:
                    service = {a.key: a.value.string_value for a in rs.resource.attributes}.get("service.name")
                    for ss in rs.scope_spans:
                        outer.spans += [(service, s) for s in ss.spans]
                data = pb.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = (v.string_value or v.int_value or v.double_value or v.bool_value
                      or [x.string_value for x in v.array_value.values])
    return out


def test_off_without_otel_variables_and_the_sdk_never_imported():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = ("import sys, app.live.server, app.live.tracing as t; "
            "assert t.configure() is None and t.session_span('s') is t.NO_SPAN; "
            "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('opentelemetry.')}))")
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": os.getcwd()}, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "sdk" not in out and "exporter" not in out and "proto" not in out, out  # (fastapi imports the API)


@pytest.fixture
def collector(monkeypatch):
    c = Collector()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "synchrony-test")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    yield c
    tracing.shutdown()
    c.close()


async def test_a_conversation_is_one_trace_whose_turns_name_their_children(collector):
    tr = tracing.configure()
    assert tr is not None
    llm = await StandInLLM(ttft_s=0.01, tokens_per_s=500.0).start()
    try:
        conv = ConversationTrace(tracing.session_span("sess-1", WHIP_PARENT))
        import time

        speech_end = time.monotonic() - 0.4
        conv.asr_final(speech_end, speech_end + 0.3)  # the final came before the answer began
        policy = TokenRatePolicy(tokens_per_s=40.0, max_tokens=64, temperature=0.6)
        answer = MeteredAnswer(OpenAIResponder(base_url=llm.base_url, model="standin-1"), policy, None, conv, 3,
                               speech_end)
        words = [w async for w in answer.words("tell me about the weather")]
        tts = answer.turn.child("tts")  # the spoken answer's hooks
        tts.end()
        playback = answer.turn.child("playback")
        answer.turn.event("barge_in")
        playback.end()
        answer.end(AnswerEnd.DONE)
        conv.event("level3_failure", {"synchrony.word": "hello"})
        conv.root.end()
    finally:
        await llm.stop()
    assert words == ["Sure,", "I", "heard:"]
    assert llm.log[0].traceparent and llm.log[0].traceparent.split("-")[1] == WHIP_TRACE  # propagated
    assert tr.queue.force_flush(10_000)
    spans = {s.name: (svc, s) for svc, s in collector.spans}
    assert set(spans) == {"session", "turn", "asr", "llm", "tts", "playback"}
    assert {svc for svc, _ in spans.values()} == {"synchrony-test"}
    assert all(s.trace_id.hex() == WHIP_TRACE for _, s in spans.values())  # one trace, joined to the WHIP caller
    session, turn = spans["session"][1], spans["turn"][1]
    assert session.parent_span_id.hex() == WHIP_PARENT.split("-")[2]
    assert turn.parent_span_id == session.span_id
    assert {n for n in ("asr", "llm", "tts", "playback") if spans[n][1].parent_span_id == turn.span_id} == {
        "asr", "llm", "tts", "playback"}
    llm_attrs = _attrs(spans["llm"][1])
    assert llm_attrs["gen_ai.operation.name"] == "chat" and llm_attrs["gen_ai.request.model"] == "standin-1"
    assert llm_attrs["gen_ai.request.max_tokens"] == 64 and llm_attrs["gen_ai.request.temperature"] == 0.6
    assert llm_attrs["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert "gen_ai.usage.output_tokens" in llm_attrs
    assert [e.name for e in spans["llm"][1].events] == ["first_token"]
    assert [e.name for e in turn.events] == ["barge_in"] and [e.name for e in session.events] == ["level3_failure"]
    asr = spans["asr"][1]
    assert (asr.end_time_unix_nano - asr.start_time_unix_nano) / 1e6 == pytest.approx(300, abs=2)
    assert all(ct == "application/x-protobuf" for ct in collector.content_types)


def test_a_collector_that_is_down_costs_only_dropped_spans(monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    tr = tracing.Tracing(max_queue=16, exporter=OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces",
                                                                 timeout=1))
    try:
        root = tr.session("down")
        for i in range(500):
            root.child("turn", {"i": i}).end()
        root.end()
        assert tr.queue.dropped >= 500 - 16 - 256  # the queue stayed bounded; the rest were dropped
        assert len(tr.queue._queue) <= 16
    finally:
        tr.shutdown()
    assert tr.queue.exported == 0


@pytest.fixture(scope="module")
def voice():
    """The spoken answer's voice as ``synchrony serve`` warms it (festival, the avatar where built)."""
    from app.live.server import ServerConfig
    from app.live.warmup import WarmState, _warm_voice

    state = WarmState()
    _warm_voice(ServerConfig.in_process(ui=False, tts="festival"), state)
    return state.stages.voice


async def test_a_live_conversation_yields_a_trace_whose_turn_names_its_children(collector, live_stages, av_clip,  # noqa: F811
                                                                                voice):
    """A real peer speaks one sentence over WebRTC to a live server (OpenAI stand-in responder, answers
    spoken by festival) with OTEL_EXPORTER_OTLP_ENDPOINT set; the loopback collector gets the session's
    trace, and the answer's turn names its asr, llm, tts and playback children."""
    import dataclasses

    from app.live.server import ServerConfig, create_app, running_server
    from app.loadtest.peer import WhipPeer

    llm = await StandInLLM(ttft_s=0.08).start()
    stages = dataclasses.replace(live_stages, voice=voice,
                                 make_responder=lambda: OpenAIResponder(base_url=llm.base_url))
    app = create_app(ServerConfig.in_process(ui=False, output_delay_s=0.9, tts="festival"), stages=stages)
    try:
        async with running_server(app) as base:
            peer = WhipPeer(f"{base}/whip", av_clip, traceparent=WHIP_PARENT)
            await peer.connect()
            try:
                await peer.wait_for("response_end", lambda m: True, timeout=90)  # one whole spoken answer
            finally:
                await peer.close()
    finally:
        await llm.stop()
    # the server's shutdown flushed and closed the exporter (tracing.shutdown in the lifespan)
    names = [s.name for _, s in collector.spans]
    assert "session" in names and "turn" in names and "llm" in names, names
    assert all(s.trace_id.hex() == WHIP_TRACE for _, s in collector.spans)
    by_id = {s.span_id: s for _, s in collector.spans}
    turns = [s for _, s in collector.spans if s.name == "turn"]
    children = {t.span_id: {s.name for _, s in collector.spans if s.parent_span_id == t.span_id} for t in turns}
    spoken = [t for t in turns if {"asr", "llm", "tts", "playback"} <= children[t.span_id]]
    assert spoken, children
    turn = spoken[0]
    assert by_id[turn.parent_span_id].name == "session"
    for name in ("tts", "playback"):  # inside the turn, which lasts until the answer has played
        child = next(s for _, s in collector.spans if s.parent_span_id == turn.span_id and s.name == name)
        assert turn.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
        assert child.end_time_unix_nano <= turn.end_time_unix_nano
    assert llm.log[0].traceparent.split("-")[1] == WHIP_TRACE
    print(f"spans {sorted(names)}; the spoken turn's children {sorted(children[turn.span_id])}")
