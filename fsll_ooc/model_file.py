"""The model file: one versioned JSON document per fitted model (``docs/model-format.md``).

:func:`save` writes it atomically; :func:`load` reads it and trusts nothing in it: the
format and version, the cardinalities (the limits of :mod:`fsll_ooc.validation`), every
parameter index, the numbers, the history and the labels are checked, and any problem
is one ``ValueError`` naming the file.

To add a field: write it in :func:`save`, read and check it in :func:`load` (a file
written by an older version lacks it: give it a default), carry it in
:class:`ModelFile`, and describe it in ``docs/model-format.md``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import storage
from .cost import checked_further_price, checked_penalty_scale, checked_smoothing
from .validation import MAX_CATEGORIES, MAX_CELLS, MAX_MODEL_BYTES, DataError, check_input_file, check_labels
from .learn import FitState, LearnOptions

__all__ = ["json_or_none", "plain_value", "params_from_json", "MODEL_FORMAT", "MODEL_VERSION", "AVERAGE_FORMAT", "AVERAGE_VERSION", "ModelFile", "AverageFile",
           "save", "load", "save_average", "load_average", "is_average", "category_order", "em_summary",
           "set_em_summary", "checked_category_order", "checked_em", "check_stored", "check_state", "check_log_z",
           "log_partition", "CHECK_LOG_Z_CELLS"]

MODEL_FORMAT = "fsll-ooc-model"
MODEL_VERSION = 1
#: The file of an average of models (:class:`fsll_ooc.FSLLAverage`): its members' model documents.
AVERAGE_FORMAT = "fsll-ooc-average"
AVERAGE_VERSION = 1
#: Largest table whose log Z :func:`load` recomputes from the parameters.  The table is
#: that of the variables joined by terms, one group at a time (variables in no term add
#: ``log k`` each; see :func:`log_partition`); a file needing a larger one is refused
#: (a model's ``log_z`` is never believed unchecked).  ``docs/reliability.md`` gives the cost.
CHECK_LOG_Z_CELLS = 2**32
#: Cells :func:`log_partition` transforms at once (its memory: a few arrays of this many floats).
LOG_Z_BLOCK_CELLS = 2**22


@dataclass
class ModelFile:
    """What a model file holds: the fitted state and what the estimator reports with it."""

    state: FitState
    params: dict
    cost: float | None = None
    kl_data: float | None = None
    feature_names: list | None = None
    categories: list | None = None  # in the basis order (what theta's indices refer to)
    #: Per variable the basis code of each code shown to the user (None: the same), or None
    #: when every variable is shown in the basis order (``FSLL(category_order=...)``).
    category_order: list | None = None
    #: An EM fit's summary (missing cells, hidden variables): ``rounds``, ``converged``,
    #: ``loglik`` (observed-data log-likelihood per row), ``objective``; None otherwise.
    em: dict | None = None


def jsonable_categories(categories) -> list | None:
    """Category labels as plain JSON values (numpy scalars become Python ones)."""
    if categories is None:
        return None
    return [[c.item() if hasattr(c, "item") else c for c in cat] for cat in categories]


@dataclass
class AverageFile:
    """What an average's file holds: the members' models and the average's own fields."""

    members: list
    params: dict
    n_samples: int
    feature_names: list | None = None
    categories: list | None = None


def save(path, model: ModelFile) -> None:
    """Write ``model`` to ``path`` atomically (a temporary file renamed into place)."""
    storage.write_bytes_atomic(path, _text(_document(model)).encode())


def _document(model: ModelFile) -> dict:
    """The JSON object of one model."""
    st = model.state
    return {
        "format": MODEL_FORMAT, "version": MODEL_VERSION,
        "cardinalities": list(st.cards),
        "theta": [[list(map(int, st.digits(y))), float(v)] for y, v in sorted(st.theta.items())],
        "log_z": st.log_z, "n_samples": st.n_samples, "n_iter": st.n_iter, "cost": model.cost,
        "kl_data": model.kl_data, "converged": bool(st.converged), "penalty_scale": st.penalty_scale,
        **({} if st.further_price == "full" else {"further_price": st.further_price}),
        **({} if st.smoothing == 1.0 else {"smoothing": st.smoothing}),
        "history": st.history,
        "params": model.params,
        "feature_names": model.feature_names,
        "categories": jsonable_categories(model.categories),
        **({} if model.em is None else {"em": model.em}),
        **({} if model.category_order is None else
           {"category_order": [None if t is None else [int(v) for v in t] for t in model.category_order]}),
    }


def save_average(path, members: list, params: dict, n_samples: int, feature_names=None, categories=None) -> None:
    """Write an average of ``members`` (:class:`ModelFile` each, without labels: the
    average keeps them once) to ``path`` atomically."""
    docs = [_document(m) for m in members]
    obj = {"format": AVERAGE_FORMAT, "version": AVERAGE_VERSION, "n_members": len(docs), "n_samples": int(n_samples),
           "params": params, "feature_names": feature_names, "categories": jsonable_categories(categories)}
    head = _text(obj)[:-3]  # without the closing "\n}\n"
    inner = ",\n".join(_text(d).rstrip("\n") for d in docs)
    storage.write_bytes_atomic(path, (head + ',\n "members": [\n' + inner + "\n ]\n}\n").encode())


def _read_json(path):
    """The JSON object of a model or average file (size and encoding checked)."""
    try:
        check_input_file(path, "model file", MAX_MODEL_BYTES,
                         f"the {MAX_MODEL_BYTES / 2**20:.0f} MiB limit of a model file "
                         "(fsll_ooc.model_file.MAX_MODEL_BYTES; a term takes about 100 bytes)")
    except DataError as e:
        raise ValueError(str(e)) from None
    try:
        with open(path, "rb") as fh:
            obj = json.loads(fh.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not an fsll-ooc model file (invalid JSON: {e})") from None
    except RecursionError:
        raise ValueError(f"{path}: not an fsll-ooc model file (JSON nested too deeply; a model file "
                         "nests four levels, an average's five)") from None
    return obj


def _check_version(path, obj, what: str, newest: int) -> None:
    version = obj.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= newest:
        if isinstance(version, int) and not isinstance(version, bool) and version > newest:
            raise ValueError(f"{path}: {what} version {version!r} is newer than this fsll-ooc "
                             f"understands (<= {newest}); upgrade fsll-ooc")
        raise ValueError(f"{path}: {what} version {version!r} is not a version (an integer 1..{newest})")


def is_average(path) -> bool:
    """Whether the file at ``path`` is an average's file (format ``fsll-ooc-average``) rather
    than a single model's; the file is checked as :func:`load` checks it (``ValueError``)."""
    obj = _read_json(path)
    return isinstance(obj, dict) and obj.get("format") == AVERAGE_FORMAT


def load(path) -> ModelFile:
    """Read and check a model file; unknown formats, newer versions and damage raise ``ValueError``."""
    obj = _read_json(path)
    if isinstance(obj, dict) and obj.get("format") == AVERAGE_FORMAT:
        raise ValueError(f"{path}: holds an average of {obj.get('n_members')!r} models (format "
                         f"{AVERAGE_FORMAT!r}); read it with fsll_ooc.FSLLAverage.load")
    if not isinstance(obj, dict) or obj.get("format") != MODEL_FORMAT:
        raise ValueError(f"{path}: not an fsll-ooc model file (format field is "
                         f"{obj.get('format') if isinstance(obj, dict) else None!r})")
    _check_version(path, obj, "model file", MODEL_VERSION)
    return _parse(path, obj)


def load_average(path) -> AverageFile:
    """Read and check an average's file (every member as :func:`load` checks a model)."""
    obj = _read_json(path)
    if isinstance(obj, dict) and obj.get("format") == MODEL_FORMAT:
        raise ValueError(f"{path}: holds a single model (format {MODEL_FORMAT!r}); read it with fsll_ooc.FSLL.load")
    if not isinstance(obj, dict) or obj.get("format") != AVERAGE_FORMAT:
        raise ValueError(f"{path}: not an fsll-ooc average file (format field is "
                         f"{obj.get('format') if isinstance(obj, dict) else None!r})")
    _check_version(path, obj, "average file", AVERAGE_VERSION)
    docs = obj.get("members")
    if not isinstance(docs, list) or len(docs) < 2 or obj.get("n_members") != len(docs):
        raise ValueError(f"{path}: malformed fsll-ooc average file (members must be a list of at least 2 models, "
                         f"as many as n_members {obj.get('n_members')!r})")
    members = []
    for k, d in enumerate(docs):
        if not isinstance(d, dict) or d.get("format") != MODEL_FORMAT:
            raise ValueError(f"{path}: malformed fsll-ooc average file (member {k} is not a model)")
        _check_version(f"{path} (member {k})", d, "model", MODEL_VERSION)
        members.append(_parse(f"{path} (member {k})", d))
    cards = {m.state.cards for m in members}
    if len(cards) != 1:
        raise ValueError(f"{path}: malformed fsll-ooc average file (members of different cardinalities)")
    params = obj.get("params", {})
    n = obj.get("n_samples")
    if not isinstance(params, dict) or set(params) - {"n_members", "random_state"} \
            or isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{path}: malformed fsll-ooc average file (params must hold only n_members and "
                         f"random_state, n_samples a positive int)")
    try:
        names, categories = check_labels(obj.get("feature_names"), obj.get("categories"), members[0].state.cards)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed fsll-ooc average file (labels: {e})") from None
    return AverageFile(members, params, n, names, categories)


def _parse(path, obj: dict) -> ModelFile:
    """The checked :class:`ModelFile` of one model's JSON object."""
    try:
        params = obj.get("params", {})
        if not isinstance(params, dict):
            raise TypeError(f"params must be an object, got {params!r}")
        cards = _checked_cards(obj["cardinalities"])
        flat = []
        for entry in _pairs(obj["theta"], "theta"):
            y = entry[0]
            if not isinstance(y, list) or len(y) != len(cards) or any(
                    not _is_int(v) or not 0 <= v < k for v, k in zip(y, cards)):
                raise ValueError(f"parameter index {str(y)[:80]} does not fit cardinalities {cards}")
            flat.append([int(np.ravel_multi_index(tuple(y), cards)), entry[1]])
        state = FitState(cards, _count(obj["n_samples"]), 0.0, _checked_theta(cards, flat), {},
                         _number(obj["log_z"], "log_z"), _count(obj["n_iter"], 0, "n_iter"),
                         bool(obj.get("converged", True)), checked_history(obj.get("history", [])),
                         penalty_scale=checked_penalty_scale(obj.get("penalty_scale", 1.0)),
                         further_price=checked_further_price(obj.get("further_price", "full")),
                         smoothing=checked_smoothing(obj.get("smoothing", 1.0)))
        check_log_z(cards, state.theta, state.log_z)
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"{path}: malformed fsll-ooc model file ({type(e).__name__}: {e})") from None
    try:
        names, categories = check_labels(obj.get("feature_names"), obj.get("categories"), cards)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed fsll-ooc model file (labels: {e})") from None
    try:
        order = checked_category_order(obj.get("category_order"), cards)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed fsll-ooc model file (category_order: {e})") from None
    try:
        em = checked_em(obj.get("em"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed fsll-ooc model file (em: {e})") from None
    return ModelFile(state, params, obj.get("cost"), obj.get("kl_data"), names, categories, order, em)


def checked_em(em) -> dict | None:
    """A file's ``em`` summary: None, or ``rounds`` (int >= 0), ``converged`` (bool), ``loglik``
    and ``objective`` (numbers or null)."""
    if em is None:
        return None
    if not isinstance(em, dict):
        raise TypeError(f"must be an object, got {str(em)[:80]}")
    rounds, conv = em.get("rounds"), em.get("converged")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0 or not isinstance(conv, bool):
        raise ValueError("rounds must be an integer >= 0 and converged a boolean")
    out = {"rounds": rounds, "converged": conv}
    for k in ("loglik", "objective"):
        v = em.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise ValueError(f"{k} must be a finite number or null")
        out[k] = None if v is None else float(v)
    return out


def checked_category_order(order, cards) -> list | None:
    """A file's ``category_order``: None, or per variable None or a permutation of ``0 .. k-1``."""
    if order is None:
        return None
    if not isinstance(order, list) or len(order) != len(cards):
        raise ValueError(f"must be a list of {len(cards)} entries")
    for t, k in zip(order, cards):
        if t is not None and (not isinstance(t, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in t)
                              or sorted(t) != list(range(k))):
            raise ValueError(f"each entry must be null or a permutation of 0..k-1, got {str(t)[:80]}")
    return order


def check_stored(fs, stored) -> None:
    """Raise :class:`~fsll_ooc.storage.IntegrityError` naming the state file of store ``fs``
    unless the fit state ``stored`` (:meth:`fsll_ooc.storage.fit_store.FitStore.read`) and its
    labels describe a model :func:`load` would accept: cardinalities within the limits;
    every parameter index a cell of the table other than the all-zero one, given once, with
    a finite value and a finite target in [-1, 1]; ``n_samples >= 1``; ``log_z`` equal to
    the parameters' log Z (recomputed, :func:`check_log_z`); a history of numbers; labels
    that fit.  A store's state is checksummed, but whoever can write the store can write a
    new checksum: nothing in it is believed unchecked."""
    try:
        check_state(stored.state, stored.feature_names, stored.categories, complete=stored.status == "complete")
    except ValueError as e:
        with fs.damage_hint():
            raise storage.IntegrityError(fs.state_file, f"the stored model cannot be trusted ({e})") from None


def check_state(state: Any, feature_names=None, categories=None, complete: bool = True) -> None:
    """``ValueError`` unless ``state`` (the dict of :meth:`fsll_ooc.learn.FitState.to_json`) and
    the labels pass the checks of :func:`check_stored` (a target for every parameter: only
    in a ``complete`` state; a fit in progress may hold parameters whose targets it has yet
    to read, as EM does)."""
    try:
        if not isinstance(state, dict):
            raise TypeError(f"the fit state must be an object, got {type(state).__name__}")
        cards = _checked_cards(state["cards"])
        theta = _checked_theta(cards, state["theta"])
        dbar = {}
        for y, v in _pairs(state["dbar"], "dbar"):
            if not _is_int(y) or not 0 < y < math.prod(cards) or y in dbar:
                raise ValueError(f"target index {str(y)[:40]} is not a cell of the table given once")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(v) <= 1 + 1e-9:
                raise ValueError(f"the target of cell {y} is {v!r}, not a number in [-1, 1]")
            dbar[y] = v
        missing = [y for y in theta if y not in dbar] if complete else []
        if missing:
            raise ValueError(f"parameter {missing[0]} has no target")
        _count(state["n_samples"])
        _count(state["n_iter"], 0, "n_iter")
        _number(state["entropy_q"], "entropy_q")
        checked_history(state.get("history", []))
        checked_penalty_scale(state.get("penalty_scale", 1.0))
        checked_further_price(state.get("further_price", "full"))
        checked_smoothing(state.get("smoothing", 1.0))
        check_log_z(cards, theta, _number(state["log_z"], "log_z"))
        check_labels(feature_names, categories, cards)
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"missing field {e}" if isinstance(e, KeyError) else str(e)) from None


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _count(v, least: int = 1, what: str = "n_samples") -> int:
    if not _is_int(v) or v < least:
        raise ValueError(f"{what} must be an integer >= {least}, got {v!r}")
    return int(v)


def _number(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{what} must be a finite number, got {v!r}")
    return float(v)


def _pairs(entries, what: str) -> list:
    if not isinstance(entries, list) or not all(isinstance(e, list) and len(e) == 2 for e in entries):
        raise ValueError(f"{what} must be a list of [index, value] pairs")
    return entries


def _checked_cards(raw) -> tuple:
    if not isinstance(raw, list) or not all(_is_int(k) for k in raw):
        raise ValueError(f"cardinalities must be a list of integers, got {str(raw)[:80]}")
    cards = tuple(int(k) for k in raw)
    check_cards(cards)
    return cards


def _checked_theta(cards: tuple, pairs) -> dict:
    """``{flat index: value}`` of ``[flat index, value]`` pairs: each index a cell other than
    the all-zero one, given once, each value finite."""
    size = math.prod(cards)
    theta: dict = {}
    for y, v in _pairs(pairs, "theta"):
        if not _is_int(y) or not 0 <= y < size:
            raise ValueError(f"parameter index {str(y)[:40]} is not a cell of the table of {size:,} cells")
        if y == 0:
            raise ValueError("a parameter at the all-zero index (that is log_z's place, not a basis)")
        if y in theta:
            raise ValueError(f"parameter index {tuple(np.unravel_index(y, cards))} appears twice")
        theta[int(y)] = _number(v, "a parameter")
    return theta


def check_log_z(cards: tuple, theta: dict, log_z: float) -> None:
    """``ValueError`` unless ``log_z`` is the log Z of parameters ``theta`` (``{flat index:
    value}``), recomputed exactly (:func:`log_partition`; relative and absolute tolerance
    ``1e-7``); a model whose variables joined by terms span more than
    :data:`CHECK_LOG_Z_CELLS` cells is refused."""
    bound = math.log(math.prod(cards)) + sum(abs(v) for v in theta.values())
    if abs(log_z) > bound * (1 + 1e-9) + 1e-9:  # |log Z| <= log|X| + sum |theta|
        raise ValueError(f"log_z {log_z!r} is impossible for these parameters (|log_z| <= {bound:.6g})")
    exact = log_partition(cards, theta)
    if not math.isclose(exact, log_z, rel_tol=1e-7, abs_tol=1e-7):
        raise ValueError(f"log_z {log_z!r} does not match the parameters (their log Z is {exact!r})")


def log_partition(cards: tuple, theta: dict, block_cells: int = LOG_Z_BLOCK_CELLS) -> float:
    """``log Z = log sum_x exp(sum_y theta_y Phi_y(x))`` of parameters ``theta`` (``{flat
    index: value}``), exactly, in memory bounded by ``block_cells`` cells.

    The log-linear table factors over the groups of variables that terms join (``Phi_y``
    is a product over the variables where ``y`` is not zero): ``log Z`` is the sum of each
    group's log Z, plus ``log k`` for each variable in no term.  A group's table is the
    transposed transform of its parameters (``docs/design.md``); a group larger than
    ``block_cells`` is done one block of its leading variables' values at a time (the
    trailing variables' parameters, weighted by the leading ones' basis values, then
    transformed).  Raises ``ValueError`` for a group of more than :data:`CHECK_LOG_Z_CELLS`
    cells (``O(cells * sum log k)`` operations: ``docs/reliability.md``).
    """
    cards = tuple(int(k) for k in cards)
    if not theta:
        return float(sum(math.log(k) for k in cards))
    digits = np.stack(np.unravel_index(np.fromiter(theta.keys(), np.int64, len(theta)), cards), axis=1)
    values = np.fromiter(theta.values(), float, len(theta))
    parent = list(range(len(cards)))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = a = parent[parent[a]]
        return a

    for row in digits:
        on = np.flatnonzero(row)
        for v in on[1:]:
            parent[root(int(v))] = root(int(on[0]))
    used = digits.any(axis=0)
    total = math.fsum(math.log(k) for k, u in zip(cards, used) if not u)
    group_of_term = np.array([root(int(np.flatnonzero(row)[0])) for row in digits])
    groups: dict = {}
    for i in np.flatnonzero(used):
        groups.setdefault(root(int(i)), []).append(int(i))
    for g, members in groups.items():
        sub = tuple(cards[i] for i in members)
        if math.prod(sub) > CHECK_LOG_Z_CELLS:
            raise ValueError(f"the model's log Z needs a table of {math.prod(sub):,} cells ({len(members)} variables "
                             f"joined by terms); the limit of the check is {CHECK_LOG_Z_CELLS:,} cells "
                             "(fsll_ooc.model_file.CHECK_LOG_Z_CELLS)")
        mine = group_of_term == g
        total += _group_log_z(sub, digits[mine][:, members], values[mine], block_cells)
    return float(total)


def _group_log_z(cards: tuple, digits: np.ndarray, values: np.ndarray, block_cells: int) -> float:
    """log Z of one group of variables (see :func:`log_partition`)."""
    from .basis import phi_values, transform

    split, cells = len(cards), 1
    while split > 0 and cells * cards[split - 1] <= block_cells:
        split -= 1
        cells *= cards[split]
    split = min(split, len(cards) - 1)  # at least the last variable is inside a block
    inner = cards[split:]
    at = np.ravel_multi_index(tuple(digits[:, split:].T), inner)
    # basis values of the leading variables: per variable, (terms, k) rows phi_{y_i}(x_i)
    lead = [np.stack([phi_values(k, int(y), np.arange(k)) for y in digits[:, a]]) for a, k in enumerate(cards[:split])]
    top, acc = -math.inf, 0.0
    for x in np.ndindex(*cards[:split]):
        w = values.copy()
        for a, xa in enumerate(x):
            w *= lead[a][:, xa]
        block = np.bincount(at, weights=w, minlength=math.prod(inner)).reshape(inner)
        log_p = transform(block, transpose=True)
        m = float(log_p.max())
        if m > top:
            acc = acc * math.exp(top - m) if acc else 0.0
            top = m
        acc += float(np.exp(log_p - top).sum())
    return top + math.log(acc)


def check_cards(cards) -> None:
    """Cardinalities read from a file obey the limits of ``fit`` (a file is not trusted)."""
    if not cards or any(not 1 <= k <= MAX_CATEGORIES for k in cards):
        raise ValueError(f"cardinalities {list(cards)[:8]} must be 1..{MAX_CATEGORIES}, at least one")
    if math.prod(cards) > MAX_CELLS:
        raise ValueError(f"the joint table would have {math.prod(cards):.3e} cells; the limit is 2**40")


def checked_history(history: Any) -> list:
    """A file's history: a list of dicts whose numbers are numbers (queries and plots use them)."""
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise ValueError("history must be a list of objects")
    for h in history:
        for k in ("iter", "cost", "delta", "value", "n_bases"):
            if h.get(k) is not None and (isinstance(h[k], bool) or not isinstance(h[k], (int, float))):
                raise ValueError(f"history entry field {k!r} is {h[k]!r}, not a number")
        for k in ("y", "added"):
            if h.get(k) is not None:
                np.asarray(h[k], dtype=np.int64)  # ValueError/TypeError/OverflowError when not integers
    from .queries import term_contributions

    term_contributions(history)
    return history


def _text(obj: dict) -> str:
    """The file's JSON: one line per field, and one per term, history entry or variable's
    categories (a term's index on one line, not one line per digit)."""
    lines = []
    for k, v in obj.items():
        if isinstance(v, list) and v and k in ("theta", "history", "categories"):
            inner = ",\n  ".join(json.dumps(e, separators=(",", ":"), allow_nan=True) for e in v)
            lines.append(f" {json.dumps(k)}: [\n  {inner}\n ]")
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(v, allow_nan=True)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def json_or_none(obj):
    """``obj`` if JSON can write it, else ``None`` (labels a store keeps only when they are JSON)."""
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        return None


def plain_value(v):
    """A parameter value as plain JSON (numpy scalars and arrays, tuples)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, LearnOptions):
        return v.to_json()
    if isinstance(v, (np.ndarray, tuple, list)):
        return [plain_value(x) for x in v]
    return v


def params_from_json(params: dict) -> dict:
    """Parameters read from a file: ``learn_options`` back to a :class:`LearnOptions`."""
    lo = params.get("learn_options")
    return {**params, "learn_options": LearnOptions.from_json(lo)} if isinstance(lo, dict) else params


def category_order(basis_order) -> list | None:
    """A model's ``basis_order_`` as the file's ``category_order`` (per variable the basis code
    of each shown code; ``None`` where the orders agree, ``None`` when they all do)."""
    out = [None if np.array_equal(o, np.arange(len(o))) else np.argsort(o).tolist() for o in basis_order]
    return None if all(t is None for t in out) else out


def em_summary(est) -> dict | None:
    """The file's ``em`` summary of an EM fit (None for a fit of complete data)."""
    if not hasattr(est, "em_rounds_"):
        return None

    def finite(v):
        return float(v) if v is not None and math.isfinite(v) else None

    return {"rounds": int(est.em_rounds_), "converged": bool(est.em_converged_),
            "loglik": finite(est.em_loglik_), "objective": finite(est.em_objective_)}


def set_em_summary(est, em: dict | None) -> None:
    """The EM attributes of a model read from a file with an ``em`` summary."""
    if em is None:
        return
    nan = float("nan")
    est.em_rounds_, est.em_converged_ = em["rounds"], em["converged"]
    est.em_loglik_ = nan if em["loglik"] is None else em["loglik"]
    est.em_objective_ = nan if em["objective"] is None else em["objective"]
    est.em_history_, est.n_hidden_ = [], len(getattr(est, "hidden", None) or ())
