"""One BLAS thread for the whole process (the server's numpy work is many small calls)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def single_threaded_blas() -> bool:
    """Give the process one BLAS thread (once); False where threadpoolctl is missing.

    numpy's OpenBLAS keeps its worker threads spinning for a while after each threaded call. Its
    calls here take about a millisecond, yet the spinning after them cost streaming ASR ~40 % of a
    second core (docs/benchmarks-history.md). On cores that decode lanes, face analysis and codecs
    already share, no BLAS call of ours gains from threads.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(limits=1, user_api="blas")
    return True
