"""The compiled sub-table search against the cost's closed forms (fsll_ooc.cost, one step at a
time in Python) bit for bit, and against brute force at the boundary of the duals."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from fsll_ooc import basis, cost as C, datasets
from fsll_ooc.learn import batch

import oracle

CASES = [((2, 3, 4, 5), 600, 0, (1, 3)), ((2, 3, 4, 5), 600, 1, (0, 1, 2, 3)), ((2, 2, 2, 2, 2), 500, 2, (0, 2, 4)),
         ((3, 2, 5), 2000, 3, (0, 2)), ((4, 2, 2, 3), 800, 4, (0, 1, 3)), ((4, 8, 2), 3000, 5, (0, 1, 2))]


def _reference(cards, V, tb, db, theta, weights, epsilon, max_steps, code):
    """The sub-table search one step at a time on the scalar closed forms of fsll_ooc.cost and
    the product rule of fsll_ooc.basis: what the compiled search must reproduce bit for bit."""
    shape = tuple(cards[v] for v in V)
    flats = batch.marginal_cells(cards, V).reshape(-1)
    sub = np.array(tb, np.float64).reshape(shape)
    d = np.asarray(db, np.float64).reshape(-1)
    theta = dict(theta)
    r_paper = batch.marginal_penalties(cards, V, weights).reshape(-1)
    family = code is not None and code.kind == "family"

    def axes(i):
        return tuple(v for v, x in zip(V, np.unravel_index(i, shape)) if x)

    def counts():
        out = {}
        for y in theta:
            i = int(np.searchsorted(flats, y))
            if i < flats.size and flats[i] == y:
                out[axes(i)] = out.get(axes(i), 0) + 1
        return out

    touched = set()  # families whose count changed (or had members): priced by the family code

    def price(i, m):
        A = axes(i)
        if family and code.members(A) > 1 and A in touched:
            return code.add(A, m)
        return float(r_paper[i])

    touched.update(counts())
    steps = []
    for _ in range(max_steps):
        tf = sub.reshape(-1)
        cnt = counts()
        app, sup = (math.inf, "append", -1), (math.inf, None, -1)  # ties: the lowest cell
        for i in range(1, flats.size):
            y = int(flats[i])
            t, di = float(tf[i]), float(d[i])
            m = cnt.get(axes(i), 0)
            if y in theta:
                r = price(i, m - 1) if m else math.inf
                for dl, mv in ((C.delta_adjust(di, t), "adjust"), (C.delta_remove(di, t, theta[y], r), "remove")):
                    if dl < sup[0]:  # adjust before remove
                        sup = (dl, mv, i)
            else:
                r = price(i, m)
                if C.lower_bound(di, t, r) < 0.0:
                    dl = C.delta_append(di, t, r)
                    if dl < app[0]:
                        app = (dl, "append", i)
        best = sup if sup[2] >= 0 and (sup[0] < app[0] or app[2] < 0) else app  # an equal append wins
        delta, move, i = best
        if not delta < -epsilon:
            break
        y = int(flats[i])
        t, di = float(tf[i]), float(d[i])
        old = theta.get(y, 0.0)
        new = 0.0 if move == "remove" else C.optimum_theta(old, di, t)
        part = sub
        for ax, b in enumerate(np.unravel_index(i, shape)):
            if b:
                part = basis.apply_product(part, ax, int(b))
        ch, sh = math.cosh(new - old), math.sinh(new - old)
        den = ch + sh * t
        sub = sub * (ch / den) + (sh / den) * part
        if move == "remove":
            del theta[y]
        else:
            theta[y] = new
        if move != "adjust":
            touched.add(axes(i))
        steps.append((y, move, old, new, t, di, delta, math.log(den)))
    return steps, sub.reshape(-1), theta


def _setup(cards, n, seed, V):
    p, _ = datasets.random_bayesnet(cards, 2, seed=seed)
    X = datasets.sample_table(p, n, seed=seed + 100)
    Phi = oracle.phi_matrix(cards)
    q = oracle.target(X, cards)
    rng = np.random.default_rng(seed)
    theta = np.zeros(len(q))
    sup = rng.choice(np.arange(1, len(q)), size=6, replace=False)
    theta[sup] = rng.normal(0, 0.3, size=6)
    cells = batch.marginal_cells(cards, V).reshape(-1)
    th = {int(y): float(theta[y]) for y in np.nonzero(theta)[0]}
    return (Phi @ oracle.model(theta, Phi))[cells], (Phi @ q)[cells], th


@pytest.mark.parametrize("kind,scale", [("paper", 1.0), ("family", 1.0), ("family", 0.5)])
@pytest.mark.parametrize("cards,n,seed,V", CASES)
def test_compiled_search_is_the_closed_forms_bit_for_bit(cards, n, seed, V, kind, scale):
    tb, db, th = _setup(cards, n, seed, V)
    code = C.TermCode(cards, n, kind, scale)
    weights = C.penalty_weights(cards, n, scale)
    want, want_sub, want_theta = _reference(cards, V, tb, db, th, weights, 1e-5, 200, code)
    sub = tb.copy()
    got = [(s.flat, s.move, s.old, s.new, s.t, s.d, s.delta, s.log_den)
           for s in batch.search_marginal(cards, V, sub, db, th, weights, 1e-5, 200, code=code)]
    assert want, "the reference took no step"
    assert got == want
    assert np.array_equal(sub, want_sub)
    assert th == want_theta and list(th) == list(want_theta)  # the same values, appends in the same order


@pytest.mark.parametrize("V", [tuple(range(8)), (0, 1, 3, 4, 5, 6, 7), (1, 2, 3, 4, 5, 6)])
def test_compiled_search_on_binary_runs_is_the_closed_forms_bit_for_bit(V):
    """Binary sub-tables of 64 to 256 cells: the flat XOR of a step above the runs of 64 cells,
    inside them (a lane or a block of a run) or both, each run's partners read and written in
    one loop (no copy), against the one-step-at-a-time closed forms."""
    cards, n, seed = (2,) * 8, 900, 7
    tb, db, th = _setup(cards, n, seed, V)
    weights = C.penalty_weights(cards, n)
    want, want_sub, want_theta = _reference(cards, V, tb, db, th, weights, 1e-6, 120, None)
    sub = tb.copy()
    got = [(s.flat, s.move, s.old, s.new, s.t, s.d, s.delta, s.log_den)
           for s in batch.search_marginal(cards, V, sub, db, th, weights, 1e-6, 120)]
    assert len(want) > 20
    assert got == want
    assert np.array_equal(sub, want_sub)
    assert th == want_theta


@pytest.mark.parametrize("n_axes", [3, 6, 7, 10])
def test_replay_on_walsh_axes_is_the_pairwise_update_bit_for_bit(n_axes):
    """:func:`fsll_ooc.kernels.search.replay_sub` on Walsh-Hadamard axes: each update
    ``x[j] = x[j] a + b x[j ^ mask]`` (``a = cosh/den``, ``b = sinh/den``) for masks above, inside
    and across the runs of 64 cells, and on sub-tables shorter than a run."""
    from fsll_ooc.kernels import search

    rng = np.random.default_rng(n_axes)
    size = 1 << n_axes
    shape = np.full(n_axes, 2, np.int64)
    x0 = rng.uniform(-0.6, 0.6, size)
    x0[0] = 1.0
    if size <= 128:  # every mask
        cells = rng.permutation(np.arange(1, size, dtype=np.int64))
    else:
        cells = np.array(sorted({1, size - 1, size // 2, 3, 5, 8, 40, 63, 64, 65, 72, 96, 136,
                                 *rng.integers(1, size, 24).tolist()}), np.int64)
    deltas = rng.normal(0, 0.1, cells.size)
    want = x0.copy()
    want_t, total = [], 0.0
    for c, dl in zip(cells.tolist(), deltas.tolist()):
        t = want[c]
        want_t.append(t)
        ch, sh = math.cosh(dl), math.sinh(dl)
        den = ch + sh * t
        a, b = ch / den, sh / den
        want = np.array([want[j] * a + b * want[j ^ c] for j in range(size)])
        total += math.log(den)
    x = x0.copy()
    out_t = np.empty(cells.size)
    got = search.replay_sub(x, shape, np.ones(n_axes, bool), cells, deltas, out_t)
    assert np.array_equal(x, want)
    assert out_t.tolist() == want_t
    assert got == total


def test_max_steps_bounds_the_search_and_a_later_search_continues_it():
    cards, n, seed, V = (2, 3, 4, 5), 600, 1, (0, 1, 2, 3)
    tb, db, th = _setup(cards, n, seed, V)
    weights = C.penalty_weights(cards, n)
    whole = list(batch.search_marginal(cards, V, tb.copy(), db, dict(th), weights, 1e-5, 200))
    sub, th2 = tb.copy(), dict(th)
    first = list(batch.search_marginal(cards, V, sub, db, th2, weights, 1e-5, 3))
    rest = list(batch.search_marginal(cards, V, sub, db, th2, weights, 1e-5, 200))
    assert len(first) == 3 < len(whole)
    assert [s.flat for s in first + rest] == [s.flat for s in whole]


def test_merge_steps_replays_the_sub_table():
    cards, n, seed, V = (2, 3, 4, 5), 600, 0, (1, 3)
    tb, db, th = _setup(cards, n, seed, V)
    sub = tb.copy()
    steps = list(batch.search_marginal(cards, V, sub, db, th, C.penalty_weights(cards, n), 1e-5, 200))
    factors, dlogz = batch.merge_steps(cards, V, tb, steps)
    replay = np.array(tb).reshape(tuple(cards[v] for v in V))
    total = 0.0
    for digits, delta, t in factors:
        sd = tuple(digits[v] for v in V)
        assert t == replay[sd]
        part = replay
        for ax, b in enumerate(sd):
            if b:
                part = basis.apply_product(part, ax, b)
        den = math.cosh(delta) + math.sinh(delta) * t
        replay = replay * (math.cosh(delta) / den) + (math.sinh(delta) / den) * part
        total += math.log(den)
    assert dlogz == total
    np.testing.assert_allclose(replay.reshape(-1), sub, atol=1e-12)
    # without the replay: the same terms and steps, no duals
    bare, none = batch.merge_steps(cards, V, tb, steps, duals=False)
    assert none is None and [(dg, dl) for dg, dl, _ in bare] == [(dg, dl) for dg, dl, _ in factors]
    assert all(t is None for _, _, t in bare)


@pytest.mark.parametrize("where", ["target", "dual-and-target"])
@pytest.mark.parametrize("value", [1.0, -1.0])
def test_a_dual_or_target_of_exactly_one_does_not_stop_the_search(where, value):
    """A target (or a dual and its target) of exactly +-1, reachable only by rounding, takes the
    limit ``0 ln 0 = 0`` of the closed forms: the cell is scored by a number, and the search
    still takes the other cells' moves (it used to score the cell NaN and stop)."""
    cards, n = (2, 2, 2), 500
    V = (0, 1, 2)
    rng = np.random.default_rng(7)
    x = np.array(np.unravel_index(np.arange(8), cards)).T
    q = rng.uniform(0.5, 1.5, 8) * ((x[:, 1] == x[:, 2]) == (value == 1.0))  # Phi_3 = value on q's support
    db = oracle.phi_matrix(cards) @ (q / q.sum())
    db[3] = value
    tb = np.zeros(8)
    tb[0] = 1.0
    if where == "dual-and-target":
        tb[3] = value
    weights = C.penalty_weights(cards, n)
    sub, th = tb.copy(), {}
    steps = list(batch.search_marginal(cards, V, sub, db, th, weights, 1e-6, 500))
    assert steps and all(math.isfinite(s.new) for s in steps)
    assert any(s.flat != 3 for s in steps)
    # it ended where no move gains epsilon by the closed forms (not on a NaN)
    assert np.isfinite(sub).all()
    more, _, _ = _reference(cards, V, sub, db, th, weights, 1e-6, 1, None)
    assert more == []
    # the closed form at the boundary is the limit, and the reference agrees
    t = 0.25
    want = 0.5 * (1.0 + value) * (math.log1p(value * t) - math.log(2.0)) if value == 1.0 else \
        0.5 * (1.0 - value) * (math.log1p(-t) - math.log(2.0))
    assert C.kl_step(value, t, value) == pytest.approx(want, rel=1e-15)
    assert C.kl_step(value, value, value) == 0.0


def _expand_axis_by_axis(cards, dig_a, dig_b):
    """The pair products axis by axis on numpy (all pairs' terms per axis, the triples' copies
    appended): the reference order of the terms within a pair."""
    P = len(dig_a)
    strides = np.array([math.prod(cards[i + 1:]) for i in range(len(cards))], np.int64)
    pair, flat, coef = np.arange(P), np.zeros(P, np.int64), np.ones(P)
    for i, k in enumerate(cards):
        a, b = dig_a[pair, i], dig_b[pair, i]
        if basis.is_walsh(k):
            flat = flat + (a ^ b) * strides[i]
            continue
        triple = (a != b) & (a != 0) & (b != 0)
        c = np.where(a == b, 0, a | b)
        c[triple] = 0
        flat = flat + c * strides[i]
        coef[triple] = -coef[triple]
        t = np.nonzero(triple)[0]
        pair = np.concatenate([pair, pair[t], pair[t]])
        flat = np.concatenate([flat, flat[t] + a[t] * strides[i], flat[t] + b[t] * strides[i]])
        coef = np.concatenate([coef, coef[t], coef[t]])
    return pair, flat, coef


@pytest.mark.parametrize("cards", [(2, 3, 4, 5), (3, 3, 3, 3), (5, 2, 7), (4, 8, 2)])
def test_compiled_pair_products_are_the_expansion_in_its_order(cards):
    from fsll_ooc.kernels import products
    from fsll_ooc.learn import corrective

    rng = np.random.default_rng(len(cards))
    size = math.prod(cards)
    ya, yb = rng.integers(0, size, 300), rng.integers(0, size, 300)
    da = np.stack(np.unravel_index(ya, cards), axis=1).astype(np.int64)
    db = np.stack(np.unravel_index(yb, cards), axis=1).astype(np.int64)
    pair, flat, coef = corrective.pair_products(cards, da, db)
    rp, rf, rc = _expand_axis_by_axis(cards, da, db)
    for j in range(len(ya)):  # the same terms of every pair, in the same order
        assert flat[pair == j].tolist() == rf[rp == j].tolist()
        assert coef[pair == j].tolist() == rc[rp == j].tolist()
    # and the dense product: <Phi_a Phi_b> of a random distribution
    Phi = oracle.phi_matrix(cards)
    p = rng.dirichlet(np.ones(size))
    tb = Phi @ p
    got = products.pair_sums(pair, coef, tb[flat], len(ya))
    np.testing.assert_allclose(got, (Phi[ya] * Phi[yb]) @ p, atol=1e-12)
    assert got.tolist() == np.bincount(pair, weights=coef * tb[flat], minlength=len(ya)).tolist()


@pytest.mark.parametrize("stalled", [False, True])
@pytest.mark.parametrize("kind", ["paper", "family"])
@pytest.mark.parametrize("cards,V", [((2,) * 12, tuple(range(12))), ((2,) * 12, (0, 3, 4, 7, 9, 10, 11)),
                                     ((4, 2, 8, 2, 2, 4), (0, 1, 2, 3, 4, 5)), ((4, 8, 2), (0, 1, 2)),
                                     ((2, 3, 4, 5), (0, 1, 2, 3)), ((3, 2, 5, 4, 2), (0, 1, 2, 3, 4)),
                                     ((5, 3, 2, 4, 3), (0, 2, 3, 4)),
                                     ((5, 4, 3, 4, 3, 2, 2, 3, 2), tuple(range(9))),  # several pieces
                                     ((3, 5, 4, 3, 2, 3, 4, 3), (0, 1, 2, 3, 5, 6, 7))])
@pytest.mark.parametrize("threads", [2, 3])
def test_search_on_several_threads_is_the_search_on_one(cards, V, threads, kind, stalled, monkeypatch):
    """Each step's sweep shared in pieces between threads: the same steps and duals, bit for bit;
    also when every step counts as stalled, so that the search goes on alone after a few.  With
    +-1 axes (mixed cardinalities) the partner is made in pieces too, axis by axis."""
    from fsll_ooc.kernels import search, threadpool

    p, _ = datasets.random_bayesnet(cards, 2, seed=3)
    n = 3000
    X = datasets.sample_table(p, n, seed=4)
    counts = np.bincount(np.ravel_multi_index(X.T, cards), minlength=math.prod(cards)).reshape(cards)
    q = (counts + 1.0 / counts.size) / (n + 1.0)
    cells = batch.marginal_cells(cards, V).reshape(-1)
    db = basis.transform(q).reshape(-1)[cells]
    rng = np.random.default_rng(5)
    theta = np.zeros(math.prod(cards))
    theta[rng.choice(np.arange(1, theta.size), size=8, replace=False)] = rng.normal(0, 0.3, size=8)
    model = np.exp(basis.transform(theta.reshape(cards), transpose=True))
    tb = basis.transform(model / model.sum()).reshape(-1)[cells]
    th = {int(y): float(theta[y]) for y in np.nonzero(theta)[0]}
    code, weights = C.TermCode(cards, n, kind, 1.0), C.penalty_weights(cards, n)

    def run(k):
        threadpool.set_num_threads(k)
        try:
            sub, t = tb.copy(), dict(th)
            steps = [(s.flat, s.move, s.old, s.new, s.t, s.d, s.delta, s.log_den)
                     for s in batch.search_marginal(cards, V, sub, db, t, weights, 1e-6, 400, code=code)]
        finally:
            threadpool.set_num_threads(None)
        return steps, sub, t

    one = run(1)
    monkeypatch.setattr(search, "search_threads", lambda cells, walsh: threads)
    monkeypatch.setitem(search._backoff, "searches", 0)
    if stalled:
        monkeypatch.setattr(search, "STALL_SPINS", -1)
    else:  # shared to the end, however busy the machine
        monkeypatch.setattr(search, "STALL_SPINS", 2**40)
        monkeypatch.setattr(search, "MIN_SHARE", 0.0)
    many = run(threads)
    if stalled:  # a search that went on alone makes the next ones run alone for a while
        assert search._backoff["searches"] == search.STALL_BACKOFF
    assert len(one[0]) > 20
    assert many[0] == one[0]
    assert np.array_equal(many[1], one[1])
    assert many[2] == one[2] and list(many[2]) == list(one[2])


def test_search_threads_follow_the_thread_count_size_basis_and_stalls(monkeypatch):
    from fsll_ooc.kernels import search, threadpool

    big = search.PARALLEL_MIN_CELLS
    monkeypatch.setitem(search._backoff, "searches", 0)
    threadpool.set_num_threads(3)
    try:
        assert search.search_threads(big, True) == 3
        assert search.search_threads(big - 1, True) == 1  # too small to share
        assert search.search_threads(big, False) == 3  # a +-1 axis: the partner made in pieces too
        pm = search.PARALLEL_MIN_CELLS_PM
        assert search.search_threads(pm, False) == 3 and search.search_threads(pm - 1, False) == 1
        search.shared_done(np.array([0, 0, 1, 0]))  # a search that shared to its end
        assert search.search_threads(big, True) == 3
        search.shared_done(np.array([0, 0, 2, 0]))  # one that stalled and went on alone
        assert [search.search_threads(big, True) for _ in range(search.STALL_BACKOFF + 1)] == \
            [1] * search.STALL_BACKOFF + [3]
        threadpool.set_num_threads(1)
        assert search.search_threads(big, True) == 1
    finally:
        threadpool.set_num_threads(None)


@pytest.mark.parametrize("code", ["paper", "family"])
def test_step_costs_are_the_state_costs_after_each_step_bit_for_bit(code):
    """The batch's costs without the state's dictionaries: FitState.cost() after each step, the same bits,
    through appends, adjusts, removals and a removed term appended again (it joins the end),
    under either code (the family code: terms 40 and 61 share a family with others)."""
    from fsll_ooc.learn.state import FitState

    cards, n = (2, 3, 4, 5), 700
    rng = np.random.default_rng(11)
    st = FitState(cards, n, 3.7, log_z=math.log(math.prod(cards)), penalty_code=code)
    for y in (5, 17, 33, 2):
        st.theta[y], st.dbar[y] = float(rng.normal()), float(rng.uniform(-1, 1))
    moves = [(40, "append"), (17, "adjust"), (5, "remove"), (61, "append"), (40, "adjust"), (5, "append"),
             (2, "remove"), (33, "remove"), (61, "adjust")]
    before = [(y, v, st.dbar[y]) for y, v in st.theta.items()]
    log_z0 = st.log_z
    steps, want = [], []
    for y, move in moves:
        new = 0.0 if move == "remove" else float(rng.normal())
        s = batch.SubStep(y, move, st.theta.get(y, 0.0), new, 0.1, float(rng.uniform(-1, 1)), -1e-3,
                          float(rng.normal(0, 0.01)))
        steps.append(s)
        if move == "remove":
            del st.theta[y]
            st.dbar.pop(y)
        else:
            st.theta[y] = new
            st.dbar[y] = s.d
        st.log_z += s.log_den
        want.append(st.cost())
    assert batch.step_costs(st, before, steps, log_z0) == want
