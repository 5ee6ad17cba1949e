"""Compiling kernels in a second process (fsll_ooc.kernels.ahead): the child compiles what
the fit runs, the parent then loads it from numba's cache, and nothing starts when the
kernels are there already."""
import os
import sys
import textwrap

import numpy as np

from fsll_ooc import kernels
from fsll_ooc.kernels import ahead, scan


def test_the_child_compiles_the_specialisations_a_fit_runs():
    """The signatures the child compiles are those of real passes: after one pass of each
    kind, one support move and one block of joint candidates in this process, each is among
    the compiled ones."""
    rng = np.random.default_rng(0)
    t = rng.uniform(-0.5, 0.5, (4, 8))
    d = rng.uniform(-0.5, 0.5, (4, 8))
    r = np.zeros(4), np.zeros(8)
    kernels.update_scan_xor(t.copy(), d, *r, 0.0, 1, 3, 1.0, 0.5, 0.9)
    kernels.update_scan_explicit(t.copy(), None, d, *r, 0.0, update=False)
    kernels.update_scan_explicit(t.copy(), t[::-1].copy(), d, *r, 0.0, 1.0, 0.5, 0.9)
    kernels.support_moves(np.arange(3, dtype=np.int64), t[0, :3].copy(), d[0, :3].copy(), np.ones(3), np.zeros(3))
    kernels.second_order_lowest(t[1:3], d[1:3], r[0][1:3], r[1], 0.0, 2, np.int64(-1))  # joint candidates
    assert scan.ahead_kernels() == scan.fit_kernels()[:1]
    for disp, sig in scan.fit_kernels():
        assert tuple(sig) in disp.overloads, (disp.py_func.__name__, sig)
        assert ahead.is_cached(disp, sig)
    assert ahead.start(scan.__name__) is False  # all there: no second process
    ahead.wait(scan.__name__)  # nothing to wait for


def test_a_child_fills_the_cache_and_the_parent_loads_from_it(tmp_path, monkeypatch):
    """End to end on a tiny module: a fresh cache, the child compiles, the parent's first
    call is a cache hit (no compile here), and a second start finds nothing to do."""
    (tmp_path / "tiny_ahead_mod.py").write_text(textwrap.dedent('''
        import numpy as np
        from numba import njit

        @njit(cache=True)
        def twice(x):
            return 2.0 * x

        def ahead_kernels():
            return [(twice, (twice.typeof_pyval(np.float64(1.0)),))]
    '''))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(tmp_path))
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path / "cache"))
    import importlib

    sys.modules.pop("tiny_ahead_mod", None)
    mod = importlib.import_module("tiny_ahead_mod")
    try:
        (disp, sig), = mod.ahead_kernels()
        assert not ahead.is_cached(disp, sig)
        assert ahead.start("tiny_ahead_mod") is True
        ahead.wait("tiny_ahead_mod")
        assert not ahead.running("tiny_ahead_mod")
        assert ahead.is_cached(disp, sig)
        assert disp(np.float64(1.5)) == 3.0
        assert disp.stats.cache_hits[tuple(sig)] == 1 and not disp.stats.cache_misses
        assert ahead.start("tiny_ahead_mod") is False
    finally:
        sys.modules.pop("tiny_ahead_mod", None)


def test_wait_for_nothing_is_a_no_op():
    ahead.wait("no.such.module")
    assert ahead.start("no.such.module") is False  # cannot import: numba compiles here as usual


def _table(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def test_first_use_reference_gives_the_compiled_bits(monkeypatch):
    """While the compiled driver is not there, a small table goes through the numpy
    reference: the same bits as the compiled transform (mixed cardinalities, both
    directions, all axes and a subset, a repeated axis)."""
    from fsll_ooc.kernels import transform as ft

    cases = [((2, 3, 5, 2), None), ((3, 2, 2, 7, 2), None), ((2,) * 12, None), ((5, 2, 3), (0, 2)),
             ((2, 3, 2), (1, 1, 2))]
    for i, (shape, axes) in enumerate(cases):
        for tr in (False, True):
            want = _table(shape, i)
            ft.transform_inplace(want, axes, transpose=tr)  # compiled
            with monkeypatch.context() as m:
                m.setattr(ft, "_driver_ready", lambda x, pl: False)
                got = _table(shape, i)
                ft.transform_inplace(got, axes, transpose=tr, first_use="reference")
            assert np.array_equal(got, want), (shape, axes, tr)


def test_first_use_reference_only_where_it_pays_and_keeps_bits(monkeypatch):
    """The reference is not used when the driver is ready, for a power-of-two axis of 4+
    values (other rounding), or above the size limit; a bad ``first_use`` is refused."""
    import pytest

    from fsll_ooc import basis
    from fsll_ooc.kernels import transform as ft

    calls = []
    real = basis.transform
    monkeypatch.setattr(basis, "transform", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    ft.transform_inplace(_table((2, 3), 0), first_use="reference")  # driver compiled here: no reference
    monkeypatch.setattr(ft, "_driver_ready", lambda x, pl: False)
    ft.transform_inplace(_table((4, 3), 0), first_use="reference")  # a 4-valued Walsh axis
    monkeypatch.setattr(ft, "REFERENCE_FIRST_MAX_SIZE", 4)
    ft.transform_inplace(_table((2, 3), 0), first_use="reference")  # above the limit
    ft.transform_inplace(_table((2, 3), 0))  # "compile" is the default
    assert calls == []
    monkeypatch.setattr(ft, "REFERENCE_FIRST_MAX_SIZE", 6)
    ft.transform_inplace(_table((2, 3), 0), first_use="reference")
    assert calls == [(2, 3)]
    with pytest.raises(ValueError, match="first_use"):
        ft.transform_inplace(_table((2, 3), 0), first_use="later")


def test_driver_ready_reads_the_cache_of_this_process():
    from fsll_ooc.kernels import transform as ft
    from fsll_ooc.kernels.transform_plan import plan_for

    x = _table((2, 2, 2), 0)
    ft.transform_inplace(x)
    assert ft._driver_ready(x.reshape(-1), plan_for((2, 2, 2), (0, 1, 2), 8, False))


def test_a_fit_that_compiles_says_so(monkeypatch, capsys):
    """When a fit starts the compile (first use after installing) and shows progress, one
    line on stderr says why it waits; without progress, or with the kernels cached, none."""
    from fsll_ooc import FSLL

    X = np.random.default_rng(0).integers(0, 2, (200, 4))
    started = []
    monkeypatch.setattr(ahead, "start", lambda module: started.append(module) or True)
    FSLL(epsilon=1e-4, max_iter=2, progress=True).fit(X)
    assert "compiling the kernels" in capsys.readouterr().err
    assert started == [scan.__name__]
    FSLL(epsilon=1e-4, max_iter=2, progress=False).fit(X)
    assert "compiling" not in capsys.readouterr().err
    monkeypatch.setattr(ahead, "start", lambda module: False)
    FSLL(epsilon=1e-4, max_iter=2, progress=True).fit(X)
    assert "compiling" not in capsys.readouterr().err
