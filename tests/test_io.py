"""Tests of fsll_ooc.io: encoding user data to codes, decoding, reading files, errors."""
from __future__ import annotations

import sys
import tracemalloc
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsll_ooc.io import (
    MAX_CATEGORIES,
    DataError,
    Encoded,
    check_cardinalities,
    decode,
    encode,
    encode_with,
    read_table,
)


def _raises(match_all, fn, *args, **kw):
    """Call fn, expect DataError, and check every fragment appears in the message."""
    with pytest.raises(DataError) as info:
        fn(*args, **kw)
    msg = str(info.value)
    for frag in match_all:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    assert isinstance(info.value, ValueError)
    return msg


# --------------------------------------------------------------------- numpy input

def test_int_array_codes_equal_values():
    X = np.array([[0, 2, 1], [1, 0, 1], [0, 1, 1]])
    enc = encode(X)
    assert isinstance(enc, Encoded)
    assert enc.codes.dtype == np.int64 and enc.codes.shape == (3, 3)
    np.testing.assert_array_equal(enc.codes, X)
    assert enc.names == ["X0", "X1", "X2"]
    assert enc.cardinalities == (2, 3, 2)
    assert enc.categories == [[0, 1], [0, 1, 2], [0, 1]]
    assert all(type(c) is int for cats in enc.categories for c in cats)
    assert enc.n_samples == 3 and enc.n_vars == 3
    assert "cardinalities=(2, 3, 2)" in repr(enc)


def test_declared_cardinalities_keep_unseen_codes():
    enc = encode(np.array([[0, 1], [1, 0]], dtype=np.uint8), cardinalities=[3, 4])
    assert enc.cardinalities == (3, 4)
    assert enc.categories == [[0, 1, 2], [0, 1, 2, 3]]
    assert enc.codes.dtype == np.int64


def test_list_of_rows_and_bool_array():
    assert encode([[0, 1], [1, 1]]).cardinalities == (2, 2)
    enc = encode(np.array([[True, False], [True, True]]))
    assert enc.categories == [[False, True], [False, True]]
    np.testing.assert_array_equal(enc.codes, [[1, 0], [1, 1]])
    _raises(["boolean", "declare 2"], encode, np.array([[True]]), cardinalities=[3])


def test_float_array_with_integers_is_accepted():
    enc = encode(np.array([[0.0, 2.0], [1.0, 0.0]]))
    np.testing.assert_array_equal(enc.codes, [[0, 2], [1, 0]])
    assert enc.cardinalities == (2, 3)


@pytest.mark.parametrize("bad, frags", [
    (np.nan, ["column 'X1'", "missing value (NaN)", "row 1"]),
    (np.inf, ["column 'X1'", "infinite value (inf)", "row 1"]),
    (-np.inf, ["column 'X1'", "infinite", "row 1"]),
    (1.5, ["column 'X1'", "non-integer value 1.5", "row 1"]),
])
def test_float_array_rejections(bad, frags):
    X = np.zeros((3, 2))
    X[1, 1] = bad
    _raises(frags, encode, X)


def test_shape_errors():
    _raises(["1-D", "(3,)", "reshape(-1, 1)"], encode, np.array([0, 1, 1]))
    _raises(["3-D", "(2, 2, 2)"], encode, np.zeros((2, 2, 2), dtype=int))
    _raises(["0-D"], encode, np.int64(3))
    _raises(["1-D", "Series", "to_frame"], encode, pd.Series([0, 1]))
    _raises(["cannot be read as a 2-D table"], encode, [[0, 1], [1]])


def test_empty_data():
    _raises(["no rows", "(0, 3)"], encode, np.zeros((0, 3), dtype=int))
    _raises(["no columns", "(5, 0)"], encode, np.zeros((5, 0), dtype=int))
    _raises(["no rows"], encode, pd.DataFrame({"a": pd.Series([], dtype=int)}))
    _raises(["no columns"], encode, pd.DataFrame(index=range(3)))


def test_negative_code_in_array():
    X = np.array([[0, 1], [2, -1], [1, -3]])
    _raises(["column 'X1'", "negative value -1", "row 1", "DataFrame"], encode, X)


def test_value_above_declared_cardinality():
    X = np.array([[0, 1], [1, 3], [1, 5]])
    _raises(["column 'X1'", "value 3", "row 1", ">= the declared cardinality 3", "0..2"],
            encode, X, cardinalities=(2, 3))
    _raises(["column 'X0'", "negative value -1", "row 0"],
            encode, np.array([[-1, 0]]), cardinalities=(2, 2))


def test_declared_cardinalities_validation():
    X = np.zeros((2, 2), dtype=int)
    _raises(["3 cardinalities", "2 columns", "X0, X1"], encode, X, cardinalities=(2, 2, 2))
    _raises(["'X1'", ">= 1", "got 0"], encode, X, cardinalities=(2, 0))
    _raises(["'X0'", "integer", "2.5"], encode, X, cardinalities=(2.5, 2))
    _raises(["sequence of 2 integers"], encode, X, cardinalities=2)
    _raises(["'X1'", "70000 categories", "65536"], encode, X, cardinalities=(2, 70000))


def test_too_many_categories():
    X = np.array([[0, 1], [1, MAX_CATEGORIES]])
    _raises(["column 'X1'", "65,537 categories", "values 0..65536", "limit is 65536"], encode, X)
    # labels: 70000 distinct strings
    df = pd.DataFrame({"id": [f"u{i}" for i in range(MAX_CATEGORIES + 1)]})
    _raises(["column 'id'", "65,537 categories", "65537 distinct labels"], encode, df)


def test_joint_table_limit():
    X = np.ones((2, 41), dtype=np.int8)     # 41 binary variables: 2**41 cells
    _raises(["the joint table would have 2,199,023,255,552 cells", "2**40"], encode, X)
    msg = _raises(["overflows int64"], check_cardinalities, [MAX_CATEGORIES] * 5)
    assert f"{MAX_CATEGORIES ** 5:,}" in msg
    assert check_cardinalities([2] * 40) == (2,) * 40


def test_joint_table_error_comes_before_large_allocation():
    X = np.ones((400_000, 41), dtype=np.int8)   # codes would be 131 MB of int64
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match="joint table"):
            encode(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20e6, peak


def test_sparse_integer_values_warn():
    with pytest.warns(UserWarning, match="column 'year'.*only 2 distinct values"):
        enc = encode(pd.DataFrame({"year": [1990, 2000, 1990]}))
    assert enc.cardinalities == (2001,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encode(np.array([[0], [3]]))        # small gaps do not warn


# ----------------------------------------------------------------- DataFrame input

def _mixed_frame():
    return pd.DataFrame({
        "cat": pd.Categorical(["x", "x", "y", "x"], categories=["y", "x", "z"]),
        "s": ["b", "a", "c", "a"],
        "flag": [True, True, True, True],
        "i": [0, 2, 2, 0],
        "neg": [-1, 5, 2, 5],
        "f": [1.0, 0.0, 3.0, 1.0],
    })


def test_dataframe_columns():
    enc = encode(_mixed_frame())
    assert enc.names == ["cat", "s", "flag", "i", "neg", "f"]
    assert enc.categories == [
        ["y", "x", "z"],          # categorical: own order, unused 'z' kept
        ["a", "b", "c"],          # strings: sorted
        [False, True],            # bool: both, even if only True occurs
        [0, 1, 2],                # non-negative ints: 0..max, codes equal values
        [-1, 2, 5],               # negative ints: sorted distinct values
        [0, 1, 2, 3],             # integral floats: like ints
    ]
    assert enc.cardinalities == (3, 3, 2, 3, 3, 4)
    np.testing.assert_array_equal(enc.codes, [
        [1, 1, 1, 0, 0, 1],
        [1, 0, 1, 2, 2, 0],
        [0, 2, 1, 2, 1, 3],
        [1, 0, 1, 0, 2, 1],
    ])
    assert all(type(c) in (int, str, bool) for cats in enc.categories for c in cats)


def test_dataframe_round_trip_through_decode_and_encode_with():
    df = _mixed_frame()
    enc = encode(df)
    back = decode(enc.codes, enc.categories, enc.names)
    assert list(back.columns) == enc.names
    for c in df.columns:
        assert back[c].tolist() == df[c].tolist(), c
    again = encode(back)
    assert again.categories == enc.categories
    np.testing.assert_array_equal(again.codes, enc.codes)
    np.testing.assert_array_equal(encode_with(enc.categories, df, names=enc.names), enc.codes)
    # columns picked by name: order and extra columns do not matter
    shuffled = df[df.columns[::-1]].assign(extra=1)
    np.testing.assert_array_equal(encode_with(enc.categories, shuffled, names=enc.names), enc.codes)


def test_dataframe_pandas_string_and_nullable_dtypes():
    df = pd.DataFrame({
        "s": pd.array(["b", "a"], dtype="string"),
        "i": pd.array([3, 1], dtype="Int64"),
        "b": pd.array([True, False], dtype="boolean"),
    })
    enc = encode(df)
    assert enc.categories == [["a", "b"], [0, 1, 2, 3], [False, True]]
    np.testing.assert_array_equal(enc.codes, [[1, 3, 1], [0, 1, 0]])


@pytest.mark.parametrize("col, frags", [
    (["a", None, "b"], ["column 'c'", "missing value", "row 1"]),
    (["a", "b", np.nan], ["column 'c'", "missing value", "row 2"]),
    ([1.0, np.nan, 2.0], ["column 'c'", "missing value (NaN)", "row 1"]),
    ([1.0, 2.0, np.inf], ["column 'c'", "infinite value (inf)", "row 2"]),
    ([1.0, 2.5, 2.0], ["column 'c'", "non-integer value 2.5", "row 1"]),
    (pd.array([1, None, 2], dtype="Int64"), ["column 'c'", "missing value", "row 1"]),
    (pd.array([True, None, False], dtype="boolean"), ["column 'c'", "missing value", "row 1"]),
    (pd.Categorical(["u", None, "v"]), ["column 'c'", "missing value", "row 1"]),
    (np.array(["a", float("inf"), "b"], dtype=object), ["column 'c'", "infinite value", "row 1"]),
])
def test_dataframe_bad_values(col, frags):
    _raises(frags, encode, pd.DataFrame({"ok": [0, 1, 0], "c": col}))


def test_dataframe_row_names_index_label():
    df = pd.DataFrame({"c": ["a", None]}, index=["first", "second"])
    _raises(["row 1", "index 'second'"], encode, df)


def test_dataframe_duplicate_columns_and_bad_dtype():
    df = pd.DataFrame([[0, 1]], columns=["a", "a"])
    _raises(["'a'", "more than once"], encode, df)
    df = pd.DataFrame({"t": pd.to_datetime(["2020-01-01", "2021-01-01"])})
    _raises(["column 't'", "unsupported dtype"], encode, df)


def test_dataframe_declared_cardinalities():
    df = pd.DataFrame({"i": [0, 1], "s": ["a", "b"], "c": pd.Categorical(["u", "v"])})
    enc = encode(df, cardinalities=(4, 2, 2))
    assert enc.categories[0] == [0, 1, 2, 3]
    _raises(["column 's'", "2 distinct labels", "'a', 'b'", "cardinality 3", "Categorical"],
            encode, df, cardinalities=(4, 3, 2))
    _raises(["column 'c'", "categorical with 2 categories", "cardinality 5"],
            encode, df, cardinalities=(4, 2, 5))
    _raises(["column 'i'", "value 1", "row 1", "declared cardinality 1"],
            encode, df, cardinalities=(1, 2, 2))


def test_string_array_is_encoded_as_labels():
    enc = encode(np.array([["b", "x"], ["a", "x"]]))
    assert enc.categories == [["a", "b"], ["x"]]
    np.testing.assert_array_equal(enc.codes, [[1, 0], [0, 0]])


# ------------------------------------------------------------------- encode_with

def test_encode_with_unknown_category():
    cats = [["a", "b"], [0, 1, 2]]
    df = pd.DataFrame({"s": ["a", "b", "q"], "k": [0, 2, 1]})
    _raises(["column 's'", "unknown category 'q'", "row 2", "'a', 'b'"],
            encode_with, cats, df, names=["s", "k"])
    df = pd.DataFrame({"s": ["a", "b", "a"], "k": [0, 3, 1]})
    _raises(["column 'k'", "unknown category 3", "row 1", "0..2"],
            encode_with, cats, df, names=["s", "k"])
    _raises(["column 'X1'", "unknown category -1", "row 0"],
            encode_with, [[0, 1], [0, 1]], np.array([[0, -1]]))
    _raises(["column 'X0'", "unknown category 0.5"], encode_with, [[0, 1]], np.array([[0.5]]))


def test_encode_with_labels_and_types():
    cats = [[False, True], ["lo", "hi"], [0, 1, 2, 3]]
    codes = encode_with(cats, np.array([[True, "hi", 3], [False, "lo", 0]], dtype=object))
    np.testing.assert_array_equal(codes, [[1, 1, 3], [0, 0, 0]])
    # integer categories match integral floats (e.g. a CSV column read as float)
    np.testing.assert_array_equal(encode_with([[0, 1, 2]], np.array([[2.0], [0.0]])), [[2], [0]])
    # negative integer categories (not 0..k-1) go through the label path
    np.testing.assert_array_equal(encode_with([[-1, 2, 5]], np.array([[5], [-1]])), [[2], [0]])


def test_encode_with_shape_and_missing():
    cats = [["a", "b"], ["u"]]
    _raises(["2 variables", "3 columns"], encode_with, cats, np.zeros((2, 3), dtype=int))
    _raises(["2 variables", "1 columns"], encode_with, cats, pd.DataFrame({"s": ["a"]}))
    _raises(["lacks the model's column(s) 't'", "data: 's', 'v'"], encode_with, cats,
            pd.DataFrame({"s": ["a"], "v": ["u"]}), names=["s", "t"])
    _raises(["column 's'", "missing value", "row 1"], encode_with, cats,
            pd.DataFrame({"s": ["a", None], "t": ["u", "u"]}), names=["s", "t"])
    _raises(["column 'X0'", "missing value (NaN)", "row 0"], encode_with, [[0, 1]], np.array([[np.nan]]))
    _raises(["1-D"], encode_with, cats, np.array([0, 1]))
    _raises(["no rows"], encode_with, cats, np.zeros((0, 2), dtype=int))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=3, max_size=3), min_size=1, max_size=30))
def test_round_trip_property(rows):
    X = np.array(rows, dtype=np.int64)
    enc = encode(X)
    np.testing.assert_array_equal(enc.codes, X)
    assert enc.cardinalities == tuple(int(m) + 1 for m in X.max(axis=0))
    back = decode(enc.codes, enc.categories, enc.names)
    np.testing.assert_array_equal(encode_with(enc.categories, back, names=enc.names), X)
    np.testing.assert_array_equal(encode_with(enc.categories, X), X)


def test_decode_validates():
    _raises(["codes of shape (2,)"], decode, np.array([0, 1]), [[0, 1]])
    _raises(["'X0'", "0..1"], decode, np.array([[2]]), [[0, 1]])
    df = decode(np.array([[0, 1]]), [["a", "b"], [1, "x"]], ["p", "q"])
    assert df.iloc[0].tolist() == ["a", "x"]


# ---------------------------------------------------------------------- read_table

def _write(path, text):
    path.write_text(text)
    return path


def test_read_csv_string_and_integer_labels(tmp_path):
    f = _write(tmp_path / "d.csv", "colour,size,ok\nred,1,True\nblue,0,False\nred,3,True\n")
    df = read_table(f)
    assert list(df.columns) == ["colour", "size", "ok"]
    enc = encode(df)
    assert enc.categories == [["blue", "red"], [0, 1, 2, 3], [False, True]]
    np.testing.assert_array_equal(enc.codes, [[1, 1, 1], [0, 0, 0], [1, 3, 1]])


def test_read_csv_errors_name_the_line(tmp_path):
    f = _write(tmp_path / "short.csv", "a,b,c\n1,x,2\n2,y\n3,z,1\n")
    _raises(["short.csv, line 3", "2 fields", "header has 3", "a, b, c"], read_table, f)
    f = _write(tmp_path / "long.csv", "a,b\n1,2\n1,2\n1,2,3\n")
    _raises(["long.csv, line 4", "3 fields", "header has 2"], read_table, f)
    f = _write(tmp_path / "allong.csv", "a,b\n1,2,3\n4,5,6\n")   # pandas would drop a column
    _raises(["line 2", "3 fields"], read_table, f)
    f = _write(tmp_path / "na.csv", "a,b\n1,x\n2,\n")
    _raises(["na.csv, line 3", "column 'b'", "missing value ('')"], read_table, f)
    f = _write(tmp_path / "na2.csv", "a,b\n1,x\n\n2,NA\n")
    _raises(["na2.csv, line 4", "column 'b'", "missing value ('NA')"], read_table, f)


def test_read_csv_header_checks(tmp_path):
    _raises(["looks like data", "header row"], read_table, _write(tmp_path / "h.csv", "0,1\n1,0\n"))
    _raises(["is empty"], read_table, _write(tmp_path / "e.csv", ""))
    _raises(["no data rows"], read_table, _write(tmp_path / "o.csv", "a,b\n"))
    _raises(["header field 2 is empty"], read_table, _write(tmp_path / "x.csv", "a,,c\n1,2,3\n"))
    _raises(["'a' appears more than once"], read_table, _write(tmp_path / "d.csv", "a,a\n1,2\n"))


def test_read_csv_blank_lines_and_row_lines(tmp_path):
    f = _write(tmp_path / "b.csv", "a,b\n0,1\n\n1,1\n\n")
    df = read_table(f)
    assert df.shape == (2, 2)
    # without blank lines the encode error names the CSV line
    f = _write(tmp_path / "v.csv", "a,b\n0,1\n1,1.5\n")
    _raises(["column 'b'", "non-integer value 1.5", "row 1 (line 3 of v.csv)"], encode, read_table(f))


def test_read_table_file_types(tmp_path):
    _raises(["unsupported file type '.xlsx'", ".csv, .tsv, .txt, .npy, .parquet"], read_table, tmp_path / "d.xlsx")
    _raises(["unsupported file type '(none)'"], read_table, tmp_path / "noext")
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_table(tmp_path / "missing.csv")
    X = np.array([[0, 1], [2, 0]], dtype=np.int16)
    np.save(tmp_path / "x.npy", X)
    got = read_table(tmp_path / "x.npy")
    np.testing.assert_array_equal(encode(got).codes, X)
    np.save(tmp_path / "o.npy", np.array([["a"]], dtype=object), allow_pickle=True)
    _raises(["cannot read", "o.npy", "numeric or bool"], read_table, tmp_path / "o.npy")


def test_read_parquet_keeps_categories(tmp_path):
    pytest.importorskip("pyarrow")
    df = pd.DataFrame({"c": pd.Categorical(["b", "a"], categories=["b", "a", "z"]), "i": [0, 3]})
    df.to_parquet(tmp_path / "d.parquet")
    enc = encode(read_table(tmp_path / "d.parquet"))
    assert enc.categories == [["b", "a", "z"], [0, 1, 2, 3]]
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    _raises(["cannot read", "as Parquet"], read_table, tmp_path / "bad.parquet")


def test_read_parquet_without_pyarrow(tmp_path, monkeypatch):
    (tmp_path / "d.parquet").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="needs pyarrow.*pip install pyarrow"):
        read_table(tmp_path / "d.parquet")


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from(["a", ",", "\n", "\r", "\r\n", "\x0c", "\u2028", '"', "ü"]), max_size=400),
       st.integers(1, 40))
def test_bounded_lines_split_as_the_file_does(parts, block):
    """Text data files are read in bounded blocks; the lines are those of iterating the file."""
    import io as _io

    from fsll_ooc import io as fio

    text = "".join(parts)
    old, fio._BLOCK = fio._BLOCK, block
    try:
        got = list(fio._bounded_lines(_io.StringIO(text, newline=""), "t.csv"))
    finally:
        fio._BLOCK = old
    assert got == list(_io.StringIO(text, newline=""))


def test_a_column_of_booleans_and_numbers_is_refused_not_merged():
    """``True == 1`` in Python: a column ``[True, 1, 0, False]`` would become two labels
    where the user wrote four values of two kinds, so it is refused by name."""
    df = pd.DataFrame({"a": [True, 1, 0, False] * 5, "b": [0, 1] * 10})
    _raises(["column 'a'", "booleans", "True at row 0", "1 at row 1", "astype(str)"], encode, df)
    assert encode(pd.DataFrame({"a": [True, False] * 5})).categories[0] == [False, True]
    assert encode(pd.DataFrame({"a": ["x", True] * 5})).categories[0] == [True, "x"]
