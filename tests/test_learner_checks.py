"""The learner's own invariants: duals in [-1, 1] as the scan sees them, incremental and exact
duals agreeing after a re-derivation or a batch pass; a broken one stops the fit naming the store."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fsll_ooc import cost as C, datasets, storage
from fsll_ooc.engine import Engine, Table
from fsll_ooc.learn import FitState, LearnOptions, learn
from fsll_ooc.learn import batch, checks
from fsll_ooc.planner import Layout
from fsll_ooc.storage import IntegrityError

CARDS = (2, 3, 4, 5)


def _fit_parts(backend, path, layout=(1, 2), n=3000, seed=0):
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=seed)
    X = datasets.sample_table(p, n, seed=seed + 100)
    L = Layout(CARDS, *layout)
    specs = [storage.create_table(backend, path, nm, CARDS, L.chunk_shape) for nm in ("dbar", "thetabar", "scratch")]
    flat = np.ravel_multi_index(tuple(X.T), CARDS)
    eng = Engine.create(L, specs, n, "serial", sample_flat=flat)
    _, counts = np.unique(flat, return_counts=True)
    state = FitState(CARDS, n, C.target_entropy(counts, n, math.prod(CARDS)), log_z=math.log(math.prod(CARDS)))
    return eng, state


def _tamper(eng, fn):
    """Rewrite the whole dual table as ``fn(table)``, through the backend (checksums kept: a
    chunk written by someone else, which only the learner's invariants can notice)."""
    spec = eng.ctx.specs[Table.THETABAR]
    full = tuple(slice(0, k) for k in CARDS)
    storage.write(spec, full, fn(np.array(storage.read(spec, full))))
    storage.flush(spec)


def test_a_fit_passes_its_own_checks_and_they_compare_something():
    eng, state = _fit_parts("numpy", None)
    learn(eng, state, LearnOptions(epsilon=1e-5, resync_every=3))
    assert state.converged and len(state.theta) > 3
    # the probes of a re-derivation predict the exact duals (the identity the check relies on)
    eng2, st2 = _fit_parts("numpy", None)
    learn(eng2, st2, LearnOptions(epsilon=1e-5, max_iter=5))
    from fsll_ooc.engine import Step
    y = next(iter(st2.theta))
    t = float(eng2.gather(np.array([y]))[0])
    step = Step(st2.digits(y), 0.3, t)
    cells = np.fromiter(st2.theta, np.int64)
    pred = checks.predict_step(CARDS, eng2, cells, step)
    st2.theta[y] += 0.3
    eng2.resync(cells, np.array([st2.theta[int(c)] for c in cells]), st2.log_z)
    np.testing.assert_allclose(pred, eng2.gather(cells), atol=1e-12)
    assert np.abs(pred - eng2.gather(cells)).max() < checks.SYNC_TOL


@pytest.mark.parametrize("batched", [False, True])
def test_a_not_a_number_in_the_duals_stops_the_fit(batched):
    eng, state = _fit_parts("numpy", None)
    calls = []

    def poison(st):
        calls.append(st.n_iter)
        if len(calls) == 2:
            _tamper(eng, lambda a: np.where(a != 0, np.nan, a))

    opts = LearnOptions(epsilon=1e-5, batch=batch.BatchOptions(max_cells=20) if batched else None)
    with pytest.raises(IntegrityError, match=r"outside \[-1, 1\]") as e:
        learn(eng, state, opts, callback=poison)
    assert "in memory" in str(e.value)


def test_a_drifted_table_is_caught_at_the_next_re_derivation_naming_the_store(tmp_path):
    """A small error in the duals (every cell of the table 1e-3 off) stays inside [-1, 1] for
    most cells; the incremental prediction before the re-derivation disagrees with it."""
    eng, state = _fit_parts("memmap", tmp_path / "store")
    calls = []

    def drift(st):
        calls.append(st.n_iter)
        if len(calls) == 2:
            _tamper(eng, lambda a: a * (1 - 1e-3))

    with pytest.raises(IntegrityError, match="re-derivation") as e:
        learn(eng, state, LearnOptions(epsilon=1e-5, resync_every=4), callback=drift)
    assert str(tmp_path / "store") in str(e.value) and "restart=True" in str(e.value)
    assert e.value.path == str(tmp_path / "store")


def test_a_drifted_table_is_caught_after_the_next_batch_pass():
    eng, state = _fit_parts("numpy", None, layout=(0, 0))
    calls = []

    def drift(st):
        calls.append(st.n_iter)
        if len(calls) == 1:
            _tamper(eng, lambda a: a * (1 - 1e-3))

    with pytest.raises(IntegrityError, match="after a batch pass"):
        learn(eng, state, LearnOptions(epsilon=1e-5, batch=batch.BatchOptions(max_cells=20)), callback=drift)


def test_common_cells_is_intersect1d():
    """checks.common_cells (a batch's sub-table against the cells a corrective phase read) gives
    np.intersect1d's three arrays, with and without repeated cells in the second, and falls back
    to it when the first is not ascending."""
    rng = np.random.default_rng(3)
    for t in range(400):
        cells = np.unique(rng.integers(0, 80, int(rng.integers(0, 50)))).astype(np.int64)
        if t % 5 == 0:
            cells = rng.permutation(cells)
        other = rng.integers(0, 90, int(rng.integers(0, 40))).astype(np.int64)
        for distinct in (False, True):
            o = rng.permutation(np.unique(other)) if distinct else other
            want = np.intersect1d(cells, o, assume_unique=distinct, return_indices=True)
            got = checks.common_cells(cells, o, distinct=distinct)
            for a, b in zip(want, got):
                assert a.dtype == b.dtype and np.array_equal(a, b)
