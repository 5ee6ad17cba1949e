"""The table passes of a fit, over banded stores: the execution layer.

The learner (:mod:`fsll_ooc.learn`) speaks in terms of whole tables ("compute the
targets", "apply this step and scan for candidates", "re-derive the duals exactly");
this module turns each request into band tasks over the layout chosen by the
planner, runs them with an executor and reduces their results.  In core is the same
code with one band.

Tables (all of shape ``cards``, C order):

* ``dbar``: targets ``<Phi_y>_q`` of the smoothed empirical distribution (fixed);
* ``thetabar``: duals ``<Phi_y>_{p_theta}`` (updated every iteration);
* ``scratch``: intermediate of two-pass updates, exact re-derivations and output.
"""
from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .. import basis, kernels, storage
from ..executors import Executor
from ..planner import Layout

__all__ = ["Engine", "ScanResult", "Step"]

try:  # compiled cache-blocked transforms, when available
    from ..kernels.transform import transform_inplace as _fast_transform
except Exception:  # pragma: no cover - optional acceleration
    _fast_transform = None


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
                      a.total + b.total)


@dataclass(frozen=True)
class Step:
    """A change of one parameter: ``theta_y += delta`` where ``thetabar_y`` was ``t``."""

    digits: tuple[int, ...]
    delta: float
    t: float

    @property
    def axes(self) -> tuple[int, ...]:
        return tuple(i for i, v in enumerate(self.digits) if v != 0)


# ----------------------------------------------------------------------------- bands

@dataclass(frozen=True)
class Context:
    """Everything a band task needs; small and picklable (sent to dask workers)."""

    layout: Layout
    specs: tuple  # (dbar, thetabar, scratch) TableSpecs
    r0: float
    w: tuple[float, ...]
    threads: bool = False  # may a task's transforms use several threads (bands run one at a time)?

    @property
    def cards(self) -> tuple[int, ...]:
        return self.layout.cards


D, TB, SCR = 0, 1, 2

#: Smallest band for which the fused update + scan runs on several threads (the caller
#: and the helpers of :mod:`fsll_ooc.kernels.threadpool`, taking blocks of rows as they come).
#: Only when the band is the only task of its pass (in core); several bands run as
#: concurrent tasks and keep one thread each.  Measured on 2 cores
#: (docs/benchmarks.md section 3): 1.5-2x faster per pass at 2^20 on an idle machine,
#: and close to one thread with another program busy on the other core (a static split
#: in halves, numba's ``prange``, was 3x slower there).  One and two threads break even
#: at 2^18 cells (0.33 ms); below, waking a helper costs more than it saves (2^16:
#: 89 us on one thread, 157 us on two).
PARALLEL_SCAN_MIN_CELLS = 2**19


def band_vars(layout: Layout, kind: str) -> tuple[int, ...]:
    return layout.a_axes if kind == "A" else layout.b_axes


def band_fixed_vars(layout: Layout, kind: str) -> tuple[int, ...]:
    return tuple(range(layout.a)) if kind == "A" else tuple(range(layout.a, layout.c))


def n_bands(layout: Layout, kind: str) -> int:
    return layout.n_a_bands if kind == "A" else layout.n_b_bands


def band_key(layout: Layout, kind: str, idx: int) -> tuple:
    fixed_vars = band_fixed_vars(layout, kind)
    digits = np.unravel_index(idx, [layout.cards[v] for v in fixed_vars]) if fixed_vars else ()
    digits = tuple(int(x) for x in digits)
    if kind == "A":
        return digits if digits else (Ellipsis,)
    return (slice(None),) * layout.a + digits


def fixed_digits(layout: Layout, kind: str, idx: int) -> dict[int, int]:
    fixed_vars = band_fixed_vars(layout, kind)
    if not fixed_vars:
        return {}
    digits = np.unravel_index(idx, [layout.cards[v] for v in fixed_vars])
    return {v: int(x) for v, x in zip(fixed_vars, digits)}


@functools.lru_cache(maxsize=64)
def _band_geometry(cards: tuple, a: int, c: int, kind: str, w: tuple):
    """(band shape, split j, P, Q, rP, rQ) for the 2-D ``(P, Q)`` view of a band."""
    layout = Layout(cards, a, c)
    vars_ = band_vars(layout, kind)
    shape = tuple(cards[v] for v in vars_)
    j = len(shape)
    q = 1
    while j > 0 and q * shape[j - 1] <= 2**14:
        j -= 1
        q *= shape[j]
    if j == len(shape) and j > 0:  # a single huge last axis
        j -= 1
    P = int(np.prod(shape[:j], dtype=np.int64))
    Q = int(np.prod(shape[j:], dtype=np.int64))

    def rsum(vs):
        out = np.zeros([cards[v] for v in vs]) if vs else np.zeros(())
        for ax, v in enumerate(vs):
            sh = [1] * len(vs)
            sh[ax] = cards[v]
            out = out + (w[v] * (np.arange(cards[v]) != 0)).reshape(sh)
        return np.ascontiguousarray(out.reshape(-1))

    return shape, j, P, Q, rsum(vars_[:j]), rsum(vars_[j:])


def _geometry(ctx: Context, kind: str):
    L = ctx.layout
    return _band_geometry(L.cards, L.a, L.c, kind, ctx.w)


def _r_const(ctx: Context, kind: str, idx: int) -> float:
    return ctx.r0 + sum(ctx.w[v] for v, x in fixed_digits(ctx.layout, kind, idx).items() if x != 0)


def local_to_global(layout: Layout, kind: str, idx: int, local: np.ndarray | int) -> np.ndarray:
    """Band-local flat positions -> global flat indices of the table."""
    local = np.asarray(local, dtype=np.int64)
    if kind == "A":
        return local if idx == 0 else idx * layout.a_band_elements + local
    vars_ = band_vars(layout, kind)
    cards = layout.cards
    digits = np.unravel_index(local, [cards[v] for v in vars_])
    full = [None] * len(cards)
    for v, dg in zip(vars_, digits):
        full[v] = dg
    for v, x in fixed_digits(layout, kind, idx).items():
        full[v] = np.full(local.shape, x, dtype=np.int64)
    return np.ravel_multi_index(full, cards).astype(np.int64)


def global_to_band(layout: Layout, kind: str, flat: np.ndarray):
    """Global flat indices -> (band index, band-local position) arrays."""
    flat = np.asarray(flat, dtype=np.int64)
    if kind == "A":
        if layout.a == 0:  # one band: the table itself
            return np.zeros_like(flat), flat
        be = layout.a_band_elements
        return flat // be, flat % be
    cards = layout.cards
    digits = np.unravel_index(flat, cards)
    fv = band_fixed_vars(layout, kind)
    bv = band_vars(layout, kind)
    band = np.ravel_multi_index([digits[v] for v in fv], [cards[v] for v in fv]) if fv else np.zeros_like(flat)
    local = np.ravel_multi_index([digits[v] for v in bv], [cards[v] for v in bv]) if bv else np.zeros_like(flat)
    return np.asarray(band, np.int64), np.asarray(local, np.int64)


def _transform_band(band: np.ndarray, positions: Sequence[int], transpose: bool, parallel: bool = False) -> None:
    """In-place transform of the n-D band array along band axes ``positions``; ``parallel``:
    on several threads (only when no other band task runs at the same time)."""
    if not positions:
        return
    if _fast_transform is not None:
        _fast_transform(band, axes=tuple(positions), transpose=transpose, parallel=parallel)
        return
    for ax in positions:
        basis.transform_axis(band, ax, transpose=transpose, out=band)


def _positions(ctx: Context, kind: str, vars_: Sequence[int]) -> list[int]:
    bv = band_vars(ctx.layout, kind)
    return [bv.index(v) for v in vars_]


# ----------------------------------------------------------------------------- band tasks

def task_fill(ctx: Context, kind: str, idx: int, table: int, local: np.ndarray, values: np.ndarray,
              ops: tuple, ) -> ScanResult:
    """Build a band from sparse ``(local, values)`` and apply ``ops``; write it to ``table``.

    ``ops`` is a sequence of ``("T", vars, transpose)``, ``("exp", shift)``,
    ``("normalize",)`` (one band only) and ``("sum",)``.
    """
    shape, *_ = _geometry(ctx, kind)
    band = np.zeros(shape)
    if len(local):
        np.add.at(band.reshape(-1), local, values)
    total = _apply_ops(ctx, kind, band, ops)
    storage.write(ctx.specs[table], band_key(ctx.layout, kind, idx), band)
    return ScanResult(total=total)


def uniform_dual_vector(k: int) -> np.ndarray:
    """``T`` of the uniform distribution on ``k`` values."""
    v = np.zeros(k)
    v[0] = 1.0
    if not basis.is_walsh(k):
        v[1:] = 2.0 / k - 1.0
    return v


def task_uniform_duals(ctx: Context, kind: str, idx: int) -> ScanResult:
    """Write the duals of the uniform distribution into this band of ``thetabar``."""
    shape, *_ = _geometry(ctx, kind)
    scale = 1.0
    for v, x in fixed_digits(ctx.layout, kind, idx).items():
        scale *= uniform_dual_vector(ctx.cards[v])[x]
    vars_ = band_vars(ctx.layout, kind)
    if all(basis.is_walsh(ctx.cards[v]) for v in vars_):
        # every factor is e_0: the same numbers as the outer product, zeros signed like it
        band = np.zeros(shape) if math.copysign(1.0, scale) > 0 else np.full(shape, -0.0)
        band.reshape(-1)[0] = scale
    else:
        band = np.full((), scale)
        for v in vars_:
            band = np.multiply.outer(band, uniform_dual_vector(ctx.cards[v]))
    storage.write(ctx.specs[TB], band_key(ctx.layout, kind, idx), np.ascontiguousarray(band))
    return ScanResult()


def task_map(ctx: Context, kind: str, idx: int, src: int, dst: int, ops: tuple) -> ScanResult:
    """Read a band of ``src``, apply ``ops``, write it to ``dst``."""
    key = band_key(ctx.layout, kind, idx)
    shape, *_ = _geometry(ctx, kind)
    band = storage.read(ctx.specs[src], key)
    if band.base is not None and ctx.specs[src].backend_impl.supports_inplace_views and src != dst:
        band = band.copy()
    band = band.reshape(shape)
    total = _apply_ops(ctx, kind, band, ops)
    storage.write(ctx.specs[dst], key, band)
    return ScanResult(total=total)


def _apply_ops(ctx: Context, kind: str, band: np.ndarray, ops: tuple) -> float:
    total = 0.0
    for op in ops:
        if op[0] == "T":
            _transform_band(band, _positions(ctx, kind, op[1]), op[2], ctx.threads)
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
        elif op[0] == "partner":
            for v, b in op[1]:
                ax = _positions(ctx, kind, [v])[0]
                band[...] = basis.apply_product(band, ax, b)
        else:  # pragma: no cover
            raise ValueError(f"unknown op {op!r}")
    return total


def task_update_scan(ctx: Context, kind: str, idx: int, step: Step | None, partner_src: int,
                     partner_vars: tuple, supp_local: np.ndarray, supp_global: np.ndarray,
                     parallel: bool) -> ScanResult:
    """Fused dual update (if ``step``) and candidate scan of one band."""
    L = ctx.layout
    key = band_key(L, kind, idx)
    shape, j, P, Q, rP, rQ = _geometry(ctx, kind)
    t = storage.read(ctx.specs[TB], key)
    in_place = ctx.specs[TB].backend_impl.supports_inplace_views and not t.flags.owndata  # a view of the table itself
    t = t.reshape(P, Q)
    d = storage.read(ctx.specs[D], key).reshape(P, Q)
    r_const = _r_const(ctx, kind, idx)
    skip = 0 if idx == 0 else -1  # y = 0 is the first cell of band 0 of either kind
    if step is None:
        best, pos = kernels.update_scan_explicit(t, None, d, rP, rQ, r_const, update=False, skip=skip,
                                                 parallel=parallel)
    else:
        ch, sh = math.cosh(step.delta), math.sinh(step.delta)
        inv_den = 1.0 / (ch + sh * step.t)
        bv = band_vars(L, kind)
        walsh = all(basis.is_walsh(L.cards[v]) for v in partner_vars)
        if partner_src == TB and walsh:
            flipsP = [(bv.index(v), step.digits[v]) for v in partner_vars if bv.index(v) < j]
            flipsQ = [(bv.index(v) - j, step.digits[v]) for v in partner_vars if bv.index(v) >= j]
            mp, mq = _xor_mask(shape[:j], flipsP), _xor_mask(shape[j:], flipsQ)
            if mp is not None and mq is not None:
                best, pos = kernels.update_scan_xor(t, d, rP, rQ, r_const, mp, mq, ch, sh, inv_den,
                                                    skip=skip, parallel=parallel)
            else:
                best, pos = kernels.update_scan_perm(t, d, rP, rQ, r_const, _xor_perm(shape[:j], flipsP),
                                                     _xor_perm(shape[j:], flipsQ), ch, sh, inv_den,
                                                     skip=skip, parallel=parallel)
        else:
            src = t if partner_src == TB else storage.read(ctx.specs[partner_src], key)
            part = src.reshape(shape)
            for v in partner_vars:
                part = basis.apply_product(part, bv.index(v), step.digits[v])
            part = np.ascontiguousarray(part).reshape(P, Q)
            best, pos = kernels.update_scan_explicit(t, part, d, rP, rQ, r_const, ch, sh, inv_den,
                                                     update=True, skip=skip, parallel=parallel)
        if not in_place:
            storage.write(ctx.specs[TB], key, t.reshape(shape))
    tf, df = t.reshape(-1), d.reshape(-1)
    out = ScanResult(supp_pos=supp_global, supp_t=tf[supp_local].copy(), supp_d=df[supp_local].copy())
    if pos >= 0:
        out.best, out.t, out.d = float(best), float(tf[pos]), float(df[pos])
        out.pos = int(local_to_global(L, kind, idx, pos))
    return out


def _xor_mask(shape: tuple, flips: list) -> int | None:
    """The flat mask ``m`` with ``flat(x with x_ax ^= b) == flat(x) ^ m`` for every cell of a
    C-order array of ``shape``, or None when there is none.

    There is one when each flipped axis and every axis after it have power-of-two
    cardinalities: the axis's stride is then a power of two and its digit owns bits
    of the flat index that no other axis touches.
    """
    return _xor_mask_cached(tuple(shape), tuple(flips))


@functools.lru_cache(maxsize=4096)
def _xor_mask_cached(shape: tuple, flips: tuple) -> int | None:
    m = 0
    for ax, b in flips:
        inner = shape[ax:]
        if any(k & (k - 1) for k in inner):
            return None
        m ^= int(b) << int(sum(int(k).bit_length() - 1 for k in inner[1:]))
    return m


def _xor_perm(shape: tuple, flips: list) -> np.ndarray:
    """Flat permutation of a C-order array of ``shape`` mapping digit ``x_ax -> x_ax ^ b``."""
    idx = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    for ax, b in flips:
        idx = np.take(idx, np.arange(shape[ax]) ^ b, axis=ax)
    return np.ascontiguousarray(idx.reshape(-1))


def task_partner(ctx: Context, kind: str, idx: int, step: Step, vars_: tuple) -> ScanResult:
    """First half of a two-pass update: ``scratch = M(vars_) thetabar`` on this band."""
    key = band_key(ctx.layout, kind, idx)
    shape, *_ = _geometry(ctx, kind)
    band = storage.read(ctx.specs[TB], key).reshape(shape)
    bv = band_vars(ctx.layout, kind)
    for v in vars_:
        band = basis.apply_product(band, bv.index(v), step.digits[v])
    storage.write(ctx.specs[SCR], key, np.ascontiguousarray(band))
    return ScanResult()


# ----------------------------------------------------------------------------- engine

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
        self.progress = False  # per-pass bars (set by the estimator when bars are shown)

    # -- helpers
    def _run(self, kind: str, fn, argfn, reduce=True):
        nb = n_bands(self.layout, kind)
        args = [argfn(i) for i in range(nb)]
        self.passes += 1
        bar = None
        if self.progress and nb >= 8 and not self.executor.distributed:
            from tqdm.auto import tqdm

            bar = tqdm(total=nb, desc=f"{getattr(fn, '__name__', 'pass')} ({kind}-bands)", unit="band",
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
    def compute_targets(self, sample_flat: np.ndarray, n_samples: int) -> None:
        """``dbar = T(q)`` with ``q = (counts + 1/|X|) / (N + 1)``: the positivity rule of
        :mod:`fsll_ooc.cost` (one pseudo-sample spread uniformly)."""
        L = self.layout
        flat, counts = np.unique(np.asarray(sample_flat, np.int64), return_counts=True)
        groups = self._group("A", flat, counts.astype(np.float64) / (n_samples + 1.0))
        empty = (np.zeros(0, np.int64), np.zeros(0))
        ops_a = (("add", 1.0 / (L.size * (n_samples + 1.0))), ("T", L.a_axes, False))

        def arg(i):
            loc, _, val = groups.get(i, (empty[0], None, empty[1]))
            return (self.ctx, "A", i, D, loc, val, ops_a)

        self._run("A", task_fill, arg)
        if L.a > 0:
            self._run("B", task_map, lambda i: (self.ctx, "B", i, D, D, (("T", tuple(range(L.a)), False),)))

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
            kind, src, pv = "B", SCR, tuple(v for v in step.axes if v < L.a)
        else:
            kind, src, pv = passes[0], TB, (step.axes if step is not None else ())
        groups = self._group(kind, support)
        par = self._parallel(kind)
        empty = np.zeros(0, np.int64)

        def arg(i):
            loc, glob, _ = groups.get(i, (empty, empty, None))
            return (self.ctx, kind, i, step, src, pv, loc, glob, par)

        return self._run(kind, task_update_scan, arg)

    def resync(self, support: np.ndarray, theta: np.ndarray, log_z: float) -> float:
        """Re-derive ``thetabar`` exactly from ``theta`` (full transforms); returns exact ``log Z``.

        ``log_z`` is the running estimate, used only to keep ``exp`` in range.
        """
        total = self._density(support, theta, log_z, SCR, forward=True)
        L = self.layout
        if L.a > 0:
            self._run("A", task_map, lambda i: (self.ctx, "A", i, SCR, TB,
                                                (("T", L.a_axes, False), ("scale", 1.0 / total))))
        return log_z + math.log(total)

    def density(self, support: np.ndarray, theta: np.ndarray, log_z: float) -> float:
        """Write ``exp(l_theta - log_z)`` into the scratch table; returns its sum."""
        return self._density(support, theta, log_z, SCR, forward=False)

    def _density(self, support, theta, log_z, dst, forward: bool) -> float:
        L = self.layout
        support = np.asarray(support, np.int64)
        theta = np.asarray(theta, np.float64)
        groups = self._group("A", support, theta)
        empty = (np.zeros(0, np.int64), None, np.zeros(0))
        if L.a == 0:
            ops = (("T", L.a_axes, True), ("exp", log_z))
            ops += (("normalize",), ("T", L.a_axes, False)) if forward else (("sum",),)
            res = self._run("A", task_fill, lambda i: (self.ctx, "A", i, TB if forward else dst,
                                                       groups.get(i, empty)[0], groups.get(i, empty)[2], ops))
            return res.total
        self._run("A", task_fill, lambda i: (self.ctx, "A", i, dst, groups.get(i, empty)[0],
                                             groups.get(i, empty)[2], (("T", L.a_axes, True),)))
        head = tuple(range(L.a))
        ops = (("T", head, True), ("exp", log_z), ("sum",))
        if forward:
            ops += (("T", head, False),)
        res = self._run("B", task_map, lambda i: (self.ctx, "B", i, dst, dst, ops))
        return res.total

    # -- fully corrective step (fsll_ooc.learn.corrective): gathers and a top-k candidate pass ------
    def gather(self, flat: np.ndarray, table: int = TB) -> np.ndarray:
        """Values of ``table`` (default ``thetabar``) at global flat indices ``flat``.

        One task per A-band that holds some of them; each reads only those cells
        (out of core: only the chunks holding them), never a whole band.
        """
        flat = np.asarray(flat, np.int64)
        if flat.size == 0:
            return np.zeros(0)
        band, _ = global_to_band(self.layout, "A", flat)
        keys = np.unique(band)
        sel = [np.nonzero(band == b)[0] for b in keys]
        parts = self.executor.run(task_gather, [(self.ctx, table, flat[ix]) for ix in sel])
        self.gathers = getattr(self, "gathers", 0) + 1
        out = np.empty(flat.size)
        out[np.concatenate(sel)] = np.concatenate(parts)
        return out

    def top_candidates(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` append candidates with the lowest second-order cost change
        ``r_y - (t - d)^2 / (2 (1 - t^2))`` over the whole table (``y = 0`` excluded,
        the support not): ``(flat indices, scores)``, best first.  One read pass."""
        parts = self._run("A", task_top_candidates, lambda i: (self.ctx, i, int(k)), reduce=False)
        flat = np.concatenate([p[0] for p in parts])
        score = np.concatenate([p[1] for p in parts])
        order = np.lexsort((flat, score))[:k]
        return flat[order], score[order]


def task_gather(ctx: Context, table: int, flat: np.ndarray) -> np.ndarray:
    """Read the cells ``flat`` (global C-order indices) of ``table``: a gather task."""
    return storage.gather(ctx.specs[table], flat)


def task_top_candidates(ctx: Context, idx: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best cells of A-band ``idx`` by ``r - (t - d)^2 / (2 (1 - t^2))``: (global flat, score)."""
    L = ctx.layout
    key = band_key(L, "A", idx)
    shape, j, P, Q, rP, rQ = _geometry(ctx, "A")
    t = storage.read(ctx.specs[TB], key).reshape(P, Q)
    d = storage.read(ctx.specs[D], key).reshape(P, Q)
    score = t - d
    del d  # at most three band buffers live (the planner's TASK_FACTOR is four)
    np.square(score, out=score)
    den = t * t  # not in place: in core ``t`` is a view of the dual table
    del t
    np.subtract(1.0, den, out=den)
    np.maximum(den, 1e-300, out=den)
    score /= den
    del den
    score *= -0.5
    score += rQ[None, :]
    score += (_r_const(ctx, "A", idx) + rP)[:, None]
    score = score.reshape(-1)
    if idx == 0:
        score[0] = np.inf
    k = min(k, score.size)
    local = np.argpartition(score, k - 1)[:k] if k < score.size else np.arange(score.size)
    return local_to_global(L, "A", idx, local), score[local].copy()
