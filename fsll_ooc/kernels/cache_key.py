"""numba's on-disk cache of the kernels, keyed on the sources of every kernel module.

numba keys a cached kernel on its own source file's time stamp and size only.  A kernel that
calls or inlines a kernel of another module (the table passes' partner in ``bandops`` walks
the rows with ``search.axis_rows``) would go on running the other module's older code from
the cache after that module changed: in a development checkout after ``git pull``, say (an
installed package rewrites every file, and so every stamp).  :func:`install` adds a digest of
every ``.py`` file of the kernels' folder to the stamp of their cache entries, so that a
change to any kernel module makes numba compile all of them again.

It works through numba's cache locators (``CacheImpl._locator_classes``, an internal part of
numba); where numba lacks them, nothing changes and numba keeps its own keys.

>>> from fsll_ooc.kernels import cache_key
>>> len(cache_key.sources_digest())
64
"""
from __future__ import annotations

import hashlib
import os

__all__ = ["sources_digest", "install"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_installed: set[str] = set()


def sources_digest(folder: str = _HERE) -> str:
    """SHA-256 (hex) of the names and contents of the ``.py`` files in ``folder``."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def _wrapped(base, folder: str, digest: str):
    """A subclass of the locator class ``base`` that takes only the files of ``folder`` and
    adds ``digest`` to their stamp."""

    class Locator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            if os.path.dirname(os.path.abspath(py_file)) != folder:
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return (super().get_source_stamp(), digest)

    Locator.__name__ = Locator.__qualname__ = "Sources" + base.__name__.lstrip("_")
    return Locator


def install(folder: str = _HERE) -> bool:
    """Key numba's cache of the kernels in ``folder`` (default: this package's) on the digest
    of all their sources as well.  Returns whether it is in place (once per folder and
    process; False where numba's locators are not as expected)."""
    folder = os.path.dirname(os.path.join(os.path.abspath(folder), ""))
    if folder in _installed:
        return True
    try:
        from numba.core import caching

        impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
        bases = [b for b in impl._locator_classes if hasattr(b, "get_source_stamp")]
        if not bases:
            return False
        digest = sources_digest(folder)
        impl._locator_classes = [_wrapped(b, folder, digest) for b in bases] + list(impl._locator_classes)
    except Exception:  # an unexpected numba: its own keys stay
        return False
    _installed.add(folder)
    return True
