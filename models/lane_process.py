"""A worker child process with a pipe to it: how the ASR lanes are started (``models.asr.worker``,
``app.live.asr_prestart``). Nothing heavy is imported here, so a server can start its lanes before
its own imports; the lanes fork from one fork server that loaded the model once."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

#: What the lanes' fork server imports before it forks any lane: the default model, loaded once.
LANE_PRELOAD = "models.asr.lane_preload"


def spawn_lane(target: Callable[..., None], name: str, *args: object,
               default_model: bool = True) -> tuple[Connection, BaseProcess]:
    """A child running ``target(pipe, *args)``, forked from multiprocessing's fork server (a fresh
    process, not the server: its threads must not be forked); a daemon, so it never outlives the
    server. ``default_model``: the lanes run the default Whisper, so the fork server loads it first
    (:data:`LANE_PRELOAD`); lanes given another checkpoint load their own, and it would be waste."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([LANE_PRELOAD] if default_model else [])  # read when it starts (the first lane)
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), name=name, daemon=True)
    proc.start()
    child.close()
    return conn, proc


def name_process(name: str) -> None:
    """Name this process (Linux ``prctl``; its ``comm``), so the server's CPU account knows it
    (``asr-lane`` counts as ASR)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15] + b"\0", 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass
