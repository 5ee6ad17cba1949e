"""The engine's passes against brute force on tiny mixed-cardinality problems, over several layouts."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fsll_ooc import datasets, storage
from fsll_ooc.engine import Engine, Step, Table, bands
from fsll_ooc.planner import Layout

import oracle

# (cards, layout (a, c), backend): in core, and banded layouts where steps need an A, a B or both passes
CASES = [((2, 3, 4, 5), (0, 0), "numpy"), ((2, 3, 4, 5), (0, 0), "memmap"), ((2, 3, 4, 5), (1, 2), "memmap"),
         ((2, 3, 4, 5), (2, 3), "memmap"),
         ((4, 2, 3), (0, 0), "numpy"), ((4, 2, 3), (1, 2), "memmap"), ((4, 2, 3), (1, 3), "memmap")]
IDS = [f"{c}-{lo}-{b}" for c, lo, b in CASES]
N = 200


def _data(cards, seed=0):
    p, _ = datasets.random_bayesnet(cards, 2, seed=seed)
    return datasets.sample_table(p, N, seed=seed + 1)


def _engine(cards, layout, backend, tmp_path, X, scheduler="serial"):
    L = Layout(cards, *layout)
    store = None if backend == "numpy" else tmp_path
    specs = [storage.create_table(backend, store, t.name.lower(), cards, L.chunk_shape) for t in Table]
    flat = np.ravel_multi_index(tuple(X.T), cards)
    return Engine.create(L, specs, len(X), scheduler, sample_flat=flat)


def _table(eng, table):
    return np.array(storage.open_table(eng.ctx.spec(table)), dtype=np.float64).reshape(-1)


def _exact_change(t, d, r):
    """Paper Eq. 15: the cost change of appending y at its 1-D optimum."""
    with np.errstate(all="ignore"):  # y = 0 (t = d = 1) is excluded by the caller
        return 0.5 * ((1 + d) * (np.log1p(t) - np.log1p(d)) + (1 - d) * (np.log1p(-t) - np.log1p(-d))) + r


STEPS = {(2, 3, 4, 5): [((1, 0, 0, 0), 0.4), ((0, 2, 0, 3), -0.3), ((1, 1, 2, 0), 0.2), ((0, 0, 3, 4), 0.15),
                        ((1, 0, 0, 0), -0.1)],
         (4, 2, 3): [((3, 0, 0), 0.3), ((0, 1, 2), -0.25), ((2, 1, 1), 0.2), ((1, 0, 2), 0.1)]}


@pytest.mark.parametrize("cards,layout,backend", CASES, ids=IDS)
def test_passes_match_brute_force(cards, layout, backend, tmp_path):
    X = _data(cards)
    eng = _engine(cards, layout, backend, tmp_path, X)
    Phi = oracle.phi_matrix(cards)
    q = oracle.target(X, cards)
    r = oracle.r_vec(cards, N)
    size = math.prod(cards)
    # setup passes of the factory: targets and the duals of theta = 0 (uniform)
    np.testing.assert_allclose(_table(eng, Table.DBAR), Phi @ q, atol=1e-13)
    np.testing.assert_allclose(_table(eng, Table.THETABAR), Phi @ np.full(size, 1 / size), atol=1e-14)
    theta = np.zeros(size)
    log_z = math.log(size)
    support = np.zeros(0, np.int64)
    for digits, delta in STEPS[cards]:
        y = int(np.ravel_multi_index(digits, cards))
        t_y = float(eng.gather(np.array([y]))[0])
        np.testing.assert_allclose(t_y, (Phi @ oracle.model(theta, Phi))[y], atol=1e-13)
        res = eng.update_scan(Step(digits, delta, t_y), support)
        log_z += math.log(math.cosh(delta) + math.sinh(delta) * t_y)
        theta[y] += delta
        scanned = support  # the pass reports thetabar at the support it was given
        support = np.union1d(support, [y]).astype(np.int64)
        tb = Phi @ oracle.model(theta, Phi)
        np.testing.assert_allclose(_table(eng, Table.THETABAR), tb, atol=1e-12)
        # the scan: the best append candidate over every y != 0 (the support's cells too), as a dense argmin
        ch = _exact_change(tb, Phi @ q, r)
        ch[0] = np.inf
        assert res.pos == int(np.argmin(ch)) and res.best == pytest.approx(ch.min(), abs=1e-12)
        assert (res.t, res.d) == pytest.approx((tb[res.pos], (Phi @ q)[res.pos]), abs=1e-12)
    order = np.argsort(res.supp_pos)
    np.testing.assert_array_equal(res.supp_pos[order], scanned)
    np.testing.assert_allclose(res.supp_t[order], tb[scanned], atol=1e-12)
    assert log_z == pytest.approx(math.log(np.exp(Phi.T @ theta).sum()), abs=1e-12)
    # resync: exact duals from theta agree with the incremental tables, and the exact log Z
    incremental = _table(eng, Table.THETABAR)
    before = eng.passes
    exact_log_z = eng.resync(support, theta[support], log_z)
    assert eng.passes - before == (1 if layout[0] == 0 else 2)  # out of core: an A-pass and a B-pass
    assert exact_log_z == pytest.approx(math.log(np.exp(Phi.T @ theta).sum()), abs=1e-12)
    np.testing.assert_allclose(_table(eng, Table.THETABAR), incremental, atol=1e-12)
    # the re-derivation with its scan fused into the last pass: the same duals, the scan of the table
    # (one pass with one kind of band, two with two); with a scan pass after it, the same
    exact = _table(eng, Table.THETABAR)
    plain = eng.update_scan_batch([], support, 4)
    for fused in (True, False):
        eng.one_band_scan_in_resync = fused
        before = eng.passes
        lz, sc = eng.resync_scan(support, theta[support], log_z, 4)
        assert eng.passes - before == (2 if layout[0] > 0 or not fused else 1) and lz == exact_log_z
        np.testing.assert_array_equal(_table(eng, Table.THETABAR), exact)
        assert (sc.pos, sc.best, sc.t, sc.d) == (plain.pos, plain.best, plain.t, plain.d)
        assert sorted(zip(sc.supp_pos, sc.supp_t, sc.supp_d)) == sorted(zip(plain.supp_pos, plain.supp_t,
                                                                            plain.supp_d))
        assert sorted(sc.top_delta)[:4] == sorted(plain.top_delta)[:4]
    # a sweep: the same log Z and duals at any cells, no table of the fit read or written (one band:
    # the same bits); in memory with one band it works in the scratch table, else it writes none
    before, tables = eng.passes, [_table(eng, t).copy() for t in Table]
    ys = np.array([size - 1, 0, 7, 3, 7, 1], np.int64)
    lz_s, at = eng.sweep(support, theta[support], log_z, ys)
    assert lz_s == exact_log_z and eng.passes == before and eng.sweeps >= 1
    in_scratch = layout[0] == 0 and backend == "numpy"
    for t, old in zip(Table, tables):
        if not (t == Table.SCRATCH and in_scratch):
            np.testing.assert_array_equal(_table(eng, t), old)
    if layout[0] == 0:
        np.testing.assert_array_equal(at, exact[ys])
    np.testing.assert_allclose(at, (Phi @ oracle.model(theta, Phi))[ys], atol=1e-12)
    # a scan that keeps a joint selection's candidates: the top-k without a pass of its own
    _, sj = eng.resync_scan(support, theta[support], log_z, 4, joint=5)
    before = eng.passes
    flat_j, got_j = eng.top_candidates(5, scan=sj)
    assert eng.passes == before
    # density, gather and the top-k candidate pass
    total = eng.density(support, theta[support], exact_log_z)
    assert total == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(_table(eng, Table.SCRATCH), oracle.model(theta, Phi), atol=1e-14)
    ys = np.array([size - 1, 0, 3], np.int64)
    np.testing.assert_array_equal(eng.gather(ys, table=Table.DBAR), _table(eng, Table.DBAR)[ys])
    with np.errstate(all="ignore"):
        score = r - (tb - Phi @ q) ** 2 / (2 * (1 - tb * tb))
    score[0] = np.inf
    flat, got = eng.top_candidates(5)
    np.testing.assert_array_equal(flat, np.lexsort((np.arange(size), score))[:5])
    np.testing.assert_allclose(got, score[flat], rtol=1e-10)
    np.testing.assert_array_equal(flat_j, flat)
    np.testing.assert_allclose(got_j, got, rtol=1e-12)
    before = eng.passes
    eng.top_candidates(6, scan=sj)  # more than the scan kept: a pass
    assert eng.passes == before + 1


def test_layouts_and_schedulers_give_the_same_bits(tmp_path):
    """Every layout (one band, A-bands, A- and B-bands) and scheduler computes the same tables."""
    cards = (2, 3, 4, 5)
    X = _data(cards, seed=3)
    tables = []
    for i, (layout, sched) in enumerate([((0, 0), "serial"), ((1, 2), "serial"), ((2, 3), "threads"),
                                         ((1, 3), "synchronous")]):
        eng = _engine(cards, layout, "memmap", tmp_path / str(i), X, sched)
        for digits, delta in STEPS[cards]:
            y = int(np.ravel_multi_index(digits, cards))
            eng.update_scan(Step(digits, delta, float(eng.gather(np.array([y]))[0])), np.zeros(0, np.int64))
        tables.append([_table(eng, t) for t in (Table.DBAR, Table.THETABAR)])
    for other in tables[1:]:
        np.testing.assert_allclose(other[0], tables[0][0], atol=1e-15)
        np.testing.assert_allclose(other[1], tables[0][1], atol=1e-13)


def test_create_without_data_keeps_the_tables(tmp_path):
    cards = (4, 2, 3)
    X = _data(cards)
    eng = _engine(cards, (1, 2), "memmap", tmp_path, X)
    before = [_table(eng, t) for t in (Table.DBAR, Table.THETABAR)]
    again = Engine.create(eng.layout, eng.ctx.specs, len(X), "serial")
    assert again.passes == 0
    for t, want in zip((Table.DBAR, Table.THETABAR), before):
        np.testing.assert_array_equal(_table(again, t), want)


@pytest.mark.parametrize("cards,layout", [((2, 3, 4, 5), (1, 2)), ((4, 2, 3), (2, 3)), ((3, 4, 2), (0, 0))])
def test_band_index_maps_are_inverse(cards, layout):
    L = Layout(cards, *layout)
    flat = np.arange(L.size, dtype=np.int64)
    for kind in ("A", "B") if L.a > 0 else ("A",):
        band, local = bands.global_to_band(L, kind, flat)
        assert band.max() + 1 == bands.n_bands(L, kind)
        back = np.empty_like(flat)
        for b in range(bands.n_bands(L, kind)):
            m = band == b
            back[m] = bands.local_to_global(L, kind, b, local[m])
            assert m.sum() == math.prod(bands.band_geometry(cards, L.a, L.c, kind, (0.0,) * len(cards)).shape)
        np.testing.assert_array_equal(back, flat)
