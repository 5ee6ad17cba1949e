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
    fs = FitStore(root, storage_options=s3)
    fs.read()
    spec = fs.stored_spec("dbar", CARDS, root.read_json("fsll_state.json")["chunks"])
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
        spec = fs.stored_spec(name, CARDS, second.plan_.layout.chunk_shape)
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
    from fsll_ooc.learn import FitState
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
        assert a._lock._lost is None  # A's heartbeat has not noticed: its small files ask the lock object
        for write in (lambda: a.keep("soft", np.zeros(3)), lambda: a.write_state(FitState((4, 6), 5, 0.0), "running")):
            with pytest.raises(StoreLockedError, match="lease on the store ran out and was taken over"):
                write()
        assert not a.io.exists("fsll_state.json") and not a.io.exists("fsll_soft.0.npy")
        b.release()


def test_a_stalled_writer_whose_lease_was_taken_over_cannot_damage_its_successor(s3, monkeypatch):
    """Writer A checks its lease for a band of ``thetabar`` and stops right there (SIGSTOP,
    say) for longer than its lease; B takes the store over and resumes; A continues in the
    middle of B's fit and its band lands.  B refuses that chunk by name at its next read
    (bound to A's lease, not B's), with the fix; the state keeps B's last checkpoint, and a
    plain resume ends in the model of the uninterrupted fit.  (Before, the chunk passed for
    one of B's: "dual of cell 6 is 2.66, outside [-1,1]" and every later plain resume failed.)"""
    import threading

    from fsll_ooc.storage import zarr_url

    url = "s3://bucket/stalled"
    root, dbar = _interrupted(s3, "stalled", monkeypatch)
    a = FitStore(url, storage_options=s3)
    a.read()
    band = storage.base.chunk_slices(dbar, _two_chunks(dbar)[0])
    # plausible duals: those of the interrupted fit's last checkpoint
    values = storage.read(a.stored_spec("thetabar", CARDS, dbar.chunks), band)
    checked, go = threading.Event(), threading.Event()
    writing = a.writing("fit", "resuming")
    writing.__enter__()
    theta_a = a.open_tables(CARDS, dbar.chunks)[1]
    assert theta_a.lease == theta_a.generation == a._lock.lease_token
    real_check = zarr_url.check_lease

    def check_then_stall(spec):  # A passes its lease check, then stops before its PUT
        real_check(spec)
        if spec.lease == theta_a.lease:
            checked.set()
            go.wait()

    monkeypatch.setattr(zarr_url, "check_lease", check_then_stall)
    late = threading.Thread(target=storage.write, args=(theta_a, band, values))
    late.start()
    try:
        _take_over_while_stalled(url, s3, a, late, checked, go, monkeypatch)
    finally:
        go.set()
        late.join()
        writing.__exit__(None, None, None)  # A stops ("lock was lost" at its next write)
    monkeypatch.undo()
    stored = FitStore(url, storage_options=s3).read()
    assert stored.status == "running" and stored.state["n_iter"] == 3  # B's checkpoint, nothing after
    m = FSLL.resume(url, storage_options=s3)
    _same_model(m, FSLL(**KW).fit(_data()), exact=False)


def _take_over_while_stalled(url, s3, a, late, checked, go, monkeypatch):
    """A (stalled in thread ``late`` once ``checked``) looks stale; B resumes; after B's first
    checkpoint A continues (``go``) and its band lands; B must refuse it by name."""
    from fsll_ooc.storage import url_store
    from interrupts import on_persist

    while not checked.wait(0.1):  # (polled: a write that failed before its check must not hang the test)
        assert late.is_alive(), "A's write ended before its lease check"
    a._lock._stop.set()  # stopped: A renews its lease no more, and it looks stale to B
    later = url_store._now() + url_store.LEASE + url_store.CLOCK_SLACK + 1
    monkeypatch.setattr(url_store, "_now", lambda: later)

    def a_continues():  # after B's first checkpoint, A's band lands
        go.set()
        late.join()

    on_persist(monkeypatch, 1, a_continues)
    with pytest.raises(IntegrityError) as e:
        FSLL.resume(url, storage_options=s3)  # B
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{url}/thetabar/c/"), msg
    assert "taken over" in msg and f"FSLL.resume({url!r}) writes this table again" in msg, msg
    assert not late.is_alive()


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


def test_the_learners_refusals_name_a_url_store_with_both_slashes():
    """The learner names the store of its tables in its refusals: ``s3://bucket/s``, never
    ``s3:/bucket/s`` (a URL put through ``pathlib`` loses a slash)."""
    from types import SimpleNamespace

    from fsll_ooc.engine import Table
    from fsll_ooc.learn.checks import store_of
    from fsll_ooc.storage.base import TableSpec

    def named(path):
        spec = TableSpec("zarr_url" if "://" in path else "zarr", path, (2, 3), (2, 3))
        return store_of(SimpleNamespace(ctx=SimpleNamespace(specs={Table.THETABAR: spec})))

    assert named("s3://bucket/s/thetabar") == "s3://bucket/s"
    assert named("gs://bucket/a/b/thetabar") == "gs://bucket/a/b"
    assert named("/tmp/store/thetabar") == "/tmp/store"


def test_em_on_an_s3_store_resumes_after_a_stop_at_each_kind_of_state_write(s3, monkeypatch):
    """EM out of core rewrites its targets in every round, under the lease of the writer that
    resumes it (``check_targets=False``): stopped at each kind of state write and resumed by a
    new writer (a new lease), it ends in the in-core EM model."""
    import test_missing_ooc as t
    from test_missing import _holes

    from fsll_ooc import datasets

    p, _ = datasets.random_bayesnet(t.CARDS, 2, seed=3)
    X = _holes(datasets.sample_table(p, 300, seed=1), 0.3, seed=2)
    ref = FSLL(progress=False, missing="em", penalty_scale=1.0).fit(X)
    url = "s3://bucket/em"
    fit = lambda: FSLL(progress=False, missing="em", store=url, storage_options=s3, layout=t.LAYOUT,  # noqa: E731
                       scheduler="serial", penalty_scale=1.0).fit(X)
    writes, whole = t._state_writes(monkeypatch, fit)
    t.assert_same(whole, ref)
    first = lambda pred: 1 + next(i for i, w in enumerate(writes) if pred(*w))  # noqa: E731
    for n in (1, first(lambda s, ph, r, rd, it, b: ph == "m-step" and rd == 0 and it > b),
              first(lambda s, ph, r, rd, it, b: ph == "e-step" and rd == 2),
              first(lambda s, ph, r, rd, it, b: ph == "m-step" and rd == 2 and it == b)):
        stop_after(monkeypatch, n)
        with pytest.raises(Crash):
            fit()
        monkeypatch.undo()
        m = FSLL.resume(url, storage_options=s3, progress=False)
        assert FitStore(url, storage_options=s3).read().status == "complete", n
        t.assert_same(m, ref)


def test_a_stalled_writers_late_state_never_replaces_its_successors(s3, monkeypatch):
    """Writer A resumes a store, passes its lease check for a state write and is stopped there
    past its lease; B takes the store over and finishes the fit; A continues: its state write
    (conditional on the state it read) is refused in one line naming the state object, and
    the store keeps B's finished model (before, A's older state replaced it)."""
    from types import SimpleNamespace

    from fsll_ooc.learn import FitState
    from fsll_ooc.storage import url_store

    url = "s3://bucket/late-state"
    root, _ = _interrupted(s3, "late-state", monkeypatch)
    a = FitStore(url, storage_options=s3)
    stored = a.read()
    writing = a.writing("fit", "resuming")
    writing.__enter__()
    try:
        obj = root.read_json("fsll_state.json")  # the layout the state keeps
        a.plan = SimpleNamespace(layout=SimpleNamespace(a=obj["layout"][0], c=obj["layout"][1],
                                                        chunk_shape=tuple(obj["chunks"])))
        a._lock._stop.set()  # A is stopped: it renews its lease no more
        later = url_store._now() + url_store.LEASE + url_store.CLOCK_SLACK + 1
        monkeypatch.setattr(url_store, "_now", lambda: later)
        b = FSLL.resume(url, storage_options=s3)  # B takes the store over and finishes
        monkeypatch.setattr(a, "_check_lock", lambda: None)  # A had passed its lease check before it stopped
        with pytest.raises(IntegrityError) as e:
            a.write_state(FitState.from_json(stored.state), "running")
        msg = str(e.value)
        assert msg.startswith(f"{url}/fsll_state.json: was replaced by another writer") and "\n" not in msg, msg
        assert f"FSLL.resume({url!r}) continues" in msg
    finally:
        writing.__exit__(None, None, None)
    monkeypatch.undo()
    assert FitStore(url, storage_options=s3).read().status == "complete"
    again = FSLL.resume(url, storage_options=s3)
    assert again.theta_ == b.theta_ and again.n_iter_ == b.n_iter_
    _same_model(b, FSLL(**KW).fit(_data()), exact=False)
