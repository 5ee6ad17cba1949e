"""Transforms and product rules against direct sums over all x."""
import itertools

import numpy as np
import pytest

from fsll_ooc import basis

CARDS = [(2, 3, 4, 5), (5, 3, 2), (1, 2, 1, 3), (8, 6, 4), (7,), (16, 3)]


def dense_transform(g, transpose=False):
    cards = g.shape
    out = np.zeros_like(g)
    mats = [basis.local_matrix(k) for k in cards]
    for y in itertools.product(*[range(k) for k in cards]):
        s = 0.0
        for x in itertools.product(*[range(k) for k in cards]):
            phi = np.prod([mats[i][y[i], x[i]] if not transpose else mats[i][x[i], y[i]] for i in range(len(cards))])
            s += phi * g[x]
        out[y] = s
    return out


@pytest.mark.parametrize("cards", CARDS)
@pytest.mark.parametrize("transpose", [False, True])
def test_transform_equals_direct_sums(cards, transpose):
    g = np.random.default_rng(len(cards)).random(cards)
    np.testing.assert_allclose(basis.transform(g, transpose=transpose), dense_transform(g, transpose), atol=1e-10)


def test_local_bases_follow_the_conventions():
    for k in (2, 4, 8, 16):
        H = basis.local_matrix(k)
        for a in range(k):
            for l in range(k):
                assert H[a, l] == (-1) ** bin(a & l).count("1")
        np.testing.assert_allclose(H @ H.T, k * np.eye(k))
    for k in (3, 5, 6, 7):
        M = basis.local_matrix(k)
        assert np.all(M[0] == 1)
        for j in range(1, k):
            assert all(M[j, l] == (1 if l == j else -1) for l in range(k))
        assert np.linalg.matrix_rank(M) == k


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6, 8])
def test_product_rule_and_apply_product(k):
    P = basis.local_matrix(k)
    rng = np.random.default_rng(k)
    for b in range(k):
        M = basis.product_matrix(k, b)
        np.testing.assert_allclose(P * P[b][None, :], M @ P, atol=1e-12)
        assert (np.abs(M) > 0).sum(axis=1).max() <= 3
        g = rng.random((2, k, 3))
        np.testing.assert_allclose(basis.apply_product(g, 1, b), np.einsum("ac,icj->iaj", M, g))


def test_phi_values():
    for k in (2, 3, 4, 5, 8):
        M = basis.local_matrix(k)
        x = np.arange(k)
        for y in range(k):
            np.testing.assert_array_equal(basis.phi_values(k, y, x), M[y])


@pytest.mark.parametrize("shape,axis", [((3, 5, 2), 1), ((2, 3, 40), 1), ((4, 6, 3), 2), ((5, 7, 17), 0),
                                        ((3, 3, 3, 3), 2), ((1, 5, 1), 1), ((7, 3, 5), 1), ((2, 3, 2), 1),
                                        ((3, 3, 9), 1), ((3, 3, 3, 3, 3), 4)])
def test_apply_product_compiled_is_numpys_bits(shape, axis):
    """The compiled +-1 product (row by row for long rows, cell by cell for short ones) gives
    the bits of numpy's operations, and both are the product matrix applied along the axis;
    on a read-only or non-contiguous input too."""
    from fsll_ooc.kernels import ahead, bandops

    bandops.pm_kernels_ready()
    ahead.wait(bandops.__name__)  # (a child compiles them on their first use after installing)
    assert bandops.pm_kernels_ready()
    rng = np.random.default_rng(sum(shape) + axis)
    k = shape[axis]
    g = rng.standard_normal(shape)
    for b in range(1, k):
        want = np.moveaxis(np.tensordot(basis.product_matrix(k, b), g, axes=(1, axis)), 0, axis)
        got = basis.apply_product(g, axis, b)
        np.testing.assert_allclose(got, want, atol=1e-12)
        x = g.reshape(int(np.prod(shape[:axis])), k, -1)
        ref = bandops._pm_numpy(x, b)
        assert np.array_equal(got.reshape(-1).view(np.int64), ref.reshape(-1).view(np.int64))
        ro = g.copy()
        ro.setflags(write=False)
        assert np.array_equal(basis.apply_product(ro, axis, b), got)
        swapped = np.swapaxes(g, 0, axis)  # not contiguous
        assert np.array_equal(basis.apply_product(swapped, 0, b), np.swapaxes(got, 0, axis))


def test_apply_product_uses_numpy_while_its_kernels_compile(monkeypatch):
    """While a second process compiles the +-1 product's kernels (their first use after
    installing) numpy's operations run; once it has ended the kernels do; a process that
    could start no compiler compiles them itself.  The same bits every way."""
    from fsll_ooc.kernels import ahead, bandops

    g = np.random.default_rng(3).standard_normal((4, 5, 20))
    want = bandops._pm_numpy(g, 2)
    calls = []
    real_rows = bandops._pm_rows
    monkeypatch.setattr(bandops, "_pm_rows", lambda *a: (calls.append(1), real_rows(*a)))
    compiling = [False]

    def start(module):  # a child starts compiling them
        compiling[0] = True
        return True

    monkeypatch.setattr(ahead, "running", lambda module: compiling[0] and module == bandops.__name__)
    monkeypatch.setattr(ahead, "start", start)
    monkeypatch.setattr(ahead, "_ready", {})
    for _ in range(2):  # the child compiles: numpy
        assert np.array_equal(basis.apply_product(g, 1, 2), want) and not calls
    compiling[0] = False
    assert np.array_equal(basis.apply_product(g, 1, 2), want) and calls == [1]  # done: the kernel
    monkeypatch.setattr(ahead, "start", lambda module: False)  # no child possible: compiled here
    monkeypatch.setattr(ahead, "_ready", {})
    assert np.array_equal(basis.apply_product(g, 1, 2), want) and calls == [1, 1]
