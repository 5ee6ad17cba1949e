"""dependence(): mutual information between every pair of variables, from the model's own
distribution, against brute force on the dense table of tiny mixed-cardinality models."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from fsll_ooc import FSLL, FSLLAverage, datasets

CARDS = (2, 3, 4, 5)


def brute_mi(P, a, b):
    Q = P.sum(axis=tuple(i for i in range(P.ndim) if i not in (a, b)))
    if a > b:
        Q = Q.T
    pa, pb = Q.sum(1), Q.sum(0)
    return sum(Q[i, j] * math.log(Q[i, j] / (pa[i] * pb[j]))
               for i in range(Q.shape[0]) for j in range(Q.shape[1]) if Q[i, j] > 0)


def brute_cmi(P, a, b):
    rest = [i for i in range(P.ndim) if i not in (a, b)]
    total = 0.0
    for x in itertools.product(*[range(k) for k in P.shape]):
        r = tuple(x[i] for i in rest)
        idx_r = [slice(None)] * P.ndim
        for i, v in zip(rest, r):
            idx_r[i] = v
        pr = P[tuple(idx_r)].sum()
        ia = list(idx_r); ia[a] = x[a]
        ib = list(idx_r); ib[b] = x[b]
        pa, pb = P[tuple(ia)].sum(), P[tuple(ib)].sum()
        total += P[x] * math.log(P[x] * pr / (pa * pb))
    return total


@pytest.fixture(scope="module")
def model():
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=3)
    return FSLL(progress=False).fit(datasets.sample_table(p, 2000, seed=1))


def test_dependence_matches_brute_force(model):
    d = model.dependence()
    P = model.probabilities()
    assert list(d.columns[:4]) == ["a", "b", "mi", "cmi"]
    assert len(d) == 6
    assert list(d["mi"]) == sorted(d["mi"], reverse=True)
    names = ["X0", "X1", "X2", "X3"]
    for _, r in d.iterrows():
        a, b = names.index(r["a"]), names.index(r["b"])
        assert r["mi"] == pytest.approx(brute_mi(P, a, b), abs=1e-12)
        assert r["cmi"] == pytest.approx(brute_cmi(P, a, b), abs=1e-10)
        # the log-linear model: a and b are independent given the rest exactly when no term holds both
        together = sum(1 for y in model.theta_ if y[a] and y[b])
        assert r["terms"] == together
        if together == 0:
            assert r["cmi"] == pytest.approx(0.0, abs=1e-12)


def test_independent_columns_have_small_mi_whatever_the_term_shares():
    rng = np.random.default_rng(0)
    N = 4000
    a = rng.choice(9, N, p=np.r_[0.5, np.full(8, 0.5 / 8)])
    b = rng.choice(5, N)
    c = rng.integers(0, 2, N)
    d = c ^ (rng.random(N) < 0.05)
    df = pd.DataFrame({"a": [f"a{v}" for v in a], "b": [f"b{v}" for v in b], "c": c, "d": d})
    m = FSLL(progress=False).fit(df)
    dep = m.dependence()
    assert (dep.iloc[0]["a"], dep.iloc[0]["b"]) in {("c", "d"), ("d", "c")}
    ab = dep[((dep["a"] == "a") & (dep["b"] == "b")) | ((dep["a"] == "b") & (dep["b"] == "a"))].iloc[0]
    assert ab["mi"] < 0.01 < dep.iloc[0]["mi"]


def test_out_of_core_dependence_equals_in_core(model, tmp_path):
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=3)
    X = datasets.sample_table(p, 2000, seed=1)
    ooc = FSLL(progress=False, store=tmp_path / "s", layout=(1, 2)).fit(X)
    a, b = model.dependence(), ooc.dependence()
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), atol=1e-10, check_exact=False)


def test_average_dependence_gives_a_spread():
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=3)
    X = datasets.sample_table(p, 1000, seed=1)
    avg = FSLLAverage(n_members=3, progress=False).fit(X)
    d = avg.dependence()
    P = avg.probabilities()
    names = ["X0", "X1", "X2", "X3"]
    for _, r in d.iterrows():
        a, b = names.index(r["a"]), names.index(r["b"])
        assert r["mi"] == pytest.approx(brute_mi(P, a, b), abs=1e-12)
        assert r["mi_min"] <= r["mi_max"]
        mem = [brute_mi(m.probabilities(), a, b) for m in avg.members_]
        assert r["mi_min"] == pytest.approx(min(mem), abs=1e-12)
        assert r["mi_max"] == pytest.approx(max(mem), abs=1e-12)
