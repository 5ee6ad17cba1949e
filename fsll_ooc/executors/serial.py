"""Tasks one after the other in the calling thread."""
from __future__ import annotations

import functools

from .base import Executor, register_executor

__all__ = ["SerialExecutor"]


@register_executor
class SerialExecutor(Executor):
    """Tasks one after the other in this thread; kernels may use all cores."""

    kind = "serial"
    _names = ("serial", "sync-serial")
    parallel_kernels = True

    @classmethod
    def accepts(cls, scheduler):
        return isinstance(scheduler, str) and scheduler in cls._names

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return cls._names

    def run(self, fn, args):
        return [fn(*a) for a in args]

    def run_reduce(self, fn, args, combine):
        return functools.reduce(combine, (fn(*a) for a in args))

    def __repr__(self) -> str:
        return "SerialExecutor()"
