"""The learner's own invariants, checked where they cost next to nothing.

Two facts hold for every fit (``docs/design.md``, "The learner's invariants"):

* every dual ``thetabar_y`` and target ``dbar_y`` is an expectation of a +-1 function, so
  it lies in ``[-1, 1]``: the learner checks the values every scan hands it (the support's
  duals and targets, the best candidate's), which costs ``O(|support|)`` per pass;
* the incremental update and an exact re-derivation give the same duals: where the
  learner knows the incremental values of some cells next to exact ones (a batch's
  sub-table against the table after its pass; a few support cells predicted by the
  incremental identity against a periodic re-derivation) it compares them.

A broken invariant means the tables are not what the learner wrote (a damaged or altered
store, a chunk written by someone else) or a bug; the fit stops with an
:class:`~fsll_ooc.storage.IntegrityError` naming the store instead of learning from them.
"""
from __future__ import annotations

import math

import numpy as np

from ..engine import Table
from ..storage import IntegrityError

__all__ = ["DUAL_SLACK", "SYNC_TOL", "PROBE_CELLS", "store_of", "check_range", "check_scan", "check_agree", "check_support",
           "common_cells", "predict_step"]

#: How far beyond ``[-1, 1]`` a dual may lie before the learner stops: the round-off of
#: a value computed by a few products and one division (``~1e-16``), with a wide margin.
DUAL_SLACK = 1e-9

#: How far incremental and exact duals may disagree (absolute).  The incremental update
#: drifts by about 1e-13 over the 256 steps between two re-derivations (the tests hold
#: them to 1e-10); a stale or damaged chunk is off by far more.
SYNC_TOL = 1e-6

#: Support cells predicted before a periodic re-derivation and compared after it.
PROBE_CELLS = 8


def store_of(engine) -> str:
    """What to name in an error: the directory of the engine's dual table, or the tables'
    backend when they live in memory."""
    spec = engine.ctx.specs[Table.THETABAR]
    if spec.path is None:
        return f"the {spec.backend!r} tables in memory"
    return str(spec.path).rstrip("/").rsplit("/", 1)[0]  # not Path: "s3://b/s" would become "s3:/b/s"


def _fail(engine, problem: str):
    where = store_of(engine)
    advice = (f"the store's tables cannot be trusted; FSLL.resume({where!r}, restart=True) rebuilds them from "
              "the data kept in the store and fits again") if engine.out_of_core else ""
    raise IntegrityError(where, problem, advice)


def check_range(engine, flats, values, n_iter: int, what: str) -> None:
    """Stop when one of ``values`` (at cells ``flats``) lies outside ``[-1, 1]`` or is not a number."""
    v = np.asarray(values, np.float64)
    if v.size and not (np.abs(v).max() <= 1.0 + DUAL_SLACK):  # NaN fails too
        i = int(np.argmax(np.where(np.isnan(v), np.inf, np.abs(v))))
        _fail(engine, f"at iteration {n_iter} the {what} of cell {int(np.asarray(flats)[i])} is {float(v[i])!r}, "
                      "outside [-1, 1] (an expectation of a +-1 basis function)")


def check_scan(engine, res, n_iter: int) -> None:
    """:func:`check_range` of what the scan ``res`` reports: the support's duals and
    targets, the best candidate's."""
    check_range(engine, res.supp_pos, res.supp_t, n_iter, "dual")
    check_range(engine, res.supp_pos, res.supp_d, n_iter, "target")
    if res.pos >= 0:
        check_range(engine, [res.pos, res.pos], [res.t, res.d], n_iter, "best candidate's dual or target")


def check_agree(engine, flats, incremental, exact, n_iter: int, what: str) -> None:
    """Stop when ``incremental`` and ``exact`` duals at cells ``flats`` differ by more than
    :data:`SYNC_TOL`."""
    inc = np.asarray(incremental, np.float64)
    ex = np.asarray(exact, np.float64)
    if not inc.size:
        return
    err = np.abs(inc - ex)
    if not (err.max() <= SYNC_TOL):
        i = int(np.argmax(np.where(np.isnan(err), np.inf, err)))
        _fail(engine, f"at iteration {n_iter} {what}: the dual of cell {int(flats[i])} is {float(ex[i])!r}, the "
                      f"incremental update gives {float(inc[i])!r} (tolerance {SYNC_TOL})")


def check_support(engine, res, cells, incremental, n_iter: int, what: str) -> None:
    """:func:`check_agree` on the support cells among ``cells``: their exact duals as the scan
    ``res`` reports them against ``incremental`` (aligned with ``cells``)."""
    cells = np.asarray(cells, np.int64)
    inc = np.asarray(incremental, np.float64).reshape(-1)
    sp = np.asarray(res.supp_pos, np.int64)
    common, i_cells, i_supp = common_cells(cells, sp, distinct=True)
    check_agree(engine, common, inc[i_cells], np.asarray(res.supp_t)[i_supp], n_iter, what)


def common_cells(cells, other, distinct: bool = False):
    """``np.intersect1d(cells, other, return_indices=True)`` (``assume_unique=distinct``): the
    cells in both, ascending, their places in ``cells`` and in ``other`` (its first occurrence of
    each).  For ``cells`` ascending and distinct (a batch's sub-table: a million cells against a
    few thousand of ``other``), by a binary search of ``other`` in ``cells`` instead of sorting
    both together; otherwise by ``np.intersect1d`` itself."""
    cells = np.asarray(cells, np.int64).reshape(-1)
    other = np.asarray(other, np.int64).reshape(-1)
    if not cells.size or not other.size or not bool(np.all(cells[1:] > cells[:-1])):
        return np.intersect1d(cells, other, assume_unique=distinct, return_indices=True)
    order = np.argsort(other, kind="stable")  # by cell; equal cells keep their order in ``other``
    ordered = other[order]
    pos = np.minimum(np.searchsorted(cells, ordered), cells.size - 1)  # (ascending keys: a cheaper search)
    hit = cells[pos] == ordered
    p, j = pos[hit], order[hit]
    if not distinct and p.size:  # the first occurrence of each
        first = np.ones(p.size, bool)
        first[1:] = p[1:] != p[:-1]
        p, j = p[first], j[first]
    return cells[p], p, j


def predict_step(cards, engine, cells: np.ndarray, step) -> np.ndarray:
    """The duals at ``cells`` after ``step`` by the incremental identity, from the table
    before it (``docs/design.md``, "The incremental dual update"): ``(cosh d t_y + sinh d
    <Phi_y Phi_y'>) / (cosh d + sinh d t_y')``, the partner expanded by
    :func:`fsll_ooc.learn.corrective.pair_products` and gathered (a few cells)."""
    from .corrective import pair_products

    cells = np.asarray(cells, np.int64)
    digits = np.stack(np.unravel_index(cells, tuple(cards)), axis=1).astype(np.int64)
    other = np.tile(np.asarray(step.digits, np.int64), (len(cells), 1))
    pair, flat, coef = pair_products(cards, digits, other)
    vals = engine.gather(np.concatenate([cells, flat]))
    t, part = vals[:len(cells)], np.bincount(pair, weights=coef * vals[len(cells):], minlength=len(cells))
    ch, sh = math.cosh(step.delta), math.sinh(step.delta)
    return (ch * t + sh * part) / (ch + sh * step.t)
