"""Scheduling of chunk-parallel passes: serial, dask threads, or a dask.distributed Client.

A pass is a list of independent band tasks; some passes also reduce the per-band
results (the best candidate of each band) to one value.  With dask the reduction is
a tree of small ``combine`` tasks, so no pass gathers a table into one process: only
the per-band champions (a few numbers each) travel.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

__all__ = ["Executor", "SerialExecutor", "DaskExecutor", "make_executor"]


class Executor:
    """Runs the tasks of one pass."""

    parallel_kernels = False  # may a task use multi-threaded kernels?
    distributed = False

    def run(self, fn: Callable, args: Sequence[tuple]) -> list:
        raise NotImplementedError

    def run_reduce(self, fn: Callable, args: Sequence[tuple], combine: Callable[[Any, Any], Any]) -> Any:
        raise NotImplementedError


class SerialExecutor(Executor):
    """Tasks one after the other in this thread; kernels may use all cores."""

    parallel_kernels = True

    def run(self, fn, args):
        return [fn(*a) for a in args]

    def run_reduce(self, fn, args, combine):
        return functools.reduce(combine, (fn(*a) for a in args))

    def __repr__(self) -> str:
        return "SerialExecutor()"


class DaskExecutor(Executor):
    """Tasks as dask delayed calls: ``scheduler`` is ``"threads"``, ``"synchronous"``,
    ``"processes"`` or a ``dask.distributed.Client``."""

    def __init__(self, scheduler: Any = "threads", fan_in: int = 8):
        self.scheduler = scheduler
        self.fan_in = fan_in
        self.distributed = hasattr(scheduler, "submit") and hasattr(scheduler, "gather")

    def _compute(self, objs):
        import dask

        if self.distributed:
            futs = self.scheduler.compute(list(objs))
            return self.scheduler.gather(futs)
        return list(dask.compute(*objs, scheduler=self.scheduler))

    @staticmethod
    def _tasks(fn, args):
        # functools.partial keeps dask from traversing our (dataclass) arguments on every call
        from dask import delayed

        return [delayed(functools.partial(fn, *a), pure=False)() for a in args]

    def run(self, fn, args):
        return self._compute(self._tasks(fn, args))

    def run_reduce(self, fn, args, combine):
        from dask import delayed

        level = self._tasks(fn, args)
        comb = delayed(_combine_many, pure=True)
        while len(level) > 1:
            level = [comb(combine, *level[i:i + self.fan_in]) for i in range(0, len(level), self.fan_in)]
        return self._compute(level)[0]

    def __repr__(self) -> str:
        return f"DaskExecutor({self.scheduler!r})"


def _combine_many(combine, *parts):
    return functools.reduce(combine, parts)


def make_executor(scheduler: Any, n_tasks_hint: int = 1) -> Executor:
    """``None`` picks serial for one band, dask threads otherwise; strings and Clients go to dask."""
    if isinstance(scheduler, Executor):
        return scheduler
    if scheduler is None:
        return SerialExecutor() if n_tasks_hint <= 1 else DaskExecutor("threads")
    if scheduler in ("serial", "sync-serial"):
        return SerialExecutor()
    return DaskExecutor(scheduler)
