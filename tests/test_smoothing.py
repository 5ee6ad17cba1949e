"""Smoothing the final parameters (``smoothing``): the search's support refitted to the rows and
``a`` pseudo-rows spread evenly over the cells, against brute force."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fsll_ooc import FSLL, cost as C, fitting
from fsll_ooc.learn import corrective, select

import oracle
from oracle import brute_cost
from test_penalty import _data


def _theta_vec(m, cards):
    theta = np.zeros(math.prod(cards))
    for y, v in m.theta_.items():
        theta[np.ravel_multi_index(y, cards)] = v
    return theta


def _moves(m):
    """The search's history without its timings."""
    return [{k: v for k, v in h.items() if k != "time"} for h in m.history_]


def _smoothed_target(X, cards, a):
    """``q_a = (counts + a / |X|) / (N + a)``, flat, from its definition."""
    size = math.prod(cards)
    counts = np.bincount(np.ravel_multi_index(tuple(np.asarray(X).T), cards), minlength=size).astype(float)
    return (counts + a / size) / (len(X) + a)


@pytest.mark.parametrize("a", [0.5, 8.0, 60.0])
def test_smoothed_parameters_are_the_dirichlet_mode_on_the_searched_support(a):
    """The support is the search's (that of ``smoothing=1``, whose model is the default's bit for
    bit); the parameters are the maximum of ``sum_x q_a(x) log p(x)`` on that support: the
    model's moments of every selected basis function equal those of ``q_a`` (brute force, dense
    basis matrix); ``cost_`` is the cost of the paper's ``q`` (``a = 1``)."""
    cards = (2, 3, 4, 5)
    X, _ = _data(cards, 400, 3)
    plain = FSLL(progress=False, penalty_scale=1.0).fit(X)
    one = FSLL(progress=False, penalty_scale=1.0, smoothing=1.0).fit(X)
    assert one.theta_ == plain.theta_ and one.smoothing_ == 1.0
    m = FSLL(progress=False, penalty_scale=1.0, smoothing=a).fit(X)
    assert m.smoothing_ == a and set(m.theta_) == set(plain.theta_) and _moves(m) == _moves(plain)
    Phi = oracle.phi_matrix(cards)
    theta = _theta_vec(m, cards)
    p = oracle.model(theta, Phi)
    assert np.allclose(np.asarray(m.probabilities()).reshape(-1), p, atol=1e-12)
    support = np.nonzero(theta)[0]
    qa = _smoothed_target(X, cards, a)
    residual = np.abs(Phi[support] @ p - Phi[support] @ qa)
    moved = np.abs(Phi[support] @ qa - Phi[support] @ oracle.target(X, cards))
    assert residual.max() < 1e-7 and residual.max() < 1e-3 * moved.max()  # a refit to q_a, not to q_1
    # a maximum: no move of one parameter (or a pair) raises sum q_a log p
    ll = lambda th: float(qa @ np.log(oracle.model(th, Phi)))  # noqa: E731
    base = ll(theta)
    for y in support[:6]:
        for step in (1e-3, -1e-3):
            th = theta.copy()
            th[y] += step
            assert ll(th) < base
    q1 = oracle.target(X, cards)
    assert m.cost_ == pytest.approx(brute_cost(theta, q1, Phi, cards, len(X), "family", 1.0), abs=1e-10)
    assert m.cost_ > plain.cost_  # the search's own parameters are the cheapest on its support
    # more pseudo-rows pull the model toward the uniform distribution
    u = np.full(len(p), 1.0 / len(p))
    d_plain = oracle.kl(u, np.asarray(plain.probabilities()).reshape(-1))
    assert oracle.kl(u, p) < d_plain if a > 1 else oracle.kl(u, p) > d_plain


def test_auto_smoothing_is_the_rule_on_the_held_out_rows():
    """``smoothing="auto"`` with a fixed scale: the fit starts from the uniform model as without
    it (same support and search); each score is the held-out mean log-likelihood of an
    explicit fit on the training rows with that many pseudo-rows; the values tried double from
    1 until the score fell twice; the chosen one is the rule's (largest positive paired gain
    over 1 less one standard error), recomputed here."""
    cards = (3, 4, 5, 3, 4)
    X, _ = _data(cards, 400, 3)
    kw = dict(progress=False, penalty_scale=1.0)
    plain = FSLL(**kw).fit(X)
    m = FSLL(smoothing="auto", **kw).fit(X)
    assert _moves(m) == _moves(plain) and set(m.theta_) == set(plain.theta_)
    scores = m.smoothing_scores_
    tried = sorted(scores)
    assert tried[0] == 1.0 and all(b == 2 * a for a, b in zip(tried, tried[1:])) and len(tried) >= 3
    best = max(scores.values())
    assert scores[tried[-1]] < best and scores[tried[-2]] < best  # stopped after two falls
    train, held = select.holdout_split(len(X))
    lp = {}
    for a in tried:
        sub = FSLL(smoothing=a, **kw).fit(X[train])
        lp[a] = np.asarray(sub.log_prob(X[held]))
        assert scores[a] == pytest.approx(float(np.mean(lp[a])), abs=1e-6)  # refits converge to 1e-12 nats
    chosen, bound = 1.0, 0.0
    for a in tried[1:]:
        d = lp[a] - lp[1.0]
        low = float(np.mean(d)) - float(np.std(d)) / math.sqrt(len(d))
        if low > bound:
            chosen, bound = a, low
    assert chosen > 1.0  # the data (many unseen cells) make it choose: the refit is exercised
    assert m.smoothing_ == chosen
    again = FSLL(smoothing=chosen, **kw).fit(X)
    assert again.theta_ == pytest.approx(m.theta_, abs=1e-9)


def test_auto_smoothing_with_the_default_scale_choice_and_paper_mode():
    """With ``penalty_scale="auto"`` the choice reuses the scale's held-out fit (the model the
    final fit starts from); ``epsilon=1e-4`` alone stays the paper's model (no choice)."""
    cards = (3, 4, 5, 3, 4)
    X, _ = _data(cards, 400, 3)
    plain = FSLL(progress=False).fit(X)
    m = FSLL(progress=False, smoothing="auto").fit(X)
    assert _moves(m) == _moves(plain) and m.penalty_scale_scores_ == plain.penalty_scale_scores_
    assert m.smoothing_scores_ and m.smoothing_ in m.smoothing_scores_
    paper = FSLL(progress=False, epsilon=1e-4).fit(X)
    assert paper.smoothing_ == 1.0 and paper.smoothing_scores_ == {}
    assert C.resolve_smoothing(None, 1e-4) == 1.0 and C.resolve_smoothing(None, "auto") == 1.0
    # a network's start smooths by default, as a network's learner smooths its tables, and
    # chooses the price of a family's further terms (a conditional table's) on the held-out rows
    assert C.resolve_smoothing(None, "auto", "network") == "auto"
    assert C.resolve_further_price(None, "family", "network") == "auto"
    assert C.resolve_further_price(None, "paper", "network") == "full" == C.resolve_further_price(None, "family")
    assert C.resolve_smoothing(None, 1e-4, "network") == 1.0 and C.resolve_smoothing(2, "auto", "network") == 2.0
    net = FSLL(progress=False, start="network").fit(X)
    assert net.further_price_ in ("full", "aic") and any(isinstance(k, tuple) for k in net.penalty_scale_scores_)
    unsmoothed = FSLL(progress=False, start="network", smoothing=1.0).fit(X)
    assert net.smoothing_scores_ and net.smoothing_ in net.smoothing_scores_
    assert _moves(net) == _moves(unsmoothed) and set(net.theta_) == set(unsmoothed.theta_)
    assert (net.theta_ == unsmoothed.theta_) == (net.smoothing_ == 1.0)


def test_bad_smoothing_values_and_em():
    X, _ = _data((2, 3, 4), 300, 1)
    for bad in (0, -1.0, float("nan"), float("inf"), "some", True):
        with pytest.raises(ValueError, match="smoothing"):
            FSLL(smoothing=bad, progress=False).fit(X)
    with pytest.raises(ValueError, match="smoothing"):
        C.checked_smoothing("auto")  # a file must hold the number the fit used
    with pytest.raises(ValueError, match="smoothing is not available with missing='em'"):
        FSLL(smoothing=4.0, missing="em", progress=False).fit(X)
    m = FSLL(missing="em", progress=False).fit(X)
    assert m.smoothing_ == 1.0 and m.smoothing_scores_ == {}


def test_model_file_keeps_the_smoothing(tmp_path):
    cards = (3, 4, 5)
    X, _ = _data(cards, 300, 2)
    m = FSLL(smoothing=16.0, progress=False).fit(X)
    m.save(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["smoothing"] == 16.0 and doc["params"]["smoothing"] == 16.0
    back = FSLL.load(tmp_path / "m.json")
    assert back.smoothing_ == 16.0 and back.theta_ == m.theta_
    doc["smoothing"] = "lots"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="smoothing"):
        FSLL.load(tmp_path / "bad.json")


@pytest.mark.parametrize("where", ["search", "refit"])
def test_a_store_fit_interrupted_before_or_during_the_refit_resumes_to_the_same_model(tmp_path, monkeypatch, where):
    """Out of core (several chunks): stopped mid-search, or in the smoothing refit itself after
    one Newton round moved the store's dual table, the resumed fit ends on the in-core model."""
    import interrupts

    cards = (3, 4, 2, 5)
    X, _ = _data(cards, 800, 4)
    ref = FSLL(smoothing=24.0, progress=False).fit(X)
    assert ref.smoothing_ == 24.0
    kw = dict(progress=False, layout=(1, 2), scheduler="serial", smoothing=24.0)
    if where == "search":
        interrupts.stop_after(monkeypatch, 3)
    else:
        real_smooth, real_refine = fitting.smooth, corrective.refine

        def cut_short(*args, **kwargs):
            real_refine(*args, **{**kwargs, "max_rounds": 1})
            raise interrupts.Crash()

        def smooth(engine, state, *args, **kwargs):
            if state.smoothing != 1.0:  # the final refit (not a held-out sub-fit's)
                monkeypatch.setattr(corrective, "refine", cut_short)
            return real_smooth(engine, state, *args, **kwargs)

        monkeypatch.setattr(fitting, "smooth", smooth)
    with pytest.raises(interrupts.Crash):
        FSLL(store=tmp_path / "s", **kw).fit(X)
    monkeypatch.undo()
    m = FSLL.resume(tmp_path / "s", progress=False)
    assert m.smoothing_ == 24.0 and set(m.theta_) == set(ref.theta_)
    assert m.theta_ == pytest.approx(ref.theta_, abs=1e-8)
    assert m.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    assert np.allclose(m.probabilities(), ref.probabilities(), atol=1e-12)
