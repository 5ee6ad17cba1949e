"""The Zarr v3 backend ``"zarr"``: a table is a Zarr array directory ``STORE/NAME/``.

Arrays are uncompressed (random float64 barely compresses and zstd halves throughput,
see ``docs/design.md``) with chunks equal to the planner's chunk shape; every task
writes whole chunks, so concurrent writers never share a chunk.

Every chunk carries a CRC-32C (the standard ``crc32c`` codec of the Zarr v3 spec, 4 bytes
per chunk) checked by zarr on every decode; every chunk is written even when it is all
zeros (``write_empty_chunks``), so before a band is read each of its chunk files must
exist with the exact encoded size.  A missing, truncated or altered chunk raises
:class:`~fsll_ooc.storage.IntegrityError` naming the file, and so does array metadata
(``zarr.json``) that does not parse or no longer describes the table.  Zarr writes a
chunk to a ``*.partial`` file and renames it; a killed writer's partial files are
listed by :meth:`ZarrBackend.temporary_files`.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable

import numpy as np

from .base import CHECKSUM_BYTES, TableBackend, TableSpec, forget, key_chunks, open_table, register_backend
from .errors import IntegrityError
from .files import crc32c, file_sha256, fsync_path, syncfs

__all__ = ["ZarrBackend"]

_METADATA = "zarr.json"


def _chunk_file(spec: TableSpec, arr, coords) -> str:
    enc = arr.metadata.chunk_key_encoding
    return os.path.join(spec.path, *enc.encode_chunk_key(tuple(coords)).split("/"))


def _check_chunk_files(spec: TableSpec, files) -> None:
    want = spec.chunk_nbytes + CHECKSUM_BYTES
    for f in files:
        try:
            size = os.stat(f).st_size
        except FileNotFoundError:
            raise IntegrityError(f, "chunk file is missing (deleted, or the table was never completely written)") from None
        if size != want:
            raise IntegrityError(f, f"chunk file has {size:,} bytes, expected {want:,} (truncated or altered)")


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
    checksum_bytes_per_chunk = CHECKSUM_BYTES

    def table_path(self, store, name: str, dtype: str = "float64") -> str:
        return str(Path(store) / name)

    def create(self, spec: TableSpec) -> TableSpec:
        import zarr
        from zarr.codecs import Crc32cCodec

        if os.path.isdir(spec.path):  # zarr's overwrite leaves stray chunk files of other shapes
            shutil.rmtree(spec.path)
        arr = zarr.create_array(store=spec.path, shape=spec.shape, chunks=spec.chunks, dtype=spec.dtype,
                                compressors=[Crc32cCodec()], fill_value=0.0, zarr_format=3, overwrite=True,
                                config={"write_empty_chunks": True})
        del arr
        return spec

    def open(self, spec: TableSpec):
        meta = os.path.join(spec.path, _METADATA)
        if not os.path.exists(meta):
            raise IntegrityError(meta, "array metadata is missing")
        return open_checked(spec.path, spec, meta)

    def read(self, spec: TableSpec, key: tuple) -> np.ndarray:
        arr = open_table(spec)
        coords, _ = key_chunks(spec, key)
        files = [_chunk_file(spec, arr, c) for c in coords]
        _check_chunk_files(spec, files)
        try:
            out = arr[key]
        except Exception as e:  # noqa: BLE001 - find the chunk that failed and name it
            for f in files:
                _check_chunk_content(spec, f)
            raise IntegrityError(spec.path, f"reading {key!r} failed ({type(e).__name__}: {e})") from e
        return np.ascontiguousarray(out)

    def write(self, spec: TableSpec, key: tuple, value: np.ndarray) -> None:
        open_table(spec)[key] = value

    def gather(self, spec: TableSpec, flat: np.ndarray) -> np.ndarray:
        arr = open_table(spec)
        return np.asarray(arr.get_coordinate_selection(np.unravel_index(flat, spec.shape)), dtype=np.float64)

    def as_array(self, spec: TableSpec):
        import dask.array as da

        return da.from_zarr(spec.path)

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
            _check_chunk_content(spec, _chunk_file(spec, arr, c))

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
