"""The table passes of a fit, over banded stores: the execution layer.

The learner (:mod:`fsll_ooc.learn`) speaks in terms of whole tables ("compute the
targets", "apply this step and scan for candidates", "re-derive the duals exactly");
the :class:`Engine` turns each request into band tasks (:mod:`fsll_ooc.engine.tasks`)
over the layout chosen by the planner (band geometry: :mod:`fsll_ooc.engine.bands`),
runs them with an executor (:mod:`fsll_ooc.executors`) and reduces their results.
In core is the same code with one band.  The tables are named by
:class:`~fsll_ooc.engine.tasks.Table`: ``DBAR`` (targets), ``THETABAR`` (duals) and
``SCRATCH``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections import Counter
from typing import Any, Sequence

import numpy as np

from .. import basis, cost, storage
from ..executors import Executor, make_executor
from ..kernels import ahead
from ..kernels import scan as scan_kernels
from ..planner import Layout
from .bands import global_to_band, n_bands
from .tasks import (DBAR, SCRATCH, THETABAR, Context, ScanResult, Step, Table, combine, task_fill,
                    task_fill_and_uniform_duals, task_gather,
                    task_map, task_partner, task_top_candidates, task_uniform_duals, task_update_many,
                    task_update_scan)

__all__ = ["Engine", "EngineStats", "ScanResult", "Step", "Table", "PARALLEL_SCAN_MIN_CELLS"]

#: Smallest band for which the fused update + scan runs on several threads (the caller
#: and the helpers of :mod:`fsll_ooc.kernels.threadpool`, taking blocks of rows as they come).
#: Only when the band is the only task of its pass (in core); several bands run as
#: concurrent tasks and keep one thread each.  Below it, waking a helper costs more
#: than it saves (the measurements: docs/benchmarks.md, section 3).
PARALLEL_SCAN_MIN_CELLS = 2**19


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """What an :class:`Engine` has run so far (a snapshot: :attr:`Engine.stats`).

    ``passes``/``pass_seconds``: the table passes (each reads and/or writes whole tables)
    and their wall time; ``bytes_moved``: the table bytes they read and wrote;
    ``sweeps``/``sweep_seconds``: the compute sweeps (no table read or written) and their
    wall time; ``gathers``: reads of a few cells.  The rest of a fit's wall time is the
    learner's own work (its *host* time)."""

    passes: int
    pass_seconds: float
    bytes_moved: int
    sweeps: int
    sweep_seconds: float
    gathers: int

    @property
    def table_seconds(self) -> float:
        """Wall time in passes and sweeps."""
        return self.pass_seconds + self.sweep_seconds

    def host_share(self, wall_seconds: float) -> float:
        """The part of ``wall_seconds`` (a fit's wall time) spent outside passes and sweeps."""
        return max(0.0, wall_seconds - self.table_seconds) / wall_seconds if wall_seconds > 0 else 0.0


class _Ticking:
    """A task function that advances a progress bar when it finishes (threads/serial only)."""

    def __init__(self, fn, bar):
        self.fn, self.bar = fn, bar
        self.__name__ = getattr(fn, "__name__", "task")

    def __call__(self, *args):
        out = self.fn(*args)
        self.bar.update(1)
        return out


class Engine:
    """Table passes of one fit over the tables ``specs`` laid out by ``layout``."""

    def __init__(self, layout: Layout, specs: Sequence[storage.TableSpec], r0: float, w: Sequence[float],
                 executor: Executor):
        self.layout = layout
        # several band tasks run at once under dask: their transforms then keep to one thread each
        self.ctx = Context(layout, tuple(specs), float(r0), tuple(float(x) for x in w),
                           bool(executor.parallel_kernels))
        self.executor = executor
        self.passes = 0  # band passes run so far (each reads and/or writes whole tables)
        self.bytes_moved = 0  # table bytes those passes read and wrote
        self.pass_seconds = 0.0  # wall time spent in them
        self.progress = False  # per-pass bars (set by the estimator when bars are shown)
        self.purpose = None  # what the learner runs passes for right now (:meth:`purpose_of`)
        self.pass_counts = Counter()  # passes by ``purpose/band kind/task`` (:meth:`passes_by`)
        self.sweeps = 0  # compute sweeps (:meth:`sweep`): no table read or written
        self.sweep_seconds = 0.0
        self.sweep_counts = Counter()  # sweeps by purpose
        self.gathers = 0  # reads of a few cells (:meth:`gather`)

    @classmethod
    def create(cls, layout: Any, specs: Sequence[storage.TableSpec], n_samples: int, scheduler: Any = None, *,
               sample_flat: np.ndarray | None = None, progress: bool = False,
               penalty_scale: float = 1.0) -> "Engine":
        """An engine ready for the learner, over the tables ``specs`` (indexed by :class:`Table`).

        ``layout``: a :class:`fsll_ooc.planner.Layout` or a :class:`fsll_ooc.planner.Plan`
        (its layout).  The penalties are those of ``n_samples`` samples, times
        ``penalty_scale`` (:func:`fsll_ooc.cost.penalty_weights`); the executor is
        :func:`fsll_ooc.executors.make_executor` of ``scheduler`` (``None``: serial for one
        band, the pool of the kernels' threads for several, at most a plan's ``workers`` at once).  With ``sample_flat`` (the data's flat indices,
        a new fit) the engine runs its setup passes: the targets ``dbar`` of the data and
        the duals of ``theta = 0`` in ``thetabar``.  Without, the tables are used as they
        are (a resumed or finished fit).  ``progress``: per-pass progress bars.
        """
        workers = getattr(layout, "workers", None)  # a plan's: the tasks its memory budget holds
        layout = getattr(layout, "layout", layout)
        r0, w = cost.penalty_weights(layout.cards, n_samples, penalty_scale)
        n_tasks = max(layout.n_a_bands, layout.n_b_bands if layout.a > 0 else 1)
        engine = cls(layout, specs, r0, w, make_executor(scheduler, n_tasks, workers))
        engine.progress = bool(progress)
        if sample_flat is not None:
            # the first fit after installing: the update + scan kernels compile in a second
            # process while the targets' transforms compile here (fsll_ooc.kernels.ahead)
            if ahead.start(scan_kernels.__name__) and progress:
                print("fsll-ooc: compiling the kernels (the first fit after installing; later runs load "
                      "them)", file=sys.stderr, flush=True)
            engine.compute_targets(sample_flat, n_samples, init_duals=True)
        return engine

    @property
    def stats(self) -> EngineStats:
        """The passes, sweeps and their wall time so far (:class:`EngineStats`, read only)."""
        return EngineStats(self.passes, self.pass_seconds, self.bytes_moved, self.sweeps, self.sweep_seconds,
                           self.gathers)

    @contextlib.contextmanager
    def purpose_of(self, name: str):
        """Count the passes run inside the ``with`` block under ``name`` (the innermost
        name counts; :meth:`passes_by`)."""
        outer, self.purpose = self.purpose, name
        try:
            yield
        finally:
            self.purpose = outer

    def passes_by(self, level: int = 1) -> dict:
        """Passes so far by purpose (``level=1``), purpose and band kind (2) or purpose, band
        kind and task (3): ``{"batch": 12, ...}``; passes outside any :meth:`purpose_of` block
        count under ``"other"``."""
        out = Counter()
        for key, n in self.pass_counts.items():
            out["/".join(key.split("/")[:level])] += n
        return dict(sorted(out.items()))

    # -- helpers
    def _run(self, kind: str, fn, argfn, reduce=True, sweep=False):
        nb = n_bands(self.layout, kind)
        args = [argfn(i) for i in range(nb)]
        started = time.perf_counter()
        if sweep:  # no table touched: counted apart from the passes
            self.sweeps += 1
            self.sweep_counts[self.purpose or "other"] += 1
            res = self.executor.run_reduce(fn, args, combine)
            self.sweep_seconds += time.perf_counter() - started
            return res
        self.passes += 1
        self.pass_counts[f"{self.purpose or 'other'}/{kind}/{getattr(fn, '__name__', 'task')}"] += 1
        tables = _TABLES_MOVED.get(fn, 2)
        if fn in (task_update_scan, task_update_many) and args and not (
                args[0][3] or (fn is task_update_many and (args[0][8] is not None or args[0][9] is not None))):
            tables = 2  # a scan only: the duals are not written
        elif fn is task_update_scan and args and args[0][4] == SCRATCH:
            tables = 4  # the second pass of a two-pass update also reads the partner
        elif fn is task_update_many and args and args[0][9] is not None and args[0][9][0] is None:
            tables = 2  # duals built from sparse values and written, the targets read
        bar = None
        if self.progress and nb >= 8 and not self.executor.distributed:
            from tqdm.auto import tqdm

            from ..progress import pass_words

            bar = tqdm(total=nb, desc=pass_words(fn), unit=" bands",
                       leave=False, file=sys.stderr, dynamic_ncols=True)
            fn = _Ticking(fn, bar)
        try:
            if reduce:
                res = self.executor.run_reduce(fn, args, combine)
            else:
                res = self.executor.run(fn, args)
        finally:
            if bar is not None:
                bar.close()
        for s in self.ctx.specs:
            storage.flush(s)
        self.bytes_moved += tables * self.layout.size * 8
        self.pass_seconds += time.perf_counter() - started
        return res

    def _parallel(self, kind: str) -> bool:
        """Threads inside the update + scan kernel: only for one band of at least
        :data:`PARALLEL_SCAN_MIN_CELLS` cells (several bands run as concurrent tasks)."""
        L = self.layout
        cells = L.a_band_elements if kind == "A" else L.b_band_elements
        return bool(self.executor.parallel_kernels and n_bands(L, kind) == 1 and cells >= PARALLEL_SCAN_MIN_CELLS)

    def _group(self, kind: str, flat: np.ndarray, values: np.ndarray | None = None):
        """Split global flat indices by band: ``{band: (local, global, values)}``."""
        if kind == "A" and self.layout.a == 0:  # one band (in core)
            return {0: (flat, flat, values)}
        band, local = global_to_band(self.layout, kind, flat)
        out = {}
        for b in np.unique(band):
            m = band == b
            out[int(b)] = (local[m], flat[m], None if values is None else values[m])
        return out

    # -- passes
    def compute_targets(self, sample_flat: np.ndarray, n_samples: int, weights: np.ndarray | None = None,
                        init_duals: bool = False) -> None:
        """``dbar = T(q)`` with ``q = (counts + 1/|X|) / (N + 1)``: the positivity rule of
        :mod:`fsll_ooc.cost` (one pseudo-sample spread uniformly).

        ``weights``: soft counts (EM, :mod:`fsll_ooc.missing`): ``sample_flat`` are then
        distinct cells and ``weights`` their (real, non-negative) counts, summing to
        ``n_samples``.  ``init_duals``: the same pass also writes the duals of ``theta = 0``
        (:meth:`init_duals`) into its bands: a new fit's setup in one pass fewer."""
        L = self.layout
        if weights is None:
            flat, counts = np.unique(np.asarray(sample_flat, np.int64), return_counts=True)
        else:
            flat, counts = np.asarray(sample_flat, np.int64), np.asarray(weights, np.float64)
        groups = self._group("A", flat, counts.astype(np.float64) / (n_samples + 1.0))
        empty = (np.zeros(0, np.int64), np.zeros(0))
        ops_a = (("add", 1.0 / (L.size * (n_samples + 1.0))), ("T", L.a_axes, False))

        def arg(i):
            loc, _, val = groups.get(i, (empty[0], None, empty[1]))
            return (self.ctx, "A", i, DBAR, loc, val, ops_a)

        self._run("A", task_fill_and_uniform_duals if init_duals else task_fill, arg)
        if L.a > 0:
            self._run("B", task_map, lambda i: (self.ctx, "B", i, DBAR, DBAR, (("T", tuple(range(L.a)), False),)))

    def init_duals(self) -> None:
        """``thetabar`` of ``theta = 0`` (the uniform distribution): a product of per-variable
        vectors, ``e_0`` for Walsh-Hadamard variables and ``(1, 2/k-1, ..., 2/k-1)`` for the
        +-1 basis (which is not orthogonal, so uniform has non-zero moments there)."""
        self._run("A", task_uniform_duals, lambda i: (self.ctx, "A", i), reduce=False)

    def update_scan(self, step: Step | None, support: np.ndarray) -> ScanResult:
        """Apply ``step`` to ``thetabar`` (if any) and scan every append candidate, in one pass
        (two when the step's variables are not local to a single band kind)."""
        L = self.layout
        support = np.asarray(support, np.int64)
        passes = L.passes_for(step.axes) if step is not None else ("A",)
        if passes == ("A", "B"):
            first = tuple(v for v in step.axes if v >= L.a)
            self._run("A", task_partner, lambda i: (self.ctx, "A", i, step, first), reduce=False)
            kind, src, pv = "B", SCRATCH, tuple(v for v in step.axes if v < L.a)
        else:
            kind, src, pv = passes[0], THETABAR, (step.axes if step is not None else ())
        groups = self._group(kind, support)
        par = self._parallel(kind)
        empty = np.zeros(0, np.int64)

        def arg(i):
            loc, glob, _ = groups.get(i, (empty, empty, None))
            return (self.ctx, kind, i, step, src, pv, loc, glob, par)

        return self._run(kind, task_update_scan, arg)

    @property
    def out_of_core(self) -> bool:
        """Do the tables live in files (a persistent backend), so that a pass is a trip to the disk?"""
        return bool(self.ctx.specs[THETABAR].backend_impl.persistent)

    def batch_pass(self, axes) -> str | None:
        """The kind of band ("A" or "B") whose variables hold ``axes`` (one pass applies
        updates on them), or None (they need an exact re-derivation)."""
        passes = self.layout.passes_for(tuple(axes))
        return passes[0] if len(passes) == 1 else None

    def update_scan_batch(self, steps: Sequence[Step], support: np.ndarray, top: int,
                          multiplier: tuple | None = None, joint: int = 0) -> ScanResult:
        """Apply several updates (factors that commute; docs/design.md, "Several terms per
        pass") to ``thetabar`` in one pass and scan: the best append candidate, the duals
        and targets at ``support``, and the ``top`` best append candidates
        (``top_pos``/``top_delta``, exact cost changes).  Every step's variables must be local
        to one kind of band (:meth:`batch_pass`); without steps, a scan only.  ``multiplier``:
        ``(V, m)`` of :func:`fsll_ooc.learn.batch.marginal_multiplier` instead of ``steps``.
        ``joint``: as for :meth:`resync_scan`."""
        axes = sorted(set().union(*[s.axes for s in steps])) if steps else []
        if multiplier is not None:
            axes = sorted(set(axes) | set(multiplier[0]))
        kind = self.batch_pass(axes) if axes else "A"
        if kind is None:
            raise ValueError(f"updates on variables {axes} do not fit one band pass of layout "
                             f"a={self.layout.a}, c={self.layout.c}")
        support = np.asarray(support, np.int64)
        groups = self._group(kind, support)
        par = self._parallel(kind)
        empty = np.zeros(0, np.int64)
        steps = tuple(steps)

        def arg(i):
            loc, glob, _ = groups.get(i, (empty, empty, None))
            return (self.ctx, kind, i, steps, loc, glob, int(top), par, multiplier, None, int(joint))

        return self._run(kind, task_update_many, arg)

    #: With one kind of band (``a = 0``), does :meth:`resync_scan` scan inside the
    #: re-derivation's one pass (True) or run a scan pass after it (False, as before)?
    #: The same bits either way; an attribute so that benchmarks can compare the two.
    one_band_scan_in_resync = True

    @property
    def scan_in_resync(self) -> bool:
        """Does :meth:`resync_scan` scan inside the re-derivation's own passes (its last one),
        so that the scan costs no pass of its own?"""
        return self.layout.a > 0 or self.one_band_scan_in_resync

    def resync_scan(self, support: np.ndarray, theta: np.ndarray, log_z: float, top: int,
                    joint: int = 0) -> tuple[float, ScanResult]:
        """:meth:`resync` followed by the scan of :meth:`update_scan_batch` without steps:
        ``(exact log Z, scan)``.  The scan runs in the re-derivation's last pass: one pass in
        all with one kind of band (``a = 0``, in core too), two with two kinds (against two
        and three).  The duals are the same bits as :meth:`resync`'s.  ``joint``: the scan
        also keeps the ``joint`` best cells by second-order score, which :meth:`top_candidates`
        then reads from it without a pass of its own."""
        L = self.layout
        support = np.asarray(support, np.int64)
        if L.a == 0:
            if not self.one_band_scan_in_resync:
                log_z = self.resync(support, theta, log_z)
                return log_z, self.update_scan_batch([], support, top, joint=joint)
            # the one pass of the re-derivation (_density), its scan on the band in memory
            theta = np.asarray(theta, np.float64)
            ops = (("T", L.a_axes, True), ("exp", log_z), ("normalize",), ("T", L.a_axes, False))
            par = self._parallel("A")
            res = self._run("A", task_update_many, lambda i: (self.ctx, "A", i, (), support, support, int(top), par,
                                                            None, (None, ops, support, theta), int(joint)))
            return log_z + math.log(res.total), res
        total = self._density(support, theta, log_z, SCRATCH, forward=True, last=False)
        ops = (("T", tuple(range(L.a)), False), ("scale", 1.0 / total))
        groups = self._group("B", support)
        empty = np.zeros(0, np.int64)

        def arg(i):
            loc, glob, _ = groups.get(i, (empty, empty, None))
            return (self.ctx, "B", i, (), loc, glob, int(top), False, None, (SCRATCH, ops), int(joint))

        return log_z + math.log(total), self._run("B", task_update_many, arg)

    def resync(self, support: np.ndarray, theta: np.ndarray, log_z: float) -> float:
        """Re-derive ``thetabar`` exactly from ``theta`` (full transforms); returns exact ``log Z``.

        ``log_z`` is the running estimate, used only to keep ``exp`` in range.  One pass in
        core; out of core two (docs/design.md, "The engine"): an A-band pass builds the
        log-density of its values of the head variables, takes ``exp`` and transforms
        forward along the band's variables; a B-band pass transforms along the head
        variables and normalises.
        """
        total = self._density(support, theta, log_z, SCRATCH, forward=True)
        return log_z + math.log(total)

    def resync_reading(self, support: np.ndarray, theta: np.ndarray, log_z: float,
                       cells: np.ndarray) -> tuple[float, np.ndarray]:
        """:meth:`resync`, reading ``p_theta`` at the global flat indices ``cells`` on the way
        (the E-step of EM, :mod:`fsll_ooc.missing`): ``(exact log Z, p_theta[cells])``, in the
        resync's own passes (two; one in core), the duals the same bits as :meth:`resync`'s."""
        cells = np.asarray(cells, np.int64)
        total, raw = self._density(support, theta, log_z, SCRATCH, forward=True, read_at=cells)
        return log_z + math.log(total), raw / total

    def sweep(self, support: np.ndarray, theta: np.ndarray, log_z: float,
              cells: np.ndarray) -> tuple[float, np.ndarray]:
        """The exact ``log Z`` of ``theta`` and its duals ``thetabar`` at the global flat indices
        ``cells``, by the compute of a re-derivation without reading or writing any of the fit's
        tables (docs/design.md, "Corrective phases between passes"; in memory, with one band,
        it works in the scratch table's memory instead of a new band): one task per A-band builds the
        log-density of its slice from the sparse ``theta``, takes ``exp`` and transforms along
        its own variables, and reads off the cells; the transform along the head variables
        (``a > 0``) is then a short sum over the bands for each cell.  ``log Z`` is the same
        bits as :meth:`resync`'s; with one kind of band (``a = 0``) the duals too, and with
        two they agree to rounding.  The transforms do only the work the sparse ``theta`` and
        the few ``cells`` need (:func:`fsll_ooc.kernels.transform.transform_sparse`, the same
        bits), so the rest of the band, and of the scratch table in memory, is left unspecified.
        Counted in :attr:`sweeps`, not in :attr:`passes`."""
        L = self.layout
        support = np.asarray(support, np.int64)
        theta = np.asarray(theta, np.float64)
        cells = np.asarray(cells, np.int64)
        if L.a == 0:
            ops = (("T", L.a_axes, True), ("exp", log_z), ("normalize",), ("T", L.a_axes, False, "taken"),
                   ("take", cells, np.arange(cells.size, dtype=np.int64)))
            # in memory the sweep works in the scratch table (no table of the fit is current there
            # during a fit): a new band per sweep would cost the operating system's zeroed pages
            spec = self.ctx.specs[SCRATCH]
            buf = SCRATCH if spec.backend_impl.supports_inplace_views and not spec.backend_impl.persistent else None
            res = self._run("A", task_fill, lambda i: (self.ctx, "A", i, buf, support, theta, ops), sweep=True)
            values = np.empty(cells.size)
            values[np.asarray(res.supp_pos, np.int64)] = res.supp_t
            return log_z + math.log(res.total), values
        heads = self._head_values(support, theta)
        band, local = global_to_band(L, "A", cells)
        uniq, inv = np.unique(local, return_inverse=True)
        nb, nu = L.n_a_bands, uniq.size
        ops = (("T", L.a_axes, True), ("exp", log_z), ("sum",), ("T", L.a_axes, False, "taken"))

        def arg(i):
            take = ("take", uniq, i * nu + np.arange(nu, dtype=np.int64))
            return (self.ctx, "A", i, None, heads[i][0], heads[i][1], ops + (take,))

        res = self._run("A", task_fill, arg, sweep=True)
        part = np.empty(nb * nu)
        part[np.asarray(res.supp_pos, np.int64)] = res.supp_t
        part = part.reshape(nb, nu)
        # thetabar_y = sum over head values x of phi_{y_head}(x) * (band x's partial dual at y) / total
        head = L.cards[:L.a]
        ydig = np.unravel_index(band, head)
        mats = [basis.local_matrix(k) for k in head]
        values = np.zeros(cells.size)
        for i in range(nb):
            xdig = np.unravel_index(i, head)
            f = np.ones(cells.size)
            for v in range(L.a):
                f *= mats[v][ydig[v], xdig[v]]
            values += f * part[i, inv]
        return log_z + math.log(res.total), values / res.total

    def density(self, support: np.ndarray, theta: np.ndarray, log_z: float) -> float:
        """Write ``exp(l_theta - log_z)`` into the scratch table; returns its sum."""
        return self._density(support, theta, log_z, SCRATCH, forward=False)

    def _head_values(self, support: np.ndarray, theta: np.ndarray) -> list:
        """Per A-band ``i``, read as the head variables' values ``x_head = i``: ``(local, values)``
        with ``values = theta_y prod_{v < a} phi_{y_v}(x_v)`` at ``local`` = the band-local index of
        ``y``'s other digits (terms that differ only on the head variables add up in the band)."""
        L = self.layout
        band, local = global_to_band(L, "A", support)
        head = L.cards[:L.a]
        ydig = np.unravel_index(band, head)
        mats = [basis.local_matrix(k) for k in head]
        out = []
        for i in range(L.n_a_bands):
            xdig = np.unravel_index(i, head)
            f = np.ones(len(support))
            for v in range(L.a):
                f *= mats[v][ydig[v], xdig[v]]
            out.append((local, theta * f))
        return out

    def _density(self, support, theta, log_z, dst, forward: bool, read_at: np.ndarray | None = None,
                 last: bool = True):
        """The density pass(es); with ``read_at`` (global flat indices) also the values
        ``exp(l_theta - log_z)`` there, in that order: ``(total, values)``.  ``last=False``
        (forward, out of core): without the final B-pass into ``thetabar`` (the caller runs it)."""
        L = self.layout
        support = np.asarray(support, np.int64)
        theta = np.asarray(theta, np.float64)
        groups = self._group("A", support, theta)
        empty = (np.zeros(0, np.int64), None, np.zeros(0))
        kind = "A" if L.a == 0 or forward else "B"  # the band kind whose pass takes exp
        reads = None if read_at is None else self._group(kind, read_at, np.arange(read_at.size, dtype=np.int64))

        def take(i):  # the read-off op of band i, right after exp
            if reads is None:
                return ()
            loc, _, keys = reads.get(i, (np.zeros(0, np.int64), None, np.zeros(0, np.int64)))
            return (("take", loc, keys),)

        if L.a == 0:
            ops = (("T", L.a_axes, True), ("exp", log_z))
            rest = (("normalize",), ("T", L.a_axes, False)) if forward else (("sum",),)
            res = self._run("A", task_fill, lambda i: (self.ctx, "A", i, THETABAR if forward else dst,
                                                       groups.get(i, empty)[0], groups.get(i, empty)[2],
                                                       ops + take(i) + rest))
        elif forward:
            # A-band i is read as the head variables' *values* x_head = i: the sparse theta is
            # transformed along the head variables first (a few numbers per term), so the band
            # holds the whole log-density of its slice after T^T along its own variables
            heads = self._head_values(support, theta)
            ops = (("T", L.a_axes, True), ("exp", log_z))
            rest = (("sum",), ("T", L.a_axes, False))
            res = self._run("A", task_fill, lambda i: (self.ctx, "A", i, dst, heads[i][0], heads[i][1],
                                                       ops + take(i) + rest))
            total = res.total
            if last:
                self._run("B", task_map, lambda i: (self.ctx, "B", i, dst, THETABAR,
                                                    (("T", tuple(range(L.a)), False), ("scale", 1.0 / total))))
        else:
            self._run("A", task_fill, lambda i: (self.ctx, "A", i, dst, groups.get(i, empty)[0],
                                                 groups.get(i, empty)[2], (("T", L.a_axes, True),)))
            ops = (("T", tuple(range(L.a)), True), ("exp", log_z))
            res = self._run("B", task_map, lambda i: (self.ctx, "B", i, dst, dst, ops + take(i) + (("sum",),)))
        if read_at is None:
            return res.total
        values = np.empty(read_at.size)
        values[np.asarray(res.supp_pos, np.int64)] = res.supp_t
        return res.total, values

    # -- fully corrective step (fsll_ooc.learn.corrective): gathers and a top-k candidate pass ------
    def table_array(self, table: Table = THETABAR) -> np.ndarray | None:
        """``table`` as one flat C-order float64 array of this process (an in-core fit of one
        band, where a gather is an index into it), else None."""
        if self.out_of_core or self.layout.a != 0:
            return None
        spec = self.ctx.spec(table)
        if spec.backend_impl.name != "numpy":
            return None
        arr = storage.as_array(spec)
        if not isinstance(arr, np.ndarray) or arr.dtype != np.float64 or not arr.flags.c_contiguous:
            return None
        return arr.reshape(-1)

    def gather(self, flat: np.ndarray, table: Table = THETABAR) -> np.ndarray:
        """Values of ``table`` (default ``thetabar``) at global flat indices ``flat``.

        One task per A-band that holds some of them; each reads only those cells
        (out of core: only the chunks holding them), never a whole band.
        """
        flat = np.asarray(flat, np.int64)
        if flat.size == 0:
            return np.zeros(0)
        if self.layout.a == 0:  # one band (in core): one task reads them all, in order
            part, = self.executor.run(task_gather, [(self.ctx, table, flat)])
            self.gathers += 1
            return np.asarray(part, np.float64)
        band, _ = global_to_band(self.layout, "A", flat)
        keys = np.unique(band)
        sel = [np.nonzero(band == b)[0] for b in keys]
        parts = self.executor.run(task_gather, [(self.ctx, table, flat[ix]) for ix in sel])
        self.gathers += 1
        out = np.empty(flat.size)
        out[np.concatenate(sel)] = np.concatenate(parts)
        return out

    def top_candidates(self, k: int, scan: ScanResult | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` append candidates with the lowest second-order cost change
        ``r_y - (t - d)^2 / (2 (1 - t^2))`` over the whole table (``y = 0`` excluded,
        the support not): ``(flat indices, scores)``, best first.  One read pass, or none
        when ``scan`` (a scan of the table as it is now) kept at least ``k`` per band
        (``joint`` of :meth:`resync_scan`)."""
        if scan is not None and scan.joint_k >= k:
            flat, score = np.asarray(scan.joint_pos, np.int64), np.asarray(scan.joint_score, np.float64)
        else:
            parts = self._run("A", task_top_candidates, lambda i: (self.ctx, i, int(k)), reduce=False)
            flat = np.concatenate([p[0] for p in parts])
            score = np.concatenate([p[1] for p in parts])
        order = np.lexsort((flat, score))[:k]
        return flat[order], score[order]


#: Whole tables each kind of band pass reads plus writes (for ``Engine.bytes_moved``).
_TABLES_MOVED = {task_fill: 1, task_fill_and_uniform_duals: 2, task_uniform_duals: 1, task_map: 2, task_partner: 2,
                 task_update_scan: 3,
                 task_update_many: 3}
