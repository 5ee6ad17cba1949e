"""Table storage: one interface over in-memory numpy, numpy memmap and Zarr v3 arrays.

A :class:`TableSpec` names one ``|X|`` table (backend, location, shape, chunk shape,
dtype).  It is small and picklable, so a dask worker in another process opens the
same table by itself (:func:`open_table`); only the in-memory backend is tied to the
process that created it.  Band reads return C-contiguous arrays; for the in-memory
backend a contiguous band is a view and is updated in place.

Zarr tables are created without compression (random float64 barely compresses and
zstd halves throughput, see the design notes) with chunks equal to the planner's chunk
shape; every task writes whole chunks, so concurrent writers never share a chunk.

Integrity (see ``docs/reliability.md``)
---------------------------------------
Nothing read from a store is used unverified:

* **zarr**: every chunk carries a CRC-32C (the standard ``crc32c`` codec of the Zarr v3
  spec, 4 bytes per chunk) checked by zarr on every decode; every chunk is written even
  when it is all zeros (``write_empty_chunks``), so before a band is read each of its
  chunk files must exist with the exact encoded size.  A missing, truncated or altered
  chunk raises :class:`IntegrityError` naming the file, and so does array metadata
  (``zarr.json``) that does not parse or no longer describes the table.
* **memmap**: ``NAME.f64`` plus a side file ``NAME.f64.crc32c`` holding one CRC-32C per
  chunk (a chunk is a contiguous run of the file), updated on every write and checked
  on every band read by :func:`read`.  Raw access through :func:`open_table` (dask
  arrays over the memmap, point gathers) is *not* checked.  The data file is
  preallocated (``posix_fallocate``) so a full disk fails at creation with ``ENOSPC``
  instead of killing the process with ``SIGBUS`` in the middle of a pass.
* JSON state written with ``checksum=True`` carries a SHA-256 of its content.

Files are replaced atomically (temporary file, fsync, rename; zarr chunks are written
to ``*.partial`` files and renamed by zarr), so a killed writer leaves the old or the
new version of a file, plus possibly a temporary file that :func:`remove_leftovers`
deletes.

Store directory layout (``backend="zarr"``)::

    STORE/dbar/zarr.json, STORE/dbar/c/...   # zarr arrays, one per table
    STORE/thetabar/ ...
    STORE/scratch/ ...
    STORE/fsll_state.json      # fit state, replaced atomically after every iteration
    STORE/fsll_counts.npy      # the data as (cell, count) pairs: a fit can restart from any point
    STORE/fsll.lock            # writer lock (fsll_ooc.storage.lock)
    STORE/readers/...          # private scratch tables of read-only users of a finished fit

``backend="memmap"`` keeps ``STORE/<name>.f64`` raw C-order files (and their
``.crc32c`` side files) instead.
"""
from __future__ import annotations

import errno
import hashlib
import io
import itertools
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c as _gcrc  # a dependency of zarr v3 (its crc32c codec uses it too)
import numpy as np

__all__ = ["TableSpec", "create_table", "open_table", "read", "write", "flush", "sync_table", "check_table",
           "verify_table", "table_fingerprint", "remove_leftovers", "check_store_dir", "STORE_MARKERS",
           "write_json_atomic", "read_json",
           "write_bytes_atomic", "file_sha256", "forget", "quiesce", "IntegrityError", "DiskFullError",
           "BACKENDS", "CHECKSUM_BYTES"]

BACKENDS = ("numpy", "memmap", "zarr")
#: Bytes added to every stored chunk (zarr) or per chunk in the side file (memmap).
CHECKSUM_BYTES = 4

_CACHE: dict[tuple, Any] = {}
_CACHE_LOCK = threading.Lock()
_ACTIVE = threading.Condition()  # band writes in flight in this process (see quiesce)
_N_ACTIVE = [0]


class IntegrityError(ValueError):
    """A store file is missing, truncated, altered or inconsistent; ``path`` names it.

    The file's content is never used: the error is raised before.
    """

    def __init__(self, path, problem: str, advice: str = ""):
        self.path = str(path)
        self.problem = problem
        msg = f"{self.path}: {problem}"
        if advice:
            msg += f"; {advice}"
        super().__init__(msg)


class DiskFullError(OSError):
    """No space left on the store's filesystem (``errno`` is ``ENOSPC``); the message names
    the store, the free space and what the fit needs; ``filename`` is the store."""

    def __str__(self) -> str:
        return str(self.strerror)


def crc32c(data) -> int:
    """CRC-32C of a bytes object or a buffer (hardware-accelerated where available)."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data)
    elif not isinstance(data, bytes):
        data = np.frombuffer(data, dtype=np.uint8)
    return int(_gcrc.value(data))


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

    @property
    def chunk_nbytes(self) -> int:
        return int(np.prod(self.chunks, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def grid(self) -> tuple[int, ...]:
        """Number of chunks along each axis."""
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunks))

    @property
    def n_chunks(self) -> int:
        return int(np.prod(self.grid, dtype=np.int64))

    @property
    def crc_path(self) -> str | None:
        """Side file of per-chunk checksums (memmap only)."""
        return None if self.backend != "memmap" else self.path + ".crc32c"

    @property
    def name(self) -> str:
        return Path(self.path).name if self.path else "(in memory)"


def table_path(backend: str, store, name: str, dtype: str = "float64") -> str:
    """File or directory of table ``name`` in ``store``."""
    root = Path(store)
    if backend == "zarr":
        return str(root / name)
    return str(root / (f"{name}.f64" if dtype == "float64" else f"{name}.{dtype}"))


def overhead_bytes(backend: str, shape, chunks) -> int:
    """Bytes a table takes on disk beyond ``|X| * itemsize`` (its checksums)."""
    if backend == "numpy":
        return 0
    spec = TableSpec(backend, "x", tuple(shape), tuple(chunks))
    return CHECKSUM_BYTES * spec.n_chunks


def _contiguous_split(shape, chunks) -> int | None:
    """``c`` such that chunks are ``(1,)*c + shape[c:]`` (each chunk a contiguous run), else None."""
    n = len(shape)
    c = n
    while c > 0 and chunks[c - 1] == shape[c - 1]:
        c -= 1
    if all(ch == 1 for ch in chunks[:c]):
        return c
    return None


def create_table(backend: str, path: str | os.PathLike | None, name: str, shape, chunks, dtype="float64") -> TableSpec:
    """Create (or overwrite) table ``name``; contents start at zero.

    Raises ``OSError`` (``ENOSPC``) when a memmap table cannot be preallocated.
    """
    shape = tuple(int(s) for s in shape)
    chunks = tuple(int(c) for c in chunks)
    if backend == "numpy":
        return TableSpec("numpy", None, shape, chunks, dtype, np.zeros(shape, dtype=dtype))
    if path is None:
        raise ValueError(f"backend {backend!r} needs a store path")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    spec = TableSpec(backend, table_path(backend, root, name, dtype), shape, chunks, dtype)
    forget(spec)
    if backend == "memmap":
        if _contiguous_split(shape, chunks) is None:
            raise ValueError(f"memmap tables need chunks of the form (1, ..., 1, k_c, ..., k_n-1); got {chunks}")
        _create_filled(spec.path, spec.nbytes)
        crc0 = crc32c(np.zeros(int(np.prod(chunks, dtype=np.int64)), dtype=dtype))
        crcs = np.full(spec.n_chunks, crc0, dtype="<u4")
        write_bytes_atomic(spec.crc_path, crcs.tobytes())
    elif backend == "zarr":
        import shutil

        import zarr
        from zarr.codecs import Crc32cCodec

        if os.path.isdir(spec.path):  # zarr's overwrite leaves stray chunk files of other shapes
            shutil.rmtree(spec.path)
        arr = zarr.create_array(store=spec.path, shape=shape, chunks=chunks, dtype=dtype,
                                compressors=[Crc32cCodec()], fill_value=0.0, zarr_format=3, overwrite=True,
                                config={"write_empty_chunks": True})
        del arr
    else:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    return spec


def _create_filled(path: str, size: int) -> None:
    """A file of ``size`` zero bytes whose blocks are reserved now (ENOSPC here, not SIGBUS later)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
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


def forget(spec_or_path) -> None:
    """Drop cached open arrays of a table (or of every table under a directory)."""
    path = spec_or_path.path if isinstance(spec_or_path, TableSpec) else str(spec_or_path)
    if path is None:
        return
    with _CACHE_LOCK:
        for k in [k for k in _CACHE if k[1] == path or str(k[1]).startswith(path.rstrip("/") + "/")]:
            _CACHE.pop(k, None)


def open_table(spec: TableSpec):
    """The array object behind ``spec`` (cached per process), checked against ``spec``.

    Raises :class:`IntegrityError` when the file or its metadata is missing, truncated or
    does not describe ``spec``.
    """
    if spec.backend == "numpy":
        return spec.array
    key = (spec.backend, spec.path)
    arr = _CACHE.get(key)
    if arr is not None:
        return arr
    with _CACHE_LOCK:
        arr = _CACHE.get(key)
        if arr is None:
            arr = _open_memmap(spec) if spec.backend == "memmap" else _open_zarr(spec)
            _CACHE[key] = arr
    return arr


def _open_memmap(spec: TableSpec):
    try:
        size = os.path.getsize(spec.path)
    except FileNotFoundError:
        raise IntegrityError(spec.path, "table file is missing") from None
    if size != spec.nbytes:
        raise IntegrityError(spec.path, f"table file has {size:,} bytes, expected {spec.nbytes:,} "
                                        "(truncated or not this table)")
    try:
        crc_size = os.path.getsize(spec.crc_path)
    except FileNotFoundError:
        raise IntegrityError(spec.crc_path, "checksum file of the table is missing") from None
    if crc_size != CHECKSUM_BYTES * spec.n_chunks:
        raise IntegrityError(spec.crc_path, f"checksum file has {crc_size:,} bytes, expected "
                                            f"{CHECKSUM_BYTES * spec.n_chunks:,} (truncated or not this table)")
    return np.memmap(spec.path, dtype=spec.dtype, mode="r+", shape=spec.shape)


def _crcs(spec: TableSpec) -> np.memmap:
    """The per-chunk checksums of a memmap table (opened once per process)."""
    key = ("crc", spec.path)
    arr = _CACHE.get(key)
    if arr is None:
        open_table(spec)  # size checks of both files
        with _CACHE_LOCK:
            arr = _CACHE.get(key)
            if arr is None:
                arr = _CACHE[key] = np.memmap(spec.crc_path, dtype="<u4", mode="r+", shape=(spec.n_chunks,))
    return arr


def _open_zarr(spec: TableSpec):
    import zarr

    meta = os.path.join(spec.path, "zarr.json")
    if not os.path.exists(meta):
        raise IntegrityError(meta, "array metadata is missing")
    try:
        # every chunk is stored, zeros included: a missing chunk file is then always damage
        arr = zarr.open_array(spec.path, mode="r+").with_config({"write_empty_chunks": True})
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


# ----------------------------------------------------------------------------- chunks of a key

def _normalize_key(key, ndim: int) -> list:
    key = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis for k in key):
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (ndim - len(key) + 1) + key[i + 1:]
    key = tuple(key) + (slice(None),) * (ndim - len(key))
    if len(key) != ndim:
        raise IndexError(f"key {key!r} has more axes than the table ({ndim})")
    return list(key)


def _key_chunks(spec: TableSpec, key) -> tuple[list[tuple[int, ...]], bool]:
    """Chunk coordinates touched by ``key`` (C order) and whether ``key`` covers them exactly."""
    per_axis = []
    aligned = True
    for k, s, c in zip(_normalize_key(key, len(spec.shape)), spec.shape, spec.chunks):
        if isinstance(k, (int, np.integer)):
            i = int(k) + (s if k < 0 else 0)
            per_axis.append([i // c])
            aligned &= c == 1
        elif isinstance(k, slice):
            start, stop, step = k.indices(s)
            if step != 1:
                raise IndexError("strided keys are not supported by table storage")
            if stop <= start:
                return [], True
            per_axis.append(list(range(start // c, -(-stop // c))))
            aligned &= start % c == 0 and (stop % c == 0 or stop == s)
        else:
            raise IndexError(f"unsupported key element {k!r}")
    return list(itertools.product(*per_axis)), aligned


def _chunk_slices(spec: TableSpec, coords) -> tuple:
    return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(coords, spec.chunks, spec.shape))


def _zarr_chunk_file(spec: TableSpec, arr, coords) -> str:
    enc = arr.metadata.chunk_key_encoding
    return os.path.join(spec.path, *enc.encode_chunk_key(tuple(coords)).split("/"))


# ----------------------------------------------------------------------------- band I/O

def read(spec: TableSpec, key: tuple) -> np.ndarray:
    """Read ``table[key]`` as a C-contiguous array (a view for contiguous in-memory bands).

    Store backends check every chunk read (see the module doc); a bad chunk raises
    :class:`IntegrityError` naming its file.
    """
    arr = open_table(spec)
    if spec.backend == "numpy":
        v = arr[key]
        return v if v.flags.c_contiguous else np.ascontiguousarray(v)
    if spec.backend == "memmap":
        out = np.array(arr[key], order="C")
        _verify_memmap(spec, arr, key, out)
        return out
    coords, _ = _key_chunks(spec, key)
    files = [_zarr_chunk_file(spec, arr, c) for c in coords]
    _check_zarr_files(spec, files)
    try:
        out = arr[key]
    except Exception as e:  # noqa: BLE001 - find the chunk that failed and name it
        for f in files:
            _check_zarr_chunk_content(spec, f)
        raise IntegrityError(spec.path, f"reading {key!r} failed ({type(e).__name__}: {e})") from e
    return np.ascontiguousarray(out)


def write(spec: TableSpec, key: tuple, value: np.ndarray) -> None:
    """Write ``table[key] = value`` (no-op when ``value`` is the in-memory band itself)."""
    if spec.backend == "numpy":
        _write(spec, key, value)
        return
    with _ACTIVE:
        _N_ACTIVE[0] += 1
    try:
        _write(spec, key, value)
    finally:
        with _ACTIVE:
            _N_ACTIVE[0] -= 1
            _ACTIVE.notify_all()


def quiesce(timeout: float = 120.0) -> bool:
    """Wait until no band write is in flight in this process (after a pass failed, its other
    tasks may still be finishing); True if none is left."""
    with _ACTIVE:
        return _ACTIVE.wait_for(lambda: _N_ACTIVE[0] == 0, timeout=timeout)


def _write(spec: TableSpec, key: tuple, value: np.ndarray) -> None:
    arr = open_table(spec)
    if spec.backend == "numpy":
        v = arr[key]
        if isinstance(v, np.ndarray) and np.shares_memory(v, value) and v.ctypes.data == value.ctypes.data:
            return
        arr[key] = value
        return
    if spec.backend == "memmap":
        _write_memmap(spec, arr, key, value)
        return
    arr[key] = value


def _chunk_rows(spec: TableSpec, value: np.ndarray, n: int) -> np.ndarray:
    return np.ascontiguousarray(value, dtype=spec.dtype).reshape(n, -1)


def _write_memmap(spec: TableSpec, arr: np.memmap, key, value) -> None:
    """Data first, then the checksums of the chunks written (a kill in between leaves a
    mismatch that the next read reports; a fit's resume rewrites such chunks first)."""
    arr[key] = value
    crcs = _crcs(spec)
    coords, aligned = _key_chunks(spec, key)
    if not coords:
        return
    ids = np.ravel_multi_index(tuple(np.array(coords).T), spec.grid) if coords else []
    value = np.asarray(value)
    if aligned and value.size == len(coords) * int(np.prod(spec.chunks, dtype=np.int64)):
        rows = _chunk_rows(spec, value, len(coords))
        crcs[ids] = [crc32c(r) for r in rows]
    else:  # partial chunks: checksum what is now in the file
        crcs[ids] = [crc32c(np.ascontiguousarray(arr[_chunk_slices(spec, c)])) for c in coords]


def _verify_memmap(spec: TableSpec, arr: np.memmap, key, out: np.ndarray) -> None:
    coords, aligned = _key_chunks(spec, key)
    if not coords:
        return
    ids = np.ravel_multi_index(tuple(np.array(coords).T), spec.grid)
    if aligned and out.size == len(coords) * int(np.prod(spec.chunks, dtype=np.int64)):
        got = [crc32c(r) for r in _chunk_rows(spec, out, len(coords))]
    else:
        got = [crc32c(np.ascontiguousarray(arr[_chunk_slices(spec, c)])) for c in coords]
    want = np.asarray(_crcs(spec)[ids])
    bad = np.nonzero(np.asarray(got, dtype=np.uint64) != want.astype(np.uint64))[0]
    if bad.size:
        c = coords[int(bad[0])]
        off = int(ids[int(bad[0])]) * spec.chunk_nbytes
        raise IntegrityError(spec.path, f"checksum mismatch in chunk {tuple(c)} (bytes {off:,}..{off + spec.chunk_nbytes:,}; "
                                        f"{bad.size} of {len(coords)} chunks read are bad): "
                                        "the file was altered or a write was interrupted")


def _check_zarr_files(spec: TableSpec, files) -> None:
    want = spec.chunk_nbytes + CHECKSUM_BYTES
    for f in files:
        try:
            size = os.stat(f).st_size
        except FileNotFoundError:
            raise IntegrityError(f, "chunk file is missing (deleted, or the table was never completely written)") from None
        if size != want:
            raise IntegrityError(f, f"chunk file has {size:,} bytes, expected {want:,} (truncated or altered)")


def _check_zarr_chunk_content(spec: TableSpec, f: str) -> None:
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


def flush(spec: TableSpec) -> None:
    """Push written pages to the file (memmap); zarr writes are already on disk."""
    if spec.backend == "memmap":
        open_table(spec).flush()
        _crcs(spec).flush()


def sync_table(spec: TableSpec) -> None:
    """Make the table durable (survives a power cut, not only a killed process).

    One ``syncfs(2)`` of the table's filesystem where available (a zarr table is thousands
    of files and directories; fsyncing each costs far more), else an fsync per file.
    """
    if spec.backend == "numpy":
        return
    if spec.backend == "memmap":
        flush(spec)
        for p in (spec.path, spec.crc_path):
            _fsync_path(p)
        _fsync_path(os.path.dirname(spec.path), directory=True)
        return
    if _syncfs(spec.path):
        return
    for dp, _, fs in os.walk(spec.path):  # pragma: no cover - platforms without syncfs
        for f in fs:
            _fsync_path(os.path.join(dp, f))
    _fsync_path(spec.path, directory=True)


def _syncfs(path: str) -> bool:
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        if fn(fd) != 0:
            e = ctypes.get_errno()
            if e in (errno.ENOSPC, errno.EIO, errno.EDQUOT):
                raise OSError(e, os.strerror(e), path)
            return False
        return True
    finally:
        os.close(fd)


def _fsync_path(path: str, directory: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EROFS, errno.EBADF):
            raise
    finally:
        os.close(fd)


def check_table(spec: TableSpec) -> None:
    """Cheap structural check: metadata, file sizes and (zarr) every chunk file present
    with its exact size.  Contents are checked when read."""
    if spec.backend == "numpy":
        return
    forget(spec)
    arr = open_table(spec)
    if spec.backend == "zarr":
        _check_zarr_files(spec, (_zarr_chunk_file(spec, arr, c) for c in np.ndindex(*spec.grid)))


def verify_table(spec: TableSpec) -> None:
    """Deep check: every chunk's checksum (reads the whole table once)."""
    if spec.backend == "numpy":
        return
    check_table(spec)
    arr = open_table(spec)
    if spec.backend == "zarr":
        for c in np.ndindex(*spec.grid):
            _check_zarr_chunk_content(spec, _zarr_chunk_file(spec, arr, c))
        return
    per = max(1, (64 * 2**20) // max(spec.chunk_nbytes, 1))
    flat = arr.reshape(-1)
    ce = int(np.prod(spec.chunks, dtype=np.int64))
    for start in range(0, spec.n_chunks, per):
        stop = min(start + per, spec.n_chunks)
        rows = np.array(flat[start * ce: stop * ce]).reshape(stop - start, ce)
        got = np.array([crc32c(r) for r in rows], dtype=np.uint32)
        bad = np.nonzero(got != np.asarray(_crcs(spec)[start:stop]))[0]
        if bad.size:
            i = start + int(bad[0])
            raise IntegrityError(spec.path, f"checksum mismatch in chunk {np.unravel_index(i, spec.grid)} "
                                            f"(bytes {i * spec.chunk_nbytes:,}..{(i + 1) * spec.chunk_nbytes:,})")


def table_fingerprint(spec: TableSpec) -> dict:
    """What must not change while a store is in use: the metadata's hash (zarr) or the file sizes (memmap)."""
    if spec.backend == "zarr":
        return {"metadata": "zarr.json", "sha256": file_sha256(os.path.join(spec.path, "zarr.json"))}
    if spec.backend == "memmap":
        return {"bytes": spec.nbytes, "checksum_bytes": CHECKSUM_BYTES * spec.n_chunks}
    return {}


def check_fingerprint(spec: TableSpec, fp: dict) -> None:
    """Raise :class:`IntegrityError` when ``spec``'s metadata (zarr) or file sizes (memmap) no
    longer match fingerprint ``fp``; chunk files are not looked at (see :func:`check_table`)."""
    if not fp:
        return
    if spec.backend == "zarr":
        meta = os.path.join(spec.path, "zarr.json")
        try:
            h = file_sha256(meta)
        except FileNotFoundError:
            raise IntegrityError(meta, "array metadata is missing") from None
        if h != fp.get("sha256"):
            raise IntegrityError(meta, "array metadata changed since the fit wrote it (altered or replaced)")
    forget(spec)
    open_table(spec)  # metadata / file sizes describe the table
    if spec.backend == "memmap":
        _crcs(spec)


#: Files that only an fsll-ooc store holds (fit state, kept data, writer lock).
STORE_MARKERS = ("fsll_state.json", "fsll_counts.npy", "fsll.lock", "fsll.lock.d")


def check_store_dir(store) -> None:
    """Refuse to use a directory that holds other things than an fsll-ooc store.

    A store is created in a new or empty directory; a fit replaces its ``dbar``,
    ``thetabar`` and ``scratch`` entries and deletes temporary files, which in a user's
    directory could be anything.  Raises ``ValueError`` before anything is written.
    """
    root = Path(store)
    if root.exists() and not root.is_dir():
        raise ValueError(f"store {root} is a file, not a directory")
    if not root.is_dir() or any((root / m).exists() for m in STORE_MARKERS):
        return
    try:
        entries = sorted(p.name for p in root.iterdir())
    except OSError as e:
        raise ValueError(f"store {root} cannot be listed ({e.strerror})") from None
    if entries:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ValueError(f"store {root} is not empty and is not an fsll-ooc store (it holds {shown}); "
                         "a fit would replace or delete files there: give a new or empty directory")


def remove_leftovers(store, skip: tuple[str, ...] = ("readers",)) -> list[str]:
    """Delete temporary files a killed writer may leave: our ``.NAME.tmp-*`` files at the top
    of the store and zarr's ``*.partial`` files inside the store's zarr arrays (top-level
    directories holding a ``zarr.json``), except under ``skip`` (other processes' private
    tables).  Nothing else is looked at: a file the fit did not write is never deleted."""
    removed = []
    root = Path(store)
    if not root.is_dir():
        return removed

    def unlink(p) -> None:
        try:
            os.unlink(p)
            removed.append(str(p))
        except OSError:
            pass

    for entry in root.iterdir():
        if entry.is_file() and entry.name.startswith(".") and ".tmp-" in entry.name:
            unlink(entry)
        elif entry.is_dir() and entry.name not in skip and (entry / "zarr.json").is_file():
            for dp, _, fs in os.walk(entry):
                for f in fs:
                    if f.endswith(".partial"):
                        unlink(os.path.join(dp, f))
    return removed


# ----------------------------------------------------------------------------- small files

def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file, fsync and rename: readers see the old
    or the new file, never half of one; on any failure the temporary file is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_path(str(path.parent), directory=True)


_CHECKSUM_SEP = ',\n "checksum": "'


def _sha256_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def write_json_atomic(path: str | os.PathLike, obj: Any, checksum: bool = False) -> None:
    """Write JSON to ``path`` atomically (see :func:`write_bytes_atomic`).

    ``checksum=True`` (``obj`` a non-empty dict with string keys) appends a last field
    ``"checksum": "sha256:..."``, the SHA-256 of the file's text without that field, which
    ``read_json(path, checksum=True)`` verifies.  Serialisation happens before any file
    is touched, so an object that cannot be written leaves nothing behind.
    """
    if not checksum:
        write_bytes_atomic(path, json.dumps(obj, indent=1).encode())
        return
    if not isinstance(obj, dict) or not obj:
        raise TypeError("a checksummed JSON file holds a non-empty dict")
    body = json.dumps({k: v for k, v in obj.items() if k != "checksum"}, indent=1)
    text = body[:-2] + _CHECKSUM_SEP + _sha256_text(body) + '"\n}'
    write_bytes_atomic(path, text.encode())


def read_json(path: str | os.PathLike, checksum: bool = False) -> Any:
    """Read a JSON file; with ``checksum=True`` verify the checksum written by
    :func:`write_json_atomic` and raise :class:`IntegrityError` (naming the file) when the
    file is truncated, altered or has no checksum."""
    if not checksum:
        with open(path) as fh:
            return json.load(fh)
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8")
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise IntegrityError(path, f"not valid JSON (truncated or altered: {e})") from None
    if not isinstance(obj, dict) or "checksum" not in obj or _CHECKSUM_SEP not in text:
        raise IntegrityError(path, "has no checksum (altered, or written by another program)")
    stored = obj.pop("checksum")
    body = text.rsplit(_CHECKSUM_SEP, 1)[0] + "\n}"
    if _sha256_text(body) != stored:
        raise IntegrityError(path, "checksum mismatch (the file was altered or damaged)")
    return obj


def read_array_file(path) -> np.ndarray:
    """``np.load`` of a ``.npy`` file that we wrote, with damage reported as :class:`IntegrityError`."""
    try:
        with open(path, "rb") as fh:
            return np.load(io.BytesIO(fh.read()), allow_pickle=False)
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001
        raise IntegrityError(path, f"cannot be read ({type(e).__name__}: {e})") from None


def array_file_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()
