"""Fully corrective steps and the data-derived stopping rule, against brute force."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fsll_ooc import FSLL, basis, datasets
from fsll_ooc.engine import Table
from fsll_ooc.learn import corrective
from fsll_ooc.learn import AUTO_C, auto_epsilon, resolve_epsilon, resolve_refine

import oracle


def _data(cards, n, seed, n_parents=2):
    p, _ = datasets.random_bayesnet(cards, n_parents, seed=seed)
    return datasets.sample_table(p, n, seed=seed + 100), p


def _theta_vec(m, cards):
    theta = np.zeros(math.prod(cards))
    for y, v in m.theta_.items():
        theta[np.ravel_multi_index(y, cards)] = v
    return theta


CASES = [((2, 3, 4, 5), 400, 0), ((3, 2, 5), 2000, 1), ((4, 2, 2, 3), 800, 2), ((3, 3, 2, 4, 2), 5000, 11)]


def test_pair_products_match_dense_basis_products():
    cards = (2, 3, 4, 5, 6)
    rng = np.random.default_rng(0)
    a = np.stack([rng.integers(0, k, 300) for k in cards], axis=1)
    b = np.stack([rng.integers(0, k, 300) for k in cards], axis=1)
    pair, flat, coef = corrective.pair_products(cards, a, b)
    states = np.stack(np.unravel_index(np.arange(math.prod(cards)), cards), axis=1)
    for j in range(len(a)):
        want = np.ones(len(states))
        for i, k in enumerate(cards):
            want *= basis.phi_values(k, a[j, i], states[:, i]) * basis.phi_values(k, b[j, i], states[:, i])
        got = np.zeros(len(states))
        for f, c in zip(flat[pair == j], coef[pair == j]):
            y = np.unravel_index(f, cards)
            phi = np.ones(len(states))
            for i, k in enumerate(cards):
                phi *= basis.phi_values(k, y[i], states[:, i])
            got += c * phi
        np.testing.assert_array_equal(got, want)


def test_auto_epsilon_and_option_resolution():
    assert auto_epsilon(1000) == pytest.approx(AUTO_C / 1000)
    assert resolve_epsilon("auto", 10**5) == pytest.approx(AUTO_C * 1e-5)
    assert resolve_epsilon(1e-4, 10) == 1e-4
    assert resolve_refine(None, 1e-4) == "off" and resolve_refine(None, "auto") == "adjust"
    assert resolve_refine(True, 1e-4) == "adjust" and resolve_refine(False, "auto") == "off"
    for bad in ("fast", 0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            resolve_epsilon(bad, 100)
    with pytest.raises(ValueError, match="refine"):
        FSLL(refine="sometimes", progress=False).fit(np.array([[0, 1], [1, 0]]))
    with pytest.raises(ValueError, match="epsilon"):
        FSLL(epsilon="fast", progress=False).fit(np.array([[0, 1], [1, 0]]))


@pytest.mark.parametrize("refine", ["adjust", "final"])
@pytest.mark.parametrize("cards,n,seed", CASES)
def test_corrective_fit_is_an_axis_minimum_of_the_same_cost(cards, n, seed, refine):
    X, _ = _data(cards, n, seed)
    # the paper's cost (the family code's axis minimum: test_penalty.py)
    m = FSLL(cardinalities=cards, epsilon="auto", refine=refine, penalty="paper", penalty_scale=1.0,
             progress=False).fit(X)
    eps = auto_epsilon(n)
    Phi = oracle.phi_matrix(cards)
    q = oracle.target(X, cards)
    r = oracle.r_vec(cards, n)
    theta = _theta_vec(m, cards)
    base = oracle.assert_axis_minimum(theta, q, Phi, r, eps)  # no append, adjust or remove gains epsilon
    assert base == pytest.approx(m.cost_, abs=1e-10)
    # the support is jointly converged: the Newton decrement of KL on it is below epsilon
    S = np.nonzero(theta)[0]
    p = oracle.model(theta, Phi)
    g = Phi[S] @ p - Phi[S] @ q
    H = (Phi[S] * p) @ Phi[S].T - np.outer(Phi[S] @ p, Phi[S] @ p)
    assert 0.5 * g @ np.linalg.solve(H, g) < eps
    # and it is no worse than the paper's greedy search
    paper = FSLL(cardinalities=cards, epsilon=1e-4, progress=False).fit(X)
    assert m.cost_ <= paper.cost_ + 1e-12 or eps > 1e-4


@pytest.mark.parametrize("cards,n,seed", CASES[:3])
def test_corrective_history_monotone_and_consistent(cards, n, seed):
    X, _ = _data(cards, n, seed, n_parents=3)
    m = FSLL(cardinalities=cards, epsilon=1e-6, refine=True, progress=False).fit(X)
    costs = np.array([h["cost"] for h in m.history_])
    assert len(costs) == m.n_iter_ + 1
    assert np.all(np.diff(costs) <= 1e-12)
    np.testing.assert_allclose(np.diff(costs), [h["delta"] for h in m.history_[1:]], atol=1e-10)
    assert costs[-1] == pytest.approx(m.cost_)
    moves = {h["move"] for h in m.history_}
    assert "refine" in moves
    for h in m.history_:
        if h["move"] in ("refine", "joint-append"):
            assert h["delta"] < 0
        if h["move"] == "joint-append":
            assert h["value"] == len(h["added"]) >= 1 and -h["delta"] >= 1e-6
    assert m.n_bases_ == len(m.theta_) == m.history_[-1]["n_bases"]
    # the reported cost is that of the reported parameters (exact, from scratch)
    Phi = oracle.phi_matrix(cards)
    want = oracle.cost(_theta_vec(m, cards), oracle.target(X, cards), Phi, oracle.r_vec(cards, n))
    assert m.cost_ == pytest.approx(want, abs=1e-10)


def test_paper_setting_unchanged_by_the_new_options():
    cards, n, seed = CASES[0]
    X, _ = _data(cards, n, seed)
    want, costs = oracle.learn(X, cards)
    for kw in ({}, {"refine": None}, {"refine": False}):
        m = FSLL(cardinalities=cards, epsilon=1e-4, progress=False, **kw).fit(X)
        flat = {int(np.ravel_multi_index(y, cards)): v for y, v in m.theta_.items()}
        assert set(flat) == set(np.nonzero(want)[0].tolist())
        assert m.cost_ == pytest.approx(costs[-1], abs=1e-10)
        assert all(h["move"] in ("init", "append", "adjust", "remove") for h in m.history_)


def test_refine_reaches_the_support_optimum_and_never_raises_cost():
    cards = (3, 4, 2, 5)
    X, _ = _data(cards, 3000, 4, n_parents=3)
    m = FSLL(cardinalities=cards, epsilon=1e-3, progress=False).fit(X)  # a coarse greedy fit
    st, eng = m.fit_state_, m.engine_
    before = st.cost()
    rr = corrective.refine(eng, st, tol=1e-14, max_rounds=30)
    assert rr.rounds >= 1 and rr.delta < 0 and st.cost() == pytest.approx(before + rr.delta, abs=1e-12)
    Phi = oracle.phi_matrix(cards)
    q = oracle.target(X, cards)
    theta = np.zeros(len(q))
    for y, v in st.theta.items():
        theta[y] = v
    p = oracle.model(theta, Phi)
    S = np.array(sorted(st.theta))
    np.testing.assert_allclose(Phi[S] @ p, Phi[S] @ q, atol=1e-6)  # gradient thetabar - dbar = 0
    np.testing.assert_allclose(eng.ctx.spec(Table.THETABAR).array.reshape(-1), Phi @ p, atol=1e-12)  # exact duals
    assert st.log_z == pytest.approx(np.log(np.exp(Phi.T @ theta).sum()), abs=1e-12)
    again = corrective.refine(eng, st, tol=1e-14, max_rounds=5)  # at the optimum: nothing to do
    assert again.delta >= -1e-12


def test_top_candidates_match_dense_scores():
    cards = (2, 3, 4, 5)
    X, _ = _data(cards, 500, 8)
    m = FSLL(cardinalities=cards, epsilon=1e-3, progress=False).fit(X)
    eng = m.engine_
    t = eng.ctx.spec(Table.THETABAR).array.reshape(-1)
    d = eng.ctx.spec(Table.DBAR).array.reshape(-1)
    r = oracle.r_vec(cards, 500)
    score = r - (t - d) ** 2 / (2 * (1 - t * t))
    score[0] = np.inf
    flat, got = eng.top_candidates(10)
    want = np.lexsort((np.arange(len(score)), score))[:10]
    np.testing.assert_array_equal(flat, want)
    np.testing.assert_allclose(got, score[want], rtol=1e-12)
    np.testing.assert_allclose(eng.gather(np.array([5, 0, 77, 5])), t[[5, 0, 77, 5]])


def _axes(cards, flat):
    return frozenset(np.nonzero(np.unravel_index(flat, cards))[0].tolist())


def test_closure_candidates_are_the_unused_terms_on_the_supports_variable_sets():
    cards = (3, 2, 4, 5)
    size = math.prod(cards)
    support = np.array([np.ravel_multi_index(y, cards) for y in [(1, 0, 2, 0), (0, 1, 0, 0), (2, 0, 3, 0)]])
    sets = [_axes(cards, y) for y in support]
    want = {y for y in range(1, size) if y not in support and any(_axes(cards, y) <= a for a in sets)}
    got = corrective.closure_candidates(cards, support, limit=1000)
    assert len(got) == len(set(got.tolist())) and set(got.tolist()) == want  # 3*4 - 1 - 2 and 2 - 1 - 1
    part = corrective.closure_candidates(cards, support, limit=5)
    assert len(part) == 5 and set(part.tolist()) <= want
    assert len(corrective.closure_candidates(cards, support[:0], limit=10)) == 0


def test_joint_selection_from_closure_candidates_lowers_the_exact_cost():
    """Family data (a 5-valued child of a 3- and a 4-valued parent): from a coarse greedy
    support, the closure candidates alone (no top-k list) yield a joint move that lowers
    the exact cost by at least epsilon and appends only terms on the support's variable sets."""
    cards = (3, 4, 5)
    p, _ = datasets.random_bayesnet(cards, 2, seed=5)
    n = 20000
    X = datasets.sample_table(p, n, seed=6)
    m = FSLL(cardinalities=cards, epsilon=3e-3, refine="final", progress=False).fit(X)
    st, eng = m.fit_state_, m.engine_
    support = np.array(list(st.theta), dtype=np.int64)
    sets = [_axes(cards, y) for y in support]
    eps = auto_epsilon(n)
    before = st.cost()
    ja = corrective.joint_append(eng, st, epsilon=eps, tol=0.1 * eps, n_candidates=0, n_closure=500)
    assert ja.added and ja.candidates > 0
    assert all(any(_axes(cards, a) <= s for s in sets) and a not in support for a in ja.added)
    Phi = oracle.phi_matrix(cards)
    theta = np.zeros(math.prod(cards))
    for y, v in st.theta.items():
        theta[y] = v
    exact = oracle.cost(theta, oracle.target(X, cards), Phi, oracle.r_vec(cards, n))
    assert exact == pytest.approx(st.cost(), abs=1e-10) and exact <= before - eps
    np.testing.assert_allclose(eng.ctx.spec(Table.THETABAR).array.reshape(-1), Phi @ oracle.model(theta, Phi), atol=1e-12)


def test_joint_selection_bounds_the_candidate_support_pairs(monkeypatch):
    cards = (3, 4, 5)
    p, _ = datasets.random_bayesnet(cards, 2, seed=5)
    X = datasets.sample_table(p, 20000, seed=6)
    m = FSLL(cardinalities=cards, epsilon=3e-3, refine="final", progress=False).fit(X)
    st, eng = m.fit_state_, m.engine_
    size = len(st.theta)
    monkeypatch.setattr(corrective, "MAX_CROSS_PAIRS", 10 * size)
    ja = corrective.joint_append(eng, st, epsilon=1.0, tol=1e-5, n_candidates=4, n_closure=500)
    assert ja.candidates * size <= 10 * size and ja.candidates >= 4 and not ja.added
    assert len(st.theta) == size  # nothing accepted (epsilon = 1 nat), the state restored


def _closure_fit():
    cards = (3, 4, 5)
    p, _ = datasets.random_bayesnet(cards, 2, seed=5)
    X = datasets.sample_table(p, 20000, seed=6)
    m = FSLL(cardinalities=cards, epsilon=3e-3, refine="final", progress=False).fit(X)
    return cards, X, m.fit_state_, m.engine_


def test_joint_selection_in_a_batched_fit_leaves_out_candidates_in_the_support_span(monkeypatch):
    """With its refinement by sweeps (a batched fit) a joint selection does not pick a candidate
    whose variance given the support and the earlier picks is below ``JOINT_MIN_SCHUR`` of its
    own; one step per pass it picks as before."""
    picks = {}
    for sweep, limit in ((False, 1.0), (True, 0.0), (True, 1e-4), (True, 1.0)):
        cards, X, st, eng = _closure_fit()
        monkeypatch.setattr(corrective, "JOINT_MIN_SCHUR", limit)
        eps = auto_epsilon(len(X))
        before = dict(st.theta)
        ja = corrective.joint_append(eng, st, epsilon=eps, tol=0.1 * eps, n_candidates=0, n_closure=500, sweep=sweep,
                                     top=8)
        picks[sweep, limit] = (ja.added, ja.gains, ja.estimate)
        if sweep and limit == 1.0:  # every Schur complement is at most the variance: nothing is picked
            assert not ja.added and ja.estimate == 0.0 and st.theta == before
    assert picks[False, 1.0][0] and picks[False, 1.0] == picks[True, 0.0]
    assert picks[True, 1e-4][0]


def test_joint_selection_that_settles_early_leaves_an_exact_table(monkeypatch):
    """A joint selection in a batched fit predicted to gain more than ``JOINT_SETTLE_GAIN``
    epsilons ends its refinement at the first round predicted to be the last: the cost still
    falls by at least epsilon, the table is exact for the parameters kept, and it takes fewer
    rounds and passes than converging (here one of each)."""
    runs = {}
    for settle in (None, 0.0):
        cards, X, st, eng = _closure_fit()
        monkeypatch.setattr(corrective, "JOINT_SETTLE_GAIN", settle)
        eps = auto_epsilon(len(X))
        before, passes = st.cost(), eng.passes
        ja = corrective.joint_append(eng, st, epsilon=eps, tol=0.1 * eps, n_candidates=0, n_closure=500, sweep=True,
                                     top=8)
        assert ja.added and ja.refine.rounds >= 1
        Phi = oracle.phi_matrix(cards)
        theta = np.zeros(math.prod(cards))
        for y, v in st.theta.items():
            theta[y] = v
        exact = oracle.cost(theta, oracle.target(X, cards), Phi, oracle.r_vec(cards, len(X)))
        assert exact == pytest.approx(st.cost(), abs=1e-10) and exact <= before - eps
        np.testing.assert_allclose(eng.ctx.spec(Table.THETABAR).array.reshape(-1), Phi @ oracle.model(theta, Phi),
                                   atol=1e-12)
        runs[settle] = (ja.added, ja.refine.rounds, eng.passes - passes)
    assert runs[0.0][0] == runs[None][0]
    assert runs[0.0][1] < runs[None][1] and runs[0.0][2] < runs[None][2]


def test_candidate_order_expands_each_pair_as_a_products_cache_would():
    """The joint selection reads its candidates' pairs one column at a time; each pair keeps
    the member order a :class:`Products` cache kept across selections gives it (the order of
    a pair's terms, so its sum keeps its bits), through lists that keep, drop and re-admit members."""
    rng = np.random.default_rng(3)
    cache, order = corrective.Products((3, 4, 5)), corrective.CandidateOrder()
    pool = np.arange(1, 60)
    for step in range(8):
        flat = rng.permutation(pool)[:rng.integers(5, 25)] if step != 4 else cache.support[::-1].copy()
        cache.update(flat)
        order.update(flat)
        first = {(int(cache.support[i]), int(cache.support[j])) for i, j in zip(cache.I, cache.J)}
        ia, ib = order.all_pairs()
        assert {(int(flat[i]), int(flat[j])) for i, j in zip(ia, ib)} == first
        for c in range(len(flat)):
            ia, ib = order.pairs_with(c)
            assert np.array_equal(np.minimum(ia, ib), np.minimum(np.arange(len(flat)), c))
            assert all((int(flat[i]), int(flat[j])) in first for i, j in zip(ia, ib))


def test_joint_selection_reads_the_same_numbers_column_by_column(monkeypatch):
    """In core the candidates' moment matrix is read for the picks' columns only; out of core
    the whole matrix in one gather: the same picks, predicted gains and parameters, bit for
    bit, over two selections in a row sharing one candidate order."""
    cards = (3, 4, 5)
    p, _ = datasets.random_bayesnet(cards, 2, seed=5)
    X = datasets.sample_table(p, 20000, seed=6)
    eps = auto_epsilon(len(X))
    runs = []
    for whole in (False, True):
        m = FSLL(cardinalities=cards, epsilon=3e-3, refine="final", progress=False).fit(X)
        st, eng = m.fit_state_, m.engine_
        if whole:
            monkeypatch.setattr(type(eng), "out_of_core", property(lambda self: True))
        order, got = corrective.CandidateOrder(), []
        for _ in range(2):
            ja = corrective.joint_append(eng, st, epsilon=eps, tol=0.1 * eps, n_candidates=8, n_closure=500,
                                         cand_order=order)
            got.append((ja.added, ja.gains, ja.estimate, dict(st.theta), st.log_z))
        monkeypatch.undo()
        runs.append(got)
    assert runs[0][0][0] and runs[0] == runs[1]


@pytest.mark.parametrize("backend,layout", [("zarr", (1, 2)), ("memmap", (2, 4)), ("numpy", (1, 3))])
def test_out_of_core_corrective_fit_equals_in_core(tmp_path, backend, layout):
    cards = (2, 3, 4, 5, 2, 3)
    X, _ = _data(cards, 3000, 3)
    ref = FSLL(epsilon="auto", progress=False).fit(X)
    assert {h["move"] for h in ref.history_} & {"refine", "joint-append"}
    store = None if backend == "numpy" else tmp_path / "s"
    m = FSLL(epsilon="auto", store=store, backend=backend, layout=layout, progress=False).fit(X)
    assert set(m.theta_) == set(ref.theta_)
    for y, v in ref.theta_.items():
        assert m.theta_[y] == pytest.approx(v, abs=1e-9)
    assert m.n_iter_ == ref.n_iter_
    assert [h["move"] for h in m.history_] == [h["move"] for h in ref.history_]
    assert m.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    np.testing.assert_allclose(np.asarray(m.probabilities()), ref.probabilities(), atol=1e-12)


def test_default_store_out_of_core_matches(tmp_path):
    cards = (2, 3, 4, 5, 2, 3)
    X, _ = _data(cards, 3000, 3)
    ref = FSLL(progress=False).fit(X)  # the default: epsilon="auto", corrective steps
    assert {h["move"] for h in ref.history_} >= {"refine", "joint-append"}
    m = FSLL(store=tmp_path / "s", layout=(1, 2), progress=False).fit(X)
    assert m.theta_.keys() == ref.theta_.keys()
    assert m.cost_ == pytest.approx(ref.cost_, abs=1e-10)


def test_corrective_fit_beats_paper_on_a_potts_grid():
    p = datasets.potts_grid(2, 3, [3, 4, 5, 3, 4, 5], coupling=0.8)
    X = datasets.sample_table(p, 20000, seed=0)
    paper = FSLL(epsilon=1e-4, progress=False).fit(X)
    # the same cost (the paper's code at its full weight), a better search
    new = FSLL(epsilon="auto", penalty="paper", penalty_scale=1.0, progress=False).fit(X)
    assert new.cost_ < paper.cost_
    family = FSLL(penalty_scale=1.0, progress=False).fit(X)  # the family code in place of the paper's
    assert datasets.kl_divergence(p, new.probabilities()) < datasets.kl_divergence(p, paper.probabilities())
    # a whole interaction of many-valued variables is affordable under the family code
    assert datasets.kl_divergence(p, family.probabilities()) < datasets.kl_divergence(p, new.probabilities())


def _phases_of_fit(monkeypatch, cards, X, **kw):
    """``(theta, calls)`` of a default fit: ``calls`` holds each corrective phase's ``(purpose,
    leave, first_step)``."""
    calls = []
    real = corrective.refine

    def refine(engine, state, **k):
        calls.append((engine.purpose, k.get("leave"), k.get("first_step")))
        return real(engine, state, **k)

    monkeypatch.setattr(corrective, "refine", refine)
    m = FSLL(cardinalities=cards, progress=False, **kw).fit(X)
    monkeypatch.setattr(corrective, "refine", real)
    return dict(m.theta_), calls


def test_batched_fit_rules_only_in_batched_fits(monkeypatch):
    """``BATCH_SETTLE_GAIN`` and ``FIRST_ROUND_MAX_STEP`` act in batched fits only: a default fit
    below ``AUTO_MIN_CELLS`` (one step per pass) is the same, bit for bit, with the rules at
    extremes (every batch settles, a first round moves a parameter by at most 1e-3) and off,
    and none of its phases is given either; the same table fitted with batches hands them to
    its phases (a batch's phase settles, every phase's first round limited) and its model
    moves with them."""
    from fsll_ooc.learn import LearnOptions

    cards = (2, 3, 4, 5)
    p, _ = datasets.random_bayesnet(cards, 2, seed=7)
    X = datasets.sample_table(p, 2000, seed=107)
    runs = {}
    for batched in (False, True):
        kw = {"learn_options": LearnOptions(batch=True)} if batched else {}
        for rules in ((None, None), (0.0, 1e-3)):
            monkeypatch.setattr(corrective, "BATCH_SETTLE_GAIN", rules[0])
            monkeypatch.setattr(corrective, "FIRST_ROUND_MAX_STEP", rules[1])
            runs[batched, rules] = _phases_of_fit(monkeypatch, cards, X, **kw)
    theta, calls = runs[False, (0.0, 1e-3)]
    assert calls and theta == runs[False, (None, None)][0]
    assert all(leave is None and first is None for _, leave, first in calls)
    theta, calls = runs[True, (0.0, 1e-3)]
    assert any(purpose == "batch-refine" for purpose, _, _ in calls)
    assert all(first == 1e-3 for _, _, first in calls)
    assert all(leave == math.inf for purpose, leave, _ in calls if purpose == "batch-refine")
    assert theta != runs[True, (None, None)][0]
    calls = runs[True, (None, None)][1]  # (a large joint selection settles by its own rule)
    assert all(first is None for _, _, first in calls)
    assert all(leave is None for purpose, leave, _ in calls if purpose == "batch-refine")


def test_first_round_limit_of_a_corrective_phase():
    """``refine(first_step=...)``: the first round moves no parameter by more than that (the
    later ones by at most ``max_step``), the cost still falls and the table is exact for the
    parameters kept (brute force); without it the same first round moves further."""
    cards, X, st0, eng0 = _closure_fit()
    moves = {}
    for first in (None, 0.05):
        cards, X, st, eng = _closure_fit()
        for y in list(st.theta)[:: 2]:  # half the support back to 0: far from the optimum
            st.theta[y] = 0.0
        sup = np.fromiter(st.theta, np.int64)
        st.log_z = eng.resync(sup, np.fromiter(st.theta.values(), np.float64), st.log_z)
        start, before = dict(st.theta), st.cost()
        rr = corrective.refine(eng, st, tol=1e-12, max_rounds=1, top=8, sweep=True, first_step=first)
        assert rr.rounds == 1 and st.cost() < before
        moves[first] = max(abs(st.theta[y] - start[y]) for y in start)
        Phi = oracle.phi_matrix(cards)
        theta = np.zeros(math.prod(cards))
        for y, v in st.theta.items():
            theta[y] = v
        np.testing.assert_allclose(eng.ctx.spec(Table.THETABAR).array.reshape(-1), Phi @ oracle.model(theta, Phi),
                                   atol=1e-12)
    assert moves[0.05] <= 0.05 + 1e-12 < moves[None]
