"""The store directory: refuse a directory that is not a store, remove a killed writer's temporary files.

Store layout (``backend="zarr"``)::

    STORE/dbar/zarr.json, STORE/dbar/c/...   # zarr arrays, one per table
    STORE/dbar.crc32c                         # the chunks' checksums bound to table, position and fit
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

import os
from pathlib import Path

from .base import backend_names, get_backend
from .errors import IntegrityError
from .files import LINK_REFUSAL, is_temporary_file

__all__ = ["STORE_MARKERS", "check_store_dir", "remove_leftovers"]

#: Files that only an fsll-ooc store holds (fit state, kept data, writer lock).
STORE_MARKERS = ("fsll_state.json", "fsll_counts.npy", "fsll.lock", "fsll.lock.d")
#: Of those, the ones that make a directory a store: a fit wrote its data or its state there.
#: A lock alone does not (anyone can create one; a fit killed before it kept its data
#: leaves a directory holding nothing else, which counts as empty).
_DATA_MARKERS = ("fsll_state.json", "fsll_counts.npy")


def check_store_dir(store) -> None:
    """Refuse to use a directory that holds other things than an fsll-ooc store.

    A store is created in a new or empty directory; a fit replaces its ``dbar``,
    ``thetabar`` and ``scratch`` entries and deletes temporary files, which in a user's
    directory could be anything.  A directory is a store when it holds the fit's state or
    kept data as regular files; otherwise it may hold only a lock (``fsll.lock``, a regular
    file; ``fsll.lock.d``, a directory).  A marker that is a symbolic link, or a lock file
    that is not a regular file, is refused.  Raises ``ValueError`` (an
    :class:`~fsll_ooc.storage.IntegrityError` for a link) before anything is written.
    """
    root = Path(store)
    if root.exists() and not root.is_dir():
        raise ValueError(f"store {root} is a file, not a directory")
    if not root.is_dir():
        return
    for m in STORE_MARKERS:
        if os.path.islink(root / m):
            raise IntegrityError(root / m, LINK_REFUSAL)
    if any((root / m).is_file() for m in _DATA_MARKERS):
        return
    lock = root / "fsll.lock"
    if lock.exists() and not lock.is_file():
        raise ValueError(f"store {root}: {lock.name} is not a regular file (a directory?); it is the store's "
                         "lock: remove it, or give a new or empty directory")
    try:
        entries = sorted(p.name for p in root.iterdir()
                         if not (p.name == "fsll.lock" or (p.name == "fsll.lock.d" and p.is_dir())))
    except OSError as e:
        raise ValueError(f"store {root} cannot be listed ({e.strerror})") from None
    if entries:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ValueError(f"store {root} is not empty and is not an fsll-ooc store (it holds {shown}); "
                         "a fit would replace or delete files there: give a new or empty directory")


def remove_leftovers(store, skip: tuple[str, ...] = ("readers",)) -> list[str]:
    """Delete temporary files a killed writer may leave: our ``.NAME.tmp-*`` files at the top
    of the store and each backend's :meth:`~fsll_ooc.storage.TableBackend.temporary_files`
    (zarr's ``*.partial`` chunk files), except under ``skip`` (other processes' private
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
        if entry.is_file() and is_temporary_file(entry.name):
            unlink(entry)
    for name in backend_names():
        for p in list(get_backend(name).temporary_files(root, skip)):
            unlink(p)
    return removed
