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

from typing import Sequence

import numpy as np

from . import fitting, model_file, queries, storage, validation as V
from .io import check_category_order, inverse_orders, recode, validate_data
from .learn import FitState, LearnOptions, resolve_refine
from . import cost as C
from .model_file import MODEL_FORMAT, MODEL_VERSION, params_from_json, plain_value
from .storage.fit_store import FitStore, StoredFit
from .validation import check_cardinalities_param, check_labels

__all__ = ["FSLL", "MODEL_FORMAT", "MODEL_VERSION", "validate_data"]


def _check_start(v, p) -> str:
    """``start``: None or ``"network"``; not with EM (``missing``, ``hidden``)."""
    out = fitting.resolve_start(v)
    if out == "network" and (p.get("missing") == "em" or p.get("hidden")):
        raise ValueError("start='network' is not available with missing='em' or hidden variables")
    return out


def _check_smoothing(v, p):
    """``smoothing``: None, ``"auto"`` or positive pseudo-rows; with EM (``missing``, ``hidden``)
    only None (the paper's target)."""
    out = C.resolve_smoothing(v, p["epsilon"], fitting.resolve_start(p.get("start")))
    if v is not None and (p.get("missing") == "em" or p.get("hidden")):
        raise ValueError("smoothing is not available with missing='em' or hidden variables "
                         "(EM fits the paper's target); leave it None")
    return out


class FSLL(queries.QueryMethods):
    """Full-span log-linear model of ``n`` discrete variables, learned greedily under MDL.

    Parameters
    ----------
    cardinalities : sequence of int, optional
        ``k_i`` per column; inferred as ``max + 1`` per column when omitted.
    epsilon : "auto" or float
        Stop when the best move lowers the cost by less than this (nats per sample).  ``"auto"``
        (default): ``0.1 / N``, a tenth of a nat of the whole data set's code length
        (:func:`fsll_ooc.learn.auto_epsilon` gives the reasoning), with corrective steps (see
        ``refine``); it equals ``1e-4`` at ``N = 1000`` and is smaller above.  Measured in
        ``docs/benchmarks_quality.md``, it reaches a far lower ``KL(p*||p)`` than the paper's setting
        at about its time.  ``epsilon=1e-4`` (with the default ``refine``) reproduces the paper exactly.
    max_iter : int, optional
        Hard cap on iterations (None: until convergence).
    store : path or URL, optional
        Directory for out-of-core tables (Zarr v3 by default). None: in memory.  A URL (fsspec:
        ``s3://bucket/fit``, ``gs://...``; ``file://PATH`` is the directory ``PATH``) puts the store on
        an object store that every dask worker reaches, for a fit on a cluster (``docs/guide.md``,
        "Cluster runs"); its tables are Zarr v3.
    storage_options : dict, optional
        fsspec options for a ``store`` given by URL, e.g. ``{"endpoint_url": "http://minio:9000"}`` for
        an S3-compatible server; they travel with every task to the workers.  Kept neither in the
        store nor in the model file (they may hold credentials): pass them again to :meth:`resume`.
    backend : {"zarr", "memmap", "numpy"}, optional
        Table storage; default "zarr" with a store, "numpy" without.
    memory_limit : int or str, optional
        e.g. "4GiB": the planner keeps the fit's peak within it.
    scheduler : None, "pool", "threads", "synchronous", "serial" or a ``dask.distributed.Client``
        Who runs the chunk-parallel passes (None: serial in core, the ``"pool"`` of the kernels'
        threads out of core).
    layout : (a, c), optional
        Explicit chunk layout cut points (experts and tests); see :mod:`fsll_ooc.planner`.
    resync_every : int
        Re-derive the dual table exactly every this many iterations.
    progress : bool, optional
        Show a progress bar (default: when stderr is a terminal).
    refine : None, bool, "adjust" or "final"
        Fully corrective steps (:mod:`fsll_ooc.learn.corrective`): damped Newton on all selected
        parameters jointly, exact duals after each step, cost monotone, the same MDL cost and the same
        stopping test.  ``"adjust"`` runs one whenever the greedy search's best move is an adjust or it
        would stop, ``"final"`` only when it would stop; when it would stop, a joint selection of
        candidates that pay only together (the support re-adapting) is tried too.  ``None`` (default):
        ``"adjust"`` with ``epsilon="auto"``, off with a numeric epsilon (the paper's algorithm);
        measured in ``docs/benchmarks_quality.md``.
    learn_options : :class:`fsll_ooc.learn.LearnOptions`, optional
        Every further option of the search (``refine_tol``, ``refine_rounds``, ``joint``, ``joint_candidates``,
        ``joint_closure``, ``joint_max_new``, ``family_terms``, ``on_finish``); None: their defaults.
        ``epsilon``, ``max_iter``, ``resync_every`` and ``refine`` are set above (an object that sets one
        of them differently is refused).  Kept in the model file and the store's state, except
        ``on_finish`` (a resumed fit runs without it).
    penalty : None, "family" or "paper"
        The code of the selected terms in the MDL cost.  ``"paper"``: every term pays its own index and
        precision (paper Eq. 9).  ``"family"``: a variable set is named once and its terms are sent as
        one subset of the set's possible terms, so a whole interaction between many-valued variables
        costs about ``ln N / 2`` per term, as a table entry does under BIC; identical to ``"paper"`` on
        binary variables (``docs/design.md``, "The family code").  ``None`` (default): ``"family"``
        with ``epsilon="auto"``, ``"paper"`` with a numeric epsilon (the paper's algorithm).
    penalty_scale : None, "auto" or float
        A positive number multiplying the code length of the selected terms (``1.0``: the code as it
        is).  ``"auto"``: chosen between 1 and 1/2 from the training data alone: one row in five is
        held out, the rest is fitted under scale 1 and the search continued under 1/2, and the scale
        whose model gives the held-out rows the higher log-likelihood is used for the fit on every row
        (``docs/design.md``, "Choosing the penalty scale"; it costs a fit and its continuation on four
        fifths of the rows; the sub-fits hold their tables in memory, also out of core; with fewer
        than 100 rows, or tables too large for memory within ``memory_limit``, the scale is 1).
        ``None`` (default): ``"auto"`` with ``epsilon="auto"``, ``1.0`` with a numeric epsilon (the
        paper's algorithm).  An EM fit (``missing``, ``hidden``) chooses it the same way, scoring the
        held-out rows by their observed-data log-likelihood (:func:`fsll_ooc.missing.choose`).
    further_price : None, "full", "aic" or "auto"
        A family's further terms at ``"full"`` (``ln N / 2``), ``"aic"`` (one nat) or ``"auto"`` (held out); None:
        ``"auto"`` with ``start="network"``, else ``"full"`` (``docs/design.md``; not ``penalty="paper"``, EM).
    start : None or "network"
        ``"network"``: the search starts from the refitted span of a Bayesian network learned on the rows
        under BIC (``docs/design.md``, "A Bayesian network's span as the start"); not with EM.
    smoothing : None, "auto" or float
        Pseudo-rows ``a``: after the search its terms are refitted to ``(counts + a / |X|) / (N + a)``
        (a Dirichlet prior; 1 is the paper's target); ``"auto"`` chosen on the held-out rows; None:
        ``"auto"`` with ``start="network"``, else 1 (``docs/design.md``, "Smoothing the final parameters"; not EM).
    missing : None or "em"
        ``"em"``: rows with missing cells (NaN, None, ``pd.NA``; ``-1`` in an integer code array) are
        fitted by expectation-maximisation (:mod:`fsll_ooc.missing`): missing at random, each
        incomplete row spread over its completions under the current model, the learner warm-started
        on the soft counts every round.  In core, or out of core with ``store`` (the store keeps the
        rounds; ``resume`` continues an interrupted EM fit).  ``None`` (default): a missing cell is an
        error that names it.
    hidden : sequence of int or "auto", optional
        Cardinalities of hidden (latent) variables, appended after the observed ones (named ``H0,
        H1, ...``) and fitted by the same EM; :meth:`predict_hidden` gives each row's posterior over
        their states.  One of them may be ``"auto"``: its number of states is chosen on held-out rows
        (latent-class models of 2, 3, ... states scored by the observed-data log-likelihood of one
        row in five, the fewest within one standard error of the best;
        :func:`fsll_ooc.missing.latent_states`); ``hidden_scores_`` keeps the scores.
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
    category_order : {"auto", "frequency", "given"}
        The categories' order in the basis: ``"frequency"`` (:func:`fsll_ooc.io.frequency_order`:
        the model does not depend on how labels are spelled; ordered Categoricals and
        ``fit(..., ordered=...)`` keep theirs), ``"given"``, or ``"auto"`` (default: frequency
        for labelled data, given for bare codes).  What is shown keeps the user's order.

    Attributes (after ``fit``)
    --------------------------
    theta_ : dict {tuple y: float}, the non-zero parameters; n_bases_ : len(theta_);
    n_iter_, cost_, kl_data_ (= KL(p_d || p_theta)), history_ (one dict per iteration),
    log_z_, cardinalities_, n_samples_, plan_, feature_names_in_, categories_,
    penalty_scale_ (the scale fitted under), penalty_scale_scores_ (after ``fit``: the mean
    held-out log-likelihood per row of each scale ``penalty_scale="auto"`` compared; empty
    when none was compared; under ``further_price="auto"`` keyed by ``(scale, price)``),
    further_price_ (the price of a family's further terms fitted under), smoothing_ and
    smoothing_scores_ (the pseudo-rows fitted to; the held-out scores ``"auto"`` compared).
    basis_order_ (per variable: ``basis_order_[i][c]`` is the shown code at basis position
    ``c``; ``theta_``'s indices refer to it).
    After an EM fit also: em_objective_, em_loglik_ (observed-data log-likelihood per
    row), em_history_ (one dict per round), em_converged_, em_rounds_, n_hidden_.
    """

    def __init__(self, cardinalities=None, epsilon="auto", max_iter=None, store=None, backend=None,
                 memory_limit=None, scheduler=None, layout=None, resync_every=256, progress=None, refine=None,
                 learn_options=None, penalty=None, penalty_scale=None, missing=None, hidden=None, n_restarts=None,
                 random_state=None, em_max_rounds=100, em_tol=None, storage_options=None, category_order="auto",
                 further_price=None, start=None, smoothing=None):
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
        self.category_order = category_order
        self.further_price = further_price
        self.start = start
        self.smoothing = smoothing

    # ------------------------------------------------------------------ sklearn-style params
    # To add a parameter: an argument of __init__ stored verbatim, its name in _PARAMS, its
    # check in _parameter_constraints, the
    # docstring above and docs/api.md; if it changes what is learned, its name in
    # _SAVED_PARAMS too (then the model file and the store's state keep it and resume uses it).
    _PARAMS = ("cardinalities", "epsilon", "max_iter", "store", "backend", "memory_limit", "scheduler",
               "layout", "resync_every", "progress", "refine", "learn_options", "penalty", "penalty_scale",
               "missing", "hidden", "n_restarts", "random_state", "em_max_rounds", "em_tol", "storage_options",
               "category_order", "further_price", "start", "smoothing")
    #: What is learned depends on these: the model file reports them, the store keeps them.
    _SAVED_PARAMS = ("epsilon", "max_iter", "resync_every", "refine", "learn_options", "penalty", "penalty_scale", "start",
                     "missing", "hidden", "n_restarts", "random_state", "em_max_rounds", "em_tol", "further_price",
                     "smoothing")
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
        "further_price": lambda v, p: C.resolve_further_price(v, C.resolve_penalty(p["penalty"], p["epsilon"]),
                                                              fitting.resolve_start(p.get("start"))),
        "missing": lambda v, p: V.check_missing(v),
        "hidden": lambda v, p: V.check_hidden(v),
        "n_restarts": lambda v, p: V.check_n_restarts(v),
        "random_state": lambda v, p: V.check_random_state(v),
        "em_max_rounds": lambda v, p: V.check_em_max_rounds(v),
        "em_tol": lambda v, p: V.check_em_tol(v),
        "category_order": lambda v, p: check_category_order(v),
        "start": lambda v, p: _check_start(v, p),
        "smoothing": lambda v, p: _check_smoothing(v, p),
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
        fitting.options(self)
        backend = storage.get_backend(self.backend or ("zarr" if self.store is not None else "numpy"))
        if backend.persistent and self.store is None:
            raise ValueError(f"backend {backend.name!r} needs store=PATH")
        return backend

    def fit(self, X, y=None, *, feature_names=None, categories=None, ordered=None) -> "FSLL":
        """Learn the model from ``X`` (N x n integer codes, or a DataFrame); returns ``self``.

        ``feature_names`` (one per column) and ``categories`` (``k_i`` labels per column)
        label integer codes; a DataFrame brings its own.  Out of core they are kept in the
        store's state, so that a resumed or reopened fit has them too.  ``ordered``:
        variables (names or indices) whose categories keep their order (``category_order``).
        """
        self._fit_ordered = ordered
        backend = self._check_params()
        check_cardinalities_param(self.cardinalities)
        from . import missing

        if self.missing == "em" or self.hidden:
            if missing.fit(self, X, backend, feature_names, categories):
                return self
        else:
            missing.refuse(X)
        fitting.fit(self, X, backend, feature_names, categories, sub_class=FSLL)
        return self

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
            model_file.check_stored(fs, stored)
            if stored.status == "complete" and not restart:
                return cls._open_finished(fs, stored, scheduler, progress, memory_limit)
        with fs.writing("resume", "resuming the fit"):
            stored = fs.read()  # again, now that no other writer can change it
            model_file.check_stored(fs, stored)
            m = fitting.from_stored(cls, fs, stored, scheduler, progress, memory_limit)
            if stored.status == "complete" and not restart:
                return cls._open_finished(fs, stored, scheduler, progress, memory_limit)
            if fs.extra("em") is not None:  # an EM fit (missing cells, hidden variables)
                from . import missing

                missing.resume_in_store(m, fs, stored, restart)
            else:
                fitting.resume_in_store(m, fs, stored, restart)
        return m

    @classmethod
    def _open_finished(cls, fs: FitStore, stored: StoredFit, scheduler, progress, memory_limit=None) -> "FSLL":
        """A finished fit for reading: nothing in the store is written (a private scratch table is)."""
        m = fitting.open_finished(cls, fs, stored, scheduler, progress, memory_limit)
        if fs.extra("em") is not None:
            from . import missing

            missing.finished_attributes(m, fs)
        return m

    # ------------------------------------------------------------------ read-only views
    @property
    def fit_state_(self) -> FitState:
        """The fitted learner state (parameters, targets on the support, history, penalty),
        for inspection: the model reads it, so changing it changes the model."""
        self._check_fitted()
        return self._state

    @property
    def engine_(self):
        """The engine over the fitted tables (what answers queries), for inspection; ``None``
        for a model read from a file."""
        self._check_fitted()
        return self._engine

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
        return self._basis_codes(validate_data(arr, self.cardinalities_, names)[0])

    def _basis_codes(self, codes: np.ndarray) -> np.ndarray:
        """Codes as shown (``categories_``) in the basis order the tables use (``-1`` stays)."""
        return recode(codes, inverse_orders(self.basis_order_))

    def _basis_log_prob(self, codes: np.ndarray) -> np.ndarray:
        """:meth:`log_prob` of codes in the basis order (``-1``: missing, summed out)."""
        from . import missing

        return missing.log_prob(self, codes)

    def log_prob(self, X) -> np.ndarray:
        """Natural log ``p_theta(x)`` of each row of ``X``; missing cells (NaN, None,
        ``pd.NA``, ``-1`` codes) and hidden variables are marginalised out."""
        from . import missing

        codes, incomplete = missing.codes(self, X)
        if incomplete:
            return missing.log_prob(self, codes)
        return queries.log_potential(self, codes) - self.log_z_

    def impute(self, X, method: str = "mode", random_state=None, return_proba: bool = False):
        """``X`` with its missing cells filled: each row's most probable completion given
        its observed cells (``method="mode"``) or a draw from that conditional
        (``"sample"``).  A DataFrame comes back as a DataFrame of labels, an array as codes.
        See :func:`fsll_ooc.missing.impute`.  ``return_proba=True``: ``(filled, proba)``
        (:func:`fsll_ooc.queries.missing_proba`: each missing cell's distribution).
        """
        from . import missing

        filled = missing.impute_frame(self, X, method, random_state)
        return (filled, queries.missing_proba(self, X)) if return_proba else filled

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

    def probabilities(self):
        """The normalised table ``p_theta`` of shape ``cardinalities_``, its axes in the order
        of ``categories_``.

        In core: a numpy array.  Out of core: a dask array over the store's scratch
        table (valid until the next call that writes the scratch table).
        """
        p = fitting.basis_table(self)
        for i, t in enumerate(inverse_orders(self.basis_order_)):
            if t is not None:  # shown code u is basis code t[u]
                p = p[(slice(None),) * i + (t,)]
        return p

    def sample(self, n_samples: int = 1, random_state=None, as_frame: bool | None = None):
        """Draw ``n_samples`` rows from ``p_theta``.

        A model with labels (fitted on a ``DataFrame`` or with ``categories``, or loaded
        from a file saved with them) returns a ``DataFrame`` of labels, one categorical
        column per variable; a model of codes returns an ``(n, n_vars)`` int64 array of
        codes.  ``as_frame=False`` always returns the codes (``as_frame=True`` always a
        ``DataFrame``, of codes when the model has no labels).  The same ``random_state``
        draws the same rows either way.
        """
        codes = queries.sample_codes(self, n_samples, random_state)
        if as_frame is None:
            as_frame = getattr(self, "categories_", None) is not None
        if not as_frame:
            return codes
        from .io import decode
        from .queries import labels

        names, cats = labels(self)
        return decode(codes, cats, names)

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
            self.cost_, self.kl_data_, self.feature_names_in_, queries.basis_categories(self),
            model_file.category_order(self.basis_order_), model_file.em_summary(self)))

    @classmethod
    def load(cls, path) -> "FSLL":
        """Read a model written by :meth:`save`; unknown formats/versions give a clear error."""
        mf = model_file.load(path)
        m = cls._with_params(mf.params, f"{path}: malformed fsll-ooc model file")
        fitting.set_fitted(m, mf.state, cost=mf.cost, kl_data=mf.kl_data, feature_names=mf.feature_names,
                      categories=mf.categories, to_basis=mf.category_order)
        model_file.set_em_summary(m, mf.em)
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
