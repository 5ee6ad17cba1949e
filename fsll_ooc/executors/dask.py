"""Tasks as dask delayed calls: dask's local schedulers or a ``dask.distributed`` Client.

With dask a reduction is a tree of small ``combine`` tasks, so no pass gathers a table
into one process: only the per-band champions (a few numbers each) travel.

A pass ends before its error is raised.  dask raises a task's exception as soon as it
arrives, while the pass's other tasks may still be reading or writing the store's files;
the caller would then release the store's lock (or the user delete a damaged file) under
their feet.  So each task runs inside a guard that returns its exception as a value; once
one task has failed, the tasks not started yet return at once (in this process), and the
first exception is raised when every task has returned.
"""
from __future__ import annotations

import functools
import threading
from typing import Any

from .base import Executor, register_executor

__all__ = ["DaskExecutor"]


@register_executor
class DaskExecutor(Executor):
    """Tasks as dask delayed calls: ``scheduler`` is ``"threads"``, ``"synchronous"``,
    ``"processes"`` or a ``dask.distributed.Client``."""

    kind = "dask"

    def __init__(self, scheduler: Any = "threads", fan_in: int = 8):
        self.scheduler = scheduler
        self.fan_in = fan_in
        self.distributed = _is_client(scheduler)

    @classmethod
    def accepts(cls, scheduler):
        return _is_client(scheduler) or (isinstance(scheduler, str) and scheduler in cls.names())

    @staticmethod
    def names() -> tuple[str, ...]:
        """dask's named schedulers (``"threads"``, ``"synchronous"``, ``"processes"``, ...)."""
        from dask.base import named_schedulers

        return tuple(named_schedulers)

    @classmethod
    def from_scheduler(cls, scheduler):
        return cls(scheduler)

    def _compute(self, objs):
        import dask

        if self.distributed:
            futs = self.scheduler.compute(list(objs))
            return self.scheduler.gather(futs)
        return list(dask.compute(*objs, scheduler=self.scheduler))

    @staticmethod
    def _tasks(fn, args, guard):
        # functools.partial keeps dask from traversing our (dataclass) arguments on every call
        from dask import delayed

        return [delayed(functools.partial(guard, fn, *a), pure=False)() for a in args]

    def run(self, fn, args):
        guard = _Guard()
        out = self._compute(self._tasks(fn, args, guard))
        failed = [r for r in out if isinstance(r, _Outcome)]
        if failed:
            guard.raise_first(failed)
        return out

    def run_reduce(self, fn, args, combine):
        from dask import delayed

        guard = _Guard()
        level = self._tasks(fn, args, guard)
        comb = delayed(_combine_many, pure=True)
        while len(level) > 1:
            level = [comb(combine, *level[i:i + self.fan_in]) for i in range(0, len(level), self.fan_in)]
        out = self._compute(level)[0]
        if isinstance(out, _Outcome):
            guard.raise_first([out])
        return out

    def __repr__(self) -> str:
        return f"DaskExecutor({self.scheduler!r})"


def _is_client(scheduler: Any) -> bool:
    """A ``dask.distributed.Client`` (or anything with its ``submit``/``gather``)."""
    return hasattr(scheduler, "submit") and hasattr(scheduler, "gather")


class _Outcome:
    """A task that did not return a value: it raised ``exc``, or (``exc`` None) it was
    skipped because another task of its pass had failed."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException | None):
        self.exc = exc


class _Guard:
    """Runs the tasks of one pass: a task's exception becomes an :class:`_Outcome` value,
    and after a failure the tasks not started yet in this process are skipped.

    Pickled to other processes (dask's ``processes`` scheduler, a distributed cluster) it
    arrives without its flag: there every task runs, and the pass still ends before the
    error is raised."""

    def __init__(self):
        self._lock = threading.Lock()
        self._first: BaseException | None = None

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def __call__(self, fn, *args):
        if self._first is not None:
            return _Outcome(None)
        try:
            return fn(*args)
        except Exception as exc:
            with self._lock:
                if self._first is None:
                    self._first = exc
            return _Outcome(exc)

    def raise_first(self, outcomes):
        """Raise the pass's first error: the first in time where this process saw it, else
        the first of ``outcomes`` (in task order)."""
        exc = self._first
        if exc is None:
            exc = next((o.exc for o in outcomes if o.exc is not None), None)
        if exc is None:  # pragma: no cover - a skip is only ever caused by a failure
            raise RuntimeError("a pass's tasks were skipped without a failure")
        raise exc


def _combine_many(combine, *parts):
    failed = [p for p in parts if isinstance(p, _Outcome)]
    if failed:  # an error travels up the reduction tree (before a skip)
        return next((p for p in failed if p.exc is not None), failed[0])
    return functools.reduce(combine, parts)
