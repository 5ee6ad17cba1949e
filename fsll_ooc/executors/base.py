"""The executor interface and the registry of schedulers by kind.

A pass is a list of independent band tasks; some passes also reduce the per-band
results (the best candidate of each band) to one value.  An :class:`Executor` runs
the tasks of one pass (:meth:`~Executor.run`) or runs and reduces them
(:meth:`~Executor.run_reduce`).  Executors are registered by kind
(:func:`register_executor`); :func:`make_executor` turns the estimator's
``scheduler`` parameter into one.  A new scheduler is one new module in this package
that subclasses :class:`Executor`, registers itself and is imported by
``fsll_ooc/executors/__init__.py``.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["Executor", "register_executor", "executor_kinds", "make_executor"]


class Executor:
    """Runs the tasks of one pass.

    ``kind``: the name it is registered under; :meth:`accepts` says whether a
    ``scheduler`` value asks for this executor and :meth:`from_scheduler` builds it.
    """

    kind: str = ""
    parallel_kernels = False  # may a task use multi-threaded kernels (bands run one at a time)?
    distributed = False  # do tasks run in other processes (no progress bar per task)?

    def run(self, fn: Callable, args: Sequence[tuple]) -> list:
        """``[fn(*a) for a in args]``, in any order of execution, results in order."""
        raise NotImplementedError

    def run_reduce(self, fn: Callable, args: Sequence[tuple], combine: Callable[[Any, Any], Any]) -> Any:
        """``functools.reduce(combine, [fn(*a) for a in args])`` (``combine`` is associative)."""
        raise NotImplementedError

    @classmethod
    def accepts(cls, scheduler: Any) -> bool:
        """Does the ``scheduler`` value (a string, a client object, ...) ask for this executor?"""
        return False

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The ``scheduler`` strings this executor accepts (for error messages)."""
        return (cls.kind,)

    @classmethod
    def from_scheduler(cls, scheduler: Any) -> "Executor":
        """An executor for a ``scheduler`` value this class accepts."""
        return cls()


_REGISTRY: dict[str, type[Executor]] = {}


def register_executor(cls: type[Executor]) -> type[Executor]:
    """Register an :class:`Executor` subclass under its ``kind`` (usable as a class decorator).

    :func:`make_executor` asks the registered classes in registration order which one
    accepts a ``scheduler`` value.
    """
    if not (isinstance(cls, type) and issubclass(cls, Executor)) or not cls.kind:
        raise TypeError(f"register_executor needs an Executor subclass with a kind, got {cls!r}")
    _REGISTRY[cls.kind] = cls
    return cls


def executor_kinds() -> tuple[str, ...]:
    """The kinds of the registered executors, in registration order."""
    return tuple(_REGISTRY)


def make_executor(scheduler: Any, n_tasks_hint: int = 1, workers: int | None = None) -> Executor:
    """The executor for the estimator's ``scheduler`` parameter.

    An :class:`Executor` is used as it is; ``None`` picks ``"serial"`` for one band and
    ``"pool"`` (the bands on the kernels' threads, without dask) otherwise, running at most
    ``workers`` bands at once where given (the plan's: its memory budget holds that many
    tasks); any other value goes to the first registered kind that accepts it (``"serial"``,
    ``"pool"``; dask's scheduler names and ``dask.distributed.Client`` objects).
    """
    if isinstance(scheduler, Executor):
        return scheduler
    if scheduler is None:
        if n_tasks_hint > 1:
            return _REGISTRY["pool"](threads=workers)
        scheduler = "serial"
    for cls in _REGISTRY.values():
        if cls.accepts(scheduler):
            return cls.from_scheduler(scheduler)
    known = [n for cls in _REGISTRY.values() for n in cls.names()]
    raise ValueError(f"unknown scheduler {scheduler!r}; use None, an Executor, one of {known} "
                     "or a dask.distributed Client")
