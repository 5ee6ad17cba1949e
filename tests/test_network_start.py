"""A Bayesian network's span as the search's start (``FSLL(start="network")``): the BIC
family score, the hill climbing, the span and the network's parameters against brute
force on tiny tables; the refitted span against the moment conditions of maximum
likelihood (dense oracle); the option's checks, model file, store and resume."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fsll_ooc import FSLL, datasets, fitting as NS

import oracle


def _data(cards, n, seed, n_parents=2):
    p, _ = datasets.random_bayesnet(cards, n_parents, seed=seed)
    return datasets.sample_table(p, n, seed=seed + 100), p


def _distinct(X, cards):
    flat, counts = np.unique(np.ravel_multi_index(tuple(np.asarray(X).T), cards), return_counts=True)
    rows = np.stack(np.unravel_index(flat, cards), axis=1)
    return flat, counts, rows


def brute_bic(X, cards, node, parents):
    """BIC of ``node | parents`` from the definition, row by row with dictionaries."""
    n_xpa, n_pa = {}, {}
    for r in np.asarray(X):
        pa = tuple(int(r[v]) for v in parents)
        n_pa[pa] = n_pa.get(pa, 0) + 1
        n_xpa[(pa, int(r[node]))] = n_xpa.get((pa, int(r[node])), 0) + 1
    ll = sum(c * math.log(c / n_pa[pa]) for (pa, _), c in n_xpa.items())
    k_pa = math.prod(cards[v] for v in parents)
    return ll - 0.5 * math.log(len(X)) * (cards[node] - 1) * k_pa


def _dags(n):
    """Every directed acyclic graph on ``n`` nodes as a list of parent sets."""
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    for mask in range(1 << len(pairs)):
        parents = [set() for _ in range(n)]
        for b, (j, i) in enumerate(pairs):
            if mask >> b & 1:
                parents[i].add(j)
        if all(not NS._reaches([frozenset(p) for p in parents], i, j) for i in range(n) for j in parents[i]):
            yield [tuple(sorted(p)) for p in parents]


def _total(rows, w, cards, parents):
    return sum(NS.family_score(rows, w, cards, i, p) for i, p in enumerate(parents))


@pytest.mark.parametrize("cards,parents", [((3, 2, 4), (0, 2)), ((2, 2, 2, 3), (1,)), ((4, 3), ()),
                                           ((2, 3, 2, 2), (0, 2, 3))])
def test_family_score_is_bic(cards, parents):
    X, _ = _data(cards, 400, 3)
    _, counts, rows = _distinct(X, cards)
    node = next(i for i in range(len(cards)) if i not in parents)
    assert NS.family_score(rows, counts, cards, node, parents) == pytest.approx(
        brute_bic(X, cards, node, parents), rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_hill_climb_ends_on_a_local_maximum_and_best_of_orders(seed):
    """The climb's graph is acyclic and no single arc addition, removal or reversal raises
    its BIC (every neighbour enumerated); on three variables the best of the orders is
    compared with every DAG."""
    cards = (2, 3, 2)
    X, _ = _data(cards, 600, seed)
    _, counts, rows = _distinct(X, cards)
    everything = {tuple(d): _total(rows, counts, cards, d) for d in _dags(3)}
    for order in itertools.permutations(range(3)):
        pa = NS.hill_climb(rows, counts, cards, order=order)
        assert tuple(pa) in everything  # a DAG
        here = everything[tuple(pa)]
        for other, score in everything.items():
            diff = sum(len(set(a) ^ set(b)) for a, b in zip(pa, other))
            arcs = {(j, i) for i, ps in enumerate(pa) for j in ps}
            arcs2 = {(j, i) for i, ps in enumerate(other) for j in ps}
            reversal = len(arcs ^ arcs2) == 2 and {(b, a) for a, b in arcs - arcs2} == arcs2 - arcs
            if diff == 1 or reversal:  # a neighbour
                assert score <= here + 1e-9
    fams = NS.network_families(*_distinct(X, cards)[:2], cards)
    parents = [tuple(v for v in f if v != i) for i, f in enumerate(fams)]
    kept = _total(rows, counts, cards, parents)
    assert everything[tuple(NS.hill_climb(rows, counts, cards))] - 1e-9 <= kept <= max(everything.values()) + 1e-9


def test_hill_climb_finds_a_chain():
    """A strong chain x0 -> x1 -> x2 -> x3 is found (up to Markov equivalence: the span of
    its families is the chain's)."""
    rng = np.random.default_rng(0)
    x0 = rng.integers(0, 2, 3000)
    x1 = np.where(rng.random(3000) < 0.9, x0, 1 - x0)
    x2 = np.where(rng.random(3000) < 0.9, x1, 1 - x1)
    x3 = np.where(rng.random(3000) < 0.9, x2, 1 - x2)
    X = np.c_[x0, x1, x2, x3]
    fams = NS.network_families(*_distinct(X, (2,) * 4)[:2], (2,) * 4)
    assert set(NS.network_span(fams, (2,) * 4).tolist()) == set(NS.network_span([(0, 1), (1, 2), (2, 3)], (2,) * 4).tolist())


@pytest.mark.parametrize("cards,fams", [((3, 2, 4), [(0,), (0, 1), (1, 2)]), ((2, 3, 2, 2), [(0, 1, 3), (2,)]),
                                        ((4, 3), [])])
def test_span_is_every_basis_function_within_a_family(cards, fams):
    want = [y for y, d in enumerate(itertools.product(*[range(k) for k in cards]))
            if any(d) and any(all(d[v] == 0 or v in f for v in range(len(cards))) for f in fams)]
    assert NS.network_span(fams, cards).tolist() == want


def test_network_parameters_are_the_smoothed_network():
    """The parameters of :func:`network_parameters`, through the dense basis, give the
    network with each conditional table estimated with one added to every cell."""
    cards = (3, 2, 4, 5)
    X, _ = _data(cards, 500, 1)
    flat, counts, rows = _distinct(X, cards)
    fams = [(0,), (0, 1), (0, 1, 2), (2, 3)]
    theta = NS.network_parameters(flat, counts, cards, fams)
    assert set(theta) <= set(NS.network_span(fams, cards).tolist())
    vec = np.zeros(math.prod(cards))
    for y, v in theta.items():
        vec[y] = v
    p = oracle.model(vec, oracle.phi_matrix(cards)).reshape(cards)
    q = np.ones(cards)
    for node, fam in enumerate(fams):
        t = np.zeros([cards[v] for v in fam])
        np.add.at(t, tuple(rows[:, v] for v in fam), counts)
        t = (t + 1) / (t + 1).sum(axis=fam.index(node), keepdims=True)
        shape = [1] * len(cards)
        for v in fam:
            shape[v] = cards[v]
        q = q * t.reshape(shape)
    assert np.allclose(p, q / q.sum(), atol=1e-12)


@pytest.mark.parametrize("cards,seed", [((3, 2, 4), 0), ((2, 2, 2, 2), 1), ((3, 3, 2), 2)])
def test_the_start_is_the_maximum_likelihood_fit_of_the_span(cards, seed):
    """Stopped right after the start (``max_iter=1``), the model is the span of the
    network found on the rows, refitted: its moments on that span equal the target's
    (the conditions of maximum likelihood), checked on the dense table by the oracle's
    basis matrix; the history records the uniform start and the step to it."""
    X, _ = _data(cards, 2000, seed)
    m = FSLL(progress=False, start="network", max_iter=1).fit(X)
    flat, counts, _ = _distinct(X, cards)
    support = NS.network_span(NS.network_families(flat, counts, cards), cards)
    assert [h["move"] for h in m.history_[:2]] == ["init", "network-start"]
    assert sorted(np.ravel_multi_index(np.array(list(m.theta_)).T, cards).tolist()) == support.tolist()
    Phi = oracle.phi_matrix(cards)
    p = np.asarray(m.probabilities()).ravel()
    q = oracle.target(X, cards)
    assert np.allclose((Phi @ p)[support], (Phi @ q)[support], atol=1e-7)
    assert m.history_[1]["cost"] < m.history_[0]["cost"]


def test_network_start_then_the_search_lowers_the_cost():
    """The search continues from the refitted span under the fit's own cost: the final cost
    is at most the start's, and the model differs from the default's start only in where
    the search began (same penalty scale and further terms' price chosen on the same held-out
    rows: the network start chooses the price, ``further_price="auto"``, by default)."""
    cards = (3, 4, 2, 3)
    X, p = _data(cards, 3000, 5)
    m = FSLL(progress=False, start="network").fit(X)
    d = FSLL(progress=False, further_price="auto").fit(X)
    assert m.history_[1]["move"] == "network-start" and m.start == "network"
    assert m.cost_ <= m.history_[1]["cost"] + 1e-12
    assert m.penalty_scale_ == d.penalty_scale_ and m.penalty_scale_scores_ == d.penalty_scale_scores_
    assert m.further_price_ == d.further_price_ and len(m.penalty_scale_scores_) == 4
    assert np.isclose(np.asarray(m.probabilities()).sum(), 1.0)


def test_default_start_unchanged():
    X, _ = _data((3, 2, 4), 1500, 2)
    a, b = FSLL(progress=False).fit(X), FSLL(progress=False, start=None).fit(X)
    assert a.theta_ == b.theta_ and a.cost_ == b.cost_ and a.history_[1]["move"] != "network-start"


def test_a_span_too_large_to_refit_starts_as_the_default(monkeypatch):
    """A span of more terms than the corrective steps refit jointly: a warning, and the fit
    is the default's (the held-out choice's model as the start)."""
    from fsll_ooc.learn import corrective

    X, _ = _data((3, 2, 4), 1500, 2)
    monkeypatch.setattr(corrective, "MAX_SUPPORT", 3)  # (the learner's own joint phases too)
    ref = FSLL(progress=False).fit(X)
    with pytest.warns(UserWarning, match="start='network'"):
        m = FSLL(progress=False, start="network").fit(X)
    monkeypatch.undo()
    assert m.theta_ == ref.theta_ and m.cost_ == ref.cost_ and m.history_[1]["move"] == "warm-start"


def test_checks():
    X, _ = _data((2, 3), 200, 0)
    with pytest.raises(ValueError, match="start must be"):
        FSLL(progress=False, start="bn").fit(X)
    with pytest.raises(ValueError, match="not available with missing"):
        FSLL(progress=False, start="network", missing="em").fit(X)
    with pytest.raises(ValueError, match="not available with missing"):
        FSLL(progress=False, start="network", hidden=[2]).fit(X)


def test_independent_rows_start_from_the_main_effects():
    """No arc pays under BIC on independent uniform rows: the families are the single
    variables, the start their main effects, and the search then ends where the default's
    (at the same fixed scale) does."""
    X = np.random.default_rng(0).integers(0, 2, size=(300, 3))
    m = FSLL(progress=False, start="network", penalty_scale=1.0).fit(X)
    ref = FSLL(progress=False, penalty_scale=1.0).fit(X)
    assert m.history_[1]["move"] == "network-start"
    assert sorted(map(tuple, m.history_[1]["added"])) == [(0, 0, 1), (0, 1, 0), (1, 0, 0)]
    assert m.theta_ == ref.theta_


def test_model_file_store_and_resume(tmp_path, monkeypatch):
    """The option travels in the model file and the store's state; a fit in a store ends on
    the in-core fit's model, also when stopped and resumed or restarted."""
    import interrupts

    X, _ = _data((3, 4, 2), 1500, 4)
    ref = FSLL(progress=False, start="network").fit(X)
    ref.save(tmp_path / "m.json")
    assert FSLL.load(tmp_path / "m.json").get_params()["start"] == "network"
    kw = dict(progress=False, start="network", layout=(1, 2), scheduler="serial")
    st = FSLL(store=tmp_path / "ref", **kw).fit(X)
    assert set(st.theta_) == set(ref.theta_) and st.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    assert st.history_[1]["move"] == "network-start"
    interrupts.stop_after(monkeypatch, 3)
    with pytest.raises(interrupts.Crash):
        FSLL(store=tmp_path / "s", **kw).fit(X)
    monkeypatch.undo()
    m = FSLL.resume(tmp_path / "s", progress=False)
    assert m.start == "network" and set(m.theta_) == set(ref.theta_)
    assert m.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    again = FSLL.resume(tmp_path / "s", progress=False, restart=True)
    assert again.history_[1]["move"] == "network-start" and set(again.theta_) == set(ref.theta_)
