"""Whisper speech recognition: the engine, offline transcription, streaming, the shared worker.

* :mod:`models.asr.engine` — :class:`Engine` and the one we ship, :class:`WhisperEngine`.
* :mod:`models.asr.offline` — :func:`transcribe_words`: every word of a recording, final.
* :mod:`models.asr.streaming` — :class:`StreamingASR`: one session's interims, finals, endpoints.
* :mod:`models.asr.worker` — :class:`ASRWorker`: many sessions' streams on a few threads.
* :mod:`models.asr.lanes` — where a lane's turns run: in the worker's thread or a process of its own.
"""

from models.asr.engine import DecodedWord, Engine, WhisperEngine, get_engine
from models.asr.lanes import join_chunks
from models.asr.offline import transcribe_words
from models.asr.streaming import ASREvent, StreamingASR, StreamingConfig, UtteranceEnd
from models.asr.worker import ASRStream, ASRWorker, WorkerStats

__all__ = [
    "ASREvent",
    "ASRStream",
    "ASRWorker",
    "DecodedWord",
    "Engine",
    "StreamingASR",
    "StreamingConfig",
    "UtteranceEnd",
    "WhisperEngine",
    "WorkerStats",
    "get_engine",
    "join_chunks",
    "transcribe_words",
]
