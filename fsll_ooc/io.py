"""Turn what users have (arrays, data frames, files) into integer codes and labels.

The model works on integer codes: variable ``i`` takes the values ``0 .. k_i-1``.
This module maps user data onto that convention and back, and validates it *before*
anything large is allocated (the limits live in :mod:`fsll_ooc.validation`):

* :func:`encode` turns a 2-D numpy array, a list of rows or a pandas ``DataFrame``
  into an :class:`Encoded` (codes, variable names, category labels, cardinalities);
* :func:`encode_with` encodes new data (e.g. at scoring time) with an existing
  mapping, rejecting unknown categories;
* :func:`decode` turns codes back into a ``DataFrame`` of labels;
* :func:`read_table` reads ``.csv`` (header row required), ``.npy`` and ``.parquet``.

Every problem with the data raises :class:`DataError` (a ``ValueError``) whose message
names the column, the row (0-based; for CSV files the line), the value and the limit.

How labels are chosen by :func:`encode`:

* numpy integer array: categories ``0 .. max`` per column (codes equal values),
  names ``X0 .. X{n-1}``; negative values are rejected;
* bool array or column: categories ``[False, True]``;
* pandas categorical column: its categories, in their order, unused ones included;
* string / object column: the distinct labels, sorted;
* integer column (or float column holding integers): ``0 .. max`` when every value
  is ``>= 0`` (codes equal values), otherwise the sorted distinct values;
* declared ``cardinalities`` turn integer columns into codes ``0 .. k_i-1``.

Example
-------
>>> import numpy as np
>>> enc = encode(np.array([[0, 2], [1, 0]]))
>>> enc.names, enc.cardinalities
(['X0', 'X1'], (2, 3))
>>> encode(np.array([[0, 5]]), cardinalities=(2, 4))
Traceback (most recent call last):
...
fsll_ooc.io.DataError: column 'X1': value 5 at row 0 is >= the declared cardinality 4 (codes must be 0..3)
"""
from __future__ import annotations

import csv
import functools
import inspect
import itertools
import math
import os
import re
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .validation import (MAX_CATEGORIES, MAX_CELLS, MAX_LINE_CHARS, MAX_VARIABLES, DataError,
                          check_cardinalities, check_input_file, is_label)
from .validation import validate_data as _validate_codes

__all__ = [
    "DataError",
    "Encoded",
    "MAX_CATEGORIES",
    "MAX_CELLS",
    "SUPPORTED_EXTENSIONS",
    "encode",
    "encode_with",
    "decode",
    "frequency_order",
    "basis_order",
    "CATEGORY_ORDERS",
    "check_category_order",
    "variable_index",
    "recode",
    "unknown_labels",
    "inverse_orders",
    "read_table",
    "check_cardinalities",
    "validate_data",
]

#: File types understood by :func:`read_table` (``.tsv``: tab-separated text; ``.txt``: text,
#: delimiter sniffed like ``.csv``).
SUPPORTED_EXTENSIONS = (".csv", ".tsv", ".txt", ".npy", ".parquet")
#: Delimiters :func:`read_table` recognises in a text file when none is given.
SNIFFED_DELIMITERS = ",;\t|"


@dataclass(frozen=True, eq=False)
class Encoded:
    """Integer codes plus what is needed to map them back to the user's labels.

    ``codes[:, i]`` lies in ``0 .. cardinalities[i]-1`` and code ``c`` of variable ``i``
    stands for the label ``categories[i][c]``.
    """

    codes: np.ndarray
    names: list
    categories: list
    cardinalities: tuple
    #: Indices of the columns whose categories have a meaningful order (ordered pandas
    #: Categoricals): a fit keeps their order in the basis (:func:`basis_order`).
    ordered: tuple = ()

    @property
    def n_samples(self) -> int:
        return int(self.codes.shape[0])

    @property
    def n_vars(self) -> int:
        return int(self.codes.shape[1])

    def __repr__(self) -> str:
        return (f"Encoded(n_samples={self.n_samples}, names={self.names!r}, "
                f"cardinalities={self.cardinalities!r})")


# --------------------------------------------------------------------------- helpers

def _pandas():
    """The pandas module if it is already imported (a DataFrame can then exist)."""
    return sys.modules.get("pandas")


def _require_pandas(what: str):
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - pandas is installed in the tests
        raise ImportError(f"{what} needs pandas; install it with 'pip install pandas'") from exc
    return pd


def _is_dataframe(data) -> bool:
    pd = _pandas()
    return pd is not None and isinstance(data, pd.DataFrame)


def _is_series(data) -> bool:
    pd = _pandas()
    return pd is not None and isinstance(data, pd.Series)


def _py(v):
    """A plain Python value for a label (numpy scalars -> int/float/bool/str)."""
    if isinstance(v, np.generic):
        return v.item()
    return v


def _fmt_label(v) -> str:
    return repr(_py(v))


def _fmt_labels(labels: Sequence, limit: int = 8) -> str:
    shown = ", ".join(_fmt_label(v) for v in list(labels)[:limit])
    if len(labels) > limit:
        shown += f", ... ({len(labels)} in all)"
    return shown


def _sorted_labels(labels) -> list:
    labels = [_py(v) for v in labels]
    try:
        return sorted(labels)
    except TypeError:  # mixed types: group by type, then sort within a type
        return sorted(labels, key=lambda v: (type(v).__name__, str(v)))


def _first(mask: np.ndarray) -> int:
    """Index of the first True of a 1-D boolean mask (which has one)."""
    return int(np.argmax(mask))


class _Where:
    """Formats "row r" for error messages; knows the CSV line when there is one."""

    def __init__(self, index=None, source=None, first_line=None):
        self.index = index          # a pandas Index that is not the default one, or None
        self.source = source
        self.first_line = first_line

    def __call__(self, r: int) -> str:
        s = f"row {r}"
        if self.first_line is not None and self.source is not None:
            s += f" (line {r + self.first_line} of {self.source})"
        elif self.index is not None:
            s += f" (index {_fmt_label(self.index[r])})"
        return s


def _check_declared(cardinalities, n: int, names: list) -> tuple | None:
    if cardinalities is None:
        return None
    if isinstance(cardinalities, (int, np.integer)) or np.ndim(cardinalities) != 1:
        raise DataError(f"cardinalities must be a sequence of {n} integers, got {cardinalities!r}")
    cardinalities = list(cardinalities)
    if len(cardinalities) != n:
        raise DataError(f"{len(cardinalities)} cardinalities were declared but the data has "
                        f"{n} columns ({_fmt_names(names)})")
    return check_cardinalities(cardinalities, names)


def _fmt_names(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    if len(names) > limit:
        shown += f", ... ({len(names)} in all)"
    return shown


def _quoted(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(str(nm)) for nm in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _check_k(name: str, k: int, how: str) -> None:
    if k > MAX_CATEGORIES:
        raise DataError(f"column '{name}' would have {k:,} categories ({how}); "
                        f"the limit is {MAX_CATEGORIES} (2**16) categories per variable")


#: A column of integers read as codes ``0 .. max`` with at least this many categories gets a
#: warning (it is often a number, e.g. an age or a score, rather than a label).
MANY_INTEGER_CATEGORIES = 20


def _warn_sparse(name: str, k: int, present: int, labels: bool = False) -> None:
    if k >= 8 and present * 2 < k:
        warnings.warn(
            f"column '{name}': integer values span 0..{k - 1} but only {present} distinct values "
            f"occur, so {k - present} of its {k} categories are unused; convert the column to "
            f"strings or a pandas Categorical to encode only the values that occur"
            + (f" (fsll-ooc: --categorical {name})" if labels else ""),
            UserWarning, stacklevel=4)
    elif labels and k >= MANY_INTEGER_CATEGORIES:
        warnings.warn(
            f"column '{name}': its integers 0..{k - 1} become {k} categories, and the joint table grows "
            f"{k}-fold; if they are a number (an age, a count, a score) rather than a label, bin them "
            f"first" + (f"; to make only the {present} values that occur categories, pass the column as "
                        f"strings or a pandas Categorical (fsll-ooc: --categorical {name})" if present < k else ""),
            UserWarning, stacklevel=4)


def _warn_id_column(name: str, distinct: int, n_rows: int) -> None:
    """A column whose every row holds its own value looks like a row id, not a variable."""
    if n_rows >= 50 and distinct == n_rows:
        warnings.warn(f"column '{name}' holds a different value in every one of its {n_rows:,} rows: is it an id? "
                      f"As a variable it makes {distinct:,} categories and says nothing about the others; leave "
                      f"it out (fsll-ooc: --drop {name}; pandas: df.drop(columns=['{name}']))",
                      UserWarning, stacklevel=4)


def _as_2d_array(data) -> np.ndarray:
    if _is_series(data):
        raise DataError("got a 1-D pandas Series; pass a DataFrame (series.to_frame()) "
                        "with one column per variable")
    try:
        arr = np.asarray(data)
    except ValueError as exc:  # ragged nested lists
        raise DataError(f"the data cannot be read as a 2-D table: {exc}") from None
    if arr.ndim == 1:
        raise DataError(f"got a 1-D array of shape {arr.shape}; pass a 2-D array of shape "
                        "(n_samples, n_vars) (for a single variable use x.reshape(-1, 1))")
    if arr.ndim != 2:
        raise DataError(f"got a {arr.ndim}-D array of shape {arr.shape}; "
                        "pass a 2-D array of shape (n_samples, n_vars)")
    return arr


def _check_not_empty(shape) -> None:
    if shape[1] == 0:
        raise DataError(f"the data has no columns (shape {tuple(shape)})")
    if shape[1] > MAX_VARIABLES:
        raise DataError(f"the data has {shape[1]:,} columns; the limit is {MAX_VARIABLES:,} variables: "
                        "select the columns to model first")
    if shape[0] == 0:
        raise DataError(f"the data has no rows (shape {tuple(shape)}); at least one sample is needed")


# ------------------------------------------------------------------- column planning
#
# Phase 1 (`_plan_*`) looks at each column, validates it and decides its categories,
# without allocating anything of size N x n.  Then the joint table size is checked.
# Phase 2 fills the (N, n) int64 code matrix column by column.

class _ColumnCoding:
    __slots__ = ("categories", "fill")

    def __init__(self, categories: list, fill):
        self.categories = categories
        self.fill = fill            # fill(out_column_view) writes the codes


def _plan_integers(name: str, values: np.ndarray, k_decl: int | None, where: _Where,
                   allow_negative: bool) -> _ColumnCoding:
    """An integer-valued numeric column (ints, or floats already checked to be integers)."""
    lo, hi = values.min(), values.max()
    lo, hi = int(lo), int(hi)
    if k_decl is not None or not allow_negative:
        if lo < 0:
            r = _first(values < 0)
            hint = ("codes must be 0..k-1" if k_decl is not None else
                    "codes must be >= 0; pass a DataFrame to encode arbitrary integer labels")
            raise DataError(f"column '{name}': negative value {_py(values[r])} at {where(r)} ({hint})")
    if k_decl is not None:
        if hi >= k_decl:
            r = _first(values >= k_decl)
            raise DataError(f"column '{name}': value {_py(values[r])} at {where(r)} is >= the declared "
                            f"cardinality {k_decl} (codes must be 0..{k_decl - 1})")
        return _ColumnCoding(list(range(k_decl)), lambda out: np.copyto(out, values, casting="unsafe"))
    if lo >= 0:
        k = hi + 1
        _check_k(name, k, f"values 0..{hi}")
        present = int(np.count_nonzero(np.bincount(values.astype(np.int64, copy=False), minlength=k)))
        _warn_sparse(name, k, present, labels=allow_negative)
        if allow_negative:
            _warn_id_column(name, present, len(values))
        return _ColumnCoding(list(range(k)), lambda out: np.copyto(out, values, casting="unsafe"))
    # negative values: the sorted distinct values are the categories
    uniq = np.unique(values)
    _check_k(name, len(uniq), f"{len(uniq)} distinct values")
    return _ColumnCoding([_py(v) for v in uniq], lambda out: np.copyto(out, np.searchsorted(uniq, values)))


def _check_finite_integral(name: str, values: np.ndarray, where: _Where) -> None:
    nan = np.isnan(values)
    if nan.any():
        r = _first(nan)
        raise DataError(f"column '{name}': missing value (NaN) at {where(r)}; "
                        "every cell must hold a category")
    inf = np.isinf(values)
    if inf.any():
        r = _first(inf)
        raise DataError(f"column '{name}': infinite value ({_py(values[r])}) at {where(r)}")
    frac = values != np.floor(values)
    if frac.any():
        r = _first(frac)
        raise DataError(f"column '{name}': non-integer value {_fmt_label(values[r])} at {where(r)}; "
                        "float columns must hold whole numbers (or use strings / a Categorical)")


def _plan_bool(name: str, values: np.ndarray, k_decl: int | None) -> _ColumnCoding:
    if k_decl is not None and k_decl != 2:
        raise DataError(f"column '{name}' is boolean (categories [False, True]) but cardinality "
                        f"{k_decl} was declared; declare 2")
    return _ColumnCoding([False, True], lambda out: np.copyto(out, values, casting="unsafe"))


def _factorize(values: np.ndarray):
    """(codes into uniques, uniques) by hashing; pandas when available, else numpy."""
    pd = _pandas()
    if pd is not None:
        codes, uniques = pd.factorize(values, use_na_sentinel=True)
        return np.asarray(codes), list(uniques)
    uniques, codes = np.unique(values, return_inverse=True)  # pragma: no cover
    return codes.reshape(-1), list(uniques)  # pragma: no cover


def _plan_labels(name: str, values: np.ndarray, k_decl: int | None, where: _Where) -> _ColumnCoding:
    """A string / object column: the sorted distinct labels are the categories."""
    pd = _pandas()
    if pd is not None:
        na = np.asarray(pd.isna(values))
    else:  # pragma: no cover
        na = np.array([v is None or (isinstance(v, float) and math.isnan(v)) for v in values])
    if na.any():
        r = _first(na)
        raise DataError(f"column '{name}': missing value ({values[r]!r}) at {where(r)}; "
                        "every cell must hold a category")
    _check_label_objects(name, values, where)
    _check_bool_and_number(name, values, where)
    fcodes, uniques = _factorize(values)
    for u in uniques:
        if isinstance(u, (float, np.floating)) and math.isinf(u):
            r = _first(fcodes == uniques.index(u))
            raise DataError(f"column '{name}': infinite value ({u}) at {where(r)}")
    _check_k(name, len(uniques), f"{len(uniques)} distinct labels")
    _warn_id_column(name, len(uniques), len(values))
    cats = _sorted_labels(uniques)
    if k_decl is not None and k_decl != len(cats):
        raise DataError(
            f"column '{name}' has {len(cats)} distinct labels ({_fmt_labels(cats)}) but cardinality "
            f"{k_decl} was declared; declared cardinalities apply to integer codes - to declare "
            "unseen labels make the column a pandas Categorical with all its categories")
    pos = {}
    for c, lab in enumerate(cats):
        pos[lab] = c
    lut = np.array([pos[_py(u)] for u in uniques], dtype=np.int64)
    return _ColumnCoding(cats, lambda out: np.copyto(out, lut[fcodes]))


def _check_bool_and_number(name: str, values: np.ndarray, where: _Where) -> None:
    """``True == 1`` and ``False == 0`` in Python: a column holding both kinds would merge
    them into one label silently, so it is refused."""
    is_bool = np.fromiter((isinstance(v, (bool, np.bool_)) for v in values), bool, len(values))
    if not is_bool.any() or is_bool.all():
        return
    is_num = np.fromiter((isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_))
                          for v in values), bool, len(values))
    if is_num.any():
        b, n = _first(is_bool), _first(is_num)
        raise DataError(f"column '{name}' mixes booleans ({values[b]!r} at {where(b)}) with numbers "
                        f"({values[n]!r} at {where(n)}), which Python counts as equal (True == 1); "
                        "make the column one kind, e.g. df[col].astype(str)")


#: What ``pandas.api.types.infer_dtype`` calls a column whose values are all usable labels.
_PLAIN_LABELS = frozenset({"string", "integer", "floating", "boolean", "mixed-integer-float", "empty"})


def _check_label_objects(name: str, values: np.ndarray, where: _Where) -> None:
    """An object column holds only strings, numbers and bools (not bytes, lists, dicts, ...),
    checked before hashing: a list or dict cannot be hashed, bytes cannot go into a model file."""
    pd = _pandas()
    if pd is not None and pd.api.types.infer_dtype(values, skipna=True) in _PLAIN_LABELS:
        return
    for r, v in enumerate(values):
        if v is None or (isinstance(v, float) and math.isnan(v)) or is_label(v):
            continue
        if isinstance(v, (float, np.floating)):
            continue  # +-inf: reported with its row by the caller
        raise DataError(f"column '{name}': value {_short_repr(v)} at {where(r)} is of type {type(v).__name__}; "
                        "labels must be strings, integers, finite numbers or booleans (convert the column "
                        "first, e.g. to strings)")


def _short_repr(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _is_ordered(s) -> bool:
    """Whether a column is an ordered pandas Categorical."""
    dtype = getattr(s, "dtype", None)
    return bool(getattr(dtype, "ordered", False)) and isinstance(dtype, _pandas().CategoricalDtype)


def _plan_series(name: str, s, k_decl: int | None, where: _Where) -> _ColumnCoding:
    pd = _pandas()
    dtype = s.dtype
    api = pd.api.types
    if isinstance(dtype, pd.CategoricalDtype):
        cats = [_py(c) for c in dtype.categories]
        codes = np.asarray(s.cat.codes)
        if (codes < 0).any():
            r = _first(codes < 0)
            raise DataError(f"column '{name}': missing value at {where(r)}; every cell must hold a category")
        _check_k(name, len(cats), f"{len(cats)} categories")
        if k_decl is not None and k_decl != len(cats):
            raise DataError(f"column '{name}' is categorical with {len(cats)} categories "
                            f"({_fmt_labels(cats)}) but cardinality {k_decl} was declared")
        return _ColumnCoding(cats, lambda out: np.copyto(out, codes))
    na = np.asarray(s.isna())
    if api.is_bool_dtype(dtype):
        if na.any():
            r = _first(na)
            raise DataError(f"column '{name}': missing value at {where(r)}; every cell must hold a category")
        return _plan_bool(name, s.to_numpy(dtype=bool), k_decl)
    if api.is_integer_dtype(dtype):
        if na.any():
            r = _first(na)
            raise DataError(f"column '{name}': missing value at {where(r)}; every cell must hold a category")
        values = s.to_numpy(dtype=np.int64) if dtype.kind == "i" or not isinstance(dtype, np.dtype) \
            else s.to_numpy()
        return _plan_integers(name, values, k_decl, where, allow_negative=True)
    if api.is_float_dtype(dtype):
        values = s.to_numpy(dtype=np.float64, na_value=np.nan)
        _check_finite_integral(name, values, where)
        return _plan_integers(name, values, k_decl, where, allow_negative=True)
    if api.is_string_dtype(dtype) or api.is_object_dtype(dtype):
        return _plan_labels(name, s.to_numpy(dtype=object), k_decl, where)
    raise DataError(f"column '{name}' has unsupported dtype {dtype}; use integers, bools, "
                    "strings or a pandas Categorical")


def _plan_array_column(name: str, col: np.ndarray, k_decl: int | None, where: _Where) -> _ColumnCoding:
    kind = col.dtype.kind
    if kind == "b":
        return _plan_bool(name, col, k_decl)
    if kind in "iu":
        return _plan_integers(name, col, k_decl, where, allow_negative=False)
    if kind == "f":
        _check_finite_integral(name, col, where)
        return _plan_integers(name, col, k_decl, where, allow_negative=False)
    if kind in "OUS":
        return _plan_labels(name, col.astype(object), k_decl, where)
    raise DataError(f"unsupported array dtype {col.dtype}; use integer codes, bools or labels")


def _source_where(df) -> _Where:
    pd = _pandas()
    attrs = getattr(df, "attrs", {}) or {}
    if "fsll_source" in attrs:
        return _Where(source=attrs["fsll_source"], first_line=attrs.get("fsll_first_line"))
    idx = df.index
    if isinstance(idx, pd.RangeIndex) and idx.start == 0 and idx.step == 1:
        return _Where()
    return _Where(index=idx)


def _column_names(df) -> list:
    names = [str(c) for c in df.columns]
    seen = set()
    for nm in names:
        if nm in seen:
            raise DataError(f"column name '{nm}' appears more than once; column names must be unique")
        seen.add(nm)
    return names


def _names_its_file(fn):
    """``fn`` (with an argument ``data``) whose :class:`DataError` about a table read from a
    file (:func:`read_table` marks it) names the file first, unless it does already."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DataError as e:
            data = signature.bind(*args, **kwargs).arguments.get("data")
            file = (getattr(data, "attrs", None) or {}).get("fsll_file") if _is_dataframe(data) else None
            if not file or file in str(e):
                raise
            named = DataError(f"{file}: {e}")
            named.__dict__.update(e.__dict__, file=file, detail=str(e))  # what the error carries, and its parts
            raise named from None
    return checked


# ------------------------------------------------------------------------ public API

@_names_its_file
def encode(data: Any, cardinalities: Sequence[int] | None = None) -> Encoded:
    """Encode a table of categorical data as integer codes.

    Parameters
    ----------
    data
        A 2-D numpy array (integer codes, bools, integral floats or labels), a list of
        rows, or a pandas ``DataFrame`` (one column per variable).
    cardinalities
        Optional declared ``k_i`` per column.  Integer columns are then codes that must
        lie in ``0 .. k_i-1`` (unseen codes are kept as categories); label columns must
        have exactly ``k_i`` categories.

    Returns
    -------
    Encoded
        ``codes`` (``(N, n)`` int64), ``names``, ``categories`` (plain Python labels)
        and ``cardinalities``.

    Raises
    ------
    DataError
        Empty or 1-D data, negative codes, codes ``>=`` the declared cardinality,
        missing / infinite / non-integer values, more than ``2**16`` categories in a
        column, or a joint table of more than ``2**40`` cells.  Raised before the code
        matrix is allocated.
    """
    if _is_dataframe(data):
        df = data
        _check_not_empty(df.shape)
        names = _column_names(df)
        declared = _check_declared(cardinalities, len(names), names)
        where = _source_where(df)
        plans = [_plan_series(names[j], df.iloc[:, j], None if declared is None else declared[j], where)
                 for j in range(len(names))]
        n_rows = df.shape[0]
    else:
        arr = _as_2d_array(data)
        _check_not_empty(arr.shape)
        names = [f"X{i}" for i in range(arr.shape[1])]
        declared = _check_declared(cardinalities, len(names), names)
        if arr.dtype.kind not in "biufOUS":
            raise DataError(f"unsupported array dtype {arr.dtype}; use integer codes, bools or labels")
        if arr.dtype.kind in "OUS":
            _require_pandas("encoding an array of labels")
        where = _Where()
        plans = [_plan_array_column(names[j], arr[:, j], None if declared is None else declared[j], where)
                 for j in range(len(names))]
        n_rows = arr.shape[0]
    ks = check_cardinalities([len(p.categories) for p in plans], names)
    codes = np.empty((n_rows, len(plans)), dtype=np.int64)
    for j, p in enumerate(plans):
        p.fill(codes[:, j])
    ordered = tuple(j for j in range(len(names)) if _is_dataframe(data) and _is_ordered(data.iloc[:, j]))
    return Encoded(codes=codes, names=names, categories=[p.categories for p in plans], cardinalities=ks,
                   ordered=ordered)


def validate_data(X: Any, cardinalities: Sequence[int] | None = None,
                  names: Sequence[str] | None = None) -> tuple[np.ndarray, tuple[int, ...]]:
    """Check ``X`` (category codes, or a DataFrame whose labels are encoded first) and return
    ``(codes as int64 (N, n), cardinalities)``; see :func:`fsll_ooc.validation.validate_data`.

    >>> import pandas as pd
    >>> validate_data(pd.DataFrame({"a": ["x", "y"]}))[1]
    (2,)
    """
    if _is_dataframe(X):
        enc = encode(X, cardinalities)
        X = enc.codes
        if cardinalities is None:
            cardinalities = enc.cardinalities
    return _validate_codes(X, cardinalities, names)


@_names_its_file
def encode_with(categories: Sequence[Sequence], data: Any, names: Sequence[str] | None = None,
                strict: bool = False) -> np.ndarray:
    """Encode new data with an existing mapping (e.g. a fitted model's ``categories_``).

    ``categories[i][c]`` is the label of code ``c`` of variable ``i``.  When ``data`` is
    a ``DataFrame`` and ``names`` is given, its columns are picked by name, in any
    order (a missing one is an error naming it; extra columns are ignored, or with
    ``strict=True`` an error naming them, so that a renamed column is never taken for
    another); otherwise columns are taken in order.  Returns the ``(N, n)`` int64
    codes.  A label that is not among the known categories raises :class:`DataError`
    naming the column, the value and the row.
    """
    categories = [list(c) for c in categories]
    n = len(categories)
    if names is not None:
        names = [str(nm) for nm in names]
        if len(names) != n:
            raise DataError(f"{len(names)} names given for {n} variables")
    if _is_dataframe(data):
        df = data
        if names is not None:
            cols = _column_names(df)
            missing = [nm for nm in names if nm not in cols]
            unknown = [c for c in cols if c not in names] if strict else []
            if missing or unknown:
                what = []
                if missing:
                    what.append(f"lacks the model's column(s) {_quoted(missing)}")
                if unknown:
                    what.append(f"has column(s) {_quoted(unknown)} the model does not know")
                raise DataError(f"the data {' and '.join(what)} (model: {_quoted(names)}; data: {_quoted(cols)}); "
                                "columns are matched by name: rename them, or select the model's columns, "
                                "e.g. data[model.feature_names_in_]")
            df = df.iloc[:, [cols.index(nm) for nm in names]]
        elif df.shape[1] != n:
            raise DataError(f"the model has {n} variables but the data has {df.shape[1]} columns")
        _check_not_empty(df.shape)
        where = _source_where(df)
        columns = [df.iloc[:, j] for j in range(n)]
        n_rows = df.shape[0]
    else:
        arr = _as_2d_array(data)
        if arr.shape[1] != n:
            raise DataError(f"the model has {n} variables but the data has {arr.shape[1]} columns")
        _check_not_empty(arr.shape)
        where = _Where()
        columns = [arr[:, j] for j in range(n)]
        n_rows = arr.shape[0]
    col_names = names if names is not None else [f"X{i}" for i in range(n)]
    codes = np.empty((n_rows, n), dtype=np.int64)
    for j in range(n):
        codes[:, j] = _map_column(col_names[j], columns[j], categories[j], where)
    return codes


def _map_column(name: str, col, cats: list, where: _Where) -> np.ndarray:
    k = len(cats)
    if _is_series(col):
        pd = _pandas()
        if isinstance(col.dtype, pd.CategoricalDtype):
            col = col.astype(object)
        na = np.asarray(col.isna())
        if na.any():
            r = _first(na)
            raise DataError(f"column '{name}': missing value at {where(r)}; every cell must hold a category")
        dt = col.dtype
        if isinstance(dt, np.dtype) and dt.kind in "biuf":
            values = col.to_numpy()
        elif pd.api.types.is_bool_dtype(dt):
            values = col.to_numpy(dtype=bool)
        elif pd.api.types.is_integer_dtype(dt):
            values = col.to_numpy(dtype=np.int64)
        elif pd.api.types.is_float_dtype(dt):
            values = col.to_numpy(dtype=np.float64)
        else:
            values = col.to_numpy(dtype=object)
    else:
        values = np.asarray(col)
    kind = values.dtype.kind
    if kind == "f":
        nan = np.isnan(values)
        if nan.any():
            r = _first(nan)
            raise DataError(f"column '{name}': missing value (NaN) at {where(r)}; every cell must hold a category")
    # fast path: integer codes with categories 0..k-1
    if kind in "iuf" and all(type(c) is int and c == i for i, c in enumerate(cats)):
        ok = (values >= 0) & (values < k) & (values == np.floor(values) if kind == "f" else True)
        ok = np.asarray(ok)
        if not ok.all():
            r = _first(~ok)
            raise DataError(f"column '{name}': unknown category {_fmt_label(values[r])} at {where(r)} "
                            f"(the model knows 0..{k - 1})")
        return values.astype(np.int64)
    if kind == "O":
        pd = _pandas()
        na = np.asarray(pd.isna(values)) if pd is not None else np.array([v is None for v in values])
        if na.any():
            r = _first(na)
            raise DataError(f"column '{name}': missing value ({values[r]!r}) at {where(r)}; "
                            "every cell must hold a category")
        _check_label_objects(name, values, where)
    fcodes, uniques = _factorize(values)
    pos = {}
    for c, lab in enumerate(cats):
        pos.setdefault(_py(lab), c)
    lut = np.empty(len(uniques), dtype=np.int64)
    for u_i, u in enumerate(uniques):
        c = pos.get(_py(u), -1)
        if c < 0:
            r = _first(fcodes == u_i)
            raise DataError(f"column '{name}': unknown category {_fmt_label(u)} at {where(r)} "
                            f"(known categories: {_fmt_labels(cats)})")
        lut[u_i] = c
    return lut[fcodes]


def decode(codes: np.ndarray, categories: Sequence[Sequence], names: Sequence[str] | None = None):
    """Map codes back to labels: a ``DataFrame`` with one categorical column per variable.

    The columns keep the full category lists, so ``encode(decode(...))`` reproduces the
    mapping (unused categories included).
    """
    pd = _require_pandas("decode()")
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] != len(categories):
        raise DataError(f"codes of shape {codes.shape} do not match {len(categories)} variables")
    if names is None:
        names = [f"X{i}" for i in range(len(categories))]
    cols = {}
    for j, (nm, cats) in enumerate(zip(names, categories)):
        c = codes[:, j]
        if c.size and (c.min() < 0 or c.max() >= len(cats)):
            raise DataError(f"variable '{nm}': codes must lie in 0..{len(cats) - 1}")
        cols[str(nm)] = pd.Categorical.from_codes(c, categories=pd.Index(list(cats), dtype=object)
                                                  if _mixed(cats) else list(cats))
    return pd.DataFrame(cols)


def _mixed(cats) -> bool:
    return len({type(_py(c)) for c in cats}) > 1


# ------------------------------------------------------------------------- reading

def read_table(path: str | os.PathLike, *, sep: str | None = None, header: bool = True,
               na_values: Sequence[str] | None = None, keep_na: bool = False, missing: bool = False):
    """Read a data file: text (``.csv``, ``.tsv``, ``.txt``), ``.npy`` or ``.parquet``.

    Text files: one row per sample, one column per variable.

    * ``sep``: the delimiter; by default ``\\t`` for ``.tsv`` and otherwise sniffed
      from the first lines among ``, ; TAB |`` (a file that still parses as one column
      gets a warning naming ``--sep``);
    * ``header``: the first line names the columns (default); ``header=False`` names
      them ``X0, X1, ...`` and the first line is data;
    * missing cells are errors (naming line and column).  An empty field is missing;
      so are pandas' usual markers (``NA``, ``N/A``, ``None``, ``null``, ``NaN``, ...)
      unless ``keep_na=True``, which keeps them as labels (some data have a real state
      called ``None``); ``na_values`` adds markers (e.g. ``["?"]``);
    * whitespace around names and labels is removed (``" b"`` is ``"b"``), with a
      warning saying so.

    Returns a pandas ``DataFrame`` (text, Parquet) or a numpy array (``.npy``, memory
    mapped).  Raises ``FileNotFoundError`` for a missing file and :class:`DataError`
    for an unsupported extension, a header that looks like data, ragged rows (naming
    the line) or missing fields (naming line and column).
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in SUPPORTED_EXTENSIONS:
        raise DataError(f"cannot read '{path}': unsupported file type '{ext or '(none)'}'; "
                        f"supported: {', '.join(SUPPORTED_EXTENSIONS)}")
    size = check_input_file(path, "data file").st_size
    if ext != ".npy":  # .npy files are memory-mapped, the others read whole
        _check_fits_in_memory(path, size, "file")
    if ext == ".npy":
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise DataError(f"cannot read '{path}': {exc} (.npy files must hold a numeric or bool "
                            "array)") from None
    if ext == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading '{path}' needs pyarrow: install it with 'pip install pyarrow'") from exc
        _require_pandas("reading .parquet files")
        try:
            meta = pq.ParquetFile(path)
            _check_parquet_schema(path, meta)
            df = pq.read_table(path).to_pandas()
            df.attrs["fsll_file"] = os.path.basename(path)  # what errors about its values name
            return df
        except DataError:
            raise
        except Exception as exc:  # pyarrow raises ArrowInvalid etc. on corrupt files
            raise DataError(f"cannot read '{path}' as Parquet: {exc}") from None
    if sep is not None and (len(sep) != 1 or sep in "\r\n\"'"):
        raise DataError(f"the delimiter must be one character other than a quote or a line break, got {sep!r}")
    if sep is None:
        sep = "\t" if ext == ".tsv" else _sniff_delimiter(path)
    return _read_csv(path, sep=sep, header=header, na_values=na_values, keep_na=keep_na, missing=missing)


def _check_fits_in_memory(path: str, nbytes: int, what: str) -> None:
    """A data file is read whole: refuse one whose content cannot fit in this machine's memory."""
    from .machine import total_memory

    memory = total_memory()
    if memory is not None and nbytes > memory:
        raise DataError(f"'{path}': its {what} takes {nbytes / 2**30:.1f} GiB, more than this machine's "
                        f"{memory / 2**30:.1f} GiB of memory, and data files are read whole; fit a sample "
                        "of its rows (the model needs the counts of the rows, not every row)")


def _check_parquet_schema(path: str, meta) -> None:
    """Before reading a Parquet file: not too many columns, not more than memory, and no
    column whose values cannot be labels (bytes, lists, structs, maps, ...)."""
    import pyarrow as pa

    schema = meta.schema_arrow
    if len(schema) > MAX_VARIABLES:
        raise DataError(f"'{path}' has {len(schema):,} columns; the limit is {MAX_VARIABLES:,} variables: "
                        "select the columns to model first")
    t = pa.types
    for fld in schema:
        typ = fld.type.value_type if t.is_dictionary(fld.type) else fld.type
        if not (t.is_integer(typ) or t.is_boolean(typ) or t.is_floating(typ) or t.is_string(typ)
                or t.is_large_string(typ) or t.is_null(typ)):
            raise DataError(f"'{path}': column '{fld.name}' holds {fld.type} values; category labels must be "
                            "integers, booleans, whole numbers or strings (convert the column, or leave it "
                            "out of the file)")
    _check_fits_in_memory(path, 8 * meta.metadata.num_rows * max(len(schema), 1), "table (8 bytes a cell)")


def _sniff_delimiter(path: str) -> str:
    """The delimiter of a text file from its first 64 KiB: the one of ``SNIFFED_DELIMITERS``
    that gives every line the same number (> 1) of fields; ``,`` when none does."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            sample = f.read(65536)
    except UnicodeDecodeError as exc:
        raise DataError(f"'{path}' is not UTF-8 text: {exc}") from None
    lines = sample.splitlines()
    if len(sample) == 65536 and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut
    lines = [ln for ln in lines if ln.strip()][:200]
    if not lines:
        return ","
    best, best_fields = ",", 1
    for d in SNIFFED_DELIMITERS:
        widths = {len(row) for row in csv.reader(lines, delimiter=d)}
        if len(widths) == 1:
            w = widths.pop()
            if w > best_fields:
                best, best_fields = d, w
    return best


_NUMERIC_HEADER_HINT = ("CSV files need a header row naming the columns, e.g. 'a,b,c'")


def _looks_numeric(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _read_csv(path: str, sep: str = ",", header: bool = True, na_values=None, keep_na: bool = False,
              missing: bool = False):
    pd = _require_pandas("reading .csv files")
    name = os.path.basename(path)
    # 1. structure, with the csv module (fast, exact line numbers)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(_bounded_lines(f, name), delimiter=sep)
            first = next(reader, None)
            while first == []:            # leading blank lines
                first = next(reader, None)
            if first is None:
                raise DataError(f"'{path}' is empty" + (f"; {_NUMERIC_HEADER_HINT}" if header else ""))
            header_line = reader.line_num
            if len(first) > MAX_VARIABLES:
                raise DataError(f"{name}, line {header_line}: {len(first):,} columns; the limit is "
                                f"{MAX_VARIABLES:,} variables: select the columns to model first (e.g. with cut)")
            if header:
                _check_header(path, first, sep)
            width = len(first)
            counts = Counter(map(len, reader))
            last_line = reader.line_num
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            raise DataError(f"{name}, line {reader.line_num}: a field longer than {csv.field_size_limit():,} "
                            "characters; category labels are short (is this a text data file?)") from None
        raise DataError(f"cannot parse '{path}' as CSV: {exc}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"'{path}' is not UTF-8 text: {exc}") from None
    if not header:
        counts[width] += 1
    blank = counts.pop(0, 0)              # blank lines are skipped
    if set(counts) - {width}:
        line, got = _find_ragged(path, width, sep, header)
        what = f"the header has {width} ({', '.join(first)})" if header else f"the first line has {width}"
        raise DataError(f"{name}, line {line}: {got} fields but {what}; every row needs one value per column")
    if not counts:
        raise DataError(f"'{path}' has a header but no data rows")
    if width == 1 and re.search(r"[\s:]", first[0].strip()):  # one column whose name looks like several
        warnings.warn(f"{name} reads as one column ({first[0][:40]!r}); if it has several, give the "
                      f"delimiter (--sep in the command line, sep= in Python)", UserWarning, stacklevel=3)
    # 2. values, with pandas' C parser
    extra = [str(v) for v in (na_values or [])]
    df = pd.read_csv(path, sep=sep, encoding="utf-8-sig", index_col=False, low_memory=False,
                     skip_blank_lines=True, header=0 if header else None,
                     keep_default_na=not keep_na, na_values=[""] + extra)
    if not header:
        df.columns = [f"X{j}" for j in range(df.shape[1])]
    df = _strip_whitespace(df, name)
    df.attrs["fsll_file"] = name  # what errors about its values name
    na = df.isna()
    if not missing and bool(na.to_numpy().any()):  # missing=True: kept as NaN (FSLL(missing="em"))
        rows = np.flatnonzero(na.to_numpy().any(axis=1))
        r = int(rows[0])
        j = int(np.argmax(na.iloc[r].to_numpy()))
        col = str(df.columns[j])
        line, raw = _find_row(path, r + (0 if header else -1), j, sep)
        marker = raw.strip() != "" and raw not in extra
        hint = " (--keep-na, or keep_na=True, reads NA/None/null/... as labels)" if marker and not keep_na else ""
        raise DataError(f"{name}, line {line}, column '{col}': missing value ({raw!r}); "
                        f"every cell must hold a category{hint}, or fit with --missing em (FSLL(missing='em'))")
    # data row r is on line header_line + 1 + r unless blank lines or quoted line
    # breaks shift it; error messages then give the row only
    if blank == 0 and last_line == header_line + sum(counts.values()) - (0 if header else 1):
        df.attrs["fsll_source"] = name
        df.attrs["fsll_first_line"] = header_line + (1 if header else 0)
    return df


#: One line of text with its ending (``\n``, ``\r\n`` or ``\r``, as ``open(newline="")`` splits).
_LINES = re.compile(r"[^\r\n]*(?:\r\n?|\n)|[^\r\n]+\Z").findall
_BLOCK = 2**20


def _bounded_lines(f, name: str):
    """The lines of a text file (opened with ``newline=""``), read in blocks of bounded size: a
    line longer than ``MAX_LINE_CHARS`` is refused after reading about that much, never read
    whole.  Splitting is done in C (a regular expression per block), so this costs little
    more than iterating over the file."""
    return itertools.chain.from_iterable(_line_blocks(f, name))


def _line_blocks(f, name: str):
    seen = 0  # lines in earlier blocks
    while True:
        block = f.read(_BLOCK)
        if not block:
            return
        while block.endswith("\r"):  # keep a "\r\n" together
            c = f.read(1)
            block += c
            if c != "\r":
                break
        if not block.endswith(("\n", "\r")):  # finish the last line, reading at most the limit
            tail = f.readline(MAX_LINE_CHARS + 1)
            start = max(block.rfind("\n"), block.rfind("\r")) + 1
            if len(block) - start + len(tail) > MAX_LINE_CHARS:
                line = seen + block.count("\n") + 1 if "\r" not in block else seen + len(_LINES(block))
                raise DataError(f"{name}, line {line}: longer than {MAX_LINE_CHARS:,} characters (the limit of a "
                                "line of a text data file); is this a text data file with one row per line?")
            block += tail
        lines = _LINES(block)
        seen += len(lines)
        yield lines


def _strip_whitespace(df, name: str):
    """Names and text labels without surrounding whitespace (a column of numbers written
    with spaces becomes numbers); warns once when anything changed."""
    pd = _pandas()
    changed = []
    names = [str(c).strip() if isinstance(c, str) else c for c in df.columns]
    if names != list(df.columns):
        changed.append("column names")
        if len(set(names)) != len(names):
            dup = next(nm for nm in names if names.count(nm) > 1)
            raise DataError(f"{name}: column name '{dup}' appears more than once once whitespace is removed")
        df.columns = names
    for c in df.columns:
        s = df[c]
        if not (pd.api.types.is_object_dtype(s.dtype) or pd.api.types.is_string_dtype(s.dtype)):
            continue
        stripped = s.str.strip()
        if stripped.equals(s):
            continue
        changed.append(f"labels of '{c}'")
        num = pd.to_numeric(stripped, errors="coerce")
        if not num.isna().any():
            stripped = num
        elif set(stripped.dropna().unique()) <= {"True", "False"}:
            stripped = stripped == "True"
        df[c] = stripped
    if changed:
        warnings.warn(f"{name}: removed whitespace around {', '.join(changed[:4])}"
                      + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
                      + " ('a, b' reads as 'a' and 'b')", UserWarning, stacklevel=4)
    return df


def _check_header(path: str, header: list, sep: str = ",") -> None:
    name = os.path.basename(path)
    if all(_looks_numeric(h.strip()) for h in header):
        raise DataError(f"{name}: the first line ({sep.join(header)}) looks like data, not a header; "
                        f"{_NUMERIC_HEADER_HINT} (or read it without one: --no-header, header=False)")
    seen = set()
    for i, h in enumerate(header):
        if not h.strip():
            raise DataError(f"{name}: header field {i + 1} is empty; every column needs a name")
        if h in seen:
            raise DataError(f"{name}: column name '{h}' appears more than once in the header")
        seen.add(h)


def _find_ragged(path: str, width: int, sep: str = ",", header: bool = True) -> tuple:
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(_bounded_lines(f, os.path.basename(path)), delimiter=sep)
        header_seen = not header
        for row in reader:
            if not row:
                continue
            if not header_seen:
                header_seen = True
                continue
            if len(row) != width:
                return reader.line_num, len(row)
    raise AssertionError("no ragged row found")  # pragma: no cover


def _find_row(path: str, r: int, j: int, sep: str = ",") -> tuple:
    """Line number and raw field j of data row r (blank lines skipped; row -1 is the first line)."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(_bounded_lines(f, os.path.basename(path)), delimiter=sep)
        k = -1
        for row in reader:
            if not row:
                continue
            if k == r:
                return reader.line_num, row[j] if j < len(row) else ""
            k += 1
    return -1, ""  # pragma: no cover


# ------------------------------------------------------------------ basis order

#: What ``FSLL(category_order=...)`` accepts (see :func:`basis_order`).
CATEGORY_ORDERS = ("auto", "frequency", "given")


def frequency_order(codes: np.ndarray, cardinalities: Sequence[int], keep: Sequence[int] = ()) -> list:
    """The canonical basis order of each variable's codes, decided by the data alone.

    Entry ``i`` is ``None`` for a variable in ``keep`` or with at most two categories
    (both orders give the same model), else an int64 array ``order`` with ``order[c]``
    the given code placed at basis position ``c``: most frequent first (code 0 is the
    +-1 basis's reference category); equal counts by their pairwise count profiles
    (for every other variable, the counts of its categories among the rows holding this
    one, sorted), which do not depend on the other variables' labels or the rows'
    order either; what is still equal (categories the data cannot tell apart, or unseen
    ones) keeps the given order.  Negative codes (missing cells) are not counted.

    >>> frequency_order(np.array([[0, 1], [2, 1], [2, 0], [1, 2], [2, 2]]), (3, 3))[0].tolist()
    [2, 0, 1]
    """
    codes = np.asarray(codes)
    n = codes.shape[1]
    keep = set(keep)
    out: list = []
    for i, k in enumerate(cardinalities):
        k = int(k)
        if i in keep or k <= 2:
            out.append(None)
            continue
        col = codes[:, i]
        seen = col >= 0
        counts = np.bincount(col[seen], minlength=k)
        keys = [(-int(counts[u]),) for u in range(k)]
        values, mult = np.unique(counts[counts > 0], return_counts=True)
        for tie in values[mult > 1]:
            for u in np.flatnonzero(counts == tie):
                rows = codes[seen & (col == u)]
                profile = []
                for j in range(n):
                    if j != i:
                        cj = rows[:, j]
                        profile.append(tuple(-np.sort(np.bincount(cj[cj >= 0], minlength=int(cardinalities[j])))[::-1]))
                keys[u] = keys[u] + (tuple(profile),)
        order = sorted(range(k), key=lambda u: (keys[u], u))
        out.append(np.array(order, dtype=np.int64))
    return out


def check_category_order(how) -> str:
    """``how`` if it is one of :data:`CATEGORY_ORDERS`, else ``ValueError``."""
    if not isinstance(how, str) or how not in CATEGORY_ORDERS:
        raise ValueError(f"category_order must be one of {', '.join(map(repr, CATEGORY_ORDERS))}, got {how!r}")
    return how


def variable_index(var, names: Sequence[str] | None, n: int) -> int:
    """The index of variable ``var`` (a name from ``names`` or an index ``0 .. n-1``)."""
    if names is not None and str(var) in [str(v) for v in names]:
        return [str(v) for v in names].index(str(var))
    if isinstance(var, (int, np.integer)) and not isinstance(var, (bool, np.bool_)) and 0 <= int(var) < n:
        return int(var)
    raise ValueError(f"unknown variable {var!r} in ordered (variables: "
                     f"{_fmt_names([str(v) for v in names]) if names is not None else f'0..{n - 1}'})")


def basis_order(how: str, codes: np.ndarray, cardinalities: Sequence[int], *, labelled: bool,
                ordered: Sequence[int] = ()) -> list | None:
    """The basis order a fit uses (:func:`frequency_order`), or ``None`` for the given order.

    ``how``: ``"frequency"`` for every variable not in ``ordered``; ``"given"``: none;
    ``"auto"``: ``"frequency"`` when the data came with labels (``labelled``: a
    DataFrame, or codes with ``categories``), ``"given"`` for bare integer codes, whose
    order is the paper's convention.
    """
    check_category_order(how)
    if how == "given" or (how == "auto" and not labelled):
        return None
    order = frequency_order(codes, cardinalities, keep=ordered)
    if all(o is None or bool(np.all(o == np.arange(len(o)))) for o in order):
        return None
    return order


def recode(codes: np.ndarray, maps: Sequence | None) -> np.ndarray:
    """``codes`` with column ``i`` mapped through ``maps[i]`` (an int array: new code of
    each old one; ``None`` or the identity: unchanged).  Negative codes (missing cells) stay
    as they are.  Returns ``codes`` itself when nothing changes, else a new array."""
    maps = _moving(maps)
    if maps is None:
        return codes
    out = np.array(codes, dtype=np.int64, copy=True)
    for i, m in enumerate(maps):
        if m is not None and i < out.shape[1]:
            col = out[:, i]
            seen = col >= 0
            col[seen] = np.asarray(m, dtype=np.int64)[col[seen]]
    return out


def inverse_orders(maps: Sequence | None) -> list:
    """The inverse permutation of every map of :func:`recode` (``None`` and the identity
    give ``None``); ``[]`` when every map is ``None`` or the identity."""
    maps = _moving(maps)
    if maps is None:
        return []
    return [None if m is None else np.argsort(np.asarray(m, dtype=np.int64)) for m in maps]


def _moving(maps: Sequence | None) -> list | None:
    """``maps`` with the identities as ``None``; ``None`` when nothing moves."""
    if maps is None:
        return None
    out = [None if m is None or np.array_equal(m, np.arange(len(m))) else m for m in maps]
    return None if all(m is None for m in out) else out


def unknown_labels(categories: Sequence[Sequence], data) -> np.ndarray:
    """``(N, n)`` bool: the cells of ``data`` (a ``DataFrame`` or 2-D array whose columns
    are in the order of ``categories``) holding a label that is not among their column's
    categories.  Missing cells (NaN, None, ``pd.NA``) are not unknown."""
    pd = _require_pandas("unknown_labels()")
    n_rows, n = (data.shape[0], data.shape[1])
    out = np.zeros((n_rows, n), dtype=bool)
    for j, cats in enumerate(categories):
        col = data.iloc[:, j] if _is_dataframe(data) else np.asarray(data)[:, j]
        values = np.asarray(col.astype(object) if _is_series(col) else col, dtype=object)
        na = np.asarray(pd.isna(values), dtype=bool)
        if na.all():
            continue
        fcodes, uniques = _factorize(values[~na])
        known = {_py(c) for c in cats}
        bad = np.array([_py(u) not in known for u in uniques], dtype=bool)
        out[~na, j] = bad[fcodes]
    return out
