"""The joint selection's pair sums read straight off the dual table (in core) against the
expansion, a gather and ``pair_sums`` (bit for bit) and against brute force."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fsll_ooc import basis, datasets
from fsll_ooc.kernels import products as kernel_products
from fsll_ooc.learn import corrective

import oracle


def _digit_rows(cards, n, rng, max_nonzero):
    """``n`` digit rows, each with at most ``max_nonzero`` non-zero digits (as a support's terms)."""
    out = np.zeros((n, len(cards)), np.int64)
    for r in range(n):
        axes = rng.choice(len(cards), size=int(rng.integers(0, max_nonzero + 1)), replace=False)
        for ax in axes:
            out[r, ax] = rng.integers(1, cards[ax])
    return out


@pytest.mark.parametrize("cards,max_nonzero", [((2, 3, 4, 5), 4), ((3, 3, 3), 3), ((5, 2, 6, 3, 8), 3),
                                               ((2, 2, 2), 3), ((7,), 1)])
def test_pair_sums_at_equals_expansion_then_gather(cards, max_nonzero):
    rng = np.random.default_rng(len(cards) + max_nonzero)
    table = rng.standard_normal(math.prod(cards))
    a = _digit_rows(cards, 40, rng, max_nonzero)
    b = _digit_rows(cards, 30, rng, max_nonzero)
    ia = rng.integers(0, len(a), 500)
    ib = rng.integers(0, len(b), 500)
    pair, flat, coef = corrective._expand(cards, a, b, ia, ib)
    want = kernel_products.pair_sums(pair, coef, table[flat], len(ia))
    got = corrective._pair_sums_at(cards, table, a, b, ia, ib)
    np.testing.assert_array_equal(got, want)  # the same numbers added in the same order
    # no pairs at all
    assert corrective._pair_sums_at(cards, table, a, b, ia[:0], ib[:0]).shape == (0,)


def test_pair_sums_at_are_moments_of_basis_products():
    """Brute force: with ``table = Phi p`` (the duals of a distribution ``p``), the sum of a pair
    is ``<Phi_a Phi_b>_p``, from the dense basis matrix."""
    cards = (3, 2, 4, 3)
    rng = np.random.default_rng(7)
    Phi = oracle.phi_matrix(cards)
    p = rng.dirichlet(np.ones(math.prod(cards)))
    table = Phi @ p
    a = _digit_rows(cards, 25, rng, 4)
    b = _digit_rows(cards, 25, rng, 4)
    ia, ib = np.repeat(np.arange(25), 25), np.tile(np.arange(25), 25)
    got = corrective._pair_sums_at(cards, table, a, b, ia, ib)
    fa, fb = np.ravel_multi_index(a.T, cards), np.ravel_multi_index(b.T, cards)
    want = (Phi[fa[ia]] * Phi[fb[ib]]) @ p
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_table_array_is_the_dual_table_in_core_only(tmp_path):
    cards = (3, 4, 2)
    X = datasets.sample_table(datasets.random_bayesnet(cards, 1, seed=1)[0], 500, seed=2)
    from fsll_ooc import FSLL

    m = FSLL(cardinalities=cards, progress=False).fit(X)
    t = corrective._table_array(m.engine_)
    assert t is not None and t.shape == (math.prod(cards),)
    flat = np.arange(math.prod(cards))
    np.testing.assert_array_equal(t, m.engine_.gather(flat))
    m = FSLL(cardinalities=cards, store=tmp_path / "s", layout=(1, 2), progress=False).fit(X)
    assert corrective._table_array(m.engine_) is None


@pytest.mark.parametrize("cards,max_nonzero", [((2, 3, 4, 5), 4), ((3, 3, 3), 3), ((5, 2, 6, 3, 8), 3),
                                               ((2, 2, 2), 3), ((2, 4, 8, 2), 4), ((7,), 1)])
def test_pair_sums_grid_equals_pair_sums_at(cards, max_nonzero):
    """The candidate x support matrix in one call: every pair's sum, bit for bit, also where every
    axis is Walsh-Hadamard (one product cell per pair, read by the XOR of the flat indices)."""
    rng = np.random.default_rng(3 * len(cards) + max_nonzero)
    table = rng.standard_normal(math.prod(cards))
    table[rng.integers(0, len(table), 3)] = -0.0  # (a pair's sum starts from 0.0: -0.0 comes out as 0.0)
    a = _digit_rows(cards, 23, rng, max_nonzero)
    b = _digit_rows(cards, 17, rng, max_nonzero)
    ia, ib = np.repeat(np.arange(len(a)), len(b)), np.tile(np.arange(len(b)), len(a))
    want = corrective._pair_sums_at(cards, table, a, b, ia, ib).reshape(len(a), len(b))
    got = corrective._pair_sums_grid(cards, table, a, b)
    assert got.shape == (len(a), len(b))
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    assert corrective._pair_sums_grid(cards, table, a[:0], b).shape == (0, len(b))
    assert corrective._pair_sums_grid(cards, table, a, b[:0]).shape == (len(a), 0)


@pytest.mark.parametrize("cards,max_nonzero", [((2, 3, 4, 5), 4), ((3, 3, 3), 3), ((5, 2, 6, 3, 8), 3),
                                               ((2, 2, 2), 3), ((7,), 1)])
def test_pair_sums_column_equals_pair_sums_at_of_pairs_with(cards, max_nonzero):
    """A joint selection's column of candidate pairs with the rows' sums made once: the sums of
    :meth:`CandidateOrder.pairs_with`'s pairs read by ``pair_sums_at``, bit for bit, for every
    candidate and an order that is not the list's."""
    rng = np.random.default_rng(5 * len(cards) + max_nonzero)
    table = rng.standard_normal(math.prod(cards))
    table[rng.integers(0, len(table), 3)] = -0.0
    dig = np.ascontiguousarray(_digit_rows(cards, 19, rng, max_nonzero), np.int64)
    order = corrective.CandidateOrder()
    strides = np.ones(len(cards), np.int64)
    for i in range(len(cards) - 2, -1, -1):
        strides[i] = strides[i + 1] * cards[i + 1]
    flat = dig @ strides
    _, first = np.unique(flat, return_index=True)
    dig = dig[np.sort(first)]
    flat = dig @ strides
    order.update(flat[::-1].copy())  # the first list, then the list reversed: ranks not in list order
    order.update(flat)
    walsh = np.array([basis.is_walsh(k) for k in cards], bool)
    rows = kernel_products.row_sums(dig, dig, strides)
    for c in range(len(dig)):
        ia, ib = order.pairs_with(c)
        want = corrective._pair_sums_at(cards, table, dig, dig, ia, ib)
        got = kernel_products.pair_sums_column(dig, c, order.rank, strides, walsh, table, *rows)
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("cards", [(3, 4, 2, 5), (2, 2, 2, 2, 2)])
def test_products_appends_keep_what_a_full_update_keeps(cards):
    """Members appended at the end take the short way (nothing re-indexed): the same cache, array
    for array, as the full re-indexing update, through appends, removals and reorders."""
    rng = np.random.default_rng(11)
    size = math.prod(cards)
    pool = rng.permutation(np.arange(1, size))[:30]
    steps = [pool[:3], pool[:7], pool[:7], pool[:12], pool[[0, 2, 3, 5, 6, 8, 9, 10, 11]],
             np.concatenate([pool[[0, 2, 3, 5, 6, 8, 9, 10, 11]], pool[20:25]]), pool[:12][::-1],
             np.concatenate([pool[:12][::-1], pool[25:30]]), pool[:0], pool[:4]]
    fast, full = corrective.Products(cards), corrective.Products(cards)
    for support in steps:
        support = np.asarray(support, np.int64)
        fast.update(support)
        if not np.array_equal(support, full.support):
            full._update(support)
        for name in ("support", "pair", "flat", "coef", "I", "J"):
            a, b = getattr(fast, name), getattr(full, name)
            assert a.dtype == b.dtype and np.array_equal(a, b), name
        # every pair i <= j of the support, each once
        got = sorted(zip(np.minimum(fast.I, fast.J).tolist(), np.maximum(fast.I, fast.J).tolist()))
        m = len(support)
        assert got == [(i, j) for i in range(m) for j in range(i, m)]


def _closure_reference(cards, support, limit):
    """:func:`corrective.closure_candidates` as it was first written (one variable set at a time
    by ``meshgrid``): the reference for the faster one."""
    support = np.asarray(support, np.int64)
    if len(support) == 0 or limit <= 0:
        return np.zeros(0, np.int64)
    strides = corrective._strides(cards)
    have = set(int(v) for v in support) | {0}
    seen, out, total = set(), [], 0
    for row in corrective._digits(cards, support):
        axes = tuple(int(i) for i in np.nonzero(row)[0])
        if axes in seen or math.prod(cards[i] for i in axes) > 4 * limit:
            continue
        seen.add(axes)
        grids = np.meshgrid(*[np.arange(cards[i]) for i in axes], indexing="ij")
        flat = sum(g.reshape(-1) * strides[i] for g, i in zip(grids, axes))
        flat = np.array([f for f in flat.tolist() if f not in have], dtype=np.int64)
        have.update(flat.tolist())
        out.append(flat)
        total += len(flat)
        if total >= limit:
            break
    return np.concatenate(out)[:limit] if out else np.zeros(0, np.int64)


@pytest.mark.parametrize("cards", [(3, 4, 2, 5), (2,) * 17, (3,) * 11, (5, 2, 6, 3, 8)])
def test_closure_candidates_match_the_reference(cards):
    rng = np.random.default_rng(len(cards))
    size = math.prod(cards)
    for max_nonzero in (1, 2, 3, 4):
        support = np.unique(np.ravel_multi_index(_digit_rows(cards, 60, rng, max_nonzero).T, cards))
        support = rng.permutation(support[support != 0])
        for limit in (0, 1, 7, 64, 512, min(size, 4096)):
            got = corrective.closure_candidates(cards, support, limit)
            want = _closure_reference(cards, support, limit)
            assert got.dtype == want.dtype and np.array_equal(got, want), (max_nonzero, limit)


def test_solve_skips_the_check_of_a_matrix_that_passed_it(monkeypatch):
    """A joint selection's solve (several right-hand sides) with the matrix the corrective phase's
    last round checked: no second Cholesky check, the same numbers; any other matrix is checked."""
    rng = np.random.default_rng(5)
    B = rng.standard_normal((40, 80))
    H = B @ B.T / 80
    g, G = rng.standard_normal(40), rng.standard_normal((40, 7))
    calls = []
    real = np.linalg.cholesky
    monkeypatch.setattr(np.linalg, "cholesky", lambda A: calls.append(1) or real(A))
    memo = corrective.Products((2, 2))
    x = corrective._solve(H, g, memo)
    assert len(calls) == 1 and memo.checked is not None
    np.testing.assert_array_equal(x, corrective._solve(H, g))
    X = corrective._solve(H.copy(), G, memo)  # the same bits: not checked again
    assert len(calls) == 2
    np.testing.assert_array_equal(X, corrective._solve(H, G))
    H2 = H.copy()
    H2[3, 3] += 1e-9
    corrective._solve(H2, G, memo)  # another matrix: checked
    assert len(calls) == 4
    # a matrix that fails the check at the first ridge fails it whatever the memo holds
    S = np.outer(g, g)  # rank one
    want = corrective._solve(S, G)
    memo.checked = S + 0.0
    np.testing.assert_array_equal(corrective._solve(S, G, memo), want)
