"""The learner against brute force on tiny mixed-cardinality problems."""
from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from fsll_ooc import FSLL, basis, cost as C, datasets, fitting
from fsll_ooc.learn import FitState, LearnOptions, learn, resolve_epsilon
from fsll_ooc.engine import Table

import oracle


def _data(cards, n, seed, n_parents=2):
    p, _ = datasets.random_bayesnet(cards, n_parents, seed=seed)
    return datasets.sample_table(p, n, seed=seed + 100), p


CASES = [((2, 3, 4, 5), 400, 0), ((3, 2, 5), 2000, 1), ((4, 2, 2, 3), 800, 2), ((5, 6), 3000, 3)]


@pytest.mark.parametrize("cards,n,seed", CASES)
def test_candidate_closed_forms_match_cost_from_scratch(cards, n, seed):
    X, _ = _data(cards, n, seed)
    Phi = oracle.phi_matrix(cards)
    q = oracle.target(X, cards)
    r = oracle.r_vec(cards, n)
    rng = np.random.default_rng(seed)
    theta = np.zeros(len(q))
    sup = rng.choice(np.arange(1, len(q)), size=4, replace=False)
    theta[sup] = rng.normal(0, 0.4, size=4)
    base = oracle.cost(theta, q, Phi, r)
    tb = Phi @ oracle.model(theta, Phi)
    dbar = Phi @ q
    for y in range(1, len(q)):
        if theta[y] == 0:
            th = theta.copy()
            th[y] = oracle.coord_optimum(theta, y, q, Phi)  # bisection, not the closed form
            want = oracle.cost(th, q, Phi, r) - base
            got = C.delta_append(dbar[y], tb[y], r[y])
            assert got == pytest.approx(want, abs=1e-10)
            assert C.lower_bound(dbar[y], tb[y], r[y]) <= got + 1e-15
        else:
            th = theta.copy()
            th[y] = oracle.coord_optimum(theta, y, q, Phi)
            assert C.delta_adjust(dbar[y], tb[y]) == pytest.approx(oracle.cost(th, q, Phi, r) - base, abs=1e-10)
            th[y] = 0.0
            want = oracle.cost(th, q, Phi, r) - base
            assert C.delta_remove(dbar[y], tb[y], theta[y], r[y]) == pytest.approx(want, abs=1e-10)


@pytest.mark.parametrize("cards,n,seed", CASES)
def test_fit_equals_dense_reference(cards, n, seed):
    X, _ = _data(cards, n, seed)
    want, costs = oracle.learn(X, cards)
    m = FSLL(cardinalities=cards, epsilon=1e-4, progress=False).fit(X)  # the paper's search, exactly
    flat = {int(np.ravel_multi_index(y, cards)): v for y, v in m.theta_.items()}
    assert set(flat) == set(np.nonzero(want)[0].tolist())
    for y, v in flat.items():
        assert v == pytest.approx(want[y], abs=1e-9)
    assert m.cost_ == pytest.approx(costs[-1], abs=1e-10)
    assert m.n_iter_ == len(costs) - 1


@pytest.mark.parametrize("epsilon", [1e-4, "auto"])
@pytest.mark.parametrize("cards,n,seed", CASES[:3])
def test_no_single_coordinate_move_improves_at_termination(cards, n, seed, epsilon):
    X, _ = _data(cards, n, seed)
    # the paper's cost (the family code's axis minimum: test_penalty.py)
    m = FSLL(cardinalities=cards, epsilon=epsilon, penalty="paper", penalty_scale=1.0, progress=False).fit(X)
    eps = resolve_epsilon(epsilon, n)
    Phi = oracle.phi_matrix(cards)
    q = oracle.target(X, cards)
    r = oracle.r_vec(cards, n)
    theta = np.zeros(len(q))
    for y, v in m.theta_.items():
        theta[np.ravel_multi_index(y, cards)] = v
    base = oracle.assert_axis_minimum(theta, q, Phi, r, eps)
    assert base == pytest.approx(m.cost_, abs=1e-10)


def test_log_prob_and_probabilities_match_theta():
    cards = (2, 3, 4, 5)
    X, _ = _data(cards, 1500, 7)
    m = FSLL(progress=False).fit(X)
    assert m.cardinalities_ == cards
    Phi = oracle.phi_matrix(cards)
    theta = np.zeros(math.prod(cards))
    for y, v in m.theta_.items():
        theta[np.ravel_multi_index(y, cards)] = v
    l = Phi.T @ theta
    logp = l - np.log(np.exp(l).sum())
    allx = np.array(list(itertools.product(*[range(k) for k in cards])))
    np.testing.assert_allclose(m.log_prob(allx), logp, atol=1e-10)
    np.testing.assert_allclose(m.probabilities().reshape(-1), np.exp(logp), atol=1e-12)
    assert m.score(X) == pytest.approx(np.mean(m.log_prob(X)))
    # kl_data_ is KL from the raw empirical distribution
    counts = np.bincount(np.ravel_multi_index(tuple(X.T), cards), minlength=len(l)) / len(X)
    nz = counts > 0
    assert m.kl_data_ == pytest.approx(float(np.sum(counts[nz] * (np.log(counts[nz]) - logp[nz]))), abs=1e-10)
    # kl_data_ comes from the sparse state (targets on the support); evaluating log p at the
    # data (the path taken when a target is missing) gives the same number
    flat = np.ravel_multi_index(tuple(X.T), cards)
    _, cnt = np.unique(flat, return_counts=True)
    saved = dict(m.fit_state_.dbar)
    m.fit_state_.dbar.clear()
    try:
        assert fitting.kl_data(m, flat, cnt, len(X)) == pytest.approx(m.kl_data_, abs=1e-12)
    finally:
        m.fit_state_.dbar.update(saved)


def test_cost_monotone_and_history_consistent():
    X, _ = _data((3, 3, 2, 4, 2), 5000, 11, n_parents=3)
    m = FSLL(progress=False).fit(X)
    costs = np.array([h["cost"] for h in m.history_])
    assert len(costs) == m.n_iter_ + 1
    assert np.all(np.diff(costs) <= 1e-12)
    deltas = np.array([h["delta"] for h in m.history_[1:]])
    np.testing.assert_allclose(np.diff(costs), deltas, atol=1e-10)
    assert costs[-1] == pytest.approx(m.cost_)
    assert m.n_bases_ == len(m.theta_) == m.history_[-1]["n_bases"]
    assert all(v != 0 for v in m.theta_.values())


def test_incremental_duals_agree_with_exact_resync():
    X, _ = _data((2, 3, 4, 5, 2), 3000, 5)
    a = FSLL(progress=False, resync_every=1).fit(X)   # exact duals every iteration
    b = FSLL(progress=False, resync_every=10**6).fit(X)  # incremental only
    assert set(a.theta_) == set(b.theta_)
    for y in a.theta_:
        assert a.theta_[y] == pytest.approx(b.theta_[y], abs=1e-10)
    assert a.log_z_ == pytest.approx(b.log_z_, abs=1e-10)
    # and the incremental table itself matches a transform of p_theta
    tb = b.engine_.ctx.spec(Table.THETABAR).array
    exact = basis.transform(b.probabilities())
    np.testing.assert_allclose(tb, exact, atol=1e-10)


def test_unseen_categories_and_constant_columns_stay_positive():
    rng = np.random.default_rng(0)
    n = 400
    X = np.c_[rng.integers(0, 2, n), np.zeros(n, int), rng.integers(0, 3, n), rng.integers(0, 2, n)]
    X[:, 3] = X[:, 0]  # perfectly dependent pair: the raw optimum is infinite
    cards = (2, 3, 4, 2)  # column 1 constant; categories 1, 2 of col 1 and 3 of col 2 never seen
    m = FSLL(cardinalities=cards, epsilon=1e-4, progress=False).fit(X)  # compared with the paper's search below
    p = m.probabilities()
    assert np.all(p > 0) and np.all(np.isfinite(p))
    assert all(np.isfinite(v) for v in m.theta_.values())
    # unseen cells get about the pseudo-count's mass: far below any seen cell
    assert p[:, 1:, :, :].sum() < 0.02
    want, _ = oracle.learn(X, cards)
    flat = {int(np.ravel_multi_index(y, cards)): v for y, v in m.theta_.items()}
    assert set(flat) == set(np.nonzero(want)[0].tolist())


def test_fit_state_json_roundtrip():
    X, _ = _data((2, 3), 100, 1)
    m = FSLL(progress=False).fit(X)
    s = FitState.from_json(m.fit_state_.to_json())
    assert s.theta == m.fit_state_.theta and s.cost() == pytest.approx(m.cost_)


@pytest.mark.parametrize("bad,msg", [
    (np.zeros((0, 3), int), "no samples"),
    (np.zeros(5, int), "2-D"),
    (np.array([[0, -1]]), "negative"),
    (np.array([[0.0, np.nan]]), "missing value at column 1.*missing=.em."),
    (np.array([[0.5, 1.0]]), "not an integer"),
    (np.array([["a", "b"]]), "integer category codes"),
])
def test_bad_input_raises_clear_errors(bad, msg):
    with pytest.raises(ValueError, match=msg):
        FSLL(progress=False).fit(bad)


def test_out_of_range_and_wrong_shape_name_the_column():
    with pytest.raises(ValueError, match=r"column 1 \(X1\): value 3 in row 1 is outside 0..2"):
        FSLL(cardinalities=[2, 3], progress=False).fit(np.array([[0, 0], [1, 3]]))
    with pytest.raises(ValueError, match="3 entries but X has 2 columns"):
        FSLL(cardinalities=[2, 3, 4], progress=False).fit(np.array([[0, 0]]))
    m = FSLL(progress=False).fit(np.array([[0, 1], [1, 0], [1, 1]]))
    with pytest.raises(ValueError, match="3 columns but the model has 2"):
        m.log_prob(np.zeros((2, 3), int))
    with pytest.raises(ValueError, match="epsilon"):
        FSLL(epsilon=-1).fit(np.array([[0, 1]]))


def test_too_large_table_refused_before_allocation():
    X = np.zeros((10, 40), int)
    with pytest.raises(ValueError, match="do not fit in memory|joint table"):
        FSLL(cardinalities=[64] * 40, progress=False).fit(X)
    with pytest.raises(ValueError, match="do not fit in memory"):
        FSLL(cardinalities=[2] * 40, progress=False).fit(X)


def test_sample_follows_model():
    X, _ = _data((2, 3, 2), 2000, 4)
    m = FSLL(progress=False).fit(X)
    S = m.sample(20000, random_state=0)
    assert S.shape == (20000, 3) and S.dtype == np.int64
    emp = np.bincount(np.ravel_multi_index(tuple(S.T), (2, 3, 2)), minlength=12) / len(S)
    np.testing.assert_allclose(emp, m.probabilities().reshape(-1), atol=0.015)
    np.testing.assert_array_equal(m.sample(5, random_state=1), m.sample(5, random_state=1))


def test_save_load_roundtrip(tmp_path):
    X, _ = _data((2, 3, 4), 600, 2)
    m = FSLL(progress=False).fit(X)
    m.save(tmp_path / "m.json")
    m2 = FSLL.load(tmp_path / "m.json")
    assert m2.theta_ == m.theta_ and m2.cardinalities_ == m.cardinalities_
    np.testing.assert_allclose(m2.log_prob(X), m.log_prob(X))
    np.testing.assert_allclose(m2.probabilities(), m.probabilities())
    (tmp_path / "bad.json").write_text('{"format": "fsll-ooc-model", "version": 99}')
    with pytest.raises(ValueError, match="newer"):
        FSLL.load(tmp_path / "bad.json")
    (tmp_path / "junk.json").write_text("not json")
    with pytest.raises(ValueError, match="not an fsll-ooc model"):
        FSLL.load(tmp_path / "junk.json")


def _started(X, cards):
    """An engine with its targets and uniform duals, and the state of a fit at iteration 0."""
    m = FSLL(cardinalities=cards, epsilon=1e-4, max_iter=0, progress=False).fit(X)
    assert m.n_iter_ == 0 and not m.theta_
    return m.engine_, m.fit_state_


def test_learn_options_reach_the_learner():
    cards = (2, 3, 4, 5, 2, 3)
    X, _ = _data(cards, 3000, 3)
    # the paper's setting through learn() equals the paper's setting through FSLL
    eng, st = _started(X, cards)
    learn(eng, st, LearnOptions(epsilon=1e-4))
    ref = FSLL(cardinalities=cards, epsilon=1e-4, progress=False).fit(X)
    assert st.theta == ref.fit_state_.theta and st.cost() == ref.cost_ and st.n_iter == ref.n_iter_
    # the default options (FSLL's defaults) use corrective phases and the joint selection ...
    eng, st = _started(X, cards)
    learn(eng, st)
    assert {h["move"] for h in st.history} >= {"refine", "joint-append"}
    # ... which options FSLL does not take switch off or bound
    eng, st = _started(X, cards)
    seen = []
    learn(eng, st, LearnOptions(refine="final", joint=False, refine_rounds=1,
                                on_finish=lambda e, s: seen.append((e, s))))
    moves = {h["move"] for h in st.history}
    assert "refine" in moves and "joint-append" not in moves
    assert all(h["value"] == 1.0 for h in st.history if h["move"] == "refine")  # one Newton round each
    assert seen == [(eng, st)]  # the hook ran once, on the final state
    # FSLL passes them on: the same search, the hook called once (the paper's code, as _started's state)
    hooked = []
    m = FSLL(cardinalities=cards, refine="final", penalty="paper", penalty_scale=1.0, progress=False,
             learn_options=LearnOptions(refine="final", joint=False, refine_rounds=1,
                                        on_finish=lambda e, s: hooked.append(s))).fit(X)
    assert [h["move"] for h in m.history_] == [h["move"] for h in st.history]
    assert m.theta_ == {st.digits(y): v for y, v in st.theta.items()} and m.cost_ == st.cost()
    assert len(hooked) == 1 and hooked[0].theta == st.theta
    eng, st = _started(X, cards)
    learn(eng, st, LearnOptions(epsilon=1e-4, max_iter=7))
    assert st.n_iter == 7 and not st.converged


@pytest.mark.parametrize("field,value", [
    ("epsilon", 0), ("epsilon", -1e-4), ("epsilon", math.inf), ("epsilon", "fast"), ("epsilon", True),
    ("max_iter", -1), ("max_iter", 2.5), ("resync_every", 0), ("resync_every", True),
    ("refine", "sometimes"), ("refine_tol", -0.1), ("refine_tol", math.nan), ("refine_rounds", 0),
    ("joint", "yes"), ("joint_candidates", -1), ("joint_closure", 1.5), ("joint_max_new", 0),
    ("on_finish", 3),
])
def test_bad_learn_options_name_the_option_and_value(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must") as info:
        LearnOptions(**{field: value})
    assert str(info.value).endswith(f"got {value!r}")


def test_learn_options_frozen_json_and_type_checked():
    o = LearnOptions(epsilon=1e-4, joint=False, joint_max_new=np.int64(4), on_finish=print)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.epsilon = 1.0
    d = o.to_json()
    assert "on_finish" not in d and d["joint_max_new"] == 4 and type(d["joint_max_new"]) is int
    assert LearnOptions.from_json(d) == dataclasses.replace(o, on_finish=None, joint_max_new=4)
    with pytest.raises(ValueError, match="unknown learner option.*'epsilom'"):
        LearnOptions.from_json({"epsilom": 1e-4})
    with pytest.raises(TypeError, match="LearnOptions"):
        learn(None, None, {"epsilon": 1e-4})


def test_the_same_estimator_fits_twice():
    """A fitted estimator fits again (new data, then the first data): each fit equals a fresh one."""
    rng = np.random.default_rng(3)
    X1 = rng.integers(0, [2, 3, 4], size=(300, 3))
    X2 = rng.integers(0, [2, 3, 4], size=(200, 3))
    m = FSLL(epsilon=1e-4, progress=False)
    m.fit(X1)
    first = (m.theta_, m.cost_)
    m.fit(X2)
    assert m.cost_ == FSLL(epsilon=1e-4, progress=False).fit(X2).cost_
    m.fit(X1)
    assert (m.theta_, m.cost_) == first
    assert np.isclose(m.probabilities().sum(), 1.0)
