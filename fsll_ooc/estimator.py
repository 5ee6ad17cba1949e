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

import dataclasses
import math
import sys
import warnings
from typing import Sequence

import numpy as np

from . import basis, cost as C, storage
from .engine import Engine, Table
from .learn import FitState, LearnOptions, learn, resolve_refine
from .planner import plan as make_plan, PlanError
from . import model_file
from .machine import cgroup_memory_limit, free_disk, total_memory
from . import validation as V
from .validation import check_cardinalities_param, check_code_range, check_labels, check_n_samples, check_store_path
from .model_file import MODEL_FORMAT, MODEL_VERSION, json_or_none, jsonable_categories, params_from_json, plain_value
from .storage.fit_store import TABLE_NAMES, FitStore, StoredFit
from .storage.url_store import decode_options
from .io import validate_data

__all__ = ["FSLL", "MODEL_FORMAT", "MODEL_VERSION", "validate_data"]


def _flat_index(codes: np.ndarray, cards: Sequence[int]) -> np.ndarray:
    return np.ravel_multi_index(tuple(codes.T), tuple(cards)).astype(np.int64)


#: Fewer samples than this get a warning from :meth:`FSLL.fit`.
FEW_SAMPLES = 10
#: the key under which a store keeps the model a new fit starts from (``penalty_scale="auto"``)
WARM_START = "warm_start"


def _start_of(state: FitState) -> dict:
    """The model of ``state`` as a start for another fit (plain JSON; see :func:`_warm_start`):
    its parameters, ``log Z`` and each term's share of its cost reduction (``gain``, from its
    history as :meth:`FSLL.interactions` counts it)."""
    from .queries import term_contributions

    contrib, _ = term_contributions(state.history)
    return {"theta": [[int(y), float(v)] for y, v in state.theta.items()], "log_z": float(state.log_z),
            "gain": [float(contrib.get(state.digits(y), 0.0)) for y in state.theta]}


def _warm_start(engine: Engine, state: FitState, start: dict | None) -> None:
    """Start the new fit ``state`` (targets and uniform duals in ``engine``) from ``start``
    (:func:`_start_of` of a fit of the same variables on other rows, e.g. the held-out choice
    of the penalty scale): its terms and parameters become the state's, the duals are
    re-derived exactly from them, the targets of the terms read from the target table; the
    learner then continues from there (``docs/design.md``, "Choosing the penalty scale").
    The history records the uniform start (``init``) and then the step to ``start`` as the
    first iteration, one move on several terms (``warm-start``: its terms under ``added``,
    the gains they had in ``start``'s own fit under ``added_gain``, which divide the move's
    gain among them).  Nothing happens for ``start`` None, without terms, or no cheaper on
    these rows than the uniform model (the search then starts from the uniform model)."""
    if not start or not start["theta"]:
        return
    support = np.array([y for y, _ in start["theta"]], np.int64)
    values = np.array([v for _, v in start["theta"]], np.float64)
    uniform, log_z = state.cost(), state.log_z
    state.theta = dict(zip(support.tolist(), values.tolist()))
    state.log_z = engine.resync(support, values, float(start["log_z"]))
    state.dbar = dict(zip(support.tolist(), engine.gather(support, Table.DBAR).tolist()))
    c = state.cost()
    if not c < uniform:  # no better than the uniform model on these rows: the search starts there
        state.theta, state.dbar, state.log_z = {}, {}, log_z
        engine.init_duals()
        return
    state.history.append({"iter": 0, "move": "init", "y": None, "value": 0.0, "delta": 0.0, "cost": uniform,
                          "n_bases": 0, "time": 0.0})
    state.n_iter = 1
    state.history.append({"iter": 1, "move": "warm-start", "y": None, "value": float(len(support)),
                          "delta": c - uniform, "cost": c, "n_bases": len(support), "time": 0.0,
                          "added": [list(state.digits(y)) for y in support.tolist()],
                          "added_gain": list(start.get("gain") or ())})


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
    store : path or URL, optional
        Directory for out-of-core tables (Zarr v3 by default). None: in memory.  A URL
        (fsspec: ``s3://bucket/fit``, ``gs://...``; ``file://PATH`` is the directory
        ``PATH``) puts the store on an object store that every dask worker reaches, for a
        fit on a cluster (``docs/guide.md``, "Cluster runs"); its tables are Zarr v3.
    storage_options : dict, optional
        fsspec options for a ``store`` given by URL, e.g.
        ``{"endpoint_url": "http://minio:9000"}`` for an S3-compatible server; they travel
        with every task to the workers.  Kept neither in the store nor in the model file
        (they may hold credentials): pass them again to :meth:`resume`.
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
        algorithm).  What it buys in ``KL(p*||p)`` and costs in time is measured in
        ``docs/benchmarks_quality.md``.
    learn_options : :class:`fsll_ooc.learn.LearnOptions`, optional
        Every further option of the search (``refine_tol``, ``refine_rounds``, ``joint``,
        ``joint_candidates``, ``joint_closure``, ``joint_max_new``, ``family_terms``,
        ``on_finish``); None:
        their defaults.  ``epsilon``, ``max_iter``, ``resync_every`` and ``refine`` are
        set above (an object that sets one of them differently is refused).  Kept in the
        model file and the store's state, except ``on_finish`` (a resumed fit runs without it).
    penalty : None, "family" or "paper"
        The code of the selected terms in the MDL cost.  ``"paper"``: every term pays its
        own index and precision (paper Eq. 9).  ``"family"``: a variable set is named
        once and its terms are sent as one subset of the set's possible terms, so a whole
        interaction between many-valued variables costs about ``ln N / 2`` per term, as a
        table entry does under BIC; identical to ``"paper"`` on binary variables
        (``docs/design.md``, "The family code").  ``None`` (default): ``"family"`` with
        ``epsilon="auto"``, ``"paper"`` with a numeric epsilon (the paper's algorithm).
    penalty_scale : None, "auto" or float
        A positive number multiplying the code length of the selected terms (``1.0``: the
        code as it is).  ``"auto"``: chosen between 1 and 1/2 from the training data alone:
        one row in five is held out, the rest is fitted under scale 1 and the search
        continued under 1/2, and the scale whose model gives the held-out rows the higher
        log-likelihood is used for the fit on every row (``docs/design.md``, "Choosing the
        penalty scale"; it costs a fit and its continuation on four fifths of the rows;
        the sub-fits hold their tables in memory, also out of core; with fewer than 100
        rows, or tables that do not fit in memory within ``memory_limit``, the scale is 1).  ``None`` (default): ``"auto"`` with
        ``epsilon="auto"``, ``1.0`` with a numeric epsilon (the paper's algorithm).  An EM
        fit (``missing``, ``hidden``) uses 1.
    missing : None or "em"
        ``"em"``: rows with missing cells (NaN, None, ``pd.NA``; ``-1`` in an integer
        code array) are fitted by expectation-maximisation (:mod:`fsll_ooc.missing`):
        missing at random, each incomplete row spread over its completions under the
        current model, the learner warm-started on the soft counts every round.  In
        core, or out of core with ``store`` (the store keeps the rounds; ``resume``
        continues an interrupted EM fit).  ``None`` (default): a missing cell is an
        error that names it.
    hidden : sequence of int, optional
        Cardinalities of hidden (latent) variables, appended after the observed ones
        (named ``H0, H1, ...``) and fitted by the same EM; :meth:`predict_hidden` gives
        each row's posterior over their states.
    n_restarts : int, optional
        EM runs from different seeded first rounds, the best (lowest objective) kept;
        default 3 with ``hidden``, 1 without (the first round is then deterministic).
    random_state : int, optional
        Seed of the restarts' first rounds.
    em_max_rounds : int
        At most this many EM rounds per run.
    em_tol : float, optional
        Stop EM when a round lowers the objective by less than this (nats per row);
        default the learner's resolved ``epsilon``.

    Attributes (after ``fit``)
    --------------------------
    theta_ : dict {tuple y: float}, the non-zero parameters; n_bases_ : len(theta_);
    n_iter_, cost_, kl_data_ (= KL(p_d || p_theta)), history_ (one dict per iteration),
    log_z_, cardinalities_, n_samples_, plan_, feature_names_in_, categories_,
    penalty_scale_ (the scale fitted under), penalty_scale_scores_ (after ``fit``: the mean
    held-out log-likelihood per row of each scale ``penalty_scale="auto"`` compared; empty
    when none was compared).
    After an EM fit also: em_objective_, em_loglik_ (observed-data log-likelihood per
    row), em_history_ (one dict per round), em_converged_, em_rounds_, n_hidden_.
    """

    def __init__(self, cardinalities=None, epsilon="auto", max_iter=None, store=None, backend=None,
                 memory_limit=None, scheduler=None, layout=None, resync_every=256, progress=None, refine=None,
                 learn_options=None, penalty=None, penalty_scale=None, missing=None, hidden=None, n_restarts=None,
                 random_state=None, em_max_rounds=100, em_tol=None, storage_options=None):
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
        self.learn_options = learn_options
        self.penalty = penalty
        self.penalty_scale = penalty_scale
        self.missing = missing
        self.hidden = hidden
        self.n_restarts = n_restarts
        self.random_state = random_state
        self.em_max_rounds = em_max_rounds
        self.em_tol = em_tol
        self.storage_options = storage_options

    # ------------------------------------------------------------------ sklearn-style params
    # To add a parameter: an argument of __init__ stored verbatim, its name in _PARAMS, its
    # check in _parameter_constraints, the
    # docstring above and docs/api.md; if it changes what is learned, its name in
    # _SAVED_PARAMS too (then the model file and the store's state keep it and resume uses it).
    _PARAMS = ("cardinalities", "epsilon", "max_iter", "store", "backend", "memory_limit", "scheduler",
               "layout", "resync_every", "progress", "refine", "learn_options", "penalty", "penalty_scale",
               "missing", "hidden", "n_restarts", "random_state", "em_max_rounds", "em_tol", "storage_options")
    #: What is learned depends on these: the model file reports them, the store keeps them.
    _SAVED_PARAMS = ("epsilon", "max_iter", "resync_every", "refine", "learn_options", "penalty", "penalty_scale",
                     "missing", "hidden", "n_restarts", "random_state", "em_max_rounds", "em_tol")
    #: A store also keeps these, to resume with the same problem and budget.
    _STORED_PARAMS = _SAVED_PARAMS + ("cardinalities", "memory_limit")
    # Every parameter check, in the order they run (``validation.validate_params``); a check
    # gets the value and all parameters.  The EM parameters come last.
    _parameter_constraints = {
        "epsilon": lambda v, p: V.check_epsilon(v),
        "max_iter": lambda v, p: V.check_max_iter(v),
        "resync_every": lambda v, p: V.check_resync_every(v),
        "memory_limit": lambda v, p: V.check_memory_limit(v),
        "refine": lambda v, p: resolve_refine(v, p["epsilon"]),
        "penalty": lambda v, p: C.resolve_penalty(v, p["epsilon"]),
        "penalty_scale": lambda v, p: C.resolve_penalty_scale(v, p["epsilon"]),
        "missing": lambda v, p: V.check_missing(v),
        "hidden": lambda v, p: V.check_hidden(v),
        "n_restarts": lambda v, p: V.check_n_restarts(v),
        "random_state": lambda v, p: V.check_random_state(v),
        "em_max_rounds": lambda v, p: V.check_em_max_rounds(v),
        "em_tol": lambda v, p: V.check_em_tol(v),
    }

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
        if isinstance(diff.get("storage_options"), dict):  # may hold credentials: names only
            diff["storage_options"] = {k: "..." for k in diff["storage_options"]}
        return "FSLL(" + ", ".join(f"{k}={v!r}" for k, v in diff.items()) + ")"

    # ------------------------------------------------------------------ fitting
    def _check_params(self) -> storage.TableBackend:
        V.validate_params(self.get_params(), self._parameter_constraints)
        self._options()
        backend = storage.get_backend(self.backend or ("zarr" if self.store is not None else "numpy"))
        if backend.persistent and self.store is None:
            raise ValueError(f"backend {backend.name!r} needs store=PATH")
        return backend

    def _workers(self, default: int) -> int:
        if self.scheduler is not None and hasattr(self.scheduler, "nthreads"):
            return max(1, sum(self.scheduler.nthreads().values()))
        return default

    def _make_plan(self, cards, backend: storage.TableBackend, disk_free=None, memory=None):
        """The chunk plan of a fit: in core within the machine's memory, out of core within the
        store's free disk (``disk_free``) and ``memory_limit``; ``PlanError`` if it cannot fit."""
        ooc = backend.persistent
        mem = self.memory_limit if self.memory_limit is not None or ooc else memory
        if mem is None:  # out of core without a limit: a container's limit still holds
            mem = cgroup_memory_limit()
        p = make_plan(cards, memory_limit=mem, disk_free=disk_free, workers=self._workers(2 if ooc else 1),
                      out_of_core=True if ooc else None, layout=self.layout)
        if not ooc and p.layout.a > 0 and self.layout is None:
            raise PlanError(f"the {math.prod(cards):,}-cell tables do not fit in memory "
                            f"({p.report().splitlines()[0]}); pass store=PATH to fit out of core")
        if not p.feasible:
            raise PlanError("infeasible fit:\n" + p.report())
        return p

    def _show_progress(self) -> bool:
        return bool(self.progress if self.progress is not None else sys.stderr.isatty())

    def fit(self, X, y=None, *, feature_names=None, categories=None) -> "FSLL":
        """Learn the model from ``X`` (N x n integer codes, or a DataFrame); returns ``self``.

        ``feature_names`` (one per column) and ``categories`` (``k_i`` labels per column)
        label integer codes; a DataFrame brings its own.  Out of core they are kept in the
        store's state, so that a resumed or reopened fit has them too.
        """
        backend = self._check_params()
        check_cardinalities_param(self.cardinalities)
        from . import missing

        if self.missing == "em" or self.hidden:
            if missing.fit(self, X, backend, feature_names, categories):
                return self
        else:
            missing.refuse(X)
        if backend.persistent:
            check_store_path(self.store)
        codes, cards, names, categories = self._encoded(X, feature_names, categories)
        if backend.persistent:
            fs = FitStore(self.store, backend.name, self.storage_options)
            plan = self._make_plan(cards, backend, disk_free=None if fs.io.is_url else free_disk(fs.root.resolve()))
            fs.check_new()  # never replace or delete a user's files
            plan = fs.account(plan)
        else:
            plan = self._make_plan(cards, backend, memory=total_memory())
        N = codes.shape[0]
        if N < FEW_SAMPLES:
            warnings.warn(f"fitting on only {N} sample{'s' if N != 1 else ''}: the model can say little more "
                          "than which rows were seen; fit on more data for a distribution to rely on",
                          UserWarning, stacklevel=2)
        choice = self._choose_penalty_scale(codes, cards)
        flat = _flat_index(codes, cards)
        uniq, counts = np.unique(flat, return_counts=True)
        size = math.prod(cards)
        state = FitState(cards, N, C.target_entropy(counts, N, size), log_z=math.log(size),
                         penalty_code=C.resolve_penalty(self.penalty, self.epsilon), penalty_scale=choice.scale)
        self.penalty_scale_scores_ = choice.scores
        if not backend.persistent:
            engine = self._make_engine(plan, [storage.create_table(backend.name, None, nm, cards, plan.layout.chunk_shape)
                                         for nm in TABLE_NAMES], N, sample_flat=flat,
                                       penalty_scale=state.penalty_scale)
            _warm_start(engine, state, choice.start)
            self._learn(engine, state, fresh=True, checkpoint=None)
            self._set_fitted(state, plan=plan, engine=engine, cost=state.cost(), feature_names=names,
                             categories=categories)
            self.kl_data_ = self._kl_data(flat, counts, N)
            return self
        # Crash-safe order (docs/reliability.md): lock; old state out; data kept in the store;
        # "starting"; tables and targets; "running" after every iteration; "complete".
        with fs.writing("fit", "fitting", plan):
            fs.begin(plan, self._stored_params(), (names, json_or_none(jsonable_categories(categories))),
                     uniq, counts, state, extra=None if choice.start is None else {WARM_START: choice.start})
            self._fit_in_store(fs, plan, state, uniq, counts, flat=flat, fresh=True, names=names,
                               categories=categories, start=choice.start)
        return self

    def _choose_penalty_scale(self, codes: np.ndarray, cards):
        """The penalty scale of this fit (:func:`fsll_ooc.learn.select.choose_scale` for
        ``"auto"``): the sub-fits run in memory with this estimator's learning parameters."""
        from .learn.select import ScaleChoice, choose_scale

        want = C.resolve_penalty_scale(self.penalty_scale, self.epsilon)
        if want != "auto":
            return ScaleChoice(want)
        try:  # the sub-fits hold the whole tables in memory, within the fit's memory limit
            p = make_plan(cards, memory_limit=self.memory_limit if self.memory_limit is not None else total_memory(),
                          disk_free=None, workers=1, out_of_core=None)
            fits = p.feasible and p.layout.a == 0
        except PlanError:
            fits = False
        if not fits:
            return ScaleChoice(C.PENALTY_SCALES[0], reason="the tables do not fit in memory")
        opts = self.learn_options
        if opts is not None:
            opts = dataclasses.replace(opts, on_finish=None)
        own = {k: getattr(self, k) for k in ("epsilon", "max_iter", "resync_every", "refine", "penalty")}

        def fit_path(train, scales):  # a fit under the first scale, continued under each further one
            sub = FSLL(cardinalities=tuple(cards), progress=False, learn_options=opts, penalty_scale=scales[0], **own)
            sub.fit(train)
            yield (lambda c: sub._log_potential(c) - sub.log_z_), _start_of(sub._state)
            state, specs = sub._state, sub._engine.ctx.specs
            for s in scales[1:]:
                state.set_penalty_scale(s)
                state.converged = False
                engine = sub._make_engine(sub.plan_, specs, state.n_samples, penalty_scale=s)
                learn(engine, state, sub._options(), fresh=False)
                sub._set_fitted(state, plan=sub.plan_, engine=engine)
                yield (lambda c: sub._log_potential(c) - sub.log_z_), _start_of(state)

        return choose_scale(fit_path, codes)

    def _encoded(self, X, feature_names=None, categories=None):
        """``(codes, cards, names, categories)`` of ``X`` (codes, or a DataFrame of labels), checked."""
        if hasattr(X, "columns"):
            from .io import encode

            enc = encode(X, self.cardinalities)
            codes, cards = validate_data(enc.codes, enc.cardinalities)
            names = list(map(str, X.columns)) if feature_names is None else feature_names
            categories = enc.categories if categories is None else categories
        else:
            codes, cards = validate_data(check_code_range(X), self.cardinalities)
            names = feature_names
        names, categories = check_labels(names, categories, cards)
        return codes, cards, names, categories

    def _stored_params(self) -> dict:
        """The parameters a store keeps to resume with (plain JSON)."""
        return {k: plain_value(v) for k, v in self.get_params().items() if k in self._STORED_PARAMS}

    def _fit_in_store(self, fs: FitStore, plan, state: FitState, uniq, counts, *, flat=None, fresh: bool,
                      names=None, categories=None, start=None) -> None:
        """Learn with the store's checkpoint: from new tables (``fresh``; ``flat`` is the data, by
        default the stored counts; ``start`` the model the search starts from, see
        :func:`_warm_start`) or from the store's tables and ``state``; then complete it."""
        cards, N = tuple(state.cards), state.n_samples
        if fresh:
            specs = fs.create_tables(cards, plan.layout.chunk_shape)
            with fs.damage_hint():
                engine = self._make_engine(plan, specs, N, sample_flat=np.repeat(uniq, counts) if flat is None else flat,
                                           penalty_scale=state.penalty_scale)
                _warm_start(engine, state, start)
                fs.tables_ready(specs, state)
                self._learn(engine, state, fresh=True, checkpoint=fs.checkpoint)
        else:
            engine = self._make_engine(plan, fs.open_tables(cards, plan.layout.chunk_shape), N,
                                       penalty_scale=state.penalty_scale)
            if not state.converged and (self.max_iter is None or state.n_iter < self.max_iter):
                with fs.damage_hint():
                    self._learn(engine, state, fresh=False, checkpoint=fs.checkpoint)
        # once fitted, the model answers queries in a private scratch table: the store's own
        # tables are written only under its lock (docs/reliability.md)
        engine = Engine.create(plan, fs.open_tables(cards, plan.layout.chunk_shape, reader_owner=self), N,
                               self.scheduler)
        self._set_fitted(state, plan=plan, engine=engine, cost=state.cost(), feature_names=names,
                         categories=categories)
        self.kl_data_ = self._kl_data(uniq, counts, N) if flat is None else self._kl_data(flat, counts, N)
        fs.complete(state, self.kl_data_)

    def _make_engine(self, plan, specs, N: int, sample_flat=None, penalty_scale: float = 1.0) -> Engine:
        """The engine over ``specs`` with the plan's layout and this fit's scheduler; with
        ``sample_flat`` (the data of a new fit) it computes the targets and uniform duals."""
        return Engine.create(plan, specs, N, self.scheduler, sample_flat=sample_flat,
                             progress=sample_flat is not None and self._show_progress(),
                             penalty_scale=penalty_scale)

    _OWN_OPTIONS = ("epsilon", "max_iter", "resync_every", "refine")

    def _options(self) -> LearnOptions:
        """The learner's options: ``learn_options`` with this estimator's own four."""
        base = self.learn_options
        if base is None:
            base = LearnOptions()
        elif not isinstance(base, LearnOptions):
            raise ValueError(f"learn_options must be a fsll_ooc.learn.LearnOptions or None, got {base!r}")
        own = {k: getattr(self, k) for k in self._OWN_OPTIONS}
        default = LearnOptions()
        for k, v in own.items():
            if getattr(base, k) != getattr(default, k) and getattr(base, k) != v:
                raise ValueError(f"learn_options sets {k}={getattr(base, k)!r} but FSLL has {k}={v!r}; "
                                 f"set {k} on FSLL")
        return dataclasses.replace(base, **own)

    def _learn(self, engine, state, fresh: bool, checkpoint) -> None:
        bar = None
        if self._show_progress():  # in words, counting on from a resumed fit's iterations
            from .learn.greedy import resolve_epsilon
            from .progress import FitProgress

            bar = FitProgress(resolve_epsilon(self.epsilon, state.n_samples), start=state.n_iter)
        engine.progress = bar is not None
        try:
            learn(engine, state, self._options(), fresh=fresh, progress=bar, callback=checkpoint)
        finally:
            if bar is not None:
                bar.close()

    @classmethod
    def resume(cls, store, scheduler=None, progress=None, restart: bool = False, memory_limit=None,
               storage_options=None) -> "FSLL":
        """Continue an interrupted out-of-core fit from its store, to the same result.

        Works from any point at which the fit was stopped (killed, disk full, ...) once the
        store holds its state file: ``starting`` (the tables are rebuilt from the data kept
        in the store), ``running`` (the dual table is re-derived exactly from the saved
        parameters), ``complete`` (the finished model is returned; several processes may
        do this at once, each computing probabilities in its own scratch table).
        ``restart=True`` rebuilds every table from the stored data and fits from the start
        (for a store whose tables are damaged).  An EM fit (``missing="em"``, ``hidden=``)
        continues from the round and phase its store recorded, to the same model
        (:mod:`fsll_ooc.missing`).  Column names and category labels given
        to the fit come back with the model.  ``memory_limit`` (bytes or ``"4GiB"``) replaces
        the fit's own for this run (a smaller container, say; the chunk layout is the store's).
        ``storage_options``: fsspec's options for a store given by URL (see :class:`FSLL`).

        Raises ``FileNotFoundError`` (nothing to resume), :class:`~fsll_ooc.storage.IntegrityError`
        (a store file is damaged or altered, named in the message) or
        :class:`~fsll_ooc.storage.lock.StoreLockedError` (another process is writing the store).
        """
        fs = FitStore(store, storage_options=storage_options)
        fs.require_state()
        with fs.shared():
            stored = fs.read()
            if stored.status == "complete" and not restart:
                return cls._open_finished(fs, stored, scheduler, progress, memory_limit)
        with fs.writing("resume", "resuming the fit"):
            stored = fs.read()  # again, now that no other writer can change it
            m = cls._from_stored(fs, stored, scheduler, progress, memory_limit)
            if stored.status == "complete" and not restart:
                return cls._open_finished(fs, stored, scheduler, progress, memory_limit)
            if fs.extra("em") is not None:  # an EM fit (missing cells, hidden variables)
                from . import missing

                missing.resume_in_store(m, fs, stored, restart)
                return m
            state = FitState.from_json(stored.state)
            cards, N = tuple(state.cards), state.n_samples
            plan = fs.account(m._make_plan(cards, storage.get_backend(stored.backend),
                                           disk_free=fs.disk_available()))
            uniq, counts = fs.read_counts(cards, N)
            fs.reopen(plan, stored)
            fresh = stored.status == "starting" or restart
            if fresh:
                state = FitState(cards, N, C.target_entropy(counts, N, math.prod(cards)), log_z=math.log(math.prod(cards)),
                                 penalty_code=C.resolve_penalty(m.penalty, m.epsilon),
                                 penalty_scale=state.penalty_scale)  # the scale chosen when the fit began
                fs.restart(state)
            m._fit_in_store(fs, plan, state, uniq, counts, fresh=fresh, names=stored.feature_names,
                            categories=stored.categories, start=fs.extra(WARM_START) if fresh else None)
        return m

    @classmethod
    def _from_stored(cls, fs: FitStore, stored: StoredFit, scheduler, progress, memory_limit=None) -> "FSLL":
        """An estimator with the stored fit's parameters (every learning parameter of the fit)."""
        kw = params_from_json({k: v for k, v in stored.params.items() if k in cls._PARAMS})
        kw.update(store=fs.root, backend=stored.backend, scheduler=scheduler, layout=stored.layout, progress=progress,
                  storage_options=decode_options(fs.io.options) if fs.io.is_url else None)
        if memory_limit is not None:
            kw["memory_limit"] = memory_limit
        return cls(**kw)

    @classmethod
    def _open_finished(cls, fs: FitStore, stored: StoredFit, scheduler, progress, memory_limit=None) -> "FSLL":
        """A finished fit for reading: nothing in the store is written (a private scratch table is)."""
        m = cls._from_stored(fs, stored, scheduler, progress, memory_limit)
        state = FitState.from_json(stored.state)
        plan = fs.account(m._make_plan(tuple(state.cards), storage.get_backend(stored.backend)))
        specs = fs.open_tables(state.cards, plan.layout.chunk_shape, reader_owner=m)
        m._set_fitted(state, plan=plan, engine=m._make_engine(plan, specs, state.n_samples), cost=state.cost(),
                      kl_data=stored.kl_data, feature_names=stored.feature_names, categories=stored.categories)
        if fs.extra("em") is not None:
            from . import missing

            missing.finished_attributes(m, fs)
        return m

    # ------------------------------------------------------------------ using the model
    def _check_fitted(self):
        if not hasattr(self, "theta_"):
            raise RuntimeError("this FSLL model is not fitted yet; call fit(X) first")

    def _codes(self, X) -> np.ndarray:
        self._check_fitted()
        names = getattr(self, "feature_names_in_", None)
        if hasattr(X, "columns") and getattr(self, "categories_", None) is not None:
            from .io import encode_with

            # by name (any order; a missing or unknown column is an error), never by position
            X = encode_with(self.categories_, X, names=names, strict=names is not None)
        arr = np.asarray(X)
        if arr.ndim == 1 and arr.shape[0] == len(self.cardinalities_):
            arr = arr[None, :]
        if arr.ndim == 2 and arr.shape[1] != len(self.cardinalities_):
            raise ValueError(f"X has {arr.shape[1]} columns but the model has {len(self.cardinalities_)} variables")
        return validate_data(arr, self.cardinalities_, names)[0]

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
        """Natural log ``p_theta(x)`` of each row of ``X``; missing cells (NaN, None,
        ``pd.NA``, ``-1`` codes) and hidden variables are marginalised out."""
        from . import missing

        codes, incomplete = missing.codes(self, X)
        if incomplete:
            return missing.log_prob(self, codes)
        return self._log_potential(codes) - self.log_z_

    def impute(self, X, method: str = "mode", random_state=None):
        """``X`` with its missing cells filled: each row's most probable completion given
        its observed cells (``method="mode"``) or a draw from that conditional
        (``"sample"``).  A DataFrame comes back as a DataFrame of labels, an array as codes.
        See :func:`fsll_ooc.missing.impute`.
        """
        from . import missing

        return missing.impute_frame(self, X, method, random_state)

    def predict_hidden(self, X) -> np.ndarray | list:
        """Each row's posterior over the hidden variables' states (a soft clustering).

        ``(N, k)`` for one hidden variable; a list of ``(N, k_j)`` arrays for several.
        See :func:`fsll_ooc.missing.posterior`.
        """
        from . import missing

        return missing.predict_hidden(self, X)

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
            from .kernels.transform import transform_inplace

            transform_inplace(table, transpose=True, first_use="reference")  # no compile for one table
            l = table
            l -= l.max()
            p = np.exp(l, out=l)
            return p / p.sum()
        total = eng.density(sup, val, self.log_z_)
        return storage.as_array(eng.ctx.spec(Table.SCRATCH)) / total

    def sample(self, n_samples: int = 1, random_state=None, as_frame: bool | None = None):
        """Draw ``n_samples`` rows from ``p_theta``.

        A model with labels (fitted on a ``DataFrame`` or with ``categories``, or loaded
        from a file saved with them) returns a ``DataFrame`` of labels, one categorical
        column per variable; a model of codes returns an ``(n, n_vars)`` int64 array of
        codes.  ``as_frame=False`` always returns the codes (``as_frame=True`` always a
        ``DataFrame``, of codes when the model has no labels).  The same ``random_state``
        draws the same rows either way.
        """
        codes = self._sample_codes(n_samples, random_state)
        if as_frame is None:
            as_frame = getattr(self, "categories_", None) is not None
        if not as_frame:
            return codes
        from .io import decode
        from .queries import labels

        names, cats = labels(self)
        return decode(codes, cats, names)

    def _sample_codes(self, n_samples, random_state) -> np.ndarray:
        self._check_fitted()
        check_n_samples(n_samples, len(self.cardinalities_), total_memory())
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
        """Attach column names and category labels (used by :mod:`fsll_ooc.io` and the queries)."""
        self._check_fitted()
        self.feature_names_in_, self.categories_ = check_labels(names, categories, self.cardinalities_)
        return self

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> None:
        """Write the model as one JSON file (format ``fsll-ooc-model``, versioned), atomically."""
        self._check_fitted()
        model_file.save(path, model_file.ModelFile(
            self._state, {k: plain_value(v) for k, v in self.get_params().items() if k in self._SAVED_PARAMS},
            self.cost_, self.kl_data_, self.feature_names_in_, self.categories_))

    @classmethod
    def load(cls, path) -> "FSLL":
        """Read a model written by :meth:`save`; unknown formats/versions give a clear error."""
        mf = model_file.load(path)
        m = cls._with_params(mf.params, f"{path}: malformed fsll-ooc model file")
        m._set_fitted(mf.state, cost=mf.cost, kl_data=mf.kl_data, feature_names=mf.feature_names,
                      categories=mf.categories)
        return m

    @classmethod
    def _with_params(cls, params: dict, what: str) -> "FSLL":
        """An estimator with the parameters ``params`` read from a file (unknown names: ``ValueError``)."""
        unknown = [k for k in params if k not in cls._PARAMS]
        if unknown:  # named by repr: a key may hold any character
            raise ValueError(f"{what} (unknown parameter {unknown[0]!r})")
        try:
            return cls(**params_from_json(params))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{what} ({type(e).__name__}: {e})") from None

    def _set_fitted(self, state: FitState, *, plan=None, engine=None, cost=None, kl_data=None,
                    feature_names=None, categories=None) -> None:
        """The one place that sets the fitted attributes (after ``fit``, ``resume`` and ``load``)."""
        self._state = state
        self._engine = engine
        self.plan_ = plan
        self.cardinalities_ = tuple(state.cards)
        self.n_features_in_ = len(state.cards)
        self.n_samples_ = state.n_samples
        self.theta_ = {state.digits(y): v for y, v in sorted(state.theta.items())}
        self.log_z_ = state.log_z
        self.n_bases_ = len(state.theta)
        self.penalty_scale_ = state.penalty_scale
        self.n_iter_ = state.n_iter
        self.cost_ = state.cost() if cost is None and engine is not None else cost
        self.kl_data_ = kl_data
        self.history_ = state.history
        self.converged_ = state.converged
        self.feature_names_in_, self.categories_ = check_labels(feature_names, categories, self.cardinalities_)

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


def _check_table_fits_memory(cards) -> None:
    """Building the whole ``p_theta`` table of a loaded model in memory takes about two tables."""
    need, mem = 16 * math.prod(cards), total_memory()
    if mem is not None and need > mem:
        raise ValueError(f"the model's joint table has {math.prod(cards):,} cells; building it in memory needs "
                         f"about {need / 2**30:.1f} GiB, more than this machine's {mem / 2**30:.1f} GiB")


