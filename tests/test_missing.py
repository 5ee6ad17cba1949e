"""Missing cells and hidden variables (fsll_ooc.missing) against brute force.

The oracle enumerates, for every row, every completion of its missing cells on a tiny
mixed-cardinality table (cards 2, 3, 4, 5: both local bases).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fsll_ooc import FSLL, datasets, missing as M, storage
from fsll_ooc.engine import Table

CARDS = (2, 3, 4, 5)


def _holes(X, frac, seed):
    rng = np.random.default_rng(seed)
    Xm = np.array(X, np.int64)
    Xm[rng.random(Xm.shape) < frac] = M.MISSING
    return Xm


def completions(row, cards):
    """Every full row that agrees with ``row`` on its observed cells."""
    axes = [range(k) if v < 0 else [v] for v, k in zip(row, cards)]
    return list(itertools.product(*axes))


def brute_soft(p, X):
    soft, ll = np.zeros(p.shape), 0.0
    for row in X:
        comp = completions(row, p.shape)
        s = sum(p[c] for c in comp)
        ll += math.log(s)
        for c in comp:
            soft[c] += p[c] / s
    return soft, ll


@pytest.fixture(scope="module")
def data():
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=3)
    X = datasets.sample_table(p, 400, seed=1)
    Xm = _holes(X, 0.3, seed=2)
    Xm[0] = M.MISSING  # a row with nothing observed
    Xm[1] = X[1]  # and a complete one
    return p, Xm


@pytest.fixture(scope="module")
def model():
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=5)
    return FSLL(progress=False).fit(datasets.sample_table(p, 1500, seed=4))


def test_groups_partition_the_rows(data):
    _, Xm = data
    groups = M.group_rows(Xm, CARDS)
    rows = np.sort(np.concatenate([g.rows for g in groups]))
    assert np.array_equal(rows, np.arange(len(Xm)))
    seen = set()
    for g in groups:
        assert np.array_equal(Xm[g.rows], g.codes[g.inverse])  # each row is its distinct row
        assert np.array_equal(np.bincount(g.inverse, minlength=len(g.codes)), g.counts)
        for c, ax in zip(g.codes, g.axes):
            assert list(ax) == list(np.flatnonzero(c < 0)) and tuple(CARDS[a] for a in ax) == g.kmiss
            assert tuple(c) not in seen
            seen.add(tuple(c))
    assert len({g.kmiss for g in groups}) == len(groups)


def test_e_step_equals_enumeration(data):
    p, Xm = data
    cells, w, ll = M.e_step(p, M.group_rows(Xm, CARDS))
    soft, ll_ref = brute_soft(p, Xm)
    got = np.zeros(p.size)
    got[cells] = w
    np.testing.assert_allclose(got, soft.reshape(-1), rtol=1e-12, atol=1e-12)
    assert math.isclose(ll, ll_ref, rel_tol=1e-12)
    assert math.isclose(w.sum(), len(Xm), rel_tol=1e-12)


def test_e_step_with_shared_completions_equals_enumeration():
    """Rows of one group (missing variables of equal cardinalities) share completions."""
    cards = (2, 3, 2, 2)
    p = np.random.default_rng(0).dirichlet(np.ones(24)).reshape(cards)
    X = _holes(datasets.sample_table(p, 300, seed=1), 0.35, seed=3)
    groups = M.group_rows(X, cards)
    assert any(len({tuple(a) for a in g.axes}) > 1 for g in groups)
    cells, w, ll = M.e_step(p, groups)
    soft, ll_ref = brute_soft(p, X)
    np.testing.assert_allclose(w, soft.reshape(-1)[cells], rtol=1e-12)
    assert math.isclose(w.sum(), 300, rel_tol=1e-12) and math.isclose(ll, ll_ref, rel_tol=1e-12)


def test_e_step_in_chunks_equals_enumeration(data, monkeypatch):
    p, Xm = data
    monkeypatch.setattr(M, "CHUNK_CELLS", 7)  # several row chunks per pattern
    cells, w, ll = M.e_step(p, M.group_rows(Xm, CARDS))
    soft, ll_ref = brute_soft(p, Xm)
    np.testing.assert_allclose(w, soft.reshape(-1)[cells], rtol=1e-12)
    assert math.isclose(ll, ll_ref, rel_tol=1e-12)


def test_uniform_mean_log_p(model):
    P = model.probabilities()
    got = M.uniform_mean_log_p(model.theta_, CARDS, model.log_z_)
    assert math.isclose(got, float(np.mean(np.log(P))), rel_tol=1e-10)


def test_initial_tables_are_distributions(data):
    _, Xm = data
    t = M.initial_table(Xm, CARDS)
    assert t.shape == CARDS and math.isclose(t.sum(), 1.0) and (t > 0).all()
    # the independence model: each variable's observed frequency (one pseudo-count spread)
    col = Xm[:, 2][Xm[:, 2] >= 0]
    np.testing.assert_allclose(t.sum(axis=(0, 1, 3)), (np.bincount(col, minlength=4) + 0.25) / (len(col) + 1))
    h = M.initial_table(np.c_[Xm[:, :3], np.full(len(Xm), -1)], CARDS, n_hidden=1, seed=0)
    assert h.shape == CARDS and math.isclose(h.sum(), 1.0) and (h > 0).all()


@pytest.mark.parametrize("route", ["table", "enumerate"])
def test_log_prob_marginalises_missing_cells(data, model, route, monkeypatch):
    _, Xm = data
    P = model.probabilities()
    if route == "enumerate":
        monkeypatch.setattr(M, "_table_for", lambda model, g, cache: None)
    got = M.log_prob(model, Xm)
    ref = [math.log(sum(P[c] for c in completions(row, CARDS))) for row in Xm]
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    full = Xm[1:2]  # a complete row: the model's own log_prob, same bits
    assert M.log_prob(model, full)[0] == model.log_prob(full)[0]


def test_log_prob_out_of_core(data, tmp_path):
    _, Xm = data
    X = datasets.sample_table(datasets.random_bayesnet(CARDS, 2, seed=5)[0], 1500, seed=4)
    ooc = FSLL(progress=False, store=tmp_path / "s", layout=(1, 2)).fit(X)
    P = np.asarray(ooc.probabilities().compute())
    ref = [math.log(sum(P[c] for c in completions(row, CARDS))) for row in Xm[:40]]
    np.testing.assert_allclose(M.log_prob(ooc, Xm[:40]), ref, rtol=1e-10, atol=1e-12)
    modes = M.impute(ooc, Xm[:40])
    assert np.array_equal(modes, _brute_modes(P, Xm[:40]))


def _brute_modes(P, X, hidden=()):
    out = X.copy()
    for r, row in enumerate(X):
        miss = [i for i, v in enumerate(row) if v < 0 and i not in hidden]
        if not miss:
            continue
        best, arg = -1.0, None
        for c in itertools.product(*[range(CARDS[i]) for i in miss]):  # C order: ties keep the lowest
            full = list(row)
            for i, v in zip(miss, c):
                full[i] = v
            s = sum(P[x] for x in completions(full, CARDS))
            if s > best:
                best, arg = s, c
        for i, v in zip(miss, arg):
            out[r, i] = v
    return out


@pytest.mark.parametrize("route", ["table", "enumerate"])
def test_impute_mode_is_the_conditional_argmax(data, model, route, monkeypatch):
    _, Xm = data
    if route == "enumerate":
        monkeypatch.setattr(M, "_table_for", lambda model, g, cache: None)
    P = model.probabilities()
    assert np.array_equal(M.impute(model, Xm), _brute_modes(P, Xm))
    # a hidden variable is marginalised out and left missing
    Xh = Xm.copy()
    Xh[:, 3] = M.MISSING
    got = M.impute(model, Xh, n_hidden=1)
    assert np.array_equal(got, _brute_modes(P, Xh, hidden=(3,)))


def test_impute_sample_follows_the_conditional(model):
    P = model.probabilities()
    row = np.array([[1, -1, 2, -1]])
    draws = M.impute(model, np.repeat(row, 20000, axis=0), method="sample", random_state=0)
    assert (draws[:, [0, 2]] == [1, 2]).all()
    cond = P[1, :, 2, :] / P[1, :, 2, :].sum()
    freq = np.zeros((3, 5))
    np.add.at(freq, (draws[:, 1], draws[:, 3]), 1.0)
    assert np.abs(freq / 20000 - cond).max() < 0.015
    with pytest.raises(ValueError, match="method must be"):
        M.impute(model, row, method="mean")


def test_posterior_is_the_conditional(data, model):
    _, Xm = data
    P = model.probabilities()
    X = Xm.copy()
    X[:, 3] = M.MISSING
    got = M.posterior(model, X, 1)
    for r, row in enumerate(X[:60]):
        ref = np.array([sum(P[c] for c in completions([*row[:3], j], CARDS)) for j in range(5)])
        np.testing.assert_allclose(got[r], ref / ref.sum(), rtol=1e-10)


# --------------------------------------------------------------------------- the estimator

import oracle  # noqa: E402  (tests/oracle.py: the brute-force model)


def _brute_objective(m, Xm, kind="family", scale=1.0):
    """J = -(LL_obs + E_u[log p]) / (N + 1) + L(S) / N, every part from the dense table; the
    code length ``L(S)`` of the support from its definition (``oracle.brute_code``: the family
    code of the default fit, or the paper's ``sum r_y``)."""
    P = m.probabilities()
    ll = sum(math.log(sum(P[c] for c in completions(row, P.shape))) for row in Xm)
    support = [int(np.ravel_multi_index(y, P.shape)) for y in m.theta_]
    pen = oracle.brute_code(P.shape, len(Xm), support, kind)
    if kind == "paper":  # the paper's code is the sum of the r_y of the oracle's vector
        r = oracle.r_vec(P.shape, len(Xm)).reshape(P.shape)
        assert pen == pytest.approx(sum(r[y] for y in m.theta_), rel=1e-12)
    return -(ll + float(np.mean(np.log(P)))) / (len(Xm) + 1) + scale * pen


@pytest.fixture(scope="module")
def em_model(data):
    _, Xm = data
    return FSLL(progress=False, missing="em", penalty_scale=1.0).fit(Xm)


@pytest.fixture(scope="module")
def em_default(data):
    _, Xm = data
    return FSLL(progress=False, missing="em").fit(Xm)


def test_em_objective_never_increases(data, em_model):
    _, Xm = data
    objs = [h["objective"] for h in em_model.em_history_]
    assert len(objs) >= 3 and em_model.em_converged_
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objs, objs[1:]))
    assert objs[-1] < objs[0]
    assert em_model.fit_state_.penalty_code == "family"  # the code of an ordinary default fit
    assert math.isclose(em_model.em_objective_, _brute_objective(em_model, Xm), rel_tol=1e-10)
    # the family code is shorter than the paper's for a support with several terms in a family
    assert _brute_objective(em_model, Xm, "paper") > em_model.em_objective_
    P = em_model.probabilities()
    ll = np.mean([math.log(sum(P[c] for c in completions(row, CARDS))) for row in Xm])
    assert math.isclose(em_model.em_loglik_, ll, rel_tol=1e-10)


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_em_uses_a_numeric_penalty_scale(data, em_model, scale):
    _, Xm = data
    m = FSLL(progress=False, missing="em", penalty_scale=scale).fit(Xm)
    assert m.fit_state_.penalty_scale == scale and m.penalty_scale_ == scale
    objs = [h["objective"] for h in m.em_history_]
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objs, objs[1:]))
    assert math.isclose(m.em_objective_, _brute_objective(m, Xm, scale=scale), rel_tol=1e-10)
    # a smaller price keeps more terms, a larger one fewer, than the code as it is
    if scale < 1:
        assert len(m.theta_) > len(em_model.theta_)
    else:
        assert len(m.theta_) < len(em_model.theta_)
    assert m.penalty_scale_scores_ == {}  # a numeric scale: nothing compared


def test_em_chooses_its_scale_on_held_out_rows(data, em_default):
    """The default EM fit compares the scales as an ordinary fit does: EM on four fifths of the
    rows, each model scoring the held-out rows by their observed-data log-likelihood (brute
    force: every completion of each held-out row); the final fit starts from the chosen
    model, under the family code and the chosen scale, with a monotone objective."""
    _, Xm = data
    m = em_default
    scores = m.penalty_scale_scores_
    assert set(scores) == {1.0, 0.5}
    assert m.penalty_scale_ == max(scores, key=lambda s: (scores[s], s))  # ties to the full code
    rows, counts = M.distinct_rows(Xm)
    tc, hc = M.split_counts(counts)
    assert tc.sum() + hc.sum() == len(Xm) and hc.sum() == len(Xm) // 5
    # the first scale's model is EM under scale 1 on the training rows alone
    sub = FSLL(progress=False, missing="em", penalty_scale=1.0).fit(np.repeat(rows, tc, axis=0))
    P = sub.probabilities()
    held = np.repeat(rows, hc, axis=0)
    ll = np.mean([math.log(sum(P[c] for c in completions(row, CARDS))) for row in held])
    assert scores[1.0] == pytest.approx(ll, rel=1e-10)
    # the fit on every row starts from the chosen model and lowers the brute-force objective
    assert [h["move"] for h in m.history_[:2]] == ["init", "warm-start"]
    objs = [h["objective"] for h in m.em_history_]
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objs, objs[1:]))
    assert m._state.penalty_code == "family" and m._state.penalty_scale == m.penalty_scale_
    assert math.isclose(m.em_objective_, _brute_objective(m, Xm, scale=m.penalty_scale_), rel_tol=1e-10)


@pytest.fixture(scope="module")
def few_holes():
    """Rows with 8 % of the cells missing: most rows complete (the complete rows' fit is a start)."""
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=5)
    return _holes(datasets.sample_table(p, 600, seed=2), 0.08, seed=2)


def test_em_keeps_the_better_of_its_runs_from_the_held_out_model_and_the_complete_rows_fit(few_holes, monkeypatch):
    """The fit on every row runs EM twice: from the held-out choice's model and from the complete
    rows' own default fit (``complete_start``), under the chosen scale; it keeps the run with
    the lower objective, each run's objective that of the same run alone (brute force)."""
    Xm = few_holes
    m = FSLL(progress=False, missing="em").fit(Xm)
    rows, counts = M.distinct_rows(Xm)
    keep = (rows >= 0).all(axis=1)
    cc = FSLL(progress=False, cardinalities=CARDS).fit(np.repeat(rows[keep], counts[keep], axis=0))
    start = M.complete_start(FSLL(progress=False, missing="em"), rows, counts, CARDS)
    assert start["theta"] == M.start_of(cc._state)["theta"] and start["log_z"] == cc.log_z_
    # each run alone: the held-out choice's model only, then the complete rows' fit only
    choose = M.choose
    monkeypatch.setattr(M, "complete_start", lambda *a, **k: None)
    held = FSLL(progress=False, missing="em").fit(Xm)

    def only_complete(*a):
        c = choose(*a)
        c.start, c.complete_start = start, None
        return c

    monkeypatch.setattr(M, "choose", only_complete)
    other = FSLL(progress=False, missing="em").fit(Xm)
    assert held.penalty_scale_ == other.penalty_scale_ == m.penalty_scale_
    # on these rows the run from the complete rows' fit ends lower: it is the one kept
    assert other.em_objective_ < held.em_objective_
    assert m.em_objective_ == pytest.approx(other.em_objective_, rel=1e-12) and m.theta_.keys() == other.theta_.keys()
    assert {h["restart"] for h in m.em_history_} == {1} and {h["restart"] for h in held.em_history_} == {0}
    for fit in (m, held, other):
        objs = [h["objective"] for h in fit.em_history_]
        assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objs, objs[1:]))
        assert math.isclose(fit.em_objective_, _brute_objective(fit, Xm, scale=fit.penalty_scale_), rel_tol=1e-10)


def test_no_complete_rows_start_without_enough_complete_rows(data, few_holes):
    """Fewer than 100 complete rows (or none incomplete): one run, from the held-out choice's model."""
    _, Xm = data
    rows, counts = M.distinct_rows(Xm)
    assert int(counts[(rows >= 0).all(axis=1)].sum()) < 100
    assert M.complete_start(FSLL(progress=False, missing="em"), rows, counts, CARDS) is None
    full = np.where(few_holes < 0, 0, few_holes)
    rows, counts = M.distinct_rows(full)
    assert M.complete_start(FSLL(progress=False, missing="em"), rows, counts, CARDS) is None


@pytest.mark.parametrize("penalty", [None, "paper"])
def test_em_with_hidden_objective_never_increases(penalty):
    rng = np.random.default_rng(1)
    z = rng.integers(0, 2, 300)
    X = np.c_[(z + (rng.random(300) < 0.1)) % 2, (z + (rng.random(300) < 0.2)) % 2, rng.integers(0, 3, 300)]
    X[rng.random(X.shape) < 0.1] = M.MISSING
    m = FSLL(progress=False, missing="em", hidden=[2], n_restarts=2, random_state=0, penalty=penalty).fit(X)
    objs = [h["objective"] for h in m.em_history_]
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objs, objs[1:]))
    Xh = np.c_[X, np.full(len(X), M.MISSING)]
    kind = penalty or "family"
    assert m.fit_state_.penalty_code == kind
    assert math.isclose(m.em_objective_, _brute_objective(m, Xh, kind), rel_tol=1e-10)


def test_soft_targets_equal_the_transform_of_the_weighted_cells(em_model):
    eng = em_model.engine_
    size = math.prod(CARDS)
    rng = np.random.default_rng(0)
    cells = np.sort(rng.choice(size, 50, replace=False))
    w = rng.random(50) * 7
    N = 300
    w *= N / w.sum()
    eng.compute_targets(cells, N, weights=w)
    q = np.full(size, 1.0 / size)
    q[cells] += w
    q /= N + 1
    Phi = oracle.phi_matrix(CARDS)
    np.testing.assert_allclose(storage.open_table(eng.ctx.spec(Table.DBAR)).reshape(-1), Phi @ q, atol=1e-13)
    # integer weights give the same bits as the counts of repeated cells
    reps = rng.integers(1, 5, 50)
    eng.compute_targets(cells, int(reps.sum()), weights=reps.astype(float))
    a = storage.open_table(eng.ctx.spec(Table.DBAR)).copy()
    eng.compute_targets(np.repeat(cells, reps), int(reps.sum()))
    assert np.array_equal(a, storage.open_table(eng.ctx.spec(Table.DBAR)))


def test_em_on_complete_data_is_the_ordinary_fit():
    X = datasets.sample_table(datasets.random_bayesnet(CARDS, 2, seed=7)[0], 500, seed=0)
    a = FSLL(progress=False, missing="em").fit(X)
    b = FSLL(progress=False).fit(X)
    assert a.theta_ == b.theta_ and a.cost_ == b.cost_


def test_missing_cells_refused_without_the_option():
    import pandas as pd

    X = np.array([[0, 1.0], [1, np.nan], [1, 0]])
    with pytest.raises(ValueError, match=r"column 1 \(X1\), row 1 .*missing='em'"):
        FSLL(progress=False).fit(X)
    df = pd.DataFrame({"a": ["x", "y", None], "b": pd.array([1, pd.NA, 0], dtype="Int64")})
    with pytest.raises(ValueError, match=r"column 1 \(b\), row 1 .*2 missing cells in 2 rows.*missing='em'"):
        FSLL(progress=False).fit(df)
    with pytest.raises(ValueError, match="missing must be None or 'em'"):
        FSLL(missing="drop").fit(X)
    with pytest.raises(ValueError, match="hidden cardinalities must be integers >= 2 or 'auto'"):
        FSLL(hidden=[1]).fit(X)
    with pytest.raises(ValueError, match="has no observed value"):
        FSLL(missing="em").fit(np.array([[0, np.nan], [1, np.nan]]))


def test_dataframe_with_missing_cells(data):
    import pandas as pd

    _, Xm = data
    labels = [["f", "m"], ["b", "g", "r"], [0, 1, 2, 3], ["E", "D", "C", "B", "A"]]
    df = pd.DataFrame({nm: [labels[i][v] if v >= 0 else None for v in Xm[:, i]] for i, nm in enumerate("abcd")})
    df["c"] = df["c"].astype("Int64")  # pd.NA in a nullable integer column
    df["d"] = pd.Categorical(df["d"], categories=labels[3])
    m = FSLL(progress=False, missing="em").fit(df)
    # labels put the categories into their canonical basis order; the same order on the codes gives the same fit
    ref = FSLL(progress=False, missing="em", category_order="frequency").fit(Xm)
    assert [list(o) for o in m.basis_order_] == [list(o) for o in ref.basis_order_]
    assert m.categories_ == labels and m.theta_ == ref.theta_
    np.testing.assert_allclose(m.log_prob(df), ref.log_prob(Xm), rtol=1e-12)
    filled = m.impute(df)
    assert list(filled.columns) == list("abcd") and not filled.isna().any().any()
    codes = ref.impute(Xm)
    assert [labels[2][v] for v in codes[:, 2]] == filled["c"].astype(int).tolist()


def test_hidden_variable_recovers_planted_classes():
    rng = np.random.default_rng(3)
    z = rng.integers(0, 3, 1500)
    X = np.stack([(z + (rng.random(1500) < 0.08) * rng.integers(1, 3, 1500)) % 3 for _ in range(6)], axis=1)
    m = FSLL(progress=False, hidden=[3], random_state=0, refine=False).fit(X)
    assert m.cardinalities_ == (3,) * 7 and m.n_hidden_ == 1
    post = m.predict_hidden(X)
    assert post.shape == (1500, 3) and np.allclose(post.sum(axis=1), 1.0)
    found = post.argmax(axis=1)
    # the hidden states are the planted classes up to a relabelling
    table = np.zeros((3, 3), int)
    np.add.at(table, (z, found), 1)
    assert (table.max(axis=1).sum()) / 1500 > 0.97
    assert sorted(table.argmax(axis=1).tolist()) == [0, 1, 2]
    inter = m.interactions()
    assert any("H0" in v for v in inter["variables"])  # the hidden variable explains the observed ones
    # the posterior is the conditional of the dense table; log_prob marginalises the hidden variable
    P = m.probabilities()
    for r in range(5):
        ref = P[tuple(X[r])] / P[tuple(X[r])].sum()
        np.testing.assert_allclose(post[r], ref, rtol=1e-10)
        assert math.isclose(m.log_prob(X[r:r + 1])[0], math.log(P[tuple(X[r])].sum()), rel_tol=1e-10)


def _planted(k, n, seed):
    return datasets.latent_classes(k, n, seed=seed)


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_hidden_auto_recovers_the_number_of_planted_classes(k):
    X, z = _planted(k, 1500, seed=100 * k)
    m = FSLL(progress=False, hidden=["auto"], random_state=0).fit(X)
    assert m.cardinalities_ == (3, 4, 5, 3, 4, 5, k) and m.n_hidden_ == 1
    scores = m.hidden_scores_
    assert sorted(scores) == list(range(2, max(scores) + 1)) and max(scores) >= k + 1  # 2, 3, ... past the choice
    assert all(scores[k] > v for j, v in scores.items() if j < k)  # fewer states score worse
    found = m.predict_hidden(X).argmax(axis=1)
    table = np.zeros((k, k), int)
    np.add.at(table, (z, found), 1)
    assert table.max(axis=1).sum() / len(X) > 0.85 and sorted(table.argmax(axis=1).tolist()) == list(range(k))
    objs = [h["objective"] for h in m.em_history_]
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objs, objs[1:]))


def test_hidden_auto_needs_rows_and_takes_one_auto():
    X, _ = _planted(2, 60, seed=0)
    with pytest.raises(ValueError, match="only 60 rows"):
        FSLL(progress=False, hidden=["auto"]).fit(X)
    with pytest.raises(ValueError, match="at most one hidden cardinality can be 'auto'"):
        FSLL(progress=False, hidden=["auto", "auto"]).fit(X)
    with pytest.raises(ValueError, match="integers >= 2 or 'auto'"):
        FSLL(progress=False, hidden=["many"]).fit(X)
    m = FSLL(progress=False, hidden=["auto", 2], random_state=0).fit(_planted(3, 600, seed=1)[0])
    assert m.n_hidden_ == 2 and m.cardinalities_[-1] == 2 and m.cardinalities_[-2] in m.hidden_scores_


def test_hidden_model_saves_and_loads(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.integers(0, 2, 400)
    X = np.stack([(z + (rng.random(400) < 0.1)) % 2 for _ in range(4)], axis=1)
    m = FSLL(progress=False, hidden=[2], n_restarts=1, random_state=1).fit(X)
    m.save(tmp_path / "m.json")
    m2 = FSLL.load(tmp_path / "m.json")
    assert m2.hidden == [2] and m2.random_state == 1
    np.testing.assert_allclose(m2.predict_hidden(X), m.predict_hidden(X), rtol=1e-10)
    np.testing.assert_allclose(m2.log_prob(X), m.log_prob(X), rtol=1e-10)


def test_conditional_ignores_missing_evidence(model):
    a = model.conditional(1, given={0: 1, 2: None, 3: float("nan")})
    assert np.allclose(a, model.conditional(1, given={0: 1}))


def test_rows_of_lists_with_none_and_models_without_hidden(model):
    X = [[0, 1, None, 4], [1, None, 2, 0], [None, 0, 0, 1]]
    lp = model.log_prob(X)
    ref = model.log_prob(np.array([[0, 1, -1, 4], [1, -1, 2, 0], [-1, 0, 0, 1]]))
    assert np.array_equal(lp, ref) and np.isfinite(lp).all()
    out = model.impute(X)
    assert (out >= 0).all() and out[0, 3] == 4 and out[1, 2] == 2 and out[2, 3] == 1
    assert np.array_equal(out, model.impute(np.array([[0, 1, -1, 4], [1, -1, 2, 0], [-1, 0, 0, 1]])))
    with pytest.raises(ValueError, match="no hidden variables"):
        model.predict_hidden(X)


def holes_csv(path, n: int):
    """A CSV of ``n`` rows over columns a, b, c with about 15 % of column b's cells empty."""
    rng = np.random.default_rng(0)
    a = rng.choice(["x", "y"], n)
    b = np.where(rng.random(n) < 0.9, a, np.where(a == "x", "y", "x"))
    rows = ["a,b,c"] + [f"{u},{'' if r < 0.15 else v},{w}" for u, v, w, r in
                        zip(a, b, rng.integers(0, 3, n), rng.random(n))]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_cli_fit_with_missing_cells(tmp_path, capsys):
    from fsll_ooc import cli

    path = holes_csv(tmp_path / "holes.csv", 300)
    assert cli.main(["fit", str(path), "-o", str(tmp_path / "no.json")]) == 2
    assert "--missing em" in capsys.readouterr().err
    assert cli.main(["fit", str(path), "--missing", "em", "-o", str(tmp_path / "m.json")]) == 0
    m = FSLL.load(tmp_path / "m.json")
    assert m.missing == "em" and m.feature_names_in_ == ["a", "b", "c"] and m.categories_[1] == ["x", "y"]
    import pandas as pd

    df = pd.read_csv(path)
    ref = FSLL(progress=False, missing="em").fit(df)
    assert m.theta_ == ref.theta_


def test_in_core_em_restarts_plan_two_sets_of_tables():
    """In core, EM with several restarts keeps the best run's tables while the next run builds
    its own: the plan budgets two sets, and a memory limit that holds only one is refused
    with the fix named; one restart fits in it."""
    from fsll_ooc import planner

    cards = (2,) * 18
    limit = int(planner.min_memory(cards, out_of_core=False) * 1.5)  # one set fits, two do not
    rng = np.random.default_rng(0)
    X = rng.integers(0, 2, (200, 18))
    X[::7, 3] = -1
    kw = dict(missing="em", penalty_scale=1.0, memory_limit=limit, progress=False, max_iter=3, random_state=0)
    with pytest.raises(planner.PlanError, match="n_restarts=1"):
        FSLL(n_restarts=2, **kw).fit(X)
    m = FSLL(n_restarts=1, **kw).fit(X)
    assert m.plan_.memory_limit == limit and m.plan_.layout.a == 0


def test_em_choice_scores_each_scale_by_the_better_of_two_runs(few_holes, monkeypatch):
    """EM's held-out choice (no hidden variable) runs each scale twice on the training rows:
    the run continued from the previous scale, and EM from the training rows' own complete-row
    fit; the scale's score is the higher held-out observed-data log-likelihood of the two
    (brute force: every completion of each held-out row), its start that run's model."""
    Xm = few_holes
    rows, counts = M.distinct_rows(Xm)
    tc, hc = M.split_counts(counts)
    train, held = np.repeat(rows, tc, axis=0), np.repeat(rows, hc, axis=0)
    est, seeds = FSLL(progress=False, missing="em"), M.restart_seeds(0, 1)
    choice = M.choose(est, rows, counts, CARDS, [], seeds)
    second = M.complete_start(est, rows[tc > 0], tc[tc > 0], CARDS)
    assert second is not None  # the training rows hold enough complete rows
    keep = (train >= 0).all(axis=1)
    assert second["theta"] == M.start_of(FSLL(progress=False, cardinalities=CARDS).fit(train[keep])._state)["theta"]
    choose = M.choose
    monkeypatch.setattr(M, "complete_start", lambda *a, **k: None)
    path = choose(est, rows, counts, CARDS, [], seeds)  # the continued runs alone
    starts = {}
    for s in (1.0, 0.5):
        monkeypatch.setattr(M, "choose", lambda *a, s=s: M.EMChoice(s, [], start=second))
        run = FSLL(progress=False, missing="em", cardinalities=CARDS).fit(train)  # EM from the complete-row fit
        P = run.probabilities()
        ll = np.mean([math.log(sum(P[c] for c in completions(row, CARDS))) for row in held])
        assert choice.scores[s] == pytest.approx(max(path.scores[s], ll), rel=1e-10)
        starts[s] = M.start_of(run._state) if ll > path.scores[s] else None
    assert any(starts.values())  # on these rows the second run scores higher under at least one scale
    assert choice.scale == max(choice.scores, key=lambda s: (choice.scores[s], s))
    # the fit on every row starts from the chosen scale's better run
    want = starts[choice.scale] or (path.start if path.scale == choice.scale else None)
    assert want is not None
    got, want = np.array(choice.start["theta"]), np.array(want["theta"])
    assert got.shape == want.shape and np.array_equal(got[:, 0], want[:, 0])
    np.testing.assert_allclose(got[:, 1], want[:, 1], rtol=1e-9)


def test_choice_second_start_needs_two_sets_of_tables_in_memory(few_holes, tmp_path):
    """The choice's runs hold their tables in memory even for a fit with a store: its second
    start is skipped when two sets of tables do not fit in the memory limit."""
    rows, counts = M.distinct_rows(few_holes)
    cells = int(np.prod(CARDS))
    roomy = FSLL(progress=False, missing="em", store=tmp_path / "a", memory_limit="1GiB")
    assert M.complete_start(roomy, rows, counts, CARDS, in_memory=True) is not None
    tight = FSLL(progress=False, missing="em", store=tmp_path / "b", memory_limit=f"{cells * 8}B")
    assert M.complete_start(tight, rows, counts, CARDS, in_memory=True) is None
