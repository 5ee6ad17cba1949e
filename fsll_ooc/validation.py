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

import errno
import math
import os
import stat
from typing import Any, Callable, Mapping, Sequence

import numpy as np

__all__ = ["DataError", "MAX_CATEGORIES", "MAX_CELLS", "MAX_VARIABLES", "MAX_LINE_CHARS", "MAX_MODEL_BYTES",
           "check_cardinalities", "check_cardinalities_param", "check_code_range", "validate_data",
           "check_labels", "check_label_values", "validate_params", "check_epsilon", "check_max_iter",
           "check_resync_every", "check_missing", "check_hidden", "check_n_restarts", "check_random_state",
           "check_em_max_rounds", "check_em_tol", "check_n_samples", "check_input_file",
           "check_memory_limit", "check_store_path", "read_only_fs"]

#: Largest number of categories of one variable.
MAX_CATEGORIES = 2**16
#: Largest joint table ``prod(k_i)`` accepted (8 TiB of float64 per table).
MAX_CELLS = 2**40
#: Largest number of variables (columns).  At most 40 of them can have two or more
#: categories within ``MAX_CELLS``; the rest are constant, so a wider table is not data
#: for this model and is refused before it is read.
MAX_VARIABLES = 10_000
#: Longest line of a text data file, in characters (10,000 columns of 400-character labels).
MAX_LINE_CHARS = 2**22
#: Largest model file read, in bytes (a term takes about 100 bytes: millions of terms fit).
MAX_MODEL_BYTES = 2**28

_INT64_MAX = 2**63 - 1


class DataError(ValueError):
    """The input cannot be used; the message says which column, row, value and limit."""


DataError.__module__ = "fsll_ooc.io"  # its public home (fsll_ooc.io.DataError)


def check_cardinalities(cardinalities: Sequence[int], names: Sequence[str] | None = None) -> tuple:
    """Validate cardinalities: ints in ``1 .. MAX_CATEGORIES``, joint table within ``MAX_CELLS``.

    Returns them as a tuple of ints.  Raises :class:`DataError` naming the variable or
    the size of the joint table.  Cheap: nothing is allocated.
    """
    cardinalities = list(cardinalities)
    if len(cardinalities) > MAX_VARIABLES:
        raise DataError(f"{len(cardinalities):,} variables; the limit is {MAX_VARIABLES:,} variables "
                        f"(at most 40 of them can have two or more categories within the {MAX_CELLS:,}-cell "
                        "limit): select the columns to model first")
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
    log2_cells = sum(math.log2(k) for k in ks)
    if log2_cells > 41 or math.prod(ks) > MAX_CELLS:
        extra = "; that overflows int64" if log2_cells >= 63 else ""
        shown = str(tuple(ks)) if len(ks) <= 12 else f"of {len(ks)} variables ({', '.join(map(str, ks[:8]))}, ...)"
        exc = DataError(f"the joint table would have {format_count(ks)} cells (product of the cardinalities "
                        f"{shown}){extra}; the limit is 2**40 = {MAX_CELLS:,} cells")
        exc.cardinalities, exc.names = tuple(ks), None if names is None else list(names)  # for advice
        raise exc
    return tuple(ks)


def format_count(cards: Sequence[int]) -> str:
    """The number of cells ``prod(cards)``, exact below 2**128 and as a power of two beyond.

    >>> format_count([10, 10]), format_count([2] * 200)
    ('100', 'about 2^200.0')
    """
    log2 = sum(math.log2(k) for k in cards)
    return f"{math.prod(cards):,}" if log2 < 128 else f"about 2^{log2:.1f}"


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
    """Check the codes ``X`` and return ``(codes as int64 (N, n), cardinalities)``.

    ``X`` holds category codes (a DataFrame of labels goes through
    :func:`fsll_ooc.io.validate_data`, which encodes it first).

    Raises :class:`DataError` (a ``ValueError``) naming the offending column (by its
    name in ``names`` when given, else ``X0, X1, ...``), row, value or limit; nothing
    large is allocated before the checks pass.

    >>> validate_data([[0, 1], [1, 2]])[1]
    (2, 3)
    """
    if hasattr(X, "to_numpy") and hasattr(X, "columns"):
        raise DataError("X is a DataFrame: encode its labels first (fsll_ooc.io.validate_data checks a DataFrame, "
                        "fsll_ooc.io.encode gives its codes)")
    arr = np.asarray(X)
    if arr.ndim != 2:
        raise DataError(f"X must be a 2-D array (samples x variables), got {arr.ndim}-D with shape {arr.shape}")
    if arr.shape[0] == 0:
        raise DataError("X has no samples (0 rows)")
    if arr.shape[1] == 0:
        raise DataError("X has no variables (0 columns)")
    if arr.shape[1] > MAX_VARIABLES:
        raise DataError(f"X has {arr.shape[1]:,} columns; the limit is {MAX_VARIABLES:,} variables")
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
        names = list(names)
        for i, nm in enumerate(names):
            if not isinstance(nm, str):
                raise DataError(f"the name of variable {i} must be a string, got {_short(nm)}")
        if len(set(names)) != n:
            dup = next(nm for i, nm in enumerate(names) if nm in names[:i])
            raise DataError(f"the name {dup!r} is given to more than one variable; names must be unique")
    if categories is not None:
        if isinstance(categories, (str, bytes)) or not hasattr(categories, "__len__"):
            raise DataError(f"categories must be a list of {n} lists, got {categories!r}")
        if len(categories) != n:
            raise DataError(f"{len(categories)} category lists for {n} variables")
        for i, (cat, k) in enumerate(zip(categories, cards)):
            if isinstance(cat, (str, bytes)) or not hasattr(cat, "__len__") or len(cat) != k:
                raise DataError(f"variable {i} has cardinality {k} but {len(cat) if hasattr(cat, '__len__') else cat!r}"
                                " category labels")
            name = names[i] if names is not None else f"X{i}"
            check_label_values(name, cat)
            seen: set = set()
            for c in cat:
                if c in seen:
                    dup = c
                    raise DataError(f"variable '{name}': the label {dup!r} appears more than once among its "
                                f"{k} categories; labels must be distinct (1, 1.0 and True count as one)")
                seen.add(c)
    return (list(names) if names is not None else None,
            [list(c) for c in categories] if categories is not None else None)


def validate_params(params: Mapping[str, Any], constraints: Mapping[str, Callable[[Any, Mapping], Any]]) -> None:
    """Check every parameter that ``constraints`` declares, in the declared order.

    ``constraints`` maps a parameter's name to ``check(value, params)``, which raises a
    ``ValueError`` naming the parameter (``params`` is there for checks that depend on
    another parameter, such as the penalty on ``epsilon``).  An estimator declares its
    constraints once (``FSLL._parameter_constraints``) and checks them all here.

    >>> validate_params({"max_iter": -1}, {"max_iter": lambda v, p: check_max_iter(v)})
    Traceback (most recent call last):
    ...
    fsll_ooc.io.DataError: max_iter must be a non-negative int or None, got -1
    """
    for name, check in constraints.items():
        check(params[name], params)


def check_epsilon(epsilon) -> None:
    """``epsilon``: a positive finite number or ``"auto"``."""
    if not (epsilon == "auto" if isinstance(epsilon, str) else (
            isinstance(epsilon, (int, float)) and epsilon > 0
            and math.isfinite(epsilon))):
        raise DataError(f"epsilon must be a positive number or 'auto', got {epsilon!r}")


def check_max_iter(max_iter) -> None:
    """``max_iter``: a non-negative int or None."""
    if max_iter is not None and (not isinstance(max_iter, (int, np.integer)) or max_iter < 0):
        raise DataError(f"max_iter must be a non-negative int or None, got {max_iter!r}")


def check_resync_every(resync_every) -> None:
    """``resync_every``: a positive int."""
    if not (isinstance(resync_every, (int, np.integer)) and resync_every >= 1):
        raise DataError(f"resync_every must be a positive int, got {resync_every!r}")


def _is_int(v) -> bool:
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, np.integer))


def check_missing(missing) -> None:
    """``missing``: None or ``"em"``."""
    if missing not in (None, "em"):
        raise ValueError(f"missing must be None or 'em', got {missing!r}")


def check_hidden(hidden) -> None:
    """``hidden``: None or a sequence of cardinalities, each an int >= 2 or ``"auto"`` (at most one)."""
    if hidden is not None:
        if isinstance(hidden, (str, bytes)) or not hasattr(hidden, "__iter__"):
            raise ValueError(f"hidden must be a sequence of cardinalities, e.g. [3], got {hidden!r}")
        for k in hidden:
            if not (isinstance(k, str) and k == "auto") and (not _is_int(k) or k < 2):
                raise ValueError(f"hidden cardinalities must be integers >= 2 or 'auto', got {k!r} in {list(hidden)!r}")
        if sum(isinstance(k, str) for k in hidden) > 1:
            raise ValueError(f"at most one hidden cardinality can be 'auto', got {list(hidden)!r}")


def check_n_restarts(n_restarts) -> None:
    """``n_restarts``: a positive int or None."""
    if n_restarts is not None and (not _is_int(n_restarts) or n_restarts < 1):
        raise ValueError(f"n_restarts must be a positive int or None, got {n_restarts!r}")


def check_random_state(random_state) -> None:
    """``random_state``: a non-negative int or None."""
    if random_state is not None and (not _is_int(random_state) or random_state < 0):
        raise ValueError(f"random_state must be a non-negative int or None, got {random_state!r}")


def check_em_max_rounds(em_max_rounds) -> None:
    """``em_max_rounds``: a positive int."""
    if not _is_int(em_max_rounds) or em_max_rounds < 1:
        raise ValueError(f"em_max_rounds must be a positive int, got {em_max_rounds!r}")


def check_em_tol(em_tol) -> None:
    """``em_tol``: a non-negative finite number or None."""
    if em_tol is not None and not (isinstance(em_tol, (int, float)) and not isinstance(em_tol, bool)
                                   and em_tol >= 0 and math.isfinite(em_tol)):
        raise ValueError(f"em_tol must be a non-negative number or None, got {em_tol!r}")


def check_n_samples(n_samples, n_vars: int, memory: int | None) -> None:
    """``n_samples`` to draw: a non-negative int whose result fits in half of ``memory``."""
    if not isinstance(n_samples, (int, np.integer)) or n_samples < 0:
        raise DataError(f"n_samples must be a non-negative int, got {n_samples!r}")
    need = 16 * int(n_samples) * (1 + n_vars)
    if memory is not None and need > memory // 2:
        raise DataError(f"{n_samples:,} samples need about {need / 2**30:.1f} GiB, more than half of this "
                        f"machine's {memory / 2**30:.1f} GiB; draw them in smaller batches")


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO), which has no size and may never end"),
               (stat.S_ISCHR, "a character device (such as /dev/zero), which may never end"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_input_file(path, what: str, max_bytes: int | None = None, limit_name: str = "") -> os.stat_result:
    """``path`` is a regular file (a symbolic link to one is fine) of at most ``max_bytes``.

    Opens it without blocking (a FIFO is refused, never waited on) and looks at what it
    is before anything is read.  Raises ``FileNotFoundError`` for a missing file and
    :class:`DataError` saying what it is otherwise (a dangling link, a directory, a FIFO,
    a device, a file over the size limit named by ``limit_name``).
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if os.path.islink(path):
            raise DataError(f"{what} '{path}' is a symbolic link to '{os.readlink(path)}', which does not "
                            "exist") from None
        raise FileNotFoundError(errno.ENOENT, "no such file", path) from None
    except IsADirectoryError:
        raise DataError(f"{what} '{path}' is a directory, not a file") from None
    except OSError as e:  # ENXIO: a socket; EACCES: no permission
        if e.errno == errno.EACCES:
            raise
        raise DataError(f"cannot open {what} '{path}': {e.strerror}") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _FILE_KINDS if test(st.st_mode)), "not a regular file")
        raise DataError(f"{what} '{path}' is {kind}; give a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise DataError(f"{what} '{path}' has {st.st_size:,} bytes, more than {limit_name or f'{max_bytes:,} bytes'}")
    return st


#: The types a category label may have (they go into a model file as JSON).
_LABEL_TYPES = (str, int, float, bool, np.integer, np.floating, np.bool_, np.str_)


def check_label_values(name: str, labels, where=None) -> None:
    """Every label of column ``name`` is a string, an integer, a finite float or a bool.

    ``labels`` are the distinct labels of a column (``where(i)`` says where label ``i``
    occurs in the data, for the message).  Bytes, lists, dicts and other objects are
    refused, since a model file could not hold them.
    """
    for i, v in enumerate(labels):
        if not is_label(v):
            at = f" at {where(i)}" if where is not None else ""
            what = "is not a finite number" if isinstance(v, (float, np.floating)) else f"is of type {type(v).__name__}"
            raise DataError(f"column '{name}': label {_short(v)}{at} {what}; labels must be strings, integers, "
                            "finite numbers or booleans (convert the column first, e.g. to strings)")


def is_label(v) -> bool:
    """Whether ``v`` can be a category label (see :func:`check_label_values`)."""
    return isinstance(v, _LABEL_TYPES) and not (isinstance(v, (float, np.floating)) and not math.isfinite(v))


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def check_memory_limit(value, what: str = "memory_limit"):
    """``memory_limit``: None, a positive finite number of bytes, or a size string."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DataError(f"{what} must be a number of bytes or a size such as '4GiB', got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise DataError(f"{what} must be a positive, finite number of bytes or a size such as '4GiB' "
                        f"(None: this machine's memory), got {value!r}")
    return value


def check_store_path(store) -> None:
    """A store directory that a fit can create or write: not a dangling symbolic link, not
    a file, on a writable file system (checked before any data is read)."""
    if not isinstance(store, (str, os.PathLike)) or "://" in os.fspath(store):
        return  # a store reached by URL or given as an object: its own backend checks it
    path = os.fspath(store)
    if os.path.islink(path) and not os.path.exists(path):
        raise DataError(f"store '{path}' is a symbolic link to '{os.readlink(path)}', which does not exist; "
                        "create that directory first, or give another store directory")
    if os.path.exists(path) and not os.path.isdir(path):
        raise DataError(f"store '{path}' exists and is not a directory; give a new or empty directory")
    parent = path
    while not os.path.exists(parent):
        up = os.path.dirname(os.path.abspath(parent))
        if up == os.path.abspath(parent):
            break
        parent = up
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise DataError(f"store '{path}' cannot be created: '{parent}' is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        why = "on a read-only file system" if read_only_fs(parent) else "not writable"
        raise DataError(f"store '{path}' cannot be written: directory '{parent}' is {why}; give a store "
                        "directory where you may write")


def read_only_fs(path: str) -> bool:
    """Whether ``path`` lies on a file system mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # pragma: no cover - not POSIX
        return False
