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

from .validation import MAX_VARIABLES, format_count

__all__ = ["Layout", "Plan", "PlanError", "plan", "min_memory", "parse_bytes", "format_bytes", "parse_cards",
           "TABLES", "TASK_FACTOR", "BASE_OVERHEAD", "MAX_CHUNKS", "PASSES_PER_TERM", "Duration", "estimate_duration",
           "TERM_SECONDS", "TERM_TABLE_COPIES"]

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
#: Most chunks (chunk files) of one table: a fit's three tables stay under ~100,000 files,
#: and per-chunk overhead stays small against the data moved.  A memory limit that needs
#: more chunks is refused with the limit that fits (``min_memory``).
MAX_CHUNKS = 2**15

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


#: Passes over the tables per term of the final model, as measured out of core
#: (docs/benchmarks.md, section 4): several steps per pass at the default stopping rule
#: (0.075-0.137 on binary tables of 2^24-2^30 cells, 0.152 on a mixed network of
#: 2-6-valued variables; 0.15 is taken) and one step per pass (1.7-1.8).
PASSES_PER_TERM = {"several steps per pass": 0.15, "one step per pass": 1.7}
#: The learner's own work per term of the final model that does not grow with the table
#: (candidate lists, corrective phases, the penalty scale's sub-fits), seconds; and the work
#: on the tables per term, in units of one copy of the table at the machine's memory speed.
#: Fitted to the default fits of the 2-core VM (``docs/benchmarks.md``, "How long a fit
#: takes": 2^22 to 2^28 cells and a 12-variable survey-like table), each within 1.5x.
TERM_SECONDS = 0.03
TERM_TABLE_COPIES = 8.7


class PlanError(ValueError):
    """An infeasible or malformed plan request; the message says what would fit."""


def parse_bytes(value: int | float | str | None) -> int | None:
    """``"4GiB"``, ``"500 MB"``, ``2**30`` -> bytes (``None`` stays ``None``).

    >>> parse_bytes("4GiB"), parse_bytes("1.5 GB"), parse_bytes(1024)
    (4294967296, 1500000000, 1024)
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise PlanError(f"a byte size must be a number or a size such as '4GiB', got {value!r}")
    if isinstance(value, (int, float)) or hasattr(value, "__index__") or hasattr(value, "__float__"):
        try:
            v = float(value)
        except (TypeError, ValueError, OverflowError):
            v = math.inf
        if not (v > 0 and math.isfinite(v)):
            raise PlanError(f"a byte size must be a positive, finite number, got {value!r}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise PlanError(f"cannot read {value!r} as a size; use e.g. '4GiB', '512MiB', '100GB'")
    n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not (n >= 1 and math.isfinite(n)):
        raise PlanError(f"a byte size must be at least 1 byte, got {value!r}")
    return int(n)


def format_bytes(n: float) -> str:
    """Human-readable binary size.

    >>> format_bytes(3 * 2**30)
    '3.00 GiB'
    """
    if n >= 2**70:  # beyond any disk: a power of two (a float could overflow)
        return f"2^{math.log2(n):.1f} B"
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
        m = re.fullmatch(r"(\d{1,30})(?:x(\d{1,30}))?", part)
        if not m:
            raise PlanError(f"cannot read cardinalities {part!r}; use e.g. '2x20,3x4' or '2,3,4'")
        k, rep = int(m.group(1)), int(m.group(2) or 1)
        if k < 1:
            raise PlanError(f"a cardinality must be >= 1, got {k}")
        if len(out) + rep > MAX_VARIABLES:
            raise PlanError(f"{len(out) + rep:,} variables; the limit is {MAX_VARIABLES:,} variables")
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

    def report(self, extra: Sequence[tuple[str, str]] = (), names: Sequence[str] | None = None) -> str:
        """The plan as a readable table (like ``opt_einsum.contract_path``'s report); ``extra``
        rows (name, text) go before the verdict; ``names``: the variables' names (default
        ``X0, X1, ...``)."""
        L = self.layout

        def _span(axes):
            return _span_of(axes, names)

        log2 = sum(math.log2(k) for k in L.cards)
        head = (f"fsll-ooc plan: {len(L.cards)} variables, |X| = {format_count(L.cards)} cells"
                + (f" (2^{log2:.1f})" if log2 < 128 else "") + f", {self.dtype}")
        if self.task_bytes == 0 and not self.feasible:  # a table beyond the limits: nothing was planned
            return "\n".join([head, "  verdict  INFEASIBLE"] + [f"  ! {p}" for p in self.problems])
        rows = [
            ("layout", "in core (one chunk)" if L.in_core and not self.out_of_core else
             f"out of core: A-bands fix {_span(range(L.a))}, chunks hold {_span(range(L.c, len(L.cards)))}"
             if L.a > 0 else "out of core, one band"),
            ("chunk shape", "(" + ",".join(map(str, L.chunk_shape)) + ")"),
            ("chunk size", f"{self.chunk_elements:,} cells = {format_bytes(self.chunk_elements * self.itemsize)}"),
            ("chunks / table", f"{L.size // self.chunk_elements:,} (at most {MAX_CHUNKS:,})"),
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
            *extra,
            ("verdict", "FEASIBLE" if self.feasible else "INFEASIBLE"),
        ]
        w = max(len(r[0]) for r in rows)
        lines = [head] + [f"  {k:<{w}}  {v}" for k, v in rows]
        lines += [f"  ! {p}" for p in self.problems]
        return "\n".join(lines)


def _span_of(axes: Sequence[int], names: Sequence[str] | None = None) -> str:
    """Compact variable list: ``X0, X6..X25`` (or the variables' ``names``)."""
    if not axes:
        return "none"
    nm = (lambda i: str(names[i])) if names is not None else (lambda i: f"X{i}")
    runs, start, prev = [], axes[0], axes[0]
    for a in list(axes[1:]) + [None]:
        if a is not None and a == prev + 1:
            prev = a
            continue
        runs.append(nm(start) if start == prev else f"{nm(start)}..{nm(prev)}")
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


def _advise_bytes(n: int) -> str:
    """A size string that :func:`parse_bytes` reads back as at least ``n`` bytes, rounded up
    to two decimals of a binary unit (advice must never round down below what is needed).

    >>> _advise_bytes(2**30 + 1), parse_bytes(_advise_bytes(2**30 + 1)) > 2**30
    ('1.01GiB', True)
    """
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            break
    else:
        return f"{max(int(n), 1)}B"
    hundredths = -(-int(n) * 100 // size)
    while parse_bytes(f"{hundredths / 100:.2f}{unit}") < n:
        hundredths += 1
    return f"{hundredths / 100:.2f}{unit}"


def _cut_points(cards: tuple) -> list:
    """Cut positions worth trying: 0 and every position right after a variable with two or
    more categories (positions after constant variables give the same products)."""
    return [0] + [i + 1 for i, k in enumerate(cards) if k > 1]


def _layouts(cards: tuple, size: int):
    """Every ``(chunks, a, c, A-band, B-band)`` within the chunk bounds (``MIN_CHUNK_HARD``,
    ``MAX_CHUNKS``), independent of memory; at most ~41^2/2 of them (``size <= MAX_CELLS``)."""
    cuts = _cut_points(cards)
    n = len(cards)
    suffix = [1] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] * cards[i]
    floor = min(MIN_CHUNK_HARD, size)
    for a in cuts:
        lead = size // suffix[a]
        for c in cuts:
            if c < a:
                continue
            chunk = suffix[c]
            if chunk < floor:
                break
            if size // chunk > MAX_CHUNKS:
                continue
            yield size // chunk, a, c, suffix[a], (lead * chunk if a > 0 else 0), chunk


def _choose(cards: tuple, size: int, band_max: int):
    """The layout within ``band_max`` elements per band with the fewest chunks of at most
    ``MAX_CHUNK`` elements (then the fewest bands); None when there is none."""
    best = None
    for count, a, c, A, B, chunk in _layouts(cards, size):
        if A > band_max or B > band_max:
            continue
        key = (chunk > MAX_CHUNK, count if chunk <= MAX_CHUNK else -count, a, c)
        if best is None or key < best[0]:
            best = (key, a, c)
    return None if best is None else (best[1], best[2])


def _band_max(mem: int, workers: int, itemsize: int) -> int:
    """Band elements that one task may hold within ``mem`` (see ``_costs``)."""
    budget = int(mem * (1 - IO_HEADROOM)) - BASE_OVERHEAD
    return max(budget // (workers * TASK_FACTOR * itemsize), 0)


def min_memory_band(cards: tuple, size: int) -> int:
    """The smallest band (elements) of any layout within the chunk bounds."""
    return min(max(A, B) for _, _, _, A, B, _ in _layouts(cards, size))


def min_memory(cards: Sequence[int], *, itemsize: int = 8, workers: int = 2, out_of_core: bool | None = True) -> int:
    """The smallest ``memory_limit`` (bytes) at which :func:`plan` finds a feasible layout
    (memory only: disk is not considered), out of core, in core (``False``) or either (``None``).

    >>> m = min_memory((2,) * 26)
    >>> plan((2,) * 26, memory_limit=m, out_of_core=True).feasible
    True
    >>> plan((2,) * 26, memory_limit=m - 1, out_of_core=True).feasible
    False
    """
    cards = tuple(int(k) for k in cards)
    size = _prod(cards)
    in_core = BASE_OVERHEAD + (TABLES + 1) * size * itemsize
    if out_of_core is False:
        return in_core
    if out_of_core is None:
        return min(in_core, min_memory(cards, itemsize=itemsize, workers=workers))
    band = min_memory_band(cards, size)
    need = int((BASE_OVERHEAD + workers * TASK_FACTOR * itemsize * band) / (1 - IO_HEADROOM))
    need = max(need - 2, 1)
    while _band_max(need, workers, itemsize) < band:  # exact, whatever the float rounding did
        need += 1
    return need


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

    Total: any request is answered at once (at most a few thousand candidate layouts are
    looked at).  Raises :class:`PlanError` for malformed input (more than ``MAX_VARIABLES``
    variables, a cardinality below 1); an infeasible problem returns a plan with
    ``feasible=False`` and ``problems`` saying what would fit, and taking that advice (a
    memory limit, a disk size) gives a feasible plan.  A table is cut into at most
    ``MAX_CHUNKS`` chunks.
    """
    from .validation import MAX_CATEGORIES, MAX_CELLS

    if isinstance(cards, (str, bytes)):
        raise PlanError(f"cardinalities must be a sequence of integers, got {cards!r}")
    cards = list(cards)
    if len(cards) > MAX_VARIABLES:
        raise PlanError(f"{len(cards):,} variables; the limit is {MAX_VARIABLES:,} variables")
    try:
        cards = tuple(int(k) for k in cards)
    except (TypeError, ValueError, OverflowError) as e:
        raise PlanError(f"cardinalities must be integers: {e}") from None
    if not cards:
        raise PlanError("need at least one variable")
    bad = [(i, k) for i, k in enumerate(cards) if k < 1]
    if bad:
        raise PlanError(f"cardinality of X{bad[0][0]} must be >= 1, got {bad[0][1]}")
    if dtype not in ("float64", "float32"):
        raise PlanError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    itemsize = 8 if dtype == "float64" else 4
    mem = parse_bytes(memory_limit)
    disk = None if disk_free is None else 0 if (not isinstance(disk_free, (bool, str)) and disk_free == 0) \
        else parse_bytes(disk_free)  # a full disk has 0 bytes free
    workers = max(1, int(workers))
    problems: list[str] = []
    too_many = [(i, k) for i, k in enumerate(cards) if k > MAX_CATEGORIES]
    log2_size = sum(math.log2(k) for k in cards)
    if too_many:
        problems.append(f"X{too_many[0][0]} has {too_many[0][1]:,} categories; the limit is "
                        f"{MAX_CATEGORIES:,} (2**16) categories per variable")
    if log2_size > 41 or _prod(cards) > MAX_CELLS:
        problems.append(f"the joint table has {format_count(cards)} cells; a fit's limit is 2**40 = {MAX_CELLS:,} cells")
    if problems:  # nothing else is meaningful: a layout of an impossible table is not planned
        L = Layout(cards, 0, 0)
        return Plan(L, itemsize, mem, disk, workers, bool(out_of_core), 0, 0, 0, 0, 0, False, tuple(problems))
    size = _prod(cards)

    in_core_peak = BASE_OVERHEAD + (TABLES + 1) * size * itemsize
    auto = out_of_core is None
    if out_of_core is None:
        out_of_core = mem is not None and in_core_peak > mem

    if layout is not None:
        L = Layout(cards, int(layout[0]), int(layout[1]))
    elif not out_of_core:
        L = Layout(cards, 0, 0)
    else:
        if mem is None:  # no limit: split only big tables, into a few bands for parallel passes
            band_max = min(2**31, max(size // 4, MAX_CHUNK))
            band_max = max(band_max, min_memory_band(cards, size))
        else:
            band_max = _band_max(mem, workers, itemsize)
        choice = _choose(cards, size, band_max)
        if choice is None:
            need = min_memory(cards, itemsize=itemsize, workers=workers, out_of_core=None if auto else True)
            problems.append(
                f"no chunk layout of this table fits the memory limit (bands of at most {band_max:,} cells, "
                f"chunks of at least {min(MIN_CHUNK_HARD, size):,} cells, at most {MAX_CHUNKS:,} chunks per "
                f"table); use memory_limit >= {_advise_bytes(need)}")
            choice = _choose(cards, size, max(_band_max(need, workers, itemsize),
                                              min_memory_band(cards, size)))  # the layout of the advice
        L = Layout(cards, *choice)
    task, peak, dsk, per_iter, worst = _costs(L, itemsize, workers, out_of_core)
    if mem is not None and peak > mem and not problems:
        if not out_of_core:
            problems.append(f"in-core tables need {format_bytes(peak)} but memory_limit is {format_bytes(mem)}; "
                            f"give a store (out of core) or use memory_limit >= {_advise_bytes(peak)}")
        else:  # an explicit layout
            problems.append(f"peak memory {format_bytes(peak)} exceeds memory_limit {format_bytes(mem)}; "
                            f"use memory_limit >= {_advise_bytes(peak)}")
    if out_of_core and disk is not None and dsk > disk:
        problems.append(f"the store needs {format_bytes(dsk)} of disk but only {format_bytes(disk)} is free "
                        f"(disk_free >= {_advise_bytes(dsk)})")
    return Plan(L, itemsize, mem, disk, workers, bool(out_of_core), task, peak, dsk, per_iter, worst,
                not problems, tuple(problems))




@dataclass(frozen=True)
class Duration:
    """How long the passes of a fit take at given speeds (see :func:`estimate_duration`)."""

    read_bytes: int
    write_bytes: int
    read_speed: float
    write_speed: float
    source: str
    batched_by_default: bool = False
    table_bytes: int = 0
    memory_speed: float | None = None
    out_of_core: bool = False

    def fit_seconds(self, terms: int) -> float | None:
        """Estimated wall time of a default fit ending with ``terms`` terms: the learner's
        work (:data:`TERM_SECONDS` and :data:`TERM_TABLE_COPIES` table copies at the memory
        speed, per term) and, out of core, the passes' I/O, whichever is longer (they
        overlap).  None without a memory speed."""
        if not self.memory_speed:
            return None
        work = terms * (TERM_SECONDS + TERM_TABLE_COPIES * self.table_bytes / self.memory_speed)
        if not self.out_of_core:
            return work
        per_term = PASSES_PER_TERM["several steps per pass" if self.batched_by_default else "one step per pass"]
        return max(work, self.seconds(terms, per_term))

    @property
    def seconds_per_pass(self) -> float:
        return self.read_bytes / self.read_speed + self.write_bytes / self.write_speed

    def seconds(self, terms: int, passes_per_term: float) -> float:
        """Seconds for a model of ``terms`` terms at ``passes_per_term``."""
        return terms * passes_per_term * self.seconds_per_pass

    def rows(self) -> list:
        """Report rows: the speeds, a pass, and 100 terms under each assumption."""
        when = {True: "the default here", False: "epsilon=1e-4 or batch=False" if self.batched_by_default
                else "batch=True"}
        order = sorted(PASSES_PER_TERM.items(), key=lambda kv: (kv[0] == "several steps per pass")
                       != self.batched_by_default)
        per = "; ".join(f"{_duration(self.seconds(100, k))} at {k} passes/term, {how} "
                        f"({when[(how == 'several steps per pass') == self.batched_by_default]})"
                        for how, k in order)
        fit = self.fit_seconds(100)
        estimate = [] if fit is None else [
            ("fit estimate / 100 terms", f"{_duration(fit)} for a default fit (the learner's work per term at this "
                                         f"machine's memory speed{', or the passes over the disk' if self.out_of_core else ''}; "
                                         "models of tables of 2^20 cells and more have some 150-250 terms)")]
        return [("speed", f"{self.write_speed / 1e6:,.0f} MB/s write, {self.read_speed / 1e6:,.0f} MB/s read "
                          f"({self.source})"),
                ("time / pass", f"{_duration(self.seconds_per_pass)} ({format_bytes(self.read_bytes)} read, "
                                f"{format_bytes(self.write_bytes)} written)"),
                ("time / 100 terms", per)] + estimate


def estimate_duration(p: Plan, read_speed: float, write_speed: float, source: str = "given",
                      batched_by_default: bool = False, memory_speed: float | None = None) -> Duration:
    """The time of a fit's passes under plan ``p`` at ``read_speed`` and ``write_speed``
    (bytes per second: the disk's out of core, the memory's in core).

    A typical pass reads ``dbar`` and ``thetabar`` and writes ``thetabar``
    (``bytes_per_iteration``: two thirds read, one third written).  Compute and the
    learner's own work come on top, so in core this is a lower bound.
    ``batched_by_default`` says whether the default learner takes several steps per pass
    on this table (the caller asks the learner: :func:`fsll_ooc.learn.batch.resolve_batch`).
    ``memory_speed`` (bytes per second of a copy in memory) adds :meth:`Duration.fit_seconds`,
    the estimate of a whole default fit.

    >>> d = estimate_duration(plan((2,) * 30, memory_limit="4GiB"), 100e6, 50e6)
    >>> round(d.seconds_per_pass, 1)  # 16 GiB read at 100 MB/s + 8 GiB written at 50 MB/s
    343.6
    """
    if not (read_speed > 0 and write_speed > 0):
        raise PlanError(f"speeds must be positive, got {read_speed!r} and {write_speed!r}")
    third = p.bytes_per_iteration // 3
    return Duration(2 * third, third, float(read_speed), float(write_speed), source, bool(batched_by_default),
                    p.layout.size * p.itemsize, memory_speed, bool(p.out_of_core))


def _duration(seconds: float) -> str:
    """``about 3.2 h`` / ``about 12 min`` / ``about 40 s``."""
    if seconds >= 2 * 86400:
        return f"about {seconds / 86400:.1f} days"
    if seconds >= 5400:
        return f"about {seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds:.2g} s" if seconds < 10 else f"about {seconds:.0f} s"
