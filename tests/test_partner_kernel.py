"""A step's partner made by one compiled walk per axis (kernels.bandops.partner_into) has the bits
of numpy's product rule (basis.apply_product) axis after axis, on one and several threads, and the
engine's tasks that use it (held buffers in core) leave the same duals as the numpy form."""
import itertools

import numpy as np
import pytest

from fsll_ooc import basis
from fsll_ooc.kernels import bandops


def _reference(src, shape, axes):
    part = src.reshape(shape)
    for ax, b, _ in axes:
        part = basis.apply_product(part, ax, b) if b else part.copy()
    return np.ascontiguousarray(part).reshape(-1)


def _numpy_product(g, axis, b):
    """basis.apply_product by numpy's operations only (take for Walsh-Hadamard, _pm_numpy for +-1)."""
    k = g.shape[axis]
    if basis.is_walsh(k):
        return np.take(g, np.arange(k) ^ b, axis=axis)
    x = np.ascontiguousarray(g).reshape(int(np.prod(g.shape[:axis])), k, int(np.prod(g.shape[axis + 1:])))
    return bandops._pm_numpy(x, b).reshape(g.shape)


CARDS = [(2, 3, 4, 5), (5, 4, 3, 2), (3, 5, 2, 4, 3), (4, 17, 3), (3, 2, 40), (3, 5, 7), (5, 3, 4, 2), (3, 2, 3),
         (5, 2, 2)]


@pytest.mark.parametrize("shape", CARDS)
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_partner_into_is_the_product_rules_bits(monkeypatch, shape, n_threads):
    monkeypatch.setattr(bandops, "PARALLEL_MIN", 1)  # the pieces on the helpers even for small bands
    rng = np.random.default_rng(len(shape) * 7 + n_threads)
    n = int(np.prod(shape))
    src = rng.standard_normal(n) * 0.3
    out = np.full(n, np.nan)
    for m in (1, 2, 3):
        for axs in itertools.combinations(range(len(shape)), m):
            for digits in itertools.product(*[range(1, shape[a]) for a in axs]):
                axes = [(a, b, basis.is_walsh(shape[a])) for a, b in zip(axs, digits)]
                tmp = np.full(n, np.nan) if sum(1 for _, b, _ in axes if b) > 1 else None
                got = bandops.partner_into(src, shape, axes, out, tmp, n_threads)
                want = src.reshape(shape)
                for a, b, _ in axes:
                    want = _numpy_product(want, a, b)
                assert got is out
                assert np.array_equal(got, np.ascontiguousarray(want).reshape(-1))
                assert np.array_equal(got, _reference(src, shape, axes))


def test_partner_into_reads_a_read_only_band_and_zero_digits():
    shape = (3, 4, 5)
    src = np.random.default_rng(0).standard_normal(60)
    ro = src.copy()
    ro.setflags(write=False)
    out, tmp = np.empty(60), np.empty(60)
    axes = [(0, 2, False), (1, 0, True), (2, 3, False)]
    assert np.array_equal(bandops.partner_into(ro, shape, axes, out, tmp), _reference(src, shape, axes))
    assert np.array_equal(bandops.partner_into(ro, shape, [(1, 0, True)], out, None), src)


@pytest.mark.parametrize("hold", [True, False])
def test_engine_partner_is_numpys_and_keeps_its_buffers(monkeypatch, hold):
    from fsll_ooc.engine import tasks
    from fsll_ooc.engine.tasks import Step

    monkeypatch.setattr(bandops, "pm_kernels_ready", lambda: True)  # (not numpy's fallback while they compile)
    calls = []

    class Ctx:
        cards = (2, 3, 4, 5)
        _cache: dict = {}

        class _Spec:
            class backend_impl:
                persistent = not hold

        specs = (_Spec, _Spec, _Spec)

    ctx = Ctx()
    ctx._cache = {}
    shape = ctx.cards
    src = np.random.default_rng(1).standard_normal(int(np.prod(shape)))
    bv = (0, 1, 2, 3)
    firsts = []
    for digits in [(1, 2, 0, 0), (0, 1, 3, 4), (1, 0, 2, 0), (0, 0, 0, 3)]:
        step = Step(digits, 0.1, 0.0)
        got = tasks._make_partner(ctx, src, shape, bv, step, step.axes, False)
        want = src.reshape(shape)
        for v in step.axes:
            want = basis.apply_product(want, v, digits[v])
        assert np.array_equal(got, np.ascontiguousarray(want).reshape(-1))
        firsts.append(got)
        calls.append(len(ctx._cache))
    assert calls[-1] == (1 if hold else 0)
    if hold:  # the same buffer step after step
        assert all(np.shares_memory(f, firsts[0]) for f in firsts[1:])


def test_engine_partner_uses_numpy_while_its_kernels_compile(monkeypatch):
    from fsll_ooc.engine import tasks
    from fsll_ooc.engine.tasks import Step

    monkeypatch.setattr(bandops, "pm_kernels_ready", lambda: False)
    monkeypatch.setattr(bandops, "partner_into", None)  # not called

    class Ctx:
        cards = (3, 4)
        _cache: dict = {}
        specs = ()

    src = np.random.default_rng(2).standard_normal(12)
    step = Step((2, 3), 0.1, 0.0)
    got = tasks._make_partner(Ctx(), src, (3, 4), (0, 1), step, step.axes, False)
    assert np.array_equal(got, basis.apply_product(basis.apply_product(src.reshape(3, 4), 0, 2), 1, 3).reshape(-1))
