"""The penalty scale (``penalty_scale``) and its choice from held-out rows, against brute force."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fsll_ooc import FSLL, cost as C, queries
from fsll_ooc.learn import auto_epsilon, select

import oracle
from oracle import brute_code, brute_cost
from test_penalty import _data, _state


@pytest.mark.parametrize("kind", ["paper", "family"])
@pytest.mark.parametrize("scale", [0.5, 0.3])
def test_scaled_code_is_the_scale_times_the_code(kind, scale):
    cards, N = (2, 3, 4, 5), 613
    size = math.prod(cards)
    rng = np.random.default_rng(7)
    for _ in range(4):
        support = rng.choice(np.arange(1, size), size=int(rng.integers(1, 30)), replace=False)
        st = _state(cards, N, support, kind)
        st.penalty_scale = scale
        want = scale * brute_code(cards, N, support, kind)
        assert st.total_penalty() == pytest.approx(want, rel=1e-12)
        for y, r in zip(range(1, 40), st.penalties(list(range(1, 40)))):
            other = sorted(set(support.tolist()) ^ {y})
            assert r == pytest.approx(abs(scale * brute_code(cards, N, other, kind) - want), rel=1e-9, abs=1e-15)
    r0, w = C.penalty_weights(cards, N)
    r0s, ws = C.penalty_weights(cards, N, scale)
    assert r0s == pytest.approx(scale * r0) and np.allclose(ws, scale * w)
    assert C.penalty_weights(cards, N, 1.0)[0] == r0  # scale 1: the same bits


def test_scaled_fit_is_an_axis_minimum_of_the_scaled_cost():
    """``penalty_scale=0.5``: the fit's cost is KL(q||p) plus half the brute-force family code, and
    no single append, adjust or remove gains epsilon under it."""
    cards, n = (2, 3, 4, 5), 500
    X, _ = _data(cards, n, 3)
    m = FSLL(cardinalities=cards, penalty_scale=0.5, progress=False).fit(X)
    assert m.penalty_scale_ == 0.5 and m.penalty_scale_scores_ == {}
    half = FSLL(cardinalities=cards, penalty_scale=1.0, progress=False).fit(X)
    assert m.n_bases_ > half.n_bases_  # a lighter penalty keeps more terms here
    Phi, q = oracle.phi_matrix(cards), oracle.target(X, cards)
    theta = np.zeros(math.prod(cards))
    for y, v in m.theta_.items():
        theta[np.ravel_multi_index(y, cards)] = v

    base = oracle.assert_axis_minimum(theta, q, Phi, None, auto_epsilon(n),
                                      cost_fn=lambda th: brute_cost(th, q, Phi, cards, n, "family", 0.5))
    assert m.cost_ == pytest.approx(base, abs=1e-10)


def test_holdout_split_and_choice_rule():
    train, held = select.holdout_split(1003)
    assert len(held) == math.ceil(1003 / select.HOLDOUT)
    assert np.array_equal(np.sort(np.concatenate([train, held])), np.arange(1003))
    assert np.array_equal(held, select.holdout_split(1003)[1])  # seeded: the same rows every time
    codes = np.arange(500)[:, None]
    seen = []

    def fake(score_of):
        def fit_path(train_codes, scales):
            for s in scales:
                seen.append((len(train_codes), s))
                yield (lambda c, s=s: np.full(len(c), score_of[s])), {"model of": s}
        return fit_path

    half = select.choose_scale(fake({1.0: -2.0, 0.5: -1.5}), codes)
    assert half.scale == 0.5 and half.start == {"model of": 0.5}  # the final fit starts from the winner
    full = select.choose_scale(fake({1.0: -2.0, 0.5: -2.5}), codes)
    assert full.scale == 1.0 and full.start == {"model of": 1.0}
    tie = select.choose_scale(fake({1.0: -2.0, 0.5: -2.0}), codes)
    assert tie.scale == 1.0 and tie.scores == {1.0: -2.0, 0.5: -2.0}  # ties keep the full code
    assert all(n == 400 for n, _ in seen)
    few = select.choose_scale(fake({1.0: -9.0, 0.5: 0.0}), codes[: select.MIN_ROWS - 1])
    assert few.scale == 1.0 and few.scores == {} and "rows" in few.reason and few.start is None


def test_auto_scale_is_the_held_out_argmax_and_the_final_fit_uses_it(tmp_path, monkeypatch):
    """The default fit's scale is the one whose fit on four fifths of the rows scores the held-out
    fifth best: scale 1 recomputed here by an explicit fit; scale 1/2 by the search continued
    from it, an axis minimum of the half-weight cost on those rows (brute force); the final
    fit starts from the chosen scale's model (its first recorded cost is that model's cost on
    every row, brute force) and ends on an axis minimum of the chosen scaled cost on every row."""
    cards = (3, 4, 2, 3)
    X, _ = _data(cards, 600, 5)
    m = FSLL(cardinalities=cards, progress=False).fit(X)
    train, held = select.holdout_split(len(X))
    full = FSLL(cardinalities=cards, penalty_scale=1.0, progress=False).fit(X[train])
    assert m.penalty_scale_scores_[1.0] == pytest.approx(float(np.mean(full.log_prob(X[held]))), abs=1e-12)
    seen, models = [], {}
    real_path = select.choose_scale

    def spy(fit_path, codes, scales=C.PENALTY_SCALES):
        def recording(train_codes, scales):
            for s, (lp, model) in zip(scales, fit_path(train_codes, scales)):
                seen.append(lp(np.array(list(itertools.product(*[range(k) for k in cards])))))
                models[s] = model
                yield lp, model
        return real_path(recording, codes, scales)

    monkeypatch.setattr(select, "choose_scale", spy)
    again = FSLL(cardinalities=cards, progress=False).fit(X)
    monkeypatch.undo()
    assert again.penalty_scale_scores_ == m.penalty_scale_scores_ and again.theta_ == m.theta_
    # the continued model (log-probabilities of every cell) is an axis minimum of the half cost
    Phi, q = oracle.phi_matrix(cards), oracle.target(X[train], cards)
    logp = seen[1]
    theta = np.linalg.solve(Phi.T, logp)
    theta[0] = 0.0  # the normaliser's place
    theta[np.abs(theta) < 1e-9] = 0.0
    n = len(train)
    oracle.assert_axis_minimum(theta, q, Phi, None, auto_epsilon(n),
                               cost_fn=lambda th: brute_cost(th, q, Phi, cards, n, "family", 0.5))
    scores = m.penalty_scale_scores_
    assert m.penalty_scale_ == max(scores, key=lambda s: (scores[s], s == 1.0))
    alpha = m.penalty_scale_
    Phi, q, n = oracle.phi_matrix(cards), oracle.target(X, cards), len(X)
    start = np.zeros(len(q))
    for y, v in models[alpha]["theta"]:
        start[y] = v
    init, warm = m.history_[:2]
    assert init["move"] == "init" and warm["move"] == "warm-start"
    assert models[alpha]["theta"] and warm["n_bases"] == len(models[alpha]["theta"])
    assert init["cost"] == pytest.approx(brute_cost(np.zeros(len(q)), q, Phi, cards, n, "family", alpha), abs=1e-12)
    assert warm["cost"] == pytest.approx(brute_cost(start, q, Phi, cards, n, "family", alpha), abs=1e-10)
    assert warm["delta"] == pytest.approx(warm["cost"] - init["cost"], abs=1e-14)
    # the start's terms share its gain (by their gains in the held-out fit): every term has a share
    df = m.interactions()
    assert len(df) == m.n_bases_ and df["share"].notna().all() and (df["share"] > 0).all()
    _, total = queries.term_contributions(m.history_)
    assert total == pytest.approx(init["cost"] - m.cost_, rel=1e-9)
    theta = np.zeros(len(q))
    for y, v in m.theta_.items():
        theta[np.ravel_multi_index(y, cards)] = v
    final = oracle.assert_axis_minimum(theta, q, Phi, None, auto_epsilon(n),
                                       cost_fn=lambda th: brute_cost(th, q, Phi, cards, n, "family", alpha))
    assert m.cost_ == pytest.approx(final, abs=1e-10)
    m.save(tmp_path / "m.json")
    back = FSLL.load(tmp_path / "m.json")
    assert back.penalty_scale_ == m.penalty_scale_ and back.get_params()["penalty_scale"] is None


def test_paper_mode_and_bad_scales():
    X, _ = _data((2, 3, 4), 300, 1)
    m = FSLL(epsilon=1e-4, progress=False).fit(X)
    assert m.penalty_scale_ == 1.0 and m.penalty_scale_scores_ == {}
    assert C.resolve_penalty_scale(None, 1e-4) == 1.0 and C.resolve_penalty_scale(None, "auto") == "auto"
    for bad in (0, -1.0, float("nan"), float("inf"), "half", True):
        with pytest.raises(ValueError, match="penalty_scale"):
            FSLL(penalty_scale=bad, progress=False).fit(X)
    with pytest.raises(ValueError, match="penalty_scale"):
        C.checked_penalty_scale("auto")  # a file must hold the number the fit used


def test_half_scale_survives_an_interrupted_out_of_core_fit(tmp_path, monkeypatch):
    """The scale is part of the stored state: resuming (and restarting) a fit uses it."""
    import interrupts

    X, _ = _data((3, 4, 2), 800, 4)
    ref = FSLL(penalty_scale=0.5, progress=False).fit(X)
    interrupts.stop_after(monkeypatch, 3)
    with pytest.raises(interrupts.Crash):
        FSLL(penalty_scale=0.5, progress=False, store=tmp_path / "s", layout=(1, 2), scheduler="serial").fit(X)
    monkeypatch.undo()
    m = FSLL.resume(tmp_path / "s", progress=False)
    assert m.penalty_scale_ == 0.5
    assert set(m.theta_) == set(ref.theta_) and m.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    again = FSLL.resume(tmp_path / "s", progress=False, restart=True)
    assert again.penalty_scale_ == 0.5 and set(again.theta_) == set(ref.theta_)


@pytest.mark.parametrize("stop", [1, 2, 4])
def test_warm_started_store_fit_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch, stop):
    """A default (``penalty_scale="auto"``) fit in a store starts from the held-out choice's
    model, which the store keeps: stopped while ``starting`` (1), right after the warm start
    (2) or mid-search (4), its resume, and a restart, end on the uninterrupted fit's model."""
    import interrupts

    X, _ = _data((3, 4, 2), 800, 4)
    kw = dict(progress=False, layout=(1, 2), scheduler="serial")
    ref = FSLL(store=tmp_path / "ref", **kw).fit(X)
    assert ref.penalty_scale_scores_ and ref.history_[1]["move"] == "warm-start"
    core = FSLL(progress=False).fit(X)
    assert set(core.theta_) == set(ref.theta_) and core.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    interrupts.stop_after(monkeypatch, stop)
    with pytest.raises(interrupts.Crash):
        FSLL(store=tmp_path / "s", **kw).fit(X)
    monkeypatch.undo()
    m = FSLL.resume(tmp_path / "s", progress=False)
    assert m.penalty_scale_ == ref.penalty_scale_ and m.history_[:2] == ref.history_[:2]
    assert set(m.theta_) == set(ref.theta_) and m.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    again = FSLL.resume(tmp_path / "s", progress=False, restart=True)
    assert again.history_[:2] == ref.history_[:2] and set(again.theta_) == set(ref.theta_)
    assert again.cost_ == pytest.approx(ref.cost_, abs=1e-10)


def test_unique_inverse_is_numpys():
    from fsll_ooc.learn.cells import unique_inverse

    rng = np.random.default_rng(11)
    for size, n in ((50, 1000), (7, 3), (10_000, 100), (1, 5), (300, 0)):
        flat = rng.integers(0, size, n)
        want_u, want_i = np.unique(flat, return_inverse=True)
        got_u, got_i = unique_inverse(flat, size)
        assert np.array_equal(got_u, want_u) and np.array_equal(got_i, want_i.reshape(-1))
        assert got_u.dtype == np.int64 and got_i.dtype == want_i.dtype


def test_a_start_no_better_than_uniform_is_not_taken(monkeypatch):
    """A start whose cost on every row is not below the uniform model's is dropped: the fit is
    then the search from the uniform model under the chosen scale, bit for bit."""
    X, _ = _data((3, 4, 2), 600, 2)
    bad = select.ScaleChoice(1.0, {1.0: -1.0, 0.5: -2.0}, start={"theta": [[5, 40.0]], "log_z": 0.0, "gain": [1.0]})
    monkeypatch.setattr(select, "choose_scale", lambda fit_path, codes: bad)
    m = FSLL(progress=False).fit(X)
    monkeypatch.undo()
    ref = FSLL(penalty_scale=1.0, progress=False).fit(X)
    assert m.theta_ == ref.theta_ and m.cost_ == ref.cost_ and m.n_iter_ == ref.n_iter_
    assert [h["move"] for h in m.history_] == [h["move"] for h in ref.history_]
    assert [h["cost"] for h in m.history_] == [h["cost"] for h in ref.history_]


def test_a_fixed_scale_fits_the_same_model_whatever_the_rows_order():
    """The guide's promise: with a fixed ``penalty_scale`` the model depends on the rows as a
    multiset (their counts), not on their order; under ``"auto"`` the held-out rows are picked
    by position, so the order may matter there (documented, not asserted)."""
    rng = np.random.default_rng(3)
    n = 1500
    a = rng.integers(0, 3, n)
    b = (a + (rng.random(n) < 0.2)) % 3
    c = rng.integers(0, 2, n)
    d = c ^ (rng.random(n) < 0.1)
    X = np.c_[a, b, c, d, rng.integers(0, 5, n)]
    perm = rng.permutation(n)
    m1 = FSLL(progress=False, penalty_scale=1.0).fit(X)
    m2 = FSLL(progress=False, penalty_scale=1.0).fit(X[perm])
    assert len(m1.history_) > 1  # the fit took steps, so there is something to compare
    np.testing.assert_array_equal(m1.score_samples(X), m2.score_samples(X))
