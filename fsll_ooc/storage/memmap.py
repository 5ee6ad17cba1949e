"""The memmap backend ``"memmap"``: a table is a raw C-order file ``STORE/NAME.f64``.

Chunks must be contiguous runs of the file (chunk shape ``(1, ..., 1, k_c, ..., k_n-1)``).
A side file ``NAME.f64.crc32c`` holds one CRC-32C per chunk (little-endian uint32),
bound to the chunk's table, position and fit (:mod:`fsll_ooc.storage.binding`),
updated on every write and checked on every band read; raw access through
:func:`fsll_ooc.storage.open_table` (dask arrays over the memmap, point gathers) is *not*
checked.  The data file is preallocated (``posix_fallocate``) so a full disk fails at
creation with ``ENOSPC`` instead of killing the process with ``SIGBUS`` in the middle of
a pass.

Band reads and writes of whole chunks of a table larger than the page cache can hold
bypass it where the system allows it (``O_DIRECT``, :data:`DIRECT_IO`, :func:`wants_direct`): under a memory limit that counts the page cache (a
cgroup) and tables larger than it, every buffered byte is copied, its page reclaimed and
written back by the kernel, and passes moved a fraction of the disk's throughput
(``docs/benchmarks.md`` section 4).  The file offsets of a direct transfer are aligned to
:data:`DIRECT_ALIGN`; the few bytes of a run of chunks outside the aligned part, and every
partial-chunk access, go through the page cache as before.  Point gathers and
:func:`fsll_ooc.storage.open_table` use the memory map, which the kernel keeps coherent
with direct transfers.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading

import numpy as np

from .base import (CHECKSUM_BYTES, TableBackend, TableSpec, cached, chunk_slices, forget, key_chunks, open_table,
                   register_backend)
from .errors import IntegrityError
from . import binding, files
from .binding import crc_path
from .files import crc32c, fsync_path, refuse_link

__all__ = ["MemmapBackend", "crc_path", "wants_direct", "DIRECT_IO", "DIRECT_ALIGN", "DIRECT_PIECE"]

#: Whole-chunk band reads and writes use ``O_DIRECT`` (where the OS has it and the file
#: system accepts it; a refusal falls back to buffered I/O for that file system):
#: ``"auto"`` for tables that the page cache cannot hold (:func:`wants_direct`), ``True``
#: for every table, ``False`` never.
DIRECT_IO: bool | str = "auto"
#: File offsets and lengths of a direct transfer are multiples of this (the page size
#: covers every block size of common file systems).
DIRECT_ALIGN = 4096
#: A direct transfer moves at most this many bytes at once, through one aligned buffer
#: per thread (so it adds this much memory per running task, not a band's worth).
DIRECT_PIECE = 16 * 2**20

_local = threading.local()
_direct_refused: set = set()  # devices (st_dev) whose file system refused O_DIRECT


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
    open_table(spec)  # size checks of both files
    return binding.side_file(spec)


def _chunk_rows(spec: TableSpec, value: np.ndarray, n: int) -> np.ndarray:
    return np.ascontiguousarray(value, dtype=spec.dtype).reshape(n, -1)


def _chunk_ids(spec: TableSpec, coords) -> np.ndarray:
    return np.ravel_multi_index(tuple(np.array(coords).T), spec.grid)


def _buffer() -> memoryview:
    """This thread's page-aligned transfer buffer of :data:`DIRECT_PIECE` bytes."""
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = mmap.mmap(-1, DIRECT_PIECE)
    return memoryview(buf)


def _runs(spec: TableSpec, ids: np.ndarray):
    """``(file offset, byte offset in the band, length)`` of each run of consecutive chunks."""
    cb = spec.chunk_nbytes
    ids = np.asarray(ids, np.int64)
    cut = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [len(ids)]])
    for a, b in zip(starts.tolist(), ends.tolist()):
        yield int(ids[a]) * cb, a * cb, (b - a) * cb


def wants_direct(spec: TableSpec) -> bool:
    """Does band I/O of ``spec`` bypass the page cache (:data:`DIRECT_IO`)?  ``"auto"``: when a
    fit's three tables of this size take more than half of the memory this process may use
    (the machine's or its control group's): the page cache cannot keep them from one pass
    to the next, and buffered I/O only adds copies and reclaim; smaller tables stay cached."""
    if not hasattr(os, "O_DIRECT") or DIRECT_IO is False:
        return False
    if DIRECT_IO is True:
        return True
    from .._machine import total_memory

    mem = total_memory()
    return mem is not None and 3 * spec.nbytes > mem // 2


def _direct_fd(spec: TableSpec, write: bool) -> int | None:
    if not wants_direct(spec):
        return None
    dev = cached(("dev", spec.path), lambda: os.stat(spec.path).st_dev)
    if dev in _direct_refused:
        return None
    try:
        return files.open_nofollow(spec.path, (os.O_RDWR if write else os.O_RDONLY) | os.O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:  # this file system has no direct I/O (tmpfs, some network ones)
            _direct_refused.add(dev)
            return None
        raise


def _read_direct(spec: TableSpec, ids, out: np.ndarray) -> bool:
    """Fill ``out`` (C order, the chunks ``ids`` one after the other) from the file with
    direct reads; False (nothing read) when direct I/O is not available."""
    fd = _direct_fd(spec, False)
    if fd is None:
        return False
    dst = memoryview(out.reshape(-1).view(np.uint8))
    buf = _buffer()
    size = spec.nbytes
    try:
        for off, pos, length in _runs(spec, ids):
            lo = off - off % DIRECT_ALIGN  # read whole aligned pages; keep the bytes of the run
            end = off + length
            while lo < end:
                n = min(DIRECT_PIECE, -(-(end - lo) // DIRECT_ALIGN) * DIRECT_ALIGN)
                got = os.preadv(fd, [buf[:n]], lo)
                a, b = max(off, lo), min(end, lo + n)
                if got < min(b, size) - lo:
                    raise OSError(errno.EIO, f"short read at byte {lo:,} of the table", spec.path)
                dst[pos + a - off:pos + b - off] = buf[a - lo:b - lo]
                lo += n
    finally:
        os.close(fd)
    return True


def _write_direct(spec: TableSpec, ids, value: np.ndarray) -> bool:
    """Write ``value`` (C order, the chunks ``ids`` one after the other): the aligned part of
    each run with direct writes, its unaligned ends buffered; False (nothing written) when
    direct I/O is not available."""
    fd = _direct_fd(spec, True)
    if fd is None:
        return False
    src = memoryview(np.ascontiguousarray(value, dtype=spec.dtype).reshape(-1).view(np.uint8))
    buf = _buffer()
    plain = None  # a buffered descriptor for the unaligned ends, opened when one is needed
    try:
        for off, pos, length in _runs(spec, ids):
            end = off + length
            a0 = -(-off // DIRECT_ALIGN) * DIRECT_ALIGN
            a1 = end - end % DIRECT_ALIGN
            if a1 <= a0:
                a0 = a1 = end  # too short for an aligned part: all buffered
            for lo_, hi_ in ((off, a0), (a1, end)):
                if hi_ > lo_:
                    if plain is None:
                        plain = files.open_nofollow(spec.path, os.O_WRONLY)
                    if os.pwrite(plain, src[pos + lo_ - off:pos + hi_ - off], lo_) != hi_ - lo_:
                        raise OSError(errno.EIO, f"short write at byte {lo_:,} of the table", spec.path)
            lo = a0
            while lo < a1:
                n = min(DIRECT_PIECE, a1 - lo)
                buf[:n] = src[pos + lo - off:pos + lo - off + n]
                if os.pwritev(fd, [buf[:n]], lo) != n:
                    raise OSError(errno.EIO, f"short write at byte {lo:,} of the table", spec.path)
                lo += n
    finally:
        os.close(fd)
        if plain is not None:
            os.close(plain)
    return True


def _whole_chunks(spec: TableSpec, key, n_cells: int | None = None):
    """The chunk ids of ``key`` when it covers whole chunks (and ``n_cells`` of them), else None."""
    coords, aligned = key_chunks(spec, key)
    if not (aligned and coords) or (n_cells is not None and n_cells != len(coords) * spec.chunk_size):
        return None
    return _chunk_ids(spec, coords)


def _write_memmap(spec: TableSpec, arr: np.memmap, key, value) -> None:
    """Data first, then the checksums of the chunks written (a kill in between leaves a
    mismatch that the next read reports; a fit's resume rewrites such chunks first)."""
    ids = _whole_chunks(spec, key, np.size(value))
    if ids is None or not _write_direct(spec, ids, value):
        arr[key] = value
    crcs = _crcs(spec)
    coords, aligned = key_chunks(spec, key)
    if not coords:
        return
    ids = _chunk_ids(spec, coords)
    value = np.asarray(value)
    if aligned and value.size == len(coords) * spec.chunk_size:
        rows = _chunk_rows(spec, value, len(coords))
        crcs[ids] = binding.bind_many(spec, (crc32c(r) for r in rows), ids)
    else:  # partial chunks: checksum what is now in the file
        crcs[ids] = binding.bind_many(spec, (crc32c(np.ascontiguousarray(arr[chunk_slices(spec, c)])) for c in coords),
                                      ids)


def _verify_memmap(spec: TableSpec, arr: np.memmap, key, out: np.ndarray) -> None:
    coords, aligned = key_chunks(spec, key)
    if not coords:
        return
    ids = _chunk_ids(spec, coords)
    if aligned and out.size == len(coords) * spec.chunk_size:
        got = binding.bind_many(spec, (crc32c(r) for r in _chunk_rows(spec, out, len(coords))), ids)
    else:
        got = binding.bind_many(spec, (crc32c(np.ascontiguousarray(arr[chunk_slices(spec, c)])) for c in coords), ids)
    want = np.asarray(_crcs(spec)[ids])
    bad = np.nonzero(np.asarray(got, dtype=np.uint64) != want.astype(np.uint64))[0]
    if bad.size:
        c = coords[int(bad[0])]
        off = int(ids[int(bad[0])]) * spec.chunk_nbytes
        raise IntegrityError(spec.path, f"checksum mismatch in chunk {tuple(c)} (bytes {off:,}..{off + spec.chunk_nbytes:,}; "
                                        f"{bad.size} of {len(coords)} chunks read are bad): "
                                        "the file was altered or a write was interrupted, or the chunk was "
                                        "swapped, moved from another table or copied from another fit")


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
        binding.create_side_file(spec, binding.bind_many(spec, np.full(spec.n_chunks, crc0), range(spec.n_chunks)))
        return spec

    def open(self, spec: TableSpec) -> np.memmap:
        try:
            size = os.lstat(spec.path).st_size
        except FileNotFoundError:
            raise IntegrityError(spec.path, "table file is missing") from None
        refuse_link(spec.path)
        if size != spec.nbytes:
            raise IntegrityError(spec.path, f"table file has {size:,} bytes, expected {spec.nbytes:,} "
                                            "(truncated or not this table)")
        binding.check_side_file(spec)
        return files.memmap_nofollow(spec.path, spec.dtype, spec.shape)

    def read(self, spec: TableSpec, key: tuple) -> np.ndarray:
        arr = open_table(spec)
        view = arr[key]
        ids = _whole_chunks(spec, key, view.size)
        out = None
        if ids is not None:
            out = np.empty(view.shape, dtype=spec.dtype)
            if not _read_direct(spec, ids, out):
                out = None
        if out is None:
            out = np.array(view, order="C")
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
            got = binding.bind_many(spec, (crc32c(r) for r in rows), range(start, stop))
            bad = np.nonzero(got != np.asarray(_crcs(spec)[start:stop]))[0]
            if bad.size:
                i = start + int(bad[0])
                raise IntegrityError(spec.path, f"checksum mismatch in chunk {np.unravel_index(i, spec.grid)} "
                                                f"(bytes {i * spec.chunk_nbytes:,}..{(i + 1) * spec.chunk_nbytes:,}): "
                                                "altered, or not the chunk this fit wrote at this place")

    def fingerprint(self, spec: TableSpec) -> dict:
        return {"bytes": spec.nbytes, "checksum_bytes": CHECKSUM_BYTES * spec.n_chunks}

    def check_fingerprint(self, spec: TableSpec, fp: dict) -> None:
        forget(spec)
        self.check(spec)  # the file sizes describe the table
        _crcs(spec)
