"""How :func:`fsll_ooc.kernels.transform.transform_inplace` transforms a table: the
transform planner (pure Python, no numba; cached).

A table's axes are cut into *groups* of adjacent axes (:func:`_groups`): the innermost
group is done in contiguous blocks, each outer group in gathered tiles.  Each group
becomes one *pass* over memory with a *program*: rows of fused butterfly sweeps
(radix 2, 4 or 8, chosen by a small cost model, :func:`_chunk_stages`) and +-1 rows, in
the reference's order of operations.  :func:`plan` returns the :class:`TransformPlan`
for a shape; :meth:`TransformPlan.describe` prints it.  The kernels that run a plan
live in :mod:`fsll_ooc.kernels.transform`.
"""
from __future__ import annotations

import operator
from functools import lru_cache

import numpy as np

__all__ = ["TransformPlan", "plan", "plan_for", "axis_index", "R2", "R4", "R8", "PMF", "PMT", "C_SPAN", "C_PAT",
           "NCOL"]

# Cache budgets (each core has 1.25 MiB of L2): the innermost group is done in
# contiguous blocks of at most _BLOCK_BYTES, an outer group in gathered tiles of at
# most _TILE_BYTES whose rows are at least _MIN_ROW_BYTES long (short rows make the
# gather latency-bound: the prefetchers need long contiguous runs).
_BLOCK_BYTES = 1 << 20
_TILE_BYTES = 1 << 18
_MIN_ROW_BYTES = 2048
_PAD_BYTES = 64

# Program rows: (kind, h, k, o_1 .. o_7, span, pattern), strides/offsets in rows of the
# group (multiplied by the tile pitch before use).  A radix-r row transforms the fibres
# x[b + j + o_k], k < r, j < h, of each block of span = r*h elements: butterflies
# between positions k and k ^ 2^t for t = 0, 1, ..: the offsets o_k put the stages in
# the reference's order.  pattern: 1 = strides ascending (o_k = k h), 2 = descending
# (bit-reversed), 0 = other.  A +-1 row: h = stride, k = cardinality.
R2, R4, R8, PMF, PMT = 0, 1, 2, 3, 4
C_SPAN, C_PAT = 10, 11
NCOL = 12


class TransformPlan:
    """How :func:`transform_inplace` transforms one table: a list of passes over
    memory, each with a program (see :meth:`describe`)."""

    def __init__(self, shape, axes, transpose, itemsize, passes, progs, info):
        self.shape = shape
        self.axes = axes
        self.transpose = transpose
        self.itemsize = itemsize
        self.passes = passes  # uint64 (npass, 9): R, C, w, gather, p0, p1, ntiles, pad, blocks/tile
        self.progs = progs    # uint64 (nrows, NCOL): kind, h, k, o_1 .. o_7, span, pattern
        self.info = info      # per pass: dict(R, C, w, gather, tiles, rows)

    @property
    def npasses(self) -> int:
        return len(self.info)

    def describe(self) -> str:
        names = {R2: "r2", R4: "r4", R8: "r8", PMF: "pm", PMT: "pmT"}
        lines = [f"shape={self.shape} axes={self.axes} transpose={self.transpose} "
                 f"itemsize={self.itemsize}: {self.npasses} pass(es)"]
        for k, d in enumerate(self.info):
            ks = " ".join(f"{names[r[0]]}{'' if r[0] >= PMF or r[0] == R2 else '.ad*'[r[C_PAT]]}@{r[1]}"
                          + (f"(k={r[2]})" if r[0] >= PMF else "") for r in d["rows"])
            lines.append(f"  pass {k}: {'gather' if d['gather'] else 'in place'} R={d['R']} "
                         f"C={d['C']} w={d['w']} tiles={d['tiles']}: {ks}")
        return "\n".join(lines)


def _units(shape, axes):
    """Outer -> inner ``[size, kind]``: "N" untouched, "W" Walsh, "P" +-1 (size 1 dropped)."""
    units = []
    for i, k in enumerate(shape):
        if k == 1:
            continue
        kind = "N" if i not in axes else ("W" if k & (k - 1) == 0 else "P")
        if kind == "N" and units and units[-1][1] == "N":
            units[-1][0] *= k
        else:
            units.append([k, kind])
    return units


def _groups(units, block, tile, wmin):
    """Cut the units into groups, innermost first: list of (members outer->inner, C, R)
    with C the extent inside the group and R the group's extent (its rows).  The first
    group fits ``block`` elements; later ones ``tile`` elements with rows of at least
    ``min(C, wmin)``."""
    units = [list(u) for u in units]
    groups = []
    i = len(units) - 1
    C = 1
    while i >= 0:
        d, kind = units[i]
        if kind == "N":
            C *= d
            i -= 1
            continue
        cap = max(1, (block if C == 1 else tile) // min(C, wmin))
        members = []
        R = 1
        while i >= 0:
            d, kind = units[i]
            if R * d <= cap:
                members.append((d, kind))
                R *= d
                i -= 1
                continue
            if kind == "W" and 2 * R <= cap:
                b = (cap // R).bit_length() - 1  # split the axis: its low 2^b fit
                members.append((1 << b, "W"))
                R <<= b
                units[i][0] = d >> b
                break
            if not members:  # one +-1 axis larger than the block: alone
                members.append((d, kind))
                R *= d
                i -= 1
            break
        while members[-1][1] == "N":  # untouched axes at the outer edge stay outside
            d, _ = members.pop()
            R //= d
            i += 1
        members.reverse()
        groups.append((members, C, R))
        C *= R
    return groups


def _program(members, transpose, unit):
    """Program rows for one group, in the reference's order of operations.  ``unit``:
    elements per group row when the program runs (tile pitch, or C in place)."""
    strides = []
    s = 1
    for d, _ in reversed(members):
        strides.append(s)
        s *= d
    strides.reverse()
    steps = []  # ("W", h) or ("P", k, h)
    for (d, kind), st in zip(members, strides):
        if kind == "W":
            steps += [("W", st << b) for b in range(d.bit_length() - 1)]
        elif kind == "P":
            steps.append(("P", d, st))
    rows = []
    i = 0
    while i < len(steps):
        if steps[i][0] == "P":
            k, h = steps[i][1], steps[i][2]
            row = [0] * NCOL
            row[0], row[1], row[2], row[C_SPAN] = (PMT if transpose else PMF), h, k, h * k
            rows.append(tuple(row))
            i += 1
            continue
        j = i
        while j < len(steps) and steps[j][0] == "W":
            j += 1
        rows += _chunk_stages([st[1] for st in steps[i:j]], unit)
        i = j
    return rows


def _radix_cost(m, h, pattern):
    """Cycles per element of one radix-2^m sweep at stride h (elements), as measured on
    an L2-resident block (Xeon, AVX-512 machine; only the ranking matters)."""
    if m == 1:
        return 3.0 if h < 4 else (0.9 if h < 8 else 0.5)
    if m == 2:
        return 1.1 if h < 16 else (0.7 if h < 32 else (0.58 if h < 64 else 0.53))
    if h < 8:
        return 1.45
    if h == 8 and pattern:
        return 0.51  # the constant-stride kernels
    return 1.04 if h < 32 else (0.8 if h < 64 else (0.66 if h < 128 else 0.57))


def _pattern(seq):
    """1: strides ascending (h0, 2 h0, ..), 2: descending, 0: other order."""
    h0 = min(seq)
    up = [h0 << t for t in range(len(seq))]
    return 1 if seq == up else (2 if seq == up[::-1] else 0)


def _chunk_stages(hs, unit):
    """Fuse a sequence of butterfly stages (strides ``hs`` in rows, in the order they must
    run) into radix-2/4/8/16 rows.  A row takes consecutive stages whose strides are
    ``h0 * 2^j`` (j < m, any order): offsets o_k = sum_t bit_t(k) * hs[t] make the
    kernel's t-th stage the t-th of the sequence, so the order (and rounding) is kept.
    The split minimises ``_radix_cost`` (dynamic programming)."""
    L = len(hs)
    best = [0.0] * (L + 1)
    choice = [0] * (L + 1)
    for a in range(L - 1, -1, -1):
        best[a] = float("inf")
        for m in range(1, 4):
            if a + m > L:
                break
            seq = hs[a:a + m]
            h0 = min(seq)
            if sorted(seq) != [h0 << t for t in range(m)]:
                continue
            c = _radix_cost(m, h0 * unit, _pattern(seq)) + best[a + m]
            if c < best[a] - 1e-12:
                best[a], choice[a] = c, m
    rows = []
    a = 0
    while a < L:
        m = choice[a]
        seq = hs[a:a + m]
        h0 = min(seq)
        offs = [sum(seq[t] for t in range(m) if k >> t & 1) for k in range(1 << m)]
        row = [0] * NCOL
        row[0], row[1] = {1: R2, 2: R4, 3: R8}[m], h0
        row[3:3 + len(offs) - 1] = offs[1:]
        row[C_SPAN], row[C_PAT] = h0 << m, _pattern(seq)
        rows.append(tuple(row))
        a += m
    return rows


@lru_cache(maxsize=256)
def _plan_cached(shape, axes, itemsize, budgets, transpose):
    block_bytes, tile_bytes, row_bytes, pad_bytes = budgets
    pad = pad_bytes // itemsize
    block = max(16, block_bytes // itemsize)
    tile = max(16, tile_bytes // itemsize)
    wmin = max(1, row_bytes // itemsize)
    units = _units(shape, set(axes))
    groups = _groups(units, block, tile, wmin) if units else []
    total = 1
    for k in shape:
        total *= k
    passes, progs, info = [], [], []
    for members, C, R in reversed(groups):  # outer groups first: the reference's order
        if all(kind == "N" for _, kind in members):
            continue
        O = total // (R * C)
        m = 1
        if R * C <= block or C < 8:
            # in place; a tile takes several consecutive blocks when they are small
            gather, w = 0, C
            m = max(1, min(O, block // (R * C)))
            tiles = -(-O // m)
        else:
            gather, w = 1, min(C, wmin)
            while 2 * w * R <= tile and 2 * w <= C:
                w *= 2
            tiles = O * (-(-C // w))
        rows = _program(members, transpose, w + pad if gather else C)
        p0 = len(progs)
        progs += rows
        passes.append((R, C, w, gather, p0, len(progs), tiles, pad if gather else 0, m))
        info.append(dict(R=R, C=C, w=w, gather=gather, tiles=tiles, rows=rows))
    passes_a = np.array(passes, dtype=np.uint64).reshape(-1, 9)
    progs_a = np.array(progs, dtype=np.uint64).reshape(-1, NCOL)
    passes_a.setflags(write=False)
    progs_a.setflags(write=False)
    return TransformPlan(shape, axes, transpose, itemsize, passes_a, progs_a, info)


def _budgets():
    return (_BLOCK_BYTES, _TILE_BYTES, _MIN_ROW_BYTES, _PAD_BYTES)


def axis_index(ax, ndim):
    """``ax`` as a non-negative axis of an ``ndim``-dimensional array (numpy's AxisError if out of range)."""
    ax = operator.index(ax)
    if not -ndim <= ax < ndim:
        raise np.exceptions.AxisError(ax, ndim)
    return ax % ndim


def plan(shape, axes=None, transpose: bool = False, itemsize: int = 8) -> TransformPlan:
    """The plan :func:`transform_inplace` follows for a table of ``shape``."""
    shape = tuple(int(k) for k in shape)
    ax = range(len(shape)) if axes is None else axes
    ax = tuple(sorted({axis_index(a, len(shape)) for a in ax}))
    return _plan_cached(shape, ax, int(itemsize), _budgets(), bool(transpose))


def plan_for(shape: tuple, axes: tuple, itemsize: int, transpose: bool) -> TransformPlan:
    """:func:`plan` for a shape of ints and sorted, distinct, non-negative ``axes`` (no checks)."""
    return _plan_cached(shape, axes, itemsize, _budgets(), transpose)
