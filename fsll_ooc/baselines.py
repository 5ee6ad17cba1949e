"""The paper's two baselines: fully visible Boltzmann machines BM-DI and BM-PCD.

Model (the paper's Eq. "BM", binary ``x_i in {0, 1}``, no hidden units, no
temperature)::

    p_theta(x) = exp(l_theta(x)) / Z(theta),
    l_theta(x) = sum_{i<j} W_ij x_i x_j + sum_i b_i x_i

with ``n(n+1)/2`` parameters (``n`` biases ``bias_`` plus ``n(n-1)/2`` weights; 210
for ``n = 20``).  ``weights_`` is stored as a symmetric ``n x n`` matrix with a zero
diagonal.  The data are the ``0/1`` values themselves (the ``{0, 1}`` encoding of the
paper; a ``+-1`` encoding spans the same family, so the maximum-likelihood
distribution is the same, but the gradient scale -- and so PCD's learning rate --
refers to ``{0, 1}``).

The gradient of ``KL(p_d || p_theta)`` is ``<x_i x_j>_p - <x_i x_j>_d`` (and
``<x_i>_p - <x_i>_d`` for the biases).

* :class:`BoltzmannMachineDI` ("direct integration") evaluates ``log Z`` and the model
  moments exactly by summing over all ``2^n`` states and minimises
  ``KL(p_d || p_theta)`` (no regulariser) with scipy's quasi-Newton optimiser.
* :class:`BoltzmannMachinePCD` estimates the model moments by persistent contrastive
  divergence (Tieleman 2008): ``n_chains`` Gibbs chains, one sweep per parameter
  update, ``chain_length`` updates.

Both compute ``log Z`` exactly after fitting, so ``log_prob``, ``probabilities``,
``score`` and ``kl_data_`` are exact for the learned parameters.  The exact sums keep
the ``2^n x n`` state matrix implicit: the variables are split into a high half
``H`` and a low half ``L``; ``l_theta`` on a block of high states times all low states
is ``e_H[:, None] + e_L[None, :] + B_H W_HL B_L^T`` (small matrix products), and the
moments follow from row sums, column sums and one product ``B_H^T P B_L``.  Blocks
hold at most ``2^20`` states (8 MiB), so memory stays far below 1 GiB up to the
limit of ``n = 24`` variables.

scipy is needed by :class:`BoltzmannMachineDI` only (``pip install fsll-ooc[bench]``).

Example
-------
>>> import numpy as np
>>> from fsll_ooc.baselines import BoltzmannMachineDI
>>> rng = np.random.default_rng(0)
>>> X = (rng.random((500, 4)) < 0.3).astype(np.int64)
>>> X[:, 1] = X[:, 0] ^ (rng.random(500) < 0.1)
>>> bm = BoltzmannMachineDI().fit(X)
>>> bm.n_params_, round(float(bm.probabilities().sum()), 12)
(10, 1.0)
>>> bool(np.allclose(bm.model_moments(), X.T @ X / len(X), atol=1e-5))   # moment matching
True
"""
from __future__ import annotations

import time

import numpy as np

__all__ = ["BoltzmannMachineDI", "BoltzmannMachinePCD", "MAX_VARIABLES"]

#: Largest number of variables the exact sums over ``2^n`` states accept.
MAX_VARIABLES = 24

_BLOCK_CELLS = 2**20


# --------------------------------------------------------------------------- helpers
def _states(k: int) -> np.ndarray:
    """``(2^k, k)`` float64 0/1 matrix of all states of ``k`` bits, C order (bit 0 = slowest)."""
    idx = np.arange(2**k, dtype=np.int64)
    shifts = np.arange(k - 1, -1, -1, dtype=np.int64)
    return ((idx[:, None] >> shifts[None, :]) & 1).astype(np.float64)


def _check_binary(X, n_expected=None) -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D array (n_samples, n_variables), got shape {X.shape}")
    if X.shape[0] == 0:
        raise ValueError("X has no samples")
    bad = (X != 0) & (X != 1)
    if np.any(bad):
        vals = np.unique(np.asarray(X)[bad])[:5]
        raise ValueError(
            "Boltzmann machines are binary models: every value of X must be 0 or 1, "
            f"found e.g. {vals.tolist()}"
        )
    n = X.shape[1]
    if n_expected is not None and n != n_expected:
        raise ValueError(f"X has {n} variables, the model was fitted on {n_expected}")
    if n < 1:
        raise ValueError("X has no variables")
    if n > MAX_VARIABLES:
        raise ValueError(
            f"X has {n} variables; these baselines sum over all 2^n states exactly "
            f"and accept at most n = {MAX_VARIABLES}"
        )
    return X.astype(np.float64)


def _data_stats(Xf: np.ndarray):
    """Second-moment matrix ``<x x^T>_d`` (diagonal = ``<x_i>_d``) and entropy of ``p_d``."""
    N, n = Xf.shape
    D = Xf.T @ Xf / N
    codes = Xf.astype(np.int64) @ (np.int64(1) << np.arange(n - 1, -1, -1, dtype=np.int64))
    _, counts = np.unique(codes, return_counts=True)
    q = counts / N
    entropy = float(-(q * np.log(q)).sum())
    return D, entropy


def _pack(b: np.ndarray, W: np.ndarray) -> np.ndarray:
    iu = np.triu_indices(len(b), 1)
    return np.concatenate([b, W[iu]])


def _unpack(theta: np.ndarray, n: int):
    b = theta[:n].copy()
    W = np.zeros((n, n))
    iu = np.triu_indices(n, 1)
    W[iu] = theta[n:]
    W += W.T
    return b, W


class _ExactSums:
    """Exact ``log Z``, moments and tables of a fully visible BM over ``n <= 24`` bits."""

    def __init__(self, n: int):
        self.n = n
        self.h = n // 2
        self.l = n - self.h
        self.BH = _states(self.h)
        self.BL = _states(self.l)
        self.rows = max(1, min(2**self.h, _BLOCK_CELLS // 2**self.l))

    def _parts(self, b, W):
        h = self.h
        bH, bL = b[:h], b[h:]
        WHH, WLL, WHL = W[:h, :h], W[h:, h:], W[:h, h:]
        eH = self.BH @ bH + 0.5 * np.einsum("si,ij,sj->s", self.BH, WHH, self.BH)
        eL = self.BL @ bL + 0.5 * np.einsum("si,ij,sj->s", self.BL, WLL, self.BL)
        right = WHL @ self.BL.T                     # (h, 2^l)
        return eH, eL, right

    def _blocks(self, b, W):
        eH, eL, right = self._parts(b, W)
        for r0 in range(0, 2**self.h, self.rows):
            r1 = min(r0 + self.rows, 2**self.h)
            BHc = self.BH[r0:r1]
            logits = BHc @ right
            logits += eH[r0:r1, None]
            logits += eL[None, :]
            yield r0, r1, BHc, logits

    def log_partition(self, b, W) -> float:
        m, z = -np.inf, 0.0
        for _, _, _, lg in self._blocks(b, W):
            mb = float(lg.max())
            mn = max(m, mb)
            z = z * np.exp(m - mn) + float(np.exp(lg - mn).sum())
            m = mn
        return m + np.log(z)

    def moments(self, b, W):
        """``(log Z, M)`` with ``M = <x x^T>_p`` (its diagonal holds ``<x_i>_p``)."""
        h, n = self.h, self.n
        m = -np.inf
        z = 0.0
        MHH = np.zeros((h, h))
        MHL = np.zeros((h, n - h))
        col = np.zeros(2**self.l)
        for _, _, BHc, lg in self._blocks(b, W):
            mb = float(lg.max())
            if mb > m:
                s = np.exp(m - mb) if np.isfinite(m) else 0.0
                z *= s
                MHH *= s
                MHL *= s
                col *= s
                m = mb
            w = np.exp(lg - m, out=lg)
            row = w.sum(axis=1)
            z += float(row.sum())
            col += w.sum(axis=0)
            MHH += (BHc * row[:, None]).T @ BHc
            MHL += BHc.T @ (w @ self.BL)
        MLL = (self.BL * col[:, None]).T @ self.BL
        M = np.empty((n, n))
        M[:h, :h] = MHH
        M[h:, h:] = MLL
        M[:h, h:] = MHL
        M[h:, :h] = MHL.T
        M /= z
        return m + np.log(z), M

    def table(self, b, W, log_z) -> np.ndarray:
        out = np.empty((2**self.h, 2**self.l))
        for r0, r1, _, lg in self._blocks(b, W):
            lg -= log_z
            np.exp(lg, out=out[r0:r1])
        return out.reshape((2,) * self.n)


def _l_theta(Xf, b, W):
    return Xf @ b + 0.5 * np.einsum("si,ij,sj->s", Xf, W, Xf)


# --------------------------------------------------------------------------- base class
class _BoltzmannBase:
    def _finish(self, Xf, D, entropy, b, W):
        n = Xf.shape[1]
        self.n_features_in_ = n
        self.bias_ = b
        self.weights_ = W
        self.n_params_ = n * (n + 1) // 2
        self._sums = _ExactSums(n)
        self.log_partition_ = float(self._sums.log_partition(b, W))
        theta_dot_md = float(b @ np.diag(D) + 0.5 * np.sum(W * D))
        self.kl_data_ = float(max(-entropy - theta_dot_md + self.log_partition_, 0.0))

    def _check_fitted(self):
        if not hasattr(self, "bias_"):
            raise RuntimeError(f"this {type(self).__name__} is not fitted yet; call fit(X) first")

    def log_prob(self, X) -> np.ndarray:
        """Natural-log probability of every row of ``X`` under the fitted model."""
        self._check_fitted()
        Xf = _check_binary(X, self.n_features_in_)
        return _l_theta(Xf, self.bias_, self.weights_) - self.log_partition_

    def score(self, X) -> float:
        """Mean log-likelihood per sample (nats; higher is better)."""
        return float(np.mean(self.log_prob(X)))

    def probabilities(self) -> np.ndarray:
        """Dense table of ``p_theta`` with shape ``(2,) * n`` (C order, variable 0 slowest)."""
        self._check_fitted()
        return self._sums.table(self.bias_, self.weights_, self.log_partition_)

    def model_moments(self) -> np.ndarray:
        """Exact ``<x x^T>_p`` (``n x n``; the diagonal holds ``<x_i>_p``)."""
        self._check_fitted()
        return self._sums.moments(self.bias_, self.weights_)[1]


# --------------------------------------------------------------------------- BM-DI
class BoltzmannMachineDI(_BoltzmannBase):
    """Fully visible Boltzmann machine fitted with the exact gradient (the paper's BM-DI).

    Minimises ``KL(p_d || p_theta)`` (no regulariser) with
    ``scipy.optimize.minimize(method=method, jac=True)`` starting from ``theta = 0``;
    ``log Z`` and ``<x_i x_j>_p`` are exact sums over the ``2^n`` states.

    Parameters
    ----------
    max_iter : int
        Maximum number of quasi-Newton iterations.
    tol : float
        Gradient tolerance: stop when every component of
        ``<x_i x_j>_p - <x_i x_j>_d`` is below ``tol`` in absolute value (``gtol``).
    method : {"BFGS", "L-BFGS-B"}
        scipy optimiser. BFGS (the paper's choice) needed about half the gradient
        evaluations of L-BFGS-B on the paper's n = 20 datasets; both reach the same
        optimum.

    Attributes
    ----------
    bias_, weights_ : learned ``b`` (``n``) and symmetric ``W`` (``n x n``, zero diagonal).
    log_partition_ : ``log Z(theta)``.
    n_params_ : ``n (n + 1) / 2``.
    kl_data_ : ``KL(p_d || p_theta)`` in nats at the end of fitting.
    n_iter_, converged_, fit_time_ : optimiser iterations, its success flag, seconds.
    """

    def __init__(self, max_iter: int = 5000, tol: float = 1e-7, method: str = "BFGS"):
        self.max_iter = max_iter
        self.tol = tol
        self.method = method

    def fit(self, X, y=None):
        try:
            from scipy.optimize import minimize
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "BoltzmannMachineDI needs scipy: pip install fsll-ooc[bench]"
            ) from exc
        if self.method not in ("L-BFGS-B", "BFGS"):
            raise ValueError(f"method must be 'L-BFGS-B' or 'BFGS', got {self.method!r}")
        t0 = time.perf_counter()
        Xf = _check_binary(X)
        n = Xf.shape[1]
        D, entropy = _data_stats(Xf)
        md = _pack(np.diag(D).copy(), D)
        sums = _ExactSums(n)

        def fun(theta):
            b, W = _unpack(theta, n)
            log_z, M = sums.moments(b, W)
            f = -entropy - float(theta @ md) + log_z
            g = _pack(np.diag(M).copy(), M) - md
            return f, g

        if self.method == "L-BFGS-B":
            options = {"maxiter": int(self.max_iter), "maxfun": 10 * int(self.max_iter),
                       "gtol": float(self.tol), "ftol": 1e-15}
        else:
            options = {"maxiter": int(self.max_iter), "gtol": float(self.tol)}
        res = minimize(fun, np.zeros(n * (n + 1) // 2), jac=True, method=self.method,
                       options=options)
        b, W = _unpack(res.x, n)
        self._finish(Xf, D, entropy, b, W)
        self.n_iter_ = int(res.nit)
        self.converged_ = bool(res.success)
        self.fit_time_ = time.perf_counter() - t0
        return self


# --------------------------------------------------------------------------- BM-PCD
class BoltzmannMachinePCD(_BoltzmannBase):
    """Fully visible Boltzmann machine trained by persistent contrastive divergence (BM-PCD).

    Starting point: ``W = 0`` and biases at the logits of the data marginals (clipped to
    ``[1/(N+2), 1 - 1/(N+2)]``), i.e. the best independent model; the ``n_chains``
    persistent chains start from independent draws of that model.  Each of the
    ``chain_length`` steps does one systematic-scan Gibbs sweep of every chain, then one
    gradient-ascent step ``theta += learning_rate * (<x x^T>_d - <x x^T>_chains)``.
    The paper's setting is the default: learning rate 0.01, 100 chains, length 10000.

    ``log Z`` is computed exactly after training (``n <= 24``), so ``log_prob``,
    ``probabilities``, ``score`` and ``kl_data_`` are exact for the learned parameters.

    Parameters
    ----------
    learning_rate : float
    n_chains : int
    chain_length : int
        Number of Gibbs sweeps = number of parameter updates.
    random_state : None, int or numpy Generator

    Attributes
    ----------
    bias_, weights_, log_partition_, n_params_, kl_data_, fit_time_ : as for
    :class:`BoltzmannMachineDI`.
    """

    def __init__(self, learning_rate: float = 0.01, n_chains: int = 100,
                 chain_length: int = 10000, random_state=None):
        self.learning_rate = learning_rate
        self.n_chains = n_chains
        self.chain_length = chain_length
        self.random_state = random_state

    def fit(self, X, y=None):
        t0 = time.perf_counter()
        Xf = _check_binary(X)
        N, n = Xf.shape
        C = int(self.n_chains)
        T = int(self.chain_length)
        lr = float(self.learning_rate)
        if C < 1 or T < 0:
            raise ValueError("n_chains must be >= 1 and chain_length >= 0")
        rng = np.random.default_rng(self.random_state)
        D, entropy = _data_stats(Xf)
        mu = np.clip(np.diag(D), 1.0 / (N + 2), 1.0 - 1.0 / (N + 2))
        b = np.log(mu) - np.log1p(-mu)
        W = np.zeros((n, n))
        S = (rng.random((C, n)) < mu).astype(np.float64)
        offdiag = ~np.eye(n, dtype=bool)
        for _ in range(T):
            # uniforms turned into logistic thresholds:
            # u < sigmoid(field)  <=>  field > log(u) - log(1 - u)
            U = rng.random((C, n))
            thr = np.log(U) - np.log1p(-U)
            for i in range(n):
                field = S @ W[:, i]
                field += b[i]
                S[:, i] = field > thr[:, i]
            M = S.T @ S / C
            G = D - M
            b += lr * np.diag(G)
            W += lr * np.where(offdiag, G, 0.0)
        self._finish(Xf, D, entropy, b, W)
        self.fit_time_ = time.perf_counter() - t0
        return self
