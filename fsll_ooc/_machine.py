"""Facts about the machine a fit runs on: its memory and the free space of a disk.

The one home of these questions (the estimator's default budgets, the ``plan`` command).

>>> total_memory() is None or total_memory() > 0
True
>>> free_disk("/no/such/dir/below/the/root") >= 0
True
"""
from __future__ import annotations

import os
import shutil

__all__ = ["total_memory", "free_disk"]


def total_memory() -> int | None:
    """Physical memory of this machine in bytes; None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def free_disk(path) -> int:
    """Free bytes of the file system that holds ``path`` (or would: its nearest existing parent)."""
    parent = os.path.abspath(os.fspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return shutil.disk_usage(parent).free
