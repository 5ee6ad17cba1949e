"""The compiled fused update + scan kernels against a plain numpy reference.

Every path of :mod:`fsll_ooc.kernels` (runs paired with runs, gathered chunks by runs of
8, 4 and 1 cells, general permutations, explicit partners, serial with the champion
carried across rows, and shared between threads that take blocks of rows as they
come with the champion carried within a block) must give the updated
table bit for bit and the winner of a dense ``argmin`` (ties to the lowest flat
position, ``skip`` excluded, nothing at or above ``threshold``).
"""
from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from fsll_ooc.engine import Table, bands, tasks
from fsll_ooc import kernels
from fsll_ooc.kernels import threadpool


def _reference(t, partner_flat, d, rP, rQ, r_const, ch, sh, inv_den, threshold, skip, update=True):
    """New table and (best, pos) by definitions; ``partner_flat[f]`` is the partner of flat cell f."""
    P, Q = t.shape
    ca, sb = ch * inv_den, sh * inv_den
    old = t.reshape(-1)
    new = ca * old + sb * old[partner_flat] if update else old.copy()
    dd = d.reshape(-1)
    r = ((r_const + rP)[:, None] + rQ[None, :]).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ex = 0.5 * ((1.0 + dd) * (np.log1p(new) - np.log1p(dd)) + (1.0 - dd) * (np.log1p(-new) - np.log1p(-dd))) + r
    ex = np.where(ex < threshold, ex, np.inf)
    if 0 <= skip < ex.size:
        ex[skip] = np.inf
    if not np.isfinite(ex).any():
        return new.reshape(P, Q), math.inf, -1
    pos = int(np.argmin(ex))  # first occurrence: the lowest position among ties
    return new.reshape(P, Q), float(ex[pos]), pos


def _tables(rng, P, Q, spread=0.4):
    t = rng.uniform(-spread, spread, (P, Q))
    d = np.clip(t + rng.normal(0, 0.05, (P, Q)), -0.95, 0.95)
    rP = rng.uniform(0, 2e-3, P)
    rQ = rng.uniform(0, 2e-3, Q)
    return t, d, rP, rQ


def _check(got, want, t_got, t_want):
    assert np.array_equal(t_got, t_want)  # bit for bit
    assert got[1] == want[2]
    if want[2] >= 0:
        assert got[0] == pytest.approx(want[1], rel=1e-12, abs=1e-15)


def _xor_partner(P, Q, mp, mq):
    p, q = np.divmod(np.arange(P * Q), Q)
    return (p ^ mp) * Q + (q ^ mq)


# masks chosen to reach every path: runs paired with runs (mq % 64 == 0), gathers by runs of
# 8 / 4 / 1 cells, partners inside the same row and in another row, the identity
XOR_CASES = [
    (4, 4096, 0, 64), (4, 4096, 1, 128 + 64), (4, 4096, 3, 0), (2, 4096, 0, 2048), (4, 4096, 0, 8),
    (4, 4096, 2, 1024 + 24), (4, 4096, 1, 4), (4, 4096, 0, 12), (4, 4096, 0, 1), (4, 4096, 3, 2047),
    (8, 2048, 5, 1024 + 3), (1, 16384, 0, 8192 + 5), (4, 4096, 0, 0), (16, 64, 7, 63), (16, 64, 1, 0),
    (8, 8, 3, 5), (2, 2, 1, 1), (1, 1, 0, 0), (6, 12, 1, 1), (3, 96, 0, 16 + 1), (3, 96, 0, 8),
    (5, 6, 0, 1),
]


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("P,Q,mp,mq", XOR_CASES)
def test_xor_kernel_matches_reference(P, Q, mp, mq, parallel):
    rng = np.random.default_rng(P * 7919 + Q * 31 + mp * 7 + mq)
    t, d, rP, rQ = _tables(rng, P, Q)
    for delta, threshold, skip in [(0.3, 0.0, -1), (-0.7, 0.0, 0), (1e-3, -1e-3, 5), (0.2, -np.inf, -1),
                                   (0.05, np.inf, 0)]:
        ch, sh = math.cosh(delta), math.sinh(delta)
        inv_den = 1.0 / (ch + sh * float(t.reshape(-1)[rng.integers(t.size)]))
        want = _reference(t, _xor_partner(P, Q, mp, mq), d, rP, rQ, 1e-4, ch, sh, inv_den, threshold, skip)
        tt = t.copy()
        got = kernels.update_scan_xor(tt, d, rP, rQ, 1e-4, mp, mq, ch, sh, inv_den, threshold=threshold,
                                      skip=skip, parallel=parallel)
        _check(got, want, tt, want[0])
        t = tt  # the next step starts from the updated table, as in a fit


def _involution(rng, n):
    """A random involution of range(n): disjoint transpositions and fixed points."""
    perm = np.arange(n)
    idx = rng.permutation(n)
    k = rng.integers(0, n // 2 + 1)
    a, b = idx[:k], idx[k:2 * k]
    perm[a], perm[b] = b, a
    return perm


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("P,Q", [(1, 7), (3, 5), (8, 60), (5, 1024), (2, 3000)])
def test_perm_kernel_matches_reference(P, Q, parallel):
    rng = np.random.default_rng(P * 100 + Q)
    t, d, rP, rQ = _tables(rng, P, Q)
    for delta, threshold, skip in [(0.4, 0.0, -1), (-0.2, 0.0, 0), (0.1, -5e-3, 3)]:
        permP, permQ = _involution(rng, P), _involution(rng, Q)
        partner = (permP[:, None] * Q + permQ[None, :]).reshape(-1)
        ch, sh = math.cosh(delta), math.sinh(delta)
        inv_den = 1.0 / (ch + sh * 0.1)
        want = _reference(t, partner, d, rP, rQ, 2e-4, ch, sh, inv_den, threshold, skip)
        tt = t.copy()
        got = kernels.update_scan_perm(tt, d, rP, rQ, 2e-4, permP, permQ, ch, sh, inv_den, threshold=threshold,
                                       skip=skip, parallel=parallel)
        _check(got, want, tt, want[0])
        t = tt


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("update", [False, True])
@pytest.mark.parametrize("P,Q", [(1, 1), (4, 63), (3, 64), (7, 200), (2, 4096)])
def test_explicit_kernel_matches_reference(P, Q, update, parallel):
    rng = np.random.default_rng(P * 1000 + Q + update)
    t, d, rP, rQ = _tables(rng, P, Q)
    partner = rng.uniform(-0.4, 0.4, (P, Q))
    for delta, threshold, skip in [(0.4, 0.0, -1), (-0.2, 0.0, 0), (0.1, -5e-3, 1)]:
        ch, sh = math.cosh(delta), math.sinh(delta)
        inv_den = 1.0 / (ch + sh * 0.2)
        ref_t = t.copy()
        if update:
            ref_t = (ch * inv_den) * t + (sh * inv_den) * partner
        want = _reference(ref_t, np.arange(t.size), d, rP, rQ, 3e-4, 1.0, 0.0, 1.0, threshold, skip, update=False)
        tt = t.copy()
        got = kernels.update_scan_explicit(tt, partner if update else None, d, rP, rQ, 3e-4, ch, sh, inv_den,
                                           update=update, threshold=threshold, skip=skip, parallel=parallel)
        _check(got, want, tt, ref_t)
        t = tt


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("mq", [0, 64, 5, 8])
def test_ties_go_to_the_lowest_position(mq, parallel):
    """Identical cells (same t after the update, same d, same r) in several rows and runs."""
    P, Q = 4, 256
    t = np.full((P, Q), 0.01)
    d = np.full((P, Q), 0.01)
    rP, rQ = np.zeros(P), np.full(Q, 1e-3)
    cells = [(3, 200), (1, 77), (2, 5), (1, 130)]
    for p, q in cells:
        t[p, q] = t[p ^ 1, q ^ mq] = 0.3  # partner pairs hold equal values: the update keeps them equal
        d[p, q] = d[p ^ 1, q ^ mq] = -0.2
    want = min(min(p * Q + q, (p ^ 1) * Q + (q ^ mq)) for p, q in cells)
    for delta in (0.0, 0.3):
        ch, sh = math.cosh(delta), math.sinh(delta)
        tt = t.copy()
        best, pos = kernels.update_scan_xor(tt, d, rP, rQ, 0.0, 1, mq, ch, sh, 1.0 / (ch + sh * 0.1),
                                            parallel=parallel)
        assert pos == want
        best2, pos2 = kernels.update_scan_explicit(tt, None, d, rP, rQ, 0.0, update=False, parallel=parallel)
        assert (best2, pos2) == (best, pos)


@pytest.mark.parametrize("parallel", [False, True])
def test_skip_and_threshold(parallel):
    P, Q = 2, 128
    t = np.zeros((P, Q))
    d = np.zeros((P, Q))
    rP, rQ = np.zeros(P), np.full(Q, 1e-3)
    d[0, 0], d[1, 64] = 0.9, 0.5  # cell 0 is the best candidate, then cell Q + 64
    args = (d, rP, rQ, 0.0, 0, 0, 1.0, 0.0, 1.0)
    assert kernels.update_scan_xor(t.copy(), *args, parallel=parallel)[1] == 0
    best, pos = kernels.update_scan_xor(t.copy(), *args, skip=0, parallel=parallel)
    assert pos == Q + 64
    # a threshold just above / at the winner's value
    assert kernels.update_scan_xor(t.copy(), *args, threshold=best + 1e-12, skip=0, parallel=parallel)[1] == pos
    assert kernels.update_scan_xor(t.copy(), *args, threshold=best, skip=0, parallel=parallel)[1] == -1
    assert kernels.update_scan_xor(t.copy(), *args, threshold=-1.0, parallel=parallel) == (math.inf, -1)


@pytest.mark.parametrize("n_threads", [2, 3])
@pytest.mark.parametrize("mp,mq", [(0, 1024), (17, 0), (32, 5), (1, 2047 + 4096)])
def test_threads_take_blocks_and_match_one_thread(monkeypatch, n_threads, mp, mq):
    """Blocks of rows taken by 2 or 3 threads: the table and the winner are those of one thread
    (bit for bit), on a table with many blocks; repeated to give a race a chance to show."""
    monkeypatch.setattr(threadpool, "num_threads", lambda: n_threads)
    monkeypatch.setattr(kernels.scan, "BLOCK_CELLS", 4 * 8192)  # 4 rows per block: 16 blocks
    rng = np.random.default_rng(mp * 7 + mq)
    t, d, rP, rQ = _tables(rng, 64, 8192)
    ch, sh = math.cosh(0.2), math.sinh(0.2)
    args = (d, rP, rQ, 1e-4, mp, mq, ch, sh, 1.0 / (ch + sh * 0.05))
    want_t = t.copy()
    want = kernels.update_scan_xor(want_t, *args, threshold=0.5)
    for _ in range(3):
        tt = t.copy()
        assert kernels.update_scan_xor(tt, *args, threshold=0.5, parallel=True) == want
        assert np.array_equal(tt, want_t)


def test_a_helper_that_never_runs_does_not_stall_the_pass(monkeypatch):
    """The caller takes every block when the helper thread is busy elsewhere (as when the
    operating system gives the other core to another program): the pass ends, correct."""
    gate = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    pool.submit(gate.wait)  # the only helper is blocked until the end of the test
    monkeypatch.setattr(threadpool, "num_threads", lambda: 2)
    monkeypatch.setattr(threadpool, "fire", lambda n, fn, *args: pool.submit(fn, *args))
    try:
        rng = np.random.default_rng(5)
        t, d, rP, rQ = _tables(rng, 32, 4096)
        want_t = t.copy()
        want = kernels.update_scan_xor(want_t, d, rP, rQ, 0.0, 3, 64, 1.1, 0.4, 0.9)
        tt = t.copy()
        got = kernels.update_scan_xor(tt, d, rP, rQ, 0.0, 3, 64, 1.1, 0.4, 0.9, parallel=True)
        assert got == want and np.array_equal(tt, want_t)
        assert not gate.is_set()  # it really never ran
        want2 = kernels.update_scan_explicit(want_t.copy(), None, d, rP, rQ, 0.0, update=False)
        assert kernels.update_scan_explicit(tt, None, d, rP, rQ, 0.0, update=False, parallel=True) == want2
    finally:
        gate.set()
        pool.shutdown()


def test_bad_masks_are_refused():
    t = np.zeros((4, 6))
    with pytest.raises(ValueError):
        kernels.update_scan_xor(t, t, np.zeros(4), np.zeros(6), 0.0, 0, 3, 1.0, 0.0, 1.0)  # 5 ^ 3 = 6
    with pytest.raises(ValueError):
        kernels.update_scan_xor(t, t, np.zeros(4), np.zeros(6), 0.0, 4, 0, 1.0, 0.0, 1.0)
    t = np.zeros((3, 96))
    with pytest.raises(ValueError):
        kernels.update_scan_xor(t, t, np.zeros(3), np.zeros(96), 0.0, 0, 33, 1.0, 0.0, 1.0)


@pytest.mark.parametrize("seed", range(40))
def test_engine_xor_mask_equals_digit_permutation(seed):
    """The flat XOR mask the engine passes is the digit permutation whenever it exists."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(k) for k in rng.choice([2, 3, 4, 5, 8], size=rng.integers(1, 5)))
    walsh = [ax for ax, k in enumerate(shape) if k & (k - 1) == 0]
    if not walsh:
        return
    flips = [(ax, int(rng.integers(1, shape[ax]))) for ax in rng.choice(walsh, size=rng.integers(1, len(walsh) + 1),
                                                                       replace=False)]
    perm = bands.xor_perm(shape, flips)
    m = bands.xor_mask(shape, flips)
    inner_pow2 = all(all(k & (k - 1) == 0 for k in shape[ax:]) for ax, _ in flips)
    if inner_pow2:
        assert m is not None and np.array_equal(perm, np.arange(perm.size) ^ m)
    else:
        assert m is None


@pytest.mark.parametrize("cards", [(2, 2, 4, 8), (2, 3, 4), (5, 2)])
def test_uniform_duals_equal_the_outer_product(cards):
    """The all-Walsh shortcut of ``init_duals`` writes the outer product's numbers, bit for bit."""
    from fsll_ooc import FSLL, storage

    X = np.random.default_rng(0).integers(0, 2, size=(50, len(cards)))
    m = FSLL(cardinalities=cards, epsilon=1e-4, max_iter=0, progress=False).fit(X)
    got = np.array(storage.open_table(m.engine_.ctx.spec(Table.THETABAR)))
    want = np.full((), 1.0)
    for k in cards:
        want = np.multiply.outer(want, tasks.uniform_dual_vector(k))
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("seed", range(12))
def test_support_moves_match_the_closed_forms(seed):
    """The compiled best adjust/remove move equals the closed forms of fsll_ooc.cost
    (values to 1e-12; the winner by lowest change, then lowest y, adjust before remove)."""
    from fsll_ooc import cost as C

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    ys = rng.permutation(10 * n)[:n].astype(np.int64)
    t = rng.uniform(-0.9, 0.9, n)
    d = np.clip(t + rng.normal(0, 0.1, n), -0.95, 0.95)
    th = rng.normal(0, 0.5, n)
    r = rng.uniform(0, 1e-2, n)
    if seed % 3 == 0 and n > 2:  # exact ties: copies of one entry under other y
        k = rng.integers(0, n, size=3)
        t[k], d[k], th[k], r[k] = t[k[0]], d[k[0]], th[k[0]], r[k[0]]
    if seed % 4 == 1:  # entries already at their optimum: adjust changes of exactly 0
        d[: n // 2] = t[: n // 2]
    adj = np.array([C.delta_adjust(d[j], t[j]) for j in range(n)])
    rem = np.array([C.delta_remove(d[j], t[j], th[j], r[j]) for j in range(n)])
    vals = np.concatenate([adj, rem])
    order = np.lexsort((np.repeat([0, 1], n), np.concatenate([ys, ys]), vals))
    best, i, mv = kernels.support_moves(ys, t, d, th, r)
    want = order[0]
    assert (i, mv) == (want % n, want // n) or vals[order[1]] == pytest.approx(vals[want], abs=1e-15)
    assert best == pytest.approx(vals[want], rel=1e-12, abs=1e-15)
    got = [kernels.support_moves(ys[j:j + 1], t[j:j + 1], d[j:j + 1], th[j:j + 1], r[j:j + 1])[0] for j in range(n)]
    np.testing.assert_allclose(got, np.minimum(adj, rem), rtol=1e-12, atol=1e-15)


def test_support_moves_ties_and_empty():
    ys = np.array([7, 3, 5], np.int64)
    t = np.full(3, 0.2)
    d = np.full(3, -0.1)
    th = np.zeros(3)  # removing a zero parameter changes the cost by -r: r = 0 ties it with itself
    r = np.full(3, 1.0)  # a large penalty: removing is the best move
    best, i, mv = kernels.support_moves(ys, t, d, th, r)
    assert (i, mv) == (1, 1) and best == pytest.approx(-1.0)  # lowest y among equal changes
    assert kernels.support_moves(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0))[1] == -1


def test_pass_args_name_the_compiled_drivers_parameters():
    """The named kernel arguments are the leading parameters of the compiled pass driver, in order."""
    import inspect

    params = list(inspect.signature(kernels.scan._kernel_blocks).parameters)
    assert list(kernels.PassArgs._fields) + ["rows", "ctr", "wait"] == params


@pytest.mark.parametrize("k,skip", [(5, -1), (5, 0), (40, 3), (400, 0)])
def test_second_order_lowest_is_the_lowest_of_numpys_scores(k, skip):
    """The joint candidates in one compiled pass: numpy's scores (bit for bit) and the ``k``
    lowest of them by score, then position; the skipped cell scores +inf."""
    from fsll_ooc.kernels import second_order_lowest

    rng = np.random.default_rng(2)
    P, Q = 7, 33
    t = rng.uniform(-1, 1, (P, Q))
    t[0, 1], t[1, 1], t[2, 2] = 1.0, -1.0, 0.0  # 1 - t^2 = 0: the floor
    d = rng.uniform(-1, 1, (P, Q))
    d[4], t[4] = d[3], t[3]  # a whole row of ties
    rP, rQ, r_const = rng.uniform(0, 1e-3, P), rng.uniform(0, 1e-3, Q), 2.5e-5
    rP[4] = rP[3]
    want = t - d
    np.square(want, out=want)
    den = t * t
    np.subtract(1.0, den, out=den)
    np.maximum(den, 1e-300, out=den)
    want /= den
    want *= -0.5
    want += rQ[None, :]
    want += (r_const + rP)[:, None]
    want = want.reshape(-1)
    if skip >= 0:
        want[skip] = np.inf
    order = np.lexsort((np.arange(want.size), want))[:k]
    val, pos = second_order_lowest(t, d, rP, rQ, r_const, k, np.int64(skip))
    got = np.lexsort((pos, val))
    assert pos[got].tolist() == order.tolist()
    assert val[got].tolist() == want[order].tolist()


@pytest.mark.parametrize("k,skip,ties", [(1, -1, False), (37, 5, False), (300, -1, True), (999, 12345, True)])
def test_second_order_lowest_keeps_the_k_lowest_across_many_buffer_refills(k, skip, ties):
    """Many more cells than ``k`` (the buffer of about ``2 k`` is refilled many times), with
    runs of equal scores across the refills: the same ``k`` cells as numpy's scores sorted by
    score, then position, and the same scores bit for bit."""
    from fsll_ooc.kernels import second_order_lowest

    rng = np.random.default_rng(k)
    P, Q = 61, 347
    t = rng.uniform(-1, 1, (P, Q))
    d = rng.uniform(-1, 1, (P, Q))
    if ties:  # a few distinct values only: most scores are tied with many others
        t = rng.choice([-0.5, 0.0, 0.25], (P, Q))
        d = rng.choice([-0.25, 0.5], (P, Q))
    rP, rQ, r_const = np.zeros(P), np.zeros(Q), 1e-4
    if not ties:
        rP, rQ = rng.uniform(0, 1e-3, P), rng.uniform(0, 1e-3, Q)
    want = ((t - d) ** 2 / np.maximum(1.0 - t * t, 1e-300)) * -0.5 + rQ[None, :] + (r_const + rP)[:, None]
    want = want.reshape(-1)
    if skip >= 0:
        want[skip] = np.inf
    order = np.lexsort((np.arange(want.size), want))[:k]
    val, pos = second_order_lowest(t, d, rP, rQ, r_const, k, np.int64(skip))
    assert pos.tolist() == order.tolist()  # returned by score, then position
    assert val.tolist() == want[order].tolist()
