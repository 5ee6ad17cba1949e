"""Chunk checksums bound to their place: the table, the chunk's position and the fit.

A checksummed backend keeps one CRC-32C per chunk in a side file ``TABLE.crc32c`` (next
to the table's file or directory).  The value kept for chunk ``i`` is not the CRC of the
chunk's bytes ``D`` alone but of ``D`` followed by the chunk's *place*::

    crc32c(D || "fsll-ooc" 0 FIT_ID 0 TABLE 0 i)

where ``FIT_ID`` is a random id the fit writes into its state when it starts
(``TableSpec.fit_id``), ``TABLE`` the table's file name and ``i`` the chunk's C-order
number.  CRC-32C extends (``crc32c(D || s)`` is computed from ``crc32c(D)`` and ``s``
alone), so binding costs one CRC of a few dozen bytes per chunk, and a backend that
already has ``crc32c(D)`` (zarr's ``crc32c`` codec stores it after the chunk's bytes)
need not read ``D`` again.  Two chunks of a table swapped, a chunk moved to another
table, or a table copied from another fit (same cardinalities, so same sizes and
metadata) then fail the check and are refused naming the file, unless their bytes are
identical (then nothing changed).

A table of a store at a URL, whose writer lock is a lease that can be taken over, binds
one more field: ``0 GENERATION``, the id of the lease under which the chunk was written
(``TableSpec.generation``).  A writer binds what it writes to its own lease and reads
every table it rewrote under that lease; a chunk sent late by a writer whose lease was
taken over then fails the check at its successor's next read, instead of passing for
one of the successor's.  See ``docs/reliability.md``.
"""
from __future__ import annotations

import os
from typing import Iterable

import google_crc32c as _gcrc  # a dependency of zarr v3 (its crc32c codec uses it too)
import numpy as np

from . import files
from .base import CHECKSUM_BYTES, TableSpec, cached
from .errors import IntegrityError

__all__ = ["crc_path", "place", "bind", "bind_many", "create_side_file", "side_file", "check_side_file",
           "PLACE_PROBLEM"]

#: What a chunk whose bytes are intact but whose binding fails has gone through.
PLACE_PROBLEM = ("is not the chunk this fit wrote at this place (swapped with another chunk, moved from "
                 "another table, or copied from another fit)")


def crc_path(spec: TableSpec) -> str:
    """The side file of per-chunk checksums of table ``spec``."""
    return spec.path + ".crc32c"


def place(spec: TableSpec, i: int) -> bytes:
    """The bytes naming chunk ``i`` of table ``spec`` in its fit (and, for a table written
    under a lease, ``0 GENERATION`` after them: the lease that wrote it)."""
    name = os.path.basename(spec.path) if spec.path else ""
    lease = f"\0{spec.generation}" if spec.generation else ""
    return b"fsll-ooc\0" + f"{spec.fit_id}\0{name}\0{int(i)}{lease}".encode()


def bind(spec: TableSpec, crc: int, i: int) -> int:
    """``crc32c(D || place)`` from ``crc = crc32c(D)`` of chunk ``i``'s bytes."""
    return int(_gcrc.extend(int(crc), place(spec, i)))


def bind_many(spec: TableSpec, crcs: Iterable[int], ids: Iterable[int]) -> np.ndarray:
    """:func:`bind` of several chunks, as a ``uint32`` array."""
    return np.fromiter((bind(spec, c, i) for c, i in zip(crcs, ids)), dtype="<u4")


def create_side_file(spec: TableSpec, crcs: np.ndarray) -> None:
    """Write the side file with the bound checksums ``crcs`` (one per chunk), atomically."""
    files.write_bytes_atomic(crc_path(spec), np.asarray(crcs, dtype="<u4").tobytes())


def check_side_file(spec: TableSpec) -> None:
    """The side file exists, is no link, and holds one checksum per chunk."""
    path = crc_path(spec)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise IntegrityError(path, "checksum file of the table is missing") from None
    if not os.path.isfile(path) or os.path.islink(path):
        raise IntegrityError(path, "is not a regular file (a symbolic link or a directory); fsll-ooc never "
                                   "writes through a link in a store (remove it)")
    if st.st_size != CHECKSUM_BYTES * spec.n_chunks:
        raise IntegrityError(path, f"checksum file has {st.st_size:,} bytes, expected "
                                   f"{CHECKSUM_BYTES * spec.n_chunks:,} (truncated or not this table)")


def side_file(spec: TableSpec) -> np.memmap:
    """The side file mapped read-write (opened once per process, never through a link)."""
    def opener():
        check_side_file(spec)
        return files.memmap_nofollow(crc_path(spec), "<u4", (spec.n_chunks,))

    return cached(("crc", spec.path), opener, spec.fit_id)
