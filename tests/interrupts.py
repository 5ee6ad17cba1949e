"""Stopping a fit in-process at a chosen state write (for resume tests), and a store
table copied from another fit (for tests of foreign tables)."""
from __future__ import annotations

import shutil

from fsll_ooc.storage.fit_store import FitStore


class Crash(Exception):
    """Raised by :func:`stop_after` in place of a kill."""


def on_persist(monkeypatch, n: int, action) -> None:
    """Run ``action()`` right after the fit's ``n``-th state write (undo: ``monkeypatch.undo()``)."""
    calls = [0]
    orig = FitStore.write_state

    def persist(self, *a, **k):
        orig(self, *a, **k)
        calls[0] += 1
        if calls[0] == n:
            action()

    monkeypatch.setattr(FitStore, "write_state", persist)


def stop_after(monkeypatch, n: int) -> None:
    """Raise :class:`Crash` right after the fit's ``n``-th state write."""
    def crash():
        raise Crash()

    on_persist(monkeypatch, n, crash)


def copy_table(src, dst, backend: str, table: str) -> str:
    """Replace table ``table`` of store ``dst`` by the one of store ``src`` (a fit with the same
    cardinalities), with its checksum side file; returns the table's file or directory name."""
    name = table if backend == "zarr" else f"{table}.f64"
    if backend == "zarr":
        shutil.rmtree(dst / name)
        shutil.copytree(src / name, dst / name)
    else:
        shutil.copy(src / name, dst / name)
    shutil.copy(src / f"{name}.crc32c", dst / f"{name}.crc32c")
    return name
