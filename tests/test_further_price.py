"""A family's further terms at AIC's price (``further_price``) against brute force on tiny
mixed-cardinality tables, on both searches (the scan and the batched sub-table search),
and its held-out choice (``further_price="auto"``)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fsll_ooc import FSLL, cost as C, datasets
from fsll_ooc.learn import LearnOptions, auto_epsilon, select
from fsll_ooc.learn.state import FitState

import oracle


def brute_code(cards, N, support, price):
    """Description length / N of a support under the family code with a family's further
    terms at ``price`` (``"full"``: ``ln N / 2`` each, ``"aic"``: one nat each), from the
    definitions: families by grouping the digit vectors, ``M_A`` by counting every index
    with that exact set of non-zero digits, ``C(M_A, m)`` by ``math.comb``; the first term of
    a family always pays ``ln N / 2``."""
    n = len(cards)
    states = list(itertools.product(*[range(k) for k in cards]))
    fams = {}
    for y in support:
        a = tuple(i for i, v in enumerate(states[y]) if v)
        fams[a] = fams.get(a, 0) + 1
    total = 0.0
    for a, m in fams.items():
        M = sum(1 for s in states if tuple(i for i, v in enumerate(s) if v) == a)
        further = math.log(N) / 2 if price == "full" else 1.0
        total += math.log(N) / 2 + (m - 1) * further + len(a) * math.log(n) + math.log(math.comb(M, m))
    return total / N


def brute_cost(theta_vec, q, Phi, cards, N, price, scale=1.0):
    return oracle.kl(q, oracle.model(theta_vec, Phi)) + scale * brute_code(cards, N, np.nonzero(theta_vec)[0], price)


def _data(cards, n, seed, n_parents=2):
    p, _ = datasets.random_bayesnet(cards, n_parents, seed=seed)
    return datasets.sample_table(p, n, seed=seed + 100), p


def _state(cards, N, support, price, scale=1.0):
    st = FitState(tuple(cards), N, 0.0, penalty_code="family", penalty_scale=scale, further_price=price)
    st.theta = {int(y): 0.5 for y in support}
    st.dbar = {int(y): 0.0 for y in support}
    return st


def _vec(m, cards):
    theta = np.zeros(math.prod(cards))
    for y, v in m.theta_.items():
        theta[np.ravel_multi_index(y, cards)] = v
    return theta


def test_brute_code_of_the_full_price_is_the_family_code():
    cards, N = (2, 3, 4), 321
    rng = np.random.default_rng(0)
    for _ in range(5):
        support = rng.choice(np.arange(1, 24), size=9, replace=False)
        assert brute_code(cards, N, support, "full") == pytest.approx(oracle.brute_code(cards, N, support, "family"),
                                                                      rel=1e-13)


@pytest.mark.parametrize("cards", [(2, 3, 4, 5), (3, 5, 2), (4, 4, 3)])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_code_length_and_marginals_against_brute_force(cards, scale):
    """The support's code length and every term's marginal price (what adding a non-member
    costs, removing a member gives back) under the cheap price, from brute force."""
    N = 777
    size = math.prod(cards)
    rng = np.random.default_rng(sum(cards))
    for trial in range(6):
        support = rng.choice(np.arange(1, size), size=int(rng.integers(1, min(40, size - 1))), replace=False)
        st = _state(cards, N, support, "aic", scale)
        want = scale * brute_code(cards, N, support, "aic")
        assert st.total_penalty() == pytest.approx(want, rel=1e-12, abs=1e-15)
        probe = rng.choice(np.arange(1, size), size=12, replace=False).tolist()
        for y, r in zip(probe, st.penalties(probe)):
            other = set(support.tolist()) ^ {y}
            diff = scale * brute_code(cards, N, sorted(other), "aic") - want
            # (a nearly full family's next term can shorten the code: ln C(M, m) falls faster)
            assert r == pytest.approx(diff if y not in st.theta else -diff, rel=1e-9, abs=1e-15)


def test_first_member_and_binary_variables_keep_the_full_price():
    """A family's first term costs what it costs under the family code (the scan's price), so
    on binary variables (one term per family) the cheap price changes nothing; the full price
    given explicitly is the family code bit for bit."""
    cards, N = (3, 4, 5), 500
    full, aic = C.TermCode(cards, N, "family"), C.TermCode(cards, N, "family", further="aic")
    same = C.TermCode(cards, N, "family", further="full")
    for axes in [(0,), (1, 2), (0, 1, 2)]:
        assert aic.add(axes, 0) == full.add(axes, 0) and aic.total(axes, 1) == full.total(axes, 1)
        for m in range(min(4, full.members(axes))):
            assert same.add(axes, m) == full.add(axes, m) and same.total(axes, m) == full.total(axes, m)
            if m + 1 < full.members(axes):
                assert aic.add(axes, m + 1) < full.add(axes, m + 1)
    X, _ = _data((2, 2, 2, 2, 2), 800, 1)
    a = FSLL(progress=False, further_price="aic").fit(X)
    b = FSLL(progress=False).fit(X)
    assert a.theta_ == b.theta_ and a.cost_ == b.cost_ and a.further_price_ == "aic" and b.further_price_ == "full"
    c = FSLL(progress=False, further_price="full").fit(X)
    assert c.theta_ == b.theta_ and c.cost_ == b.cost_


@pytest.mark.parametrize("cards,n,seed,batched", [((2, 3, 4, 5), 1500, 0, False), ((3, 2, 5), 3000, 1, False),
                                                  ((4, 3, 3), 2000, 2, False), ((2, 3, 4, 5), 2000, 7, True)])
def test_fit_is_an_axis_minimum_of_the_cheap_cost(cards, n, seed, batched):
    """A default-rule fit under ``further_price="aic"`` (``batched``: batching on): its cost is
    the brute-force cost of its parameters (times its scale), and no single append, adjust or
    remove, each priced by the code's change, gains epsilon."""
    X, _ = _data(cards, n, seed)
    opts = LearnOptions(batch=True) if batched else None
    m = FSLL(cardinalities=cards, progress=False, further_price="aic", learn_options=opts).fit(X)
    assert m.fit_state_.further_price == "aic" and m.further_price_ == "aic"
    Phi, q = oracle.phi_matrix(cards), oracle.target(X, cards)
    cost = lambda th_: brute_cost(th_, q, Phi, cards, n, "aic", m.penalty_scale_)  # noqa: E731
    base = oracle.assert_axis_minimum(_vec(m, cards), q, Phi, None, auto_epsilon(n), cost_fn=cost)
    assert m.cost_ == pytest.approx(base, abs=1e-10)
    costs = np.array([h["cost"] for h in m.history_])
    assert np.all(np.diff(costs) <= 1e-12)


@pytest.mark.parametrize("cards,n,seed,layout", [((2, 3, 4, 5), 3000, 0, (0, 0)), ((3, 2, 5), 4000, 3, (1, 1)),
                                                 ((4, 4, 3), 3000, 2, (0, 0))])
def test_batched_search_under_the_cheap_price(cards, n, seed, layout):
    """The compiled sub-table search prices a family's further terms by the cheap price: batches
    of several steps run, every step gains epsilon, the end is an axis minimum of the cheap
    cost (brute force) and no worse than the one-step learner's."""
    from fsll_ooc.learn import batch, learn
    from test_batch import _engine

    X, _ = _data(cards, n, seed)
    Phi, q = oracle.phi_matrix(cards), oracle.target(X, cards)
    eps = 1e-5
    eng, state = _engine(cards, X, layout)
    state.penalty_code, state.further_price = "family", "aic"
    learn(eng, state, LearnOptions(epsilon=eps, batch=batch.BatchOptions(max_cells=20, factor=8.0)))
    assert state.converged
    sizes = np.bincount([h["batch"] for h in state.history if "batch" in h])
    assert sizes.max() >= 3, "no batch of several steps ran"
    vec = np.zeros(math.prod(cards))
    for y, v in state.theta.items():
        vec[y] = v
    cost = lambda th_: brute_cost(th_, q, Phi, cards, n, "aic")  # noqa: E731
    base = oracle.assert_axis_minimum(vec, q, Phi, None, eps, cost_fn=cost)
    assert state.cost() == pytest.approx(base, abs=1e-10)
    costs = np.array([h["cost"] for h in state.history])
    np.testing.assert_allclose(np.diff(costs), [h["delta"] for h in state.history[1:]], atol=1e-10)
    assert all(h["delta"] < -eps for h in state.history[1:])
    eng1, one = _engine(cards, X, layout)
    one.penalty_code, one.further_price = "family", "aic"
    learn(eng1, one, LearnOptions(epsilon=eps))
    assert state.cost() <= one.cost() + 0.01 * (one.history[0]["cost"] - one.cost())
    full_eng, full = _engine(cards, X, layout)
    full.penalty_code = "family"
    learn(full_eng, full, LearnOptions(epsilon=eps, batch=batch.BatchOptions(max_cells=20, factor=8.0)))
    assert len(state.theta) > len(full.theta)  # the cheap price buys more of the families' terms


def test_cheap_price_keeps_more_terms_of_a_conditional_table():
    X, _ = _data((4, 4, 3, 3), 3000, 3)
    full = FSLL(progress=False, penalty_scale=1.0).fit(X)
    aic = FSLL(progress=False, penalty_scale=1.0, further_price="aic").fit(X)
    assert aic.n_bases_ > full.n_bases_


def test_auto_is_the_held_out_argmax_over_scales_and_prices(monkeypatch):
    """``further_price="auto"``: the four (scale, price) pairs scored on the held-out fifth, the
    full code's two the default's own scores (bit for bit: the same sub-fit and
    continuation); the fit uses the best pair, and starts from its model."""
    cards = (4, 3, 3, 2)
    X, _ = _data(cards, 1500, 4)
    default = FSLL(cardinalities=cards, progress=False).fit(X)
    m = FSLL(cardinalities=cards, progress=False, further_price="auto").fit(X)
    keys = [(1.0, "full"), (0.5, "full"), (1.0, "aic"), (0.5, "aic")]
    assert list(m.penalty_scale_scores_) == keys
    assert m.penalty_scale_scores_[(1.0, "full")] == default.penalty_scale_scores_[1.0]
    assert m.penalty_scale_scores_[(0.5, "full")] == default.penalty_scale_scores_[0.5]
    best = keys[0]
    for k in keys[1:]:
        if m.penalty_scale_scores_[k] > m.penalty_scale_scores_[best]:
            best = k
    assert (m.penalty_scale_, m.further_price_) == best
    ref = FSLL(cardinalities=cards, progress=False, penalty_scale=best[0], further_price=best[1]).fit(X)
    assert m.cost_ <= ref.cost_ + 1e-3  # a warm start can end elsewhere, not much worse
    # the first pair's score is that of an explicit fit on the training rows
    train, held = select.holdout_split(len(X))
    sub = FSLL(cardinalities=cards, progress=False, penalty_scale=1.0).fit(X[train])
    assert np.mean(sub.log_prob(X[held])) == pytest.approx(m.penalty_scale_scores_[(1.0, "full")], abs=1e-12)


def test_auto_ties_keep_the_full_code(monkeypatch):
    codes = np.arange(500)[:, None]

    def fit_path(train_codes, settings):
        for s in settings:
            yield (lambda c: np.full(len(c), -2.0)), {"model of": s}

    tie = select.choose_scale(fit_path, codes, C.PENALTY_SCALES, C.FURTHER_PRICES)
    assert (tie.scale, tie.price) == (1.0, "full") and tie.start == {"model of": (1.0, "full")}
    few = select.choose_scale(fit_path, codes[:50], C.PENALTY_SCALES, C.FURTHER_PRICES)
    assert (few.scale, few.price, few.scores) == (1.0, "full", {})


def test_auto_with_a_fixed_scale_compares_the_prices_only():
    X, _ = _data((4, 3, 3), 1200, 5)
    m = FSLL(progress=False, further_price="auto", penalty_scale=0.5).fit(X)
    assert list(m.penalty_scale_scores_) == [(0.5, "full"), (0.5, "aic")] and m.penalty_scale_ == 0.5


def test_refused_where_it_does_not_apply():
    X, _ = _data((3, 3, 2), 400, 6)
    with pytest.raises(ValueError, match="further_price"):
        FSLL(progress=False, penalty="paper", further_price="aic").fit(X)
    with pytest.raises(ValueError, match="further_price"):
        FSLL(progress=False, epsilon=1e-4, further_price="auto").fit(X)  # the paper's code by default there
    with pytest.raises(ValueError, match="further_price"):
        FSLL(progress=False, further_price="bic").fit(X)
    Xm = X.astype(float)
    Xm[:20, 0] = np.nan
    with pytest.raises(ValueError, match="further_price='auto'"):
        FSLL(progress=False, missing="em", further_price="auto").fit(Xm)
    m = FSLL(progress=False, missing="em", further_price="aic", penalty_scale=1.0).fit(Xm)
    assert m.fit_state_.further_price == "aic"


def test_saved_and_resumed_with_its_price(tmp_path, monkeypatch):
    """The model file and the store keep the price: a loaded model reports it, an interrupted
    fit resumes under it to the in-core model."""
    import interrupts

    X, _ = _data((3, 4, 2, 5), 3000, 4)
    ref = FSLL(progress=False, penalty_scale=1.0, further_price="aic").fit(X)
    ref.save(tmp_path / "m.json")
    back = FSLL.load(tmp_path / "m.json")
    assert back.further_price_ == "aic" and back.get_params()["further_price"] == "aic"
    interrupts.stop_after(monkeypatch, 6)
    with pytest.raises(interrupts.Crash):
        FSLL(progress=False, penalty_scale=1.0, further_price="aic", store=tmp_path / "s", layout=(1, 2),
             scheduler="serial").fit(X)
    monkeypatch.undo()
    m = FSLL.resume(tmp_path / "s", progress=False)
    assert m.fit_state_.further_price == "aic"
    assert set(m.theta_) == set(ref.theta_) and m.cost_ == pytest.approx(ref.cost_, abs=1e-10)


def test_several_folds_sum_every_rows_score(monkeypatch):
    """``select.FOLDS_BELOW`` (an experiment's setting): below it every fold is held out in
    turn, each row scored once; the models of the first fold (today's split) are the starts."""
    codes = np.arange(500)[:, None]
    seen = []

    def fit_path(train_codes, scales):
        seen.append(len(train_codes))
        for s in scales:
            yield (lambda c, s=s: -s * c[:, 0].astype(float)), {"model of": s, "fold": len(seen)}

    one = select.choose_scale(fit_path, codes)
    assert seen == [400] and one.scores[1.0] == pytest.approx(-np.mean(codes[select.holdout_split(500)[1], 0]))
    monkeypatch.setattr(select, "FOLDS_BELOW", 1000)
    seen.clear()
    five = select.choose_scale(fit_path, codes)
    assert seen == [400] * select.HOLDOUT
    assert five.scores == pytest.approx({1.0: -np.mean(codes[:, 0]), 0.5: -0.5 * np.mean(codes[:, 0])})
    assert five.scale == 0.5 and five.start == {"model of": 0.5, "fold": 1}
