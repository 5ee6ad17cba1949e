"""The fixed local bases of the FSLL model and their fast transforms (pure math).

Conventions (``docs/design.md``, "Conventions"; tests and users depend on them):

* variable ``i`` takes values ``0 .. k_i-1``; tables have shape ``(k_0, ..., k_{n-1})``
  and flatten in C order (last variable fastest);
* ``k_i = 2**m``: Walsh-Hadamard basis in Sylvester order,
  ``phi_a(l) = (-1)**popcount(a & l)``;
* otherwise the "+-1 basis": ``phi_0 = 1`` and ``phi_j(l) = +1 if l == j else -1``.

The *forward* transform along an axis computes ``g'(y) = sum_l phi_y(l) g(l)``
(``T g``); it turns a distribution into its dual coordinates
``<Phi_y>_p``.  The *transposed* transform computes ``f(l) = sum_y phi_y(l) g(y)``
(``T^T g``); it turns a parameter vector ``theta`` into ``l_theta(x)``.
Both cost ``O(k log k)`` (Walsh-Hadamard butterflies) or ``O(k)`` (+-1 basis)
per fibre, never ``O(k^2)``.

Example
-------
>>> import numpy as np
>>> from fsll_ooc.basis import local_matrix, transform
>>> local_matrix(3)
array([[ 1.,  1.,  1.],
       [-1.,  1., -1.],
       [-1., -1.,  1.]])
>>> p = np.full((2, 3), 1 / 6)
>>> np.round(transform(p), 12) + 0.0   # uniform: every non-constant moment is 0
array([[ 1.        , -0.33333333, -0.33333333],
       [ 0.        ,  0.        ,  0.        ]])
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

__all__ = [
    "is_walsh",
    "local_matrix",
    "transform_axis",
    "transform",
    "transform_t",
    "product_matrix",
    "phi_values",
    "uniform_moment",
]


def is_walsh(k: int) -> bool:
    """True when cardinality ``k`` uses the Walsh-Hadamard basis (``k`` a power of two)."""
    return k >= 1 and (k & (k - 1)) == 0


def local_matrix(k: int) -> np.ndarray:
    """Dense ``k x k`` matrix ``M[y, l] = phi_y(l)`` of the local basis (for tests and small work)."""
    if k < 1:
        raise ValueError(f"cardinality must be >= 1, got {k}")
    if is_walsh(k):
        a = np.arange(k)
        bits = np.bitwise_and.outer(a, a)
        pop = np.zeros_like(bits)
        while bits.any():
            pop += bits & 1
            bits >>= 1
        return np.where(pop % 2 == 0, 1.0, -1.0)
    m = -np.ones((k, k))
    m[0, :] = 1.0
    m[np.arange(1, k), np.arange(1, k)] = 1.0
    return m


def transform_axis(g: np.ndarray, axis: int, transpose: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """Apply the local transform of ``g.shape[axis]`` along ``axis``.

    ``transpose=False`` computes ``T g`` (forward, distribution -> moments),
    ``transpose=True`` computes ``T^T g`` (parameters -> log-potential).
    Works on any float array; returns a new array unless ``out`` is given
    (``out`` may be ``g`` itself).
    """
    k = g.shape[axis]
    if out is None:
        out = np.empty_like(g)
    inplace = out is g
    x = np.moveaxis(g, axis, 0)
    o = np.moveaxis(out, axis, 0)
    if k == 1:
        if not inplace:
            o[...] = x
        return out
    if is_walsh(k):
        # Butterflies: H is symmetric, so forward and transposed coincide.
        if not inplace:
            o[...] = x
        h = 1
        rest = o.shape[1:]
        while h < k:
            v = o.reshape((k // (2 * h), 2, h) + rest)  # splitting one axis is always a view
            a = v[:, 0].copy()
            v[:, 0] += v[:, 1]
            np.subtract(a, v[:, 1], out=v[:, 1])
            h *= 2
        return out
    s = x.sum(axis=0)
    if transpose:
        # (T^T g)_0 = g_0 - S1, (T^T g)_l = g_0 - S1 + 2 g_l,  S1 = sum_{j>=1} g_j
        base = 2.0 * x[0] - s
        np.multiply(x[1:], 2.0, out=o[1:])
        o[1:] += base
        o[0] = base
    else:
        # (T g)_0 = S, (T g)_j = 2 g_j - S
        np.multiply(x[1:], 2.0, out=o[1:])
        o[1:] -= s
        o[0] = s
    return out


def transform(g: np.ndarray, axes: Sequence[int] | None = None, transpose: bool = False) -> np.ndarray:
    """Full (or partial, over ``axes``) dimension-by-dimension transform of a table (returns a new array)."""
    out = np.array(g, dtype=np.float64 if g.dtype.kind != "f" else g.dtype, copy=True)
    for ax in range(out.ndim) if axes is None else axes:
        transform_axis(out, ax, transpose=transpose, out=out)
    return out


def transform_t(g: np.ndarray, axes: Sequence[int] | None = None) -> np.ndarray:
    """Transposed transform ``T^T`` over ``axes`` (all by default): parameters -> ``l_theta``."""
    return transform(g, axes, transpose=True)


def product_matrix(k: int, b: int) -> np.ndarray:
    """Matrix ``M`` with ``phi_a * phi_b = sum_c M[a, c] phi_c`` (rows ``a``, for fixed ``b``).

    So ``<Phi_y Phi_y'>_p`` is ``M`` applied to the dual table along each axis where
    ``y'_i = b != 0``.  Walsh-Hadamard: a permutation (``a -> a ^ b``).
    +-1 basis: ``phi_0 phi_b = phi_b``, ``phi_b phi_b = phi_0`` and, for ``a != b``,
    ``phi_a phi_b = -phi_0 - phi_a - phi_b``.
    """
    m = np.zeros((k, k))
    if is_walsh(k):
        a = np.arange(k)
        m[a, a ^ b] = 1.0
        return m
    if b == 0:
        return np.eye(k)
    m[0, b] = 1.0
    for a in range(1, k):
        if a == b:
            m[a, 0] = 1.0
        else:
            m[a, 0] -= 1.0
            m[a, a] -= 1.0
            m[a, b] -= 1.0
    return m


def apply_product(g: np.ndarray, axis: int, b: int) -> np.ndarray:
    """Return ``M_b`` (see :func:`product_matrix`) applied along ``axis`` of ``g``, in O(size)."""
    k = g.shape[axis]
    if b == 0:
        return g.copy()
    if is_walsh(k):
        return np.take(g, np.arange(k) ^ b, axis=axis)  # one C-contiguous copy
    shape = g.shape
    x = np.ascontiguousarray(g, np.float64).reshape(math.prod(shape[:axis]), k, math.prod(shape[axis + 1:]))
    return _bandops().pm_product(x, b).reshape(shape)


@functools.cache
def _bandops():
    """:mod:`fsll_ooc.kernels.bandops` (imported on first use: the kernels import this module)."""
    from .kernels import bandops

    return bandops


def phi_values(k: int, y: int, x: np.ndarray) -> np.ndarray:
    """``phi_y(x)`` for an integer array ``x`` of values of a variable with cardinality ``k``."""
    x = np.asarray(x)
    if y == 0:
        return np.ones(x.shape)
    if is_walsh(k):
        v = np.bitwise_and(x, y)
        par = np.zeros(x.shape, dtype=np.int64)
        while np.any(v):
            par ^= v & 1
            v = v >> 1
        return 1.0 - 2.0 * par
    return np.where(x == y, 1.0, -1.0)


def uniform_moment(cards: Sequence[int], y: Sequence[int]) -> float:
    """``E_u[Phi_y]``, the moment of the global basis function ``y`` (a multi-index) under the
    uniform distribution: the product over the term's variables (``y_i != 0``) of 0 on a
    Walsh-Hadamard axis and ``(2 - k) / k`` on a +-1 axis; 1 for ``y = 0``.

    >>> uniform_moment((2, 3), (0, 1)), uniform_moment((2, 3), (1, 0))
    (-0.3333333333333333, 0.0)
    """
    eu = 1.0
    for k, yi in zip(cards, y):
        if yi:
            eu *= 0.0 if is_walsh(k) else (2.0 - k) / k
    return eu
