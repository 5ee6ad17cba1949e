"""How an :class:`~fsll_ooc.FSLL` fit runs: encode and check the data, plan the chunk layout,
choose the penalty scale, learn in memory or in a store with its checkpoint, resume, and
the training data's KL.  The estimator keeps the scikit-learn surface and calls these;
the EM fit (:mod:`fsll_ooc.missing`) builds on them.
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
from .io import validate_data
from .kernels import threadpool
from .learn import FitState, LearnOptions, learn
from .machine import cgroup_memory_limit, free_disk, total_memory
from .model_file import json_or_none, jsonable_categories, params_from_json, plain_value
from .planner import PlanError, parse_bytes, plan as chunk_plan
from .queries import log_potential
from .storage.fit_store import TABLE_NAMES, FitStore, StoredFit
from .storage.url_store import decode_options
from .validation import check_code_range, check_labels, check_store_path

__all__ = ["FEW_SAMPLES", "WARM_START", "OWN_OPTIONS", "flat_index", "start_of", "warm_start", "workers", "make_plan",
           "show_progress", "fit", "choose_penalty_scale", "encoded", "stored_params", "fit_in_store", "make_engine",
           "options", "learn_with_progress", "resume_in_store", "from_stored", "open_finished", "kl_data",
           "labelled", "store_extra", "CATEGORY_ORDER", "set_fitted", "basis_table",
           "check_table_fits_memory", "begin", "network_start", "NETWORK_STARTS", "resolve_start", "family_score",
           "hill_climb", "network_families", "network_span", "network_parameters", "uniform_moments",
           "smoothed_targets", "smooth", "resolved_smoothing", "choose_smoothing", "held_out_plan",
           "SMOOTHING_PATIENCE", "SMOOTHING_Z", "SMOOTH_TOL", "SMOOTH_ROUNDS"]


def flat_index(codes: np.ndarray, cards: Sequence[int]) -> np.ndarray:
    """The C-order flat index of each row of ``codes`` in the joint table of ``cards``."""
    return np.ravel_multi_index(tuple(codes.T), tuple(cards)).astype(np.int64)


#: Fewer samples than this get a warning from :meth:`FSLL.fit`.
FEW_SAMPLES = 10
#: the key under which a store keeps the model a new fit starts from (``penalty_scale="auto"``)
WARM_START = "warm_start"
#: The store's record (``FitStore.extra``) of a fit's basis order (see ``set_fitted``).
CATEGORY_ORDER = "category_order"


def start_of(state: FitState) -> dict:
    """The model of ``state`` as a start for another fit (plain JSON; see :func:`warm_start`):
    its parameters, ``log Z`` and each term's share of its cost reduction (``gain``, from its
    history as :meth:`FSLL.interactions` counts it)."""
    from .queries import term_contributions

    contrib, _ = term_contributions(state.history)
    return {"theta": [[int(y), float(v)] for y, v in state.theta.items()], "log_z": float(state.log_z),
            "gain": [float(contrib.get(state.digits(y), 0.0)) for y in state.theta]}


#: ``start="network"``: the joint refit of the network's span stops when its predicted
#: remaining gain is below this (nats per row) or after :data:`NETWORK_REFIT_ROUNDS` rounds.
NETWORK_REFIT_TOL = 1e-12
NETWORK_REFIT_ROUNDS = 60


def begin(est, engine: Engine, state: FitState, uniq, counts, start: dict | None) -> None:
    """Where a new fit's search starts: the span of a Bayesian network learned on the rows
    for ``start="network"`` (:func:`network_start`; a span too large to refit jointly: a
    warning, then as the default), else ``start`` (:func:`warm_start`, the held-out
    choice's model; None: the uniform model)."""
    if resolve_start(getattr(est, "start", None)) == "network":
        if network_start(engine, state, uniq, counts):
            return
        warnings.warn("start='network': the network's span has more terms than the corrective steps refit "
                      "jointly; the search starts as the default's does", UserWarning, stacklevel=2)
    warm_start(engine, state, start)


def network_start(engine: Engine, state: FitState, uniq, counts) -> bool:
    """Start the new fit ``state`` (targets and uniform duals in ``engine``) from the span of
    the Bayesian network that greedy hill climbing under BIC finds on the rows (distinct
    flat cells ``uniq`` and their ``counts``; :func:`network_families`): every basis
    function within a family (a node and its parents) enters with parameter 0, their
    targets read from the target table, and the corrective Newton steps fit them jointly
    (to :data:`NETWORK_REFIT_TOL`, at most :data:`NETWORK_REFIT_ROUNDS` rounds); the
    learner then continues from there under the fit's own cost (``docs/design.md``, "A
    Bayesian network's span as the start").  The history records the uniform start
    (``init``) and then the step to the refitted span as the first iteration
    (``network-start``, its terms under ``added``).  A network without arcs gives the
    main effects.  Returns False, and leaves ``state`` as it was, when the span has more
    terms than the corrective steps refit jointly (``corrective.MAX_SUPPORT``: their
    Hessian is dense); True (nothing done) when it is empty (every variable one value)."""
    from .learn import corrective

    support = network_span(network_families(uniq, counts, state.cards), state.cards)
    if len(support) > corrective.MAX_SUPPORT:
        return False
    if not len(support):
        return True
    uniform = state.cost()
    state.theta = dict.fromkeys(support.tolist(), 0.0)
    state.dbar = dict(zip(support.tolist(), engine.gather(support, Table.DBAR).tolist()))
    state.log_z = engine.resync(support, np.zeros(len(support)), float(state.log_z))
    corrective.refine(engine, state, tol=NETWORK_REFIT_TOL, max_rounds=NETWORK_REFIT_ROUNDS)
    c = state.cost()
    state.history.append({"iter": 0, "move": "init", "y": None, "value": 0.0, "delta": 0.0, "cost": uniform,
                          "n_bases": 0, "time": 0.0})
    state.n_iter = 1
    state.history.append({"iter": 1, "move": "network-start", "y": None, "value": float(len(support)),
                          "delta": c - uniform, "cost": c, "n_bases": len(state.theta), "time": 0.0,
                          "added": [list(state.digits(y)) for y in support.tolist()]})
    return True


def warm_start(engine: Engine, state: FitState, start: dict | None) -> None:
    """Start the new fit ``state`` (targets and uniform duals in ``engine``) from ``start``
    (:func:`start_of` of a fit of the same variables on other rows, e.g. the held-out choice
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


#: ``smoothing="auto"``: the pseudo-rows tried double from the paper's 1 until the held-out
#: score has fallen this many times in a row (or they exceed the training rows).
SMOOTHING_PATIENCE = 2
#: ``smoothing="auto"`` keeps the pseudo-rows whose held-out gain over the paper's ``q``, less
#: this many standard errors of the paired per-row gain, is the largest and positive (the
#: held-out fifth is a small sample: the bound keeps a chance gain from choosing).
SMOOTHING_Z = 1.0
#: The smoothed refit (:func:`smooth`) stops when its predicted remaining gain is below this
#: (nats per row) or after :data:`SMOOTH_ROUNDS` rounds.
SMOOTH_TOL = 1e-12
SMOOTH_ROUNDS = 60


def uniform_moments(state: FitState, ys) -> np.ndarray:
    """``<Phi_y>_u``, the moments of the uniform distribution, of the flat indices ``ys``: the
    product over the term's variables of 0 (Walsh-Hadamard basis) or ``(2 - k) / k`` (the
    +-1 basis of a variable with ``k`` values)."""
    return np.array([basis.uniform_moment(state.cards, state.digits(y)) for y in np.asarray(ys).tolist()])


def smoothed_targets(state: FitState, ys, dbar, alpha: float) -> np.ndarray:
    """The targets ``<Phi_y>_q`` of ``q = (counts + alpha / |X|) / (N + alpha)`` from ``dbar``,
    those of the paper's ``q`` (``alpha = 1``, the search's targets)."""
    N = float(state.n_samples)
    return ((N + 1.0) * np.asarray(dbar, np.float64) + (alpha - 1.0) * uniform_moments(state, ys)) / (N + alpha)


def smooth(engine: Engine, state: FitState, alpha: float | None = None, *, current: bool = True) -> bool:
    """Refit the support of ``state`` (in place, with ``engine``'s dual table) to the targets of
    ``q = (counts + alpha / |X|) / (N + alpha)`` (``alpha``: ``state.smoothing``): the maximum of
    the likelihood of the rows and ``alpha`` pseudo-rows spread evenly over the cells, a
    Dirichlet prior's posterior mode on the search's support (``docs/design.md``, "Smoothing
    the final parameters").  ``state.dbar`` keeps the search's targets, so ``state.cost()``
    stays the cost of the paper's ``q``.  ``current=False``: the dual table may not describe
    ``state.theta`` (a resumed store) and is re-derived first.  Returns False, doing nothing,
    for ``alpha`` 1 (the search's own targets), an empty support or one larger than the
    corrective steps refit jointly (``corrective.MAX_SUPPORT``)."""
    from .learn import corrective

    alpha = state.smoothing if alpha is None else float(alpha)
    if alpha == 1.0 or not state.theta or len(state.theta) > corrective.MAX_SUPPORT:
        return False
    ys = np.fromiter(state.theta.keys(), np.int64, len(state.theta))
    if not current:
        state.log_z = engine.resync(ys, np.fromiter(state.theta.values(), np.float64, len(ys)), float(state.log_z))
    raw = state.dbar
    state.dbar = dict(zip(ys.tolist(), smoothed_targets(state, ys, [raw[y] for y in ys.tolist()], alpha).tolist()))
    try:
        corrective.refine(engine, state, tol=SMOOTH_TOL, max_rounds=SMOOTH_ROUNDS)
    finally:
        state.dbar = raw
    return True


def resolved_smoothing(est):
    """``est``'s ``smoothing`` resolved (:func:`fsll_ooc.cost.resolve_smoothing`): ``"auto"`` or
    the pseudo-rows."""
    return C.resolve_smoothing(getattr(est, "smoothing", None), est.epsilon, resolve_start(getattr(est, "start", None)))


def choose_smoothing(est, codes: np.ndarray, cards, choice) -> tuple[float, dict]:
    """``(alpha, scores)``: the pseudo-rows of the final parameters' target (``smoothing``) and,
    for ``"auto"``, the held-out log-likelihood per row of each value tried.

    ``"auto"`` refits the penalty scale's chosen model on the training rows of each held-out
    split :func:`fsll_ooc.learn.select.choose_scale` used (``choice.fold_models``, its own
    support on its own rows) with 2, 4, 8, ... pseudo-rows (:func:`smooth`); the doubling
    stops when the held-out score has fallen :data:`SMOOTHING_PATIENCE` times in a row or the
    pseudo-rows pass the training rows.  It keeps the value whose paired gain over the
    paper's ``q`` per held-out row, less :data:`SMOOTHING_Z` standard errors, is the largest
    and positive, else 1.  With a fixed penalty scale and price the held-out fit is made for
    this choice alone (:func:`choose_penalty_scale`).  No choice (1) without held-out fits
    (fewer than ``select.MIN_ROWS`` rows, tables too large for memory), or with a support
    larger than the corrective steps refit jointly."""
    from types import SimpleNamespace

    from .learn import corrective, select

    want = resolved_smoothing(est)
    if want != "auto":
        return want, {}
    n = int(codes.shape[0])
    folds = select.HOLDOUT if n < select.FOLDS_BELOW else 1
    models = choice.fold_models
    if len(models) != folds or any(len(m["theta"]) > corrective.MAX_SUPPORT for m in models):
        return 1.0, {}
    code = C.resolve_penalty(est.penalty, est.epsilon)
    size = math.prod(cards)
    plan = None
    alphas: list[float] = []
    rows: dict[float, list] = {}
    for fold in range(folds):
        train, held = select.holdout_split(n, fold)
        flat = flat_index(codes[train], cards)
        uniq, counts = np.unique(flat, return_counts=True)
        nt = len(train)
        state = FitState(tuple(cards), nt, C.target_entropy(counts, nt, size), log_z=math.log(size),
                         penalty_code=code, penalty_scale=choice.scale, further_price=choice.price)
        if plan is None:
            plan = held_out_plan(est, cards)
        engine = Engine.create(plan, [storage.create_table("numpy", None, nm, cards, plan.layout.chunk_shape)
                                      for nm in TABLE_NAMES], nt, None, sample_flat=flat)
        model = models[fold]  # the chosen setting's fit on this split's training rows
        ys = np.array([y for y, _ in model["theta"]], np.int64)
        values = np.array([v for _, v in model["theta"]], np.float64)
        if len(ys):
            state.theta = dict(zip(ys.tolist(), values.tolist()))
            state.dbar = dict(zip(ys.tolist(), engine.gather(ys, Table.DBAR).tolist()))
            state.log_z = engine.resync(ys, values, float(model["log_z"]))
        shown = SimpleNamespace(cardinalities_=tuple(cards), theta_={})

        def held_out() -> np.ndarray:
            shown.theta_ = {state.digits(y): v for y, v in state.theta.items()}
            return log_potential(shown, codes[held]) - state.log_z

        if fold == 0:
            alpha, best, falls = 1.0, None, 0
            while True:
                smooth(engine, state, alpha)
                alphas.append(alpha)
                rows[alpha] = [held_out()]
                score = float(np.mean(rows[alpha][0]))
                if best is not None and score <= best:
                    falls += 1
                else:
                    best, falls = score, 0
                alpha *= 2.0
                if falls >= SMOOTHING_PATIENCE or alpha > nt:
                    break
        else:
            for alpha in alphas:
                smooth(engine, state, alpha)
                rows[alpha].append(held_out())
    lp = {a: np.concatenate(rows[a]) for a in alphas}
    scores = {a: float(np.mean(v)) for a, v in lp.items()}
    best, bound = alphas[0], 0.0
    for alpha in alphas[1:]:  # the paired gain over the paper's q, less SMOOTHING_Z standard errors
        d = lp[alpha] - lp[alphas[0]]
        low = float(np.mean(d)) - SMOOTHING_Z * float(np.std(d)) / math.sqrt(len(d))
        if low > bound:
            best, bound = alpha, low
    return best, scores


def workers(est, out_of_core: bool) -> int:
    """Band tasks at once, which the plan budgets memory for: a dask.distributed client's
    threads, an :class:`~fsll_ooc.executors.Executor`'s ``threads`` where it has them; else 1
    in core (one band) and, out of core, the local pool's threads
    (:func:`fsll_ooc.kernels.threadpool.num_threads`, at least 2), which the engine then
    keeps to (:func:`fsll_ooc.executors.make_executor`)."""
    if est.scheduler is not None and hasattr(est.scheduler, "nthreads"):
        return max(1, sum(est.scheduler.nthreads().values()))
    if getattr(est.scheduler, "threads", None):
        return max(1, int(est.scheduler.threads))
    return max(2, threadpool.num_threads()) if out_of_core else 1


def make_plan(est, cards, backend: storage.TableBackend, disk_free=None, memory=None, table_sets: int = 1):
    """The chunk plan of a fit: in core within the machine's memory, out of core within the
    store's free disk (``disk_free``) and ``memory_limit``; ``PlanError`` if it cannot fit.
    ``table_sets``: in core, how many sets of tables the fit holds at once (each gets that
    share of the memory)."""
    ooc = backend.persistent
    mem = est.memory_limit if est.memory_limit is not None or ooc else memory
    if mem is None:  # out of core without a limit: a container's limit still holds
        mem = cgroup_memory_limit()
    if not ooc and table_sets > 1 and mem is not None:
        mem = parse_bytes(mem) // table_sets
    p = chunk_plan(cards, memory_limit=mem, disk_free=disk_free, workers=workers(est, ooc),
                  out_of_core=True if ooc else None, layout=est.layout)
    if not ooc and p.layout.a > 0 and est.layout is None:
        sets = (f" {table_sets} times over (n_restarts keeps the best run's tables while the next "
                f"run builds its own; n_restarts=1 needs one set)" if table_sets > 1 else "")
        raise PlanError(f"the {math.prod(cards):,}-cell tables do not fit in memory{sets} "
                        f"({p.report().splitlines()[0]}); pass store=PATH to fit out of core")
    if not p.feasible:
        raise PlanError("infeasible fit:\n" + p.report())
    return p


def show_progress(est) -> bool:
    """Does ``est`` show a progress line (``progress``; by default when stderr is a terminal)?"""
    return bool(est.progress if est.progress is not None else sys.stderr.isatty())


def fit(est, X, backend, feature_names=None, categories=None, sub_class=None) -> None:
    """The ordinary fit of ``est`` on ``X`` (complete rows, nothing hidden): in memory, or in
    its store with the store's checkpoint (``backend`` checked by ``FSLL._check_params``);
    ``sub_class`` fits the penalty scale's held-out sub-fits (:func:`choose_penalty_scale`)."""
    if backend.persistent:
        check_store_path(est.store)
    codes, cards, names, categories = encoded(est, X, feature_names, categories)
    if backend.persistent:
        fs = FitStore(est.store, backend.name, est.storage_options)
        plan = make_plan(est, cards, backend, disk_free=None if fs.io.is_url else free_disk(fs.root.resolve()))
        fs.check_new()  # never replace or delete a user's files
        plan = fs.account(plan)
    else:
        plan = make_plan(est, cards, backend, memory=total_memory())
    N = codes.shape[0]
    if N < FEW_SAMPLES:
        warnings.warn(f"fitting on only {N} sample{'s' if N != 1 else ''}: the model can say little more "
                      "than which rows were seen; fit on more data for a distribution to rely on",
                      UserWarning, stacklevel=3)
    choice = choose_penalty_scale(est, codes, cards, sub_class)
    alpha, est.smoothing_scores_ = choose_smoothing(est, codes, cards, choice)
    flat = flat_index(codes, cards)
    uniq, counts = np.unique(flat, return_counts=True)
    size = math.prod(cards)
    state = FitState(cards, N, C.target_entropy(counts, N, size), log_z=math.log(size),
                     penalty_code=C.resolve_penalty(est.penalty, est.epsilon), penalty_scale=choice.scale,
                     further_price=choice.price, smoothing=alpha)
    est.penalty_scale_scores_ = choice.scores
    if not backend.persistent:
        engine = make_engine(est, plan, [storage.create_table(backend.name, None, nm, cards, plan.layout.chunk_shape)
                                         for nm in TABLE_NAMES], N, sample_flat=flat, penalty_scale=state.penalty_scale)
        begin(est, engine, state, uniq, counts, choice.start)
        learn_with_progress(est, engine, state, fresh=True, checkpoint=None)
        smooth(engine, state)
        set_fitted(est, state, plan=plan, engine=engine, cost=state.cost(), feature_names=names,
                        categories=categories)
        est.kl_data_ = kl_data(est, flat, counts, N)
        return
    # Crash-safe order (docs/reliability.md): lock; old state out; data kept in the store;
    # "starting"; tables and targets; "running" after every iteration; "complete".
    with fs.writing("fit", "fitting", plan):
        fs.begin(plan, stored_params(est), (names, json_or_none(jsonable_categories(categories))),
                 uniq, counts, state, extra=store_extra(est, choice.start))
        fit_in_store(est, fs, plan, state, uniq, counts, flat=flat, fresh=True, names=names,
                     categories=categories, start=choice.start)


def held_out_plan(est, cards):
    """The plan of the held-out fits (:func:`choose_penalty_scale`, :func:`choose_smoothing`):
    one worker, the whole tables in memory within ``memory_limit`` if they fit."""
    return chunk_plan(cards, memory_limit=est.memory_limit if est.memory_limit is not None else total_memory(),
                      disk_free=None, workers=1, out_of_core=None)


def choose_penalty_scale(est, codes: np.ndarray, cards, sub_class=None):
    """The penalty scale and the price of a family's further terms of this fit
    (:func:`fsll_ooc.learn.select.choose_scale` for ``"auto"``): the sub-fits (estimators of
    ``sub_class``, by default ``est``'s class) run in memory with this estimator's learning
    parameters and the paper's target (``smoothing=1``).  With ``smoothing="auto"`` and a fixed
    scale and price, the one held-out fit is made for :func:`choose_smoothing` alone: the
    choice has its ``fold_models`` but no ``start`` (the fit starts as it would without)."""
    from .learn.select import ScaleChoice, choose_scale

    want = C.resolve_penalty_scale(est.penalty_scale, est.epsilon)
    price = C.resolve_further_price(est.further_price, C.resolve_penalty(est.penalty, est.epsilon),
                                    resolve_start(getattr(est, "start", None)))
    smoothing = resolved_smoothing(est) == "auto"
    if want != "auto" and price != "auto" and not smoothing:
        return ScaleChoice(want, price=price)
    scales = C.PENALTY_SCALES if want == "auto" else (want,)
    prices = C.FURTHER_PRICES if price == "auto" else (price,)
    try:  # the sub-fits hold the whole tables in memory, within the fit's memory limit
        p = held_out_plan(est, cards)
        fits = p.feasible and p.layout.a == 0
    except PlanError:
        fits = False
    if not fits:
        return ScaleChoice(scales[0], reason="the tables do not fit in memory", price=prices[0])
    opts = est.learn_options
    if opts is not None:
        opts = dataclasses.replace(opts, on_finish=None)
    own = {k: getattr(est, k) for k in ("epsilon", "max_iter", "resync_every", "refine", "penalty")}

    def fit_path(train, settings):  # a fit under the first setting, continued under each further one
        settings = [s if isinstance(s, tuple) else (float(s), price) for s in settings]
        scale, first_price = settings[0]
        sub = (sub_class or type(est))(cardinalities=tuple(cards), progress=False, learn_options=opts,
                                       penalty_scale=scale, further_price=first_price, smoothing=1.0, **own)
        sub.fit(train)
        yield (lambda c: log_potential(sub, c) - sub.log_z_), start_of(sub._state)
        state, specs = sub._state, sub._engine.ctx.specs
        kept = {settings[0]: _snapshot(state)}
        for i, (scale, price_i) in enumerate(settings[1:], 1):
            engine = make_engine(sub, sub.plan_, specs, state.n_samples, penalty_scale=scale)
            parent = _parent(settings, i)
            if parent != settings[i - 1]:  # another branch: back to the model of its parent
                _restore(engine, state, kept[parent])
            state.set_penalty_scale(scale)
            state.set_further_price(price_i)
            state.converged = False
            learn(engine, state, options(sub), fresh=False)
            set_fitted(sub, state, plan=sub.plan_, engine=engine)
            if any(_parent(settings, j) == settings[i] for j in range(i + 2, len(settings))):
                kept[settings[i]] = _snapshot(state)
            yield (lambda c: log_potential(sub, c) - sub.log_z_), start_of(state)

    if price == "auto":
        return choose_scale(fit_path, codes, scales, C.FURTHER_PRICES)
    if want != "auto":  # held out for the smoothing's choice only: the fit starts as without it
        choice = choose_scale(fit_path, codes, scales)
        choice.start, choice.scores, choice.price = None, {}, price
        return choice
    choice = choose_scale(fit_path, codes)  # the scales under one price (the default: the full price)
    choice.price = price
    return choice


def _parent(settings, i: int):
    """The setting whose model the ``i``-th of ``settings`` ((scale, price) pairs, the scales
    of each price in turn) continues: the one before it at the same price; a price's first
    setting continues the first price's fit at the same scale."""
    scale, price = settings[i]
    if settings[i - 1][1] == price:
        return settings[i - 1]
    return next(s for s in settings if s[0] == scale and s[1] == settings[0][1])


def _snapshot(state: FitState) -> tuple:
    """What :func:`_restore` needs to put ``state``'s model back."""
    return dict(state.theta), dict(state.dbar), state.log_z, list(state.history), state.n_iter


def _restore(engine: Engine, state: FitState, snap: tuple) -> None:
    """Put the model of :func:`_snapshot` back into ``state`` and ``engine``'s duals (as
    :func:`warm_start` does)."""
    theta, dbar, log_z, history, n_iter = snap
    state.theta, state.dbar, state.history, state.n_iter = dict(theta), dict(dbar), list(history), n_iter
    if theta:
        support = np.fromiter(theta.keys(), np.int64, len(theta))
        state.log_z = engine.resync(support, np.fromiter(theta.values(), np.float64, len(theta)), float(log_z))
    else:
        engine.init_duals()
        state.log_z = log_z


def encoded(est, X, feature_names=None, categories=None, mask=None):
    """``(codes, cards, names, categories)`` of ``X`` (codes, or a DataFrame of labels), checked,
    in the basis order of the fit (:func:`fsll_ooc.io.basis_order`; kept on ``est`` for its
    ``set_fitted``; ``mask``: the missing cells, which are not counted)."""
    from .io import basis_order, recode

    codes, cards, names, categories, is_labelled, keep = labelled(est, X, feature_names, categories)
    counted = codes if mask is None else np.where(mask, -1, codes)
    order = basis_order(est.category_order, counted, cards, labelled=is_labelled, ordered=keep)
    est._fit_to_basis = None if order is None else [None if o is None else np.argsort(o) for o in order]
    if order is not None:
        codes = recode(codes, est._fit_to_basis)
        shown = categories if categories is not None else [list(range(k)) for k in cards]
        categories = [list(c) if o is None else [c[u] for u in o] for c, o in zip(shown, order)]
    return codes, cards, names, categories


def labelled(est, X, feature_names=None, categories=None):
    """``(codes, cards, names, categories, labelled, ordered)`` of ``X`` as given: whether it
    came with labels, and the variables whose order is kept (``fit(..., ordered=...)``)."""
    from .io import encode, variable_index

    ordered = ()
    if hasattr(X, "columns"):
        enc = encode(X, est.cardinalities)
        codes, cards = validate_data(enc.codes, enc.cardinalities)
        names = list(map(str, X.columns)) if feature_names is None else feature_names
        is_labelled, ordered = True, enc.ordered
        categories = enc.categories if categories is None else categories
    else:
        codes, cards = validate_data(check_code_range(X), est.cardinalities)
        names, is_labelled = feature_names, categories is not None
    names, categories = check_labels(names, categories, cards)
    keep = set(ordered) | {variable_index(v, names, len(cards)) for v in (getattr(est, "_fit_ordered", None) or ())}
    return codes, cards, names, categories, is_labelled, sorted(keep)


def store_extra(est, start) -> dict | None:
    """What a new store keeps beside the data: the warm start, the basis order of the codes."""
    extra = {} if start is None else {WARM_START: start}
    if getattr(est, "_fit_to_basis", None) is not None:
        extra[CATEGORY_ORDER] = [None if t is None else t.tolist() for t in est._fit_to_basis]
    return extra or None


def stored_params(est) -> dict:
    """The parameters a store keeps to resume with (plain JSON)."""
    return {k: plain_value(v) for k, v in est.get_params().items() if k in est._STORED_PARAMS}


def fit_in_store(est, fs: FitStore, plan, state: FitState, uniq, counts, *, flat=None, fresh: bool,
                  names=None, categories=None, start=None) -> None:
    """Learn with the store's checkpoint: from new tables (``fresh``; ``flat`` is the data, by
    default the stored counts; ``start`` the model the search starts from, see
    :func:`warm_start`) or from the store's tables and ``state``; then complete it."""
    cards, N = tuple(state.cards), state.n_samples
    if fresh:
        specs = fs.create_tables(cards, plan.layout.chunk_shape)
        with fs.damage_hint():
            engine = make_engine(est, plan, specs, N, sample_flat=np.repeat(uniq, counts) if flat is None else flat,
                                 penalty_scale=state.penalty_scale)
            begin(est, engine, state, uniq, counts, start)
            fs.tables_ready(specs, state)
            learn_with_progress(est, engine, state, fresh=True, checkpoint=fs.checkpoint)
    else:
        engine = make_engine(est, plan, fs.open_tables(cards, plan.layout.chunk_shape), N,
                             penalty_scale=state.penalty_scale)
        if not state.converged and (est.max_iter is None or state.n_iter < est.max_iter):
            with fs.damage_hint():
                learn_with_progress(est, engine, state, fresh=False, checkpoint=fs.checkpoint)
    with fs.damage_hint():  # a resumed store's tables may be those of a smoothing refit cut short
        smooth(engine, state, current=fresh)
    # once fitted, the model answers queries in a private scratch table: the store's own
    # tables are written only under its lock (docs/reliability.md)
    engine = Engine.create(plan, fs.open_tables(cards, plan.layout.chunk_shape, reader_owner=est), N,
                           est.scheduler)
    set_fitted(est, state, plan=plan, engine=engine, cost=state.cost(), feature_names=names,
                    categories=categories)
    est.kl_data_ = kl_data(est, uniq, counts, N) if flat is None else kl_data(est, flat, counts, N)
    fs.complete(state, est.kl_data_)


def make_engine(est, plan, specs, N: int, sample_flat=None, penalty_scale: float = 1.0) -> Engine:
    """The engine over ``specs`` with the plan's layout and this fit's scheduler; with
    ``sample_flat`` (the data of a new fit) it computes the targets and uniform duals."""
    return Engine.create(plan, specs, N, est.scheduler, sample_flat=sample_flat,
                         progress=sample_flat is not None and show_progress(est),
                         penalty_scale=penalty_scale)


#: The learner's options that :class:`~fsll_ooc.FSLL` sets itself.
OWN_OPTIONS = ("epsilon", "max_iter", "resync_every", "refine")


def options(est) -> LearnOptions:
    """The learner's options: ``learn_options`` with this estimator's own four."""
    base = est.learn_options
    if base is None:
        base = LearnOptions()
    elif not isinstance(base, LearnOptions):
        raise ValueError(f"learn_options must be a fsll_ooc.learn.LearnOptions or None, got {base!r}")
    own = {k: getattr(est, k) for k in OWN_OPTIONS}
    default = LearnOptions()
    for k, v in own.items():
        if getattr(base, k) != getattr(default, k) and getattr(base, k) != v:
            raise ValueError(f"learn_options sets {k}={getattr(base, k)!r} but FSLL has {k}={v!r}; "
                             f"set {k} on FSLL")
    return dataclasses.replace(base, **own)


def learn_with_progress(est, engine, state, fresh: bool, checkpoint) -> None:
    """Run the learner for ``est`` (its options; a progress line when ``est`` shows one)."""
    bar = None
    if show_progress(est):  # in words, counting on from a resumed fit's iterations
        from .learn.greedy import resolve_epsilon
        from .progress import FitProgress

        bar = FitProgress(resolve_epsilon(est.epsilon, state.n_samples), start=state.n_iter)
    engine.progress = bar is not None
    try:
        learn(engine, state, options(est), fresh=fresh, progress=bar, callback=checkpoint)
    finally:
        if bar is not None:
            bar.close()


def resume_in_store(m, fs: FitStore, stored: StoredFit, restart: bool) -> None:
    """Continue the ordinary fit of ``m`` in its store ``fs`` (the writer lock held), from its
    tables or, for a fit that was ``starting`` or with ``restart``, from the stored data."""
    state = FitState.from_json(stored.state)
    cards, N = tuple(state.cards), state.n_samples
    plan = fs.account(make_plan(m, cards, storage.get_backend(stored.backend), disk_free=fs.disk_available()))
    uniq, counts = fs.read_counts(cards, N)
    fs.reopen(plan, stored)
    fresh = stored.status == "starting" or restart
    if fresh:
        state = FitState(cards, N, C.target_entropy(counts, N, math.prod(cards)), log_z=math.log(math.prod(cards)),
                         penalty_code=C.resolve_penalty(m.penalty, m.epsilon),
                         penalty_scale=state.penalty_scale,  # the scale chosen when the fit began
                         further_price=state.further_price)  # and the price
        fs.restart(state)
    fit_in_store(m, fs, plan, state, uniq, counts, fresh=fresh, names=stored.feature_names,
                 categories=stored.categories, start=fs.extra(WARM_START) if fresh else None)


def from_stored(cls, fs: FitStore, stored: StoredFit, scheduler, progress, memory_limit=None) -> "FSLL":
    """An estimator with the stored fit's parameters (every learning parameter of the fit)."""
    kw = params_from_json({k: v for k, v in stored.params.items() if k in cls._PARAMS})
    kw.update(store=fs.root, backend=stored.backend, scheduler=scheduler, layout=stored.layout, progress=progress,
              storage_options=decode_options(fs.io.options) if fs.io.is_url else None)
    if memory_limit is not None:
        kw["memory_limit"] = memory_limit
    m = cls(**kw)
    m._fit_to_basis = fs.extra(CATEGORY_ORDER)  # the shown order of the stored (basis-order) labels
    return m


def open_finished(cls, fs: FitStore, stored: StoredFit, scheduler, progress, memory_limit=None) -> "FSLL":
    """A finished fit for reading: nothing in the store is written (a private scratch table is)."""
    m = from_stored(cls, fs, stored, scheduler, progress, memory_limit)
    state = FitState.from_json(stored.state)
    plan = fs.account(make_plan(m, tuple(state.cards), storage.get_backend(stored.backend)))
    specs = fs.open_tables(state.cards, plan.layout.chunk_shape, reader_owner=m)
    set_fitted(m, state, plan=plan, engine=make_engine(m, plan, specs, state.n_samples), cost=state.cost(),
                  kl_data=stored.kl_data, feature_names=stored.feature_names, categories=stored.categories)
    return m


def kl_data(est, flat, counts, N) -> float:
    """``KL(p_d || p_theta)`` of the training data.

    From the sparse state, ``O(#terms)``: ``-H(p_d) - sum_y theta_y E_pd[Phi_y] + log Z``,
    where ``E_pd[Phi_y] = ((N + 1) dbar_y - E_u[Phi_y]) / N`` undoes the positivity rule
    (``dbar`` are the moments of ``q = (N p_d + u) / (N + 1)``; ``E_u[Phi_y]`` is 0 on a
    Walsh-Hadamard axis with ``y_i != 0`` and ``(2 - k) / k`` on a +-1 axis).  Falls back
    to evaluating ``log p_theta`` at the data when a target is missing.
    """
    st = est._state
    if all(y in st.dbar for y in st.theta):
        m = 0.0
        for y, v in st.theta.items():
            m += v * ((N + 1.0) * st.dbar[y] - basis.uniform_moment(st.cards, st.digits(y))) / N
        return float(-C.empirical_entropy(counts, N) - m + st.log_z)
    uniq = np.unique(flat)
    eng = getattr(est, "_engine", None)
    if eng is not None and eng.layout.a == 0 and len(uniq) * len(est.theta_) > eng.layout.size:
        # in core with many occupied cells and terms: one pass over the table is cheaper
        lp = np.log(basis_table(est).reshape(-1)[uniq])
    else:
        codes = np.stack(np.unravel_index(uniq, est.cardinalities_), axis=1)
        lp = log_potential(est, codes) - est.log_z_
    return float(-C.empirical_entropy(counts, N) - np.dot(counts, lp) / N)


def set_fitted(est, state: FitState, *, plan=None, engine=None, cost=None, kl_data=None,
               feature_names=None, categories=None, to_basis="fit", shown: bool = False) -> None:
    """The one place that sets an estimator's fitted attributes (after ``fit``, ``resume`` and ``load``).

    ``categories`` are in the basis order (``shown``: in the order shown); ``to_basis``
    (per variable the basis code of each shown code, or None; ``"fit"``: this fit's,
    :func:`fsll_ooc.fitting.encoded`) gives the order shown.
    """
    est._state = state
    est._engine = engine
    est.plan_ = plan
    est.cardinalities_ = tuple(state.cards)
    est.n_features_in_ = len(state.cards)
    est.n_samples_ = state.n_samples
    est.theta_ = {state.digits(y): v for y, v in sorted(state.theta.items())}
    est.log_z_ = state.log_z
    est.n_bases_ = len(state.theta)
    est.penalty_scale_ = state.penalty_scale
    est.further_price_ = state.further_price
    est.smoothing_ = state.smoothing
    est.n_iter_ = state.n_iter
    est.cost_ = state.cost() if cost is None and engine is not None else cost
    est.kl_data_ = kl_data
    est.history_ = state.history
    est.converged_ = state.converged
    to_basis = getattr(est, "_fit_to_basis", None) if isinstance(to_basis, str) else to_basis
    to_basis = list(to_basis or []) + [None] * (len(state.cards) - len(to_basis or []))  # hidden: as given
    est.basis_order_ = [np.arange(k) if t is None else np.argsort(np.asarray(t, np.int64))
                         for t, k in zip(to_basis, state.cards)]
    if categories is not None and not shown:
        categories = [list(c) if t is None else [c[b] for b in t] for c, t in zip(categories, to_basis)]
    est.feature_names_in_, est.categories_ = check_labels(feature_names, categories, est.cardinalities_)


def basis_table(est) -> np.ndarray:
    """``est.probabilities()`` with every axis in the basis order."""
    est._check_fitted()
    st = est._state
    sup = np.fromiter(st.theta.keys(), np.int64, len(st.theta))
    val = np.fromiter(st.theta.values(), np.float64, len(st.theta))
    eng = getattr(est, "_engine", None)
    if eng is None:  # a loaded model: build the table here
        check_table_fits_memory(est.cardinalities_)
        table = np.zeros(est.cardinalities_)
        table.reshape(-1)[sup] = val
        from .kernels.transform import transform_inplace

        transform_inplace(table, transpose=True, first_use="reference")  # no compile for one table
        l = table
        l -= l.max()
        p = np.exp(l, out=l)
        return p / p.sum()
    total = eng.density(sup, val, est.log_z_)
    return storage.as_array(eng.ctx.spec(Table.SCRATCH)) / total


def check_table_fits_memory(cards) -> None:
    """Building the whole ``p_theta`` table of a loaded model in memory takes about two tables."""
    need, mem = 16 * math.prod(cards), total_memory()
    if mem is not None and need > mem:
        raise ValueError(f"the model's joint table has {math.prod(cards):,} cells; building it in memory needs "
                         f"about {need / 2**30:.1f} GiB, more than this machine's {mem / 2**30:.1f} GiB")


# ------------------------------------------------------------------ start="network"
# A Bayesian network's span as the search's start (``FSLL(start="network")``).
#
# The MDL cost buys a term only if it gains more than its price, about ``ln N / 2`` nats
# (times the penalty scale) plus the naming of its variables; a weak interaction of the
# source gains less and is left out, while for prediction it pays from about ``1 / N``
# (``docs/benchmarks_quality.md``, "Search or cost?").  A Bayesian network learned under
# BIC prices a *whole conditional table* once its parents are in: its structure search
# compares families, not single terms.  ``start="network"`` takes that structure as the
# start of the greedy search: greedy hill climbing over directed acyclic graphs under the
# BIC score (:func:`hill_climb`: from the empty graph, the best arc addition, removal or
# reversal while one raises the score; the moves of pyAgrum's and pgmpy's hill climbing),
# then every basis function whose variables lie within one family (a node and its
# parents: :func:`network_span`) enters the model, fitted jointly by the learner's corrective
# Newton steps, and the ordinary search continues from there under the fit's own cost
# (its terms may leave, others join).  ``docs/design.md``, "A Bayesian network's span as
# the start".
#
# Pure numpy on the distinct rows and their counts; no table of the model's size.


#: Values of ``FSLL(start=...)`` besides None (the default's start).
NETWORK_STARTS = ("network",)


def resolve_start(start) -> str:
    """``"default"`` (``start=None``: the uniform model, or the held-out choice's model under
    ``penalty_scale="auto"``) or ``"network"``."""
    if start is None:
        return "default"
    if not isinstance(start, str) or start not in NETWORK_STARTS:
        raise ValueError(f"start must be None or one of {NETWORK_STARTS}, got {start!r}")
    return start


#: A family (a node and its parents) is not proposed when its table would have more
#: cells than this or more than the number of rows (its conditional table could not be
#: estimated; BIC would refuse it anyway).
NETWORK_MAX_FAMILY_CELLS = 1 << 20
#: Hill climbs of :func:`network_families`, each with the variables in another order (ties).
NETWORK_ORDERS = 8
#: Then this many times a share (:data:`NETWORK_KICK_SHARE`) of the best graph's arcs, at
#: least one, are taken out at random and the climb runs again from there, the variables in
#: a random order; a higher BIC replaces the best graph (iterated local search).
NETWORK_KICKS = 64
#: The share of the arcs a kick takes out.
NETWORK_KICK_SHARE = 0.5
#: Seed of those orders and kicks.
NETWORK_SEED = 0


class _FamilyScores:
    """BIC of families ``(node, parents)`` on weighted distinct rows, memoised."""

    def __init__(self, rows: np.ndarray, weights: np.ndarray, cards: Sequence[int]):
        self.rows = np.asarray(rows, np.int64)
        self.w = np.asarray(weights, np.float64)
        self.cards = tuple(int(k) for k in cards)
        self.n = float(self.w.sum())
        self.log_n = math.log(self.n) if self.n > 1 else 0.0
        self.memo: dict = {}

    def cells(self, node: int, parents) -> int:
        return math.prod(self.cards[v] for v in parents) * self.cards[node]

    def allowed(self, node: int, parents) -> bool:
        c = self.cells(node, parents)
        return c <= NETWORK_MAX_FAMILY_CELLS and c <= max(self.n, 1.0)

    def __call__(self, node: int, parents: frozenset) -> float:
        key = (node, parents)
        out = self.memo.get(key)
        if out is None:
            out = self.memo[key] = family_score(self.rows, self.w, self.cards, node, sorted(parents), self.log_n)
        return out


def family_score(rows: np.ndarray, weights: np.ndarray, cards: Sequence[int], node: int, parents: Sequence[int],
                 log_n: float | None = None) -> float:
    """BIC of ``node`` given ``parents`` on rows ``rows`` (codes, one row per distinct
    observation) weighted by ``weights``: the maximised log-likelihood of the node's
    conditional table, ``sum n(x, pa) ln(n(x, pa) / n(pa))``, less ``ln N / 2`` per free
    parameter, ``(k_node - 1) prod k_pa``."""
    w = np.asarray(weights, np.float64)
    if log_n is None:
        log_n = math.log(float(w.sum())) if w.sum() > 1 else 0.0
    k = int(cards[node])
    pa_index = np.zeros(len(rows), np.int64)
    n_pa = 1
    for v in parents:
        pa_index = pa_index * int(cards[v]) + rows[:, v]
        n_pa *= int(cards[v])
    joint = np.bincount(pa_index * k + rows[:, node], weights=w, minlength=n_pa * k).reshape(n_pa, k)
    marg = joint.sum(axis=1, keepdims=True)
    nz = joint > 0
    ll = float(np.sum(joint[nz] * np.log((joint / np.where(marg > 0, marg, 1.0))[nz])))
    return ll - 0.5 * log_n * (k - 1) * n_pa


def _reaches(parents: list, start: int, goal: int) -> bool:
    """Is there a directed path ``start -> ... -> goal`` (``parents[v]``: the parents of ``v``)?"""
    children = [[] for _ in parents]
    for v, ps in enumerate(parents):
        for u in ps:
            children[u].append(v)
    seen, todo = {start}, [start]
    while todo:
        u = todo.pop()
        if u == goal:
            return True
        for c in children[u]:
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return False


def _descendants(parents: list) -> list:
    """Per variable, the set of variables a directed path from it reaches (itself left out)."""
    children = [[] for _ in parents]
    for v, ps in enumerate(parents):
        for u in ps:
            children[u].append(v)
    out = []
    for start in range(len(parents)):
        seen, todo = set(), list(children[start])
        while todo:
            u = todo.pop()
            if u not in seen:
                seen.add(u)
                todo.extend(children[u])
        out.append(seen)
    return out


def hill_climb(rows: np.ndarray, weights: np.ndarray, cards: Sequence[int], max_moves: int | None = None,
               order: Sequence[int] | None = None, scorer: "_FamilyScores | None" = None, start=None) -> list:
    """The parents of each variable (a list of sorted tuples) of the directed acyclic graph
    found by greedy hill climbing under BIC from the empty graph: at each step the move of
    highest gain among adding, removing or reversing one arc (ties: the first in the order
    add, remove, reverse, by child then parent, the variables taken in ``order``, by default
    their own), while one gains more than ``1e-9`` nats; from ``start`` (parent sets of an
    acyclic graph) if given.  ``rows``: codes of the distinct rows, ``weights`` their
    counts.

    BIC gives Markov-equivalent graphs the same score, so the first arcs' directions are
    ties that ``order`` breaks, and they decide which later arcs pay: another order may end
    on another local maximum (:func:`network_families` keeps the best of several)."""
    cards = tuple(int(k) for k in cards)
    n = len(cards)
    score = scorer if scorer is not None else _FamilyScores(rows, weights, cards)
    seq = list(range(n)) if order is None else [int(v) for v in order]
    parents = [frozenset() for _ in range(n)] if start is None else [frozenset(p) for p in start]
    current = [score(i, parents[i]) for i in range(n)]
    moves = 0
    while max_moves is None or moves < max_moves:
        best_gain, best = 1e-9, None
        below = _descendants(parents)
        for i in seq:  # add j -> i
            for j in seq:
                if j == i or j in parents[i] or j in below[i]:  # a path i -> ... -> j: a cycle
                    continue
                new = parents[i] | {j}
                if not score.allowed(i, new):
                    continue
                g = score(i, new) - current[i]
                if g > best_gain:
                    best_gain, best = g, ("add", i, j)
        for i in seq:  # remove j -> i
            for j in sorted(parents[i], key=seq.index):
                g = score(i, parents[i] - {j}) - current[i]
                if g > best_gain:
                    best_gain, best = g, ("remove", i, j)
        for i in seq:  # reverse j -> i into i -> j
            for j in sorted(parents[i], key=seq.index):
                new_j = parents[j] | {i}
                if not score.allowed(j, new_j):
                    continue
                trial = list(parents)
                trial[i] = parents[i] - {j}
                if _reaches(trial, j, i):  # another path j -> ... -> i: the arc i -> j would close a cycle
                    continue
                g = score(i, trial[i]) - current[i] + score(j, new_j) - current[j]
                if g > best_gain:
                    best_gain, best = g, ("reverse", i, j)
        if best is None:
            break
        kind, i, j = best
        if kind == "add":
            parents[i] = parents[i] | {j}
        elif kind == "remove":
            parents[i] = parents[i] - {j}
        else:
            parents[i] = parents[i] - {j}
            parents[j] = parents[j] | {i}
            current[j] = score(j, parents[j])
        current[i] = score(i, parents[i])
        moves += 1
    return [tuple(sorted(p)) for p in parents]


def network_families(flat: np.ndarray, counts: np.ndarray, cards: Sequence[int], orders: int = NETWORK_ORDERS,
                     kicks: int = NETWORK_KICKS) -> list:
    """The families (a node and its parents, sorted variable positions; one per node) of the
    network :func:`hill_climb` finds on the rows given as distinct flat cell indices
    ``flat`` (C order over ``cards``) and their ``counts``: the climb of the highest BIC of
    ``orders`` climbs, the variables in their own order first, then in seeded random
    orders, each best graph so far then kicked ``kicks`` times (:data:`NETWORK_KICKS`);
    seeded (:data:`NETWORK_SEED`: a fit is repeatable); ties to the earlier."""
    cards = tuple(int(k) for k in cards)
    n = len(cards)
    rows = np.stack(np.unravel_index(np.asarray(flat, np.int64), cards), axis=1) if n else \
        np.zeros((len(flat), 0), np.int64)
    scorer = _FamilyScores(rows, counts, cards)
    rng = np.random.default_rng(NETWORK_SEED)
    best, best_score = None, -math.inf
    total = lambda pa: sum(scorer(i, frozenset(p)) for i, p in enumerate(pa))  # noqa: E731
    for k in range(max(1, int(orders))):
        order = np.arange(n) if k == 0 else rng.permutation(n)
        pa = hill_climb(rows, counts, cards, order=order, scorer=scorer)
        if total(pa) > best_score:
            best, best_score = pa, total(pa)
    for _ in range(int(kicks)):  # iterated local search: a few arcs of the best graph out, climb again
        arcs = [(j, i) for i, p in enumerate(best) for j in p]
        if not arcs:
            break
        size = min(len(arcs), max(1, int(len(arcs) * NETWORK_KICK_SHARE)))
        drop = {arcs[a] for a in rng.choice(len(arcs), size=size, replace=False)}
        start = [tuple(j for j in p if (j, i) not in drop) for i, p in enumerate(best)]
        pa = hill_climb(rows, counts, cards, order=rng.permutation(n), scorer=scorer, start=start)
        if total(pa) > best_score + 1e-9:
            best, best_score = pa, total(pa)
    return [tuple(sorted((i,) + tuple(p))) for i, p in enumerate(best)]


def network_span(fams, cards: Sequence[int]) -> np.ndarray:
    """Flat indices (sorted, without the constant) of every basis function whose variables
    lie within one of ``fams``: each family's whole table of terms."""
    cards = tuple(int(k) for k in cards)
    out = []
    for f in {tuple(sorted(f)) for f in fams}:
        if not f:
            continue
        grids = np.meshgrid(*[np.arange(cards[v]) for v in f], indexing="ij")
        digits = np.zeros((grids[0].size, len(cards)), np.int64)
        for v, g in zip(f, grids):
            digits[:, v] = g.ravel()
        digits = digits[digits.any(axis=1)]
        out.append(np.ravel_multi_index(digits.T, cards))
    if not out:
        return np.zeros(0, np.int64)
    return np.unique(np.concatenate(out)).astype(np.int64)


def network_parameters(flat: np.ndarray, counts: np.ndarray, cards: Sequence[int], fams, prior: float = 1.0) -> dict:
    """The network of ``fams`` (one family per node, as :func:`network_families` gives them) with
    each node's conditional table estimated with ``prior`` added to every cell (Laplace's
    rule for ``prior=1``), written as the log-linear model's parameters: ``{flat index:
    value}`` on :func:`network_span` of ``fams`` (the constant term left out: ``log Z`` absorbs it).
    ``log p(x) = sum_i log p(x_i | pa_i)``, each term a function of one family's variables,
    expanded in the fixed local bases (``fsll_ooc.basis``)."""
    cards = tuple(int(k) for k in cards)
    n = len(cards)
    rows = np.stack(np.unravel_index(np.asarray(flat, np.int64), cards), axis=1)
    w = np.asarray(counts, np.float64)
    inv_t = {k: np.linalg.inv(basis.local_matrix(k).T) for k in set(cards)}
    theta: dict = {}
    for node in range(n):
        fam = tuple(sorted(fams[node]))
        shape = tuple(cards[v] for v in fam)
        idx = np.ravel_multi_index(tuple(rows[:, v] for v in fam), shape) if fam else np.zeros(len(rows), np.int64)
        table = np.bincount(idx, weights=w, minlength=math.prod(shape)).reshape(shape) + float(prior)
        axis = fam.index(node)
        log_cpt = np.log(table) - np.log(table.sum(axis=axis, keepdims=True))
        coef = log_cpt
        for a, v in enumerate(fam):  # l = (M^T x ... x M^T) theta per axis: theta = (M^T)^-1 l
            coef = np.moveaxis(np.tensordot(inv_t[cards[v]], coef, axes=([1], [a])), 0, a)
        digits = np.zeros((coef.size, n), np.int64)
        grid = np.indices(shape).reshape(len(fam), -1)
        for a, v in enumerate(fam):
            digits[:, v] = grid[a]
        ys = np.ravel_multi_index(digits.T, cards)
        for y, c in zip(ys.tolist(), coef.ravel().tolist()):
            if y:
                theta[y] = theta.get(y, 0.0) + c
    return theta
