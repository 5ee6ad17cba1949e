"""Every check of what a user hands in, and the one set of limits they are checked against.

The estimator, :mod:`fsll_ooc.io`, the model file and the command line all check through
here, so a limit is stated once and every refusal names the column, row, value or
limit.  Checks run before anything large is allocated.

>>> check_cardinalities([2, 3, 4])
(2, 3, 4)
>>> validate_data([[0, 5]], cardinalities=[2, 3])
Traceback (most recent call last):
...
fsll_ooc.io.DataError: column 1 (X1): value 5 in row 0 is outside 0..2 (cardinality 3)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

__all__ = ["DataError", "MAX_CATEGORIES", "MAX_CELLS", "check_cardinalities", "check_cardinalities_param",
           "check_code_range", "validate_data", "check_labels", "check_fit_params", "check_n_samples"]

#: Largest number of categories of one variable.
MAX_CATEGORIES = 2**16
#: Largest joint table ``prod(k_i)`` accepted (8 TiB of float64 per table).
MAX_CELLS = 2**40

_INT64_MAX = 2**63 - 1


class DataError(ValueError):
    """The input cannot be used; the message says which column, row, value and limit."""


DataError.__module__ = "fsll_ooc.io"  # its public home (fsll_ooc.io.DataError)


def check_cardinalities(cardinalities: Sequence[int], names: Sequence[str] | None = None) -> tuple:
    """Validate cardinalities: ints in ``1 .. MAX_CATEGORIES``, joint table within ``MAX_CELLS``.

    Returns them as a tuple of ints.  Raises :class:`DataError` naming the variable or
    the size of the joint table.  Cheap: nothing is allocated.
    """
    ks = []
    for i, k in enumerate(cardinalities):
        name = names[i] if names is not None else f"X{i}"
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer, float, np.floating)):
            raise DataError(f"cardinality of variable '{name}' must be an integer, got {k!r}")
        if not math.isfinite(k) or k != int(k):
            raise DataError(f"cardinality of variable '{name}' must be an integer, got {k!r}")
        k = int(k)
        if k < 1:
            raise DataError(f"cardinality of variable '{name}' must be >= 1, got {k}")
        if k > MAX_CATEGORIES:
            raise DataError(f"variable '{name}' has {k} categories; "
                            f"the limit is {MAX_CATEGORIES} (2**16) categories per variable")
        ks.append(k)
    if not ks:
        raise DataError("there are no variables (0 columns)")
    cells = math.prod(ks)
    if cells > MAX_CELLS:
        extra = "; that overflows int64" if cells > _INT64_MAX else ""
        shown = str(tuple(ks)) if len(ks) <= 12 else f"of {len(ks)} variables ({', '.join(map(str, ks[:8]))}, ...)"
        exc = DataError(f"the joint table would have {cells:,} cells (product of the cardinalities "
                        f"{shown}){extra}; the limit is 2**40 = {MAX_CELLS:,} cells")
        exc.cardinalities, exc.names = tuple(ks), None if names is None else list(names)  # for advice
        raise exc
    return tuple(ks)


def check_cardinalities_param(cards) -> None:
    """``cardinalities`` must be None or a sequence of integers (no silent truncation of 2.5)."""
    if cards is None:
        return
    if isinstance(cards, (str, bytes)) or not hasattr(cards, "__len__") or not hasattr(cards, "__iter__"):
        raise DataError(f"cardinalities must be a sequence of integers (one per column), got {cards!r}")
    for i, k in enumerate(cards):
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
            if isinstance(k, (float, np.floating)) and math.isfinite(k) and float(k).is_integer():
                continue
            raise DataError(f"cardinality of column {i} (X{i}) must be an integer, got {k!r}")


def check_code_range(X, names=None):
    """Refuse codes that cannot be converted to int64 (huge uint64 or float values) before
    they wrap around silently; returns ``X`` as an array when it was array-like."""
    if hasattr(X, "columns"):
        return X
    try:
        arr = np.asarray(X)
    except (ValueError, TypeError) as e:
        raise DataError(f"X must be a rectangular 2-D array of integer codes (samples x variables): {e}") from None
    if arr.size == 0 or arr.ndim != 2 or arr.dtype.kind not in "uf":
        return arr
    with np.errstate(invalid="ignore"):
        big = (arr > np.iinfo(np.int64).max) if arr.dtype.kind == "u" else (np.abs(arr) >= 2.0**62)
    if big.any():
        r, c = map(int, np.argwhere(big)[0])
        raise DataError(f"column {c} ({_var(c, names)}): value {arr[r, c]} in row {r} is too large to be a category code "
                        f"(codes are 0..{MAX_CATEGORIES - 1} at most)")
    return arr


def validate_data(X: Any, cardinalities: Sequence[int] | None = None,
                  names: Sequence[str] | None = None) -> tuple[np.ndarray, tuple[int, ...]]:
    """Check ``X`` and return ``(codes as int64 (N, n), cardinalities)``.

    Raises :class:`DataError` (a ``ValueError``) naming the offending column (by its
    name in ``names`` when given, else ``X0, X1, ...``), row, value or limit; nothing
    large is allocated before the checks pass.

    >>> validate_data([[0, 1], [1, 2]])[1]
    (2, 3)
    """
    if hasattr(X, "to_numpy") and hasattr(X, "columns"):
        from .io import encode  # DataFrames: categories become codes

        enc = encode(X, cardinalities)
        X = enc.codes
        if cardinalities is None:
            cardinalities = enc.cardinalities
    arr = np.asarray(X)
    if arr.ndim != 2:
        raise DataError(f"X must be a 2-D array (samples x variables), got {arr.ndim}-D with shape {arr.shape}")
    if arr.shape[0] == 0:
        raise DataError("X has no samples (0 rows)")
    if arr.shape[1] == 0:
        raise DataError("X has no variables (0 columns)")
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    check_code_range(arr, names)  # before any cast to int64 can wrap a huge code onto another cell
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            r, c = map(int, np.argwhere(bad)[0])
            raise DataError(f"column {c} ({_var(c, names)}): value {arr[r, c]} in row {r} is not a finite number")
        frac = arr != np.round(arr)
        if frac.any():
            r, c = map(int, np.argwhere(frac)[0])
            raise DataError(f"column {c} ({_var(c, names)}): value {arr[r, c]} in row {r} is not an integer category code")
    elif arr.dtype.kind not in "iu":
        raise DataError(f"X must hold integer category codes, got dtype {arr.dtype}; "
                        "encode strings first (fsll_ooc.io.encode or pass a pandas DataFrame)")
    if (arr < 0).any():
        r, c = map(int, np.argwhere(arr < 0)[0])
        raise DataError(f"column {c} ({_var(c, names)}): value {arr[r, c]} in row {r} is negative; codes are 0..k-1")
    arr = arr.astype(np.int64)
    n = arr.shape[1]
    if cardinalities is None:
        cards = check_cardinalities([int(v) + 1 for v in arr.max(axis=0)])
    else:
        check_cardinalities_param(cardinalities)
        if len(cardinalities) != n:
            raise DataError(f"cardinalities has {len(cardinalities)} entries but X has {n} columns")
        cards = check_cardinalities(cardinalities)
        over = arr >= np.array(cards)
        if over.any():
            r, c = map(int, np.argwhere(over)[0])
            raise DataError(f"column {c} ({_var(c, names)}): value {arr[r, c]} in row {r} is outside 0..{cards[c] - 1} "
                            f"(cardinality {cards[c]})")
    return arr, cards



def _var(c: int, names) -> str:
    """How a message names column ``c``: its name in ``names``, else ``X{c}``."""
    return repr(str(names[c])) if names is not None and c < len(names) else f"X{c}"

def check_labels(names, categories, cards) -> tuple[list | None, list | None]:
    """Column names (one per variable) and category labels (``k_i`` per variable), as lists."""
    n = len(cards)
    if names is not None:
        if isinstance(names, (str, bytes)) or not hasattr(names, "__len__"):
            raise DataError(f"names must be a list of {n} strings, got {names!r}")
        if len(names) != n:
            raise DataError(f"{len(names)} names for {n} variables")
    if categories is not None:
        if isinstance(categories, (str, bytes)) or not hasattr(categories, "__len__"):
            raise DataError(f"categories must be a list of {n} lists, got {categories!r}")
        if len(categories) != n:
            raise DataError(f"{len(categories)} category lists for {n} variables")
        for i, (cat, k) in enumerate(zip(categories, cards)):
            if isinstance(cat, (str, bytes)) or not hasattr(cat, "__len__") or len(cat) != k:
                raise DataError(f"variable {i} has cardinality {k} but {len(cat) if hasattr(cat, '__len__') else cat!r}"
                                " category labels")
    return (list(names) if names is not None else None,
            [list(c) for c in categories] if categories is not None else None)


def check_fit_params(epsilon, max_iter, resync_every) -> None:
    """The estimator's learning parameters (``refine`` is checked by the learner)."""
    if not (epsilon == "auto" if isinstance(epsilon, str) else (
            isinstance(epsilon, (int, float)) and epsilon > 0
            and math.isfinite(epsilon))):
        raise DataError(f"epsilon must be a positive number or 'auto', got {epsilon!r}")
    if max_iter is not None and (not isinstance(max_iter, (int, np.integer)) or max_iter < 0):
        raise DataError(f"max_iter must be a non-negative int or None, got {max_iter!r}")
    if not (isinstance(resync_every, (int, np.integer)) and resync_every >= 1):
        raise DataError(f"resync_every must be a positive int, got {resync_every!r}")


def check_n_samples(n_samples, n_vars: int, memory: int | None) -> None:
    """``n_samples`` to draw: a non-negative int whose result fits in half of ``memory``."""
    if not isinstance(n_samples, (int, np.integer)) or n_samples < 0:
        raise DataError(f"n_samples must be a non-negative int, got {n_samples!r}")
    need = 16 * int(n_samples) * (1 + n_vars)
    if memory is not None and need > memory // 2:
        raise DataError(f"{n_samples:,} samples need about {need / 2**30:.1f} GiB, more than half of this "
                        f"machine's {memory / 2**30:.1f} GiB; draw them in smaller batches")
