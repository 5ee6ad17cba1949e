"""Missing cells and hidden variables (fsll_ooc.missing) against brute force.

The oracle enumerates, for every row, every completion of its missing cells on a tiny
mixed-cardinality table (cards 2, 3, 4, 5: both local bases).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fsll_ooc import FSLL, datasets, missing as M

CARDS = (2, 3, 4, 5)


def _holes(X, frac, seed):
    rng = np.random.default_rng(seed)
    Xm = np.array(X, np.int64)
    Xm[rng.random(Xm.shape) < frac] = M.MISSING
    return Xm


def completions(row, cards):
    """Every full row that agrees with ``row`` on its observed cells."""
    axes = [range(k) if v < 0 else [v] for v, k in zip(row, cards)]
    return list(itertools.product(*axes))


def brute_soft(p, X):
    soft, ll = np.zeros(p.shape), 0.0
    for row in X:
        comp = completions(row, p.shape)
        s = sum(p[c] for c in comp)
        ll += math.log(s)
        for c in comp:
            soft[c] += p[c] / s
    return soft, ll


@pytest.fixture(scope="module")
def data():
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=3)
    X = datasets.sample_table(p, 400, seed=1)
    Xm = _holes(X, 0.3, seed=2)
    Xm[0] = M.MISSING  # a row with nothing observed
    Xm[1] = X[1]  # and a complete one
    return p, Xm


@pytest.fixture(scope="module")
def model():
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=5)
    return FSLL(progress=False).fit(datasets.sample_table(p, 1500, seed=4))


def test_patterns_partition_the_rows(data):
    _, Xm = data
    pats = M.group_patterns(Xm, CARDS)
    rows = np.sort(np.concatenate([pt.rows for pt in pats]))
    assert np.array_equal(rows, np.arange(len(Xm)))
    for pt in pats:
        assert (Xm[np.ix_(pt.rows, list(pt.missing))] < 0).all()
        assert (Xm[np.ix_(pt.rows, list(pt.observed))] >= 0).all()
        assert np.array_equal(Xm[np.ix_(pt.rows, list(pt.observed))], pt.values[pt.inverse])
        assert pt.counts.sum() == len(pt.rows)


def test_e_step_equals_enumeration(data):
    p, Xm = data
    cells, w, ll = M.e_step(p, M.group_patterns(Xm, CARDS))
    soft, ll_ref = brute_soft(p, Xm)
    got = np.zeros(p.size)
    got[cells] = w
    np.testing.assert_allclose(got, soft.reshape(-1), rtol=1e-12, atol=1e-12)
    assert math.isclose(ll, ll_ref, rel_tol=1e-12)
    assert math.isclose(w.sum(), len(Xm), rel_tol=1e-12)


def test_e_step_in_chunks_equals_enumeration(data, monkeypatch):
    p, Xm = data
    monkeypatch.setattr(M, "CHUNK_CELLS", 7)  # several row chunks per pattern
    cells, w, ll = M.e_step(p, M.group_patterns(Xm, CARDS))
    soft, ll_ref = brute_soft(p, Xm)
    np.testing.assert_allclose(w, soft.reshape(-1)[cells], rtol=1e-12)
    assert math.isclose(ll, ll_ref, rel_tol=1e-12)


def test_uniform_mean_log_p(model):
    P = model.probabilities()
    got = M.uniform_mean_log_p(model.theta_, CARDS, model.log_z_)
    assert math.isclose(got, float(np.mean(np.log(P))), rel_tol=1e-10)


def test_initial_tables_are_distributions(data):
    _, Xm = data
    t = M.initial_table(Xm, CARDS)
    assert t.shape == CARDS and math.isclose(t.sum(), 1.0) and (t > 0).all()
    # the independence model: each variable's observed frequency (one pseudo-count spread)
    col = Xm[:, 2][Xm[:, 2] >= 0]
    np.testing.assert_allclose(t.sum(axis=(0, 1, 3)), (np.bincount(col, minlength=4) + 0.25) / (len(col) + 1))
    h = M.initial_table(np.c_[Xm[:, :3], np.full(len(Xm), -1)], CARDS, n_hidden=1, seed=0)
    assert h.shape == CARDS and math.isclose(h.sum(), 1.0) and (h > 0).all()


@pytest.mark.parametrize("route", ["table", "enumerate"])
def test_log_prob_marginalises_missing_cells(data, model, route, monkeypatch):
    _, Xm = data
    P = model.probabilities()
    if route == "enumerate":
        monkeypatch.setattr(M, "_table_for", lambda model, pat, cache: None)
    got = M.log_prob(model, Xm)
    ref = [math.log(sum(P[c] for c in completions(row, CARDS))) for row in Xm]
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    full = Xm[1:2]  # a complete row: the model's own log_prob, same bits
    assert M.log_prob(model, full)[0] == model.log_prob(full)[0]


def test_log_prob_out_of_core(data, tmp_path):
    _, Xm = data
    X = datasets.sample_table(datasets.random_bayesnet(CARDS, 2, seed=5)[0], 1500, seed=4)
    ooc = FSLL(progress=False, store=tmp_path / "s", layout=(1, 2)).fit(X)
    P = np.asarray(ooc.probabilities().compute())
    ref = [math.log(sum(P[c] for c in completions(row, CARDS))) for row in Xm[:40]]
    np.testing.assert_allclose(M.log_prob(ooc, Xm[:40]), ref, rtol=1e-10, atol=1e-12)
    modes = M.impute(ooc, Xm[:40])
    assert np.array_equal(modes, _brute_modes(P, Xm[:40]))


def _brute_modes(P, X, hidden=()):
    out = X.copy()
    for r, row in enumerate(X):
        miss = [i for i, v in enumerate(row) if v < 0 and i not in hidden]
        if not miss:
            continue
        best, arg = -1.0, None
        for c in itertools.product(*[range(CARDS[i]) for i in miss]):  # C order: ties keep the lowest
            full = list(row)
            for i, v in zip(miss, c):
                full[i] = v
            s = sum(P[x] for x in completions(full, CARDS))
            if s > best:
                best, arg = s, c
        for i, v in zip(miss, arg):
            out[r, i] = v
    return out


@pytest.mark.parametrize("route", ["table", "enumerate"])
def test_impute_mode_is_the_conditional_argmax(data, model, route, monkeypatch):
    _, Xm = data
    if route == "enumerate":
        monkeypatch.setattr(M, "_table_for", lambda model, pat, cache: None)
    P = model.probabilities()
    assert np.array_equal(M.impute(model, Xm), _brute_modes(P, Xm))
    # a hidden variable is marginalised out and left missing
    got = M.impute(model, Xm, hidden=(3,))
    assert np.array_equal(got, _brute_modes(P, Xm, hidden=(3,)))


def test_impute_sample_follows_the_conditional(model):
    P = model.probabilities()
    row = np.array([[1, -1, 2, -1]])
    draws = M.impute(model, np.repeat(row, 20000, axis=0), method="sample", random_state=0)
    assert (draws[:, [0, 2]] == [1, 2]).all()
    cond = P[1, :, 2, :] / P[1, :, 2, :].sum()
    freq = np.zeros((3, 5))
    np.add.at(freq, (draws[:, 1], draws[:, 3]), 1.0)
    assert np.abs(freq / 20000 - cond).max() < 0.015
    with pytest.raises(ValueError, match="method must be"):
        M.impute(model, row, method="mean")


def test_posterior_is_the_conditional(data, model):
    _, Xm = data
    P = model.probabilities()
    X = Xm.copy()
    X[:, 1] = M.MISSING
    got = M.posterior(model, X, (1,))
    for r, row in enumerate(X[:60]):
        ref = np.array([sum(P[c] for c in completions([*row[:1], j, *row[2:]], CARDS)) for j in range(3)])
        np.testing.assert_allclose(got[r], ref / ref.sum(), rtol=1e-10)
