"""What a table backend is: the :class:`TableBackend` interface, its registry, and :class:`TableSpec`.

A *table* is one ``|X|``-cell array of a fit (``dbar``, ``thetabar``, ``scratch``), stored
in chunks of the planner's chunk shape.  A *backend* stores tables one way (in memory,
a memmap file, a Zarr v3 array, ...).  Backends are classes registered by name
(:func:`register_backend`); callers hold a :class:`TableSpec` (backend name, location,
shape, chunks, dtype) and ask the backend's capabilities or call its methods, never
test its name.  See ``docs/design.md`` ("Storage backends") for how to add one.

The module also holds what every backend shares: the per-process cache of open arrays
(:func:`cached`, :func:`forget`) and the chunk geometry of a key (:func:`key_chunks`).
"""
from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable

import numpy as np

from .. import threads

__all__ = ["TableBackend", "TableSpec", "register_backend", "get_backend", "backend_names",
           "open_table", "cached", "forget", "thread_pool", "normalize_key", "key_chunks", "chunk_slices", "CHECKSUM_BYTES"]

#: Bytes of checksum per chunk of the checksummed built-in backends (a CRC-32C).
CHECKSUM_BYTES = 4


@dataclass(frozen=True)
class TableSpec:
    """Where one table lives: ``backend`` (a registered name), ``path`` (file or directory;
    a URL for a backend that stores by URL; None in memory), ``shape``, ``chunks``,
    ``dtype``; ``array`` holds the data of a backend that is not
    :attr:`~TableBackend.persistent`; ``options`` (a JSON text) are the fsspec storage
    options of a table stored by URL, sent with the spec to every worker; ``fit_id``
    names the fit the table belongs to (checksummed local backends bind every chunk's
    checksum to it, to the table and to the chunk's position:
    :mod:`fsll_ooc.storage.binding`); ``lease`` (a table of a store at a URL, written
    under its lease) is the token of the writer's lease: every write first checks that the
    store's lock object still names it (:mod:`fsll_ooc.storage.url_store`); ``generation``
    (a table of a store at a URL) names the lease under which its chunks were written, and
    is bound into every chunk's checksum with ``fit_id`` (:func:`fsll_ooc.storage.binding.place`),
    so a chunk a writer sent after its lease was taken over is refused at the next read.

    Small and picklable, so a dask worker in another process opens the same table by itself
    (:func:`fsll_ooc.storage.open_table`); a table that lives in this process's memory refuses
    to be pickled.
    """

    backend: str
    path: str | None
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str = "float64"
    array: Any = None
    options: str | None = None
    fit_id: str = ""
    lease: str = ""
    generation: str = ""

    def __reduce__(self):
        if not self.backend_impl.persistent:
            raise TypeError(f"a {self.backend!r} table lives in this process's memory and cannot be sent to "
                            f"another process; use a store (backend one of {_persistent_names()}) with a "
                            "distributed scheduler")
        return (TableSpec, (self.backend, self.path, self.shape, self.chunks, self.dtype, None, self.options,
                            self.fit_id, self.lease, self.generation))

    @property
    def backend_impl(self) -> "TableBackend":
        """The registered backend object that stores this table."""
        return get_backend(self.backend)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def chunk_nbytes(self) -> int:
        return int(np.prod(self.chunks, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def chunk_size(self) -> int:
        """Cells per chunk."""
        return int(np.prod(self.chunks, dtype=np.int64))

    @property
    def grid(self) -> tuple[int, ...]:
        """Number of chunks along each axis."""
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunks))

    @property
    def n_chunks(self) -> int:
        return int(np.prod(self.grid, dtype=np.int64))

    @property
    def name(self) -> str:
        return Path(self.path).name if self.path else "(in memory)"


class TableBackend(ABC):
    """One way of storing tables.  Subclass it in a module of its own, set the class
    attributes, implement the abstract methods, and decorate the class with
    :func:`register_backend`.

    Capabilities (class attributes; callers ask these, never the name):

    ``persistent``
        Tables are files under a store directory and outlive the process (a fit can be
        resumed, a dask worker in another process can open them).  False: the table lives
        in ``TableSpec.array`` in this process.
    ``supports_inplace_views``
        :meth:`read` may return a view aliasing the table (writing into it changes the
        table; a caller that must not change the source copies it first).
    ``checksummed``
        Every chunk read is verified against a stored checksum; damage raises
        :class:`~fsll_ooc.storage.IntegrityError` naming the file.
    ``checksum_bytes_per_chunk``
        Bytes each chunk adds on disk for its checksum (:meth:`overhead_bytes`).

    Methods take the table's :class:`TableSpec`.  The package functions of
    :mod:`fsll_ooc.storage` (``create_table``, ``read``, ``write``, ...) dispatch to them and
    add what all backends share: creating the store directory, caching open arrays,
    counting writes in flight.
    """

    name: ClassVar[str] = ""
    persistent: ClassVar[bool] = True
    supports_inplace_views: ClassVar[bool] = False
    checksummed: ClassVar[bool] = False
    checksum_bytes_per_chunk: ClassVar[int] = 0

    # ------------------------------------------------------------------ required
    @abstractmethod
    def create(self, spec: TableSpec) -> TableSpec:
        """Create (or overwrite) the table ``spec`` describes and return its spec (with
        ``array`` set for a backend that is not persistent).  The store directory exists
        and the spec's cached arrays are forgotten.  Contents are zero, or (a checksummed
        backend that stores every chunk) not readable before they are written: callers
        write every chunk before reading it.  Raise ``OSError`` (``ENOSPC``) when the
        space cannot be reserved, ``ValueError`` when the chunk shape cannot be stored
        this way."""

    @abstractmethod
    def open(self, spec: TableSpec) -> Any:
        """The array object behind ``spec`` (numpy-style indexing), checked against ``spec``:
        raise :class:`~fsll_ooc.storage.IntegrityError` when a file or its metadata is
        missing or does not describe ``spec``.  Persistent backends' results are cached per
        process (:func:`fsll_ooc.storage.open_table`)."""

    @abstractmethod
    def read(self, spec: TableSpec, key: tuple) -> np.ndarray:
        """``table[key]`` as a C-contiguous array (a view only if ``supports_inplace_views``),
        verified when ``checksummed``."""

    @abstractmethod
    def write(self, spec: TableSpec, key: tuple, value: np.ndarray) -> None:
        """``table[key] = value`` (with the checksums of the chunks written, when ``checksummed``).
        Tasks write whole chunks, so concurrent writers never share one."""

    # ------------------------------------------------------------------ optional
    def table_path(self, store, name: str, dtype: str = "float64") -> str:
        """File (or directory) of table ``name`` in directory ``store``."""
        return str(Path(store) / (f"{name}.f64" if dtype == "float64" else f"{name}.{dtype}"))

    def overhead_bytes(self, shape, chunks) -> int:
        """Bytes a table takes on disk beyond ``|X| * itemsize`` (its checksums)."""
        if not self.checksum_bytes_per_chunk:
            return 0
        spec = TableSpec(self.name, "x", tuple(shape), tuple(chunks))
        return self.checksum_bytes_per_chunk * spec.n_chunks

    def gather(self, spec: TableSpec, flat: np.ndarray) -> np.ndarray:
        """The cells ``flat`` (C-order indices) as float64 (not verified: point reads)."""
        return np.asarray(open_table(spec).reshape(-1)[flat], dtype=np.float64)

    def as_array(self, spec: TableSpec):
        """The whole table as one array: a lazy ``dask.array`` over the store (chunks of the
        table); a backend holding the table in memory returns its numpy array."""
        import dask.array as da

        return da.from_array(open_table(spec), chunks=spec.chunks)

    def flush(self, spec: TableSpec) -> None:
        """Push written data to the file (visible to other processes); default: nothing to do."""

    def sync(self, spec: TableSpec) -> None:
        """Make the table durable (survives a power cut); default: nothing to do."""

    def check(self, spec: TableSpec) -> None:
        """Cheap structural check (metadata, file sizes); contents are checked when read."""
        if self.persistent:
            forget(spec)
            open_table(spec)

    def verify(self, spec: TableSpec) -> None:
        """Deep check: every chunk's checksum (reads the whole table once)."""
        self.check(spec)

    def fingerprint(self, spec: TableSpec) -> dict:
        """What must not change while a store is in use (JSON-able; ``{}``: nothing to check)."""
        return {}

    def check_fingerprint(self, spec: TableSpec, fp: dict) -> None:
        """Raise :class:`~fsll_ooc.storage.IntegrityError` when ``spec`` no longer matches ``fp``
        (called only with a non-empty ``fp``); default: the structural :meth:`check`."""
        self.check(spec)

    def temporary_files(self, store: Path, skip: tuple[str, ...]) -> Iterable[str]:
        """Temporary files this backend's writers may leave in ``store`` when killed (not
        under the top-level entries ``skip``); :func:`fsll_ooc.storage.remove_leftovers`
        deletes them.  Default: none."""
        return ()


_REGISTRY: dict[str, TableBackend] = {}


def register_backend(cls: type[TableBackend]) -> type[TableBackend]:
    """Register backend class ``cls`` under ``cls.name`` (usable as a class decorator).

    A name registered again is replaced (a module reloaded, a test's backend).
    """
    if not (isinstance(cls, type) and issubclass(cls, TableBackend)):
        raise TypeError(f"register_backend takes a TableBackend subclass, got {cls!r}")
    if not isinstance(cls.name, str) or not cls.name.isidentifier():
        raise ValueError(f"backend class {cls.__name__} needs a name (an identifier), got {cls.name!r}")
    _REGISTRY[cls.name] = cls()
    return cls


def unregister_backend(name: str) -> None:
    """Remove backend ``name`` from the registry (tests)."""
    _REGISTRY.pop(name, None)


def get_backend(name: str) -> TableBackend:
    """The registered backend called ``name``; ``ValueError`` names the registered ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown backend {name!r}; choose one of {backend_names()}") from None


def backend_names() -> tuple[str, ...]:
    """Names of the registered backends, in registration order."""
    return tuple(_REGISTRY)


def _persistent_names() -> tuple[str, ...]:
    return tuple(n for n, b in _REGISTRY.items() if b.persistent)


# ----------------------------------------------------------------------------- open arrays

_CACHE: dict[tuple, Any] = {}
_CACHE_LOCK = threading.RLock()  # an opener may open another cached object


def cached(key: tuple, opener: Callable[[], Any], identity: str = "") -> Any:
    """``opener()``'s result, opened once per process; ``key[1]`` is the file path it reads
    (so that :func:`forget` finds it).  ``identity`` names what is open there (a table's fit
    id): asked for another identity at the same key (the table was created again at its path,
    by another fit, perhaps in another process), the path is opened anew and the old handle
    dropped, so nothing is ever written through a handle of a table that was replaced."""
    hit = _CACHE.get(key)
    if hit is not None and hit[0] == identity:
        return hit[1]
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is None or hit[0] != identity:
            hit = _CACHE[key] = (identity, opener())
    return hit[1]


_POOLS: dict[tuple, ThreadPoolExecutor] = {}


def thread_pool(name: str, size: int) -> ThreadPoolExecutor:
    """This process's pool of ``size`` background threads called ``name`` (made on first use,
    and again in a child process made by fork, which inherits no threads)."""
    key = (name, os.getpid())
    pool = _POOLS.get(key)
    if pool is None:
        with _CACHE_LOCK:
            pool = _POOLS.get(key)
            if pool is None:
                pool = _POOLS[key] = threads.pool(size, name)
    return pool


def open_table(spec: TableSpec):
    """The array object behind ``spec`` (cached per process for persistent backends), checked
    against ``spec``.

    Raises :class:`~fsll_ooc.storage.IntegrityError` when the file or its metadata is
    missing, truncated or does not describe ``spec``.  Access through it is not verified
    (see :func:`fsll_ooc.storage.read`).
    """
    impl = spec.backend_impl
    if not impl.persistent:
        return impl.open(spec)
    return cached((spec.backend, spec.path), lambda: impl.open(spec), spec.fit_id)


def forget(spec_or_path) -> None:
    """Drop cached open arrays of a table (or of every table under a directory)."""
    path = spec_or_path.path if isinstance(spec_or_path, TableSpec) else str(spec_or_path)
    if path is None:
        return
    under = path.rstrip("/") + "/"
    with _CACHE_LOCK:
        for k in [k for k in _CACHE if k[1] == path or str(k[1]).startswith(under)]:
            _CACHE.pop(k, None)


# ----------------------------------------------------------------------------- chunks of a key

def normalize_key(key, ndim: int) -> list:
    """``key`` as a list of ``ndim`` ints and slices (Ellipsis expanded, missing axes filled)."""
    key = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis for k in key):
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (ndim - len(key) + 1) + key[i + 1:]
    key = tuple(key) + (slice(None),) * (ndim - len(key))
    if len(key) != ndim:
        raise IndexError(f"key {key!r} has more axes than the table ({ndim})")
    return list(key)


def key_chunks(spec: TableSpec, key) -> tuple[list[tuple[int, ...]], bool]:
    """Chunk coordinates touched by ``key`` (ints, unit-step slices, an Ellipsis), in C order,
    and whether ``key`` covers exactly those chunks."""
    per_axis = []
    aligned = True
    for k, s, c in zip(normalize_key(key, len(spec.shape)), spec.shape, spec.chunks):
        if isinstance(k, (int, np.integer)):
            i = int(k) + (s if k < 0 else 0)
            per_axis.append([i // c])
            aligned &= c == 1
        elif isinstance(k, slice):
            start, stop, step = k.indices(s)
            if step != 1:
                raise IndexError("strided keys are not supported by table storage")
            if stop <= start:
                return [], True
            per_axis.append(list(range(start // c, -(-stop // c))))
            aligned &= start % c == 0 and (stop % c == 0 or stop == s)
        else:
            raise IndexError(f"unsupported key element {k!r}")
    return list(itertools.product(*per_axis)), aligned


def whole_chunks(spec: TableSpec, key, n_cells: int | None = None) -> list[tuple[int, ...]] | None:
    """The chunk coordinates of ``key`` when it covers whole chunks (and, when given,
    ``n_cells`` cells: a value of the key's size), else None (what a backend's band I/O
    that moves whole chunks can take)."""
    coords, aligned = key_chunks(spec, key)
    if not (aligned and coords) or (n_cells is not None and n_cells != len(coords) * spec.chunk_size):
        return None
    return coords


def chunk_slices(spec: TableSpec, coords) -> tuple:
    """The key of the chunk at grid coordinates ``coords``."""
    return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(coords, spec.chunks, spec.shape))

