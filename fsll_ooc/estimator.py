"""The user's door: the :class:`FSLL` estimator (scikit-learn conventions, no sklearn needed).

>>> import numpy as np
>>> from fsll_ooc import FSLL
>>> rng = np.random.default_rng(0)
>>> a = rng.integers(0, 2, 500); b = (a + (rng.random(500) < 0.1)) % 2; c = rng.integers(0, 3, 500)
>>> m = FSLL(progress=False).fit(np.c_[a, b, c])
>>> m.cardinalities_, m.n_bases_ >= 1
((2, 2, 3), True)
>>> p = m.probabilities(); p.shape, round(float(p.sum()), 12)
((2, 2, 3), 1.0)
>>> bool(np.isclose(m.log_prob(np.array([[0, 0, 1]]))[0], np.log(p[0, 0, 1])))
True
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import basis, cost as C, storage
from .storage import lock as locking
from .engine import Engine
from .executors import make_executor
from .learn import FitState, LearnOptions, learn, resolve_refine
from .planner import plan as make_plan, PlanError

__all__ = ["FSLL", "MODEL_FORMAT", "MODEL_VERSION", "validate_data"]

MODEL_FORMAT = "fsll-ooc-model"
MODEL_VERSION = 1
STATE_FILE = "fsll_state.json"
STATE_FORMAT = "fsll-ooc-fit-state"
#: The fit's data as (cell, count) pairs, kept in the store so that resume can restart any stage.
COUNTS_FILE = "fsll_counts.npy"
#: Private scratch tables of read-only users of a finished store (one directory per reader).
READERS_DIR = "readers"
TABLE_NAMES = ("dbar", "thetabar", "scratch")
_STATUSES = ("starting", "running", "complete")
MAX_CARD = 2**16


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return None


def validate_data(X: Any, cardinalities: Sequence[int] | None = None) -> tuple[np.ndarray, tuple[int, ...]]:
    """Check ``X`` and return ``(codes as int64 (N, n), cardinalities)``.

    Raises ``ValueError`` naming the offending column, row, value or limit; nothing
    large is allocated before the checks pass.

    >>> validate_data([[0, 1], [1, 2]])[1]
    (2, 3)
    >>> validate_data([[0, 5]], cardinalities=[2, 3])
    Traceback (most recent call last):
    ...
    ValueError: column 1 (X1): value 5 in row 0 is outside 0..2 (cardinality 3)
    """
    if hasattr(X, "to_numpy") and hasattr(X, "columns"):
        from .io import encode  # DataFrames: categories become codes

        enc = encode(X, cardinalities)
        X = enc.codes
        if cardinalities is None:
            cardinalities = enc.cardinalities
    arr = np.asarray(X)
    if arr.ndim != 2:
        raise ValueError(f"X must be a 2-D array (samples x variables), got {arr.ndim}-D with shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError("X has no samples (0 rows)")
    if arr.shape[1] == 0:
        raise ValueError("X has no variables (0 columns)")
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    _check_code_range(arr)  # before any cast to int64 can wrap a huge code onto another cell
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            r, c = map(int, np.argwhere(bad)[0])
            raise ValueError(f"column {c} (X{c}): value {arr[r, c]} in row {r} is not a finite number")
        frac = arr != np.round(arr)
        if frac.any():
            r, c = map(int, np.argwhere(frac)[0])
            raise ValueError(f"column {c} (X{c}): value {arr[r, c]} in row {r} is not an integer category code")
    elif arr.dtype.kind not in "iu":
        raise ValueError(f"X must hold integer category codes, got dtype {arr.dtype}; "
                         "encode strings first (fsll_ooc.io.encode or pass a pandas DataFrame)")
    if (arr < 0).any():
        r, c = map(int, np.argwhere(arr < 0)[0])
        raise ValueError(f"column {c} (X{c}): value {arr[r, c]} in row {r} is negative; codes are 0..k-1")
    arr = arr.astype(np.int64)
    n = arr.shape[1]
    if cardinalities is None:
        cards = tuple(int(v) + 1 for v in arr.max(axis=0))
    else:
        cards = tuple(int(k) for k in cardinalities)
        if len(cards) != n:
            raise ValueError(f"cardinalities has {len(cards)} entries but X has {n} columns")
        for i, k in enumerate(cards):
            if k < 1:
                raise ValueError(f"cardinality of column {i} (X{i}) must be >= 1, got {k}")
        over = arr >= np.array(cards)
        if over.any():
            r, c = map(int, np.argwhere(over)[0])
            raise ValueError(f"column {c} (X{c}): value {arr[r, c]} in row {r} is outside 0..{cards[c] - 1} "
                             f"(cardinality {cards[c]})")
    for i, k in enumerate(cards):
        if k > MAX_CARD:
            raise ValueError(f"column {i} (X{i}) has {k} categories, above the limit of {MAX_CARD}")
    size = math.prod(cards)
    if size >= 2**62:
        raise ValueError(f"the joint table would have {size:.3e} cells (product of cardinalities {cards}); "
                         "the limit is 2^62")
    return arr, cards


def _flat_index(codes: np.ndarray, cards: Sequence[int]) -> np.ndarray:
    return np.ravel_multi_index(tuple(codes.T), tuple(cards)).astype(np.int64)


class FSLL:
    """Full-span log-linear model of ``n`` discrete variables, learned greedily under MDL.

    Parameters
    ----------
    cardinalities : sequence of int, optional
        ``k_i`` per column; inferred as ``max + 1`` per column when omitted.
    epsilon : "auto" or float
        Stop when the best move lowers the cost by less than this (nats per sample).
        ``"auto"`` (default): ``0.1 / N``, a tenth of a nat of the whole data set's
        code length (:func:`fsll_ooc.learn.auto_epsilon` gives the reasoning), with
        corrective steps (see ``refine``); it equals ``1e-4`` at ``N = 1000`` and is
        smaller above.  Measured in ``docs/benchmarks_quality.md``, it reaches a far
        lower ``KL(p*||p)`` than the paper's setting at about its time.
        ``epsilon=1e-4`` (with the default ``refine``) reproduces the paper exactly.
    max_iter : int, optional
        Hard cap on iterations (None: until convergence).
    store : path, optional
        Directory for out-of-core tables (Zarr v3 by default). None: in memory.
    backend : {"zarr", "memmap", "numpy"}, optional
        Table storage; default "zarr" with a store, "numpy" without.
    memory_limit : int or str, optional
        e.g. "4GiB": the planner keeps the fit's peak within it.
    scheduler : None, "threads", "synchronous", "serial" or a ``dask.distributed.Client``
        Who runs the chunk-parallel passes (None: serial in core, dask threads out of core).
    layout : (a, c), optional
        Explicit chunk layout cut points (experts and tests); see :mod:`fsll_ooc.planner`.
    resync_every : int
        Re-derive the dual table exactly every this many iterations.
    progress : bool, optional
        Show a progress bar (default: when stderr is a terminal).
    refine : None, bool, "adjust" or "final"
        Fully corrective steps (:mod:`fsll_ooc.learn.corrective`): damped Newton on all
        selected parameters jointly, exact duals after each step, cost monotone, the
        same MDL cost and the same stopping test.  ``"adjust"`` runs one whenever the
        greedy search's best move is an adjust or it would stop, ``"final"`` only when
        it would stop; when it would stop, a joint selection of candidates that pay
        only together (the support re-adapting) is tried too.  ``None`` (default):
        ``"adjust"`` with ``epsilon="auto"``, off with a numeric epsilon (the paper's
        algorithm).  Measured in ``docs/benchmarks_quality.md`` (3 seeds): KL(p*||p) on
        the paper's Ising5x4L 0.0057 -> 0.0002 and BN20-54L 0.051 -> 0.0022, at 0.8-2.7x
        the time of the paper setting over all twelve datasets there.

    Attributes (after ``fit``)
    --------------------------
    theta_ : dict {tuple y: float}, the non-zero parameters; n_bases_ : len(theta_);
    n_iter_, cost_, kl_data_ (= KL(p_d || p_theta)), history_ (one dict per iteration),
    log_z_, cardinalities_, n_samples_, plan_, feature_names_in_, categories_.
    """

    def __init__(self, cardinalities=None, epsilon="auto", max_iter=None, store=None, backend=None,
                 memory_limit=None, scheduler=None, layout=None, resync_every=256, progress=None, refine=None):
        self.cardinalities = cardinalities
        self.epsilon = epsilon
        self.max_iter = max_iter
        self.store = store
        self.backend = backend
        self.memory_limit = memory_limit
        self.scheduler = scheduler
        self.layout = layout
        self.resync_every = resync_every
        self.progress = progress
        self.refine = refine

    # ------------------------------------------------------------------ sklearn-style params
    _PARAMS = ("cardinalities", "epsilon", "max_iter", "store", "backend", "memory_limit", "scheduler",
               "layout", "resync_every", "progress", "refine")

    def get_params(self, deep: bool = True) -> dict:
        """Constructor parameters, as in scikit-learn."""
        return {k: getattr(self, k) for k in self._PARAMS}

    def set_params(self, **params) -> "FSLL":
        """Set constructor parameters; unknown names raise ``ValueError``."""
        for k, v in params.items():
            if k not in self._PARAMS:
                raise ValueError(f"unknown parameter {k!r}; valid: {', '.join(self._PARAMS)}")
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        diff = {k: v for k, v in self.get_params().items() if v != FSLL().get_params()[k]}
        return "FSLL(" + ", ".join(f"{k}={v!r}" for k, v in diff.items()) + ")"

    # ------------------------------------------------------------------ fitting
    def _check_params(self):
        if not (self.epsilon == "auto" if isinstance(self.epsilon, str) else (
                isinstance(self.epsilon, (int, float)) and self.epsilon > 0 and math.isfinite(self.epsilon))):
            raise ValueError(f"epsilon must be a positive number or 'auto', got {self.epsilon!r}")
        resolve_refine(self.refine, self.epsilon)  # raises ValueError on a bad value
        if self.max_iter is not None and (not isinstance(self.max_iter, (int, np.integer)) or self.max_iter < 0):
            raise ValueError(f"max_iter must be a non-negative int or None, got {self.max_iter!r}")
        if not (isinstance(self.resync_every, (int, np.integer)) and self.resync_every >= 1):
            raise ValueError(f"resync_every must be a positive int, got {self.resync_every!r}")
        backend = self.backend or ("zarr" if self.store is not None else "numpy")
        if backend not in storage.BACKENDS:
            raise ValueError(f"backend must be one of {storage.BACKENDS}, got {backend!r}")
        if backend != "numpy" and self.store is None:
            raise ValueError(f"backend {backend!r} needs store=PATH")
        return backend

    def _make_plan(self, cards, backend):
        disk = None
        if backend != "numpy":
            parent = Path(self.store).resolve()
            while not parent.exists():
                parent = parent.parent
            disk = shutil.disk_usage(parent).free
        mem = self.memory_limit
        if mem is None and backend == "numpy":
            mem = _total_memory()
        workers = 2 if backend != "numpy" else 1
        if self.scheduler is not None and hasattr(self.scheduler, "nthreads"):
            workers = max(1, sum(self.scheduler.nthreads().values()))
        p = make_plan(cards, memory_limit=mem, disk_free=disk, workers=workers,
                      out_of_core=backend != "numpy" or None, layout=self.layout)
        if backend == "numpy" and p.layout.a > 0 and self.layout is None:
            raise PlanError(f"the {math.prod(cards):,}-cell tables do not fit in memory "
                            f"({p.report().splitlines()[0]}); pass store=PATH to fit out of core")
        if not p.feasible:
            raise PlanError("infeasible fit:\n" + p.report())
        return p

    def _show_progress(self) -> bool:
        return bool(self.progress if self.progress is not None else sys.stderr.isatty())

    def _bar(self, desc: str):
        if not self._show_progress():
            return None
        from tqdm.auto import tqdm

        return tqdm(desc=desc, unit="it", file=sys.stderr, dynamic_ncols=True)

    def fit(self, X, y=None) -> "FSLL":
        """Learn the model from ``X`` (N x n integer codes, or a DataFrame); returns ``self``."""
        backend = self._check_params()
        _check_cardinalities_param(self.cardinalities)
        feature_names = list(map(str, X.columns)) if hasattr(X, "columns") else None
        categories = None
        if hasattr(X, "columns"):
            from .io import encode

            enc = encode(X, self.cardinalities)
            codes, cards, categories = enc.codes, enc.cardinalities, enc.categories
            codes, cards = validate_data(codes, cards)
        else:
            X = _check_code_range(X)
            codes, cards = validate_data(X, self.cardinalities)
        plan = self._make_plan(cards, backend)
        N = codes.shape[0]
        flat = _flat_index(codes, cards)
        uniq, counts = np.unique(flat, return_counts=True)
        size = math.prod(cards)
        state = FitState(cards, N, C.target_entropy(counts, N, size), log_z=math.log(size))
        if backend == "numpy":
            engine, specs = self._open_engine(plan, backend, cards, N, create=True)
            engine.progress = self._show_progress()
            engine.compute_targets(flat, N)
            engine.init_duals()
            self._run(engine, state, plan, backend, fresh=True)
            self._finish(state, plan, backend, specs, engine)
            self.kl_data_ = self._kl_data(flat, counts, N)
        else:
            # Crash-safe order (docs/reliability.md): lock; old state out; data kept in the store;
            # "starting"; tables and targets; "running" after every iteration; "complete".
            storage.check_store_dir(self.store)  # never replace or delete a user's files
            plan = _with_checksum_bytes(plan, backend)
            self._meta = {"feature_names": feature_names, "categories": _json_or_none(_jsonable(categories))}
            self._resumable = False
            with self._disk_guard(plan, "fitting"), self._writer_lock("fit"):
                root = Path(self.store)
                sf = root / STATE_FILE
                if sf.exists():
                    sf.unlink()  # an old state must never describe new tables
                    storage._fsync_path(str(root), directory=True)
                storage.remove_leftovers(root)
                _clean_dead_readers(root)
                self._write_counts(uniq, counts)
                self._persist(state, plan, backend, status="starting")
                self._resumable = True
                engine, specs = self._start_tables(state, plan, backend, flat)
                self._guarded_run(engine, state, plan, backend, fresh=True)
                self._finish(state, plan, backend, specs, engine)
                self.kl_data_ = self._kl_data(flat, counts, N)
                self._meta["kl_data"] = self.kl_data_
                self._persist(state, plan, backend, status="complete")
        self.feature_names_in_ = feature_names
        self.categories_ = categories
        return self

    def _open_engine(self, plan, backend, cards, N, create: bool, reader: bool = False):
        """Engine over the store's tables: new ones (``create``), the existing ones, or for a
        ``reader`` of a finished fit the existing ones plus a private scratch table."""
        L = plan.layout
        names = TABLE_NAMES
        if create:
            if backend != "numpy":
                Path(self.store).mkdir(parents=True, exist_ok=True)
            specs = [storage.create_table(backend, self.store, nm, cards, L.chunk_shape) for nm in names]
        else:
            specs = [storage.TableSpec(backend, storage.table_path(backend, self.store, nm),
                                       tuple(cards), L.chunk_shape) for nm in names]
            if reader:
                specs[2] = self._reader_scratch(tuple(cards), L.chunk_shape)
        r0, w = C.penalty_weights(cards, N)
        n_tasks = max(L.n_a_bands, L.n_b_bands if L.a > 0 else 1)
        executor = make_executor(self.scheduler, n_tasks)
        return Engine(L, specs, r0, w, executor), specs

    def _run(self, engine, state, plan, backend, fresh):
        bar = self._bar("fsll fit")
        engine.progress = bar is not None
        cb = (lambda s: self._persist(s, plan, backend, status="running")) if backend != "numpy" else None
        try:
            learn(engine, state, LearnOptions(epsilon=self.epsilon, max_iter=self.max_iter,
                                              resync_every=self.resync_every, refine=self.refine),
                  fresh=fresh, progress=bar, callback=cb)
        finally:
            if bar is not None:
                bar.close()

    def _persist(self, state: FitState, plan, backend, status: str) -> None:
        """Replace the store's state file atomically (with a checksum).

        ``starting``: the data file is written, the tables are not yet complete (resume
        rebuilds them); ``running``: targets complete and durable, ``state`` is the model
        after ``n_iter`` iterations (resume re-derives the dual table from it);
        ``complete``: the fit is finished and ``state`` is the final model.
        """
        obj = {"format": STATE_FORMAT, "version": MODEL_VERSION, "status": status,
               "backend": backend, "layout": [plan.layout.a, plan.layout.c],
               "chunks": list(plan.layout.chunk_shape),
               "params": {k: _plain(v) for k, v in self.get_params().items()
                          if k in ("epsilon", "max_iter", "resync_every", "cardinalities", "memory_limit", "refine")},
               "state": state.to_json()}
        obj.update(getattr(self, "_meta", None) or {})
        storage.write_json_atomic(Path(self.store) / STATE_FILE, obj, checksum=True)

    def _finish(self, state, plan, backend, specs, engine):
        self._state = state
        self._engine = engine
        self.plan_ = plan
        self.cardinalities_ = tuple(state.cards)
        self.n_features_in_ = len(state.cards)
        self.n_samples_ = state.n_samples
        self.theta_ = {state.digits(y): v for y, v in sorted(state.theta.items())}
        self.log_z_ = state.log_z
        self.n_bases_ = len(state.theta)
        self.n_iter_ = state.n_iter
        self.cost_ = state.cost()
        self.history_ = state.history
        self.converged_ = state.converged

    @classmethod
    def resume(cls, store, scheduler=None, progress=None, restart: bool = False) -> "FSLL":
        """Continue an interrupted out-of-core fit from its store, to the same result.

        Works from any point at which the fit was stopped (killed, disk full, ...) once the
        store holds its state file: ``starting`` (the tables are rebuilt from the data kept
        in the store), ``running`` (the dual table is re-derived exactly from the saved
        parameters), ``complete`` (the finished model is returned; several processes may
        do this at once, each computing probabilities in its own scratch table).
        ``restart=True`` rebuilds every table from the stored data and fits from the start
        (for a store whose tables are damaged).

        Raises ``FileNotFoundError`` (nothing to resume), :class:`~fsll_ooc.storage.IntegrityError`
        (a store file is damaged or altered, named in the message) or
        :class:`~fsll_ooc.storage.lock.StoreLockedError` (another process is writing the store).
        """
        root = Path(store)
        sf = root / STATE_FILE
        if not sf.exists():
            hint = (" (the fit was stopped before it started; run fit() again)"
                    if (root / COUNTS_FILE).exists() or (root / locking.LOCK_FILE).exists() else "")
            raise FileNotFoundError(f"{store}: no fit state ({STATE_FILE}) found; nothing to resume{hint}")
        with locking.StoreLock(root, purpose="read").acquire(shared=True, create=False):
            obj = cls._read_state(root)
            if obj["status"] == "complete" and not restart:
                return cls._open_finished(root, obj, scheduler, progress)
        m = cls._from_state(root, obj, scheduler, progress)
        with m._disk_guard(None, "resuming the fit"), m._writer_lock("resume"):
            obj = cls._read_state(root)  # again, now that no other writer can change it
            m.set_params(**cls._from_state(root, obj, scheduler, progress).get_params())
            if obj["status"] == "complete" and not restart:
                return cls._open_finished(root, obj, scheduler, progress)
            backend = obj["backend"]
            state = FitState.from_json(obj["state"])
            cards, N = tuple(state.cards), state.n_samples
            plan = _with_checksum_bytes(m._resume_plan(cards, backend), backend)
            m._disk_plan = plan
            uniq, counts = m._read_counts(obj, cards, N)
            storage.remove_leftovers(root)
            _clean_dead_readers(root)
            m._meta = {k: obj.get(k) for k in ("counts", "tables", "feature_names", "categories")}
            m._resumable = True
            if obj["status"] == "starting" or restart:
                size = math.prod(cards)
                state = FitState(cards, N, C.target_entropy(counts, N, size), log_z=math.log(size))
                m._persist(state, plan, backend, status="starting")
                engine, specs = m._start_tables(state, plan, backend, np.repeat(uniq, counts))
                m._guarded_run(engine, state, plan, backend, fresh=True)
            else:
                engine, specs = m._open_engine(plan, backend, cards, N, create=False)
                m._check_tables(specs, obj)
                if not state.converged and (m.max_iter is None or state.n_iter < m.max_iter):
                    m._guarded_run(engine, state, plan, backend, fresh=False)
            m._finish(state, plan, backend, specs, engine)
            m.feature_names_in_ = obj.get("feature_names")
            m.categories_ = obj.get("categories")
            m.kl_data_ = m._kl_data(uniq, counts, N)
            m._meta["kl_data"] = m.kl_data_
            m._persist(state, plan, backend, status="complete")
        return m

    # ------------------------------------------------------------------ store internals (crash safety)
    @staticmethod
    def _read_state(root: Path) -> dict:
        """The verified state of the store at ``root``; :class:`IntegrityError` if it cannot be trusted."""
        sf = root / STATE_FILE
        obj = storage.read_json(sf, checksum=True)
        if obj.get("format") != STATE_FORMAT:
            raise storage.IntegrityError(sf, f"not an fsll-ooc fit state (format {obj.get('format')!r})")
        if not isinstance(obj.get("version"), int) or obj["version"] > MODEL_VERSION:
            raise storage.IntegrityError(sf, f"fit state version {obj.get('version')!r} is newer than this "
                                             f"fsll-ooc understands (<= {MODEL_VERSION}); upgrade fsll-ooc")
        missing = [k for k in ("status", "backend", "layout", "params", "state", "counts") if k not in obj]
        if missing or obj["status"] not in _STATUSES or obj["backend"] not in ("memmap", "zarr"):
            raise storage.IntegrityError(sf, f"fit state is incomplete or unknown (missing {missing}, "
                                             f"status {obj.get('status')!r}, backend {obj.get('backend')!r})")
        if obj["status"] != "starting" and not obj.get("tables"):
            raise storage.IntegrityError(sf, "fit state has no table fingerprints")
        return obj

    @classmethod
    def _from_state(cls, root: Path, obj: dict, scheduler, progress) -> "FSLL":
        params = obj["params"]
        if not isinstance(params, dict) or not all(k in params for k in ("epsilon", "max_iter", "resync_every")):
            raise storage.IntegrityError(root / STATE_FILE, f"fit state lacks parameters (has {params!r})")
        kw = {k: v for k, v in params.items() if k in cls._PARAMS}  # every learning parameter of the fit
        kw.update(store=root, backend=obj["backend"], scheduler=scheduler, layout=tuple(obj["layout"]),
                  progress=progress)
        return cls(**kw)

    @classmethod
    def _open_finished(cls, root: Path, obj: dict, scheduler, progress) -> "FSLL":
        """A finished fit for reading: nothing in the store is written (a private scratch table is)."""
        m = cls._from_state(root, obj, scheduler, progress)
        state = FitState.from_json(obj["state"])
        backend = obj["backend"]
        plan = _with_checksum_bytes(m._resume_plan(tuple(state.cards), backend, disk=False), backend)
        engine, specs = m._open_engine(plan, backend, state.cards, state.n_samples, create=False, reader=True)
        m._finish(state, plan, backend, specs, engine)
        m.feature_names_in_ = obj.get("feature_names")
        m.categories_ = obj.get("categories")
        m.kl_data_ = obj.get("kl_data")
        return m

    def _resume_plan(self, cards, backend, disk: bool = True):
        """The plan of a stored fit (its layout is fixed): the memory check as for a new fit;
        the disk check counts the space the store's tables already take as available."""
        free = None
        if disk:
            root = Path(self.store)
            held = sum(_tree_bytes(Path(storage.table_path(backend, root, nm))) for nm in TABLE_NAMES)
            free = shutil.disk_usage(root).free + held
        workers = 2
        if self.scheduler is not None and hasattr(self.scheduler, "nthreads"):
            workers = max(1, sum(self.scheduler.nthreads().values()))
        p = make_plan(cards, memory_limit=self.memory_limit, disk_free=free, workers=workers, out_of_core=True,
                      layout=self.layout)
        if not p.feasible:
            raise PlanError("infeasible fit:\n" + p.report())
        return p

    @contextlib.contextmanager
    def _writer_lock(self, purpose: str):
        """Hold the store's exclusive lock (refused at once if another writer holds it).  On the
        way out, failed or not, wait for band writes still in flight (a failed pass's other
        tasks) so that nothing writes the store once the lock is released."""
        lock = locking.StoreLock(Path(self.store), purpose=purpose).acquire()
        try:
            yield lock
        finally:
            try:
                storage.quiesce()
            finally:
                lock.release()

    @contextlib.contextmanager
    def _disk_guard(self, plan, stage: str):
        """Turn a full disk (ENOSPC/EDQUOT anywhere in the fit) into one clear :class:`DiskFullError`."""
        try:
            yield
        except storage.DiskFullError:
            raise
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            plan = plan or getattr(self, "_disk_plan", None)
            root = Path(self.store)
            try:
                free = shutil.disk_usage(root if root.exists() else root.parent).free
            except OSError:
                free = None
            from .planner import format_bytes

            need = f"; the fit's tables take {format_bytes(plan.disk_bytes)}" if plan is not None else ""
            have = f"{format_bytes(free)} free" if free is not None else "free space unknown"
            if getattr(self, "_resumable", False):
                todo = f"the store is resumable: free some space, then run FSLL.resume({str(root)!r})"
            else:
                todo = "nothing was started: free some space and run fit() again"
            what = e.strerror or os.strerror(e.errno)
            where = f" ({what}: {e.filename})" if getattr(e, "filename", None) else f" ({what})"
            raise storage.DiskFullError(e.errno, f"{root}: disk full while {stage}{where}; {have}{need}; {todo}",
                                        str(root)) from e

    def _write_counts(self, uniq: np.ndarray, counts: np.ndarray) -> None:
        data = storage.array_file_bytes(np.stack([np.asarray(uniq, np.int64), np.asarray(counts, np.int64)]))
        path = Path(self.store) / COUNTS_FILE
        storage.write_bytes_atomic(path, data)
        self._meta["counts"] = {"file": COUNTS_FILE, "sha256": storage.file_sha256(path),
                                "n_unique": int(len(uniq))}

    def _read_counts(self, obj: dict, cards, N: int) -> tuple[np.ndarray, np.ndarray]:
        info = obj.get("counts") or {}
        path = Path(self.store) / info.get("file", COUNTS_FILE)
        if not path.exists():
            raise storage.IntegrityError(path, "the fit's data file is missing; run fit() again")
        if storage.file_sha256(path) != info.get("sha256"):
            raise storage.IntegrityError(path, "the fit's data file does not match its checksum (altered or "
                                               "damaged); run fit() again")
        a = storage.read_array_file(path)
        if a.ndim != 2 or a.shape[0] != 2 or int(a[1].sum()) != N or (a.size and (a[0].min() < 0 or a[0].max() >= math.prod(cards))):
            raise storage.IntegrityError(path, "the fit's data file does not describe this fit")
        return a[0], a[1]

    def _start_tables(self, state, plan, backend, flat):
        """New tables, targets and duals, made durable, then state ``running`` at iteration 0."""
        engine, specs = self._open_engine(plan, backend, state.cards, state.n_samples, create=True)
        engine.progress = self._show_progress()
        engine.compute_targets(flat, state.n_samples)
        engine.init_duals()
        for spec in specs[:2]:
            storage.flush(spec)
            storage.sync_table(spec)
        self._meta["tables"] = {nm: storage.table_fingerprint(sp) for nm, sp in zip(TABLE_NAMES, specs)}
        self._persist(state, plan, backend, status="running")
        return engine, specs

    def _check_tables(self, specs, obj: dict) -> None:
        """Every table still is the one the fit created; every chunk of ``dbar`` is present
        with its exact size (its content is checked when read)."""
        tables = obj.get("tables") or {}
        for nm, spec in zip(TABLE_NAMES, specs):
            try:
                storage.check_fingerprint(spec, tables.get(nm) or {})
                if nm == "dbar":
                    storage.check_table(spec)
            except storage.IntegrityError as e:
                raise storage.IntegrityError(e.path, e.problem, _DAMAGED.format(store=self.store)) from None

    def _guarded_run(self, engine, state, plan, backend, fresh):
        try:
            self._run(engine, state, plan, backend, fresh=fresh)
        except storage.IntegrityError as e:
            raise storage.IntegrityError(e.path, e.problem, _DAMAGED.format(store=self.store)) from None

    def _reader_scratch(self, cards, chunks) -> storage.TableSpec:
        """A scratch table of our own (zarr: space is taken only when written), removed with the model."""
        token = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        root = Path(self.store) / READERS_DIR / token
        try:
            spec = storage.create_table("zarr", root, "scratch", cards, chunks)
        except OSError:  # a read-only store: use the temporary directory
            root = Path(tempfile.mkdtemp(prefix="fsll-reader-"))
            spec = storage.create_table("zarr", root, "scratch", cards, chunks)
        self._reader_dir = weakref.finalize(self, _remove_tree, str(root))
        return spec

    # ------------------------------------------------------------------ using the model
    def _check_fitted(self):
        if not hasattr(self, "theta_"):
            raise RuntimeError("this FSLL model is not fitted yet; call fit(X) first")

    def _codes(self, X) -> np.ndarray:
        self._check_fitted()
        if hasattr(X, "columns") and getattr(self, "categories_", None) is not None:
            from .io import encode_with

            X = encode_with(self.categories_, X)
        arr = np.asarray(X)
        if arr.ndim == 1 and arr.shape[0] == len(self.cardinalities_):
            arr = arr[None, :]
        if arr.ndim == 2 and arr.shape[1] != len(self.cardinalities_):
            raise ValueError(f"X has {arr.shape[1]} columns but the model has {len(self.cardinalities_)} variables")
        return validate_data(arr, self.cardinalities_)[0]

    def _log_potential(self, codes: np.ndarray) -> np.ndarray:
        """``l_theta(x) = sum_y theta_y Phi_y(x)`` per row, by gathers from the local basis matrices."""
        rows: dict = {}
        l = np.zeros(codes.shape[0])
        for y, v in self.theta_.items():
            phi = None
            for i, yi in enumerate(y):
                if yi:
                    k = self.cardinalities_[i]
                    row = rows.get((k, yi))
                    if row is None:
                        row = rows[(k, yi)] = basis.phi_values(k, yi, np.arange(k))
                    f = row[codes[:, i]]
                    phi = f if phi is None else phi * f
            l += v * (1.0 if phi is None else phi)
        return l

    def log_prob(self, X) -> np.ndarray:
        """Natural log ``p_theta(x)`` of each row of ``X``."""
        codes = self._codes(X)
        return self._log_potential(codes) - self.log_z_

    def score_samples(self, X) -> np.ndarray:
        """Alias of :meth:`log_prob` (scikit-learn density-model name)."""
        return self.log_prob(X)

    def score(self, X, y=None) -> float:
        """Mean log-likelihood (nats per sample) of ``X``."""
        return float(np.mean(self.log_prob(X)))

    def _kl_data(self, flat, counts, N) -> float:
        """``KL(p_d || p_theta)`` of the training data.

        From the sparse state, ``O(#terms)``: ``-H(p_d) - sum_y theta_y E_pd[Phi_y] + log Z``,
        where ``E_pd[Phi_y] = ((N + 1) dbar_y - E_u[Phi_y]) / N`` undoes the positivity rule
        (``dbar`` are the moments of ``q = (N p_d + u) / (N + 1)``; ``E_u[Phi_y]`` is 0 on a
        Walsh-Hadamard axis with ``y_i != 0`` and ``(2 - k) / k`` on a +-1 axis).  Falls back
        to evaluating ``log p_theta`` at the data when a target is missing.
        """
        st = self._state
        if all(y in st.dbar for y in st.theta):
            cards = st.cards
            m = 0.0
            for y, v in st.theta.items():
                eu = 1.0
                for i, yi in enumerate(st.digits(y)):
                    if yi:
                        eu *= 0.0 if basis.is_walsh(cards[i]) else (2.0 - cards[i]) / cards[i]
                m += v * ((N + 1.0) * st.dbar[y] - eu) / N
            return float(-C.empirical_entropy(counts, N) - m + st.log_z)
        uniq = np.unique(flat)
        eng = getattr(self, "_engine", None)
        if eng is not None and eng.layout.a == 0 and len(uniq) * len(self.theta_) > eng.layout.size:
            # in core with many occupied cells and terms: one pass over the table is cheaper
            lp = np.log(self.probabilities().reshape(-1)[uniq])
        else:
            codes = np.stack(np.unravel_index(uniq, self.cardinalities_), axis=1)
            lp = self._log_potential(codes) - self.log_z_
        return float(-C.empirical_entropy(counts, N) - np.dot(counts, lp) / N)

    def probabilities(self):
        """The normalised table ``p_theta`` of shape ``cardinalities_``.

        In core: a numpy array.  Out of core: a dask array over the store's scratch
        table (valid until the next call that writes the scratch table).
        """
        self._check_fitted()
        st = self._state
        sup = np.fromiter(st.theta.keys(), np.int64, len(st.theta))
        val = np.fromiter(st.theta.values(), np.float64, len(st.theta))
        eng = getattr(self, "_engine", None)
        if eng is None:  # a loaded model: build the table here
            _check_table_fits_memory(self.cardinalities_)
            table = np.zeros(self.cardinalities_)
            table.reshape(-1)[sup] = val
            try:
                from .kernels.transform import transform_inplace

                transform_inplace(table, transpose=True)
                l = table
            except ImportError:  # pragma: no cover
                l = basis.transform_t(table)
            l -= l.max()
            p = np.exp(l, out=l)
            return p / p.sum()
        total = eng.density(sup, val, self.log_z_)
        if eng.ctx.specs[2].backend == "numpy":
            return eng.ctx.specs[2].array / total
        import dask.array as da

        spec = eng.ctx.specs[2]
        arr = da.from_zarr(spec.path) if spec.backend == "zarr" else da.from_array(
            storage.open_table(spec), chunks=spec.chunks)
        return arr / total

    def sample(self, n_samples: int = 1, random_state=None) -> np.ndarray:
        """Draw ``n_samples`` rows (int64 codes) from ``p_theta``."""
        self._check_fitted()
        if not isinstance(n_samples, (int, np.integer)) or n_samples < 0:
            raise ValueError(f"n_samples must be a non-negative int, got {n_samples!r}")
        need, mem = 16 * int(n_samples) * (1 + len(self.cardinalities_)), _total_memory()
        if mem is not None and need > mem // 2:
            raise ValueError(f"{n_samples:,} samples need about {need / 2**30:.1f} GiB, more than half of this "
                             f"machine's {mem / 2**30:.1f} GiB; draw them in smaller batches")
        rng = np.random.default_rng(random_state)
        p = self.probabilities()
        if isinstance(p, np.ndarray):
            cdf = np.cumsum(p.reshape(-1))
            flat = np.searchsorted(cdf, rng.random(n_samples) * cdf[-1], side="right")
            flat = np.minimum(flat, cdf.size - 1)
        else:  # out of core: pick blocks by their mass, then cells inside each block
            blocks = p.reshape(-1).rechunk(int(np.prod(p.chunksize)))
            mass = blocks.map_blocks(lambda b: np.array([b.sum()]), chunks=(1,)).compute()
            counts = rng.multinomial(n_samples, mass / mass.sum())
            offsets = np.concatenate([[0], np.cumsum(blocks.chunks[0])])
            parts = []
            for b in np.nonzero(counts)[0]:
                cdf = np.cumsum(blocks.blocks[b].compute())
                idx = np.minimum(np.searchsorted(cdf, rng.random(counts[b]) * cdf[-1], side="right"), cdf.size - 1)
                parts.append(offsets[b] + idx)
            flat = rng.permutation(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
        return np.stack(np.unravel_index(flat, self.cardinalities_), axis=1).astype(np.int64)

    def set_labels(self, names: Sequence[str] | None, categories: Sequence[Sequence] | None) -> "FSLL":
        """Attach column names and category labels (used by the CLI and :mod:`fsll_ooc.io`)."""
        self._check_fitted()
        if names is not None and len(names) != len(self.cardinalities_):
            raise ValueError(f"{len(names)} names for {len(self.cardinalities_)} variables")
        if categories is not None:
            if len(categories) != len(self.cardinalities_):
                raise ValueError(f"{len(categories)} category lists for {len(self.cardinalities_)} variables")
            for i, (cat, k) in enumerate(zip(categories, self.cardinalities_)):
                if len(cat) != k:
                    raise ValueError(f"variable {i} has cardinality {k} but {len(cat)} category labels")
        self.feature_names_in_ = list(names) if names is not None else None
        self.categories_ = [list(c) for c in categories] if categories is not None else None
        return self

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> None:
        """Write the model as one JSON file (format ``fsll-ooc-model``, versioned), atomically."""
        self._check_fitted()
        obj = {
            "format": MODEL_FORMAT, "version": MODEL_VERSION,
            "cardinalities": list(self.cardinalities_),
            "theta": [[list(map(int, y)), float(v)] for y, v in self.theta_.items()],
            "log_z": self.log_z_, "n_samples": self.n_samples_, "n_iter": self.n_iter_, "cost": self.cost_,
            "kl_data": self.kl_data_, "converged": bool(getattr(self, "converged_", True)),
            "history": self.history_,
            "params": {k: v for k, v in self.get_params().items() if k in ("epsilon", "max_iter", "resync_every", "refine")},
            "feature_names": getattr(self, "feature_names_in_", None),
            "categories": _jsonable(getattr(self, "categories_", None)),
        }
        storage.write_json_atomic(path, obj)

    @classmethod
    def load(cls, path) -> "FSLL":
        """Read a model written by :meth:`save`; unknown formats/versions give a clear error."""
        try:
            obj = storage.read_json(path)
        except FileNotFoundError:
            raise
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not an fsll-ooc model file (invalid JSON: {e})") from None
        if not isinstance(obj, dict) or obj.get("format") != MODEL_FORMAT:
            raise ValueError(f"{path}: not an fsll-ooc model file (format field is {obj.get('format') if isinstance(obj, dict) else None!r})")
        if not isinstance(obj.get("version"), int) or obj["version"] > MODEL_VERSION:
            raise ValueError(f"{path}: model file version {obj.get('version')!r} is newer than this fsll-ooc "
                             f"understands (<= {MODEL_VERSION}); upgrade fsll-ooc")
        try:
            m = cls(**obj.get("params", {}))
            cards = tuple(int(k) for k in obj["cardinalities"])
            theta = {tuple(int(v) for v in y): float(t) for y, t in obj["theta"]}
            for y in theta:
                if len(y) != len(cards) or any(not 0 <= v < k for v, k in zip(y, cards)):
                    raise ValueError(f"parameter index {y} does not fit cardinalities {cards}")
            _check_model_cards(cards)
            N = int(obj["n_samples"])
            flat = {int(np.ravel_multi_index(y, cards)): v for y, v in theta.items()}
            state = FitState(cards, N, 0.0, flat, {}, float(obj["log_z"]), int(obj["n_iter"]),
                             bool(obj.get("converged", True)), _checked_history(obj.get("history", [])))
            if not (N >= 1 and math.isfinite(state.log_z) and all(math.isfinite(v) for v in theta.values())):
                raise ValueError("n_samples, log_z and theta must be finite numbers (n_samples >= 1)")
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"{path}: malformed fsll-ooc model file ({type(e).__name__}: {e})") from None
        m._state = state
        m._engine = None
        m.plan_ = None
        m.cardinalities_ = cards
        m.n_features_in_ = len(cards)
        m.n_samples_ = N
        m.theta_ = theta
        m.log_z_ = state.log_z
        m.n_bases_ = len(theta)
        m.n_iter_ = state.n_iter
        m.cost_ = obj.get("cost")
        m.kl_data_ = obj.get("kl_data")
        m.history_ = state.history
        m.converged_ = state.converged
        try:
            m.set_labels(obj.get("feature_names"), obj.get("categories"))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: malformed fsll-ooc model file (labels: {e})") from None
        return m

    # ------------------------------------------------------------------ queries (fsll_ooc.queries)
    def marginal(self, variables, as_frame: bool = False):
        """Marginal distribution of ``variables`` (names or indices); streams out of core.

        Returns an array of shape ``(k_i, k_j, ...)`` in the order given, or with
        ``as_frame=True`` a tidy ``DataFrame`` (labels and ``p``).  See
        :func:`fsll_ooc.queries.marginal`.

        >>> import numpy as np
        >>> X = np.array([[0, 0], [0, 0], [1, 1], [1, 1], [0, 1]] * 40)
        >>> m = FSLL(progress=False).fit(X)
        >>> m.marginal([1, 0]).shape, round(float(m.marginal(0).sum()), 12)
        ((2, 2), 1.0)
        """
        from . import queries

        return queries.marginal(self, variables, as_frame=as_frame)

    def conditional(self, target, given=None, as_frame: bool = False):
        """Distribution of ``target`` given evidence ``{variable: value}`` (labels or codes).

        See :func:`fsll_ooc.queries.conditional`.

        >>> import numpy as np
        >>> X = np.array([[0, 0], [0, 0], [1, 1], [1, 1], [0, 1]] * 40)
        >>> m = FSLL(progress=False).fit(X)
        >>> bool(m.conditional(1, given={0: 1})[1] > 0.9)
        True
        """
        from . import queries

        return queries.conditional(self, target, given=given, as_frame=as_frame)

    def mode(self, k: int = 1, given=None, as_frame: bool = False):
        """The ``k`` most probable joint states and their probabilities: ``(states, probs)``.

        See :func:`fsll_ooc.queries.mode`.

        >>> import numpy as np
        >>> X = np.array([[0, 0], [0, 0], [1, 1], [1, 1], [0, 1]] * 40)
        >>> states, probs = FSLL(progress=False).fit(X).mode(k=2)
        >>> sorted(map(tuple, states.tolist()))
        [(0, 0), (1, 1)]
        """
        from . import queries

        return queries.mode(self, k=k, given=given, as_frame=as_frame)

    def interactions(self, as_frame: bool = True):
        """The selected terms in words, sorted by their share of the cost reduction.

        Columns ``term``, ``variables``, ``order``, ``theta``, ``share``, ``y``.  See
        :func:`fsll_ooc.queries.interactions`.

        >>> import numpy as np
        >>> X = np.array([[0, 0], [0, 0], [1, 1], [1, 1], [0, 1]] * 40)
        >>> FSLL(progress=False).fit(X).interactions()["term"].iloc[0]
        'X0=0 * X1=0'
        """
        from . import queries

        return queries.interactions(self, as_frame=as_frame)


def _check_cardinalities_param(cards) -> None:
    """``cardinalities`` must be None or a sequence of integers >= 1 (no silent truncation of 2.5)."""
    if cards is None:
        return
    if isinstance(cards, (str, bytes)) or not hasattr(cards, "__len__") or not hasattr(cards, "__iter__"):
        raise ValueError(f"cardinalities must be a sequence of integers (one per column), got {cards!r}")
    for i, k in enumerate(cards):
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
            if isinstance(k, (float, np.floating)) and math.isfinite(k) and float(k).is_integer():
                continue
            raise ValueError(f"cardinality of column {i} (X{i}) must be an integer, got {k!r}")


def _check_code_range(X):
    """Refuse codes that cannot be converted to int64 (huge uint64 or float values) before
    they wrap around silently; returns ``X`` as an array when it was array-like."""
    if hasattr(X, "columns"):
        return X
    try:
        arr = np.asarray(X)
    except (ValueError, TypeError) as e:
        raise ValueError(f"X must be a rectangular 2-D array of integer codes (samples x variables): {e}") from None
    if arr.size == 0 or arr.ndim != 2 or arr.dtype.kind not in "uf":
        return arr
    with np.errstate(invalid="ignore"):
        big = (arr > np.iinfo(np.int64).max) if arr.dtype.kind == "u" else (np.abs(arr) >= 2.0**62)
    if big.any():
        r, c = map(int, np.argwhere(big)[0])
        raise ValueError(f"column {c} (X{c}): value {arr[r, c]} in row {r} is too large to be a category code "
                         f"(codes are 0..{MAX_CARD - 1} at most)")
    return arr


_DAMAGED = ("the store's tables cannot be trusted; FSLL.resume({store!r}, restart=True) rebuilds them from the "
            "data kept in the store and fits again")


def _with_checksum_bytes(plan, backend):
    """The plan with the tables' checksum bytes in its disk figure (zarr: 4 bytes per chunk)."""
    if backend != "zarr":
        return plan
    extra = len(TABLE_NAMES) * storage.overhead_bytes(backend, plan.layout.cards, plan.layout.chunk_shape)
    return dataclasses.replace(plan, disk_bytes=plan.disk_bytes + extra)


def _check_model_cards(cards) -> None:
    """Cardinalities read from a file obey the limits of ``fit`` (a file is not trusted)."""
    if not cards or any(not 1 <= k <= MAX_CARD for k in cards):
        raise ValueError(f"cardinalities {list(cards)[:8]} must be 1..{MAX_CARD}, at least one")
    if math.prod(cards) >= 2**62:
        raise ValueError(f"the joint table would have {math.prod(cards):.3e} cells; the limit is 2^62")


def _checked_history(history) -> list:
    """A model file's history: a list of dicts whose numbers are numbers (queries and plots use them)."""
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise ValueError("history must be a list of objects")
    for h in history:
        for k in ("iter", "cost", "delta", "value", "n_bases"):
            if h.get(k) is not None and (isinstance(h[k], bool) or not isinstance(h[k], (int, float))):
                raise ValueError(f"history entry field {k!r} is {h[k]!r}, not a number")
        for k in ("y", "added"):
            if h.get(k) is not None:
                np.asarray(h[k], dtype=np.int64)  # ValueError/TypeError/OverflowError when not integers
    from .queries import _contributions

    _contributions(history)
    return history


def _check_table_fits_memory(cards) -> None:
    """Building the whole ``p_theta`` table of a loaded model in memory takes about two tables."""
    need, mem = 16 * math.prod(cards), _total_memory()
    if mem is not None and need > mem:
        raise ValueError(f"the model's joint table has {math.prod(cards):,} cells; building it in memory needs "
                         f"about {need / 2**30:.1f} GiB, more than this machine's {mem / 2**30:.1f} GiB")


def _plain(v):
    """A parameter value as plain JSON (numpy scalars and arrays, tuples)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (np.ndarray, tuple, list)):
        return [_plain(x) for x in v]
    return v


def _json_or_none(obj):
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        return None


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


def _jsonable(categories):
    if categories is None:
        return None
    return [[c.item() if hasattr(c, "item") else c for c in cat] for cat in categories]
