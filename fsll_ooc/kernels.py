"""Compiled block kernels: the fused "dual update + candidate scan" of one block.

One learning iteration is one streaming pass per block of the dual table
``thetabar``: each element is updated by the incremental identity (design notes,
identity 3)::

    thetabar'(y) = (cosh(delta) thetabar(y) + sinh(delta) <Phi_y Phi_y'>) / (cosh(delta) + sinh(delta) thetabar(y'))

and, while it is in registers, scored as an *append* candidate: the cheap lower bound
``r_y - (t - d)^2 / (1 - t^2)`` first, the exact cost change (two ``log1p`` pairs)
only when the bound beats the block's champion (paper Algorithm 2).

A block is viewed as a 2-D ``(P, Q)`` C-contiguous array; ``r_y`` is generated as
``r_const + rP[p] + rQ[q]`` (it is separable), never read from memory.  The partner
``<Phi_y Phi_y'>`` is either a permutation ``(permP[p], permQ[q])`` (all changed axes
Walsh-Hadamard: ``y XOR y'``, an involution, so the block is updated in place pair by
pair) or an explicit array computed beforehand (axes with the +-1 basis).

Ties are broken towards the lowest flat position, so every block decomposition
and thread count selects the same winner as a dense ``argmin``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

__all__ = ["update_scan_perm", "update_scan_explicit", "reduce_rows", "warmup"]


@njit(inline="always")
def _exact(t, d, r):
    """Exact cost change of appending at the 1-D optimum (paper Eq. 15)."""
    return 0.5 * ((1.0 + d) * (math.log1p(t) - math.log1p(d)) + (1.0 - d) * (math.log1p(-t) - math.log1p(-d))) + r


# The hot test is the lower bound without its division:
#     r - (t - d)^2 / (1 - t^2) < best   <=>   (r - best) (1 - t^2) < (t - d)^2
# (1 - t^2 > 0).  Only when it passes is the exact change computed; this branch is rare,
# so the position bookkeeping (skip y = 0, ties to the lowest position) lives there.


def _make_pair_kernel(use_xor: bool):
    """The fused update + scan for a partner permutation that is an involution.

    ``use_xor`` (a compile-time constant): the permutation is ``(p ^ mp, q ^ mq)`` and no
    index arrays are loaded; otherwise ``(permP[p], permQ[q])``.  Each pair of cells is
    read, updated and scored once, by the thread that owns its lower row.
    """

    def kernel(t, d, rP, rQ, r_const, permP, permQ, mp, mq, ch, sh, inv_den, threshold, skip, row_best, row_pos):
        P, Q = t.shape
        ca = ch * inv_den
        sb = sh * inv_den
        for p in prange(P):
            if use_xor:
                pp = p ^ mp
            else:
                pp = permP[p]
            best = threshold
            bpos = np.int64(-1)
            if p <= pp:
                rp = r_const + rP[p]
                rpp = r_const + rP[pp]
                tp = t[p]
                tpp = t[pp]
                dp = d[p]
                dpp = d[pp]
                for q in range(Q):
                    if use_xor:
                        qq = q ^ mq
                    else:
                        qq = permQ[q]
                    if p == pp and q > qq:
                        continue
                    a = tp[q]
                    b = tpp[qq]
                    na = ca * a + sb * b
                    nb = ca * b + sb * a
                    tp[q] = na
                    tpp[qq] = nb
                    da = dp[q]
                    r = rp + rQ[q]
                    if (r - best) * (1.0 - na * na) < (na - da) * (na - da):
                        pos = np.int64(p) * Q + q
                        if pos != skip:
                            ex = _exact(na, da, r)
                            if ex < best or (ex == best and pos < bpos):
                                best = ex
                                bpos = pos
                    if p != pp or q != qq:
                        db = dpp[qq]
                        r = rpp + rQ[qq]
                        if (r - best) * (1.0 - nb * nb) < (nb - db) * (nb - db):
                            pos = np.int64(pp) * Q + qq
                            if pos != skip:
                                ex = _exact(nb, db, r)
                                if ex < best or (ex == best and pos < bpos):
                                    best = ex
                                    bpos = pos
            row_best[p] = best
            row_pos[p] = bpos

    return kernel


def _update_scan_explicit(t, partner, d, rP, rQ, r_const, ch, sh, inv_den, update, threshold, skip, row_best, row_pos):
    P, Q = t.shape
    ca = ch * inv_den
    sb = sh * inv_den
    for p in prange(P):
        best = threshold
        bpos = np.int64(-1)
        rp = r_const + rP[p]
        for q in range(Q):
            a = t[p, q]
            if update:
                a = ca * a + sb * partner[p, q]
                t[p, q] = a
            da = d[p, q]
            r = rp + rQ[q]
            if (r - best) * (1.0 - a * a) < (a - da) * (a - da):
                pos = np.int64(p) * Q + q
                if pos != skip:
                    ex = _exact(a, da, r)
                    if ex < best or (ex == best and pos < bpos):
                        best = ex
                        bpos = pos
        row_best[p] = best
        row_pos[p] = bpos


_perm_serial = njit(cache=True, nogil=True)(_make_pair_kernel(False))
_perm_parallel = njit(cache=True, nogil=True, parallel=True)(_make_pair_kernel(False))
_xor_serial = njit(cache=True, nogil=True)(_make_pair_kernel(True))
_xor_parallel = njit(cache=True, nogil=True, parallel=True)(_make_pair_kernel(True))
_expl_serial = njit(cache=True, nogil=True)(_update_scan_explicit)
_expl_parallel = njit(cache=True, nogil=True, parallel=True)(_update_scan_explicit)


@njit(cache=True, nogil=True)
def reduce_rows(row_best, row_pos):
    """Reduce per-row champions to ``(best, pos)``; ties go to the lowest position."""
    best = np.inf
    bpos = np.int64(-1)
    for i in range(row_best.shape[0]):
        b = row_best[i]
        if row_pos[i] >= 0 and (b < best or (b == best and row_pos[i] < bpos)):
            best = b
            bpos = row_pos[i]
    return best, bpos


def _rows(P):
    return np.empty(P, dtype=np.float64), np.empty(P, dtype=np.int64)


def update_scan_perm(t, d, rP, rQ, r_const, permP, permQ, ch, sh, inv_den, threshold=0.0, skip=-1, parallel=False):
    """Fused update (partner = permutation) and scan of block ``t`` (modified in place).

    Returns ``(best_delta, flat_position)``; position ``-1`` when no candidate beats ``threshold``.
    """
    rb, rp = _rows(t.shape[0])
    P, Q = t.shape
    mp, mq = int(permP[0]), int(permQ[0])
    if np.array_equal(permP, np.arange(P) ^ mp) and np.array_equal(permQ, np.arange(Q) ^ mq):
        fn = _xor_parallel if parallel else _xor_serial
    else:
        fn = _perm_parallel if parallel else _perm_serial
    fn(t, d, rP, rQ, float(r_const), permP, permQ, np.int64(mp), np.int64(mq), float(ch), float(sh), float(inv_den), float(threshold), np.int64(skip), rb, rp)
    return reduce_rows(rb, rp)


def update_scan_explicit(t, partner, d, rP, rQ, r_const, ch=1.0, sh=0.0, inv_den=1.0, update=True,
                         threshold=0.0, skip=-1, parallel=False):
    """Fused update (explicit partner array) and scan; ``update=False`` only scans."""
    rb, rp = _rows(t.shape[0])
    fn = _expl_parallel if parallel else _expl_serial
    if partner is None:
        partner = t
    fn(t, partner, d, rP, rQ, float(r_const), float(ch), float(sh), float(inv_den), bool(update), float(threshold), np.int64(skip), rb, rp)
    return reduce_rows(rb, rp)


def warmup() -> None:
    """Compile (or load from numba's cache) every kernel variant on tiny inputs."""
    t = np.zeros((2, 4))
    d = np.zeros((2, 4))
    r = np.zeros(2), np.zeros(4)
    for par in (False, True):
        update_scan_perm(t, d, *r, 0.0, np.array([1, 0]), np.array([1, 0, 3, 2]), 1.0, 0.0, 1.0, parallel=par)
        update_scan_perm(t, d, *r, 0.0, np.array([0, 1]), np.array([0, 2, 1, 3]), 1.0, 0.0, 1.0, parallel=par)
        update_scan_explicit(t, None, d, *r, 0.0, update=False, parallel=par)
