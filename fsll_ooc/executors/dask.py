"""Tasks as dask delayed calls: dask's local schedulers or a ``dask.distributed`` Client.

With dask a reduction is a tree of small ``combine`` tasks, so no pass gathers a table
into one process: only the per-band champions (a few numbers each) travel.
"""
from __future__ import annotations

import functools
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


def _is_client(scheduler: Any) -> bool:
    """A ``dask.distributed.Client`` (or anything with its ``submit``/``gather``)."""
    return hasattr(scheduler, "submit") and hasattr(scheduler, "gather")


def _combine_many(combine, *parts):
    return functools.reduce(combine, parts)
