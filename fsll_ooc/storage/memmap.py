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
bypass it where the system allows it (``O_DIRECT``, :mod:`fsll_ooc.storage.direct_io`): under a memory limit that counts the page cache (a
cgroup) and tables larger than it, every buffered byte is copied, its page reclaimed and
written back by the kernel, and passes moved a fraction of the disk's throughput
(``docs/benchmarks.md`` section 4).  The file offsets of a direct transfer are aligned to
:data:`~fsll_ooc.storage.direct_io.DIRECT_ALIGN`; the few bytes of a run of chunks outside the aligned part, and every
partial-chunk access, go through the page cache as before.  Point gathers and
:func:`fsll_ooc.storage.open_table` use the memory map, which the kernel keeps coherent
with direct transfers.

Where a band's runs of chunks are whole pages of the file (:data:`OVERLAP`; every band of
a table whose chunks are), a direct band transfer moves the bytes straight between the
file and a page-aligned band array (:func:`~fsll_ooc.storage.direct_io.aligned_empty`; no copy through a bounce
buffer) on a transfer thread, while the calling thread computes
the checksums: of each piece already read (a read), or of the band being written (a
write, whose checksums are stored after all its data is in the file).  A transfer
thread's error is raised in the calling thread, which first waits until that thread has
stopped touching the band (``docs/reliability.md``).
"""
from __future__ import annotations

import errno
import math
import os
import queue
import threading

import numpy as np

from .base import (CHECKSUM_BYTES, TableBackend, TableSpec, chunk_slices, forget, key_chunks, open_table,
                   register_backend, thread_pool, whole_chunks)
from .errors import IntegrityError
from . import binding, files
from .binding import crc_path
from .files import crc32c, fsync_path, refuse_link
from . import direct_io
from .direct_io import DIRECT_ALIGN, aligned_empty, bounce_buffer, contiguous_split, move_bytes, wants_direct

__all__ = ["MemmapBackend", "crc_path", "OVERLAP", "IO_THREADS"]

#: Direct band transfers of tables whose chunks are whole pages go straight between the file
#: and the band array on a transfer thread while the caller computes the checksums (True);
#: False: through the bounce buffer, one step after the other (the same bytes either way).
OVERLAP = True
#: Transfer threads of a process (each moves one band at a time and only waits on the disk).
IO_THREADS = 8


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


def _pieces(spec: TableSpec, ids: np.ndarray) -> list:
    """``(file offset, byte offset in the band, length, first chunk, chunks)`` of the pieces of
    a band: whole chunks of one run, about :data:`~fsll_ooc.storage.direct_io.DIRECT_PIECE` bytes, each a whole number of
    pages when the runs are (:func:`_overlaps`)."""
    cb = spec.chunk_nbytes
    step = DIRECT_ALIGN // math.gcd(cb, DIRECT_ALIGN)  # chunks that make whole pages
    per = max(step, direct_io.DIRECT_PIECE // cb // step * step)
    out = []
    for off, pos, length in _runs(spec, ids):
        n = length // cb
        for k in range(0, n, per):
            m = min(per, n - k)
            out.append((off + k * cb, pos + k * cb, m * cb, pos // cb + k, m))
    return out


def _move(fd: int, write: bool, band: memoryview, pieces: list, done: queue.SimpleQueue, stop: threading.Event,
          path: str) -> None:
    """A transfer thread's work: move ``pieces`` between the file ``fd`` and ``band`` in order,
    reporting each piece's index (or the error that ended the transfer) on ``done``;
    stops early when ``stop`` is set.  A band that is not page-aligned goes through this
    thread's bounce buffer."""
    def short(w, at):
        return OSError(errno.EIO, f"short {'write' if w else 'read'} at byte {at:,} of the table", path)

    try:
        zero_copy = np.frombuffer(band, np.uint8).ctypes.data % DIRECT_ALIGN == 0 if len(band) else True
        buf = None if zero_copy else bounce_buffer()
        for i, (off, pos, length, _, _) in enumerate(pieces):
            if stop.is_set():
                break
            move_bytes(fd, write, band, pos, off, length, buf, short)
            done.put(i)
    except BaseException as e:  # handed to the caller, which raises it
        done.put(e)


def _overlapped(spec: TableSpec, fd: int, write: bool, ids, band: np.ndarray) -> np.ndarray:
    """Move the chunks ``ids`` between the file and ``band`` (C order, the chunks one after the
    other) on a transfer thread; meanwhile compute the chunks' CRC-32C here (a read: each
    piece once it has arrived).  Returns the CRCs; raises the transfer's error after the
    thread has stopped."""
    flat = band.reshape(-1)
    rows = flat.reshape(len(ids), -1)
    pieces = _pieces(spec, ids)
    done: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()
    mv = memoryview(flat.view(np.uint8))
    crcs = np.zeros(len(ids), np.uint64)
    job = thread_pool("fsll-io", IO_THREADS).submit(_move, fd, write, mv, pieces, done, stop, spec.path)
    try:
        if write:  # the checksums of the band while its bytes go to the file
            crcs[:] = [crc32c(r) for r in rows]
        for _ in pieces:
            item = done.get()
            if isinstance(item, BaseException):
                raise item
            if not write:
                _, _, _, c0, m = pieces[item]
                crcs[c0:c0 + m] = [crc32c(rows[c]) for c in range(c0, c0 + m)]
    finally:
        stop.set()
        job.result()  # the thread has let go of the band and the descriptor
    return crcs


def _runs(spec: TableSpec, ids: np.ndarray):
    """``(file offset, byte offset in the band, length)`` of each run of consecutive chunks."""
    cb = spec.chunk_nbytes
    ids = np.asarray(ids, np.int64)
    cut = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [len(ids)]])
    for a, b in zip(starts.tolist(), ends.tolist()):
        yield int(ids[a]) * cb, a * cb, (b - a) * cb


def _direct_fd(spec: TableSpec, write: bool) -> int | None:
    if not wants_direct(spec) or direct_io.refused(spec.path):
        return None
    try:
        return files.open_nofollow(spec.path, (os.O_RDWR if write else os.O_RDONLY) | os.O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:  # this file system has no direct I/O (tmpfs, some network ones)
            direct_io.note_refusal(spec.path)
            return None
        raise


def _overlaps(spec: TableSpec, ids, band: np.ndarray | None = None) -> bool:
    """Does a direct transfer of the chunks ``ids`` (into or out of ``band``) take the
    overlapped path: :data:`OVERLAP`, every run of consecutive chunks starts and ends on a
    page boundary of the file (always, when chunks are whole pages), and a band read into
    starts on one?"""
    if not OVERLAP or (band is not None and band.ctypes.data % DIRECT_ALIGN):
        return False
    return spec.chunk_nbytes % DIRECT_ALIGN == 0 or all(
        off % DIRECT_ALIGN == 0 and length % DIRECT_ALIGN == 0 for off, _, length in _runs(spec, ids))


def _read_direct(spec: TableSpec, ids, out: np.ndarray):
    """Fill ``out`` (C order, the chunks ``ids`` one after the other) from the file with
    direct reads; False (nothing read) when direct I/O is not available.  On the
    overlapped path (:func:`_overlaps`) returns the chunks' CRC-32C, computed while the
    rest was read; else True."""
    fd = _direct_fd(spec, False)
    if fd is None:
        return False
    if _overlaps(spec, ids, out):
        try:
            return _overlapped(spec, fd, False, ids, out)
        finally:
            os.close(fd)
    dst = memoryview(out.reshape(-1).view(np.uint8))
    buf = bounce_buffer()
    size = spec.nbytes
    try:
        for off, pos, length in _runs(spec, ids):
            lo = off - off % DIRECT_ALIGN  # read whole aligned pages; keep the bytes of the run
            end = off + length
            while lo < end:
                n = min(direct_io.DIRECT_PIECE, -(-(end - lo) // DIRECT_ALIGN) * DIRECT_ALIGN)
                got = os.preadv(fd, [buf[:n]], lo)
                a, b = max(off, lo), min(end, lo + n)
                if got < min(b, size) - lo:
                    raise OSError(errno.EIO, f"short read at byte {lo:,} of the table", spec.path)
                dst[pos + a - off:pos + b - off] = buf[a - lo:b - lo]
                lo += n
    finally:
        os.close(fd)
    return True


def _write_direct(spec: TableSpec, ids, value: np.ndarray):
    """Write ``value`` (C order, the chunks ``ids`` one after the other): the aligned part of
    each run with direct writes, its unaligned ends buffered; False (nothing written) when
    direct I/O is not available.  On the overlapped path (:func:`_overlaps`) returns the
    chunks' CRC-32C, computed while the band was written; else True."""
    value = np.ascontiguousarray(value, dtype=spec.dtype)  # before the descriptor: may raise
    overlapped = _overlaps(spec, ids)
    fd = _direct_fd(spec, True)
    if fd is None:
        return False
    if overlapped:
        try:
            return _overlapped(spec, fd, True, ids, value)
        finally:
            os.close(fd)
    src = memoryview(value.reshape(-1).view(np.uint8))
    buf = bounce_buffer()
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
                n = min(direct_io.DIRECT_PIECE, a1 - lo)
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
    coords = whole_chunks(spec, key, n_cells)
    return None if coords is None else _chunk_ids(spec, coords)


def _write_memmap(spec: TableSpec, arr: np.memmap, key, value) -> None:
    """Data first, then the checksums of the chunks written (a kill in between leaves a
    mismatch that the next read reports; a fit's resume rewrites such chunks first)."""
    ids = _whole_chunks(spec, key, np.size(value))
    done = False if ids is None else _write_direct(spec, ids, value)
    if done is False:
        arr[key] = value
    crcs = _crcs(spec)
    if isinstance(done, np.ndarray):  # computed while the data was written
        crcs[ids] = binding.bind_many(spec, done, ids)
        return
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


def _verify_memmap(spec: TableSpec, arr: np.memmap, key, out: np.ndarray, raw=None) -> None:
    """Check the chunks ``out`` holds against the side file; ``raw``: their CRC-32C, already
    computed (an overlapped direct read)."""
    coords, aligned = key_chunks(spec, key)
    if not coords:
        return
    ids = _chunk_ids(spec, coords)
    if raw is not None:
        got = binding.bind_many(spec, raw, ids)
    elif aligned and out.size == len(coords) * spec.chunk_size:
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
        if contiguous_split(spec.shape, spec.chunks) is None:
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
        out = raw = None
        if ids is not None:
            out = aligned_empty(view.shape, spec.dtype) if _overlaps(spec, ids) else np.empty(view.shape, spec.dtype)
            done = _read_direct(spec, ids, out)
            if done is False:
                out = None
            elif isinstance(done, np.ndarray):
                raw = done
        if out is None:
            out = np.array(view, order="C")
        _verify_memmap(spec, arr, key, out, raw)
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
