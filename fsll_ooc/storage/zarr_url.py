"""The backend ``"zarr_url"``: a table is a Zarr v3 array at a URL (fsspec: ``s3://``, ``gs://``, ...).

The arrays have the layout the local ``zarr`` backend writes (uncompressed, chunks of the
planner's chunk shape, 4 bytes of checksum after each chunk's values, every chunk
stored); where a local table keeps each chunk's binding in a side file, a table at a URL
keeps it in the chunk object (below), so a store copied between a bucket and a disk is
refused as not bound (``restart=True`` rebuilds its tables).  A spec's ``path`` is the array's URL and its
``options`` the fsspec storage options (JSON), which travel with the spec to every
dask worker.

Every read and write goes to the chunk objects themselves, many at once (``fs.cat`` /
``fs.pipe``; a key that covers part of a chunk reads the whole chunk, and a partial write
rewrites it whole): every chunk read must exist with its exact size and checksum, else
:class:`~fsll_ooc.storage.IntegrityError` names the object (a missing chunk is damage,
never zeros).  Each chunk is one PUT, which an object store applies atomically, so there
are no temporary objects to clean up.

The 4 bytes after a chunk's values, where zarr's ``crc32c`` codec keeps the CRC-32C of the
values, hold that CRC bound to the chunk's place (:func:`fsll_ooc.storage.binding.bind`:
the fit's id, the table's name, the chunk's number, and the lease it was written under),
so a chunk object swapped with another, moved from another table or copied from another
fit is refused by name, as on a local disk, with no side object to keep in step; and so
is a chunk that a writer whose lease was taken over sent after its successor rewrote
the table.  The price: zarr itself (or
``dask.array.from_zarr``) refuses these chunks as damaged; read a table through
:func:`fsll_ooc.storage.read` or :func:`fsll_ooc.storage.as_array`.
"""
from __future__ import annotations

import hashlib

import numpy as np

from . import binding
from .base import CHECKSUM_BYTES, TableBackend, TableSpec, chunk_slices, forget, key_chunks, normalize_key, \
    open_table, register_backend
from .errors import IntegrityError
from .files import crc32c
from .url_store import URL_FORMS, check_lease, decode_options, filesystem, is_s3
from .zarr_tables import open_checked

__all__ = ["ZarrURLBackend"]

_METADATA = "zarr.json"


def _chunk_path(spec: TableSpec, coords) -> str:
    _, path = filesystem(spec.path, spec.options)
    # the default chunk key encoding of zarr v3: c/i/j/...
    return path + "/c/" + "/".join(str(int(i)) for i in coords)


def _chunk_url(spec: TableSpec, coords) -> str:
    """The URL of chunk ``coords`` (how messages name it)."""
    return spec.path.rstrip("/") + "/c/" + "/".join(str(int(i)) for i in coords)


def _chunk_id(spec: TableSpec, coords) -> int:
    """The chunk's C-order number (its place in :func:`fsll_ooc.storage.binding.place`)."""
    return int(np.ravel_multi_index(tuple(int(c) for c in coords), spec.grid))


def _decode(spec: TableSpec, where: str, data, coords) -> np.ndarray:
    """The chunk's values from its stored bytes, checked (size, CRC-32C bound to its place)."""
    if isinstance(data, BaseException):
        if isinstance(data, FileNotFoundError):
            raise IntegrityError(where, "chunk object is missing (deleted, or the table was never completely written)")
        raise IntegrityError(where, f"chunk object cannot be read ({type(data).__name__}: {data})")
    want = spec.chunk_nbytes + CHECKSUM_BYTES
    if len(data) != want:
        raise IntegrityError(where, f"chunk object has {len(data):,} bytes, expected {want:,} (truncated or altered)")
    body = memoryview(data)[:-CHECKSUM_BYTES]
    crc = crc32c(body)
    stored = int.from_bytes(bytes(data[-CHECKSUM_BYTES:]), "little")
    if binding.bind(spec, crc, _chunk_id(spec, coords)) != stored:
        if stored == crc:
            raise IntegrityError(where, "chunk checksum is not bound to its place (the object was written by zarr "
                                        "itself or by an older fsll-ooc)")
        late = ("; or it was sent late by a writer whose lease on the store had been taken over, and is not "
                "this writer's" if spec.generation else "")
        raise IntegrityError(where, "chunk checksum mismatch: the object was altered or damaged, or "
                             + binding.PLACE_PROBLEM + late)
    return np.frombuffer(body, dtype=np.dtype(spec.dtype).newbyteorder("<")).reshape(spec.chunks)


def _encode(spec: TableSpec, block: np.ndarray, coords) -> bytes:
    body = np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<")).tobytes()
    return body + binding.bind(spec, crc32c(body), _chunk_id(spec, coords)).to_bytes(CHECKSUM_BYTES, "little")


def _read_chunks(spec: TableSpec, coords: list) -> dict:
    """``{coords: values}`` of the chunks ``coords``, each checked (:func:`_decode`), 64 objects at a time."""
    fs, _ = filesystem(spec.path, spec.options)
    out = {}
    for i in range(0, len(coords), 64):
        part = coords[i:i + 64]
        paths = [_chunk_path(spec, c) for c in part]
        got = _cat(fs, paths)
        for c, p in zip(part, paths):
            out[tuple(c)] = _decode(spec, _chunk_url(spec, c), got.get(p, FileNotFoundError(p)), c)
    return out


def _region(spec: TableSpec, key) -> tuple[list[tuple[int, int]], list[int]]:
    """Per axis ``(start, stop)`` of ``key``, and the axes given as integers (dropped from the result)."""
    bounds, drop = [], []
    for ax, (k, s) in enumerate(zip(normalize_key(key, len(spec.shape)), spec.shape)):
        if isinstance(k, (int, np.integer)):
            i = int(k) + (s if k < 0 else 0)
            bounds.append((i, i + 1))
            drop.append(ax)
        else:
            start, stop, _ = k.indices(s)
            bounds.append((start, max(start, stop)))
    return bounds, drop


@register_backend
class ZarrURLBackend(TableBackend):
    """Zarr v3 arrays at a URL, one object per chunk with its CRC-32C (codec ``crc32c``)."""

    name = "zarr_url"
    persistent = True
    supports_inplace_views = False
    checksummed = True
    checksum_bytes_per_chunk = CHECKSUM_BYTES

    def table_path(self, store, name: str, dtype: str = "float64") -> str:
        return f"{str(store).rstrip('/')}/{name}"

    def _store(self, spec: TableSpec):
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(spec.path, storage_options=decode_options(spec.options))

    def create(self, spec: TableSpec) -> TableSpec:
        import zarr
        from zarr.codecs import Crc32cCodec

        fs, path = filesystem(spec.path, spec.options)
        if fs.exists(path):  # an old table of another shape must leave no chunk behind
            fs.rm(path, recursive=True)
        zarr.create_array(store=self._store(spec), shape=spec.shape, chunks=spec.chunks, dtype=spec.dtype,
                          compressors=[Crc32cCodec()], fill_value=0.0, zarr_format=3, overwrite=True,
                          config={"write_empty_chunks": True})
        return spec

    def open(self, spec: TableSpec):
        fs, path = filesystem(spec.path, spec.options)
        meta = f"{spec.path}/{_METADATA}"
        fs.invalidate_cache(path)
        if not fs.exists(f"{path}/{_METADATA}"):
            raise IntegrityError(meta, "array metadata is missing")
        return open_checked(self._store(spec), spec, meta)

    def read(self, spec: TableSpec, key: tuple) -> np.ndarray:
        open_table(spec)  # the metadata, checked once per process
        coords, _ = key_chunks(spec, key)
        bounds, drop = _region(spec, key)
        out = np.empty([b - a for a, b in bounds], dtype=spec.dtype)
        if coords:
            for c, chunk in _read_chunks(spec, coords).items():
                src, dst = [], []
                for (a, b), sl, size in zip(bounds, chunk_slices(spec, c), spec.chunks):
                    lo, hi = max(a, sl.start), min(b, sl.stop)
                    src.append(slice(lo - sl.start, hi - sl.start))
                    dst.append(slice(lo - a, hi - a))
                out[tuple(dst)] = chunk[tuple(src)]
        return out.reshape([n for ax, n in enumerate(out.shape) if ax not in drop]) if drop else out

    def write(self, spec: TableSpec, key: tuple, value: np.ndarray) -> None:
        coords, aligned = key_chunks(spec, key)
        if not coords:
            return
        bounds, _ = _region(spec, key)
        shape = [b - a for a, b in bounds]  # an integer in the key keeps its axis here, of size 1
        value = np.asarray(value, dtype=spec.dtype)
        value = value.reshape(shape) if value.size == int(np.prod(shape)) else np.broadcast_to(value, shape)
        # a key covering part of a chunk rewrites the chunk whole (a chunk never written: zeros)
        old = {} if aligned else _read_chunks_or_zeros(spec, coords)
        objects = {}
        for c in coords:
            block = np.array(old[tuple(c)]) if tuple(c) in old else np.zeros(spec.chunks, dtype=spec.dtype)
            sl = chunk_slices(spec, c)  # an edge chunk is stored whole, padded
            lo = [max(a, s.start) for (a, _), s in zip(bounds, sl)]
            hi = [min(b, s.stop) for (_, b), s in zip(bounds, sl)]
            block[tuple(slice(l - s.start, h - s.start) for l, h, s in zip(lo, hi, sl))] = \
                value[tuple(slice(l - a, h - a) for l, h, (a, _) in zip(lo, hi, bounds))]
            objects[_chunk_path(spec, c)] = _encode(spec, block, c)
        fs, _ = filesystem(spec.path, spec.options)
        if spec.lease:
            check_lease(spec)
        fs.pipe(objects)

    def gather(self, spec: TableSpec, flat: np.ndarray) -> np.ndarray:
        """The cells ``flat``, from their chunks (each read once and checked)."""
        open_table(spec)
        flat = np.asarray(flat, dtype=np.int64).reshape(-1)
        cell = np.stack(np.unravel_index(flat, spec.shape), axis=1) if flat.size else np.zeros((0, len(spec.shape)), int)
        where = cell // np.asarray(spec.chunks)
        out = np.empty(flat.size, dtype=np.float64)
        ids = np.ravel_multi_index(tuple(where.T), spec.grid) if flat.size else where[:, 0]
        order = np.unique(ids)
        chunks = _read_chunks(spec, [tuple(int(v) for v in np.unravel_index(i, spec.grid)) for i in order])
        for i in order:
            rows = np.flatnonzero(ids == i)
            c = tuple(int(v) for v in np.unravel_index(i, spec.grid))
            inside = cell[rows] - np.asarray(c) * np.asarray(spec.chunks)
            out[rows] = chunks[c][tuple(inside.T)]
        return out

    def as_array(self, spec: TableSpec):
        """A lazy ``dask.array`` whose blocks are the table's chunks, each read and checked."""
        import dask.array as da

        open_table(spec)
        return da.from_array(_Chunks(spec), chunks=spec.chunks, asarray=True, fancy=False)

    def check(self, spec: TableSpec) -> None:
        """Metadata, and every chunk object present with its exact size (one listing)."""
        forget(spec)
        open_table(spec)
        fs, path = filesystem(spec.path, spec.options)
        fs.invalidate_cache(path)
        try:
            sizes = {k.rstrip("/"): v.get("size") for k, v in fs.find(path + "/c", detail=True).items()}
        except FileNotFoundError:
            sizes = {}
        want = spec.chunk_nbytes + CHECKSUM_BYTES
        for c in np.ndindex(*spec.grid):
            p = _chunk_path(spec, c)
            size = sizes.get(p)
            if size is None:
                raise IntegrityError(_chunk_url(spec, c), "chunk object is missing (deleted, or the table was never completely written)")
            if size != want:
                raise IntegrityError(_chunk_url(spec, c), f"chunk object has {size:,} bytes, expected {want:,} (truncated or altered)")

    def verify(self, spec: TableSpec) -> None:
        """Every chunk object's size and checksum (reads the whole table once, 64 chunks at a time)."""
        self.check(spec)
        grid = list(np.ndindex(*spec.grid))
        for i in range(0, len(grid), 64):
            _read_chunks(spec, grid[i:i + 64])

    def fingerprint(self, spec: TableSpec) -> dict:
        return {"metadata": _METADATA, "sha256": self._metadata_hash(spec)}

    def _metadata_hash(self, spec: TableSpec) -> str:
        fs, path = filesystem(spec.path, spec.options)
        try:
            data = fs.cat_file(f"{path}/{_METADATA}")
        except FileNotFoundError:
            raise IntegrityError(f"{spec.path}/{_METADATA}", "array metadata is missing") from None
        return "sha256:" + hashlib.sha256(data).hexdigest()

    def check_fingerprint(self, spec: TableSpec, fp: dict) -> None:
        """The metadata's hash, then the metadata describes the table (chunk objects are not looked at)."""
        if self._metadata_hash(spec) != fp.get("sha256"):
            raise IntegrityError(f"{spec.path}/{_METADATA}",
                                 "array metadata changed since the fit wrote it (altered or replaced)")
        forget(spec)
        open_table(spec)


class _Chunks:
    """A table at a URL as an array-like for ``dask.array.from_array`` (reads through the backend)."""

    def __init__(self, spec: TableSpec):
        self.spec = spec
        self.shape, self.dtype, self.ndim = spec.shape, np.dtype(spec.dtype), len(spec.shape)

    def __getitem__(self, key):
        return ZarrURLBackend().read(self.spec, key)


def _read_chunks_or_zeros(spec: TableSpec, coords: list) -> dict:
    """:func:`_read_chunks` of the chunks that exist (a partial write into a chunk never
    written starts from zeros, as zarr's fill value)."""
    fs, _ = filesystem(spec.path, spec.options)
    there = [c for c in coords if fs.exists(_chunk_path(spec, c))]
    return _read_chunks(spec, there)


def _cat(fs, paths: list[str]) -> dict:
    """The objects ``paths``, fetched concurrently, as ``{path: bytes or the exception}``
    (each one GET: S3's size request before a download is skipped, the chunks are read
    concurrently anyway)."""
    kw = {"max_concurrency": 1} if is_s3(fs) else {}
    if len(paths) == 1:
        try:
            return {paths[0]: fs.cat_file(paths[0], **kw)}
        except Exception as e:  # noqa: BLE001 - reported by _decode, naming the object
            return {paths[0]: e}
    return fs.cat(paths, on_error="return", **kw)


URL_FORMS["zarr"] = ZarrURLBackend.name  # a store's "zarr" tables, at a URL
