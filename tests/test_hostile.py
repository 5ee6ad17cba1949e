"""Hostile input: property-based tests over ``FSLL.fit``, scoring, model files and the CLI.

Every case ends in success (then the model is sane) or a clear exception: ``ValueError``
(its subclasses ``PlanError``, ``DataError``, ``IntegrityError`` included) with a message,
or ``FileNotFoundError``; from the CLI, exit code 2 and one line ``fsll-ooc: error: ...``.
Never another exception type, a traceback or a partial file left behind (a hang would
keep the suite from finishing: there are no wall-clock limits in the tests).

Hypothesis runs derandomized (a fixed sequence of examples, no example database), so CI
sees the same inputs every run; ``FSLL_HOSTILE_EXAMPLES`` (default 25) scales every test's
number of examples.  Counts of tried inputs are in docs/reliability.md
(``FSLL_HOSTILE_EXAMPLES=100 python -m pytest tests/test_hostile.py --hypothesis-show-statistics``).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from fsll_ooc import FSLL, cli

N_EXAMPLES = int(os.environ.get("FSLL_HOSTILE_EXAMPLES", "25"))
SETTINGS = settings(max_examples=N_EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])
CLEAN = (ValueError, FileNotFoundError)


def refused_cleanly(exc: BaseException) -> bool:
    return isinstance(exc, CLEAN) and len(str(exc)) > 10 and "\n" not in str(exc).strip()


def assert_sane(m, X=None):
    p = np.asarray(m.probabilities())
    assert p.shape == tuple(m.cardinalities_)
    assert np.all(np.isfinite(p)) and np.all(p > 0) and math.isclose(float(p.sum()), 1.0, rel_tol=1e-9)
    assert math.isfinite(m.cost_) and all(math.isfinite(v) for v in m.theta_.values())
    if X is not None:
        assert np.all(np.isfinite(m.log_prob(X)))


# ============================================================================ fit: edge cases that must work

@st.composite
def valid_data(draw):
    n = draw(st.integers(1, 4))
    N = draw(st.integers(1, 40))
    cards = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    codes = np.array(draw(st.lists(st.lists(st.integers(0, 3), min_size=n, max_size=n), min_size=N, max_size=N)))
    codes = codes % np.array(cards)
    if draw(st.booleans()):  # a constant column
        codes[:, draw(st.integers(0, n - 1))] = 0
    dtype = draw(st.sampled_from([np.int64, np.int32, np.int8, np.uint8, np.uint64, np.float64, np.float32]))
    declared = draw(st.sampled_from([None, "exact", "wider"]))
    decl = None if declared is None else [k + (declared == "wider") for k in cards]
    return codes.astype(dtype), decl


@SETTINGS
@given(valid_data())
def test_edge_case_data_fits(case):
    """One sample, one column, constant columns, cardinality 1, any integer/float dtype: all fit."""
    X, decl = case
    m = FSLL(cardinalities=decl, progress=False).fit(X)
    assert_sane(m, X)
    event(f"fitted: N={'1' if len(X) == 1 else '>1'}, n={'1' if X.shape[1] == 1 else '>1'}, "
          f"constant column={bool((X == X[0]).all(axis=0).any())}")
    if decl is not None:
        assert m.cardinalities_ == tuple(decl)


# ============================================================================ fit: hostile arrays

MUTATIONS = ["nan", "inf", "-inf", "negative", "fraction", "huge-float", "huge-uint", "above-card", "ndim-1",
             "ndim-3", "scalar", "no-rows", "no-columns", "strings", "object-none", "complex", "datetime",
             "ragged-list", "cards-length", "cards-zero", "cards-negative", "cards-float", "cards-str",
             "cards-scalar", "cards-overflow", "cards-huge-table", "too-many-categories"]


@st.composite
def hostile_data(draw, kind):
    n = draw(st.integers(1, 4))
    N = draw(st.integers(1, 20))
    X = np.array(draw(st.lists(st.lists(st.integers(0, 2), min_size=n, max_size=n), min_size=N, max_size=N)))
    r, c = draw(st.integers(0, N - 1)), draw(st.integers(0, n - 1))
    cards = None
    if kind in ("nan", "inf", "-inf", "fraction", "huge-float"):
        X = X.astype(draw(st.sampled_from([np.float64, np.float32])) if kind != "huge-float" else np.float64)
        X[r, c] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "fraction": 0.5,
                   "huge-float": draw(st.sampled_from([1e300, 2.0**63, 2.0**64, 9.3e18]))}[kind]
    elif kind == "negative":
        X[r, c] = -draw(st.integers(1, 2**62))
    elif kind == "huge-uint":
        X = X.astype(np.uint64)
        X[r, c] = draw(st.integers(2**63, 2**64 - 1))
    elif kind == "above-card":
        cards = [3] * n
        X[r, c] = draw(st.integers(3, 2**40))
    elif kind == "ndim-1":
        X = X.reshape(-1)
    elif kind == "ndim-3":
        X = X.reshape(1, N, n)
    elif kind == "scalar":
        X = np.int64(1)
    elif kind == "no-rows":
        X = np.zeros((0, n), dtype=int)
    elif kind == "no-columns":
        X = np.zeros((N, 0), dtype=int)
    elif kind == "strings":
        X = X.astype(str)
    elif kind == "object-none":
        X = X.astype(object)
        X[r, c] = None
    elif kind == "complex":
        X = X.astype(complex)
    elif kind == "datetime":
        X = X.astype("datetime64[D]")
    elif kind == "ragged-list":
        X = [list(row) for row in X] + [[0] * (n + 1)]
    elif kind == "cards-length":
        cards = [3] * (n + draw(st.sampled_from([-1, 1, 5])))
    elif kind == "cards-zero":
        cards = [3] * n
        cards[c] = 0
    elif kind == "cards-negative":
        cards = [3] * n
        cards[c] = -draw(st.integers(1, 10))
    elif kind == "cards-float":
        cards = [3] * n
        cards[c] = draw(st.sampled_from([2.5, float("nan"), float("inf")]))
    elif kind == "cards-str":
        cards = draw(st.sampled_from(["3,3", "abc", ["3", "x"] * n]))
    elif kind == "cards-scalar":
        cards = draw(st.sampled_from([3, 3.0, True]))
    elif kind == "cards-overflow":  # the product overflows int64
        cards = [2**16] * max(n, 4) if n >= 4 else [2**40] * n
        X = np.zeros((N, len(cards)), dtype=int)
    elif kind == "cards-huge-table":  # fits int64, above the 2**40-cell limit
        cards = [2**12] * 4
        X = np.zeros((N, 4), dtype=int)
    elif kind == "too-many-categories":
        X[r, c] = 2**16 + draw(st.integers(0, 10))
    return kind, X, cards


@pytest.mark.parametrize("kind", MUTATIONS)
@settings(SETTINGS, max_examples=max(1, N_EXAMPLES // 5))
@given(data=st.data())
def test_hostile_arrays_are_refused_cleanly(kind, data):
    """Every kind of hostile array, each with N_EXAMPLES // 5 drawn shapes and positions."""
    kind, X, cards = data.draw(hostile_data(kind))
    try:
        FSLL(cardinalities=cards, progress=False).fit(X)
    except BaseException as e:  # noqa: BLE001
        assert refused_cleanly(e), f"{kind}: {type(e).__name__}: {e}"
        event(f"refused: {kind} ({type(e).__name__})")
    else:
        pytest.fail(f"{kind}: accepted")


def test_every_hostile_kind_is_covered():
    assert len(MUTATIONS) == len(set(MUTATIONS)) >= 25


# ============================================================================ scoring

@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(0)
    X = rng.integers(0, 3, size=(200, 3))
    X[:, 1] = (X[:, 0] + (rng.random(200) < 0.2)) % 3
    return FSLL(cardinalities=[3, 3, 4], progress=False).fit(X)


# (a NaN cell is a missing cell, marginalised out: tests/test_missing.py)
@pytest.mark.parametrize("kind", ["unknown", "negative", "fraction", "ncols", "ndim", "strings", "empty"])
@settings(SETTINGS, max_examples=max(1, N_EXAMPLES // 5))
@given(c=st.integers(0, 2), v=st.integers(3, 10**6))
def test_hostile_rows_at_scoring_time(model, kind, c, v):
    X = np.zeros((4, 3), dtype=int)
    if kind == "unknown":
        X[1, c] = v if c < 2 else max(v, 4)
    elif kind == "negative":
        X[2, c] = -v
    elif kind == "fraction":
        X = X.astype(float)
        X[0, c] = 0.25
    elif kind == "ncols":
        X = np.zeros((4, 2 + 2 * (c % 2)), dtype=int)
    elif kind == "ndim":
        X = np.zeros((1, 2, 3), dtype=int)
    elif kind == "strings":
        X = X.astype(str)
    else:
        X = np.zeros((0, 3), dtype=int)
    for f in (model.log_prob, model.score):
        with pytest.raises(CLEAN) as ei:
            f(X)
        assert refused_cleanly(ei.value), (kind, ei.value)
    event(f"refused: {kind}")


@pytest.mark.parametrize("row", [np.array([[2**64 - 1, 0, 0]], dtype=np.uint64), np.array([[1e300, 0.0, 0.0]]),
                                 np.array([[0, 2**63, 0]], dtype=np.uint64), np.array([[0, 0, 2.0**63]])])
def test_unrepresentable_codes_at_scoring_time(model, row):
    """Codes that cannot be int64 are refused, not wrapped around onto another cell."""
    with pytest.raises(ValueError, match="too large to be a category code"):
        model.log_prob(row)


def test_unknown_labels_at_scoring_time():
    import pandas as pd

    df = pd.DataFrame({"colour": ["red", "green", "blue", "red"] * 20, "n": [0, 1, 2, 1] * 20})
    m = FSLL(progress=False).fit(df)
    with pytest.raises(ValueError, match="purple"):
        m.log_prob(pd.DataFrame({"colour": ["purple"], "n": [0]}))


# ============================================================================ model files

@pytest.fixture(scope="module")
def model_json(model, tmp_path_factory):
    p = tmp_path_factory.mktemp("models") / "m.json"
    model.save(p)
    return p.read_text()


# an explicit alphabet: hypothesis' full-unicode text strategy builds a character map on first
# use (~150 MiB transient in a fresh checkout), which the memory tests of the suite would notice
_short_text = st.text(alphabet="ab0 ü\"\\,\n", max_size=5)
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) |
                           _short_text, lambda ch: st.lists(ch, max_size=3) |
                           st.dictionaries(_short_text, ch, max_size=3), max_leaves=6)


@st.composite
def malformed_model(draw, text):
    obj = json.loads(text)
    kind = draw(st.sampled_from(["drop-key", "replace-value", "truncate", "garbage", "theta-entry", "version"]))
    if kind == "drop-key":
        obj.pop(draw(st.sampled_from(sorted(obj))))
    elif kind == "replace-value":
        obj[draw(st.sampled_from(sorted(obj)))] = draw(json_values)
    elif kind == "theta-entry":
        if obj["theta"]:
            obj["theta"][draw(st.integers(0, len(obj["theta"]) - 1))] = draw(json_values)
        else:
            obj["theta"] = [draw(json_values)]
    elif kind == "version":
        obj["version"] = draw(st.sampled_from([2, 99, -1, "1", None, 1.5]))
    data = json.dumps(obj).encode()
    if kind == "truncate":
        data = text.encode()[: draw(st.integers(0, len(text) - 1))]
    elif kind == "garbage":
        data = draw(st.binary(max_size=200))
    return kind, data


@settings(SETTINGS, max_examples=3 * N_EXAMPLES)
@given(data=st.data())
def test_malformed_model_files(model_json, tmp_path_factory, data):
    kind, blob = data.draw(malformed_model(model_json))
    path = tmp_path_factory.mktemp("bad") / "m.json"
    path.write_bytes(blob)
    try:
        m = FSLL.load(path)
    except BaseException as e:  # noqa: BLE001
        assert refused_cleanly(e), f"{kind}: {type(e).__name__}: {e}"
        assert str(path) in str(e) or isinstance(e, FileNotFoundError), e  # the message names the file
        event(f"refused: {kind}")
        return
    event(f"loaded (still valid): {kind}")
    # it loaded (the change kept it valid): using it must work or refuse cleanly
    try:
        ks = m.cardinalities_
        X = np.zeros((2, len(ks)), dtype=int)
        assert np.asarray(m.log_prob(X)).shape == (2,)
        m.interactions(as_frame=False)
    except BaseException as e:  # noqa: BLE001
        assert refused_cleanly(e), f"{kind} (loaded, then used): {type(e).__name__}: {e}"


@pytest.mark.parametrize("field,value", [("categories", []), ("feature_names", ["a"]), ("categories", [[0], [1], [2]])])
def test_model_file_with_labels_that_do_not_match(model_json, tmp_path, field, value):
    obj = json.loads(model_json)
    obj[field] = value
    (tmp_path / "m.json").write_text(json.dumps(obj))
    rc, _, err = run_cli("info", tmp_path / "m.json")
    assert_one_line_error(rc, err, field)


@pytest.mark.parametrize("cards", [[3, 3, 2**40], [3, 3, 0], [2**16] * 3 + [2**15]])
def test_model_file_with_absurd_cardinality(model_json, tmp_path, cards):
    obj = json.loads(model_json)
    obj["cardinalities"] = cards
    obj["categories"] = None
    (tmp_path / "m.json").write_text(json.dumps(obj))
    with pytest.raises(ValueError, match="malformed fsll-ooc model file"):
        FSLL.load(tmp_path / "m.json")


# ============================================================================ CLI

def run_cli(*argv):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = cli.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def assert_one_line_error(rc, err, case):
    assert rc == 2, f"{case}: exit {rc}, stderr {err!r}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsll-ooc: error: "), f"{case}: {err!r}"
    assert "Traceback" not in err


FIELDS = st.sampled_from(["0", "1", "2", "3", "-1", "1.5", "nan", "NaN", "inf", "", " ", "1e400", "99999999999999999999",
                          "red", "blue", "ü", "\"a,b\"", "0x10", "True", "None", "2.0"])


CLEAN_FIELDS = st.sampled_from(["0", "1", "2", "red", "blue", "True", "False", "-1", "2.0"])


def _reason(err: str) -> str:
    """A short class of a CLI error line (for the statistics in docs/reliability.md)."""
    text = err.strip().removeprefix("fsll-ooc: error: ").lower()
    for key in ("empty", "header", "ragged", "missing", "not a finite", "cardinalit", "categories", "integer",
                "label", "json", "format", "version", "malformed", "unknown", "column", "utf", "decode"):
        if key in text:
            return key
    return text[:30]


@st.composite
def csv_text(draw):
    kind = draw(st.sampled_from(["clean", "clean", "table", "table", "ragged", "empty", "header-only", "garbage",
                                 "blank-lines"]))
    if kind == "empty":
        return kind, b""
    if kind == "garbage":
        return kind, draw(st.binary(min_size=1, max_size=300))
    n = draw(st.integers(1, 4))
    names = (draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=n, max_size=n, unique=True))
             if kind == "clean" else
             draw(st.lists(st.sampled_from(["a", "b", "c", "a", "", "1", "x y"]), min_size=n, max_size=n)))
    rows = []
    for _ in range(draw(st.integers(0 if kind == "header-only" else 1, 30 if kind != "header-only" else 0))):
        w = n + (draw(st.sampled_from([-1, 1, 2])) if kind == "ragged" and draw(st.booleans()) else 0)
        rows.append([draw(CLEAN_FIELDS if kind == "clean" else FIELDS) for _ in range(max(w, 0))])
    if kind == "ragged" and all(len(r) == n for r in rows):
        rows.append(["0"] * (n + 1))
    lines = [",".join(names)] + [",".join(r) for r in rows]
    if kind == "blank-lines":
        lines = [""] + lines + ["", ""]
    return kind, ("\n".join(lines) + "\n").encode()


@settings(SETTINGS, max_examples=2 * N_EXAMPLES)
@given(case=csv_text(), cards=st.sampled_from([None, None, "2,2", "3", "0,1", "2,x", "65537,2", "4,4,4,4"]))
def test_cli_fit_on_hostile_csv(tmp_path_factory, case, cards):
    kind, blob = case
    d = tmp_path_factory.mktemp("clifit")
    data = d / "data.csv"
    data.write_bytes(blob)
    out = d / "model.json"
    argv = ["fit", data, "--out", out, "--quiet"] + (["--cardinalities", cards] if cards else [])
    rc, stdout, err = run_cli(*argv)
    if rc == 0:
        assert out.exists()
        FSLL.load(out)
        event(f"fitted: {kind}")
    else:
        assert_one_line_error(rc, err, (kind, cards, blob[:200]))
        assert not out.exists()  # no partial model left looking valid
        event(f"refused (exit 2): {kind}: {_reason(err)}")
    assert sorted(p.name for p in d.iterdir()) == sorted(["data.csv"] + (["model.json"] if rc == 0 else []))


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("climodel")
    (d / "train.csv").write_text("colour,n\n" + "red,0\nblue,1\ngreen,2\nred,1\n" * 30)
    assert run_cli("fit", d / "train.csv", "--out", d / "m.json", "--quiet")[0] == 0
    return d / "m.json"


@SETTINGS
@given(case=csv_text())
def test_cli_score_on_hostile_csv(cli_model, tmp_path_factory, case):
    kind, blob = case
    data = tmp_path_factory.mktemp("cliscore") / "data.csv"
    data.write_bytes(blob)
    rc, stdout, err = run_cli("score", cli_model, data)
    if rc != 0:
        assert_one_line_error(rc, err, (kind, blob[:200]))
    event(f"scored: {kind}" if rc == 0 else f"refused (exit 2): {kind}: {_reason(err)}")


def test_cli_score_unknown_category(cli_model, tmp_path):
    (tmp_path / "d.csv").write_text("colour,n\npurple,0\n")
    rc, _, err = run_cli("score", cli_model, tmp_path / "d.csv")
    assert_one_line_error(rc, err, "unknown category")
    assert "purple" in err


@settings(SETTINGS, max_examples=2 * N_EXAMPLES)
@given(data=st.data(), command=st.sampled_from(["info", "sample", "score"]))
def test_cli_malformed_model_files(model_json, cli_model, tmp_path_factory, data, command):
    kind, blob = data.draw(malformed_model(model_json))
    d = tmp_path_factory.mktemp("clibad")
    bad = d / "bad.json"
    bad.write_bytes(blob)
    (d / "d.csv").write_text("X0,X1,X2\n0,0,0\n")
    argv = {"info": ["info", bad], "sample": ["sample", bad, "-n", "3"], "score": ["score", bad, d / "d.csv"]}[command]
    rc, _, err = run_cli(*argv)
    if rc != 0:
        assert_one_line_error(rc, err, (command, kind, blob[:200]))
    event(f"{command} {'ok' if rc == 0 else 'refused (exit 2)'}: {kind}")


# ============================================================================ CLI: named hostile cases

def _write_case_files(d, model_json):
    """The files the named cases below refer to."""
    (d / "train.csv").write_text("a,b,c\n" + "0,1,x\n1,0,y\n1,1,x\n" * 10)
    (d / "five.csv").write_text("a,b,c,d,e\n" + "0,1,0,1,0\n" * 5)
    (d / "ragged-short.csv").write_text("a,b,c\n0,1,x\n1\n")
    (d / "ragged-long.csv").write_text("a,b,c\n0,1,x\n1,0,y,7\n")
    (d / "empty.csv").write_text("")
    (d / "header-only.csv").write_text("a,b,c\n")
    (d / "unknown-label.csv").write_text("a,b,c\n0,1,purple\n")
    (d / "unknown-code.csv").write_text("a,b,c\n0,7,x\n")
    (d / "missing-column.csv").write_text("a,b\n0,1\n")
    np.save(d / "object.npy", np.array([[1, None]], dtype=object))
    np.save(d / "ok.npy", np.zeros((5, 3), dtype=int))
    (d / "truncated.npy").write_bytes((d / "ok.npy").read_bytes()[:100])
    assert run_cli("fit", d / "train.csv", "--out", d / "m.json", "--quiet")[0] == 0
    text = (d / "m.json").read_text()
    (d / "truncated.json").write_text(text[: len(text) // 2])
    (d / "binary.json").write_bytes(bytes(range(256)))
    obj = json.loads(text)
    obj.update(cardinalities=[1024] * 4, theta=[], categories=None, feature_names=None,  # 2**40 cells: the limit
               log_z=40 * math.log(2))  # the log Z of no parameters
    (d / "huge-table.json").write_text(json.dumps(obj))
    obj = json.loads(text)
    obj["cardinalities"] = [2**40, 2, 2]
    (d / "absurd-card.json").write_text(json.dumps(obj))
    (d / "not-a-store").mkdir()
    (d / "not-a-store" / "notes.txt").write_text("precious")
    # a store whose fit is not complete, and one whose state file is truncated
    from fsll_ooc import storage

    assert run_cli("fit", d / "train.csv", "--out", d / "s.json", "--store", d / "store", "--quiet")[0] == 0
    shutil.copytree(d / "store", d / "running-store")
    sf = d / "running-store" / "fsll_state.json"
    st = storage.read_json(sf, checksum=True)
    st["status"] = "running"
    storage.write_json_atomic(sf, st, checksum=True)
    shutil.copytree(d / "store", d / "torn-store")
    tf = d / "torn-store" / "fsll_state.json"
    tf.write_bytes(tf.read_bytes()[:300])
    shutil.copytree(d / "store", d / "altered-store")
    af = d / "altered-store" / "fsll_state.json"
    af.write_text(af.read_text().replace('"status": "complete"', '"status": "complete" '))
    shutil.copytree(d / "store", d / "old-labels-store")  # a labels file of an older version: ignored
    (d / "old-labels-store" / "fsll_cli_labels.json").write_text('{"names": 3}')


#: (case, argv with {d} for the case directory, a word the one-line message must contain)
CLI_CASES = [
    ("fit: ragged CSV, short row", "fit {d}/ragged-short.csv --out {d}/o.json", "line 3"),
    ("fit: ragged CSV, long row", "fit {d}/ragged-long.csv --out {d}/o.json", "line 3"),
    ("fit: empty CSV", "fit {d}/empty.csv --out {d}/o.json", "empty"),
    ("fit: header only", "fit {d}/header-only.csv --out {d}/o.json", "no"),
    ("fit: cardinality product overflows int64", "fit {d}/five.csv --out {d}/o.json --cardinalities "
     + ",".join(["65536"] * 5), "cells"),
    ("fit: cardinality above int64", "fit {d}/five.csv --out {d}/o.json --cardinalities 99999999999999999999,2,2,2,2",
     "categories"),
    ("fit: table larger than memory, in core", "fit {d}/five.csv --out {d}/o.json --cardinalities "
     + "65536,65536,2,2,2", "memory"),
    ("fit --store: a directory holding other files", "fit {d}/train.csv --out {d}/o.json --store {d}/not-a-store",
     "not an fsll-ooc store"),
    ("fit --store: tables larger than the disk", "fit {d}/five.csv --out {d}/o.json --store {d}/big-store "
     "--cardinalities 65536,65536,16,2,2", "disk"),
    ("fit: cardinalities of another length", "fit {d}/train.csv --out {d}/o.json --cardinalities 2,2", "declared"),
    ("fit: value above the declared cardinality", "fit {d}/five.csv --out {d}/o.json --cardinalities 1,1,1,1,1",
     "declared"),
    ("fit: object .npy", "fit {d}/object.npy --out {d}/o.json", "object.npy"),
    ("fit: truncated .npy", "fit {d}/truncated.npy --out {d}/o.json", "truncated.npy"),
    ("fit: missing data file", "fit {d}/nowhere.csv --out {d}/o.json", "nowhere.csv"),
    ("fit: output directory missing", "fit {d}/train.csv --out {d}/no/such/dir/o.json", "does not exist"),
    ("fit: --store is a file", "fit {d}/train.csv --out {d}/o.json --store {d}/train.csv", "directory"),
    ("score: unknown category label", "score {d}/m.json {d}/unknown-label.csv", "purple"),
    ("score: unknown integer code", "score {d}/m.json {d}/unknown-code.csv", "7"),
    ("score: ragged CSV", "score {d}/m.json {d}/ragged-long.csv", "line 3"),
    ("score: a column missing", "score {d}/m.json {d}/missing-column.csv", "c"),
    ("info: truncated model file", "info {d}/truncated.json", "truncated.json"),
    ("info: binary model file", "info {d}/binary.json", "binary.json"),
    ("info: cardinality 2^40 in the model file", "info {d}/absurd-card.json", "absurd-card.json"),
    ("info: a directory that is no store", "info {d}/not-a-store", "not-a-store"),
    ("info: store of an unfinished fit", "info {d}/running-store", "not complete"),
    ("info: store with a truncated state file", "info {d}/torn-store", "fsll_state.json"),
    ("info: store with an altered state file", "info {d}/altered-store", "fsll_state.json"),
    ("sample: truncated model file", "sample {d}/truncated.json -n 3", "truncated.json"),
    ("sample: table larger than memory", "sample {d}/huge-table.json -n 3", "memory"),
    ("sample: more samples than memory", "sample {d}/m.json -n 1000000000000", "batches"),
    ("sample: -n 0", "sample {d}/m.json -n 0", "positive"),
    ("score: malformed model file", "score {d}/binary.json {d}/train.csv", "binary.json"),
]


@pytest.fixture(scope="module")
def case_dir(model_json, tmp_path_factory):
    d = tmp_path_factory.mktemp("clicases")
    _write_case_files(d, model_json)
    return d


def assert_refused_in_one_line(d, case, argv, word):
    """``argv`` (``{d}`` is the case directory) exits 2 with one line holding ``word`` and
    writes nothing in ``d``."""
    before = sorted(p.name for p in d.iterdir())
    rc, out, err = run_cli(*argv.format(d=d).split())
    assert_one_line_error(rc, err, case)
    assert word in err, (case, err)
    assert sorted(p.name for p in d.iterdir()) == before  # nothing written, nothing half-written


@pytest.mark.parametrize("case,argv,word", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_named_hostile_cases(case_dir, case, argv, word):
    assert_refused_in_one_line(case_dir, case, argv, word)


def test_store_labels_come_from_its_state(case_dir):
    """The column names of a CLI fit live in the store's state; an older version's labels file is ignored."""
    rc, out, err = run_cli("info", case_dir / "old-labels-store", "--json")
    assert rc == 0, err
    names = json.loads(out)["names"]
    rc, out, _ = run_cli("info", case_dir / "s.json", "--json")
    assert rc == 0 and names == json.loads(out)["names"] and names != [f"X{i}" for i in range(len(names))]


def test_cli_named_cases_are_many():
    assert len(CLI_CASES) == len({c[0] for c in CLI_CASES}) >= 25


# ============================================================================ bounded reads

def _write_unbounded_files(d, model_json):
    """Inputs that are not bounded data: each must be refused after reading little of it."""
    from fsll_ooc.validation import MAX_LINE_CHARS

    os.mkfifo(d / "fifo.csv")
    os.symlink("/dev/zero", d / "zero.csv")
    os.symlink(d / "nowhere.csv", d / "dangling.csv")
    (d / "folder.csv").mkdir()
    with open(d / "long-line.csv", "w") as f:  # one line just over the limit
        f.write("a,b\n" + "x" * MAX_LINE_CHARS + ",1\n")
    (d / "wide.csv").write_text(",".join(f"c{i}" for i in range(100_000)) + "\n" + ",".join("0" * 100_000) + "\n")
    (d / "train.csv").write_text("a,b,c\n" + "0,1,x\n1,0,y\n1,1,x\n" * 10)
    with open(d / "huge.json", "wb") as f:  # 300 MiB, sparse: refused by its size, never read
        f.write(b'{"format": "fsll-ooc-model"')
        f.truncate(300 * 2**20)
    (d / "deep.json").write_text('{"format": "fsll-ooc-model", "version": 1, "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    os.mkfifo(d / "fifo.json")
    obj = json.loads(model_json)
    n = len(obj["cardinalities"])
    for name, field, value in [("dup-cats", "categories", lambda c: [[c[0][0]] * len(c[0])] + c[1:]),
                               ("null-cats", "categories", lambda c: [[None] + c[0][1:]] + c[1:]),
                               ("list-cats", "categories", lambda c: [[[0]] + c[0][1:]] + c[1:]),
                               ("dup-names", "feature_names", lambda _: ["a"] * n),
                               ("null-names", "feature_names", lambda _: [None] * n)]:
        o = dict(obj)
        cats = obj["categories"] or [list(range(k)) for k in obj["cardinalities"]]
        o[field] = value(cats)
        (d / f"{name}.json").write_text(json.dumps(o))
    import pyarrow as pa
    import pyarrow.parquet as pq

    for kind, col in [("bytes", pa.array([b"x", b"y"] * 5)), ("list", pa.array([[1], [2]] * 5)),
                      ("struct", pa.array([{"x": 1}, {"x": 2}] * 5))]:
        pq.write_table(pa.table({"a": col, "b": [0, 1] * 5}), d / f"{kind}.parquet")
    os.symlink(d / "no-such-dir", d / "dangling-store")


#: (case, argv with {d} for the case directory, a word the one-line message must contain)
UNBOUNDED_CASES = [
    ("fit: a FIFO as data", "fit {d}/fifo.csv --out {d}/o.json", "FIFO"),
    ("fit: /dev/zero as data", "fit {d}/zero.csv --out {d}/o.json", "device"),
    ("plan: /dev/zero as data", "plan --data {d}/zero.csv", "device"),
    ("fit: a dangling symbolic link as data", "fit {d}/dangling.csv --out {d}/o.json", "symbolic link"),
    ("fit: a directory as data", "fit {d}/folder.csv --out {d}/o.json", "directory"),
    ("fit: a line over the limit", "fit {d}/long-line.csv --out {d}/o.json", "4,194,304 characters"),
    ("fit: 10^5 columns", "fit {d}/wide.csv --out {d}/o.json", "10,000 variables"),
    ("plan: 10^5 columns", "plan --data {d}/wide.csv", "10,000 variables"),
    ("fit: Parquet with a bytes column", "fit {d}/bytes.parquet --out {d}/o.json", "binary"),
    ("fit: Parquet with a list column", "fit {d}/list.parquet --out {d}/o.json", "list"),
    ("fit: Parquet with a struct column", "fit {d}/struct.parquet --out {d}/o.json", "struct"),
    ("fit: a dangling symbolic link as --store", "fit {d}/train.csv --out {d}/o.json --store {d}/dangling-store",
     "symbolic link"),
    ("info: a 300 MiB model file", "info {d}/huge.json", "256 MiB limit"),
    ("info: JSON nested 200,000 deep", "info {d}/deep.json", "nested too deeply"),
    ("info: a FIFO as model", "info {d}/fifo.json", "FIFO"),
    ("info: duplicate categories in a model", "info {d}/dup-cats.json", "more than once"),
    ("info: a null category in a model", "info {d}/null-cats.json", "NoneType"),
    ("info: a list as a category in a model", "info {d}/list-cats.json", "list"),
    ("info: duplicate names in a model", "info {d}/dup-names.json", "more than one variable"),
    ("sample: null names in a model", "sample {d}/null-names.json -n 3", "must be a string"),
]


@pytest.fixture(scope="module")
def unbounded_dir(model_json, tmp_path_factory):
    d = tmp_path_factory.mktemp("unbounded")
    _write_unbounded_files(d, model_json)
    return d


@pytest.mark.parametrize("case,argv,word", UNBOUNDED_CASES, ids=[c[0] for c in UNBOUNDED_CASES])
def test_cli_unbounded_inputs_are_refused_in_one_line(unbounded_dir, case, argv, word):
    assert_refused_in_one_line(unbounded_dir, case, argv, word)


@pytest.mark.parametrize("name", ["fifo.csv", "zero.csv", "dangling.csv", "folder.csv", "long-line.csv", "wide.csv",
                                  "bytes.parquet", "list.parquet", "struct.parquet"])
def test_read_table_refuses_unbounded_data(unbounded_dir, name):
    from fsll_ooc.io import read_table

    with pytest.raises(ValueError) as e:
        FSLL(progress=False).fit(read_table(unbounded_dir / name))
    assert refused_cleanly(e.value), e.value


@pytest.mark.parametrize("name", ["huge.json", "deep.json", "fifo.json", "dup-cats.json", "null-cats.json",
                                  "list-cats.json", "dup-names.json", "null-names.json"])
def test_load_refuses_unbounded_or_lying_model_files(unbounded_dir, name):
    with pytest.raises(ValueError) as e:
        FSLL.load(unbounded_dir / name)
    assert refused_cleanly(e.value) and name in str(e.value), e.value


@pytest.mark.parametrize("labels", [[b"x", b"y"], [[0], [1]], [{"a": 1}, {"a": 2}], [1 + 2j, 2]])
def test_labels_a_model_file_cannot_hold_are_refused_before_fitting(labels):
    import pandas as pd

    df = pd.DataFrame({"a": pd.Series(labels * 5, dtype=object), "b": [0, 1] * 5})
    with pytest.raises(ValueError, match="column 'a'.*labels must be") as e:
        FSLL(progress=False).fit(df)
    assert refused_cleanly(e.value)


@pytest.mark.parametrize("limit", [float("inf"), float("nan"), -1.0, 0, True, "inf"])
@pytest.mark.parametrize("store", [False, True])
def test_memory_limits_that_are_not_sizes(tmp_path, limit, store):
    X = np.array([[0, 1], [1, 0], [1, 1]])
    with pytest.raises(ValueError) as e:
        FSLL(memory_limit=limit, store=tmp_path / "s" if store else None, progress=False).fit(X)
    assert refused_cleanly(e.value) and not (tmp_path / "s").exists()


def test_a_dangling_symlink_as_store_is_refused_and_not_created(tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "s")
    with pytest.raises(ValueError, match="symbolic link") as e:
        FSLL(store=tmp_path / "s", progress=False).fit(np.array([[0, 1], [1, 0]]))
    assert refused_cleanly(e.value) and not (tmp_path / "gone").exists()


def test_a_store_on_a_read_only_file_system_is_refused_before_reading(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (tmp_path / "d.csv").write_text("a,b\n0,1\n1,0\n")
        for store in (ro, ro / "s"):
            rc, _, err = run_cli("fit", tmp_path / "d.csv", "-o", tmp_path / "m.json", "--store", store)
            assert_one_line_error(rc, err, store)
            assert "read-only file system" in err
        with pytest.raises(ValueError, match="read-only"):
            FSLL(store=ro / "s", progress=False).fit(np.array([[0, 1], [1, 0]]))
    finally:
        subprocess.run(["umount", str(ro)])


# ============================================================================ the output is checked before a fit

def test_out_inside_a_store_is_refused_before_fitting(tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n0,1\n1,0\n1,1\n")
    store = tmp_path / "s"
    rc, _, err = run_cli("fit", tmp_path / "d.csv", "--out", store / "fsll_state.json", "--store", store, "-q")
    assert_one_line_error(rc, err, "out in the store being fitted")
    assert "inside the store" in err or "does not exist" in err
    store.mkdir()
    rc, _, err = run_cli("fit", tmp_path / "d.csv", "--out", store / "fsll_state.json", "--store", store, "-q")
    assert_one_line_error(rc, err, "out in the store being fitted")
    assert "inside the store" in err and list(store.iterdir()) == []
    assert run_cli("fit", tmp_path / "d.csv", "--out", tmp_path / "m.json", "--store", tmp_path / "t", "-q")[0] == 0
    for out in (tmp_path / "t" / "fsll_state.json", tmp_path / "t" / "model.json"):  # a finished store
        before = sorted(p.name for p in (tmp_path / "t").iterdir())
        rc, _, err = run_cli("fit", tmp_path / "d.csv", "--out", out, "--force", "-q")
        assert_one_line_error(rc, err, out)
        assert "inside the store" in err and sorted(p.name for p in (tmp_path / "t").iterdir()) == before


def test_out_on_a_full_or_read_only_disk_is_refused_before_fitting(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    import subprocess

    small, ro = tmp_path / "small", tmp_path / "ro"
    small.mkdir()
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        (small / "filler").write_bytes(b"x" * 900_000)
        (tmp_path / "d.csv").write_text("a,b\n0,1\n1,0\n1,1\n")
        fitted = []
        monkeypatch.setattr(FSLL, "fit", lambda *a, **k: fitted.append(1))
        rc, _, err = run_cli("fit", tmp_path / "d.csv", "--out", small / "m.json", "-q")
        assert_one_line_error(rc, err, "full disk")
        assert "free" in err and "before fitting" in err and not fitted
        assert sorted(p.name for p in small.iterdir()) == ["filler"]
        rc, _, err = run_cli("fit", tmp_path / "d.csv", "--out", ro / "m.json", "-q")
        assert_one_line_error(rc, err, "read-only disk")
        assert "read-only" in err and not fitted
    finally:
        subprocess.run(["umount", str(small)])
        subprocess.run(["umount", str(ro)])


# ============================================================================ model files, mutated anywhere

def _paths(obj, prefix=()):
    """Every path (keys and indices) into a JSON value, the root included."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


_NUMBERS = st.sampled_from([0, 1, -1, 2, 2**16, 2**40, 2**63, -2**63, 0.5, -0.0, 1e308, -1e308, 1e-308,
                            float("nan"), float("inf"), float("-inf"), True, False])


@st.composite
def mutated_model(draw, text):
    """A valid model file with one to three mutations at random places: a value replaced (by
    a number, a string, a list or object, ``null``), a value wrapped in a list or object, an
    entry removed or duplicated, an extra key, a number nudged or made huge."""
    obj = json.loads(text)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(obj))
        path = draw(st.sampled_from(paths[1:]))
        parent = obj
        for p in path[:-1]:
            parent = parent[p]
        key, value = path[-1], parent[path[-1]]
        op = draw(st.sampled_from(["number", "json", "wrap-list", "wrap-dict", "remove", "duplicate", "extra-key",
                                   "nudge", "string"]))
        if op == "number":
            parent[key] = draw(_NUMBERS)
        elif op == "json":
            parent[key] = draw(json_values)
        elif op == "wrap-list":
            parent[key] = [value]
        elif op == "wrap-dict":
            parent[key] = {"v": value}
        elif op == "remove":
            del parent[key]
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(key, value)
        elif op == "extra-key":
            (parent if isinstance(parent, dict) else obj)[draw(_short_text)] = draw(json_values)
        elif op == "nudge" and isinstance(value, (int, float)) and not isinstance(value, bool):
            parent[key] = value + draw(st.sampled_from([1, -1, 0.5, 1e-9, 1e6]))
        elif op == "string":
            parent[key] = str(value)
        done.append(f"{op} at {'/'.join(map(str, path[:2]))}")
    return done, json.dumps(obj, allow_nan=True).encode()


@settings(SETTINGS, max_examples=4 * N_EXAMPLES)
@given(data=st.data())
def test_mutated_model_files_load_sane_or_are_refused(model_json, tmp_path_factory, data):
    """Load refuses a mutated model file with one line naming the file, or gives a model
    whose probabilities are finite, positive and sum to 1 (and whose log_prob agrees)."""
    done, blob = data.draw(mutated_model(model_json))
    path = tmp_path_factory.mktemp("mut") / "m.json"
    path.write_bytes(blob)
    try:
        m = FSLL.load(path)
    except ValueError as e:
        assert refused_cleanly(e) and str(path) in str(e), (done, e)
        event(f"refused: {done[0].split(' at ')[0]}")
        return
    event(f"loaded: {done[0].split(' at ')[0]}")
    p = np.asarray(m.probabilities())
    assert np.all(np.isfinite(p)) and np.all(p > 0) and math.isclose(float(p.sum()), 1.0, rel_tol=1e-9), done
    X = np.stack(np.unravel_index(np.arange(p.size), p.shape), axis=1)
    assert np.allclose(np.exp(m.log_prob(X)), p.reshape(-1), rtol=1e-9, atol=0), done


@pytest.mark.parametrize("as_frame", [False, True])
def test_arrays_wider_than_the_variable_limit_are_refused_before_encoding(as_frame):
    import pandas as pd

    from fsll_ooc.validation import MAX_VARIABLES

    X = np.zeros((3, MAX_VARIABLES + 1), dtype=np.int8)
    with pytest.raises(ValueError, match="10,000 variables") as e:
        FSLL(progress=False).fit(pd.DataFrame(X).add_prefix("c") if as_frame else X)
    assert refused_cleanly(e.value)
