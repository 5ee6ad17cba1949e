"""predict_proba / conditional with evidence rows / impute(return_proba=True), against
brute force on the model's dense table (missing cells summed out by hand)."""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

from fsll_ooc import FSLL
from conftest import bayesnet_rows

CARDS = (2, 3, 4, 5)
NAMES = ["sex", "colour", "size", "grade"]
LABELS = [["f", "m"], ["blue", "green", "red"], ["l", "m", "s", "xl"], ["A", "B", "C", "D", "E"]]  # sorted: the order shown


@pytest.fixture(scope="module")
def codes():
    return bayesnet_rows(CARDS, 2000)


@pytest.fixture(scope="module")
def model(codes):
    df = pd.DataFrame({nm: [LABELS[i][c] for c in codes[:, i]] for i, nm in enumerate(NAMES)})
    return FSLL(progress=False).fit(df)


def brute(P, targets, row):
    """p(targets | the observed cells of row) from the dense table; row: codes, -1 = missing."""
    idx = []
    for i, v in enumerate(row):
        idx.append(slice(None) if (v < 0 or i in targets) else v)
    sub = P[tuple(idx)]
    free = [i for i in range(P.ndim) if idx[i] == slice(None)]
    keep = [free.index(t) for t in targets]
    out = sub.sum(axis=tuple(a for a in range(sub.ndim) if a not in keep))
    out = np.transpose(out, np.argsort(np.argsort(keep))) if len(keep) > 1 else out
    return out / out.sum()


def _frame(rows):
    return pd.DataFrame({nm: [None if r[i] < 0 else LABELS[i][r[i]] for r in rows]
                         for i, nm in enumerate(NAMES)})


def test_predict_proba_one_target(model, codes):
    P = model.probabilities()
    rng = np.random.default_rng(0)
    rows = codes[:40].copy()
    rows[rng.random(rows.shape) < 0.3] = -1
    out = model.predict_proba("size", _frame(rows))
    assert list(out.columns) == model.categories_[2]
    for r, row in enumerate(rows):
        np.testing.assert_allclose(out.iloc[r].to_numpy(), brute(P, [2], row), atol=1e-12)


def test_predict_proba_joint_target_and_missing_columns(model, codes):
    P = model.probabilities()
    rows = codes[:25].copy()
    rows[:, 0] = -1  # a column the evidence lacks altogether
    X = _frame(rows).drop(columns=["sex"])
    out = model.predict_proba(["grade", "colour"], X)
    assert out.shape == (25, 15)
    for r, row in enumerate(rows):
        np.testing.assert_allclose(out.iloc[r].to_numpy().reshape(5, 3), brute(P, [3, 1], row), atol=1e-12)


def test_predict_proba_codes_and_conditional_with_rows(model, codes):
    P = model.probabilities()
    X = codes[:30].astype(float)
    X[::3, 1] = np.nan
    a = model.predict_proba(0, X)
    b = model.conditional("sex", given=_frame(np.where(np.isnan(X), -1, X).astype(int)))
    np.testing.assert_allclose(a.to_numpy(), b, atol=1e-12)
    for r in range(30):
        row = np.where(np.isnan(X[r]), -1, X[r]).astype(int)
        np.testing.assert_allclose(b[r], brute(P, [0], row), atol=1e-12)


def test_impute_return_proba(model, codes):
    P = model.probabilities()
    rows = codes[:30].copy()
    rows[::2, 2] = -1
    rows[::5, 3] = -1
    df = _frame(rows)
    filled, proba = model.impute(df, return_proba=True)
    assert set(proba) == {"size", "grade"}
    assert list(proba["size"].index) == list(df.index[df["size"].isna()])
    for r in proba["size"].index:
        np.testing.assert_allclose(proba["size"].loc[r].to_numpy(), brute(P, [2], rows[r]), atol=1e-12)
    # the filled cell is the most likely completion of the row's missing cells jointly (mode)
    assert filled.notna().all().all()


def test_predict_proba_refuses_unknown_labels(model):
    with pytest.raises(ValueError, match="purple"):
        model.predict_proba("size", pd.DataFrame({"colour": ["purple"]}))
