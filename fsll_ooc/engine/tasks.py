"""Band tasks: the work of one band in one pass, and the small picklable :class:`Context`
they run in.

Every task is a module-level function ``task_*(ctx, ...)`` (dask pickles it by name)
that reads and writes whole bands of the tables through :mod:`fsll_ooc.storage` and
returns a :class:`ScanResult` (or a few arrays), which the engine reduces with
:func:`combine`.  The tables are named by :class:`Table`.
"""
from __future__ import annotations

import enum
import math
import threading
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .. import basis, kernels, storage
from ..kernels import bandops, threadpool
from ..kernels.transform import transform_sparse
from ..planner import Layout
from .bands import band_geometry, band_key, band_vars, fixed_digits, local_to_global, xor_mask, xor_perm

__all__ = ["Table", "DBAR", "THETABAR", "SCRATCH", "Context", "ScanResult", "Step", "combine", "uniform_dual_vector",
           "task_fill", "task_fill_and_uniform_duals", "task_uniform_duals", "task_map", "task_update_scan",
           "task_partner", "task_gather",
           "task_top_candidates", "task_update_many", "second_order_top"]


class Table(enum.IntEnum):
    """The tables of a fit (all of shape ``cards``, C order), by their index in ``Context.specs``.

    * ``DBAR``: targets ``<Phi_y>_q`` of the smoothed empirical distribution (fixed);
    * ``THETABAR``: duals ``<Phi_y>_{p_theta}`` (updated every iteration);
    * ``SCRATCH``: intermediate of two-pass updates, exact re-derivations and output.
    """

    DBAR = 0
    THETABAR = 1
    SCRATCH = 2


#: The members as module constants: a global lookup costs less than ``Table.X`` in per-pass code.
DBAR, THETABAR, SCRATCH = Table.DBAR, Table.THETABAR, Table.SCRATCH


# ----------------------------------------------------------------------------- results

@dataclass
class ScanResult:
    """Best append candidate of some bands, and the current duals/targets at the support."""

    best: float = math.inf
    pos: int = -1
    t: float = 0.0
    d: float = 0.0
    supp_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    supp_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    supp_d: np.ndarray = field(default_factory=lambda: np.zeros(0))
    total: float = 0.0  # sums reduced by some passes (normalisers)
    # the best append candidates of a batch pass (:func:`task_update_many`): global flat
    # positions and exact cost changes, unsorted across bands
    top_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    top_delta: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # a joint selection's candidates taken by the same scan (``joint`` of :func:`task_update_many`):
    # each band's ``joint_k`` best cells by second-order score (:func:`second_order_top`), unsorted
    joint_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    joint_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    joint_k: int = 0


def combine(a: ScanResult, b: ScanResult) -> ScanResult:
    """Merge two partial results; ties go to the lower flat position (dense argmin order)."""
    if b.pos >= 0 and (a.pos < 0 or b.best < a.best or (b.best == a.best and b.pos < a.pos)):
        best, pos, t, d = b.best, b.pos, b.t, b.d
    else:
        best, pos, t, d = a.best, a.pos, a.t, a.d
    return ScanResult(best, pos, t, d,
                      np.concatenate([a.supp_pos, b.supp_pos]),
                      np.concatenate([a.supp_t, b.supp_t]),
                      np.concatenate([a.supp_d, b.supp_d]),
                      a.total + b.total,
                      np.concatenate([a.top_pos, b.top_pos]),
                      np.concatenate([a.top_delta, b.top_delta]),
                      np.concatenate([a.joint_pos, b.joint_pos]),
                      np.concatenate([a.joint_score, b.joint_score]),
                      max(a.joint_k, b.joint_k))


@dataclass(frozen=True)
class Step:
    """A change of one parameter: ``theta_y += delta`` where ``thetabar_y`` was ``t``."""

    digits: tuple[int, ...]
    delta: float
    t: float

    @property
    def axes(self) -> tuple[int, ...]:
        return tuple(i for i, v in enumerate(self.digits) if v != 0)



@dataclass(frozen=True)
class Context:
    """Everything a band task needs; small and picklable (sent to dask workers)."""

    layout: Layout
    specs: tuple  # TableSpecs indexed by Table
    r0: float
    w: tuple[float, ...]
    threads: bool = False  # may a task's transforms use several threads (bands run one at a time)?
    _cache: dict = field(default_factory=dict, compare=False, repr=False)  # geometry and band facts, once each

    @property
    def cards(self) -> tuple[int, ...]:
        return self.layout.cards

    def spec(self, table: Table):
        """The :class:`fsll_ooc.storage.TableSpec` of ``table``."""
        return self.specs[table]

    def geometry(self, kind: str):
        """The :class:`~fsll_ooc.engine.bands.BandGeometry` of this context's bands of ``kind``."""
        g = self._cache.get(kind)
        if g is None:  # once per context and kind: hashing cards and w on every task costs more
            L = self.layout
            g = self._cache[kind] = band_geometry(L.cards, L.a, L.c, kind, self.w)
        return g

    def __getstate__(self):
        # the partner buffers held in core (:func:`_make_partner`) stay with this process
        state = dict(self.__dict__)
        state["_cache"] = {k: v for k, v in self._cache.items() if not (type(k) is tuple and k[:1] == ("partner",))}
        return state

    def band(self, kind: str, idx: int) -> tuple[tuple, float]:
        """``(key, r_const)`` of band ``idx`` of ``kind``: its index expression in the table and
        the part of the penalty its fixed digits contribute (with ``r0``); once per context."""
        b = self._cache.get((kind, idx))
        if b is None:
            b = self._cache[(kind, idx)] = (band_key(self.layout, kind, idx), _r_const(self, kind, idx))
        return b


def _r_const(ctx: Context, kind: str, idx: int) -> float:
    return ctx.r0 + sum(ctx.w[v] for v, x in fixed_digits(ctx.layout, kind, idx).items() if x != 0)


def _transform_band(band: np.ndarray, positions: Sequence[int], transpose: bool, parallel: bool = False,
                    nonzero: np.ndarray | None = None, needed: np.ndarray | None = None) -> None:
    """In-place transform of the n-D band array along band axes ``positions``; ``parallel``:
    on several threads (only when no other band task runs at the same time).  ``nonzero``
    (the band is ``+0.0`` outside these flat positions) or ``needed`` (only these flat
    positions are read afterwards): :func:`fsll_ooc.kernels.transform.transform_sparse`,
    the same bits with only the work they need."""
    if positions:
        transform_sparse(band, axes=tuple(positions), transpose=transpose, nonzero=nonzero, needed=needed,
                         parallel=parallel)


def _positions(ctx: Context, kind: str, vars_: Sequence[int]) -> list[int]:
    bv = band_vars(ctx.layout, kind)
    return [bv.index(v) for v in vars_]


# ----------------------------------------------------------------------------- band tasks

def task_fill(ctx: Context, kind: str, idx: int, table: Table | None, local: np.ndarray, values: np.ndarray,
              ops: tuple) -> ScanResult:
    """Build a band from sparse ``(local, values)`` and apply ``ops``; write it to ``table``
    (``None``: nothing is written, the result is the ops' sum and the cells they read off).

    ``ops``: see :func:`_apply_ops`.
    """
    shape = ctx.geometry(kind).shape
    key = band_key(ctx.layout, kind, idx)
    band = _sparse_band(ctx, shape, local, values, None if table is None else ctx.specs[table], key)
    taken: list = []
    total = _apply_ops(ctx, kind, band, ops, taken, nonzero=local)
    if table is not None:
        storage.write(ctx.specs[table], key, band)
    return _with_taken(ScanResult(total=total), taken)


def _sparse_band(ctx: Context, shape: tuple, local: np.ndarray, values: np.ndarray, spec=None,
                 key: tuple | None = None) -> np.ndarray:
    """A band of zeros plus ``values`` at ``local`` (flat, band order; repeated positions
    add up, as ``np.add.at``).  With ``spec`` (the table the band will be written to) whose
    band is a view of the table itself (in core), that view is filled and returned: the
    write is then a no-op and no band is allocated.  A large band is zeroed on every thread
    (``ctx.threads``)."""
    n = threadpool.num_threads() if ctx.threads else 1
    band = None
    if spec is not None and spec.backend_impl.supports_inplace_views and not spec.backend_impl.persistent:
        view = storage.read(spec, key)
        if not view.flags.owndata and view.flags.c_contiguous and view.flags.writeable:
            band = view.reshape(shape)
            bandops.zero_fill(band.reshape(-1), n)
    if band is None:
        if n > 1 and math.prod(shape) >= bandops.PARALLEL_MIN:
            band = np.empty(shape)
            bandops.zero_fill(band.reshape(-1), n)
        else:
            band = np.zeros(shape)
    flat = band.reshape(-1)
    if len(local):
        bandops.scatter_add(flat, local, values)
    return band


def uniform_dual_vector(k: int) -> np.ndarray:
    """``T`` of the uniform distribution on ``k`` values."""
    v = np.zeros(k)
    v[0] = 1.0
    if not basis.is_walsh(k):
        v[1:] = 2.0 / k - 1.0
    return v


def task_uniform_duals(ctx: Context, kind: str, idx: int) -> ScanResult:
    """Write the duals of the uniform distribution into this band of ``thetabar``."""
    shape = ctx.geometry(kind).shape
    scale = 1.0
    for v, x in fixed_digits(ctx.layout, kind, idx).items():
        scale *= uniform_dual_vector(ctx.cards[v])[x]
    vars_ = band_vars(ctx.layout, kind)
    if all(basis.is_walsh(ctx.cards[v]) for v in vars_):
        # every factor is e_0: the same numbers as the outer product, zeros signed like it
        # (in memory: written into the table's band itself)
        band = _sparse_band(ctx, shape, np.zeros(0, np.int64), np.zeros(0), ctx.specs[THETABAR],
                            band_key(ctx.layout, kind, idx))
        if math.copysign(1.0, scale) < 0:
            band.reshape(-1)[:] = -0.0
        band.reshape(-1)[0] = scale
    else:
        band = np.full((), scale)
        for v in vars_:
            band = np.multiply.outer(band, uniform_dual_vector(ctx.cards[v]))
    storage.write(ctx.specs[THETABAR], band_key(ctx.layout, kind, idx), np.ascontiguousarray(band))
    return ScanResult()


def task_fill_and_uniform_duals(ctx: Context, kind: str, idx: int, table: Table, local: np.ndarray,
                                values: np.ndarray, ops: tuple) -> ScanResult:
    """:func:`task_uniform_duals` and :func:`task_fill` of the same band in one task (a new
    fit's setup: the duals of ``theta = 0`` and the targets, in one pass)."""
    task_uniform_duals(ctx, kind, idx)
    return task_fill(ctx, kind, idx, table, local, values, ops)


def task_map(ctx: Context, kind: str, idx: int, src: Table, dst: Table, ops: tuple) -> ScanResult:
    """Read a band of ``src``, apply ``ops``, write it to ``dst``."""
    key = band_key(ctx.layout, kind, idx)
    shape = ctx.geometry(kind).shape
    band = storage.read(ctx.specs[src], key)
    if band.base is not None and ctx.specs[src].backend_impl.supports_inplace_views and src != dst:
        band = band.copy()
    band = band.reshape(shape)
    taken: list = []
    total = _apply_ops(ctx, kind, band, ops, taken)
    storage.write(ctx.specs[dst], key, band)
    return _with_taken(ScanResult(total=total), taken)


def _with_taken(res: ScanResult, taken: list) -> ScanResult:
    """``res`` with the cells read off by ``("take", ...)`` ops in ``supp_pos`` / ``supp_t``."""
    if taken:
        res.supp_pos = np.concatenate([k for k, _ in taken])
        res.supp_t = np.concatenate([v for _, v in taken])
    return res


_ELEMENTWISE = frozenset(("exp", "sum", "normalize", "scale", "add"))


def _apply_ops(ctx: Context, kind: str, band: np.ndarray, ops: tuple, taken: list | None = None,
               parallel: bool | None = None, nonzero: np.ndarray | None = None) -> float:
    """Apply ``ops`` to ``band`` in place, in order; returns the last sum taken (0.0 if none).

    ``("T", vars, transpose)``: the transform (``T^T`` with ``transpose``) along ``vars``;
    ``("T", vars, transpose, "taken")``: the same, but computed only where the ``take`` ops
    that must follow it (and nothing else) read (the rest of the band is left unspecified);
    ``("exp", shift)``: ``exp(band - shift)``; ``("sum",)``: the sum; ``("normalize",)``:
    divide by the sum (one band only); ``("scale", c)``, ``("add", c)``: times / plus ``c``;
    ``("take", local, keys)``: read off the band's cells ``local`` (flat, band order) as they
    are at that point, appended to ``taken`` as ``(keys, values)``.

    ``parallel`` (default ``ctx.threads``: the band is its pass's only task): a large band's
    transforms, and its runs of elementwise ops and sums (:func:`fsll_ooc.kernels.bandops.elementwise`,
    numpy's bits), on every thread of :mod:`fsll_ooc.kernels.threadpool`.  ``nonzero``: the
    band is ``+0.0`` outside these flat positions (a band built from sparse values): a
    first transform skips the fibres that hold only zeros (the same bits).
    """
    if parallel is None:
        parallel = ctx.threads
    total = 0.0
    split = parallel and band.size >= bandops.PARALLEL_MIN and band.flags.c_contiguous
    i = 0
    while i < len(ops):
        op = ops[i]
        if split and op[0] in _ELEMENTWISE:
            j = i
            while j < len(ops) and ops[j][0] in _ELEMENTWISE:
                j += 1
            s = bandops.elementwise(band.reshape(-1), ops[i:j], threadpool.num_threads())
            if s is not None:
                total = s
            i, nonzero = j, None
            continue
        if op[0] == "T":
            needed = None
            if len(op) > 3 and op[3] == "taken":
                rest = ops[i + 1:]
                if not rest or any(o[0] != "take" for o in rest):
                    raise ValueError(f"a transform computed only where it is read must be followed by reads only: "
                                 f"{ops!r}")
                needed = np.concatenate([np.asarray(o[1], np.int64) for o in rest])
            _transform_band(band, _positions(ctx, kind, op[1]), op[2], parallel, nonzero, needed)
        elif op[0] == "exp":
            band -= op[1]
            np.exp(band, out=band)
        elif op[0] == "sum":
            total = float(band.sum())
        elif op[0] == "normalize":
            s = float(band.sum())
            total = s
            band /= s
        elif op[0] == "scale":
            band *= op[1]
        elif op[0] == "add":
            band += op[1]
        elif op[0] == "take":
            taken.append((np.asarray(op[2], np.int64), band.reshape(-1)[op[1]].copy()))
        else:  # pragma: no cover
            raise ValueError(f"unknown op {op!r}")
        if op[0] != "take":
            nonzero = None  # the band is no longer zero outside it
        i += 1
    return total


#: Band tasks read the targets of their band on a background thread while they read (and,
#: for a re-derivation's last pass, transform) the duals (:func:`fsll_ooc.storage.read_ahead`):
#: the disk keeps a read in flight while the task computes.  Same bands, same memory.
READ_AHEAD = True


def _open_band(ctx: Context, kind: str, idx: int, source: tuple | None = None, sums: list | None = None):
    """``(key, r_const, geometry, t, d, in_place, skip)`` of band ``idx``: its duals ``t`` and
    targets ``d`` as ``(P, Q)`` arrays (``in_place``: ``t`` is a view of the table itself).
    ``source = (table, ops)``: the duals are ``table``'s band after ``ops`` (:func:`_apply_ops`),
    a new array (the caller writes it to ``thetabar``); ``source = (None, ops, local, values)``:
    the band is built from the sparse ``(local, values)`` (as :func:`task_fill` does, nothing
    read) before ``ops``.  The sum the ops take is appended to ``sums``.  The targets are
    read ahead (:data:`READ_AHEAD`) while the duals are read; an error in either is raised
    here once both reads have ended."""
    key, r_const = ctx.band(kind, idx)
    geom = ctx.geometry(kind)
    spec_d = ctx.specs[DBAR]
    ahead = storage.read_ahead(spec_d, key) if READ_AHEAD and spec_d.backend_impl.persistent else None
    try:
        if source is None:
            t = storage.read(ctx.specs[THETABAR], key)
            in_place = ctx.specs[THETABAR].backend_impl.supports_inplace_views and not t.flags.owndata
        else:
            nonzero = None
            if source[0] is None:
                t = _sparse_band(ctx, geom.shape, source[2], source[3], ctx.specs[THETABAR], key)
                nonzero = source[2]
            else:
                spec_s = ctx.specs[source[0]]
                t = storage.read(spec_s, key)
                if spec_s.backend_impl.supports_inplace_views and not t.flags.owndata:
                    t = t.copy()  # a view of the source table: work on a copy, the source stays clean
                t = t.reshape(geom.shape)
            total = _apply_ops(ctx, kind, t, source[1], nonzero=nonzero)
            if sums is not None:
                sums.append(total)
            in_place = False
    except BaseException:
        storage.settle(ahead)
        raise
    t = t.reshape(geom.P, geom.Q)
    d = (storage.read(spec_d, key) if ahead is None else ahead.result()).reshape(geom.P, geom.Q)
    skip = 0 if idx == 0 else -1  # y = 0 is the first cell of band 0 of either kind
    return key, r_const, geom, t, d, in_place, skip


def _update_band(ctx: Context, kind: str, key, geom, t, d, r_const, step: Step, partner_src: Table,
                 partner_vars: tuple, threshold: float, skip: int, parallel: bool, partner=None):
    """The fused update of band ``t`` by ``step`` and its scan against ``threshold``: ``(best, pos)``.
    ``partner``: the band of ``partner_src`` being read ahead (a future), if it is not ``thetabar``."""
    L = ctx.layout
    shape, j, P, Q, rP, rQ = geom
    ch, sh = math.cosh(step.delta), math.sinh(step.delta)
    inv_den = 1.0 / (ch + sh * step.t)
    bv = band_vars(L, kind)
    walsh = all(basis.is_walsh(L.cards[v]) for v in partner_vars)
    if partner_src == THETABAR and walsh:
        flipsP = [(bv.index(v), step.digits[v]) for v in partner_vars if bv.index(v) < j]
        flipsQ = [(bv.index(v) - j, step.digits[v]) for v in partner_vars if bv.index(v) >= j]
        mp, mq = xor_mask(shape[:j], flipsP), xor_mask(shape[j:], flipsQ)
        if mp is not None and mq is not None:
            return kernels.update_scan_xor(t, d, rP, rQ, r_const, mp, mq, ch, sh, inv_den, threshold=threshold,
                                           skip=skip, parallel=parallel)
        return kernels.update_scan_perm(t, d, rP, rQ, r_const, xor_perm(shape[:j], flipsP),
                                        xor_perm(shape[j:], flipsQ), ch, sh, inv_den, threshold=threshold,
                                        skip=skip, parallel=parallel)
    if partner_src == THETABAR:
        src = t
    else:
        src = partner.result() if partner is not None else storage.read(ctx.specs[partner_src], key)
    part = _make_partner(ctx, src, shape, bv, step, partner_vars, parallel).reshape(P, Q)
    return kernels.update_scan_explicit(t, part, d, rP, rQ, r_const, ch, sh, inv_den, update=True,
                                        threshold=threshold, skip=skip, parallel=parallel)


def _make_partner(ctx: Context, src: np.ndarray, shape: tuple, bv: tuple, step: Step, partner_vars: tuple,
                  parallel: bool, hold: bool | None = None) -> np.ndarray:
    """``M(partner_vars) src``: the product rule (:func:`fsll_ooc.basis.apply_product`) along the
    band axes of ``partner_vars`` in their order, with ``step``'s digits, as a flat C-order array.

    One compiled walk per axis (:func:`fsll_ooc.kernels.bandops.partner_into`, the same bits;
    on every thread with ``parallel``), into buffers that ``hold`` keeps in the context for the
    next steps (default: in core, the tables not persistent: at most two arrays of the band's
    size per thread that runs update tasks, for the context's life, instead of one or two new
    arrays per step whose pages the system maps afresh each time).  While its kernel compiles
    in a second process (the first use after installing), numpy's operations
    (:func:`fsll_ooc.basis.apply_product`)."""
    if not bandops.pm_kernels_ready():
        part = src.reshape(shape)
        for v in partner_vars:
            part = basis.apply_product(part, bv.index(v), step.digits[v])
        return np.ascontiguousarray(part).reshape(-1)
    axes = [(bv.index(v), step.digits[v], basis.is_walsh(ctx.cards[v])) for v in partner_vars]
    n = int(src.size)
    two = sum(1 for _, b, _ in axes if b != 0) > 1
    if hold is None:
        hold = not ctx.specs[THETABAR].backend_impl.persistent
    if hold:
        key = ("partner", threading.get_ident())
        bufs = ctx._cache.get(key)
        if bufs is None or bufs[0].size != n or (two and bufs[1] is None):
            bufs = ctx._cache[key] = (np.empty(n), np.empty(n) if two else None)
        out, tmp = bufs
    else:
        out, tmp = np.empty(n), (np.empty(n) if two else None)
    flat = src.reshape(-1)
    if not flat.flags.c_contiguous:  # pragma: no cover - bands are contiguous
        flat = np.ascontiguousarray(flat)
    return bandops.partner_into(flat, shape, axes, out, tmp, threadpool.num_threads() if parallel else 1)


def task_update_scan(ctx: Context, kind: str, idx: int, step: Step | None, partner_src: Table,
                     partner_vars: tuple, supp_local: np.ndarray, supp_global: np.ndarray,
                     parallel: bool) -> ScanResult:
    """Fused dual update (if ``step``) and candidate scan of one band (the partner band of a
    two-pass update read ahead with the duals and targets)."""
    spec_p = ctx.specs[partner_src]
    partner = (storage.read_ahead(spec_p, ctx.band(kind, idx)[0])
               if step is not None and partner_src != THETABAR and READ_AHEAD and spec_p.backend_impl.persistent
               else None)
    try:
        key, r_const, geom, t, d, in_place, skip = _open_band(ctx, kind, idx)
    except BaseException:
        storage.settle(partner)
        raise
    if step is None:
        best, pos = kernels.update_scan_explicit(t, None, d, geom.rP, geom.rQ, r_const, update=False, skip=skip,
                                                 parallel=parallel)
    else:
        best, pos = _update_band(ctx, kind, key, geom, t, d, r_const, step, partner_src, partner_vars, 0.0, skip,
                                 parallel, partner)
        if not in_place:
            storage.write(ctx.specs[THETABAR], key, t.reshape(geom.shape))
    tf, df = t.reshape(-1), d.reshape(-1)
    out = ScanResult(supp_pos=supp_global, supp_t=tf[supp_local].copy(), supp_d=df[supp_local].copy())
    if pos >= 0:
        out.best, out.t, out.d = float(best), float(tf[pos]), float(df[pos])
        out.pos = int(local_to_global(ctx.layout, kind, idx, pos))
    return out


def task_update_many(ctx: Context, kind: str, idx: int, steps: tuple, supp_local: np.ndarray,
                     supp_global: np.ndarray, top: int, parallel: bool, multiplier=None,
                     source: tuple | None = None, joint: int = 0) -> ScanResult:
    """Several dual updates of one band (docs/design.md, "Several terms per pass"), then a scan.

    ``steps``: factors ``cosh + sinh Phi_y`` whose variables are all local to this kind of
    band, applied in the order given; or ``multiplier = (V, m)``: the band becomes
    ``T_V(m * T_V(band))`` (Walsh-Hadamard variables ``V``).  The scan reports the best
    append candidate and the ``top`` best by exact cost change (:func:`fsll_ooc.kernels.top_appends`).
    ``source = (table, ops)`` or ``(None, ops, local, values)``: the band's duals are first
    made from ``table``'s band (or from sparse values) by ``ops`` and written to ``thetabar``
    (the last pass of an exact re-derivation, then its scan; ``total``: the ops' sum).
    ``joint``: also the band's ``joint`` best cells by second-order score
    (:func:`second_order_top`, a joint selection's candidates; ``joint_pos``/``joint_score``).
    """
    L = ctx.layout
    sums: list = []
    key, r_const, geom, t, d, in_place, skip = _open_band(ctx, kind, idx, source, sums)
    if multiplier is not None:
        V, m = multiplier
        band = t.reshape(geom.shape)
        pos = _positions(ctx, kind, V)
        _transform_band(band, pos, False, parallel)
        bshape = [1] * len(geom.shape)
        for p_, v in zip(pos, V):
            bshape[p_] = L.cards[v]
        band *= np.asarray(m, np.float64).reshape(bshape)
        _transform_band(band, pos, False, parallel)
    for step in steps:  # the fused kernels with a threshold no cell beats: updates only
        _update_band(ctx, kind, key, geom, t, d, r_const, step, THETABAR, step.axes, -math.inf, skip, parallel)
    if (steps or multiplier is not None or source is not None) and not in_place:
        storage.write(ctx.specs[THETABAR], key, t.reshape(geom.shape))
    val, pos = kernels.top_appends_threads(t, d, geom.rP, geom.rQ, r_const, max(int(top), 1), skip,
                                           threadpool.num_threads() if parallel else 1)
    used = pos >= 0
    val, pos = val[used], pos[used]
    tf, df = t.reshape(-1), d.reshape(-1)
    out = ScanResult(supp_pos=supp_global, supp_t=tf[supp_local].copy(), supp_d=df[supp_local].copy(),
                     top_pos=local_to_global(L, kind, idx, pos), top_delta=val.copy(),
                     total=sums[0] if sums else 0.0)
    if joint > 0:
        out.joint_pos, out.joint_score = second_order_top(ctx, kind, idx, t, d, int(joint))
        out.joint_k = int(joint)
    if len(pos):
        out.best, out.t, out.d = float(val[0]), float(tf[pos[0]]), float(df[pos[0]])
        out.pos = int(out.top_pos[0])
    return out


def task_partner(ctx: Context, kind: str, idx: int, step: Step, vars_: tuple) -> ScanResult:
    """First half of a two-pass update: ``scratch = M(vars_) thetabar`` on this band."""
    key = band_key(ctx.layout, kind, idx)
    shape = ctx.geometry(kind).shape
    band = storage.read(ctx.specs[THETABAR], key)
    part = _make_partner(ctx, band, shape, band_vars(ctx.layout, kind), step, vars_, False, hold=False)
    storage.write(ctx.specs[SCRATCH], key, part.reshape(shape))
    return ScanResult()


def task_gather(ctx: Context, table: Table, flat: np.ndarray) -> np.ndarray:
    """Read the cells ``flat`` (global C-order indices) of ``table``: a gather task."""
    return storage.gather(ctx.specs[table], flat)


def task_top_candidates(ctx: Context, idx: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best cells of A-band ``idx`` by ``r - (t - d)^2 / (2 (1 - t^2))``: (global flat, score)."""
    key = band_key(ctx.layout, "A", idx)
    shape, j, P, Q, rP, rQ = ctx.geometry("A")
    t = storage.read(ctx.specs[THETABAR], key).reshape(P, Q)
    d = storage.read(ctx.specs[DBAR], key).reshape(P, Q)
    return second_order_top(ctx, "A", idx, t, d, k)


#: :func:`second_order_top` scores this many cells per piece of work (a piece keeps its ``k``
#: best; the pieces run on every thread in core).
SCORE_BLOCK = 2**18


def second_order_top(ctx: Context, kind: str, idx: int, t: np.ndarray, d: np.ndarray,
                     k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best cells of band ``idx`` of ``kind`` (duals ``t``, targets ``d``, ``(P, Q)``)
    by ``r - (t - d)^2 / (2 (1 - t^2))`` (``y = 0`` scored ``+inf``; ties to the lowest position):
    (global flat, score), by blocks of rows of about :data:`SCORE_BLOCK` cells, each keeping its
    ``k`` best (:func:`fsll_ooc.kernels.second_order_lowest`; read only; on every thread with
    ``ctx.threads``)."""
    L = ctx.layout
    shape, j, P, Q, rP, rQ = ctx.geometry(kind)
    rows = max(1, SCORE_BLOCK // max(Q, 1))
    r_const = _r_const(ctx, kind, idx)
    starts = range(0, P, rows)
    keep_pos, keep_score = [None] * len(starts), [None] * len(starts)

    def block(b):
        p0 = starts[b]
        skip = 0 if idx == 0 and p0 == 0 else -1
        keep_score[b], keep_pos[b] = kernels.second_order_lowest(t[p0:p0 + rows], d[p0:p0 + rows], rP[p0:p0 + rows],
                                                                 rQ, r_const, int(k), np.int64(skip))
        keep_pos[b] = keep_pos[b] + p0 * Q

    # the blocks on every thread when the band is its pass's only task (in core): each block's
    # numbers and choice are the same, kept in block order
    threadpool.parallel_for(threadpool.num_threads() if ctx.threads else 1, len(starts), block)
    pos, score = np.concatenate(keep_pos), np.concatenate(keep_score)
    local = np.lexsort((pos, score))[:k]  # by score, ties to the lowest position
    return local_to_global(L, kind, idx, pos[local]), score[local].copy()
