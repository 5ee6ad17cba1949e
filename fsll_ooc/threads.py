"""Thread pools that let the interpreter exit after an interrupt.

At exit Python joins every non-daemon thread, and :mod:`concurrent.futures` first wakes
the idle workers of its pools, but only the workers it has registered.  A
``KeyboardInterrupt`` (Ctrl-C, or SIGTERM, which the command line raises as one) that
lands in the caller's ``submit`` after a new worker has started and before it is
registered leaves a worker waiting for work that nothing will ever send, and the process
hangs at exit instead of ending.  The executors made by :func:`pool` are shut down without
waiting as soon as the interpreter begins to exit, before the threads are joined: that
wakes every worker of the pool, registered or not, and each ends after the work it is
running (a write in flight still completes).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["pool"]

_made: list[ThreadPoolExecutor] = []
_lock = threading.Lock()


def pool(size: int, name: str) -> ThreadPoolExecutor:
    """A new :class:`~concurrent.futures.ThreadPoolExecutor` of ``size`` threads called
    ``name``, woken and shut down (without waiting) when the interpreter begins to exit.

    >>> pool(2, "example").submit(sum, [1, 2]).result()
    3
    """
    ex = ThreadPoolExecutor(size, thread_name_prefix=name)
    with _lock:
        _made.append(ex)
    return ex


def _wake_at_exit() -> None:
    with _lock:
        made = list(_made)
    for ex in made:
        ex.shutdown(wait=False)


# Runs before the interpreter joins its threads (plain ``atexit`` runs after: too late).
# A CPython hook that concurrent.futures itself uses; where it is missing, the exit
# stays as the standard library makes it.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_wake_at_exit)
