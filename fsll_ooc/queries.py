"""Questions a fitted model answers: marginals, conditionals, most probable states, its terms.

Every function takes a fitted :class:`~fsll_ooc.FSLL` or :class:`~fsll_ooc.FSLLAverage`
(both have thin methods of the same names that call these; :func:`interactions` reads a
single model's terms).  Variables are named by index or by name
(``feature_names_in_``); values by label (``categories_``) or by code ``0 .. k-1``.

In core the functions work on the dense table ``model.probabilities()``.  Out of core
that table is a dask array over the store, and the same code streams over it chunk by
chunk: a marginal is a dask tree reduction (one partial sum per chunk), evidence is a
slice that reads only the chunks it touches, and :func:`mode` keeps the best ``k``
cells of each chunk.  Peak memory is a few chunks plus the result; the full table is
never in memory.

:func:`interactions` reads the model's terms (``theta_``) and its fit history
(``history_``) and describes each term in words, e.g. ``colour=red * size in {0,2}``.

Example
-------
>>> import numpy as np, pandas as pd
>>> from fsll_ooc import FSLL
>>> rng = np.random.default_rng(0)
>>> rain = rng.random(400) < 0.5; umbrella = rain ^ (rng.random(400) < 0.1)
>>> df = pd.DataFrame({"rain": np.where(rain, "yes", "no"), "umbrella": np.where(umbrella, "yes", "no"),
...                    "day": rng.choice(["mon", "tue", "wed"], 400)})
>>> m = FSLL(progress=False).fit(df)
>>> marginal(m, ["rain", "umbrella"]).round(2)
array([[0.46, 0.04],
       [0.04, 0.46]])
>>> conditional(m, "umbrella", given={"rain": "yes"}).round(2)
array([0.07, 0.93])
>>> mode(m, k=2, given={"day": "tue"}, as_frame=True).round(3)
  rain umbrella  day      p
0   no       no  tue  0.464
1  yes      yes  tue  0.464
>>> interactions(m)[["term", "order", "share"]]
                    term  order  share
0  rain=no * umbrella=no      2    1.0
"""
from __future__ import annotations

import itertools
import math
from typing import Iterable, Mapping, Sequence

import numpy as np

from . import basis
from .basis import is_walsh
from .machine import total_memory
from .validation import check_n_samples

__all__ = ["marginal", "conditional", "mode", "interactions", "dependence", "predict_proba", "missing_proba",
           "evidence_codes", "pair_marginals", "labels", "resolve_variable", "resolve_value", "factor_text",
           "describe_factor", "term_contributions", "log_potential", "sample_codes", "QueryMethods", "basis_categories"]


# --------------------------------------------------------------------------- labels

def labels(model) -> tuple[list[str], list[list]]:
    """``(names, categories)`` of a fitted model; ``X0, X1, ...`` and ``0 .. k-1`` when it has none."""
    _check_fitted(model)
    ks = tuple(int(k) for k in model.cardinalities_)
    names = getattr(model, "feature_names_in_", None)
    cats = getattr(model, "categories_", None)
    names = [str(v) for v in names] if names is not None else [f"X{i}" for i in range(len(ks))]
    cats = [list(c) for c in cats] if cats is not None else [list(range(k)) for k in ks]
    return names, cats


def _check_fitted(model) -> None:
    if not hasattr(model, "cardinalities_"):  # FSLL and FSLLAverage set it when fitted
        raise RuntimeError(f"this {type(model).__name__} model is not fitted yet; call fit(X) first")


def resolve_variable(model, var) -> int:
    """Index of variable ``var``, given as an index (``0 .. n-1``) or a name.

    >>> class M: cardinalities_ = (2, 3); theta_ = {}; feature_names_in_ = ["a", "b"]
    >>> resolve_variable(M(), "b"), resolve_variable(M(), 0)
    (1, 0)
    """
    names, _ = labels(model)
    n = len(names)
    if isinstance(var, (bool, np.bool_)):
        raise ValueError(f"variable {var!r} is neither a name nor an index")
    if isinstance(var, (int, np.integer)):
        if not 0 <= int(var) < n:
            raise ValueError(f"variable index {int(var)} is out of range; the model has {n} variables (0..{n - 1})")
        return int(var)
    if isinstance(var, str):
        if var in names:
            return names.index(var)
        raise ValueError(f"unknown variable {var!r}; the model's variables are {_fmt_list(names)}")
    raise ValueError(f"variable {var!r} is neither a name nor an index")


def resolve_value(model, i: int, value) -> int:
    """Code of ``value`` for variable ``i``: a category label, or a code ``0 .. k-1``.

    Labels are matched first.  An integer that is not a label is read as a code,
    unless the variable's labels are themselves integers (then it is an error, since
    it would be ambiguous).
    """
    names, cats = labels(model)
    cat = cats[i]
    for c, lab in enumerate(cat):
        if _same(lab, value):
            return c
    int_labels = any(isinstance(lab, (int, np.integer)) and not isinstance(lab, (bool, np.bool_)) for lab in cat)
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and not int_labels:
        if 0 <= int(value) < len(cat):
            return int(value)
    raise ValueError(f"unknown value {value!r} of variable {names[i]!r}; its categories are {_fmt_list(cat)}"
                     + ("" if int_labels else f" (or codes 0..{len(cat) - 1})"))


def _same(label, value) -> bool:
    a = label.item() if isinstance(label, np.generic) else label
    b = value.item() if isinstance(value, np.generic) else value
    if isinstance(a, bool) != isinstance(b, bool) or isinstance(a, str) != isinstance(b, str):
        return False  # True is not the label 1, "1" is not the label 1
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable labels are not equal
        return False


def _fmt_list(items: Sequence, limit: int = 10) -> str:
    shown = ", ".join(repr(v) for v in list(items)[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def _variables(model, variables) -> list[int]:
    single = isinstance(variables, (str, int, np.integer))
    idx = [resolve_variable(model, v) for v in ([variables] if single else list(variables))]
    if not idx:
        raise ValueError("need at least one variable")
    if len(set(idx)) != len(idx):
        names, _ = labels(model)
        dup = next(names[i] for i in idx if idx.count(i) > 1)
        raise ValueError(f"variable {dup!r} is listed twice")
    return idx


def _evidence(model, given: Mapping | None) -> dict[int, int]:
    out: dict[int, int] = {}
    names, _ = labels(model)
    for var, value in (given or {}).items():
        if _is_missing(value):  # a missing cell is no evidence: marginalised out
            continue
        i = resolve_variable(model, var)
        if i in out:
            raise ValueError(f"variable {names[i]!r} appears twice in the evidence")
        out[i] = resolve_value(model, i, value)
    return out


def _is_missing(value) -> bool:
    """None, NaN or ``pd.NA``."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN
    except TypeError:  # pd.NA refuses bool()
        return True


# --------------------------------------------------------------------------- the table

def _table(model):
    """``model.probabilities()``: a numpy array in core, a dask array out of core."""
    _check_fitted(model)
    return model.probabilities()


def _compute(x) -> np.ndarray:
    return np.asarray(x.compute() if hasattr(x, "compute") else x, dtype=np.float64)


def _reduce(p, keep: Sequence[int], evidence: Mapping[int, int]) -> np.ndarray:
    """Sum of ``p`` restricted to ``evidence`` over all axes but ``keep`` (in ``keep``'s order).

    ``p`` is numpy or dask; dask slices read only the chunks they touch and ``sum``
    is a chunk-wise tree reduction, so nothing of table size is ever held.
    """
    n = p.ndim
    index = tuple(evidence.get(i, slice(None)) for i in range(n))
    sub = p[index] if evidence else p
    rest = [i for i in range(n) if i not in evidence]  # axes of sub, in order
    drop = tuple(a for a, i in enumerate(rest) if i not in keep)
    out = _compute(sub.sum(axis=drop) if drop else sub)
    kept = [i for i in rest if i in keep]
    return np.transpose(out, [kept.index(i) for i in keep])


def _frame(model, idx: Sequence[int], table: np.ndarray, column: str = "p"):
    import pandas as pd

    names, cats = labels(model)
    grids = np.meshgrid(*[np.arange(len(cats[i])) for i in idx], indexing="ij")
    cols = {names[i]: pd.Categorical.from_codes(g.ravel(), categories=pd.Index(cats[i], dtype=object))
            for i, g in zip(idx, grids)}
    cols[column] = table.ravel()
    return pd.DataFrame(cols)


# --------------------------------------------------------------------------- queries

def marginal(model, variables, as_frame: bool = False):
    """Marginal distribution of ``variables`` (a name/index, or a list of them).

    Returns an array of shape ``(k_i, k_j, ...)`` in the order given (1-D for a single
    variable); with ``as_frame=True`` a tidy ``DataFrame``: one column per variable
    (labels) and ``p``, one row per joint state (pivot it for a cross table).
    """
    idx = _variables(model, variables)
    out = _reduce(_table(model), idx, {})
    return _frame(model, idx, out) if as_frame else out


def conditional(model, target, given: Mapping | None = None, as_frame: bool = False):
    """Distribution of ``target`` (a variable or a list) given evidence ``{variable: value}``.

    Variables by name or index, values by label or code.  Returns an array of shape
    ``(k_t, ...)`` summing to 1 (``as_frame=True``: a tidy ``DataFrame`` as in
    :func:`marginal`).  ``given`` may also be evidence *rows* (a ``DataFrame``, or a 2-D
    array of codes): then the answer is one distribution per row, an array of shape
    ``(n_rows, k_t, ...)`` (``as_frame=True``: :func:`predict_proba`'s frame).  Raises ``ValueError`` for unknown variables or values, a
    target that is also evidence, or evidence of probability zero.
    """
    if _is_rows(given):  # evidence rows: one distribution per row
        out = predict_proba(model, target, given, as_frame=as_frame)
        if as_frame:
            return out
        return out.reshape((out.shape[0],) + tuple(int(model.cardinalities_[i]) for i in _variables(model, target)))
    idx = _variables(model, target)
    ev = _evidence(model, given)
    both = [i for i in idx if i in ev]
    if both:
        names, _ = labels(model)
        raise ValueError(f"variable {names[both[0]]!r} is both a target and evidence")
    out = _reduce(_table(model), idx, ev)
    total = float(out.sum())
    if not total > 0:
        raise ValueError(f"the evidence {dict(given or {})!r} has probability zero under the model")
    out = out / total
    return _frame(model, idx, out) if as_frame else out


def _top_block(block: np.ndarray, offsets: Sequence[int], shape: Sequence[int], k: int):
    """The ``k`` largest cells of one block: (values, flat indices into ``shape``), ties kept."""
    flat = np.asarray(block, dtype=np.float64).reshape(-1)
    if flat.size > k:
        kth = np.partition(flat, flat.size - k)[flat.size - k]
        pos = np.flatnonzero(flat >= kth)
    else:
        pos = np.arange(flat.size)
    local = np.unravel_index(pos, np.shape(block))
    glob = tuple(l + o for l, o in zip(local, offsets))
    return flat[pos], np.ravel_multi_index(glob, tuple(shape)).astype(np.int64)


def _top_k(p, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, flat indices) of the ``k`` largest cells of ``p``; ties by lowest index."""
    shape = tuple(p.shape)
    if isinstance(p, np.ndarray):
        vals, pos = _top_block(p, (0,) * p.ndim, shape, k)
    else:  # dask: the best k of every chunk, in parallel, then merge (never the whole table)
        import dask

        offs = [np.concatenate([[0], np.cumsum(c)[:-1]]).astype(int) for c in p.chunks]
        blocks = p.to_delayed()
        tasks = [dask.delayed(_top_block)(blocks[b], tuple(int(offs[a][j]) for a, j in enumerate(b)), shape, k)
                 for b in np.ndindex(*blocks.shape)]
        parts = dask.compute(*tasks)
        vals = np.concatenate([v for v, _ in parts])
        pos = np.concatenate([q for _, q in parts])
    order = np.lexsort((pos, -vals))[:k]
    return vals[order], pos[order]


def mode(model, k: int = 1, given: Mapping | None = None, as_frame: bool = False):
    """The ``k`` most probable joint states, most probable first (ties: lowest code first).

    Returns ``(states, probs)``: ``states`` an ``(k, n)`` int64 array of codes (as
    :meth:`~fsll_ooc.FSLL.sample`), ``probs`` their probabilities.  With evidence
    ``given`` the states agree with it and ``probs`` are conditional on it.
    ``as_frame=True``: one ``DataFrame`` with the labels and a column ``p``.
    """
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    ev = _evidence(model, given)
    p = _table(model)
    n = p.ndim
    free = [i for i in range(n) if i not in ev]
    sub = p[tuple(ev.get(i, slice(None)) for i in range(n))] if ev else p
    if not free:  # every variable is evidence: one state, certain given itself
        vals, pos = np.ones(1), np.zeros(1, np.int64)
    else:
        vals, pos = _top_k(sub, min(int(k), math.prod(sub.shape)))
    if ev and free:
        total = float(_compute(sub.sum()))
        if not total > 0:
            raise ValueError(f"the evidence {dict(given or {})!r} has probability zero under the model")
        vals = vals / total
    states = np.empty((len(pos), n), dtype=np.int64)
    if free:
        for i, col in zip(free, np.unravel_index(pos, tuple(sub.shape))):
            states[:, i] = col
    for i, v in ev.items():
        states[:, i] = v
    if not as_frame:
        return states, vals
    import pandas as pd

    names, cats = labels(model)
    cols = {names[i]: [cats[i][c] for c in states[:, i]] for i in range(n)}
    cols["p"] = vals
    return pd.DataFrame(cols)


# ------------------------------------------------------------------------ the terms

def _plus_set(k: int, j: int) -> list[int]:
    """Categories ``l`` where the local basis function ``phi_j(l)`` is +1."""
    if is_walsh(k):
        return [l for l in range(k) if bin(j & l).count("1") % 2 == 0]
    return [j]


def describe_factor(name: str, cats: Sequence, k: int, j: int) -> dict:
    """One variable's part of a term: ``{"var", "index", "basis", "plus"}``.

    ``plus`` lists the categories where the local basis function ``phi_j`` is +1 (it is
    -1 on the others).

    >>> describe_factor("size", [0, 1, 2, 3], 4, 1)["plus"]
    [0, 2]
    """
    return {"var": name, "index": int(j), "basis": "walsh" if is_walsh(k) else "indicator",
            "plus": [cats[l] for l in _plus_set(k, j)]}


def factor_text(f: Mapping, limit: int = 6) -> str:
    """``colour=red`` or ``size in {0,2}``: the categories where the factor is +1.

    >>> factor_text(describe_factor("colour", ["blue", "green", "red"], 3, 2))
    'colour=red'
    """
    plus = f["plus"]
    if len(plus) == 1:
        return f"{f['var']}={plus[0]}"
    shown = ",".join(str(v) for v in plus[:limit])
    if len(plus) > limit:
        shown += f",...({len(plus)})"
    return f"{f['var']} in {{{shown}}}"


def _joint_weights(gains, n: int) -> list[float]:
    """Fractions (summing to one) of a joint move's gain owed to each of its ``n`` new terms."""
    g = [max(float(v), 0.0) for v in gains] if gains is not None and len(gains) == n else []
    total = sum(g)
    if not (total > 0 and math.isfinite(total)):
        return [1.0 / n] * n
    return [v / total for v in g]


def term_contributions(history: Iterable[Mapping]) -> tuple[dict[tuple, float], float]:
    """Cost reduction owed to each term now in the model, and the total reduction.

    * ``append`` of ``y`` starts its account with that iteration's gain (``-delta``);
      ``adjust`` of ``y`` adds to it; ``remove`` closes it (the gains stay in the
      total, so the shares of the remaining terms then sum to less than 1);
    * a move that appends several terms at once (a history entry with ``y`` None and
      an ``added`` list, a joint selection) splits its whole gain, the re-fit of the
      terms already present included (they moved because of the new ones), among the
      new terms in proportion to the gain predicted for each when it was picked
      (``added_gain``; equally when absent or not positive);
    * a move on no single term (e.g. a joint refit of all parameters) shares its gain
      among the terms present in proportion to their accounts.
    """
    contrib: dict[tuple, float] = {}
    total = 0.0
    for h in history:
        move, y = h.get("move"), h.get("y")
        gain = -float(h.get("delta") or 0.0)
        if move in (None, "init") or not gain:
            continue
        total += gain
        if y is not None:
            y = tuple(map(int, y))
            if move == "remove":
                contrib.pop(y, None)
            elif move == "append":
                contrib[y] = gain
            else:  # adjust, or any other move of one term
                contrib[y] = contrib.get(y, 0.0) + gain
        elif h.get("added"):
            added = [tuple(map(int, a)) for a in h["added"]]
            w = _joint_weights(h.get("added_gain"), len(added))
            for a, wa in zip(added, w):
                contrib[a] = contrib.get(a, 0.0) + gain * wa
        elif contrib:
            base = sum(contrib.values())
            for t in contrib:
                contrib[t] += gain * (contrib[t] / base if base > 0 else 1 / len(contrib))
    return contrib, total


def basis_categories(model) -> list | None:
    """A model's ``categories_`` in its basis order (what ``theta_``'s indices refer to)."""
    if getattr(model, "categories_", None) is None:
        return None
    return [[c[u] for u in o] for c, o in zip(model.categories_, model.basis_order_)]


def interactions(model, as_frame: bool = True):
    """The model's terms in words, sorted by their share of the cost reduction.

    One row per selected basis function ``y``: ``term`` (e.g. ``colour=red * size in
    {0,2}``: the categories where each factor is +1; the term adds ``theta`` to
    ``log p(x)`` where an even number of the factors are -1, and subtracts it
    elsewhere), ``variables`` (tuple of names), ``order`` (number of variables),
    ``theta``, ``share`` (fraction of the fit's total cost reduction that appending
    and adjusting this term brought, see :func:`term_contributions`; NaN when the model
    has no history) and ``y``.
    Sorted by ``share``, then ``|theta|``.  ``as_frame=False`` returns the rows as
    dicts, each with its ``factors`` (see :func:`describe_factor`) too.
    """
    _check_fitted(model)
    if not hasattr(model, "theta_"):
        raise TypeError(f"a {type(model).__name__} is a mixture of models and has no single set of terms; "
                        "ask a member: model.members_[k] (model.interactions() lists every member's)")
    names, cats = labels(model)
    order = getattr(model, "basis_order_", None)
    if order is not None:  # theta_'s indices refer to the basis order of the categories
        cats = [[c[u] for u in o] for c, o in zip(cats, order)]
    ks = tuple(int(k) for k in model.cardinalities_)
    contrib, total = term_contributions(getattr(model, "history_", None) or [])
    rows = []
    for y, theta in dict(model.theta_).items():
        y = tuple(int(v) for v in y)
        if not any(y) or float(theta) == 0.0:
            continue
        factors = [describe_factor(names[i], cats[i], ks[i], yi) for i, yi in enumerate(y) if yi]
        share = contrib[y] / total if (y in contrib and total > 0) else math.nan
        rows.append({"term": " * ".join(factor_text(f) for f in factors),
                     "variables": tuple(names[i] for i, yi in enumerate(y) if yi),
                     "order": len(factors), "theta": float(theta), "share": share, "y": y, "factors": factors})
    rows.sort(key=lambda r: (math.isnan(r["share"]), -(0.0 if math.isnan(r["share"]) else r["share"]),
                             -abs(r["theta"]), r["order"], r["y"]))
    if not as_frame:
        return rows
    import pandas as pd

    cols = ["term", "variables", "order", "theta", "share", "y"]
    return pd.DataFrame([{c: r[c] for c in cols} for r in rows], columns=cols)


#: Rows per call of the compiled loop (its copy of their codes: 8 bytes per row and variable).
ROWS_PER_BLOCK = 2**16
#: Rows x terms from which :func:`log_potential` runs the compiled loop (below it, numpy's
#: gathers cost less than the call).
COMPILED_MIN_WORK = 4096


def log_potential(model, codes: np.ndarray) -> np.ndarray:
    """``l_theta(x) = sum_y theta_y Phi_y(x)`` per row of ``codes`` under a fitted ``model``, by
    gathers from the local basis matrices (one compiled pass over the rows,
    :func:`fsll_ooc.kernels.rows.term_sums`, when every code is within its variable's range: the
    same operations in the same order as the numpy form below, the same bits)."""
    cards = [int(k) for k in model.cardinalities_]
    codes = np.asarray(codes)
    theta = model.theta_
    if (codes.ndim == 2 and codes.shape[1] == len(cards) and codes.shape[0] * len(theta) >= COMPILED_MIN_WORK
            and np.issubdtype(codes.dtype, np.integer) and codes.size
            and bool(np.all((codes.min(axis=0) >= 0) & (codes.max(axis=0) < np.array(cards))))):
        return _log_potential_compiled(cards, theta, codes)
    rows: dict = {}
    l = np.zeros(codes.shape[0])
    for y, v in model.theta_.items():
        phi = None
        for i, yi in enumerate(y):
            if yi:
                k = model.cardinalities_[i]
                row = rows.get((k, yi))
                if row is None:
                    row = rows[(k, yi)] = basis.phi_values(k, yi, np.arange(k))
                f = row[codes[:, i]]
                phi = f if phi is None else phi * f
        l += v * (1.0 if phi is None else phi)
    return l


def _log_potential_compiled(cards, theta, codes: np.ndarray) -> np.ndarray:
    """:func:`log_potential` by :func:`fsll_ooc.kernels.rows.term_sums`: each term's factors as
    (axis, offset of the axis's value table), the tables of the distinct ``(k, y_i)`` side by side."""
    from .kernels.rows import term_sums

    at: dict = {}
    tables, starts, axes, offsets, values = [], [0], [], [], []
    size = 0
    for y, v in theta.items():
        for i, yi in enumerate(y):
            if yi:
                key = (cards[i], int(yi))
                off = at.get(key)
                if off is None:
                    off = at[key] = size
                    tables.append(basis.phi_values(cards[i], int(yi), np.arange(cards[i])))
                    size += cards[i]
                axes.append(i)
                offsets.append(off)
        starts.append(len(axes))
        values.append(v)
    args = (np.asarray(values, dtype=np.float64), np.asarray(starts, dtype=np.int64),
            np.asarray(axes, dtype=np.int64), np.asarray(offsets, dtype=np.int64),
            np.concatenate(tables).astype(np.float64) if tables else np.zeros(1))
    out = np.zeros(codes.shape[0])
    for lo in range(0, codes.shape[0], ROWS_PER_BLOCK):  # (the codes of a block copied as axes x rows)
        block = np.ascontiguousarray(codes[lo:lo + ROWS_PER_BLOCK].T, dtype=np.int64)
        term_sums(block, *args, out[lo:lo + ROWS_PER_BLOCK])
    return out


def sample_codes(model, n_samples, random_state) -> np.ndarray:
    """``n_samples`` rows of codes drawn from a fitted ``model``'s ``p_theta`` (in core from its
    table, out of core block by block by mass)."""
    model._check_fitted()
    check_n_samples(n_samples, len(model.cardinalities_), total_memory())
    rng = np.random.default_rng(random_state)
    p = model.probabilities()
    if isinstance(p, np.ndarray):
        cdf = np.cumsum(p.reshape(-1))
        flat = np.searchsorted(cdf, rng.random(n_samples) * cdf[-1], side="right")
        flat = np.minimum(flat, cdf.size - 1)
    else:  # out of core: pick blocks by their mass, then cells inside each block
        blocks = p.reshape(-1).rechunk(int(np.prod(p.chunksize)))
        mass = blocks.map_blocks(lambda b: np.array([b.sum()]), chunks=(1,)).compute()
        counts = rng.multinomial(n_samples, mass / mass.sum())
        offsets = np.concatenate([[0], np.cumsum(blocks.chunks[0])])
        parts = []
        for b in np.nonzero(counts)[0]:
            cdf = np.cumsum(blocks.blocks[b].compute())
            idx = np.minimum(np.searchsorted(cdf, rng.random(counts[b]) * cdf[-1], side="right"), cdf.size - 1)
            parts.append(offsets[b] + idx)
        flat = rng.permutation(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    return np.stack(np.unravel_index(flat, model.cardinalities_), axis=1).astype(np.int64)


class QueryMethods:
    """The query methods of a fitted :class:`~fsll_ooc.FSLL` (the functions of this module,
    called with the model)."""

    def marginal(self, variables, as_frame: bool = False):
        """Marginal distribution of ``variables`` (names or indices); streams out of core.

        Returns an array of shape ``(k_i, k_j, ...)`` in the order given, or with
        ``as_frame=True`` a tidy ``DataFrame`` (labels and ``p``).  See
        :func:`fsll_ooc.queries.marginal`.

        >>> import numpy as np
        >>> from fsll_ooc import FSLL
        >>> X = np.array([[0, 0], [0, 0], [1, 1], [1, 1], [0, 1]] * 40)
        >>> m = FSLL(progress=False).fit(X)
        >>> m.marginal([1, 0]).shape, round(float(m.marginal(0).sum()), 12)
        ((2, 2), 1.0)
        """
        return marginal(self, variables, as_frame=as_frame)

    def conditional(self, target, given=None, as_frame: bool = False):
        """Distribution of ``target`` given evidence ``{variable: value}`` (labels or codes).

        See :func:`fsll_ooc.queries.conditional`.

        >>> import numpy as np
        >>> from fsll_ooc import FSLL
        >>> X = np.array([[0, 0], [0, 0], [1, 1], [1, 1], [0, 1]] * 40)
        >>> m = FSLL(progress=False).fit(X)
        >>> bool(m.conditional(1, given={0: 1})[1] > 0.9)
        True
        """
        return conditional(self, target, given=given, as_frame=as_frame)

    def mode(self, k: int = 1, given=None, as_frame: bool = False):
        """The ``k`` most probable joint states and their probabilities: ``(states, probs)``.

        See :func:`fsll_ooc.queries.mode`.

        >>> import numpy as np
        >>> from fsll_ooc import FSLL
        >>> X = np.array([[0, 0], [0, 0], [1, 1], [1, 1], [0, 1]] * 40)
        >>> states, probs = FSLL(progress=False).fit(X).mode(k=2)
        >>> sorted(map(tuple, states.tolist()))
        [(0, 0), (1, 1)]
        """
        return mode(self, k=k, given=given, as_frame=as_frame)

    def interactions(self, as_frame: bool = True):
        """The selected terms in words, sorted by their share of the cost reduction.

        Columns ``term``, ``variables``, ``order``, ``theta``, ``share``, ``y``.  See
        :func:`fsll_ooc.queries.interactions`.

        >>> import numpy as np
        >>> from fsll_ooc import FSLL
        >>> X = np.array([[0, 0], [0, 0], [1, 1], [1, 1], [0, 1]] * 40)
        >>> FSLL(progress=False).fit(X).interactions()["term"].iloc[0]
        'X0=0 * X1=0'
        """
        return interactions(self, as_frame=as_frame)

    def dependence(self, conditional="auto"):
        """Mutual information of every pair of variables under the model, largest first:
        a ``DataFrame`` with ``a``, ``b``, ``mi``, ``cmi`` (given the other variables) and
        ``terms`` (an average: ``mi_min``, ``mi_max`` over its members).  See
        :func:`fsll_ooc.queries.dependence`."""
        return dependence(self, conditional=conditional)

    def predict_proba(self, target, X, as_frame: bool = True):
        """The distribution of ``target`` (a variable, or a list for their joint) given each
        row of ``X`` (a DataFrame or codes; missing cells summed out): one row per row of
        ``X``, one column per category.  See :func:`fsll_ooc.queries.predict_proba`."""
        return predict_proba(self, target, X, as_frame=as_frame)


# ------------------------------------------------------------------- dependence

#: :func:`dependence` computes the conditional mutual information of every pair from the
#: dense table when it has at most this many cells times pairs (a few seconds) ...
CMI_WORK = 2**27
#: ... and the table (read into memory for it, out of core) at most this many cells.
CMI_CELLS = 2**24


def _pair_sums(block: np.ndarray, out: dict, offsets: Sequence[int]) -> None:
    """Add every pairwise marginal ``(a, b)``, ``a < b``, of one block of the table into ``out``.

    Sums over the trailing axes first, then over the leading ones, so that every sum
    runs over contiguous memory: about three passes over the block in all for binary
    axes, not one per pair.
    """
    shape = block.shape
    n = len(shape)
    t = np.asarray(block, dtype=np.float64)
    for b in range(n - 1, 0, -1):
        if b < n - 1:  # t: the block summed over the axes after b
            t = t.reshape(-1, shape[b + 1]).sum(axis=-1).reshape(shape[:b + 1])
        h = t  # axes a .. b
        for a in range(b):
            s = h.reshape(shape[a], -1, shape[b]).sum(axis=1)
            out[(a, b)][offsets[a]:offsets[a] + shape[a], offsets[b]:offsets[b] + shape[b]] += s
            if a < b - 1:
                h = h.reshape(shape[a], -1).sum(axis=0)


def pair_marginals(p) -> dict[tuple[int, int], np.ndarray]:
    """Every pairwise marginal ``{(a, b): table}`` (``a < b``) of ``p`` (numpy, or dask
    chunk by chunk: one read of the table, never more than a chunk in memory)."""
    shape = tuple(int(s) for s in p.shape)
    n = len(shape)
    out = {(a, b): np.zeros((shape[a], shape[b])) for b in range(n) for a in range(b)}
    if isinstance(p, np.ndarray):
        _pair_sums(p, out, (0,) * n)
        return out
    offs = [np.concatenate([[0], np.cumsum(c)[:-1]]).astype(int) for c in p.chunks]
    for b in np.ndindex(*p.numblocks):
        _pair_sums(np.asarray(p.blocks[b].compute()), out, tuple(int(offs[a][j]) for a, j in enumerate(b)))
    return out


def _mi(P: np.ndarray) -> float:
    """Mutual information (nats) of a two-way table ``P`` (normalised here); ``0 log 0 = 0``."""
    P = P / P.sum()
    outer = P.sum(1, keepdims=True) * P.sum(0, keepdims=True)
    m = P > 0
    return _clean(float(np.sum(P[m] * np.log(P[m] / outer[m]))))


def _cmi(p: np.ndarray, a: int, b: int) -> float:
    """``I(a; b | the other variables)`` (nats) from the dense table ``p``."""
    P = np.moveaxis(p, (a, b), (0, 1)).reshape(p.shape[a], p.shape[b], -1)
    P = P / P.sum()
    rest, pa, pb = P.sum((0, 1)), P.sum(1), P.sum(0)
    m = P > 0
    ratio = P * rest[None, None] / (pa[:, None] * pb[None])
    return _clean(float(np.sum(P[m] * np.log(ratio[m]))))


#: Mutual informations below this (nats) are round-off of an exact zero, reported as 0.
MI_ROUNDOFF = 1e-12


def _clean(v: float) -> float:
    return v if v > MI_ROUNDOFF else 0.0


def _pairs_with_terms(model, n: int) -> dict[tuple[int, int], int]:
    theta = getattr(model, "theta_", None)
    if theta is None:
        return {}
    out: dict = {}
    for y, v in theta.items():
        if float(v) == 0.0:
            continue
        on = [i for i, yi in enumerate(y) if yi]
        for a, b in itertools.combinations(on, 2):
            out[(a, b)] = out.get((a, b), 0) + 1
    return out


def dependence(model, conditional: bool | str = "auto"):
    """How strongly each pair of variables depends on each other, under the model.

    One row per pair of variables: ``a``, ``b`` (names), ``mi`` (the mutual information
    ``I(a; b)`` in nats, from the model's exact pairwise marginal), ``cmi`` (``I(a; b |
    every other variable)``: what a and b say about each other beyond what the rest
    says; 0 exactly when no term of the model holds both; NaN when not computed),
    ``terms`` (how many of the model's terms hold both variables).  Sorted by ``mi``,
    largest first.  An :class:`~fsll_ooc.FSLLAverage` gives the mixture's ``mi`` and
    ``cmi``, and ``mi_min`` / ``mi_max`` over its members.

    Unlike the term shares of :func:`interactions`, these numbers do not depend on the
    basis (how the categories are coded): they are properties of the distribution.

    ``conditional``: ``"auto"`` computes ``cmi`` when the table is small enough (cells
    times pairs at most :data:`CMI_WORK`, cells at most :data:`CMI_CELLS`: it is read
    into memory); ``True`` always, ``False`` never.  The pairwise marginals take one read of the table (out of core:
    chunk by chunk).
    """
    import pandas as pd

    _check_fitted(model)
    names, _ = labels(model)
    n = len(names)
    p = _table(model)
    size = math.prod(int(k) for k in p.shape)
    pairs = n * (n - 1) // 2
    if conditional == "auto":
        conditional = size * pairs <= CMI_WORK and size <= CMI_CELLS
    elif conditional not in (True, False):
        raise ValueError(f"conditional must be True, False or 'auto', got {conditional!r}")
    marg = pair_marginals(p)
    dense = None
    if conditional:
        dense = p if isinstance(p, np.ndarray) else _compute(p)
    members = getattr(model, "members_", None)
    member_marg = [pair_marginals(_table(m)) for m in members] if members else None
    together = _pairs_with_terms(model, n)
    rows = []
    for (a, b), P in marg.items():
        r = {"a": names[a], "b": names[b], "mi": _mi(P),
             "cmi": _cmi(dense, a, b) if dense is not None else math.nan}
        if members:
            mis = [_mi(mm[(a, b)]) for mm in member_marg]
            r["mi_min"], r["mi_max"] = min(mis), max(mis)
        else:
            r["terms"] = together.get((a, b), 0)
        rows.append(r)
    cols = ["a", "b", "mi", "cmi"] + (["mi_min", "mi_max"] if members else ["terms"])
    df = pd.DataFrame(rows, columns=cols)
    return df.sort_values(["mi", "a", "b"], ascending=[False, True, True], kind="stable").reset_index(drop=True)


# ------------------------------------------------------------------- predictions

def _is_rows(given) -> bool:
    """Evidence rows (a DataFrame, or a 2-D array) rather than one ``{variable: value}`` mapping."""
    return hasattr(given, "columns") or (isinstance(given, np.ndarray) and given.ndim == 2)


def _n_hidden(model) -> int:
    return int(getattr(model, "n_hidden_", 0) or 0)


def evidence_codes(model, X) -> np.ndarray:
    """The ``(N, n)`` codes of evidence rows ``X``, in the order shown (``categories_``),
    ``-1`` where a cell is missing.

    ``X``: a ``DataFrame`` whose columns are a subset of the model's variables (matched by
    name; a variable it lacks is missing in every row; a column the model does not know
    is an error naming it), missing cells NaN, None or ``pd.NA``; or a 2-D array of codes
    (or labels) with one column per variable (NaN or ``-1`` missing); hidden variables
    may be left out.  An unknown label is an error naming the column, value and row.
    """
    from .io import encode_with

    names, cats = labels(model)
    n = len(names)
    width = n - _n_hidden(model)
    if hasattr(X, "columns"):
        import pandas as pd

        cols = [str(c) for c in X.columns]
        unknown = [c for c in cols if c not in names]
        if unknown:
            raise ValueError(f"the evidence has column(s) {_fmt_list(unknown)} the model does not know "
                             f"(its variables: {_fmt_list(names)})")
        X = X.copy(deep=False)
        X.columns = cols
        X = pd.DataFrame({nm: X[nm] if nm in cols else pd.Series([None] * len(X), index=X.index, dtype=object)
                          for nm in names[:width]}, index=X.index)
    else:
        X = np.asarray(X)
        if X.ndim == 1:
            X = X[None, :]
        if X.ndim != 2 or X.shape[1] not in (width, n):
            raise ValueError(f"evidence rows need {width} columns (one per variable), got shape {X.shape}")
        width = X.shape[1]
    if len(X) == 0:
        return np.zeros((0, n), np.int64)
    codes = np.full((len(X), n), -1, np.int64)
    if not hasattr(X, "columns") and X.dtype.kind in "iuf":  # codes, as everywhere an array is given
        miss = np.isnan(X) if X.dtype.kind == "f" else X < 0
        vals = np.where(miss, 0, X)
        ks = np.asarray(model.cardinalities_[:width])
        bad = (vals != np.floor(vals)) | (vals >= ks) | (vals < 0)
        if bad.any():
            r, j = np.argwhere(bad)[0]
            raise ValueError(f"column {names[j]!r}: {X[r, j]!r} at row {r} is not a code 0..{ks[j] - 1} "
                             "(NaN or -1: missing)")
        codes[:, :width] = np.where(miss, -1, vals).astype(np.int64)
        return codes
    import pandas as pd

    frame = X if hasattr(X, "columns") else pd.DataFrame(X, columns=names[:width])
    mask = np.asarray(frame.isna().to_numpy(), dtype=bool)
    if mask.any():  # a missing cell holds a known label while encoding, then -1
        frame = frame.copy()
        for j in np.flatnonzero(mask.any(axis=0)):
            frame[frame.columns[j]] = frame.iloc[:, j].astype(object).where(~mask[:, j], cats[j][0])
    codes[:, :width] = encode_with(cats[:width], frame, names=names[:width])
    codes[:, :width][mask] = -1
    return codes


def _log_prob_codes(model, codes: np.ndarray) -> np.ndarray:
    """``log p`` of each row of ``codes`` (in the order shown; ``-1``: missing, summed out);
    an average: the log of its members' mean."""
    members = getattr(model, "members_", None)
    if members:
        lp = np.stack([_log_prob_codes(m, codes) for m in members])
        top = lp.max(axis=0)
        return top + np.log(np.mean(np.exp(lp - top), axis=0))
    return model._basis_log_prob(model._basis_codes(codes))


def predict_proba(model, target, X, as_frame: bool = True):
    """For every row of ``X``, the distribution of ``target`` given that row's observed cells.

    ``target``: a variable (name or index) or a list of them (their joint distribution).
    ``X``: evidence rows as :func:`evidence_codes` reads them (a ``DataFrame`` with any
    subset of the model's columns, or codes); missing cells are summed out under the
    model, and a value ``X`` holds for a target variable is ignored.  Returns a
    ``DataFrame`` with one row per row of ``X`` (same index) and one column per category
    of the target (a ``MultiIndex`` of the targets' categories for a list), each row
    summing to 1; ``as_frame=False``: the ``(N, k_t1 * k_t2 * ...)`` array.

    All rows are answered together: one evaluation of the model per target state for
    complete rows (``O(N x terms)``), and for rows with missing cells the marginals
    that :meth:`~fsll_ooc.FSLL.log_prob` uses (out of core they stream over the store).
    """
    idx = _variables(model, target)
    names, cats = labels(model)
    codes = evidence_codes(model, X)
    codes[:, idx] = -1
    ks = [int(model.cardinalities_[i]) for i in idx]
    states = np.array(list(itertools.product(*[range(k) for k in ks])), dtype=np.int64).reshape(-1, len(idx))
    T, N = len(states), codes.shape[0]
    big = np.repeat(codes[None], T, axis=0)
    big[:, :, idx] = states[:, None, :]
    lp = _log_prob_codes(model, big.reshape(T * N, -1)).reshape(T, N) if N else np.zeros((T, 0))
    lp = lp - lp.max(axis=0, keepdims=True) if N else lp
    p = np.exp(lp)
    p = (p / p.sum(axis=0, keepdims=True)).T
    if not as_frame:
        return p
    import pandas as pd

    if len(idx) == 1:
        columns = pd.Index(cats[idx[0]], dtype=object, name=names[idx[0]])
    else:
        columns = pd.MultiIndex.from_product([cats[i] for i in idx], names=[names[i] for i in idx])
    index = X.index if hasattr(X, "index") and hasattr(X, "columns") else None
    return pd.DataFrame(p, index=index, columns=columns)


def missing_proba(model, X) -> dict:
    """``{column: DataFrame}``: for every variable with missing cells in ``X``, the rows where
    it is missing and the distribution of its value given each row's observed cells
    (:func:`predict_proba` of that variable on those rows)."""
    names, _ = labels(model)
    codes = evidence_codes(model, X)
    width = len(names) - _n_hidden(model)
    out = {}
    for i in range(width):
        rows = np.flatnonzero(codes[:, i] < 0)
        if not len(rows):
            continue
        sub = X.iloc[rows] if hasattr(X, "iloc") else np.asarray(X)[rows]
        frame = predict_proba(model, i, sub)
        if not hasattr(X, "columns"):
            frame.index = rows
        out[names[i] if hasattr(X, "columns") else i] = frame
    return out
