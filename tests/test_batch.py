"""Several steps per pass: the marginal sub-table search against brute force (tests/oracle.py)."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from fsll_ooc import basis, cost as C, datasets
from fsll_ooc.learn import batch

import oracle

CASES = [((2, 3, 4, 5), 600, 0, (1, 3)), ((2, 3, 4, 5), 600, 1, (0, 1, 2)), ((2, 2, 2, 2, 2), 500, 2, (0, 2, 4)),
         ((3, 2, 5), 2000, 3, (0, 2)), ((4, 2, 2, 3), 800, 4, (0, 1, 3))]


def _dense_theta(st, size):
    """The parameters of a fit state as a dense vector of ``size`` cells."""
    theta = np.zeros(size)
    for y, v in st.theta.items():
        theta[y] = v
    return theta


def _bn_problem(cards, n, seed):
    """Samples of a random network, the basis matrix, the targets, ``|X|``, a dense-theta function."""
    p, _ = datasets.random_bayesnet(cards, 2, seed=seed)
    X = datasets.sample_table(p, n, seed=seed + 100)
    size = math.prod(cards)
    return X, oracle.phi_matrix(cards), oracle.target(X, cards), size, functools.partial(_dense_theta, size=size)


def _problem(cards, n, seed):
    p, _ = datasets.random_bayesnet(cards, 2, seed=seed)
    X = datasets.sample_table(p, n, seed=seed + 100)
    Phi = oracle.phi_matrix(cards)
    q = oracle.target(X, cards)
    return Phi, q, oracle.r_vec(cards, n)


def test_marginal_cells_are_the_terms_supported_on_v():
    cards = (2, 3, 4, 5)
    for V in [(0,), (1, 3), (0, 1, 2, 3), (2,)]:
        cells = batch.marginal_cells(cards, V)
        assert cells.shape == tuple(cards[v] for v in V)
        want = [y for y in range(math.prod(cards))
                if all(d == 0 for i, d in enumerate(np.unravel_index(y, cards)) if i not in V)]
        assert sorted(cells.reshape(-1).tolist()) == want
    with pytest.raises(ValueError, match="sorted"):
        batch.marginal_cells(cards, (2, 1))


@pytest.mark.parametrize("kind", ["paper", "family"])
@pytest.mark.parametrize("cards,n,seed,V", CASES)
def test_sub_table_search_is_exact_and_merged_factors_update_the_whole_table(cards, n, seed, V, kind):
    """Under either code: every step's predicted change is the brute-force change of that
    code's cost (the family code prices appends and removes by the change of the code
    length, which depends on the family's other members)."""
    Phi, q, r = _problem(cards, n, seed)
    if kind == "family":
        cost_of = lambda th_: oracle.brute_cost(th_, q, Phi, cards, n, "family")  # noqa: E731
    else:
        cost_of = lambda th_: oracle.cost(th_, q, Phi, r)  # noqa: E731
    rng = np.random.default_rng(seed)
    theta = np.zeros(len(q))
    sup = rng.choice(np.arange(1, len(q)), size=5, replace=False)
    theta[sup] = rng.normal(0, 0.3, size=5)
    p = oracle.model(theta, Phi)
    tb_full = Phi @ p
    dbar = Phi @ q
    cells = batch.marginal_cells(cards, V).reshape(-1)
    th = {int(y): float(theta[y]) for y in np.nonzero(theta)[0]}
    sub = tb_full[cells].copy()
    code = C.TermCode(cards, n, kind)
    steps = list(batch.search_marginal(cards, V, sub, dbar[cells], th, C.penalty_weights(cards, n), 1e-5, 500,
                                       code=code))
    assert steps, "the sub-table search took no step"
    new = theta.copy()
    new[cells] = 0.0
    for y, v in th.items():
        new[y] = v
    assert np.array_equal(new[np.setdiff1d(np.arange(len(q)), cells)], theta[np.setdiff1d(np.arange(len(q)), cells)])
    p_new = oracle.model(new, Phi)
    tb_exact = Phi @ p_new
    # (a) the sub-table is the exact duals of the new model on V
    np.testing.assert_allclose(sub, tb_exact[cells], atol=1e-11)
    # every step's predicted change is the brute-force cost change, and log Z moves by log_den
    cost_now = cost_of(theta)
    cur = theta.copy()
    for s in steps:
        cur[s.flat] = s.new
        c = cost_of(cur)
        assert c - cost_now == pytest.approx(s.delta, abs=1e-11)
        assert s.delta < -1e-5
        cost_now = c
    logz = lambda th_: math.log(np.exp(Phi.T @ th_).sum())  # noqa: E731
    assert logz(new) - logz(theta) == pytest.approx(sum(s.log_den for s in steps), abs=1e-11)
    # (b) merged factors, one per changed term, bring the whole dual table to the exact one
    factors, dlogz = batch.merge_steps(cards, V, tb_full[cells], steps)
    net = {}
    for s in steps:
        net[s.flat] = net.get(s.flat, 0.0) + (s.new - s.old)
    assert len(factors) == sum(1 for v in net.values() if v != 0.0)  # a term appended then removed: none
    tb = tb_full.reshape(cards).copy()
    for digits, delta, t in factors:
        part = tb
        for ax, b in enumerate(digits):
            if b:
                part = basis.apply_product(part, ax, b)
        ch, sh = math.cosh(delta), math.sinh(delta)
        tb = (ch * tb + sh * part) / (ch + sh * t)
    np.testing.assert_allclose(tb.reshape(-1), tb_exact, atol=1e-11)
    assert dlogz == pytest.approx(logz(new) - logz(theta), abs=1e-11)
    # the search stops at a point where no move on V gains epsilon (brute force)
    for y in cells[1:]:
        y = int(y)
        trial = new.copy()
        trial[y] = oracle.coord_optimum(new, y, q, Phi)
        assert cost_of(trial) > cost_of(new) - 1e-5 - 1e-12
        if new[y] != 0:
            trial[y] = 0.0
            assert cost_of(trial) > cost_of(new) - 1e-5 - 1e-12
    if kind == "family" and max(cards[v] for v in V) > 2:
        fams = {}
        for y in np.nonzero(new)[0]:
            a = tuple(i for i, dg in enumerate(np.unravel_index(y, cards)) if dg)
            fams[a] = fams.get(a, 0) + 1
        assert max(fams.values()) >= 2 or len(steps) < 3, "no family got a second member"


def test_marginal_penalties_are_the_penalties():
    cards, n = (2, 3, 4, 5), 700
    r0, w = C.penalty_weights(cards, n)
    for V in [(1, 3), (0, 1, 2, 3)]:
        got = batch.marginal_penalties(cards, V, (r0, w)).reshape(-1)
        want = [C.penalty(np.unravel_index(y, cards), r0, w) for y in batch.marginal_cells(cards, V).reshape(-1)]
        assert got.tolist() == want  # the same numbers, bit for bit
        np.testing.assert_allclose(got, oracle.r_vec(cards, n)[batch.marginal_cells(cards, V).reshape(-1)], rtol=1e-13)


def test_choose_variables_follows_gains_and_cells():
    cards = (2, 3, 4, 5, 2)
    flat = lambda *d: int(np.ravel_multi_index(d, cards))  # noqa: E731
    moves = [(1.0, flat(1, 0, 0, 0, 0)), (0.9, flat(0, 0, 0, 0, 1)), (0.8, flat(0, 0, 0, 3, 0)),
             (0.3, flat(0, 2, 0, 0, 0)), (0.2, flat(0, 0, 1, 0, 0))]
    assert batch.choose_variables(cards, moves, factor=4.0, max_cells=1000) == (0, 1, 3, 4)
    assert batch.choose_variables(cards, moves, factor=2.0, max_cells=1000) == (0, 3, 4)
    # a candidate that does not fit is skipped, later ones still join
    assert batch.choose_variables(cards, moves, factor=10.0, max_cells=24) == (0, 3, 4)
    assert batch.choose_variables(cards, moves, factor=10.0, max_cells=12) == (0, 1, 4)
    # the best move alone too wide: one step (None)
    assert batch.choose_variables(cards, [(1.0, flat(0, 0, 3, 4, 1))], factor=4.0, max_cells=16) is None
    assert batch.choose_variables(cards, [], factor=4.0, max_cells=100) is None


@pytest.mark.parametrize("cards,V,U", [((2, 3, 4, 5), (0, 1, 3), (1, 3)), ((2, 2, 2, 2, 2), (0, 2, 4), (0, 4)),
                                      ((3, 2, 5), (0, 1, 2), ()), ((4, 2, 2, 3), (1, 3), (1, 3))])
def test_sub_table_of_fewer_variables_and_changed_variables(cards, V, U):
    rng = np.random.default_rng(1)
    full = rng.normal(size=math.prod(cards))
    got = batch.sub_table(cards, V, full[batch.marginal_cells(cards, V).reshape(-1)], U)
    assert got.tolist() == full[batch.marginal_cells(cards, U).reshape(-1)].tolist()
    digits = [tuple(int(x) for x in np.unravel_index(int(y), cards)) for y in batch.marginal_cells(cards, U).reshape(-1)]
    assert batch.changed_variables([(d, 0.1, 0.0) for d in digits]) == tuple(U)
    with pytest.raises(ValueError, match="not all among"):
        batch.sub_table(cards, V[:1], full[batch.marginal_cells(cards, V[:1]).reshape(-1)], V)


@pytest.mark.parametrize("cards,layout,seed,cells", [((2, 3, 4, 5), (1, 2), 0, 40), ((2, 2, 2, 2, 2, 2), (1, 3), 2, 24)])
def test_a_batch_whose_changes_keep_to_one_band_kind_is_one_pass(cards, layout, seed, cells, monkeypatch):
    """A batch over variables on both sides of the cut whose changed terms keep to one side is
    applied in one pass (the duals exact, brute force), not by a re-derivation."""
    from fsll_ooc.learn import LearnOptions, greedy, learn

    p, _ = datasets.random_bayesnet(cards, 2, seed=seed)
    X = datasets.sample_table(p, 3000, seed=100 + seed)
    Phi = oracle.phi_matrix(cards)
    size = math.prod(cards)
    eng, state = _engine(cards, X, layout)
    L = eng.layout
    spans, kept = [], []
    real = greedy.Search.batch

    def spy(self, V):  # a batch over V: did it span, and how many passes did it take?
        engine, st = self.engine, self.state
        before, n0 = engine.passes, len(st.history)
        out = real(self, V)
        changed = {i for h in st.history[n0:] for i, x in enumerate(h["y"]) if x}
        if engine.batch_pass(V) is None and engine.batch_pass(tuple(changed)) is not None:
            spans.append(engine.passes - before)
        theta = np.zeros(size)
        for y, v in st.theta.items():
            theta[y] = v
        np.testing.assert_allclose(engine.gather(np.arange(size)), Phi @ oracle.model(theta, Phi), atol=1e-10)
        kept.append(V)
        return out

    monkeypatch.setattr(greedy.Search, "batch", spy)
    learn(eng, state, LearnOptions(epsilon=1e-5, batch=batch.BatchOptions(max_cells=cells, factor=50.0)))
    assert kept and L.a > 0
    assert spans and all(n == 1 for n in spans), spans


def test_support_gains_are_the_closed_forms():
    rng = np.random.default_rng(0)
    t, d = rng.uniform(-0.99, 0.99, 200), rng.uniform(-0.99, 0.99, 200)
    theta, r = rng.normal(0.0, 1.5, 200), rng.uniform(0.0, 0.05, 200)
    t[:3] = (1.0, -1.0, 0.5)  # saturated duals stay finite
    got = batch.support_gains(t, d, theta, r)
    want = [-min(C.delta_adjust(*dt), C.delta_remove(*dt, th, rr)) for dt, th, rr in zip(zip(d[3:], t[3:]), theta[3:], r[3:])]
    np.testing.assert_allclose(got[3:], want, rtol=1e-12, atol=1e-15)
    assert np.isfinite(got).all()
    assert got[2] == pytest.approx(-min(C.delta_adjust(d[2], 0.5), C.delta_remove(d[2], 0.5, theta[2], r[2])))


def test_support_moves_join_the_batch():
    """The members whose adjust or remove gains join the batch's variables by gain, among the
    append candidates; without ``support_moves`` only the best move and the appends do."""
    from types import SimpleNamespace

    from fsll_ooc.learn.greedy import _batch_moves
    from fsll_ooc.learn.state import FitState

    cards = (2, 3, 4, 5, 2)
    flat = lambda *dg: int(np.ravel_multi_index(dg, cards))  # noqa: E731
    st = FitState(cards, 1000, 0.0, log_z=0.0)
    ya, yb, yc = flat(1, 1, 0, 0, 0), flat(0, 0, 2, 0, 1), flat(0, 0, 0, 1, 0)
    st.theta.update({ya: 0.4, yb: -0.3, yc: 0.2})
    # ya: its dual far from its target (an adjust gains); yb: at its target (nothing gains); yc: the best move
    res = SimpleNamespace(top_pos=[flat(0, 0, 0, 0, 1)], top_delta=[-0.001], supp_pos=[ya, yb, yc],
                          supp_t=[0.1, -0.2, 0.0], supp_d=[0.5, -0.2, 0.3])
    moves = list(_batch_moves(st, res, -0.05, yc))
    assert moves[0] == (0.05, yc)
    gains = dict((y, g) for g, y in moves[1:])
    assert set(gains) == {ya, flat(0, 0, 0, 0, 1)}
    assert gains[ya] == pytest.approx(-C.delta_adjust(0.5, 0.1))
    assert [g for g, _ in moves[1:]] == sorted((g for g, _ in moves[1:]), reverse=True)
    assert batch.choose_variables(cards, moves, factor=100.0, max_cells=1000) == (0, 1, 3, 4)
    only = list(_batch_moves(st, res, -0.05, yc, support_moves=False))
    assert [y for _, y in only] == [yc, flat(0, 0, 0, 0, 1)]


@pytest.mark.parametrize("layout", [(1, 2), (0, 0)])
def test_passes_counted_by_purpose(layout):
    """Every pass of a batched default-rule fit counted once, under what the learner ran it for."""
    from fsll_ooc.learn import LearnOptions, learn

    cards, n = (2, 3, 4, 5), 2000
    p, _ = datasets.random_bayesnet(cards, 2, seed=5)
    X = datasets.sample_table(p, n, seed=105)
    eng, state = _engine(cards, X, layout)
    state.penalty_code = "family"
    learn(eng, state, LearnOptions(batch=batch.BatchOptions(max_cells=20)))
    by = eng.passes_by()
    assert sum(by.values()) == eng.passes and by["other"] >= 2  # the setup pass(es) and the first scan
    assert by.get("batch", 0) + by.get("batch-span", 0) + by.get("batch-refine", 0) >= 1
    assert by.get("refine", 0) + by.get("batch-refine", 0) >= 1
    fine = eng.passes_by(3)
    assert sum(fine.values()) == eng.passes
    assert all(k.split("/")[1] in ("A", "B") for k in fine)
    if layout == (0, 0):
        assert "batch-span" not in by and all(k.split("/")[1] == "A" for k in fine)


@pytest.mark.parametrize("cards,n,seed,layout", [((2, 3, 4, 5), 3000, 0, (0, 0)), ((2, 3, 4, 5), 3000, 0, (1, 2)),
                                                 ((3, 2, 5), 4000, 3, (1, 1)), ((4, 4, 3), 3000, 2, (0, 0))])
def test_batched_search_under_the_family_code(cards, n, seed, layout):
    """The family code: the duals exact after every pass, the first step the one-step learner's,
    fewer passes than steps, and the end an axis minimum of the family cost (brute force)."""
    from fsll_ooc.learn import LearnOptions, learn

    X, Phi, q, size, vec = _bn_problem(cards, n, seed)
    eps = 1e-5

    eng, state = _engine(cards, X, layout)
    state.penalty_code = "family"
    checked = []

    def check(st):
        exact = Phi @ oracle.model(vec(st), Phi)
        np.testing.assert_allclose(eng.gather(np.arange(size)), exact, atol=1e-10)
        checked.append(st.n_iter)

    learn(eng, state, LearnOptions(epsilon=eps, batch=batch.BatchOptions(max_cells=20, factor=8.0)), callback=check)
    assert state.converged
    assert len(checked) < state.n_iter
    sizes = np.bincount([h["batch"] for h in state.history if "batch" in h])
    assert sizes.max() >= 3, "no batch of several steps ran"
    family = lambda th_: oracle.brute_cost(th_, q, Phi, cards, n, "family")  # noqa: E731
    base = oracle.assert_axis_minimum(vec(state), q, Phi, None, eps, cost_fn=family)
    assert state.cost() == pytest.approx(base, abs=1e-10)
    costs = np.array([h["cost"] for h in state.history])
    np.testing.assert_allclose(np.diff(costs), [h["delta"] for h in state.history[1:]], atol=1e-10)
    for h in state.history[1:]:  # every step gains epsilon
        assert h["delta"] < -eps
    # against the one-step learner: the same first step, and a final cost as low within 1 %
    eng1, one = _engine(cards, X, layout)
    one.penalty_code = "family"
    learn(eng1, one, LearnOptions(epsilon=eps))
    assert state.history[1]["y"] == one.history[1]["y"]
    assert state.history[1]["value"] == pytest.approx(one.history[1]["value"], abs=1e-12)
    drop = one.history[0]["cost"] - one.cost()
    assert state.cost() <= one.cost() + 0.01 * drop
    assert eng.passes < eng1.passes


def test_batched_default_fit_under_the_family_code():
    """The library's default (family code, epsilon="auto", corrective phases, the penalty
    scale chosen) with batching: an axis minimum of the (scaled) family cost by brute force."""
    from fsll_ooc import FSLL
    from fsll_ooc.learn import LearnOptions, auto_epsilon

    cards, n = (2, 3, 4, 5), 2000
    p, _ = datasets.random_bayesnet(cards, 2, seed=7)
    X = datasets.sample_table(p, n, seed=107)
    m = FSLL(cardinalities=cards, progress=False, learn_options=LearnOptions(batch=True)).fit(X)
    assert m.fit_state_.penalty_code == "family" and any("batch" in h for h in m.history_)
    Phi, q = oracle.phi_matrix(cards), oracle.target(X, cards)
    theta = np.zeros(math.prod(cards))
    for y, v in m.theta_.items():
        theta[np.ravel_multi_index(y, cards)] = v
    family = lambda th_: oracle.brute_cost(th_, q, Phi, cards, n, "family", m.penalty_scale_)  # noqa: E731
    base = oracle.assert_axis_minimum(theta, q, Phi, None, auto_epsilon(n), cost_fn=family)
    assert m.cost_ == pytest.approx(base, abs=1e-10)


def test_batch_options_validated_resolved_and_kept():
    from fsll_ooc.learn import LearnOptions

    with pytest.raises(ValueError, match="factor"):
        batch.BatchOptions(factor=0.5)
    with pytest.raises(ValueError, match="max_cells"):
        batch.BatchOptions(max_cells=0)
    with pytest.raises(ValueError, match="batch must be"):
        LearnOptions(batch="yes")
    with pytest.raises(ValueError, match="unknown batch option"):
        LearnOptions(batch={"factor": 2.0, "size": 3})
    # "auto" (the default): on for the default rule from AUTO_MIN_CELLS cells; never with a
    # numeric epsilon (epsilon=1e-4 is the paper's search), nor for smaller tables
    big, small = batch.AUTO_MIN_CELLS, batch.AUTO_MIN_CELLS - 1
    assert LearnOptions().batch == "auto"
    assert batch.resolve_batch("auto", "auto", cells=big) == batch.BatchOptions()
    assert batch.resolve_batch("auto", "auto", cells=small) is None
    assert batch.resolve_batch("auto", 1e-4, cells=2**40) is None
    assert batch.resolve_batch(None, "auto", cells=big) is None
    assert batch.resolve_batch(False, "auto", cells=big) is None
    assert batch.resolve_batch(True, 1e-4, cells=16) == batch.BatchOptions()
    o = LearnOptions(batch=batch.BatchOptions(factor=3.0, max_cells=64, support_moves=False))
    assert LearnOptions.from_json(o.to_json()) == o
    with pytest.raises(ValueError, match="support_moves"):
        batch.BatchOptions(support_moves=1)


def _engine(cards, X, layout=(0, 0), backend="numpy", store=None):
    from fsll_ooc import storage
    from fsll_ooc.engine import Engine
    from fsll_ooc.learn import FitState
    from fsll_ooc.planner import Layout

    L = Layout(tuple(cards), *layout)
    specs = [storage.create_table(backend, store, nm, cards, L.chunk_shape) for nm in ("dbar", "thetabar", "scratch")]
    N = len(X)
    flat = np.ravel_multi_index(tuple(np.asarray(X).T), cards)
    eng = Engine.create(L, specs, N, "serial", sample_flat=flat)
    _, counts = np.unique(flat, return_counts=True)
    state = FitState(tuple(cards), N, C.target_entropy(counts, N, math.prod(cards)), log_z=math.log(math.prod(cards)))
    return eng, state


@pytest.mark.parametrize("cards,n,seed,layout", [((2, 3, 4, 5), 3000, 0, (0, 0)), ((2, 3, 4, 5), 3000, 0, (1, 2)),
                                                 ((2, 2, 2, 2, 2, 2), 2000, 1, (0, 0)),
                                                 ((2, 2, 2, 2, 2, 2), 2000, 1, (2, 4)), ((3, 2, 5), 4000, 3, (1, 1))])
def test_batched_search_keeps_exact_duals_and_ends_at_an_axis_minimum(cards, n, seed, layout):
    from fsll_ooc.learn import LearnOptions, learn

    p, _ = datasets.random_bayesnet(cards, 2, seed=seed)
    X = datasets.sample_table(p, n, seed=seed + 100)
    Phi, q, r = oracle.phi_matrix(cards), oracle.target(X, cards), oracle.r_vec(cards, n)
    eng, state = _engine(cards, X, layout)
    size = math.prod(cards)
    checked = []

    def check(st):  # after every pass that brought the dual table up to date
        theta = np.zeros(size)
        for y, v in st.theta.items():
            theta[y] = v
        exact = Phi @ oracle.model(theta, Phi)
        np.testing.assert_allclose(eng.gather(np.arange(size)), exact, atol=1e-10)
        l = Phi.T @ theta
        assert st.log_z == pytest.approx(math.log(np.exp(l).sum()), abs=1e-10)
        checked.append(st.n_iter)

    eps = 1e-5
    learn(eng, state, LearnOptions(epsilon=eps, batch=batch.BatchOptions(max_cells=12, factor=8.0)), callback=check)
    assert state.converged
    sizes = np.bincount([h["batch"] for h in state.history if "batch" in h])
    assert sizes.max() >= 3, "no batch of several steps ran"
    assert len(checked) < state.n_iter  # fewer table passes than steps, each one checked
    theta = np.zeros(size)
    for y, v in state.theta.items():
        theta[y] = v
    base = oracle.assert_axis_minimum(theta, q, Phi, r, eps)
    assert base == pytest.approx(state.cost(), abs=1e-10)
    passes = [h["passes"] for h in state.history[1:]]
    assert passes == sorted(passes) and passes[-1] == eng.passes


@pytest.mark.parametrize("cards,n,seed", [((2, 3, 4, 5), 2000, 5), ((2, 2, 2, 2, 2), 1500, 6)])
def test_batched_fit_through_the_estimator(cards, n, seed, tmp_path):
    from fsll_ooc import FSLL
    from fsll_ooc.learn import LearnOptions

    p, _ = datasets.random_bayesnet(cards, 2, seed=seed)
    X = datasets.sample_table(p, n, seed=seed + 100)
    Phi, q, r = oracle.phi_matrix(cards), oracle.target(X, cards), oracle.r_vec(cards, n)
    on = LearnOptions(epsilon=1e-5, batch=True)
    m = FSLL(cardinalities=cards, epsilon=1e-5, learn_options=on, progress=False).fit(X)
    o = FSLL(cardinalities=cards, epsilon=1e-5, learn_options=on, progress=False, store=tmp_path / "s",
             backend="memmap", layout=(1, 2)).fit(X)
    for mm in (m, o):
        theta = np.zeros(math.prod(cards))
        for y, v in mm.theta_.items():
            theta[np.ravel_multi_index(y, cards)] = v
        assert oracle.assert_axis_minimum(theta, q, Phi, r, 1e-5) == pytest.approx(mm.cost_, abs=1e-10)
    assert set(o.theta_) == set(m.theta_) and o.n_iter_ == m.n_iter_
    assert any("batch" in h for h in m.history_)
    costs = np.array([h["cost"] for h in m.history_])
    np.testing.assert_allclose(np.diff(costs), [h["delta"] for h in m.history_[1:]], atol=1e-10)


def test_auto_batches_default_fits_of_large_tables_alike_in_and_out_of_core(monkeypatch, tmp_path):
    """``batch="auto"`` (the default) from the table size only: with the threshold lowered to
    this tiny table, a default fit batches, in core and out of core to the same model; a
    fit at ``epsilon=1e-4`` stays one step per pass (the paper's search, brute force).  The
    scale is fixed (``penalty_scale=1.0``): a search from the uniform model, whose appends batch."""
    from fsll_ooc import FSLL

    cards, n = (2, 3, 4, 5), 2000
    p, _ = datasets.random_bayesnet(cards, 2, seed=5)
    X = datasets.sample_table(p, n, seed=105)
    off = FSLL(cardinalities=cards, progress=False, penalty_scale=1.0).fit(X)
    assert not any("batch" in h for h in off.history_)  # 120 cells: below the threshold
    monkeypatch.setattr(batch, "AUTO_MIN_CELLS", math.prod(cards))
    m = FSLL(cardinalities=cards, progress=False, penalty_scale=1.0).fit(X)
    assert any("batch" in h for h in m.history_)
    o = FSLL(cardinalities=cards, progress=False, penalty_scale=1.0, store=tmp_path / "s", backend="memmap",
             layout=(1, 2)).fit(X)
    assert set(o.theta_) == set(m.theta_) and o.n_iter_ == m.n_iter_
    assert o.cost_ == pytest.approx(m.cost_, abs=1e-10)
    # out of core the corrective phases scan in their last re-derivation: the same phases, the same moves
    assert any(h["move"] == "refine" for h in o.history_)
    assert [h["move"] for h in o.history_] == [h["move"] for h in m.history_]
    paper = FSLL(cardinalities=cards, epsilon=1e-4, progress=False).fit(X)
    assert not any("batch" in h for h in paper.history_)
    want, costs = oracle.learn(X, cards)
    assert {int(np.ravel_multi_index(y, cards)) for y in paper.theta_} == set(np.nonzero(want)[0].tolist())
    assert paper.cost_ == pytest.approx(costs[-1], abs=1e-10)


def test_refine_scans_in_its_last_re_derivation_out_of_core(tmp_path):
    """``refine(top=...)`` on a banded store and in core (one band): the same parameters as
    without, and its ``scan`` is the scan of the final dual table (so the learner need not scan
    again)."""
    from fsll_ooc import storage
    from fsll_ooc.engine import Engine, Table
    from fsll_ooc.learn import corrective
    from fsll_ooc.learn.state import FitState
    from fsll_ooc.planner import Layout

    cards, n = (2, 3, 4, 5), 1500
    p, _ = datasets.random_bayesnet(cards, 2, seed=3)
    X = datasets.sample_table(p, n, seed=4)
    flat = np.ravel_multi_index(tuple(X.T), cards)
    size = math.prod(cards)
    Phi = oracle.phi_matrix(cards)
    sup = np.array([1, 5, 20, 33, 61, 118], np.int64)
    results = []
    for name, layout, backend, top in (("a", (1, 2), "memmap", None), ("b", (1, 2), "memmap", 8),
                                       ("c", (0, 0), "numpy", 8)):
        L = Layout(cards, *layout)
        store = None if backend == "numpy" else tmp_path / name
        specs = [storage.create_table(backend, store, t.name.lower(), cards, L.chunk_shape) for t in Table]
        eng = Engine.create(L, specs, n, "serial", sample_flat=flat)
        state = FitState(cards, n, 0.0, log_z=math.log(size))
        for y, d in zip(sup.tolist(), eng.gather(sup, table=Table.DBAR).tolist()):
            state.theta[y], state.dbar[y] = 0.0, d
        rr = corrective.refine(eng, state, tol=1e-12, top=top)
        results.append((eng, (state, rr)))
    (ea, (sa, ra)), (eb, (sb, rb)), (ec, (sc, rc)) = results
    assert ra.rounds >= 2 and ra.scan is None
    assert sb.theta == sa.theta and sb.log_z == sa.log_z and rb.rounds == ra.rounds
    assert rc.rounds == ra.rounds and sc.theta == pytest.approx(sa.theta, abs=1e-10)
    for e, r, s in ((eb, rb, sb), (ec, rc, sc)):
        plain = e.update_scan_batch([], np.fromiter(s.theta, np.int64), 8)
        assert (r.scan.pos, r.scan.t, r.scan.d) == (plain.pos, plain.t, plain.d)
        assert r.scan.best == pytest.approx(plain.best, abs=1e-15)
        assert sorted(zip(r.scan.supp_pos, r.scan.supp_t)) == sorted(zip(plain.supp_pos, plain.supp_t))
    # and the duals are the model's (brute force)
    theta = np.zeros(size)
    for y, v in sb.theta.items():
        theta[y] = v
    tb = Phi @ oracle.model(theta, Phi)
    np.testing.assert_allclose(rb.scan.supp_t[np.argsort(rb.scan.supp_pos)], tb[np.sort(rb.scan.supp_pos)],
                               atol=1e-12)


@pytest.mark.parametrize("layout", [(0, 0), (1, 2)])
def test_scans_in_re_derivations_and_joint_candidates_from_the_scan_save_passes_alone(layout, tmp_path):
    """A corrective phase's last re-derivation scans in its own pass with one band kind too, and
    out of core a joint selection takes its candidates from that scan: the same model, fewer
    passes (no scan pass after a corrective phase, no top-k pass of a joint selection right
    after one); in core it runs its own top-k pass, the same model again."""
    from fsll_ooc.learn import LearnOptions, learn

    cards, n = (2, 3, 4, 5), 2000
    p, _ = datasets.random_bayesnet(cards, 2, seed=5)
    X = datasets.sample_table(p, n, seed=105)
    runs = []
    for new, backend in ((False, "memmap"), (True, "memmap"), (True, "numpy")):
        eng, state = _engine(cards, X, layout, backend, None if backend == "numpy" else tmp_path / f"{new}")
        eng.one_band_scan_in_resync = new
        state.penalty_code = "family"
        learn(eng, state, LearnOptions(batch=batch.BatchOptions(max_cells=20, joint_in_scan=new, sweep_trials=False)))
        runs.append((eng, state))
    (e0, s0), (e1, s1), (e2, s2) = runs
    assert s1.theta == s0.theta and s1.log_z == s0.log_z and s0.converged and s1.converged
    assert s2.theta == s0.theta and s2.log_z == s0.log_z
    by0, by1, by2 = e0.passes_by(), e1.passes_by(), e2.passes_by()
    assert by0.get("joint-top", 0) >= 1 and by1.get("joint-top", 0) < by0["joint-top"]
    assert by2.get("joint-top", 0) == by0["joint-top"]  # in core: a top-k pass of its own
    if layout == (0, 0):
        assert by1["other"] < by0["other"]
    assert e1.passes < e0.passes


@pytest.mark.parametrize("cards,layout,backend", [((2, 3, 4, 5), (0, 0), "numpy"), ((2, 3, 4, 5), (1, 2), "memmap"),
                                                  ((3, 2, 5, 2), (2, 3), "memmap")])
def test_corrective_trials_as_sweeps(cards, layout, backend, tmp_path):
    """``refine(sweep=True)``: its trials read and write no table but the last round's, which is
    the one re-derivation; the same Newton rounds and parameters as trials by re-derivations
    (one kind of band: the same bits), the final dual table exact (brute force), its scan that
    of the table."""
    from fsll_ooc import storage
    from fsll_ooc.engine import Engine, Table
    from fsll_ooc.learn import corrective
    from fsll_ooc.learn.state import FitState
    from fsll_ooc.planner import Layout

    n = 1500
    p, _ = datasets.random_bayesnet(cards, 2, seed=3)
    X = datasets.sample_table(p, n, seed=4)
    flat = np.ravel_multi_index(tuple(X.T), cards)
    size = math.prod(cards)
    Phi = oracle.phi_matrix(cards)
    sup = np.array([1, 5, 20, 33, 61, 118], np.int64) % size
    out = []
    for sweep in (False, True):
        L = Layout(cards, *layout)
        store = None if backend == "numpy" else tmp_path / str(sweep)
        specs = [storage.create_table(backend, store, t.name.lower(), cards, L.chunk_shape) for t in Table]
        eng = Engine.create(L, specs, n, "serial", sample_flat=flat)
        state = FitState(cards, n, 0.0, log_z=math.log(size))
        for y, d in zip(np.unique(sup).tolist(), eng.gather(np.unique(sup), table=Table.DBAR).tolist()):
            state.theta[y], state.dbar[y] = 0.0, d
        before = eng.passes
        rr = corrective.refine(eng, state, tol=1e-12, top=8, sweep=sweep)
        out.append((eng, state, rr, eng.passes - before))
    (e0, s0, r0, p0), (e1, s1, r1, p1) = out
    assert r0.rounds >= 3 and r1.rounds == r0.rounds and r1.trials == r0.trials
    assert p1 == (1 if layout[0] == 0 else 2) < p0 and e1.sweeps == r1.trials - 1 and e0.sweeps == 0
    if layout[0] == 0:
        assert s1.theta == s0.theta and s1.log_z == s0.log_z
    assert s1.theta == pytest.approx(s0.theta, abs=1e-10) and s1.log_z == pytest.approx(s0.log_z, abs=1e-12)
    theta = np.zeros(size)
    for y, v in s1.theta.items():
        theta[y] = v
    np.testing.assert_allclose(e1.gather(np.arange(size)), Phi @ oracle.model(theta, Phi), atol=1e-12)
    assert s1.log_z == pytest.approx(math.log(np.exp(Phi.T @ theta).sum()), abs=1e-12)
    plain = e1.update_scan_batch([], np.fromiter(s1.theta, np.int64), 8)
    assert (r1.scan.pos, r1.scan.t, r1.scan.d) == (plain.pos, plain.t, plain.d)
    # write=False leaves the re-derivation to the caller: the table still that of theta = 0
    e2, s2, *_ = out[1]
    st = FitState(cards, n, 0.0, log_z=math.log(size))
    for y in s2.theta:
        st.theta[y], st.dbar[y] = 0.0, s2.dbar[y]
    e2.resync(np.fromiter(st.theta, np.int64), np.zeros(len(st.theta)), st.log_z)
    table = e2.gather(np.arange(size))
    r2 = corrective.refine(e2, st, tol=1e-12, top=8, sweep=True, write=False)
    assert r2.pending and r2.scan is None and st.theta == pytest.approx(s2.theta, abs=1e-10)
    np.testing.assert_array_equal(e2.gather(np.arange(size)), table)
    corrective.write_duals(e2, st, 8)
    np.testing.assert_allclose(e2.gather(np.arange(size)), Phi @ oracle.model(theta, Phi), atol=1e-12)


@pytest.mark.parametrize("table_current", [True, False])
@pytest.mark.parametrize("reject", ["last", "all"])
def test_corrective_rejected_re_derivation(table_current, reject):
    """With sweeps the last round's first trial is the table's re-derivation; when it is rejected
    (here its ``log Z`` is made NaN after it wrote the table) the phase goes on by sweeps and
    re-derives the table again at the end, exact (brute force) for the parameters kept, the
    cost never higher; when every trial is rejected the table is re-derived for the parameters
    the phase started from and not left to the caller (``pending`` False), also after a batch's
    steps (``table_current=False``)."""
    from fsll_ooc import storage
    from fsll_ooc.engine import Engine, Table
    from fsll_ooc.learn import corrective
    from fsll_ooc.learn.state import FitState
    from fsll_ooc.planner import Layout

    cards, n = (2, 3, 4, 5), 1500
    p, _ = datasets.random_bayesnet(cards, 2, seed=3)
    X = datasets.sample_table(p, n, seed=4)
    size = math.prod(cards)
    Phi = oracle.phi_matrix(cards)
    L = Layout(cards, 0, 0)
    specs = [storage.create_table("numpy", None, t.name.lower(), cards, L.chunk_shape) for t in Table]
    eng = Engine.create(L, specs, n, "serial", sample_flat=np.ravel_multi_index(tuple(X.T), cards))
    sup = np.array([1, 5, 20, 33, 61, 118], np.int64)
    st = FitState(cards, n, 0.0, log_z=math.log(size))
    for y, d in zip(sup.tolist(), eng.gather(sup, table=Table.DBAR).tolist()):
        st.theta[y], st.dbar[y] = (0.0 if table_current else 0.3), d
    if table_current:
        st.log_z = eng.resync(sup, np.zeros(len(sup)), st.log_z)
    start = dict(st.theta)
    real_resync_scan, real_sweep = eng.resync_scan, eng.sweep
    calls = {"rederive": 0, "sweep": 0}

    def resync_scan(*a, **k):  # writes the table, then its log Z is lost
        calls["rederive"] += 1
        lz, scan = real_resync_scan(*a, **k)
        return (math.nan if calls["rederive"] == 1 else lz), scan

    def sweep(*a, **k):
        calls["sweep"] += 1
        lz, at = real_sweep(*a, **k)
        return (math.nan if reject == "all" and (table_current or calls["sweep"] > 1) else lz), at

    eng.resync_scan, eng.sweep = resync_scan, sweep
    before = None if not table_current else st.cost()
    # (one round at most where every trial is rejected: its first trial is the re-derivation)
    rr = corrective.refine(eng, st, tol=1e-3, top=8, sweep=True, table_current=table_current,
                           max_rounds=1 if reject == "all" else 8)
    assert not rr.pending and calls["rederive"] >= 2 and rr.scan is not None
    if reject == "all":
        assert rr.rounds == 0 and st.theta == start
    else:
        assert rr.rounds >= 1 and rr.delta < 0
        if before is not None:
            assert st.cost() < before
    theta = np.zeros(size)
    for y, v in st.theta.items():
        theta[y] = v
    np.testing.assert_allclose(eng.gather(np.arange(size)), Phi @ oracle.model(theta, Phi), atol=1e-12)
    assert st.log_z == pytest.approx(math.log(np.exp(Phi.T @ theta).sum()), abs=1e-12)


@pytest.mark.parametrize("cards,n,seed,layout", [((2, 3, 4, 5), 3000, 0, (1, 2)), ((3, 2, 5, 2), 4000, 3, (2, 3)),
                                                 ((2, 2, 2, 2, 2, 2), 3000, 1, (2, 4)), ((2, 3, 4, 5), 3000, 0, (0, 0))])
def test_corrective_phase_after_every_batch(cards, n, seed, layout):
    """After its steps a batch runs a corrective phase by sweeps, and one re-derivation of the
    phase's result brings the table up to date: the duals exact after it (brute force), the
    cost monotone, the end an axis minimum of the family cost (as without the phase)."""
    from fsll_ooc.learn import LearnOptions, learn

    X, Phi, q, size, vec = _bn_problem(cards, n, seed)
    eps = 1e-5

    runs = []
    for inside in (False, True):
        eng, state = _engine(cards, X, layout)
        state.penalty_code = "family"

        def check(st, eng=eng):
            np.testing.assert_allclose(eng.gather(np.arange(size)), Phi @ oracle.model(vec(st), Phi), atol=1e-10)
            assert st.log_z == pytest.approx(math.log(np.exp(Phi.T @ vec(st)).sum()), abs=1e-10)

        opts = batch.BatchOptions(max_cells=20, factor=8.0, refine_in_batch=inside)
        learn(eng, state, LearnOptions(epsilon=eps, refine="adjust", batch=opts), callback=check)
        assert state.converged
        costs = np.array([h["cost"] for h in state.history])
        np.testing.assert_allclose(np.diff(costs), [h["delta"] for h in state.history[1:]], atol=1e-10)
        assert np.all(np.diff(costs) <= 1e-12)
        family = lambda th_: oracle.brute_cost(th_, q, Phi, cards, n, "family")  # noqa: E731
        base = oracle.assert_axis_minimum(vec(state), q, Phi, None, eps, cost_fn=family)
        assert state.cost() == pytest.approx(base, abs=1e-10)
        runs.append((eng, state))
    (e0, s0), (e1, s1) = runs
    assert any("in_batch" in h for h in s1.history) and not any("in_batch" in h for h in s0.history)
    assert e1.sweeps > 0


@pytest.mark.parametrize("scan_in_resync", [True, False])
def test_corrective_phase_in_a_batch_without_a_scan_in_its_re_derivation(scan_in_resync, monkeypatch):
    """Where a re-derivation does not scan (``Engine.one_band_scan_in_resync = False``), a batch
    whose corrective phase moved the parameters scans the re-derived table itself: the same
    fit as with the scan inside the re-derivation, ending at an axis minimum."""
    from fsll_ooc.engine import Engine
    from fsll_ooc.learn import LearnOptions, learn

    monkeypatch.setattr(Engine, "one_band_scan_in_resync", scan_in_resync)
    cards, n, seed = (2, 3, 4, 5), 3000, 0
    X, Phi, q, size, vec = _bn_problem(cards, n, seed)
    eng, state = _engine(cards, X, (0, 0))
    state.penalty_code = "family"
    opts = batch.BatchOptions(max_cells=20, factor=8.0, refine_in_batch=True)
    learn(eng, state, LearnOptions(epsilon=1e-5, refine="adjust", batch=opts))
    assert state.converged and any("in_batch" in h for h in state.history)
    family = lambda th_: oracle.brute_cost(th_, q, Phi, cards, n, "family")  # noqa: E731
    assert state.cost() == pytest.approx(oracle.assert_axis_minimum(vec(state), q, Phi, None, 1e-5, cost_fn=family),
                                         abs=1e-10)
    np.testing.assert_allclose(eng.gather(np.arange(size)), Phi @ oracle.model(vec(state), Phi), atol=1e-10)


def test_a_batch_that_takes_no_step_falls_back_to_one_step(monkeypatch):
    """A sub-table search that takes no step changes nothing and costs no pass; the search then
    takes the best move alone, so it cannot repeat the same batch for ever, and it ends at an
    axis minimum as without batches."""
    from fsll_ooc.learn import LearnOptions, greedy, learn

    cards, n, seed = (2, 3, 4, 5), 3000, 0
    X, Phi, q, size, vec = _bn_problem(cards, n, seed)
    calls = []

    def no_step(*a, **k):
        calls.append(1)
        return iter(())

    monkeypatch.setattr(greedy.B, "search_marginal", no_step)
    eng, state = _engine(cards, X, (0, 0))
    learn(eng, state, LearnOptions(epsilon=1e-5, batch=batch.BatchOptions(max_cells=20, factor=8.0)))
    assert state.converged and calls
    assert not any("batch" in h for h in state.history)
    assert len(state.history) - 1 == state.n_iter  # every iteration one single step
    r = oracle.r_vec(cards, n)
    assert state.cost() == pytest.approx(oracle.assert_axis_minimum(vec(state), q, Phi, r, 1e-5), abs=1e-10)
    np.testing.assert_allclose(eng.gather(np.arange(size)), Phi @ oracle.model(vec(state), Phi), atol=1e-10)


def _tail_rule_fits(monkeypatch, cards, X, factors, **kw):
    """``{factor: (theta, cost, history moves, rule joints)}`` of fits with
    ``corrective.JOINT_TAIL_FACTOR`` at each factor; rule joints: the joint selections
    :meth:`Search.joint_due` started."""
    from fsll_ooc import FSLL
    from fsll_ooc.learn import corrective, greedy

    out = {}
    due = greedy.Search.joint_due
    for f in factors:
        fired = []

        def counted(self):
            d = due(self)
            fired.append(d)
            return d

        monkeypatch.setattr(corrective, "JOINT_TAIL_FACTOR", f)
        monkeypatch.setattr(greedy.Search, "joint_due", counted)
        m = FSLL(cardinalities=cards, progress=False, **kw).fit(X)
        out[f] = (dict(m.theta_), m.cost_, [h["move"] for h in m.history_], sum(fired), m)
    monkeypatch.setattr(greedy.Search, "joint_due", due)
    return out


def test_tail_rule_acts_in_batched_fits_with_joint_selections_only(monkeypatch):
    """``JOINT_TAIL_FACTOR`` (a joint selection when the last batch gained less per table
    operation than the last selection): a fit one step per pass (the default below
    ``AUTO_MIN_CELLS``, the paper's rule), a batched fit without joint selections and one
    without corrective phases are the same, bit for bit, with the rule at its extreme (0: a
    selection after every batch once one has paid) and off, and it never fires there."""
    from fsll_ooc.learn import LearnOptions

    cards = (2, 3, 4, 5)
    p, _ = datasets.random_bayesnet(cards, 2, seed=7)
    X = datasets.sample_table(p, 2000, seed=107)
    opts = batch.BatchOptions(max_cells=20, factor=8.0)
    for kw in ({}, {"epsilon": 1e-4}, {"learn_options": LearnOptions(batch=opts, joint=False)},
               {"epsilon": 1e-5, "refine": False,
                "learn_options": LearnOptions(epsilon=1e-5, batch=opts, refine=False)}):
        runs = _tail_rule_fits(monkeypatch, cards, X, (None, 0.0), **kw)
        assert runs[0.0][3] == 0 and runs[None][3] == 0
        assert runs[0.0][:3] == runs[None][:3]


def test_tail_rule_starts_joint_selections_and_ends_at_an_axis_minimum(monkeypatch):
    """In a batched fit with joint selections the rule at its extreme (0) starts a selection
    after every batch once one has paid (here: as if one had from the start), which changes
    the search's path; the fit still ends where no single move gains epsilon (an axis minimum
    of the family cost, brute force), with the duals exact throughout."""
    from fsll_ooc.learn import LearnOptions, corrective, greedy, learn

    cards, n = (3, 2, 5, 2), 4000
    X, Phi, q, size, vec = _bn_problem(cards, n, 3)
    eps = 1e-5
    due, init = greedy.Search.joint_due, greedy.Search.__init__

    def paid(self, *a, **k):
        init(self, *a, **k)
        self.joint_rate = 1.0

    monkeypatch.setattr(greedy.Search, "__init__", paid)
    runs = {}
    for f in (None, 0.0):
        fired = []

        def counted(self):
            fired.append(due(self))
            return fired[-1]

        monkeypatch.setattr(corrective, "JOINT_TAIL_FACTOR", f)
        monkeypatch.setattr(greedy.Search, "joint_due", counted)
        eng, state = _engine(cards, X, (1, 2))
        state.penalty_code = "family"

        def check(st, eng=eng):
            np.testing.assert_allclose(eng.gather(np.arange(size)), Phi @ oracle.model(vec(st), Phi), atol=1e-10)
            assert st.log_z == pytest.approx(math.log(np.exp(Phi.T @ vec(st)).sum()), abs=1e-10)

        opts = batch.BatchOptions(max_cells=20, factor=8.0)
        learn(eng, state, LearnOptions(epsilon=eps, refine="adjust", batch=opts), callback=check)
        assert state.converged
        family = lambda th_: oracle.brute_cost(th_, q, Phi, cards, n, "family")  # noqa: E731
        assert state.cost() == pytest.approx(oracle.assert_axis_minimum(vec(state), q, Phi, None, eps, cost_fn=family),
                                             abs=1e-10)
        runs[f] = (sum(fired), [h["move"] for h in state.history])
    assert runs[None][0] == 0 and runs[0.0][0] > 0
    assert runs[0.0][1] != runs[None][1] and "joint-append" in runs[0.0][1]


@pytest.mark.parametrize("backend, layout", [("numpy", None), ("memmap", (1, 2))])
def test_gather_marginal_is_the_gather_of_the_marginal_cells(tmp_path, backend, layout):
    """batch.gather_marginal (a batch's sub-table: in core a copy of the table's slice) reads what a
    gather of marginal_cells reads, for both tables, in core and out of core, as a fresh array."""
    from fsll_ooc import storage
    from fsll_ooc.engine import Engine, Table
    from fsll_ooc.planner import Layout

    cards = (2, 3, 4, 5)
    L = Layout(cards, *(layout or (0, len(cards))))
    path = None if backend == "numpy" else str(tmp_path)
    specs = [storage.create_table(backend, path, nm, cards, L.chunk_shape) for nm in ("dbar", "thetabar", "scratch")]
    rng = np.random.default_rng(2)
    eng = Engine.create(L, specs, 400, "serial", sample_flat=rng.integers(0, math.prod(cards), 400))
    assert (eng.table_array(Table.DBAR) is None) == (backend != "numpy")
    for V in [(3, 1), (2, 0, 3), (1, 1)]:  # as marginal_cells: ascending and distinct, or refused
        with pytest.raises(ValueError, match="sorted and distinct"):
            batch.gather_marginal(eng, cards, V)
    for V in [(0,), (1, 3), (0, 2, 3), (0, 1, 2, 3)]:
        for table in (Table.THETABAR, Table.DBAR):
            want = eng.gather(batch.marginal_cells(cards, V).reshape(-1), table)
            got = batch.gather_marginal(eng, cards, V, table)
            assert got.dtype == np.float64 and got.flags.c_contiguous and got.tolist() == want.tolist()
            got[:] = 2.0
            assert eng.gather(batch.marginal_cells(cards, V).reshape(-1), table).tolist() == want.tolist()
