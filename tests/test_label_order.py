"""The fitted distribution does not depend on how unordered categories are spelled.

The basis gives code 0 of a variable a special role (the reference of the +-1 basis) and,
for 2^m categories, groups codes into Walsh-Hadamard halves.  Labels that come with the
data (a DataFrame, or codes with ``categories``) are therefore put into a canonical order
for the basis, most frequent first; everything shown keeps the user's labels and order.
Bare integer codes keep their order by default (the paper's convention and bits).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fsll_ooc import FSLL
from fsll_ooc.io import frequency_order

CARDS = (3, 5, 8, 2, 4, 8)


def _data(N=3000, seed=1):
    rng = np.random.default_rng(seed)
    a = rng.choice(3, N, p=[.5, .3, .2])
    b = (a + rng.choice(5, N, p=[.4, .3, .1, .1, .1])) % 5
    c = rng.choice(8, N, p=np.arange(1, 9) / 36)
    d = (c % 2) ^ (rng.random(N) < .2)
    e = (b + rng.integers(0, 2, N)) % 4
    f = (c + 3 * a + rng.choice(8, N, p=np.arange(8, 0, -1) / 36)) % 8
    return np.stack([a, b, c, d, e, f], 1)


NAMES = ["region", "work", "age", "sex", "happy", "income"]


def _frame(X, spell):
    return pd.DataFrame({nm: [spell(i, v) for v in X[:, i]] for i, nm in enumerate(NAMES)})


def _plain(i, v):
    return f"{NAMES[i][:2]}{v}"


def _renamed(i, v):  # other names, whose sorted order differs from the plain ones'
    return f"{(7 * v + 3 * i) % 11}_{NAMES[i][:2]}{v}"


@pytest.fixture(scope="module")
def X():
    return _data()


@pytest.fixture(scope="module")
def pair(X):
    df1, df2 = _frame(X, _plain), _frame(X, _renamed)
    return df1, df2, FSLL(progress=False).fit(df1), FSLL(progress=False).fit(df2)


def test_renamed_labels_give_the_same_distribution(pair):
    df1, df2, m1, m2 = pair
    assert m1.n_bases_ == m2.n_bases_
    np.testing.assert_allclose(m1.log_prob(df1), m2.log_prob(df2), rtol=0, atol=1e-7)
    assert m1.cost_ == pytest.approx(m2.cost_, abs=1e-9)


def test_shown_order_is_the_users(pair, X):
    df1, df2, m1, m2 = pair
    for i, nm in enumerate(NAMES):
        assert m2.categories_[i] == sorted(set(df2[nm]))  # the user's (sorted) labels, not the basis order
        emp = pd.Series(df2[nm]).value_counts(normalize=True).reindex(m2.categories_[i]).to_numpy()
        np.testing.assert_allclose(m2.marginal(nm), emp, atol=0.03)
    # the same table, shown in each user's own order
    p1 = m1.probabilities()
    p2 = m2.probabilities()
    for i in range(len(NAMES)):  # reorder m2's axes to m1's labels
        lab1 = m1.categories_[i]
        lab2 = m2.categories_[i]
        back = [lab2.index(_renamed(i, int(lab[2:]))) for lab in lab1]
        p2 = np.take(p2, back, axis=i)
    np.testing.assert_allclose(p1, p2, rtol=1e-6, atol=1e-12)


def test_basis_order_is_most_frequent_first(pair):
    _, df2, _, m2 = pair
    for i, nm in enumerate(NAMES):
        order = m2.basis_order_[i]
        counts = df2[nm].value_counts()
        shown = [m2.categories_[i][u] for u in order]
        if len(order) > 2:
            assert [counts.get(s, 0) for s in shown] == sorted([counts.get(s, 0) for s in shown], reverse=True)


def test_row_order_and_first_appearance_do_not_matter_at_a_fixed_penalty(X):
    rng = np.random.default_rng(5)
    sh = rng.permutation(len(X))
    df1, df2 = _frame(X, _plain), _frame(X, _renamed).iloc[sh].reset_index(drop=True)
    kw = dict(progress=False, epsilon=1e-4)
    m1, m2 = FSLL(**kw).fit(df1), FSLL(**kw).fit(df2)
    assert m1.n_bases_ == m2.n_bases_
    np.testing.assert_allclose(m1.log_prob(df1), m2.log_prob(_frame(X, _renamed)), rtol=0, atol=1e-7)


def test_ordered_categorical_keeps_its_order(X):
    df = _frame(X, _plain)
    levels = sorted(set(df["age"]), reverse=True)
    df["age"] = pd.Categorical(df["age"], categories=levels, ordered=True)
    m = FSLL(progress=False, epsilon=1e-4).fit(df)
    assert list(m.basis_order_[2]) == list(range(8))
    assert m.categories_[2] == levels
    assert list(m.basis_order_[0]) != [0, 1, 2] or True  # unordered columns are free to move


def test_bare_codes_keep_their_order_by_default(X):
    m = FSLL(progress=False, epsilon=1e-4).fit(X)
    assert all(list(o) == list(range(k)) for o, k in zip(m.basis_order_, CARDS))
    perms = [np.random.default_rng(i).permutation(k) for i, k in enumerate(CARDS)]
    Y = np.stack([perms[i][X[:, i]] for i in range(len(CARDS))], 1)
    kw = dict(progress=False, epsilon=1e-4, category_order="frequency")
    a, b = FSLL(**kw).fit(X), FSLL(**kw).fit(Y)
    assert a.n_bases_ == b.n_bases_
    np.testing.assert_allclose(a.log_prob(X), b.log_prob(Y), atol=1e-7)
    np.testing.assert_array_equal(a.sample(50, random_state=0).shape, (50, len(CARDS)))
    # "given" on a DataFrame keeps the labels' order
    g = FSLL(progress=False, epsilon=1e-4, category_order="given").fit(_frame(X, _plain))
    assert all(list(o) == list(range(len(o))) for o in g.basis_order_)


def test_frequency_order_ties():
    # equal counts: the pairwise count profiles decide, not the labels or the rows' order
    X = np.array([[0, 0], [0, 0], [1, 1], [1, 2], [2, 0], [2, 0]])
    o = frequency_order(X, (3, 3))
    # code 1 of column 0 is the least frequent; 0 and 2 tie, with the same profile: first seen first
    assert list(o[0]) == [0, 2, 1]
    # column 1: code 0 (4 rows) first; 1 and 2 tie (one row each) with equal profiles
    assert list(o[1])[0] == 0


def test_save_load_and_queries_keep_the_users_view(pair, tmp_path):
    df1, df2, m1, m2 = pair
    m2.save(tmp_path / "m.json")
    r = FSLL.load(tmp_path / "m.json")
    assert r.categories_ == m2.categories_
    np.testing.assert_allclose(r.log_prob(df2), m2.log_prob(df2), atol=1e-12)
    np.testing.assert_allclose(r.marginal("income"), m2.marginal("income"), atol=1e-12)
    s = r.sample(20, random_state=1)
    assert list(s.columns) == NAMES and set(s["age"]) <= set(m2.categories_[2])
    # a term's words name the categories where the factor is +1, in the basis's grouping
    terms = r.interactions()
    assert len(terms) == r.n_bases_


def test_missing_cells_em_is_invariant_too(X):
    rng = np.random.default_rng(2)
    df1, df2 = _frame(X[:1500], _plain), _frame(X[:1500], _renamed)
    holes = rng.random(df1.shape) < 0.1
    df1 = df1.mask(holes)
    df2 = df2.mask(holes)
    kw = dict(progress=False, missing="em", epsilon=1e-4)
    m1, m2 = FSLL(**kw).fit(df1), FSLL(**kw).fit(df2)
    assert m1.n_bases_ == m2.n_bases_
    np.testing.assert_allclose(m1.log_prob(df1), m2.log_prob(df2), atol=1e-6)


def test_hidden_variables_and_an_em_store_keep_the_order(X, tmp_path):
    df = _frame(X[:800], _renamed).iloc[:, :4].copy()
    df.iloc[::7, 1] = None
    m = FSLL(progress=False, hidden=[2], epsilon=1e-4, n_restarts=1, random_state=0).fit(df)
    assert len(m.basis_order_) == 5 and list(m.basis_order_[4]) == [0, 1]  # the hidden variable as it is
    assert len(m.interactions()) == m.n_bases_
    ooc = FSLL(progress=False, missing="em", epsilon=1e-4, store=tmp_path / "s").fit(df)
    back = FSLL.resume(tmp_path / "s", progress=False)
    assert back.categories_ == ooc.categories_ == [sorted(set(df[c].dropna())) for c in df.columns]
    np.testing.assert_allclose(back.log_prob(df), ooc.log_prob(df), atol=1e-10)
