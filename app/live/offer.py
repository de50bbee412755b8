"""What a WHIP request must be before any session exists: the bearer token, the browser origin, the
SDP offer; and the CORS policy. The single server and the cluster ingress both use it, so bad input
gets the same answers (400/401/403/413/415, short plain text) wherever it arrives.
"""

from __future__ import annotations

import re
import secrets
from urllib.parse import urlsplit

from fastapi import FastAPI, Request

#: Codecs aiortc can decode, per media kind (rtpmap encoding names, lower case).
DECODABLE = {"audio": ("opus", "g722", "pcmu", "pcma"), "video": ("vp8", "h264")}


class SdpError(ValueError):
    """An offer we cannot answer; the message is shown to the client as is."""


class OfferRefused(Exception):
    """A WHIP request refused before any session exists: ``status`` and the one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_offer(sdp: str) -> None:
    """Refuse offers that are not WHIP offers we can answer, with a message that says why."""
    lines = [ln.strip() for ln in sdp.replace("\r\n", "\n").split("\n") if ln.strip()]
    if not lines or lines[0] != "v=0":
        raise SdpError("not an SDP offer: the body must start with 'v=0'")
    if any(len(ln) < 2 or ln[1] != "=" for ln in lines):
        bad = next(ln for ln in lines if len(ln) < 2 or ln[1] != "=")
        raise SdpError(f"malformed SDP line: {bad[:60]!r}")
    sections: list[list[str]] = []
    for ln in lines:
        if ln.startswith("m="):
            sections.append([ln])
        elif sections:
            sections[-1].append(ln)
    kinds = {sec[0][2:].split(" ", 1)[0] for sec in sections}
    for kind in ("audio", "video", "application"):
        if kind not in kinds:
            what = "a DataChannel (m=application) for the 'events' channel" if kind == "application" else kind
            raise SdpError(f"the offer has no {what} section")
    seen: dict[str, int] = {}
    for sec in sections:
        kind = sec[0][2:].split(" ", 1)[0]
        seen[kind] = seen.get(kind, 0) + 1
        _check_section(sec, avatar=kind == "video" and seen[kind] == 2)
    text = "\n".join(lines)
    for attr, what in (("a=ice-ufrag:", "ICE credentials (a=ice-ufrag)"), ("a=ice-pwd:", "ICE credentials (a=ice-pwd)"),
                       ("a=fingerprint:", "a DTLS fingerprint (a=fingerprint)")):
        if attr not in text:
            raise SdpError(f"the offer has no {what}; it may be truncated")


def _check_section(sec: list[str], avatar: bool = False) -> None:
    """One media section (its ``m=`` line first): accepted, sending, with a codec we decode.
    ``avatar``: the second video section, where the answer's avatar is sent (the client may only receive)."""
    m = re.match(r"m=(\w+) (\d+) (\S+) (.+)$", sec[0])
    if m is None:
        raise SdpError(f"malformed media line: {sec[0][:60]!r}")
    kind = m.group(1)
    if kind not in ("audio", "video"):
        return
    if m.group(2) == "0":
        raise SdpError(f"the offer rejects its {kind} section (port 0)")
    direction = next((a[2:] for a in sec if a[2:] in ("sendrecv", "sendonly", "recvonly", "inactive")),
                     "sendrecv")
    wanted = ("recvonly", "sendrecv") if avatar else ("sendrecv",) if kind == "video" else ("sendrecv", "sendonly")
    if direction not in wanted:
        raise SdpError(f"the {kind} section is {direction}; it must be {' or '.join(wanted)}")
    if not any(a.startswith("a=rtpmap:") for a in sec):
        raise SdpError(f"the {kind} section lists no codecs (a=rtpmap)")
    offered = {a.split(" ", 1)[1].split("/", 1)[0].lower() for a in sec
               if a.startswith("a=rtpmap:") and " " in a}
    if not offered & set(DECODABLE[kind]):
        raise SdpError(f"the {kind} section offers no codec this server decodes "
                       f"(supported: {', '.join(DECODABLE[kind])})")


async def read_offer(request: Request, max_bytes: int) -> str:
    """The offer's SDP text, checked; ``OfferRefused`` 415 (not application/sdp), 413 (larger than
    ``max_bytes``) or 400 (not UTF-8, not an offer we can answer)."""
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype != "application/sdp":
        raise OfferRefused(415, f"Content-Type must be application/sdp, not {ctype or 'missing'!r}")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise OfferRefused(413, f"SDP offer larger than {max_bytes} bytes")
    body = b""
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise OfferRefused(413, f"SDP offer larger than {max_bytes} bytes")
    try:
        sdp = body.decode("utf-8")
        check_offer(sdp)
    except UnicodeDecodeError:
        raise OfferRefused(400, "SDP offer is not UTF-8 text") from None
    except SdpError as exc:
        raise OfferRefused(400, str(exc)) from None
    return sdp


def client_address(request: Request) -> str:
    """The client's address (a trusted proxy's ``X-Forwarded-For`` already applied: ``app.live.proxy``)."""
    return request.client.host if request.client is not None else "unknown"


def resource_location(request: Request, path: str) -> str:
    """``path`` under the proxy's path prefix, if a trusted proxy named one (``X-Forwarded-Prefix``)."""
    from app.live.proxy import PREFIX_KEY

    return str(request.scope.get(PREFIX_KEY, "")) + path


def cap_bitrate(sdp: str, kbps: int) -> str:
    """An SDP answer with ``b=AS:<kbps>`` on its video sections: the most a browser will send us."""
    if kbps <= 0:
        return sdp
    out: list[str] = []
    in_video = False
    for line in sdp.split("\r\n"):
        if line.startswith("m="):
            in_video = line.startswith("m=video")
        elif in_video and line.startswith("b="):
            continue  # replaced by ours
        out.append(line)
        if in_video and line.startswith("c="):
            out.append(f"b=AS:{kbps}")
    return "\r\n".join(out)


def authorised(request: Request, token: str | None) -> bool:
    """The request carries ``Bearer <token>`` (always true without a token)."""
    if not token:
        return True
    given = request.headers.get("authorization", "")
    return secrets.compare_digest(given.encode(), f"Bearer {token}".encode())


def origin_allowed(request: Request, allowed: tuple[str, ...]) -> bool:
    """Browsers send Origin: accept our own page and ``allowed``; other clients send none."""
    origin = request.headers.get("origin")
    if origin is None or origin in allowed:
        return True
    return urlsplit(origin).netloc.lower() == request.headers.get("host", "").lower()


def origin_refusal(request: Request) -> str:
    """The 403 message for a browser origin ``origin_allowed`` refused."""
    origin = request.headers.get("origin", "")[:80]
    return f"origin {origin!r} is not allowed (same origin or allowed_origins only)"


def allow_cross_origin(app: FastAPI, origins: tuple[str, ...]) -> None:
    """Let pages from ``origins`` use WHIP (and read ``Location``) across origins."""
    if origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(origins),
                           allow_methods=["POST", "DELETE", "GET", "OPTIONS", "PATCH"],
                           allow_headers=["Authorization", "Content-Type"], expose_headers=["Location", "Link"])
