"""Incomplete rows and hidden variables: EM over the full-span model.

A missing cell is the code :data:`MISSING` (``-1``) in a row of codes.  A hidden
variable is a column missing in every row.  Both are fitted by the same
expectation-maximisation loop (``docs/design.md``, "Missing cells and hidden
variables"):

* **E-step** (:func:`e_step`): each incomplete row is spread over its completions
  under the current model, exactly: the slice of ``p`` fixed by the row's observed
  cells, divided by its sum.  Rows are grouped by their missingness pattern
  (:func:`group_patterns`), and within a pattern by their observed values, so a
  pattern costs one gather of ``u * prod(k_missing)`` cells of ``p`` (``u`` distinct
  observed rows; never more than the table's size).  The result is soft counts: ``(cell, weight)`` pairs whose
  weights sum to ``N``, the number of rows.
* **M-step**: the learner, warm-started from the current ``theta``, on the targets of
  the soft counts (the same positivity rule and the same cost, with ``N`` the number
  of rows).

The objective (:func:`objective`) is the cost's observed-data counterpart::

    J(theta) = -(LL_obs(theta) + E_u[log p_theta]) / (N + 1) + sum_{y in support} r_y

``LL_obs`` is the observed-data log-likelihood (each row's log-probability of its
observed cells), ``E_u[log p_theta]`` the positivity rule's pseudo-sample.  With
complete data ``J`` is the learner's cost plus the (constant) entropy of its target.
``J`` never goes up from round to round: the E-step makes ``J`` and the M-step's
cost touch at the current ``theta`` and lie above it elsewhere (Jensen), and the
learner only takes moves that lower its cost.

The first round has no model yet: its E-step uses an independence model of the
observed frequencies or, with hidden variables, a latent-class model fitted to the
observed cells from a seeded random start (:func:`initial_table`); random restarts
differ only in that seed.

Everything here works on a dense in-core table (``numpy``); the queries with missing
cells (:func:`log_prob`, :func:`impute`, :func:`posterior`) also work on a model
whose table is a dask array over an out-of-core store.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from . import basis

__all__ = ["MISSING", "Pattern", "EMResult", "group_patterns", "e_step", "objective", "uniform_mean_log_p",
           "initial_table", "run_em", "log_prob", "impute", "posterior", "CHUNK_CELLS"]

#: The code of a missing cell.
MISSING = -1
#: Largest gather (rows x completions) held at once by the E-step and the queries.
CHUNK_CELLS = 2**22


@dataclass(frozen=True, eq=False)
class Pattern:
    """The rows that miss exactly the variables ``missing``.

    ``values[j]`` are the observed codes (on ``observed``, in order) of the ``j``-th
    distinct observed row, ``counts[j]`` how many rows have them; ``rows`` are the
    rows' indices in the data and ``inverse[r]`` the distinct row of ``rows[r]``.
    """

    missing: tuple[int, ...]
    observed: tuple[int, ...]
    values: np.ndarray
    counts: np.ndarray
    rows: np.ndarray
    inverse: np.ndarray


def group_patterns(codes: np.ndarray, cards: Sequence[int]) -> list[Pattern]:
    """Group the rows of ``codes`` (``MISSING`` = -1 marks a missing cell) by missingness pattern.

    Patterns come in a fixed order (the complete pattern first, then by the missing
    set), distinct observed rows in C order of their codes.

    >>> pats = group_patterns(np.array([[0, 1], [-1, 1], [0, 1], [1, -1]]), (2, 2))
    >>> [(p.missing, p.values.tolist(), p.counts.tolist()) for p in pats]
    [((), [[0, 1]], [2]), ((0,), [[1]], [1]), ((1,), [[1]], [1])]
    """
    codes = np.asarray(codes, np.int64)
    cards = tuple(int(k) for k in cards)
    n = codes.shape[1]
    miss = codes < 0
    weights = np.left_shift(np.int64(1), np.arange(n, dtype=np.int64)) if n <= 62 else None
    if weights is not None:
        key = miss.astype(np.int64) @ weights
        masks, inv = np.unique(key, return_inverse=True)
        mask_rows = [(m >> np.arange(n)) & 1 == 1 for m in masks.tolist()]
    else:  # pragma: no cover - more than 62 variables
        mrows, inv = np.unique(miss, axis=0, return_inverse=True)
        mask_rows = list(mrows)
    inv = inv.reshape(-1)
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(len(mask_rows) + 1))
    out = []
    for j in sorted(range(len(mask_rows)), key=lambda j: (int(mask_rows[j].sum()), tuple(np.flatnonzero(mask_rows[j])))):
        rows = order[bounds[j]:bounds[j + 1]]
        mask = np.asarray(mask_rows[j], bool)
        obs = tuple(int(i) for i in np.flatnonzero(~mask))
        mis = tuple(int(i) for i in np.flatnonzero(mask))
        sub = codes[np.ix_(rows, list(obs))] if obs else np.zeros((len(rows), 0), np.int64)
        if obs:
            key = np.ravel_multi_index(tuple(sub.T), tuple(cards[i] for i in obs))
            uk, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
            values = sub[first]
        else:
            values, inverse, counts = np.zeros((1, 0), np.int64), np.zeros(len(rows), np.int64), np.array([len(rows)])
        out.append(Pattern(mis, obs, values, counts.astype(np.float64), rows, inverse.reshape(-1)))
    return out


def _strides(cards: Sequence[int]) -> np.ndarray:
    st = np.ones(len(cards), np.int64)
    for i in range(len(cards) - 2, -1, -1):
        st[i] = st[i + 1] * cards[i + 1]
    return st


def _offsets(cards: Sequence[int], axes: Sequence[int]) -> np.ndarray:
    """Flat offsets of every joint state of ``axes`` (C order over them), other axes at 0."""
    st = _strides(cards)
    off = np.zeros(1, np.int64)
    for a in axes:
        off = (off[:, None] + np.arange(cards[a], dtype=np.int64)[None, :] * st[a]).reshape(-1)
    return off


def _bases(pat: Pattern, cards: Sequence[int]) -> np.ndarray:
    """Flat index of each distinct observed row with its missing cells at 0."""
    if not pat.observed:
        return np.zeros(len(pat.values), np.int64)
    return pat.values @ _strides(cards)[list(pat.observed)]


def _row_chunks(u: int, k: int):
    b = max(1, CHUNK_CELLS // max(k, 1))
    for s in range(0, u, b):
        yield slice(s, min(u, s + b))


def e_step(p: np.ndarray, patterns: Sequence[Pattern]) -> tuple[np.ndarray, np.ndarray, float]:
    """Soft counts of the data under the normalised dense table ``p``.

    Returns ``(cells, weights, loglik)``: the occupied cells (flat, increasing), their
    expected counts (summing to the number of rows), and the observed-data
    log-likelihood ``sum_rows log p(observed cells of the row)`` in nats.
    """
    cards = p.shape
    pf = p.reshape(-1)
    soft = np.zeros(pf.size)
    ll = 0.0
    for pat in patterns:
        base, cnt = _bases(pat, cards), pat.counts
        if not pat.missing:
            soft[base] += cnt  # distinct observed rows: distinct cells
            ll += float(cnt @ np.log(pf[base]))
            continue
        k = math.prod(cards[a] for a in pat.missing)
        off = _offsets(cards, pat.missing)  # len(base) * k <= |X|: the rows' slices of p
        for sl in _row_chunks(len(base), k):
            idx = base[sl, None] + off[None, :]
            P = pf[idx]
            s = P.sum(axis=1)
            ll += float(cnt[sl] @ np.log(s))
            soft[idx.reshape(-1)] += (P * (cnt[sl] / s)[:, None]).reshape(-1)
    cells = np.flatnonzero(soft)
    return cells, soft[cells], ll


def uniform_mean_log_p(theta: dict, cards: Sequence[int], log_z: float) -> float:
    """``E_u[log p_theta]`` under the uniform distribution, from the sparse model (``O(#terms)``).

    ``theta`` maps index tuples ``y`` to ``theta_y``; ``E_u[Phi_y]`` is 0 on a
    Walsh-Hadamard axis with ``y_i != 0`` and ``(2 - k) / k`` on a +-1 axis.
    """
    m = 0.0
    for y, v in theta.items():
        eu = 1.0
        for i, yi in enumerate(y):
            if yi:
                eu *= 0.0 if basis.is_walsh(cards[i]) else (2.0 - cards[i]) / cards[i]
        m += v * eu
    return m - log_z


def objective(loglik: float, n_samples: int, mean_u_log_p: float, penalty: float) -> float:
    """``J = -(LL_obs + E_u[log p]) / (N + 1) + sum r_y``: what EM lowers every round (nats per row)."""
    return -(loglik + mean_u_log_p) / (n_samples + 1.0) + penalty


# --------------------------------------------------------------------------- the first round

def initial_table(codes: np.ndarray, cards: Sequence[int], n_hidden: int = 0, seed=None,
                  rounds: int = 30) -> np.ndarray:
    """The first round's model: a dense table over ``cards`` (the last ``n_hidden`` variables hidden).

    Without hidden variables: the product of each column's observed frequencies (plus
    one pseudo-count spread over its categories).  With them: a latent-class model
    ``pi(h) prod_i f_i(x_i | h)`` over the joint hidden state ``h``, fitted by ``rounds``
    EM steps on the observed cells from Dirichlet-random responsibilities drawn with
    ``seed``; it gives the hidden variables a distinct role from the first round.
    """
    codes = np.asarray(codes, np.int64)
    cards = tuple(int(k) for k in cards)
    n_obs = len(cards) - n_hidden
    obs_cards = cards[:n_obs]
    N = codes.shape[0]
    K = math.prod(cards[n_obs:])
    rng = np.random.default_rng(seed)
    if K == 1:
        resp = np.ones((N, 1))
        rounds = 0
    else:
        resp = rng.dirichlet(np.ones(K), size=N)
    for it in range(rounds + 1):
        pi = (resp.sum(axis=0) + 1.0) / (N + K)
        f = []
        for i, k in enumerate(obs_cards):
            col = codes[:, i]
            seen = col >= 0
            t = np.ones((K, k)) / k  # one pseudo-count per class, spread
            np.add.at(t.T, col[seen], resp[seen])
            f.append(t / t.sum(axis=1, keepdims=True))
        if it == rounds:
            break
        logr = np.log(pi)[None, :].repeat(N, axis=0)
        for i in range(n_obs):
            col = codes[:, i]
            seen = col >= 0
            logr[seen] += np.log(f[i][:, col[seen]].T)
        logr -= logr.max(axis=1, keepdims=True)
        resp = np.exp(logr)
        resp /= resp.sum(axis=1, keepdims=True)
    table = np.zeros(obs_cards + (K,))
    for h in range(K):
        t = np.array(pi[h])
        for i in range(n_obs):
            t = np.multiply.outer(t, f[i][h])
        table[..., h] = t
    return (table / table.sum()).reshape(cards)


# --------------------------------------------------------------------------- the loop

@dataclass
class EMResult:
    """One EM run: its rounds (``history``), final objective and whether it converged."""

    objective: float = math.inf
    loglik: float = -math.inf
    rounds: int = 0
    converged: bool = False
    history: list[dict] = field(default_factory=list)
    learner: object = None
    seed: int | None = None


def run_em(learner, codes: np.ndarray, cards: Sequence[int], *, n_hidden: int = 0, tol: float,
           max_rounds: int = 100, seed=None, progress: Callable[[dict], None] | None = None) -> EMResult:
    """EM from the first round's table (:func:`initial_table` with ``seed``) to convergence.

    ``learner`` is the M-step, an object with

    * ``m_step(cells, weights)``: fit to the soft counts (the first call from
      ``theta = 0``, later ones warm-started from the current ``theta``);
    * ``table()``: the model's normalised dense table;
    * ``uniform_mean_log_p()``, ``penalty()``: ``E_u[log p_theta]`` and ``sum r_y``;
    * ``n_iter``: learner iterations so far.

    The stopping rule: stop after the round whose objective fell by less than ``tol``
    (nats per row), or whose M-step made no move (a fixed point), or after
    ``max_rounds`` M-steps (then ``converged`` is False).
    """
    cards = tuple(int(k) for k in cards)
    N = int(np.asarray(codes).shape[0])
    patterns = group_patterns(codes, cards)
    t0 = time.perf_counter()
    cells, weights, _ = e_step(initial_table(codes, cards, n_hidden, seed), patterns)
    res = EMResult(learner=learner, seed=None if seed is None else int(seed))
    prev = math.inf
    while True:
        before = learner.n_iter
        learner.m_step(cells, weights)
        res.rounds += 1
        cells, weights, ll = e_step(learner.table(), patterns)
        j = objective(ll, N, learner.uniform_mean_log_p(), learner.penalty())
        entry = {"round": res.rounds, "objective": j, "loglik": ll / N, "iters": learner.n_iter - before,
                 "time": time.perf_counter() - t0}
        res.history.append(entry)
        if progress is not None:
            progress(entry)
        res.objective, res.loglik = j, ll / N
        if prev - j < tol or learner.n_iter == before:
            res.converged = True
            break
        if res.rounds >= max_rounds:
            break
        prev = j
    return res


# --------------------------------------------------------------------------- queries with missing cells

def _completions(model, pat: Pattern, table):
    """Yield ``(slice of distinct rows, P)``: ``P[j, m]`` is ``p(observed row j, missing state m)``
    (missing states in C order over ``pat.missing``)."""
    cards = tuple(model.cardinalities_)
    k = math.prod(cards[a] for a in pat.missing)
    u = len(pat.values)
    if table is None:  # enumerate the completions and evaluate the sparse model on them
        grids = np.indices([cards[a] for a in pat.missing]).reshape(len(pat.missing), -1).T
        for sl in _row_chunks(u, k):
            b = sl.stop - sl.start
            full = np.empty((b, k, len(cards)), np.int64)
            for j, a in enumerate(pat.observed):
                full[:, :, a] = pat.values[sl, j][:, None]
            for j, a in enumerate(pat.missing):
                full[:, :, a] = grids[None, :, j]
            lp = model._log_potential(full.reshape(-1, len(cards))) - model.log_z_
            yield sl, np.exp(lp.reshape(b, k))
        return
    if isinstance(table, np.ndarray):
        pf = table.reshape(-1)
        base, off = _bases(pat, cards), _offsets(cards, pat.missing)
        for sl in _row_chunks(u, k):
            yield sl, pf[base[sl, None] + off[None, :]]
        return
    for j in range(u):  # a dask table (out of core): one slice per distinct row
        at = [slice(None)] * len(cards)
        for jj, a in enumerate(pat.observed):
            at[a] = int(pat.values[j, jj])
        sub = table[tuple(at)]
        sub = np.asarray(sub.compute() if hasattr(sub, "compute") else sub, np.float64)
        yield slice(j, j + 1), sub.reshape(1, -1)


def _table_for(model, pat: Pattern, cache: dict):
    """``None`` (enumerate completions) when that is cheaper than building the model's table."""
    cards = tuple(model.cardinalities_)
    size = math.prod(cards)
    k = math.prod(cards[a] for a in pat.missing)
    eng = getattr(model, "_engine", None)
    in_core = eng is not None and eng.layout.a == 0
    if not in_core and "p" not in cache and len(pat.values) * k * max(1, len(model.theta_)) <= 4 * size:
        return None
    if "p" not in cache:
        cache["p"] = model.probabilities()
    return cache["p"]


def log_prob(model, codes: np.ndarray) -> np.ndarray:
    """Natural log of each row's probability, its missing cells (``-1``) marginalised out."""
    codes = np.asarray(codes, np.int64)
    out = np.empty(codes.shape[0])
    cache: dict = {}
    cards = tuple(model.cardinalities_)
    for pat in group_patterns(codes, cards):
        if not pat.missing:
            full = np.empty((len(pat.values), len(cards)), np.int64)
            full[:, list(pat.observed)] = pat.values
            lp = model._log_potential(full) - model.log_z_
        else:
            table = _table_for(model, pat, cache)
            if table is not None and not isinstance(table, np.ndarray):  # out of core: one streamed marginal
                po = table.sum(axis=pat.missing)
                po = np.asarray(po.compute() if hasattr(po, "compute") else po, np.float64)
                lp = np.log(po[tuple(pat.values.T)]) if pat.observed else np.log(np.full(1, float(po)))
            else:
                lp = np.empty(len(pat.values))
                for sl, P in _completions(model, pat, table):
                    lp[sl] = np.log(P.sum(axis=1))
        out[pat.rows] = lp[pat.inverse]
    return out


def _conditionals(model, codes: np.ndarray, keep):
    """Yield ``(pattern, slice, C)`` with ``C[j]`` the distribution of ``keep(pattern)`` (a subset of
    its missing variables, joint, C order) given distinct observed row ``j``."""
    cards = tuple(model.cardinalities_)
    cache: dict = {}
    for pat in group_patterns(codes, cards):
        axes = keep(pat)
        if not pat.missing:
            yield pat, slice(0, len(pat.values)), np.ones((len(pat.values), 1)), axes
            continue
        table = _table_for(model, pat, cache)
        drop = tuple(j + 1 for j, a in enumerate(pat.missing) if a not in axes)
        for sl, P in _completions(model, pat, table):
            P = P.reshape((P.shape[0],) + tuple(cards[a] for a in pat.missing))
            if drop:
                P = P.sum(axis=drop)
            P = P.reshape(P.shape[0], -1)
            yield pat, sl, P / P.sum(axis=1, keepdims=True), axes


def impute(model, codes: np.ndarray, method: str = "mode", random_state=None,
           hidden: Sequence[int] = ()) -> np.ndarray:
    """Fill the missing cells (``-1``) of ``codes`` given each row's observed cells.

    ``method="mode"``: the most probable joint completion of the row's missing cells
    (ties: the lowest codes); ``"sample"``: a draw from that conditional.  Variables
    in ``hidden`` are marginalised out and left as they are.
    """
    if method not in ("mode", "sample"):
        raise ValueError(f"method must be 'mode' or 'sample', got {method!r}")
    codes = np.asarray(codes, np.int64)
    out = codes.copy()
    rng = np.random.default_rng(random_state)
    cards = tuple(model.cardinalities_)
    hid = set(int(h) for h in hidden)
    for pat, sl, C, axes in _conditionals(model, codes, lambda pat: tuple(a for a in pat.missing if a not in hid)):
        if not axes:
            continue
        sel = np.isin(pat.inverse, np.arange(sl.start, sl.stop))
        rows, which = pat.rows[sel], pat.inverse[sel] - sl.start
        if method == "mode":
            pick = np.argmax(C, axis=1)[which]
        else:
            cdf = np.cumsum(C[which], axis=1)
            pick = (cdf < rng.random(len(which))[:, None] * cdf[:, -1:]).sum(axis=1)
            pick = np.minimum(pick, C.shape[1] - 1)
        states = np.unravel_index(pick, tuple(cards[a] for a in axes))
        for a, s in zip(axes, states):
            out[rows, a] = s
    return out


def posterior(model, codes: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """``p(variables axes | observed cells)`` per row: ``(N, prod k_axes)``, joint in C order.

    Every variable in ``axes`` must be missing (``-1``) in every row.
    """
    codes = np.asarray(codes, np.int64)
    axes = tuple(int(a) for a in axes)
    cards = tuple(model.cardinalities_)
    out = np.empty((codes.shape[0], math.prod(cards[a] for a in axes)))
    for pat, sl, C, _ in _conditionals(model, codes, lambda pat: axes):
        sel = np.isin(pat.inverse, np.arange(sl.start, sl.stop))
        out[pat.rows[sel]] = C[pat.inverse[sel] - sl.start]
    return out
