"""FSLLAverage: every answer is the mixture's, checked against brute force on a tiny
mixed-cardinality problem (the mean of the members' tables built from their parameters
by explicit basis products)."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from fsll_ooc import FSLL, FSLLAverage, datasets
from oracle import model as brute_model, phi_matrix

CARDS = (2, 3, 4, 5)
NAMES = ["sex", "colour", "size", "grade"]
LABELS = [["f", "m"], ["red", "green", "blue"], [0, 1, 2, 3], ["A", "B", "C", "D", "E"]]
ALL = np.array(list(itertools.product(*[range(k) for k in CARDS])))


@pytest.fixture(scope="module")
def codes():
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=3)
    return datasets.sample_table(p, 600, seed=1)


@pytest.fixture(scope="module")
def avg(codes):
    return FSLLAverage(n_members=3, random_state=5, progress=False).fit(codes)


def brute_member(m) -> np.ndarray:
    """``exp(Phi^T theta) / Z`` of a member from its parameters (explicit basis products)."""
    theta = np.zeros(int(np.prod(CARDS)))
    for y, v in m.theta_.items():
        theta[np.ravel_multi_index(y, CARDS)] = v
    return brute_model(theta, phi_matrix(CARDS)).reshape(CARDS)


@pytest.fixture(scope="module")
def P(avg):
    return np.mean([brute_member(m) for m in avg.members_], axis=0)


def test_members_are_fits_on_distinct_four_fifths(avg, codes):
    assert avg.n_members_ == 3 and avg.n_samples_ == 600
    assert [m.n_samples_ for m in avg.members_] == [480] * 3
    tables = [brute_member(m) for m in avg.members_]
    assert all(m.n_bases_ > 0 for m in avg.members_)
    assert all(m.engine_ is None for m in avg.members_)  # in core the members' working tables are dropped
    assert max(np.abs(tables[0] - t).max() for t in tables[1:]) > 1e-4  # different rows, different models
    again = FSLLAverage(n_members=3, random_state=5, progress=False).fit(codes)  # seeded: repeatable
    np.testing.assert_array_equal(again.probabilities(), avg.probabilities())


def test_members_fitted_at_once_are_the_same_members(avg, codes):
    par = FSLLAverage(n_members=3, random_state=5, n_jobs=2, progress=False).fit(codes)
    assert par.get_params()["n_jobs"] == 2
    for a, b in zip(par.members_, avg.members_):  # each member is its own fit of its own rows: same bits
        assert a.theta_ == b.theta_ and a.cost_ == b.cost_ and a.log_z_ == b.log_z_


def test_probabilities_log_prob_score_are_the_mixture(avg, P, codes):
    np.testing.assert_allclose(avg.probabilities(), P, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(avg.log_prob(ALL), np.log(P.reshape(-1)), rtol=1e-9)
    np.testing.assert_allclose(avg.score_samples(codes[:50]), np.log(P[tuple(codes[:50].T)]), rtol=1e-9)
    assert avg.score(codes) == pytest.approx(float(np.mean(np.log(P[tuple(codes.T)]))), rel=1e-10)


def test_log_prob_marginalises_missing_cells(avg, P):
    x = np.array([[1, -1, 2, -1], [0, 2, -1, 4]])
    want = [np.log(P[1, :, 2, :].sum()), np.log(P[0, 2, :, 4].sum())]
    np.testing.assert_allclose(avg.log_prob(x), want, rtol=1e-9)


def test_queries_on_the_mean_table(avg, P):
    np.testing.assert_allclose(avg.marginal([3, 1]), P.sum(axis=(0, 2)).T, rtol=1e-9)
    c = P[:, :, 1, :].sum(axis=(0,))  # colour x grade given size = 1
    np.testing.assert_allclose(avg.conditional([1, 3], given={2: 1}), c / c.sum(), rtol=1e-9)
    states, probs = avg.mode(k=4)
    order = np.argsort(-P.reshape(-1), kind="stable")[:4]
    np.testing.assert_array_equal(states, ALL[order])
    np.testing.assert_allclose(probs, P.reshape(-1)[order], rtol=1e-9)


def test_sample_follows_the_mixture(avg, P):
    n = 200_000
    draws = avg.sample(n, random_state=0)
    assert draws.shape == (n, 4) and draws.dtype == np.int64
    freq = np.bincount(np.ravel_multi_index(tuple(draws.T), CARDS), minlength=P.size) / n
    p = P.reshape(-1)
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12)
    np.testing.assert_array_equal(avg.sample(30, random_state=7), avg.sample(30, random_state=7))


def test_save_load_round_trip(avg, P, tmp_path):
    path = tmp_path / "avg.json"
    avg.save(path)
    back = FSLLAverage.load(path)
    assert back.n_members_ == 3 and back.n_samples_ == 600 and back.get_params()["random_state"] == 5
    np.testing.assert_allclose(back.probabilities(), P, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(back.log_prob(ALL), avg.log_prob(ALL), rtol=1e-12)
    np.testing.assert_array_equal(back.sample(100, random_state=3), avg.sample(100, random_state=3))
    with pytest.raises(ValueError, match="average of 3 models.*FSLLAverage.load"):
        FSLL.load(path)
    single = tmp_path / "one.json"
    avg.members_[0].save(single)
    with pytest.raises(ValueError, match="single model.*FSLL.load"):
        FSLLAverage.load(single)
    np.testing.assert_allclose(FSLL.load(single).probabilities(), brute_member(avg.members_[0]), rtol=1e-9)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(version=2), "average file version 2 is newer"),
    (lambda d: d.update(n_members=4), "as many as n_members"),
    (lambda d: d["members"].pop(), "as many as n_members"),
    (lambda d: d["members"][1].update(cardinalities=[2, 3, 4, 6]), "member 1"),
    (lambda d: d["members"][2].update(log_z=1.0), "member 2.*log_z"),
    (lambda d: d["params"].update(store="/x"), "params must hold only"),
])
def test_damaged_average_files_are_refused(avg, tmp_path, edit, message):
    path = tmp_path / "avg.json"
    avg.save(path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message):
        FSLLAverage.load(path)


def test_labels_frames_and_interactions(codes):
    df = pd.DataFrame({nm: [LABELS[i][c] for c in codes[:, i]] for i, nm in enumerate(NAMES)})
    df["colour"] = pd.Categorical(df["colour"], categories=LABELS[1])
    a = FSLLAverage(n_members=2, progress=False).fit(df)
    assert a.feature_names_in_ == NAMES and all(m.feature_names_in_ == NAMES for m in a.members_)
    s = a.sample(5, random_state=0)
    assert list(s.columns) == NAMES and set(s["colour"]) <= set(LABELS[1])
    m = a.marginal("colour", as_frame=True)
    assert list(m["colour"]) == LABELS[1] and m["p"].sum() == pytest.approx(1.0)
    assert a.conditional("grade", given={"colour": "blue"}).shape == (5,)
    inter = a.interactions()
    assert list(inter.columns[:2]) == ["member", "term"]
    assert [int((inter["member"] == k).sum()) for k in range(2)] == [mm.n_bases_ for mm in a.members_]
    pd.testing.assert_frame_equal(inter[inter["member"] == 1].drop(columns="member").reset_index(drop=True),
                                  a.members_[1].interactions())
    from fsll_ooc import queries

    with pytest.raises(TypeError, match="mixture of models.*members_"):
        queries.interactions(a)  # what the per-term plots call


def test_out_of_core_members(codes, tmp_path, avg):
    a = FSLLAverage(n_members=3, random_state=5, progress=False, store=tmp_path / "avg", layout=(1, 2)).fit(codes)
    assert sorted(p.name for p in (tmp_path / "avg").iterdir()) == ["member-0", "member-1", "member-2"]
    p = a.probabilities()
    assert not isinstance(p, np.ndarray)  # a dask sum over the members' stores
    P = np.mean([brute_member(m) for m in a.members_], axis=0)
    np.testing.assert_allclose(np.asarray(p.compute()), P, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(a.marginal([2, 0]), P.sum(axis=(1, 3)).T, rtol=1e-9)
    np.testing.assert_allclose(a.log_prob(ALL[:20]), np.log(P.reshape(-1)[:20]), rtol=1e-9)
    states, _ = a.mode(k=3)
    np.testing.assert_array_equal(states, ALL[np.argsort(-P.reshape(-1), kind="stable")[:3]])
    assert a.sample(50, random_state=1).shape == (50, 4)
    np.testing.assert_allclose(P, avg.probabilities(), atol=1e-9)  # the same members as in core


@pytest.mark.parametrize("kw, message", [
    ({"n_members": 1}, "n_members must be 'auto' or an int of at least 2"),
    ({"n_members": True}, "n_members must be"),
    ({"n_members": "many"}, "n_members must be"),
    ({"random_state": -1}, "random_state must be"),
    ({"n_jobs": 0}, "n_jobs must be None or a positive int"),
    ({"n_jobs": 1.5}, "n_jobs must be None or a positive int"),
    ({"colour": 3}, "unknown parameter 'colour'"),
    ({"missing": "em"}, "does not average EM fits .*'missing'"),
    ({"epsilon": -1.0}, "epsilon"),
])
def test_bad_parameters_are_refused_before_fitting(codes, kw, message):
    with pytest.raises(ValueError, match=message):
        FSLLAverage(progress=False, **kw).fit(codes)


def test_bad_data_and_unfitted_use():
    with pytest.raises(ValueError, match="at least 2 rows"):
        FSLLAverage(progress=False).fit(np.array([[0, 1]]))
    with pytest.raises(RuntimeError, match="not fitted"):
        FSLLAverage().log_prob(np.array([[0, 1]]))
    with pytest.raises(RuntimeError, match="not fitted"):
        FSLLAverage().marginal(0)
    with pytest.raises(ValueError, match="row 1 is negative"):
        FSLLAverage(progress=False).fit(np.array([[0, 1], [1, -1], [0, 0]]))
    with pytest.raises(ValueError, match="missing"):
        FSLLAverage(progress=False).fit(np.array([[0, 1], [1, np.nan], [0, 0]]))
    assert FSLLAverage().n_members == "auto"
    assert FSLLAverage(n_members="auto", progress=False).fit(
        np.random.default_rng(0).integers(0, 2, (50, 3))).n_members_ == 8


def test_auto_members_by_rows():
    """``n_members="auto"``: eight members on up to SMALL_DATA rows, four on more."""
    from fsll_ooc.average import SMALL_DATA, auto_members

    assert [auto_members(n) for n in (2, SMALL_DATA, SMALL_DATA + 1, 10**7)] == [8, 8, 4, 4]
    X = np.random.default_rng(1).integers(0, 2, (SMALL_DATA + 1, 2))
    assert FSLLAverage(progress=False).fit(X).n_members_ == 4
    assert FSLLAverage(progress=False).fit(X[:SMALL_DATA]).n_members_ == 8
