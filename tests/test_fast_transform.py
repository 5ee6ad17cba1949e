"""kernels.transform.transform_inplace against the numpy reference (basis.transform) and
against dense sums with basis.local_matrix."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from fsll_ooc import basis
from fsll_ooc.kernels import transform as ft
from fsll_ooc.kernels import transform_plan as tp


def _close(got, ref, rtol=1e-12):
    """Equal up to rounding, relative to the table's scale (transforms cancel)."""
    scale = max(float(np.max(np.abs(ref))), 1e-300) if ref.size else 1.0
    np.testing.assert_allclose(got, ref, rtol=0, atol=rtol * scale)


def _run(g, axes=None, transpose=False, **kw):
    a = g.copy()
    ft.transform_inplace(a, axes, transpose=transpose, **kw)
    return a


def _dense(g, axes, transpose):
    """The transform as explicit sums with the dense local matrices."""
    out = g.astype(np.float64)
    for ax in range(g.ndim) if axes is None else axes:
        m = basis.local_matrix(g.shape[ax])
        m = m.T if transpose else m
        out = np.moveaxis(np.tensordot(m, np.moveaxis(out, ax, 0), axes=(1, 0)), 0, ax)
    return out


@pytest.fixture
def small_budgets(monkeypatch):
    """Tiny cache budgets: small tables then take several gathered passes, split Walsh
    axes over groups, remainder tiles and oversized +-1 axes; threads on small tables."""
    monkeypatch.setattr(tp, "_BLOCK_BYTES", 256)
    monkeypatch.setattr(tp, "_TILE_BYTES", 512)
    monkeypatch.setattr(tp, "_MIN_ROW_BYTES", 64)
    monkeypatch.setattr(tp, "_PAD_BYTES", 64)
    monkeypatch.setattr(ft, "_PAR_MIN_SIZE", 0)


SHAPES = [
    (2, 3, 4, 5), (5, 3, 2), (1, 2, 1, 3), (8, 6, 4), (3, 5, 6, 2, 4), (16, 3, 8),
    (7,), (2,), (9, 12), (130, 2), (2,) * 10, (4,) * 5, (1,), (1, 1, 1), (6, 1, 16, 1, 5),
    (2, 2, 3, 2, 2), (32, 2, 2),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transpose", [False, True])
def test_matches_reference_all_axes(shape, transpose):
    rng = np.random.default_rng(hash(shape) % 2**32)
    g = rng.standard_normal(shape)
    ref = basis.transform(g, transpose=transpose)
    _close(_run(g, transpose=transpose), ref)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (5, 3, 2), (1, 2, 1, 3), (8, 6, 4), (3, 2, 2), (4, 7)])
@pytest.mark.parametrize("transpose", [False, True])
def test_matches_dense_sums(shape, transpose):
    rng = np.random.default_rng(7)
    g = rng.standard_normal(shape)
    _close(_run(g, transpose=transpose), _dense(g, None, transpose))
    ax = [a for a in range(len(shape)) if rng.random() < 0.5]
    _close(_run(g, ax, transpose=transpose), _dense(g, ax, transpose))


def test_walsh_tables_bit_identical():
    """Butterflies in the reference's stage order: same rounding, same bits."""
    rng = np.random.default_rng(3)
    for shape in [(2,) * 12, (4, 2, 8, 2), (16, 16, 2)]:
        g = rng.standard_normal(shape) * 10.0 ** rng.uniform(-5, 5, size=shape)
        assert np.array_equal(_run(g), basis.transform(g))


def test_random_axis_subsets_and_orders():
    rng = np.random.default_rng(11)
    cards = [1, 2, 3, 4, 5, 6, 7, 8, 16]
    for _ in range(60):
        n = int(rng.integers(1, 6))
        shape = tuple(int(rng.choice(cards)) for _ in range(n))
        g = rng.standard_normal(shape)
        axes = [int(a) for a in rng.permutation(n)[: rng.integers(0, n + 1)]]
        axes = [a - n if rng.random() < 0.3 else a for a in axes]  # some negative
        tr = bool(rng.random() < 0.5)
        _close(_run(g, axes, transpose=tr), basis.transform(g, axes, transpose=tr))


@pytest.mark.parametrize("transpose", [False, True])
def test_multi_pass_paths(small_budgets, transpose):
    """Several passes, gathered tiles (with padding and remainder tiles), threads."""
    rng = np.random.default_rng(5)
    for shape in [(3, 5, 6, 2, 4, 2, 2, 2), (2,) * 13, (8, 8, 8, 3), (5, 16, 7, 4), (37, 3, 2, 2),
                  (2, 3, 16, 5, 2), (3, 300, 2)]:
        g = rng.standard_normal(shape)
        pl = tp.plan(shape, None, transpose)
        assert pl.npasses >= 2, pl.describe()
        for axes in [None, [0, 2], [-1], list(range(1, len(shape)))]:
            ref = basis.transform(g, axes, transpose=transpose)
            _close(_run(g, axes, transpose=transpose), ref)
            _close(_run(g, axes, transpose=transpose, parallel=False), ref)


@pytest.mark.parametrize("shape", [(3, 2), (4, 3, 2), (5, 3, 3), (2, 3, 2, 2), (3, 3, 2), (7, 3, 2, 3)])
def test_three_values_at_small_strides_bit_identical(shape):
    """A 3-valued axis at stride 2 or 3 (its own kernel), and a binary last axis after a
    +-1 axis (radix-2 at a constant offset): the reference's bits, both ways."""
    rng = np.random.default_rng(sum(shape))
    g = rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 4, size=shape)
    for tr in (False, True):
        got, ref = _run(g, transpose=tr), basis.transform(g, transpose=tr)
        assert np.array_equal(got, ref)


def test_long_last_axis_pairwise():
    """+-1 sums along the last axis follow numpy's pairwise order, also past 128."""
    rng = np.random.default_rng(2)
    for k in (9, 127, 129, 300, 1000):
        g = rng.standard_normal((3, k)) * 10.0 ** rng.uniform(-4, 4, size=(3, k))
        for tr in (False, True):
            got, ref = _run(g, transpose=tr), basis.transform(g, transpose=tr)
            _close(got, ref)
            assert np.array_equal(got, ref)


def test_float32():
    rng = np.random.default_rng(4)
    for shape in [(2, 3, 4, 5), (8, 6, 4), (2,) * 12]:
        g = rng.standard_normal(shape).astype(np.float32)
        for tr in (False, True):
            got = _run(g, transpose=tr)
            assert got.dtype == np.float32
            _close(got, basis.transform(g, transpose=tr), rtol=2e-6)
            _close(got, basis.transform(g.astype(np.float64), transpose=tr), rtol=1e-5)


def test_other_float_dtypes_go_through_reference():
    g = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float16)
    got = _run(g, transpose=True)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, basis.transform(g, transpose=True))
    big_endian = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(">f8")
    _close(_run(big_endian), basis.transform(big_endian))


def test_big_cardinalities():
    """A +-1 axis larger than a cache block, alone in its pass; untouched axes between."""
    rng = np.random.default_rng(8)
    for shape, axes in [((100003, 3), None), ((3, 70001), None), ((5, 1, 30001, 1, 2), [0, 2]),
                        ((2,) * 6 + (999,), None), ((3,) * 12, [1, 5, 11])]:
        g = rng.standard_normal(shape)
        for tr in (False, True):
            _close(_run(g, axes, transpose=tr), basis.transform(g, axes, transpose=tr))


def test_duplicate_axes_apply_twice():
    g = np.random.default_rng(1).standard_normal((4, 3, 2))
    _close(_run(g, [1, 0, 1]), basis.transform(g, [1, 0, 1]))
    _close(_run(g, [2, 2], transpose=True), basis.transform(g, [2, 2], transpose=True))


def test_edge_cases():
    z = np.array(3.5)
    ft.transform_inplace(z)
    assert z == 3.5 and z.shape == ()
    with pytest.raises(np.exceptions.AxisError):
        ft.transform_inplace(np.array(3.5), [0])
    one = np.array([2.5])
    ft.transform_inplace(one)
    assert one[0] == 2.5
    g = np.random.default_rng(0).standard_normal((1, 1, 1))
    assert np.array_equal(_run(g), g)
    e = np.empty((0, 3))
    ft.transform_inplace(e)  # nothing to do
    g = np.random.default_rng(0).standard_normal((3, 4))
    assert np.array_equal(_run(g, []), g)


def test_rejects_bad_input():
    a = np.zeros((4, 6))
    with pytest.raises(ValueError, match="C-contiguous"):
        ft.transform_inplace(a[:, ::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        ft.transform_inplace(np.zeros((4, 6)).T)
    ro = np.zeros((2, 3))
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="writeable"):
        ft.transform_inplace(ro)
    with pytest.raises(TypeError):
        ft.transform_inplace(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(TypeError):
        ft.transform_inplace([[1.0, 2.0]])
    with pytest.raises(np.exceptions.AxisError):
        ft.transform_inplace(np.zeros((2, 3)), [2])


def test_larger_table_two_passes_threads():
    """A 2^18 binary table (2 MiB: two passes with the default budgets), threaded."""
    g = np.random.default_rng(9).standard_normal((2,) * 18)
    assert tp.plan(g.shape).npasses == 2
    assert np.array_equal(_run(g, parallel=True), basis.transform(g))
    mixed = np.random.default_rng(9).standard_normal((3, 5, 6, 2, 4) + (2,) * 10)
    _close(_run(mixed, transpose=True), basis.transform(mixed, transpose=True))


def test_plans_for_big_tables():
    assert tp.plan((2,) * 24).npasses == 2
    assert tp.plan((2,) * 30).npasses == 3
    assert tp.plan((2,) * 24, itemsize=4).npasses == 2
    assert "pass 0" in tp.plan((3, 5, 6, 2, 4) + (2,) * 12).describe()


def test_concurrent_callers(small_budgets):
    rng = np.random.default_rng(6)
    tables = [rng.standard_normal((3, 4, 5, 2, 2, 2)) for _ in range(4)]
    refs = [basis.transform(t, transpose=True) for t in tables]
    outs = [t.copy() for t in tables]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                o = tables[i].copy()
                ft.transform_inplace(o, transpose=True)
                outs[i] = o
        except Exception as e:  # pragma: no cover
            errors.append(e)

    th = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errors
    for o, r in zip(outs, refs):
        _close(o, r)


def test_warmup():
    ft.warmup()
