"""Compiled block kernels: the fused "dual update + candidate scan" of one block.

One learning iteration is one streaming pass per block of the dual table
``thetabar``: each element is updated by the incremental identity (docs/design.md,
"The incremental dual update")::

    thetabar'(y) = (cosh(delta) thetabar(y) + sinh(delta) <Phi_y Phi_y'>) / (cosh(delta) + sinh(delta) thetabar(y'))

and, while it is in cache, scored as an *append* candidate: the cheap lower bound
``r_y - (t - d)^2 / (1 - t^2)`` first, the exact cost change (two ``log1p`` pairs)
only when the bound beats the running champion (paper Algorithm 2).

A block is viewed as a 2-D ``(P, Q)`` C-contiguous array; ``r_y`` is generated as
``r_const + rP[p] + rQ[q]`` (it is separable), never read from memory.  The partner
``<Phi_y Phi_y'>`` is either a permutation (all changed axes Walsh-Hadamard: ``y XOR
y'``, an involution, so the block is updated in place pair by pair) or an explicit
array computed beforehand (axes with the +-1 basis).

How the loops are laid out so that LLVM vectorises them (SIMD), with results
bit-identical to the plain one-cell-at-a-time loop:

* cells are processed in runs of ``SUB`` consecutive cells.  A run is updated and
  tested against the champion ``best`` *as of the start of the run* in one
  branch-free loop that only reports whether any cell passed the bound; a run with
  such a cell is then replayed cell by cell with the scalar logic.  The test is
  monotone in ``best`` and ``best`` only decreases within a run, so the replay sees
  exactly the cells the one-cell loop would have evaluated.
* the partner of a run: when the flat XOR mask has no bit below ``SUB`` the partner
  of a run is a run (two contiguous streams, updated together); otherwise the
  partner values of a chunk of ``CHUNK`` cells are first gathered into a small
  buffer (in L1), then the chunk is updated from it contiguously.
* array indices are unsigned, so numba emits no negative-index wrap-around code in
  the hot loops (which would block vectorisation).

The update of one cell is ``ca * a + sb * b`` in every kernel (no fused
multiply-add contraction), so every path and thread count gives the same bits.
Ties are broken towards the lowest flat position, so every block decomposition,
path and thread count selects the same winner as a dense ``argmin``.  On one thread
a pass is one block of all rows, and the champion is carried from row to row (fewer
exact evaluations).

``parallel=True`` shares a pass between the calling thread and the helpers of
:mod:`fsll_ooc.kernels.threadpool`: each takes blocks of rows (about :data:`BLOCK_CELLS`
cells) from an atomic counter as it comes and carries the champion within a block;
every row records its champion, and :func:`reduce_rows` picks the winner.  A pair of
rows is updated by the thread holding the lower row, so no two threads write the
same cell.  A helper descheduled by the operating system delays the pass by at most
one block (a static split in halves, as numba's ``prange`` does, waits for the
whole half: much slower than one thread on a shared machine; docs/benchmarks.md,
section 3).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from . import ahead, threadpool
from .atomics import fetch_add

__all__ = ["update_scan_xor", "update_scan_perm", "update_scan_explicit", "reduce_rows", "support_moves",
           "second_order_lowest",
           "top_appends_threads",
           "top_appends", "warmup", "fit_kernels", "ahead_kernels", "PassArgs", "SUB", "CHUNK", "BLOCK_CELLS"]

SUB = 64  # cells per branch-free bound test
CHUNK = 1024  # cells per gathered partner chunk (8 KiB: stays in L1)
BLOCK_CELLS = 1 << 16  # cells per piece of work taken by one thread (``parallel=True``)
_U = np.uint64


@njit(inline="always")
def _kl_to_optimum(t, d):
    """KL change of moving ``thetabar_y`` from ``t`` to its 1-D optimum ``d`` (cost.kl_step)."""
    return 0.5 * ((1.0 + d) * (math.log1p(t) - math.log1p(d)) + (1.0 - d) * (math.log1p(-t) - math.log1p(-d)))


@njit(inline="always")
def _exact(t, d, r):
    """Exact cost change of appending at the 1-D optimum (paper Eq. 15)."""
    return _kl_to_optimum(t, d) + r


@njit(inline="always")
def _lncosh(x):
    """``ln cosh x`` as cost._lncosh (stable for large ``|x|``)."""
    x = abs(x)
    return x + math.log1p(math.exp(-2.0 * x)) - math.log(2.0)


# The hot test is the lower bound without its division:
#     r - (t - d)^2 / (1 - t^2) < best   <=>   (r - best) (1 - t^2) < (t - d)^2
# (1 - t^2 > 0).  Only when it passes is the exact change computed; this branch is rare,
# so the position bookkeeping (skip y = 0, ties to the lowest position) lives there.

@njit(nogil=True, cache=True)
def _replay(x, dx, rQ, a, n, rp, best, bpos, base, skip):
    """The scalar scan of cells ``a .. a+n-1`` of row ``x`` (already updated)."""
    for i in range(n):
        j = _U(a + i)
        na = x[j]
        da = dx[j]
        r = rp + rQ[j]
        if (r - best) * (1.0 - na * na) < (na - da) * (na - da):
            pos = base + a + i
            if pos != skip:
                ex = _exact(na, da, r)
                if ex < best or (ex == best and pos < bpos):
                    best = ex
                    bpos = pos
    return best, bpos


@njit(nogil=True, cache=True)
def _update_test(x, src, dx, rQ, a, s, n, rp, ca, sb, best):
    """``x[a+i] = ca x[a+i] + sb src[s+i]`` for ``i < n``; does any updated cell pass the bound?"""
    hit = False
    for i in range(n):
        j = _U(a + i)
        na = ca * x[j] + sb * src[_U(s + i)]
        x[j] = na
        da = dx[j]
        r = rp + rQ[j]
        hit |= (r - best) * (1.0 - na * na) < (na - da) * (na - da)
    return hit


@njit(nogil=True, cache=True)
def _test(x, dx, rQ, a, n, rp, best):
    hit = False
    for i in range(n):
        j = _U(a + i)
        na = x[j]
        da = dx[j]
        r = rp + rQ[j]
        hit |= (r - best) * (1.0 - na * na) < (na - da) * (na - da)
    return hit


@njit(nogil=True, cache=True)
def _pair_update_test(xa, xb, da_, db_, rQ, a, b, n, rpa, rpb, ca, sb, best):
    """Update the two partner runs ``xa[a..a+n)`` and ``xb[b..b+n)`` together; any cell passing?"""
    hit = False
    for i in range(n):
        ja = _U(a + i)
        jb = _U(b + i)
        va = xa[ja]
        vb = xb[jb]
        na = ca * va + sb * vb
        nb = ca * vb + sb * va
        xa[ja] = na
        xb[jb] = nb
        da = da_[ja]
        db = db_[jb]
        r1 = rpa + rQ[ja]
        r2 = rpb + rQ[jb]
        hit |= ((r1 - best) * (1.0 - na * na) < (na - da) * (na - da)) | \
               ((r2 - best) * (1.0 - nb * nb) < (nb - db) * (nb - db))
    return hit


@njit(nogil=True, cache=True)
def _gather_xor(buf, src, base, lo, cw, unit):
    """``buf[i] = src[base + (i ^ lo)]`` for ``i < cw``, by runs of ``unit`` (8, 4 or 1) cells."""
    if unit == 8:
        for k in range(cw // 8):
            s = base + ((k * 8) ^ lo)
            for j in range(8):
                buf[_U(k * 8 + j)] = src[_U(s + j)]
    elif unit == 4:
        for k in range(cw // 4):
            s = base + ((k * 4) ^ lo)
            for j in range(4):
                buf[_U(k * 4 + j)] = src[_U(s + j)]
    else:
        for i in range(cw):
            buf[_U(i)] = src[_U(base + (i ^ lo))]


@njit(nogil=True, cache=True)
def _scan_chunk(x, buf, dx, rQ, a, cw, rp, ca, sb, best, bpos, base, skip):
    """Update cells ``a .. a+cw-1`` of row ``x`` from the gathered partners ``buf`` and scan them."""
    if cw % SUB == 0:  # a constant trip count: LLVM drops the remainder loops
        for s0 in range(0, cw, SUB):
            if _update_test(x, buf, dx, rQ, a + s0, s0, SUB, rp, ca, sb, best):
                best, bpos = _replay(x, dx, rQ, a + s0, SUB, rp, best, bpos, base, skip)
        return best, bpos
    for s0 in range(0, cw, SUB):
        n = min(SUB, cw - s0)
        if _update_test(x, buf, dx, rQ, a + s0, s0, n, rp, ca, sb, best):
            best, bpos = _replay(x, dx, rQ, a + s0, n, rp, best, bpos, base, skip)
    return best, bpos


@njit(nogil=True, cache=True)
def _pair_row(t, d, rP, rQ, r_const, permP, permQ, mp, mq, ca, sb, cw, unit, skip, p, best, bpos):
    """The work of row ``p`` (and of its partner row) for a partner that is an involution.

    An empty ``permP`` means a flat XOR: the partner of cell ``(p, q)`` is ``(p ^ mp, q ^ mq)``
    and ``cw`` says how (0: runs pair with runs; else the gathered chunk width, gathered by
    runs of ``unit`` cells).  Otherwise the partner is ``(permP[p], permQ[q])`` and ``cw == Q``.
    Each pair of cells is read, updated and scored once, by the row with the lower index.
    """
    P, Q = t.shape
    use_xor = permP.shape[0] == 0
    pp = p ^ mp if use_xor else permP[p]
    if p > pp:
        return best, bpos
    rp = r_const + rP[p]
    rpp = r_const + rP[pp]
    tp = t[p]
    tpp = t[pp]
    dp = d[p]
    dpp = d[pp]
    bp = np.int64(p) * Q
    bpp = np.int64(pp) * Q
    if use_xor and cw == 0:  # runs pair with runs: two contiguous streams
        for q0 in range(0, Q, SUB):
            qq0 = q0 ^ mq
            if p == pp and qq0 <= q0:
                if qq0 == q0:  # mq == 0: each cell is its own partner
                    if _update_test(tp, tp, dp, rQ, q0, q0, SUB, rp, ca, sb, best):
                        best, bpos = _replay(tp, dp, rQ, q0, SUB, rp, best, bpos, bp, skip)
                continue
            if _pair_update_test(tp, tpp, dp, dpp, rQ, q0, qq0, SUB, rp, rpp, ca, sb, best):
                best, bpos = _replay(tp, dp, rQ, q0, SUB, rp, best, bpos, bp, skip)
                best, bpos = _replay(tpp, dpp, rQ, qq0, SUB, rpp, best, bpos, bpp, skip)
        return best, bpos
    bufa = np.empty(cw)
    bufb = np.empty(cw)
    hi = mq & ~(cw - 1)
    lo = mq & (cw - 1)
    for q0 in range(0, Q, cw):
        qq0 = (q0 ^ hi) if use_xor else 0
        if p == pp and qq0 < q0:
            continue
        own = p == pp and qq0 == q0  # the chunk is its own partner
        # old partner values first: both chunks are overwritten below
        if use_xor:
            _gather_xor(bufa, tpp, qq0, lo, cw, unit)
            if not own:
                _gather_xor(bufb, tp, q0, lo, cw, unit)
        else:
            for i in range(cw):
                bufa[_U(i)] = tpp[_U(permQ[i])]
            if not own:
                for i in range(cw):
                    bufb[_U(i)] = tp[_U(permQ[i])]
        best, bpos = _scan_chunk(tp, bufa, dp, rQ, q0, cw, rp, ca, sb, best, bpos, bp, skip)
        if not own:
            best, bpos = _scan_chunk(tpp, bufb, dpp, rQ, qq0, cw, rpp, ca, sb, best, bpos, bpp, skip)
    return best, bpos


def _explicit_row(t, partner, d, rP, rQ, r_const, ca, sb, update, skip, p, best, bpos):
    Q = t.shape[1]
    rp = r_const + rP[p]
    tp = t[p]
    dp = d[p]
    base = np.int64(p) * Q
    for s0 in range(0, Q, SUB):
        n = min(SUB, Q - s0)
        if update:
            hit = _update_test(tp, partner[p], dp, rQ, s0, s0, n, rp, ca, sb, best)
        else:
            hit = _test(tp, dp, rQ, s0, n, rp, best)
        if hit:
            best, bpos = _replay(tp, dp, rQ, s0, n, rp, best, bpos, base, skip)
    return best, bpos


_row_explicit = njit(nogil=True, cache=True)(_explicit_row)


# The top-level driver (numba caches it; closures over dispatchers would recompile each run).

def _kernel_blocks(t, partner, d, rP, rQ, r_const, permP, permQ, mp, mq, ca, sb, cw, unit, explicit, update,
                   threshold, skip, row_best, row_pos, rows, ctr, wait):
    """One thread's share of a pass: takes blocks of ``rows`` rows (``ctr[0]``, atomically)
    until none is left, carrying the champion within a block; counts its blocks done in
    ``ctr[1]``.  The caller's thread (``wait``) then waits until every block is done.

    Rows are done by :func:`_pair_row` (a partner that is an involution) or, with
    ``explicit``, by :func:`_explicit_row` (the partner array ``partner``)."""
    P = t.shape[0]
    nblocks = (P + rows - 1) // rows
    while True:
        k = fetch_add(ctr, 0, 1)
        if k >= nblocks:
            break
        b = threshold
        pos = np.int64(-1)
        for p in range(k * rows, min(P, (k + 1) * rows)):
            if explicit:
                b, pos = _row_explicit(t, partner, d, rP, rQ, r_const, ca, sb, update, skip, np.int64(p), b, pos)
            else:
                b, pos = _pair_row(t, d, rP, rQ, r_const, permP, permQ, mp, mq, ca, sb, cw, unit, skip,
                                   np.int64(p), b, pos)
            row_best[p] = b
            row_pos[p] = pos
        fetch_add(ctr, 1, 1)
    while wait and fetch_add(ctr, 1, 0) < nblocks:
        pass


_blocks = njit(cache=True, nogil=True)(_kernel_blocks)


class PassArgs(NamedTuple):
    """The arguments of one compiled pass over a ``(P, Q)`` block, named.

    The fields are the leading parameters of the compiled driver, in its order
    (:func:`_kernel_blocks`; a test keeps them equal): :func:`_run` passes them
    positionally, so the compiled code is that of plain arguments.
    """

    t: np.ndarray  # the block of thetabar (P, Q), updated in place
    partner: np.ndarray  # explicit partner values (P, Q), or ``t`` when the partner is a permutation
    d: np.ndarray  # the block of dbar (P, Q)
    rP: np.ndarray  # penalty per row: r_y = r_const + rP[p] + rQ[q]
    rQ: np.ndarray  # penalty per column
    r_const: float  # penalty common to the block
    permP: np.ndarray  # row permutation of an involution partner (empty: a flat XOR)
    permQ: np.ndarray  # column permutation (empty: a flat XOR)
    mp: np.int64  # row XOR mask of a flat XOR partner
    mq: np.int64  # column XOR mask
    ca: float  # cosh(delta) / (cosh(delta) + sinh(delta) t'): the cell's own weight
    sb: float  # sinh(delta) / (...): the partner's weight
    cw: np.int64  # gathered chunk width (0: runs pair with runs; Q for a permutation)
    unit: np.int64  # cells per gather run (8, 4 or 1)
    explicit: bool  # the partner is the array ``partner`` (rows by :func:`_explicit_row`)
    update: bool  # update the cells (False: scan only)
    threshold: float  # a candidate must beat this cost change
    skip: np.int64  # flat position never reported (y = 0), or -1
    row_best: np.ndarray  # out: champion per row
    row_pos: np.ndarray  # out: its flat position (-1: none)


def _run(args: PassArgs, P, Q, parallel):
    """Run a pass on this thread alone (one block of all ``P`` rows: the champion is
    carried from row to row), or, with ``parallel`` and more than one thread allowed
    (:func:`fsll_ooc.kernels.threadpool.num_threads`), on this thread and the helpers: blocks of
    rows of about :data:`BLOCK_CELLS` cells taken as they come.

    The caller does not wait for a helper to start, only for the blocks a helper has
    taken to be done: a helper the operating system has not scheduled yet finds no
    block left when it runs and returns at once.
    """
    n = threadpool.num_threads() if parallel else 1
    rows = max(1, min(BLOCK_CELLS // max(Q, 1), P // (4 * n)))
    ctr = np.zeros(2, dtype=np.int64)
    if ahead.running(__name__):  # first use after installing: a child compiles the driver;
        for disp, sig in fit_kernels()[1:]:  # the small kernels meanwhile here
            disp.compile(sig)
    ahead.wait(__name__)
    if n == 1 or P < 2 * rows:
        _blocks(*args, np.int64(max(P, 1)), ctr, True)
        return
    threadpool.fire(n, _blocks, *args, np.int64(rows), ctr, False)
    _blocks(*args, np.int64(rows), ctr, True)


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


_NO_PERM = np.zeros(0, dtype=np.int64)  # an empty permutation: the partner is a flat XOR


def _xor_geometry(Q: int, mq: int) -> tuple[int, int]:
    """``(cw, unit)``: ``cw = 0`` when runs of ``SUB`` cells pair with runs (no gather);
    otherwise the gathered chunk width (a power of two dividing ``Q``) and the gather unit."""
    if Q % SUB == 0 and mq % SUB == 0:
        return 0, 0
    cw = CHUNK
    while Q % cw:
        cw //= 2
    lo = mq & (cw - 1)
    unit = 8 if cw % 8 == 0 and lo % 8 == 0 else 4 if cw % 4 == 0 and lo % 4 == 0 else 1
    return cw, unit


def _xor_fits(n: int, m: int) -> bool:
    """Does ``i -> i ^ m`` map ``range(n)`` onto itself?"""
    if m < 0:
        return False
    if n & (n - 1) == 0:
        return m < n
    return bool((np.arange(n) ^ m).max() < n)


def update_scan_xor(t, d, rP, rQ, r_const, mp, mq, ch, sh, inv_den, threshold=0.0, skip=-1, parallel=False):
    """Fused update (partner of flat cell ``(p, q)`` is ``(p ^ mp, q ^ mq)``) and scan of block ``t``
    (modified in place).  Returns ``(best_delta, flat_position)``; position ``-1`` when no
    candidate beats ``threshold``.
    """
    P, Q = t.shape
    mp, mq = int(mp), int(mq)
    if not (_xor_fits(P, mp) and _xor_fits(Q, mq)):
        raise ValueError(f"XOR masks ({mp}, {mq}) do not fit a ({P}, {Q}) block")
    cw, unit = _xor_geometry(Q, mq)
    rb, rp = _rows(P)
    ca, sb = ch * inv_den, sh * inv_den
    _run(PassArgs(t=t, partner=t, d=d, rP=rP, rQ=rQ, r_const=float(r_const), permP=_NO_PERM, permQ=_NO_PERM,
                  mp=np.int64(mp), mq=np.int64(mq), ca=float(ca), sb=float(sb), cw=np.int64(cw), unit=np.int64(unit),
                  explicit=False, update=True, threshold=float(threshold), skip=np.int64(skip), row_best=rb,
                  row_pos=rp), P, Q, parallel)
    return reduce_rows(rb, rp)


def update_scan_perm(t, d, rP, rQ, r_const, permP, permQ, ch, sh, inv_den, threshold=0.0, skip=-1, parallel=False):
    """Fused update (partner of ``(p, q)`` is ``(permP[p], permQ[q])``, an involution) and scan of
    block ``t`` (modified in place).  Returns ``(best_delta, flat_position)``; position ``-1`` when
    no candidate beats ``threshold``.  Flat XOR permutations take the faster :func:`update_scan_xor`.
    """
    P, Q = t.shape
    permP = np.ascontiguousarray(permP, dtype=np.int64)
    permQ = np.ascontiguousarray(permQ, dtype=np.int64)
    mp, mq = int(permP[0]), int(permQ[0])
    if np.array_equal(permP, np.arange(P) ^ mp) and np.array_equal(permQ, np.arange(Q) ^ mq):
        return update_scan_xor(t, d, rP, rQ, r_const, mp, mq, ch, sh, inv_den, threshold, skip, parallel)
    rb, rp = _rows(P)
    ca, sb = ch * inv_den, sh * inv_den
    _run(PassArgs(t=t, partner=t, d=d, rP=rP, rQ=rQ, r_const=float(r_const), permP=permP, permQ=permQ,
                  mp=np.int64(0), mq=np.int64(0), ca=float(ca), sb=float(sb), cw=np.int64(Q), unit=np.int64(1),
                  explicit=False, update=True, threshold=float(threshold), skip=np.int64(skip), row_best=rb,
                  row_pos=rp), P, Q, parallel)
    return reduce_rows(rb, rp)


def update_scan_explicit(t, partner, d, rP, rQ, r_const, ch=1.0, sh=0.0, inv_den=1.0, update=True,
                         threshold=0.0, skip=-1, parallel=False):
    """Fused update (explicit partner array) and scan; ``update=False`` only scans."""
    P, Q = t.shape
    rb, rp = _rows(P)
    if partner is None:
        partner = t
    ca, sb = ch * inv_den, sh * inv_den
    _run(PassArgs(t=t, partner=partner, d=d, rP=rP, rQ=rQ, r_const=float(r_const), permP=_NO_PERM, permQ=_NO_PERM,
                  mp=np.int64(0), mq=np.int64(0), ca=float(ca), sb=float(sb), cw=np.int64(0), unit=np.int64(1),
                  explicit=True, update=bool(update), threshold=float(threshold), skip=np.int64(skip), row_best=rb,
                  row_pos=rp), P, Q, parallel)
    return reduce_rows(rb, rp)


def support_moves(ys, t, d, theta, r):
    """The best *adjust* or *remove* move over the support: ``(delta, i, move)`` (see
    :func:`_support_moves`, the compiled kernel)."""
    ahead.wait(__name__)  # (a fit's first pass has waited already)
    return _support_moves(ys, t, d, theta, r)


@njit(cache=True, nogil=True)
def _support_moves(ys, t, d, theta, r):
    """The best *adjust* or *remove* move over the support: ``(delta, i, move)``.

    ``ys``: the support's flat indices; ``t``, ``d``: ``thetabar`` and ``dbar`` there;
    ``theta``, ``r``: its parameters and penalties.  ``move`` is 0 (adjust) or 1 (remove);
    ``i = -1`` when no change is a number.  The formulas are :func:`fsll_ooc.cost.delta_adjust`
    and :func:`fsll_ooc.cost.delta_remove`, in the same order of operations; ties go to the
    lowest change, then the lowest ``y``, then adjust before remove.

    Compiled because the Python between two passes runs with caches just flushed by the
    pass: there, a dozen numpy calls on the support cost 5x what they cost warm.
    """
    lim = 1.0 - 2.0**-52
    best = np.inf
    bi = np.int64(-1)
    bm = np.int64(0)
    by = np.int64(0)
    for i in range(t.shape[0]):
        adj = _kl_to_optimum(t[i], d[i])
        a = math.atanh(min(max(t[i], -lim), lim))
        rem = _lncosh(a - theta[i]) - _lncosh(a) + d[i] * theta[i] - r[i]
        y = ys[i]  # the adjust of y is looked at before its remove: equal changes keep the adjust
        if adj < best or (adj == best and y < by):
            best, bi, bm, by = adj, np.int64(i), np.int64(0), y
        if rem < best or (rem == best and y < by):
            best, bi, bm, by = rem, np.int64(i), np.int64(1), y
    return best, bi, bm


@njit(inline="always")
def _worst(val, pos, big):
    """``(value, position, index)`` of the worst entry kept by a top-k: the largest value, then
    the largest position (an empty entry, position -1, counts as position ``big``)."""
    worst = -np.inf
    wpos = np.int64(-1)
    wi = 0
    for j in range(val.shape[0]):
        pj = pos[j] if pos[j] >= 0 else big
        if val[j] > worst or (val[j] == worst and pj > wpos):
            worst = val[j]
            wpos = pj
            wi = j
    return worst, wpos, wi


@njit(cache=True, nogil=True)
def top_appends(t, d, rP, rQ, r_const, k, skip):
    """The ``k`` best *append* candidates of block ``t`` by exact cost change (paper Eq. 15),
    among those that lower the cost: ``(delta, position)`` arrays sorted by change, then
    position (unused entries: position -1, change 0).

    A read-only scan (the block is not changed): runs of :data:`SUB` cells go through the
    division-free bound against the worst change kept so far, as in the fused kernels;
    the exact change is computed only for cells that pass.  Ties go to the lowest
    position, so every block decomposition keeps the same set.
    """
    P, Q = t.shape
    val = np.zeros(k)
    pos = np.full(k, -1, dtype=np.int64)
    big = np.int64(P) * Q
    worst = 0.0
    wpos = big  # an empty entry: change 0, position "infinity" (replaced first)
    wi = 0
    for p in range(P):
        rp = r_const + rP[p]
        tp = t[p]
        dp = d[p]
        for s0 in range(0, Q, SUB):
            n = min(SUB, Q - s0)
            if not _test(tp, dp, rQ, s0, n, rp, worst):
                continue
            for i in range(n):
                q = s0 + i
                na = tp[q]
                da = dp[q]
                r = rp + rQ[q]
                if not (r - worst) * (1.0 - na * na) < (na - da) * (na - da):
                    continue
                at = np.int64(p) * Q + q
                if at == skip:
                    continue
                ex = _exact(na, da, r)
                if ex < worst or (ex == worst and at < wpos):
                    val[wi] = ex
                    pos[wi] = at
                    worst, wpos, wi = _worst(val, pos, big)
    order = np.argsort(val, kind="mergesort")
    val = val[order]
    pos = pos[order]
    # equal changes: lowest position first (empty entries last)
    i = 0
    while i < k:
        j = i
        while j + 1 < k and val[j + 1] == val[i]:
            j += 1
        if j > i:
            seg = pos[i:j + 1].copy()
            seg_key = np.where(seg >= 0, seg, big)
            o = np.argsort(seg_key, kind="mergesort")
            pos[i:j + 1] = seg[o]
        i = j + 1
    return val, pos


@njit(inline="always")
def _second_order(tv, dv, r):
    """``r - (t - d)^2 / (2 (1 - t^2))`` in the order of operations of numpy's
    ``((t - d)^2 / max(1 - t^2, 1e-300)) * -0.5 + rQ + (r_const + rP)`` (``r`` split so)."""
    s = tv - dv
    s = s * s
    den = 1.0 - tv * tv
    return (s / max(den, 1e-300)) * -0.5


@njit(cache=True, nogil=True)
def _keep_lowest(bval, bpos, n, k):
    """Of the ``n`` buffered ``(score, position)`` pairs (in increasing position order), keep
    the ``k`` lowest by score, then position, at the front and still in position order:
    ``(count kept, score, position)`` of the worst one kept (``(+inf, -1)`` when none is
    dropped).  A stable sort of the scores keeps equal scores in position order."""
    if n <= k:
        return n, np.inf, np.int64(-1)
    order = np.argsort(bval[:n], kind="mergesort")
    last = order[k - 1]
    wv, wp = bval[last], bpos[last]
    keep = np.sort(order[:k])
    for i in range(k):  # keep[i] >= i: a forward copy in place
        j = keep[i]
        bval[i] = bval[j]
        bpos[i] = bpos[j]
    return k, wv, wp


@njit(cache=True, nogil=True)
def second_order_lowest(t, d, rP, rQ, r_const, k, skip):
    """The ``k`` cells of the ``(P, Q)`` rows ``t``, ``d`` with the lowest second-order score
    ``r - (t - d)^2 / (2 (1 - t^2))`` (``r = r_const + rP[p] + rQ[q]``; the cell ``skip`` scored
    ``+inf``), the joint selection's candidates, each score in the order of operations of numpy's
    ``((t - d)^2 / max(1 - t^2, 1e-300)) * -0.5 + rQ + (r_const + rP)``: ``(score, position)``
    arrays, by score, ties to the lowest position (every split of the rows keeps the same
    set); fewer when the rows hold fewer cells (the rest ``(+inf, -1)``).

    One pass, no scores kept: a cell that beats the bar (the ``k``-th lowest of the cells
    kept so far) joins a buffer of about ``2 k``; a full buffer keeps its ``k`` lowest and
    lowers the bar to the worst of them (a stable sort: ``O(log k)`` per joining cell, where
    replacing the worst of ``k`` kept cells one at a time costs ``O(k)``, which at a
    ``2^30``-cell table with two thousand terms in the support made this scan the fit's
    largest cost).  The scores of a run of :data:`SUB` cells are computed in one
    branch-free loop (vector registers) that counts those not above the bar; only a run
    with such a cell (or the cell ``skip``) goes through the scalar rule."""
    P, Q = t.shape
    k = min(k, P * Q)
    val = np.full(k, np.inf)
    pos = np.full(k, -1, np.int64)
    if k <= 0:
        return val, pos
    big = np.int64(P) * Q
    cap = 2 * k + 2 * SUB
    bval = np.empty(cap)
    bpos = np.empty(cap, np.int64)
    n = 0
    bar = np.inf
    bar_pos = big  # nothing kept yet: every score but NaN joins
    buf = np.empty(SUB)
    for p in range(P):
        rp = r_const + rP[p]
        tp = t[p]
        dp = d[p]
        base = np.int64(p) * Q
        for s0 in range(0, Q, SUB):
            m = min(SUB, Q - s0)
            near = 0  # the run's scores in one branch-free loop, and how many may join
            for i in range(m):
                j = _U(s0 + i)
                sc = (_second_order(tp[j], dp[j], 0.0) + rQ[j]) + rp
                buf[i] = sc
                near += sc <= bar
            if near == 0 and not base + s0 <= skip < base + s0 + m:
                continue
            for i in range(m):  # the scalar rule on the same scores
                sc = buf[i]
                at = base + s0 + i
                if at == skip:
                    sc = np.inf
                if not (sc < bar or (sc == bar and at < bar_pos)):
                    continue
                if n == cap:
                    n, bar, bar_pos = _keep_lowest(bval, bpos, n, k)
                    if not (sc < bar or (sc == bar and at < bar_pos)):
                        continue
                bval[n] = sc
                bpos[n] = at
                n += 1
    order = np.argsort(bval[:n], kind="mergesort")  # (the buffer in position order: ties stay so)
    n = min(n, k)
    for i in range(n):
        val[i] = bval[order[i]]
        pos[i] = bpos[order[i]]
    return val, pos


#: :func:`top_appends_threads` gives each piece about this many cells (whole rows).
TOP_PIECE = 2**17


def top_appends_threads(t, d, rP, rQ, r_const, k, skip, n_threads):
    """:func:`top_appends` of the whole block on ``n_threads`` threads: each piece of rows
    (about :data:`TOP_PIECE` cells) keeps its own ``k`` best, and the pieces' candidates are
    merged by change, then position, into the same ``k`` (``top_appends`` keeps the same set
    for every block decomposition)."""
    P, Q = t.shape
    rows = max(1, TOP_PIECE // max(Q, 1))
    starts = list(range(0, P, rows))
    if n_threads <= 1 or len(starts) <= 1:
        return top_appends(t, d, rP, rQ, r_const, k, skip)
    parts = [None] * len(starts)

    def piece(i):
        p0 = starts[i]
        p1 = min(P, p0 + rows)
        off = np.int64(p0) * Q
        sk = skip - off if 0 <= skip - off < (p1 - p0) * Q else -1
        val, pos = top_appends(t[p0:p1], d[p0:p1], rP[p0:p1], rQ, r_const, k, np.int64(sk))
        used = pos >= 0
        parts[i] = (val[used], pos[used] + off)

    threadpool.parallel_for(n_threads, len(starts), piece)
    val = np.concatenate([v for v, _ in parts])
    pos = np.concatenate([q for _, q in parts])
    order = np.lexsort((pos, val))[:k]
    out_val, out_pos = np.zeros(k), np.full(k, -1, dtype=np.int64)
    out_val[:order.size], out_pos[:order.size] = val[order], pos[order]
    return out_val, out_pos


def _example_pass() -> PassArgs:
    """A tiny pass with the argument types of every real one (one specialisation of the driver)."""
    t = np.zeros((2, 4))
    rb, rp = _rows(2)
    return PassArgs(t=t, partner=t, d=np.zeros((2, 4)), rP=np.zeros(2), rQ=np.zeros(4), r_const=0.0, permP=_NO_PERM,
                    permQ=_NO_PERM, mp=np.int64(0), mq=np.int64(0), ca=1.0, sb=0.0, cw=np.int64(0), unit=np.int64(1),
                    explicit=True, update=False, threshold=0.0, skip=np.int64(-1), row_best=rb, row_pos=rp)


def fit_kernels() -> list:
    """``(dispatcher, argument types)`` of the kernels every fit runs, in the types the fit
    passes them: the driver of the fused update + scan, then the reductions after it.
    :func:`top_appends` (several terms per pass, not a default) compiles on its first use."""
    a = _example_pass()
    one = np.zeros(1)
    examples = [(_blocks, (*a, np.int64(1), np.zeros(2, np.int64), True)),
                (reduce_rows, (a.row_best, a.row_pos)),
                (_support_moves, (np.zeros(1, np.int64), one, one, one, one)),
                (second_order_lowest, (a.t, a.d, a.rP, a.rQ, 0.0, 1, np.int64(-1)))]
    return [(disp, tuple(disp.typeof_pyval(x) for x in args)) for disp, args in examples]


def ahead_kernels() -> list:
    """What a new fit compiles in a second process while it compiles its transforms
    (:mod:`fsll_ooc.kernels.ahead`): the driver, the longest compile of this module; the
    reductions compile in the fit's process while it waits for the driver."""
    return fit_kernels()[:1]


def warmup() -> None:
    """Compile (or load from numba's cache) every kernel variant on tiny inputs (every kind
    of pass and thread count runs the one driver ``_blocks``)."""
    t = np.zeros((2, 4))
    d = np.zeros((2, 4))
    r = np.zeros(2), np.zeros(4)
    update_scan_xor(t, d, *r, 0.0, 1, 3, 1.0, 0.0, 1.0)
    update_scan_perm(t, d, *r, 0.0, np.array([0, 1]), np.array([0, 2, 1, 3]), 1.0, 0.0, 1.0)
    update_scan_explicit(t, None, d, *r, 0.0, update=False)
    support_moves(np.zeros(1, np.int64), np.zeros(1), np.zeros(1), np.ones(1), np.zeros(1))
    top_appends(t, d, *r, 0.0, 2, -1)
