"""The memmap backend ``"memmap"``: a table is a raw C-order file ``STORE/NAME.f64``.

Chunks must be contiguous runs of the file (chunk shape ``(1, ..., 1, k_c, ..., k_n-1)``).
A side file ``NAME.f64.crc32c`` holds one CRC-32C per chunk (little-endian uint32),
updated on every write and checked on every band read; raw access through
:func:`fsll_ooc.storage.open_table` (dask arrays over the memmap, point gathers) is *not*
checked.  The data file is preallocated (``posix_fallocate``) so a full disk fails at
creation with ``ENOSPC`` instead of killing the process with ``SIGBUS`` in the middle of
a pass.
"""
from __future__ import annotations

import errno
import os

import numpy as np

from .base import (CHECKSUM_BYTES, TableBackend, TableSpec, cached, chunk_slices, forget, key_chunks, open_table,
                   register_backend)
from .errors import IntegrityError
from . import files
from .files import crc32c, fsync_path

__all__ = ["MemmapBackend", "crc_path"]


def crc_path(spec: TableSpec) -> str:
    """The side file of per-chunk checksums of memmap table ``spec``."""
    return spec.path + ".crc32c"


def _contiguous_split(shape, chunks) -> int | None:
    """``c`` such that chunks are ``(1,)*c + shape[c:]`` (each chunk a contiguous run), else None."""
    n = len(shape)
    c = n
    while c > 0 and chunks[c - 1] == shape[c - 1]:
        c -= 1
    if all(ch == 1 for ch in chunks[:c]):
        return c
    return None


def _create_filled(path: str, size: int) -> None:
    """A file of ``size`` zero bytes whose blocks are reserved now (ENOSPC here, not SIGBUS later)."""
    fd = files.open_nofollow(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        if size:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    os.ftruncate(fd, 0)
                    raise OSError(e.errno, f"cannot reserve {size:,} bytes for the table ({os.strerror(e.errno)})",
                                  path) from None
                os.ftruncate(fd, size)  # no fallocate here (e.g. some network filesystems): sparse file
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    os.close(fd)


def _crcs(spec: TableSpec) -> np.memmap:
    """The per-chunk checksums of a memmap table (opened once per process)."""
    def opener():
        open_table(spec)  # size checks of both files
        return np.memmap(crc_path(spec), dtype="<u4", mode="r+", shape=(spec.n_chunks,))

    return cached(("crc", spec.path), opener)


def _chunk_rows(spec: TableSpec, value: np.ndarray, n: int) -> np.ndarray:
    return np.ascontiguousarray(value, dtype=spec.dtype).reshape(n, -1)


def _chunk_ids(spec: TableSpec, coords) -> np.ndarray:
    return np.ravel_multi_index(tuple(np.array(coords).T), spec.grid)


def _write_memmap(spec: TableSpec, arr: np.memmap, key, value) -> None:
    """Data first, then the checksums of the chunks written (a kill in between leaves a
    mismatch that the next read reports; a fit's resume rewrites such chunks first)."""
    arr[key] = value
    crcs = _crcs(spec)
    coords, aligned = key_chunks(spec, key)
    if not coords:
        return
    ids = _chunk_ids(spec, coords)
    value = np.asarray(value)
    if aligned and value.size == len(coords) * spec.chunk_size:
        rows = _chunk_rows(spec, value, len(coords))
        crcs[ids] = [crc32c(r) for r in rows]
    else:  # partial chunks: checksum what is now in the file
        crcs[ids] = [crc32c(np.ascontiguousarray(arr[chunk_slices(spec, c)])) for c in coords]


def _verify_memmap(spec: TableSpec, arr: np.memmap, key, out: np.ndarray) -> None:
    coords, aligned = key_chunks(spec, key)
    if not coords:
        return
    ids = _chunk_ids(spec, coords)
    if aligned and out.size == len(coords) * spec.chunk_size:
        got = [crc32c(r) for r in _chunk_rows(spec, out, len(coords))]
    else:
        got = [crc32c(np.ascontiguousarray(arr[chunk_slices(spec, c)])) for c in coords]
    want = np.asarray(_crcs(spec)[ids])
    bad = np.nonzero(np.asarray(got, dtype=np.uint64) != want.astype(np.uint64))[0]
    if bad.size:
        c = coords[int(bad[0])]
        off = int(ids[int(bad[0])]) * spec.chunk_nbytes
        raise IntegrityError(spec.path, f"checksum mismatch in chunk {tuple(c)} (bytes {off:,}..{off + spec.chunk_nbytes:,}; "
                                        f"{bad.size} of {len(coords)} chunks read are bad): "
                                        "the file was altered or a write was interrupted")


@register_backend
class MemmapBackend(TableBackend):
    """Raw files mapped into memory, one CRC-32C per chunk in a side file."""

    name = "memmap"
    persistent = True
    supports_inplace_views = False
    checksummed = True
    checksum_bytes_per_chunk = CHECKSUM_BYTES

    def create(self, spec: TableSpec) -> TableSpec:
        if _contiguous_split(spec.shape, spec.chunks) is None:
            raise ValueError(f"memmap tables need chunks of the form (1, ..., 1, k_c, ..., k_n-1); got {spec.chunks}")
        _create_filled(spec.path, spec.nbytes)
        crc0 = crc32c(np.zeros(spec.chunk_size, dtype=spec.dtype))
        crcs = np.full(spec.n_chunks, crc0, dtype="<u4")
        files.write_bytes_atomic(crc_path(spec), crcs.tobytes())  # looked up per call: fault injection replaces it
        return spec

    def open(self, spec: TableSpec) -> np.memmap:
        if os.path.islink(spec.path):
            raise IntegrityError(spec.path, "is a symbolic link; fsll-ooc never writes through a link in a store "
                                            "(remove the link)")
        try:
            size = os.path.getsize(spec.path)
        except FileNotFoundError:
            raise IntegrityError(spec.path, "table file is missing") from None
        if size != spec.nbytes:
            raise IntegrityError(spec.path, f"table file has {size:,} bytes, expected {spec.nbytes:,} "
                                            "(truncated or not this table)")
        try:
            crc_size = os.path.getsize(crc_path(spec))
        except FileNotFoundError:
            raise IntegrityError(crc_path(spec), "checksum file of the table is missing") from None
        if crc_size != CHECKSUM_BYTES * spec.n_chunks:
            raise IntegrityError(crc_path(spec), f"checksum file has {crc_size:,} bytes, expected "
                                                 f"{CHECKSUM_BYTES * spec.n_chunks:,} (truncated or not this table)")
        return np.memmap(spec.path, dtype=spec.dtype, mode="r+", shape=spec.shape)

    def read(self, spec: TableSpec, key: tuple) -> np.ndarray:
        arr = open_table(spec)
        out = np.array(arr[key], order="C")
        _verify_memmap(spec, arr, key, out)
        return out

    def write(self, spec: TableSpec, key: tuple, value: np.ndarray) -> None:
        _write_memmap(spec, open_table(spec), key, value)

    def flush(self, spec: TableSpec) -> None:
        open_table(spec).flush()
        _crcs(spec).flush()

    def sync(self, spec: TableSpec) -> None:
        self.flush(spec)
        for p in (spec.path, crc_path(spec)):
            fsync_path(p)
        fsync_path(os.path.dirname(spec.path), directory=True)

    def verify(self, spec: TableSpec) -> None:
        self.check(spec)
        arr = open_table(spec)
        per = max(1, (64 * 2**20) // max(spec.chunk_nbytes, 1))
        flat = arr.reshape(-1)
        ce = spec.chunk_size
        for start in range(0, spec.n_chunks, per):
            stop = min(start + per, spec.n_chunks)
            rows = np.array(flat[start * ce: stop * ce]).reshape(stop - start, ce)
            got = np.array([crc32c(r) for r in rows], dtype=np.uint32)
            bad = np.nonzero(got != np.asarray(_crcs(spec)[start:stop]))[0]
            if bad.size:
                i = start + int(bad[0])
                raise IntegrityError(spec.path, f"checksum mismatch in chunk {np.unravel_index(i, spec.grid)} "
                                                f"(bytes {i * spec.chunk_nbytes:,}..{(i + 1) * spec.chunk_nbytes:,})")

    def fingerprint(self, spec: TableSpec) -> dict:
        return {"bytes": spec.nbytes, "checksum_bytes": CHECKSUM_BYTES * spec.n_chunks}

    def check_fingerprint(self, spec: TableSpec, fp: dict) -> None:
        forget(spec)
        self.check(spec)  # the file sizes describe the table
        _crcs(spec)
