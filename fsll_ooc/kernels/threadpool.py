"""The private helper threads of the compiled kernels (execution, not math).

In core, one band is the whole table and the learner runs it on the calling thread;
the kernels of :mod:`fsll_ooc.kernels` (the fused update + scan) and
:mod:`fsll_ooc.kernels.transform` (full transforms) then split their work between the
caller and ``n - 1`` helper threads of this module, ``n`` = :func:`num_threads`: the
update + scan hands its helpers work through :func:`fire` (no result, no waiting for a
helper to start), the transforms through the pool of :func:`helpers` (they wait for
their pieces).
Work is always taken in small pieces as it comes (never split in equal halves up
front), so a helper that the operating system deschedules, because another program
has the other core, delays a pass by at most one piece.

No numba threading layer (OpenMP/TBB/workqueue) is involved: nothing extra to compile,
fork-safe (the helpers are rebuilt in a child process), and callable from several threads
(dask tasks) at once.  Out of core, dask runs several bands at once and the kernels
stay on one thread each.

Set ``NUMBA_NUM_THREADS=1`` in the environment to keep every kernel on the calling
thread.
"""
from __future__ import annotations

import functools
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["num_threads", "helpers", "fire"]

_lock = threading.Lock()
_pool = {"ex": None, "n": 0, "pid": None}
_fire = {"q": None, "n": 0, "pid": None}


@functools.cache
def num_threads() -> int:
    """Threads a kernel may use: ``numba.config.NUMBA_NUM_THREADS`` (the number of
    cores unless the ``NUMBA_NUM_THREADS`` environment variable says otherwise; read
    once, as numba does)."""
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


def _serve(q: queue.SimpleQueue) -> None:
    while True:
        fn, args = q.get()
        if fn is None:  # the pool was replaced
            return
        fn(*args)


def fire(n: int, fn, *args) -> None:
    """Run ``fn(*args)`` on each of ``n - 1`` helper threads, without waiting and without
    a result (the compiled passes count their own progress; see
    :func:`fsll_ooc.kernels.scan._run`).  Cheaper than :func:`helpers`' ``submit`` right
    after a pass has flushed the caches (docs/benchmarks.md, section 3).  The helpers are daemon
    threads, rebuilt after a fork or when ``n`` changes.

    >>> import threading
    >>> done = threading.Event()
    >>> fire(2, done.set); done.wait(5)
    True
    """
    with _lock:
        if _fire["q"] is None or _fire["n"] != n or _fire["pid"] != os.getpid():
            if _fire["q"] is not None and _fire["pid"] == os.getpid():
                for _ in range(max(1, _fire["n"] - 1)):
                    _fire["q"].put((None, None))
            q = queue.SimpleQueue()
            for i in range(max(1, n - 1)):
                threading.Thread(target=_serve, args=(q,), name=f"fsll-kernel-{i}", daemon=True).start()
            _fire.update(q=q, n=n, pid=os.getpid())
        q = _fire["q"]
    for _ in range(n - 1):
        q.put((fn, args))
