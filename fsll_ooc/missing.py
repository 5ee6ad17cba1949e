"""Incomplete rows and hidden variables: EM over the full-span model.

A missing cell is the code :data:`MISSING` (``-1``) in a row of codes.  A hidden
variable is a column missing in every row.  Both are fitted by the same
expectation-maximisation loop (``docs/design.md``, "Missing cells and hidden
variables"):

* **E-step** (:func:`e_step`): each incomplete row is spread over its completions
  under the current model, exactly: the slice of ``p`` fixed by the row's observed
  cells, divided by its sum.  Identical rows are counted once, and rows whose
  missing variables have the same cardinalities are handled together
  (:func:`group_rows`), so the work is a few array operations per group, not per row
  or per missingness pattern: one gather of ``prod(k_missing)`` cells of ``p`` per
  distinct row.  The result is soft counts: ``(cell, weight)`` pairs whose
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

__all__ = ["MISSING", "Group", "EMResult", "MStep", "group_rows", "e_step", "objective",
           "uniform_mean_log_p", "initial_table", "run_em", "fit_em", "split_missing", "log_prob", "impute",
           "posterior", "CHUNK_CELLS"]

#: The code of a missing cell.
MISSING = -1
#: Largest gather (rows x completions) held at once by the E-step and the queries.
CHUNK_CELLS = 2**22


@dataclass(frozen=True, eq=False)
class Group:
    """The distinct rows whose missing variables have the cardinalities ``kmiss`` (in order).

    ``codes[j]`` is the ``j``-th distinct row (``-1`` at its missing cells),
    ``axes[j]`` its missing variables (ascending), ``counts[j]`` how many data rows
    it stands for; ``rows`` are those data rows and ``inverse[r]`` the distinct row of
    ``rows[r]``.  A row's completions are the ``prod(kmiss)`` joint states of its
    missing variables, in C order over them.
    """

    kmiss: tuple[int, ...]
    codes: np.ndarray
    axes: np.ndarray
    counts: np.ndarray
    rows: np.ndarray
    inverse: np.ndarray

    @property
    def size(self) -> int:
        """Completions per row."""
        return math.prod(self.kmiss)


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
    if kind == "O":  # e.g. rows of ints and None: the filled cells may make it numeric again
        try:
            filled = np.asarray(X.tolist())
            if filled.dtype.kind in "iufb":
                X = filled
        except (TypeError, ValueError):
            pass
    return X, mask


def group_rows(codes: np.ndarray, cards: Sequence[int]) -> list[Group]:
    """Group the rows of ``codes`` (``MISSING`` = -1 marks a missing cell): identical rows
    become one distinct row with a count, and distinct rows whose missing variables have
    the same cardinalities form one :class:`Group` (the complete rows first, then by
    number of missing cells).  The work of a group is a few array operations, whatever
    the number of missingness patterns in it.

    >>> gs = group_rows(np.array([[0, 1], [-1, 1], [0, 1], [1, -1]]), (2, 2))
    >>> [(g.kmiss, g.codes.tolist(), g.counts.tolist()) for g in gs]
    [((), [[0, 1]], [2.0]), ((2,), [[-1, 1], [1, -1]], [1.0, 1.0])]
    """
    codes = np.asarray(codes, np.int64)
    cards = tuple(int(k) for k in cards)
    N, n = codes.shape
    miss = codes < 0
    base = np.where(miss, 0, codes) @ _strides(cards)
    if n <= 62:  # identical rows: same missing cells (bits of one int) and same observed cells
        mkey = miss.astype(np.int64) @ _bits(n)
        order = np.lexsort((base, mkey))
        new = np.ones(N, bool)
        new[1:] = (mkey[order][1:] != mkey[order][:-1]) | (base[order][1:] != base[order][:-1])
        first = order[new]
        inv = np.empty(N, np.int64)
        inv[order] = np.cumsum(new) - 1
    else:  # pragma: no cover - more than 62 variables
        key = np.concatenate([np.packbits(miss, axis=1), base.view(np.uint8).reshape(N, 8)], axis=1)
        _, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
    dmiss = miss[first]  # (u, n) missing cells of each distinct row
    counts = np.bincount(inv, minlength=len(first)).astype(np.float64)
    # the signature of a distinct row: the cardinalities of its missing variables, in order
    masks, mask_of = np.unique(dmiss.astype(np.int64) @ _bits(n), return_inverse=True) if n <= 62 else \
        np.unique(np.packbits(dmiss, axis=1), axis=0, return_inverse=True)
    sig_ids: dict = {}
    sig_of_mask = np.empty(len(masks), np.int64)
    for t, j in enumerate(np.unique(mask_of.reshape(-1), return_index=True)[1]):
        kmiss = tuple(cards[a] for a in np.flatnonzero(dmiss[j]))
        sig_of_mask[t] = sig_ids.setdefault(kmiss, len(sig_ids))
    sig = sig_of_mask[mask_of.reshape(-1)]
    by_sig = np.argsort(sig, kind="stable")
    sig_bounds = np.searchsorted(sig[by_sig], np.arange(len(sig_ids) + 1))
    local = np.empty(len(first), np.int64)  # a distinct row's index inside its group
    for g in range(len(sig_ids)):
        local[by_sig[sig_bounds[g]:sig_bounds[g + 1]]] = np.arange(sig_bounds[g + 1] - sig_bounds[g])
    row_sig = sig[inv]
    row_order = np.argsort(row_sig, kind="stable")
    row_bounds = np.searchsorted(row_sig[row_order], np.arange(len(sig_ids) + 1))
    groups = []
    for kmiss, g in sig_ids.items():
        d = by_sig[sig_bounds[g]:sig_bounds[g + 1]]  # distinct rows of this group
        axes = np.nonzero(dmiss[d])[1].reshape(len(d), len(kmiss)).astype(np.int64)
        rows = row_order[row_bounds[g]:row_bounds[g + 1]]
        groups.append(Group(kmiss, codes[first[d]], axes, counts[d], rows, local[inv[rows]]))
    groups.sort(key=lambda g: (len(g.kmiss), g.kmiss))
    return groups


def _bits(n: int) -> np.ndarray:
    return np.left_shift(np.int64(1), np.arange(n, dtype=np.int64))


def _strides(cards: Sequence[int]) -> np.ndarray:
    st = np.ones(len(cards), np.int64)
    for i in range(len(cards) - 2, -1, -1):
        st[i] = st[i + 1] * cards[i + 1]
    return st


def _digits(kmiss: tuple) -> np.ndarray:
    """``(m, K)``: the digits of every joint state of variables of cardinalities ``kmiss`` (C order)."""
    return np.indices(kmiss, dtype=np.int64).reshape(len(kmiss), math.prod(kmiss))


def _cells(g: Group, sl: slice, strides: np.ndarray) -> np.ndarray:
    """``(rows, K)`` flat cells of the completions of the distinct rows ``sl`` of ``g``."""
    c = g.codes[sl]
    idx = (np.where(c < 0, 0, c) @ strides)[:, None] + np.zeros((1, g.size), np.int64)
    for j, dig in enumerate(_digits(g.kmiss)):
        idx += strides[g.axes[sl, j]][:, None] * dig[None, :]
    return idx


def _row_chunks(u: int, k: int):
    b = max(1, CHUNK_CELLS // max(k, 1))
    for s in range(0, u, b):
        yield slice(s, min(u, s + b))


def e_step(p: np.ndarray, groups: Sequence[Group]) -> tuple[np.ndarray, np.ndarray, float]:
    """Soft counts of the data under the normalised dense table ``p``.

    Returns ``(cells, weights, loglik)``: the occupied cells (flat, increasing), their
    expected counts (summing to the number of rows), and the observed-data
    log-likelihood ``sum_rows log p(observed cells of the row)`` in nats.
    """
    pf = p.reshape(-1)
    st = _strides(p.shape)
    soft = np.zeros(pf.size)
    ll = 0.0
    parts: list = []  # (cells, weights) not yet added: rows of one group may share cells
    held = 0
    for g in groups:
        for sl in _row_chunks(len(g.codes), g.size):
            idx = _cells(g, sl, st)
            P = pf[idx]
            s = P.sum(axis=1)
            cnt = g.counts[sl]
            ll += float(cnt @ np.log(s))
            parts.append((idx.reshape(-1), (P * (cnt / s)[:, None]).reshape(-1)))
            held += idx.size
            if held >= pf.size:
                soft += _add_up(parts, pf.size)
                parts, held = [], 0
    if parts:
        soft += _add_up(parts, pf.size)
    cells = np.flatnonzero(soft)
    return cells, soft[cells], ll


def _add_up(parts, size: int) -> np.ndarray:
    return np.bincount(np.concatenate([c for c, _ in parts]), np.concatenate([w for _, w in parts]), minlength=size)


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
    groups = group_rows(codes, cards)
    t0 = time.perf_counter()
    cells, weights, _ = e_step(initial_table(codes, cards, n_hidden, seed), groups)
    res = EMResult(learner=learner, seed=None if seed is None else int(seed))
    prev = math.inf
    while True:
        before = learner.n_iter
        learner.m_step(cells, weights)
        res.rounds += 1
        p = learner.table()
        cells, weights, ll = e_step(p, groups)
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

    def __init__(self, engine, state, run, scratch, dbar_table=0):
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

def _completions(model, g: Group, table):
    """Yield ``(slice of distinct rows, P)``: ``P[j, m]`` is ``p(distinct row j completed by state m)``."""
    cards = tuple(model.cardinalities_)
    u, K = len(g.codes), g.size
    if table is None:  # enumerate the completions and evaluate the sparse model on them
        digits = _digits(g.kmiss)
        for sl in _row_chunks(u, K):
            b = sl.stop - sl.start
            full = np.repeat(g.codes[sl][:, None, :], K, axis=1)
            for j, dig in enumerate(digits):
                full[np.arange(b)[:, None], np.arange(K)[None, :], g.axes[sl, j][:, None]] = dig[None, :]
            lp = model._log_potential(full.reshape(-1, len(cards))) - model.log_z_
            yield sl, np.exp(lp.reshape(b, K))
        return
    if isinstance(table, np.ndarray):
        pf, st = table.reshape(-1), _strides(cards)
        for sl in _row_chunks(u, K):
            yield sl, pf[_cells(g, sl, st)]
        return
    for j in range(u):  # a dask table (out of core): one slice per distinct row
        at = tuple(slice(None) if v < 0 else int(v) for v in g.codes[j])
        sub = table[at]
        sub = np.asarray(sub.compute() if hasattr(sub, "compute") else sub, np.float64)
        yield slice(j, j + 1), sub.reshape(1, -1)


def _table_for(model, g: Group, cache: dict):
    """``None`` (enumerate completions) when that is cheaper than building the model's table."""
    cards = tuple(model.cardinalities_)
    eng = getattr(model, "_engine", None)
    in_core = eng is not None and eng.layout.a == 0
    if not in_core and "p" not in cache and len(g.codes) * g.size * max(1, len(model.theta_)) <= 4 * math.prod(cards):
        return None
    if "p" not in cache:
        cache["p"] = model.probabilities()
    return cache["p"]


def log_prob(model, codes: np.ndarray) -> np.ndarray:
    """Natural log of each row's probability, its missing cells (``-1``) marginalised out."""
    codes = np.asarray(codes, np.int64)
    out = np.empty(codes.shape[0])
    cache: dict = {}
    for g in group_rows(codes, model.cardinalities_):
        if not g.kmiss:
            lp = model._log_potential(g.codes) - model.log_z_
        else:
            table = _table_for(model, g, cache)
            lp = np.empty(len(g.codes))
            if table is not None and not isinstance(table, np.ndarray):  # out of core: streamed marginals
                pats, which = np.unique(g.axes, axis=0, return_inverse=True)
                which = which.reshape(-1)
                for t, ax in enumerate(pats):
                    sel = np.flatnonzero(which == t)
                    po = table.sum(axis=tuple(int(a) for a in ax))
                    po = np.asarray(po.compute() if hasattr(po, "compute") else po, np.float64)
                    obs = g.codes[sel][:, [i for i in range(codes.shape[1]) if i not in set(ax.tolist())]]
                    lp[sel] = np.log(po[tuple(obs.T)]) if obs.shape[1] else math.log(float(po))
            else:
                for sl, P in _completions(model, g, table):
                    lp[sl] = np.log(P.sum(axis=1))
        out[g.rows] = lp[g.inverse]
    return out


def _conditionals(model, codes: np.ndarray, n_keep):
    """Yield ``(group, slice, C, kept)``: ``C[j]`` is the joint distribution, given distinct row
    ``j``'s observed cells, of the ``kept`` positions of its missing variables
    (``n_keep(group)`` returns that slice of positions)."""
    cache: dict = {}
    for g in group_rows(codes, model.cardinalities_):
        kept = n_keep(g)
        if not g.kmiss:
            yield g, slice(0, len(g.codes)), np.ones((len(g.codes), 1)), kept
            continue
        table = _table_for(model, g, cache)
        drop = tuple(j + 1 for j in range(len(g.kmiss)) if j not in range(*kept.indices(len(g.kmiss))))
        for sl, P in _completions(model, g, table):
            P = P.reshape((P.shape[0],) + g.kmiss)
            if drop:
                P = P.sum(axis=drop)
            P = P.reshape(P.shape[0], -1)
            yield g, sl, P / P.sum(axis=1, keepdims=True), kept


def _rows_of(g: Group, sl: slice):
    sel = (g.inverse >= sl.start) & (g.inverse < sl.stop)
    return g.rows[sel], g.inverse[sel] - sl.start


def impute(model, codes: np.ndarray, method: str = "mode", random_state=None, n_hidden: int = 0) -> np.ndarray:
    """Fill the missing cells (``-1``) of ``codes`` given each row's observed cells.

    ``method="mode"``: the most probable joint completion of the row's missing cells
    (ties: the lowest codes, C order); ``"sample"``: a draw from that conditional.
    The last ``n_hidden`` variables (hidden, missing in every row) are marginalised
    out and left as they are.
    """
    if method not in ("mode", "sample"):
        raise ValueError(f"method must be 'mode' or 'sample', got {method!r}")
    codes = np.asarray(codes, np.int64)
    out = codes.copy()
    rng = np.random.default_rng(random_state)
    for g, sl, C, kept in _conditionals(model, codes, lambda g: slice(0, len(g.kmiss) - n_hidden)):
        m = len(g.kmiss) - n_hidden
        if m <= 0:
            continue
        rows, which = _rows_of(g, sl)
        if method == "mode":
            pick = np.argmax(C, axis=1)[which]
        else:
            cdf = np.cumsum(C[which], axis=1)
            pick = (cdf < rng.random(len(which))[:, None] * cdf[:, -1:]).sum(axis=1)
            pick = np.minimum(pick, C.shape[1] - 1)
        states = np.unravel_index(pick, g.kmiss[:m])
        for j, s in enumerate(states):
            out[rows, g.axes[sl][which, j]] = s
    return out


def posterior(model, codes: np.ndarray, n_hidden: int) -> np.ndarray:
    """``p(hidden variables | observed cells)`` per row: ``(N, prod k_hidden)``, joint in C order.

    The hidden variables are the last ``n_hidden``; they must be missing (``-1``) in
    every row.
    """
    codes = np.asarray(codes, np.int64)
    cards = tuple(model.cardinalities_)
    out = np.empty((codes.shape[0], math.prod(cards[len(cards) - n_hidden:])))
    for g, sl, C, _ in _conditionals(model, codes, lambda g: slice(len(g.kmiss) - n_hidden, len(g.kmiss))):
        rows, which = _rows_of(g, sl)
        out[rows] = C[which]
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


def fit(est, X, backend, feature_names=None, categories=None) -> bool:
    """The EM fit of ``est`` on ``X`` (in core); ``False`` when ``X`` is complete and
    nothing is hidden (the caller then runs the ordinary fit, with the same bits)."""
    from . import storage
    from ._machine import total_memory
    from ._validation import validate_data
    from .learn import FitState, learn, resolve_epsilon
    from .storage.fit_store import TABLE_NAMES

    Xf, mask = split_missing(X)
    hidden = [int(k) for k in (est.hidden or ())]
    if mask is None and not hidden:
        return False
    if backend.persistent:
        raise ValueError("missing='em' and hidden= fit in core only (store=None); an out-of-core store cannot "
                         "hold the EM rounds yet")
    codes_, cards, names, categories = est._encoded(Xf, feature_names, categories)
    codes_ = np.array(codes_, np.int64)
    if mask is not None:
        codes_[mask] = MISSING
    N = codes_.shape[0]
    if hidden:
        codes_ = np.concatenate([codes_, np.full((N, len(hidden)), MISSING, np.int64)], axis=1)
        cards = tuple(cards) + tuple(hidden)
        names = list(names) if names is not None else [f"X{i}" for i in range(codes_.shape[1] - len(hidden))]
        taken = set(names)
        names += [f"H{j}" if f"H{j}" not in taken else f"_H{j}" for j in range(len(hidden))]
        if categories is not None:
            categories = list(categories) + [list(range(k)) for k in hidden]
        validate_data(np.zeros((1, len(cards)), np.int64), cards)  # the joint table's limits
    plan = est._make_plan(cards, backend, memory=total_memory())
    bar = None
    if est._show_progress():
        import sys

        from tqdm.auto import tqdm

        bar = tqdm(desc="fsll EM rounds", unit="round", file=sys.stderr, dynamic_ncols=True)
    options = est._options()
    from .engine import Table

    dbar, scratch = Table.DBAR, Table.SCRATCH

    def run(engine, state, fresh):
        learn(engine, state, options, fresh=fresh, progress=None, callback=None)

    def make():
        specs = [storage.create_table(backend.name, None, nm, cards, plan.layout.chunk_shape) for nm in TABLE_NAMES]
        engine = est._make_engine(plan, specs, N)
        state = FitState(cards, N, 0.0, log_z=math.log(math.prod(cards)))
        lr = MStep(engine, state, run, lambda: storage.open_table(specs[scratch]), dbar_table=dbar)
        lr.plan = plan
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
    est._set_fitted(lr.state, plan=plan, engine=lr.engine, cost=lr.state.cost(), kl_data=res.kl_soft,
                    feature_names=names, categories=categories)
    est.em_objective_, est.em_loglik_ = res.objective, res.loglik
    est.em_history_, est.em_converged_, est.em_rounds_ = res.history, res.converged, res.rounds
    est.n_hidden_ = len(hidden)
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
    out = impute(est, c, method=method, random_state=random_state, n_hidden=h)[:, :n - h]
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
    post = posterior(est, c, h)
    if h == 1:
        return post
    hc = tuple(est.cardinalities_[n - h:])
    joint = post.reshape((-1,) + hc)
    return [joint.sum(axis=tuple(j + 1 for j in range(h) if j != i)) for i in range(h)]
