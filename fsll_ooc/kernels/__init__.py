"""Compiled kernels: the fused update + scan of a block (``scan``), the cache-blocked
transforms (``transform``, running the plans of the pure ``transform_plan``) and the
helper threads they share in core (``threadpool``)."""
from . import scan, threadpool, transform, transform_plan  # noqa: F401
from .scan import *  # noqa: F401,F403
from .scan import __all__ as _scan_all

__all__ = list(_scan_all)
