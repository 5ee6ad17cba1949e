"""The greedy learning algorithm of the paper (Algorithm 1-3), over any :class:`Engine`.

Each iteration evaluates every candidate: *append* ``theta_y`` for ``y`` outside the
support (found by the engine's fused block scan, lower bound first), *adjust* and
*remove* for ``y`` in the support (closed forms, ``O(|support|)``); it takes the best
one if it lowers the cost by at least ``epsilon`` and updates the duals with the
incremental identity (``docs/design.md``, "What one iteration costs"), re-deriving them
exactly every ``resync_every`` iterations to bound floating-point drift.

Beyond the paper (both off with ``epsilon=1e-4, refine=False``, which reproduces it
exactly):

* ``epsilon="auto"``: the stopping threshold ``AUTO_C / N`` (:func:`auto_epsilon`);
* ``refine``: fully corrective Newton phases on the selected support
  (:mod:`fsll_ooc.learn.corrective`), run when the greedy search would stop and/or when
  its best move is only an *adjust* of a selected parameter.

Every option of the search is a field of :class:`LearnOptions`, checked in one place.
The cost is tracked exactly from the sparse state:
``KL(q || p_theta) = -H(q) - sum_y theta_y dbar_y + log Z``.
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from . import batch as B, checks, corrective
from .state import FitState
from .. import basis, cost as C
from ..engine import Engine, Step, Table
from ..kernels import ahead, search as kernels_search

__all__ = ["LearnOptions", "learn", "Search", "auto_epsilon", "resolve_epsilon", "resolve_refine", "AUTO_C",
           "REFINE_MODES"]


def _best_move(state: FitState, res) -> tuple[float, str, int, float, float]:
    """(delta, move, flat, t, d) of the best candidate; ties: lowest delta, then lowest y.

    Adjust and remove are evaluated for the whole support by one call
    (:func:`fsll_ooc.cost.best_support_move`).
    """
    best = (math.inf, "none", -1, 0.0, 0.0)
    if res.pos >= 0 and res.pos not in state.theta:
        best = (res.best, "append", res.pos, res.t, res.d)
    if len(res.supp_pos):
        sp = np.asarray(res.supp_pos, np.int64)
        t, d = np.asarray(res.supp_t, np.float64), np.asarray(res.supp_d, np.float64)
        ys_l = sp.tolist()
        th = np.fromiter(map(state.theta.__getitem__, ys_l), np.float64, len(ys_l))
        r = np.array(state.penalties(ys_l), np.float64)
        dy, i, mv = C.best_support_move(sp, t, d, th, r)
        if i >= 0:
            yi = ys_l[i]
            if dy < best[0] or (dy == best[0] and yi < best[2]):
                best = (float(dy), ("adjust", "remove")[mv], yi, float(t[i]), float(d[i]))
    return best


#: glibc's malloc settings for a fit's process (:func:`settle_allocator`): blocks below this
#: come from the heap, and free memory at its top above twice this goes back to the system.
MMAP_THRESHOLD = 32 << 20
_ALLOCATOR = []  # [done] once per process


def settle_allocator() -> bool:
    """Keep a fit's table-sized temporaries in the heap (glibc only; once per process).

    glibc serves a block above 128 KiB by a fresh ``mmap`` and unmaps it at ``free``, so each
    new temporary of the table's size (a step's partner product: 1.4 MB on a ``3^11`` table)
    is paid again in page faults, a table pass each (measured: a sachs-like fit's partner
    products 4x slower).  glibc raises that threshold by itself, up to 32 MiB, once a larger
    block has been freed, which a fit may or may not happen to do; this sets it where glibc's
    own rule ends (``M_MMAP_THRESHOLD`` 32 MiB, ``M_TRIM_THRESHOLD`` 64 MiB), so a fit's speed
    does not depend on its allocation history.  Nothing is done when the process's
    environment sets malloc's own tunables, or off glibc.  Returns whether it set them."""
    if _ALLOCATOR:
        return _ALLOCATOR[0]
    done = False
    try:
        import ctypes
        import os
        import sys

        if sys.platform.startswith("linux") and not any(
                k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")):
            libc = ctypes.CDLL(None)
            if hasattr(libc, "gnu_get_libc_version"):
                M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
                done = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
                    bool(libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD))
    except Exception:
        done = False
    _ALLOCATOR.append(done)
    return done


#: ``epsilon="auto"`` is ``AUTO_C / N`` (see :func:`auto_epsilon`).
AUTO_C = 0.1

REFINE_MODES = ("off", "final", "adjust")


def auto_epsilon(n_samples: int, c: float = AUTO_C) -> float:
    """The data-derived stopping threshold ``c / N`` (nats per sample).

    The cost is a description length per sample, so ``N * cost`` is the length in
    nats of the two-part code of the whole data set.  A move worth less than
    ``c / N`` shortens that code by less than ``c`` nats: far below the
    ``(ln N) / 2`` nats that MDL charges for one more parameter and below the
    sampling noise of the cost itself (an unneeded parameter fitted to noise gains
    ``chi^2_1 / (2N)``, i.e. ``1 / (2N)`` on average).  Moves smaller than that are
    numerical polishing, not model selection; moves larger are signal the paper's
    fixed ``1e-4`` leaves unused once ``N`` is large (at ``N = 10^5``, ``1e-4`` is
    10 nats of code length, the price of one parameter).  ``c = 0.1`` was chosen by
    measurement (``docs/benchmarks_quality.md``): smaller ``c`` costs time and gains
    nothing measurable in ``KL(p* || p)``.  At ``N = 1000`` it equals the paper's
    ``1e-4``.
    """
    return float(c) / max(int(n_samples), 1)


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _check_epsilon(epsilon) -> None:
    if not (epsilon == "auto" if isinstance(epsilon, str) else
            (_is_number(epsilon) and epsilon > 0 and math.isfinite(epsilon))):
        raise ValueError(f"epsilon must be a positive number or 'auto', got {epsilon!r}")


def resolve_epsilon(epsilon, n_samples: int) -> float:
    """A positive float threshold from ``epsilon`` (a number or ``"auto"``)."""
    _check_epsilon(epsilon)
    return auto_epsilon(n_samples) if isinstance(epsilon, str) else float(epsilon)


def resolve_refine(refine, epsilon) -> str:
    """The corrective schedule: ``"off"``, ``"final"`` or ``"adjust"``.

    ``None`` ("auto") means ``"adjust"`` when ``epsilon == "auto"`` and ``"off"`` for
    a numeric epsilon (so ``epsilon=1e-4`` alone reproduces the paper); ``True`` is
    ``"adjust"`` and ``False`` is ``"off"``.
    """
    if refine is None:
        return "adjust" if isinstance(epsilon, str) and epsilon == "auto" else "off"
    if refine is True:
        return "adjust"
    if refine is False:
        return "off"
    if refine in REFINE_MODES:
        return refine
    raise ValueError(f"refine must be None, True, False or one of {REFINE_MODES}, got {refine!r}")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class LearnOptions:
    """Every option of the search (:func:`learn`), checked when the object is made.

    The defaults are the library's (``FSLL()``); ``LearnOptions(epsilon=1e-4)`` is the
    paper's algorithm exactly (``refine=None`` resolves to off with a numeric epsilon).

    epsilon : "auto" or float
        Stop when no candidate lowers the cost by this much (nats per sample);
        ``"auto"`` is ``AUTO_C / N`` (:func:`auto_epsilon`).
    max_iter : int or None
        Stop after this many iterations in total (counting those of a resumed fit).
    resync_every : int
        Re-derive the duals exactly every this many greedy moves (bounds the drift of
        the incremental update).
    refine : None, bool, "off", "adjust" or "final"
        The corrective schedule (:func:`resolve_refine`): ``"final"`` runs a fully
        corrective phase (:func:`fsll_ooc.learn.corrective.refine`) whenever the greedy
        search would stop and continues the search if it moved; ``"adjust"`` also runs
        one whenever the best move is an *adjust* (at most once between two
        appends/removes).  ``None``: ``"adjust"`` with ``epsilon="auto"``, else off.
    refine_tol : float
        A corrective phase stops when its predicted remaining gain is below
        ``refine_tol * epsilon`` ...
    refine_rounds : int
        ... or after this many Newton rounds.
    joint : bool
        With ``refine`` on, a search that would stop after a corrective phase first
        tries a joint selection (:func:`fsll_ooc.learn.corrective.joint_append`) ...
    joint_candidates : int
        ... over this many best cells of a top-k pass ...
    joint_closure : int
        ... and up to this many unused terms on the support's variable sets
        (:func:`fsll_ooc.learn.corrective.closure_candidates`) ...
    joint_max_new : int
        ... appending at most this many terms at once.
    family_terms : int
        Under the family code (``FitState.penalty_code == "family"``), score up to this
        many unused terms on the support's variable sets every iteration at their
        marginal code length (:func:`fsll_ooc.learn.corrective.family_move`); 0: only the
        scan's best append is re-priced.  No effect under the paper's code.
    batch : "auto", None, bool, BatchOptions or dict
        Several steps per table pass (:mod:`fsll_ooc.learn.batch`, :func:`fsll_ooc.learn.batch.resolve_batch`):
        ``"auto"`` (the default): on for ``epsilon="auto"`` and tables of at least
        :data:`fsll_ooc.learn.batch.AUTO_MIN_CELLS` cells, else one step per pass (so
        ``epsilon=1e-4`` is the paper's algorithm); ``None`` or ``False``: one step per pass;
        ``True`` or a :class:`~fsll_ooc.learn.batch.BatchOptions` turns it on.
    on_finish : callable or None
        ``on_finish(engine, state)`` runs once when the search has ended, before
        :func:`learn` returns; what it leaves in ``state`` (and in the engine's dual
        table) is the result.  For experiments that continue from a fitted state
        (further corrective phases, a different support; ``bench/quality.py``).  Not
        part of :meth:`to_json`: a resumed fit runs without it.
    """

    epsilon: float | str = "auto"
    max_iter: int | None = None
    resync_every: int = 256
    refine: str | bool | None = None
    refine_tol: float = 0.1
    refine_rounds: int = 8
    joint: bool = True
    joint_candidates: int = 256
    joint_closure: int = 512
    joint_max_new: int = 32
    family_terms: int = 512
    batch: B.BatchOptions | bool | str | None = "auto"
    on_finish: Callable[[Engine, FitState], None] | None = None

    def __post_init__(self):
        _check_epsilon(self.epsilon)
        if self.max_iter is not None and not (_is_int(self.max_iter) and self.max_iter >= 0):
            raise ValueError(f"max_iter must be a non-negative int or None, got {self.max_iter!r}")
        resolve_refine(self.refine, self.epsilon)  # raises ValueError naming the allowed values
        tol = self.refine_tol
        if not (_is_number(tol) and tol >= 0 and math.isfinite(tol)):
            raise ValueError(f"refine_tol must be a non-negative finite number, got {tol!r}")
        if not isinstance(self.joint, (bool, np.bool_)):
            raise ValueError(f"joint must be True or False, got {self.joint!r}")
        for name, low in (("resync_every", 1), ("refine_rounds", 1), ("joint_candidates", 0),
                          ("joint_closure", 0), ("joint_max_new", 1), ("family_terms", 0)):
            v = getattr(self, name)
            if not (_is_int(v) and v >= low):
                kind = "positive" if low else "non-negative"
                raise ValueError(f"{name} must be a {kind} int, got {v!r}")
        if isinstance(self.batch, dict):  # as to_json writes it
            object.__setattr__(self, "batch", B.resolve_batch(self.batch, self.epsilon, cells=0))
        B.resolve_batch(self.batch, self.epsilon, cells=0)  # raises ValueError naming the value
        if self.on_finish is not None and not callable(self.on_finish):
            raise ValueError(f"on_finish must be callable or None, got {self.on_finish!r}")

    def to_json(self) -> dict:
        """The options as a JSON-ready dict (without ``on_finish``); :meth:`from_json` reads it."""
        out = {}
        for f in fields(self):
            if f.name == "on_finish":
                continue
            v = getattr(self, f.name)
            if isinstance(v, B.BatchOptions):
                v = v.to_json()
            out[f.name] = v.item() if isinstance(v, (np.generic,)) else v
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "LearnOptions":
        """Options from :meth:`to_json`'s dict (missing fields take their defaults)."""
        names = {f.name for f in fields(cls)} - {"on_finish"}
        unknown = sorted(set(obj) - names)
        if unknown:
            raise ValueError(f"unknown learner option(s) {', '.join(map(repr, unknown))}; valid: "
                             f"{', '.join(sorted(names))}")
        return cls(**obj)


def learn(engine: Engine, state: FitState, options: LearnOptions | None = None, *, fresh: bool = True,
          progress=None, callback: Callable[[FitState], None] | None = None) -> FitState:
    """Run Algorithm 1 from ``state`` until no candidate lowers the cost by ``options.epsilon``.

    ``options``: a :class:`LearnOptions` (``None``: the defaults).  ``fresh=True``:
    ``thetabar`` is the table of ``state`` already (a new fit: the uniform duals);
    otherwise it is re-derived exactly from ``state.theta`` first (resuming).
    ``progress`` is a tqdm-like bar or None; ``callback(state)`` runs after every
    iteration (persistence).

    A corrective phase counts as one iteration (``move="refine"`` in the history); a
    joint selection too (``move="joint-append"``, the appended indices under
    ``"added"``, their predicted gains under ``"added_gain"``).  The search always ends
    on a scan of the final state in which no single-coordinate move gains ``epsilon``
    (an axis minimum of the same cost), unless ``max_iter`` stopped it first.

    ``batch`` (resolved by :func:`fsll_ooc.learn.batch.resolve_batch`; off: one step per
    pass, the paper's search): several steps per pass.  Each scan also reports the best append
    candidates; the variables of the best of them (:func:`fsll_ooc.learn.batch.choose_variables`)
    define a marginal sub-table on which the search takes steps
    (:func:`fsll_ooc.learn.batch.search_marginal`) until none gains ``epsilon``; one pass
    then applies them to the dual table (or an exact re-derivation, when their variables
    are not local to one kind of band).  Every step is one history entry (``"batch"``:
    the number of the pass that applied it); ``"passes"`` counts table passes so far.
    """
    return Search(engine, state, options, fresh=fresh, progress=progress, callback=callback).run()


class Search:
    """The learner of one fit: the engine, the fit state, the options and the last scan.

    One method per phase, each leaving the scan of the table after it in :attr:`scan`
    (and returning it): :meth:`step` (one greedy move, one pass), :meth:`batch` (several
    moves on a marginal sub-table, one pass or re-derivation), :meth:`refine` (a fully
    corrective phase) and :meth:`joint` (a joint selection); :meth:`run` chooses between
    them until no move gains ``epsilon`` (:func:`learn`, which builds one and runs it).
    """

    def __init__(self, engine: Engine, state: FitState, options: LearnOptions | None = None, *, fresh: bool = True,
                 progress=None, callback: Callable[[FitState], None] | None = None):
        if options is None:
            options = LearnOptions()
        elif not isinstance(options, LearnOptions):
            raise TypeError(f"options must be a LearnOptions, got {type(options).__name__}")
        self.engine, self.state, self.options = engine, state, options
        self.progress, self.callback = progress, callback
        settle_allocator()
        o = options
        self.eps = resolve_epsilon(o.epsilon, state.n_samples)
        self.mode = resolve_refine(o.refine, o.epsilon)
        self.batch_options = B.resolve_batch(o.batch, o.epsilon, cells=math.prod(state.cards))
        bo = self.batch_options
        if bo is not None:  # the sub-table search's kernels compile meanwhile (the first use after installing)
            ahead.start(kernels_search.__name__)
        # out of core a corrective phase's scans keep a joint selection's candidates (no top-k pass
        # of its own); in core that pass costs less than keeping them in every scan
        self.joint_k = o.joint_candidates if bo is not None and bo.joint_in_scan and o.joint and self.mode != "off" \
            and engine.out_of_core else 0
        # a corrective phase's trials as compute sweeps, one re-derivation at its end
        self.sweep = bo is not None and bo.sweep_trials
        self.top = None if bo is None else bo.top
        # history times count fitting seconds since the start, across resumed sessions
        self.t0 = time.perf_counter() - (state.history[-1]["time"] if state.history else 0.0)
        self.fresh = fresh
        self.scan = None  # the scan of the table as it is now
        self.since_sync = 0  # moves applied incrementally since the last exact re-derivation
        self.n_batches = 0
        self.refined = False  # a corrective phase ran since the last append/remove
        self.joint_tried = False  # a joint selection was tried on the current state
        # cost drop per table operation (pass or sweep) of the last joint selection and of the
        # last batch (corrective.JOINT_TAIL_FACTOR)
        self.joint_rate = None
        self.batch_rate = None
        self.products = corrective.Products(state.cards) if self.mode != "off" else None
        self.cand_order = corrective.CandidateOrder() if self.mode != "off" else None  # joint candidates' pairs

    # ----------------------------------------------------------------- bookkeeping
    def support(self) -> np.ndarray:
        """The support's flat indices, in insertion order."""
        return np.fromiter(self.state.theta.keys(), dtype=np.int64, count=len(self.state.theta))

    def values(self) -> np.ndarray:
        """The support's parameters, in the order of :meth:`support`."""
        return np.fromiter(self.state.theta.values(), dtype=np.float64, count=len(self.state.theta))

    def _checked(self, r):
        """``r``, after checking that the duals it hands over lie in [-1, 1] (docs/design.md,
        "The learner's invariants"); it becomes :attr:`scan`."""
        checks.check_scan(self.engine, r, self.state.n_iter)
        self.scan = r
        return r

    def full_scan(self):
        """A scan pass of the table as it is (no move)."""
        e = self.engine
        return self._checked(e.update_scan(None, self.support()) if self.batch_options is None else
                             e.update_scan_batch([], self.support(), self.top))

    def _scan_or_rescan(self, r):
        return self.full_scan() if r is None else self._checked(r)

    def record(self, entry: dict, persist_now: bool = True) -> None:
        """Append a history entry (with the passes so far); persist unless told not to."""
        entry["passes"] = self.engine.passes
        self.state.history.append(entry)
        if self.progress is not None:
            self.progress.update(1)
            self.progress.set_postfix(cost=f"{entry['cost']:.6f}", bases=len(self.state.theta), refresh=False)
        if self.callback is not None and persist_now:
            self.callback(self.state)

    def persist(self) -> None:
        """Hand the state to the caller's callback (persistence)."""
        if self.callback is not None:
            self.callback(self.state)

    def ops(self) -> int:
        """The engine's table operations so far: passes and compute sweeps."""
        return self.engine.passes + self.engine.sweeps

    def joint_due(self) -> bool:
        """Whether a joint selection is tried before the next batch though a single move gains
        ``epsilon``: the last batch lowered the cost by less per table operation than the last
        joint selection did, divided by :data:`fsll_ooc.learn.corrective.JOINT_TAIL_FACTOR`
        (batched fits with joint selections only; once per state)."""
        f = corrective.JOINT_TAIL_FACTOR
        return f is not None and self.batch_options is not None and self.mode != "off" and self.options.joint \
            and not self.joint_tried and self.joint_rate is not None and self.batch_rate is not None \
            and self.batch_rate * f < self.joint_rate

    def _refine_kwargs(self) -> dict:
        o = self.options
        return dict(tol=o.refine_tol * self.eps, max_rounds=o.refine_rounds, products=self.products, top=self.top,
                    joint=self.joint_k, sweep=self.sweep,
                    first_step=corrective.FIRST_ROUND_MAX_STEP if self.sweep else None)

    # ----------------------------------------------------------------- phases
    def refine(self):
        """A fully corrective phase on the support; the scan after it, or None when it did
        not move (the table and :attr:`scan` unchanged)."""
        st = self.state
        self.refined = True
        before = st.cost()
        with self.engine.purpose_of("refine"):
            rr = corrective.refine(self.engine, st, **self._refine_kwargs())
        if not rr.rounds:
            return None
        self.since_sync = 0
        self.joint_tried = False
        st.n_iter += 1
        self._scan_or_rescan(rr.scan)
        c = st.cost()
        self.record({"iter": st.n_iter, "move": "refine", "y": None, "value": float(rr.rounds), "delta": c - before,
                     "cost": c, "n_bases": len(st.theta), "time": time.perf_counter() - self.t0, "trials": rr.trials})
        return self.scan

    def joint(self):
        """A joint selection (:func:`fsll_ooc.learn.corrective.joint_append`); the scan after it,
        or None when it appended nothing."""
        st, o = self.state, self.options
        self.joint_tried = True
        before, ops0 = st.cost(), self.ops()
        kw = self._refine_kwargs()
        with self.engine.purpose_of("joint"):
            ja = corrective.joint_append(self.engine, st, epsilon=self.eps, tol=kw["tol"],
                                         n_candidates=o.joint_candidates, max_rounds=o.refine_rounds,
                                         products=self.products, n_closure=o.joint_closure, max_new=o.joint_max_new,
                                         cand_order=self.cand_order, top=self.top, scan=self.scan,
                                         joint=self.joint_k, sweep=self.sweep)
        if not ja.added:
            if self.joint_rate is not None:
                self.joint_rate = 0.0
            return None
        self.since_sync = 0
        self.refined = True
        self.joint_tried = False
        st.n_iter += 1
        self._scan_or_rescan(ja.refine.scan)
        c = st.cost()
        # the bar for the rule; the next selection it starts waits for a batch after this one
        self.joint_rate, self.batch_rate = (before - c) / max(self.ops() - ops0, 1), None
        self.record({"iter": st.n_iter, "move": "joint-append", "y": None, "value": float(len(ja.added)),
                     "delta": c - before, "cost": c, "n_bases": len(st.theta), "time": time.perf_counter() - self.t0,
                     "added": [list(st.digits(a)) for a in ja.added], "added_gain": ja.gains,
                     "estimate": -ja.estimate})
        return self.scan

    def step(self, move: str, y: int, t: float, d: float, delta: float):
        """One greedy move (``append``, ``adjust`` or ``remove`` of term ``y`` whose dual is ``t``
        and target ``d``, predicted change ``delta``) and the pass that applies it; the scan."""
        st, e, bo = self.state, self.engine, self.batch_options
        old = st.theta.get(y, 0.0)
        new = 0.0 if move == "remove" else C.optimum_theta(old, d, t)
        step = Step(st.digits(y), new - old, t)
        st.log_z += math.log(math.cosh(step.delta) + math.sinh(step.delta) * t)
        if move == "remove":
            del st.theta[y]
            st.dbar.pop(y, None)
        else:
            st.theta[y] = new
            st.dbar[y] = d
        if move != "adjust":
            self.refined = False
        self.joint_tried = False
        st.n_iter += 1
        self.since_sync += 1
        e.purpose = "step"
        if self.since_sync >= self.options.resync_every:
            # a few support duals by the incremental identity, against the exact re-derivation
            e.purpose = "periodic"
            probe = np.fromiter(st.theta, np.int64, len(st.theta))[-checks.PROBE_CELLS:]
            predicted = checks.predict_step(st.cards, e, probe, step)
            if bo is None:
                st.log_z = e.resync(self.support(), self.values(), st.log_z)
                res = self.full_scan()
            else:  # the scan in the re-derivation's last pass (out of core; in core the same two passes)
                st.log_z, res = e.resync_scan(self.support(), self.values(), st.log_z, bo.top)
                self._checked(res)
            checks.check_support(e, res, probe, predicted, st.n_iter, "after a re-derivation")
            self.since_sync = 0
        elif bo is not None and e.batch_pass(step.axes) is not None:
            self._checked(e.update_scan_batch([step], self.support(), bo.top))
        else:
            self._checked(e.update_scan(step, self.support()))
        e.purpose = None
        self.record({"iter": st.n_iter, "move": move, "y": list(step.digits), "value": new, "delta": delta,
                     "cost": st.cost(), "n_bases": len(st.theta), "time": time.perf_counter() - self.t0})
        return self.scan

    def batch(self, V):
        """Steps on the marginal sub-table over the variables ``V``, then one pass that applies
        them (or an exact re-derivation); the scan after it, or None when the sub-table search
        took no step (nothing changed, no pass: the caller takes the best move alone, so a
        batch that cannot move never repeats).

        With corrective phases between passes (``refine_in_batch``), a corrective phase on the
        batch's parameters runs first, by compute sweeps (:func:`fsll_ooc.learn.corrective.refine`
        with ``table_current=False``); when it moves them, the table is brought up to date by
        one re-derivation of its result instead of the batch's pass (docs/design.md,
        "Corrective phases between passes")."""
        st, e, opts, o = self.state, self.engine, self.batch_options, self.options
        max_iter = o.max_iter
        cells = B.marginal_cells(st.cards, V).reshape(-1)
        tb0 = B.gather_marginal(e, st.cards, V)
        db = B.gather_marginal(e, st.cards, V, Table.DBAR)
        checks.check_range(e, cells, tb0, st.n_iter, "dual")
        checks.check_range(e, cells, db, st.n_iter, "target")
        sub = tb0.copy()
        limit = opts.max_steps if max_iter is None else min(opts.max_steps, max_iter - st.n_iter)
        weights = C.penalty_weights(st.cards, st.n_samples, st.penalty_scale)
        steps = []
        self.n_batches += 1
        before = [(y, v, st.dbar[y]) for y, v in st.theta.items()]
        # (the compiled search has run before its first step comes out)
        found = list(B.search_marginal(st.cards, V, sub, db, st.theta, weights, self.eps, limit, code=st.term_code()))
        costs = iter(B.step_costs(st, before, found, st.log_z))  # st.cost() after each, its bits
        n_bases = len(before)
        for s in found:
            steps.append(s)
            if s.move == "remove":
                st.dbar.pop(s.flat, None)
            else:
                st.dbar[s.flat] = s.d
            st.log_z += s.log_den
            st.n_iter += 1
            n_bases += (s.move == "append") - (s.move == "remove")
            self.record({"iter": st.n_iter, "move": s.move, "y": list(st.digits(s.flat)), "value": s.new,
                         "delta": s.delta, "cost": next(costs), "n_bases": n_bases,
                         "time": time.perf_counter() - self.t0, "batch": self.n_batches}, persist_now=False)
        if not steps:
            self.n_batches -= 1
            return None
        # the merged factors; the duals before each (a replay of the sub-table) only where a pass applies them one by one
        factors, _ = B.merge_steps(st.cards, V, tb0, steps, duals=False)
        # the variables of the terms that changed: a batch over variables on both sides of the
        # layout's cut whose changes keep to one side is still one pass
        U = B.changed_variables(factors)
        one_pass = e.batch_pass(U) is not None
        self.since_sync += len(factors)
        rr = None
        if self.mode != "off" and self.sweep and opts.refine_in_batch and st.theta:
            # a batch that gained much leaves the tail of the phase's convergence to the phases after it
            gain = -math.fsum(s.delta for s in found)
            settle = corrective.BATCH_SETTLE_GAIN is not None and gain > corrective.BATCH_SETTLE_GAIN * self.eps
            with e.purpose_of("batch-refine"):  # a corrective phase on the batch's parameters, before its re-derivation
                rr = corrective.refine(e, st, **self._refine_kwargs(), table_current=False,
                                       leave=math.inf if settle else None)
        if rr is not None and not rr.pending:  # the phase re-derived the table (with its scan where the engine scans there)
            res = rr.scan if rr.scan is not None else e.update_scan_batch([], self.support(), opts.top)
            # the phase moved the parameters: the sub-table is checked against its first sweep
            sub_inc, sub = sub, None
            self.since_sync = 0
        elif self.since_sync >= o.resync_every or not one_pass:
            with e.purpose_of("batch-periodic" if one_pass else "batch-span"):
                st.log_z, res = e.resync_scan(self.support(), self.values(), st.log_z, opts.top)
            self.since_sync = 0
        elif len(factors) >= B.MULTIPLIER_MIN_FACTORS and all(basis.is_walsh(st.cards[v]) for v in U):
            m = B.marginal_multiplier(st.cards, U, B.sub_table(st.cards, V, tb0, U), factors)
            res = e.update_scan_batch([], self.support(), opts.top, multiplier=(U, m))
        else:
            factors, _ = B.merge_steps(st.cards, V, tb0, steps)
            res = e.update_scan_batch([Step(dg, dl, t) for dg, dl, t in factors], self.support(), opts.top)
        # the table after its pass (or re-derivation) against the sub-table's incremental duals;
        # after a corrective phase, the exact duals of its first sweep (the parameters of the batch)
        if sub is not None:
            checks.check_support(e, res, cells, sub, st.n_iter, "after a batch pass")
        elif rr.swept is not None:
            common, i_cells, i_swept = checks.common_cells(cells, rr.swept[0])
            checks.check_agree(e, common, np.asarray(sub_inc).reshape(-1)[i_cells], rr.swept[1][i_swept],
                               st.n_iter, "after a batch's steps")
        st.history[-1]["passes"] = e.passes
        if rr is None or not rr.rounds:  # (after a phase its record persists)
            self.persist()
        self._checked(res)
        self.refined = False
        self.joint_tried = False
        if rr is not None and rr.rounds:
            self.refined = True
            st.n_iter += 1
            self.record({"iter": st.n_iter, "move": "refine", "y": None, "value": float(rr.rounds), "delta": rr.delta,
                         "cost": st.cost(), "n_bases": len(st.theta), "time": time.perf_counter() - self.t0,
                         "trials": rr.trials, "in_batch": self.n_batches})
        return self.scan

    # ----------------------------------------------------------------- the search
    def best_move(self) -> tuple[float, str, int, float, float]:
        """``(delta, move, flat, t, d)`` of the best single move by the last scan (under the
        family code re-priced, with the named families' terms tried)."""
        st = self.state
        best = _best_move(st, self.scan)
        if st.penalty_code != "paper":  # the family code: re-price the scan, try the named families
            best = corrective.family_move(self.engine, st, best, self.options.family_terms)
        return best

    def run(self) -> FitState:
        """Search until no move gains ``epsilon`` (or ``max_iter``); returns the state."""
        st, e, o, bo = self.state, self.engine, self.options, self.batch_options
        if not self.fresh:
            st.log_z = e.resync(self.support(), self.values(), st.log_z)
        if not st.history:
            st.history.append({"iter": 0, "move": "init", "y": None, "value": 0.0, "delta": 0.0,
                               "cost": st.cost(), "n_bases": 0, "time": 0.0})
        self.full_scan()
        cells = math.prod(st.cards)
        while o.max_iter is None or st.n_iter < o.max_iter:
            delta, move, y, t, d = self.best_move()
            stop = not delta < -self.eps
            if self.mode != "off" and not self.refined and st.theta and \
                    (stop or (self.mode == "adjust" and move == "adjust")):
                if self.refine() is not None:
                    continue
            if stop and self.mode != "off" and o.joint and not self.joint_tried:
                if self.joint() is not None:
                    continue
            if stop:
                st.converged = True
                break
            if self.joint_due() and self.joint() is not None:
                continue
            if bo is not None:
                V = B.choose_variables(st.cards, _batch_moves(st, self.scan, delta, y, bo.support_moves),
                                       factor=bo.factor, max_cells=bo.cells_for(cells))
                if V is not None:
                    rate = corrective.JOINT_TAIL_FACTOR is not None
                    before, ops0 = (st.cost(), self.ops()) if rate else (0.0, 0)
                    with e.purpose_of("batch"):
                        moved = self.batch(V)
                    if moved is not None:
                        if rate:
                            self.batch_rate = (before - st.cost()) / max(self.ops() - ops0, 1)
                        continue
            self.step(move, y, t, d, delta)
        if o.on_finish is not None:
            o.on_finish(e, st)
        return st


def _batch_moves(state: FitState, res, delta: float, y: int, support_moves: bool = True):
    """``(gain, flat)`` of the best move, then of the other moves that gain, by decreasing
    gain: what :func:`fsll_ooc.learn.batch.choose_variables` reads.  The other moves are the
    scan's best append candidates (not in the support) and, with ``support_moves``, the
    best adjust or remove of every member of the support (the scan returns the duals of
    all of them; :func:`fsll_ooc.learn.batch.support_gains`).

    Under the family code the scan prices every cell as a family's first member; a
    candidate on a family the support names costs less, so its gain is re-priced to its
    marginal code length (as :func:`fsll_ooc.learn.corrective.family_move` does for the best)."""
    yield -delta, y
    pos = np.asarray(res.top_pos, np.int64)
    gain = -np.asarray(res.top_delta, np.float64)
    keep = np.fromiter((p != y and p not in state.theta for p in pos.tolist()), bool, len(pos))
    pos, gain = pos[keep], gain[keep]
    if state.penalty_code != "paper" and len(pos):
        ys = pos.tolist()
        gain = gain - (np.array(state.marginal_penalties(ys)) - np.array([state.penalty(p) for p in ys]))
    if support_moves and len(res.supp_pos):
        sp = np.asarray(res.supp_pos, np.int64)
        ys = sp.tolist()
        th = np.fromiter(map(state.theta.__getitem__, ys), np.float64, len(ys))
        g = B.support_gains(np.asarray(res.supp_t, np.float64), np.asarray(res.supp_d, np.float64), th,
                            np.array(state.penalties(ys), np.float64))
        keep = (g > 0.0) & (sp != y)
        pos, gain = np.concatenate([pos, sp[keep]]), np.concatenate([gain, g[keep]])
    for i in np.lexsort((pos, -gain)).tolist():
        yield float(gain[i]), int(pos[i])
