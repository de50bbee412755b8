"""The refusals a WHIP front door makes before it reads an offer: one rule for a server and the cluster ingress.

Both answer the same requests the same way (docs/DEPLOY.md): a missing or wrong bearer token is 401, a
page from another origin 403, a client address offering too fast 429 with ``Retry-After``, and
``/metrics`` asks for the token when the operator protects it. Every refusal is plain text and counted
by status.
"""

from __future__ import annotations

from fastapi import Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import Counter

from app.live.offer import authorised, client_address, origin_allowed, origin_refusal
from app.live.ratelimit import OfferRateLimit

_BEARER = {"WWW-Authenticate": "Bearer"}


class RequestGate:
    """Token, origin, offer-rate and metrics checks; each returns the refusal, or None when the request may pass."""

    def __init__(self, *, auth_token: str | None, allowed_origins: tuple[str, ...], metrics_auth: bool,
                 offers: OfferRateLimit, rejected: Counter) -> None:
        self.auth_token = auth_token
        self.allowed_origins = allowed_origins
        self.metrics_auth = metrics_auth
        self.offers = offers
        self.rejected = rejected

    def refuse(self, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
        self.rejected.labels(str(status)).inc()
        return PlainTextResponse(message + "\n", status_code=status, headers=headers)

    def check(self, request: Request) -> Response | None:
        """The bearer-token and browser-origin refusal for ``request``."""
        if not authorised(request, self.auth_token):
            return self.refuse(401, "missing or wrong bearer token", _BEARER)
        if not origin_allowed(request, self.allowed_origins):
            return self.refuse(403, origin_refusal(request))
        return None

    def rate(self, request: Request) -> Response | None:
        """429 + Retry-After when this client address has offered too often."""
        wait = self.offers.retry_after(client_address(request))
        if wait is None:
            return None
        return self.refuse(429, f"too many offers from this address; retry in {wait} s", {"Retry-After": str(wait)})

    def metrics(self, request: Request) -> Response | None:
        """The bearer-token refusal for /metrics and /metrics/lst when the operator protects them."""
        if self.metrics_auth and not authorised(request, self.auth_token):
            return self.refuse(401, "missing or wrong bearer token", _BEARER)
        return None
