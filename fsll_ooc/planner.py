"""The chunk planner: pure arithmetic from problem size and budgets to a table layout.

No I/O, no dask, no allocation: cardinalities, dtype, memory limit, free disk and
worker count in; a :class:`Plan` out (chunk shape, bands, passes, bytes moved, peak
memory, disk use) or a :class:`PlanError` that says what would fit instead.

The layout
----------
Every ``|X|`` table (``dbar``, ``thetabar`` and a scratch table) is stored with the
same chunking, described by two cut points ``0 <= a <= c <= n`` on the variables:

* a *chunk* holds variables ``c .. n-1`` whole (one index of each of ``0 .. c-1``);
* an **A-band** fixes variables ``0 .. a-1`` and holds ``a .. n-1`` whole: it is
  ``prod(k[:a])`` contiguous runs of chunks, so transforms and partner reads along
  any of the variables ``a .. n-1`` stay inside it;
* a **B-band** fixes variables ``a .. c-1`` and holds ``0 .. a-1`` and ``c .. n-1`` whole
  (a strided set of whole chunks), so variables ``0 .. a-1`` are local there.

A full transform is one pass over A-bands plus one over B-bands (the two steps of
Bailey's four-step FFT, with no separate transposition), and an iteration whose new
basis function only involves variables ``a .. n-1`` (or only ``0 .. a-1`` and
``c .. n-1``) is a single pass.  In core, ``a = c = 0``: one band, one chunk.

Example
-------
>>> p = plan((2,) * 30, memory_limit="4GiB", disk_free="100GiB", out_of_core=True)
>>> p.feasible, p.layout.a, p.layout.c, p.chunk_elements == 2 ** (30 - p.layout.c)
(True, 5, 10, True)
>>> print(p.report().splitlines()[0])
fsll-ooc plan: 30 variables, |X| = 1,073,741,824 cells (2^30.0), float64
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["Layout", "Plan", "PlanError", "plan", "parse_bytes", "format_bytes", "parse_cards",
           "TABLES", "TASK_FACTOR", "BASE_OVERHEAD"]

#: Tables kept for a fit: dbar, thetabar and one scratch table.
TABLES = 3
#: Live band-sized buffers in one task (band, targets, partner/scratch, temporaries).
TASK_FACTOR = 4
#: Resident memory of the interpreter, numpy, numba, zarr and dask before any table.
BASE_OVERHEAD = 400 * 2**20
#: Share of an out-of-core memory limit left to the page cache and I/O buffers (a cgroup
#: limit counts them too; without headroom, writeback stalls or the kernel kills the fit).
IO_HEADROOM = 0.25
#: Smallest chunk accepted (elements): below it every pass drowns in per-chunk overhead.
MIN_CHUNK_HARD = 2**12
#: Preferred largest chunk (elements).
MAX_CHUNK = 2**20

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class PlanError(ValueError):
    """An infeasible or malformed plan request; the message says what would fit."""


def parse_bytes(value: int | float | str | None) -> int | None:
    """``"4GiB"``, ``"500 MB"``, ``2**30`` -> bytes (``None`` stays ``None``).

    >>> parse_bytes("4GiB"), parse_bytes("1.5 GB"), parse_bytes(1024)
    (4294967296, 1500000000, 1024)
    """
    if value is None:
        return None
    if isinstance(value, (int, float)):
        if value <= 0:
            raise PlanError(f"a byte size must be positive, got {value!r}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise PlanError(f"cannot read {value!r} as a size; use e.g. '4GiB', '512MiB', '100GB'")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: float) -> str:
    """Human-readable binary size.

    >>> format_bytes(3 * 2**30)
    '3.00 GiB'
    """
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def parse_cards(text: str) -> tuple[int, ...]:
    """``"2x20,3x4"`` -> twenty 2s then four 3s; ``"2,3,4"`` -> (2, 3, 4).

    >>> parse_cards("2x3,5")
    (2, 2, 2, 5)
    """
    out: list[int] = []
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:x(\d+))?", part)
        if not m:
            raise PlanError(f"cannot read cardinalities {part!r}; use e.g. '2x20,3x4' or '2,3,4'")
        k, rep = int(m.group(1)), int(m.group(2) or 1)
        if k < 1:
            raise PlanError(f"a cardinality must be >= 1, got {k}")
        out.extend([k] * rep)
    if not out:
        raise PlanError("no cardinalities given")
    return tuple(out)


def _prod(xs: Sequence[int]) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p


@dataclass(frozen=True)
class Layout:
    """Cut points ``a <= c`` of the chunk layout over cardinalities ``cards`` (see module doc)."""

    cards: tuple[int, ...]
    a: int
    c: int

    def __post_init__(self) -> None:
        n = len(self.cards)
        if not (0 <= self.a <= self.c <= n):
            raise PlanError(f"layout needs 0 <= a <= c <= n={n}, got a={self.a}, c={self.c}")

    @property
    def size(self) -> int:
        return _prod(self.cards)

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        return (1,) * self.c + tuple(self.cards[self.c:])

    @property
    def n_a_bands(self) -> int:
        return _prod(self.cards[: self.a])

    @property
    def n_b_bands(self) -> int:
        return _prod(self.cards[self.a: self.c])

    @property
    def a_band_elements(self) -> int:
        return _prod(self.cards[self.a:])

    @property
    def b_band_elements(self) -> int:
        return _prod(self.cards[: self.a]) * _prod(self.cards[self.c:])

    @property
    def a_axes(self) -> tuple[int, ...]:
        """Variables local to an A-band."""
        return tuple(range(self.a, len(self.cards)))

    @property
    def b_axes(self) -> tuple[int, ...]:
        """Variables local to a B-band."""
        return tuple(range(self.a)) + tuple(range(self.c, len(self.cards)))

    @property
    def in_core(self) -> bool:
        return self.a == 0

    def passes_for(self, axes: Sequence[int]) -> tuple[str, ...]:
        """Band passes needed to apply an operator acting on variables ``axes``."""
        if self.a == 0:  # in core: an A-band holds every variable
            return ("A",)
        axes = set(axes)
        if not axes or axes <= set(self.a_axes):
            return ("A",)
        if axes <= set(self.b_axes):
            return ("B",)
        return ("A", "B")


@dataclass(frozen=True)
class Plan:
    """A chunk layout with its costs. ``report()`` prints it as a small table."""

    layout: Layout
    itemsize: int
    memory_limit: int | None
    disk_free: int | None
    workers: int
    out_of_core: bool
    task_bytes: int
    peak_memory: int
    disk_bytes: int
    bytes_per_iteration: int
    bytes_per_iteration_worst: int
    feasible: bool
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def chunk_elements(self) -> int:
        return _prod(self.layout.chunk_shape)

    @property
    def dtype(self) -> str:
        return {8: "float64", 4: "float32"}.get(self.itemsize, f"{self.itemsize}-byte float")

    def report(self) -> str:
        """The plan as a readable table (like ``opt_einsum.contract_path``'s report)."""
        L = self.layout
        size = L.size
        rows = [
            ("layout", "in core (one chunk)" if L.in_core and not self.out_of_core else
             f"out of core: A-bands fix {_span(range(L.a))}, chunks hold {_span(range(L.c, len(L.cards)))}"
             if L.a > 0 else "out of core, one band"),
            ("chunk shape", "(" + ",".join(map(str, L.chunk_shape)) + ")"),
            ("chunk size", f"{self.chunk_elements:,} cells = {format_bytes(self.chunk_elements * self.itemsize)}"),
            ("A-bands", f"{L.n_a_bands:,} x {format_bytes(L.a_band_elements * self.itemsize)} (vars {_span(L.a_axes)})"),
            ("B-bands", f"{L.n_b_bands:,} x {format_bytes(L.b_band_elements * self.itemsize)} (vars {_span(L.b_axes)})"),
            ("passes / iteration", "1 typical, 2 when the new term spans both band kinds"),
            ("passes / full transform", "1" if L.a == 0 else "2"),
            ("bytes moved / iteration", f"{format_bytes(self.bytes_per_iteration)} typical, "
                                        f"{format_bytes(self.bytes_per_iteration_worst)} worst"),
            ("workers", str(self.workers)),
            ("memory per task", format_bytes(self.task_bytes)),
            ("peak memory", format_bytes(self.peak_memory) +
             (f" of {format_bytes(self.memory_limit)} limit" if self.memory_limit else "")),
            ("disk", format_bytes(self.disk_bytes) +
             (f" of {format_bytes(self.disk_free)} free" if self.disk_free is not None else "") if self.out_of_core else "none (in memory)"),
            ("verdict", "FEASIBLE" if self.feasible else "INFEASIBLE"),
        ]
        w = max(len(r[0]) for r in rows)
        head = (f"fsll-ooc plan: {len(L.cards)} variables, |X| = {size:,} cells (2^{math.log2(size):.1f}), "
                f"{self.dtype}")
        lines = [head] + [f"  {k:<{w}}  {v}" for k, v in rows]
        lines += [f"  ! {p}" for p in self.problems]
        return "\n".join(lines)


def _span(axes: Sequence[int]) -> str:
    """Compact variable list: ``X0, X6..X25``."""
    if not axes:
        return "none"
    runs, start, prev = [], axes[0], axes[0]
    for a in list(axes[1:]) + [None]:
        if a is not None and a == prev + 1:
            prev = a
            continue
        runs.append(f"X{start}" if start == prev else f"X{start}..X{prev}")
        if a is not None:
            start = prev = a
    return ", ".join(runs)


def _costs(layout: Layout, itemsize: int, workers: int, out_of_core: bool):
    size = layout.size
    band = max(layout.a_band_elements, layout.b_band_elements if layout.a > 0 else 0)
    par = min(workers, max(layout.n_a_bands, 1)) if layout.a > 0 else 1
    task = TASK_FACTOR * band * itemsize
    peak = BASE_OVERHEAD + par * task  # process memory; the page cache comes on top (IO_HEADROOM)
    if not out_of_core:
        peak = BASE_OVERHEAD + (TABLES + 1) * size * itemsize  # tables + one band-sized temporary
    disk = TABLES * size * itemsize if out_of_core else 0
    per_iter = 3 * size * itemsize  # read thetabar and dbar, write thetabar
    worst = 6 * size * itemsize  # + scratch write and read when the update needs both band kinds
    return task, peak, disk, per_iter, worst


def plan(cards: Sequence[int], *, dtype: str = "float64", memory_limit=None, disk_free=None,
         workers: int = 2, out_of_core: bool | None = None, layout: tuple[int, int] | None = None) -> Plan:
    """Choose the chunk layout for a fit over cardinalities ``cards``.

    Parameters
    ----------
    cards : cardinalities ``k_i`` (each >= 1).
    dtype : ``"float64"`` (the only dtype fits use today; ``"float32"`` is accepted for
        what-if planning).
    memory_limit : bytes or a string like ``"4GiB"``; ``None`` means unlimited.
    disk_free : free bytes where the store goes; ``None`` skips the disk check.
    workers : tasks running at once (threads or dask workers).
    out_of_core : force (True) or forbid (False) chunked stores; ``None`` picks in core
        when the tables fit in ``memory_limit``.
    layout : explicit cut points ``(a, c)`` overriding the planner's choice.

    Raises :class:`PlanError` for malformed input; an infeasible problem returns a plan
    with ``feasible=False`` and ``problems`` saying what would fit.
    """
    cards = tuple(int(k) for k in cards)
    if not cards:
        raise PlanError("need at least one variable")
    bad = [(i, k) for i, k in enumerate(cards) if k < 1]
    if bad:
        raise PlanError(f"cardinality of X{bad[0][0]} must be >= 1, got {bad[0][1]}")
    if dtype not in ("float64", "float32"):
        raise PlanError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    itemsize = 8 if dtype == "float64" else 4
    mem = parse_bytes(memory_limit)
    disk = parse_bytes(disk_free) if disk_free is not None else None
    workers = max(1, int(workers))
    n = len(cards)
    size = _prod(cards)
    problems: list[str] = []

    in_core_peak = BASE_OVERHEAD + (TABLES + 1) * size * itemsize
    if out_of_core is None:
        out_of_core = mem is not None and in_core_peak > mem

    if layout is not None:
        L = Layout(cards, int(layout[0]), int(layout[1]))
    elif not out_of_core:
        L = Layout(cards, 0, 0)
    else:
        budget = (int(mem * (1 - IO_HEADROOM)) - BASE_OVERHEAD) if mem is not None else 2**31
        band_max = max(budget // (workers * TASK_FACTOR * itemsize), 1)
        if mem is None:  # no limit: split only big tables, into a few bands for parallel passes
            band_max = min(band_max, max(size // 4, MAX_CHUNK))
        a = 0
        while a < n and _prod(cards[a:]) > band_max:
            a += 1
        # smallest c >= a whose B-band fits, but keep chunks no larger than MAX_CHUNK
        c = a
        lead = _prod(cards[:a])
        while c < n and (lead * _prod(cards[c:]) > band_max or _prod(cards[c:]) > MAX_CHUNK):
            c += 1
        L = Layout(cards, a, c)
        if lead * _prod(cards[c:]) > band_max:
            need = TASK_FACTOR * itemsize * workers * 2 * int(math.isqrt(size)) + BASE_OVERHEAD
            problems.append(
                f"no chunk layout keeps one band within the memory limit: |X| = {size:,} cells needs bands of "
                f"about sqrt(|X|) = {math.isqrt(size):,} cells; use memory_limit >= {format_bytes(need)}"
                + (" or dtype float32" if itemsize == 8 else "") + f", or fewer workers (now {workers})")
        elif mem is not None and _prod(cards[c:]) < min(MIN_CHUNK_HARD, size):
            need = TASK_FACTOR * itemsize * workers * MIN_CHUNK_HARD * _prod(cards[:a]) + BASE_OVERHEAD
            problems.append(
                f"within this memory_limit chunks would hold only {_prod(cards[c:]):,} cells; "
                f"use memory_limit >= {format_bytes(need)} (or fewer workers, now {workers})")
    task, peak, dsk, per_iter, worst = _costs(L, itemsize, workers, out_of_core)
    if mem is not None and peak > mem:
        if not out_of_core:
            problems.append(f"in-core tables need {format_bytes(peak)} but memory_limit is {format_bytes(mem)}; "
                            "give a store (out of core) or raise memory_limit")
        elif not problems:
            problems.append(f"peak memory {format_bytes(peak)} exceeds memory_limit {format_bytes(mem)}; "
                            f"raise memory_limit to {format_bytes(peak)} or use fewer workers")
    if out_of_core and disk is not None and dsk > disk:
        problems.append(f"the store needs {format_bytes(dsk)} of disk but only {format_bytes(disk)} is free"
                        + (f"; float32 would need {format_bytes(dsk // 2)}" if itemsize == 8 else ""))
    return Plan(L, itemsize, mem, disk, workers, bool(out_of_core), task, peak, dsk, per_iter, worst,
                not problems, tuple(problems))
