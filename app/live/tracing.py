"""OpenTelemetry traces of a session's conversation, by the standard ``OTEL_*`` variables.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_TRACES_ENDPOINT``) is set: then nothing of
OpenTelemetry is imported and every hook is a no-op object. On: OTLP over HTTP (protobuf) only
(``OTEL_EXPORTER_OTLP_PROTOCOL`` other than ``http/protobuf`` turns tracing off with a warning),
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` name the service, ``OTEL_TRACES_SAMPLER``
decides at the root (default parent-based always-on), ``OTEL_SDK_DISABLED=true`` turns it off.

Shape (docs/LST.md): one trace per session (its root span ``session``, a child of the WHIP POST's
``traceparent`` when one came), a ``turn`` span per answered turn with child spans ``asr`` (speech
end → final), ``llm`` (request → first token → last; GenAI attributes), ``tts`` and ``playback``
(``TurnTrace.child``, for the spoken answer); Level-3 failures and barge-ins are span events.
Spans go through a bounded queue (``BoundedSpanQueue``) exported by one background thread, so a
collector that is down costs dropped spans, never a stall of the event loop.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span as OtelSpan

    from alignment.types import TokenRatePolicy
    from models.responders import RequestTimes

log = logging.getLogger("synchrony.tracing")

AttrValue = str | int | float | bool | Sequence[str]
Attrs = Mapping[str, AttrValue]

#: Spans kept waiting for export at most (``OTEL_BSP_MAX_QUEUE_SIZE`` overrides): past it, dropped.
MAX_QUEUE = 2048


def wanted() -> bool:
    """Tracing asked for by the environment (an OTLP endpoint set, the SDK not disabled)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def _epoch_ns(mono_s: float | None) -> int | None:
    """A ``time.monotonic`` instant as the epoch nanoseconds OpenTelemetry stamps spans with."""
    if mono_s is None:
        return None
    return time.time_ns() - int((time.monotonic() - mono_s) * 1e9)


class _NoSpan:
    """What every hook returns with tracing off: accepts every call, does nothing."""

    def child(self, name: str, attrs: Attrs | None = None, start: float | None = None) -> _NoSpan:
        return self

    def event(self, name: str, attrs: Attrs | None = None) -> None:
        pass

    def set(self, attrs: Attrs) -> None:
        pass

    def end(self, at: float | None = None) -> None:
        pass

    def headers(self) -> dict[str, str]:
        return {}


NO_SPAN = _NoSpan()


class Span(_NoSpan):
    """One live span: children, events, attributes, ``headers()`` (``traceparent`` for requests)."""

    def __init__(self, tracing: Tracing, span: OtelSpan) -> None:
        self._tracing, self._span = tracing, span
        self._ended = False

    def child(self, name: str, attrs: Attrs | None = None, start: float | None = None) -> Span:
        """A child span starting at ``start`` (``time.monotonic`` s; None: now)."""
        return self._tracing.start(name, self._span, attrs, start)

    def event(self, name: str, attrs: Attrs | None = None) -> None:
        self._span.add_event(name, dict(attrs or {}))

    def set(self, attrs: Attrs) -> None:
        self._span.set_attributes(dict(attrs))

    def end(self, at: float | None = None) -> None:
        if not self._ended:
            self._ended = True
            self._span.end(end_time=_epoch_ns(at))

    def headers(self) -> dict[str, str]:
        return self._tracing.inject(self._span)


class Tracing:
    """The process's tracer: a provider, the OTLP/HTTP exporter behind a bounded queue."""

    def __init__(self, max_queue: int | None = None, exporter: SpanExporter | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "synchrony"})
        self.provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER
        size = max_queue or int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE") or MAX_QUEUE)
        processor = type("BoundedSpanProcessor", (BoundedSpanQueue, SpanProcessor), {})  # the SDK's hooks
        self.queue: BoundedSpanQueue = processor(exporter or OTLPSpanExporter(), size)
        self.provider.add_span_processor(self.queue)
        self.tracer = self.provider.get_tracer("synchrony")
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()

    def start(self, name: str, parent: OtelSpan | None, attrs: Attrs | None = None, start: float | None = None) -> Span:
        ctx = None if parent is None else self._trace.set_span_in_context(parent)
        return Span(self, self.tracer.start_span(name, context=ctx, attributes=dict(attrs or {}),
                                                 start_time=_epoch_ns(start)))

    def session(self, session_id: str, traceparent: str | None = None) -> Span:
        """The session's root span; a child of the caller's trace when the WHIP POST carried one."""
        ctx = self._propagator.extract({"traceparent": traceparent}) if traceparent else None
        span = self.tracer.start_span("session", context=ctx, attributes={"synchrony.session": session_id})
        return Span(self, span)

    def inject(self, span: OtelSpan) -> dict[str, str]:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return carrier

    def shutdown(self) -> None:
        self.provider.shutdown()


class BoundedSpanQueue:
    """A span processor: ended spans wait in a bounded deque; one daemon thread exports them in
    batches. A full queue drops the span (counted in ``dropped``), so a slow or absent collector
    never blocks the caller; an export that fails drops its batch (``failed``)."""

    def __init__(self, exporter: SpanExporter, max_queue: int = MAX_QUEUE, batch: int = 256,
                 delay_s: float = 1.0) -> None:
        self._exporter, self._max, self._batch, self._delay = exporter, max_queue, batch, delay_s
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._stop = False
        self.dropped = self.exported = self.failed = 0
        self._thread = threading.Thread(target=self._run, name="otel-export", daemon=True)
        self._thread.start()

    def on_start(self, span: OtelSpan, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        if len(self._queue) >= self._max:
            self.dropped += 1
            return
        self._queue.append(span)
        if len(self._queue) >= self._batch:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._drain()
        self._drain()

    def _drain(self) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        while self._queue:
            batch = [self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))]
            try:
                ok = self._exporter.export(batch) is SpanExportResult.SUCCESS
            except Exception:  # noqa: BLE001 - an exporter failure drops the batch, never the server
                ok = False
            if ok:
                self.exported += len(batch)
            else:
                self.failed += len(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._wake.set()
        deadline = time.monotonic() + timeout_millis / 1000
        while self._queue and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(5.0)
        self._exporter.shutdown()


_TRACING: Tracing | None = None


def configure() -> Tracing | None:
    """Start tracing if the environment asks for it (once per process); None when off."""
    global _TRACING
    if _TRACING is not None or not wanted():
        return _TRACING
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if protocol != "http/protobuf":
        log.warning("tracing off: OTLP protocol %r is not supported here (use http/protobuf)", protocol)
        return None
    try:
        _TRACING = Tracing()
    except ImportError as exc:
        log.warning("tracing off: OpenTelemetry is not installed (%s)", exc)
        return None
    log.info("tracing on: OTLP/HTTP to %s", os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
             or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    return _TRACING


def shutdown() -> None:
    """Flush and stop the exporter (server shutdown)."""
    global _TRACING
    if _TRACING is not None:
        _TRACING.shutdown()
        _TRACING = None


def session_span(session_id: str, traceparent: str | None = None) -> _NoSpan:
    """The session's root span (``NO_SPAN`` with tracing off)."""
    return _TRACING.session(session_id, traceparent) if _TRACING is not None else NO_SPAN


def turn_span(session: _NoSpan, answer: int, speech_end: float | None) -> _NoSpan:
    """A turn's span under the session's, from the end of the user's speech (``time.monotonic`` s).
    Its children: ``asr``, ``llm`` (``llm_span``), and for the spoken answer ``tts`` and
    ``playback`` (``turn.child("tts")`` … ``.end()``); a barge-in is ``turn.event("barge_in")``."""
    return session.child("turn", {"synchrony.answer": answer}, start=speech_end)


def llm_span(turn: _NoSpan, model: str, policy: TokenRatePolicy, responder: str) -> _NoSpan:
    """The responder request's span, GenAI semantic conventions: the load policy per request."""
    return turn.child("llm", {"gen_ai.operation.name": "chat", "gen_ai.request.model": model or responder,
                              "gen_ai.system": responder, "gen_ai.request.max_tokens": int(policy.max_tokens),
                              "gen_ai.request.temperature": float(policy.temperature),
                              "synchrony.policy.tokens_per_s": float(policy.tokens_per_s)})


def end_llm_span(span: _NoSpan, times: RequestTimes, delivered: int) -> None:
    """Close the request's span with what it measured (first token as an event, usage, finish)."""
    if span is NO_SPAN:
        return
    if times.first is not None:
        span.event("first_token", {"synchrony.ttft_ms": round((times.first - (times.sent or times.first)) * 1e3, 3)})
    attrs: dict[str, AttrValue] = {"gen_ai.response.finish_reasons": [times.finish_reason or "cancelled"],
                             "synchrony.words_delivered": delivered}
    if times.completion_id:
        attrs["gen_ai.response.id"] = times.completion_id
    usage = times.usage or {}
    if "prompt_tokens" in usage:
        attrs["gen_ai.usage.input_tokens"] = usage["prompt_tokens"]
    if "completion_tokens" in usage:
        attrs["gen_ai.usage.output_tokens"] = usage["completion_tokens"]
    elif times.content:
        attrs["gen_ai.usage.output_tokens"] = len(times.content)  # content deltas received
    span.set(attrs)
    span.end(times.last)
