"""Imported once by the ASR lanes' fork server (``models.lane_process``): the default Whisper model
and its int8 streaming engine load there, and every lane forked from it starts with them (shared
copy-on-write) instead of importing torch and loading its own, which cost each lane seconds of CPU at
start-up and at every restart. Importing this module anywhere else loads the model too.
"""

from __future__ import annotations

import logging


def _preload() -> None:
    import torch
    import whisper.timing  # noqa: F401 - imports numba, which resets this thread's torch threads

    # Before any torch op: a process that forks must not have started an OpenMP pool (a forked
    # child cannot use it); the lanes decode on one thread anyway.
    torch.set_num_threads(1)
    from models.asr.engine import get_engine
    from models.asr.streaming import StreamingConfig

    try:
        get_engine("whisper", None, int8=StreamingConfig().int8)
    except Exception as exc:  # noqa: BLE001 - each lane then loads (and reports) on its own
        logging.getLogger(__name__).warning("ASR lane preload failed: %s", exc)


_preload()
