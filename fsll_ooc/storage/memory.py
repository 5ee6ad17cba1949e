"""The in-memory backend ``"numpy"``: a table is one numpy array of this process.

A contiguous band read is a view of the table, so a task updates it in place and its
write is then a no-op.  Nothing is persistent or checksummed.
"""
from __future__ import annotations

import numpy as np

from .base import TableBackend, TableSpec, register_backend

__all__ = ["NumpyBackend"]


@register_backend
class NumpyBackend(TableBackend):
    """Tables held in ``TableSpec.array`` (an in-core fit)."""

    name = "numpy"
    persistent = False
    supports_inplace_views = True
    checksummed = False

    def create(self, spec: TableSpec) -> TableSpec:
        return TableSpec(spec.backend, None, spec.shape, spec.chunks, spec.dtype,
                         np.zeros(spec.shape, dtype=spec.dtype))

    def open(self, spec: TableSpec):
        return spec.array

    def read(self, spec: TableSpec, key: tuple) -> np.ndarray:
        v = spec.array[key]
        return v if v.flags.c_contiguous else np.ascontiguousarray(v)

    def write(self, spec: TableSpec, key: tuple, value: np.ndarray) -> None:
        arr = spec.array
        v = arr[key]
        if isinstance(v, np.ndarray) and np.shares_memory(v, value) and v.ctypes.data == value.ctypes.data:
            return  # the band was updated in place
        arr[key] = value

    def as_array(self, spec: TableSpec):
        return spec.array
