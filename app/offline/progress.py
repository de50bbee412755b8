"""A quiet progress bar for long offline runs: one stderr line, redrawn, only on a terminal."""

from __future__ import annotations

import sys
import time


class Progress:
    """Redraws ``label [#####.....] i/n`` at most 10 times a second; silent when not a TTY."""

    def __init__(self, label: str, total: int, enabled: bool | None = None) -> None:
        self.label = label
        self.total = max(total, 1)
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0
        self._done = 0

    def advance(self, n: int = 1) -> None:
        self._done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.1 or self._done >= self.total):
            self._last = now
            filled = int(30 * min(self._done / self.total, 1.0))
            sys.stderr.write(f"\r{self.label:<10} [{'#' * filled}{'.' * (30 - filled)}] {self._done}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
