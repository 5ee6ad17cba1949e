"""Executors: who runs a pass's band tasks (in the calling thread, dask threads, or dask.distributed)."""
from .executor import *  # noqa: F401,F403
from .executor import __all__  # noqa: F401
