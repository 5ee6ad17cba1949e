"""Small files of a store: atomic replacement, checksummed JSON, ``.npy`` arrays, hashes, fsync.

Every file is replaced atomically (temporary file ``.NAME.tmp-PID-THREAD``, fsync, rename,
fsync of the directory), so a killed writer leaves the old or the new version, plus
possibly a temporary file that :func:`fsll_ooc.storage.remove_leftovers` deletes.
JSON written with ``checksum=True`` carries a SHA-256 of its content that
:func:`read_json` verifies (see ``docs/reliability.md``).
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import google_crc32c as _gcrc  # a dependency of zarr v3 (its crc32c codec uses it too)
import numpy as np

from .errors import IntegrityError

__all__ = ["LINK_REFUSAL", "refuse_link", "open_nofollow", "memmap_nofollow", "crc32c", "fsync_path", "syncfs", "file_sha256", "write_bytes_atomic",
           "write_json_atomic", "read_json", "read_array_file", "array_file_bytes", "is_temporary_file", "json_text",
           "parse_json"]


#: The refusal of a symbolic link where a store writes.
LINK_REFUSAL = "is a symbolic link; fsll-ooc never writes through a link in a store (remove the link)"


def refuse_link(path) -> None:
    """:class:`IntegrityError` naming ``path`` when it is a symbolic link (a store never writes
    through one)."""
    if os.path.islink(path):
        raise IntegrityError(path, LINK_REFUSAL)


def open_nofollow(path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a symbolic link at ``path`` (``O_NOFOLLOW``): a link
    planted in a store is refused with :class:`IntegrityError` and what it points to is untouched."""
    try:
        return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), mode)
    except OSError as e:
        if e.errno == errno.ELOOP or (e.errno in (errno.EEXIST, errno.EACCES) and os.path.islink(path)):
            raise IntegrityError(path, LINK_REFUSAL) from None
        raise


def memmap_nofollow(path, dtype, shape) -> np.memmap:
    """``np.memmap`` of an existing file, read-write, opened with ``O_NOFOLLOW`` (a link
    planted at ``path`` is refused, see :func:`open_nofollow`)."""
    fd = open_nofollow(path, os.O_RDWR)
    with os.fdopen(fd, "r+b") as fh:
        return np.memmap(fh, dtype=dtype, mode="r+", shape=shape)


def crc32c(data) -> int:
    """CRC-32C of a bytes object or a buffer (hardware-accelerated where available)."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data)
    elif not isinstance(data, bytes):
        data = np.frombuffer(data, dtype=np.uint8)
    return int(_gcrc.value(data))


def fsync_path(path, directory: bool = False) -> None:
    """fsync the file (or with ``directory=True`` the directory) ``path``.

    A path that cannot be opened is skipped; filesystems that do not support fsync
    (``EINVAL``, ``EROFS``, ``EBADF``) are tolerated; any other error (``EIO``, ``ENOSPC``)
    is raised: the data may not be on disk.
    """
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


def syncfs(path) -> bool:
    """One ``syncfs(2)`` of the filesystem holding ``path``; False where it is not available.

    Raises ``OSError`` when the filesystem reports lost writes (``ENOSPC``, ``EIO``, ``EDQUOT``).
    """
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


def file_sha256(path) -> str:
    """``"sha256:<hex>"`` of the file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


def is_temporary_file(name: str) -> bool:
    """Is ``name`` (a file name) a temporary file of :func:`write_bytes_atomic`?"""
    return name.startswith(".") and ".tmp-" in name


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file, fsync and rename: readers see the old
    or the new file, never half of one; on any failure the temporary file is removed."""
    path = Path(path)
    tmp = _temporary_name(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    if os.path.lexists(tmp):  # a leftover of a killed writer with our pid, or a planted link: remove the name
        os.unlink(tmp)
    fd = open_nofollow(tmp, flags)
    try:
        with os.fdopen(fd, "wb") as fh:
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
    fsync_path(str(path.parent), directory=True)


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
    write_bytes_atomic(path, json_text(obj, checksum).encode())


def json_text(obj: Any, checksum: bool = False) -> str:
    """The text :func:`write_json_atomic` writes (with ``checksum=True``, its last field
    ``"checksum"``); also the body of a state object in a store given by URL."""
    if not checksum:
        return json.dumps(obj, indent=1)
    if not isinstance(obj, dict) or not obj:
        raise TypeError("a checksummed JSON file holds a non-empty dict")
    body = json.dumps({k: v for k, v in obj.items() if k != "checksum"}, indent=1)
    return body[:-2] + _CHECKSUM_SEP + _sha256_text(body) + '"\n}'


def read_json(path: str | os.PathLike, checksum: bool = False) -> Any:
    """Read a JSON file; with ``checksum=True`` verify the checksum written by
    :func:`write_json_atomic` and raise :class:`IntegrityError` (naming the file) when the
    file is truncated, altered or has no checksum."""
    if not checksum:
        with open(path) as fh:
            return json.load(fh)
    with open(path, "rb") as fh:
        return parse_json(fh.read(), path)


def parse_json(data: bytes, path) -> Any:
    """The object of checksummed JSON ``data`` (the text of :func:`json_text`), verified;
    :class:`IntegrityError` naming ``path`` when it is truncated, altered or has no checksum."""
    try:
        text = data.decode("utf-8")
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
    """The bytes of ``a`` as a ``.npy`` file (no pickled objects), for :func:`write_bytes_atomic`."""
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()
