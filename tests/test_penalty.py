"""The family code (``penalty="family"``) against brute force on tiny mixed-cardinality tables."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fsll_ooc import FSLL, cost as C, datasets
from fsll_ooc.learn import auto_epsilon

import oracle
from oracle import brute_code, brute_cost


def _data(cards, n, seed, n_parents=2):
    p, _ = datasets.random_bayesnet(cards, n_parents, seed=seed)
    return datasets.sample_table(p, n, seed=seed + 100), p


def _state(cards, N, support, kind):
    from fsll_ooc.learn.state import FitState
    st = FitState(tuple(cards), N, 0.0, penalty_code=kind)
    st.theta = {int(y): 0.5 for y in support}
    st.dbar = {int(y): 0.0 for y in support}
    return st


@pytest.mark.parametrize("cards", [(2, 3, 4, 5), (3, 5, 2), (4, 4, 3)])
@pytest.mark.parametrize("kind", ["paper", "family"])
def test_code_length_two_ways_and_marginals(cards, kind):
    N = 777
    size = math.prod(cards)
    rng = np.random.default_rng(sum(cards))
    for trial in range(6):
        support = rng.choice(np.arange(1, size), size=int(rng.integers(1, min(40, size - 1))), replace=False)
        st = _state(cards, N, support, kind)
        want = brute_code(cards, N, support, kind)
        assert st.total_penalty() == pytest.approx(want, rel=1e-12, abs=1e-15)
        # a member's marginal is what removing it gives back; a non-member's what adding it costs
        probe = rng.choice(np.arange(1, size), size=12, replace=False).tolist()
        got = st.penalties(probe)
        for y, r in zip(probe, got):
            other = set(support.tolist()) ^ {y}
            diff = brute_code(cards, N, sorted(other), kind) - want
            assert r == pytest.approx(abs(diff), rel=1e-9, abs=1e-15)
            assert (diff > 0) == (y not in st.theta) or diff == pytest.approx(0.0, abs=1e-12)


def test_family_code_equals_paper_on_binary_variables_and_for_a_familys_first_member():
    cards, N = (2, 2, 2, 2, 2), 500
    rng = np.random.default_rng(3)
    for _ in range(5):
        support = rng.choice(np.arange(1, 32), size=9, replace=False)
        assert brute_code(cards, N, support, "family") == pytest.approx(brute_code(cards, N, support, "paper"))
        assert _state(cards, N, support, "family").total_penalty() == pytest.approx(
            _state(cards, N, support, "paper").total_penalty(), rel=1e-14)
    cards = (3, 4, 5)
    st = _state(cards, N, [], "family")
    r0, w = C.penalty_weights(cards, N)
    for y in range(1, 60):
        assert st.penalties([y])[0] == pytest.approx(C.penalty(np.unravel_index(y, cards), r0, w), rel=1e-12)


def test_paper_epsilon_keeps_the_paper_cost():
    cards, n = (2, 3, 4, 5), 400
    X, _ = _data(cards, n, 0)
    want, costs = oracle.learn(X, cards)
    m = FSLL(cardinalities=cards, epsilon=1e-4, progress=False).fit(X)
    assert m.fit_state_.penalty_code == "paper"
    flat = {int(np.ravel_multi_index(y, cards)): v for y, v in m.theta_.items()}
    assert set(flat) == set(np.nonzero(want)[0].tolist())
    assert m.cost_ == pytest.approx(costs[-1], abs=1e-10)
    assert C.resolve_penalty(None, 1e-4) == "paper" and C.resolve_penalty(None, "auto") == "family"
    with pytest.raises(ValueError, match="penalty"):
        FSLL(penalty="bic", progress=False).fit(X)


@pytest.mark.parametrize("cards,n,seed", [((2, 3, 4, 5), 400, 0), ((3, 2, 5), 3000, 1), ((4, 3, 3), 2000, 2)])
def test_family_fit_is_an_axis_minimum_of_the_family_cost(cards, n, seed):
    """Default fit: its cost is the brute-force family cost of its parameters (times the
    penalty scale the fit chose), and no single append, adjust or remove (each priced by the
    code's change) gains epsilon."""
    X, _ = _data(cards, n, seed)
    m = FSLL(cardinalities=cards, progress=False).fit(X)
    assert m.fit_state_.penalty_code == "family"
    eps = auto_epsilon(n)
    Phi = oracle.phi_matrix(cards)
    q = oracle.target(X, cards)
    theta = np.zeros(math.prod(cards))
    for y, v in m.theta_.items():
        theta[np.ravel_multi_index(y, cards)] = v
    a = m.penalty_scale_
    base = brute_cost(theta, q, Phi, cards, n, "family", a)
    assert m.cost_ == pytest.approx(base, abs=1e-10)
    for y in range(1, len(q)):
        th = theta.copy()
        th[y] = oracle.coord_optimum(theta, y, q, Phi)
        assert brute_cost(th, q, Phi, cards, n, "family", a) > base - eps, f"moving {y} gains epsilon"
        if theta[y] != 0:
            th[y] = 0.0
            assert brute_cost(th, q, Phi, cards, n, "family", a) > base - eps, f"removing {y} gains epsilon"
    costs = np.array([h["cost"] for h in m.history_])
    assert np.all(np.diff(costs) <= 1e-12)
    np.testing.assert_allclose(np.diff(costs), [h["delta"] for h in m.history_[1:]], atol=1e-10)


def test_family_code_survives_resume_save_and_load(tmp_path, monkeypatch):
    """An interrupted out-of-core fit resumes under the family code to the in-core model; the
    model file keeps the parameter."""
    import interrupts

    X, _ = _data((3, 4, 2, 5), 3000, 4)
    ref = FSLL(progress=False, penalty_scale=1.0).fit(X)  # a fit from scratch, long enough to stop in
    assert any(h["move"] == "append" for h in ref.history_) and ref.fit_state_.penalty_code == "family"
    interrupts.stop_after(monkeypatch, 6)
    with pytest.raises(interrupts.Crash):
        FSLL(progress=False, penalty_scale=1.0, store=tmp_path / "s", layout=(1, 2), scheduler="serial").fit(X)
    monkeypatch.undo()
    m = FSLL.resume(tmp_path / "s", progress=False)
    assert m.fit_state_.penalty_code == "family"
    assert set(m.theta_) == set(ref.theta_) and m.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    paper = FSLL(penalty="paper", penalty_scale=ref.penalty_scale_, progress=False).fit(X)
    assert paper.cost_ > ref.cost_  # the family code is never longer than the paper's for one support
    ref.save(tmp_path / "m.json")
    back = FSLL.load(tmp_path / "m.json")
    assert back.get_params()["penalty"] is None and back.theta_ == ref.theta_
    np.testing.assert_allclose(back.log_prob(X[:50]), ref.log_prob(X[:50]), atol=1e-12)


@pytest.mark.parametrize("cards", [(2, 3, 4, 5), (2,) * 17, (3, 5, 2, 7, 9, 4), (40, 40, 40, 40, 40, 40, 40, 40, 40, 40), (1025,) * 7])
@pytest.mark.parametrize("scale,further", [(1.0, "full"), (0.37, "full"), (1.0, "aic"), (2.5, "aic")])
def test_prices_of_many_families_at_once_are_add_bit_for_bit(cards, scale, further):
    """``TermCode.add_many`` (a joint selection's candidates priced together) gives what ``add``
    gives one family at a time, bit for bit: first members, further ones, full families."""
    rng = np.random.default_rng(len(cards))
    n = len(cards)
    keys = [((), 0)]
    for _ in range(300):
        axes = tuple(sorted(rng.choice(n, size=int(rng.integers(1, min(n, 6) + 1)), replace=False).tolist()))
        M = math.prod(cards[i] - 1 for i in axes)
        keys.append((axes, int(rng.choice([0, 1, 2, M - 1, M, M + 3]) if M > 2 else rng.integers(0, M + 2))))
    keys += keys[:5]  # (repeats)
    kw = dict(scale=scale, further=further)
    fresh = C.TermCode(cards, 12345, "family", **kw)
    want = [fresh.add(a, m) for a, m in keys]
    got = C.TermCode(cards, 12345, "family", **kw).add_many(keys)
    assert [v.hex() if math.isfinite(v) else v for v in got] == [v.hex() if math.isfinite(v) else v for v in want]
    assert all(type(v) is float for v in got)
    paper = C.TermCode(cards, 12345, "paper", scale=scale)
    assert paper.add_many(keys[:40]) == [C.TermCode(cards, 12345, "paper", scale=scale).add(a, m) for a, m in keys[:40]]
