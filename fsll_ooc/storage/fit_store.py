"""The store of an out-of-core fit: one directory, its crash protocol, its readers.

A :class:`FitStore` owns everything a fit keeps on disk and the order in which it is
written (``docs/reliability.md``):

* the writer lock (exclusive, refused at once) and the readers' shared lock;
* the disk-full guard: an ``ENOSPC``/``EDQUOT`` anywhere becomes one
  :class:`~fsll_ooc.storage.DiskFullError` that says what to do;
* leftovers of killed writers and the scratch directories of dead readers;
* the counts file (the fit's data as (cell, count) pairs, checksummed in the state);
* the checksummed state file with status ``starting`` (data kept, tables not yet
  complete), ``running`` (targets durable; the model after ``n_iter`` iterations)
  and ``complete`` (the final model);
* the tables (``dbar``, ``thetabar``, ``scratch``): creation, fingerprints, checks;
* :meth:`FitStore.checkpoint`, the learner's callback after every iteration;
* a private scratch table for each reader of a finished fit.

The estimator decides *what* is fitted (parameters, labels, the plan) and hands it over
as plain values; nothing here knows about the estimator.

>>> import tempfile, numpy as np
>>> from fsll_ooc.learn import FitState
>>> from fsll_ooc.planner import plan
>>> fs = FitStore(tempfile.mkdtemp() + "/s", "zarr")
>>> p = fs.account(plan((2, 3), out_of_core=True))
>>> params = {"epsilon": 1e-4, "max_iter": None, "resync_every": 256}
>>> with fs.writing("fit", "fitting", p):
...     fs.begin(p, params, None, np.array([0, 4]), np.array([3, 2]), FitState((2, 3), 5, 0.0))
>>> fs.read().status, fs.read_counts((2, 3), 5)[1].tolist()
('starting', [3, 2])
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import secrets
import shutil
import socket
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import storage  # the package's functions (what tests and the kill-point harness replace)
from . import lock as locking
from .tables import DiskFullError, IntegrityError, TableSpec

__all__ = ["FitStore", "StoredFit", "check_invariants", "STATE_FILE", "COUNTS_FILE", "READERS_DIR", "TABLE_NAMES", "STATUSES"]

STATE_FILE = "fsll_state.json"
STATE_FORMAT = "fsll-ooc-fit-state"
#: 2: the state names the fit (``fit_id``) and chunk checksums are bound to it; a version-1
#: store's tables are rebuilt (``FSLL.resume(store, restart=True)``), its finished model is read.
STATE_VERSION = 2
#: The fit's data as (cell, count) pairs, kept in the store so that resume can restart any stage.
COUNTS_FILE = "fsll_counts.npy"
#: Private scratch tables of read-only users of a finished store (one directory per reader).
READERS_DIR = "readers"
TABLE_NAMES = ("dbar", "thetabar", "scratch")
STATUSES = ("starting", "running", "complete")
#: The backend of a reader's private scratch table: takes disk space only where written.
READER_BACKEND = "zarr"
#: Seconds :meth:`FitStore.writing` waits on its way out for band writes still in flight
#: before it leaves the lock's release to a background thread (which waits for them).
QUIESCE_SECONDS = 120.0

_OLD_STORE = ("written by an older fsll-ooc whose chunk checksums do not bind a chunk to its table, position "
              "and fit, so its tables cannot be trusted; FSLL.resume({store!r}, restart=True) rebuilds them from the "
              "data kept in the store and fits again")
_DAMAGED = ("the store's tables cannot be trusted; FSLL.resume({store!r}, restart=True) rebuilds them from the "
            "data kept in the store and fits again")
#: The fix for a damaged table that every resume writes again before reading it.
_REDERIVED = ("FSLL.resume({store!r}) writes this table again from the last checkpoint and continues "
              "(restart=True rebuilds every table from the data kept in the store and fits again)")
#: Tables a resume writes again before reading them (from the parameters of the last checkpoint).
REDERIVED_TABLES = ("thetabar", "scratch")


@dataclasses.dataclass(frozen=True)
class StoredFit:
    """What a verified state file says: the fit's settings, its model so far, its labels."""

    status: str
    backend: str
    layout: tuple[int, int]
    params: dict
    state: dict  # FitState.to_json()
    feature_names: list | None
    categories: list | None
    kl_data: float | None


class FitStore:
    """The directory ``root`` of an out-of-core fit whose tables use ``backend``.

    ``root`` may also be a URL (fsspec: ``s3://bucket/store``, ...; ``storage_options``
    are fsspec's options for it): the same files and the same order of writes, as
    objects (:mod:`fsll_ooc.storage.url_store`), with tables of backend ``zarr_url``.

    Writing happens inside :meth:`writing` (the writer lock and the disk guard):
    :meth:`begin` (new fit) or :meth:`restart` / :meth:`reopen` (resume), then
    :meth:`create_tables` + :meth:`tables_ready` or :meth:`open_tables`,
    :meth:`checkpoint` after every iteration, :meth:`complete` at the end.
    """

    def __init__(self, root, backend: str | None = None, storage_options: dict | None = None):
        self.io = open_root(root, storage_options)
        self.root = self.io.root  # a Path, or the URL of a store given by URL
        self.backend = backend
        self.plan = None  # the plan whose layout the tables have (set by begin/reopen)
        self.resumable = False  # a state file describes this fit: a failure can be resumed
        self._params: dict = {}
        self._meta: dict[str, Any] = {}
        self._durable: dict[str, Any] = {}  # the kept files named by the state file on disk
        # per fit state seen by checkpoint(): (the state, its entries checked, H(q) of their targets)
        self._seen: dict[int, tuple] = {}
        self._stored: tuple | None = None  # (entries, H(q)) of the state a resume continues
        # at a URL (S3): the ETag of the state object this writer last read or wrote, on which
        # its next state write is conditional (a writer whose lease was taken over and whose
        # successor wrote the state since writes no state over it)
        self._state_tag: str | None = None

    # ------------------------------------------------------------------ reading
    @property
    def state_file(self):
        return self.io.child(STATE_FILE)

    def exists(self) -> bool:
        """Whether the store holds a fit state (there is something to resume)."""
        return self.io.exists(STATE_FILE)

    def require_state(self) -> None:
        """``FileNotFoundError`` that says why, when there is no fit state to resume."""
        if not self.io.exists(STATE_FILE):
            hint = (" (the fit was stopped before it started; run fit() again)"
                    if self.io.exists(COUNTS_FILE) or self.io.exists(locking.LOCK_FILE) else "")
            raise FileNotFoundError(f"{self.root}: no fit state ({STATE_FILE}) found; nothing to resume{hint}")

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the readers' shared lock (waits briefly for a writer; never creates the store)."""
        with self.io.lock("read").acquire(shared=True, create=False):
            yield

    def read(self) -> StoredFit:
        """The verified state of the store; :class:`IntegrityError` if it cannot be trusted."""
        sf = self.state_file
        tag = self.io.etag(STATE_FILE) if self.io.is_url else None
        obj = self.io.read_json(STATE_FILE)
        if not isinstance(obj, dict) or obj.get("format") != STATE_FORMAT:
            fmt = obj.get("format") if isinstance(obj, dict) else None
            raise IntegrityError(sf, f"not an fsll-ooc fit state (format {fmt!r})")
        if not isinstance(obj.get("version"), int) or obj["version"] > STATE_VERSION:
            raise IntegrityError(sf, f"fit state version {obj.get('version')!r} is newer than this "
                                     f"fsll-ooc understands (<= {STATE_VERSION}); upgrade fsll-ooc")
        missing = [k for k in ("status", "backend", "layout", "params", "state", "counts") if k not in obj]
        if missing or obj["status"] not in STATUSES or not _persistent(obj["backend"]):
            raise IntegrityError(sf, f"fit state is incomplete or unknown (missing {missing}, "
                                     f"status {obj.get('status')!r}, backend {obj.get('backend')!r})")
        if obj["status"] != "starting" and not obj.get("tables"):
            raise IntegrityError(sf, "fit state has no table fingerprints")
        params = obj["params"]
        if not isinstance(params, dict) or not all(k in params for k in ("epsilon", "max_iter", "resync_every")):
            raise IntegrityError(sf, f"fit state lacks parameters (has {params!r})")
        self.backend = obj["backend"]
        self._params = params
        self._meta = {k: obj.get(k) for k in ("counts", "tables", "feature_names", "categories", "kl_data",
                                              "files", "extra", "fit_id", "generations")}
        self._durable = {"files": obj.get("files")}
        self._state_tag = tag
        return StoredFit(obj["status"], obj["backend"], tuple(obj["layout"]), params, obj["state"],
                         obj.get("feature_names"), obj.get("categories"), obj.get("kl_data"))

    def read_counts(self, cards, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
        """The fit's data as (cells, counts), checked against the state's checksum (after :meth:`read`)."""
        info = self._meta.get("counts") or {}
        name = info.get("file", COUNTS_FILE)
        path = self.io.child(name)
        if not self.io.exists(name):
            raise IntegrityError(path, "the fit's data file is missing; run fit() again")
        if self.io.sha256(name) != info.get("sha256"):
            raise IntegrityError(path, "the fit's data file does not match its checksum (altered or "
                                       "damaged); run fit() again")
        a = self.io.read_array(name)
        if (a.ndim != 2 or a.shape[0] != 2 or int(a[1].sum()) != n_samples
                or (a.size and (a[0].min() < 0 or a[0].max() >= math.prod(cards)))):
            raise IntegrityError(path, "the fit's data file does not describe this fit")
        return a[0], a[1]

    def read_kept(self, name: str, data: bool = False) -> np.ndarray:
        """An array kept by :meth:`keep` (or ``begin(files=...)``), checked against the state's checksum
        (after :meth:`read`).  ``data``: the file is the fit's data (a damaged one means fitting
        again from the data; another kept file is rebuilt by ``restart=True`` from the data)."""
        fix = "run fit() again" if data else (f"FSLL.resume({str(self.root)!r}, restart=True) fits again from the "
                                              "data kept in the store")
        info = (self._meta.get("files") or {}).get(name)
        if not info:
            raise IntegrityError(self.state_file, f"fit state names no {name!r} file", fix)
        path = self.io.child(info["file"])
        if not self.io.exists(info["file"]):
            raise IntegrityError(path, f"the fit's {name} file is missing", fix)
        if self.io.sha256(info["file"]) != info.get("sha256"):
            raise IntegrityError(path, f"the fit's {name} file does not match its checksum (altered or damaged)", fix)
        return self.io.read_array(info["file"])

    def extra(self, key: str):
        """What the fit's caller keeps under ``key`` in the state (``set_extra``; None if nothing)."""
        return (self._meta.get("extra") or {}).get(key)

    def disk_available(self) -> int | None:
        """Free space for the fit: the file system's free bytes plus what its tables take already
        (None for an object store: it does not say)."""
        if self.io.is_url:
            return None
        held = 0
        for nm in TABLE_NAMES:  # a table's file or directory and its side files (e.g. checksums)
            table = Path(storage.table_path(self.backend, self.root, nm))
            held += sum(_tree_bytes(p) for p in table.parent.glob(table.name + "*"))
        return shutil.disk_usage(self.root).free + held

    def account(self, plan):
        """``plan`` with the tables' checksum bytes in its disk figure."""
        extra = len(TABLE_NAMES) * storage.overhead_bytes(self.backend, plan.layout.cards, plan.layout.chunk_shape)
        return dataclasses.replace(plan, disk_bytes=plan.disk_bytes + extra) if extra else plan

    # ------------------------------------------------------------------ writing
    def check_new(self) -> None:
        """Refuse a directory that is not empty and not an fsll-ooc store (a user's files)."""
        self.io.check_new()

    @contextlib.contextmanager
    def writing(self, purpose: str, stage: str, plan=None) -> Iterator["FitStore"]:
        """Hold the writer lock inside the disk guard (``stage`` words the full-disk message).

        The lock is refused at once if another writer holds it.  On the way out, failed or
        not, band writes still in flight in this process (a failed pass's other tasks) are
        waited for :data:`QUIESCE_SECONDS`; writes still running then keep the lock, which a
        background thread releases once they have ended, so that nothing writes the store
        once the lock is released.  (Tasks in other processes: a pass of the dask executor
        ends only after every task that began has returned.)
        """
        if plan is not None:
            self.plan = plan
        with self._disk_guard(stage):
            lock = self._lock = self.io.lock(purpose).acquire()
            try:
                yield self
            finally:
                if storage.quiesce(QUIESCE_SECONDS):
                    lock.release()
                else:  # writes of this process still run: the lock goes once the last one ended
                    threading.Thread(target=_release_when_quiet, args=(lock,), name="fsll-release-lock",
                                     daemon=True).start()

    def begin(self, plan, params: dict, labels: tuple | None, uniq, counts, state, files: dict | None = None,
              extra: dict | None = None) -> None:
        """A new fit: old state out, leftovers gone, the data kept, status ``starting``.

        ``files``: more arrays to keep with the data (``{name: array}``, read back by
        :meth:`read_kept`); ``extra``: JSON the caller keeps in the state (:meth:`set_extra`).
        """
        self.plan, self._params = plan, dict(params)
        names, categories = labels if labels is not None else (None, None)
        self._meta = {"feature_names": names, "categories": categories, "fit_id": _new_fit_id()}
        self.io.remove(STATE_FILE)  # an old state must never describe new tables
        self._durable, self._state_tag = {}, None
        self._tidy()
        data = storage.array_file_bytes(np.stack([np.asarray(uniq, np.int64), np.asarray(counts, np.int64)]))
        self.io.write_bytes(COUNTS_FILE, data)
        self._meta["counts"] = {"file": COUNTS_FILE, "sha256": self.io.sha256(COUNTS_FILE),
                                "n_unique": int(len(uniq))}
        for name, a in (files or {}).items():
            self.keep(name, a)
        for key, obj in (extra or {}).items():
            self.set_extra(key, obj)
        self._watch(state, 0, None)
        self.write_state(state, "starting")
        self.resumable = True

    def reopen(self, plan, stored: StoredFit) -> None:
        """Continue the fit of this store (after :meth:`read` under the writer lock)."""
        self.plan = plan
        self._stored = (len(stored.state.get("history") or ()), stored.state.get("entropy_q"))
        self._meta = {k: self._meta.get(k) for k in ("counts", "tables", "feature_names", "categories", "files",
                                                     "extra", "fit_id", "generations")}
        self._tidy()
        self.resumable = True

    def keep(self, name: str, a: np.ndarray) -> None:
        """Keep array ``a`` as the file ``fsll_NAME.0.npy`` or ``fsll_NAME.1.npy``, the one the
        state file on disk does not name (so that file stays intact until the next state
        write, which records the new one and its checksum; keeping twice in between rewrites
        the same new file)."""
        if not name.isidentifier():
            raise ValueError(f"a kept file's name must be an identifier, got {name!r}")
        old = ((self._durable.get("files") or {}).get(name) or {}).get("file")
        fname = f"fsll_{name}.{1 if old == f'fsll_{name}.0.npy' else 0}.npy"
        self._check_lock()
        self.io.write_bytes(fname, storage.array_file_bytes(np.asarray(a)))
        self._meta.setdefault("files", {})
        self._meta["files"] = {**(self._meta["files"] or {}), name: {"file": fname,
                                                                     "sha256": self.io.sha256(fname)}}

    def set_extra(self, key: str, obj) -> None:
        """Keep JSON ``obj`` under ``key`` in the state from the next state write on."""
        self._meta["extra"] = {**(self._meta.get("extra") or {}), key: obj}

    def restart(self, state) -> None:
        """Back to status ``starting`` (tables are rebuilt from the data kept in the store, under
        a new fit id: no chunk of the old tables passes for one of the new)."""
        self._watch(state, 0, None)
        self._meta["fit_id"] = _new_fit_id()
        self._meta.pop("tables", None)
        self._meta.pop("generations", None)
        self.write_state(state, "starting")

    def create_tables(self, cards, chunks) -> list[TableSpec]:
        """New, empty tables ``dbar``, ``thetabar``, ``scratch`` in the store."""
        if not self._meta.get("fit_id"):
            self._meta["fit_id"] = _new_fit_id()
        specs = [self._leased(self.io.create_table(self.backend, nm, cards, chunks, fit_id=self._meta["fit_id"]))
                 for nm in TABLE_NAMES]
        self._record_generations(specs)
        return specs

    def _lease_token(self) -> str | None:
        """The id of this writer's lease (a store at a URL, under its lock), else None."""
        lock = getattr(self, "_lock", None)
        token = getattr(lock, "lease_token", None)
        return token if token and lock.held else None

    def _leased(self, spec: TableSpec, generation: str | None = None) -> TableSpec:
        """``spec`` as this writer writes it: at a URL, under its lock, every write checks the
        lease first, and the chunks are bound to the lease (``generation``: the lease of
        the chunks to read, for a table this writer reads but does not write again)."""
        token = self._lease_token()
        if token is None:
            return spec
        return dataclasses.replace(spec, lease=token, generation=token if generation is None else generation)

    def _record_generations(self, specs) -> None:
        """Keep, from the next state write on, the lease each table's chunks are bound to."""
        if self._lease_token() is not None:
            self._meta["generations"] = {nm: sp.generation for nm, sp in zip(TABLE_NAMES, specs)}

    def _generation(self, name: str) -> str:
        """The lease the chunks of table ``name`` were written under, as the state says ("": none)."""
        gens = self._meta.get("generations")
        gen = gens.get(name) if isinstance(gens, dict) else None
        return gen if isinstance(gen, str) else ""

    def stored_spec(self, name: str, cards, chunks) -> TableSpec:
        """Table ``name`` as the state read last describes it (its fit and, at a URL, the lease
        its chunks are bound to): what reads or verifies it outside a fit."""
        spec = self.io.table_spec(self.backend, name, cards, chunks, fit_id=self._meta.get("fit_id") or "")
        return dataclasses.replace(spec, generation=self._generation(name))

    def tables_ready(self, specs, state) -> None:
        """Targets and duals written: make them durable, fingerprint the tables, status ``running``."""
        for spec in specs[:2]:
            storage.flush(spec)
            storage.sync_table(spec)
        self._meta["tables"] = {nm: storage.table_fingerprint(sp) for nm, sp in zip(TABLE_NAMES, specs)}
        self.write_state(state, "running")

    def checkpoint(self, state) -> None:
        """The learner's callback after every iteration: ``state`` is the model so far.

        Cheap invariants are checked first (:func:`check_invariants`: every cost recorded
        since the last checkpoint finite, not below zero and not rising beyond round-off;
        parameters finite): a learner fed
        damaged tables stops here with an :class:`IntegrityError` naming the store instead
        of running away, and the state file keeps the last sane step."""
        checked, target = self._checked(state)
        # a cost compares with the one before it only on the same targets (EM changes them)
        same = target is None or state.entropy_q == target
        check_invariants(self.root, state, since=checked if same else checked + 1)
        self.write_state(state, "running")
        self._watch(state, len(state.history), state.entropy_q)

    def complete(self, state, kl_data: float | None) -> None:
        """The fit is finished: ``state`` is the final model."""
        self._meta["kl_data"] = kl_data
        self.write_state(state, "complete")

    def _watch(self, state, checked: int, target) -> None:
        self._seen[id(state)] = (weakref.ref(state), checked, target)

    def _checked(self, state) -> tuple[int, float | None]:
        """``(entries checked, H(q) of their targets)`` of ``state``: what an earlier checkpoint
        saw of it; for the state a resume continues, what was stored; for another state
        (EM writes its best restart's), all but its last entry."""
        seen = self._seen.get(id(state))
        if seen is not None and seen[0]() is state:
            return seen[1], seen[2]
        n = len(state.history)
        if self._stored is not None and state.entropy_q == self._stored[1] and n >= self._stored[0]:
            self._stored, (n, _) = None, self._stored
        return n, state.entropy_q

    def open_tables(self, cards, chunks, reader_owner=None, check_targets: bool = True) -> list[TableSpec]:
        """The store's tables, checked: each is still the one the fit created and every
        chunk of ``dbar`` is present with its exact size (its content is checked when read;
        ``check_targets=False``: not, for a fit that rewrites ``dbar`` before reading it).

        With ``reader_owner`` (a reader of a finished fit) the scratch table is a private one
        of this process, removed when ``reader_owner`` is garbage collected.
        """
        fit_id = self._meta.get("fit_id") or ""
        specs = [self.stored_spec(nm, cards, chunks) for nm in TABLE_NAMES]
        if reader_owner is not None:
            specs[2] = self._reader_scratch(tuple(cards), tuple(chunks), reader_owner)
            return specs
        # a resume writes thetabar and scratch again (under its own lease) before reading
        # them; the targets are read as written, unless the fit writes them again too
        specs = [self._leased(sp, sp.generation if nm == "dbar" and check_targets else None)
                 for nm, sp in zip(TABLE_NAMES, specs)]
        self._record_generations(specs)
        if not fit_id:
            raise IntegrityError(self.state_file, _OLD_STORE.format(store=str(self.root)))
        tables = self._meta.get("tables") or {}
        for nm, spec in zip(TABLE_NAMES, specs):
            try:
                storage.check_fingerprint(spec, tables.get(nm) or {})
                if nm == "dbar" and check_targets:
                    storage.check_table(spec)
            except IntegrityError as e:
                raise IntegrityError(e.path, e.problem, _DAMAGED.format(store=str(self.root))) from None
        return specs

    @contextlib.contextmanager
    def damage_hint(self) -> Iterator[None]:
        """A damaged table found while learning: say how to rebuild the store's tables."""
        try:
            yield
        except IntegrityError as e:
            fix = _REDERIVED if self._table_of(e.path) in REDERIVED_TABLES else _DAMAGED
            raise IntegrityError(e.path, e.problem, fix.format(store=str(self.root))) from None

    def _table_of(self, path: str) -> str | None:
        """The table of the store that ``path`` (a table's file, chunk or side file) belongs to."""
        root = str(self.root).rstrip("/") + "/"
        if not str(path).startswith(root):
            return None
        name = str(path)[len(root):].split("/", 1)[0].split(".", 1)[0]
        return name if name in TABLE_NAMES else None

    # ------------------------------------------------------------------ internals
    def write_state(self, state, status: str) -> None:
        """Replace the state file atomically, with a checksum."""
        L = self.plan.layout
        obj = {"format": STATE_FORMAT, "version": STATE_VERSION, "status": status,
               "backend": self.backend, "layout": [L.a, L.c], "chunks": list(L.chunk_shape),
               "params": self._params, "state": state.to_json()}
        obj.update(self._meta)
        self._check_lock()
        if self.io.is_url:
            self._write_state_object(obj)
        else:
            self.io.write_json(STATE_FILE, obj)
        self._durable = {"files": obj.get("files")}

    def _write_state_object(self, obj) -> None:
        """The state object at a URL, on condition (S3) that it is still the one this writer
        last read or wrote: a writer stopped past its lease between its lease check and
        this PUT writes nothing over its successor's state."""
        from .url_store import ObjectChangedError

        try:
            self.io.write_json(STATE_FILE, obj, if_match=self._state_tag)
        except ObjectChangedError:
            raise IntegrityError(self.state_file, "was replaced by another writer since this one last wrote it (this "
                                 "writer's lease ran out and another writer took the store over): it writes nothing "
                                 "more", f"FSLL.resume({str(self.root)!r}) continues from the state there") from None
        self._state_tag = self.io.etag(STATE_FILE)

    def _check_lock(self) -> None:
        """Before a small file is written: a writer whose lease ran out writes nothing over another
        writer's (a store at a URL: :meth:`~fsll_ooc.storage.url_store.ObjectLock.check`)."""
        lock = getattr(self, "_lock", None)
        if lock is not None and hasattr(lock, "check"):
            lock.check()

    def _tidy(self) -> None:
        self.io.tidy()

    @contextlib.contextmanager
    def _disk_guard(self, stage: str) -> Iterator[None]:
        """Turn a full disk (ENOSPC/EDQUOT anywhere in the fit) into one clear :class:`DiskFullError`."""
        try:
            yield
        except DiskFullError:
            raise
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            root = self.root
            try:
                free = None if self.io.is_url else shutil.disk_usage(root if root.exists() else root.parent).free
            except OSError:
                free = None
            from ..planner import format_bytes

            need = f"; the fit's tables take {format_bytes(self.plan.disk_bytes)}" if self.plan is not None else ""
            have = f"{format_bytes(free)} free" if free is not None else "free space unknown"
            if self.resumable:
                todo = f"the store is resumable: free some space, then run FSLL.resume({str(root)!r})"
            else:
                todo = "nothing was started: free some space and run fit() again"
            what = e.strerror or os.strerror(e.errno)
            where = f" ({what}: {e.filename})" if getattr(e, "filename", None) else f" ({what})"
            raise DiskFullError(e.errno, f"{root}: disk full while {stage}{where}; {have}{need}; {todo}",
                                str(root)) from e

    def _reader_scratch(self, cards, chunks, owner) -> TableSpec:
        """A scratch table of our own (space is taken only when written), removed with ``owner``."""
        if self.io.is_url:
            return self.io.reader_scratch(READERS_DIR, cards, chunks, owner)
        token = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        readers = self.root / READERS_DIR
        storage.refuse_link(readers)
        root = readers / token
        try:
            spec = storage.create_table(READER_BACKEND, root, "scratch", cards, chunks, fit_id=_new_fit_id())
        except OSError:  # a read-only store: use the temporary directory
            root = Path(tempfile.mkdtemp(prefix="fsll-reader-"))
            spec = storage.create_table(READER_BACKEND, root, "scratch", cards, chunks, fit_id=_new_fit_id())
        weakref.finalize(owner, _remove_tree, str(root))
        return spec


#: Round-off allowed in a recorded cost, relative to the size of the terms it is computed
#: from (``H(q)``, ``log Z``, ``sum |theta_y dbar_y|``): far above the drift of an exact
#: re-derivation, far below any step the learner takes (``docs/design.md``, "Invariants").
COST_ROUNDOFF = 1e-9


def check_invariants(root, state, since: int = 0) -> None:
    """Raise :class:`IntegrityError` naming store ``root`` when the fit's ``state`` breaks an
    invariant of the learner: a cost (history entries from ``since - 1`` on) that is not
    finite, below zero (a KL divergence plus code lengths) or above the one before it; a
    parameter or ``log Z`` that is not finite.  ``O(#terms + #entries)``; the learner checks
    its duals and targets itself (``fsll_ooc.learn.checks``)."""
    costs = [h.get("cost") for h in state.history[max(since - 1, 0):]]
    costs = [c for c in costs if c is not None]
    theta, dbar = state.theta, state.dbar
    bad = None
    if not all(map(math.isfinite, theta.values())) or not math.isfinite(state.log_z):
        bad = "a parameter is not finite"
    else:
        scale = abs(state.entropy_q) + abs(state.log_z) + sum(abs(v * dbar.get(y, 1.0)) for y, v in theta.items())
        tol = COST_ROUNDOFF * max(1.0, scale)
        for prev, cost in zip([None] + costs, costs):
            if not math.isfinite(cost) or cost < -tol:
                bad = f"the cost is {cost!r} (a KL divergence plus code lengths is never below zero)"
            elif prev is not None and cost > prev + tol:
                bad = f"the cost rose from {prev!r} to {cost!r} (the learner only takes steps that lower it)"
            if bad:
                break
    if bad is not None:
        raise IntegrityError(root, f"the learner stopped at iteration {state.n_iter}: {bad}",
                             _DAMAGED.format(store=str(root)))


def _release_when_quiet(lock) -> None:
    """Release ``lock`` once no band write of this process is in flight."""
    while not storage.quiesce(QUIESCE_SECONDS):
        pass
    lock.release()


def _new_fit_id() -> str:
    """A random id naming one fit's tables (their chunk checksums are bound to it)."""
    return secrets.token_hex(16)


def _persistent(name) -> bool:
    try:
        return storage.get_backend(name).persistent
    except ValueError:
        return False


def _tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for dp, _, fs in os.walk(path):
        for f in fs:
            try:
                total += os.stat(os.path.join(dp, f)).st_blocks * 512
            except OSError:
                pass
    return total


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    parent = os.path.dirname(path)
    if os.path.basename(parent) == READERS_DIR:
        with contextlib.suppress(OSError):
            os.rmdir(parent)  # only when empty


def _clean_dead_readers(root: Path) -> None:
    """Remove private scratch tables of readers that died without cleaning up (this host only)."""
    d = root / READERS_DIR
    if not d.is_dir():
        return
    host = socket.gethostname()
    for sub in d.iterdir():
        h, _, rest = sub.name.rpartition("-")  # host-pid-token
        h, _, pid = h.rpartition("-")
        if h == host and pid.isdigit() and not locking.pid_alive(int(pid)):
            shutil.rmtree(sub, ignore_errors=True)


def open_root(root, storage_options: dict | None = None):
    """How the store ``root`` is reached: a local directory (:class:`LocalRoot`), or a URL
    (:class:`~fsll_ooc.storage.url_store.URLRoot`); ``file://PATH`` is the local ``PATH``."""
    from .url_store import URLRoot, is_url, local_path

    if isinstance(root, (LocalRoot, URLRoot)):
        return root
    path = local_path(root)
    if path is None:
        return URLRoot(root, storage_options)
    return LocalRoot(path)


class LocalRoot:
    """The files of a store in a local directory: atomic replacement, ``flock``, leftovers."""

    is_url = False

    def __init__(self, root):
        self.root = Path(root)

    def __str__(self) -> str:
        return str(self.root)

    def child(self, name: str) -> Path:
        return self.root / name

    def exists(self, name: str) -> bool:
        return (self.root / name).exists()

    def remove(self, name: str) -> None:
        if (self.root / name).exists():
            (self.root / name).unlink()
            storage.fsync_path(str(self.root), directory=True)

    def write_bytes(self, name: str, data: bytes) -> None:
        storage.write_bytes_atomic(self.root / name, data)

    def sha256(self, name: str) -> str:
        return storage.file_sha256(self.root / name)

    def read_array(self, name: str) -> np.ndarray:
        return storage.read_array_file(self.root / name)

    def read_json(self, name: str):
        return storage.read_json(self.root / name, checksum=True)

    def write_json(self, name: str, obj) -> None:
        storage.write_json_atomic(self.root / name, obj, checksum=True)

    def lock(self, purpose: str):
        return locking.StoreLock(self.root, purpose=purpose)

    def check_new(self) -> None:
        storage.check_store_dir(self.root)

    def tidy(self) -> None:
        storage.remove_leftovers(self.root)
        _clean_dead_readers(self.root)

    def create_table(self, backend: str, name: str, cards, chunks, fit_id: str = "") -> TableSpec:
        self.root.mkdir(parents=True, exist_ok=True)
        return storage.create_table(backend, self.root, name, cards, chunks, fit_id=fit_id)

    def table_spec(self, backend: str, name: str, cards, chunks, fit_id: str = "") -> TableSpec:
        return TableSpec(backend, storage.table_path(backend, self.root, name), tuple(cards), tuple(chunks),
                         fit_id=fit_id)
