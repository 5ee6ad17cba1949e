"""Compiled sub-table search: the greedy steps of a batch on its gathered marginal sub-table.

:func:`fsll_ooc.learn.batch.search_marginal` takes the paper's steps (append, adjust,
remove) on the ``prod_{i in V} k_i`` cells of a marginal sub-table until none gains
``epsilon``.  Each step scans every cell once (the best append, lower bound first, and
the best adjust or remove of the members) and updates every cell once (the incremental
dual update with the partner ``<Phi_y Phi_y'>``).  On numpy that is a dozen calls on
small arrays per step; here one compiled call runs the whole search.  On a large sub-table
each step's sweep is shared in pieces with the helper threads of
:mod:`fsll_ooc.kernels.threadpool` (:func:`sub_helper`), with the same bits (with a +-1 axis,
the partner's axes too, one after the other).

The formulas are those of :mod:`fsll_ooc.cost` (the reference), in the same order of
operations, evaluated with the C library's ``log1p``, ``atanh``, ``cosh``, ``sinh`` as
:mod:`fsll_ooc.cost` and the table scans (:mod:`fsll_ooc.kernels.scan`) evaluate them, so
the sub-table search and the whole-table scan score a cell with the same bits.  A target
or dual of exactly ``+-1`` (reachable only by rounding) takes the limit ``0 ln 0 = 0``
(:func:`fsll_ooc.cost.kl_step`) instead of giving NaN.

The partner of a step on Walsh-Hadamard axes only is one flat XOR (the digits own
disjoint bits of the flat index); otherwise the product rule
(:func:`fsll_ooc.basis.apply_product`) is applied axis by axis, in increasing axis order,
with the same additions as numpy's.

Pricing: the paper's code prices a cell by its fixed ``r_y`` (given); the family code
(:class:`fsll_ooc.cost.TermCode`) re-prices the cells of a family whenever its member
count changes, with :meth:`~fsll_ooc.cost.TermCode.add`'s formula.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import threadpool
from .atomics import cas, fetch_add, load, store

__all__ = ["kl_to_optimum", "search_sub", "sub_helper", "search_threads", "helper_ready", "shared_done",
           "shared_arrays", "replay_sub", "axis_rows", "ahead_kernels", "warmup", "PARALLEL_MIN_CELLS",
           "PARALLEL_MIN_CELLS_PM", "RUN"]

_LIM = 1.0 - 2.0**-52
#: Cells per bound test of the search (runs; a sub-table of fewer cells is one run).
RUN = 64
#: A search on several threads splits each step into pieces of at least this many cells ...
_PIECE_CELLS = 4096
#: ... and about this many pieces per thread (a late helper delays a step by one piece).
_PIECES_PER_THREAD = 4
#: Sub-tables of at least this many cells (Walsh-Hadamard axes only) are searched on every
#: thread of :mod:`fsll_ooc.kernels.threadpool` (below it, a step is too short to share).
PARALLEL_MIN_CELLS = 2**15
#: ... and sub-tables with a +-1 axis of at least this many cells (a step there makes the partner
#: axis by axis before the update: more work per cell, so a smaller sub-table is worth sharing).
PARALLEL_MIN_CELLS_PM = 2**14
#: A step of a shared search whose thread, its own pieces done, waits more than this many
#: turns per cell of a piece for its helpers' pieces (a piece takes about one or two turns per
#: cell) is stalled: a helper holding a piece waits for a core.  When more than one step in
#: ``_STALL_STEPS`` stalls (counted from that many steps on), or the helpers took less than
#: :data:`MIN_SHARE` of their share of the pieces of the last ``_STALL_STEPS`` steps (from the
#: second such window on: the helpers start meanwhile), the search goes on alone.
STALL_SPINS = 32
_STALL_STEPS = 16
#: After a search that went on alone, this many searches run on one thread before sharing is
#: tried again (:func:`search_threads`).
STALL_BACKOFF = 4
#: A helper that finds no piece this many times in a row leaves (the search's thread is not
#: stepping: it waits for a core), rather than hold a core the search may need.
_IDLE_TURNS = 1 << 22
#: A shared search goes on alone when its helpers took less than this part of their share of
#: the pieces (see :data:`STALL_SPINS`).
MIN_SHARE = 0.5
_backoff = {"searches": 0}

#: Move codes of :func:`search_sub`'s output.
APPEND, ADJUST, REMOVE = 0, 1, 2


@njit(inline="always", error_model="numpy")
def kl_to_optimum(t, d):
    """``KL`` change of moving ``thetabar_y`` from ``t`` to its optimum ``d``
    (:func:`fsll_ooc.cost.kl_step` ``(d, t, d)``), with ``0 ln 0 = 0`` at ``d = +-1``."""
    a = 0.0 if d == -1.0 else (1.0 + d) * (math.log1p(t) - math.log1p(d))
    b = 0.0 if d == 1.0 else (1.0 - d) * (math.log1p(-t) - math.log1p(-d))
    return 0.5 * (a + b)


@njit(inline="always", error_model="numpy")
def _atanh(t):
    return math.atanh(min(max(t, -_LIM), _LIM))


@njit(inline="always", error_model="numpy")
def _lncosh(x):
    x = abs(x)
    return x + math.log1p(math.exp(-2.0 * x)) - math.log(2.0)


@njit(inline="always")
def _copy_row(dst, src, m):
    """``dst[:m] = src[:m]`` (views; a loop that vectorises, without numpy's overlap check)."""
    for q in range(m):
        dst[q] = src[q]


@njit(cache=True, nogil=True, error_model="numpy")
def _partner(x, shape, strides, walsh, digits, all_walsh, mask, part, tmp):
    """``part[i] = <Phi_i Phi_y'>`` for every cell ``i`` of the sub-table ``x`` (flat), ``y'``
    with sub-table ``digits``: one flat XOR (``all_walsh``) or the product rule axis by axis
    (each axis walked as blocks of ``k`` rows of ``stride`` cells: no division per cell; the
    results of two axes alternate between ``part`` and ``tmp``, the last one in ``part``)."""
    n = x.shape[0]
    if all_walsh:
        for i in range(n):
            part[i] = x[i ^ mask]
        return
    left = 0
    for ax in range(shape.shape[0]):
        if digits[ax] != 0:
            left += 1
    src = x
    for ax in range(shape.shape[0]):
        b = digits[ax]
        if b == 0:
            continue
        dst = part if left % 2 == 1 else tmp  # the last axis writes part
        left -= 1
        k = shape[ax]
        s = strides[ax]
        axis_rows(src, dst, k, s, b, walsh[ax], 0, n // (k * s), 0, s)
        src = dst


#: Rows (an axis' stride) shorter than this are walked cell by cell in :func:`axis_rows` ...
_SHORT_ROW = 4
#: ... and rows at least this long are walked as slices of the whole array (rows between these
#: lengths are walked on views of each block: 1.5-3x faster there, the same operations; on long
#: +-1 rows the views were slower).
_LONG_ROW = 16


@njit(inline="always")
def _pm3_unit(src, dst, b, o0, o1):
    """:func:`axis_rows` on an axis of 3 values and stride 1 by the +-1 rule, blocks ``o0 .. o1-1``:
    the same operations, the block's three cells read once (a loop the compiler runs on vector
    registers: about 5x faster than cell by cell)."""
    if b == 1:
        for o in range(o0, o1):
            p = 3 * o
            x0 = src[p]
            x1 = src[p + 1]
            x2 = src[p + 2]
            dst[p] = x1
            dst[p + 1] = x0
            dst[p + 2] = -(x2 + (x0 + x1))
    else:
        for o in range(o0, o1):
            p = 3 * o
            x0 = src[p]
            x1 = src[p + 1]
            x2 = src[p + 2]
            dst[p] = x2
            dst[p + 1] = -(x1 + (x0 + x2))
            dst[p + 2] = x0


@njit(inline="always")
def _swap_unit(src, dst, o0, o1):
    """:func:`axis_rows` on an axis of 2 values and stride 1 (digit 1, either basis: the two
    rules agree there), blocks ``o0 .. o1-1``: each pair of cells swapped."""
    for o in range(o0, o1):
        p = 2 * o
        x0 = src[p]
        dst[p] = src[p + 1]
        dst[p + 1] = x0


@njit(inline="always")
def axis_rows(src, dst, k, s, b, walsh, o0, o1, q0, q1):
    """One axis of :func:`_partner` (digit ``b`` on an axis of ``k`` values and stride ``s``) on
    the blocks ``o0 .. o1-1`` of ``k s`` cells, offsets ``q0 .. q1-1`` of each row: the
    Walsh-Hadamard rule (row ``a`` from row ``a ^ b``) or the +-1 rule (row 0 from row ``b``,
    row ``b`` from row 0, row ``a`` from ``-(a + (0 + b))``)."""
    ks = k * s
    w = q1 - q0
    if s == 1 and k == 3 and not walsh:  # the last axis, of three values: three cells per block
        _pm3_unit(src, dst, b, o0, o1)
        return
    if s == 1 and k == 2:  # the last axis, of two values: pairs of cells swapped
        _swap_unit(src, dst, o0, o1)
        return
    if k == 2 and s < _SHORT_ROW:  # two short rows swapped
        for o in range(o0, o1):
            p = ks * o
            for q in range(q0, q1):
                x0 = src[p + q]
                dst[p + q] = src[p + s + q]
                dst[p + s + q] = x0
        return
    if s < _SHORT_ROW:  # short rows: cell by cell across the axis (no views)
        for o in range(o0 * ks, o1 * ks, ks):
            for q in range(o + q0, o + q1):
                if walsh:
                    for a in range(k):
                        dst[q + a * s] = src[q + (a ^ b) * s]
                else:
                    x0 = src[q]
                    xb = src[q + b * s]
                    dst[q] = xb
                    for a in range(1, k):
                        if a == b:
                            dst[q + a * s] = x0
                        else:
                            dst[q + a * s] = -(src[q + a * s] + (x0 + xb))
        return
    if s >= _LONG_ROW:  # long rows: each row a slice of the whole array
        for o in range(o0 * ks, o1 * ks, ks):
            if walsh:
                for a in range(k):
                    _copy_row(dst[o + a * s + q0:o + a * s + q1], src[o + (a ^ b) * s + q0:o + (a ^ b) * s + q1], w)
            else:
                s0 = src[o + q0:o + q1]
                sp = src[o + b * s + q0:o + b * s + q1]
                _copy_row(dst[o + q0:o + q1], sp, w)  # a = 0: the partner's row
                for a in range(1, k):
                    row = o + a * s
                    if a == b:
                        _copy_row(dst[row + q0:row + q1], s0, w)
                    else:
                        dr = dst[row + q0:row + q1]
                        sr = src[row + q0:row + q1]
                        for q in range(w):
                            dr[q] = -(sr[q] + (s0[q] + sp[q]))
        return
    for o in range(o0 * ks, o1 * ks, ks):  # rows on views of the block, indexed from its start
        blk = src[o:o + ks]
        dbk = dst[o:o + ks]
        if walsh:
            for a in range(k):
                sr = blk[(a ^ b) * s:(a ^ b) * s + s]
                dr = dbk[a * s:a * s + s]
                for q in range(q0, q1):
                    dr[q] = sr[q]
        else:
            s0 = blk[0:s]
            sp = blk[b * s:b * s + s]
            d0 = dbk[0:s]
            for q in range(q0, q1):  # a = 0: the partner's row
                d0[q] = sp[q]
            for a in range(1, k):
                dr = dbk[a * s:a * s + s]
                if a == b:
                    for q in range(q0, q1):
                        dr[q] = s0[q]
                else:
                    sr = blk[a * s:a * s + s]
                    for q in range(q0, q1):
                        dr[q] = -(sr[q] + (s0[q] + sp[q]))


@njit(cache=True, nogil=True, error_model="numpy")
def _update(x, i, delta, shape, strides, walsh, all_walsh, part, tmp):
    """The incremental dual update of the sub-table ``x`` (in place) by ``delta`` on cell ``i``;
    returns ``ln`` of the normaliser (``cosh(delta) + sinh(delta) x[i]``)."""
    nax = shape.shape[0]
    digits = np.empty(nax, np.int64)
    mask = np.int64(0)
    rest = i
    for ax in range(nax - 1, -1, -1):
        digits[ax] = rest % shape[ax]
        rest //= shape[ax]
    if all_walsh:
        sh_bits = 0
        for ax in range(nax - 1, -1, -1):
            mask |= digits[ax] << sh_bits
            kk = shape[ax]
            while kk > 1:
                sh_bits += 1
                kk >>= 1
    t = x[i]
    ch = math.cosh(delta)
    sh = math.sinh(delta)
    den = ch + sh * t
    a = ch / den
    b = sh / den
    if all_walsh:
        _xor_update(x, mask, a, b)
    else:
        _partner(x, shape, strides, walsh, digits, False, mask, part, tmp)
        for j in range(x.shape[0]):
            x[j] = x[j] * a + b * part[j]
    return math.log(den)


@njit(inline="always", error_model="numpy")
def _price(fam_m_total, r0, r1, n_samples, name, scale, m):
    """:meth:`fsll_ooc.cost.TermCode.add` of the family code (``m`` members now; ``r1``: a further
    member's price per parameter, ``r0`` a first one's)."""
    if m >= fam_m_total:
        return np.inf
    x = (r0 if m == 0 else r1) + (math.log(fam_m_total - m) - math.log(m + 1)) / n_samples + (name if m == 0 else 0.0)
    return x if scale == 1.0 else scale * x


@njit(cache=True, nogil=True, error_model="numpy")
def _reprice(r, member, f, fam_cnt, fam_total, fam_name, fam_ptr, fam_cells, r0, r1, n_samples, scale):
    m = fam_cnt[f]
    M = fam_total[f]
    if M <= 1:
        return
    add_m = _price(M, r0, r1, n_samples, fam_name[f], scale, m)
    add_less = _price(M, r0, r1, n_samples, fam_name[f], scale, m - 1) if m else np.inf
    for q in range(fam_ptr[f], fam_ptr[f + 1]):
        c = fam_cells[q]
        r[c] = add_less if member[c] else add_m


@njit(inline="always", error_model="numpy")
def _passes(x, d, ra, best):
    """The division-free lower bound (:func:`fsll_ooc.cost.lower_bound` ``< best``)."""
    return (ra - best) * (1.0 - x * x) < (x - d) * (x - d)


@njit(cache=True, nogil=True, error_model="numpy")
def _replay(x, d, ra, a, m, best, bi):
    """The exact append change of cells ``a .. a+m-1`` (whose bound may beat ``best``): the best
    and its cell (ties: the lowest cell)."""
    for j in range(a, a + m):
        if _passes(x[j], d[j], ra[j], best):
            ex = kl_to_optimum(x[j], d[j]) + ra[j]
            if ex < best or (ex == best and j < bi):
                best, bi = ex, np.int64(j)
    return best, bi


@njit(cache=True, nogil=True, error_model="numpy")
def _scan(x, d, ra, run):
    """The best append with a negative change (:func:`fsll_ooc.cost.delta_append`): ``(change,
    cell)``, ``(0, -1)`` when none; runs of ``run`` cells through the bound first."""
    best = 0.0
    bi = np.int64(-1)
    n = x.shape[0]
    for a in range(0, n, run):
        m = min(run, n - a)
        xr = x[a:a + m]
        dr = d[a:a + m]
        rar = ra[a:a + m]
        hit = 0
        for j in range(m):
            hit += _passes(xr[j], dr[j], rar[j], best)
        if hit:
            best, bi = _replay(x, d, ra, a, m, best, bi)
    return best, bi


@njit(inline="always", error_model="numpy")
def _member_move(x, d, theta, r, i, bs, si, sm):
    """The better of ``(bs, si, sm)`` and the adjust and remove of member ``i`` (the closed forms
    of :func:`fsll_ooc.cost.delta_adjust` and :func:`fsll_ooc.cost.delta_remove`; ties: the lowest
    change, then the lowest cell, adjust before remove)."""
    t = x[i]
    di = d[i]
    adj = kl_to_optimum(t, di)
    a = _atanh(t)
    th = theta[i]
    rem = _lncosh(a - th) - _lncosh(a) + di * th - r[i]
    if adj < bs or (adj == bs and i < si):
        bs, si, sm = adj, i, np.int64(ADJUST)
    if rem < bs or (rem == bs and i < si):
        bs, si, sm = rem, i, np.int64(REMOVE)
    return bs, si, sm


@njit(inline="always", error_model="numpy")
def _run_members(x, d, ra, member, theta, r, a, run, bs, si, sm):
    """:func:`_member_move` of the members among cells ``a .. a+run-1`` (append price ``inf``)."""
    for j in range(a, a + run):
        if ra[j] == np.inf and member[j]:
            bs, si, sm = _member_move(x, d, theta, r, np.int64(j), bs, si, sm)
    return bs, si, sm


@njit(inline="always", error_model="numpy")
def _run_axpy(xr, pr, ca, sb, m):
    """``xr[i] = xr[i] ca + sb pr[i]`` for the ``m`` cells of one run (views indexed from 0: the
    compiler runs the loop on vector registers)."""
    for i in range(m):
        xr[i] = xr[i] * ca + sb * pr[i]


@njit(inline="always", error_model="numpy")
def _run_pair(xa, xb, ca, sb, m):
    """``xa[i], xb[i] = xa[i] ca + sb xb[i], xb[i] ca + sb xa[i]`` for the ``m`` cells of two runs
    that are each other's partners cell by cell (a flat XOR above the run): both read and
    written in one loop, without a copy of either."""
    for i in range(m):
        va = xa[i]
        vb = xb[i]
        xa[i] = va * ca + sb * vb
        xb[i] = vb * ca + sb * va


@njit(inline="always", error_model="numpy")
def _run_pair_xor(xa, xb, lo, ca, sb, m):
    """:func:`_run_pair` with the partner of cell ``i`` of ``xa`` at cell ``i ^ lo`` of ``xb``
    (``lo`` below ``m``, a power of two): each pair read and written once.  When the lowest bit
    of ``lo`` is 8 or more, cells ``i`` and ``i ^ lo`` lie in segments of that many cells that
    are each other's partners cell by cell (:func:`_run_pair` on each); else cell by cell."""
    if lo == 0:
        _run_pair(xa, xb, ca, sb, m)
        return
    low = lo & -lo
    if low >= 8:
        for s0 in range(0, m, low):
            t0 = s0 ^ lo
            _run_pair(xa[s0:s0 + low], xb[t0:t0 + low], ca, sb, low)
        return
    for i in range(m):
        j = i ^ lo
        va = xa[i]
        vb = xb[j]
        xa[i] = va * ca + sb * vb
        xb[j] = vb * ca + sb * va


@njit(inline="always", error_model="numpy")
def _run_self_xor(xr, lo, ca, sb, m):
    """``xr[i] = xr[i] ca + sb xr[i ^ lo]`` for the ``m`` cells of one run (``m`` a power of two
    above ``lo``; ``lo`` 0: the partner is the cell itself).  With ``h >= 8`` the highest bit of
    ``lo``, the cells of each block of ``2 h`` whose bit ``h`` is clear have their partners in
    the block's upper half: :func:`_run_pair_xor` of the two halves (``lo ^ h``); below, cell by
    cell (both cells of each pair read before either is written)."""
    h = np.int64(1)
    while h * 2 <= lo:
        h *= 2
    if lo >= 8:
        for base in range(0, m, 2 * h):
            _run_pair_xor(xr[base:base + h], xr[base + h:base + 2 * h], lo ^ h, ca, sb, h)
        return
    for i in range(m):  # partners within blocks of 8 cells: cell by cell
        j = i ^ lo
        if j > i:
            va = xr[i]
            vb = xr[j]
            xr[i] = va * ca + sb * vb
            xr[j] = vb * ca + sb * va
        elif j == i:
            va = xr[i]
            xr[i] = va * ca + sb * va


@njit(inline="always", error_model="numpy")
def _run_hits(xr, dr, rar, best, m):
    """How many of the ``m`` cells of one run (duals ``xr`` already updated) pass the bound of
    :func:`_passes` against ``best``.  A loop of its own after the update (the update's loop
    with this test inside ran 1.5-2x slower): the same operations per cell, so the same bits."""
    hit = 0
    for i in range(m):
        hit += _passes(xr[i], dr[i], rar[i], best)
    return hit


@njit(inline="always", error_model="numpy")
def _lead_update(x, m, hi, lo, hbu, ca, sb, run):
    """``x[j] = x[j] ca + sb x[j ^ mask]`` on leading run ``m`` and its partner run (the layout of
    :func:`_xor_layout`: leader ``m`` is run ``m`` with a 0 bit inserted at ``hbu``); returns
    the two runs' first cells ``(a, b)`` (``b == a``: the partners lie within the run)."""
    u = (((m & ~(hbu - 1)) << 1) | (m & (hbu - 1))) if hbu else m
    a = u * run
    b = a ^ hi
    xa = x[a:a + run]
    if b == a:  # partners within the run
        _run_self_xor(xa, lo, ca, sb, run)
    elif lo == 0:  # partners cell by cell: one loop over both runs
        _run_pair(xa, x[b:b + run], ca, sb, run)
    else:
        _run_pair_xor(xa, x[b:b + run], lo, ca, sb, run)
    return a, b


@njit(cache=True, nogil=True, error_model="numpy")
def _xor_runs(x, d, ra, hi, lo, hbu, ca, sb, run, m0, m1, members, member, theta, r, rmem):
    """``x[j] = x[j] ca + sb x[j ^ mask]`` on the leading runs ``m0 .. m1-1`` and their partner
    runs (pairs of runs read and written together), each run scanned as :func:`_scan` right
    after; returns the best ``(change, cell)`` among them (``(0, -1)``: none), and with
    ``members`` the best adjust or remove of the members among them, ``(change, cell, move)``
    (:func:`_member_move`; ``(inf, -1, 0)``: none), from their updated duals (``rmem``: the
    members in each run; a run without members is not looked at).

    ``hi``, ``lo``: the mask's bits above and below the run; ``hbu``: the highest bit of
    ``hi // run`` (0 when ``hi`` is 0).  The leading runs are those whose partner run is not
    lower (bit ``hbu`` of the run's index clear), numbered in increasing order: leader ``m`` is
    run ``m`` with a 0 bit inserted at ``hbu``."""
    best = 0.0
    bi = np.int64(-1)
    bs = np.inf
    si = np.int64(-1)
    sm = np.int64(0)
    for m in range(m0, m1):
        a, b = _lead_update(x, m, hi, lo, hbu, ca, sb, run)
        xa = x[a:a + run]
        xb = x[b:b + run]
        # then the bound test of both runs (their cells in cache), each against the same best
        hit = _run_hits(xa, d[a:a + run], ra[a:a + run], best, run)
        if b != a:
            hit += _run_hits(xb, d[b:b + run], ra[b:b + run], best, run)
        if hit:
            best, bi = _replay(x, d, ra, a, run, best, bi)
            if b != a:
                best, bi = _replay(x, d, ra, b, run, best, bi)
        if members:
            if rmem[a // run]:
                bs, si, sm = _run_members(x, d, ra, member, theta, r, a, run, bs, si, sm)
            if b != a and rmem[b // run]:
                bs, si, sm = _run_members(x, d, ra, member, theta, r, b, run, bs, si, sm)
    return best, bi, bs, si, sm


@njit(inline="always")
def _xor_layout(n, mask, run):
    """``(hi, lo, hbu, leaders)`` of the flat XOR ``mask`` on ``n`` cells in runs of ``run``
    (:func:`_xor_runs`)."""
    lo = mask & (run - 1)
    hi = mask & ~np.int64(run - 1)
    hu = hi // run
    hbu = np.int64(0)
    if hu:
        hbu = np.int64(1)
        while hbu * 2 <= hu:
            hbu *= 2
    nrun = n // run
    return hi, lo, hbu, (nrun // 2 if hbu else nrun)


@njit(cache=True, nogil=True, error_model="numpy")
def _xor_update(x, mask, ca, sb):
    """``x[j] = x[j] ca + sb x[j ^ mask]`` for every cell (pairs of runs read and written
    together, as :func:`_xor_runs` without its scan)."""
    run = min(x.shape[0], RUN)
    hi, lo, hbu, nlead = _xor_layout(x.shape[0], mask, run)
    for m in range(nlead):
        _lead_update(x, m, hi, lo, hbu, ca, sb, run)


@njit(cache=True, nogil=True, error_model="numpy")
def _update_scan_xor(x, d, ra, mask, ca, sb, run, rmem):
    """``x[j] = x[j] ca + sb x[j ^ mask]`` for every cell (pairs of runs read and written
    together), each run scanned as :func:`_scan` right after; returns its ``(change, cell)``."""
    hi, lo, hbu, nlead = _xor_layout(x.shape[0], mask, run)
    best, bi, _, _, _ = _xor_runs(x, d, ra, hi, lo, hbu, ca, sb, run, 0, nlead, False, ra, ra, ra, rmem)
    return best, bi


# -- the same update + scan shared between threads, step after step ---------------------------
# ``ctl`` (int64): [0] the ticket ``gen << 40 | pieces << 20 | next piece`` (a piece is taken
# by a compare-and-swap of the ticket; the ticket itself says how many pieces its generation
# has, so that a thread never takes a piece of a generation before it is published), [1]
# pieces done in this generation, [2] stop, [3] pieces the helpers took (all generations).
# ``iprm`` (int64): [0..2] hi, lo, hbu (an axis pass: k, stride, digit), [3] units per piece,
# [4] pieces, [5] units (leaders; an axis pass: blocks or offsets; an update: cells), [6] a
# stall's turns per cell (:data:`STALL_SPINS`), [7] the kind of the generation's pieces
# (:data:`_XOR`, :data:`_AXIS`, :data:`_PART`), [8] an axis pass's basis (1: Walsh-Hadamard),
# [9], [10] its source (0: the duals, 1, 2: ``bufs`` row 0, 1) and destination, [11] its pieces
# split the offsets of each row (1) or the blocks (0), [12] its blocks;
# ``fprm``: ca, sb, :data:`MIN_SHARE`.
_LOW = np.int64(0xFFFFF)
#: Kinds of a generation's pieces: the XOR update + scan, one axis of the product rule, the
#: update + scan from the partner.
_XOR, _AXIS, _PART = 0, 1, 2
_IPRM = 13


@njit(inline="always")
def _take_pieces(x, d, ra, member, theta, r, run, ctl, iprm, fprm, pbest, ppos, bufs, rmem, helper):
    """Take pieces of the current generation until none is left; returns when the ticket
    says so (the pieces taken by others may still run), and whether it took any.  A helper
    counts its pieces in ``ctl[3]``."""
    took = False
    while True:
        c = load(ctl, 0)
        k = c & _LOW
        if k >= (c >> 20) & _LOW:  # the pieces of the generation the ticket names (not iprm's,
            return took  # which may be the next generation's already)
        if not cas(ctl, 0, c, c + 1):
            continue
        took = True
        per = iprm[3]
        m0 = k * per
        m1 = min(m0 + per, iprm[5])
        kind = iprm[7]
        if kind == _XOR:
            pbest[k, 0], ppos[k, 0], pbest[k, 1], ppos[k, 1], ppos[k, 2] = _xor_runs(
                x, d, ra, iprm[0], iprm[1], iprm[2], fprm[0], fprm[1], run, m0, m1, True, member, theta, r, rmem)
        elif kind == _AXIS:
            src = x if iprm[9] == 0 else bufs[iprm[9] - 1]
            if iprm[11]:  # offsets m0 .. m1-1 of every block's rows
                axis_rows(src, bufs[iprm[10] - 1], iprm[0], iprm[1], iprm[2], iprm[8] != 0, 0, iprm[12], m0, m1)
            else:  # blocks m0 .. m1-1, whole rows
                axis_rows(src, bufs[iprm[10] - 1], iprm[0], iprm[1], iprm[2], iprm[8] != 0, m0, m1, 0, iprm[1])
        else:  # cells m0 .. m1-1
            best, bi = _update_scan_part(x[m0:m1], d[m0:m1], ra[m0:m1], bufs[0][m0:m1], fprm[0], fprm[1], run)
            pbest[k, 0] = best
            ppos[k, 0] = bi + m0 if bi >= 0 else -1
        if helper:
            fetch_add(ctl, 3, 1)
        fetch_add(ctl, 1, 1)


@njit(cache=True, nogil=True, error_model="numpy")
def sub_helper(x, d, ra, member, theta, r, run, ctl, iprm, fprm, pbest, ppos, bufs, rmem):
    """A helper thread's part of a search on several threads (:func:`search_sub` with ``ctl``):
    takes pieces of every step's update + scan as they come, until the search says stop."""
    idle = 0
    while load(ctl, 2) == 0:
        if _take_pieces(x, d, ra, member, theta, r, run, ctl, iprm, fprm, pbest, ppos, bufs, rmem, True):
            idle = 0
        else:
            idle += 1
            if idle > _IDLE_TURNS:  # the search is not stepping (its thread waits for a core):
                return  # leave it the pieces rather than hold a core


@njit(inline="always")
def _publish(x, d, ra, member, theta, r, run, ctl, iprm, fprm, pbest, ppos, bufs, rmem, gen, npieces):
    """Publish generation ``gen`` of ``npieces`` pieces (``iprm``, ``fprm`` set), take pieces of it
    with the helpers, and wait until all are done; returns the turns waited."""
    store(ctl, 1, 0)
    store(ctl, 0, ((gen & 0x7FFFFF) << 40) | (npieces << 20))  # publishes the step: pieces may be taken now
    _take_pieces(x, d, ra, member, theta, r, run, ctl, iprm, fprm, pbest, ppos, bufs, rmem, False)
    spins = 0
    while load(ctl, 1) < npieces:
        spins += 1
    return spins


@njit(inline="always")
def _split(units, unit_cells, n_threads, cap):
    """``(units per piece, pieces)`` of work of ``units`` units of ``unit_cells`` cells each:
    pieces of at least :data:`_PIECE_CELLS` cells, about :data:`_PIECES_PER_THREAD` per thread,
    at most ``cap``."""
    per = max(np.int64(_PIECE_CELLS // max(unit_cells, 1)), units // (_PIECES_PER_THREAD * n_threads))
    per = max(per, (units + cap - 1) // cap, np.int64(1))
    return per, (units + per - 1) // per


@njit(inline="always")
def _part_scan_shared(x, d, ra, member, theta, r, shape, strides, walsh, digits, ca, sb, run, ctl, iprm,
                      fprm, pbest, ppos, bufs, rmem, n_threads, gen):
    """:func:`_partner` (into ``bufs``, row 0 last) and :func:`_update_scan_part` in pieces taken by
    this thread and the helpers: one generation of pieces per axis of the product rule (the
    blocks of the axis, or the offsets of its rows when there are fewer blocks), then one of
    the update + scan, whose pieces' champions are reduced as one scan's (ties: the lowest
    cell).  Returns ``(append change, cell, turns waited, a stall's turns, pieces, gen)``."""
    n = x.shape[0]
    cap = ppos.shape[0]
    left = 0
    for ax in range(shape.shape[0]):
        if digits[ax] != 0:
            left += 1
    src = 0
    spins = 0
    limit = 0
    pieces = 0
    for ax in range(shape.shape[0]):
        b = digits[ax]
        if b == 0:
            continue
        dst = 1 if left % 2 == 1 else 2  # the last axis writes row 0
        left -= 1
        k = shape[ax]
        s = strides[ax]
        nb = n // (k * s)
        qsplit = nb < s
        if qsplit:
            per, npieces = _split(s, nb * k, n_threads, cap)
        else:
            per, npieces = _split(nb, k * s, n_threads, cap)
        iprm[0] = k
        iprm[1] = s
        iprm[2] = b
        iprm[3] = per
        iprm[4] = npieces
        iprm[5] = s if qsplit else nb
        iprm[7] = _AXIS
        iprm[8] = 1 if walsh[ax] else 0
        iprm[9] = src
        iprm[10] = dst
        iprm[11] = 1 if qsplit else 0
        iprm[12] = nb
        gen += 1
        spins += _publish(x, d, ra, member, theta, r, run, ctl, iprm, fprm, pbest, ppos, bufs, rmem, gen, npieces)
        limit += iprm[6] * per * (nb * k if qsplit else k * s)
        pieces += npieces
        src = dst
    per, npieces = _split(n, 1, n_threads, cap)
    iprm[3] = per
    iprm[4] = npieces
    iprm[5] = n
    iprm[7] = _PART
    fprm[0] = ca
    fprm[1] = sb
    gen += 1
    spins += _publish(x, d, ra, member, theta, r, run, ctl, iprm, fprm, pbest, ppos, bufs, rmem, gen, npieces)
    limit += iprm[6] * per
    pieces += npieces
    best = 0.0
    bi = np.int64(-1)
    for k in range(npieces):
        p = ppos[k, 0]
        if p >= 0 and (pbest[k, 0] < best or (pbest[k, 0] == best and p < bi)):
            best = pbest[k, 0]
            bi = p
    return best, bi, spins, limit, pieces, gen


@njit(inline="always")
def _update_scan_shared(x, d, ra, member, theta, r, mask, ca, sb, run, ctl, iprm, fprm, pbest, ppos,
                        bufs, rmem, n_threads, gen):
    """:func:`_update_scan_xor` in pieces of leading runs taken by this thread and the helpers
    (:func:`sub_helper`); the pieces' champions reduced as one scan's (ties: the lowest cell).
    The pieces also score the members' adjust and remove on the updated duals: returns
    ``(append change, cell, member change, cell, move, turns waited)``."""
    hi, lo, hbu, nlead = _xor_layout(x.shape[0], mask, run)
    per = max(np.int64(_PIECE_CELLS // (2 * run)), nlead // (_PIECES_PER_THREAD * n_threads))
    per = max(per, (nlead + ppos.shape[0] - 1) // ppos.shape[0], np.int64(1))
    npieces = (nlead + per - 1) // per
    iprm[0] = hi
    iprm[1] = lo
    iprm[2] = hbu
    iprm[3] = per
    iprm[4] = npieces
    iprm[5] = nlead
    iprm[7] = _XOR
    fprm[0] = ca
    fprm[1] = sb
    spins = _publish(x, d, ra, member, theta, r, run, ctl, iprm, fprm, pbest, ppos, bufs, rmem, gen, npieces)
    best = 0.0
    bi = np.int64(-1)
    bs = np.inf
    si = np.int64(-1)
    sm = np.int64(0)
    for k in range(npieces):
        p = ppos[k, 0]
        if p >= 0 and (pbest[k, 0] < best or (pbest[k, 0] == best and p < bi)):
            best = pbest[k, 0]
            bi = p
        q = ppos[k, 1]  # (a cell is in one piece: the move's order is the piece's)
        if q >= 0 and (pbest[k, 1] < bs or (pbest[k, 1] == bs and q < si)):
            bs = pbest[k, 1]
            si = q
            sm = ppos[k, 2]
    return best, bi, bs, si, sm, spins


@njit(cache=True, nogil=True, error_model="numpy")
def _update_scan_part(x, d, ra, part, ca, sb, run):
    """``x[j] = x[j] ca + sb part[j]`` for every cell, each run scanned right after."""
    n = x.shape[0]
    best = 0.0
    bi = np.int64(-1)
    for a in range(0, n, run):
        m = min(run, n - a)
        xr = x[a:a + m]
        _run_axpy(xr, part[a:a + m], ca, sb, m)
        hit = _run_hits(xr, d[a:a + m], ra[a:a + m], best, m)
        if hit:
            best, bi = _replay(x, d, ra, a, m, best, bi)
    return best, bi



@njit(cache=True, nogil=True)
def _geometry(shape, walsh, n):
    """``(strides, all_walsh, part, tmp)`` of a sub-table of ``n`` cells: C-order strides,
    whether every axis is Walsh-Hadamard, and the partner buffers (empty when it is)."""
    nax = shape.shape[0]
    strides = np.ones(nax, np.int64)
    for ax in range(nax - 2, -1, -1):
        strides[ax] = strides[ax + 1] * shape[ax + 1]
    all_walsh = True
    for ax in range(nax):
        if not walsh[ax]:
            all_walsh = False
    m = 0 if all_walsh else n
    return strides, all_walsh, np.empty(m), np.empty(m)


@njit(cache=True, nogil=True, error_model="numpy")
def search_sub(x, d, r, member, theta, shape, walsh, eps, max_steps,
               family, fam, fam_cnt, fam_total, fam_name, fam_ptr, fam_cells, r0, r1, n_samples, scale,
               out_i, out_move, out_old, out_new, out_t, out_delta, out_logden, ra, ctl, iprm, fprm, pbest,
               ppos, bufs, rmem, n_threads):
    """The greedy search on a sub-table (flat, C order over ``shape``), in place.

    ``x``: the duals (updated), ``d``: the targets, ``r``: each cell's price (a member's:
    what its removal gives back; updated under the family code), ``member``/``theta``: the
    support on the sub-table (updated), ``walsh``: which axes use the Walsh-Hadamard basis.
    Every step takes the best move (append at the 1-D optimum, adjust, remove; ties: the
    lowest change, then the lowest cell, adjust before remove, an append before a support
    move of equal change) while it gains at least ``eps``, at most ``max_steps``.
    ``family``: price under the family code, the families with members first, then every
    family whose count changes (``fam``: each cell's family, ``fam_cnt``
    its members now, ``fam_total`` its possible members, ``fam_name`` the code length that
    names it, ``fam_ptr``/``fam_cells`` its cells); ``r0``, ``r1`` (a further member's price per
    parameter), ``n_samples``, ``scale`` of the code.
    Writes step ``s``'s cell, move (0 append, 1 adjust, 2 remove), old and new value, dual
    before it, predicted change and ``ln`` of its normaliser to the ``out_*`` arrays;
    returns the number of steps.

    Each step is one sweep over the cells that updates them and, while they are in cache,
    looks for the next step's best append (the bound of a run of cells first, as the table
    scans do); the members' adjust and remove are scored from their list.

    ``ra``: room for ``n`` floats (the append prices, written here).
    ``ctl`` (4 int64, zero; empty: this thread alone), ``iprm`` (13 int64, the seventh
    :data:`STALL_SPINS`), ``fprm`` (3 floats, the last :data:`MIN_SHARE`),
    ``pbest``/``ppos`` (2 floats and 3 int64 per piece, room for
    ``_PIECES_PER_THREAD * n_threads + 1`` pieces), ``bufs`` (``(2, n)`` floats with a +-1 axis,
    else ``(2, 0)``), ``rmem`` (int64, one per run of :data:`RUN` cells: the members of each,
    written here): each step's sweep is shared in pieces with the helpers running
    :func:`sub_helper` on the same arrays (the same cells, the same bits; the champion of the
    pieces is the scan's, ties to the lowest cell).  With Walsh-Hadamard axes only, the
    pieces also score the members they hold, so that the next step's best adjust or remove
    needs no loop over the members here; with a +-1 axis, the partner is made in pieces too,
    one axis after the other (in ``bufs``), before the update's pieces.  The search sets ``ctl[2]`` (stop) to 1 when
    it returns, or to 2 earlier when its helpers keep it waiting (a machine whose cores are busy
    with other work: see :data:`STALL_SPINS`); it then goes on alone.
    """
    n = x.shape[0]
    nax = shape.shape[0]
    strides, all_walsh, part, tmp = _geometry(shape, walsh, n)
    if not all_walsh and bufs.shape[1] == n:  # shared with the helpers
        part = bufs[0]
        tmp = bufs[1]
    run = min(n, RUN)
    if family:  # the families with members: their marginal prices
        for f in range(fam_cnt.shape[0]):
            if fam_cnt[f]:
                _reprice(r, member, f, fam_cnt, fam_total, fam_name, fam_ptr, fam_cells, r0, r1, n_samples, scale)
    mlist = np.empty(n, np.int64)
    nm = 0
    rmem[:] = 0
    for j in range(n):
        if member[j]:
            ra[j] = np.inf
            mlist[nm] = j
            nm += 1
            rmem[j // run] += 1
        else:
            ra[j] = r[j]
    digits = np.empty(nax, np.int64)
    ba, bi = _scan(x, d, ra, run)
    steps = 0
    shared = ctl.shape[0] > 0 and n_threads > 1
    gen = np.int64(0)
    shared_steps = 0
    spins = 0
    limit = 0
    step_pieces = 0
    stalls = 0
    pieces = 0
    took0 = 0
    pieces0 = 0
    have = False  # the members' best move came with the last shared sweep
    nbs = np.inf
    nsi = np.int64(-1)
    nsm = np.int64(0)
    while steps < max_steps:
        bs = np.inf
        si = np.int64(-1)
        sm = np.int64(0)
        if have:
            bs, si, sm = nbs, nsi, nsm
            have = False
        else:
            for q in range(nm):  # cost.delta_adjust and cost.delta_remove (kernels.scan._support_moves' order)
                bs, si, sm = _member_move(x, d, theta, r, mlist[q], bs, si, sm)
        delta, i, move = ba, bi, np.int64(APPEND)
        if si >= 0 and (bs < delta or bi < 0):
            delta, i, move = bs, si, sm
        if not delta < -eps:
            break
        t = x[i]
        old = theta[i]
        new = 0.0 if move == REMOVE else (old + _atanh(d[i])) - _atanh(t)
        theta[i] = new
        if move == APPEND:
            member[i] = True
            ra[i] = np.inf
            mlist[nm] = i
            nm += 1
            rmem[i // run] += 1
        elif move == REMOVE:
            member[i] = False
            ra[i] = r[i]
            for q in range(nm):
                if mlist[q] == i:
                    mlist[q] = mlist[nm - 1]
                    break
            nm -= 1
            rmem[i // run] -= 1
        if family and move != ADJUST:
            f = fam[i]
            fam_cnt[f] += 1 if move == APPEND else -1
            _reprice(r, member, f, fam_cnt, fam_total, fam_name, fam_ptr, fam_cells, r0, r1, n_samples, scale)
            for q in range(fam_ptr[f], fam_ptr[f + 1]):
                c = fam_cells[q]
                ra[c] = np.inf if member[c] else r[c]
        dl = new - old
        ch = math.cosh(dl)
        sh = math.sinh(dl)
        den = ch + sh * t
        ca = ch / den
        sb = sh / den
        rest = i
        for ax in range(nax - 1, -1, -1):
            digits[ax] = rest % shape[ax]
            rest //= shape[ax]
        if all_walsh:
            mask = np.int64(0)
            bits = 0
            for ax in range(nax - 1, -1, -1):
                mask |= digits[ax] << bits
                kk = shape[ax]
                while kk > 1:
                    bits += 1
                    kk >>= 1
            if shared:
                gen += 1
                ba, bi, nbs, nsi, nsm, spins = _update_scan_shared(x, d, ra, member, theta, r, mask, ca, sb, run,
                                                                   ctl, iprm, fprm, pbest, ppos, bufs,
                                                                   rmem, n_threads, gen)
                have = True
                limit = iprm[6] * iprm[3] * run * (2 if iprm[2] else 1)  # turns per cell of a piece
                step_pieces = iprm[4]
            else:
                ba, bi = _update_scan_xor(x, d, ra, mask, ca, sb, run, rmem)
        elif shared:
            ba, bi, spins, limit, step_pieces, gen = _part_scan_shared(x, d, ra, member, theta, r, shape, strides,
                                                                       walsh, digits, ca, sb, run, ctl, iprm,
                                                                       fprm, pbest, ppos, bufs, rmem, n_threads,
                                                                       gen)
        else:
            _partner(x, shape, strides, walsh, digits, False, 0, part, tmp)
            ba, bi = _update_scan_part(x, d, ra, part, ca, sb, run)
        if shared:
            shared_steps += 1
            if spins > limit:
                stalls += 1
            pieces += step_pieces
            # helpers that keep it waiting, or that took less than half their share of the
            # pieces of the last _STALL_STEPS steps (their threads wait for a core, or spin
            # on the core this one needs; the first steps, while they start, not counted):
            slow = False
            if shared_steps % _STALL_STEPS == 0:
                took = load(ctl, 3)
                slow = shared_steps > _STALL_STEPS and \
                    n_threads * (took - took0) < fprm[2] * (n_threads - 1) * (pieces - pieces0)
                took0, pieces0 = took, pieces
            if shared_steps >= _STALL_STEPS and (stalls * _STALL_STEPS > shared_steps or slow):
                shared = False  # this thread alone from here on (the same bits)
                store(ctl, 2, 2)
        out_i[steps] = i
        out_move[steps] = move
        out_old[steps] = old
        out_new[steps] = new
        out_t[steps] = t
        out_delta[steps] = delta
        out_logden[steps] = math.log(den)
        steps += 1
    if ctl.shape[0] and load(ctl, 2) == 0:
        store(ctl, 2, 1)
    return steps


@njit(cache=True, nogil=True, error_model="numpy")
def replay_sub(x, shape, walsh, cells, deltas, out_t):
    """Apply the updates ``deltas`` on ``cells`` to the sub-table ``x`` (in place) in order;
    ``out_t[j]``: the dual of ``cells[j]`` just before its update.  Returns the summed ``ln``
    of the normalisers."""
    strides, all_walsh, part, tmp = _geometry(shape, walsh, x.shape[0])
    total = 0.0
    for j in range(cells.shape[0]):
        out_t[j] = x[cells[j]]
        total += _update(x, cells[j], deltas[j], shape, strides, walsh, all_walsh, part, tmp)
    return total


def search_threads(cells: int, walsh: bool) -> int:
    """Threads that share a search of a sub-table of ``cells`` cells (``walsh``: Walsh-Hadamard
    axes only): those of :func:`fsll_ooc.kernels.threadpool.num_threads` from
    :data:`PARALLEL_MIN_CELLS` cells on (:data:`PARALLEL_MIN_CELLS_PM` with a +-1 axis), else 1."""
    n = threadpool.num_threads()
    if n <= 1 or cells < (PARALLEL_MIN_CELLS if walsh else PARALLEL_MIN_CELLS_PM):
        return 1
    if _backoff["searches"] > 0:  # the last shared search stalled (see :func:`shared_done`)
        _backoff["searches"] -= 1
        return 1
    return n


def helper_ready() -> None:
    """Load :func:`sub_helper` in this process (numba's cache) before its first helper starts:
    a helper that loads it itself starts only after the search's first steps, and the search
    would take it for a helper that cannot get a core."""
    if not _ready:
        sub_helper.compile(tuple(sub_helper.typeof_pyval(x) for x in _helper_example()))
        _ready.append(True)


_ready: list = []


def shared_done(ctl: np.ndarray) -> None:
    """Note how a search on several threads ended (its ``ctl``): one that went on alone because
    its helpers kept it waiting makes the next :data:`STALL_BACKOFF` searches run on one thread."""
    if ctl.size and ctl[2] == 2:
        _backoff["searches"] = STALL_BACKOFF


def shared_arrays(n_threads: int, cells: int = 0, walsh: bool = True) -> tuple:
    """``(ctl, iprm, fprm, pbest, ppos, bufs, rmem)`` of a search on ``n_threads`` threads
    (:func:`search_sub`) of a sub-table of ``cells`` cells (``walsh``: Walsh-Hadamard axes only;
    else ``bufs`` holds the partner's two rows of ``cells``; ``rmem``: room for the members of
    each run of :data:`RUN` cells); ``n_threads`` 1: empty but ``rmem`` (the search runs on its
    own thread)."""
    rmem = np.zeros(max(1, -(-int(cells) // RUN)), np.int64)
    if n_threads <= 1:
        return (np.zeros(0, np.int64), np.zeros(_IPRM, np.int64), np.zeros(3), np.zeros((1, 2)),
                np.zeros((1, 3), np.int64), np.zeros((2, 0)), rmem)
    pieces = _PIECES_PER_THREAD * int(n_threads) + 1
    iprm = np.zeros(_IPRM, np.int64)
    iprm[6] = STALL_SPINS
    fprm = np.zeros(3)
    fprm[2] = MIN_SHARE
    bufs = np.zeros((2, 0 if walsh else int(cells)))
    return (np.zeros(4, np.int64), iprm, fprm, np.zeros((pieces, 2)), np.zeros((pieces, 3), np.int64), bufs,
            rmem)


def _examples():
    """Arguments of the types a search passes (one specialisation of each kernel)."""
    f, i, b = np.zeros(2), np.zeros(2, np.int64), np.zeros(2, np.bool_)
    f2, i2 = np.zeros((2, 2)), np.zeros((2, 3), np.int64)
    search = (f, f, f, b, f, i, b, 0.0, np.int64(1), True, i, i, i, f, i, i, 0.0, 0.0, 0.0, 0.0, i, i, f, f, f, f, f,
              f, i, i, f, f2, i2, f2, i, np.int64(1))
    return [(search_sub, search), (replay_sub, (f, i, b, i, f, f)), (sub_helper, _helper_example())]


def _helper_example() -> tuple:
    """Arguments of the types a search hands :func:`sub_helper`."""
    f, i, b = np.zeros(2), np.zeros(2, np.int64), np.zeros(2, np.bool_)
    return (f, f, f, b, f, f, np.int64(1), i, i, f, np.zeros((2, 2)), np.zeros((2, 3), np.int64), np.zeros((2, 2)), i)


def ahead_kernels() -> list:
    """``(dispatcher, argument types)`` of the kernels: what a fit with several steps per pass
    compiles in a second process (:mod:`fsll_ooc.kernels.ahead`) while its first passes run."""
    return [(disp, tuple(disp.typeof_pyval(x) for x in args)) for disp, args in _examples()]


def warmup() -> None:
    """Compile (or load from numba's cache) the kernels."""
    for disp, sig in ahead_kernels():
        disp.compile(sig)
