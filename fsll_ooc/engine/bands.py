"""Band geometry: which cells of a table a band task holds, and how it views them.

A layout (:class:`fsll_ooc.planner.Layout`, cut points ``a <= c``) splits a table of
shape ``cards`` two ways.  An *A-band* fixes the variables ``0 .. a-1`` and holds
every cell of the others (it is contiguous in C order); a *B-band* fixes the
variables ``a .. c-1``.  In core (``a == 0``) the one A-band is the whole table.  A
band task sees its band as an n-D array over the band's variables
(:func:`band_vars`), and the fused update + scan as a 2-D ``(P, Q)`` array
(:func:`band_geometry`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ..planner import Layout

__all__ = ["BandGeometry", "band_vars", "band_fixed_vars", "n_bands", "band_key", "fixed_digits", "band_geometry",
           "local_to_global", "global_to_band", "xor_mask", "xor_perm"]

#: Largest ``Q`` (cells of a row of the 2-D view of a band): a row stays in the caches.
MAX_ROW_CELLS = 2**14


def band_vars(layout: Layout, kind: str) -> tuple[int, ...]:
    """The variables a band of ``kind`` (``"A"`` or ``"B"``) holds, in table order."""
    return layout.a_axes if kind == "A" else layout.b_axes


def band_fixed_vars(layout: Layout, kind: str) -> tuple[int, ...]:
    """The variables a band of ``kind`` fixes (its index enumerates their digits, C order)."""
    return tuple(range(layout.a)) if kind == "A" else tuple(range(layout.a, layout.c))


def n_bands(layout: Layout, kind: str) -> int:
    """How many bands of ``kind`` the layout has."""
    return layout.n_a_bands if kind == "A" else layout.n_b_bands


def band_key(layout: Layout, kind: str, idx: int) -> tuple:
    """The index expression of band ``idx`` of ``kind`` in the table (for :func:`fsll_ooc.storage.read`)."""
    digits = tuple(fixed_digits(layout, kind, idx).values())
    if kind == "A":
        return digits if digits else (Ellipsis,)
    return (slice(None),) * layout.a + digits


def fixed_digits(layout: Layout, kind: str, idx: int) -> dict[int, int]:
    """``{variable: digit}`` of the variables band ``idx`` of ``kind`` fixes."""
    fixed_vars = band_fixed_vars(layout, kind)
    if not fixed_vars:
        return {}
    digits = np.unravel_index(idx, [layout.cards[v] for v in fixed_vars])
    return {v: int(x) for v, x in zip(fixed_vars, digits)}


class BandGeometry(NamedTuple):
    """How a band of one kind is viewed by its tasks.

    ``shape``: the band as an n-D array (its variables' cardinalities); ``split``: the
    2-D view's rows are the first ``split`` band axes, its columns the others; ``P``,
    ``Q``: rows and columns of that view; ``rP``, ``rQ``: the separable penalty
    ``r_y = r_const + rP[p] + rQ[q]`` (``r_const`` from the band's fixed digits).
    """

    shape: tuple[int, ...]
    split: int
    P: int
    Q: int
    rP: np.ndarray
    rQ: np.ndarray


@functools.lru_cache(maxsize=64)
def band_geometry(cards: tuple, a: int, c: int, kind: str, w: tuple) -> BandGeometry:
    """The :class:`BandGeometry` of the bands of ``kind`` for layout ``(cards, a, c)`` and
    per-variable penalty weights ``w``.  Rows of the 2-D view hold at most
    :data:`MAX_ROW_CELLS` cells unless the last axis alone is longer."""
    layout = Layout(cards, a, c)
    vars_ = band_vars(layout, kind)
    shape = tuple(cards[v] for v in vars_)
    j = len(shape)
    q = 1
    while j > 0 and q * shape[j - 1] <= MAX_ROW_CELLS:
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

    return BandGeometry(shape, j, P, Q, rsum(vars_[:j]), rsum(vars_[j:]))


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


def xor_mask(shape: tuple, flips: list) -> int | None:
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


def xor_perm(shape: tuple, flips: list) -> np.ndarray:
    """Flat permutation of a C-order array of ``shape`` mapping digit ``x_ax -> x_ax ^ b``."""
    idx = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    for ax, b in flips:
        idx = np.take(idx, np.arange(shape[ax]) ^ b, axis=ax)
    return np.ascontiguousarray(idx.reshape(-1))
