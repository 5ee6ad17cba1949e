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

Set ``NUMBA_NUM_THREADS=1`` in the environment (or call :func:`set_num_threads`) to
keep every kernel on the calling thread; ``NUMBA_NUM_THREADS=k`` (or ``set_num_threads(k)``)
uses ``k`` threads.
"""
from __future__ import annotations

import functools
import itertools
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

from .. import threads

__all__ = ["num_threads", "set_num_threads", "helpers", "fire", "parallel_for"]

_PREFIX = "fsll-kernel"  # the helper threads' names begin so
_lock = threading.Lock()
_pool = {"ex": None, "n": 0, "pid": None}
_fire = {"q": None, "n": 0, "pid": None}


_chosen = {"n": None}


def num_threads() -> int:
    """Threads a kernel may use: the count given to :func:`set_num_threads`, else
    ``numba.config.NUMBA_NUM_THREADS`` (the number of cores unless the
    ``NUMBA_NUM_THREADS`` environment variable says otherwise; read once, as numba does)."""
    n = _chosen["n"]
    return n if n is not None else _default_threads()


@functools.cache
def _default_threads() -> int:
    try:
        from numba import config
        n = int(config.NUMBA_NUM_THREADS)
    except Exception:  # pragma: no cover
        n = os.cpu_count() or 1
    return max(1, n)


def set_num_threads(n: int | None) -> None:
    """Let the kernels of this process use ``n`` threads from now on (``None``: back to the
    default of :func:`num_threads`), e.g. to measure how a fit scales with the cores.

    >>> set_num_threads(1); num_threads()
    1
    >>> set_num_threads(None)
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"the thread count must be a positive integer or None, got {n!r}")
    _chosen["n"] = n


def helpers(n: int) -> ThreadPoolExecutor:
    """A private pool of ``n - 1`` helper threads (the caller is the n-th), rebuilt
    after a fork or when ``n`` changes.

    >>> helpers(2).submit(sum, [1, 2]).result()
    3
    """
    with _lock:
        if _pool["ex"] is None or _pool["n"] != n or _pool["pid"] != os.getpid():
            _pool["ex"] = threads.pool(max(1, n - 1), _PREFIX)
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


def parallel_for(n: int, count: int, work) -> None:
    """``work(i)`` for ``i`` in ``range(count)`` on the caller and ``n - 1`` helpers of
    :func:`helpers`, each taking the next ``i`` as it comes (the work must release the
    GIL to gain: compiled kernels, numpy on large arrays).  The caller waits for the pieces,
    not for the helpers: a helper that starts late (another program has the other core)
    finds every piece taken and leaves, so it delays nothing.  Every piece that began has
    ended when this returns or raises; after a failure the pieces not begun are skipped and
    the first error is raised.

    >>> out = [0] * 5
    >>> parallel_for(2, 5, lambda i: out.__setitem__(i, i * i)); out
    [0, 1, 4, 9, 16]
    """
    if n <= 1 or count <= 1 or threading.current_thread().name.startswith(_PREFIX):
        # a piece of a parallel_for (or of a transform) runs its own loops on its own thread:
        # waiting there for pieces queued behind the pieces that wait could never end
        for i in range(count):
            work(i)
        return
    # The caller never holds a lock that a helper needs: Ctrl-C (KeyboardInterrupt) reaches
    # the main thread between any two bytecodes, also just after a lock was taken and before
    # the ``with`` that would release it began, and a helper then blocked on that lock would
    # keep the interpreter's exit (which joins the helpers) waiting for ever.  So only the
    # helpers take ``mu``; the caller sets ``stop`` and reads ``active`` (each helper counts
    # itself in before it checks ``stop``, the caller sets ``stop`` before it reads ``active``:
    # under the GIL one of them sees the other), and waits on ``wake``, which the helpers
    # release and the caller only acquires.
    nxt = itertools.count()  # next() is atomic under the GIL
    failed: list = []
    stop = [False]
    active = [0]
    mu = threading.Lock()
    wake = threading.Lock()
    wake.acquire()

    def helper():
        while True:
            with mu:
                active[0] += 1
            try:
                if stop[0] or failed:
                    return
                i = next(nxt)
                if i >= count:
                    return
                try:
                    work(i)
                except BaseException as exc:  # noqa: BLE001 - raised by the caller below
                    failed.append(exc)
            finally:
                with mu:
                    active[0] -= 1
                    if active[0] == 0 and wake.locked():
                        wake.release()

    ex = helpers(n)
    pending: list = []
    started = False
    while True:  # one try around it all: the interrupt may land at any bytecode
        try:
            if not started:
                started = True
                for _ in range(min(n, count) - 1):
                    ex.submit(helper)
                while not failed:
                    i = next(nxt)
                    if i >= count:
                        break
                    work(i)
            # no piece begins from now on, and every piece that began ends before this returns
            stop[0] = True
            while active[0]:
                wake.acquire(timeout=0.05)
            break
        except BaseException as exc:  # noqa: BLE001 - raised below, once no helper is in a piece
            pending.append(exc)
    if pending:
        raise pending[0]
    if failed:
        raise failed[0]
