"""The Zarr v3 backend ``"zarr"``: a table is a Zarr array directory ``STORE/NAME/``.

Arrays are uncompressed (random float64 barely compresses and zstd halves throughput,
see ``docs/design.md``) with chunks equal to the planner's chunk shape; every task
writes whole chunks, so concurrent writers never share a chunk.

Every chunk carries a CRC-32C (the standard ``crc32c`` codec of the Zarr v3 spec, 4 bytes
per chunk) checked by zarr on every decode; every chunk is written even when it is all
zeros (``write_empty_chunks``), so before a band is read each of its chunk files must
exist with the exact encoded size.  A missing, truncated or altered chunk raises
:class:`~fsll_ooc.storage.IntegrityError` naming the file, and so does array metadata
(``zarr.json``) that does not parse or no longer describes the table.  The codec's CRC
covers the chunk's bytes only; a side file ``NAME.crc32c`` next to the array's
directory binds each chunk to its table, position and fit
(:mod:`fsll_ooc.storage.binding`: the codec's CRC, read from the last 4 bytes of the
chunk file, extended with the chunk's place), so a swapped, moved or foreign chunk
file is refused by name as well.

Zarr writes a chunk (a partial-chunk key) to a ``*.partial`` file with a random name and
renames it over the chunk's path (a link planted at a chunk's path is replaced, never
written through); directories are another matter, so a table directory or chunk
directory that is a symbolic link is refused before anything is written.  A killed
writer's partial files are listed by :meth:`ZarrBackend.temporary_files`.

Whole-chunk band reads and writes (what the engine's tasks do) do not go through zarr
(:data:`OWN_IO`): this module reads and writes the chunk files itself, in zarr's own
encoding (the chunk's little-endian bytes, then their CRC-32C), so the files stay
byte-identical to zarr's and zarr still opens the table.  A transfer thread moves
chunk files one after the other between the disk and the band array while the task's thread
computes the CRC-32C of each chunk already read (a read: checked against the CRC stored
in the file, then the place against the side file) or of each chunk to be written (a
write: the transfer thread writes a chunk's bytes, then its CRC); :data:`LANES` such
threads share a band's chunk files.  Tables the page cache
cannot hold bypass it (``O_DIRECT`` for the page-aligned part of each chunk file, the
rest, at least the CRC, buffered; the same rule and switch as the ``memmap`` backend:
:func:`fsll_ooc.storage.direct_io.wants_direct`).  A chunk file that exists whole is
rewritten in place: its bytes, then its CRC, then its entry in the side file, so a
kill in between leaves a chunk whose CRC or place check fails on the next read (a fit's
resume rewrites the tables it cannot trust, ``docs/design.md``); one that is missing,
of another size or hard-linked elsewhere is written to a ``*.partial`` file and renamed
over its path, as zarr does.  A chunk file that is a symbolic link is refused, read or
written, naming the file.
"""
from __future__ import annotations

import errno
import fcntl
import os
import queue
import shutil
import stat
import sys
import threading
import uuid
from pathlib import Path
from typing import Iterable

import numpy as np

from . import binding, direct_io, files, memmap
from .base import (CHECKSUM_BYTES, TableBackend, TableSpec, forget, key_chunks, normalize_key, open_table,
                   register_backend, thread_pool, whole_chunks)
from .errors import IntegrityError
from .files import crc32c, file_sha256, fsync_path, refuse_link, syncfs

__all__ = ["ZarrBackend", "OWN_IO", "LANES"]

_METADATA = "zarr.json"

#: Whole-chunk band reads and writes of a local table go straight to its chunk files
#: (this module encodes and checks them as zarr's codecs do; see the module docstring);
#: False: through zarr (the same files, slower under a memory limit: every byte passes
#: through the page cache and zarr's buffers).
OWN_IO = True
#: Transfer threads of one band (each moves every ``LANES``-th chunk file): a band keeps this
#: many chunk files in flight, as a ``memmap`` band keeps one piece of up to 16 MiB.
LANES = 2


def _chunk_file(spec: TableSpec, arr, coords) -> str:
    """The file of chunk ``coords`` (the default chunk key encoding ``c/i/j/...``, the only one
    :meth:`ZarrBackend.create` makes; checked by :meth:`ZarrBackend.open`)."""
    return os.path.join(spec.path, "c", *(str(int(c)) for c in coords))


def _check_chunk_files(spec: TableSpec, files) -> None:
    want = spec.chunk_nbytes + CHECKSUM_BYTES
    for f in files:
        try:
            st = os.lstat(f)  # a link is refused, never followed
        except FileNotFoundError:
            raise IntegrityError(f, "chunk file is missing (deleted, or the table was never completely written)") from None
        if not stat.S_ISREG(st.st_mode):
            raise IntegrityError(f, "chunk file is not a regular file (a symbolic link, say); fsll-ooc never reads "
                                    "or writes a store's chunks through a link (remove it)")
        size = st.st_size
        if size != want:
            raise IntegrityError(f, f"chunk file has {size:,} bytes, expected {want:,} (truncated or altered)")


def _key_shape(spec: TableSpec, key) -> tuple[int, ...]:
    """The shape of ``table[key]`` (integers drop their axis)."""
    out = []
    for k, s in zip(normalize_key(key, len(spec.shape)), spec.shape):
        if isinstance(k, slice):
            start, stop, _ = k.indices(s)
            out.append(max(0, stop - start))
    return tuple(out)


def _chunk_id(spec: TableSpec, coords) -> int:
    return int(np.ravel_multi_index(tuple(int(c) for c in coords), spec.grid))


def _stored_crc(f: str) -> int:
    """The codec's CRC-32C of chunk file ``f`` (its last 4 bytes; the file's size was checked)."""
    fd = files.open_nofollow(f, os.O_RDONLY | os.O_NONBLOCK)
    try:
        tail = os.pread(fd, CHECKSUM_BYTES, os.fstat(fd).st_size - CHECKSUM_BYTES)
    finally:
        os.close(fd)
    return int.from_bytes(tail, "little")


def _check_places(spec: TableSpec, coords, files) -> None:
    """Each chunk file is the one this fit wrote at its place (see :mod:`fsll_ooc.storage.binding`)."""
    ids = [_chunk_id(spec, c) for c in coords]
    got = binding.bind_many(spec, (_stored_crc(f) for f in files), ids)
    want = np.asarray(binding.side_file(spec)[ids])
    bad = np.nonzero(got != want)[0]
    if bad.size:
        raise IntegrityError(files[int(bad[0])], binding.PLACE_PROBLEM)


def _refuse_links(spec: TableSpec, coords) -> None:
    """No directory on the way to the chunk files of ``coords`` is a symbolic link (zarr
    would create and rename its files inside whatever the link points to)."""
    refuse_link(spec.path)
    seen = set()
    for c in coords:
        d = os.path.dirname(_chunk_file(spec, None, c))
        while d != spec.path and d not in seen:
            seen.add(d)
            refuse_link(d)
            d = os.path.dirname(d)


def _check_chunk_content(spec: TableSpec, f: str) -> None:
    try:
        with open(f, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise IntegrityError(f, "chunk file is missing") from None
    want = spec.chunk_nbytes + CHECKSUM_BYTES
    if len(data) != want:
        raise IntegrityError(f, f"chunk file has {len(data):,} bytes, expected {want:,} (truncated or altered)")
    stored = int.from_bytes(data[-4:], "little")
    if crc32c(memoryview(data)[:-4]) != stored:
        raise IntegrityError(f, "chunk checksum mismatch (the file was altered or damaged)")


# ----------------------------------------------------------------------------- own chunk I/O

def _own_ids(spec: TableSpec, key, n_cells: int | None = None):
    """The chunk coordinates of ``key`` when this module moves them itself (:data:`OWN_IO`):
    ``key`` covers whole chunks (``n_cells`` cells, when given), each chunk is a contiguous
    run of the table (then a band is its chunks one after the other) and the values are
    stored as they are in memory (little-endian); else None."""
    if not OWN_IO or sys.byteorder != "little" or np.dtype(spec.dtype).byteorder == ">":
        return None
    if direct_io.contiguous_split(spec.shape, spec.chunks) is None:
        return None
    return whole_chunks(spec, key, n_cells)


def _direct(spec: TableSpec) -> bool:
    """Do this table's chunk transfers try ``O_DIRECT`` (:func:`fsll_ooc.storage.direct_io.wants_direct`,
    and the file system has not refused it)?"""
    return direct_io.wants_direct(spec) and not direct_io.refused(spec.path)


def _open_chunk(spec: TableSpec, f: str, flags: int, direct: bool) -> tuple[int, bool]:
    """``(descriptor, direct)`` of chunk file ``f`` (never through a link, never waiting for a
    FIFO planted there: ``O_NONBLOCK``, which regular files ignore); a file system that
    refuses ``O_DIRECT`` is remembered and the file opened buffered."""
    flags |= os.O_NONBLOCK
    if direct:
        try:
            return files.open_nofollow(f, flags | os.O_DIRECT), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            try:
                regular = stat.S_ISREG(os.lstat(f).st_mode)
            except FileNotFoundError:
                regular = True
            if regular:  # not a FIFO or the like planted there: the file system has no O_DIRECT
                direct_io.note_refusal(spec.path)
            flags &= ~os.O_EXCL  # a new file (a random name) may have been made before the refusal
    return files.open_nofollow(f, flags), False


def _split(spec: TableSpec, direct: bool) -> int:
    """Bytes at the start of a chunk file moved straight between the file and the band
    (with ``O_DIRECT``: whole pages); the rest of the chunk's bytes and the 4 bytes of its
    CRC are moved together, buffered."""
    return spec.chunk_nbytes - spec.chunk_nbytes % direct_io.DIRECT_ALIGN if direct else spec.chunk_nbytes


def _set_direct(fd: int, on: bool) -> None:
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, (fl | os.O_DIRECT) if on else (fl & ~os.O_DIRECT))


def _transfer(fd: int, write: bool, view: memoryview, pos: int, n: int, f: str) -> None:
    """Move ``n`` bytes at file offset ``pos`` between ``fd`` and ``view`` (the chunk's bytes,
    from ``pos``); a direct descriptor needs ``view`` page-aligned or goes through this
    thread's aligned bounce buffer (:func:`fsll_ooc.storage.direct_io.move_bytes`)."""
    if n <= 0:
        return
    direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
    aligned = not direct or np.frombuffer(view, np.uint8, count=1, offset=pos).ctypes.data % direct_io.DIRECT_ALIGN == 0

    def short(w, at):
        return IntegrityError(f, f"short {'write' if w else 'read'} at byte {at:,} of the chunk file "
                                 "(the file changed while it was in use)")

    direct_io.move_bytes(fd, write, view, pos, pos, n, None if aligned else direct_io.bounce_buffer(), short)


def _read_chunk(spec: TableSpec, f: str, view: memoryview, direct: bool) -> int:
    """Read chunk file ``f`` into ``view`` (the chunk's bytes); returns the CRC-32C stored after
    them.  A missing file, a link, a file of another size raise :class:`IntegrityError`."""
    want = spec.chunk_nbytes + CHECKSUM_BYTES
    try:
        fd, direct = _open_chunk(spec, f, os.O_RDONLY, direct)
    except FileNotFoundError:
        raise IntegrityError(f, "chunk file is missing (deleted, or the table was never completely written)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IntegrityError(f, "chunk file is not a regular file")
        if st.st_size != want:
            raise IntegrityError(f, f"chunk file has {st.st_size:,} bytes, expected {want:,} (truncated or altered)")
        a = _split(spec, direct)
        _transfer(fd, False, view, 0, a, f)
        if direct:
            _set_direct(fd, False)
        rest = bytearray(want - a)
        if os.preadv(fd, [rest], a) != len(rest):
            raise IntegrityError(f, "short read of the chunk file's end (the file changed while it was in use)")
        view[a:] = rest[:-CHECKSUM_BYTES]
        return int.from_bytes(rest[-CHECKSUM_BYTES:], "little")
    finally:
        os.close(fd)


def _put_chunk(spec: TableSpec, f: str, view: memoryview, crc: queue.SimpleQueue, direct: bool) -> None:
    """Write the chunk's bytes ``view`` to chunk file ``f``, then the CRC-32C taken from ``crc``
    (computed meanwhile by the caller).  In place when ``f`` is a whole chunk file of this
    table with no other link; else to a new ``*.partial`` file renamed over ``f``.  A link
    at ``f`` is refused."""
    want = spec.chunk_nbytes + CHECKSUM_BYTES
    try:
        fd, d = _open_chunk(spec, f, os.O_WRONLY, direct)
    except (FileNotFoundError, IsADirectoryError):
        fd = None
    except OSError as e:
        if e.errno != errno.ENXIO:  # ENXIO: a FIFO nobody reads; replaced like any file that is not a chunk
            raise
        fd = None
    tmp = None
    if fd is not None:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size == want):
            os.close(fd)
            fd = None
    try:
        if fd is None:  # a new file, renamed over the old one when complete (what zarr does)
            tmp = f"{f}.{uuid.uuid4().hex}.partial"
            os.makedirs(os.path.dirname(f), exist_ok=True)
            fd, d = _open_chunk(spec, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, direct)
        a = _split(spec, d)
        _transfer(fd, True, view, 0, a, f)
        if d:
            _set_direct(fd, False)
        value = crc.get()
        if isinstance(value, BaseException):
            raise value
        tail = bytes(view[a:]) + int(value).to_bytes(CHECKSUM_BYTES, "little")
        if os.pwrite(fd, tail, a) != len(tail):
            raise OSError(errno.EIO, "short write of the chunk file's end", f)
        if tmp is not None:
            os.close(fd)
            fd = None
            os.replace(tmp, f)
            tmp = None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _move_chunks(spec: TableSpec, write: bool, paths: list, lane: range, band: memoryview, done: queue.SimpleQueue,
                 crcs: list, stop: threading.Event, direct: bool) -> None:
    """A transfer thread's work: the chunk files ``paths[i]`` for ``i`` in ``lane``, one after
    the other (a read reports each chunk's stored CRC on ``done``, a write each chunk
    written); ends with None, or with the error that stopped it.  ``crcs``: a write's
    queues of the chunks' CRC-32C."""
    cb = spec.chunk_nbytes
    try:
        for i in lane:
            if stop.is_set():
                break
            f = paths[i]
            view = band[i * cb:(i + 1) * cb]
            if write:
                _put_chunk(spec, f, view, crcs[i], direct)
                done.put((i, None))
            else:
                done.put((i, _read_chunk(spec, f, view, direct)))
        done.put(None)
    except BaseException as e:  # handed to the caller, which raises it
        done.put(e)


def _own_transfer(spec: TableSpec, coords: list, band: np.ndarray, write: bool) -> np.ndarray:
    """Move the chunks ``coords`` between their files and ``band`` (C order, the chunks one
    after the other) on :data:`LANES` transfer threads (chunk ``i`` on lane ``i % LANES``)
    while this thread computes their CRC-32C; a read checks each chunk's CRC against the
    one stored in its file.  Returns the CRC-32C of the chunks' bytes; raises the first
    error once every transfer thread has stopped."""
    paths = [_chunk_file(spec, None, c) for c in coords]
    flat = band.reshape(-1)
    rows = flat.reshape(len(coords), -1)
    mv = memoryview(flat.view(np.uint8))
    done: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()
    queues = [queue.SimpleQueue() for _ in paths] if write else None
    out = np.zeros(len(paths), np.uint64)
    direct = _direct(spec)
    lanes = max(1, min(LANES, len(paths)))
    pool = thread_pool("fsll-io", memmap.IO_THREADS)
    jobs = [pool.submit(_move_chunks, spec, write, paths, range(k, len(paths), lanes), mv, done, queues, stop, direct)
            for k in range(lanes)]
    try:
        if write:
            for i, r in enumerate(rows):
                out[i] = crc32c(r)
                queues[i].put(int(out[i]))
        running = lanes
        while running:
            item = done.get()
            if item is None:
                running -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            i, stored = item
            if not write:
                out[i] = crc32c(rows[i])
                if int(out[i]) != stored:
                    raise IntegrityError(paths[i], "chunk checksum mismatch (the file was altered or damaged)")
    finally:
        stop.set()
        if queues is not None:
            for q in queues:  # a thread waiting for a CRC that will not come stops
                q.put(RuntimeError("the band write was abandoned"))
        for job in jobs:
            job.result()
    return out


def _own_read(spec: TableSpec, coords: list, shape) -> np.ndarray:
    out = direct_io.aligned_empty(shape, spec.dtype)
    crcs = _own_transfer(spec, coords, out, False)
    ids = [_chunk_id(spec, c) for c in coords]
    got = binding.bind_many(spec, crcs, ids)
    bad = np.nonzero(got != np.asarray(binding.side_file(spec)[ids]))[0]
    if bad.size:
        raise IntegrityError(_chunk_file(spec, None, coords[int(bad[0])]), binding.PLACE_PROBLEM)
    return out


def _own_write(spec: TableSpec, coords: list, value: np.ndarray) -> None:
    """The chunks' files first, then their entries in the side file."""
    value = np.ascontiguousarray(value, dtype=spec.dtype)
    crcs = _own_transfer(spec, coords, value, True)
    ids = [_chunk_id(spec, c) for c in coords]
    binding.side_file(spec)[ids] = binding.bind_many(spec, crcs, ids)


def open_checked(store, spec: TableSpec, meta: str):
    """The zarr array at ``store`` (a path or a zarr store), checked against ``spec``;
    :class:`IntegrityError` naming ``meta`` when its metadata does not describe the table."""
    import zarr

    try:
        # every chunk is stored, zeros included: a missing chunk file is then always damage
        arr = zarr.open_array(store, mode="r+").with_config({"write_empty_chunks": True})
    except Exception as e:  # noqa: BLE001 - any parse failure means the metadata cannot be trusted
        raise IntegrityError(meta, f"array metadata cannot be read ({type(e).__name__}: {e})") from None
    problems = []
    if tuple(arr.shape) != spec.shape:
        problems.append(f"shape {tuple(arr.shape)} instead of {spec.shape}")
    if tuple(arr.chunks) != spec.chunks:
        problems.append(f"chunks {tuple(arr.chunks)} instead of {spec.chunks}")
    if np.dtype(arr.dtype) != np.dtype(spec.dtype):
        problems.append(f"dtype {arr.dtype} instead of {spec.dtype}")
    names = [type(c).__name__ for c in getattr(arr.metadata, "codecs", ())]
    if names != ["BytesCodec", "Crc32cCodec"]:
        problems.append(f"codecs {names} instead of [BytesCodec, Crc32cCodec] (checksummed, uncompressed)")
    if problems:
        raise IntegrityError(meta, "array metadata does not describe this table: " + "; ".join(problems))
    return arr


@register_backend
class ZarrBackend(TableBackend):
    """Zarr v3 arrays, one chunk file per chunk with its CRC-32C (codec ``crc32c``)."""

    name = "zarr"
    persistent = True
    supports_inplace_views = False
    checksummed = True
    checksum_bytes_per_chunk = 2 * CHECKSUM_BYTES  # the codec's CRC in the chunk file, the bound one in the side file

    def table_path(self, store, name: str, dtype: str = "float64") -> str:
        return str(Path(store) / name)

    def create(self, spec: TableSpec) -> TableSpec:
        import zarr
        from zarr.codecs import Crc32cCodec

        refuse_link(spec.path)
        if os.path.isdir(spec.path):  # zarr's overwrite leaves stray chunk files of other shapes
            shutil.rmtree(spec.path)
        binding.create_side_file(spec, np.zeros(spec.n_chunks, dtype="<u4"))  # no chunk is valid before written
        arr = zarr.create_array(store=spec.path, shape=spec.shape, chunks=spec.chunks, dtype=spec.dtype,
                                compressors=[Crc32cCodec()], fill_value=0.0, zarr_format=3, overwrite=True,
                                config={"write_empty_chunks": True})
        del arr
        return spec

    def open(self, spec: TableSpec):
        meta = os.path.join(spec.path, _METADATA)
        if not os.path.exists(meta):
            raise IntegrityError(meta, "array metadata is missing")
        arr = open_checked(spec.path, spec, meta)
        enc = arr.metadata.chunk_key_encoding
        if enc.encode_chunk_key((0,) * len(spec.shape)) != "/".join(["c"] + ["0"] * len(spec.shape)):
            raise IntegrityError(meta, "array metadata does not describe this table: a chunk key encoding other "
                                       "than the default 'c/i/j/...'")
        binding.check_side_file(spec)
        return arr

    def read(self, spec: TableSpec, key: tuple) -> np.ndarray:
        arr = open_table(spec)
        own = _own_ids(spec, key)
        if own is not None:
            return _own_read(spec, own, _key_shape(spec, key))
        coords, _ = key_chunks(spec, key)
        _refuse_links(spec, coords)
        files = [_chunk_file(spec, arr, c) for c in coords]
        _check_chunk_files(spec, files)
        _check_places(spec, coords, files)
        try:
            out = arr[key]
        except Exception as e:  # noqa: BLE001 - find the chunk that failed and name it
            for f in files:
                _check_chunk_content(spec, f)
            raise IntegrityError(spec.path, f"reading {key!r} failed ({type(e).__name__}: {e})") from e
        return np.ascontiguousarray(out)

    def write(self, spec: TableSpec, key: tuple, value: np.ndarray) -> None:
        arr = open_table(spec)
        coords, _ = key_chunks(spec, key)
        _refuse_links(spec, coords)
        if _own_ids(spec, key, np.size(value)) is not None:
            _own_write(spec, coords, value)
            return
        arr[key] = value
        files = [_chunk_file(spec, arr, c) for c in coords]
        ids = [_chunk_id(spec, c) for c in coords]
        binding.side_file(spec)[ids] = binding.bind_many(spec, (_stored_crc(f) for f in files), ids)

    def gather(self, spec: TableSpec, flat: np.ndarray) -> np.ndarray:
        arr = open_table(spec)
        idx = np.unravel_index(flat, spec.shape)
        coords = np.unique(np.stack([i // c for i, c in zip(idx, spec.chunks)], axis=1), axis=0) if len(flat) else ()
        files = [_chunk_file(spec, arr, c) for c in coords]
        _check_chunk_files(spec, files)
        _check_places(spec, coords, files)
        return np.asarray(arr.get_coordinate_selection(idx), dtype=np.float64)

    def as_array(self, spec: TableSpec):
        import dask.array as da

        return da.from_zarr(spec.path)

    def flush(self, spec: TableSpec) -> None:
        binding.side_file(spec).flush()

    def sync(self, spec: TableSpec) -> None:
        """One ``syncfs(2)`` of the table's filesystem where available (a zarr table is thousands
        of files and directories; fsyncing each costs far more), else an fsync per file."""
        if syncfs(spec.path):
            return
        for dp, _, fs in os.walk(spec.path):  # pragma: no cover - platforms without syncfs
            for f in fs:
                fsync_path(os.path.join(dp, f))
        fsync_path(spec.path, directory=True)

    def check(self, spec: TableSpec) -> None:
        """Metadata, and every chunk file present with its exact size."""
        forget(spec)
        arr = open_table(spec)
        _check_chunk_files(spec, (_chunk_file(spec, arr, c) for c in np.ndindex(*spec.grid)))

    def verify(self, spec: TableSpec) -> None:
        self.check(spec)
        arr = open_table(spec)
        for c in np.ndindex(*spec.grid):
            f = _chunk_file(spec, arr, c)
            _check_chunk_content(spec, f)
            _check_places(spec, [c], [f])

    def fingerprint(self, spec: TableSpec) -> dict:
        return {"metadata": _METADATA, "sha256": file_sha256(os.path.join(spec.path, _METADATA))}

    def check_fingerprint(self, spec: TableSpec, fp: dict) -> None:
        """The metadata's hash, then the metadata describes the table (chunk files are not looked at)."""
        meta = os.path.join(spec.path, _METADATA)
        try:
            h = file_sha256(meta)
        except FileNotFoundError:
            raise IntegrityError(meta, "array metadata is missing") from None
        if h != fp.get("sha256"):
            raise IntegrityError(meta, "array metadata changed since the fit wrote it (altered or replaced)")
        forget(spec)
        open_table(spec)

    def temporary_files(self, store: Path, skip: tuple[str, ...]) -> Iterable[str]:
        """Zarr's ``*.partial`` files inside the store's zarr arrays (top-level directories
        holding a ``zarr.json``)."""
        for entry in Path(store).iterdir():
            if entry.is_dir() and entry.name not in skip and (entry / _METADATA).is_file():
                for dp, _, fs in os.walk(entry):
                    for f in fs:
                        if f.endswith(".partial"):
                            yield os.path.join(dp, f)
