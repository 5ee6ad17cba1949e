"""The private helper threads of the compiled kernels (execution, not math).

In core, one band is the whole table and the learner runs it on the calling thread;
the kernels of :mod:`fsll_ooc.kernels` (the fused update + scan) and
:mod:`fsll_ooc.fast_transform` (full transforms) then split their work between the
caller and ``n - 1`` helper threads of this pool, ``n`` = :func:`num_threads`.
Work is always taken in small pieces as it comes (never split in equal halves up
front), so a helper that the operating system deschedules, because another program
has the other core, delays a pass by at most one piece.

No numba threading layer (OpenMP/TBB/workqueue) is involved: nothing extra to compile,
fork-safe (the pool is rebuilt in a child process), and callable from several threads
(dask tasks) at once.  Out of core, dask runs several bands at once and the kernels
stay on one thread each.

Set ``NUMBA_NUM_THREADS=1`` in the environment to keep every kernel on the calling
thread.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["num_threads", "helpers"]

_lock = threading.Lock()
_pool = {"ex": None, "n": 0, "pid": None}


def num_threads() -> int:
    """Threads a kernel may use: ``numba.config.NUMBA_NUM_THREADS`` (the number of
    cores unless the ``NUMBA_NUM_THREADS`` environment variable says otherwise)."""
    try:
        from numba import config
        n = int(config.NUMBA_NUM_THREADS)
    except Exception:  # pragma: no cover
        n = os.cpu_count() or 1
    return max(1, n)


def helpers(n: int) -> ThreadPoolExecutor:
    """A private pool of ``n - 1`` helper threads (the caller is the n-th), rebuilt
    after a fork or when ``n`` changes.

    >>> helpers(2).submit(sum, [1, 2]).result()
    3
    """
    with _lock:
        if _pool["ex"] is None or _pool["n"] != n or _pool["pid"] != os.getpid():
            _pool["ex"] = ThreadPoolExecutor(max_workers=max(1, n - 1), thread_name_prefix="fsll-kernel")
            _pool["n"] = n
            _pool["pid"] = os.getpid()
        return _pool["ex"]
