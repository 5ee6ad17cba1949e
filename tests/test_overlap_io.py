"""Overlapped band I/O: direct transfers on a transfer thread while the checksums are computed,
and the targets read ahead while a band task reads its duals.  Errors in the background
threads reach the caller, after the thread has let go of the band; damage is still found."""
from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

from fsll_ooc import FSLL, datasets, storage
from fsll_ooc.storage import IntegrityError, direct_io, memmap, tables

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this system")

SHAPE, CHUNKS = (4, 8, 2048), (1, 1, 2048)  # 16 KiB chunks (whole pages), 128 KiB bands of 8 chunks


@pytest.fixture
def table(tmp_path, monkeypatch):
    monkeypatch.setattr(direct_io, "DIRECT_IO", True)
    monkeypatch.setattr(memmap, "OVERLAP", True)
    monkeypatch.setattr(direct_io, "DIRECT_PIECE", 2 * 16384)  # four pieces of two chunks per band
    spec = storage.create_table("memmap", tmp_path, "t", SHAPE, CHUNKS, fit_id="test")
    rng = np.random.default_rng(0)
    want = rng.normal(size=SHAPE)
    for i in range(SHAPE[0]):
        storage.write(spec, (i,), want[i])
    return spec, want


def test_overlapped_path_is_taken_and_reads_what_was_written(table, monkeypatch):
    spec, want = table
    seen = []
    orig = memmap._overlapped
    monkeypatch.setattr(memmap, "_overlapped", lambda *a: seen.append(a[2]) or orig(*a))
    storage.write(spec, (2,), want[2] * 3)
    got = storage.read(spec, (2,))
    assert seen == [True, False]
    np.testing.assert_array_equal(got, want[2] * 3)
    assert got.ctypes.data % direct_io.DIRECT_ALIGN == 0 and got.flags.c_contiguous
    # a strided B-band (one chunk of every leading index) takes it too
    key = (slice(None), slice(3, 5), slice(None))
    np.testing.assert_array_equal(storage.read(spec, key), np.concatenate([want[:2], want[2:3] * 3, want[3:]])[key])
    memmap.MemmapBackend().verify(spec)


def test_chunks_of_part_pages_overlap_where_a_bands_runs_are_whole_pages(tmp_path, monkeypatch):
    monkeypatch.setattr(direct_io, "DIRECT_IO", True)
    monkeypatch.setattr(direct_io, "DIRECT_PIECE", 3 * 4096)
    shape = (3, 64, 1000)  # 8,000-byte chunks; an A-band (64 chunks) is 125 pages, a B-band's runs are not
    spec = storage.create_table("memmap", tmp_path, "t", shape, (1, 1, 1000), fit_id="test")
    seen = []
    orig = memmap._overlapped
    monkeypatch.setattr(memmap, "_overlapped", lambda *a: seen.append(a[2]) or orig(*a))
    want = np.random.default_rng(1).normal(size=shape)
    for i in range(shape[0]):
        storage.write(spec, (i,), want[i])
    assert seen == [True] * 3
    b_key = (slice(None), slice(5, 6), slice(None))
    storage.write(spec, b_key, want[b_key] * 2)  # runs of one chunk: through the bounce buffer
    want[b_key] *= 2
    assert seen == [True] * 3
    for i in range(shape[0]):
        np.testing.assert_array_equal(storage.read(spec, (i,)), want[i])
    np.testing.assert_array_equal(storage.read(spec, b_key), want[b_key])
    assert seen == [True] * 3 + [False] * 3
    np.testing.assert_array_equal(np.fromfile(spec.path, dtype=np.float64).reshape(shape), want)
    memmap.MemmapBackend().verify(spec)


def test_a_write_error_on_the_transfer_thread_is_raised_and_the_band_is_not_taken_as_written(table, monkeypatch):
    spec, want = table
    calls = []
    real = os.pwritev

    def failing(fd, bufs, off):
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            raise OSError(errno.EIO, "simulated device error")
        return real(fd, bufs, off)

    monkeypatch.setattr(memmap.os, "pwritev", failing)
    with pytest.raises(OSError, match="simulated device error"):
        storage.write(spec, (1,), want[1] + 1.0)
    monkeypatch.setattr(memmap.os, "pwritev", real)
    # the transfer stopped at the error (two of four pieces tried) and ran on a transfer thread
    assert len(calls) == 2 and all(n.startswith("fsll-io") for n in calls)
    raw = np.fromfile(spec.path, dtype=np.float64).reshape(SHAPE)
    np.testing.assert_array_equal(raw[1, :2], want[1, :2] + 1.0)  # the first piece reached the file
    np.testing.assert_array_equal(raw[1, 2:], want[1, 2:])  # nothing after the error
    # the checksums were not updated: the half-written band is refused, its neighbours are fine
    with pytest.raises(IntegrityError, match=r"checksum mismatch in chunk \(1, 0, 0\)"):
        storage.read(spec, (1,))
    np.testing.assert_array_equal(storage.read(spec, (0,)), want[0])
    storage.write(spec, (1,), want[1])  # a rewrite mends it (as a resumed fit does)
    np.testing.assert_array_equal(storage.read(spec, (1,)), want[1])


def test_a_read_error_on_the_transfer_thread_is_raised_and_the_threads_stay_usable(table, monkeypatch):
    spec, want = table
    real = os.preadv
    calls = []

    def failing(fd, bufs, off):
        calls.append(off)
        if len(calls) == 3:
            raise OSError(errno.EIO, "simulated read error")
        return real(fd, bufs, off)

    monkeypatch.setattr(memmap.os, "preadv", failing)
    with pytest.raises(OSError, match="simulated read error"):
        storage.read(spec, (3,))
    assert len(calls) == 3  # no piece read after the error
    monkeypatch.setattr(memmap.os, "preadv", real)
    np.testing.assert_array_equal(storage.read(spec, (3,)), want[3])


@pytest.mark.parametrize("chunk", [0, 5, 7])
def test_damage_is_found_in_any_piece_of_an_overlapped_read(table, chunk):
    spec, want = table
    with open(spec.path, "r+b") as fh:  # one changed byte in chunk ``chunk`` of band 2
        pos = (2 * 8 + chunk) * 16384 + 100
        fh.seek(pos)
        b = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([b[0] ^ 1]))
    with pytest.raises(IntegrityError, match=rf"checksum mismatch in chunk \(2, {chunk}, 0\)"):
        storage.read(spec, (2,))
    with pytest.raises(IntegrityError):
        storage.read(spec, (slice(None), slice(chunk, chunk + 1), slice(None)))  # and in a strided band
    np.testing.assert_array_equal(storage.read(spec, (1,)), want[1])


def test_read_ahead_gives_the_band_or_its_error(table, monkeypatch):
    spec, want = table
    np.testing.assert_array_equal(storage.read_ahead(spec, (1,)).result(), want[1])
    with open(spec.path, "r+b") as fh:
        fh.seek(16384 * 8 + 8)
        fh.write(b"\1")
    fut = storage.read_ahead(spec, (1,))
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        fut.result()
    mem = storage.create_table("numpy", None, "m", (2, 3), (1, 3))
    storage.write(mem, (1,), np.arange(3.0))
    np.testing.assert_array_equal(storage.read_ahead(mem, (1,)).result(), np.arange(3.0))


CARDS = (2, 3, 4, 5)


@pytest.fixture(scope="module")
def X():
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=3)
    return datasets.sample_table(p, 2000, seed=103)


@pytest.fixture(scope="module")
def ref(X):
    return FSLL(cardinalities=CARDS, progress=False).fit(X)


def _status(store):
    return storage.read_json(store / "fsll_state.json", checksum=True)["status"]


def test_an_error_in_the_read_ahead_thread_ends_the_fit_clearly_and_resume_completes_it(X, ref, tmp_path,
                                                                                        monkeypatch):
    store = tmp_path / "s"
    real = tables.read
    ahead_reads = []

    def flaky(spec, key):  # the read-ahead threads' reads (the band tasks' own go through storage.read)
        ahead_reads.append(threading.current_thread().name)
        if len(ahead_reads) == 5:
            raise OSError(errno.EIO, "simulated read-ahead failure", spec.path)
        return real(spec, key)

    monkeypatch.setattr(tables, "read", flaky)
    with pytest.raises(OSError, match="simulated read-ahead failure"):
        FSLL(cardinalities=CARDS, progress=False, store=store, backend="memmap", layout=(1, 2),
             scheduler="serial").fit(X)
    # the failing read (a two-pass update's partner band) and the targets' read started with it; no more
    assert len(ahead_reads) in (5, 6) and all(n.startswith("fsll-ahead") for n in ahead_reads)
    assert _status(store) == "running"  # never marked complete
    monkeypatch.undo()
    m = FSLL.resume(store, progress=False)
    assert _status(store) == "complete"
    assert m.cost_ == pytest.approx(ref.cost_, abs=1e-10) and set(m.theta_) == set(ref.theta_)


def test_a_band_task_whose_duals_fail_waits_for_its_read_ahead(X, tmp_path, monkeypatch):
    log = []
    dual_failed = threading.Event()
    real_ahead = tables.read
    real_read = storage.read

    def slow_ahead(spec, key):  # the targets' read ahead ends only after the duals' read failed
        assert dual_failed.wait(timeout=60)
        out = real_ahead(spec, key)
        log.append("read ahead ended")
        return out

    def failing_read(spec, key):
        if spec.path and spec.path.endswith("thetabar.f64"):
            dual_failed.set()
            raise OSError(errno.EIO, "simulated dual read failure", spec.path)
        return real_read(spec, key)

    monkeypatch.setattr(tables, "read", slow_ahead)
    monkeypatch.setattr(storage, "read", failing_read)
    with pytest.raises(OSError, match="simulated dual read failure"):
        FSLL(cardinalities=CARDS, progress=False, store=tmp_path / "s", backend="memmap", layout=(1, 2),
             scheduler="serial").fit(X)
    log.append("task raised")
    assert log == ["read ahead ended", "task raised"]
