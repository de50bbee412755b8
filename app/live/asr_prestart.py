"""ASR lane processes started first thing in ``synchrony serve``, before the server's own imports.

A lane process spends seconds importing torch and loading Whisper before it can warm up, and the
server process spends its first seconds importing the web, media and model stacks on one core.
Started before those imports, the lanes load on the other core meanwhile; the warm-up hands them to
the ASR worker it builds (:func:`take_started_lanes`). Nothing heavy is imported here.
"""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from models.lane_process import spawn_lane

_started: list[tuple[str | None, Connection, BaseProcess]] = []  # (whisper path, pipe, process)
_starting: list[threading.Thread] = []
_lock = threading.Lock()


def start_lanes(n: int, whisper_path: str | None) -> None:
    """Start ``n`` lane processes with the default streaming settings, for the warm-up to adopt.
    Returns at once: the first fork waits for the fork server to load the model, on a thread."""
    def run() -> None:
        for i in range(n):
            conn, proc = spawn_lane(_default_lane, f"asr-lane-{i}", whisper_path, default_model=whisper_path is None)
            with _lock:
                _started.append((whisper_path, conn, proc))

    thread = threading.Thread(target=run, name="asr-prestart", daemon=True)
    thread.start()
    _starting.append(thread)


def take_started_lanes(whisper_path: str | None, n: int) -> list[tuple[Connection, BaseProcess]]:
    """Up to ``n`` lanes :func:`start_lanes` started for this model (the worker starts the rest)."""
    for thread in _starting:
        thread.join()
    with _lock:
        mine = [i for i, (path, _, proc) in enumerate(_started) if path == whisper_path and proc.is_alive()][:n]
        taken = [_started[i][1:] for i in mine]
        for i in reversed(mine):
            del _started[i]
    return taken


def _default_lane(conn: Connection, whisper_path: str | None) -> None:
    from models.asr.lanes import lane_main
    from models.asr.streaming import StreamingConfig

    lane_main(conn, whisper_path, StreamingConfig())
