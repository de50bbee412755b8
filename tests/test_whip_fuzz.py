"""Fuzz the WHIP endpoint over real HTTP: mutated SDP offers, headers, content types, paths, methods.

The server runs (uvicorn, real aiortc negotiation, no models) on its own event loop in a thread, as
in production; hypothesis drives a plain HTTP client at it. Every answer must be a deliberate
status (2xx, 4xx or 503) with a short plain message: never a 500, never a traceback, and the
process keeps serving. Schemathesis is not used: the WHIP routes take a raw SDP body, so the
app's OpenAPI document describes no request schema for it to generate from.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.live.server import ServerConfig, create_app, running_server
from tests.live_fixtures import whip_offer

TOKEN = "fuzz-token"
ALLOWED = {200, 201, 204, 400, 401, 403, 404, 405, 413, 415, 422, 503}
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                database=None)


class _Errors(logging.Handler):
    """Counts log records that mean a request blew up inside the app."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "internal error" in msg or "Exception in ASGI application" in msg:
            self.records.append(msg)


class ServerThread:
    """The app under uvicorn on an event loop of its own thread."""

    def __init__(self, config: ServerConfig) -> None:
        self.app = create_app(config)
        self.base = ""
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, name="fuzz-server", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with running_server(self.app) as base:
            self.base = base
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ServerThread:
        self.thread.start()
        assert self._ready.wait(30), "server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)

    def sessions(self) -> int:
        return len(self.app.state.sessions)


@pytest.fixture(scope="module")
def offer() -> str:
    return asyncio.run(whip_offer())


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    errors = _Errors()
    for name in ("synchrony.server", "uvicorn.error"):
        logging.getLogger(name).addHandler(errors)
    config = ServerConfig.in_process(ui=False, stages=(), max_sessions=3, media_timeout_s=1.0, max_sdp_bytes=16384,
                                     auth_token=TOKEN, allowed_origins=("https://allowed.example",))
    try:
        with ServerThread(config) as srv:
            srv.errors = errors  # type: ignore[attr-defined]
            yield srv
            # After all the fuzzing the process still serves, and nothing was a 500.
            with httpx.Client(base_url=srv.base, timeout=10) as c:
                assert c.get("/healthz").json()["status"] == "ok"
                assert 'synchrony_whip_rejected_total{status="500"}' not in c.get("/metrics").text
            assert errors.records == []
    finally:
        for name in ("synchrony.server", "uvicorn.error"):
            logging.getLogger(name).removeHandler(errors)


def check_answer(resp: httpx.Response, srv: ServerThread, client: httpx.Client) -> None:
    """A deliberate status with a clear, short body; a created session is deleted at once."""
    assert resp.status_code in ALLOWED, (resp.status_code, resp.text[:300])
    assert "Traceback" not in resp.text and 'File "' not in resp.text
    if resp.status_code >= 400:
        assert resp.text.strip(), f"{resp.status_code} with an empty body"
        assert len(resp.text) < 600, resp.text[:600]
    if resp.status_code == 201:
        assert resp.text.startswith("v=0") and resp.headers["Location"].startswith("/whip/")
        gone = client.delete(resp.headers["Location"], headers={"Authorization": f"Bearer {TOKEN}"})
        assert gone.status_code in (200, 404), gone.text


# --- strategies -------------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)


@st.composite
def mutated_offer(draw: st.DrawFn, base: str) -> bytes:
    """A real offer with 1-4 structural edits: lines dropped, duplicated, swapped, rewritten, numbers bent."""
    lines = base.split("\r\n")
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["drop", "dup", "swap", "junk", "number", "attr", "truncate", "value"]))
        i = draw(st.integers(0, len(lines) - 1))
        if op == "drop" and len(lines) > 1:
            del lines[i]
        elif op == "dup":
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "junk":
            lines[i] = draw(_text)
        elif op == "number":
            nums = list(re.finditer(r"\d+", lines[i]))
            if nums:
                m = nums[draw(st.integers(0, len(nums) - 1))]
                new = str(draw(st.one_of(st.integers(-5, 70000), st.integers(2**31, 2**70))))
                lines[i] = lines[i][: m.start()] + new + lines[i][m.end():]
        elif op == "attr":
            key = draw(st.sampled_from(["mid", "group:BUNDLE", "rtpmap", "fmtp", "setup", "fingerprint",
                                        "ice-ufrag", "ice-pwd", "sctp-port", "ssrc", "candidate", "extmap",
                                        "rtcp-fb", "msid", "max-message-size", "sendonly", "inactive"]))
            lines.insert(i, f"a={key}:{draw(_text)}")
        elif op == "truncate":
            text = "\r\n".join(lines)
            lines = text[: draw(st.integers(0, len(text)))].split("\r\n")
        elif op == "value":
            if "=" in lines[i]:
                lines[i] = lines[i].split("=", 1)[0] + "=" + draw(_text)
    sep = draw(st.sampled_from(["\r\n", "\n", "\r"]))
    return sep.join(lines).encode("utf-8", "surrogatepass")


# --- the tests ----------------------------------------------------------------------------------


def _post(client: httpx.Client, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    h = {"Content-Type": "application/sdp", "Authorization": f"Bearer {TOKEN}"}
    h.update(headers or {})
    return client.post("/whip", content=body, headers=h)


def test_fuzzed_sdp_offers_get_deliberate_answers(server: ServerThread, offer: str) -> None:
    """Structural mutations of a real offer: 201 (then DELETE), 400 with the reason, 413, or 503."""
    seen: dict[int, int] = {}

    @FUZZ
    @given(body=mutated_offer(offer))
    def run(body: bytes) -> None:
        with httpx.Client(base_url=server.base, timeout=20) as c:
            resp = _post(c, body)
            seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
            check_answer(resp, server, c)
            assert resp.status_code in (201, 400, 413, 503)

    run()
    print("status counts:", seen)
    assert seen.get(400, 0) > 0  # the mutations do reach the refusals


@FUZZ
@given(body=st.one_of(st.binary(max_size=2000), _text.map(lambda s: s.encode()),
                      _text.map(lambda s: ("v=0\r\n" + s).encode())))
def test_fuzzed_raw_bodies_are_refused_clearly(server: ServerThread, body: bytes) -> None:
    with httpx.Client(base_url=server.base, timeout=20) as c:
        resp = _post(c, body)
        check_answer(resp, server, c)
        assert resp.status_code in (400, 413)


_ctype = st.one_of(
    st.sampled_from(["application/sdp", "APPLICATION/SDP; charset=utf-8", "application/json", "text/plain",
                     "multipart/form-data; boundary=x", "application/x-www-form-urlencoded", "", "sdp",
                     "application/sdp;;;", "application/sdp\tx"]),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(str.strip),
)
_printable = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80).map(str.strip)
_auth = st.one_of(st.none(), st.just(f"Bearer {TOKEN}"), st.just(f"bearer {TOKEN}"), st.just("Bearer"),
                  st.just(f"Bearer {TOKEN}x"), _printable)
_origin = st.one_of(st.none(), st.just("https://allowed.example"), st.just("https://evil.example"),
                    st.just("null"), _printable.filter(bool))


@FUZZ
@given(ctype=_ctype, auth=_auth, origin=_origin, real=st.booleans(), junk=st.dictionaries(
    st.from_regex(r"X-[A-Za-z]{1,12}", fullmatch=True),
    _printable, max_size=3))
def test_fuzzed_headers_and_content_types(server: ServerThread, offer: str, ctype: str, auth: str | None,
                                          origin: str | None, real: bool, junk: dict[str, str]) -> None:
    headers: dict[str, Any] = {"Content-Type": ctype, **junk}
    if auth is not None:
        headers["Authorization"] = auth
    if origin is not None:
        headers["Origin"] = origin
    with httpx.Client(base_url=server.base, timeout=20) as c:
        resp = c.post("/whip", content=offer.encode() if real else b"v=0\r\n", headers=headers)
        check_answer(resp, server, c)
        if auth != f"Bearer {TOKEN}":
            assert resp.status_code == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
        elif origin not in (None, "https://allowed.example"):
            assert resp.status_code == 403 and "origin" in resp.text
        elif ctype.split(";", 1)[0].strip().lower() != "application/sdp":
            assert resp.status_code == 415 and "application/sdp" in resp.text


@FUZZ
@given(method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]),
       path=st.one_of(
           st.sampled_from(["/whip", "/whip/", "/whip/x", "/whip/../metrics", "/whip//", "/metrics", "/readyz",
                            "/healthz", "/metrics/lst", "/openapi.json", "/docs", "/whip/%00", "/%2e%2e/whip"]),
           st.from_regex(r"/whip/[A-Za-z0-9_\-%.~]{0,40}", fullmatch=True),
           st.from_regex(r"/[A-Za-z0-9_\-%./]{0,60}", fullmatch=True)),
       auth=st.booleans())
def test_fuzzed_paths_and_methods(server: ServerThread, method: str, path: str, auth: bool) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"} if auth else {}
    with httpx.Client(base_url=server.base, timeout=20) as c:
        resp = c.request(method, path, headers=headers)
        assert resp.status_code != 500 and resp.status_code < 600, (method, path, resp.text[:200])
        assert "Traceback" not in resp.text


def test_oversized_streamed_body_without_length_is_413(server: ServerThread, offer: str) -> None:
    """A chunked upload that never declares its size is cut off at the limit, not read to the end."""
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        yield offer.encode()
        for _ in range(64):
            sent += 4096
            yield b"a=x:" + b"y" * 4090 + b"\r\n"

    with httpx.Client(base_url=server.base, timeout=20) as c:
        resp = c.post("/whip", content=chunks(), headers={"Content-Type": "application/sdp",
                                                           "Authorization": f"Bearer {TOKEN}"})
        assert resp.status_code == 413 and "larger than 16384" in resp.text
        lying = c.post("/whip", content=offer.encode(), headers={
            "Content-Type": "application/sdp", "Authorization": f"Bearer {TOKEN}", "Content-Length-X": "1"})
        check_answer(lying, server, c)
