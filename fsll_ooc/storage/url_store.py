"""A store given by URL (fsspec: ``s3://``, ``gs://``, ``memory://``, ...): its small files and its writer lock.

A store on an object store is shared by every machine that can reach the URL, so
dask.distributed workers on several hosts read and write one store.  Its tables are Zarr
v3 arrays (backend ``zarr_url``, :mod:`fsll_ooc.storage.zarr_url`); the memmap backend is
local only.  ``file://PATH`` is the local store at ``PATH`` (the local directory's
guarantees, ``flock`` included), not an object store.

Small files (fit state, counts) are written with one PUT each: an object store replaces
an object atomically, so a reader sees the old or the new object, never half of one, and
nothing is left behind by a killed writer (no temporary objects).  The fit's crash
protocol (``docs/reliability.md``) is the same as on a local disk: the state object says
``complete`` only after every table chunk was written and acknowledged.

The writer lock is the object ``STORE/fsll.lock`` (:class:`ObjectLock`), a lease:

* taken by a conditional PUT that succeeds only if the object does not exist (S3
  ``If-None-Match: *``; fsspec ``mode="create"``), so of two writers exactly one wins;
* renewed every ``LEASE / 4`` seconds by its holder (a heartbeat thread) with a PUT
  conditional on the object being unchanged (S3 ``If-Match: ETAG``); a holder that
  finds the object changed has lost the lock and stops at its next state write;
* stale when its last renewal (the object's ``Last-Modified``) is older than ``LEASE``
  seconds by this machine's clock (clocks must agree to well within the lease); a stale
  lock is taken over by a PUT conditional on its ETag, so of two recoverers exactly one
  wins;
* broken by hand (a fit that is known to be gone) by deleting the object
  ``STORE/fsll.lock``.

A writer whose lease was taken over (stopped for longer than the lease, then continued)
must not damage its successor: every table write first checks that the lock object
still names its lease (:func:`check_lease`), every state and kept-file write too
(:meth:`ObjectLock.check`), and every chunk it writes is bound to its lease
(``TableSpec.generation``, :mod:`fsll_ooc.storage.binding`).  A check and the PUT after
it are two requests, so a writer stopped between them still sends that one band late;
its successor, which wrote the table again under its own lease, refuses the chunk by
name at its next read, and a plain resume writes that table again.  On S3 a state write
is also conditional on the ETag of the state object the writer last read or wrote
(:meth:`URLRoot.write_json`), so a late state never replaces the successor's.

The conditional PUTs are S3's (AWS S3 and servers that implement its conditional
writes); on other object stores the lock is created with fsspec's exclusive create where
the filesystem provides one and renewed and taken over without a condition: there two
writers started within the same moment are not guaranteed to be told apart (see
``docs/guide.md``, "Cluster runs").
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import secrets
import socket
import threading
import time
import weakref
from typing import Any

import numpy as np

from .errors import IntegrityError
from .lock import StoreLockedError

__all__ = ["is_url", "local_path", "encode_options", "decode_options", "filesystem", "URLRoot", "ObjectLock",
           "LEASE", "check_lease", "ObjectChangedError"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: Seconds a writer lock stays valid without renewal (the holder renews every LEASE / 4).
LEASE = 60.0
#: Resolution of an object's Last-Modified (whole seconds on S3): added to a lease before it is stale.
CLOCK_SLACK = 1.0
LOCK_OBJECT = "fsll.lock"
#: For a backend a store can name (``"zarr"``), the backend that keeps its tables at a URL
#: (filled by the backend modules: ``storage/zarr_url.py``).
URL_FORMS: dict[str, str] = {}


def _now() -> float:
    """This machine's clock, against which a lock's Last-Modified is compared."""
    return time.time()


def is_url(store) -> bool:
    """Is ``store`` a URL (``scheme://...``) rather than a local path?"""
    return isinstance(store, str) and bool(_SCHEME.match(store))


def local_path(store):
    """The local path of ``store``: ``file://PATH`` is ``PATH``; another URL is None; a path is itself."""
    if not is_url(store):
        return store
    if store.lower().startswith("file://"):
        return store[len("file://"):] or "/"
    return None


def encode_options(options: dict | None) -> str | None:
    """Storage options as the JSON text a :class:`~fsll_ooc.storage.TableSpec` carries (None: none)."""
    if not options:
        return None
    if not isinstance(options, dict):
        raise ValueError(f"storage_options must be a dict of fsspec options, got {type(options).__name__}")
    try:
        return json.dumps(options, sort_keys=True)
    except TypeError as e:
        raise ValueError(f"storage_options must be plain JSON values (strings, numbers, dicts): {e}") from None


def decode_options(text: str | None) -> dict:
    """The storage options a spec carries, as a dict."""
    return json.loads(text) if text else {}


_FS: dict[tuple[str, str | None], Any] = {}
_FS_LOCK = threading.Lock()


def filesystem(url: str, options: str | None = None):
    """``(fs, path)`` for ``url`` with the JSON storage ``options`` (one fsspec filesystem per
    protocol and options in this process; ``path`` is the URL without its protocol)."""
    from fsspec.core import url_to_fs

    key = (url.split("://", 1)[0], options)
    with _FS_LOCK:
        fs = _FS.get(key)
        if fs is None:
            fs = _FS[key] = url_to_fs(url, **decode_options(options))[0]
    return fs, fs._strip_protocol(url).rstrip("/")


def is_s3(fs) -> bool:
    """Whether the fsspec file system ``fs`` speaks S3."""
    proto = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return any(p in ("s3", "s3a") for p in proto)


class URLRoot:
    """The small files of a store at a URL: read, replace atomically (one PUT), remove, list.

    ``url`` is the store's root; ``options`` the fsspec storage options (a dict).
    """

    is_url = True

    def __init__(self, url: str, options: dict | None = None):
        self.url = self.root = url.rstrip("/")
        self.options = encode_options(options)
        try:
            self.fs, self.path = filesystem(self.url, self.options)
        except ImportError as e:
            raise ImportError(f"store {self.url}: {e}; install the filesystem for this URL (for s3:// "
                              "install fsll-ooc[s3], which brings s3fs)") from None
        except ValueError as e:
            raise ValueError(f"store {self.url}: {e}") from None

    def __str__(self) -> str:
        return self.url

    def child(self, name: str) -> str:
        """The URL of entry ``name`` of the store."""
        return f"{self.url}/{name}"

    def _p(self, name: str) -> str:
        return f"{self.path}/{name}"

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self._p(name)))

    def remove(self, name: str) -> None:
        try:
            self.fs.rm(self._p(name), recursive=True)
        except FileNotFoundError:
            pass

    def write_bytes(self, name: str, data: bytes) -> None:
        """Replace object ``name`` with ``data`` (one PUT: the old or the new object, never half)."""
        self.fs.pipe_file(self._p(name), bytes(data))

    def read_bytes(self, name: str) -> bytes:
        try:
            return self.fs.cat_file(self._p(name))
        except FileNotFoundError:
            raise
        except OSError as e:
            raise IntegrityError(self.child(name), f"cannot be read ({e})") from None

    def sha256(self, name: str) -> str:
        return "sha256:" + hashlib.sha256(self.read_bytes(name)).hexdigest()

    def read_array(self, name: str) -> np.ndarray:
        data = self.read_bytes(name)
        try:
            return np.load(io.BytesIO(data), allow_pickle=False)
        except Exception as e:  # noqa: BLE001
            raise IntegrityError(self.child(name), f"cannot be read ({type(e).__name__}: {e})") from None

    def read_json(self, name: str):
        """The verified object of checksummed JSON object ``name`` (``files.parse_json``)."""
        from .files import parse_json

        return parse_json(self.read_bytes(name), self.child(name))

    def write_json(self, name: str, obj, if_match: str | None = None) -> None:
        """Replace ``name`` with ``obj`` as checksummed JSON (serialised before anything is sent);
        ``if_match``: on S3, only if the object is still the one with that ETag, else
        :class:`ObjectChangedError` (another writer replaced it)."""
        from .files import json_text

        data = json_text(obj, checksum=True).encode()
        if if_match is None or not is_s3(self.fs):
            return self.write_bytes(name, data)
        try:
            self.fs.pipe_file(self._p(name), data, IfMatch=if_match)
        except OSError as e:
            if "pre-condition" in str(e) or "PreconditionFailed" in str(e) or "412" in str(e):
                raise ObjectChangedError(self.child(name)) from None
            raise

    def etag(self, name: str) -> str | None:
        """The ETag of object ``name`` as the server says now (None: no such object, or an
        object store that does not condition writes on it)."""
        if not is_s3(self.fs):
            return None
        self.fs.invalidate_cache(self._p(name))
        try:
            info = self.fs.info(self._p(name))
        except FileNotFoundError:
            return None
        return info.get("ETag") or info.get("etag")

    def check_new(self) -> None:
        """Refuse a location that holds other things than an fsll-ooc store (``ValueError``)."""
        from .store_dir import STORE_MARKERS

        entries = self.entries()
        if not entries or any(m in entries for m in STORE_MARKERS):
            return
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ValueError(f"store {self.url} is not empty and is not an fsll-ooc store (it holds {shown}); "
                         "a fit would replace or delete objects there: give a new or empty location")

    def tidy(self) -> None:
        """Nothing to remove: a killed writer leaves no temporary objects (every PUT is whole)."""

    def create_table(self, backend: str, name: str, cards, chunks, fit_id: str = ""):
        from .base import forget, get_backend

        spec = self.table_spec(backend, name, cards, chunks, fit_id=fit_id)
        forget(spec)
        return get_backend(spec.backend).create(spec)

    def table_spec(self, backend: str, name: str, cards, chunks, fit_id: str = ""):
        """The spec of table ``name``: a ``zarr`` table of the store is a ``zarr_url`` array here
        (``fit_id`` is kept in the spec; chunk checksums at a URL are not bound to it)."""
        from .base import TableSpec

        if backend not in URL_FORMS:
            raise ValueError(f"a store given by URL ({self.url}) keeps its tables as zarr arrays; backend "
                             f"{backend!r} is local only: use backend='zarr' or a local store")
        return TableSpec(URL_FORMS[backend], self.child(name), tuple(int(c) for c in cards),
                         tuple(int(c) for c in chunks), options=self.options, fit_id=fit_id)

    def reader_scratch(self, readers: str, cards, chunks, owner):
        """A private scratch table under ``STORE/readers/`` (reachable by every worker),
        removed when ``owner`` is garbage collected."""
        token = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        spec = self.create_table("zarr", f"{readers}/{token}/scratch", cards, chunks)
        weakref.finalize(owner, _remove_quietly, self.fs, f"{self.path}/{readers}/{token}")
        return spec

    def entries(self) -> list[str]:
        """Names of the store's top-level entries (empty when the store does not exist)."""
        try:
            found = self.fs.ls(self.path, detail=False, refresh=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(os.path.basename(str(p).rstrip("/")) for p in found)

    def lock(self, purpose: str) -> "ObjectLock":
        return ObjectLock(self, purpose)


class ObjectChangedError(OSError):
    """A conditional write found the object replaced since this writer last read or wrote it."""

    def __init__(self, url: str):
        self.url = url
        super().__init__(f"{url} was replaced by another writer since this writer last wrote it")


def _remove_now(fs, path: str) -> None:
    try:
        fs.rm(path, recursive=True)
    except Exception:  # noqa: BLE001 - at exit, an unreachable store keeps the scratch table
        pass


def _remove_quietly(fs, path: str) -> None:
    """Remove a reader's scratch table (a garbage collection's finalizer, or at exit).

    A garbage collection may run the finalizer in any thread, among them one that the
    removal's own requests wait on (an event loop's, a server's in the same process): the
    removal then runs in a thread of its own, and only the main thread (at exit, or a
    collection there) waits for it, as before."""
    worker = threading.Thread(target=_remove_now, args=(fs, path), name="fsll-ooc-scratch-removal", daemon=True)
    worker.start()
    if threading.current_thread() is threading.main_thread():
        worker.join()


def _server_age(fs, path: str) -> tuple[dict | None, str | None, float | None]:
    """The lock object's content, ETag and age in seconds (by the server's clock where it says)."""
    fs.invalidate_cache(path)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None, None, None
    etag = info.get("ETag") or info.get("etag")
    modified = info.get("LastModified") or info.get("mtime") or info.get("created")
    try:
        record = json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None, None, None
    except (ValueError, OSError):
        record = {}
    age = None
    if modified is not None:
        stamp = modified.timestamp() if hasattr(modified, "timestamp") else float(modified)
        age = _now() - stamp
    return (record if isinstance(record, dict) else {}), etag, age


def check_lease(spec) -> None:
    """Raise :class:`~fsll_ooc.storage.lock.StoreLockedError` unless the lock object of the
    store holding table ``spec`` still names the lease ``spec.lease`` (one GET; what every
    write of a table at a URL does first: a writer whose lease ran out and was taken over
    writes no chunk over its successor's)."""
    fs, path = filesystem(spec.path, spec.options)
    store = path.rsplit("/", 1)[0]
    record, _, _ = _server_age(fs, f"{store}/{LOCK_OBJECT}")
    if record is None or record.get("token") != spec.lease:
        url = spec.path.rsplit("/", 1)[0]
        raise StoreLockedError(url, record, False, "(this writer's lease on the store ran out and was taken over "
                                                   "or removed: it writes nothing more)")


class ObjectLock:
    """The writer lock of a store at a URL: a lease object renewed by a heartbeat (see the module doc).

    Same use as :class:`fsll_ooc.storage.lock.StoreLock`: ``acquire()`` raises
    :class:`~fsll_ooc.storage.lock.StoreLockedError` naming the holder; :meth:`release`;
    :meth:`check` raises it when the lease was lost (another writer took the store over).
    """

    def __init__(self, root: URLRoot, purpose: str = "fit", lease: float | None = None):
        self.root = root
        self.purpose = purpose
        self.lease = float(LEASE if lease is None else lease)
        self.shared = False
        self.recovered: dict | None = None
        self._token = secrets.token_hex(8)
        self._etag: str | None = None
        self._held = False
        self._lost: str | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._mutex = threading.Lock()

    @property
    def held(self) -> bool:
        return self._held

    @property
    def lease_token(self) -> str:
        """The token naming this holder's lease in the lock object (what a table's writes check)."""
        return self._token

    @property
    def _path(self) -> str:
        return self.root._p(LOCK_OBJECT)

    def _record(self) -> bytes:
        return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "purpose": self.purpose,
                           "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "token": self._token,
                           "lease_seconds": self.lease, "state": "held"}).encode()

    def _put(self, *, create: bool = False, if_match: str | None = None) -> None:
        fs = self.root.fs
        if is_s3(fs):
            kw = {"IfMatch": if_match} if if_match else {}
            fs.pipe_file(self._path, self._record(), mode="create" if create else "overwrite", **kw)
        elif create:
            fs.pipe_file(self._path, self._record(), mode="create")
        else:
            fs.pipe_file(self._path, self._record())
        record, self._etag, _ = _server_age(fs, self._path)
        if record is None or record.get("token") != self._token:
            raise OSError(f"{self.root.child(LOCK_OBJECT)} was replaced by another writer")

    def acquire(self, shared: bool = False, create: bool = True) -> "ObjectLock":
        """Take the lock (exclusive by default; ``shared``: only check that no live writer holds it)."""
        if self._held:
            raise RuntimeError("this lock is already held")
        fs = self.root.fs
        if shared:
            record, _, age = _server_age(fs, self._path)
            if record is not None and not self._stale(age, record):
                raise StoreLockedError(self.root.url, record, True, self._advice(age))
            return self
        for _ in range(3):
            try:
                self._put(create=True)
                break
            except FileExistsError:
                pass
            record, etag, age = _server_age(fs, self._path)
            if record is None:
                continue  # released in the meantime: try again
            if not self._stale(age, record):
                raise StoreLockedError(self.root.url, record, False, self._advice(age))
            try:  # stale: take it over, on condition that nobody else did first
                self._put(if_match=etag)
            except (OSError, ValueError):
                continue
            self.recovered = record
            break
        else:
            raise StoreLockedError(self.root.url, _server_age(fs, self._path)[0], False,
                                   "(lock changed hands repeatedly)")
        self._held = True
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="fsll-lock-lease", daemon=True)
        self._beat.start()
        return self

    def _advice(self, age: float | None) -> str:
        if age is None:
            return ""
        return (f"(a lease renewed {max(age, 0):.0f} s ago; if that fit is gone, delete "
                f"{self.root.child(LOCK_OBJECT)} or wait {self.lease:.0f} s)")

    def _stale(self, age: float | None, record: dict) -> bool:
        if record.get("state") != "held":
            return True
        lease = float(record.get("lease_seconds") or self.lease)
        return age is not None and age > lease + CLOCK_SLACK

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease / 4):
            with self._mutex:
                if not self._held:
                    return
                try:
                    if is_s3(self.root.fs):
                        self._put(if_match=self._etag)
                    else:
                        record, _, _ = _server_age(self.root.fs, self._path)
                        if record is None or record.get("token") != self._token:
                            raise OSError("the lock object was replaced")
                        self._put()
                except (OSError, ValueError) as e:
                    self._lost = f"the store's lock was lost ({e}): another writer may have taken it over"
                    return

    def check(self) -> None:
        """Raise :class:`StoreLockedError` if this writer lost the lock (its lease ran out and
        another writer took the store over, or the lock object was deleted by hand): what the
        heartbeat found, else what the lock object says now (one GET)."""
        if not self._lost and self._held:
            record, _, _ = _server_age(self.root.fs, self._path)
            if record is None or record.get("token") != self._token:
                self._lost = ("this writer's lease on the store ran out and was taken over or removed: it writes "
                              "nothing more")
        if self._lost:
            raise StoreLockedError(self.root.url, _server_age(self.root.fs, self._path)[0], False, self._lost)

    def release(self) -> None:
        with self._mutex:
            if not self._held:
                return
            self._held = False
            self._stop.set()
            record, _, _ = _server_age(self.root.fs, self._path)
            if record is not None and record.get("token") == self._token:
                try:
                    self.root.fs.rm(self._path)
                except FileNotFoundError:
                    pass

    def __enter__(self) -> "ObjectLock":
        if not self._held:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
