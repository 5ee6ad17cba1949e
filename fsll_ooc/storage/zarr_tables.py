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

Zarr writes a chunk to a ``*.partial`` file with a random name and renames it over the
chunk's path (a link planted at a chunk's path is replaced, never written through);
directories are another matter, so a table directory or chunk directory that is a
symbolic link is refused before anything is written.  A killed writer's partial files
are listed by :meth:`ZarrBackend.temporary_files`.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable

import numpy as np

from . import binding
from .base import CHECKSUM_BYTES, TableBackend, TableSpec, forget, key_chunks, open_table, register_backend
from .errors import IntegrityError
from .files import crc32c, file_sha256, fsync_path, refuse_link, syncfs

__all__ = ["ZarrBackend"]

_METADATA = "zarr.json"


def _chunk_file(spec: TableSpec, arr, coords) -> str:
    """The file of chunk ``coords`` (the default chunk key encoding ``c/i/j/...``, the only one
    :meth:`ZarrBackend.create` makes; checked by :meth:`ZarrBackend.open`)."""
    return os.path.join(spec.path, "c", *(str(int(c)) for c in coords))


def _check_chunk_files(spec: TableSpec, files) -> None:
    want = spec.chunk_nbytes + CHECKSUM_BYTES
    for f in files:
        try:
            size = os.stat(f).st_size
        except FileNotFoundError:
            raise IntegrityError(f, "chunk file is missing (deleted, or the table was never completely written)") from None
        if size != want:
            raise IntegrityError(f, f"chunk file has {size:,} bytes, expected {want:,} (truncated or altered)")


def _chunk_id(spec: TableSpec, coords) -> int:
    return int(np.ravel_multi_index(tuple(int(c) for c in coords), spec.grid))


def _stored_crc(f: str) -> int:
    """The codec's CRC-32C of chunk file ``f`` (its last 4 bytes; the file's size was checked)."""
    fd = os.open(f, os.O_RDONLY)
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
        coords, _ = key_chunks(spec, key)
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
