"""Compiled pair products of the corrective phases: ``Phi_a Phi_b`` expanded for many pairs.

:func:`fsll_ooc.learn.corrective.pair_products` expands ``Phi_a Phi_b = sum_k coef_k
Phi_{flat_k}`` (the product rule of :func:`fsll_ooc.basis.product_matrix`): a
Walsh-Hadamard axis contributes ``a XOR b``; a +-1 axis ``a`` or ``b`` when the other is
0, ``0`` when they are equal, and ``-phi_0 - phi_a - phi_b`` when both are non-zero and
different (a *triple* axis).  A pair with ``t`` triple axes has ``3^t`` terms, all with
coefficient ``(-1)^t``.

:func:`expand` writes the terms pair by pair (the pairs in order); within a pair term
``k`` takes, on its ``q``-th triple axis (in axis order), digit ``0``, ``a`` or ``b`` by the
``q``-th base-3 digit of ``k`` (the first triple axis varies fastest): the order in which
the axis-by-axis numpy expansion lists a pair's terms, so sums over a pair's terms
(:func:`pair_sums`) add the same numbers in the same order.
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["expand", "pair_sums", "moment_matrix", "pair_sums_at", "pair_sums_grid", "row_sums",
           "pair_sums_column", "warmup"]


@njit(inline="always")
def _cell(base, k, nt, t_a, t_b, t_stride):
    """The ``k``-th product cell of a pair: ``base`` plus, on each of its ``nt`` axes where
    both digits are non-zero and differ, nothing, ``a`` or ``b`` (``k``'s base-3 digits)."""
    f = base
    rest = k
    for q in range(nt):
        ch = rest % 3
        rest //= 3
        if ch == 1:
            f += t_a[q] * t_stride[q]
        elif ch == 2:
            f += t_b[q] * t_stride[q]
    return f


@njit(cache=True, nogil=True)
def expand(dig_a, dig_b, ia, ib, strides, walsh):
    """``(pair, flat, coef)`` of the pairs ``(dig_a[ia[j]], dig_b[ib[j]])`` (digit rows)."""
    P = ia.shape[0]
    nax = strides.shape[0]
    counts = np.empty(P, np.int64)
    total = 0
    for j in range(P):
        c = 1
        ra = ia[j]
        rb = ib[j]
        for ax in range(nax):
            if not walsh[ax]:
                a = dig_a[ra, ax]
                b = dig_b[rb, ax]
                if a != b and a != 0 and b != 0:
                    c *= 3
        counts[j] = c
        total += c
    pair = np.empty(total, np.int64)
    flat = np.empty(total, np.int64)
    coef = np.empty(total)
    t_stride = np.empty(nax, np.int64)
    t_a = np.empty(nax, np.int64)
    t_b = np.empty(nax, np.int64)
    pos = 0
    for j in range(P):
        ra = ia[j]
        rb = ib[j]
        base = np.int64(0)
        nt = 0
        sign = 1.0
        for ax in range(nax):
            a = dig_a[ra, ax]
            b = dig_b[rb, ax]
            if walsh[ax]:
                base += (a ^ b) * strides[ax]
            elif a == b:
                continue
            elif a == 0 or b == 0:
                base += (a | b) * strides[ax]
            else:
                t_stride[nt] = strides[ax]
                t_a[nt] = a
                t_b[nt] = b
                nt += 1
                sign = -sign
        for k in range(counts[j]):
            pair[pos] = j
            flat[pos] = _cell(base, k, nt, t_a, t_b, t_stride)
            coef[pos] = sign
            pos += 1
    return pair, flat, coef


@njit(cache=True, nogil=True)
def pair_sums(pair, coef, cells, n_pairs):
    """``np.bincount(pair, weights=coef * cells, minlength=n_pairs)``: the same sums in the same
    order (term by term)."""
    out = np.zeros(n_pairs)
    for k in range(pair.shape[0]):
        out[pair[k]] += coef[k] * cells[k]
    return out


@njit(cache=True, nogil=True)
def moment_matrix(pair, coef, cells, I, J, m):
    """The symmetric ``(m, m)`` matrix with ``s = pair_sums(pair, coef, cells, len(I))`` at ``(I[p],
    J[p])`` and ``(J[p], I[p])`` (zero elsewhere): the same sums, in one call."""
    s = pair_sums(pair, coef, cells, I.shape[0])
    M = np.zeros((m, m))
    for p in range(I.shape[0]):
        M[I[p], J[p]] = s[p]
        M[J[p], I[p]] = s[p]
    return M


@njit(inline="always")
def _row_sums(dig_a, dig_b, strides):
    """Per row of ``dig_a``: its flat index, its non-zero axes (in axis order) and how many;
    per row of ``dig_b``: its flat index."""
    nax = strides.shape[0]
    na = dig_a.shape[0]
    nb = dig_b.shape[0]
    fa = np.zeros(na, np.int64)
    nz = np.empty((na, nax), np.int64)
    nnz = np.zeros(na, np.int64)
    for r in range(na):
        for ax in range(nax):
            d = dig_a[r, ax]
            if d != 0:
                fa[r] += d * strides[ax]
                nz[r, nnz[r]] = ax
                nnz[r] += 1
    fb = np.zeros(nb, np.int64)
    for r in range(nb):
        for ax in range(nax):
            fb[r] += dig_b[r, ax] * strides[ax]
    return fa, nz, nnz, fb


@njit(inline="always")
def _pair_sum(ra, rb, dig_a, dig_b, strides, walsh, table, fa, nz, nnz, fb, t_stride, t_a, t_b):
    """The sum of pair ``(dig_a[ra], dig_b[rb])``'s product cells read off ``table``, in
    :func:`expand`'s order, from ``0.0``."""
    base = fa[ra] + fb[rb]
    nt = 0
    sign = 1.0
    n = 1
    for q in range(nnz[ra]):  # (in axis order)
        ax = nz[ra, q]
        b = dig_b[rb, ax]
        if b == 0:
            continue
        a = dig_a[ra, ax]
        base -= (a + b) * strides[ax]
        if walsh[ax]:
            base += (a ^ b) * strides[ax]
        elif a != b:
            t_stride[nt] = strides[ax]
            t_a[nt] = a
            t_b[nt] = b
            nt += 1
            n *= 3
            sign = -sign
    acc = 0.0
    for k in range(n):
        acc += sign * table[_cell(base, k, nt, t_a, t_b, t_stride)]
    return acc


@njit(cache=True, nogil=True)
def pair_sums_at(dig_a, dig_b, ia, ib, strides, walsh, table):
    """``pair_sums(pair, coef, table[flat], P)`` of ``(pair, flat, coef) = expand(dig_a, dig_b, ia,
    ib, strides, walsh)``, without writing the expansion out: each pair's terms are read off
    ``table`` (the whole table, flat C order) and added in :func:`expand`'s order, from
    ``0.0``, so the sums have the same bits.  A pair costs the non-zero digits of its ``a``
    (the flat indices of both rows are summed first, then corrected on the shared axes)."""
    P = ia.shape[0]
    nax = strides.shape[0]
    fa, nz, nnz, fb = _row_sums(dig_a, dig_b, strides)
    out = np.empty(P)
    t_stride = np.empty(nax, np.int64)
    t_a = np.empty(nax, np.int64)
    t_b = np.empty(nax, np.int64)
    for j in range(P):
        out[j] = _pair_sum(ia[j], ib[j], dig_a, dig_b, strides, walsh, table, fa, nz, nnz, fb, t_stride, t_a, t_b)
    return out


@njit(cache=True, nogil=True)
def row_sums(dig_a, dig_b, strides):
    """``(fa, nz, nnz, fb)`` of :func:`pair_sums_column`: per row of ``dig_a`` its flat index, its
    non-zero axes (in axis order) and how many; per row of ``dig_b`` its flat index."""
    return _row_sums(dig_a, dig_b, strides)


@njit(cache=True, nogil=True)
def pair_sums_column(dig, c, rank, strides, walsh, table, fa, nz, nnz, fb):
    """:func:`pair_sums_at` of the pairs of every row ``i`` of ``dig`` with row ``c``, the row of
    lower ``rank`` first (``(i, c)`` where ``rank[i] <= rank[c]``, else ``(c, i)``), with the
    rows' sums ``(fa, nz, nnz, fb) = row_sums(dig, dig, strides)`` made once by the caller: the
    same sums, bit for bit."""
    K = dig.shape[0]
    nax = strides.shape[0]
    out = np.empty(K)
    t_stride = np.empty(nax, np.int64)
    t_a = np.empty(nax, np.int64)
    t_b = np.empty(nax, np.int64)
    rc = rank[c]
    for i in range(K):
        if rank[i] <= rc:
            out[i] = _pair_sum(i, c, dig, dig, strides, walsh, table, fa, nz, nnz, fb, t_stride, t_a, t_b)
        else:
            out[i] = _pair_sum(c, i, dig, dig, strides, walsh, table, fa, nz, nnz, fb, t_stride, t_a, t_b)
    return out


@njit(cache=True, nogil=True)
def pair_sums_grid(dig_a, dig_b, strides, walsh, table):
    """:func:`pair_sums_at` of every pair ``(i, j)`` of a row ``i`` of ``dig_a`` and a row ``j`` of
    ``dig_b``, as a ``(len(dig_a), len(dig_b))`` matrix (the same sums, bit for bit; no pair
    lists).  When every axis is Walsh-Hadamard a pair's one product cell is the XOR of the two
    flat indices (each digit owns its own bits): read straight off the table."""
    na = dig_a.shape[0]
    nb = dig_b.shape[0]
    nax = strides.shape[0]
    fa, nz, nnz, fb = _row_sums(dig_a, dig_b, strides)
    out = np.empty((na, nb))
    all_walsh = True
    for ax in range(nax):
        if not walsh[ax]:
            all_walsh = False
    if all_walsh:
        for i in range(na):
            f = fa[i]
            for j in range(nb):
                out[i, j] = 0.0 + 1.0 * table[f ^ fb[j]]
        return out
    t_stride = np.empty(nax, np.int64)
    t_a = np.empty(nax, np.int64)
    t_b = np.empty(nax, np.int64)
    for i in range(na):
        for j in range(nb):
            out[i, j] = _pair_sum(i, j, dig_a, dig_b, strides, walsh, table, fa, nz, nnz, fb, t_stride, t_a, t_b)
    return out


def warmup() -> None:
    """Compile (or load from numba's cache) the kernels."""
    d = np.zeros((1, 2), np.int64)
    i = np.zeros(1, np.int64)
    p, f, c = expand(d, d, i, i, np.ones(2, np.int64), np.zeros(2, np.bool_))
    pair_sums(p, c, c, 1)
    moment_matrix(p, c, c, i, i, 1)
    pair_sums_at(d, d, i, i, np.ones(2, np.int64), np.zeros(2, np.bool_), np.zeros(4))
    pair_sums_grid(d, d, np.ones(2, np.int64), np.zeros(2, np.bool_), np.zeros(4))
    rows = row_sums(d, d, np.ones(2, np.int64))
    pair_sums_column(d, 0, i, np.ones(2, np.int64), np.zeros(2, np.bool_), np.zeros(4), *rows)
