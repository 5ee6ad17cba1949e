"""Fast in-place local transforms of dense ``|X|`` tables (numba kernels).

:func:`transform_inplace` computes what :func:`fsll_ooc.basis.transform` computes
(the dimension-by-dimension local transform ``T``, or ``T^T``), in place and in few
passes over memory:

* Power-of-two axes are butterfly stages of Walsh-Hadamard transforms (Sylvester
  order factorises: ``H_{2^a} (x) H_{2^b} = H_{2^{a+b}}``, so stages of neighbouring
  axes combine).  Up to three consecutive stages whose strides are ``h, 2h, 4h`` (in
  any order) are fused into one radix-8 (or radix-4) sweep that reads and writes each
  element once; the split of the stage sequence into sweeps minimises a measured cost
  table (:func:`fsll_ooc.kernels.transform_plan._chunk_stages`).
* The table is cut into *groups* of adjacent axes.  The innermost group is transformed
  block by contiguous block (``_BLOCK_BYTES``), in place.  An outer group is
  transformed in *tiles*: its ``R`` index rows by ``w`` contiguous columns
  (``_TILE_BYTES``, rows of at least ``_MIN_ROW_BYTES``) are gathered into a padded
  L2-resident buffer, transformed there (every stride a multiple of the row pitch, so
  the loops vectorise) and scattered back.  A ``2^24`` binary table takes two passes
  over memory, ``2^30`` three (:func:`fsll_ooc.kernels.transform_plan.plan` shows the
  passes; this module runs the plan).
* Inside a block or tile, consecutive sweeps whose butterflies stay within 32 KiB (L1)
  or 256 KiB (L2) sub-blocks run sub-block by sub-block.
* ``+-1`` axes use the O(k) formulas of ``basis.transform_axis``.
* Tiles are independent.  The kernels release the GIL, and large tables are shared
  between a small pool of Python threads (``parallel=True``) that take chunks of tiles
  as they come.  No numba threading layer (OpenMP/TBB/workqueue) is involved: nothing
  extra to compile, fork-safe, and callable from several threads (dask) at once.

Floating point: the operations are the reference's own (``a + b``, ``a - b``,
``2 g - S``, ``2 g_0 - S + 2 g_l``) in the reference's order: axes ascending and,
within a power-of-two axis, low bit first; the ``+-1`` sums in numpy's summation
order (sequential, or numpy's pairwise sum along the last axis).  So for
``axes=None`` (or ascending ``axes``) the result is normally bit-identical to the
reference.  The exception is a power-of-two axis of cardinality >= 4 that straddles
two groups (its high bits are then done first), which differs by rounding only
(~1e-16 of the table's scale).  float32 is computed in float32, as numpy does.

Kernel notes: all index arithmetic is ``uint64`` (with signed indices numba emits
negative-index wraparound checks that stop LLVM from vectorising); strides are re-read
from the program array for every block, which keeps LLVM's run-time alias checks per
block (hoisted out of the block loop they always fail); strides below 8 use scalar
kernels and the radix-8 sweep at stride 8 constant-stride ones.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np
from numba import njit

from . import ahead, threadpool
from .transform_plan import C_PAT, C_SPAN, NCOL, PMF, PMT, R2, R4, R8, axis_index, plan_for

__all__ = ["transform_inplace", "transform_sparse", "sparse_kernels_ready", "warmup", "REFERENCE_FIRST_MAX_SIZE",
           "SPARSE_SHARE"]

# Sub-blocks (bytes) for consecutive program rows acting within them (L1, L2).
_SUB1_BYTES = 1 << 15
_SUB2_BYTES = 1 << 18
# Tables smaller than this (elements) are done on the calling thread only.
_PAR_MIN_SIZE = 1 << 21
# Work chunks per thread and pass (taken dynamically).
_CHUNKS_PER_THREAD = 4
# How many fibres a +-1 kernel keeps sums for (scratch length).
_PM_CHUNK = 256
#: ``first_use="reference"``: tables up to this many elements are done by the numpy
#: reference while the compiled driver is neither loaded nor in numba's cache.
REFERENCE_FIRST_MAX_SIZE = 1 << 22

# Program rows and passes: the format of :mod:`fsll_ooc.kernels.transform_plan`.

# ---------------------------------------------------------------------------------
# Butterfly kernels (generated straight-line code).  The region is x[base:base+n];
# each block of r*h elements holds h fibres of length r.
# ---------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _r2(x, base, n, p, i):
    """Radix-2 butterflies: fibres x[b + o_k + j], o_k = p[i, 2 + k], j < h = p[i, 1]."""
    step = p[i, 1] * np.uint64(2)
    for b in range(base, base + n, step):
        h = p[i, 1]  # re-read for every block: LLVM's alias checks stay per block
        q1 = b + p[i, 3]
        for j in range(h):
            x0 = x[b + j]
            x1 = x[q1 + j]
            t0 = x0 + x1
            t1 = x0 - x1
            x[b + j] = t0
            x[q1 + j] = t1


@njit(cache=True, nogil=True)
def _r4(x, base, n, p, i):
    """Radix-4 butterflies: fibres x[b + o_k + j], o_k = p[i, 2 + k], j < h = p[i, 1]."""
    step = p[i, 1] * np.uint64(4)
    for b in range(base, base + n, step):
        h = p[i, 1]  # re-read for every block: LLVM's alias checks stay per block
        q1 = b + p[i, 3]
        q2 = b + p[i, 4]
        q3 = b + p[i, 5]
        for j in range(h):
            x0 = x[b + j]
            x1 = x[q1 + j]
            x2 = x[q2 + j]
            x3 = x[q3 + j]
            t0 = x0 + x1
            t1 = x0 - x1
            t2 = x2 + x3
            t3 = x2 - x3
            t4 = t0 + t2
            t5 = t0 - t2
            t6 = t1 + t3
            t7 = t1 - t3
            x[b + j] = t4
            x[q1 + j] = t6
            x[q2 + j] = t5
            x[q3 + j] = t7


@njit(cache=True, nogil=True)
def _r8(x, base, n, p, i):
    """Radix-8 butterflies: fibres x[b + o_k + j], o_k = p[i, 2 + k], j < h = p[i, 1]."""
    step = p[i, 1] * np.uint64(8)
    for b in range(base, base + n, step):
        h = p[i, 1]  # re-read for every block: LLVM's alias checks stay per block
        q1 = b + p[i, 3]
        q2 = b + p[i, 4]
        q3 = b + p[i, 5]
        q4 = b + p[i, 6]
        q5 = b + p[i, 7]
        q6 = b + p[i, 8]
        q7 = b + p[i, 9]
        for j in range(h):
            x0 = x[b + j]
            x1 = x[q1 + j]
            x2 = x[q2 + j]
            x3 = x[q3 + j]
            x4 = x[q4 + j]
            x5 = x[q5 + j]
            x6 = x[q6 + j]
            x7 = x[q7 + j]
            t0 = x0 + x1
            t1 = x0 - x1
            t2 = x2 + x3
            t3 = x2 - x3
            t4 = x4 + x5
            t5 = x4 - x5
            t6 = x6 + x7
            t7 = x6 - x7
            t8 = t0 + t2
            t9 = t0 - t2
            t10 = t1 + t3
            t11 = t1 - t3
            t12 = t4 + t6
            t13 = t4 - t6
            t14 = t5 + t7
            t15 = t5 - t7
            t16 = t8 + t12
            t17 = t8 - t12
            t18 = t10 + t14
            t19 = t10 - t14
            t20 = t9 + t13
            t21 = t9 - t13
            t22 = t11 + t15
            t23 = t11 - t15
            x[b + j] = t16
            x[q1 + j] = t18
            x[q2 + j] = t20
            x[q3 + j] = t22
            x[q4 + j] = t17
            x[q5 + j] = t19
            x[q6 + j] = t21
            x[q7 + j] = t23


@njit(cache=True, nogil=True)
def _r2s(x, base, n, p, i):
    """Radix-2 butterflies at a small stride h = p[i, 1] < 8, fibre by fibre (offsets
    read once: per-block reloads and alias checks would cost more than the work)."""
    h = p[i, 1]
    o1 = p[i, 3]
    one = np.uint64(1)
    if h == one and o1 == one:  # the table's last axis: a constant offset (the loop vectorises)
        for q in range(base, base + n, np.uint64(2)):
            x0 = x[q]
            x1 = x[q + one]
            t0 = x0 + x1
            t1 = x0 - x1
            x[q] = t0
            x[q + one] = t1
    elif h == one:
        for q in range(base, base + n, np.uint64(2)):
            x0 = x[q]
            x1 = x[q + o1]
            t0 = x0 + x1
            t1 = x0 - x1
            x[q] = t0
            x[q + o1] = t1
    else:
        for b in range(base, base + n, h * np.uint64(2)):
            for j in range(b, b + h):
                x0 = x[j]
                x1 = x[j + o1]
                t0 = x0 + x1
                t1 = x0 - x1
                x[j] = t0
                x[j + o1] = t1


@njit(cache=True, nogil=True)
def _r4s(x, base, n, p, i):
    """Radix-4 butterflies at a small stride h = p[i, 1] < 8, fibre by fibre (offsets
    read once: per-block reloads and alias checks would cost more than the work)."""
    h = p[i, 1]
    o1 = p[i, 3]
    o2 = p[i, 4]
    o3 = p[i, 5]
    if h == np.uint64(1):
        for q in range(base, base + n, np.uint64(4)):
            x0 = x[q]
            x1 = x[q + o1]
            x2 = x[q + o2]
            x3 = x[q + o3]
            t0 = x0 + x1
            t1 = x0 - x1
            t2 = x2 + x3
            t3 = x2 - x3
            t4 = t0 + t2
            t5 = t0 - t2
            t6 = t1 + t3
            t7 = t1 - t3
            x[q] = t4
            x[q + o1] = t6
            x[q + o2] = t5
            x[q + o3] = t7
    else:
        for b in range(base, base + n, h * np.uint64(4)):
            for j in range(b, b + h):
                x0 = x[j]
                x1 = x[j + o1]
                x2 = x[j + o2]
                x3 = x[j + o3]
                t0 = x0 + x1
                t1 = x0 - x1
                t2 = x2 + x3
                t3 = x2 - x3
                t4 = t0 + t2
                t5 = t0 - t2
                t6 = t1 + t3
                t7 = t1 - t3
                x[j] = t4
                x[j + o1] = t6
                x[j + o2] = t5
                x[j + o3] = t7


@njit(cache=True, nogil=True)
def _r8s(x, base, n, p, i):
    """Radix-8 butterflies at a small stride h = p[i, 1] < 8, fibre by fibre (offsets
    read once: per-block reloads and alias checks would cost more than the work)."""
    h = p[i, 1]
    o1 = p[i, 3]
    o2 = p[i, 4]
    o3 = p[i, 5]
    o4 = p[i, 6]
    o5 = p[i, 7]
    o6 = p[i, 8]
    o7 = p[i, 9]
    if h == np.uint64(1):
        for q in range(base, base + n, np.uint64(8)):
            x0 = x[q]
            x1 = x[q + o1]
            x2 = x[q + o2]
            x3 = x[q + o3]
            x4 = x[q + o4]
            x5 = x[q + o5]
            x6 = x[q + o6]
            x7 = x[q + o7]
            t0 = x0 + x1
            t1 = x0 - x1
            t2 = x2 + x3
            t3 = x2 - x3
            t4 = x4 + x5
            t5 = x4 - x5
            t6 = x6 + x7
            t7 = x6 - x7
            t8 = t0 + t2
            t9 = t0 - t2
            t10 = t1 + t3
            t11 = t1 - t3
            t12 = t4 + t6
            t13 = t4 - t6
            t14 = t5 + t7
            t15 = t5 - t7
            t16 = t8 + t12
            t17 = t8 - t12
            t18 = t10 + t14
            t19 = t10 - t14
            t20 = t9 + t13
            t21 = t9 - t13
            t22 = t11 + t15
            t23 = t11 - t15
            x[q] = t16
            x[q + o1] = t18
            x[q + o2] = t20
            x[q + o3] = t22
            x[q + o4] = t17
            x[q + o5] = t19
            x[q + o6] = t21
            x[q + o7] = t23
    else:
        for b in range(base, base + n, h * np.uint64(8)):
            for j in range(b, b + h):
                x0 = x[j]
                x1 = x[j + o1]
                x2 = x[j + o2]
                x3 = x[j + o3]
                x4 = x[j + o4]
                x5 = x[j + o5]
                x6 = x[j + o6]
                x7 = x[j + o7]
                t0 = x0 + x1
                t1 = x0 - x1
                t2 = x2 + x3
                t3 = x2 - x3
                t4 = x4 + x5
                t5 = x4 - x5
                t6 = x6 + x7
                t7 = x6 - x7
                t8 = t0 + t2
                t9 = t0 - t2
                t10 = t1 + t3
                t11 = t1 - t3
                t12 = t4 + t6
                t13 = t4 - t6
                t14 = t5 + t7
                t15 = t5 - t7
                t16 = t8 + t12
                t17 = t8 - t12
                t18 = t10 + t14
                t19 = t10 - t14
                t20 = t9 + t13
                t21 = t9 - t13
                t22 = t11 + t15
                t23 = t11 - t15
                x[j] = t16
                x[j + o1] = t18
                x[j + o2] = t20
                x[j + o3] = t22
                x[j + o4] = t17
                x[j + o5] = t19
                x[j + o6] = t21
                x[j + o7] = t23


@njit(cache=True, nogil=True)
def _r8a_h8(x, base, n, p, i):
    """Radix-8 at h = 8, ascending stages (constant strides: no run-time alias checks)."""
    h = np.uint64(8)
    step = np.uint64(64)
    for b in range(base, base + n, step):
        q1 = b + np.uint64(8)
        q2 = b + np.uint64(16)
        q3 = b + np.uint64(24)
        q4 = b + np.uint64(32)
        q5 = b + np.uint64(40)
        q6 = b + np.uint64(48)
        q7 = b + np.uint64(56)
        for j in range(h):
            x0 = x[b + j]
            x1 = x[q1 + j]
            x2 = x[q2 + j]
            x3 = x[q3 + j]
            x4 = x[q4 + j]
            x5 = x[q5 + j]
            x6 = x[q6 + j]
            x7 = x[q7 + j]
            t0 = x0 + x1
            t1 = x0 - x1
            t2 = x2 + x3
            t3 = x2 - x3
            t4 = x4 + x5
            t5 = x4 - x5
            t6 = x6 + x7
            t7 = x6 - x7
            t8 = t0 + t2
            t9 = t0 - t2
            t10 = t1 + t3
            t11 = t1 - t3
            t12 = t4 + t6
            t13 = t4 - t6
            t14 = t5 + t7
            t15 = t5 - t7
            t16 = t8 + t12
            t17 = t8 - t12
            t18 = t10 + t14
            t19 = t10 - t14
            t20 = t9 + t13
            t21 = t9 - t13
            t22 = t11 + t15
            t23 = t11 - t15
            x[b + j] = t16
            x[q1 + j] = t18
            x[q2 + j] = t20
            x[q3 + j] = t22
            x[q4 + j] = t17
            x[q5 + j] = t19
            x[q6 + j] = t21
            x[q7 + j] = t23


@njit(cache=True, nogil=True)
def _r8d_h8(x, base, n, p, i):
    """Radix-8 at h = 8, descending stages (constant strides: no run-time alias checks)."""
    h = np.uint64(8)
    step = np.uint64(64)
    for b in range(base, base + n, step):
        q1 = b + np.uint64(32)
        q2 = b + np.uint64(16)
        q3 = b + np.uint64(48)
        q4 = b + np.uint64(8)
        q5 = b + np.uint64(40)
        q6 = b + np.uint64(24)
        q7 = b + np.uint64(56)
        for j in range(h):
            x0 = x[b + j]
            x1 = x[q1 + j]
            x2 = x[q2 + j]
            x3 = x[q3 + j]
            x4 = x[q4 + j]
            x5 = x[q5 + j]
            x6 = x[q6 + j]
            x7 = x[q7 + j]
            t0 = x0 + x1
            t1 = x0 - x1
            t2 = x2 + x3
            t3 = x2 - x3
            t4 = x4 + x5
            t5 = x4 - x5
            t6 = x6 + x7
            t7 = x6 - x7
            t8 = t0 + t2
            t9 = t0 - t2
            t10 = t1 + t3
            t11 = t1 - t3
            t12 = t4 + t6
            t13 = t4 - t6
            t14 = t5 + t7
            t15 = t5 - t7
            t16 = t8 + t12
            t17 = t8 - t12
            t18 = t10 + t14
            t19 = t10 - t14
            t20 = t9 + t13
            t21 = t9 - t13
            t22 = t11 + t15
            t23 = t11 - t15
            x[b + j] = t16
            x[q1 + j] = t18
            x[q2 + j] = t20
            x[q3 + j] = t22
            x[q4 + j] = t17
            x[q5 + j] = t19
            x[q6 + j] = t21
            x[q7 + j] = t23



# ---------------------------------------------------------------------------------
# +-1 basis kernels
# ---------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _pw_base(x, q, n):
    """``sum(x[q:q+n])`` for ``n <= 128`` in numpy's pairwise order (``add.reduce`` over
    a contiguous axis), so that sums along the table's last axis match the reference."""
    one = np.uint64(1)
    eight = np.uint64(8)
    if n < eight:
        res = x[q]
        for l in range(q + one, q + n):
            res += x[l]
        return res
    r0 = x[q]
    r1 = x[q + np.uint64(1)]
    r2 = x[q + np.uint64(2)]
    r3 = x[q + np.uint64(3)]
    r4 = x[q + np.uint64(4)]
    r5 = x[q + np.uint64(5)]
    r6 = x[q + np.uint64(6)]
    r7 = x[q + np.uint64(7)]
    end8 = q + n - n % eight
    for i in range(q + eight, end8, eight):
        r0 += x[i]
        r1 += x[i + np.uint64(1)]
        r2 += x[i + np.uint64(2)]
        r3 += x[i + np.uint64(3)]
        r4 += x[i + np.uint64(4)]
        r5 += x[i + np.uint64(5)]
        r6 += x[i + np.uint64(6)]
        r7 += x[i + np.uint64(7)]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(end8, q + n):
        res += x[i]
    return res


_COMBINE = 1 << 63


@njit(cache=True, nogil=True)
def _pairwise(x, q, n, sq, sn, sv):
    """numpy's pairwise sum for any ``n``: its recursion (halves rounded to multiples
    of 8, blocks of <= 128 summed by ``_pw_base``) evaluated with explicit stacks."""
    lim = np.uint64(128)
    if n <= lim:
        return _pw_base(x, q, n)
    flag = np.uint64(_COMBINE)
    eight = np.uint64(8)
    top = 0
    vtop = 0
    sq[0] = q
    sn[0] = n
    top = 1
    while top > 0:
        top -= 1
        cq = sq[top]
        cn = sn[top]
        if cn == flag:
            b = sv[vtop - 1]
            a = sv[vtop - 2]
            sv[vtop - 2] = a + b
            vtop -= 1
        elif cn <= lim:
            sv[vtop] = _pw_base(x, cq, cn)
            vtop += 1
        else:
            n2 = cn // np.uint64(2)
            n2 -= n2 % eight
            sq[top] = cq
            sn[top] = flag
            sq[top + 1] = cq + n2
            sn[top + 1] = cn - n2
            sq[top + 2] = cq
            sn[top + 2] = n2
            top += 3
    return sv[0]


@njit(cache=True, nogil=True)
def _pm_c(x, base, n, k, tr):
    """+-1 basis on fibres of ``k`` consecutive elements (the table's last axis).  The
    common small k are written out (loops of 2-6 iterations per fibre cost several times more)."""
    one = np.uint64(1)
    eight = np.uint64(8)
    lim = np.uint64(128)
    # explicit stacks for _pairwise (only used when k > 128)
    m = 256 if k > np.uint64(128) else 1
    sq = np.empty(m, np.uint64)
    sn = np.empty(m, np.uint64)
    sv = np.empty(m, x.dtype)
    if k == np.uint64(3):
        if tr:
            for q in range(base, base + n, np.uint64(3)):
                x0 = x[q]
                x1 = x[q + np.uint64(1)]
                x2 = x[q + np.uint64(2)]
                s = x0 + x1
                s = s + x2
                b = (x0 + x0) - s
                x[q] = b
                x[q + np.uint64(1)] = (x1 + x1) + b
                x[q + np.uint64(2)] = (x2 + x2) + b
        else:
            for q in range(base, base + n, np.uint64(3)):
                x0 = x[q]
                x1 = x[q + np.uint64(1)]
                x2 = x[q + np.uint64(2)]
                s = x0 + x1
                s = s + x2
                x[q] = s
                x[q + np.uint64(1)] = (x1 + x1) - s
                x[q + np.uint64(2)] = (x2 + x2) - s
    elif k == np.uint64(5):
        if tr:
            for q in range(base, base + n, np.uint64(5)):
                x0 = x[q]
                x1 = x[q + np.uint64(1)]
                x2 = x[q + np.uint64(2)]
                x3 = x[q + np.uint64(3)]
                x4 = x[q + np.uint64(4)]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                b = (x0 + x0) - s
                x[q] = b
                x[q + np.uint64(1)] = (x1 + x1) + b
                x[q + np.uint64(2)] = (x2 + x2) + b
                x[q + np.uint64(3)] = (x3 + x3) + b
                x[q + np.uint64(4)] = (x4 + x4) + b
        else:
            for q in range(base, base + n, np.uint64(5)):
                x0 = x[q]
                x1 = x[q + np.uint64(1)]
                x2 = x[q + np.uint64(2)]
                x3 = x[q + np.uint64(3)]
                x4 = x[q + np.uint64(4)]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                x[q] = s
                x[q + np.uint64(1)] = (x1 + x1) - s
                x[q + np.uint64(2)] = (x2 + x2) - s
                x[q + np.uint64(3)] = (x3 + x3) - s
                x[q + np.uint64(4)] = (x4 + x4) - s
    elif k == np.uint64(6):
        if tr:
            for q in range(base, base + n, np.uint64(6)):
                x0 = x[q]
                x1 = x[q + np.uint64(1)]
                x2 = x[q + np.uint64(2)]
                x3 = x[q + np.uint64(3)]
                x4 = x[q + np.uint64(4)]
                x5 = x[q + np.uint64(5)]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                s = s + x5
                b = (x0 + x0) - s
                x[q] = b
                x[q + np.uint64(1)] = (x1 + x1) + b
                x[q + np.uint64(2)] = (x2 + x2) + b
                x[q + np.uint64(3)] = (x3 + x3) + b
                x[q + np.uint64(4)] = (x4 + x4) + b
                x[q + np.uint64(5)] = (x5 + x5) + b
        else:
            for q in range(base, base + n, np.uint64(6)):
                x0 = x[q]
                x1 = x[q + np.uint64(1)]
                x2 = x[q + np.uint64(2)]
                x3 = x[q + np.uint64(3)]
                x4 = x[q + np.uint64(4)]
                x5 = x[q + np.uint64(5)]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                s = s + x5
                x[q] = s
                x[q + np.uint64(1)] = (x1 + x1) - s
                x[q + np.uint64(2)] = (x2 + x2) - s
                x[q + np.uint64(3)] = (x3 + x3) - s
                x[q + np.uint64(4)] = (x4 + x4) - s
                x[q + np.uint64(5)] = (x5 + x5) - s
    elif k == np.uint64(7):  # (k < 8 is one of 3, 5, 6, 7: powers of two are Walsh axes)
        if tr:
            for q in range(base, base + n, np.uint64(7)):
                x0 = x[q]
                x1 = x[q + np.uint64(1)]
                x2 = x[q + np.uint64(2)]
                x3 = x[q + np.uint64(3)]
                x4 = x[q + np.uint64(4)]
                x5 = x[q + np.uint64(5)]
                x6 = x[q + np.uint64(6)]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                s = s + x5
                s = s + x6
                b = (x0 + x0) - s
                x[q] = b
                x[q + np.uint64(1)] = (x1 + x1) + b
                x[q + np.uint64(2)] = (x2 + x2) + b
                x[q + np.uint64(3)] = (x3 + x3) + b
                x[q + np.uint64(4)] = (x4 + x4) + b
                x[q + np.uint64(5)] = (x5 + x5) + b
                x[q + np.uint64(6)] = (x6 + x6) + b
        else:
            for q in range(base, base + n, np.uint64(7)):
                x0 = x[q]
                x1 = x[q + np.uint64(1)]
                x2 = x[q + np.uint64(2)]
                x3 = x[q + np.uint64(3)]
                x4 = x[q + np.uint64(4)]
                x5 = x[q + np.uint64(5)]
                x6 = x[q + np.uint64(6)]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                s = s + x5
                s = s + x6
                x[q] = s
                x[q + np.uint64(1)] = (x1 + x1) - s
                x[q + np.uint64(2)] = (x2 + x2) - s
                x[q + np.uint64(3)] = (x3 + x3) - s
                x[q + np.uint64(4)] = (x4 + x4) - s
                x[q + np.uint64(5)] = (x5 + x5) - s
                x[q + np.uint64(6)] = (x6 + x6) - s
    else:
        for q in range(base, base + n, k):
            x0 = x[q]
            if k <= lim:  # k >= 9 here; numpy: 8 accumulators (written out: a call costs more)
                r0 = x0
                r1 = x[q + one]
                r2 = x[q + np.uint64(2)]
                r3 = x[q + np.uint64(3)]
                r4 = x[q + np.uint64(4)]
                r5 = x[q + np.uint64(5)]
                r6 = x[q + np.uint64(6)]
                r7 = x[q + np.uint64(7)]
                end8 = q + k - k % eight
                for i in range(q + eight, end8, eight):
                    r0 += x[i]
                    r1 += x[i + one]
                    r2 += x[i + np.uint64(2)]
                    r3 += x[i + np.uint64(3)]
                    r4 += x[i + np.uint64(4)]
                    r5 += x[i + np.uint64(5)]
                    r6 += x[i + np.uint64(6)]
                    r7 += x[i + np.uint64(7)]
                s = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
                for i in range(end8, q + k):
                    s += x[i]
            else:
                s = _pairwise(x, q, k, sq, sn, sv)
            if tr:
                b = (x0 + x0) - s  # (T^T g)_0 = g_0 - S1 = 2 g_0 - S
                x[q] = b
                for l in range(q + one, q + k):
                    v = x[l]
                    x[l] = (v + v) + b
            else:
                x[q] = s
                for l in range(q + one, q + k):
                    v = x[l]
                    x[l] = (v + v) - s


@njit(cache=True, nogil=True)
def _pm3s(x, base, n, p, i, tr):
    """+-1 basis, k = 3, stride h = p[i, 1] >= 8: the 3 elements of a fibre stay in
    registers (one read and one write per element; the loop over fibres vectorises)."""
    step = p[i, 1] * np.uint64(3)
    for b in range(base, base + n, step):
        h = p[i, 1]  # re-read for every block: LLVM's alias checks stay per block
        q1 = b + h
        q2 = q1 + h
        if tr:
            for j in range(h):
                x0 = x[b + j]
                x1 = x[q1 + j]
                x2 = x[q2 + j]
                s = x0 + x1
                s = s + x2
                t = (x0 + x0) - s
                x[b + j] = t
                x[q1 + j] = (x1 + x1) + t
                x[q2 + j] = (x2 + x2) + t
        else:
            for j in range(h):
                x0 = x[b + j]
                x1 = x[q1 + j]
                x2 = x[q2 + j]
                s = x0 + x1
                s = s + x2
                x[b + j] = s
                x[q1 + j] = (x1 + x1) - s
                x[q2 + j] = (x2 + x2) - s


@njit(cache=True, nogil=True)
def _pm5s(x, base, n, p, i, tr):
    """+-1 basis, k = 5, stride h = p[i, 1] >= 8: the 5 elements of a fibre stay in
    registers (one read and one write per element; the loop over fibres vectorises)."""
    step = p[i, 1] * np.uint64(5)
    for b in range(base, base + n, step):
        h = p[i, 1]  # re-read for every block: LLVM's alias checks stay per block
        q1 = b + h
        q2 = q1 + h
        q3 = q2 + h
        q4 = q3 + h
        if tr:
            for j in range(h):
                x0 = x[b + j]
                x1 = x[q1 + j]
                x2 = x[q2 + j]
                x3 = x[q3 + j]
                x4 = x[q4 + j]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                t = (x0 + x0) - s
                x[b + j] = t
                x[q1 + j] = (x1 + x1) + t
                x[q2 + j] = (x2 + x2) + t
                x[q3 + j] = (x3 + x3) + t
                x[q4 + j] = (x4 + x4) + t
        else:
            for j in range(h):
                x0 = x[b + j]
                x1 = x[q1 + j]
                x2 = x[q2 + j]
                x3 = x[q3 + j]
                x4 = x[q4 + j]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                x[b + j] = s
                x[q1 + j] = (x1 + x1) - s
                x[q2 + j] = (x2 + x2) - s
                x[q3 + j] = (x3 + x3) - s
                x[q4 + j] = (x4 + x4) - s


@njit(cache=True, nogil=True)
def _pm6s(x, base, n, p, i, tr):
    """+-1 basis, k = 6, stride h = p[i, 1] >= 8: the 6 elements of a fibre stay in
    registers (one read and one write per element; the loop over fibres vectorises)."""
    step = p[i, 1] * np.uint64(6)
    for b in range(base, base + n, step):
        h = p[i, 1]  # re-read for every block: LLVM's alias checks stay per block
        q1 = b + h
        q2 = q1 + h
        q3 = q2 + h
        q4 = q3 + h
        q5 = q4 + h
        if tr:
            for j in range(h):
                x0 = x[b + j]
                x1 = x[q1 + j]
                x2 = x[q2 + j]
                x3 = x[q3 + j]
                x4 = x[q4 + j]
                x5 = x[q5 + j]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                s = s + x5
                t = (x0 + x0) - s
                x[b + j] = t
                x[q1 + j] = (x1 + x1) + t
                x[q2 + j] = (x2 + x2) + t
                x[q3 + j] = (x3 + x3) + t
                x[q4 + j] = (x4 + x4) + t
                x[q5 + j] = (x5 + x5) + t
        else:
            for j in range(h):
                x0 = x[b + j]
                x1 = x[q1 + j]
                x2 = x[q2 + j]
                x3 = x[q3 + j]
                x4 = x[q4 + j]
                x5 = x[q5 + j]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                s = s + x5
                x[b + j] = s
                x[q1 + j] = (x1 + x1) - s
                x[q2 + j] = (x2 + x2) - s
                x[q3 + j] = (x3 + x3) - s
                x[q4 + j] = (x4 + x4) - s
                x[q5 + j] = (x5 + x5) - s


@njit(cache=True, nogil=True)
def _pm7s(x, base, n, p, i, tr):
    """+-1 basis, k = 7, stride h = p[i, 1] >= 8: the 7 elements of a fibre stay in
    registers (one read and one write per element; the loop over fibres vectorises)."""
    step = p[i, 1] * np.uint64(7)
    for b in range(base, base + n, step):
        h = p[i, 1]  # re-read for every block: LLVM's alias checks stay per block
        q1 = b + h
        q2 = q1 + h
        q3 = q2 + h
        q4 = q3 + h
        q5 = q4 + h
        q6 = q5 + h
        if tr:
            for j in range(h):
                x0 = x[b + j]
                x1 = x[q1 + j]
                x2 = x[q2 + j]
                x3 = x[q3 + j]
                x4 = x[q4 + j]
                x5 = x[q5 + j]
                x6 = x[q6 + j]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                s = s + x5
                s = s + x6
                t = (x0 + x0) - s
                x[b + j] = t
                x[q1 + j] = (x1 + x1) + t
                x[q2 + j] = (x2 + x2) + t
                x[q3 + j] = (x3 + x3) + t
                x[q4 + j] = (x4 + x4) + t
                x[q5 + j] = (x5 + x5) + t
                x[q6 + j] = (x6 + x6) + t
        else:
            for j in range(h):
                x0 = x[b + j]
                x1 = x[q1 + j]
                x2 = x[q2 + j]
                x3 = x[q3 + j]
                x4 = x[q4 + j]
                x5 = x[q5 + j]
                x6 = x[q6 + j]
                s = x0 + x1
                s = s + x2
                s = s + x3
                s = s + x4
                s = s + x5
                s = s + x6
                x[b + j] = s
                x[q1 + j] = (x1 + x1) - s
                x[q2 + j] = (x2 + x2) - s
                x[q3 + j] = (x3 + x3) - s
                x[q4 + j] = (x4 + x4) - s
                x[q5 + j] = (x5 + x5) - s
                x[q6 + j] = (x6 + x6) - s



@njit(cache=True, nogil=True)
def _pm_f(x, base, n, k, st, tr):
    """+-1 basis on fibres of ``k`` elements at a small stride ``st`` (2, 3), fibre by
    fibre (scalar; sums in sequence, as numpy's reduction over a non-contiguous axis)."""
    one = np.uint64(1)
    for b in range(base, base + n, k * st):
        for q in range(b, b + st):
            x0 = x[q]
            s = x0
            for l in range(one, k):
                s += x[q + l * st]
            if tr:
                t = (x0 + x0) - s
                x[q] = t
                for l in range(one, k):
                    v = x[q + l * st]
                    x[q + l * st] = (v + v) + t
            else:
                x[q] = s
                for l in range(one, k):
                    v = x[q + l * st]
                    x[q + l * st] = (v + v) - s


@njit(cache=True, nogil=True)
def _pm3_f(x, base, n, st, tr):
    """:func:`_pm_f` for ``k = 3`` (a variable of three values before a small axis or two):
    the fibre's three elements in registers, the same sums."""
    two = st * np.uint64(2)
    for b in range(base, base + n, np.uint64(3) * st):
        for q in range(b, b + st):
            x0 = x[q]
            x1 = x[q + st]
            x2 = x[q + two]
            s = x0 + x1
            s = s + x2
            if tr:
                t = (x0 + x0) - s
                x[q] = t
                x[q + st] = (x1 + x1) + t
                x[q + two] = (x2 + x2) + t
            else:
                x[q] = s
                x[q + st] = (x1 + x1) - s
                x[q + two] = (x2 + x2) - s


@njit(cache=True, nogil=True)
def _pm_s(x, base, n, k, st, tr, s):
    """+-1 basis on fibres of ``k`` elements at stride ``st > 1``.  The sums of up to
    ``len(s)`` neighbouring fibres are kept in ``s``, so every inner loop is contiguous."""
    for b in range(base, base + n, k * st):
        _pm_fibres(x, b, b + st, k, st, tr, s)


@njit(cache=True, nogil=True)
def _pm_fibres(x, q0, q1, k, st, tr, s):
    """:func:`_pm_s` on the fibres that start at ``q0 .. q1 - 1`` (in one span)."""
    one = np.uint64(1)
    ch = np.uint64(s.size)
    for j0 in range(q0, q1, ch):
        m = min(ch, q1 - j0)
        for jj in range(m):
            s[jj] = x[j0 + jj]
        for l in range(one, k):
            ql = j0 + l * st
            for jj in range(m):
                s[jj] += x[ql + jj]
        if tr:
            for jj in range(m):
                v = x[j0 + jj]
                t = (v + v) - s[jj]
                s[jj] = t
                x[j0 + jj] = t
            for l in range(one, k):
                ql = j0 + l * st
                for jj in range(m):
                    v = x[ql + jj]
                    x[ql + jj] = (v + v) + s[jj]
        else:
            for jj in range(m):
                x[j0 + jj] = s[jj]
            for l in range(one, k):
                ql = j0 + l * st
                for jj in range(m):
                    v = x[ql + jj]
                    x[ql + jj] = (v + v) - s[jj]


# ---------------------------------------------------------------------------------
# Programs, tiles, passes
# ---------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _grow(span, total, limit):
    """A multiple of ``span`` dividing ``total`` (itself a multiple of ``span``), as large
    as small prime factors allow without exceeding ``limit``."""
    q = total // span
    for f in (2, 3, 5, 7):
        fu = np.uint64(f)
        while q % fu == np.uint64(0) and span * fu <= limit:
            span *= fu
            q //= fu
    return span


@njit(cache=True, nogil=True)
def _row(y, b1, s1, p, i, s):
    """Program row ``i`` of ``p`` (strides in elements) on ``y[b1:b1+s1]`` (whole spans)."""
    eight = np.uint64(8)
    one = np.uint64(1)
    two = np.uint64(2)
    four = np.uint64(4)
    kind = p[i, 0]
    h = p[i, 1]
    if kind == R8:
        if h < eight:
            _r8s(y, b1, s1, p, i)
        elif h == eight and p[i, C_PAT] == one:
            _r8a_h8(y, b1, s1, p, i)
        elif h == eight and p[i, C_PAT] == two:
            _r8d_h8(y, b1, s1, p, i)
        else:
            _r8(y, b1, s1, p, i)
    elif kind == R4:
        if h < eight:
            _r4s(y, b1, s1, p, i)
        else:
            _r4(y, b1, s1, p, i)
    elif kind == R2:
        if h < eight:
            _r2s(y, b1, s1, p, i)
        else:
            _r2(y, b1, s1, p, i)
    elif s is None:
        pass  # no +-1 axis in this program (see the docstring)
    elif h == one:
        _pm_c(y, b1, s1, p[i, 2], kind == PMT)
    elif h < four:
        if p[i, 2] == np.uint64(3):
            _pm3_f(y, b1, s1, h, kind == PMT)
        else:
            _pm_f(y, b1, s1, p[i, 2], h, kind == PMT)
    elif h < eight:
        _pm_s(y, b1, s1, p[i, 2], h, kind == PMT, s)
    elif p[i, 2] == np.uint64(3):
        _pm3s(y, b1, s1, p, i, kind == PMT)
    elif p[i, 2] == np.uint64(5):
        _pm5s(y, b1, s1, p, i, kind == PMT)
    elif p[i, 2] == np.uint64(6):
        _pm6s(y, b1, s1, p, i, kind == PMT)
    elif p[i, 2] == np.uint64(7):
        _pm7s(y, b1, s1, p, i, kind == PMT)
    else:
        _pm_s(y, b1, s1, p[i, 2], h, kind == PMT, s)


@njit(cache=True, nogil=True)
def _sub_block(p, i0, nrows, limit, n):
    """``(i1, size)``: rows ``i0 .. i1 - 1`` (of at most ``nrows``) run together in
    sub-blocks of ``size`` elements (of a region of ``n``) when their spans fit ``limit``;
    a row whose span does not runs alone on the whole region."""
    i1 = i0 + 1
    size = p[i0, C_SPAN]
    if size > limit:
        return i1, n
    while i1 < nrows and p[i1, C_SPAN] <= limit:
        size = max(size, p[i1, C_SPAN])
        i1 += 1
    return i1, _grow(size, n, limit)


@njit(cache=True, nogil=True)
def _rows(y, p, i0, nrows, base, n, s):
    """Program rows ``i0 .. nrows - 1`` of ``p`` (strides in elements) on ``y[base:base+n]``."""
    sub1 = np.uint64(_SUB1_BYTES // y.itemsize)
    sub2 = np.uint64(_SUB2_BYTES // y.itemsize)
    # Rows run in order, but consecutive rows whose butterflies stay inside
    # sub-blocks of <= sub2 (L2) or <= sub1 (L1) elements run sub-block by
    # sub-block (spans form a divisibility chain, so this only reorders
    # independent work): fewer sweeps through the larger caches.
    while i0 < nrows:
        i1, s0 = _sub_block(p, i0, nrows, sub2, n)
        for b0 in range(base, base + n, s0):
            k = i0
            while k < i1:
                kend, s1 = _sub_block(p, k, i1, sub1, s0)
                for b1 in range(b0, b0 + s0, s1):
                    for i in range(k, kend):
                        _row(y, b1, s1, p, i, s)
                k = kend
        i0 = i1


@njit(cache=True, nogil=True)
def _run_pass(x, passes, progs, ps, t0, t1, s):
    """Tiles ``t0 .. t1-1`` of pass ``ps``.  Gathered: tile ``t`` covers rows ``r < R``
    of ``ww <= w`` contiguous elements at ``o R C + r C + c0`` (``o, c0`` from ``t``),
    copied to a buffer, transformed there and scattered back.  In place: tile ``t`` is
    ``m`` consecutive blocks of ``R C`` contiguous elements.  The pass's program rows
    (strides in rows) are scaled to elements for the tile width.

    ``s``: the scratch of the ``+-1`` kernels (``_PM_CHUNK`` elements), or None when the
    program has no ``+-1`` axis.  numba prunes the branch on ``s is None`` while
    compiling, so a table of power-of-two axes only never compiles the ``+-1`` kernels
    (about a third of this driver's first-use compile time)."""
    one = np.uint64(1)
    zero = np.uint64(0)
    R = passes[ps, 0]
    C = passes[ps, 1]
    w = passes[ps, 2]
    gather = passes[ps, 3] != zero
    prog = progs[passes[ps, 4]:passes[ps, 5]]
    # gathered rows are padded so that the buffer's rows do not all fall on the same
    # cache sets / 4 KiB offsets as the table's rows (the pad is transformed, never stored)
    pad = passes[ps, 7] if gather else zero
    buf = np.zeros(np.int64(R * (w + pad)) if gather else 0, x.dtype)
    nct = (C + w - one) // w
    p = prog.copy()
    cur = zero
    m = passes[ps, 8]  # in place: blocks of R*C elements per tile
    nblk = np.uint64(x.size) // (R * C)
    for t in range(t0, t1):
        if gather:
            o = t // nct
            c0 = (t - o * nct) * w
            ww = min(w, C - c0)
            start = o * R * C + c0
        else:
            ww = C
            start = t * m * R * C
        pitch = ww + pad
        if pitch != cur:
            for i in range(p.shape[0]):
                p[i, 1] = prog[i, 1] * pitch
                for c in range(3, C_SPAN + 1):
                    p[i, c] = prog[i, c] * pitch  # offsets and span
            cur = pitch
        if gather:
            for r in range(R):
                src = start + r * C
                dst = r * pitch
                for j in range(ww):
                    buf[dst + j] = x[src + j]
            y = buf
            base = zero
            n = R * pitch
        else:
            y = x
            base = start
            n = min(m, nblk - t * m) * R * C
        _rows(y, p, 0, p.shape[0], base, n, s)
        if gather:
            for r in range(R):
                src = start + r * C
                dst = r * pitch
                for j in range(ww):
                    x[src + j] = buf[dst + j]


# ---------------------------------------------------------------------------------
# Sparse inputs and outputs: only the fibres that can be non-zero, or that lead to the
# cells read (same kernels per fibre, so the same bits)
# ---------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _row_run(x, q0, cnt, p, i, one_row, s):
    """Program row ``i`` of ``p`` (strides in elements of ``x``) on its ``cnt`` fibres
    that start at ``q0, q0 + 1, ..`` (all in one span), by the kernels of :func:`_row` (so
    with their arithmetic): a butterfly row's kernel on a copy of the row (``one_row``) whose
    inner loop runs over the fibres of the run, or fibre by fibre for a short run; a ``+-1``
    row's sums in sequence, or numpy's pairwise sums on the table's last axis (``s``: the
    ``+-1`` kernels' scratch)."""
    kind = p[i, 0]
    one = np.uint64(1)
    if kind >= np.uint64(PMF):
        if s is None:
            return  # no +-1 axis in this program (see _run_pass)
        k = p[i, 2]
        if p[i, 1] == one:  # the table's last axis: one fibre, numpy's pairwise sums
            _pm_c(x, q0, k, k, kind == PMT)
        else:
            _pm_fibres(x, q0, q0 + cnt, k, p[i, 1], kind == PMT, s)
        return
    for c in range(one_row.shape[1]):
        one_row[0, c] = p[i, c]
    if cnt >= np.uint64(8):
        one_row[0, 1] = cnt  # the kernels' inner loop runs over the fibres of the run
        if kind == R8:
            _r8(x, q0, one, one_row, 0)
        elif kind == R4:
            _r4(x, q0, one, one_row, 0)
        else:
            _r2(x, q0, one, one_row, 0)
        return
    one_row[0, 1] = one  # a few fibres: one by one, by the kernels' unit-stride branch
    for q in range(q0, q0 + cnt):
        if kind == R8:
            _r8s(x, q, one, one_row, 0)
        elif kind == R4:
            _r4s(x, q, one, one_row, 0)
        else:
            _r2s(x, q, one, one_row, 0)


@njit(cache=True, nogil=True)
def _run_sparse(x, p, mode, rstart, rcount, rptr, blocks, blen, s):
    """The rows of ``p`` (strides in elements of ``x``) on the blocks ``blocks`` of ``blen``
    elements, row after row in each block.  Row ``i``'s ``mode``: 0, its runs
    ``rstart/rcount[rptr[i, b]:rptr[i, b + 1]]`` in block ``b`` (fibres ``start .. start +
    count - 1``); 1, the runs ``rptr[i, 0]:rptr[i, 1]`` relative to each of its spans
    (the same in every span); 3, every fibre of the block."""
    one_row = np.empty((1, p.shape[1]), np.uint64)
    for bi in range(blocks.size):
        blk = blocks[bi]
        b0 = np.uint64(blk) * blen
        i = 0
        while i < p.shape[0]:
            md = mode[i]
            if md == 3:  # consecutive rows on every fibre: as in the plan's own pass
                i1 = i + 1
                while i1 < p.shape[0] and mode[i1] == 3:
                    i1 += 1
                _rows(x, p, i, i1, b0, blen, s)
                i = i1
                continue
            if md == 0:
                for r in range(rptr[i, blk], rptr[i, blk + 1]):
                    _row_run(x, np.uint64(rstart[r]), np.uint64(rcount[r]), p, i, one_row, s)
            elif md == 1:
                for sb in range(b0, b0 + blen, p[i, C_SPAN]):
                    for r in range(rptr[i, 0], rptr[i, 1]):
                        _row_run(x, sb + np.uint64(rstart[r]), np.uint64(rcount[r]), p, i, one_row, s)
            i += 1


def _pm_scratch(progs, dtype):
    """The ``+-1`` kernels' scratch when the program has a ``+-1`` axis, else None."""
    if progs.shape[0] and np.any(progs[:, 0] >= np.uint64(PMF)):
        return np.empty(_PM_CHUNK, dtype)
    return None


def _transform_serial(x, passes, progs):
    s = _pm_scratch(progs, x.dtype)
    for ps in range(passes.shape[0]):
        _run_pass(x, passes, progs, ps, np.uint64(0), passes[ps, 6], s)


# ---------------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------------

def _per_thread_scratch(progs, dtype):
    """A function returning the calling thread's ``+-1`` scratch (:func:`_pm_scratch`)."""
    local = threading.local()

    def scratch():
        if not hasattr(local, "s"):
            local.s = _pm_scratch(progs, dtype)
        return local.s

    return scratch


def _pass_threads(x, passes, progs, ps, n, scratch):
    """Pass ``ps``: its tiles in contiguous chunks (a few per thread), taken by ``n``
    threads (the caller and ``n - 1`` helpers) in order; it ends when all are done
    (:func:`fsll_ooc.kernels.threadpool.parallel_for`: the caller waits for chunks, not
    for a helper that has not started).  Taking chunks as they come keeps the threads busy
    when a core is shared."""
    nt = int(passes[ps, 6])
    k = max(1, min(nt, _CHUNKS_PER_THREAD * n))
    bounds = [np.uint64(nt * c // k) for c in range(k + 1)]
    threadpool.parallel_for(n, k, lambda c: _run_pass(x, passes, progs, ps, bounds[c], bounds[c + 1], scratch()))


def _transform_threads(x, passes, progs, n):
    """Every pass on ``n`` threads (:func:`_pass_threads`)."""
    scratch = _per_thread_scratch(progs, x.dtype)
    for ps in range(passes.shape[0]):
        _pass_threads(x, passes, progs, ps, n, scratch)


# ---------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------

def _driver_ready(x, pl) -> bool:
    """Is the driver for this table's dtype and kind of program compiled in this process or
    in numba's on-disk cache?  (A positive answer is kept.)"""
    s = _pm_scratch(pl.progs, x.dtype)
    key = (x.dtype.str, s is None)
    if key not in _READY:
        sig = tuple(_run_pass.typeof_pyval(v) for v in (x, pl.passes, pl.progs, 0, np.uint64(0), np.uint64(0), s))
        if not ahead.is_cached(_run_pass, sig):
            return False
        _READY.add(key)
    return True


_READY: set = set()


def _reference_same_bits(shape, axes) -> bool:
    """Does the numpy reference give this transform's bits?  Yes unless a transformed
    power-of-two axis has 4 or more values (its stages may then run in another order:
    see the module docstring)."""
    return all(shape[ax] == 2 or shape[ax] & (shape[ax] - 1) for ax in axes)


def _check_table(a) -> None:
    """The errors of :func:`transform_inplace` for a table it cannot work on in place."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"transform_inplace needs a numpy array, got {type(a).__name__}")
    if a.dtype.kind != "f":
        raise TypeError(f"transform_inplace needs a float array (float64 or float32), got {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError("transform_inplace needs a C-contiguous array "
                         "(use np.ascontiguousarray(a), or basis.transform(a) for a copy)")
    if not a.flags.writeable:
        raise ValueError("transform_inplace needs a writeable array")


def transform_inplace(a: np.ndarray, axes: Sequence[int] | None = None, transpose: bool = False,
                      parallel: bool = True, first_use: str = "compile") -> None:
    """Overwrite ``a`` with ``basis.transform(a, axes, transpose=transpose)``.

    ``a``: C-contiguous, writeable ``float64`` or ``float32`` array of shape
    ``(k_0, ..., k_{n-1})`` (0-d and empty arrays are no-ops).  ``axes``: the axes to
    transform, all by default; negative indices allowed; an axis listed twice is
    transformed twice, as in the reference.  ``transpose``: ``T^T`` instead of ``T``
    (they differ only on ``+-1`` axes).  ``parallel``: split tables of >= 2^21
    elements between ``numba.config.NUMBA_NUM_THREADS`` threads (the caller and a
    private pool); pass ``parallel=False`` where the caller is already one of several
    workers (dask tasks), to avoid oversubscribing the cores.

    Raises ``TypeError`` for a non-float array and ``ValueError`` for a non-contiguous
    or read-only one (use ``np.ascontiguousarray`` or ``basis.transform``).  Other
    float dtypes (float16, longdouble, non-native byte order) are done by the numpy
    reference and copied back.
    """
    _check_table(a)
    ndim = a.ndim
    ax_list = list(range(ndim)) if axes is None else [axis_index(ax, ndim) for ax in axes]
    if a.size == 0 or not ax_list:
        return
    if a.dtype not in (np.float64, np.float32) or not a.dtype.isnative:
        from .. import basis
        a[...] = basis.transform(a, ax_list, transpose=transpose)
        return
    counts = {}
    for ax in ax_list:
        counts[ax] = counts.get(ax, 0) + 1
    if first_use not in ("compile", "reference"):
        raise ValueError(f"first_use must be 'compile' or 'reference', got {first_use!r}")
    x = a.reshape(-1)
    n = threadpool.num_threads() if parallel and a.size >= _PAR_MIN_SIZE else 1
    for r in range(max(counts.values())):  # one round per multiplicity of an axis
        axs = tuple(sorted(ax for ax, c in counts.items() if c > r))
        pl = plan_for(tuple(a.shape), axs, a.itemsize, bool(transpose))
        if pl.passes.shape[0] == 0:
            continue
        if (first_use == "reference" and a.size <= REFERENCE_FIRST_MAX_SIZE and _reference_same_bits(a.shape, axs)
                and not _driver_ready(x, pl)):
            from .. import basis
            a[...] = basis.transform(a, axs, transpose=transpose)
            continue
        if n > 1:
            _transform_threads(x, pl.passes, pl.progs, n)
        else:
            _transform_serial(x, pl.passes, pl.progs)


#: A program row runs on its listed fibres only while they cost at most this share of a
#: run over all its fibres (the vectorised kernels), counting :data:`_RUN_COST` fibres for
#: each run of consecutive fibres; above it, it runs on every fibre of the blocks it touches
#: (measured on the sweeps of a survey-like table and a 2^24 binary one).
SPARSE_SHARE = 0.5
_RUN_COST = 8
#: The same for the runs of a sparse input's fibres (repeated in every span: many short runs).
_SPAN_RUN_COST = 64


def _distinct(a, is_sorted=False):
    """The distinct values of the int64 array ``a``, ascending (by a sort: numpy's hashed
    ``unique`` costs more on the few thousand cells read at once)."""
    if not is_sorted:
        a = np.sort(a)
    if a.size < 2:
        return a
    keep = np.empty(a.size, bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def _runs(lo, H):
    """Offsets ``lo`` (sorted, distinct, below ``H``) widened to 8-aligned chunks when
    ``H >= 8`` (so that runs reach the vectorised kernels; a zero fibre done costs nothing
    but time), as runs ``(start, count)`` of consecutive offsets."""
    if H >= 8:
        c = _distinct(lo // 8, True)
        brk = np.flatnonzero(np.diff(c) != 1) + 1
        starts = c[np.concatenate(([0], brk))] * 8
        ends = np.minimum((c[np.concatenate((brk - 1, [c.size - 1]))] + 1) * 8, H)
        return starts, ends - starts
    brk = np.flatnonzero(np.diff(lo) != 1) + 1
    starts = lo[np.concatenate(([0], brk))]
    return starts, np.diff(np.concatenate(([0], brk, [lo.size])))


def _row_runs_nonzero(S, H, span, lo_mod, N, limit):
    """The fibres of a row (stride ``H``, ``span``) that can hold a non-zero when the cells
    ``x`` with ``x mod lo_mod`` outside ``S mod lo_mod`` are zero (``lo_mod`` divides ``H``):
    runs ``(start, count)`` of fibre offsets relative to each span (the same in every
    span); None when they cost more than ``limit`` fibres (:data:`SPARSE_SHARE`)."""
    lo = _distinct(S % lo_mod)
    spans = N // span
    if spans * (H // lo_mod) * lo.size > 4 * limit:
        return None
    if lo_mod < H:
        lo = (np.arange(H // lo_mod, dtype=np.int64)[:, None] * lo_mod + lo[None, :]).ravel()  # ascending
    starts, counts = _runs(lo, H)
    if spans * (int(counts.sum()) + _SPAN_RUN_COST * starts.size) > limit:
        return None
    return starts, counts


def _row_runs_needed(Y, H, span, M, limit):
    """The fibres of a row (stride ``H``, ``span``) that lead to the cells ``x`` with
    ``x // M`` in ``Y // M`` (``M``, the largest span of the rows after it, a place value of
    the table like ``H`` and ``span``; ``Y`` ascending): runs ``(start, count)`` of fibres,
    sorted; None when they cost more than ``limit`` fibres or cannot be told apart (then
    every fibre)."""
    K = _distinct(Y // M, True) * M
    if M <= H:
        if K.size * M > 4 * limit:  # (before the duplicates go)
            return None
        starts = _distinct((K // span) * span + K % H)
        count = M
    elif M % span or K.size * (M // span) * H > limit:
        return None
    else:
        starts = (K[:, None] + np.arange(M // span, dtype=np.int64)[None, :] * span).ravel()
        count = H
    if starts.size * (count + _RUN_COST) > limit:
        return None
    return starts, np.full(starts.size, count, np.int64)


def _table_rows(pl, ps):
    """Pass ``ps``'s program rows with strides, offsets and spans in elements of the table
    (not of a gathered tile): ``(rows, radix of each row)``."""
    C = pl.passes[ps, 1]
    rows = pl.progs[pl.passes[ps, 4]:pl.passes[ps, 5]].copy()
    rows[:, 1] *= C
    rows[:, 3:C_SPAN + 1] *= C
    radix = [int(r[2]) if r[0] >= PMF else {R2: 2, R4: 4, R8: 8}[int(r[0])] for r in rows]
    return rows, radix


def _sparse_schedule(pl, N, nonzero, needed):
    """Per pass: its rows (:func:`_table_rows`) and per row ``(mode, starts, counts)`` for
    :func:`_run_sparse` (modes there; the starts of mode 0 absolute and sorted, of mode 1
    relative to the row's spans)."""
    rows = [_table_rows(pl, ps) for ps in range(pl.npasses)]
    flat = [(ps, i, int(r[1]), int(r[C_SPAN]), rad[i]) for ps, (rr, rad) in enumerate(rows) for i, r in enumerate(rr)]
    sched = {}
    runs = ()
    if nonzero is not None:  # rows in order: the cells below the smallest stride done so far are untouched
        done = N
        for ps, i, H, span, radix in flat:
            # (once a row needs most fibres, so do the rows after it: they are not worked out)
            if runs is not None:
                runs = _row_runs_nonzero(nonzero, H, span, min(H, done), N, SPARSE_SHARE * (N // radix))
            sched[ps, i] = (3, None, None) if runs is None else (1,) + runs
            done = min(done, H)
    else:  # rows backwards: a row's outputs are needed where a later row's fibre needs them
        M = 1
        for ps, i, H, span, radix in reversed(flat):
            if runs is not None:  # (and the rows before one that needs most fibres need most too)
                runs = _row_runs_needed(needed, H, span, M, SPARSE_SHARE * (N // radix))
            sched[ps, i] = (3, None, None) if runs is None else (0,) + runs
            M = max(M, span)
    return [(rows[ps][0], [sched[ps, i] for i in range(len(rows[ps][1]))]) for ps in range(pl.npasses)]




def ahead_kernels() -> list:
    """``(dispatcher, argument types)`` of :func:`transform_sparse`'s driver on float64 tables,
    with and without ``+-1`` axes (compiled in a second process on its first use after
    installing: :mod:`fsll_ooc.kernels.ahead`)."""
    x = np.zeros(8)
    p = np.zeros((1, NCOL), np.uint64)
    v = np.zeros(1, np.int64)
    ptr = np.zeros((1, 2), np.int64)
    return [(_run_sparse, tuple(_run_sparse.typeof_pyval(a) for a in (x, p, v, v, v, ptr, v, np.uint64(8), s)))
            for s in (np.zeros(_PM_CHUNK), None)]


def sparse_kernels_ready() -> bool:
    """May :func:`transform_sparse` run its driver?  Not while a second process compiles it (its
    first use after installing: :func:`fsll_ooc.kernels.ahead.ready`); :func:`transform_sparse`
    then runs the full transform (the same bits)."""
    return ahead.ready(__name__)


def transform_sparse(a: np.ndarray, axes: Sequence[int] | None = None, transpose: bool = False, *,
                     nonzero: np.ndarray | None = None, needed: np.ndarray | None = None,
                     parallel: bool = True) -> None:
    """:func:`transform_inplace` doing only the work a sparse input or a sparse output needs,
    with the same bits at every cell it computes.

    ``nonzero``: flat (C order) positions outside which ``a`` is ``+0.0``; the fibres that
    hold only such zeros (they stay zeros) are skipped, and every cell of the result is
    :func:`transform_inplace`'s.  Or ``needed``: the flat positions to be read afterwards;
    only the fibres that lead to them are computed, and the other cells are left
    unspecified.  Each program row of the transform's plan (:mod:`fsll_ooc.kernels.transform_plan`)
    runs on the fibres it must, with the kernels (and so the arithmetic) of
    :func:`transform_inplace`; a row with more than :data:`SPARSE_SHARE` of its fibres to do
    runs on whole blocks.  Without either (or with both, a repeated axis or another dtype),
    and until its driver is compiled (:func:`sparse_kernels_ready`), it is
    :func:`transform_inplace`."""
    _check_table(a)
    ndim = a.ndim
    ax_list = list(range(ndim)) if axes is None else [axis_index(ax, ndim) for ax in axes]
    axs = tuple(sorted(set(ax_list)))
    if ((nonzero is None) == (needed is None) or len(axs) != len(ax_list) or a.size == 0
            or a.dtype not in (np.float64, np.float32) or not a.dtype.isnative or not sparse_kernels_ready()):
        transform_inplace(a, axes, transpose=transpose, parallel=parallel)
        return
    N = a.size
    raw = np.ascontiguousarray(nonzero if needed is None else needed, np.int64).reshape(-1)
    x = a.reshape(-1)
    n = threadpool.num_threads() if parallel and N >= _PAR_MIN_SIZE else 1
    pl = plan_for(tuple(a.shape), axs, a.itemsize, bool(transpose))
    key = (tuple(a.shape), axs, bool(transpose), a.dtype.str, needed is None, n, SPARSE_SHARE, _RUN_COST,
           _SPAN_RUN_COST, raw.size, hash(raw.tobytes()))
    with _SCHEDULES_LOCK:
        hit = _SCHEDULES.get(key)
    if hit is not None and hit[1] is pl and np.array_equal(hit[0], raw):
        work = hit[2]
    else:
        cells = _distinct(raw)
        if cells.size and (cells[0] < 0 or cells[-1] >= N):
            raise IndexError(f"a position outside the table of {N} cells")
        if cells.size == 0:
            return  # a table of zeros stays zeros; no cell is read
        if pl.passes.shape[0] == 0:
            return
        work = _sparse_work(pl, N, n, cells, needed is not None)
        with _SCHEDULES_LOCK:
            _SCHEDULES[key] = (raw.copy(), pl, work)
            while len(_SCHEDULES) > SCHEDULES_KEPT:
                del _SCHEDULES[next(iter(_SCHEDULES))]
    scratch = _per_thread_scratch(pl.progs, x.dtype)
    for item in work:
        if item[0] is None:
            _pass_threads(x, pl.passes, pl.progs, item[1], n, scratch)  # every fibre: the plan's own pass
            continue
        rows, args, blocks, bounds, blen, k = item
        threadpool.parallel_for(n, k, lambda c: _run_sparse(x, rows, *args, blocks[bounds[c]:bounds[c + 1]],
                                                            np.uint64(blen), scratch()))


#: The sweeps of a corrective phase transform the same sparse input, and read the same cells,
#: round after round: :func:`transform_sparse` keeps the work it worked out for the last few
#: (by the plan, threads, cost rule and positions; the positions compared in full).
SCHEDULES_KEPT = 8
_SCHEDULES: dict = {}
_SCHEDULES_LOCK = threading.Lock()


def _sparse_work(pl, N, n, cells, is_needed):
    """:func:`transform_sparse`'s passes over a table of ``N`` cells on ``n`` threads, from the
    distinct sorted positions ``cells`` (read afterwards when ``is_needed``, else the only
    non-zero ones): per pass ``(None, pass)`` (every fibre: the plan's own pass) or ``(rows,
    args, blocks, bounds, block length, chunks)`` for :func:`_run_sparse`."""
    sched = _sparse_schedule(pl, N, None if is_needed else cells, cells if is_needed else None)
    work = []
    for ps, (rows, plan_rows) in enumerate(sched):
        modes = [m for m, _, _ in plan_rows]
        gather = bool(pl.passes[ps, 3])
        blen = N if gather else int(pl.passes[ps, 0] * pl.passes[ps, 1])
        nblk = N // blen
        # a row's fibres lie in its spans, and every span of a pass in one of its blocks: the
        # needed cells' blocks hold all the fibres that lead to them
        blocks = np.arange(nblk, dtype=np.int64) if not is_needed else _distinct(cells // blen, True)
        if (gather and 3 in modes) or (all(m == 3 for m in modes) and blocks.size == nblk):
            work.append((None, ps))
            continue
        rptr = np.zeros((len(modes), nblk + 1), np.int64)
        starts, counts, off = [], [], 0
        for i, (m, st, ct) in enumerate(plan_rows):
            if m == 0:
                rptr[i] = off + np.searchsorted(st, np.arange(nblk + 1, dtype=np.int64) * blen)
            elif m == 1:
                rptr[i, :2] = (off, off + st.size)
            if st is not None:
                starts.append(st)
                counts.append(ct)
                off += st.size
        args = (np.asarray(modes, np.int64), np.concatenate(starts or [np.zeros(0, np.int64)]),
                np.concatenate(counts or [np.zeros(0, np.int64)]), rptr)
        k = max(1, min(blocks.size, _CHUNKS_PER_THREAD * n)) if n > 1 and not gather else 1
        bounds = [blocks.size * c // k for c in range(k + 1)]
        work.append((rows, args, blocks, bounds, blen, k))
    return work


def warmup(dtypes=(np.float64, np.float32), cards=None) -> None:
    """Compile (or load from numba's on-disk cache) the kernels for ``dtypes`` on tiny
    tables, so that compilation stays out of timed regions (numba's cache is keyed on
    this file; loading the cached kernels is much faster: docs/benchmarks.md, "JIT compile").

    ``cards``: the cardinalities of the tables to come; only the driver they need is
    compiled (with the ``+-1`` kernels when a cardinality is not a power of two).  None:
    both drivers."""
    from ..basis import is_walsh

    needs_pm = (True, False) if cards is None else (not all(is_walsh(int(k)) for k in cards),)
    for dt in dtypes:
        for pm in needs_pm:
            t = np.ones((2, 3, 4) if pm else (2, 4), dtype=dt)
            transform_inplace(t, parallel=False)
