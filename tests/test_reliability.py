"""Nothing lost, nothing crashes: kill points, integrity, locking, disk and memory faults.

The kill-point harness is ``tests/kill_points.py``; ``bench/kill_points.py`` runs its full
sweep (figures in docs/reliability.md); here a handful of its points run in CI on the same
tiny problem.
"""
import errno
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fsll_ooc import FSLL, storage
from fsll_ooc.storage.fit_store import FitStore
from fsll_ooc.storage import lock as locking
from fsll_ooc.storage.lock import StoreLock, StoreLockedError
from fsll_ooc.planner import PlanError
from fsll_ooc.storage import DiskFullError, IntegrityError

from interrupts import Crash, on_persist, stop_after  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = (1, 2)


def _load_harness():
    spec = importlib.util.spec_from_file_location("kill_points", ROOT / "tests" / "kill_points.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


K = _load_harness()


@pytest.fixture(scope="module")
def X():
    return K.make_data()


@pytest.fixture(scope="module")
def ref(X):
    return FSLL(progress=False).fit(X)


def assert_same(m, ref):
    assert set(m.theta_) == set(ref.theta_)
    for y, v in ref.theta_.items():
        assert m.theta_[y] == pytest.approx(v, abs=1e-9)
    assert m.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    assert m.n_iter_ == ref.n_iter_


def status(store):
    return storage.read_json(Path(store) / "fsll_state.json", checksum=True)["status"]


def interrupted_fit(X, store, backend="zarr", after=6, monkeypatch=None):
    """A fit stopped (in-process) right after its ``after``-th state write: status 'running'."""
    stop_after(monkeypatch, after)
    with pytest.raises(Crash):
        FSLL(progress=False, store=store, backend=backend, layout=LAYOUT, scheduler="serial").fit(X)
    monkeypatch.undo()
    assert status(store) == "running"


# ============================================================================ kill points

@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    hs = {}
    yield lambda be: hs.setdefault(be, _prepared(be, tmp_path_factory.mktemp(f"kill-{be}")))
    for h in hs.values():
        h.close()


def _prepared(backend, work):
    h = K.Harness(backend, "serial", work, n_zygotes=1)
    h.prepare()
    return h


def _first(h, pred):
    return next(i for i, ev in enumerate(h.events) if pred(*ev))


@pytest.mark.parametrize("backend", ["zarr", "memmap"])
def test_sigkill_at_chosen_points_then_resume_gives_the_same_model(harness, backend):
    h = harness(backend)
    kinds = {"zarr": "chunk", "memmap": "band"}
    last = len(h.events) - 1
    points = [
        (0, "after"),  # the data file only: nothing started -> clean refusal
        (_first(h, lambda k, d, s: k == kinds[backend] and "dbar" in d and s == "starting"),
         "torn-final" if backend == "zarr" else "torn"),  # in the targets pass
        (_first(h, lambda k, d, s: k == kinds[backend] and "thetabar" in d and s == "running"),
         "torn-final" if backend == "zarr" else "data-no-crc"),  # mid-iteration, table half updated
        (_first(h, lambda k, d, s: k == "file" and "running" in d and s == "running"), "torn-tmp"),
        (last, "before-rename"),  # the 'complete' state written but not yet in place
    ]
    if backend == "memmap":
        points = points[1:3]  # the file points are the same code as for zarr
    outcomes = [h.run_point(i, mode) for i, mode in points]
    for r in outcomes:
        assert r["outcome"] in ("resumed-identical", "refused-not-started"), r
    if backend == "zarr":
        assert outcomes[0]["outcome"] == "refused-not-started"
        assert outcomes[-1]["status_after_kill"] == "running"  # never 'complete' before it is
        assert all(r["outcome"] == "resumed-identical" for r in outcomes[1:])


def test_sigkill_during_resume_then_resume_again(harness):
    import random

    h = harness("zarr")
    i = _first(h, lambda k, d, s: k == "chunk" and "thetabar" in d and s == "running")
    r = h.run_point(i + 20, "after", double=True, rng=random.Random(5))
    assert r["outcome"] == "resumed-identical", r
    assert r["double"]["signal"] == signal.SIGKILL


# ============================================================================ integrity

def _chunk_files(table_dir):
    return sorted(p for p in Path(table_dir).rglob("*") if p.is_file() and p.name != "zarr.json")


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_target_chunk_is_detected_and_named(X, ref, tmp_path, monkeypatch, damage):
    store = tmp_path / "s"
    interrupted_fit(X, store, monkeypatch=monkeypatch)
    victim = _chunk_files(store / "dbar")[3]
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[17] ^= 0x10
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(bytes(data[:-9]))
    else:
        victim.unlink()
    with pytest.raises(IntegrityError) as ei:
        FSLL.resume(store, progress=False)
    msg = str(ei.value)
    assert str(victim) in msg and ei.value.path == str(victim)
    assert {"flip": "checksum", "truncate": "bytes", "delete": "missing"}[damage] in msg
    assert "restart=True" in msg
    assert status(store) == "running"  # never marked complete
    m = FSLL.resume(store, progress=False, restart=True)  # rebuilt from the data kept in the store
    assert_same(m, ref)
    assert status(store) == "complete"


def test_damaged_memmap_table_is_detected_and_named(X, ref, tmp_path, monkeypatch):
    store = tmp_path / "m"
    interrupted_fit(X, store, backend="memmap", monkeypatch=monkeypatch)
    f = store / "dbar.f64"
    a = np.memmap(f, dtype="<f8", mode="r+")
    a[100] += 1e-12  # a silent one-ulp-ish change
    a.flush()
    del a
    with pytest.raises(IntegrityError, match="checksum mismatch in chunk") as ei:
        FSLL.resume(store, progress=False)
    assert ei.value.path == str(f)
    with open(f, "r+b") as fh:
        fh.truncate(1000)
    with pytest.raises(IntegrityError, match="1,000 bytes, expected 5,760") as ei:
        FSLL.resume(store, progress=False)
    assert ei.value.path == str(f)
    (store / "dbar.f64.crc32c").unlink()
    with pytest.raises(IntegrityError, match="dbar.f64"):
        FSLL.resume(store, progress=False)
    assert_same(FSLL.resume(store, progress=False, restart=True), ref)


def test_damaged_thetabar_is_rederived_not_used(X, ref, tmp_path, monkeypatch):
    store = tmp_path / "s"
    interrupted_fit(X, store, monkeypatch=monkeypatch)
    for f in _chunk_files(store / "thetabar")[:2] + _chunk_files(store / "scratch")[:1]:
        f.write_bytes(f.read_bytes()[:10])  # a half-updated dual table: resume re-derives it
    assert_same(FSLL.resume(store, progress=False), ref)


@pytest.mark.parametrize("what", ["state-value", "state-truncated", "metadata", "counts"])
def test_altered_state_metadata_or_data_file_is_refused(X, tmp_path, monkeypatch, what):
    store = tmp_path / "s"
    interrupted_fit(X, store, monkeypatch=monkeypatch)
    sf = store / "fsll_state.json"
    if what == "state-value":
        text = sf.read_text()
        obj = json.loads(text)
        y, v = obj["state"]["theta"][0]
        sf.write_text(text.replace(json.dumps(v), json.dumps(v * 1.5), 1))
        victim, match = sf, "checksum mismatch"
    elif what == "state-truncated":
        sf.write_bytes(sf.read_bytes()[:200])
        victim, match = sf, "not valid JSON"
    elif what == "metadata":
        meta = store / "thetabar" / "zarr.json"
        obj = json.loads(meta.read_text())
        obj["attributes"] = {"edited": True}
        meta.write_text(json.dumps(obj))
        victim, match = meta, "metadata changed"
    else:
        cf = store / "fsll_counts.npy"
        data = bytearray(cf.read_bytes())
        data[-3] ^= 1
        cf.write_bytes(bytes(data))
        victim, match = cf, "checksum"
    with pytest.raises(IntegrityError, match=match) as ei:
        FSLL.resume(store, progress=False)
    assert ei.value.path == str(victim) and str(victim) in str(ei.value)


def test_zarr_metadata_that_does_not_describe_the_table(tmp_path):
    spec = storage.create_table("zarr", tmp_path, "t", (2, 3, 4), (1, 3, 4))
    storage.write(spec, (Ellipsis,), np.ones((2, 3, 4)))
    meta = tmp_path / "t" / "zarr.json"
    obj = json.loads(meta.read_text())
    obj["codecs"] = [c for c in obj["codecs"] if c["name"] != "crc32c"]
    meta.write_text(json.dumps(obj))
    storage.forget(spec)
    with pytest.raises(IntegrityError, match="codecs") as ei:
        storage.read(spec, (0,))
    assert ei.value.path == str(meta)
    meta.write_text("{ not json")
    storage.forget(spec)
    with pytest.raises(IntegrityError, match="cannot be read"):
        storage.read(spec, (0,))


def test_every_chunk_carries_a_checksum_and_the_plan_counts_it(X, tmp_path):
    m = FSLL(progress=False, store=tmp_path / "s", layout=LAYOUT).fit(X)
    import zarr

    fit_id = json.loads((tmp_path / "s" / "fsll_state.json").read_text())["fit_id"]
    for name in ("dbar", "thetabar", "scratch"):
        arr = zarr.open_array(str(tmp_path / "s" / name), mode="r")
        assert [type(c).__name__ for c in arr.metadata.codecs] == ["BytesCodec", "Crc32cCodec"]
        storage.verify_table(storage.TableSpec("zarr", str(tmp_path / "s" / name), arr.shape, arr.chunks,
                                               fit_id=fit_id))
    used = sum(f.stat().st_size for n in ("dbar", "thetabar", "scratch")
               for f in _chunk_files(tmp_path / "s" / n) + [tmp_path / "s" / f"{n}.crc32c"])
    assert used == m.plan_.disk_bytes


def _files(d):
    return {p.relative_to(d): p.read_bytes() for p in sorted(Path(d).rglob("*")) if p.is_file()}


def test_a_directory_that_is_not_a_store_is_left_alone(X, tmp_path):
    """A fit replaces dbar/thetabar/scratch and deletes temporary files: never in a user's directory."""
    home = tmp_path / "home"
    for rel, text in (("scratch/notes.txt", "precious"), ("downloads/film.mp4.partial", "half"),
                      (".report.tmp-1", "draft")):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    before = _files(home)
    for backend in ("zarr", "memmap"):
        with pytest.raises(ValueError, match="not empty and is not an fsll-ooc store"):
            FSLL(progress=False, store=home, backend=backend).fit(X)
    assert _files(home) == before and sorted(p.name for p in home.iterdir()) == [".report.tmp-1", "downloads",
                                                                                  "scratch"]


def test_leftover_cleanup_deletes_only_what_a_fit_writes(X, tmp_path):
    store = tmp_path / "s"
    FSLL(progress=False, store=store, layout=LAYOUT).fit(X)
    ours = [store / "dbar" / "c" / "0.partial", store / ".fsll_state.json.tmp-12-34"]
    theirs = [store / "mine" / "x.partial", store / "notes.partial", store / "mine" / ".a.tmp-1"]
    for f in ours + theirs:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    assert sorted(storage.remove_leftovers(store)) == sorted(map(str, ours))
    assert all(f.exists() for f in theirs) and not any(f.exists() for f in ours)


def test_json_writes_leave_nothing_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "model.json"
    with pytest.raises(TypeError):
        storage.write_json_atomic(target, {"x": object()})
    assert list(tmp_path.iterdir()) == []

    def boom(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage.files.os, "fsync", boom)
    with pytest.raises(OSError):
        storage.write_json_atomic(target, {"x": 1}, checksum=True)
    assert list(tmp_path.iterdir()) == []


# ============================================================================ locking

def _hold_lock_in_child(store):
    code = textwrap.dedent(f"""
        import sys, time
        from fsll_ooc.storage.lock import StoreLock
        lk = StoreLock({str(store)!r}, purpose="fit").acquire()
        print("ready", flush=True)
        time.sleep(120)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    assert p.stdout.readline().strip() == "ready"
    return p


def test_second_writer_is_refused_and_a_killed_holders_lock_is_recovered(X, ref, tmp_path):
    store = tmp_path / "s"
    p = _hold_lock_in_child(store)
    try:
        with pytest.raises(StoreLockedError, match=f"held by pid {p.pid}"):
            FSLL(progress=False, store=store, layout=LAYOUT).fit(X)
        assert not (store / "fsll_state.json").exists()  # refused before touching anything
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    m = FSLL(progress=False, store=store, layout=LAYOUT).fit(X)  # stale lock: recovered
    assert_same(m, ref)
    assert locking.read_holder(store)["state"] == "released"


def test_lock_recovery_is_reported(tmp_path):
    p = _hold_lock_in_child(tmp_path)
    p.send_signal(signal.SIGKILL)
    p.wait()
    with StoreLock(tmp_path) as lk:
        assert lk.recovered is not None and lk.recovered["pid"] == p.pid
    with StoreLock(tmp_path) as lk:
        assert lk.recovered is None  # released cleanly last time


def test_second_writer_in_the_same_process_is_refused(X, tmp_path):
    store = tmp_path / "s"
    with StoreLock(store):
        with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
            FSLL(progress=False, store=store, layout=LAYOUT).fit(X)
        with pytest.raises(StoreLockedError):
            StoreLock(store).acquire(shared=True)  # a reader waits for no writer either


def test_lock_directory_fallback_without_flock(tmp_path, monkeypatch):
    monkeypatch.setattr(locking, "USE_FLOCK", False)
    with StoreLock(tmp_path, purpose="fit") as lk:
        with pytest.raises(StoreLockedError, match="held by pid"):
            StoreLock(tmp_path).acquire()
        assert lk.held
    assert not (tmp_path / locking.LOCK_DIR).exists()
    # a holder that died (pid that is not running) is stale and recovered
    d = tmp_path / locking.LOCK_DIR
    d.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (d / "holder.json").write_text(json.dumps({"pid": dead.pid, "host": __import__("socket").gethostname(),
                                               "state": "held", "start": None}))
    with StoreLock(tmp_path) as lk:
        assert lk.recovered["pid"] == dead.pid
    # a holder on another host is never broken automatically
    d.mkdir()
    (d / "holder.json").write_text(json.dumps({"pid": 1, "host": "elsewhere.invalid", "state": "held"}))
    with pytest.raises(StoreLockedError, match="elsewhere.invalid"):
        StoreLock(tmp_path).acquire()


def test_concurrent_readers_of_a_finished_store(X, ref, tmp_path):
    store = tmp_path / "s"
    FSLL(progress=False, store=store, layout=LAYOUT).fit(X)
    state_before = (store / "fsll_state.json").read_bytes()
    np.save(tmp_path / "p.npy", ref.probabilities())
    code = textwrap.dedent(f"""
        import numpy as np
        from fsll_ooc import FSLL
        ref = np.load({str(tmp_path / 'p.npy')!r})
        for _ in range(3):
            m = FSLL.resume({str(store)!r}, progress=False)
            np.testing.assert_allclose(np.asarray(m.probabilities()), ref, atol=1e-12)
            assert m.sample(50, random_state=1).shape == (50, 6)
        print("ok")
    """)
    cmds = [[sys.executable, "-c", code]] * 3 + [[sys.executable, "-m", "fsll_ooc.cli", "sample", str(store), "-n",
                                                  "20", "--seed", "1"]] * 2  # CLI readers too
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
             for c in cmds]
    m = FSLL.resume(store, progress=False)  # and one in this process, at the same time
    np.testing.assert_allclose(np.asarray(m.probabilities()), ref.probabilities(), atol=1e-12)
    outs = []
    for p in procs:
        out, err = p.communicate()
        assert p.returncode == 0, err[-2000:]
        outs.append(out)
    assert [o.strip() for o in outs[:3]] == ["ok"] * 3
    assert outs[3] == outs[4] and len(outs[3].strip().splitlines()) == 21  # header + 20 rows, the same twice
    assert (store / "fsll_state.json").read_bytes() == state_before  # readers write nothing shared
    del m
    import gc

    gc.collect()
    assert not (store / "readers").exists() or not any((store / "readers").iterdir())


def test_resume_of_a_store_being_written_is_refused(X, tmp_path, monkeypatch):
    store = tmp_path / "s"
    interrupted_fit(X, store, monkeypatch=monkeypatch)
    p = _hold_lock_in_child(store)
    try:
        with pytest.raises(StoreLockedError, match="locked"):
            FSLL.resume(store, progress=False)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()


# ============================================================================ disk full

@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted by the test itself (root only); unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the disk-full tests are skipped")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); disk-full tests skipped")
    try:
        yield mnt
    finally:
        storage.forget(str(mnt))
        import gc

        gc.collect()
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt):
    """Take every free byte of the filesystem; returns the filler file."""
    f = Path(mnt) / "filler"
    with open(f, "ab") as fh:
        block = b"\0" * 65536
        try:
            while True:
                fh.write(block)
                fh.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    with open(f, "ab") as fh:  # and the last few bytes
        try:
            while True:
                fh.write(b"\0")
                fh.flush()
        except OSError:
            pass
    return f


@pytest.mark.parametrize("backend", ["zarr", "memmap"])
def test_disk_full_during_a_pass_is_clear_and_resumable(X, ref, small_disk, monkeypatch, backend):
    store = small_disk / "s"
    on_persist(monkeypatch, 5, lambda: fill(small_disk))
    with pytest.raises(DiskFullError) as ei:
        FSLL(progress=False, store=store, backend=backend, layout=LAYOUT, scheduler="serial").fit(X)
    monkeypatch.undo()
    e = ei.value
    assert e.errno == errno.ENOSPC and isinstance(e, OSError)
    msg = str(e)
    assert str(store) in msg and "free" in msg and "tables take" in msg and "FSLL.resume" in msg
    assert status(store) == "running"
    (small_disk / "filler").unlink()
    assert_same(FSLL.resume(store, progress=False), ref)
    assert status(store) == "complete"


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_disk_full_while_creating_tables_is_clear_and_resumable(X, ref, small_disk, monkeypatch, backend):
    store = small_disk / backend
    orig = storage.create_table

    def create(name, *a, **k):
        if name == backend and not (small_disk / "filler").exists():  # the store's tables, not in memory
            fill(small_disk)
        return orig(name, *a, **k)

    monkeypatch.setattr(storage, "create_table", create)
    with pytest.raises(DiskFullError, match="cannot reserve|No space") as ei:
        FSLL(progress=False, store=store, backend=backend, layout=LAYOUT).fit(X)
    monkeypatch.setattr(storage, "create_table", orig)
    assert "disk full while fitting" in str(ei.value) and "FSLL.resume" in str(ei.value)
    assert status(store) == "starting"
    (small_disk / "filler").unlink()
    assert_same(FSLL.resume(store, progress=False), ref)


def test_disk_full_before_anything_started(X, ref, small_disk, monkeypatch):
    store = small_disk / "z"
    orig = FitStore.begin

    def begin(self, *a, **k):  # the disk fills up just before the data file is written
        fill(small_disk)
        return orig(self, *a, **k)

    monkeypatch.setattr(FitStore, "begin", begin)
    with pytest.raises(DiskFullError, match="nothing was started"):
        FSLL(progress=False, store=store, layout=LAYOUT).fit(X)
    monkeypatch.undo()
    assert not (store / "fsll_state.json").exists()
    assert not [p for p in store.iterdir() if p.name.startswith(".")]  # no temporary files left
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        FSLL.resume(store)
    (small_disk / "filler").unlink()
    assert_same(FSLL(progress=False, store=store, layout=LAYOUT).fit(X), ref)


def test_store_larger_than_the_disk_is_refused_before_allocation(small_disk):
    X = np.zeros((10, 19), dtype=int)  # 3 tables x 2^19 x 8 B = 12 MiB on a 2 MiB disk
    store = small_disk / "big"
    with pytest.raises(PlanError, match="of disk but only"):
        FSLL(cardinalities=[2] * 19, store=store, progress=False).fit(X)
    assert not store.exists()


# ============================================================================ memory

def test_memory_limit_that_cannot_be_met_is_refused_before_allocation(tmp_path):
    import psutil

    rss0 = psutil.Process().memory_info().rss
    X = np.zeros((10, 34), dtype=int)  # 2^34 cells: 128 GiB per table
    for limit in ("64MiB", "450MiB"):
        with pytest.raises(PlanError, match="infeasible|memory"):
            FSLL(cardinalities=[2] * 34, store=tmp_path / "s", memory_limit=limit, progress=False).fit(X)
    with pytest.raises(PlanError, match="do not fit in memory"):
        FSLL(cardinalities=[2] * 34, progress=False).fit(X)  # in core
    assert not (tmp_path / "s").exists()
    assert psutil.Process().memory_info().rss - rss0 < 200 * 2**20


# ============================================================================ the same faults through the CLI

from test_hostile import assert_one_line_error, run_cli  # noqa: E402 (tests/ is on sys.path)


def _csv(X, path):
    path.write_text(",".join(f"v{i}" for i in range(X.shape[1])) + "\n"
                    + "".join(",".join(map(str, row)) + "\n" for row in X))
    return path


def test_cli_fit_on_a_store_being_written_is_refused(X, tmp_path):
    store, out = tmp_path / "s", tmp_path / "m.json"
    p = _hold_lock_in_child(store)
    try:
        rc, _, err = run_cli("fit", _csv(X, tmp_path / "d.csv"), "--out", out, "--store", store, "--quiet")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert_one_line_error(rc, err, "second writer")
    assert f"held by pid {p.pid}" in err and not out.exists()


def test_cli_disk_full_during_a_fit_then_resume(X, small_disk, tmp_path, monkeypatch):
    store, out = small_disk / "s", tmp_path / "m.json"
    on_persist(monkeypatch, 5, lambda: fill(small_disk))
    rc, _, err = run_cli("fit", _csv(X, tmp_path / "d.csv"), "--out", out, "--store", store, "--quiet",
                         "--epsilon", "1e-4")
    monkeypatch.undo()
    assert_one_line_error(rc, err, "disk full")
    assert "disk full" in err and f"fsll-ooc resume {store}" in err and not out.exists()  # in the CLI's words
    assert status(store) == "running"
    (small_disk / "filler").unlink()
    # the command line reads the codes as labels: their basis order is the canonical one
    assert_same(FSLL.resume(store, progress=False), FSLL(epsilon=1e-4, progress=False, category_order="frequency").fit(X))
    rc, stdout, _ = run_cli("info", store)  # the finished store serves as MODEL
    assert rc == 0 and "bases" in stdout


def test_cli_store_larger_than_the_disk_is_refused(small_disk, tmp_path):
    data = _csv(np.zeros((10, 19), dtype=int), tmp_path / "d.csv")
    rc, _, err = run_cli("fit", data, "--out", tmp_path / "m.json", "--store", small_disk / "big",
                         "--cardinalities", ",".join(["2"] * 19))
    assert_one_line_error(rc, err, "larger than the disk")
    assert "disk" in err and not (small_disk / "big").exists()
