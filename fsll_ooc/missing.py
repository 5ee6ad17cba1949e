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

from . import basis, cost as C

__all__ = ["MISSING", "Pattern", "EMResult", "MStep", "group_patterns", "e_step", "objective",
           "uniform_mean_log_p", "initial_table", "run_em", "fit_em", "split_missing", "log_prob", "impute",
           "posterior", "CHUNK_CELLS"]

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


def split_missing(X, *, codes_missing: bool = True, fill: Sequence | None = None):
    """``(X with its missing cells filled, mask of the missing cells or None)``.

    Missing: NaN, None and ``pd.NA`` (numpy float and object arrays, DataFrames) and,
    when ``codes_missing``, the code :data:`MISSING` in an integer array.  A missing
    cell is filled with a value its column already holds (its first observed one), so
    the categories found by encoding the filled data are those of the observed cells.
    A column with no observed cell is filled with ``fill[j]`` when given, else it raises
    ``ValueError`` naming the column.
    """
    if hasattr(X, "columns") and hasattr(X, "isna"):
        mask = np.asarray(X.isna().to_numpy(), bool)
        if not mask.any():
            return X, None
        X = X.copy()
        for j in np.flatnonzero(mask.any(axis=0)):
            col = X.iloc[:, j]
            seen = np.flatnonzero(~mask[:, j])
            if not len(seen) and fill is None:
                raise ValueError(f"column {X.columns[j]!r} has no observed value (every cell is missing); "
                                 "a variable missing in every row is a hidden variable: FSLL(hidden=[k])")
            value = col.iloc[int(seen[0])] if len(seen) else fill[j]
            X[X.columns[j]] = col.fillna(value)
        return X, mask
    if isinstance(X, (list, tuple)):
        try:
            X = np.asarray(X)
        except ValueError:
            return X, None
    if not isinstance(X, np.ndarray) or X.ndim != 2 or X.size == 0:
        return X, None
    kind = X.dtype.kind
    if kind == "f":
        mask = np.isnan(X)
    elif kind == "O":
        import pandas as pd

        mask = np.asarray(pd.isna(X), bool)
    elif kind in "iu" and codes_missing:
        mask = X == MISSING if kind == "i" else np.zeros(X.shape, bool)
    else:
        return X, None
    if not mask.any():
        return X, None
    X = X.copy()
    for j in np.flatnonzero(mask.any(axis=0)):
        seen = np.flatnonzero(~mask[:, j])
        if not len(seen) and fill is None:
            raise ValueError(f"column {j} (X{j}) has no observed value (every cell is missing); a variable "
                             "missing in every row is a hidden variable: FSLL(hidden=[k])")
        X[mask[:, j], j] = X[seen[0], j] if len(seen) else fill[j]
    return X, mask


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
    restart: int = 0
    kl_soft: float = math.nan  # KL(completed data || p) at the end


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
        p = learner.table()
        cells, weights, ll = e_step(p, patterns)
        j = objective(ll, N, learner.uniform_mean_log_p(), learner.penalty())
        res.kl_soft = float(weights @ (np.log(weights / N) - np.log(p.reshape(-1)[cells]))) / N
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


class MStep:
    """The M-step of :func:`run_em` over an in-core engine and a fit state.

    ``run(engine, state, fresh)`` runs the learner (the estimator's, with its options);
    ``scratch()`` returns the engine's scratch table as a numpy array (written by
    ``engine.density``).  The first ``m_step`` starts from ``theta = 0`` (the state as
    created, uniform duals); later ones re-read the targets on the support and
    continue from the current ``theta`` (the learner re-derives the duals exactly).
    """

    def __init__(self, engine, state, run, scratch, dbar_table: int = 0):
        self.engine, self.state, self.run, self.scratch = engine, state, run, scratch
        self.dbar_table = dbar_table
        self.fresh = True

    @property
    def n_iter(self) -> int:
        return self.state.n_iter

    def m_step(self, cells: np.ndarray, weights: np.ndarray) -> None:
        st, eng = self.state, self.engine
        eng.compute_targets(cells, st.n_samples, weights=weights)
        st.entropy_q = C.target_entropy(weights, st.n_samples, math.prod(st.cards))
        if self.fresh:
            eng.init_duals()
        else:
            sup = np.fromiter(st.theta.keys(), np.int64, len(st.theta))
            st.dbar = dict(zip(sup.tolist(), eng.gather(sup, self.dbar_table).tolist()))
            st.converged = False
        self.run(eng, st, self.fresh)
        self.fresh = False

    def table(self) -> np.ndarray:
        st = self.state
        sup = np.fromiter(st.theta.keys(), np.int64, len(st.theta))
        val = np.fromiter(st.theta.values(), np.float64, len(st.theta))
        total = self.engine.density(sup, val, st.log_z)
        return self.scratch().reshape(st.cards) / total

    def uniform_mean_log_p(self) -> float:
        st = self.state
        return uniform_mean_log_p({st.digits(y): v for y, v in st.theta.items()}, st.cards, st.log_z)

    def penalty(self) -> float:
        return float(sum(self.state.penalties(self.state.theta)))


def fit_em(make_learner: Callable[[], MStep], codes: np.ndarray, cards: Sequence[int], *, n_hidden: int = 0,
           n_restarts: int = 1, random_state=None, tol: float, max_rounds: int = 100,
           progress: Callable[[dict], None] | None = None) -> EMResult:
    """:func:`run_em` from ``n_restarts`` first-round tables (seeds drawn from ``random_state``);
    returns the run with the lowest final objective (its ``learner`` holds the model)."""
    seeds = np.random.SeedSequence(random_state if random_state is None else int(random_state)).generate_state(
        max(1, int(n_restarts)))
    best = None
    for r, seed in enumerate(seeds.tolist()):
        res = run_em(make_learner(), codes, cards, n_hidden=n_hidden, tol=tol, max_rounds=max_rounds, seed=seed,
                     progress=None if progress is None else (lambda e, r=r: progress({**e, "restart": r})))
        res.restart = r
        if best is None or res.objective < best.objective:
            best = res
    return best


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


# --------------------------------------------------------------------------- the estimator's door

def check_params(est) -> None:
    """Validate :class:`~fsll_ooc.FSLL`'s EM parameters (``ValueError`` naming the parameter)."""
    if est.missing not in (None, "em"):
        raise ValueError(f"missing must be None or 'em', got {est.missing!r}")
    if est.hidden is not None:
        h = est.hidden
        if isinstance(h, (str, bytes)) or not hasattr(h, "__iter__"):
            raise ValueError(f"hidden must be a sequence of cardinalities, e.g. [3], got {h!r}")
        for k in h:
            if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 2:
                raise ValueError(f"hidden cardinalities must be integers >= 2, got {k!r} in {list(h)!r}")
    if est.n_restarts is not None and (isinstance(est.n_restarts, (bool, np.bool_))
                                       or not isinstance(est.n_restarts, (int, np.integer)) or est.n_restarts < 1):
        raise ValueError(f"n_restarts must be a positive int or None, got {est.n_restarts!r}")
    if est.random_state is not None and (isinstance(est.random_state, (bool, np.bool_))
                                         or not isinstance(est.random_state, (int, np.integer))
                                         or est.random_state < 0):
        raise ValueError(f"random_state must be a non-negative int or None, got {est.random_state!r}")
    if isinstance(est.em_max_rounds, (bool, np.bool_)) or not isinstance(est.em_max_rounds, (int, np.integer)) \
            or est.em_max_rounds < 1:
        raise ValueError(f"em_max_rounds must be a positive int, got {est.em_max_rounds!r}")
    if est.em_tol is not None and not (isinstance(est.em_tol, (int, float)) and not isinstance(est.em_tol, bool)
                                       and est.em_tol >= 0 and math.isfinite(est.em_tol)):
        raise ValueError(f"em_tol must be a non-negative number or None, got {est.em_tol!r}")


def _first_missing(mask: np.ndarray, X) -> str:
    r, c = map(int, np.argwhere(mask)[0])
    name = str(X.columns[c]) if hasattr(X, "columns") else f"X{c}"
    return f"column {c} ({name}), row {r}"


def refuse(X) -> None:
    """The error of a fit without ``missing="em"`` on data with missing cells (NaN/None/NA)."""
    try:
        _, mask = split_missing(X, codes_missing=False)
    except ValueError:  # a column with no observed cell: missing all the same
        mask = np.asarray(X.isna().to_numpy() if hasattr(X, "isna") else np.isnan(np.asarray(X, float)))
    if mask is not None:
        raise ValueError(f"missing value at {_first_missing(mask, X)} ({int(mask.sum()):,} missing cells in "
                         f"{int(mask.any(axis=1).sum()):,} rows); pass FSLL(missing='em') to fit incomplete rows "
                         "by EM, or drop them")


def _n_hidden(est) -> int:
    return int(getattr(est, "n_hidden_", len(est.hidden or ())))


def fit(est, X, backend: str) -> bool:
    """The EM fit of ``est`` on ``X`` (in core); ``False`` when ``X`` is complete and
    nothing is hidden (the caller then runs the ordinary fit, with the same bits)."""
    from .engine import engine as _engine
    from .estimator import _check_code_range, validate_data
    from .learn import FitState, learn, resolve_epsilon

    Xf, mask = split_missing(X)
    hidden = [int(k) for k in (est.hidden or ())]
    if mask is None and not hidden:
        return False
    if backend != "numpy":
        raise ValueError("missing='em' and hidden= fit in core only (store=None); an out-of-core store cannot "
                         "hold the EM rounds yet")
    feature_names = list(map(str, X.columns)) if hasattr(X, "columns") else None
    categories = None
    if hasattr(Xf, "columns"):
        from .io import encode

        enc = encode(Xf, est.cardinalities)
        codes_, cards, categories = enc.codes, enc.cardinalities, enc.categories
        codes_, cards = validate_data(codes_, cards)
    else:
        codes_, cards = validate_data(_check_code_range(Xf), est.cardinalities)
    codes_ = np.array(codes_, np.int64)
    if mask is not None:
        codes_[mask] = MISSING
    N, n_obs = codes_.shape
    if hidden:
        codes_ = np.concatenate([codes_, np.full((N, len(hidden)), MISSING, np.int64)], axis=1)
        cards = tuple(cards) + tuple(hidden)
        if feature_names is not None:
            taken = set(feature_names)
            feature_names += [f"H{j}" if f"H{j}" not in taken else f"_H{j}" for j in range(len(hidden))]
        if categories is not None:
            categories = list(categories) + [list(range(k)) for k in hidden]
    validate_data(np.zeros((1, len(cards)), np.int64), cards)  # the joint table's limits
    plan = est._make_plan(cards, backend)
    bar = est._bar("fsll EM")

    def run(engine, state, fresh):
        learn(engine, state, epsilon=est.epsilon, max_iter=est.max_iter, resync_every=est.resync_every,
              fresh=fresh, progress=None, callback=None, refine=est.refine)

    def make():
        engine, specs = est._open_engine(plan, backend, cards, N, create=True)
        state = FitState(cards, N, 0.0, log_z=math.log(math.prod(cards)))
        lr = MStep(engine, state, run, lambda: specs[_engine.SCR].array, dbar_table=_engine.D)
        lr.specs = specs
        return lr

    def shown(e):
        if bar is not None:
            bar.update(1)
            bar.set_postfix(objective=f"{e['objective']:.6f}", restart=e["restart"], refresh=False)

    restarts = est.n_restarts if est.n_restarts is not None else (3 if hidden else 1)
    tol = est.em_tol if est.em_tol is not None else resolve_epsilon(est.epsilon, N)
    try:
        res = fit_em(make, codes_, cards, n_hidden=len(hidden), n_restarts=restarts, random_state=est.random_state,
                     tol=tol, max_rounds=est.em_max_rounds, progress=shown)
    finally:
        if bar is not None:
            bar.close()
    lr = res.learner
    est._finish(lr.state, plan, backend, lr.specs, lr.engine)
    est.kl_data_ = res.kl_soft
    est.em_objective_, est.em_loglik_ = res.objective, res.loglik
    est.em_history_, est.em_converged_, est.em_rounds_ = res.history, res.converged, res.rounds
    est.n_hidden_ = len(hidden)
    est.feature_names_in_ = feature_names
    est.categories_ = categories
    return True


def codes(est, X) -> tuple[np.ndarray, bool]:
    """Codes of ``X`` for a fitted model, ``-1`` at missing cells and at hidden variables
    (``X`` may omit the hidden columns); and whether any cell is ``-1``."""
    est._check_fitted()
    h = _n_hidden(est)
    n = len(est.cardinalities_)
    cats = getattr(est, "categories_", None)
    fill = [c[0] for c in cats] if cats is not None else [0] * n
    Xf, mask = split_missing(X, fill=fill)
    if h:
        width = Xf.shape[1] if hasattr(Xf, "shape") and len(np.shape(Xf)) == 2 else None
        if width == n - h:  # the observed columns only: the hidden ones are missing
            if hasattr(Xf, "columns"):
                names = (getattr(est, "feature_names_in_", None) or [])[n - h:] or [f"H{j}" for j in range(h)]
                Xf = Xf.assign(**{nm: fill[n - h + j] for j, nm in enumerate(names)})
            else:
                Xf = np.concatenate([np.asarray(Xf), np.zeros((Xf.shape[0], h), np.asarray(Xf).dtype)], axis=1)
            extra = np.zeros((Xf.shape[0], h), bool)
            mask = np.concatenate([mask if mask is not None else np.zeros((Xf.shape[0], n - h), bool),
                                   ~extra], axis=1)
    out = est._codes(Xf)
    if mask is not None:
        if mask.shape != out.shape:
            mask = mask.reshape(out.shape)
        out = np.array(out, np.int64)
        out[mask] = MISSING
        return out, bool(mask.any())
    return out, False


def impute_frame(est, X, method: str, random_state):
    """:func:`impute` on what the user has: a DataFrame comes back with labels, an array as codes."""
    c, _ = codes(est, X)
    h = _n_hidden(est)
    n = len(est.cardinalities_)
    out = impute(est, c, method=method, random_state=random_state, hidden=tuple(range(n - h, n)))[:, :n - h]
    if hasattr(X, "columns") and getattr(est, "categories_", None) is not None:
        from .io import decode

        names = list(X.columns)[:n - h]
        df = decode(out, est.categories_[:n - h], names)
        df.index = X.index
        return df
    return out


def predict_hidden(est, X):
    """Posteriors over the hidden variables: ``(N, k)`` for one, a list of ``(N, k_j)`` for several."""
    h = _n_hidden(est)
    if not h:
        raise ValueError("this model has no hidden variables; fit with FSLL(hidden=[k, ...])")
    c, _ = codes(est, X)
    n = len(est.cardinalities_)
    axes = tuple(range(n - h, n))
    post = posterior(est, c, axes)
    if h == 1:
        return post
    hc = tuple(est.cardinalities_[a] for a in axes)
    joint = post.reshape((-1,) + hc)
    return [joint.sum(axis=tuple(j + 1 for j in range(h) if j != i)) for i in range(h)]
