"""Tests of fsll_ooc.baselines (BM-DI, BM-PCD) against brute force on tiny problems."""
import itertools
import sys

import numpy as np
import pytest

from fsll_ooc import baselines
from fsll_ooc.baselines import BoltzmannMachineDI, BoltzmannMachinePCD

pytest.importorskip("scipy")


def _all_states(n):
    return np.array(list(itertools.product((0, 1), repeat=n)), dtype=np.float64)


def _brute(b, W):
    """Brute-force table, log Z and <x x^T> of the {0,1} BM."""
    S = _all_states(len(b))
    lt = S @ b + 0.5 * np.einsum("si,ij,sj->s", S, W, S)
    log_z = np.log(np.exp(lt - lt.max()).sum()) + lt.max()
    p = np.exp(lt - log_z)
    return p, log_z, S.T @ (S * p[:, None])


def _random_params(n, rng, scale=1.0):
    b = rng.normal(scale=scale, size=n)
    W = rng.normal(scale=scale, size=(n, n))
    W = np.triu(W, 1)
    return b, W + W.T


def _data(n=5, N=3000, seed=0):
    rng = np.random.default_rng(seed)
    X = (rng.random((N, n)) < 0.4).astype(np.int64)
    X[:, 1] = X[:, 0] ^ (rng.random(N) < 0.15)
    X[:, 2] = X[:, 0] & X[:, 1] | (rng.random(N) < 0.1)    # a third-order effect
    return X


def _kl_data(X, p_table):
    n = X.shape[1]
    codes = X @ (1 << np.arange(n - 1, -1, -1))
    q = np.bincount(codes, minlength=2**n) / len(X)
    m = q > 0
    return float((q[m] * np.log(q[m] / p_table.ravel()[m])).sum())


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_exact_sums_match_brute_force(n, monkeypatch):
    rng = np.random.default_rng(n)
    b, W = _random_params(n, rng, scale=2.0)
    p, log_z, M = _brute(b, W)
    for block in (2**20, 2):                       # one block / many blocks (online rescale)
        monkeypatch.setattr(baselines, "_BLOCK_CELLS", block)
        sums = baselines._ExactSums(n)
        lz, Mx = sums.moments(b, W)
        assert lz == pytest.approx(log_z, abs=1e-12)
        assert sums.log_partition(b, W) == pytest.approx(log_z, abs=1e-12)
        assert np.allclose(Mx, M, atol=1e-13)
        assert np.allclose(sums.table(b, W, lz).ravel(), p, atol=1e-14)


def test_gradient_matches_finite_differences():
    n = 4
    X = _data(n=n, N=500, seed=1)
    Xf = X.astype(float)
    D, _ = baselines._data_stats(Xf)
    rng = np.random.default_rng(3)
    b, W = _random_params(n, rng, scale=0.5)
    theta = baselines._pack(b, W)

    def kl(th):
        bb, WW = baselines._unpack(th, n)
        return _kl_data(X, _brute(bb, WW)[0])

    _, M = baselines._ExactSums(n).moments(b, W)
    grad = baselines._pack(np.diag(M).copy(), M) - baselines._pack(np.diag(D).copy(), D)
    h = 1e-6
    fd = np.array([(kl(theta + h * e) - kl(theta - h * e)) / (2 * h) for e in np.eye(len(theta))])
    assert np.allclose(grad, fd, atol=1e-7)


def test_di_reaches_ml_optimum():
    X = _data()
    bm = BoltzmannMachineDI().fit(X)
    assert bm.n_params_ == 5 * 6 // 2
    assert bm.converged_
    D = X.T @ X / len(X)
    assert np.max(np.abs(bm.model_moments() - D)) < 1e-5      # moment matching
    p = bm.probabilities()
    assert p.shape == (2,) * 5
    assert abs(p.sum() - 1) < 1e-12
    assert bm.kl_data_ == pytest.approx(_kl_data(X, p), abs=1e-10)
    # the moment-matching point is the minimum: perturbations only increase KL
    rng = np.random.default_rng(0)
    for _ in range(5):
        db, dW = _random_params(5, rng, scale=0.05)
        q, _, _ = _brute(bm.bias_ + db, bm.weights_ + dW)
        assert _kl_data(X, q) > bm.kl_data_
    # L-BFGS-B reaches the same optimum
    bm2 = BoltzmannMachineDI(method="L-BFGS-B").fit(X)
    assert bm2.kl_data_ == pytest.approx(bm.kl_data_, abs=1e-9)


def test_log_prob_consistent_with_probabilities():
    X = _data(seed=2)
    for model in (BoltzmannMachineDI(), BoltzmannMachinePCD(chain_length=200, random_state=0)):
        model.fit(X)
        p = model.probabilities()
        S = _all_states(5).astype(np.int64)
        assert np.allclose(np.exp(model.log_prob(S)), p.ravel(), rtol=1e-12, atol=0)
        assert model.score(X) == pytest.approx(np.mean(np.log(p[tuple(X.T)])), abs=1e-12)
        assert abs(p.sum() - 1) < 1e-12


def test_pcd_close_to_di():
    X = _data(seed=3)
    di = BoltzmannMachineDI().fit(X)
    pcd = BoltzmannMachinePCD(random_state=0).fit(X)             # the paper's setting
    assert pcd.n_params_ == di.n_params_
    assert di.kl_data_ <= pcd.kl_data_ + 1e-12
    assert pcd.kl_data_ - di.kl_data_ < 0.01
    # reproducible from random_state
    pcd2 = BoltzmannMachinePCD(chain_length=50, random_state=1).fit(X)
    pcd3 = BoltzmannMachinePCD(chain_length=50, random_state=1).fit(X)
    assert np.array_equal(pcd2.weights_, pcd3.weights_)


def test_params_stored_verbatim():
    m = BoltzmannMachinePCD(learning_rate=0.5, n_chains=7, chain_length=3, random_state=11)
    assert (m.learning_rate, m.n_chains, m.chain_length, m.random_state) == (0.5, 7, 3, 11)
    d = BoltzmannMachineDI(max_iter=12, tol=1e-3)
    assert (d.max_iter, d.tol) == (12, 1e-3)
    assert not hasattr(d, "bias_")


def test_input_validation():
    with pytest.raises(ValueError, match="binary"):
        BoltzmannMachineDI().fit(np.array([[0, 1], [2, 0]]))
    with pytest.raises(ValueError, match="binary"):
        BoltzmannMachinePCD(chain_length=1).fit(np.array([[0.5, 1.0]]))
    with pytest.raises(ValueError, match="at most n = 24"):
        BoltzmannMachineDI().fit(np.zeros((3, 25), dtype=np.int64))
    with pytest.raises(ValueError, match="at most n = 24"):
        BoltzmannMachinePCD().fit(np.zeros((3, 25), dtype=np.int64))
    with pytest.raises(RuntimeError, match="not fitted"):
        BoltzmannMachineDI().log_prob(np.zeros((1, 3), dtype=np.int64))
    bm = BoltzmannMachineDI().fit(_data(n=3, N=200))
    with pytest.raises(ValueError, match="3"):
        bm.log_prob(np.zeros((2, 4), dtype=np.int64))


def test_missing_scipy_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    with pytest.raises(ImportError, match=r"pip install fsll-ooc\[bench\]"):
        BoltzmannMachineDI().fit(_data(n=3, N=50))


def test_n20_runs_and_stays_exact():
    """One n = 20 exact evaluation: normalised table, consistent log_prob."""
    rng = np.random.default_rng(0)
    X = (rng.random((200, 20)) < 0.5).astype(np.int64)
    bm = BoltzmannMachinePCD(chain_length=20, random_state=0).fit(X)
    p = bm.probabilities()
    assert p.shape == (2,) * 20 and abs(p.sum() - 1) < 1e-10
    assert np.allclose(np.exp(bm.log_prob(X[:10])), p[tuple(X[:10].T)], rtol=1e-10)
