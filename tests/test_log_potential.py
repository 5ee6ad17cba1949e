"""``queries.log_potential``: the compiled pass over the rows gives the numpy form's sums bit
for bit, and both equal the brute-force sum of ``theta_y Phi_y(x)``."""
from types import SimpleNamespace

import numpy as np
import pytest

from fsll_ooc import FSLL, basis, queries


def _numpy_form(model, codes):
    # the numpy form of log_potential (term after term, factors in axis order)
    l = np.zeros(codes.shape[0])
    for y, v in model.theta_.items():
        phi = None
        for i, yi in enumerate(y):
            if yi:
                f = basis.phi_values(model.cardinalities_[i], yi, np.arange(model.cardinalities_[i]))[codes[:, i]]
                phi = f if phi is None else phi * f
        l += v * (1.0 if phi is None else phi)
    return l


def _model(cards, n_terms, seed):
    rng = np.random.default_rng(seed)
    ys = [tuple(int(v) for v in np.unravel_index(f, cards)) for f in rng.permutation(int(np.prod(cards)))[:n_terms]]
    return SimpleNamespace(cardinalities_=list(cards), theta_={y: float(rng.normal()) for y in ys})


@pytest.mark.parametrize("cards", [(2, 3, 4, 5), (3, 2, 8), (2,) * 6])
def test_compiled_equals_numpy_form_bit_for_bit(cards, monkeypatch):
    calls = []
    compiled = queries._log_potential_compiled
    monkeypatch.setattr(queries, "_log_potential_compiled", lambda *a: calls.append(1) or compiled(*a))
    monkeypatch.setattr(queries, "ROWS_PER_BLOCK", 1000)  # three blocks of rows
    m = _model(cards, int(np.prod(cards)), seed=len(cards))  # every term, the zero term included
    codes = np.stack([np.random.default_rng(1).integers(0, k, 3000) for k in cards], axis=1)
    assert codes.shape[0] * len(m.theta_) >= queries.COMPILED_MIN_WORK  # the compiled path runs
    got = queries.log_potential(m, codes)
    assert np.array_equal(got, _numpy_form(m, codes))
    # and with narrower code dtypes
    assert np.array_equal(queries.log_potential(m, codes.astype(np.int8)), got)
    assert len(calls) == 2


def test_brute_force_sum_and_fallback():
    cards = (2, 3, 4, 5)
    m = _model(cards, 40, seed=7)
    cells = np.array(list(np.ndindex(*cards)))
    brute = np.array([sum(v * np.prod([basis.phi_values(cards[i], yi, np.array([x[i]]))[0]
                                       for i, yi in enumerate(y) if yi]) for y, v in m.theta_.items())
                      for x in cells])
    got = queries.log_potential(m, np.repeat(cells, 20, axis=0))[::20]
    np.testing.assert_allclose(got, brute, rtol=0, atol=1e-12)
    # a code outside its variable's range takes the numpy form (which raises for it)
    bad = np.repeat(cells, 20, axis=0)
    bad[0, 3] = 5
    with pytest.raises(IndexError):
        queries.log_potential(m, bad)


def test_fitted_model_log_prob_matches_its_table():
    rng = np.random.default_rng(0)
    X = np.stack([rng.integers(0, k, 4000) for k in (2, 3, 4, 5)], axis=1)
    X[:, 1] = (X[:, 0] + X[:, 2]) % 3
    m = FSLL(progress=False).fit(X)
    lp = m.log_prob(X)
    p = m.probabilities()
    np.testing.assert_allclose(lp, np.log(p[tuple(X.T)]), rtol=0, atol=1e-9)
