"""Stopping a fit in-process at a chosen state write (for resume tests)."""
from __future__ import annotations

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
