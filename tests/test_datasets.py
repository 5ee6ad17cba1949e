"""Tests of fsll_ooc.datasets: shapes, normalisation, reproducibility, structure, sampling."""
import itertools

import numpy as np
import pytest

from fsll_ooc import datasets


def _marginals(p):
    """P(X_i = 1) for every binary axis of a table."""
    n = p.ndim
    return np.array([p.sum(axis=tuple(a for a in range(n) if a != i))[1] for i in range(n)])


def test_names():
    assert datasets.PAPER_DATASETS == (
        "Ising5x4S", "Ising5x4L", "BN20-37S", "BN20-37L", "BN20-54S", "BN20-54L",
    )


@pytest.mark.parametrize("name", datasets.PAPER_DATASETS)
def test_paper_dataset_shapes(name):
    X, p = datasets.paper_dataset(name, seed=0)
    n_expected = 1_000 if name.endswith("S") else 100_000
    assert X.shape == (n_expected, 20)
    assert X.dtype == np.int64
    assert X.min() >= 0 and X.max() <= 1
    assert p.shape == (2,) * 20 and p.dtype == np.float64
    assert abs(p.sum() - 1.0) < 1e-12
    assert (p > 0).all()


def test_unknown_name():
    with pytest.raises(ValueError) as exc:
        datasets.paper_dataset("BN20-99L")
    msg = str(exc.value)
    assert "BN20-99L" in msg
    for name in datasets.PAPER_DATASETS:
        assert name in msg


def test_reproducible_and_shared_truth():
    X1, p1 = datasets.paper_dataset("BN20-37S", seed=5)
    X2, p2 = datasets.paper_dataset("BN20-37S", seed=5)
    assert np.array_equal(X1, X2) and np.array_equal(p1, p2)
    XL, pL = datasets.paper_dataset("BN20-37L", seed=5)
    assert np.array_equal(p1, pL)                      # S and L share p*
    assert not np.array_equal(XL[:1000], X1)           # independent samples
    _, p3 = datasets.paper_dataset("BN20-37S", seed=6)
    assert not np.array_equal(p1, p3)                  # the seed changes the network
    _, q1 = datasets.paper_dataset("Ising5x4S", seed=0)
    _, q2 = datasets.paper_dataset("Ising5x4L", seed=1)
    assert np.array_equal(q1, q2)                      # the Ising truth has no randomness


@pytest.mark.parametrize("family,edges,npar", [("BN20-37", 37, 2), ("BN20-54", 54, 3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_bn_structure(family, edges, npar, seed):
    p, s = datasets.paper_true_distribution(family + "L", seed=seed)
    assert s["n_edges"] == edges
    pa = s["parents"]
    assert pa[0] == ()
    assert pa[1] == (0,)
    for i in range(2, 20):
        assert len(pa[i]) == min(i, npar)
        assert len(set(pa[i])) == len(pa[i])
        assert all(0 <= j < i for j in pa[i])
    # the table is the product of the CPTs: check a few cells directly
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = tuple(int(v) for v in rng.integers(0, 2, size=20))
        prod = 1.0
        for i in range(20):
            prod *= s["cpts"][i][tuple(x[j] for j in pa[i]) + (x[i],)]
        assert p[x] == pytest.approx(prod, rel=1e-10)


def test_random_bayesnet_mixed_cards():
    cards = (2, 3, 4, 2, 5)
    p, s = datasets.random_bayesnet(cards, n_parents=[0, 1, 2, 2, 1], seed=3)
    assert p.shape == cards and abs(p.sum() - 1) < 1e-12
    assert s["n_edges"] == 0 + 1 + 2 + 2 + 1
    for i, cpt in enumerate(s["cpts"]):
        assert cpt.shape == tuple(cards[j] for j in s["parents"][i]) + (cards[i],)
        assert np.allclose(cpt.sum(axis=-1), 1.0)
    p2, _ = datasets.random_bayesnet(cards, n_parents=[0, 1, 2, 2, 1], seed=3)
    assert np.array_equal(p, p2)


def test_ising_brute_force():
    rows, cols = 2, 3
    p = datasets.ising_grid(rows, cols, coupling=0.5)
    edges = [(0, 1), (1, 2), (3, 4), (4, 5), (0, 3), (1, 4), (2, 5)]
    w = np.empty((2,) * 6)
    for x in itertools.product((0, 1), repeat=6):
        s = 2 * np.array(x) - 1
        w[x] = np.exp(0.5 * sum(s[i] * s[j] for i, j in edges))
    assert np.allclose(p, w / w.sum(), rtol=1e-12, atol=0)


def test_potts_brute_force():
    cards = (2, 3, 3, 4)          # 2x2 grid: edges (0,1), (0,2), (1,3), (2,3)
    p = datasets.potts_grid(2, 2, cards, coupling=0.7)
    edges = [(0, 1), (0, 2), (1, 3), (2, 3)]
    w = np.empty(cards)
    for x in itertools.product(*(range(k) for k in cards)):
        w[x] = np.exp(0.7 * sum(x[i] == x[j] for i, j in edges))
    assert np.allclose(p, w / w.sum(), rtol=1e-12, atol=0)
    assert datasets.potts_grid(1, 3, 3).shape == (3, 3, 3)


@pytest.mark.parametrize("name", ["Ising5x4L", "BN20-37L", "BN20-54L"])
def test_empirical_marginals(name):
    X, p = datasets.paper_dataset(name, seed=0)
    m_true = _marginals(p)
    m_emp = X.mean(axis=0)
    # 100,000 samples: standard error <= 0.0016 per marginal; 5 sigma
    assert np.max(np.abs(m_emp - m_true)) < 0.008
    # a pairwise marginal too
    p01 = p.sum(axis=tuple(range(2, 20)))
    emp = np.histogram2d(X[:, 0], X[:, 1], bins=2, range=[[0, 2], [0, 2]])[0] / len(X)
    assert np.max(np.abs(emp - p01)) < 0.008


def test_sample_table_exact():
    p = np.array([[0.1, 0.0, 0.2], [0.0, 0.3, 0.4]])
    X = datasets.sample_table(p, 200_000, seed=0)
    assert X.shape == (200_000, 2) and X.dtype == np.int64
    counts = np.zeros_like(p)
    np.add.at(counts, (X[:, 0], X[:, 1]), 1)
    assert counts[0, 1] == 0 and counts[1, 0] == 0
    assert np.max(np.abs(counts / len(X) - p)) < 0.005
    assert np.array_equal(X, datasets.sample_table(p, 200_000, seed=0))
    # unnormalised input is fine; a trailing zero cell is never drawn
    X = datasets.sample_table(np.array([3.0, 1.0, 0.0]), 10_000, seed=1)
    assert X.max() <= 1


def test_sample_table_rejects_bad_input():
    with pytest.raises(ValueError):
        datasets.sample_table(np.array([0.5, -0.1]), 3)
    with pytest.raises(ValueError):
        datasets.sample_table(np.zeros(4), 3)


def test_size_limit():
    with pytest.raises(ValueError, match="cells"):
        datasets.random_bayesnet((2,) * 27, 2, seed=0)
    with pytest.raises(ValueError, match="134217728"):
        datasets.ising_grid(3, 9)
    with pytest.raises(ValueError, match="2\\*\\*26"):
        datasets.potts_grid(1, 4, q=[128, 128, 128, 128])


def test_kl_true_zero_log_zero():
    p_true = np.array([0.5, 0.5, 0.0])
    p = np.array([0.25, 0.5, 0.25])
    assert datasets.kl_divergence(p_true, p) == pytest.approx(0.5 * np.log(2))


def test_kl_divergence_infinite_zero_and_size_checked():
    p = np.array([[0.2, 0.3], [0.5, 0.0]])
    assert datasets.kl_divergence(p, p) == 0.0
    assert datasets.kl_divergence(p, [0.5, 0.5, 0.0, 0.0]) == np.inf  # q = 0 where p > 0
    assert datasets.kl_divergence(p, [0.2, 0.3, np.nan, 0.5]) == np.inf
    q = np.array([0.1, 0.2, 0.3, 0.4])
    want = sum(a * np.log(a / b) for a, b in zip(p.ravel(), q) if a > 0)
    assert datasets.kl_divergence(p, q) == pytest.approx(want, rel=1e-14)
    with pytest.raises(ValueError, match="4 and 3 cells"):
        datasets.kl_divergence(p, q[:3])


def test_paper_table1_has_every_dataset_and_model():
    T = datasets.PAPER_TABLE1
    assert set(T) == {(d, m) for d in datasets.PAPER_DATASETS for m in ("FL", "BM-DI", "BM-PCD")}
    assert T[("Ising5x4S", "FL")] == (2.501, 0.012, 31, 5) and T[("BN20-54L", "BM-PCD")] == (1.620, 1.242, 210, 3)
    assert all(len(v) == 4 and 0 < v[1] < v[0] for v in T.values())  # KL(p*||p) below KL(p_d||p) in every row
