"""Compiling kernels in a second process while this one works (the first use after installing).

numba compiles a kernel the first time it is called with new argument types and keeps
the result in its on-disk cache, so only the first process after installing (or after
the kernels' source changed) pays for compiling.  Compiling holds a lock for the whole
process, so a second *thread* cannot compile at the same time as the first; a second
*process* can.  A new fit needs two groups of kernels, one after the other: the
transforms first (the targets ``dbar`` are a transform of the data's counts), then the
fused update + scan (:mod:`fsll_ooc.kernels.scan`).  :func:`start` compiles a group in
a child process, which writes numba's cache and exits; the fit compiles its transforms
meanwhile, and :func:`wait` (called before the group's first kernel runs) waits for the
child, after which numba loads the group from the cache.  On two cores the first fit
then waits for the longer of the two compiles instead of their sum
(docs/benchmarks.md, section 3).

Nothing changes when the cache already holds the kernels (no child is started), and
every failure (no child process possible, a child that dies, a cache the child could
not write) ends in the usual compile in this process: the same kernels either way.
"""
from __future__ import annotations

import atexit
import importlib
import os
import subprocess
import sys
import threading

__all__ = ["is_cached", "start", "running", "ready", "wait", "WAIT_SECONDS"]

#: How long :func:`wait` waits for a child before compiling in this process instead.
WAIT_SECONDS = 300.0

_lock = threading.Lock()
_children: dict[str, tuple[int, subprocess.Popen]] = {}  # module -> (owner pid, child)

# The child: compiles (or finds cached) the listed kernels of a module, then exits.
# ``ahead_kernels()`` of the module gives ``(dispatcher, argument types)`` pairs.  The
# module's top-level package is entered without running its ``__init__`` (which imports
# much more than the kernels need: seconds on a busy machine); numba's cache is keyed on
# the kernels' source file and names, the same either way.
_CHILD = """import importlib, os, sys, types
root, module = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
top = module.split(".")[0]
if "." in module and os.path.isdir(os.path.join(root, top)):
    pkg = types.ModuleType(top)
    pkg.__path__ = [os.path.join(root, top)]
    sys.modules[top] = pkg
for disp, sig in importlib.import_module(module).ahead_kernels():
    disp.compile(sig)
"""


def is_cached(disp, sig) -> bool:
    """Is the specialisation ``sig`` (a tuple of numba types) of the numba dispatcher ``disp``
    compiled in this process or in numba's on-disk cache (current for this source)?

    Reads numba's cache index the way numba does on a first call; anything unexpected
    counts as cached (then nothing is started and numba proceeds as usual)."""
    try:
        if tuple(sig) in disp.overloads:
            return True
        cache = disp._cache
        key = cache._index_key(tuple(sig), disp.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:
        return True


def _missing(module: str) -> bool:
    mod = importlib.import_module(module)
    return any(not is_cached(d, s) for d, s in mod.ahead_kernels())


def start(module: str) -> bool:
    """Compile the kernels ``ahead_kernels()`` of ``module`` (e.g. ``"fsll_ooc.kernels.scan"``)
    in a child process unless they are all cached or a child is already at it.  Returns
    whether a child was started.  Call :func:`wait` before the kernels' first use."""
    with _lock:
        if module in _children and _children[module][0] == os.getpid():
            return False
        try:
            if not _missing(module):
                return False
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            child = subprocess.Popen([sys.executable, "-c", _CHILD, root, module], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
        except Exception:  # no child: numba compiles in this process, as without this module
            return False
        _children[module] = (os.getpid(), child)
        return True


def running(module: str) -> bool:
    """Is a child started by this process still compiling ``module``'s kernels?"""
    entry = _children.get(module)
    return entry is not None and entry[0] == os.getpid() and entry[1].poll() is None


_ready: dict[str, bool] = {}  # module -> asked for a child (False) or ready (True), in this process


def ready(module: str) -> bool:
    """May ``module``'s kernels (its ``ahead_kernels()``) be called now, by a caller that has
    a fallback with the same bits?  Not while a child started by this process compiles them;
    the first call asks for one (:func:`start`; none starts when they are cached).  Once that
    child has ended, or when none could start, yes: numba loads them from its cache or
    compiles them here (asked once per process, never again at every call)."""
    state = _ready.get(module)
    if state:
        return True
    if running(module):
        return False
    if state is None:
        _ready[module] = False
        if start(module):
            return False
    _ready[module] = True
    return True


def wait(module: str, timeout: float | None = None) -> None:
    """Wait until the child compiling ``module``'s kernels (if any, started by this process)
    has finished, at most ``timeout`` seconds (default :data:`WAIT_SECONDS`); numba then
    loads them from its cache on their first call, or compiles them here if the child did
    not write them.  Cheap when no child runs: callers call it before every pass."""
    if not _children:
        return
    entry = _children.get(module)
    if entry is None or entry[0] != os.getpid():
        return
    child = entry[1]  # every thread that asks waits (Popen.wait may be called from several)
    try:
        child.wait(WAIT_SECONDS if timeout is None else timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    with _lock:
        if _children.get(module) is entry:
            del _children[module]


@atexit.register
def _stop_children() -> None:
    """A child still compiling when this process ends is stopped (numba writes each cache
    file under a temporary name and renames it, so a stopped child leaves no half file)."""
    for pid, child in list(_children.values()):
        if pid == os.getpid() and child.poll() is None:
            child.kill()
            child.wait()

