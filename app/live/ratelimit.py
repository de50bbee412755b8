"""Per-client-address limits on WHIP offers: a token bucket per address, 429 + Retry-After past it.

Each offer costs the server an SDP parse, a peer connection and ICE gathering before any admission
decision can refuse it, so one client asking fast could keep the server busy answering. A bucket
of ``burst`` offers per address refills at ``rate_per_s``; an offer that finds it empty is refused
with the seconds until the next token. The table of addresses is bounded (least recently seen
first out), so a flood from many addresses cannot grow memory.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict


class OfferRateLimit:
    """Token buckets by client address; ``rate_per_s`` <= 0 admits everything."""

    def __init__(self, rate_per_s: float, burst: int, max_clients: int = 10_000) -> None:
        self.rate = rate_per_s
        self.burst = max(1, burst)
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # addr -> (tokens, last time)

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def retry_after(self, address: str, now: float | None = None) -> int | None:
        """None when ``address`` may offer now (a token is taken), else whole seconds to wait (>= 1)."""
        if not self.enabled:
            return None
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.pop(address, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            tokens -= 1.0
            wait = None
        else:
            wait = max(1, math.ceil((1.0 - tokens) / self.rate))
        self._buckets[address] = (tokens, now)
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return wait
