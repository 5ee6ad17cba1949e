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

__all__ = ["total_memory", "cgroup_memory_limit", "free_disk"]

#: Where the kernel shows this process's control groups and their files (tests point these elsewhere).
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def cgroup_memory_limit() -> int | None:
    """The memory limit of this process's control group (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) in bytes; None when there is none (or it exceeds the machine)."""
    try:
        with open(PROC_CGROUP) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        path = path.strip("/")
        if controllers == "":  # v2 (unified hierarchy)
            candidates += [os.path.join(CGROUP_ROOT, path, "memory.max"), os.path.join(CGROUP_ROOT, "memory.max")]
        elif "memory" in controllers.split(","):  # v1
            base = os.path.join(CGROUP_ROOT, "memory")
            candidates += [os.path.join(base, path, "memory.limit_in_bytes"),
                           os.path.join(base, "memory.limit_in_bytes")]
    phys = _physical_memory()
    for f in candidates:
        try:
            with open(f) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if not text.isdigit():  # "max": no limit
            return None
        limit = int(text)
        return None if limit <= 0 or (phys is not None and limit >= phys) else limit
    return None


def total_memory() -> int | None:
    """Memory this process may use in bytes: the machine's, or its control group's limit when
    that is lower (a container); None where the system does not say."""
    phys, limit = _physical_memory(), cgroup_memory_limit()
    if limit is not None and (phys is None or limit < phys):
        return limit
    return phys


def free_disk(path) -> int:
    """Free bytes of the file system that holds ``path`` (or would: its nearest existing parent)."""
    parent = os.path.abspath(os.fspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return shutil.disk_usage(parent).free
