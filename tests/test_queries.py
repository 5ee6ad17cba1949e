"""Queries (marginal, conditional, mode, interactions) against brute force on the dense table.

The oracle is ``probabilities()`` of a tiny mixed-cardinality model (cards 2, 3, 4, 5:
both local bases), summed and sorted with plain numpy.  The out-of-core model must
give the same answers while never computing a table-sized result.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from fsll_ooc import FSLL, datasets, queries
from conftest import bayesnet_rows

CARDS = (2, 3, 4, 5)
NAMES = ["sex", "colour", "size", "grade"]
LABELS = [["f", "m"], ["red", "green", "blue"], [0, 1, 2, 3], ["A", "B", "C", "D", "E"]]


@pytest.fixture(scope="module")
def codes():
    return bayesnet_rows(CARDS, 2000)


@pytest.fixture(scope="module")
def model(codes):
    return FSLL(progress=False).fit(codes)


@pytest.fixture(scope="module")
def P(model):
    p = model.probabilities()
    assert isinstance(p, np.ndarray) and p.shape == CARDS
    return p


@pytest.fixture(scope="module")
def labelled(codes):
    df = pd.DataFrame({nm: [LABELS[i][c] for c in codes[:, i]] for i, nm in enumerate(NAMES)})
    df["colour"] = pd.Categorical(df["colour"], categories=LABELS[1])  # keep this order
    return FSLL(progress=False).fit(df)


@pytest.fixture(scope="module")
def LP(labelled):
    """The labelled model's table by brute force from its parameters (tests/oracle.py), its axes
    moved from the basis order of the fit (most frequent label first) to the labels' order."""
    from oracle import model as brute_model, phi_matrix

    cards = labelled.cardinalities_
    theta = np.zeros(math.prod(cards))
    for y, v in labelled.theta_.items():
        theta[np.ravel_multi_index(y, cards)] = v
    p = brute_model(theta, phi_matrix(cards)).reshape(cards)
    for i, order in enumerate(labelled.basis_order_):  # basis position c holds shown code order[c]
        p = np.take(p, np.argsort(order), axis=i)
    np.testing.assert_allclose(labelled.probabilities(), p, atol=1e-14)
    return p


@pytest.fixture(scope="module")
def ooc(codes, tmp_path_factory):
    m = FSLL(progress=False, store=tmp_path_factory.mktemp("ooc") / "s", layout=(1, 2)).fit(codes)
    assert not isinstance(m.probabilities(), np.ndarray)  # a dask array over the store
    return m


def brute_marginal(P, idx):
    other = tuple(a for a in range(P.ndim) if a not in idx)
    return np.transpose(P.sum(axis=other), np.argsort(np.argsort(idx)))


def brute_top(P, k):
    flat = P.reshape(-1)
    order = np.lexsort((np.arange(flat.size), -flat))[:k]
    return np.stack(np.unravel_index(order, P.shape), axis=1), flat[order]


# --------------------------------------------------------------------- marginal

@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_marginal_every_subset_and_order(model, P, size):
    for idx in itertools.permutations(range(4), size):
        got = queries.marginal(model, list(idx))
        assert got.shape == tuple(CARDS[i] for i in idx)
        np.testing.assert_allclose(got, brute_marginal(P, list(idx)), atol=1e-14)


def test_marginal_single_variable_is_1d(model, P):
    np.testing.assert_allclose(model.marginal(2), P.sum(axis=(0, 1, 3)), atol=1e-15)


def test_marginal_names_and_frame(labelled, LP):
    np.testing.assert_allclose(labelled.marginal(["grade", "sex"]), brute_marginal(LP, [3, 0]), atol=1e-14)
    df = labelled.marginal(["colour", "size"], as_frame=True)
    assert list(df.columns) == ["colour", "size", "p"] and len(df) == 12
    assert list(df["colour"].iloc[:4]) == ["red"] * 4 and list(df["size"].iloc[:4]) == [0, 1, 2, 3]
    table = df.pivot(index="colour", columns="size", values="p").loc[LABELS[1], LABELS[2]]
    np.testing.assert_allclose(table.to_numpy(), brute_marginal(LP, [1, 2]), atol=1e-14)


# ------------------------------------------------------------------ conditional

def test_conditional_all_evidence_patterns(model, P):
    for target in range(4):
        others = [i for i in range(4) if i != target]
        for r in range(len(others) + 1):
            for ev_vars in itertools.combinations(others, r):
                for ev_vals in itertools.product(*[range(CARDS[i]) for i in ev_vars]):
                    given = dict(zip(ev_vars, ev_vals))
                    sub = P[tuple(given.get(i, slice(None)) for i in range(4))]
                    rest = [i for i in range(4) if i not in given]
                    want = sub.sum(axis=tuple(a for a, i in enumerate(rest) if i != target))
                    got = queries.conditional(model, target, given=given)
                    np.testing.assert_allclose(got, want / want.sum(), rtol=1e-12, atol=1e-15)


def test_conditional_several_targets(model, P):
    got = model.conditional([3, 1], given={0: 1})
    want = P[1].sum(axis=1).T
    np.testing.assert_allclose(got, want / want.sum(), rtol=1e-12)
    assert got.shape == (5, 3)


def test_conditional_by_label_code_and_name(labelled, LP):
    want = LP[:, 2, :, 0].sum(axis=1)
    want = want / want.sum()
    for given in ({"colour": "blue", "grade": "A"}, {1: 2, 3: 0}, {"colour": 2, "grade": 0}):
        np.testing.assert_allclose(labelled.conditional("sex", given=given), want, rtol=1e-12)
    df = labelled.conditional("sex", given={"colour": "blue"}, as_frame=True)
    assert list(df["sex"]) == ["f", "m"] and df["p"].sum() == pytest.approx(1)


def test_conditional_without_evidence_is_the_marginal(model, P):
    np.testing.assert_allclose(model.conditional(1), P.sum(axis=(0, 2, 3)), rtol=1e-12)


# ------------------------------------------------------------------------- mode

@pytest.mark.parametrize("k", [1, 2, 7, 120, 500])
def test_mode_top_k(model, P, k):
    states, probs = model.mode(k=k)
    want_s, want_p = brute_top(P, k)
    assert states.dtype == np.int64 and states.shape == (min(k, 120), 4)
    np.testing.assert_array_equal(states, want_s)
    np.testing.assert_allclose(probs, want_p, rtol=1e-12)


def test_mode_ties_lowest_code_first():
    class Flat:  # anything with probabilities(), cardinalities_ and theta_ can be queried
        cardinalities_ = (2, 3)
        theta_ = {}

        def probabilities(self):
            return np.full((2, 3), 1 / 6)

    states, probs = queries.mode(Flat(), k=3)
    assert states.tolist() == [[0, 0], [0, 1], [0, 2]]
    np.testing.assert_allclose(probs, 1 / 6)


def test_mode_given(labelled, LP):
    states, probs = labelled.mode(k=4, given={"size": 3, "sex": "m"})
    sub = LP[1, :, 3, :]
    want_s, want_p = brute_top(sub, 4)
    assert (states[:, 0] == 1).all() and (states[:, 2] == 3).all()
    np.testing.assert_array_equal(states[:, [1, 3]], want_s)
    np.testing.assert_allclose(probs, want_p / sub.sum(), rtol=1e-12)
    df = labelled.mode(k=2, as_frame=True)
    assert list(df.columns) == NAMES + ["p"] and len(df) == 2
    s, p = brute_top(LP, 1)
    assert [df.iloc[0][nm] for nm in NAMES] == [LABELS[i][c] for i, c in enumerate(s[0])]
    full, pr = labelled.mode(k=3, given={"sex": "f", "colour": "red", "size": 0, "grade": "B"})
    assert full.tolist() == [[0, 0, 0, 1]] and pr.tolist() == [1.0]


# ----------------------------------------------------------------------- errors

def test_errors_name_what_was_wrong(labelled):
    with pytest.raises(ValueError, match="unknown variable 'colr'.*'sex', 'colour'"):
        labelled.marginal(["colr"])
    with pytest.raises(ValueError, match="out of range.*4 variables"):
        labelled.marginal([4])
    with pytest.raises(ValueError, match="listed twice"):
        labelled.marginal(["sex", 0])
    with pytest.raises(ValueError, match="unknown value 'purple' of variable 'colour'.*'red'"):
        labelled.conditional("sex", given={"colour": "purple"})
    with pytest.raises(ValueError, match="unknown value 7 of variable 'size'"):
        labelled.conditional("sex", given={"size": 7})  # integer labels: 7 is not a code either
    with pytest.raises(ValueError, match="both a target and evidence"):
        labelled.conditional("sex", given={"sex": "f"})
    with pytest.raises(ValueError, match="k must be a positive int"):
        labelled.mode(k=0)
    with pytest.raises(RuntimeError, match="not fitted"):
        FSLL().marginal([0])


def test_zero_probability_evidence():
    class Degenerate:
        cardinalities_ = (2, 2)
        theta_ = {}

        def probabilities(self):
            return np.array([[0.5, 0.5], [0.0, 0.0]])

    with pytest.raises(ValueError, match="probability zero"):
        queries.conditional(Degenerate(), 1, given={0: 1})
    with pytest.raises(ValueError, match="probability zero"):
        queries.mode(Degenerate(), given={0: 1})


def test_bool_labels_are_not_codes_of_other_variables():
    class M:
        cardinalities_ = (2,)
        theta_ = {}
        feature_names_in_ = ["ok"]
        categories_ = [[False, True]]

    assert queries.resolve_value(M(), 0, True) == 1 and queries.resolve_value(M(), 0, 0) == 0
    M.categories_ = [["1", "0"]]
    assert queries.resolve_value(M(), 0, "0") == 1  # the label, not the code
    assert queries.resolve_value(M(), 0, 0) == 0    # an int that is not a label: a code


# ----------------------------------------------------------------- out of core

def test_out_of_core_equals_in_core(model, ooc):
    np.testing.assert_allclose(ooc.marginal([3, 1]), model.marginal([3, 1]), atol=1e-12)
    np.testing.assert_allclose(ooc.marginal(0), model.marginal(0), atol=1e-12)
    for target, given in (([1, 2], {0: 1}), (2, {1: 2, 3: 4}), ([3, 0], {2: 0})):
        np.testing.assert_allclose(ooc.conditional(target, given=given), model.conditional(target, given=given),
                                   atol=1e-12)
    for k in (1, 5, 120):
        s1, p1 = ooc.mode(k=k)
        s0, p0 = model.mode(k=k)
        np.testing.assert_allclose(p1, p0, rtol=1e-10)
        assert {tuple(s) for s in s1} == {tuple(s) for s in s0}
    s1, p1 = ooc.mode(k=3, given={2: 1})
    s0, p0 = model.mode(k=3, given={2: 1})
    np.testing.assert_array_equal(s1, s0)
    np.testing.assert_allclose(p1, p0, rtol=1e-10)
    pd.testing.assert_frame_equal(ooc.interactions().drop(columns=["theta", "share"]),
                                  model.interactions().drop(columns=["theta", "share"]))


def test_out_of_core_never_computes_a_table_sized_result(ooc):
    from dask.callbacks import Callback

    sizes = []

    class Spy(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            sizes.append(np.size(result) if isinstance(result, np.ndarray) else 0)

    table = math.prod(CARDS)
    chunk = math.prod(ooc.plan_.layout.chunk_shape)
    assert chunk < table
    with Spy():
        ooc.marginal([0, 3])
        ooc.conditional(3, given={0: 1, 1: 0})
        ooc.mode(k=3)
    assert sizes and max(sizes) <= chunk


# ---------------------------------------------------------------- interactions

def test_interactions_columns_sorting_and_shares(model):
    df = model.interactions()
    assert list(df.columns) == ["term", "variables", "order", "theta", "share", "y"]
    assert len(df) == model.n_bases_
    share = df["share"].to_numpy()
    assert not np.isnan(share).any() and (np.diff(share) <= 1e-15).all()
    for _, r in df.iterrows():
        assert model.theta_[r["y"]] == r["theta"]
        assert r["order"] == len(r["variables"]) == sum(1 for v in r["y"] if v)
        assert r["variables"] == tuple(f"X{i}" for i, v in enumerate(r["y"]) if v)
    contrib, total = queries.term_contributions(model.history_)
    assert total == pytest.approx(model.history_[0]["cost"] - model.history_[-1]["cost"], rel=1e-9)
    np.testing.assert_allclose(share, [contrib[y] / total for y in df["y"]])
    if "remove" not in {h["move"] for h in model.history_}:
        assert share.sum() == pytest.approx(1.0, abs=1e-9)


def test_interactions_text_uses_labels(labelled):
    rows = labelled.interactions(as_frame=False)
    texts = [r["term"] for r in rows]
    assert all(isinstance(t, str) and t for t in texts)
    for r in rows:
        for f in r["factors"]:
            i = NAMES.index(f["var"])
            assert set(f["plus"]) <= set(LABELS[i])
            assert f["basis"] == ("walsh" if CARDS[i] in (2, 4) else "indicator")
        assert r["term"] == " * ".join(queries.factor_text(f) for f in r["factors"])


def test_contributions_with_remove_and_reappend():
    hist = [{"move": "init", "y": None, "delta": 0.0},
            {"move": "append", "y": [1, 0], "delta": -0.5},
            {"move": "append", "y": [0, 1], "delta": -0.2},
            {"move": "adjust", "y": [1, 0], "delta": -0.1},
            {"move": "remove", "y": [0, 1], "delta": -0.05},
            {"move": "append", "y": [0, 1], "delta": -0.15}]
    contrib, total = queries.term_contributions(hist)
    assert total == pytest.approx(1.0)
    assert contrib == pytest.approx({(1, 0): 0.6, (0, 1): 0.15})


def test_contributions_of_joint_moves():
    hist = [{"move": "init", "y": None, "delta": 0.0},
            {"move": "append", "y": [1, 0], "delta": -0.3},
            {"move": "append", "y": [0, 1], "delta": -0.1},
            {"move": "refine", "y": None, "delta": -0.2},            # shared 3:1
            {"move": "joint-append", "y": None, "delta": -0.4, "added": [[1, 1], [2, 0]]}]
    contrib, total = queries.term_contributions(hist)
    assert total == pytest.approx(1.0)
    assert contrib == pytest.approx({(1, 0): 0.45, (0, 1): 0.15, (1, 1): 0.2, (2, 0): 0.2})
    # with the gains predicted at selection, the joint move is split in their proportion
    hist[-1]["added_gain"] = [0.03, 0.01]
    contrib, total = queries.term_contributions(hist)
    assert total == pytest.approx(1.0)
    assert contrib == pytest.approx({(1, 0): 0.45, (0, 1): 0.15, (1, 1): 0.3, (2, 0): 0.1})
    hist[-1]["added_gain"] = [0.0, -1.0]  # nothing usable: equal split
    assert queries.term_contributions(hist)[0] == pytest.approx({(1, 0): 0.45, (0, 1): 0.15, (1, 1): 0.2, (2, 0): 0.2})


def test_shares_of_a_fit_with_joint_moves_account_for_every_gain():
    """A fit from the uniform model (corrective steps, joint selection; the scale fixed, so
    no warm start): every term gets a share, joint moves are credited to the terms they
    added, and the shares plus the gains of removed terms add up to the whole cost reduction."""
    cards = (3, 3, 2, 4, 2)
    p, _ = datasets.random_bayesnet(cards, 3, seed=11)
    X = datasets.sample_table(p, 5000, seed=111)
    m = FSLL(cardinalities=cards, progress=False, penalty_scale=1.0).fit(X)
    joint = [h for h in m.history_ if h["move"] == "joint-append"]
    assert joint and all(h["y"] is None and len(h["added"]) == len(h["added_gain"]) for h in joint)
    df = m.interactions()
    assert len(df) == m.n_bases_ and df["share"].notna().all() and (df["share"] > 0).all()
    total = m.history_[0]["cost"] - m.cost_
    contrib, got_total = queries.term_contributions(m.history_)
    assert got_total == pytest.approx(total, rel=1e-9)
    # replay: a term's account is what its appends/adjusts/joint credits gave it, refits shared
    removed = 0.0
    acc = {}
    for h in m.history_[1:]:
        gain = -h["delta"]
        if h["move"] == "remove":
            removed += acc.pop(tuple(h["y"]))
        elif h["move"] == "joint-append":
            w = np.maximum(h["added_gain"], 0) / np.maximum(h["added_gain"], 0).sum()
            for a, wa in zip(h["added"], w):
                acc[tuple(a)] = gain * wa
        elif h["y"] is None:
            base = sum(acc.values())
            acc = {t: v + gain * v / base for t, v in acc.items()}
        else:
            acc[tuple(h["y"])] = acc.get(tuple(h["y"]), 0.0) + gain
        removed += gain if h["move"] == "remove" else 0.0
    assert contrib == pytest.approx(acc)
    assert df["share"].sum() * total + removed == pytest.approx(total, rel=1e-9)
    for h in joint:  # every added term still in the model carries at least its credit
        for a, g in zip(h["added"], h["added_gain"]):
            if tuple(a) in contrib:
                assert contrib[tuple(a)] > 0


def test_interactions_after_save_load_and_without_history(model, tmp_path):
    model.save(tmp_path / "m.json")
    m2 = FSLL.load(tmp_path / "m.json")
    pd.testing.assert_frame_equal(m2.interactions(), model.interactions())
    m2.history_ = []
    df = m2.interactions()
    assert df["share"].isna().all()
    th = df["theta"].abs().to_numpy()
    assert (np.diff(th) <= 0).all()  # then sorted by |theta|
