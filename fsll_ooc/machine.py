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

__all__ = ["total_memory", "cgroup_memory_limit", "free_disk", "disk_speed", "memory_speed"]

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


def disk_speed(directory, nbytes: int = 128 * 2**20, block: int = 8 * 2**20) -> tuple[float, float]:
    """``(write, read)`` bytes per second of a sequential write and read of a temporary file of
    ``nbytes`` in ``directory`` (removed afterwards).

    The write is timed up to its ``fsync`` and the file's pages are then dropped from the page
    cache (``posix_fadvise(DONTNEED)``), so neither figure is the speed of memory.  The data are
    random (a compressing file system would flatter zeros).
    """
    import tempfile
    import time

    import numpy as np

    buf = np.random.default_rng(0).integers(0, 256, block, dtype=np.uint8).tobytes()
    n_blocks = max(1, nbytes // block)
    fd, path = tempfile.mkstemp(prefix=".fsll-ooc-speed-", dir=directory)
    try:
        t0 = time.perf_counter()
        for _ in range(n_blocks):
            os.write(fd, buf)
        os.fsync(fd)
        t1 = time.perf_counter()
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        t2 = time.perf_counter()
        while os.read(fd, block):
            pass
        t3 = time.perf_counter()
    finally:
        os.close(fd)
        os.unlink(path)
    total = n_blocks * block
    return total / max(t1 - t0, 1e-9), total / max(t3 - t2, 1e-9)


def memory_speed(nbytes: int = 64 * 2**20) -> float:
    """Bytes per second that a copy between two arrays of ``nbytes`` moves (read plus write),
    the best of three."""
    import numpy as np

    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    best = min(_timed(np.copyto, dst, src) for _ in range(3))
    return 2 * src.nbytes / max(best, 1e-9)


def _timed(f, *args) -> float:
    import time

    t0 = time.perf_counter()
    f(*args)
    return time.perf_counter() - t0
