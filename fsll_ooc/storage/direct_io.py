"""Direct I/O for the file backends: when a table's band transfers bypass the page cache,
the aligned buffers they use, and the one byte mover both backends share.

The memmap backend (:mod:`fsll_ooc.storage.memmap`) and the Zarr tables' own chunk I/O
(:mod:`fsll_ooc.storage.zarr_tables`) move whole chunks with ``O_DIRECT`` where the
system allows it: :func:`wants_direct` decides per table (:data:`DIRECT_IO`); a file
system that refuses ``O_DIRECT`` is remembered (:func:`note_refusal`, :func:`refused`)
and its files are read and written through the page cache from then on.  File offsets
of a direct transfer are multiples of :data:`DIRECT_ALIGN`; memory is either
page-aligned (:func:`aligned_empty`) or goes through this thread's bounce buffer
(:func:`bounce_buffer`) a piece of :data:`DIRECT_PIECE` bytes at a time
(:func:`move_bytes`).

>>> a = aligned_empty((3, 5))
>>> a.ctypes.data % DIRECT_ALIGN, a.shape
(0, (3, 5))
>>> contiguous_split((4, 3, 2), (1, 3, 2)), contiguous_split((4, 3, 2), (2, 3, 1))
(1, None)
"""
from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from .base import TableSpec, cached

__all__ = ["DIRECT_IO", "DIRECT_ALIGN", "DIRECT_PIECE", "wants_direct", "refused", "note_refusal",
           "refused_devices", "bounce_buffer", "aligned_empty", "move_bytes", "contiguous_split"]

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

#: Devices (``st_dev``) whose file system refused ``O_DIRECT`` in this process.
refused_devices: set = set()
_local = threading.local()


def wants_direct(spec: TableSpec) -> bool:
    """Does band I/O of ``spec`` bypass the page cache (:data:`DIRECT_IO`)?  ``"auto"``: when a
    fit's three tables of this size take more than half of the memory this process may use
    (the machine's or its control group's): the page cache cannot keep them from one pass
    to the next, and buffered I/O only adds copies and reclaim; smaller tables stay cached."""
    if not hasattr(os, "O_DIRECT") or DIRECT_IO is False:
        return False
    if DIRECT_IO is True:
        return True
    from ..machine import total_memory

    mem = total_memory()
    return mem is not None and 3 * spec.nbytes > mem // 2


def _device(path: str) -> int:
    return cached(("dev", path), lambda: os.stat(path).st_dev)


def refused(path: str) -> bool:
    """Has the file system holding ``path`` refused ``O_DIRECT`` in this process?"""
    return _device(path) in refused_devices


def note_refusal(path: str) -> None:
    """Remember that the file system holding ``path`` refused ``O_DIRECT`` (its files are
    moved through the page cache from now on)."""
    refused_devices.add(os.stat(path).st_dev)


def contiguous_split(shape, chunks) -> int | None:
    """``c`` such that chunks are ``(1,)*c + shape[c:]`` (each chunk a contiguous run), else None."""
    n = len(shape)
    c = n
    while c > 0 and chunks[c - 1] == shape[c - 1]:
        c -= 1
    if all(ch == 1 for ch in chunks[:c]):
        return c
    return None


def bounce_buffer() -> memoryview:
    """This thread's page-aligned transfer buffer of :data:`DIRECT_PIECE` bytes."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) != DIRECT_PIECE:  # none yet in this thread, or the piece size was changed
        buf = _local.buf = mmap.mmap(-1, DIRECT_PIECE)
    return memoryview(buf)


def aligned_empty(shape, dtype="float64") -> np.ndarray:
    """An uninitialised C-order array whose data starts on a :data:`DIRECT_ALIGN` boundary
    (direct transfers read into it and write from it without a bounce buffer)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + DIRECT_ALIGN, np.uint8)
    off = (-raw.ctypes.data) % DIRECT_ALIGN
    return raw[off:off + n].view(dtype).reshape(shape)


def move_bytes(fd: int, write: bool, band: memoryview, pos: int, off: int, n: int, buf: memoryview | None,
               short) -> None:
    """Move ``n`` bytes between ``band[pos:pos + n]`` and the file ``fd`` at offset ``off``:
    straight when ``buf`` is None (with ``O_DIRECT``, ``band`` must be page-aligned there),
    else through ``buf`` (a page-aligned bounce buffer, :func:`bounce_buffer`) a buffer's
    length at a time.  A short transfer raises ``short(write, file offset)``."""
    step = n if buf is None else len(buf)
    for lo in range(0, n, max(step, 1)):
        m = min(step, n - lo)
        view = band[pos + lo:pos + lo + m] if buf is None else buf[:m]
        if write:
            if buf is not None:
                view[:] = band[pos + lo:pos + lo + m]
            got = os.pwritev(fd, [view], off + lo)
        else:
            got = os.preadv(fd, [view], off + lo)
        if got != m:
            raise short(write, off + lo)
        if not write and buf is not None:
            band[pos + lo:pos + lo + m] = view
