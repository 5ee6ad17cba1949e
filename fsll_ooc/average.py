"""The mean of several FSLL fits on subsamples of the rows (:class:`FSLLAverage`).

One fit of :class:`~fsll_ooc.FSLL` is one model from one greedy search; a model fitted
on other rows of the same source differs in some terms and values.  The average of
several such fits is a mixture with equal weights,

    p(x) = (1 / K) sum_k p_k(x),

each ``p_k`` an ordinary FSLL fit (the same parameters, its own penalty-scale choice) on
its own random four fifths of the rows, drawn without replacement.  Subsamples without
replacement, not bootstrap resamples: a resample repeats rows, and the MDL cost reads a
repeated row as evidence of structure, so each member overfits (``docs/design.md``,
"Averaging fits on subsamples", and ``docs/benchmarks_quality.md``, "Averaging").  Each
member makes its own penalty-scale choice on its own rows: members sharing one choice made
on all rows, fitted at that scale from the uniform model or from the chosen model, gave a
worse mixture (``docs/benchmarks_quality.md``, "One scale choice for every member").

Every question about the distribution is answered by the mixture: ``log_prob`` (the log
of the members' mean probability, by log-sum-exp), ``probabilities`` (the mean of the
members' tables, a lazy dask sum out of core), ``sample`` (a member per draw, then a
draw from it), the queries of :mod:`fsll_ooc.queries` (on the mean table) and the model
file (format ``fsll-ooc-average``, ``docs/model-format.md``).  What is lost: a mixture
is not one log-linear model, so it has no single set of terms; :meth:`FSLLAverage.interactions`
lists every member's terms with the member they belong to.
"""
from __future__ import annotations

import os
import time

import numpy as np

from . import fitting, model_file, queries, threads
from .estimator import FSLL

__all__ = ["FSLLAverage", "AUTO_MEMBERS", "SMALL_DATA", "auto_members", "subsamples", "SUBSAMPLE", "PARALLEL_CELLS",
           "available_cores"]

#: Members of ``n_members="auto"``: ``(small, large)``, the first on at most
#: :data:`SMALL_DATA` rows, the second on more (:func:`auto_members`).
AUTO_MEMBERS = (8, 4)
#: The most rows on which ``n_members="auto"`` fits the larger number of members.
SMALL_DATA = 10_000
#: Each member is fitted on this fraction of the rows (rounded down, at least one row),
#: drawn without replacement.
SUBSAMPLE = 0.8
#: Parameters of ``FSLL`` an average does not take (EM fits are not averaged).
_REFUSED = ("missing", "hidden", "n_restarts", "em_max_rounds", "em_tol")


class FSLLAverage:
    """The mean of ``K`` :class:`~fsll_ooc.FSLL` distributions, each fitted on a random
    four fifths of the rows (subsampling without replacement; see :mod:`fsll_ooc.average`).

    Parameters
    ----------
    n_members : "auto" or int
        ``K``, the number of fits averaged (at least 2).  ``"auto"`` (default): chosen by
        the number of rows, 8 on at most 10,000 rows and 4 on more (:func:`auto_members`).
    random_state : int, optional
        Seed of the subsamples (default 0: a fit is repeatable).
    n_jobs : None or int
        Members fitted at once: this process fits members and ``n_jobs - 1`` worker
        processes fit others (each takes the next member when it has finished one).
        The workers start first and take members once started (imports done): this
        process fits members meanwhile, and a worker that has none when no member is left
        is ended.  ``None`` (default): the idle cores (:func:`available_cores`, at most
        ``K``) on a table of at least :data:`PARALLEL_CELLS` cells in core, else 1 (a
        smaller table's member takes less than a worker's start); the first member is
        fitted here, timed, while the workers start, and if it took less than
        :data:`MIN_MEMBER_SECONDS` the workers are ended and the others are fitted here
        too.  The members are the
        same whatever ``n_jobs``, bit for bit: each is its own fit of its own rows.  Each
        process's kernels use ``cores // n_jobs`` threads meanwhile.  Out of core (``store``), or with
        parameters no other process can receive (e.g. a ``dask.distributed`` client),
        ``n_jobs > 1`` fits members in threads of this process instead (which gains little:
        between table passes the learner holds the interpreter lock).  A worker's error is
        raised here (its traceback as the cause); the workers end with the fit, also when
        it fails or is interrupted.
    **params
        Parameters of every member's :class:`~fsll_ooc.FSLL` (``epsilon``, ``penalty``,
        ``cardinalities``, ``store``, ...).  With ``store=DIR`` member ``k`` is fitted
        out of core in ``DIR/member-k``.  EM parameters (``missing``, ``hidden``, ...)
        are refused.

    Attributes (after ``fit``)
    --------------------------
    members_ : list of fitted :class:`~fsll_ooc.FSLL`, the models averaged; n_members_ ;
    cardinalities_, n_features_in_, n_samples_ (rows given to ``fit``), feature_names_in_,
    categories_.

    Example
    -------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).integers(0, 3, size=(300, 4))
    >>> avg = FSLLAverage(n_members=3, progress=False).fit(X)
    >>> len(avg.members_), round(float(avg.probabilities().sum()), 12)
    (3, 1.0)
    >>> mean = np.mean([np.exp(m.log_prob(X[:2])) for m in avg.members_], axis=0)
    >>> bool(np.allclose(avg.log_prob(X[:2]), np.log(mean)))
    True
    """

    def __init__(self, n_members="auto", random_state=0, n_jobs=None, **params):
        self.n_members = n_members
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.params = params

    # ------------------------------------------------------------------ parameters
    def get_params(self, deep: bool = True) -> dict:
        """Constructor parameters (the members' ``FSLL`` parameters included), as in scikit-learn."""
        return {"n_members": self.n_members, "random_state": self.random_state, "n_jobs": self.n_jobs, **self.params}

    def set_params(self, **params) -> "FSLLAverage":
        """Set constructor parameters; names that are not ``FSLL``'s raise ``ValueError`` at ``fit``."""
        for k, v in params.items():
            if k in ("n_members", "random_state", "n_jobs"):
                setattr(self, k, v)
            else:
                self.params[k] = v
        return self

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.get_params().items() if k != "storage_options"}
        return "FSLLAverage(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    def _resolved_members(self, n_rows: int | None = None) -> int:
        """``K`` for ``n_rows`` rows (``None``: only check ``n_members``)."""
        k = self.n_members
        if isinstance(k, str) and k == "auto":
            return auto_members(n_rows if n_rows is not None else SMALL_DATA)
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 2:
            raise ValueError(f"n_members must be 'auto' or an int of at least 2 (one fit is FSLL), got {k!r}")
        return int(k)

    def _resolved_jobs(self, n_members: int, cards) -> int:
        """Members fitted at once: ``n_jobs``, or for ``None`` the idle cores
        (:func:`available_cores`, at most ``n_members``) in core on a table of at least
        :data:`PARALLEL_CELLS` cells, else 1."""
        if self.n_jobs is not None:
            return min(int(self.n_jobs), n_members)
        if self.params.get("store") is not None or int(np.prod(cards, dtype=float)) < PARALLEL_CELLS:
            return 1
        return min(available_cores(), n_members)

    def _prototype(self) -> FSLL:
        """An ``FSLL`` with the members' parameters, checked (unknown or refused names: ``ValueError``)."""
        unknown = [k for k in self.params if k not in FSLL._PARAMS]
        if unknown:
            raise ValueError(f"unknown parameter {unknown[0]!r}; FSLLAverage takes n_members, random_state and "
                             f"the parameters of FSLL: {', '.join(FSLL._PARAMS)}")
        refused = [k for k in _REFUSED if self.params.get(k) is not None and k in self.params]
        if refused:
            raise ValueError(f"FSLLAverage does not average EM fits (parameter {refused[0]!r}); "
                             "fit FSLL(missing='em') or FSLL(hidden=...) instead")
        j = self.n_jobs
        if j is not None and (isinstance(j, (bool, np.bool_)) or not isinstance(j, (int, np.integer)) or j < 1):
            raise ValueError(f"n_jobs must be None or a positive int, got {j!r}")
        rs = self.random_state
        if rs is not None and (isinstance(rs, (bool, np.bool_)) or not isinstance(rs, (int, np.integer)) or rs < 0):
            raise ValueError(f"random_state must be None or a non-negative int, got {rs!r}")
        proto = FSLL(**self.params)
        proto._check_params()
        return proto

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y=None, *, feature_names=None, categories=None, ordered=None) -> "FSLLAverage":
        """Fit ``K`` members, each on its own random four fifths of the rows; returns ``self``.

        ``X``, ``feature_names``, ``categories`` and ``ordered`` as in :meth:`FSLL.fit`.  Bad
        parameters and data are refused before the first member is fitted.
        """
        self._resolved_members()
        proto = self._prototype()
        from . import missing

        missing.refuse(X)
        proto._fit_ordered = ordered
        codes, cards, names, cats, labelled, keep = fitting.labelled(proto, X, feature_names, categories)
        if labelled and cats is None:
            cats = [list(range(k)) for k in cards]
        N = int(codes.shape[0])
        K = self._resolved_members(N)
        if max(1, int(N * SUBSAMPLE)) >= N:
            raise ValueError(f"FSLLAverage needs at least 2 rows to fit members on subsamples, got {N}")
        store = self.params.get("store")
        subsets = subsamples(N, K, self.random_state)
        job = _Job(codes, tuple(cards), names, cats, keep, dict(self.params, cardinalities=tuple(cards)))
        jobs = self._resolved_jobs(K, cards)
        sendable = jobs > 1 and store is None and _can_send(job)
        if jobs > 1 and sendable:
            # n_jobs=None: the first member here, timed, while the workers start; they fit
            # members only if it took at least MIN_MEMBER_SECONDS (the members are the same
            # either way).
            members = _fit_in_processes(job, subsets, jobs, gate=MIN_MEMBER_SECONDS if self.n_jobs is None else None)
        elif jobs > 1 and self.n_jobs is not None:  # out of core, or parameters no other process can receive
            with threads.pool(min(jobs, K), "fsll-average") as ex:
                members = list(ex.map(lambda k: job.member(k, subsets[k]), range(K)))
        else:
            members = [job.member(k, subsets[k]) for k in range(K)]
        self._set_fitted(members, N)
        return self

    def _set_fitted(self, members, n_samples) -> None:
        """The fitted attributes (after ``fit`` and ``load``); the labels are the members'."""
        self.members_ = list(members)
        self.n_members_ = len(members)
        self.cardinalities_ = tuple(members[0].cardinalities_)
        self.n_features_in_ = len(self.cardinalities_)
        self.n_samples_ = int(n_samples)
        self.feature_names_in_, self.categories_ = members[0].feature_names_in_, members[0].categories_

    def _check_fitted(self) -> None:
        if not hasattr(self, "members_"):
            raise RuntimeError("this FSLLAverage is not fitted yet; call fit(X) first")

    # ------------------------------------------------------------------ the distribution
    def log_prob(self, X) -> np.ndarray:
        """Natural log of the mixture's probability of each row: ``log mean_k p_k(x)``
        (missing cells marginalised out, as :meth:`FSLL.log_prob`)."""
        self._check_fitted()
        lp = np.stack([m.log_prob(X) for m in self.members_])
        top = lp.max(axis=0)
        safe = np.where(np.isfinite(top), top, 0.0)
        return safe + np.log(np.mean(np.exp(lp - safe), axis=0))

    def score_samples(self, X) -> np.ndarray:
        """Alias of :meth:`log_prob` (scikit-learn density-model name)."""
        return self.log_prob(X)

    def score(self, X, y=None) -> float:
        """Mean log-likelihood (nats per sample) of ``X`` under the mixture."""
        return float(np.mean(self.log_prob(X)))

    def probabilities(self):
        """The mixture's table ``mean_k p_k`` of shape ``cardinalities_``: a numpy array in
        core; out of core a dask array (the lazy sum over the members' stores)."""
        self._check_fitted()
        total = None
        for m in self.members_:  # one member's table at a time
            t = m.probabilities()
            total = t if total is None else total + t
        return total / self.n_members_

    def sample(self, n_samples: int = 1, random_state=None, as_frame: bool | None = None):
        """Draw ``n_samples`` rows from the mixture: how many come from each member is
        multinomial with equal weights, each member draws its share (:meth:`FSLL.sample`),
        and the rows are shuffled.  Codes or a ``DataFrame`` as :meth:`FSLL.sample`."""
        self._check_fitted()
        from .validation import check_n_samples
        from .machine import total_memory

        check_n_samples(n_samples, len(self.cardinalities_), total_memory())
        rng = np.random.default_rng(random_state)
        counts = rng.multinomial(int(n_samples), np.full(self.n_members_, 1.0 / self.n_members_))
        parts = [queries.sample_codes(m, int(c), rng) for m, c in zip(self.members_, counts) if c]
        codes = np.concatenate(parts) if parts else np.empty((0, len(self.cardinalities_)), np.int64)
        codes = codes[rng.permutation(len(codes))]
        if as_frame is None:
            as_frame = self.categories_ is not None
        if not as_frame:
            return codes
        from .io import decode
        from .queries import labels

        names, cats = labels(self)
        return decode(codes, cats, names)

    # ------------------------------------------------------------------ queries (fsll_ooc.queries)
    def marginal(self, variables, as_frame: bool = False):
        """Marginal distribution of ``variables`` under the mixture (:func:`fsll_ooc.queries.marginal`)."""
        from . import queries

        self._check_fitted()
        return queries.marginal(self, variables, as_frame=as_frame)

    def conditional(self, target, given=None, as_frame: bool = False):
        """Distribution of ``target`` given evidence under the mixture (:func:`fsll_ooc.queries.conditional`)."""
        from . import queries

        self._check_fitted()
        return queries.conditional(self, target, given=given, as_frame=as_frame)

    def mode(self, k: int = 1, given=None, as_frame: bool = False):
        """The ``k`` most probable joint states of the mixture (:func:`fsll_ooc.queries.mode`)."""
        from . import queries

        self._check_fitted()
        return queries.mode(self, k=k, given=given, as_frame=as_frame)

    def dependence(self, conditional="auto"):
        """Mutual information of every pair of variables under the mixture, with the spread
        over the members (``mi_min``, ``mi_max``).  See :func:`fsll_ooc.queries.dependence`."""
        return queries.dependence(self, conditional=conditional)

    def predict_proba(self, target, X, as_frame: bool = True):
        """The mixture's distribution of ``target`` given each row of ``X``.  See
        :func:`fsll_ooc.queries.predict_proba`."""
        return queries.predict_proba(self, target, X, as_frame=as_frame)

    def interactions(self, as_frame: bool = True):
        """Every member's terms (:meth:`FSLL.interactions`) with a column ``member``.

        A mixture of log-linear models is not itself one: it has no single set of
        terms, and a term's ``theta`` and ``share`` describe it within its member only.
        ``as_frame=False``: the rows as dicts, each with its ``member``.
        """
        self._check_fitted()
        rows = [dict(r, member=k) for k, m in enumerate(self.members_) for r in m.interactions(as_frame=False)]
        if not as_frame:
            return rows
        import pandas as pd

        cols = ["member", "term", "variables", "order", "theta", "share", "y"]
        return pd.DataFrame([{c: r[c] for c in cols} for r in rows], columns=cols)

    def set_labels(self, names, categories) -> "FSLLAverage":
        """Attach column names and category labels (to the average and every member)."""
        self._check_fitted()
        for m in self.members_:
            m.set_labels(names, categories)
        self.feature_names_in_, self.categories_ = self.members_[0].feature_names_in_, self.members_[0].categories_
        return self

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> None:
        """Write the average as one JSON file (format ``fsll-ooc-average``: its members' models), atomically."""
        self._check_fitted()
        params = {k: v for k, v in self.get_params().items() if k in ("n_members", "random_state")}
        model_file.save_average(path, [_model_file(m) for m in self.members_], params, self.n_samples_,
                                self.feature_names_in_, self.categories_)

    @classmethod
    def load(cls, path) -> "FSLLAverage":
        """Read an average written by :meth:`save` (a single model's file: use :meth:`FSLL.load`)."""
        from .model_file import params_from_json

        af = model_file.load_average(path)
        members = []
        for mf in af.members:
            m = FSLL._with_params(mf.params, f"{path}: malformed fsll-ooc average file (member parameters)")
            fitting.set_fitted(m, mf.state, cost=mf.cost, kl_data=mf.kl_data, feature_names=af.feature_names,
                          categories=af.categories, to_basis=mf.category_order, shown=True)
            members.append(m)
        own = {k: v for k, v in params_from_json(af.members[0].params).items() if k not in ("random_state",)}
        avg = cls(**af.params, **own)  # a refit uses the members' parameters (random_state is the average's)
        avg._set_fitted(members, af.n_samples)
        return avg


def subsamples(n_rows: int, n_members: int, random_state=0) -> list:
    """The rows of each member of an average: ``n_members`` ascending index arrays of
    :data:`SUBSAMPLE` of ``n_rows`` rows (rounded down, at least one), each drawn without
    replacement from ``numpy.random.default_rng(random_state)`` in turn.

    >>> [r.tolist() for r in subsamples(5, 2)]
    [[0, 2, 3, 4], [0, 1, 2, 4]]
    """
    m = max(1, int(n_rows * SUBSAMPLE))
    rng = np.random.default_rng(random_state)
    return [np.sort(rng.permutation(n_rows)[:m]) for _ in range(n_members)]


def auto_members(n_rows: int) -> int:
    """``K`` of ``n_members="auto"`` for a fit on ``n_rows`` rows: 8 on at most
    :data:`SMALL_DATA` rows, 4 on more (:data:`AUTO_MEMBERS`).

    Where one fit's choice of terms is uncertain, more members lower KL(p*||p) further, and
    on up to 10,000 rows a member takes seconds: eight members instead of four brought
    KL(p*||p) on Bayesian-network data over 3-5 valued variables at N = 1e4 from 0.0293 to
    0.0276 (below hill climbing with BDeu's 0.0289) and lowered it on five of six rows of
    pgmpy's example networks at N = 1e3 and 1e4 (``docs/benchmarks_quality.md``, "pgmpy's
    example networks against pyAgrum").  On more rows one fit's terms vary less and each
    member costs more, so four are kept.

    >>> auto_members(10_000), auto_members(10_001)
    (8, 4)
    """
    small, large = AUTO_MEMBERS
    return small if int(n_rows) <= SMALL_DATA else large


def _member_store(store, k: int):
    """Member ``k``'s store: the directory (or URL) ``store/member-k``."""
    s = os.fspath(store) if isinstance(store, (str, os.PathLike)) else None
    if s is None:
        raise ValueError(f"FSLLAverage needs store to be a path or URL (its members' stores go under it), "
                         f"got {type(store).__name__}")
    if "://" in s:
        return s.rstrip("/") + f"/member-{k}"
    return os.path.join(s, f"member-{k}")


def _model_file(m: FSLL) -> "model_file.ModelFile":
    from .model_file import plain_value

    return model_file.ModelFile(m._state, {k: plain_value(v) for k, v in m.get_params().items() if k in m._SAVED_PARAMS},
                                m.cost_, m.kl_data_, None, None,
                                model_file.category_order(m.basis_order_))


# ---------------------------------------------------------------------- members at once
#: The fewest cells of the table for which ``n_jobs=None`` fits members in other
#: processes: a smaller table's fit takes well under the second a worker process needs
#: to start (imports and numba's cached kernels), so its members are fitted here.
PARALLEL_CELLS = 2**14
#: With ``n_jobs=None`` the first member is fitted here and timed while the workers start;
#: they fit members only if it took at least this many seconds (else they are ended): a
#: worker needs about 1.3 s of a core to start. On two idle cores members of 0.3 s gained nothing from a worker, members
#: of 0.7 s and 1.5 s made the average 1.3-1.5x faster (``docs/benchmarks_quality.md``).
MIN_MEMBER_SECONDS = 0.5
#: Codes up to this many bytes go to a worker process with its first message; larger
#: ones are written once to a temporary file that every worker maps (read-only).
SEND_BYTES = 32 * 2**20


def available_cores() -> int:
    """Idle cores: those of this process's CPU affinity, at most the kernels' thread count
    (:func:`fsll_ooc.kernels.threadpool.num_threads`, i.e. ``NUMBA_NUM_THREADS``), less
    the cores other programs keep busy: the whole part of the machine's 1-minute load
    average beyond one core (this process's own work counts in the load; where the load
    is unknown, none), at least 1.

    >>> available_cores() >= 1
    True
    """
    try:
        busy = max(0, int(os.getloadavg()[0] - 1.0))
    except (AttributeError, OSError):  # pragma: no cover - no load average on this platform
        busy = 0
    return max(1, _cores() - busy)


def _cores() -> int:
    """Cores of this process (its affinity, at most the kernels' thread count), busy or not."""
    from .kernels.threadpool import num_threads

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - no affinity on this platform
        cores = os.cpu_count() or 1
    return max(1, min(cores, num_threads()))


class _Job:
    """What every member's fit needs (the same in this process and in a worker process):
    the codes, their labels, and the members' ``FSLL`` parameters."""

    def __init__(self, codes, cards, names, cats, keep, params, dtype=None):
        self.codes, self.cards, self.names, self.cats, self.keep = codes, cards, names, cats, keep
        self.params = params
        self.dtype = np.dtype(dtype) if dtype is not None else codes.dtype  # of the rows a member is given

    def member(self, k: int, rows: np.ndarray) -> FSLL:
        """Member ``k``: ``FSLL(**params)`` fitted on ``codes[rows]`` (its own store under
        ``store``; in core its working tables dropped)."""
        kw = dict(self.params)
        store = kw.get("store")
        if store is not None:
            kw["store"] = _member_store(store, k)
        member = FSLL(**kw).fit(np.asarray(self.codes[rows], dtype=self.dtype), feature_names=self.names,
                                categories=self.cats, ordered=self.keep)
        if store is None:  # in core: drop its working tables, so the average needs one fit's memory
            member._engine = None  # (its table is rebuilt from theta when asked, as for a loaded model)
        return member


def _can_send(job: _Job) -> bool:
    """Can another process receive the members' parameters and labels (pickle)?"""
    import pickle

    try:
        pickle.dumps((job.params, job.names, job.cats, job.keep))
    except Exception:  # e.g. a dask.distributed client as scheduler
        return False
    return True


def _small_codes(codes: np.ndarray) -> np.ndarray:
    """``codes`` in the smallest unsigned integer type that holds them (fewer bytes to send)."""
    top = int(codes.max()) if codes.size else 0
    if codes.size and int(codes.min()) < 0:
        return codes
    for t in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(t).max:
            return codes.astype(t)
    return codes


# The worker process: its path is the parent's; it reads its work from stdin and answers
# on the file descriptor that was its stdout (its own stdout then goes to stderr).  Asked
# to end, it leaves at once (os._exit, after flushing its output): the interpreter's
# shutdown (the kernels' threads, the compiler's modules) took 0.4-0.6 s on a loaded
# machine, which the fit waited for.
_WORKER = """import json, os, sys
sys.path[:] = json.loads(sys.argv[1])
from fsll_ooc.average import _serve
_serve()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


def _serve() -> None:
    """A worker process's loop: the job, then member numbers to fit until ``None``."""
    import pickle
    import sys
    import traceback
    import warnings

    from .kernels import threadpool

    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which ends this process
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints of the library go to stderr, never into the answers
    inp = sys.stdin.buffer
    head = pickle.load(inp)
    threadpool.set_num_threads(head["threads"])
    codes = head["codes"]
    if isinstance(codes, str):
        codes = np.load(codes, mmap_mode="r")
    job = _Job(codes, head["cards"], head["names"], head["cats"], head["keep"], head["params"], head["dtype"])
    n = int(codes.shape[0])
    out.write(pickle.dumps("ready"))  # started: it takes members from now on
    out.flush()
    while True:
        msg = pickle.load(inp)
        if msg is None:
            return
        k, bits = msg
        rows = np.flatnonzero(np.unpackbits(bits, count=n))
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                member = job.member(k, rows)
            answer = ("ok", k, member, [(str(w.message), w.category) for w in caught])
        except BaseException as e:  # the fit's own error, raised again in the parent
            answer = ("error", k, e, traceback.format_exc())
        try:
            data = pickle.dumps(answer)
        except Exception:
            data = pickle.dumps(("error", k, RuntimeError(repr(answer[2])), answer[-1]))
        out.write(data)
        out.flush()


class _Worker:
    """One worker process (``python -c _WORKER``) and the thread of this process that
    feeds it member numbers and collects its members."""

    def __init__(self, head_bytes: bytes, env: dict):
        import json
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, json.dumps(list(sys.path))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.head = head_bytes  # sent by the feeding thread (the worker reads it once it has started)
        self.killed = False  # ended by this process without waiting (not an error of its own)

    def start(self) -> None:
        """Send the job and wait until the worker has read it (its imports done)."""
        import pickle

        try:
            self.proc.stdin.write(self.head)
            self.head = None
            self.proc.stdin.flush()
            if pickle.load(self.proc.stdout) != "ready":
                raise EOFError
        except (EOFError, OSError):
            code = self.proc.wait()
            raise RuntimeError(f"a worker process of the average, starting, ended unexpectedly (exit code {code}); "
                               "n_jobs=1 fits every member in this process") from None

    def fit(self, k: int, bits: np.ndarray):
        """Member ``k`` (rows ``bits``, packed) fitted in the worker: the worker's answer."""
        import pickle

        try:
            pickle.dump((k, bits), self.proc.stdin)
            self.proc.stdin.flush()
            return pickle.load(self.proc.stdout)
        except (EOFError, OSError):  # it has ended (a closed pipe, or no answer)
            code = self.proc.wait()
            raise RuntimeError(f"the worker process fitting member {k} of the average ended unexpectedly "
                               f"(exit code {code}); n_jobs=1 fits every member in this process") from None

    def end(self, wait: bool) -> None:
        """Ask the worker to end (``wait``: for its current member first), else end it now."""
        import pickle
        import subprocess

        if wait:
            try:
                pickle.dump(None, self.proc.stdin)
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Close the pipes (the process has ended and its feeding thread returned)."""
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass


def _fit_in_processes(job: _Job, subsets, jobs: int, gate: float | None = None) -> list:
    """The members of ``subsets``, fitted by this process and ``jobs - 1`` worker processes
    at once, each taking the next member as it finishes one; the same members, bit for bit,
    as one after the other (each is its own fit of its own rows).

    The workers are started first; one takes members once it has started (imports done),
    so this process fits members meanwhile, and a worker that has taken none when no member
    is left is ended at once.  ``gate`` (seconds): this process fits member 0 first, timed,
    while the workers start; if it took less than ``gate`` the workers are ended and every
    member is fitted here."""
    import pickle
    import tempfile
    import threading
    import warnings

    from .kernels import threadpool

    K, n = len(subsets), int(job.codes.shape[0])
    jobs = min(int(jobs), K)
    per = max(1, _cores() // jobs)  # kernel threads of each process: no core oversubscribed
    small = _small_codes(np.ascontiguousarray(job.codes))
    todo = list(range(K))
    lock = threading.Lock()
    go = threading.Event()  # the workers may take members (after the gate)
    members: list = [None] * K
    failed: list = []
    ended: set = set()  # workers that take no further member
    holding: dict = {}  # worker -> the member it is fitting

    def take(w=None):
        with lock:
            holding.pop(w, None)
            if failed or (w is not None and w in ended) or not todo:
                if w is not None:
                    ended.add(w)
                return None
            k = todo.pop(0)
            if w is not None:
                holding[w] = k
            return k

    def bits(k):
        mask = np.zeros(n, bool)
        mask[subsets[k]] = True
        return np.packbits(mask)

    with tempfile.TemporaryDirectory(prefix="fsll-average-") as tmp:
        codes = small
        if small.nbytes > SEND_BYTES:  # written once, mapped by every worker
            codes = os.path.join(tmp, "codes.npy")
            np.save(codes, small)
        head = pickle.dumps({"threads": per, "codes": codes, "cards": job.cards, "names": job.names,
                             "cats": job.cats, "keep": job.keep, "params": job.params, "dtype": job.dtype.str})
        env = dict(os.environ, NUMBA_NUM_THREADS=str(per), OMP_NUM_THREADS=str(per),
                   OPENBLAS_NUM_THREADS=str(per), MKL_NUM_THREADS=str(per))
        workers, feeders = [], []

        def feed(w):
            try:
                w.start()
                go.wait()
                while (k := take(w)) is not None:
                    answer = w.fit(k, bits(k))
                    if answer[0] != "ok":
                        with lock:
                            failed.append(answer)
                        return
                    members[k] = answer
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                with lock:
                    if not (w in ended and w.killed):  # (the broken pipe of one ended here is no error)
                        failed.append(("error", -1, e, ""))
            finally:
                with lock:
                    ended.add(w)
                    holding.pop(w, None)

        def end_idle():  # no member left: workers that hold none end now (e.g. still starting)
            with lock:
                idle = [w for w in workers if w not in ended and w not in holding]
                ended.update(idle)
            for w in idle:
                w.end(wait=False)

        before = threadpool.num_threads()
        try:
            for _ in range(jobs - 1):
                try:
                    workers.append(_Worker(head, env))
                except OSError as e:  # no process can be started here: this process fits the rest
                    warnings.warn(f"FSLLAverage could not start a worker process ({e}); its members are "
                                  "fitted in this process", RuntimeWarning, stacklevel=3)
                    break
            for w in workers:
                feeders.append(threading.Thread(target=feed, args=(w,), name="fsll-average-feed", daemon=True))
                feeders[-1].start()
            if gate is not None and (k := take()) is not None:  # member 0 here (all cores), timed
                t0 = time.perf_counter()
                members[k] = job.member(k, subsets[k])
                if time.perf_counter() - t0 < gate:
                    with lock:
                        ended.update(workers)
                    for w in workers:
                        w.end(wait=False)
            go.set()
            threadpool.set_num_threads(per)
            while (k := take()) is not None:  # this process fits members too
                members[k] = job.member(k, subsets[k])
            end_idle()
            for t in feeders:
                t.join()
        finally:
            go.set()
            threadpool.set_num_threads(before)  # (the count it had: the same threads from now on)
            ok = not failed and all(m is not None for m in members)
            for w in workers:
                w.end(wait=ok)
            for t in feeders:
                t.join()
            for w in workers:
                w.close()
    if failed:
        _, k, error, trace = failed[0]
        if trace:
            raise error from _RemoteError(f"member {k}, in a worker process:\n{trace}")
        raise error
    out = []
    for m in members:
        if isinstance(m, tuple):  # a worker's answer: the member and the warnings its fit gave
            _, k, m, caught = m
            for message, category in caught:
                warnings.warn(message, category, stacklevel=3)
        out.append(m)
    return out


class _RemoteError(Exception):
    """The traceback of an error raised in a worker process (the cause of the error raised here)."""
