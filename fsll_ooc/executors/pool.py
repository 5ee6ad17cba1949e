"""Tasks on the kernels' threads of this process, without dask.

The band tasks of a pass run on the caller and the helper threads of
:mod:`fsll_ooc.kernels.threadpool` (:func:`~fsll_ooc.kernels.threadpool.parallel_for`),
:func:`~fsll_ooc.kernels.threadpool.num_threads` at a time, each taking the next band as
it comes; the tasks' own kernels then keep to one thread each.  No task graph is built, so
a pass of many small bands costs no scheduling of its own.

The results are reduced in the order of dask's tree of ``combine`` tasks (groups of
``fan_in`` in band order, level by level), so a pass gives the same bits as with dask's
``"threads"`` scheduler.  A pass ends before its error is raised: once a task has failed,
the tasks not started yet are skipped, and the first error is raised when every task that
began has returned (no task reads or writes the store after the caller has seen it).
"""
from __future__ import annotations

import functools

from ..kernels import threadpool
from .base import Executor, register_executor

__all__ = ["PoolExecutor"]


@register_executor
class PoolExecutor(Executor):
    """Band tasks on this process's kernel threads (``scheduler="pool"``); ``threads``:
    how many at once (default :func:`fsll_ooc.kernels.threadpool.num_threads`, read at each
    pass)."""

    kind = "pool"

    def __init__(self, threads: int | None = None, fan_in: int = 8):
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        self.threads = threads
        self.fan_in = int(fan_in)

    @classmethod
    def accepts(cls, scheduler):
        return isinstance(scheduler, str) and scheduler == cls.kind

    def _n(self) -> int:
        return self.threads if self.threads is not None else threadpool.num_threads()

    def run(self, fn, args):
        out = [None] * len(args)

        def work(i):
            out[i] = fn(*args[i])

        threadpool.parallel_for(self._n(), len(args), work)
        return out

    def run_reduce(self, fn, args, combine):
        level = self.run(fn, args)
        while len(level) > 1:  # dask's reduction tree (DaskExecutor.run_reduce): the same bits
            level = [functools.reduce(combine, level[i:i + self.fan_in]) for i in range(0, len(level), self.fan_in)]
        return level[0]

    def __repr__(self) -> str:
        return f"PoolExecutor(threads={self.threads!r})"
