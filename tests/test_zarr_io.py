"""The zarr backend's own chunk-file I/O (band reads and writes that bypass zarr) against zarr
itself: the same bytes in every chunk file, zarr reads them back, damage is named, links
are refused, a write cut short leaves chunks that are refused, not used."""
from __future__ import annotations

import errno
import itertools
import os
from pathlib import Path

import numpy as np
import pytest

from fsll_ooc import FSLL, datasets, storage
from fsll_ooc.storage import IntegrityError, binding, direct_io, files, memmap, zarr_tables

SHAPES = [((3, 5, 7, 11), (1, 1, 7, 11)),  # 616-byte chunks: buffered whole (no full page)
          ((2, 4, 1024), (1, 1, 1024)),     # 8,192-byte chunks: the data direct, the CRC buffered
          ((2, 3, 525), (1, 1, 525))]       # 4,200-byte chunks: one page direct, 104 bytes and the CRC buffered


def _keys(shape):
    """Whole-chunk keys as bands use them: a leading index (a run of chunks), a slice of a
    middle variable for every leading value (strided chunks), the whole table."""
    yield (0,)
    yield (shape[0] - 1,)
    yield tuple([slice(None), 1] + [slice(None)] * (len(shape) - 2))
    yield (Ellipsis,)


def _chunk_files(spec):
    root = Path(spec.path)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != "zarr.json")


@pytest.fixture(params=[True, False], ids=["direct", "buffered"])
def direct(request, monkeypatch):
    if request.param and not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this system")
    monkeypatch.setattr(direct_io, "DIRECT_IO", request.param)
    return request.param


def _fill(spec, shape, seed):
    """Write every key of :func:`_keys` (twice over) with random values; the table's content."""
    rng = np.random.default_rng(seed)
    want = np.zeros(shape)
    for key in itertools.chain(_keys(shape), _keys(shape)):
        value = rng.normal(size=want[key].shape)
        storage.write(spec, key, value)
        want[key] = value
    return want


@pytest.mark.parametrize("shape,chunks", SHAPES)
def test_own_chunk_io_writes_zarrs_bytes_and_zarr_reads_them(tmp_path, shape, chunks, direct, monkeypatch):
    import zarr

    opened = []
    orig = zarr_tables._open_chunk
    monkeypatch.setattr(zarr_tables, "_open_chunk", lambda *a: opened.append(orig(*a)) or opened[-1])
    specs = {}
    for own in (True, False):
        monkeypatch.setattr(zarr_tables, "OWN_IO", own)
        spec = specs[own] = storage.create_table("zarr", tmp_path / str(own), "t", shape, chunks, fit_id="f")
        want = _fill(spec, shape, seed=sum(shape))
        for key in _keys(shape):  # each path reads what either wrote
            for own_read in (True, False):
                monkeypatch.setattr(zarr_tables, "OWN_IO", own_read)
                np.testing.assert_array_equal(storage.read(spec, key), want[key])
        np.testing.assert_array_equal(zarr.open_array(spec.path, mode="r")[...], want)
        storage.verify_table(spec)
    names = _chunk_files(specs[True])
    assert names == _chunk_files(specs[False]) and len(names) == specs[True].n_chunks
    for n in names:  # byte for byte what zarr writes, CRC included
        assert (Path(specs[True].path) / n).read_bytes() == (Path(specs[False].path) / n).read_bytes(), n
    assert Path(specs[True].path + ".crc32c").read_bytes() == Path(specs[False].path + ".crc32c").read_bytes()
    used_direct = any(d for _, d in opened)
    page = specs[True].chunk_nbytes >= direct_io.DIRECT_ALIGN
    dev = os.stat(specs[True].path).st_dev
    assert used_direct == (direct and dev not in direct_io.refused_devices) or not page


def test_bands_from_unaligned_arrays_and_large_chunks_in_pieces(tmp_path, monkeypatch):
    """A band that does not start on a page goes through the bounce buffer, in pieces when a
    chunk is larger than one; the file holds the same bytes."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this system")
    monkeypatch.setattr(direct_io, "DIRECT_IO", True)
    monkeypatch.setattr(direct_io, "DIRECT_PIECE", 8192)
    spec = storage.create_table("zarr", tmp_path, "t", (2, 3, 3000), (1, 1, 3000), fit_id="f")
    raw = np.random.default_rng(0).normal(size=2 * 3 * 3000 + 1)
    value = raw[1:].reshape(2, 3, 3000)  # 8 bytes past wherever raw starts: not page-aligned
    assert value.ctypes.data % direct_io.DIRECT_ALIGN
    storage.write(spec, (Ellipsis,), value)
    np.testing.assert_array_equal(storage.read(spec, (1,)), value[1])
    body = (Path(spec.path) / "c" / "1" / "2" / "0").read_bytes()
    assert body[:-4] == value[1, 2].tobytes() and int.from_bytes(body[-4:], "little") == files.crc32c(value[1, 2])


def test_a_file_system_without_direct_io_falls_back_to_buffered(tmp_path, monkeypatch):
    monkeypatch.setattr(direct_io, "DIRECT_IO", True)
    spec = storage.create_table("zarr", tmp_path, "t", (2, 4, 1024), (1, 1, 1024), fit_id="f")
    dev = os.stat(spec.path).st_dev
    orig = files.open_nofollow

    def no_direct(path, flags, mode=0o644):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return orig(path, flags, mode)

    monkeypatch.setattr(files, "open_nofollow", no_direct)
    monkeypatch.setattr(direct_io, "refused_devices", set())
    want = _fill(spec, (2, 4, 1024), seed=3)
    assert dev in direct_io.refused_devices or not hasattr(os, "O_DIRECT")
    np.testing.assert_array_equal(storage.read(spec, (Ellipsis,)), want)


@pytest.fixture
def table(tmp_path, direct):
    spec = storage.create_table("zarr", tmp_path / "s", "t", (2, 4, 1024), (1, 1, 1024), fit_id="f")
    return spec, _fill(spec, (2, 4, 1024), seed=5)


def _file(spec, *coords):
    return Path(spec.path, "c", *map(str, coords))


@pytest.mark.parametrize("damage", ["truncate", "flip", "flip-and-fix-crc", "missing", "swap"])
def test_damaged_chunk_is_named_and_never_used(table, damage):
    spec, want = table
    f = _file(spec, 1, 2, 0)
    raw = bytearray(f.read_bytes())
    if damage == "truncate":
        f.write_bytes(raw[:-1000])
        expect = "chunk file has 7,196 bytes, expected 8,196"
    elif damage == "flip":
        raw[100] ^= 1
        f.write_bytes(raw)
        expect = "chunk checksum mismatch"
    elif damage == "flip-and-fix-crc":  # the codec's CRC recomputed: the side file still knows
        raw[100] ^= 1
        raw[-4:] = files.crc32c(bytes(raw[:-4])).to_bytes(4, "little")
        f.write_bytes(raw)
        expect = "is not the chunk this fit wrote at this place"
    elif damage == "missing":
        f.unlink()
        expect = "chunk file is missing"
    else:  # two whole chunk files swapped: each intact, each at the wrong place
        g = _file(spec, 1, 3, 0)
        a, b = f.read_bytes(), g.read_bytes()
        f.write_bytes(b)
        g.write_bytes(a)
        expect = "is not the chunk this fit wrote at this place"
    for key in ((1,), (slice(None), 2), (Ellipsis,)):
        with pytest.raises(IntegrityError, match=expect) as ei:
            storage.read(spec, key)
        assert ei.value.path == str(f)
    np.testing.assert_array_equal(storage.read(spec, (0,)), want[0])  # the other band is fine
    storage.write(spec, (1,), want[1])  # a rewrite makes the band whole again
    np.testing.assert_array_equal(storage.read(spec, (Ellipsis,)), want)
    assert not list(Path(spec.path).rglob("*.partial"))


def test_a_symlinked_chunk_is_refused_and_its_target_untouched(table, tmp_path):
    spec, want = table
    f = _file(spec, 0, 1, 0)
    victim = tmp_path / "victim"
    victim.write_bytes(f.read_bytes())  # a perfect copy: only the link is wrong
    before = victim.read_bytes()
    f.unlink()
    os.symlink(victim, f)
    with pytest.raises(IntegrityError, match="is a symbolic link") as ei:
        storage.read(spec, (0,))
    assert ei.value.path == str(f)
    with pytest.raises(IntegrityError, match="is a symbolic link"):
        storage.write(spec, (0,), want[0] + 1)
    assert victim.read_bytes() == before and f.is_symlink()


def test_a_fifo_at_a_chunk_path_is_refused_for_reading_and_replaced_by_a_write(table):
    spec, want = table
    f = _file(spec, 0, 2, 0)
    f.unlink()
    os.mkfifo(f)
    with pytest.raises(IntegrityError, match="not a regular file") as ei:  # no wait for a writer
        storage.read(spec, (0,))
    assert ei.value.path == str(f)
    storage.write(spec, (0,), want[0] + 2)
    assert f.is_file()
    np.testing.assert_array_equal(storage.read(spec, (0,)), want[0] + 2)


def test_a_hard_linked_chunk_is_replaced_not_written_through(table, tmp_path):
    spec, want = table
    f = _file(spec, 0, 1, 0)
    other = tmp_path / "other"
    os.link(f, other)
    before = other.read_bytes()
    storage.write(spec, (0,), want[0] + 1)
    assert other.read_bytes() == before and os.stat(f).st_nlink == 1
    np.testing.assert_array_equal(storage.read(spec, (0,)), want[0] + 1)


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_write_cut_short_leaves_chunks_that_are_refused_then_rewritten(table, monkeypatch, lanes):
    """A band write that stops half-way through its second chunk file (a kill, a full disk):
    the error reaches the caller once every transfer thread has stopped, the torn chunk
    fails its CRC, a chunk written whole before it (its side-file entry not yet written)
    fails its place, a chunk not reached keeps its old bytes; no temporary file is left;
    the next write of the band (what a resume does) makes it whole."""
    spec, want = table
    monkeypatch.setattr(zarr_tables, "LANES", lanes)
    orig = zarr_tables._transfer
    victim = str(_file(spec, 1, 1, 0))

    def torn(fd, write, view, pos, n, f):
        if write and f == victim:
            orig(fd, write, view, pos, n // 2, f)
            raise OSError(errno.ENOSPC, "No space left on device", f)
        orig(fd, write, view, pos, n, f)

    monkeypatch.setattr(zarr_tables, "_transfer", torn)
    new = want[1] + 1
    with pytest.raises(OSError, match="No space left"):
        storage.write(spec, (1,), new)
    monkeypatch.setattr(zarr_tables, "_transfer", orig)
    for key in ((1,), (slice(None), 1), (1, slice(1, 2))):
        with pytest.raises(IntegrityError, match="chunk checksum mismatch") as ei:
            storage.read(spec, key)
        assert ei.value.path == victim
    if lanes == 1:  # chunk 0 written whole before, chunks 2 and 3 not reached
        with pytest.raises(IntegrityError, match="is not the chunk this fit wrote at this place") as ei:
            storage.read(spec, (1, slice(0, 1)))
        assert ei.value.path == str(_file(spec, 1, 0, 0))
        np.testing.assert_array_equal(storage.read(spec, (1, slice(2, 4))), want[1, 2:])
    else:  # chunk 3 comes after the victim on its lane; chunks 0 and 2 are on the other lane
        np.testing.assert_array_equal(storage.read(spec, (1, slice(3, 4))), want[1, 3:])
        for j in (0, 2):
            try:
                np.testing.assert_array_equal(storage.read(spec, (1, slice(j, j + 1))), want[1, j:j + 1])
            except IntegrityError as e:
                assert e.path == str(_file(spec, 1, j, 0)) and e.problem == binding.PLACE_PROBLEM
    # a missing chunk is written to a temporary file: cut short, it is removed
    Path(victim).unlink()
    monkeypatch.setattr(zarr_tables, "_transfer", torn)
    with pytest.raises(OSError, match="No space left"):
        storage.write(spec, (1,), new)
    assert not list(Path(spec.path).rglob("*.partial")) and not Path(victim).exists()
    monkeypatch.setattr(zarr_tables, "_transfer", orig)
    storage.write(spec, (1,), new)
    np.testing.assert_array_equal(storage.read(spec, (1,)), new)
    np.testing.assert_array_equal(storage.read(spec, (0,)), want[0])
    storage.verify_table(spec)


def test_a_read_error_stops_every_lane_and_the_threads_stay_usable(table, monkeypatch):
    spec, want = table
    orig = zarr_tables._transfer
    seen = []

    def failing(fd, write, view, pos, n, f):
        seen.append(f)
        if not write and f.endswith(os.path.join("1", "0", "0")):
            raise OSError(errno.EIO, "Input/output error", f)
        orig(fd, write, view, pos, n, f)

    monkeypatch.setattr(zarr_tables, "_transfer", failing)
    with pytest.raises(OSError, match="Input/output error"):
        storage.read(spec, (1,))
    n = len(seen)
    assert n <= 4  # no chunk read twice, nothing moved once the threads have stopped
    monkeypatch.setattr(zarr_tables, "_transfer", orig)
    for _ in range(3 * memmap.IO_THREADS):  # every transfer thread came back to its pool
        np.testing.assert_array_equal(storage.read(spec, (Ellipsis,)), want)
    assert len(seen) == n


def test_the_side_file_is_written_after_the_chunk_files(table, monkeypatch):
    spec, want = table
    side = binding.side_file(spec)
    seen = []
    orig = zarr_tables._put_chunk

    def spy(s, f, view, crc, d):
        seen.append(int(side[zarr_tables._chunk_id(spec, tuple(map(int, Path(f).parts[-3:])))]))
        orig(s, f, view, crc, d)

    before = np.array(side[[4, 5, 6, 7]])
    monkeypatch.setattr(zarr_tables, "_put_chunk", spy)
    storage.write(spec, (1,), want[1] + 1)
    assert sorted(seen) == sorted(before.tolist())  # while the files were written, the side file held the old ones
    assert (np.array(side[[4, 5, 6, 7]]) != before).all()


def test_fits_through_own_chunk_io_and_through_zarr_are_the_same_bits(tmp_path, monkeypatch):
    """Out of core on zarr tables, own chunk I/O with direct I/O against zarr's own path: the
    same model bit for bit, the same chunk files, and the in-core model to round-off."""
    cards = (2, 3, 4, 5, 2, 3)
    p, _ = datasets.random_bayesnet(cards, 2, seed=3)
    X = datasets.sample_table(p, 300, seed=1)
    ref = FSLL(progress=False, max_iter=6).fit(X)
    monkeypatch.setattr(direct_io, "DIRECT_IO", True)
    fits = {}
    for own in (True, False):
        monkeypatch.setattr(zarr_tables, "OWN_IO", own)
        fits[own] = FSLL(progress=False, store=tmp_path / str(own), backend="zarr", layout=(1, 2),
                         scheduler="serial", max_iter=6).fit(X)
    assert fits[True].theta_ == fits[False].theta_ and fits[True].cost_ == fits[False].cost_
    assert fits[True].n_iter_ == fits[False].n_iter_ == ref.n_iter_ and set(ref.theta_) == set(fits[True].theta_)
    for y, v in ref.theta_.items():  # in core: the same learner, round-off apart
        assert fits[True].theta_[y] == pytest.approx(v, abs=1e-9)
    for name in ("dbar", "thetabar"):
        a, b = tmp_path / "True" / name, tmp_path / "False" / name
        fa = sorted(q.relative_to(a) for q in a.rglob("*") if q.is_file())
        assert fa == sorted(q.relative_to(b) for q in b.rglob("*") if q.is_file())
        assert all((a / q).read_bytes() == (b / q).read_bytes() for q in fa)


_WRITER = """
import pickle, sys
import numpy as np
from fsll_ooc import storage
from fsll_ooc.storage import direct_io
direct_io.DIRECT_IO = sys.argv[2] == "1"
spec = pickle.loads(bytes.fromhex(sys.argv[1]))
i = 0
while True:
    i += 1
    storage.write(spec, (Ellipsis,), np.full(spec.shape, float(1 + i % 2)))
    if i == 2:
        print("writing", flush=True)
"""


def test_sigkill_in_the_middle_of_band_writes_leaves_each_chunk_whole_or_refused(tmp_path, direct):
    """A process rewriting a band over and over (all 1.0, then all 2.0, ...) is killed with
    SIGKILL at a random moment: each chunk then reads as all 1.0 or all 2.0, or is refused
    naming its file (never a mix used); writing the band again makes it whole."""
    import pickle
    import random
    import signal
    import subprocess
    import sys
    import time

    spec = storage.create_table("zarr", tmp_path, "t", (4, 16, 2048), (1, 1, 2048), fit_id="f")
    storage.write(spec, (Ellipsis,), np.full(spec.shape, 2.0))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    child = subprocess.Popen([sys.executable, "-c", _WRITER, pickle.dumps(spec).hex(), "1" if direct else "0"],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "writing"
        time.sleep(random.uniform(0.0, 0.05))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    storage.forget(spec)
    seen = {"1.0": 0, "2.0": 0, "refused": 0}
    for c in itertools.product(range(4), range(16)):
        try:
            got = storage.read(spec, (c[0], slice(c[1], c[1] + 1)))
        except IntegrityError as e:
            assert e.path == str(_file(spec, c[0], c[1], 0)), e
            seen["refused"] += 1
            continue
        assert np.all(got == got.flat[0]) and got.flat[0] in (1.0, 2.0), c
        seen[str(got.flat[0])] += 1
    assert sum(seen.values()) == 64, seen
    assert not list(Path(spec.path).rglob("*.partial"))  # every chunk file existed whole: rewritten in place
    storage.write(spec, (Ellipsis,), np.full(spec.shape, 3.0))
    np.testing.assert_array_equal(storage.read(spec, (Ellipsis,)), 3.0)
    storage.verify_table(spec)
