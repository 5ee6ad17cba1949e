"""EM out of core (fsll_ooc.missing with a store): the in-core model, the E-step's read-off
against brute force, its passes per round, and resume after a stop at every kind of state write."""
from __future__ import annotations

import math

import numpy as np
import pytest

import interrupts
import oracle
from test_missing import _brute_objective, _holes, holes_csv

from fsll_ooc import FSLL, datasets, storage
from fsll_ooc.engine import Engine, Table
from fsll_ooc.planner import Layout
from fsll_ooc.storage.fit_store import FitStore

CARDS = (2, 3, 4, 5)
LAYOUT = (1, 2)  # two A-bands, three B-bands, six chunks per table


@pytest.fixture(scope="module")
def Xm():
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=3)
    return _holes(datasets.sample_table(p, 300, seed=1), 0.3, seed=2)


@pytest.fixture(scope="module")
def Xh():
    """Three observed variables (2, 3, 5) driven by a 4-state class, with holes; a hidden 4-state variable."""
    rng = np.random.default_rng(4)
    z = rng.integers(0, 4, 300)
    X = np.c_[z % 2, (z + (rng.random(300) < 0.2)) % 3, (z + rng.integers(0, 2, 300)) % 5]
    return _holes(X, 0.1, seed=5)


#: the restarts run on every row under a numeric scale (under "auto" on the training rows of the choice)
HIDDEN = dict(hidden=[4], n_restarts=2, random_state=0, penalty_scale=1.0)


@pytest.fixture(scope="module")
def ref(Xm):
    return FSLL(progress=False, missing="em").fit(Xm)


@pytest.fixture(scope="module")
def ref_hidden(Xh):
    return FSLL(progress=False, **HIDDEN).fit(Xh)


def _ooc(X, store, backend="zarr", **kw):
    return FSLL(progress=False, missing="em", store=store, backend=backend, layout=LAYOUT, scheduler="serial",
                **kw).fit(X)


def assert_same(m, ref):
    assert set(m.theta_) == set(ref.theta_)
    for y, v in ref.theta_.items():
        assert m.theta_[y] == pytest.approx(v, abs=1e-9)
    assert (m.n_iter_, m.em_rounds_, m.em_converged_) == (ref.n_iter_, ref.em_rounds_, ref.em_converged_)
    assert m.em_objective_ == pytest.approx(ref.em_objective_, abs=1e-10)
    np.testing.assert_allclose([h["objective"] for h in m.em_history_], [h["objective"] for h in ref.em_history_],
                               rtol=0, atol=1e-10)


@pytest.mark.parametrize("backend", ["zarr", "memmap"])
def test_out_of_core_em_is_the_in_core_em(Xm, ref, tmp_path, backend):
    m = _ooc(Xm, tmp_path / "s", backend)
    assert_same(m, ref)
    objs = [h["objective"] for h in m.em_history_]
    assert len(objs) >= 3 and all(b <= a + 1e-12 * abs(a) for a, b in zip(objs, objs[1:]))
    assert math.isclose(m.em_objective_, _brute_objective(m, Xm), rel_tol=1e-10)
    # the stated passes: the E-step is the exact re-derivation's two passes (one in core);
    # the M-step is the targets' two passes (one) plus the learner's
    assert all(h["passes_e"] == 2 for h in m.em_history_) and all(h["passes_e"] == 1 for h in ref.em_history_)
    assert all(h["passes_m"] >= 2 + 1 for h in m.em_history_)
    # the finished store opens for reading with its EM record; queries marginalise missing cells
    again = FSLL.resume(tmp_path / "s", progress=False)
    assert again.theta_ == m.theta_ and again.em_history_ == m.em_history_ and again.em_rounds_ == m.em_rounds_
    np.testing.assert_allclose(again.log_prob(Xm[:30]), ref.log_prob(Xm[:30]), rtol=1e-9)
    assert np.array_equal(again.impute(Xm[:30]), ref.impute(Xm[:30]))


def test_out_of_core_em_under_a_numeric_penalty_scale_is_the_in_core_em(Xm, tmp_path):
    ref = FSLL(progress=False, missing="em", penalty_scale=0.5).fit(Xm)
    m = _ooc(Xm, tmp_path / "s", "memmap", penalty_scale=0.5)
    assert m.penalty_scale_ == 0.5 and ref.penalty_scale_ == 0.5
    assert_same(m, ref)
    assert math.isclose(m.em_objective_, _brute_objective(m, Xm, scale=0.5), rel_tol=1e-10)
    again = FSLL.resume(tmp_path / "s", progress=False)  # the finished store keeps the scale
    assert again.penalty_scale_ == 0.5 and again.theta_ == m.theta_


@pytest.mark.parametrize("scale", [1.0, "auto"])
def test_out_of_core_em_with_a_hidden_variable_is_the_in_core_em(Xh, ref_hidden, tmp_path, scale):
    if scale == "auto":  # the choice on held-out rows, then one run from the chosen model
        ref_hidden = FSLL(progress=False, **{**HIDDEN, "penalty_scale": scale}).fit(Xh)
        assert set(ref_hidden.penalty_scale_scores_) == {1.0, 0.5}
    m = _ooc(Xh, tmp_path / "s", "memmap", **{**HIDDEN, "penalty_scale": scale})
    assert m.penalty_scale_scores_ == ref_hidden.penalty_scale_scores_
    assert m.cardinalities_ == (2, 3, 5, 4) and m.n_hidden_ == 1
    assert_same(m, ref_hidden)
    np.testing.assert_allclose(m.predict_hidden(Xh[:20]), ref_hidden.predict_hidden(Xh[:20]), rtol=1e-8, atol=1e-12)
    objs = [h["objective"] for h in m.em_history_]
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objs, objs[1:]))


def test_the_e_step_reads_the_model_off_the_resync_passes(tmp_path):
    """``Engine.resync_reading``: p_theta at any cells (brute force), and the duals of ``resync``, same bits."""
    L = Layout(CARDS, *LAYOUT)
    size = math.prod(CARDS)
    rng = np.random.default_rng(0)
    sup = np.sort(rng.choice(np.arange(1, size), 9, replace=False))
    theta = rng.normal(0, 0.5, 9)
    cells = np.sort(rng.choice(size, 40, replace=False))
    Phi = oracle.phi_matrix(CARDS)
    tv = np.zeros(size)
    tv[sup] = theta
    p = oracle.model(tv, Phi)
    duals = []
    for name, backend in (("a", "memmap"), ("b", "memmap"), ("c", "numpy")):
        lay = L if backend == "memmap" else Layout(CARDS, 0, 0)
        specs = [storage.create_table(backend, None if backend == "numpy" else tmp_path / name, t.name.lower(),
                                      CARDS, lay.chunk_shape) for t in Table]
        eng = Engine.create(lay, specs, 100, "serial")
        before = eng.passes
        if name == "b":
            log_z = eng.resync(sup, theta, 0.3)
        else:
            log_z, got = eng.resync_reading(sup, theta, 0.3, cells)
            np.testing.assert_allclose(got, p[cells], rtol=1e-12)
            assert eng.passes - before == (2 if backend == "memmap" else 1)
        assert log_z == pytest.approx(math.log(np.exp(Phi.T @ tv).sum()), abs=1e-12)
        duals.append(np.array(storage.open_table(eng.ctx.spec(Table.THETABAR)), np.float64).reshape(-1))
    assert np.array_equal(duals[0], duals[1])  # reading on the way changes no bit of the duals
    np.testing.assert_allclose(duals[0], Phi @ p, atol=1e-12)


# --------------------------------------------------------------------------- stopped and resumed

def _state_writes(monkeypatch, fit):
    """``fit()`` uninterrupted; returns each state write's (status, EM phase, restart, run rounds,
    n_iter, the M-step's first iteration)."""
    seen = []
    orig = FitStore.write_state

    def record(self, state, status):
        em = self.extra("em") or {}
        seen.append((status, em.get("phase"), em.get("restart"), (em.get("run") or {}).get("rounds"),
                     state.n_iter, em.get("before")))
        orig(self, state, status)

    monkeypatch.setattr(FitStore, "write_state", record)
    out = fit()
    monkeypatch.undo()
    return seen, out


def _stop_and_resume(monkeypatch, fit, store, n):
    interrupts.stop_after(monkeypatch, n)
    with pytest.raises(interrupts.Crash):
        fit()
    monkeypatch.undo()
    return FSLL.resume(store, progress=False)


@pytest.mark.parametrize("scale", ["auto", 1.0])
def test_resume_after_a_stop_at_each_kind_of_state_write(Xm, ref, tmp_path, monkeypatch, scale):
    """"auto": the first round starts from the model chosen on held-out rows; 1.0: from theta = 0."""
    store = tmp_path / "s"
    if scale != "auto":
        ref = FSLL(progress=False, missing="em", penalty_scale=scale).fit(Xm)
    fit = lambda: _ooc(Xm, store, penalty_scale=scale)  # noqa: E731
    writes, whole = _state_writes(monkeypatch, fit)
    assert_same(whole, ref)
    assert ref.history_[1]["move"] == "warm-start" if scale == "auto" else ref.history_[1]["move"] != "warm-start"
    first = lambda pred: 1 + next(i for i, w in enumerate(writes) if pred(*w))  # noqa: E731
    points = {
        "starting": 1,
        "first M-step not begun": first(lambda s, ph, r, rd, it, b: ph == "m-step" and rd == 0 and it == b),
        "first M-step under way": first(lambda s, ph, r, rd, it, b: ph == "m-step" and rd == 0 and it > b),
        "an M-step done": first(lambda s, ph, r, rd, it, b: ph == "e-step" and rd == 2),
        "a later M-step not begun": first(lambda s, ph, r, rd, it, b: ph == "m-step" and rd == 2 and it == b),
        "a later M-step under way": first(lambda s, ph, r, rd, it, b: ph == "m-step" and rd == 2 and it > b),
    }
    for what, n in points.items():
        m = _stop_and_resume(monkeypatch, fit, store, n)
        assert FitStore(store).read().status == "complete", what
        assert_same(m, ref)


def test_resume_after_a_stop_in_the_targets_pass(Xm, ref, tmp_path, monkeypatch):
    """Stopped while a later round writes its targets (dbar half rewritten): resumed, the same model."""
    store = tmp_path / "s"
    calls = [0]
    orig = storage.write

    def write(spec, key, value):
        if "dbar" in str(spec.path):
            calls[0] += 1
            if calls[0] == 8:  # five band writes per targets computation: inside the second one
                raise interrupts.Crash()
        return orig(spec, key, value)

    monkeypatch.setattr(storage, "write", write)
    with pytest.raises(interrupts.Crash):
        _ooc(Xm, store)
    monkeypatch.undo()
    fs = FitStore(store)
    assert (fs.read().status, fs.extra("em")["phase"]) == ("running", "m-step")
    assert_same(FSLL.resume(store, progress=False), ref)


def test_resume_between_restarts_with_a_hidden_variable(Xh, ref_hidden, tmp_path, monkeypatch):
    store = tmp_path / "s"
    fit = lambda: _ooc(Xh, store, **HIDDEN)  # noqa: E731
    writes, _ = _state_writes(monkeypatch, fit)
    n = 1 + next(i for i, w in enumerate(writes) if w[1] == "start" and w[2] == 1)  # the first run kept as best
    m = _stop_and_resume(monkeypatch, fit, store, n)
    assert_same(m, ref_hidden)
    n = 1 + next(i for i, w in enumerate(writes) if w[1] == "m-step" and w[2] == 1 and w[4] > w[5])
    m = _stop_and_resume(monkeypatch, fit, store, n)  # inside the second run
    assert_same(m, ref_hidden)
    # restart=True rebuilds from the rows kept in the store
    assert_same(FSLL.resume(store, progress=False, restart=True), ref_hidden)


def test_out_of_core_em_from_both_starts_is_the_in_core_em_and_resumes(tmp_path, monkeypatch):
    """Most rows complete: the fit on every row runs from the held-out choice's model and from the
    complete rows' fit (kept in the store); out of core the same two runs, the same model kept
    (the second run's), also when stopped inside the second run or between the two."""
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=5)
    X = _holes(datasets.sample_table(p, 600, seed=2), 0.08, seed=2)
    ref = FSLL(progress=False, missing="em").fit(X)
    assert {h["restart"] for h in ref.em_history_} == {1}
    store = tmp_path / "s"
    fit = lambda: _ooc(X, store, "memmap")  # noqa: E731
    writes, whole = _state_writes(monkeypatch, fit)
    assert_same(whole, ref)
    fs = FitStore(store)
    fs.read()
    assert fs.extra("em_choice")["complete_start"]["theta"]
    for pred in (lambda s, ph, r, rd, it, b: ph == "start" and r == 1,  # the first run kept as best
                 lambda s, ph, r, rd, it, b: ph == "m-step" and r == 1 and it > b):  # inside the second run
        m = _stop_and_resume(monkeypatch, fit, store, 1 + next(i for i, w in enumerate(writes) if pred(*w)))
        assert_same(m, ref)


def test_cli_fit_with_missing_cells_out_of_core(tmp_path):
    import pandas as pd

    from fsll_ooc import cli

    path = holes_csv(tmp_path / "holes.csv", 200)
    assert cli.main(["fit", str(path), "--missing", "em", "--store", str(tmp_path / "s"), "-q",
                     "-o", str(tmp_path / "m.json")]) == 0
    m = FSLL.load(tmp_path / "m.json")
    ref = FSLL(progress=False, missing="em").fit(pd.read_csv(path))
    assert set(m.theta_) == set(ref.theta_)
    assert all(m.theta_[y] == pytest.approx(v, abs=1e-9) for y, v in ref.theta_.items())
    assert FSLL.resume(tmp_path / "s", progress=False).em_rounds_ == ref.em_rounds_


@pytest.mark.parametrize("kw", [{}, {"hidden": ["auto"]}])
def test_em_store_refusal_comes_before_the_held_out_choice(tmp_path, monkeypatch, Xm, kw):
    """A store that holds a user's files is refused before any fit runs: the held-out
    choice of the scale or of the number of states never starts."""
    from fsll_ooc import missing

    def never(*a, **k):
        raise AssertionError("the held-out choice ran before the store was checked")

    monkeypatch.setattr(missing, "choose", never)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt|not empty|not an fsll-ooc"):
        FSLL(missing="em", store=str(tmp_path / "s"), progress=False, **kw).fit(Xm[:, :3] if kw else Xm)
    assert (tmp_path / "s" / "notes.txt").read_text() == "mine"
