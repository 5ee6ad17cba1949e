"""Executors: who runs a pass's band tasks (in the calling thread, on the kernels' threads, dask threads, or dask.distributed).

``base`` holds the interface and the registry; each scheduler is one module that
registers itself on import (``serial``, ``dask``).  Import order is registration order,
which :func:`make_executor` follows.
"""
from .base import Executor, executor_kinds, make_executor, register_executor
from .serial import SerialExecutor
from .dask import DaskExecutor
from .pool import PoolExecutor

__all__ = ["Executor", "SerialExecutor", "DaskExecutor", "PoolExecutor", "make_executor", "register_executor", "executor_kinds"]
