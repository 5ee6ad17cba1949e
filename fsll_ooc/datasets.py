"""Synthetic discrete distributions with known truth, and the paper's six datasets.

Everything here is *dense-table based*: a distribution is an ``n``-dimensional
float64 array ``p`` of shape ``(k_0, ..., k_{n-1})`` (variable ``i`` takes values
``0 .. k_i-1``; flattened in C order, i.e. the last variable varies fastest), summing
to one.  Tables above ``2**26`` cells (512 MiB of float64) are refused with a
``ValueError``.

Generators
----------
* :func:`ising_grid` -- binary Ising model on an open ``rows x cols`` grid;
* :func:`potts_grid` -- Potts model on a grid, ``q``-valued (possibly mixed-cardinality)
  variables;
* :func:`random_bayesnet` -- random Bayesian network with arbitrary cardinalities;
* :func:`sample_table` -- exact i.i.d. samples from a dense table;
* :func:`paper_dataset` -- the six datasets of Takabatake & Akaho (2022), section
  "Experiments": ``Ising5x4S/L``, ``BN20-37S/L``, ``BN20-54S/L``.

Grid variables are numbered row-major: the variable at row ``r``, column ``c`` of a
``rows x cols`` grid has index ``r * cols + c``.

Reproducibility of :func:`paper_dataset`: ``SeedSequence(seed)`` is split into three
independent streams (model, samples of the ``S`` size, samples of the ``L`` size).
The model stream fixes the Bayesian network's structure and conditional tables, so the
``S`` and ``L`` datasets of one family and one seed share the same true distribution,
while their samples are independent draws.

Example
-------
>>> from fsll_ooc import datasets
>>> X, p = datasets.paper_dataset("Ising5x4S", seed=0)
>>> X.shape, X.dtype, p.shape == (2,) * 20
((1000, 20), dtype('int64'), True)
>>> round(float(p.sum()), 12)
1.0
"""
from __future__ import annotations

from typing import Sequence, Union

import numpy as np

__all__ = [
    "MAX_CELLS",
    "PAPER_DATASETS",
    "PAPER_TABLE1",
    "kl_divergence",
    "grid_edges",
    "ising_grid",
    "potts_grid",
    "random_bayesnet",
    "sample_table",
    "latent_classes",
    "paper_dataset",
    "paper_true_distribution",
]

#: Largest dense table the generators build (``2**26`` cells = 512 MiB of float64).
MAX_CELLS = 2**26

#: The six datasets of the paper's experiments, in the paper's order.
PAPER_DATASETS = ("Ising5x4S", "Ising5x4L", "BN20-37S", "BN20-37L", "BN20-54S", "BN20-54L")

#: The paper's Table 1 (its Java code on an i7-6700K @ 4 GHz): ``PAPER_TABLE1[(dataset, model)]``
#: is ``(KL(p_d||p), KL(p*||p), #basis, seconds)`` for the FSLL model (``"FL"``) and the
#: Boltzmann-machine baselines (``"BM-DI"``, ``"BM-PCD"``, :mod:`fsll_ooc.baselines`).
PAPER_TABLE1 = {
    ("Ising5x4S", "FL"): (2.501, 0.012, 31, 5), ("Ising5x4S", "BM-DI"): (2.424, 0.087, 210, 13),
    ("Ising5x4S", "BM-PCD"): (2.504, 0.094, 210, 3),
    ("Ising5x4L", "FL"): (0.476, 0.004, 37, 9), ("Ising5x4L", "BM-DI"): (0.473, 0.002, 210, 12),
    ("Ising5x4L", "BM-PCD"): (0.528, 0.053, 210, 3),
    ("BN20-37S", "FL"): (4.355, 0.317, 39, 5), ("BN20-37S", "BM-DI"): (4.746, 0.863, 210, 17),
    ("BN20-37S", "BM-PCD"): (4.803, 0.903, 210, 3),
    ("BN20-37L", "FL"): (0.697, 0.026, 105, 12), ("BN20-37L", "BM-DI"): (1.422, 0.750, 210, 19),
    ("BN20-37L", "BM-PCD"): (1.477, 0.806, 210, 3),
    ("BN20-54S", "FL"): (3.288, 0.697, 41, 5), ("BN20-54S", "BM-DI"): (3.743, 1.301, 210, 23),
    ("BN20-54S", "BM-PCD"): (3.826, 1.338, 210, 3),
    ("BN20-54L", "FL"): (0.430, 0.057, 192, 23), ("BN20-54L", "BM-DI"): (1.545, 1.166, 210, 21),
    ("BN20-54L", "BM-PCD"): (1.620, 1.242, 210, 3),
}

_SIZES = {"S": 1_000, "L": 100_000}

SeedLike = Union[None, int, np.random.SeedSequence, np.random.Generator]


def kl_divergence(p, q) -> float:
    """``KL(p || q)`` in nats of two tables of the same size, e.g. ``KL(p* || p_theta)``.

    Cells with ``p = 0`` contribute 0 (``0 ln 0 = 0``); a cell with ``p > 0`` and
    ``q <= 0`` (or ``q`` not a number) makes it ``inf``; round-off below 0 is reported
    as 0.

    >>> round(kl_divergence([0.5, 0.5, 0.0], [0.25, 0.5, 0.25]), 6)   # ln(2) / 2
    0.346574
    """
    p = np.asarray(p, dtype=np.float64).ravel()
    q = np.asarray(q, dtype=np.float64).ravel()
    if p.shape != q.shape:
        raise ValueError(f"KL needs two tables of the same size, got {p.size:,} and {q.size:,} cells")
    m = p > 0
    pm, qm = p[m], q[m]
    if np.any(~(qm > 0)):
        return float("inf")
    return float(max(np.sum(pm * (np.log(pm) - np.log(qm))), 0.0))


# --------------------------------------------------------------------------- helpers
def _check_cells(shape: Sequence[int]) -> int:
    shape = tuple(int(k) for k in shape)
    if any(k < 1 for k in shape):
        raise ValueError(f"every cardinality must be >= 1, got {shape}")
    cells = 1
    for k in shape:
        cells *= k
    if cells > MAX_CELLS:
        raise ValueError(
            f"dense table of shape {shape} has {cells} cells (about "
            f"{cells * 8 / 2**30:.1f} GiB as float64); the dataset generators refuse "
            f"tables above 2**26 = {MAX_CELLS} cells"
        )
    return cells


def _expand(factor: np.ndarray, axes: Sequence[int], ndim: int) -> np.ndarray:
    """View ``factor`` (whose dims are ``axes``, strictly increasing) broadcastable to ``ndim`` dims."""
    shape = [1] * ndim
    for a, k in zip(axes, factor.shape):
        shape[a] = k
    return factor.reshape(shape)


def grid_edges(rows: int, cols: int) -> list[tuple[int, int]]:
    """Nearest-neighbour edges ``(i, j)``, ``i < j``, of an open grid, row-major numbering."""
    if rows < 1 or cols < 1:
        raise ValueError(f"grid needs rows >= 1 and cols >= 1, got {rows}x{cols}")
    edges = []
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            if c + 1 < cols:
                edges.append((i, i + 1))
            if r + 1 < rows:
                edges.append((i, i + cols))
    return edges


def _normalise_from_log(logp: np.ndarray) -> np.ndarray:
    logp = logp - logp.max()
    p = np.exp(logp, out=logp)
    p /= p.sum()
    return p


# --------------------------------------------------------------------------- generators
def ising_grid(rows: int, cols: int, coupling: float = 0.5) -> np.ndarray:
    """Ising model on an open ``rows x cols`` grid of binary variables, as a dense table.

    ``p(x) ∝ exp(coupling * sum_<ij> s_i s_j)`` with ``s = 2x - 1`` and ``<ij>`` the
    nearest-neighbour pairs (no periodic boundary).  Variable ``r * cols + c`` sits at
    row ``r``, column ``c``.  ``ising_grid(5, 4)`` is the true distribution of the
    paper's ``Ising5x4S/L`` (coupling 1/2).

    Returns a float64 array of shape ``(2,) * (rows * cols)`` summing to one.

    >>> import numpy as np
    >>> p = ising_grid(1, 2, coupling=0.5)      # two spins, one bond
    >>> bool(np.isclose(p[0, 0] / p[0, 1], np.e))   # exp(1/2) / exp(-1/2)
    True
    >>> p = ising_grid(2, 2)
    >>> p.shape, round(float(p.sum()), 12), bool(p[0, 0, 0, 0] == p.max())
    ((2, 2, 2, 2), 1.0, True)
    """
    n = rows * cols
    _check_cells((2,) * n)
    s = np.array([-1.0, 1.0])
    pair = float(coupling) * np.outer(s, s)
    logp = np.zeros((2,) * n)
    for i, j in grid_edges(rows, cols):
        logp += _expand(pair, (i, j), n)
    return _normalise_from_log(logp)


def potts_grid(rows: int, cols: int, q: Union[int, Sequence[int]], coupling: float = 1.0) -> np.ndarray:
    """Potts model on an open ``rows x cols`` grid, as a dense table.

    ``p(x) ∝ exp(coupling * sum_<ij> [x_i == x_j])`` over nearest-neighbour pairs.
    ``q`` is either one cardinality for every variable or a sequence of
    ``rows * cols`` cardinalities (mixed-cardinality data; ``[x_i == x_j]`` compares the
    integer values, so a value ``>= k_j`` of ``x_i`` never matches).  Variable
    ``r * cols + c`` sits at row ``r``, column ``c``.

    Returns a float64 array of shape ``(k_0, ..., k_{n-1})`` summing to one.

    >>> p = potts_grid(1, 3, q=[2, 3, 4], coupling=1.0)
    >>> p.shape, round(float(p.sum()), 12)
    ((2, 3, 4), 1.0)
    >>> bool(p[1, 1, 1] > p[0, 1, 2])          # agreeing neighbours are likelier
    True
    """
    n = rows * cols
    if np.ndim(q) == 0:
        cards = (int(q),) * n
    else:
        cards = tuple(int(k) for k in q)
        if len(cards) != n:
            raise ValueError(f"q has {len(cards)} entries, the {rows}x{cols} grid has {n} variables")
    _check_cells(cards)
    logp = np.zeros(cards)
    for i, j in grid_edges(rows, cols):
        eq = np.equal.outer(np.arange(cards[i]), np.arange(cards[j])).astype(np.float64)
        logp += _expand(float(coupling) * eq, (i, j), n)
    return _normalise_from_log(logp)


def random_bayesnet(
    cards: Sequence[int],
    n_parents: Union[int, Sequence[int]],
    seed: SeedLike = None,
):
    """Random Bayesian network over variables ``X_0 .. X_{n-1}`` and its dense joint table.

    Structure: variable ``i`` gets ``min(i, m_i)`` distinct parents drawn uniformly from
    ``X_0 .. X_{i-1}`` (so the order ``0 .. n-1`` is topological), where ``m_i`` is
    ``n_parents`` if it is an int, else ``n_parents[i]``.  With 20 binary variables,
    ``n_parents=2`` gives the paper's BN20-37 family (``1 + 2*18 = 37`` edges) and
    ``n_parents=3`` the BN20-54 family (``1 + 2 + 3*17 = 54`` edges).

    Conditional tables: for a binary variable ``P(x_i = 1 | parents) ~ Uniform(0, 1)``;
    for ``k_i > 2`` each conditional distribution is drawn from a flat Dirichlet
    ``Dir(1, ..., 1)``.  The draws come from ``np.random.default_rng(seed)``: structure
    first, then the tables variable by variable.

    Returns ``(p, structure)``: ``p`` the joint table of shape ``cards`` (float64, sums
    to one), ``structure`` a dict with keys ``"cards"`` (tuple), ``"parents"`` (tuple of
    sorted tuples), ``"cpts"`` (list; ``cpts[i]`` has shape
    ``(k_pa_1, ..., k_pa_m, k_i)``, last axis summing to one) and ``"n_edges"`` (int).

    >>> p, s = random_bayesnet([2, 3, 2, 2], n_parents=2, seed=0)
    >>> p.shape, round(float(p.sum()), 12), s["n_edges"], s["parents"][0], s["parents"][1]
    ((2, 3, 2, 2), 1.0, 5, (), (0,))
    >>> s["cpts"][1].shape                     # P(X_1 | X_0): rows are X_0's values
    (2, 3)
    """
    cards = tuple(int(k) for k in cards)
    n = len(cards)
    if n == 0:
        raise ValueError("need at least one variable")
    _check_cells(cards)
    if np.ndim(n_parents) == 0:
        m = [int(n_parents)] * n
    else:
        m = [int(v) for v in n_parents]
        if len(m) != n:
            raise ValueError(f"n_parents has {len(m)} entries for {n} variables")
    if any(v < 0 for v in m):
        raise ValueError("n_parents must be >= 0")
    rng = np.random.default_rng(seed)

    parents = []
    for i in range(n):
        c = min(i, m[i])
        pa = rng.choice(i, size=c, replace=False) if c > 0 else np.empty(0, dtype=int)
        parents.append(tuple(sorted(int(v) for v in pa)))

    cpts = []
    p = np.ones(cards)
    for i in range(n):
        pa_shape = tuple(cards[j] for j in parents[i])
        k = cards[i]
        if k == 2:
            p1 = rng.uniform(0.0, 1.0, size=pa_shape)
            cpt = np.stack([1.0 - p1, p1], axis=-1)
        else:
            cpt = rng.dirichlet(np.ones(k), size=pa_shape) if pa_shape else rng.dirichlet(np.ones(k))
        cpt = np.asarray(cpt, dtype=np.float64).reshape(pa_shape + (k,))
        cpts.append(cpt)
        p *= _expand(cpt, parents[i] + (i,), n)
    p /= p.sum()
    structure = {
        "cards": cards,
        "parents": tuple(parents),
        "cpts": cpts,
        "n_edges": int(sum(len(pa) for pa in parents)),
    }
    return p, structure


def sample_table(p: np.ndarray, n: int, seed: SeedLike = None) -> np.ndarray:
    """Exact i.i.d. samples from a dense table ``p`` (non-negative; normalised internally).

    Inverse-CDF sampling over the C-order flattened table (cumulative sums plus
    ``searchsorted``).  Returns an ``(n, p.ndim)`` int64 array whose column ``i``
    holds values in ``0 .. p.shape[i]-1``.

    >>> import numpy as np
    >>> X = sample_table(np.array([[0.0, 0.25], [0.75, 0.0]]), 5, seed=1)
    >>> X.shape, X.dtype, sorted({tuple(r) for r in X.tolist()}) <= [(0, 1), (1, 0)]
    ((5, 2), dtype('int64'), True)
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim == 0:
        raise ValueError("p must have at least one dimension")
    _check_cells(p.shape)
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    flat = p.ravel()
    if not np.all(np.isfinite(flat)) or np.any(flat < 0):
        raise ValueError("p must be finite and non-negative")
    cdf = np.cumsum(flat)
    total = cdf[-1]
    if not total > 0:
        raise ValueError("p sums to zero")
    rng = np.random.default_rng(seed)
    u = rng.random(n) * total
    idx = np.searchsorted(cdf, u, side="right")
    # u < total always, but guard round-off and never return a zero-probability cell
    # sitting at the end of the table
    np.minimum(idx, flat.size - 1, out=idx)
    last = int(np.flatnonzero(flat)[-1])
    np.minimum(idx, last, out=idx)
    return np.stack(np.unravel_index(idx, p.shape), axis=1).astype(np.int64)


def latent_classes(k: int, n: int, seed: SeedLike = None, cards: Sequence[int] = (3, 4, 5, 3, 4, 5)):
    """``(X, z)``: ``n`` rows of a latent-class model with ``k`` classes (``z``), each class
    putting 0.8 of its mass on a value of its own per variable (the rest spread evenly), for
    hidden-variable fits (``FSLL(hidden=[k])``, ``hidden=["auto"]``).

    >>> X, z = latent_classes(3, 200, seed=0)
    >>> X.shape, sorted(set(z.tolist()))
    ((200, 6), [0, 1, 2])
    """
    rng = np.random.default_rng(seed)
    z = rng.integers(0, k, n)
    X = np.empty((n, len(cards)), np.int64)
    for i, c in enumerate(cards):
        top = rng.permutation(max(c, k))[:k] % c
        prof = np.full((k, c), 0.2 / c)
        prof[np.arange(k), top] += 0.8
        X[:, i] = np.minimum((rng.random(n)[:, None] > prof[z].cumsum(axis=1)).sum(axis=1), c - 1)
    return X, z


# --------------------------------------------------------------------------- paper data
def _parse_name(name: str):
    if name not in PAPER_DATASETS:
        raise ValueError(
            f"unknown dataset {name!r}; valid names are: {', '.join(PAPER_DATASETS)}"
        )
    return name[:-1], name[-1]


def paper_true_distribution(name: str, seed: int = 0):
    """True distribution ``p*`` of a paper dataset (``S`` or ``L`` give the same one).

    Returns ``(p_true, structure)``; ``structure`` is the :func:`random_bayesnet` dict
    for the ``BN20-*`` families and ``None`` for ``Ising5x4*`` (which does not depend on
    the seed).

    >>> p, s = paper_true_distribution("BN20-54S", seed=3)
    >>> p.shape == (2,) * 20, s["n_edges"]
    (True, 54)
    """
    family, _ = _parse_name(name)
    model_ss = np.random.SeedSequence(int(seed)).spawn(3)[0]
    if family == "Ising5x4":
        return ising_grid(5, 4, coupling=0.5), None
    n_parents = {"BN20-37": 2, "BN20-54": 3}[family]
    return random_bayesnet((2,) * 20, n_parents, seed=model_ss)


def paper_dataset(name: str, seed: int = 0, n_samples: int | None = None):
    """One of the paper's six datasets: ``(X, p_true)``.

    ``name`` is one of :data:`PAPER_DATASETS`.  ``X`` is an ``(N, 20)`` int64 array of
    exact i.i.d. draws from ``p_true`` (``N`` = 1,000 for ``...S``, 100,000 for
    ``...L``, or ``n_samples`` when given); ``p_true`` is the float64 table of shape
    ``(2,) * 20``.

    * ``Ising5x4S/L``: :func:`ising_grid` ``(5, 4, coupling=0.5)``, i.e.
      ``p*(x) ∝ exp(1/2 sum_<ij> s_i s_j)``, variable ``r * 4 + c`` at row ``r``,
      column ``c``.
    * ``BN20-37S/L``: :func:`random_bayesnet` with two parents per node (37 edges).
    * ``BN20-54S/L``: :func:`random_bayesnet` with three parents per node (54 edges).

    The same ``(name, seed)`` always gives the same data; ``S`` and ``L`` of one family
    and seed share ``p_true`` and have independent samples.

    >>> X, p = paper_dataset("BN20-37S", seed=0)
    >>> X.shape, int(X.min()), int(X.max())
    ((1000, 20), 0, 1)
    >>> X2, p2 = paper_dataset("BN20-37L", seed=0, n_samples=10)
    >>> X2.shape, bool((p == p2).all())
    ((10, 20), True)
    """
    family, size = _parse_name(name)
    ss = np.random.SeedSequence(int(seed)).spawn(3)
    p_true, _ = paper_true_distribution(name, seed)
    n = _SIZES[size] if n_samples is None else int(n_samples)
    sample_ss = ss[1] if size == "S" else ss[2]
    X = sample_table(p_true, n, seed=sample_ss)
    return X, p_true
