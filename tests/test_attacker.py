"""A store and model files under attack: what a hostile user can do to them, and what is refused.

Each test plays the attacker (a second writer, swapped or foreign chunks, planted symlinks,
model files that load but lie) and asserts the promise of docs/reliability.md that it tries
to break.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from fsll_ooc import FSLL
from fsll_ooc.storage.fit_store import READERS_DIR, FitStore

LAYOUT = (1, 2)


def data(seed=0, n=300, cards=(2, 3, 4, 2)):
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, k, n) for k in cards], axis=1)


def store_bytes(store: Path) -> dict:
    """Digest of every file of the store except the lock's record and readers' private scratch."""
    out = {}
    for dp, dirs, files in os.walk(store):
        dirs[:] = [d for d in dirs if d != READERS_DIR]
        for f in files:
            if f.startswith("fsll.lock"):
                continue
            p = Path(dp) / f
            out[str(p.relative_to(store))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize("backend", ["zarr", "memmap"])
def test_fitted_model_never_writes_the_store_without_its_lock(tmp_path, backend):
    store = tmp_path / "s"
    m = FSLL(progress=False, store=store, backend=backend, layout=LAYOUT, scheduler="serial").fit(data())
    before = store_bytes(store)
    with FitStore(store, backend).writing("fit", "fitting"):  # another writer holds the lock
        a = m.marginal([0, 2])
        b = m.marginal([0, 2])
        p = np.asarray(m.probabilities())
    assert np.array_equal(a, b)
    assert np.allclose(a, p.sum(axis=(1, 3)))
    assert store_bytes(store) == before  # not one byte of the store's tables changed


@pytest.mark.parametrize("version", [1, 2])
def test_default_memory_follows_the_cgroup_limit(tmp_path, monkeypatch, version):
    from fsll_ooc import machine

    proc = tmp_path / "cgroup"
    if version == 2:
        proc.write_text("0::/box\n")
        (tmp_path / "box").mkdir()
        limit_file = tmp_path / "box" / "memory.max"
    else:
        proc.write_text("9:name=systemd:/\n4:memory:/box\n")
        (tmp_path / "memory" / "box").mkdir(parents=True)
        limit_file = tmp_path / "memory" / "box" / "memory.limit_in_bytes"
    limit_file.write_text(f"{512 << 20}\n")
    monkeypatch.setattr(machine, "PROC_CGROUP", str(proc))
    monkeypatch.setattr(machine, "CGROUP_ROOT", str(tmp_path))
    assert machine.cgroup_memory_limit() == 512 << 20
    assert machine.total_memory() == 512 << 20
    limit_file.write_text("max\n" if version == 2 else "9223372036854771712\n")  # no limit
    assert machine.cgroup_memory_limit() is None
    assert machine.total_memory() == machine._physical_memory()


def test_resume_takes_a_memory_limit(tmp_path):
    store = tmp_path / "s"
    X = data(1)
    ref = FSLL(progress=False, store=store, layout=LAYOUT, scheduler="serial", max_iter=2).fit(X)
    m = FSLL.resume(store, progress=False, memory_limit="2GiB")
    assert m.memory_limit == "2GiB" and m.theta_ == ref.theta_


@pytest.fixture(scope="module")
def model_obj(tmp_path_factory):
    import json

    path = tmp_path_factory.mktemp("model") / "m.json"
    X = data(2)
    X[:, 1] = X[:, 0]  # a dependence: the model has parameters
    FSLL(progress=False).fit(X).save(path)
    return json.loads(path.read_text())


@pytest.mark.parametrize("lie", ["zero_index", "log_z_huge", "log_z_inf", "card_float", "card_string",
                                 "version_true", "version_zero", "duplicate_index"])
def test_model_files_that_load_but_lie_are_refused(model_obj, tmp_path, lie):
    import copy
    import json

    obj = copy.deepcopy(model_obj)
    if lie == "zero_index":
        obj["theta"].append([[0] * len(obj["cardinalities"]), 0.75])
    elif lie == "log_z_huge":
        obj["log_z"] = 1e308
    elif lie == "log_z_inf":
        obj["log_z"] = float("inf")
    elif lie == "card_float":
        obj["cardinalities"][0] = 2.5
    elif lie == "card_string":
        obj["cardinalities"][0] = "22222"
    elif lie == "version_true":
        obj["version"] = True
    elif lie == "version_zero":
        obj["version"] = 0
    else:
        obj["theta"].append(copy.deepcopy(obj["theta"][0]))
    path = tmp_path / "lie.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(ValueError, match="lie.json"):
        FSLL.load(path)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(model_obj))
    FSLL.load(good)  # the untouched file still loads


@pytest.mark.parametrize("backend", ["zarr", "memmap"])
def test_a_planted_lock_symlink_is_refused_and_its_victim_untouched(tmp_path, backend):
    from fsll_ooc.storage import IntegrityError

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    store = tmp_path / "s"
    store.mkdir()
    os.symlink(victim, store / "fsll.lock")  # ln -s victim store/fsll.lock
    with pytest.raises(IntegrityError, match=r"fsll\.lock: is a symbolic link"):
        FSLL(progress=False, store=store, backend=backend, layout=LAYOUT, scheduler="serial").fit(data())
    assert victim.read_text() == "precious\n"


def test_a_planted_temporary_symlink_is_not_followed(tmp_path):
    import threading

    from fsll_ooc.storage import files

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "state.json"
    os.symlink(victim, tmp_path / f".state.json.tmp-{os.getpid()}-{threading.get_ident()}")
    files.write_bytes_atomic(target, b"new")
    assert target.read_bytes() == b"new" and not target.is_symlink()
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("lie", ["below_zero", "rising", "nan_cost", "theta_inf", "log_z_nan"])
def test_a_learner_running_away_stops_naming_the_store(tmp_path, lie):
    import json

    from fsll_ooc.learn import FitState
    from fsll_ooc.planner import plan
    from fsll_ooc.storage import IntegrityError

    fs = FitStore(tmp_path / "s", "zarr")
    p = fs.account(plan((2, 3), out_of_core=True))
    state = FitState((2, 3), 5, 0.5)
    with fs.writing("fit", "fitting", p):
        fs.begin(p, {"epsilon": 1e-4, "max_iter": None, "resync_every": 256}, None, np.array([0, 4]),
                 np.array([3, 2]), state)
        state.history = [{"cost": 1.0}, {"cost": 0.9}]
        state.theta, state.dbar = {4: 0.3}, {4: 0.6}
        fs.checkpoint(state)  # sane steps are kept
        state.history.append({"cost": {"below_zero": -0.5, "rising": 0.95, "nan_cost": float("nan")}.get(lie, 0.8)})
        if lie == "theta_inf":
            state.theta[5] = float("inf")
        elif lie == "log_z_nan":
            state.log_z = float("nan")
        with pytest.raises(IntegrityError, match=f"{tmp_path / 's'}: the learner stopped") as e:
            fs.checkpoint(state)
        assert "restart=True" in str(e.value)
    kept = json.loads((tmp_path / "s" / "fsll_state.json").read_text())
    assert kept["status"] == "running" and len(kept["state"]["history"]) == 2  # the runaway step is not kept


@pytest.mark.parametrize("backend", ["zarr", "memmap"])
def test_inconsistent_target_duals_stop_the_fit_instead_of_running_away(tmp_path, monkeypatch, backend):
    """Targets rewritten through the library's own writes (valid checksums): duals no
    distribution has.  Without the invariants the resumed fit ran away (hundreds of
    iterations, the cost below -600, then infinite)."""
    import json

    import interrupts

    from fsll_ooc import storage
    from fsll_ooc.storage import IntegrityError

    store = tmp_path / "s"
    X = data(0)
    X[:, 1], X[:, 3] = X[:, 0], X[:, 2] % 2  # dependences: the fit has iterations left when stopped
    interrupts.stop_after(monkeypatch, 4)
    with pytest.raises(interrupts.Crash):
        FSLL(progress=False, store=store, backend=backend, layout=LAYOUT, scheduler="serial", epsilon=1e-4).fit(X)
    monkeypatch.undo()
    fs = FitStore(store)
    stored = fs.read()
    n_iter = stored.state["n_iter"]
    chunks = json.loads((store / "fsll_state.json").read_text())["chunks"]
    dbar = fs.open_tables(stored.state["cards"], chunks)[0]
    v = np.full(dbar.shape, -0.95)
    v.flat[0] = 1.0
    storage.write(dbar, tuple(slice(None) for _ in dbar.shape), v)
    storage.flush(dbar)
    storage.forget(dbar)
    with pytest.raises(IntegrityError, match=f"{store}: the learner stopped at iteration {n_iter + 1}"):
        FSLL.resume(store, progress=False)
    kept = FitStore(store).read()
    assert kept.status == "running" and kept.state["n_iter"] == n_iter  # the last sane step
    assert all(h["cost"] >= 0 for h in kept.state["history"])


# --------------------------------------------------------------------------- chunks bound to their place
def interrupted_fit(store, monkeypatch, backend, seed=0, stop=4):
    """A fit stopped after its ``stop``-th state write (status ``running``, iterations left)."""
    import interrupts

    X = data(seed)
    X[:, 1], X[:, 3] = X[:, 0], X[:, 2] % 2
    interrupts.stop_after(monkeypatch, stop)
    with pytest.raises(interrupts.Crash):
        FSLL(progress=False, store=store, backend=backend, layout=LAYOUT, scheduler="serial", epsilon=1e-4).fit(X)
    monkeypatch.undo()
    return X


def chunk_files(store, backend, table):
    """The chunks of ``table`` as (file, offset, size): zarr chunk files, or memmap bands."""
    if backend == "zarr":
        return [(p, 0, p.stat().st_size) for p in sorted((store / table / "c").rglob("*")) if p.is_file()]
    import json

    st = json.loads((store / "fsll_state.json").read_text())
    size = 8 * int(np.prod(st["chunks"]))
    path = store / f"{table}.f64"
    return [(path, i, size) for i in range(0, path.stat().st_size, size)]


def read_part(part):
    path, off, size = part
    with open(path, "rb") as fh:
        fh.seek(off)
        return fh.read(size)


def write_part(part, data, crc=None):
    """Write ``data`` over chunk ``part`` (and, for a memmap band, its side-file entry ``crc``)."""
    path, off, size = part
    with open(path, "r+b") as fh:
        fh.seek(off)
        fh.write(data)
    if crc is not None:
        with open(str(path) + ".crc32c", "r+b") as fh:
            fh.seek(4 * (off // size))
            fh.write(crc)


def side_entry(part):
    path, off, size = part
    if path.suffix != ".f64":
        return None
    with open(str(path) + ".crc32c", "rb") as fh:
        fh.seek(4 * (off // size))
        return fh.read(4)


@pytest.mark.parametrize("backend", ["zarr", "memmap"])
@pytest.mark.parametrize("damage", ["swap", "move", "foreign"])
def test_swapped_moved_or_foreign_chunks_are_refused_by_name(tmp_path, monkeypatch, backend, damage):
    """Every chunk passes its own CRC; only the binding to table, position and fit tells them apart."""
    from fsll_ooc.storage import IntegrityError

    store = tmp_path / "s"
    interrupted_fit(store, monkeypatch, backend)
    dbar = chunk_files(store, backend, "dbar")
    if damage == "swap":  # two chunks of a table change places, each with its own checksum
        a, b = next((a, b) for a in dbar for b in dbar if read_part(a) != read_part(b))
        da, db, ca, cb = read_part(a), read_part(b), side_entry(a), side_entry(b)
        write_part(a, db, cb)
        write_part(b, da, ca)
        victim = a
    elif damage == "move":  # a chunk of another table (with its checksum) put in place of one of dbar's
        theta = chunk_files(store, backend, "thetabar")
        i = next(i for i in range(len(dbar)) if read_part(dbar[i]) != read_part(theta[i]))
        write_part(dbar[i], read_part(theta[i]), side_entry(theta[i]))
        victim = dbar[i]
    else:  # the whole table (and its checksums) copied from another fit with the same cardinalities
        other = tmp_path / "other"
        interrupted_fit(other, monkeypatch, backend, seed=1)
        import interrupts

        name = interrupts.copy_table(other, store, backend, "dbar")
        victim = (store / name, 0, 0)
    where = str(victim[0]) if backend == "zarr" or damage == "foreign" else str(store / "dbar.f64")
    with pytest.raises(IntegrityError, match="restart=True") as e:
        FSLL.resume(store, progress=False)
    msg = str(e.value)
    assert msg.startswith(str(store / ("dbar" if backend == "zarr" else "dbar.f64"))) and "\n" not in msg
    if backend == "zarr" and damage != "foreign":
        assert msg.startswith(where + ":")
    assert "not the chunk this fit wrote at this place" in msg or "checksum mismatch" in msg
    m = FSLL.resume(store, progress=False, restart=True)  # rebuilt from the data kept in the store
    assert m.n_iter_ > 0 and np.isfinite(m.cost_)


def test_a_store_from_before_bound_checksums_is_refused_then_rebuilt(tmp_path, monkeypatch):
    import json

    from fsll_ooc import storage
    from fsll_ooc.storage import IntegrityError

    store = tmp_path / "s"
    X = interrupted_fit(store, monkeypatch, "zarr")
    obj = json.loads((store / "fsll_state.json").read_text())
    obj.pop("checksum")
    obj.pop("fit_id")
    obj["version"] = 1
    storage.write_json_atomic(store / "fsll_state.json", obj, checksum=True)
    with pytest.raises(IntegrityError, match=r"fsll_state\.json: written by an older fsll-ooc .*restart=True"):
        FSLL.resume(store, progress=False)
    m = FSLL.resume(store, progress=False, restart=True)
    ref = FSLL(progress=False, store=tmp_path / "ref", layout=LAYOUT, scheduler="serial", epsilon=1e-4).fit(X)
    assert m.theta_ == ref.theta_ and m.n_iter_ == ref.n_iter_


@pytest.mark.parametrize("marker", ["file", "symlink", "directory"])
def test_a_planted_lock_marker_does_not_make_a_directory_a_store(tmp_path, marker):
    from fsll_ooc.storage import IntegrityError

    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("precious\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock = home / "fsll.lock"
    if marker == "file":
        lock.write_text("")
    elif marker == "symlink":
        os.symlink(victim, lock)
    else:
        lock.mkdir()
    est = FSLL(progress=False, store=home, layout=LAYOUT, scheduler="serial")
    want = {"file": "not empty and is not an fsll-ooc store", "symlink": r"fsll\.lock: is a symbolic link",
            "directory": r"fsll\.lock is not a regular file"}[marker]
    with pytest.raises((ValueError, IntegrityError), match=want):
        est.fit(data())
    assert (home / "notes.txt").read_text() == "precious\n" and victim.read_text() == "precious\n"
    assert sorted(p.name for p in home.iterdir()) == ["fsll.lock", "notes.txt"]


def test_a_directory_holding_only_a_lock_is_a_store_killed_before_it_started(tmp_path):
    store = tmp_path / "s"
    store.mkdir()
    (store / "fsll.lock").write_text("")  # what a fit killed before it kept its data leaves
    m = FSLL(progress=False, store=store, layout=LAYOUT, scheduler="serial").fit(data())
    assert FitStore(store).read().status == "complete" and np.isfinite(m.cost_)


@pytest.mark.parametrize("where", ["table", "chunk_dir", "readers"])
def test_a_planted_directory_link_in_a_zarr_store_is_not_written_through(tmp_path, monkeypatch, where):
    """zarr writes a chunk to a temporary file next to it and renames it: a linked table or
    chunk directory would put the store's files in the link's target."""
    import shutil

    from fsll_ooc.storage import IntegrityError

    store = tmp_path / "s"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if where == "readers":
        FSLL(progress=False, store=store, layout=LAYOUT, scheduler="serial").fit(data())
        os.symlink(elsewhere, store / "readers")
        with pytest.raises(IntegrityError, match=r"readers: is a symbolic link"):
            FSLL.resume(store, progress=False)
        assert list(elsewhere.iterdir()) == []
        return
    interrupted_fit(store, monkeypatch, "zarr")
    if where == "table":
        target = store / "thetabar"
    else:
        target = next(p for p in (store / "thetabar" / "c").iterdir() if p.is_dir())
    shutil.copytree(target, elsewhere / "t")
    shutil.rmtree(target)
    os.symlink(elsewhere / "t", target)
    before = {p: p.read_bytes() for p in (elsewhere / "t").rglob("*") if p.is_file()}
    with pytest.raises(IntegrityError, match="is a symbolic link"):
        FSLL.resume(store, progress=False)
    assert {p: p.read_bytes() for p in (elsewhere / "t").rglob("*") if p.is_file()} == before
