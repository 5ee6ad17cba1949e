"""Incomplete rows and hidden variables: EM over the full-span model.

A missing cell is the code :data:`MISSING` (``-1``) in a row of codes.  A hidden
variable is a column missing in every row.  Both are fitted by the same
expectation-maximisation loop (``docs/design.md``, "Missing cells and hidden
variables"):

* **E-step** (:func:`soft_counts`): each incomplete row is spread over its completions
  under the current model, exactly: the slice of ``p`` fixed by the row's observed
  cells, divided by its sum.  Identical rows are counted once, and rows whose
  missing variables have the same cardinalities are handled together
  (:func:`group_rows`), so the work is a few array operations per group, not per row
  or per missingness pattern: ``prod(k_missing)`` cells of ``p`` per distinct row,
  all read at once (:func:`needed_cells`).  The result is soft counts: ``(cell, weight)`` pairs whose
  weights sum to ``N``, the number of rows.
* **M-step**: the learner, warm-started from the current ``theta``, on the targets of
  the soft counts (the same positivity rule and the same cost, with ``N`` the number
  of rows).

The objective (:func:`objective`) is the cost's observed-data counterpart::

    J(theta) = -(LL_obs(theta) + E_u[log p_theta]) / (N + 1) + L(S) / N

``L(S)`` is the support's code length under the fit's code of the terms (``penalty``: the
family code by default, ``sum_{y in support} r_y`` under the paper's).

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

The loop (:func:`run_em`, :class:`MStep`) is the same in core and out of core: the
E-step reads the model at the cells it needs in the passes that re-derive the duals
exactly (``Engine.resync_reading``), never as a table in memory; out of core a
:class:`StoreKeeper` keeps the data, each round's soft counts and the EM's progress in
the store, so that ``FSLL.resume`` continues an interrupted fit to the same model.  The
queries with missing cells (:func:`log_prob`, :func:`impute`, :func:`posterior`) work
on a dense in-core table and on a model whose table is a dask array over a store.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from . import basis, cost as C, fitting, queries

__all__ = ["MISSING", "Group", "EMResult", "MStep", "StoreKeeper", "group_rows", "distinct_rows", "needed_cells",
           "soft_counts", "e_step", "objective", "uniform_mean_log_p", "initial_model", "initial_values",
           "initial_table", "restart_seeds", "run_em", "fit_em", "split_missing", "log_prob", "impute",
           "posterior", "CHUNK_CELLS", "EMChoice", "choose", "latent_states", "split_counts", "row_logliks",
           "start_of", "complete_start", "stored_choice", "EM_CHOICE", "HIDDEN_MAX", "HIDDEN_PATIENCE"]

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


def group_rows(codes: np.ndarray, cards: Sequence[int], counts: np.ndarray | None = None) -> list[Group]:
    """Group the rows of ``codes`` (``MISSING`` = -1 marks a missing cell): identical rows
    become one distinct row with a count, and distinct rows whose missing variables have
    the same cardinalities form one :class:`Group` (the complete rows first, then by
    number of missing cells).  The work of a group is a few array operations, whatever
    the number of missingness patterns in it.  ``counts``: how many data rows each row of
    ``codes`` stands for (default one each).

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
    counts = np.bincount(inv, None if counts is None else np.asarray(counts, np.float64),
                         minlength=len(first)).astype(np.float64)
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


def needed_cells(groups: Sequence[Group], cards: Sequence[int]) -> np.ndarray:
    """Every cell the E-step reads: the completions of every distinct row (flat, increasing)."""
    st = _strides(cards)
    parts = [np.unique(_cells(g, sl, st)) for g in groups for sl in _row_chunks(len(g.codes), g.size)]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def soft_counts(groups: Sequence[Group], cards: Sequence[int], cells: np.ndarray, P: np.ndarray):
    """The E-step from the model's probabilities ``P`` at :func:`needed_cells` ``cells``.

    Returns ``(cells, weights, loglik, p)``: the occupied cells (flat, increasing), their
    expected counts (summing to the number of rows), the observed-data log-likelihood
    ``sum_rows log p(observed cells of the row)`` in nats, and ``P`` at those cells.
    """
    st = _strides(cards)
    soft = np.zeros(cells.size)
    ll = 0.0
    parts: list = []  # (positions, weights) not yet added: rows of one group may share cells
    held = 0
    for g in groups:
        for sl in _row_chunks(len(g.codes), g.size):
            pos = np.searchsorted(cells, _cells(g, sl, st))
            Pg = P[pos]
            s = Pg.sum(axis=1)
            cnt = g.counts[sl]
            ll += float(cnt @ np.log(s))
            parts.append((pos.reshape(-1), (Pg * (cnt / s)[:, None]).reshape(-1)))
            held += pos.size
            if held >= cells.size:
                soft += _add_up(parts, cells.size)
                parts, held = [], 0
    if parts:
        soft += _add_up(parts, cells.size)
    keep = np.flatnonzero(soft)
    return cells[keep], soft[keep], ll, P[keep]


def e_step(p: np.ndarray, groups: Sequence[Group]) -> tuple[np.ndarray, np.ndarray, float]:
    """Soft counts of the data under the normalised dense table ``p``.

    Returns ``(cells, weights, loglik)``: the occupied cells (flat, increasing), their
    expected counts (summing to the number of rows), and the observed-data
    log-likelihood ``sum_rows log p(observed cells of the row)`` in nats.
    (:func:`soft_counts` on the cells read from ``p``.)
    """
    cells = needed_cells(groups, p.shape)
    c, w, ll, _ = soft_counts(groups, p.shape, cells, p.reshape(-1)[cells])
    return c, w, ll


def _add_up(parts, size: int) -> np.ndarray:
    return np.bincount(np.concatenate([c for c, _ in parts]), np.concatenate([w for _, w in parts]), minlength=size)


def uniform_mean_log_p(theta: dict, cards: Sequence[int], log_z: float) -> float:
    """``E_u[log p_theta]`` under the uniform distribution, from the sparse model (``O(#terms)``).

    ``theta`` maps index tuples ``y`` to ``theta_y``; ``E_u[Phi_y]`` is 0 on a
    Walsh-Hadamard axis with ``y_i != 0`` and ``(2 - k) / k`` on a +-1 axis.
    """
    m = 0.0
    for y, v in theta.items():
        m += v * basis.uniform_moment(cards, y)
    return m - log_z


def objective(loglik: float, n_samples: int, mean_u_log_p: float, penalty: float) -> float:
    """``J = -(LL_obs + E_u[log p]) / (N + 1) + L(S) / N``: what EM lowers every round (nats per
    row; ``penalty`` is the support's code length per row, ``L(S) / N``)."""
    return -(loglik + mean_u_log_p) / (n_samples + 1.0) + penalty


# --------------------------------------------------------------------------- the first round

def distinct_rows(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, counts)``: the distinct rows of ``codes`` in increasing (lexicographic) order
    and how often each occurs.  EM depends on the data only through them."""
    codes = np.asarray(codes, np.int64)
    if codes.shape[0] == 0:
        return codes, np.zeros(0, np.int64)
    rows, counts = np.unique(codes, axis=0, return_counts=True)
    return rows.astype(np.int64), counts.astype(np.int64)


def initial_model(rows: np.ndarray, counts: np.ndarray, cards: Sequence[int], n_hidden: int = 0, seed=None,
                  rounds: int = 30) -> tuple[np.ndarray, list]:
    """The first round's model as factors ``(pi, f)``: ``p(x) = pi[h] prod_i f[i][h, x_i]``
    over the observed variables ``x`` and the joint state ``h`` of the last ``n_hidden``.

    ``rows`` (``-1`` at missing cells, the hidden columns included or not) occur
    ``counts`` times.  Without hidden variables: the product of each column's observed
    frequencies (plus one pseudo-count spread over its categories).  With them: a
    latent-class model fitted by ``rounds`` EM steps on the observed cells from
    Dirichlet-random responsibilities of each distinct row drawn with ``seed``; it gives
    the hidden variables a distinct role from the first round.
    """
    rows = np.asarray(rows, np.int64)
    counts = np.asarray(counts, np.float64)
    cards = tuple(int(k) for k in cards)
    n_obs = len(cards) - n_hidden
    u = rows.shape[0]
    N = float(counts.sum())
    K = math.prod(cards[n_obs:])
    rng = np.random.default_rng(seed)
    if K == 1:
        resp = np.ones((u, 1))
        rounds = 0
    else:
        resp = rng.dirichlet(np.ones(K), size=u)
    for it in range(rounds + 1):
        pi = (counts @ resp + 1.0) / (N + K)
        f = []
        for i, k in enumerate(cards[:n_obs]):
            col = rows[:, i]
            seen = col >= 0
            t = np.ones((K, k)) / k  # one pseudo-count per class, spread
            np.add.at(t.T, col[seen], resp[seen] * counts[seen, None])
            f.append(t / t.sum(axis=1, keepdims=True))
        if it == rounds:
            break
        logr = np.log(pi)[None, :].repeat(u, axis=0)
        for i in range(n_obs):
            col = rows[:, i]
            seen = col >= 0
            logr[seen] += np.log(f[i][:, col[seen]].T)
        logr -= logr.max(axis=1, keepdims=True)
        resp = np.exp(logr)
        resp /= resp.sum(axis=1, keepdims=True)
    return pi, f


def initial_values(model: tuple, cards: Sequence[int], n_hidden: int, cells: np.ndarray) -> np.ndarray:
    """The probabilities of :func:`initial_model`'s ``model`` at flat cells ``cells`` (no table built)."""
    pi, f = model
    cards = tuple(int(k) for k in cards)
    n_obs = len(cards) - n_hidden
    digits = np.unravel_index(np.asarray(cells, np.int64), cards)
    h = np.ravel_multi_index(digits[n_obs:], cards[n_obs:]) if n_hidden else np.zeros(len(cells), np.int64)
    v = pi[h]
    for i in range(n_obs):
        v = v * f[i][h, digits[i]]
    return v


def initial_table(codes: np.ndarray, cards: Sequence[int], n_hidden: int = 0, seed=None,
                  rounds: int = 30) -> np.ndarray:
    """The first round's model (:func:`initial_model` of the rows ``codes``) as a dense table over ``cards``."""
    cards = tuple(int(k) for k in cards)
    rows, counts = distinct_rows(codes)
    size = math.prod(cards)
    return initial_values(initial_model(rows, counts, cards, n_hidden, seed, rounds), cards, n_hidden,
                          np.arange(size)).reshape(cards)


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
    state: object = None  # the run's final FitState

    def to_json(self) -> dict:
        """The run's record (not its learner) as plain JSON, the state included."""
        return {"objective": _num(self.objective), "loglik": _num(self.loglik), "rounds": self.rounds,
                "converged": self.converged, "history": self.history, "seed": self.seed, "restart": self.restart,
                "kl_soft": _num(self.kl_soft), "state": None if self.state is None else self.state.to_json()}

    @classmethod
    def from_json(cls, obj: dict) -> "EMResult":
        from .learn import FitState

        return cls(_unnum(obj["objective"], math.inf), _unnum(obj["loglik"], -math.inf), int(obj["rounds"]),
                   bool(obj["converged"]), list(obj["history"]), None, obj.get("seed"), int(obj.get("restart", 0)),
                   _unnum(obj.get("kl_soft"), math.nan),
                   None if obj.get("state") is None else FitState.from_json(obj["state"]))


def _num(x: float):
    return float(x) if math.isfinite(x) else None


def _unnum(x, default: float) -> float:
    return default if x is None else float(x)


def run_em(learner, rows: np.ndarray, counts: np.ndarray, cards: Sequence[int], *, n_hidden: int = 0, tol: float,
           max_rounds: int = 100, seed=None, progress: Callable[[dict], None] | None = None, keeper=None,
           resume: dict | None = None, warm: bool = False) -> EMResult:
    """EM from the first round's model (:func:`initial_model` with ``seed``) to convergence.

    ``rows`` (``-1`` at missing cells and hidden columns) occur ``counts`` times
    (:func:`distinct_rows`).  ``learner`` is the M-step (:class:`MStep`): ``m_step(cells,
    weights, shift)`` fits to the soft counts (warm-started from the current ``theta``),
    ``values(cells)`` gives ``p_theta`` at ``cells`` (re-deriving the duals on the way),
    ``uniform_mean_log_p()``, ``penalty()``, ``n_iter``, ``passes``, ``state``.

    A round is the M-step, then the E-step of its model (whose log-likelihood gives the
    round's objective); the E-step's soft counts feed the next round.  The stopping
    rule: stop after the round whose objective fell by less than ``tol`` (nats per
    row), or whose M-step made no move (a fixed point), or after ``max_rounds`` M-steps
    (then ``converged`` is False).

    ``keeper`` (out of core: the store) is told each round's soft counts before the
    M-step (``soft``) and the end of each M-step (``m_done``); ``resume`` is what it
    kept (:meth:`StoreKeeper.resume_run`), to continue a run from there.

    ``warm``: the learner's state holds the first round's model already (a warm start,
    :meth:`MStep.start_from`, or a run continued under another penalty scale), so the
    first E-step reads that model instead of :func:`initial_model`'s (``seed`` unused).
    """
    cards = tuple(int(k) for k in cards)
    N = int(np.asarray(counts).sum())
    groups = group_rows(rows, cards, counts)
    needed = needed_cells(groups, cards)
    res = EMResult(learner=learner, seed=None if seed is None else int(seed))
    t0 = time.perf_counter()
    if resume is None:
        shift = None
        if warm:  # the E-step of the model the learner holds (its duals re-derived on the way)
            shift = learner.state.log_z
            first = learner.values(needed)
        else:
            first = initial_values(initial_model(rows, counts, cards, n_hidden, seed), cards, n_hidden, needed)
        cells, weights, _, _ = soft_counts(groups, cards, needed, first)
        prev, before, phase = math.inf, learner.n_iter, "m-step"
        if keeper is not None:
            keeper.soft(learner, res, cells, weights, prev, before, shift)
    else:
        old = resume["run"]
        res.rounds, res.history = old.rounds, old.history
        res.objective, res.loglik, res.kl_soft = old.objective, old.loglik, old.kl_soft
        prev, before, shift, phase = resume["prev"], resume["before"], resume["shift"], resume["phase"]
        cells, weights = resume.get("cells"), resume.get("weights")
        t0 -= res.history[-1]["time"] if res.history else 0.0
    while True:
        passes = learner.passes
        if phase == "m-step":
            learner.m_step(cells, weights, shift)
            res.rounds += 1
            if keeper is not None:
                keeper.m_done(learner, res, prev, before)
        m_passes = learner.passes - passes
        shift = learner.state.log_z
        cells, weights, ll, pc = soft_counts(groups, cards, needed, learner.values(needed))
        j = objective(ll, N, learner.uniform_mean_log_p(), learner.penalty())
        res.kl_soft = float(weights @ (np.log(weights / N) - np.log(pc))) / N
        entry = {"round": res.rounds, "objective": j, "loglik": ll / N, "iters": learner.n_iter - before,
                 "passes_m": m_passes, "passes_e": learner.passes - passes - m_passes,
                 "time": time.perf_counter() - t0}
        res.history.append(entry)
        if progress is not None:
            progress(entry)
        res.objective, res.loglik = j, ll / N
        phase = "m-step"
        if prev - j < tol or learner.n_iter == before:
            res.converged = True
            break
        if res.rounds >= max_rounds:
            break
        prev, before = j, learner.n_iter
        if keeper is not None:
            keeper.soft(learner, res, cells, weights, prev, before, shift)
    res.state = learner.state
    return res


class MStep:
    """The M-step of :func:`run_em`, and the E-step's reading of the model, over an engine
    and a fit state: the same code in core and out of core.

    ``run(engine, state, fresh)`` runs the learner (the estimator's, with its options and,
    out of core, the store's checkpoint).  The first ``m_step`` of a run starts from
    ``theta = 0`` (uniform duals); later ones continue from the current ``theta``, whose
    duals :meth:`values` (the E-step) has just re-derived exactly.  ``fresh`` / ``synced``
    describe a learner built from a stored state (resuming): ``fresh``, nothing learned
    yet; else the duals are re-derived first (with the E-step's shift ``log Z`` when the
    M-step had not started, which gives the same bits as the uninterrupted run).
    """

    def __init__(self, engine, state, run, fresh: bool = True, synced: bool = True):
        self.engine, self.state, self.run = engine, state, run
        self.fresh, self.synced = fresh, synced

    @property
    def n_iter(self) -> int:
        return self.state.n_iter

    @property
    def passes(self) -> int:
        """Table passes of the engine so far."""
        return self.engine.passes

    def _support(self):
        st = self.state
        return (np.fromiter(st.theta.keys(), np.int64, len(st.theta)),
                np.fromiter(st.theta.values(), np.float64, len(st.theta)))

    def m_step(self, cells: np.ndarray, weights: np.ndarray, shift: float | None = None) -> None:
        from .engine import Table

        st, eng = self.state, self.engine
        eng.compute_targets(cells, st.n_samples, weights=weights)
        st.targets_changed()
        st.entropy_q = C.target_entropy(weights, st.n_samples, math.prod(st.cards))
        if self.fresh:
            eng.init_duals()
            self.run(eng, st, True)
        else:
            sup, val = self._support()
            if not self.synced and shift is not None:  # resumed where the M-step starts: the E-step's resync
                st.log_z = eng.resync(sup, val, shift)
                self.synced = True
            st.dbar = dict(zip(sup.tolist(), eng.gather(sup, Table.DBAR).tolist()))
            st.converged = False
            self.run(eng, st, self.synced)
        self.fresh = self.synced = False

    def start_from(self, start: dict) -> None:
        """Start from ``start`` (:func:`start_of` of a fit of the same variables): its terms and
        parameters become the state's, and the first E-step reads that model
        (:func:`run_em` with ``warm``).  The history records the uniform start (``init``)
        and the step to ``start`` as the first iteration (``warm-start``: its terms under
        ``added``, their gains in ``start``'s own fit under ``added_gain``; its ``delta`` is
        minus their sum and its ``cost`` the start's cost in its own fit)."""
        st = self.state
        st.theta = {int(y): float(v) for y, v in start["theta"]}
        st.log_z = float(start["log_z"])
        st.dbar = {}
        gains = [float(g) for g in start.get("gain") or ()]
        st.history += [{"iter": 0, "move": "init", "y": None, "value": 0.0, "delta": 0.0,
                        "cost": float(start.get("cost", 0.0)) + sum(gains), "n_bases": 0, "time": 0.0},
                       {"iter": 1, "move": "warm-start", "y": None, "value": float(len(st.theta)),
                        "delta": -sum(gains), "cost": float(start.get("cost", 0.0)), "n_bases": len(st.theta),
                        "time": 0.0, "added": [list(st.digits(y)) for y in st.theta], "added_gain": gains}]
        st.n_iter = 1
        self.fresh = self.synced = False

    def values(self, cells: np.ndarray) -> np.ndarray:
        """``p_theta`` at flat ``cells``, read in the passes that re-derive the duals exactly."""
        st = self.state
        sup, val = self._support()
        st.log_z, P = self.engine.resync_reading(sup, val, st.log_z, cells)
        self.synced = True
        return P

    def uniform_mean_log_p(self) -> float:
        st = self.state
        return uniform_mean_log_p({st.digits(y): v for y, v in st.theta.items()}, st.cards, st.log_z)

    def penalty(self) -> float:
        """The support's code length (the fit's code of the terms, :meth:`FitState.total_penalty`)."""
        return float(self.state.total_penalty())


def restart_seeds(random_state, n_restarts: int) -> list[int]:
    """The first-round seeds of ``n_restarts`` EM runs (drawn from ``random_state``)."""
    return np.random.SeedSequence(random_state if random_state is None else int(random_state)).generate_state(
        max(1, int(n_restarts))).tolist()


def fit_em(make_learner: Callable[..., MStep], rows: np.ndarray, counts: np.ndarray, cards: Sequence[int], *,
           n_hidden: int = 0, seeds: Sequence[int], tol: float, max_rounds: int = 100,
           progress: Callable[[dict], None] | None = None, keeper=None, resume: dict | None = None,
           starts: Sequence[dict] | None = None) -> EMResult:
    """:func:`run_em` from the first-round seeds ``seeds`` (:func:`restart_seeds`); returns the
    run with the lowest final objective (its ``state`` holds the model; the first run wins
    ties).  Each round of the history records its run (``restart``).

    ``make_learner(state=None)``: an :class:`MStep` over a new fit state (or, resuming, the
    stored ``state``).  ``keeper``/``resume``: see :func:`run_em`; the keeper is also told
    the best run after each restart (``restart_done``).  ``starts``: run ``r`` starts from
    the model ``starts[r]`` (:meth:`MStep.start_from`; one per seed, whose seed is then
    unused: :func:`choose`'s models).
    """
    if starts is not None and len(starts) != len(seeds):
        raise ValueError(f"{len(starts)} starts for {len(seeds)} runs")
    best = resume.get("best") if resume else None
    first = resume["restart"] if resume else 0
    for r in range(first, len(seeds)):
        run = resume if resume is not None and r == first and resume.get("phase") != "start" else None
        learner = make_learner(state=run["state"], fresh=run["fresh"]) if run else make_learner()
        start = None if starts is None or run is not None else starts[r]
        if start is not None:
            learner.start_from(start)
        if keeper is not None:
            keeper.restart = r
        res = run_em(learner, rows, counts, cards, n_hidden=n_hidden, tol=tol, max_rounds=max_rounds,
                     seed=seeds[r], keeper=keeper, resume=run, warm=start is not None,
                     progress=None if progress is None else (lambda e, r=r: progress({**e, "restart": r})))
        res.restart = r
        for entry in res.history:
            entry["restart"] = r
        if best is None or res.objective < best.objective:
            best = res
        if keeper is not None:
            keeper.restart_done(r, best)
        res = learner = None  # a run that is not the best lets its tables go before the next is built
    return best


# --------------------------------------------------------------------------- held-out choices

#: With ``hidden=["auto"]`` the hidden variable's number of states is tried from 2 up to this.
HIDDEN_MAX = 10
#: ... and the trial stops after this many numbers in a row that score no better than the best.
HIDDEN_PATIENCE = 3


@dataclass
class EMChoice:
    """What the held-out rows chose for an EM fit (:func:`choose`)."""

    #: the penalty scale of the fit
    scale: float
    #: the hidden variables' cardinalities (``"auto"`` replaced by the chosen number)
    hidden: list
    #: mean held-out observed-data log-likelihood per row of each scale tried, for the chosen ``hidden``
    #: (of the better scorer of the scale's runs, :func:`choose`)
    scores: dict = field(default_factory=dict)
    #: the same per number of states of the ``"auto"`` hidden variable (its best scale's)
    hidden_scores: dict = field(default_factory=dict)
    #: the chosen model on the training rows, where the fit on every row starts (:func:`start_of`)
    start: dict | None = None
    #: why nothing was compared (``""`` when it was)
    reason: str = ""
    #: the complete rows' own default fit, where a second run of the fit on every row starts
    #: (:func:`complete_start`; None without one)
    complete_start: dict | None = None

    @property
    def starts(self) -> list | None:
        """The models the runs of the fit on every row start from (None: from the first round's model)."""
        if self.start is None:
            return None
        return [self.start] + ([self.complete_start] if self.complete_start is not None else [])


def start_of(state) -> dict:
    """The model of ``state`` as a start for another fit (plain JSON, :meth:`MStep.start_from`):
    :func:`fsll_ooc.fitting.start_of` (its parameters, ``log Z``, each term's share of its
    cost reduction) and its cost."""
    return {**fitting.start_of(state), "cost": float(state.cost())}


def row_logliks(learner, rows: np.ndarray, cards: Sequence[int]) -> np.ndarray:
    """Observed-data log-likelihood (nats) of each of the distinct ``rows`` (``-1`` at missing
    cells and hidden columns) under the learner's model, read as the E-step reads it."""
    groups = group_rows(rows, cards)
    needed = needed_cells(groups, cards)
    P = learner.values(needed)
    st = _strides(cards)
    out = np.empty(len(rows))
    for g in groups:
        lp = np.empty(len(g.codes))
        for sl in _row_chunks(len(g.codes), g.size):
            lp[sl] = np.log(P[np.searchsorted(needed, _cells(g, sl, st))].sum(axis=1))
        out[g.rows] = lp[g.inverse]
    return out


def split_counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(train, held_out)`` counts of each distinct row: the data's rows (each distinct row
    repeated ``counts`` times) split as :func:`fsll_ooc.learn.select.holdout_split` splits them."""
    from .learn.select import holdout_split

    counts = np.asarray(counts, np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    train, held = holdout_split(len(owner))
    return (np.bincount(owner[train], minlength=len(counts)).astype(np.int64),
            np.bincount(owner[held], minlength=len(counts)).astype(np.int64))


def choose(est, rows: np.ndarray, counts: np.ndarray, obs_cards: Sequence[int], hidden: Sequence, seeds) -> EMChoice:
    """The number of states of an ``"auto"`` hidden variable and the penalty scale
    (``penalty_scale="auto"``) of an EM fit, chosen on held-out rows as an ordinary fit
    chooses its scale (:mod:`fsll_ooc.learn.select`): one row in five is held out
    (:func:`split_counts`).

    * The number of states: :func:`latent_states` (latent-class models of 2, 3, ...
      states on the other rows, scored by the held-out rows' observed-data
      log-likelihood).
    * The scale: on the other rows, EM (with every restart of ``seeds``) under the first
      scale of :data:`fsll_ooc.cost.PENALTY_SCALES`, then continued under each further
      one; each model scores the held-out rows by their observed-data log-likelihood
      (missing cells and hidden variables marginalised, :func:`row_logliks`), the best
      wins (ties to the full code).  Without hidden variables each scale also runs EM on
      the other rows from their complete rows' own default fit (:func:`complete_start`
      of the training rows), and the scale's score and model are those of the better
      scorer of its two runs (ties to the continued run): EM from one model can stop on a
      fixed point without an interaction the other run keeps, and a continuation that
      makes no move would otherwise score both scales alike.  The chosen model is where
      the fit on every row starts (``start``).  The sub-fits hold their tables in memory.

    With a numeric scale no scale is compared.  With fewer than
    :data:`fsll_ooc.learn.select.MIN_ROWS` rows, or tables that do not fit in memory, the
    scale is 1 (an ``"auto"`` hidden variable with too few rows is an error).
    """
    from . import storage
    from .machine import total_memory
    from .learn import learn, resolve_epsilon
    from .learn.select import MIN_ROWS
    from .planner import PlanError, plan as make_plan
    from .storage.fit_store import TABLE_NAMES

    price = em_further_price(est)  # ("auto" refused before any sub-fit)
    want = C.resolve_penalty_scale(est.penalty_scale, est.epsilon)
    auto = any(isinstance(k, str) for k in hidden)
    if want != "auto" and not auto:
        return EMChoice(want, list(hidden))
    N = int(np.sum(counts))
    if N < MIN_ROWS:
        if auto:
            raise ValueError(f"hidden=['auto'] chooses the number of states on held-out rows, but there are only "
                             f"{N} rows (fewer than {MIN_ROWS}); give the number, e.g. hidden=[3]")
        return EMChoice(C.PENALTY_SCALES[0], list(hidden), reason=f"only {N} rows (fewer than {MIN_ROWS})")
    tc, hc = split_counts(counts)
    rows_t, tc = rows[tc > 0], tc[tc > 0]
    rows_h, hc = rows[hc > 0], hc[hc > 0]
    hidden_scores: dict = {}
    if auto:  # the restarts ran on the latent-class models: EM starts from the chosen one's seed
        hidden, hidden_scores, seed = latent_states(rows_t, tc, rows_h, hc, obs_cards, hidden, seeds)
        seeds = [seed]
    hidden = [int(k) for k in hidden]
    if want != "auto":
        return EMChoice(want, hidden, {}, hidden_scores)
    cards = tuple(obs_cards) + tuple(hidden)
    plan = make_plan(cards, memory_limit=est.memory_limit if est.memory_limit is not None else total_memory(),
                     disk_free=None, workers=1, out_of_core=None)
    if not (plan.feasible and plan.layout.a == 0):  # the sub-fits' tables in memory, within the fit's limit
        return EMChoice(C.PENALTY_SCALES[0], hidden, {}, hidden_scores, reason="the tables do not fit in memory")
    scales = C.PENALTY_SCALES
    Nt = int(tc.sum())
    opts = dataclasses.replace(fitting.options(est), on_finish=None)
    tol = est.em_tol if est.em_tol is not None else resolve_epsilon(est.epsilon, Nt)
    code = C.resolve_penalty(est.penalty, est.epsilon)

    def run(engine, state, fresh):
        learn(engine, state, opts, fresh=fresh, progress=None, callback=None)

    def make(state=None, fresh=True, scale=scales[0]):
        specs = [storage.create_table("numpy", None, nm, cards, plan.layout.chunk_shape) for nm in TABLE_NAMES]
        return MStep(fitting.make_engine(est, plan, specs, Nt, penalty_scale=scale),
                     _fit_state(cards, Nt, code, scale, price), run)

    def held_out(learner) -> float:
        return float(row_logliks(learner, rows_h, cards) @ hc) / float(hc.sum())

    learner = fit_em(make, rows_t, tc, cards, n_hidden=len(hidden), seeds=seeds, tol=tol,
                     max_rounds=est.em_max_rounds).learner
    # the training rows' own complete-row fit, a second start under every scale
    second = None if hidden else complete_start(est, rows_t, tc, cards, in_memory=True)
    scores, starts = {}, {}
    for i, s in enumerate(scales):
        if i:  # the search continued under the next scale, from the model it has
            learner.state.set_penalty_scale(s)
            learner.state.converged = False
            learner.engine = fitting.make_engine(est, plan, learner.engine.ctx.specs, Nt, penalty_scale=s)
            run_em(learner, rows_t, tc, cards, n_hidden=len(hidden), tol=tol, max_rounds=est.em_max_rounds, warm=True)
        scores[s] = held_out(learner)
        starts[s] = start_of(learner.state)
        if second is not None:  # EM under this scale from the complete training rows' fit: the better scorer
            other = make(scale=s)
            other.start_from(second)
            run_em(other, rows_t, tc, cards, tol=tol, max_rounds=est.em_max_rounds, warm=True)
            score = held_out(other)
            if score > scores[s]:
                scores[s], starts[s] = score, start_of(other.state)
            other = None  # its tables go before the next scale's run builds its own
    best = scales[0]
    for s in scales[1:]:
        if scores[s] > scores[best]:
            best = s
    return EMChoice(best, hidden, scores, hidden_scores, starts[best],
                    complete_start=None if hidden else complete_start(est, rows, counts, cards))


def complete_start(est, rows: np.ndarray, counts: np.ndarray, cards: Sequence[int],
                   in_memory: bool = False) -> dict | None:
    """The complete rows' own default fit as a start for the EM fit on every row
    (:func:`start_of`), or None: with fewer than :data:`fsll_ooc.learn.select.MIN_ROWS`
    complete rows, with none incomplete, or in core (or with ``in_memory``: the runs
    from both starts hold their tables in memory, as :func:`choose`'s do) when two sets
    of tables do not fit in memory.

    EM from the held-out choice's model can stop on a fixed point of its objective that a
    run from another model beats: the E-step completes the rows under a model that lacks
    some interaction, so the M-step sees less evidence for it than the observed cells hold.
    The fit on the complete rows alone (an ordinary default fit, its own penalty scale, in
    memory: the learning parameters of ``est``) is such another model; the run from it,
    under the scale chosen for EM, competes with the run from the held-out choice's model
    by the same objective as restarts do (:func:`fit_em`)."""
    from .learn.select import MIN_ROWS
    from .machine import total_memory
    from .planner import PlanError, parse_bytes, plan as make_plan

    keep = (rows >= 0).all(axis=1)
    n = int(counts[keep].sum())
    if n < MIN_ROWS or n == int(counts.sum()):
        return None
    if est.store is None or in_memory:  # the best run keeps its tables while the next builds its own
        limit = est.memory_limit if est.memory_limit is not None else total_memory()
        try:
            p = make_plan(tuple(cards), memory_limit=parse_bytes(limit) // 2, disk_free=None, workers=1,
                          out_of_core=None)
        except PlanError:
            return None
        if not (p.feasible and p.layout.a == 0):
            return None
    own = {k: getattr(est, k) for k in ("epsilon", "max_iter", "resync_every", "refine", "penalty", "penalty_scale",
                                        "learn_options", "memory_limit")}
    sub = type(est)(cardinalities=tuple(cards), progress=False, smoothing=1.0, **own)
    sub.fit(np.repeat(rows[keep], counts[keep], axis=0))
    return start_of(sub._state)


def latent_states(rows_t, counts_t, rows_h, counts_h, obs_cards: Sequence[int], hidden: Sequence,
                  seeds) -> tuple[list, dict, int]:
    """The number of states of the ``"auto"`` entry of ``hidden``, the held-out score of each
    number tried and the seed of the chosen model: ``(hidden with it, {k: mean held-out
    log-likelihood per row}, seed)``.

    For ``k = 2, 3, ...`` a latent-class model (the first round's model, :func:`initial_model`;
    of ``seeds``' restarts the one with the highest training log-likelihood, whose seed
    then starts the EM fit: it is that fit's first round) is fitted to the training rows ``rows_t`` (occurring
    ``counts_t`` times) and scores the held-out rows by their observed-data
    log-likelihood; the search stops after :data:`HIDDEN_PATIENCE` numbers in a row that
    score no better than the best so far (at most :data:`HIDDEN_MAX`).  The fewest states
    whose score is within one standard error of the best score win (the error of the mean
    row-by-row difference of the two models' held-out log-likelihoods): a model with an
    extra state rarely scores much worse, and the hidden variable should carry the classes
    the rows show, not split one.  A latent-class model is the hidden variable's structure
    alone, fitted to convergence in moments; the full-span model built on it afterwards
    adds the observed variables' own interactions.
    """
    n_obs = len(obs_cards)
    w = np.asarray(counts_h, np.float64) / float(np.sum(counts_h))

    def loglik(model, rows, K):
        pi, f = model
        like = np.zeros(len(rows))
        for h in range(K):
            v = np.full(len(rows), pi[h])
            for i in range(n_obs):
                col = rows[:, i]
                seen = col >= 0
                v[seen] *= f[i][h, col[seen]]
            like += v
        return np.log(like)

    tried: dict = {}
    best, since = None, 0
    for k in range(2, HIDDEN_MAX + 1):
        cards = tuple(obs_cards) + tuple(k if isinstance(h, str) else int(h) for h in hidden)
        K = math.prod(cards[n_obs:])
        fit = None
        for seed in seeds:
            model = initial_model(rows_t, counts_t, cards, len(hidden), seed)
            lt = float(loglik(model, rows_t, K) @ counts_t)
            if fit is None or lt > fit[0]:
                fit = (lt, model, seed)
        tried[k] = (loglik(fit[1], rows_h, K), fit[2])
        if best is None or float(w @ tried[k][0]) > float(w @ tried[best][0]):
            best, since = k, 0
        else:
            since += 1
            if since >= HIDDEN_PATIENCE:
                break
    chosen = best
    for k in sorted(tried):
        d = tried[k][0] - tried[best][0]
        mean = float(w @ d)
        if mean >= -math.sqrt(max(float(w @ (d - mean) ** 2), 0.0) / float(np.sum(counts_h))):
            chosen = k
            break
    return ([chosen if isinstance(h, str) else int(h) for h in hidden],
            {k: float(w @ v[0]) for k, v in tried.items()}, tried[chosen][1])


def _fit_state(cards, N: int, code: str, scale: float, price: str = "full"):
    """A new EM fit state (the M-step's): ``log Z`` of the uniform model, no target entropy yet."""
    from .learn import FitState

    return FitState(tuple(cards), int(N), 0.0, log_z=math.log(math.prod(cards)), penalty_code=code,
                    penalty_scale=scale, further_price=price)


def em_further_price(est) -> str:
    """The price of a family's further terms of an EM fit (``further_price``: ``"full"`` or
    ``"aic"``; the held-out choice ``"auto"`` is not made for EM and is refused)."""
    price = C.resolve_further_price(est.further_price, C.resolve_penalty(est.penalty, est.epsilon))
    if price == "auto":
        raise ValueError("further_price='auto' is not available with missing='em' or hidden variables; "
                         "give 'full' (the default) or 'aic'")
    return price


class StoreKeeper:
    """What EM keeps in an out-of-core store (a :class:`~fsll_ooc.storage.fit_store.FitStore`),
    so that a killed fit resumes to the same model (``docs/design.md``, "Missing cells and
    hidden variables").

    Under ``"em"`` in the state: the restarts' seeds, the restart running, its phase
    (``"m-step"``: the soft counts kept in the store feed the M-step under way;
    ``"e-step"``: the M-step is done, the E-step of its model is next; ``"start"``: the
    restart has not begun), the run's record so far and the best finished run.  The
    soft counts are the file ``soft`` (cells and weights), replaced every round before
    the state that names it.
    """

    def __init__(self, fs, seeds: Sequence[int]):
        self.fs, self.seeds = fs, [int(x) for x in seeds]
        self.restart = 0
        self.best: EMResult | None = None

    def _write(self, state, **em) -> None:
        self.fs.set_extra("em", {"seeds": self.seeds, "restart": self.restart,
                                 "best": None if self.best is None else self.best.to_json(), **em})
        self.fs.checkpoint(state)

    @staticmethod
    def _run(res: EMResult) -> dict:
        return {k: v for k, v in res.to_json().items() if k != "state"}

    def soft(self, learner, res, cells, weights, prev, before, shift) -> None:
        self.fs.keep("soft", np.stack([np.asarray(cells, np.float64), np.asarray(weights, np.float64)]))
        self._write(learner.state, phase="m-step", run=self._run(res), prev=_num(prev), before=int(before),
                    shift=shift)

    def m_done(self, learner, res, prev, before) -> None:
        self._write(learner.state, phase="e-step", run=self._run(res), prev=_num(prev), before=int(before),
                    shift=None)

    def restart_done(self, r: int, best: EMResult) -> None:
        self.best, self.restart = best, r + 1
        self._write(best.state, phase="start")

    def resume_run(self, state) -> dict:
        """What :func:`fit_em` needs to continue from the store's state (after ``fs.read()``)."""
        em = self.fs.extra("em")
        self.restart = int(em["restart"])
        self.best = None if em.get("best") is None else EMResult.from_json(em["best"])
        out = {"restart": self.restart, "best": self.best, "phase": em["phase"]}
        if em["phase"] == "start":
            return out
        run = EMResult.from_json({**em["run"], "state": None})
        before = int(em["before"])
        out.update(run=run, prev=_unnum(em["prev"], math.inf), before=before, state=state,
                   shift=em["shift"] if state.n_iter == before else None,
                   fresh=em["phase"] == "m-step" and run.rounds == 0 and state.n_iter == 0 and not state.theta)
        if em["phase"] == "m-step":
            soft = self.fs.read_kept("soft")
            out.update(cells=soft[0].astype(np.int64), weights=np.ascontiguousarray(soft[1]))
        return out


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
            lp = queries.log_potential(model, full.reshape(-1, len(cards))) - model.log_z_
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
        cache["p"] = fitting.basis_table(model)  # the codes here are in the basis order
    return cache["p"]


def log_prob(model, codes: np.ndarray) -> np.ndarray:
    """Natural log of each row's probability, its missing cells (``-1``) marginalised out."""
    codes = np.asarray(codes, np.int64)
    out = np.empty(codes.shape[0])
    cache: dict = {}
    for g in group_rows(codes, model.cardinalities_):
        if not g.kmiss:
            lp = queries.log_potential(model, g.codes) - model.log_z_
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
    """The EM fit of ``est`` on ``X`` (in core, or out of core in ``est.store``); ``False``
    when ``X`` is complete and nothing is hidden (the caller then runs the ordinary fit,
    with the same bits)."""
    from .validation import validate_data

    Xf, mask = split_missing(X)
    hidden = [k if isinstance(k, str) else int(k) for k in (est.hidden or ())]
    if mask is None and not hidden:
        return False
    codes_, cards, names, categories = fitting.encoded(est, Xf, feature_names, categories, mask=mask)
    codes_ = np.array(codes_, np.int64)
    if mask is not None:
        codes_[mask] = MISSING
    N = codes_.shape[0]
    obs_cards = tuple(cards)
    if hidden:
        codes_ = np.concatenate([codes_, np.full((N, len(hidden)), MISSING, np.int64)], axis=1)
        names = list(names) if names is not None else [f"X{i}" for i in range(codes_.shape[1] - len(hidden))]
        taken = set(names)
        names += [f"H{j}" if f"H{j}" not in taken else f"_H{j}" for j in range(len(hidden))]
        fixed = tuple(2 if isinstance(k, str) else k for k in hidden)
        validate_data(np.zeros((1, len(cards) + len(hidden)), np.int64), tuple(cards) + fixed)  # the table's limits
    if backend.persistent:  # the store's refusals come before the held-out choice's fits
        from .storage.fit_store import FitStore
        from .validation import check_store_path

        check_store_path(est.store)
        FitStore(est.store, backend.name, getattr(est, "storage_options", None)).check_new()
    rows, counts = distinct_rows(codes_)
    del codes_
    seeds = restart_seeds(est.random_state, est.n_restarts if est.n_restarts is not None else (3 if hidden else 1))
    choice = choose(est, rows, counts, obs_cards, hidden, seeds)
    if choice.start is not None:  # the restarts ran on the training rows: one run from each chosen model
        seeds = seeds[:1] * len(choice.starts)
    hidden = choice.hidden
    cards = obs_cards + tuple(hidden)
    if hidden:
        validate_data(np.zeros((1, len(cards)), np.int64), cards)  # the joint table's limits
        if categories is not None:
            categories = list(categories) + [list(range(k)) for k in hidden]
    if backend.persistent:
        _fit_in_store(est, backend, rows, counts, tuple(cards), len(hidden), seeds, names, categories, choice)
        return True
    from . import storage
    from .machine import total_memory
    from .learn import learn
    from .storage.fit_store import TABLE_NAMES

    # the best run's engine and tables stay while the next restart builds its own: two sets
    plan = fitting.make_plan(est, cards, backend, memory=total_memory(), table_sets=2 if len(seeds) > 1 else 1)
    options = fitting.options(est)

    def run(engine, state, fresh):
        learn(engine, state, options, fresh=fresh, progress=None, callback=None)

    def make(state=None, fresh=True):
        specs = [storage.create_table(backend.name, None, nm, cards, plan.layout.chunk_shape) for nm in TABLE_NAMES]
        return MStep(fitting.make_engine(est, plan, specs, N, penalty_scale=choice.scale),
                     state or _new_state(est, cards, N, choice.scale), run, fresh, state is None)

    res = _run_restarts(est, make, rows, counts, tuple(cards), len(hidden), seeds, starts=choice.starts)
    _set_fitted(est, res, plan, res.learner.engine, names, categories, len(hidden), choice)
    return True


def _new_state(est, cards, N: int, scale: float):
    """A new fit state under ``est``'s code of the terms (``penalty``: the family code by
    default) and the penalty scale ``scale`` (:func:`choose`)."""
    return _fit_state(cards, N, C.resolve_penalty(est.penalty, est.epsilon), scale, em_further_price(est))


def _run_restarts(est, make, rows, counts, cards, n_hidden: int, seeds, keeper=None, resume=None,
                  starts=None) -> EMResult:
    """:func:`fit_em` with ``est``'s EM parameters and its progress bar (rounds, objective,
    and each round's table passes: E-step and M-step)."""
    from .learn import resolve_epsilon

    bar = None
    if fitting.show_progress(est):
        import sys

        from tqdm.auto import tqdm

        bar = tqdm(desc="fsll EM rounds", unit="round", file=sys.stderr, dynamic_ncols=True)

    def shown(e):
        if bar is not None:
            bar.update(1)
            bar.set_postfix(objective=f"{e['objective']:.6f}", restart=e["restart"],
                            passes=f"E{e['passes_e']}+M{e['passes_m']}", refresh=False)

    N = int(np.sum(counts))
    tol = est.em_tol if est.em_tol is not None else resolve_epsilon(est.epsilon, N)
    try:
        return fit_em(make, rows, counts, cards, n_hidden=n_hidden, seeds=seeds, tol=tol,
                      max_rounds=est.em_max_rounds, progress=shown, keeper=keeper, resume=resume, starts=starts)
    finally:
        if bar is not None:
            bar.close()


def _set_fitted(est, res: EMResult, plan, engine, names, categories, n_hidden: int, choice: EMChoice) -> None:
    st = res.state
    fitting.set_fitted(est, st, plan=plan, engine=engine, cost=st.cost(), kl_data=res.kl_soft, feature_names=names,
                    categories=categories)
    _set_em_attributes(est, res, n_hidden, choice.scores, choice.hidden_scores)


def _set_em_attributes(est, res: EMResult, n_hidden: int, scores: dict, hidden_scores: dict) -> None:
    est.em_objective_, est.em_loglik_ = res.objective, res.loglik
    est.em_history_, est.em_converged_, est.em_rounds_ = res.history, res.converged, res.rounds
    est.n_hidden_ = n_hidden
    est.penalty_scale_scores_ = {float(k): float(v) for k, v in scores.items()}
    est.smoothing_scores_ = {}
    est.hidden_scores_ = {int(k): float(v) for k, v in hidden_scores.items()}


# --------------------------------------------------------------------------- out of core

#: the key under which an EM store keeps the model its fit starts from, and the held-out scores
EM_CHOICE = "em_choice"


def _fit_in_store(est, backend, rows, counts, cards, n_hidden: int, seeds, names, categories, choice) -> None:
    """A new EM fit in ``est.store``: the data kept as distinct rows and counts (file
    ``rows``), what :func:`choose` chose (under :data:`EM_CHOICE`), then
    :func:`_learn_in_store` from new tables."""
    from .machine import free_disk
    from .model_file import json_or_none, jsonable_categories
    from .storage.fit_store import FitStore

    fs = FitStore(est.store, backend.name, getattr(est, "storage_options", None))
    plan = fitting.make_plan(est, cards, backend, disk_free=None if fs.io.is_url else free_disk(fs.root.resolve()))
    fs.check_new()  # never replace or delete a user's files
    plan = fs.account(plan)
    N = int(counts.sum())
    state = _new_state(est, cards, N, choice.scale)
    empty = np.zeros(0, np.int64)
    with fs.writing("fit", "fitting", plan):
        fs.begin(plan, fitting.stored_params(est), (names, json_or_none(jsonable_categories(categories))), empty, empty,
                 state, files={"rows": np.concatenate([rows, counts[:, None]], axis=1)},
                 extra={"em": {"seeds": [int(x) for x in seeds], "restart": 0, "phase": "start", "best": None},
                        EM_CHOICE: {"start": choice.start, "complete_start": choice.complete_start, "scores": [[float(k), float(v)] for k, v in choice.scores.items()],
                                    "hidden_scores": [[int(k), float(v)] for k, v in choice.hidden_scores.items()]},
                        **(fitting.store_extra(est, None) or {})})
        _learn_in_store(est, fs, plan, rows, counts, cards, n_hidden, seeds, names, categories, state, fresh=True)


def _learn_in_store(est, fs, plan, rows, counts, cards, n_hidden, seeds, names, categories, state, fresh) -> None:
    """EM with the store's keeper: from new tables (``fresh``) or from the store's state; then
    the finished model (queries in a private scratch table) and status ``complete``."""
    from .engine import Engine
    from .learn import learn

    N = int(counts.sum())
    chunks = plan.layout.chunk_shape
    keeper = StoreKeeper(fs, seeds)
    if fresh:
        specs = fs.create_tables(cards, chunks)
        fs.tables_ready(specs, state)  # "running", EM at phase "start" (set by begin or resume)
        resume = None
    else:  # every table is rewritten before it is read: dbar's chunks are not looked at
        specs = fs.open_tables(cards, chunks, check_targets=False)
        resume = keeper.resume_run(state)
    engine = fitting.make_engine(est, plan, specs, N, penalty_scale=state.penalty_scale)
    options = fitting.options(est)
    choice = stored_choice(fs, state.penalty_scale)

    def run(eng, st, fresh_):
        learn(eng, st, options, fresh=fresh_, progress=None, callback=fs.checkpoint)

    def make(state=None, fresh=True, scale=state.penalty_scale):
        return MStep(engine, state or _new_state(est, cards, N, scale), run, fresh, state is None)

    with fs.damage_hint():
        res = _run_restarts(est, make, rows, counts, cards, n_hidden, seeds, keeper=keeper, resume=resume,
                            starts=choice.starts)
    reader = Engine.create(plan, fs.open_tables(cards, chunks, reader_owner=est), N, est.scheduler)
    _set_fitted(est, res, plan, reader, names, categories, n_hidden, choice)
    fs.set_extra("em", {"seeds": [int(x) for x in seeds], "result": {k: v for k, v in res.to_json().items()
                                                                     if k != "state"}})
    fs.complete(res.state, est.kl_data_)


def stored_choice(fs, scale: float) -> EMChoice:
    """What :func:`choose` chose for the EM fit of store ``fs`` (kept under :data:`EM_CHOICE`;
    an older store has none: no start, no scores)."""
    kept = fs.extra(EM_CHOICE) or {}
    return EMChoice(scale, [], {float(k): float(v) for k, v in kept.get("scores") or ()},
                    {int(k): float(v) for k, v in kept.get("hidden_scores") or ()}, kept.get("start"),
                    complete_start=kept.get("complete_start"))


def resume_in_store(est, fs, stored, restart: bool) -> None:
    """Continue the EM fit of store ``fs`` (under its writer lock, after ``fs.read()``) with
    the estimator ``est`` of its parameters; ``restart``: from the start, new tables."""
    from . import storage
    from .learn import FitState
    from .storage import IntegrityError

    state = FitState.from_json(stored.state)
    cards, N = tuple(state.cards), state.n_samples
    plan = fs.account(fitting.make_plan(est, cards, storage.get_backend(stored.backend), disk_free=fs.disk_available()))
    table = fs.read_kept("rows", data=True)
    if table.ndim != 2 or table.shape[1] != len(cards) + 1 or int(table[:, -1].sum()) != N:
        raise IntegrityError(fs.state_file, "the fit's rows file does not describe this fit")
    rows, counts = np.ascontiguousarray(table[:, :-1]), np.ascontiguousarray(table[:, -1])
    fs.reopen(plan, stored)
    seeds = fs.extra("em")["seeds"]
    fresh = stored.status == "starting" or restart
    if fresh:
        state = _new_state(est, cards, N, state.penalty_scale)  # the scale chosen when the fit began
        fs.set_extra("em", {"seeds": seeds, "restart": 0, "phase": "start", "best": None})
        fs.restart(state)
    _learn_in_store(est, fs, plan, rows, counts, cards, len(est.hidden or ()), seeds, stored.feature_names,
                    stored.categories, state, fresh)


def finished_attributes(est, fs) -> None:
    """The EM attributes of a finished out-of-core fit opened for reading."""
    em = fs.extra("em") or {}
    if em.get("result") is not None:
        choice = stored_choice(fs, est.penalty_scale_)
        _set_em_attributes(est, EMResult.from_json({**em["result"], "state": None}), len(est.hidden or ()),
                           choice.scores, choice.hidden_scores)


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
    from .io import recode

    c, _ = codes(est, X)
    h = _n_hidden(est)
    n = len(est.cardinalities_)
    out = recode(impute(est, c, method=method, random_state=random_state, n_hidden=h), est.basis_order_)[:, :n - h]
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
