"""Compiled sums over a model's terms for a block of rows: ``l_theta(x) = sum_y theta_y Phi_y(x)``
for each row of a code array (:func:`fsll_ooc.queries.log_potential`).

The numpy form gathers one column of basis values per factor of each term and adds each
term's products to the rows' sums, term after term, allocating a column per factor.  Here
one compiled loop does the same, term after term over the rows of a block, with the same
operations in the same order (a term's factors multiplied in increasing axis order, each
row's sum starting at zero and taking the terms one after another), so the sums are the
same bits, without the temporaries.

>>> import numpy as np
>>> codes_t = np.array([[0, 1], [1, 2]])  # axes x rows: row 0 is (0, 1), row 1 is (1, 2)
>>> # one term on both axes: its factors' value tables (k = 2: phi_1; k = 3: phi_2) side by side
>>> out = np.zeros(2)
>>> term_sums(codes_t, np.array([0.5]), np.array([0, 2]), np.array([0, 1]), np.array([0, 2]),
...           np.array([1.0, -1.0, -1.0, -1.0, 1.0]), out)
>>> out.tolist()
[-0.5, -0.5]
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["term_sums"]


@njit(cache=True, nogil=True)
def term_sums(codes_t, values, starts, axes, offsets, tables, out):  # pragma: no cover - compiled
    """``out[r] = sum_t values[t] * prod_j tables[offsets[j] + codes_t[axes[j], r]]`` over the terms
    ``t`` in order, ``j`` over the factors ``starts[t]:starts[t + 1]`` of term ``t`` in order (a
    term without factors multiplies ``1.0``).  ``codes_t``: axes x rows, each code within its
    axis's range."""
    n = codes_t.shape[1]
    phi = np.empty(n)
    for r in range(n):
        out[r] = 0.0
    for t in range(values.shape[0]):
        a = starts[t]
        b = starts[t + 1]
        v = values[t]
        if a == b:
            for r in range(n):
                out[r] += v * 1.0
            continue
        ax = axes[a]
        off = offsets[a]
        for r in range(n):
            phi[r] = tables[off + codes_t[ax, r]]
        for j in range(a + 1, b):
            ax = axes[j]
            off = offsets[j]
            for r in range(n):
                phi[r] = phi[r] * tables[off + codes_t[ax, r]]
        for r in range(n):
            out[r] += v * phi[r]
