"""Table storage: one interface over in-memory numpy, numpy memmap and Zarr v3 arrays.

A :class:`TableSpec` names one ``|X|`` table (backend, location, shape, chunk shape,
dtype).  It is small and picklable, so a dask worker in another process opens the
same table by itself (:func:`open_table`); only the in-memory backend is tied to the
process that created it.  Band reads return C-contiguous arrays; for the in-memory
backend a contiguous band is a view and is updated in place.

Zarr tables are created uncompressed (random float64 barely compresses and zstd
halves throughput, see the design notes) with chunks equal to the planner's chunk
shape; every task writes whole chunks, so concurrent writers never share a chunk.

Store directory layout (``backend="zarr"``)::

    STORE/zarr.json            # zarr group
    STORE/dbar/ ...            # zarr arrays, one per table
    STORE/thetabar/ ...
    STORE/scratch/ ...
    STORE/fsll_state.json      # fit state, replaced atomically after every iteration

``backend="memmap"`` keeps ``STORE/<name>.f64`` raw C-order files instead.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TableSpec", "create_table", "open_table", "write_json_atomic", "read_json", "BACKENDS"]

BACKENDS = ("numpy", "memmap", "zarr")

_CACHE: dict[tuple, Any] = {}
_CACHE_LOCK = threading.Lock()


@dataclass(frozen=True)
class TableSpec:
    """Where one table lives. ``array`` is only set for the in-memory backend."""

    backend: str
    path: str | None
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str = "float64"
    array: Any = None

    def __reduce__(self):
        if self.backend == "numpy":
            raise TypeError("an in-memory table cannot be sent to another process; "
                            "use a store (backend 'memmap' or 'zarr') with a distributed scheduler")
        return (TableSpec, (self.backend, self.path, self.shape, self.chunks, self.dtype, None))

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def create_table(backend: str, path: str | os.PathLike | None, name: str, shape, chunks, dtype="float64") -> TableSpec:
    """Create (or overwrite) table ``name``; contents start at zero."""
    shape = tuple(int(s) for s in shape)
    chunks = tuple(int(c) for c in chunks)
    if backend == "numpy":
        return TableSpec("numpy", None, shape, chunks, dtype, np.zeros(shape, dtype=dtype))
    if path is None:
        raise ValueError(f"backend {backend!r} needs a store path")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    if backend == "memmap":
        f = root / f"{name}.f64" if dtype == "float64" else root / f"{name}.{dtype}"
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        with open(f, "wb") as fh:
            fh.truncate(size)  # sparse file of zeros; space is taken as it is written
        spec = TableSpec("memmap", str(f), shape, chunks, dtype)
    elif backend == "zarr":
        import zarr

        arr = zarr.create_array(store=str(root / name), shape=shape, chunks=chunks, dtype=dtype,
                                compressors=None, fill_value=0.0, zarr_format=3, overwrite=True)
        del arr
        spec = TableSpec("zarr", str(root / name), shape, chunks, dtype)
    else:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    with _CACHE_LOCK:
        _CACHE.pop((spec.backend, spec.path), None)
    return spec


def open_table(spec: TableSpec):
    """The array object behind ``spec`` (cached per process)."""
    if spec.backend == "numpy":
        return spec.array
    key = (spec.backend, spec.path)
    with _CACHE_LOCK:
        arr = _CACHE.get(key)
        if arr is None:
            if spec.backend == "memmap":
                arr = np.memmap(spec.path, dtype=spec.dtype, mode="r+", shape=spec.shape)
            else:
                import zarr

                arr = zarr.open_array(spec.path, mode="r+")
            _CACHE[key] = arr
    return arr


def read(spec: TableSpec, key: tuple) -> np.ndarray:
    """Read ``table[key]`` as a C-contiguous array (a view for contiguous in-memory bands)."""
    arr = open_table(spec)
    if spec.backend == "numpy":
        v = arr[key]
        return v if v.flags.c_contiguous else np.ascontiguousarray(v)
    if spec.backend == "memmap":
        return np.array(arr[key], order="C")
    out = arr[key]
    return np.ascontiguousarray(out)


def write(spec: TableSpec, key: tuple, value: np.ndarray) -> None:
    """Write ``table[key] = value`` (no-op when ``value`` is the in-memory band itself)."""
    arr = open_table(spec)
    if spec.backend == "numpy":
        v = arr[key]
        if isinstance(v, np.ndarray) and np.shares_memory(v, value) and v.ctypes.data == value.ctypes.data:
            return
        arr[key] = value
        return
    arr[key] = value


def flush(spec: TableSpec) -> None:
    """Push written pages to the file (memmap); zarr writes are already on disk."""
    if spec.backend == "memmap":
        open_table(spec).flush()


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON to ``path`` via a temporary file, fsync and rename: readers see old or new, never half."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as fh:
        return json.load(fh)
