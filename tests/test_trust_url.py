"""A store given by URL is bound like a local one: chunk objects swapped, moved or copied from
another fit are refused by name, on an S3-compatible server started here (moto); and worker
processes that keep tables open never write a new fit's table through an old one's handle."""
import numpy as np
import pytest

from fsll_ooc import FSLL, storage
from fsll_ooc.storage import IntegrityError
from fsll_ooc.storage.fit_store import FitStore
from fsll_ooc.storage.url_store import URLRoot

from interrupts import Crash, stop_after
from test_url_store import KW, _data, _same_model, client, s3  # noqa: F401 - the server and cluster fixtures

CARDS = (2, 3, 4, 5, 2, 3)


def _interrupted(s3, name, monkeypatch):
    """A fit into ``s3://bucket/NAME`` stopped after its second iteration; its root and dbar spec."""
    stop_after(monkeypatch, 4)
    with pytest.raises(Crash):
        FSLL(store=f"s3://bucket/{name}", storage_options=s3, **KW).fit(_data())
    monkeypatch.undo()
    root = URLRoot(f"s3://bucket/{name}", s3)
    state = root.read_json("fsll_state.json")
    spec = root.table_spec("zarr", "dbar", CARDS, state["chunks"], fit_id=state["fit_id"])
    return root, spec


def _object(root, spec, table, coords):
    return f"{root.path}/{table}/c/" + "/".join(map(str, coords))


def _two_chunks(spec):
    """Two chunks of ``spec`` whose values differ (a swap that changes the table)."""
    grid = list(np.ndindex(*spec.grid))
    return grid[0], grid[-1]


def test_swapped_dbar_chunk_objects_are_refused_by_name_at_once(s3, monkeypatch):
    root, spec = _interrupted(s3, "swap", monkeypatch)
    a, b = _two_chunks(spec)
    pa, pb = _object(root, spec, "dbar", a), _object(root, spec, "dbar", b)
    da, db = root.fs.cat_file(pa), root.fs.cat_file(pb)
    assert da != db
    root.fs.pipe({pa: db, pb: da})
    with pytest.raises(IntegrityError) as e:
        FSLL.resume("s3://bucket/swap", storage_options=s3)
    msg = str(e.value)
    assert "dbar/c/" in msg and "is not the chunk this fit wrote at this place" in msg and "restart=True" in msg, msg
    assert FitStore("s3://bucket/swap", storage_options=s3).read().state["n_iter"] == 2  # nothing continued
    m = FSLL.resume("s3://bucket/swap", storage_options=s3, restart=True)
    local = FSLL(store=None, **KW).fit(_data())
    assert m.theta_ == local.theta_ and m.n_iter_ == local.n_iter_


@pytest.mark.parametrize("damage", ["moved from thetabar", "copied from another fit"])
def test_moved_or_foreign_chunk_objects_are_refused_by_name(s3, monkeypatch, damage):
    name = "moved" if damage.startswith("moved") else "foreign"
    root, spec = _interrupted(s3, name, monkeypatch)
    c = _two_chunks(spec)[0]
    if damage.startswith("moved"):
        src = _object(root, spec, "thetabar", c)
    else:
        other, _ = _interrupted(s3, name + "-other", monkeypatch)  # the same data, another fit id
        src = _object(other, spec, "dbar", c)
    root.fs.pipe_file(_object(root, spec, "dbar", c), root.fs.cat_file(src))
    with pytest.raises(IntegrityError, match=r"s3://bucket/\w+/dbar/c/[0-9/]+: chunk checksum mismatch: .*is not the chunk this fit "
                                             r"wrote at this place"):
        storage.read(spec, storage.base.chunk_slices(spec, c))
    with pytest.raises(IntegrityError, match="is not the chunk this fit wrote"):
        FSLL.resume(f"s3://bucket/{name}", storage_options=s3)


def test_partial_keys_gathers_and_dask_arrays_read_through_the_checks(s3):
    root = URLRoot("s3://bucket/table", s3)
    spec = root.create_table("zarr", "t", (5, 6), (2, 4), fit_id="f")
    want = np.arange(30, dtype=float).reshape(5, 6)
    storage.write(spec, (slice(None), slice(None)), want)
    storage.write(spec, (slice(1, 4), slice(2, 5)), -np.ones((3, 3)))  # parts of four chunks
    want[1:4, 2:5] = -1
    np.testing.assert_array_equal(storage.read(spec, (slice(None), slice(None))), want)
    flat = np.array([0, 7, 29, 14, 7])
    np.testing.assert_array_equal(storage.gather(spec, flat), want.reshape(-1)[flat])
    np.testing.assert_array_equal(np.asarray(storage.as_array(spec)), want)
    p = f"{root.path}/t/c/0/0"
    data = root.fs.cat_file(p)
    root.fs.pipe_file(p, data[:8] + bytes([data[8] ^ 1]) + data[9:])
    for read in (lambda: storage.gather(spec, flat), lambda: np.asarray(storage.as_array(spec))):
        with pytest.raises(IntegrityError, match="t/c/0/0: chunk checksum mismatch"):
            read()


@pytest.mark.parametrize("backend", ["memmap", "zarr", "s3"])
def test_worker_processes_never_write_a_new_fit_through_an_old_handle(s3, client, tmp_path, monkeypatch, backend):
    """Two fits into one store on a cluster of two worker processes (which keep tables and
    checksum files open between tasks), then a third stopped midway and resumed: every table
    verifies, and the models are those of the same fits in memory."""
    store = f"s3://bucket/workers-{tmp_path.name}" if backend == "s3" else str(tmp_path / "s")
    kw = dict(KW, store=store, scheduler=client, backend="zarr" if backend == "s3" else backend,
              storage_options=s3 if backend == "s3" else None)
    X2 = _data(seed=1)
    FSLL(**kw).fit(_data())
    second = FSLL(**kw).fit(X2)
    in_memory = FSLL(**KW).fit(X2)
    assert second.theta_ == in_memory.theta_
    fs = FitStore(store, storage_options=kw["storage_options"])
    state = fs.read()
    for name in ("dbar", "thetabar"):
        spec = fs.io.table_spec(state.backend, name, CARDS, second.plan_.layout.chunk_shape, fit_id=fs._meta["fit_id"])
        storage.verify_table(spec)
    stop_after(monkeypatch, 4)
    with pytest.raises(Crash):
        FSLL(**kw).fit(_data(seed=2))
    monkeypatch.undo()
    resumed = FSLL.resume(store, scheduler=client, storage_options=kw["storage_options"])
    _same_model(resumed, FSLL(**KW).fit(_data(seed=2)), exact=False)


def test_a_writer_whose_lease_was_taken_over_writes_no_chunk(s3, monkeypatch):
    """Writer A stops renewing (stopped, say); B takes the stale lease over; A's next band
    write is refused before any chunk object is sent, and B's table keeps B's values."""
    from fsll_ooc.planner import plan
    from fsll_ooc.storage import url_store
    from fsll_ooc.storage.lock import StoreLockedError
    from fsll_ooc.storage.url_store import ObjectLock

    a = FitStore("s3://bucket/lease", "zarr", storage_options=s3)
    p = a.account(plan((4, 6), out_of_core=True))
    with a.writing("fit", "fitting", p):
        spec = a.create_tables((4, 6), (2, 3))[1]
        assert spec.lease
        storage.write(spec, (slice(None), slice(None)), np.ones((4, 6)))
        a._lock._stop.set()  # A stops renewing its lease
        later = url_store._now() + url_store.LEASE + url_store.CLOCK_SLACK + 1
        monkeypatch.setattr(url_store, "_now", lambda: later)
        b = ObjectLock(URLRoot("s3://bucket/lease", s3)).acquire()  # the stale lease taken over
        b_spec = spec.__class__(**{**spec.__dict__, "lease": b.lease_token})
        storage.write(b_spec, (slice(None), slice(None)), np.full((4, 6), 2.0))
        with pytest.raises(StoreLockedError, match="lease on the store ran out and was taken over"):
            storage.write(spec, (slice(0, 2), slice(0, 3)), np.zeros((2, 3)))
        np.testing.assert_array_equal(storage.read(spec, (slice(None), slice(None))), np.full((4, 6), 2.0))
        b.release()


URL_DAMAGES = ("swap", "move", "truncate", "replace", "foreign")


@pytest.fixture(scope="module")
def url_stores(s3):
    """The store fuzz's fit on the S3 server: the uninterrupted model, a stopped fit, another fit's store."""
    from test_store_fuzz import LAYOUT, data

    mp = pytest.MonkeyPatch()
    kw = dict(progress=False, backend="zarr", layout=LAYOUT, scheduler="serial", epsilon=1e-4, storage_options=s3)
    ref = FSLL(store="s3://bucket/fuzz-ref", **kw).fit(data(0))
    for name, seed in (("fuzz-stopped", 0), ("fuzz-other", 1)):
        stop_after(mp, 4)
        with pytest.raises(Crash):
            FSLL(store=f"s3://bucket/{name}", **kw).fit(data(seed))
        mp.undo()
    return ref, URLRoot("s3://bucket/fuzz-stopped", s3)


@pytest.mark.parametrize("kind", URL_DAMAGES)
def test_a_damaged_url_store_resumes_to_the_same_model_or_is_refused_by_name(s3, url_stores, kind):
    """The store fuzz (``tests/test_store_fuzz.py``) on chunk objects: drawn damages to a copy
    of the stopped fit; each resumes to exactly the uninterrupted model or is refused with one
    line naming an object of the store."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    ref, stopped = url_stores
    fs = stopped.fs
    counter = [0]

    @settings(max_examples=3, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(draw=st.data())
    def run(draw):
        counter[0] += 1
        url = f"s3://bucket/fuzz-{kind}-{counter[0]}"
        root = URLRoot(url, s3)
        fs.copy(stopped.path, root.path, recursive=True)
        table = draw.draw(st.sampled_from(("dbar", "thetabar", "scratch")))
        objects = sorted(fs.find(f"{root.path}/{table}/c"))
        i = draw.draw(st.integers(0, len(objects) - 1))
        if kind == "swap":
            j = draw.draw(st.integers(0, len(objects) - 1))
            a, b = fs.cat_file(objects[i]), fs.cat_file(objects[j])
            fs.pipe({objects[i]: b, objects[j]: a})
        elif kind == "move":
            src = draw.draw(st.sampled_from(("dbar", "thetabar", "scratch")))
            fs.pipe_file(objects[i], fs.cat_file(objects[i].replace(f"/{table}/c/", f"/{src}/c/")))
        elif kind == "truncate":
            data = fs.cat_file(objects[i])
            fs.pipe_file(objects[i], data[:draw.draw(st.integers(0, len(data) - 1))])
        elif kind == "replace":
            data = bytearray(fs.cat_file(objects[i]))
            k = draw.draw(st.integers(0, len(data) - 1))
            data[k] = (data[k] + draw.draw(st.integers(1, 255))) % 256
            fs.pipe_file(objects[i], bytes(data))
        else:  # the table copied from another fit of the same cardinalities
            fs.rm(f"{root.path}/{table}", recursive=True)
            fs.copy(f"{stopped.path.rsplit('/', 1)[0]}/fuzz-other/{table}", f"{root.path}/{table}", recursive=True)
        try:
            m = FSLL.resume(url, progress=False, storage_options=s3)
        except ValueError as e:
            msg = str(e)
            assert "\n" not in msg and msg.startswith(url), msg
            return
        assert m.theta_ == ref.theta_ and m.n_iter_ == ref.n_iter_ and m.cost_ == ref.cost_

    run()


def test_keys_with_integers_read_and_write_through_the_checks(s3):
    root = URLRoot("s3://bucket/int-keys", s3)
    spec = root.create_table("zarr", "t", (2, 3, 4), (1, 3, 2), fit_id="f")
    want = np.arange(24, dtype=float).reshape(2, 3, 4)
    for i in range(2):
        storage.write(spec, (i, slice(None), slice(None)), want[i])  # the band of one value of the first axis
    np.testing.assert_array_equal(storage.read(spec, (1, slice(None), slice(None))), want[1])
    storage.write(spec, (0, 1, slice(1, 3)), np.array([-1.0, -2.0]))  # part of a chunk
    want[0, 1, 1:3] = [-1, -2]
    np.testing.assert_array_equal(storage.read(spec, (slice(None),) * 3), want)
