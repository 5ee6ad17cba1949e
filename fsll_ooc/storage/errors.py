"""The two errors a store raises: damaged content and a full disk."""
from __future__ import annotations

__all__ = ["IntegrityError", "DiskFullError"]


class IntegrityError(ValueError):
    """A store file is missing, truncated, altered or inconsistent; ``path`` names it.

    The file's content is never used: the error is raised before.
    """

    def __init__(self, path, problem: str, advice: str = ""):
        self.path = str(path)
        self.problem = problem
        msg = f"{self.path}: {problem}"
        if advice:
            msg += f"; {advice}"
        super().__init__(msg)


class DiskFullError(OSError):
    """No space left on the store's filesystem (``errno`` is ``ENOSPC``); the message names
    the store, the free space and what the fit needs; ``filename`` is the store."""

    def __str__(self) -> str:
        return str(self.strerror)
