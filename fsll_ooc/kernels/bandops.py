"""A band's elementwise operations and sums on every core, with numpy's bits.

In core the whole table is one band; between its transforms a pass takes ``exp``,
sums, scales and normalises it (:func:`fsll_ooc.engine.tasks._apply_ops`).  numpy runs
each of those on one core and walks the whole band once per operation.
:func:`elementwise` runs them leaf by leaf, each leaf a few hundred KiB that stays in
the cache while every operation of a run is applied to it, the leaves shared between
the caller and the helpers of :mod:`fsll_ooc.kernels.threadpool`.

Same bits as numpy, by construction:

* an elementwise operation is numpy's own ufunc on each leaf (an element's value does
  not depend on where it lies);
* a sum is numpy's pairwise summation (``np.add.reduce`` of a contiguous array: split at
  ``n2 = n // 2`` rounded down to a multiple of 8 until at most 128 elements remain).
  The leaves are exactly the nodes of that recursion at which :func:`leaves` stops, each
  summed by numpy itself, and their sums are added up the same tree in the same order
  (:func:`tree_sum`).

:func:`scatter_add` is ``np.add.at`` for the sparse fills (the same adds in the same
order, compiled).  :func:`pm_product` is the product rule along a +-1 axis (the partner
of a step on a variable of three or more values, :func:`fsll_ooc.basis.apply_product`)
in one compiled walk over the band, with numpy's operations in numpy's order.
:func:`partner_into` is a table pass's partner of a step (the product rule along each of the
step's axes in turn, Walsh-Hadamard or +-1), one compiled walk over the band per axis, into
arrays the caller holds, with numpy's bits.  These kernels compile in a second process on
their first use after installing (:mod:`fsll_ooc.kernels.ahead`), numpy's own operations
running meanwhile.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit

from . import ahead, threadpool
from .search import axis_rows

__all__ = ["LEAF", "PARALLEL_MIN", "leaves", "tree_sum", "elementwise", "zero_fill", "scatter_add", "pm_product",
           "pm_kernels_ready", "partner_into"]

#: Largest leaf, in elements (512 KiB of float64: a core's L2 cache).
LEAF = 2**16
#: Smallest band that :func:`elementwise` splits between threads (below it, the numpy
#: calls of the whole band are as fast).
PARALLEL_MIN = 2**18

_ADD = -1  # a token of a tree program: add the two sums on top of the stack


@functools.lru_cache(maxsize=32)
def leaves(n: int, leaf: int = LEAF) -> tuple[np.ndarray, tuple]:
    """``(bounds, program)`` of numpy's pairwise summation of ``n`` elements stopped at
    nodes of at most ``leaf`` elements (``leaf >= 128``): leaf ``i`` is
    ``[bounds[i], bounds[i + 1])``, and ``program`` (leaf indices and ``-1`` = add the two
    sums on top of the stack, in postfix order) adds their sums as numpy's recursion does.

    >>> b, prog = leaves(1000, 256); b.tolist(), prog
    ([0, 248, 496, 744, 1000], (0, 1, -1, 2, 3, -1, -1))
    """
    if leaf < 128:
        raise ValueError(f"a leaf must hold at least 128 elements, got {leaf}")
    bounds = [0]
    prog: list = []

    def rec(start: int, m: int) -> None:
        if m <= leaf:
            prog.append(len(bounds) - 1)
            bounds.append(start + m)
            return
        m2 = m // 2
        m2 -= m2 % 8
        rec(start, m2)
        rec(start + m2, m - m2)
        prog.append(_ADD)

    rec(0, int(n))
    return np.asarray(bounds, np.int64), tuple(prog)


def tree_sum(sums, program: tuple) -> float:
    """The leaf ``sums`` added as ``program`` (of :func:`leaves`) says: numpy's bits."""
    stack: list = []
    for tok in program:
        if tok == _ADD:
            b = stack.pop()
            stack.append(stack.pop() + b)
        else:
            stack.append(sums[tok])
    return float(0.0 + stack[0])  # np.add.reduce starts from add's identity


def elementwise(flat: np.ndarray, ops, n_threads: int, leaf: int | None = None) -> float | None:
    """Apply the elementwise ``ops`` to the contiguous 1-D ``flat`` in place, in order, on
    ``n_threads`` threads; returns the last sum taken (``None`` if none).

    ``ops``: ``("exp", shift)`` (``exp(x - shift)``), ``("scale", c)``, ``("add", c)``,
    ``("sum",)`` and ``("normalize",)`` (divide by the sum), as in
    :func:`fsll_ooc.engine.tasks._apply_ops`; the same bits as numpy's calls on the whole
    array.  A normalisation needs the whole sum before it divides: the ops after it run in a
    second walk over the leaves.  ``leaf``: the largest leaf (default :data:`LEAF`).
    """
    bounds, program = leaves(flat.size, LEAF if leaf is None else leaf)
    nleaf = bounds.size - 1
    total = None
    run: list = []
    for op in list(ops) + [None]:
        if op is not None and op[0] != "normalize":
            run.append(op)
            continue
        if op is not None:
            run.append(("sum",))
        if run:
            n_sums = sum(1 for o in run if o[0] == "sum")
            sums = np.empty((max(n_sums, 1), nleaf))
            threadpool.parallel_for(n_threads, nleaf, functools.partial(_leaf, flat, bounds, tuple(run), sums))
            if n_sums:
                total = tree_sum(sums[n_sums - 1], program)
        run = [("div", total)] if op is not None else []
    return total


def _leaf(flat, bounds, run, sums, i) -> None:
    c = flat[bounds[i]:bounds[i + 1]]
    k = 0
    for op in run:
        name = op[0]
        if name == "exp":
            np.subtract(c, op[1], out=c)
            np.exp(c, out=c)
        elif name == "sum":
            sums[k, i] = np.add.reduce(c)
            k += 1
        elif name == "scale":
            np.multiply(c, op[1], out=c)
        elif name == "add":
            np.add(c, op[1], out=c)
        elif name == "div":
            np.divide(c, op[1], out=c)
        else:  # pragma: no cover - the caller sends only these
            raise ValueError(f"not an elementwise op: {op!r}")


def zero_fill(flat: np.ndarray, n_threads: int) -> None:
    """``flat[:] = 0.0`` (contiguous 1-D), leaf by leaf on ``n_threads`` threads; below
    :data:`PARALLEL_MIN` elements in this thread (waking a helper costs more than the fill)."""
    if n_threads <= 1 or flat.size < PARALLEL_MIN:
        flat.fill(0.0)
        return
    bounds, _ = leaves(flat.size, LEAF)
    threadpool.parallel_for(n_threads, bounds.size - 1,
                            lambda i: flat[bounds[i]:bounds[i + 1]].fill(0.0))


@njit(nogil=True, cache=True)
def _scatter_add(flat, local, values):  # pragma: no cover - compiled
    for i in range(local.size):
        flat[local[i]] += values[i]


def scatter_add(flat: np.ndarray, local: np.ndarray, values: np.ndarray) -> None:
    """``np.add.at(flat, local, values)`` for a contiguous float64 ``flat``: the same adds in
    the same order, compiled.  ``local`` must lie in ``[0, flat.size)`` (``IndexError``)."""
    local = np.asarray(local, np.int64)
    values = np.asarray(values, np.float64)
    if local.shape != values.shape:
        raise ValueError(f"{local.size} positions but {values.size} values")
    if local.size and (int(local.min()) < 0 or int(local.max()) >= flat.size):
        raise IndexError(f"a position outside the band of {flat.size} cells")
    _scatter_add(flat, local, values)


# ----------------------------------------------------------------------------- +-1 products

def _pm_numpy(x: np.ndarray, b: int) -> np.ndarray:
    """:func:`pm_product` by numpy's operations (the reference; the first use after installing)."""
    out = np.empty(x.shape)
    common = x[:, 0] + x[:, b]
    for a in range(1, x.shape[1]):
        if a != b:
            row = out[:, a]
            np.add(x[:, a], common, out=row)
            np.negative(row, out=row)
    out[:, 0] = x[:, b]
    out[:, b] = x[:, 0]
    return out


@njit(nogil=True, cache=True)
def _pm_rows(x, b, out):  # pragma: no cover - compiled
    P, k, Q = x.shape
    for i in range(P):
        for j in range(Q):
            out[i, 0, j] = x[i, b, j]
            out[i, b, j] = x[i, 0, j]
        for a in range(1, k):
            if a != b:
                for j in range(Q):
                    out[i, a, j] = -(x[i, a, j] + (x[i, 0, j] + x[i, b, j]))


@njit(nogil=True, cache=True)
def _pm_cells(x, b, out):  # pragma: no cover - compiled
    P, k, Q = x.shape
    xf = x.reshape(-1)
    of = out.reshape(-1)
    off_b = b * Q
    if k == 3 and Q > 1:  # a ternary axis: the one other row is 3 - b (unrolled: the same operations)
        off_a = (3 - b) * Q
        for base in range(0, P * 3 * Q, 3 * Q):
            for j in range(base, base + Q):
                x0 = xf[j]
                xb = xf[j + off_b]
                c = x0 + xb
                of[j] = xb
                of[j + off_b] = x0
                of[j + off_a] = -(xf[j + off_a] + c)
        return
    for base in range(0, P * k * Q, k * Q):
        for j in range(base, base + Q):
            x0 = xf[j]
            xb = xf[j + off_b]
            c = x0 + xb
            of[j] = xb
            of[j + off_b] = x0
            for a in range(1, k):
                if a != b:
                    of[j + a * Q] = -(xf[j + a * Q] + c)


#: Shortest rows (cells after the axis) that :func:`pm_product` walks row by row.
PM_ROW_MIN = 16


def ahead_kernels() -> list:
    """``(dispatcher, argument types)`` of :func:`pm_product`'s kernels (compiled in a second
    process on their first use after installing: :mod:`fsll_ooc.kernels.ahead`)."""
    out = np.zeros((1, 3, 1))
    read_only = out.copy()
    read_only.setflags(write=False)  # (a band read from a file may be read-only)
    pm = [(disp, tuple(disp.typeof_pyval(a) for a in (x, np.int64(1), out)))
          for disp in (_pm_rows, _pm_cells) for x in (out, read_only)]
    flat, i = out.reshape(-1), np.int64(1)
    return pm + [(_axis_pass, tuple(_axis_pass.typeof_pyval(a) for a in (x.reshape(-1), flat, i, i, i, True, i, i, i, i)))
                 for x in (out, read_only)]


def pm_kernels_ready() -> bool:
    """May :func:`pm_product` call its kernels?  Not while a second process compiles them (their
    first use after installing: :func:`fsll_ooc.kernels.ahead.ready`); :func:`pm_product` then
    uses numpy's operations (the same bits)."""
    return ahead.ready(__name__)


def pm_product(x: np.ndarray, b: int) -> np.ndarray:
    """The product rule of a +-1 axis (:func:`fsll_ooc.basis.apply_product`) on ``x`` of shape
    ``(before, k, after)``, C-contiguous float64, the axis in the middle, ``0 < b < k``: a new
    array with row ``0`` = ``x``'s row ``b``, row ``b`` = row ``0`` and every other row ``a`` =
    ``-(x_a + (x_0 + x_b))``, in one compiled walk with numpy's bits (:func:`_pm_numpy`, which
    runs until the kernels are compiled: :func:`pm_kernels_ready`)."""
    b = int(b)
    if not pm_kernels_ready():
        return _pm_numpy(x, b)
    out = np.empty(x.shape)
    if x.shape[2] >= PM_ROW_MIN:  # long rows: row by row (vectorised)
        _pm_rows(x, np.int64(b), out)
    else:  # short rows: cell by cell across the axis
        _pm_cells(x, np.int64(b), out)
    return out


# ----------------------------------------------------------------------------- a step's partner

@njit(nogil=True, cache=True)
def _axis_pass(src, dst, k, s, b, walsh, o0, o1, q0, q1):  # pragma: no cover - compiled
    """One axis of the product rule on blocks ``o0 .. o1-1`` of ``k s`` cells, offsets ``q0 .. q1-1``
    of each row (:func:`fsll_ooc.kernels.search.axis_rows`: the Walsh-Hadamard rule or the +-1 rule)."""
    axis_rows(src, dst, k, s, b, walsh, o0, o1, q0, q1)


#: A pass of :func:`partner_into` along one axis is split into about this many pieces per thread.
_PARTNER_PIECES = 4


def partner_into(src: np.ndarray, shape: tuple, axes, out: np.ndarray, tmp: np.ndarray | None,
                 n_threads: int = 1) -> np.ndarray:
    """The partner of a step: the product rule (:func:`fsll_ooc.basis.apply_product`) along each
    ``(axis, digit, walsh)`` of ``axes`` in turn, applied to ``src`` (a C-order band of ``shape``,
    flat), written into ``out`` (flat, ``src``'s size; returned).  The same operations in the same
    order as :func:`fsll_ooc.basis.apply_product` axis after axis (the same bits), each axis one
    compiled walk; the results of two axes alternate between ``out`` and ``tmp`` (needed with
    more than one axis of non-zero digit), the last one in ``out``.  ``n_threads > 1``: a band of
    at least :data:`PARALLEL_MIN` cells is walked in pieces on the helpers of
    :mod:`fsll_ooc.kernels.threadpool` (each piece writes its own cells)."""
    n = int(src.size)
    axes = [(int(ax), int(b), bool(w)) for ax, b, w in axes if int(b) != 0]
    if not axes:
        out[:] = src
        return out
    left = len(axes)
    cur = src
    for ax, b, walsh in axes:
        dst = out if left % 2 == 1 else tmp  # the last axis writes out
        left -= 1
        k = int(shape[ax])
        s = int(math.prod(shape[ax + 1:]))
        nb = n // (k * s)
        if n_threads > 1 and n >= PARALLEL_MIN:
            qsplit = nb < s  # few blocks: split the offsets of each row instead
            units = s if qsplit else nb
            pieces = min(units, _PARTNER_PIECES * n_threads)
            per = -(-units // pieces)
            pieces = -(-units // per)

            def piece(i, cur=cur, dst=dst, k=k, s=s, b=b, walsh=walsh, nb=nb, qsplit=qsplit, per=per, units=units):
                m0, m1 = i * per, min(i * per + per, units)
                if qsplit:
                    _axis_pass(cur, dst, k, s, b, walsh, 0, nb, m0, m1)
                else:
                    _axis_pass(cur, dst, k, s, b, walsh, m0, m1, 0, s)

            threadpool.parallel_for(n_threads, pieces, piece)
        else:
            _axis_pass(cur, dst, k, s, b, walsh, 0, nb, 0, s)
        cur = dst
    return out
