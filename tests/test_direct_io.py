"""The memmap backend's direct band I/O (O_DIRECT, aligned runs, buffered unaligned ends) against
the plain memory map: same bytes in the file, same values read, checksums kept."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from fsll_ooc import storage
from fsll_ooc.storage import direct_io, memmap


@pytest.fixture(params=[2**20, 8192], ids=["piece-16MiB", "piece-8KiB"])
def small_pieces(request, monkeypatch):
    monkeypatch.setattr(direct_io, "DIRECT_PIECE", request.param)
    return request.param


def _keys(shape, chunks):
    """Whole-chunk keys as the engine's bands use them: one leading index (a contiguous run),
    and slices over the middle variables for every leading value (strided runs)."""
    yield (0,)
    yield (shape[0] - 1,)
    yield tuple([slice(0, shape[0])] + [slice(1, 2)] + [slice(0, s) for s in shape[2:]])
    yield tuple(slice(0, s) for s in shape)


@pytest.mark.parametrize("shape,chunks", [((3, 5, 7, 11), (1, 1, 7, 11)),   # 616-byte chunks: nothing aligned
                                          ((4, 8, 512), (1, 1, 512)),        # 4096-byte chunks: all aligned
                                          ((6, 3, 1000), (1, 3, 1000))])     # 24,000-byte chunks: ends unaligned
def test_direct_band_io_matches_the_memory_map(tmp_path, shape, chunks, small_pieces, monkeypatch):
    if not hasattr(__import__("os"), "O_DIRECT"):
        pytest.skip("no O_DIRECT on this system")  # the buffered path is the memory map itself
    monkeypatch.setattr(direct_io, "DIRECT_IO", True)
    used = []
    orig_r, orig_w = memmap._read_direct, memmap._write_direct
    monkeypatch.setattr(memmap, "_read_direct", lambda *a: used.append("r") or orig_r(*a))
    monkeypatch.setattr(memmap, "_write_direct", lambda *a: used.append("w") or orig_w(*a))
    spec = storage.create_table("memmap", tmp_path, "t", shape, chunks)
    rng = np.random.default_rng(sum(shape))
    want = np.zeros(shape)
    for key in itertools.chain(_keys(shape, chunks), _keys(shape, chunks)):
        value = rng.normal(size=want[key].shape)
        storage.write(spec, key, value)
        want[key] = value
        # a partial-chunk write through the memory map in between: the next direct read sees it
        cell = tuple(int(rng.integers(s)) for s in shape)
        storage.write(spec, tuple(slice(c, c + 1) for c in cell), np.array(7.5).reshape((1,) * len(shape)))
        want[cell] = 7.5
        for k in _keys(shape, chunks):
            np.testing.assert_array_equal(storage.read(spec, k), want[k])
    storage.flush(spec)
    assert "r" in used and "w" in used
    np.testing.assert_array_equal(np.fromfile(spec.path, dtype=np.float64).reshape(shape), want)
    memmap.MemmapBackend().verify(spec)  # every chunk's checksum matches the file
    monkeypatch.setattr(direct_io, "DIRECT_IO", False)
    for k in _keys(shape, chunks):
        np.testing.assert_array_equal(storage.read(spec, k), want[k])


def test_a_fit_through_direct_io_equals_the_buffered_one(tmp_path, monkeypatch):
    from fsll_ooc import FSLL, datasets

    cards = (2, 3, 4, 5)
    p, _ = datasets.random_bayesnet(cards, 2, seed=3)
    X = datasets.sample_table(p, 2000, seed=103)
    monkeypatch.setattr(direct_io, "DIRECT_IO", True)
    a = FSLL(cardinalities=cards, progress=False, store=tmp_path / "a", backend="memmap", layout=(1, 2)).fit(X)
    monkeypatch.setattr(direct_io, "DIRECT_IO", False)
    b = FSLL(cardinalities=cards, progress=False, store=tmp_path / "b", backend="memmap", layout=(1, 2)).fit(X)
    assert a.cost_ == b.cost_ and a.theta_ == b.theta_ and a.n_iter_ == b.n_iter_


def test_direct_io_is_for_tables_the_page_cache_cannot_hold(tmp_path, monkeypatch):
    from fsll_ooc import machine

    spec = storage.create_table("memmap", tmp_path, "t", (4, 8, 512), (1, 1, 512))  # 128 KiB
    monkeypatch.setattr(direct_io, "DIRECT_IO", "auto")
    monkeypatch.setattr(machine, "total_memory", lambda: 6 * spec.nbytes)  # three tables: exactly half
    assert not direct_io.wants_direct(spec)
    monkeypatch.setattr(machine, "total_memory", lambda: 6 * spec.nbytes - 2)
    assert direct_io.wants_direct(spec) == hasattr(__import__("os"), "O_DIRECT")
    monkeypatch.setattr(direct_io, "DIRECT_IO", False)
    assert not direct_io.wants_direct(spec)
