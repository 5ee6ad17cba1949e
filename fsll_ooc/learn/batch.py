"""Several greedy steps per table pass: the paper's steps, run on a marginal sub-table.

The duals of the terms supported on a set of variables ``V`` (every ``y`` with
``y_i = 0`` outside ``V``) are the moments of the model's marginal over ``V``.  An
update by a term supported on ``V`` maps them onto themselves: the partner
``<Phi_y Phi_y'>`` of two such terms is again supported on ``V`` (a Walsh-Hadamard
axis gives ``y_i XOR y'_i``, a +-1 axis one of ``0, y_i, y'_i``), so the incremental
update of ``docs/design.md`` ("What one iteration costs") restricted to these
``prod_{i in V} k_i`` cells is exact.  The greedy search over candidates supported on
``V`` (append, adjust, remove, with the paper's closed forms) can therefore run on the
gathered sub-table alone, for as many steps as it likes; the big dual table is then
brought up to date in one pass that applies every changed term's factor
``cosh(D) + sinh(D) Phi_y`` (the factors commute, and several steps on the same term
merge into one), followed by the usual scan.  ``docs/design.md`` ("Several terms per
pass") has the derivation and the batch rule.

The batch rule (:func:`choose_variables`): start from the best move of the last scan;
add the variables of the next best moves (append candidates and the support's adjusts
and removes, :func:`support_gains`), in order of predicted gain, while their gain is at
least ``1 / factor`` of the best and the sub-table stays within ``max_cells`` cells
(:func:`auto_max_cells` by default).  When the variables of the terms that changed are local to one kind
of band (always in core) one band pass applies every step; otherwise an exact
re-derivation does.  The sub-table search then continues while
some move on ``V`` gains at least ``epsilon``: every step it takes is one the paper's
search could take, with the same closed forms, but the order differs (candidates
outside ``V`` wait for the next scan).  The search still ends on a scan of the whole
table in which no single-coordinate move gains ``epsilon``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import numpy as np

from .. import basis, cost as C
from ..engine import Table
from ..kernels import ahead as _ahead, search as _kernels_search, threadpool as _threadpool
from .state import PenaltyTally

__all__ = ["BatchOptions", "AUTO_MIN_CELLS", "resolve_batch", "marginal_multiplier", "MULTIPLIER_MIN_FACTORS", "marginal_cells", "auto_max_cells", "choose_variables", "support_gains", "SubStep", "search_marginal", "step_costs", "merge_steps", "changed_variables", "sub_table"]


@dataclass(frozen=True)
class BatchOptions:
    """How many steps one pass may carry.

    ``factor``: append candidates join the batch's variables while their predicted
    gain is at least ``1 / factor`` of the best move's; ``max_cells``: the marginal
    sub-table (``prod k_i`` over the batch's variables) holds at most this many cells
    (None: :func:`auto_max_cells` of the table's size);
    ``top``: how many of the best append candidates each scan reports;
    ``max_steps``: steps of one sub-table search at most; ``support_moves``: the adjust and
    remove moves of the support that gain join the batch like append candidates (else
    only the best move and the append candidates do); ``joint_in_scan``: out of core, the
    scans of a corrective phase also keep the best cells by second-order score, so that a
    joint selection right after takes its candidates from them instead of a top-k pass of its
    own (in core that pass costs less than keeping them in every scan; the same candidates);
    ``sweep_trials``: a corrective phase's Newton trials are compute sweeps that read and
    write no table (:meth:`fsll_ooc.engine.Engine.sweep`), the table re-derived once at the
    phase's end (:func:`fsll_ooc.learn.corrective.refine`); ``refine_in_batch`` (with
    ``sweep_trials`` and corrective phases on): after its steps a batch runs a corrective
    phase on its parameters by sweeps before the table is brought up to date; when the
    phase moves them, one exact re-derivation of its result replaces the batch's pass.
    """

    factor: float = 10.0
    max_cells: int | None = None
    top: int = 64
    max_steps: int = 4096
    support_moves: bool = True
    joint_in_scan: bool = True
    sweep_trials: bool = True
    refine_in_batch: bool = True

    def to_json(self) -> dict:
        """The options as a JSON-ready dict (``BatchOptions(**d)`` reads it back)."""
        return {"factor": float(self.factor), "max_cells": None if self.max_cells is None else int(self.max_cells),
                "top": int(self.top),
                "max_steps": int(self.max_steps), "support_moves": bool(self.support_moves),
                "joint_in_scan": bool(self.joint_in_scan), "sweep_trials": bool(self.sweep_trials),
                "refine_in_batch": bool(self.refine_in_batch)}

    def __post_init__(self) -> None:
        if not (isinstance(self.factor, (int, float)) and self.factor >= 1.0 and math.isfinite(self.factor)):
            raise ValueError(f"batch factor must be a finite number >= 1, got {self.factor!r}")
        for name in ("max_cells", "top", "max_steps"):
            v = getattr(self, name)
            if name == "max_cells" and v is None:
                continue
            if not (isinstance(v, (int, np.integer)) and v >= 1):
                raise ValueError(f"batch {name} must be a positive integer, got {v!r}")
        for name in ("support_moves", "joint_in_scan", "sweep_trials", "refine_in_batch"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"batch {name} must be True or False, got {getattr(self, name)!r}")


    def cells_for(self, table_cells: int) -> int:
        """The sub-table size limit of a fit whose tables have ``table_cells`` cells."""
        return auto_max_cells(table_cells) if self.max_cells is None else int(self.max_cells)


def auto_max_cells(table_cells: int) -> int:
    """``max_cells`` by default: ``|X| / 64`` between ``2^14`` and ``2^18`` cells.

    A larger sub-table carries more steps per pass (a pass costs ``O(|X|)``, a sub-table
    step ``O(max_cells)``); at a 64th of the table a sub-table step costs a few hundredths
    of a pass, and beyond ``2^18`` cells the measured passes stopped falling
    (``docs/benchmarks.md`` section 4) while each step kept getting dearer.

    >>> auto_max_cells(2**20), auto_max_cells(2**22), auto_max_cells(2**30)
    (16384, 65536, 262144)
    """
    return int(min(max(int(table_cells) // 64, 2**14), 2**18))


#: ``batch="auto"`` (the default) batches a default-rule fit (``epsilon="auto"``) of at least
#: this many cells: a pass over its three tables moves at least 96 MiB, and the measured
#: fits from there on (``docs/benchmarks.md`` section 4) took 5-8x fewer passes and less
#: time at the same held-out quality.  Smaller tables are fitted one step per pass.
AUTO_MIN_CELLS = 2**22


def resolve_batch(batch, epsilon, cells: int) -> BatchOptions | None:
    """The batch options of a fit (None: one step per pass, the paper's search).

    ``batch``: ``"auto"`` (the default: :class:`BatchOptions` defaults when ``epsilon`` is
    ``"auto"`` and the table has at least :data:`AUTO_MIN_CELLS` cells, else one step per
    pass, so ``epsilon=1e-4`` stays the paper's algorithm and a table's model does not
    depend on whether it is fitted in core or out of core); ``None`` or ``False`` (one step
    per pass); ``True`` (:class:`BatchOptions` defaults, with any epsilon); a
    :class:`BatchOptions` or a dict of its fields (as a store's state keeps it).
    ``cells``: ``|X|``, the number of cells of the fit's tables.
    """
    if isinstance(batch, str) and batch == "auto":
        auto_rule = isinstance(epsilon, str) and epsilon == "auto"
        return BatchOptions() if auto_rule and int(cells) >= AUTO_MIN_CELLS else None
    if batch is None or batch is False:
        return None
    if batch is True:
        return BatchOptions()
    if isinstance(batch, BatchOptions):
        return batch
    if isinstance(batch, dict):
        unknown = set(batch) - set(BatchOptions.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown batch option(s) {sorted(unknown)}; valid: "
                             f"{', '.join(BatchOptions.__dataclass_fields__)}")
        return BatchOptions(**batch)
    raise ValueError(f"batch must be 'auto', None, True, False or a BatchOptions, got {batch!r}")


def _strides(cards: Sequence[int]) -> np.ndarray:
    s = np.ones(len(cards), dtype=np.int64)
    for i in range(len(cards) - 2, -1, -1):
        s[i] = s[i + 1] * cards[i + 1]
    return s


def marginal_cells(cards: Sequence[int], V: Sequence[int]) -> np.ndarray:
    """Flat (C-order) indices of the terms supported on the variables ``V`` (sorted), as an
    array of shape ``(k_i for i in V)``: entry ``[x_V]`` is the term with digits ``x_V`` on ``V``
    and 0 elsewhere.

    >>> marginal_cells((2, 3, 2), (0, 2)).tolist()
    [[0, 1], [6, 7]]

    Read-only: a batch asks three times for the same cells, and gets the same array.
    """
    V = tuple(int(v) for v in V)
    if list(V) != sorted(set(V)):
        raise ValueError(f"variables must be sorted and distinct, got {V}")
    return _marginal_cells(tuple(int(k) for k in cards), V)


@functools.lru_cache(maxsize=1)
def _marginal_cells(cards: tuple, V: tuple) -> np.ndarray:
    strides = _strides(cards)
    out = np.zeros((), dtype=np.int64)
    for v in reversed(V):  # one axis more in front each time: every inner loop runs over the whole array so far
        out = np.add.outer(np.arange(cards[v], dtype=np.int64) * strides[v], out)
    out.setflags(write=False)
    return out


def gather_marginal(engine, cards: Sequence[int], V: Sequence[int], table=None) -> np.ndarray:
    """``engine.gather(marginal_cells(cards, V).reshape(-1), table)`` (default: the duals): the
    values of the terms supported on ``V``, flattened; in core (one band in this process's
    memory) as a copy of the table's slice on ``V`` (the other digits 0), which reads the
    same cells without an index array.  ``V`` ascending and distinct, as for
    :func:`marginal_cells` (``ValueError`` otherwise)."""
    table = Table.THETABAR if table is None else table
    arr = engine.table_array(table)
    if arr is None or arr.size != math.prod(cards) or any(a >= b for a, b in zip(V, V[1:])):
        return engine.gather(marginal_cells(cards, V).reshape(-1), table)
    on = set(int(v) for v in V)
    engine.gathers += 1
    return arr.reshape(tuple(cards))[tuple(slice(None) if i in on else 0 for i in range(len(cards)))].copy().reshape(-1)


def _axes_of(cards: Sequence[int], flat: int) -> frozenset:
    axes = []
    for i in range(len(cards) - 1, -1, -1):
        flat, x = divmod(int(flat), cards[i])
        if x:
            axes.append(i)
    return frozenset(axes)


def choose_variables(cards: Sequence[int], moves: Iterable[tuple[float, int]], *, factor: float,
                     max_cells: int) -> tuple[int, ...] | None:
    """The variables ``V`` of the next batch, or None (the best move alone, one step per pass).

    ``moves``: ``(gain, flat)`` pairs, the best move first, then append candidates by
    decreasing gain.  A candidate's variables join while its gain is at least
    ``gain_best / factor`` and ``prod_{i in V} k_i <= max_cells``; a candidate that does
    not fit is skipped.  None when the best move's variables alone exceed ``max_cells``.
    """
    it = iter(moves)
    try:
        g0, y0 = next(it)
    except StopIteration:
        return None
    V = set(_axes_of(cards, y0))
    if not V or math.prod(cards[i] for i in V) > max_cells:
        return None
    floor = g0 / factor
    for g, y in it:
        if not g >= floor:
            break
        W = V | _axes_of(cards, y)
        if math.prod(cards[i] for i in W) <= max_cells:
            V = W
    return tuple(sorted(V))


def support_gains(t: np.ndarray, d: np.ndarray, theta: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The gain (minus the cost change) of the better of *adjust* and *remove* of each member of
    the support: :func:`fsll_ooc.cost.delta_adjust` and :func:`fsll_ooc.cost.delta_remove`,
    vectorised (``t``, ``d``: the members' duals and targets; ``theta``, ``r``: their values
    and the code length a removal gives back)."""
    lim = 1.0 - 2.0**-52
    with np.errstate(divide="ignore", invalid="ignore"):
        adj = 0.5 * ((1.0 + d) * (np.log1p(t) - np.log1p(d)) + (1.0 - d) * (np.log1p(-t) - np.log1p(-d)))
        a = np.arctanh(np.clip(t, -lim, lim))
        lncosh = lambda x: np.abs(x) + np.log1p(np.exp(-2.0 * np.abs(x))) - math.log(2.0)  # noqa: E731
        rem = lncosh(a - theta) - lncosh(a) + d * theta - r
    g = -np.fmin(adj, rem)
    return np.where(np.isfinite(g), g, 0.0)


@dataclass
class SubStep:
    """One step of the sub-table search: ``theta_y`` moved from ``old`` to ``new``."""

    flat: int  # global flat index of the term
    move: str  # "append", "adjust" or "remove"
    old: float
    new: float
    t: float  # thetabar_y before the step
    d: float  # dbar_y
    delta: float  # predicted cost change (< 0)
    log_den: float  # ln of the update's normaliser: the change of log Z


def marginal_penalties(cards: Sequence[int], V: Sequence[int], weights) -> np.ndarray:
    """``r_y`` of the terms :func:`marginal_cells` ``(cards, V)`` names (same shape), from
    ``weights = (r0, w)`` of :func:`fsll_ooc.cost.penalty_weights`, summed in the order of
    :func:`fsll_ooc.cost.penalty` (the same numbers)."""
    r0, w = weights
    acc = np.zeros(1)
    for v in V:  # one axis more each time, each cell's sum in the same order
        part = w[v] * (np.arange(cards[v]) != 0)
        grown = np.empty((acc.size, cards[v]))
        for x in range(cards[v]):  # one digit of the new axis at a time (a loop over the whole array so far)
            np.add(acc, part[x], out=grown[:, x])
        acc = grown.reshape(-1)
    acc += r0  # (r0 + acc, in place)
    return acc.reshape(tuple(cards[v] for v in V))


def _family_tables(cards, V, code, member: np.ndarray):
    """What the compiled search needs to re-price under the family code (``docs/design.md``,
    "The family code"), or None under the paper's code or when no family on ``V`` has more than
    one possible member (binary variables: the family code's prices are the paper's).

    A cell's family ``A`` (its non-zero variables, a bit mask over ``V``) holds ``m_A``
    members; appending a non-member costs ``add(A, m_A)``, removing a member gives back
    ``add(A, m_A - 1)`` (:meth:`fsll_ooc.cost.TermCode.add`).  Every family of a term
    supported on ``V`` is a subset of ``V``, so every member of it is a cell of the
    sub-table: the counts, hence the prices, are exact from the sub-table alone.
    Returns ``(fam, counts, possible members, naming length, cells by family (CSR))``.
    """
    if code is None or code.kind == "paper" or all(cards[v] <= 2 for v in V):
        return None
    shape = tuple(cards[v] for v in V)
    nf = 1 << len(V)
    fam = np.zeros(shape, np.int64)
    total = np.ones(nf, np.int64)
    name = np.zeros(nf)
    bits = np.arange(nf)
    for ax, v in enumerate(V):
        sh = [1] * len(shape)
        sh[ax] = shape[ax]
        fam = fam + ((np.arange(shape[ax]) != 0).astype(np.int64) << ax).reshape(sh)
        on = (bits >> ax & 1).astype(bool)
        total = np.where(on, total * (cards[v] - 1), total)
        name = name + np.where(on, code.name_w[v], 0.0)  # the sum of TermCode.add, in its order
    fam = fam.reshape(-1)
    counts = np.bincount(fam[member], minlength=nf).astype(np.int64)
    order = np.argsort(fam, kind="stable")
    ptr = np.zeros(nf + 1, np.int64)
    ptr[1:] = np.cumsum(np.bincount(fam, minlength=nf))
    return fam, counts, total, name, ptr, order.astype(np.int64)


_NO_FAMILY = (np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones(1, np.int64), np.zeros(1),
              np.zeros(2, np.int64), np.zeros(1, np.int64))
_MOVES = ("append", "adjust", "remove")


def search_marginal(cards: Sequence[int], V: Sequence[int], tb: np.ndarray, db: np.ndarray,
                    theta: dict, weights, epsilon: float, max_steps: int,
                    code: C.TermCode | None = None) -> Iterator[SubStep]:
    """The paper's greedy search over the terms supported on ``V``, on their gathered duals.

    ``tb``, ``db``: ``thetabar`` and ``dbar`` at :func:`marginal_cells` ``(cards, V)``
    (flattened, C order); ``theta``: the model's parameters (flat index -> value; only
    those supported on ``V`` are read, and they are updated in place); ``weights``:
    ``(r0, w)`` of the penalty (:func:`fsll_ooc.cost.penalty_weights`); ``code``: the
    support's code (:class:`fsll_ooc.cost.TermCode`; None or the paper's: ``r_y`` from
    ``weights``; the family code: every append and remove priced by the change of the
    code length, which the sub-table knows exactly, :func:`_family_tables`).  Every step
    takes the best move on ``V`` (append at the 1-D optimum, adjust, remove; the closed
    forms of :mod:`fsll_ooc.cost`) while it gains at least ``epsilon``, at most
    ``max_steps``.  The search runs as one compiled call
    (:func:`fsll_ooc.kernels.search.search_sub`) before the first step is yielded; ``tb``
    (a C-contiguous float64 array, updated in place) then holds the duals after every
    step.  Yields the steps in order (each with the ``ln`` of its normaliser, the change of
    ``log Z``), each after applying it to ``theta`` (appends join its end, as one step at a
    time leaves it), so a caller sees the support of every step in turn.
    """
    _ahead.wait(_kernels_search.__name__)  # (compiled in a second process since the fit began)
    V = tuple(V)
    shape = tuple(cards[v] for v in V)
    flats = marginal_cells(cards, V).reshape(-1)
    sub = tb.reshape(-1) if isinstance(tb, np.ndarray) and tb.dtype == np.float64 else None
    if sub is None or not sub.flags.c_contiguous:
        raise ValueError("tb must be a C-contiguous float64 array (the search updates it in place)")
    dflat = np.ascontiguousarray(db, np.float64).reshape(-1)
    ys = np.fromiter(theta.keys(), np.int64, len(theta))
    at = np.searchsorted(flats, ys).clip(0, flats.size - 1)
    inside = flats[at] == ys
    member = np.zeros(flats.size, bool)
    member[at[inside]] = True
    th = np.zeros(flats.size)
    th[at[inside]] = np.fromiter(theta.values(), np.float64, len(theta))[inside]
    r = marginal_penalties(cards, V, weights).reshape(-1)
    r[0] = np.inf  # y = 0 is the constant, never a parameter
    fam = _family_tables(cards, V, code, member)
    n = int(max_steps)
    out_i, out_move = np.empty(n, np.int64), np.empty(n, np.int64)
    out_old, out_new, out_t, out_delta, out_logden = (np.empty(n) for _ in range(5))
    walsh = np.array([basis.is_walsh(k) for k in shape], bool)
    ft = _NO_FAMILY if fam is None else fam
    r0, r1, n_samples, scale = (0.0, 0.0, 1.0, 1.0) if fam is None else (code.r0, code.r1, code.N, code.scale)
    # a large sub-table: every step shared with the kernels' helper threads
    threads = _kernels_search.search_threads(flats.size, bool(walsh.all()))
    shared = _kernels_search.shared_arrays(threads, flats.size, bool(walsh.all()))
    ra = np.empty(flats.size)  # the append prices (the search's, shared with its helpers)
    try:
        if threads > 1:
            _kernels_search.helper_ready()
            _threadpool.fire(threads, _kernels_search.sub_helper, sub, dflat, ra, member, th, r,
                             np.int64(min(flats.size, _kernels_search.RUN)), *shared)
        steps = _kernels_search.search_sub(sub, dflat, r, member, th, np.array(shape, np.int64), walsh,
                                           float(epsilon), n, fam is not None, *ft, r0, r1, n_samples, scale, out_i,
                                           out_move, out_old, out_new, out_t, out_delta, out_logden, ra, *shared,
                                           np.int64(threads))
    finally:
        if shared[0].size:
            _kernels_search.shared_done(shared[0])
            shared[0][2] = max(shared[0][2], 1)  # the helpers leave (the search sets it too when it returns)
    cells = out_i[:steps]  # the steps' outputs as Python numbers, all at once
    for y, mv, old, new, t, d, delta, log_den in zip(flats[cells].tolist(), out_move[:steps].tolist(),
                                                     out_old[:steps].tolist(), out_new[:steps].tolist(),
                                                     out_t[:steps].tolist(), dflat[cells].tolist(),
                                                     out_delta[:steps].tolist(), out_logden[:steps].tolist()):
        move = _MOVES[mv]
        if move == "remove":
            del theta[y]
        else:
            theta[y] = new
        yield SubStep(y, move, old, new, t, d, delta, log_den)


def step_costs(state, support: Sequence[tuple[int, float, float]], steps: Sequence[SubStep],
               log_z: float) -> list[float]:
    """The cost after each of ``steps``: :meth:`fsll_ooc.learn.state.FitState.cost` as it would
    be after each (the same products summed by the same ``sum`` in the same order: the same
    bits on every Python), without the state's dictionaries.

    ``support``: ``(flat, theta, dbar)`` of the support before the steps, in its order;
    ``log_z``: ``log Z`` before them.  Each step changes one product of the sum (an adjust
    in place, an append at the end, a removal out of it) and the list of products is summed
    again; the code length changes only with an append or a removal
    (:class:`~fsll_ooc.learn.state.PenaltyTally`: the parts of
    :meth:`~fsll_ooc.learn.state.FitState.total_penalty_of`, summed again)."""
    ys = [y for y, _, _ in support]
    prods = [t * d for _, t, d in support]
    at = {y: i for i, y in enumerate(ys)}
    tally = PenaltyTally(state, ys)
    neg_h, out = -state.entropy_q, []
    for s in steps:
        if s.move == "append":
            at[s.flat] = len(ys)
            ys.append(s.flat)
            prods.append(s.new * s.d)
            tally.append(s.flat)
        elif s.move == "adjust":
            prods[at[s.flat]] = s.new * s.d
        else:
            i = at[s.flat]
            del ys[i], prods[i]
            at = {y: j for j, y in enumerate(ys)}
            tally.reset(ys)
        log_z += s.log_den
        out.append(neg_h + log_z - sum(prods) + tally.total)
    return out


def merge_steps(cards: Sequence[int], V: Sequence[int], tb0: np.ndarray, steps: Sequence[SubStep],
                duals: bool = True):
    """The factors that bring the big dual table up to date after ``steps``.

    Steps on the same term merge (``(cosh a + sinh a Phi)(cosh b + sinh b Phi) = cosh(a+b) +
    sinh(a+b) Phi``); the factors commute, so they are applied in order of first
    occurrence.  Each factor's normaliser needs ``thetabar_y`` just before it, which the
    sub-table replayed from ``tb0`` (the gathered duals before the search) gives exactly.
    Returns ``[(digits, delta, t), ...]`` (full-length digit tuples) and the summed ``ln``
    of the normalisers (the change of ``log Z``).  ``duals=False``: the factors without
    replaying them (``t`` and the change of ``log Z`` None), for a caller that needs only
    their terms and steps (a batch whose table is re-derived, or updated by one multiplier).
    """
    V = tuple(V)
    shape = tuple(cards[v] for v in V)
    flats = marginal_cells(cards, V).reshape(-1)
    total: dict[int, float] = {}
    for s in steps:
        total[s.flat] = total.get(s.flat, 0.0) + (s.new - s.old)
    ys = [y for y, delta in total.items() if delta != 0.0]
    deltas = np.array([total[y] for y in ys], np.float64)
    cells = np.searchsorted(flats, np.array(ys, np.int64))
    ts, dlogz = [None] * len(ys), None
    if duals:
        sub = np.array(tb0, np.float64).reshape(-1)
        ts = np.empty(len(ys))
        dlogz = float(_kernels_search.replay_sub(sub, np.array(shape, np.int64),
                                                 np.array([basis.is_walsh(k) for k in shape], bool), cells, deltas,
                                                 ts))
        ts = ts.tolist()
    out = []
    for i, delta, t in zip(cells.tolist(), deltas.tolist(), ts):
        digits = [0] * len(cards)
        for v, x in zip(V, np.unravel_index(i, shape)):
            digits[v] = int(x)
        out.append((tuple(digits), delta, t))
    return out, dlogz


def changed_variables(factors: Sequence[tuple]) -> tuple[int, ...]:
    """The variables on which the terms of :func:`merge_steps`' ``factors`` are non-zero
    (sorted): what the pass that applies them must hold."""
    return tuple(sorted({v for digits, _, _ in factors for v, x in enumerate(digits) if x}))


def sub_table(cards: Sequence[int], V: Sequence[int], tb: np.ndarray, U: Sequence[int]) -> np.ndarray:
    """The values at :func:`marginal_cells` ``(cards, U)`` taken from ``tb``, the values at
    :func:`marginal_cells` ``(cards, V)``, for variables ``U`` among ``V`` (flattened, C order).

    >>> sub_table((2, 3), (0, 1), np.arange(6.0), (1,)).tolist()
    [0.0, 1.0, 2.0]
    """
    V, U = tuple(V), set(U)
    if not U <= set(V):
        raise ValueError(f"variables {sorted(U)} are not all among {V}")
    t = np.asarray(tb).reshape(tuple(cards[v] for v in V))
    return t[tuple(slice(None) if v in U else 0 for v in V)].reshape(-1)


#: From this many changed terms on, a batch on Walsh-Hadamard variables only is applied as
#: one multiplier between two partial transforms (:func:`marginal_multiplier`), whose cost
#: does not grow with the number of terms, instead of one factor per term.
MULTIPLIER_MIN_FACTORS = 4


def marginal_multiplier(cards: Sequence[int], V: Sequence[int], tb0: np.ndarray,
                        factors: Sequence[tuple]) -> np.ndarray:
    """The whole batch as one multiplier: ``thetabar' = T_V(m * T_V(thetabar))`` on every cell.

    For Walsh-Hadamard variables ``V`` only.  The batch multiplies ``p_theta`` by
    ``g(x_V) = exp(sum_y D_y Phi_y(x_V))`` (``factors``: :func:`merge_steps`' ``(digits,
    D, t)``) and renormalises; along ``V`` the duals are ``T_V`` of the partial density
    ``T_V^-1 thetabar = T_V thetabar / K`` (``K = prod_{i in V} k_i``), so
    ``m = g / (K Z')`` with ``Z'`` the new normaliser, read off the sub-table ``tb0``
    (the gathered duals before the batch: the marginal's moments).
    """
    V = tuple(V)
    shape = tuple(cards[v] for v in V)
    if not all(basis.is_walsh(k) for k in shape):
        raise ValueError(f"a multiplier needs Walsh-Hadamard variables, got cardinalities {shape}")
    D = np.zeros(shape)
    for digits, delta, _ in factors:
        D[tuple(digits[v] for v in V)] += delta
    l = basis.transform(D)  # T^T = T on Walsh-Hadamard axes: l(x_V) = sum_y D_y Phi_y(x_V)
    g = np.exp(l - l.max())
    K = float(D.size)
    new = basis.transform(g * basis.transform(np.asarray(tb0, np.float64).reshape(shape)) / K)
    return g / (K * float(new.reshape(-1)[0]))
