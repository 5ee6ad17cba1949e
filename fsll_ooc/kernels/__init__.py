"""Compiled kernels: the fused update + scan of a block (``scan``), the cache-blocked
transforms (``transform``, running the plans of the pure ``transform_plan``), the
helper threads they share in core (``threadpool``) and the compiling of the scan
kernels in a second process during a fit's first transforms (``ahead``).  numba's cache
of these kernels is keyed on all their sources (``cache_key``), before any is compiled."""
from . import cache_key

cache_key.install()

from . import ahead, scan, threadpool, transform, transform_plan  # noqa: E402,F401
from .scan import *  # noqa: F401,F403
from .scan import __all__ as _scan_all

__all__ = list(_scan_all) + ["prepare_fit"]


def prepare_fit(cards) -> None:
    """Compile (the first use after installing) or load from numba's cache the kernels a
    fit of a table with cardinalities ``cards`` runs: the float64 transform driver that
    ``cards`` need, and the fused update + scan with its reductions, compiled in a second
    process meanwhile (:mod:`fsll_ooc.kernels.ahead`)."""
    import numpy as np

    ahead.start(scan.__name__)
    transform.warmup((np.float64,), cards=cards)
    for disp, sig in scan.fit_kernels()[1:]:
        disp.compile(sig)
    ahead.wait(scan.__name__)
    for disp, sig in scan.fit_kernels()[:1]:
        disp.compile(sig)
