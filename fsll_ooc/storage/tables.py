"""The table functions the engine and the fit call; each one dispatches to the table's backend.

They add what every backend shares: the store directory, the per-process cache of open
arrays, and the count of band writes in flight (:func:`quiesce`).  Integrity: see
``docs/reliability.md``; nothing read from a checksummed backend is used unverified.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from .base import TableSpec, forget, get_backend, open_table, thread_pool
from .errors import DiskFullError, IntegrityError  # noqa: F401 - also importable from here

__all__ = ["create_table", "open_table", "read", "write", "gather", "as_array", "flush", "sync_table",
           "check_table", "verify_table", "table_fingerprint", "check_fingerprint", "table_path",
           "overhead_bytes", "quiesce", "read_ahead", "settle", "READ_AHEAD_THREADS"]

_ACTIVE = threading.Condition()  # band writes in flight in this process (see quiesce)
_N_ACTIVE = [0]


def table_path(backend: str, store, name: str, dtype: str = "float64") -> str:
    """File or directory of table ``name`` in ``store``."""
    return get_backend(backend).table_path(store, name, dtype)


def overhead_bytes(backend: str, shape, chunks) -> int:
    """Bytes a table takes on disk beyond ``|X| * itemsize`` (its checksums)."""
    return get_backend(backend).overhead_bytes(shape, chunks)


def create_table(backend: str, path, name: str, shape, chunks, dtype="float64", fit_id: str = "") -> TableSpec:
    """Create (or overwrite) table ``name`` of backend ``backend`` in directory ``path``
    (None for a backend that is not persistent); contents are zero, except that a zarr
    chunk must be written before it is read (every chunk is stored: a missing one is damage).
    ``fit_id`` names the fit the table belongs to (chunk checksums are bound to it).

    Raises ``ValueError`` for an unknown backend or a persistent one without a path,
    ``OSError`` (``ENOSPC``) when the table's space cannot be reserved.
    """
    impl = get_backend(backend)
    shape = tuple(int(s) for s in shape)
    chunks = tuple(int(c) for c in chunks)
    if not impl.persistent:
        return impl.create(TableSpec(backend, None, shape, chunks, dtype))
    if path is None:
        raise ValueError(f"backend {backend!r} needs a store path")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    spec = TableSpec(backend, impl.table_path(root, name, dtype), shape, chunks, dtype, fit_id=fit_id)
    forget(spec)
    return impl.create(spec)


def read(spec: TableSpec, key: tuple) -> np.ndarray:
    """Read ``table[key]`` as a C-contiguous array (a view for contiguous bands of a backend
    that ``supports_inplace_views``).

    Checksummed backends check every chunk read; a bad chunk raises :class:`IntegrityError`
    naming its file.
    """
    return spec.backend_impl.read(spec, key)


#: Threads of a process that read bands ahead (:func:`read_ahead`).
READ_AHEAD_THREADS = 4


def read_ahead(spec: TableSpec, key: tuple) -> Future:
    """Start :func:`read` of ``table[key]`` on a background thread (a persistent backend: a
    trip to the disk that can overlap other work); its ``result()`` is the band, verified,
    or raises the read's error.  Wait for it (``result()`` or :func:`settle`) before the
    task that started it ends, also on error.  A table kept in memory is read at once."""
    if not spec.backend_impl.persistent:
        fut: Future = Future()
        try:
            fut.set_result(read(spec, key))
        except Exception as e:
            fut.set_exception(e)
        return fut
    return thread_pool("fsll-ahead", READ_AHEAD_THREADS).submit(read, spec, key)


def settle(*futures) -> None:
    """Wait until the reads ``futures`` (:func:`read_ahead`; None is skipped) have ended,
    dropping their results and errors (the caller is already raising one of its own)."""
    for fut in futures:
        if fut is not None:
            try:
                fut.result()
            except BaseException:
                pass


def write(spec: TableSpec, key: tuple, value: np.ndarray) -> None:
    """Write ``table[key] = value`` (no-op when ``value`` is an in-place view of that band)."""
    impl = spec.backend_impl
    if not impl.persistent:
        impl.write(spec, key, value)
        return
    with _ACTIVE:
        _N_ACTIVE[0] += 1
    try:
        impl.write(spec, key, value)
    finally:
        with _ACTIVE:
            _N_ACTIVE[0] -= 1
            _ACTIVE.notify_all()


def quiesce(timeout: float = 120.0) -> bool:
    """Wait until no band write is in flight in this process (after a pass failed, its other
    tasks may still be finishing); True if none is left."""
    with _ACTIVE:
        return _ACTIVE.wait_for(lambda: _N_ACTIVE[0] == 0, timeout=timeout)


def gather(spec: TableSpec, flat: np.ndarray) -> np.ndarray:
    """The cells ``flat`` (global C-order indices) of the table, as float64."""
    return spec.backend_impl.gather(spec, flat)


def as_array(spec: TableSpec):
    """The whole table as one array: its numpy array for a backend that keeps it in memory,
    else a lazy ``dask.array`` over the store."""
    return spec.backend_impl.as_array(spec)


def flush(spec: TableSpec) -> None:
    """Push written pages to the file (memmap); zarr writes are already on disk."""
    spec.backend_impl.flush(spec)


def sync_table(spec: TableSpec) -> None:
    """Make the table durable (survives a power cut, not only a killed process)."""
    spec.backend_impl.sync(spec)


def check_table(spec: TableSpec) -> None:
    """Cheap structural check: metadata, file sizes and (zarr) every chunk file present
    with its exact size.  Contents are checked when read."""
    spec.backend_impl.check(spec)


def verify_table(spec: TableSpec) -> None:
    """Deep check: every chunk's checksum (reads the whole table once)."""
    spec.backend_impl.verify(spec)


def table_fingerprint(spec: TableSpec) -> dict:
    """What must not change while a store is in use: the metadata's hash (zarr) or the file sizes (memmap)."""
    return spec.backend_impl.fingerprint(spec)


def check_fingerprint(spec: TableSpec, fp: dict) -> None:
    """Raise :class:`IntegrityError` when ``spec``'s metadata (zarr) or file sizes (memmap) no
    longer match fingerprint ``fp``; chunk files are not looked at (see :func:`check_table`)."""
    if not fp:
        return
    spec.backend_impl.check_fingerprint(spec, fp)
