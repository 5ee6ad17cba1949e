"""Table backends through their common interface, the registry, and the small-file helpers.

Every registered backend (and ``toy``, a backend defined in this file: one ``.npy`` file
per chunk) is run through the same checks; a fit through ``toy`` gives the numpy model,
which shows that a new backend is one new class plus its registration.
"""
import hashlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from fsll_ooc import FSLL, datasets, storage
from fsll_ooc.storage import IntegrityError, TableBackend, TableSpec
from fsll_ooc.storage.base import chunk_slices, key_chunks, normalize_key

ROOT = Path(__file__).resolve().parents[1]


# ============================================================================ a backend in one class

class ChunkFilesBackend(TableBackend):
    """A table is a directory of ``.npy`` files, one per chunk, each replaced atomically."""

    name = "toy"
    persistent = True
    supports_inplace_views = False
    checksummed = False

    def table_path(self, store, name, dtype="float64"):
        return str(Path(store) / f"{name}.chunks")

    def _file(self, spec, coords):
        return os.path.join(spec.path, "_".join(map(str, coords)) + ".npy")

    def _put(self, spec, coords, block):
        f = self._file(spec, coords)
        np.save(f + ".tmp.npy", np.ascontiguousarray(block, dtype=spec.dtype))
        os.replace(f + ".tmp.npy", f)

    def create(self, spec):
        shutil.rmtree(spec.path, ignore_errors=True)
        os.mkdir(spec.path)
        for c in np.ndindex(*spec.grid):
            sl = chunk_slices(spec, c)
            self._put(spec, c, np.zeros([s.stop - s.start for s in sl]))
        return spec

    def open(self, spec):
        if not os.path.isdir(spec.path):
            raise IntegrityError(spec.path, "table directory is missing")
        return spec.path

    def _block(self, spec, key):
        """The chunks ``key`` touches as one block, and ``key`` relative to the block."""
        coords, _ = key_chunks(spec, key)
        lo = [min(c[i] for c in coords) * spec.chunks[i] for i in range(len(spec.shape))]
        hi = [min((max(c[i] for c in coords) + 1) * spec.chunks[i], spec.shape[i]) for i in range(len(spec.shape))]
        block = np.empty([h - l for l, h in zip(lo, hi)], dtype=spec.dtype)
        for c in coords:
            sl = chunk_slices(spec, c)
            block[tuple(slice(s.start - l, s.stop - l) for s, l in zip(sl, lo))] = np.load(self._file(spec, c))
        local = []
        for k, l, n in zip(normalize_key(key, len(spec.shape)), lo, spec.shape):
            if isinstance(k, slice):
                start, stop, _ = k.indices(n)
                local.append(slice(start - l, stop - l))
            else:
                local.append(int(k) + (n if k < 0 else 0) - l)
        return coords, lo, block, tuple(local)

    def read(self, spec, key):
        self.open(spec)
        _, _, block, local = self._block(spec, key)
        return np.array(block[local], order="C")

    def write(self, spec, key, value):
        coords, lo, block, local = self._block(spec, key)
        block[local] = value
        for c in coords:
            self._put(spec, c, block[tuple(slice(s.start - l, s.stop - l) for s, l in zip(chunk_slices(spec, c), lo))])

    def gather(self, spec, flat):
        idx = np.unravel_index(np.asarray(flat), spec.shape)
        out = np.empty(len(flat))
        for i, cell in enumerate(zip(*idx)):
            out[i] = self.read(spec, tuple(int(x) for x in cell))
        return out

    def as_array(self, spec):
        return self.read(spec, (Ellipsis,))


@pytest.fixture(autouse=True, scope="module")
def toy_backend():
    storage.register_backend(ChunkFilesBackend)
    yield
    storage.unregister_backend("toy")


BUILTIN = ("numpy", "memmap", "zarr")
ALL = BUILTIN + ("toy",)
SHAPE, CHUNKS = (3, 4, 5), (1, 4, 5)  # chunks of the planner's form (1, ..., 1, k_c, ..., k_n-1)


def make(backend, tmp_path, name="t", shape=SHAPE, chunks=CHUNKS):
    path = tmp_path / "s" if storage.get_backend(backend).persistent else None
    return storage.create_table(backend, path, name, shape, chunks)


def values(shape=SHAPE, seed=0):
    return np.random.default_rng(seed).random(shape)


def written(backend, tmp_path, seed=0):
    """A new table of ``backend`` holding ``values(seed=seed)``, flushed; and those values."""
    spec = make(backend, tmp_path)
    want = values(seed=seed)
    storage.write(spec, (Ellipsis,), want)
    storage.flush(spec)
    return spec, want


# ============================================================================ registry

def test_registry_lists_the_builtin_backends_in_order_and_refuses_unknown_names():
    assert storage.backend_names()[:3] == BUILTIN
    assert storage.BACKENDS == storage.backend_names()  # the former constant follows the registry
    for name in BUILTIN:
        b = storage.get_backend(name)
        assert isinstance(b, TableBackend) and b.name == name
        for cap in ("persistent", "supports_inplace_views", "checksummed"):
            assert isinstance(getattr(b, cap), bool)
    with pytest.raises(ValueError, match=r"unknown backend 'tape'.*'numpy', 'memmap', 'zarr'"):
        storage.get_backend("tape")
    with pytest.raises(ValueError, match="unknown backend 'tape'"):
        storage.create_table("tape", "/nonexistent", "t", (2,), (2,))


def test_register_backend_checks_what_it_is_given():
    with pytest.raises(TypeError, match="TableBackend subclass"):
        storage.register_backend(dict)

    class Nameless(ChunkFilesBackend):
        name = ""

    with pytest.raises(ValueError, match="needs a name"):
        storage.register_backend(Nameless)

    class Unfinished(TableBackend):  # no read or write
        name = "unfinished"

        def create(self, spec):
            return spec

        def open(self, spec):
            return None

    with pytest.raises(TypeError, match="abstract"):
        storage.register_backend(Unfinished)
    assert not {"", "unfinished"} & set(storage.backend_names())


def test_capabilities_of_the_builtin_backends():
    caps = {n: (b.persistent, b.supports_inplace_views, b.checksummed)
            for n in BUILTIN for b in [storage.get_backend(n)]}
    assert caps == {"numpy": (False, True, False), "memmap": (True, False, True), "zarr": (True, False, True)}


def test_no_dispatch_on_backend_names_in_storage_or_engine():
    pattern = re.compile(r"""backend\s*(==|!=)\s*["']|backend\s+(not\s+)?in\s*\(\s*["']""")
    hits = []
    for folder in ("storage", "engine"):
        for f in sorted((ROOT / "fsll_ooc" / folder).rglob("*.py")):
            hits += [f"{f.name}:{i}" for i, line in enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


# ============================================================================ the common interface

@pytest.mark.parametrize("backend", ALL)
def test_create_gives_zeros_of_the_spec(backend, tmp_path):
    spec = make(backend, tmp_path)
    assert (spec.backend, spec.shape, spec.chunks, spec.dtype) == (backend, SHAPE, CHUNKS, "float64")
    assert spec.backend_impl is storage.get_backend(backend)
    assert spec.grid == (3, 1, 1) and spec.n_chunks == 3
    try:
        got = storage.read(spec, (Ellipsis,))
    except IntegrityError as e:  # allowed: callers write every chunk before reading it
        assert "missing" in str(e) and spec.backend_impl.checksummed
    else:
        assert got.shape == SHAPE and got.flags.c_contiguous and not got.any()
    storage.write(spec, (Ellipsis,), np.zeros(SHAPE))
    assert not storage.read(spec, (Ellipsis,)).any()
    if spec.backend_impl.persistent:
        assert spec.path == storage.table_path(backend, tmp_path / "s", "t") and os.path.exists(spec.path)
        with pytest.raises(ValueError, match="needs a store path"):
            storage.create_table(backend, None, "t", SHAPE, CHUNKS)


@pytest.mark.parametrize("backend", ALL)
def test_bands_and_chunk_keys_read_back_what_was_written(backend, tmp_path):
    spec = make(backend, tmp_path)
    want = values()
    for i in range(SHAPE[0]):  # one chunk per key, as the engine writes them
        storage.write(spec, (i,), want[i].copy())
    assert np.array_equal(storage.read(spec, (Ellipsis,)), want)
    assert np.array_equal(storage.read(spec, (slice(1, 3),)), want[1:3])  # a band of two chunks
    assert np.array_equal(storage.read(spec, (2,)), want[2])
    assert np.array_equal(storage.read(spec, (-1, slice(1, 3))), want[-1, 1:3])  # inside one chunk
    # a key that is not chunk-aligned: the chunks it touches keep their other cells
    part = np.full((2, 2, 5), 7.0)
    storage.write(spec, (slice(0, 2), slice(1, 3)), part)
    want[0:2, 1:3] = part
    assert np.array_equal(storage.read(spec, (Ellipsis,)), want)
    flat = np.array([0, 7, 59, 23, 40])
    assert np.array_equal(storage.gather(spec, flat), want.reshape(-1)[flat])
    assert np.array_equal(np.asarray(storage.as_array(spec)), want)
    assert storage.quiesce(timeout=1.0)


@pytest.mark.parametrize("backend", ALL)
def test_inplace_views_only_where_the_backend_says_so(backend, tmp_path):
    spec = make(backend, tmp_path)
    storage.write(spec, (Ellipsis,), np.zeros(SHAPE))
    band = storage.read(spec, (1,))
    band += 1.0  # a caller that did not ask the capability and did not write back
    aliased = spec.backend_impl.supports_inplace_views
    assert storage.read(spec, (1,)).sum() == (band.size if aliased else 0)
    storage.write(spec, (1,), band)  # writing the view back is always right
    assert storage.read(spec, (1,)).sum() == band.size


@pytest.mark.parametrize("backend", ALL)
def test_flushed_and_synced_tables_reopen_with_their_content(backend, tmp_path):
    spec, want = written(backend, tmp_path, seed=1)
    storage.sync_table(spec)
    storage.check_table(spec)
    storage.verify_table(spec)
    if not spec.backend_impl.persistent:
        with pytest.raises(TypeError, match="cannot be sent to another process"):
            pickle.dumps(spec)
        return
    storage.forget(tmp_path / "s")  # nothing cached: read from the files
    again = pickle.loads(pickle.dumps(spec))  # as a worker process receives it
    assert again.array is None and again == TableSpec(backend, spec.path, SHAPE, CHUNKS)
    assert np.array_equal(storage.read(again, (Ellipsis,)), want)


@pytest.mark.parametrize("backend", ALL)
def test_fingerprints_are_json_and_accept_the_unchanged_table(backend, tmp_path):
    spec = make(backend, tmp_path)
    storage.write(spec, (0,), values()[0])
    fp = storage.table_fingerprint(spec)
    assert json.loads(json.dumps(fp)) == fp
    storage.check_fingerprint(spec, fp)
    assert bool(fp) == spec.backend_impl.checksummed  # the built-in persistent backends record one


def _damage_chunk(spec, coords) -> str:
    """Flip one byte of chunk ``coords`` on disk, knowing the backend's file format; return the file."""
    if spec.backend == "memmap":
        f, off = spec.path, int(np.ravel_multi_index(coords, spec.grid)) * spec.chunk_nbytes + 3
    else:
        import zarr

        arr = zarr.open_array(spec.path, mode="r")
        f = os.path.join(spec.path, *arr.metadata.chunk_key_encoding.encode_chunk_key(coords).split("/"))
        off = 3
    with open(f, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0xFF]))
    return f


@pytest.mark.parametrize("backend", [b for b in BUILTIN if storage.get_backend(b).checksummed])
def test_a_damaged_chunk_is_refused_and_named(backend, tmp_path):
    spec, want = written(backend, tmp_path, seed=2)
    storage.forget(spec)
    f = _damage_chunk(spec, (1, 0, 0))
    storage.forget(spec)
    assert np.array_equal(storage.read(spec, (0,)), want[0])  # other chunks stay readable
    for key in ((1,), (slice(0, 2),), (Ellipsis,), (1, slice(0, 2))):
        with pytest.raises(IntegrityError, match="checksum mismatch") as ei:
            storage.read(spec, key)
        assert ei.value.path == f
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        storage.verify_table(spec)
    storage.check_table(spec)  # the structural check does not read contents
    storage.write(spec, (1,), want[1])  # rewriting the chunk mends it
    storage.verify_table(spec)


@pytest.mark.parametrize("backend", [b for b in BUILTIN if storage.get_backend(b).persistent])
def test_a_truncated_or_missing_table_is_refused_and_named(backend, tmp_path):
    spec, _ = written(backend, tmp_path)
    fp = storage.table_fingerprint(spec)
    victim = Path(spec.path) if spec.backend == "memmap" else next(p for p in Path(spec.path).rglob("*")
                                                                     if p.is_file() and p.name != "zarr.json")
    with open(victim, "r+b") as fh:
        fh.truncate(victim.stat().st_size - 8)
    storage.forget(spec)
    with pytest.raises(IntegrityError, match="bytes, expected") as ei:
        storage.check_table(spec)
        storage.read(spec, (Ellipsis,))
    assert ei.value.path == str(victim)
    if spec.backend == "memmap":
        with pytest.raises(IntegrityError, match="truncated"):
            storage.check_fingerprint(spec, fp)
    shutil.rmtree(tmp_path / "s")
    storage.forget(spec)
    with pytest.raises(IntegrityError, match="missing"):
        storage.check_fingerprint(spec, fp)


@pytest.mark.parametrize("backend", ALL)
def test_overhead_bytes_are_the_checksums_on_disk(backend, tmp_path):
    spec, _ = written(backend, tmp_path)
    impl = spec.backend_impl
    extra = storage.overhead_bytes(backend, SHAPE, CHUNKS)
    assert extra == (impl.checksum_bytes_per_chunk * spec.n_chunks if impl.checksummed else 0)
    if impl.checksummed:
        files = [spec.path, spec.path + ".crc32c"] if backend == "memmap" else \
            [p for p in Path(spec.path).rglob("*") if p.is_file() and p.name != "zarr.json"] + [spec.path + ".crc32c"]
        assert sum(os.path.getsize(f) for f in files) == spec.nbytes + extra


def test_memmap_refuses_chunks_that_are_not_contiguous_runs(tmp_path):
    with pytest.raises(ValueError, match=r"memmap tables need chunks of the form .*\(2, 2, 5\)"):
        storage.create_table("memmap", tmp_path, "t", SHAPE, (2, 2, 5))


def test_zarr_tables_are_checksummed_and_uncompressed(tmp_path):
    import zarr

    spec = make("zarr", tmp_path)
    arr = zarr.open_array(spec.path, mode="r")
    assert [type(c).__name__ for c in arr.metadata.codecs] == ["BytesCodec", "Crc32cCodec"]
    changed = json.loads((Path(spec.path) / "zarr.json").read_text())
    fp = storage.table_fingerprint(spec)
    changed["attributes"] = {"x": 1}
    (Path(spec.path) / "zarr.json").write_text(json.dumps(changed))
    with pytest.raises(IntegrityError, match="metadata changed"):
        storage.check_fingerprint(spec, fp)


def test_remove_leftovers_asks_every_backend(tmp_path):
    class Scratchy(ChunkFilesBackend):
        name = "scratchy"

        def temporary_files(self, store, skip):
            return [str(p) for p in Path(store).glob("*.chunks/*.tmp.npy")]

    storage.register_backend(Scratchy)
    try:
        spec = storage.create_table("scratchy", tmp_path, "t", SHAPE, CHUNKS)
        stray = Path(spec.path) / "0_0_0.npy.tmp.npy"
        stray.write_bytes(b"half")
        keep = tmp_path / "notes.tmp.npy"
        keep.write_bytes(b"mine")
        assert storage.remove_leftovers(tmp_path) == [str(stray)]
        assert keep.exists() and not stray.exists()
    finally:
        storage.unregister_backend("scratchy")


# ============================================================================ a fit through a new backend

def test_a_new_backend_is_one_class_plus_its_registration(tmp_path):
    """``toy`` (defined above, registered by the fixture) runs an out-of-core fit of several
    bands and gives the in-memory model."""
    p, _ = datasets.random_bayesnet((2, 3, 4, 5), 2, seed=5)
    X = datasets.sample_table(p, 800, seed=2)
    ref = FSLL(progress=False, layout=(1, 2)).fit(X)
    m = FSLL(progress=False, store=tmp_path / "s", backend="toy", layout=(1, 2), scheduler="serial").fit(X)
    assert m.plan_.layout.n_a_bands > 1
    assert (tmp_path / "s" / "dbar.chunks").is_dir()
    assert set(m.theta_) == set(ref.theta_) and len(ref.theta_) > 3
    for y, v in ref.theta_.items():
        assert m.theta_[y] == pytest.approx(v, abs=1e-12)
    assert (m.n_iter_, m.cost_) == (ref.n_iter_, pytest.approx(ref.cost_, abs=1e-12))


# ============================================================================ small files

def test_write_bytes_atomic_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    storage.write_bytes_atomic(target, b"old")
    storage.write_bytes_atomic(target, b"new content")
    assert target.read_bytes() == b"new content" and os.listdir(tmp_path) == ["f.bin"]

    def fail(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage.files.os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        storage.write_bytes_atomic(target, b"newer")
    assert target.read_bytes() == b"new content" and os.listdir(tmp_path) == ["f.bin"]


def test_checksummed_json_round_trip_and_refusals(tmp_path):
    f = tmp_path / "state.json"
    obj = {"status": "running", "theta": [[1, 2], 0.5], "n": 3}
    storage.write_json_atomic(f, obj, checksum=True)
    assert storage.read_json(f, checksum=True) == obj
    text = f.read_text()
    f.write_text(text.replace('"running"', '"complete"'))
    with pytest.raises(IntegrityError, match="checksum mismatch") as ei:
        storage.read_json(f, checksum=True)
    assert ei.value.path == str(f)
    f.write_text(text[: len(text) // 2])
    with pytest.raises(IntegrityError, match="not valid JSON"):
        storage.read_json(f, checksum=True)
    storage.write_json_atomic(f, obj)  # no checksum
    assert storage.read_json(f) == obj
    with pytest.raises(IntegrityError, match="has no checksum"):
        storage.read_json(f, checksum=True)
    with pytest.raises(TypeError, match="non-empty dict"):
        storage.write_json_atomic(f, [], checksum=True)


def test_array_files_and_hashes(tmp_path):
    a = np.arange(12, dtype=np.int64).reshape(2, 6)
    f = tmp_path / "a.npy"
    storage.write_bytes_atomic(f, storage.array_file_bytes(a))
    assert np.array_equal(storage.read_array_file(f), a)
    assert storage.file_sha256(f) == "sha256:" + hashlib.sha256(f.read_bytes()).hexdigest()
    f.write_bytes(f.read_bytes()[:40])
    with pytest.raises(IntegrityError, match="cannot be read") as ei:
        storage.read_array_file(f)
    assert ei.value.path == str(f)
    with pytest.raises(FileNotFoundError):
        storage.read_array_file(tmp_path / "none.npy")


def test_fsync_path(tmp_path, monkeypatch):
    f = tmp_path / "x"
    f.write_bytes(b"1")
    storage.fsync_path(f)
    storage.fsync_path(tmp_path, directory=True)
    storage.fsync_path(tmp_path / "missing")  # nothing to sync
    assert storage._fsync_path is storage.fsync_path
    calls = []

    def fsync(fd):
        calls.append(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(storage.files.os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output"):
        storage.fsync_path(f)  # a lost write is reported
    assert len(calls) == 1
