"""kernels.transform.transform_sparse: a transform from a sparse input, or read at a few cells,
against the full transform (bit for bit) and the dense sums of basis.local_matrix (the oracle);
and the engine's sweeps and re-derivations that use it against the same without it."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsll_ooc import datasets, storage
from fsll_ooc.engine import Engine, Table, tasks
from fsll_ooc.kernels import transform as ft
from fsll_ooc.kernels import transform_plan as tp
from fsll_ooc.planner import Layout

import oracle
from test_fast_transform import _dense


@pytest.fixture(autouse=True, scope="module")
def _driver_compiled():
    """The sparse driver compiled here (it otherwise runs the full transform until a second
    process has compiled it)."""
    for disp, sig in ft.ahead_kernels():
        disp.compile(sig)
    assert ft.sparse_kernels_ready()


def _bits(a):
    """The bit patterns of a float64 array (``-0.0`` differs from ``+0.0``)."""
    return np.ascontiguousarray(a, np.float64).view(np.int64)


def _sparse_table(rng, shape, n):
    """Zeros (``+0.0``) but for ``n`` cells, mostly of low order (a few non-zero digits, as
    a model's terms), and their flat positions (unsorted, some repeated)."""
    size = math.prod(shape)
    pos = []
    for _ in range(n):
        d = [0] * len(shape)
        for ax in rng.choice(len(shape), size=int(rng.integers(0, min(3, len(shape)) + 1)), replace=False):
            d[ax] = int(rng.integers(0, shape[ax]))
        pos.append(int(np.ravel_multi_index(d, shape)) if size > 1 else 0)
    pos = np.array(pos + pos[: n // 4], np.int64)
    g = np.zeros(shape)
    g.reshape(-1)[pos] = rng.standard_normal(pos.size) * 10.0 ** rng.uniform(-3, 3, size=pos.size)
    return g, pos


def _check(g, pos, axes, transpose, reads, **kw):
    """transform_sparse from the sparse ``g`` (every cell) and read at ``reads`` against the
    full transform, bit for bit, and against the dense sums."""
    ref = g.copy()
    ft.transform_inplace(ref, axes, transpose=transpose, **kw)
    got = g.copy()
    ft.transform_sparse(got, axes, transpose=transpose, nonzero=pos, **kw)
    assert np.array_equal(_bits(got), _bits(ref))
    full = np.random.default_rng(1).standard_normal(g.shape)
    ref2 = full.copy()
    ft.transform_inplace(ref2, axes, transpose=transpose, **kw)
    got2 = full.copy()
    ft.transform_sparse(got2, axes, transpose=transpose, needed=reads, **kw)
    assert np.array_equal(_bits(got2.reshape(-1)[reads]), _bits(ref2.reshape(-1)[reads]))
    scale = max(float(np.abs(ref).max()), 1e-300)
    np.testing.assert_allclose(got, _dense(g, axes, transpose), rtol=0, atol=1e-12 * scale)


@pytest.fixture
def small_budgets(monkeypatch):
    """Tiny cache budgets: several gathered passes, split Walsh axes, threads on small tables."""
    monkeypatch.setattr(tp, "_BLOCK_BYTES", 256)
    monkeypatch.setattr(tp, "_TILE_BYTES", 512)
    monkeypatch.setattr(tp, "_MIN_ROW_BYTES", 64)
    monkeypatch.setattr(tp, "_PAD_BYTES", 64)
    monkeypatch.setattr(ft, "_PAR_MIN_SIZE", 0)


SHAPES = [(2, 3, 4, 5), (5, 3, 2), (3, 5, 6, 2, 4), (16, 3, 8), (9, 12), (130, 2), (2,) * 10, (4,) * 5,
          (6, 1, 16, 1, 5), (7, 5, 9, 3, 4, 2, 2), (2, 9), (3, 300, 2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("share", [0.0, 0.5, 100.0])
def test_same_bits_as_the_full_transform(shape, transpose, share, monkeypatch):
    """Rows run on their fibres never, by the default cost rule, wherever they can: the full
    transform's bits."""
    monkeypatch.setattr(ft, "SPARSE_SHARE", share)
    rng = np.random.default_rng(hash((shape, transpose)) % 2**32)
    size = math.prod(shape)
    for n in (1, 3, 20):
        g, pos = _sparse_table(rng, shape, n)
        reads = rng.choice(size, size=min(size, n), replace=False)
        _check(g, pos, None, transpose, reads)


@pytest.mark.parametrize("transpose", [False, True])
def test_multi_pass_plans_and_threads(small_budgets, transpose):
    """Gathered passes, split power-of-two axes, axis subsets, several threads: the same bits."""
    rng = np.random.default_rng(7)
    for shape in [(3, 5, 6, 2, 4, 2, 2, 2), (2,) * 13, (8, 8, 8, 3), (5, 16, 7, 4), (37, 3, 2, 2), (2, 3, 16, 5, 2)]:
        assert tp.plan(shape, None, transpose).npasses >= 2
        size = math.prod(shape)
        for axes in [None, [0, 2], [len(shape) - 1], list(range(1, len(shape)))]:
            for share in (0.5, 100.0):
                ft.SPARSE_SHARE = share
                try:
                    g, pos = _sparse_table(rng, shape, 12)
                    reads = rng.choice(size, size=30, replace=False)
                    _check(g, pos, axes, transpose, reads)
                    _check(g, pos, axes, transpose, reads, parallel=False)
                finally:
                    ft.SPARSE_SHARE = 0.5


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cards=st.lists(st.integers(1, 9), min_size=1, max_size=5), seed=st.integers(0, 2**31 - 1),
       n=st.integers(0, 12), transpose=st.booleans(), share=st.sampled_from([0.5, 100.0]))
def test_random_tables(cards, seed, n, transpose, share):
    """Mixed cardinalities (Walsh and +-1 axes), random supports and reads: the same bits."""
    rng = np.random.default_rng(seed)
    shape = tuple(cards)
    size = math.prod(shape)
    axes = None if rng.random() < 0.5 else sorted(set(rng.integers(0, len(shape), size=2).tolist()))
    g, pos = _sparse_table(rng, shape, n)
    reads = rng.integers(0, size, size=int(rng.integers(1, 6)))
    old = ft.SPARSE_SHARE
    ft.SPARSE_SHARE = share
    try:
        _check(g, pos, axes, transpose, reads)
    finally:
        ft.SPARSE_SHARE = old


def test_no_input_and_bad_positions():
    """An empty support leaves zeros (the transform of zeros); a position outside the table is
    refused; both hints at once, or none, are the full transform."""
    a = np.zeros((3, 4))
    ft.transform_sparse(a, nonzero=np.zeros(0, np.int64))
    assert np.array_equal(_bits(a), _bits(np.zeros((3, 4))))
    with pytest.raises(IndexError):
        ft.transform_sparse(a, nonzero=[12])
    g = np.random.default_rng(0).standard_normal((3, 4))
    ref = g.copy()
    ft.transform_inplace(ref, transpose=True)
    for kw in ({}, {"nonzero": [0], "needed": [1]}):
        got = g.copy()
        ft.transform_sparse(got, transpose=True, **kw)
        assert np.array_equal(_bits(got), _bits(ref))


def test_full_transform_until_the_driver_is_compiled(monkeypatch):
    """Before its driver is in numba's cache a second process is asked to compile it and the
    full transform runs (the same bits); once it is, the sparse driver runs."""
    started, runs = [], []
    kernel = ft._run_sparse
    monkeypatch.setattr(ft, "_run_sparse", lambda *a: runs.append(1) or kernel(*a))
    monkeypatch.setattr(ft.ahead, "_ready", {})
    monkeypatch.setattr(ft.ahead, "running", lambda module: False)
    monkeypatch.setattr(ft, "ahead_kernels", lambda: [(kernel, ())])
    monkeypatch.setattr(ft.ahead, "is_cached", lambda disp, sig: False)
    monkeypatch.setattr(ft.ahead, "start", lambda module: started.append(module) or True)
    monkeypatch.setattr(ft, "SPARSE_SHARE", 100.0)
    g, pos = _sparse_table(np.random.default_rng(3), (2, 3, 4, 5), 4)
    ref = g.copy()
    ft.transform_inplace(ref)
    got = g.copy()
    ft.transform_sparse(got, nonzero=pos)
    assert np.array_equal(_bits(got), _bits(ref)) and started == [ft.__name__] and not runs
    monkeypatch.setattr(ft.ahead, "is_cached", lambda disp, sig: True)
    got = g.copy()
    ft.transform_sparse(got, nonzero=pos)
    assert np.array_equal(_bits(got), _bits(ref)) and runs and ft.ahead._ready[ft.__name__]


def test_reads_must_follow_a_transform_for_reads():
    """A band op that computes only what is read must be followed by reads only."""
    ctx = tasks.Context(Layout((2, 3), 0, 0), (), 0.0, (0.0, 0.0))
    band = np.ones((2, 3))
    with pytest.raises(ValueError, match="followed by reads only"):
        tasks._apply_ops(ctx, "A", band, (("T", (0, 1), False, "taken"), ("exp", 0.0)))


# the engine: sweeps and re-derivations with and without the sparse transforms ---------------

CASES = [((2, 3, 4, 5), (0, 0), "numpy"), ((2, 3, 4, 5), (1, 2), "memmap"), ((4, 2, 3, 5), (2, 3), "memmap"),
         ((7, 5, 3, 2, 2), (0, 0), "numpy"), ((3, 4, 2, 5), (1, 2), "numpy")]


def _engine(cards, layout, backend, tmp_path):
    L = Layout(cards, *layout)
    p, _ = datasets.random_bayesnet(cards, 2, seed=3)
    X = datasets.sample_table(p, 300, seed=4)
    store = None if backend == "numpy" else tmp_path
    specs = [storage.create_table(backend, store, t.name.lower(), cards, L.chunk_shape) for t in Table]
    return Engine.create(L, specs, len(X), "serial", sample_flat=np.ravel_multi_index(tuple(X.T), cards))


def _full(a, axes=None, transpose=False, *, nonzero=None, needed=None, parallel=True):
    """transform_sparse without its hints: the full transform."""
    ft.transform_inplace(a, axes, transpose=transpose, parallel=parallel)


@pytest.mark.parametrize("cards,layout,backend", CASES, ids=[f"{c}-{lo}-{b}" for c, lo, b in CASES])
@pytest.mark.parametrize("share", [0.5, 100.0])
def test_engine_same_bits_with_and_without(cards, layout, backend, share, tmp_path, monkeypatch):
    """A sweep's log Z and duals, a re-derivation's tables and a re-derivation read at cells:
    the same bits as with full transforms, on in-core and banded layouts; and the oracle's
    duals (brute force) to rounding.  ``share=100``: every row that can runs on its fibres only
    (tiny tables are otherwise cheaper whole)."""
    monkeypatch.setattr(ft, "SPARSE_SHARE", share)
    rng = np.random.default_rng(11)
    size = math.prod(cards)
    support = np.unique(np.concatenate([[0], rng.choice(size, size=6, replace=False)])).astype(np.int64)
    theta = rng.standard_normal(support.size) * 0.4
    cells = np.unique(np.concatenate([support, rng.choice(size, size=9, replace=False)])).astype(np.int64)
    Phi = oracle.phi_matrix(cards)
    full = np.zeros(size)
    full[support] = theta
    log_z = math.log(np.exp(Phi.T @ full).sum())
    out = {}
    runs = []
    kernel = ft._run_sparse
    monkeypatch.setattr(ft, "_run_sparse", lambda *a: runs.append(1) or kernel(*a))
    for pruned in (True, False):
        if not pruned:
            assert runs or share < 1  # the fibres that matter only, somewhere
            monkeypatch.setattr(tasks, "transform_sparse", _full)
        eng = _engine(cards, layout, backend, tmp_path / str(pruned))
        lz, at = eng.sweep(support, theta, log_z + 0.3, cells)
        lz2 = eng.resync(support, theta, log_z + 0.1)
        duals = np.array(storage.open_table(eng.ctx.spec(Table.THETABAR)), dtype=np.float64).reshape(-1)
        lz3, raw = eng.resync_reading(support, theta, log_z - 0.2, cells)
        out[pruned] = (lz, at, lz2, duals, lz3, raw)
    for a, b in zip(out[True], out[False]):
        assert np.array_equal(_bits(np.asarray(a)), _bits(np.asarray(b)))
    lz, at, lz2, duals = out[True][:4]
    p = oracle.model(full, Phi)
    assert lz == pytest.approx(log_z, abs=1e-12) and lz2 == pytest.approx(log_z, abs=1e-12)
    np.testing.assert_allclose(at, (Phi @ p)[cells], atol=1e-12)
    np.testing.assert_allclose(duals, Phi @ p, atol=1e-12)
    np.testing.assert_allclose(out[True][5], p[cells], atol=1e-14)


def test_repeated_positions_reuse_the_work_only_when_they_are_the_same(monkeypatch):
    """The work worked out for a sparse input or a set of reads is kept for the next call with
    the same positions (a corrective phase's sweeps); other positions of the same count, another
    cost rule or thread count work theirs out: every call the full transform's bits."""
    ft._SCHEDULES.clear()
    calls = []
    real = ft._sparse_work
    monkeypatch.setattr(ft, "_sparse_work", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(3)
    shape = (7, 5, 9, 3, 4, 2, 2)
    size = math.prod(shape)
    g, pos = _sparse_table(rng, shape, 12)
    other = pos.copy()
    other[0] = (other[0] + 1) % size  # the same count, another position
    g2 = np.zeros(shape)
    g2.reshape(-1)[other] = 1.5
    reads = rng.choice(size, size=40, replace=False)
    for src, p in ((g, pos), (g, pos), (g2, other), (g, pos)):
        _check(src, p, None, True, reads)
    # per call of _check: one input, one set of reads; the second call and the last find both kept
    assert len(calls) == 2 + 0 + 1 + 0
    monkeypatch.setattr(ft, "SPARSE_SHARE", 100.0)
    _check(g, pos, None, True, reads)
    assert len(calls) == 5
    for _ in range(3):
        got = np.random.default_rng(1).standard_normal(shape)
        ref = got.copy()
        ft.transform_inplace(ref, transpose=False)
        ft.transform_sparse(got, transpose=False, needed=reads)
        assert np.array_equal(_bits(got.reshape(-1)[reads]), _bits(ref.reshape(-1)[reads]))
    assert len(calls) == 6  # the other direction's reads worked out once, then kept
