"""A store given by URL: a fit on a dask cluster against an S3-compatible server started here.

The server is moto's (in a thread of this process, on 127.0.0.1); the cluster has two worker
processes that reach the store only through its URL and the storage options sent with the
tasks.  The local store's fit is the oracle: the same model to the last bit.
"""
import logging
import tempfile
import threading

import numpy as np
import pytest

from fsll_ooc import FSLL
from fsll_ooc import storage
from fsll_ooc.storage import IntegrityError
from fsll_ooc.storage.fit_store import FitStore
from fsll_ooc.storage.lock import StoreLockedError
from fsll_ooc.storage import url_store
from fsll_ooc.storage.url_store import ObjectLock, URLRoot

from interrupts import Crash, stop_after

KW = dict(layout=(2, 2), max_iter=6, epsilon=1e-4)


def _data(n=400, seed=0):
    """Mixed cardinalities with two dependencies, so the fit selects terms."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, [2, 3, 4, 5, 2, 3], size=(n, 6))
    X[:, 1] = (X[:, 0] + X[:, 1] * (rng.random(n) < 0.2)) % 3
    X[:, 3] = (X[:, 2] + (rng.random(n) < 0.1)) % 5
    return X


@pytest.fixture(scope="module")
def s3():
    """An S3-compatible server on 127.0.0.1 with a bucket; yields the storage options."""
    from moto.server import ThreadedMotoServer
    import s3fs

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    opts = {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing"}
    s3fs.S3FileSystem(**opts).makedirs("bucket", exist_ok=True)  # moto keeps its buckets per process
    yield opts
    server.stop()


@pytest.fixture(scope="module")
def client():
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def local_model():
    """The oracle: the same fit in a local store."""
    return FSLL(store=tempfile.mkdtemp(prefix="fsll-url-oracle-") + "/s", **KW).fit(_data())


def _same_model(a, b, exact=True):
    """The same model: to the last bit (``exact``), or as a resumed fit is (its duals
    re-derived from the saved parameters: ``docs/reliability.md``)."""
    assert a.n_iter_ == b.n_iter_ and a.n_bases_ == b.n_bases_ > 1 and set(a.theta_) == set(b.theta_)
    if exact:
        assert a.theta_ == b.theta_ and a.cost_ == b.cost_
    else:
        assert all(abs(a.theta_[y] - v) <= 1e-9 for y, v in b.theta_.items())
        assert a.cost_ == pytest.approx(b.cost_, abs=1e-10)


def test_a_cluster_fits_against_an_s3_store_to_the_local_store_model(s3, client, local_model):
    m = FSLL(store="s3://bucket/fit", storage_options=s3, scheduler=client, **KW).fit(_data())
    _same_model(m, local_model)
    root = URLRoot("s3://bucket/fit", s3)
    assert not root.exists("fsll.lock")  # released
    assert b"endpoint_url" not in root.read_bytes("fsll_state.json")  # options are not kept in the store
    fs = FitStore("s3://bucket/fit", storage_options=s3)
    assert fs.read().status == "complete"
    for name in ("dbar", "thetabar"):  # every chunk object present with its size and checksum (bound to
        # the fit's id and the writer's lease, as the state says)
        storage.verify_table(fs.stored_spec(name, m.cardinalities_, m.plan_.layout.chunk_shape))
    # a reader of the finished store (the workers compute its probabilities) has the same model
    again = FSLL.resume("s3://bucket/fit", storage_options=s3, scheduler=client)
    _same_model(again, local_model)
    np.testing.assert_array_equal(again.log_prob(_data()[:20]), local_model.log_prob(_data()[:20]))
    np.testing.assert_allclose(np.asarray(again.marginal([1, 3])), np.asarray(local_model.marginal([1, 3])),
                               rtol=1e-12)


def test_a_fit_stopped_midway_resumes_from_the_url_store(s3, client, local_model, monkeypatch):
    stop_after(monkeypatch, 4)  # "starting", "running" and two iterations written
    with pytest.raises(Crash):
        FSLL(store="s3://bucket/crash", storage_options=s3, scheduler=client, **KW).fit(_data())
    monkeypatch.undo()
    stored = FitStore("s3://bucket/crash", storage_options=s3).read()
    assert stored.status == "running" and stored.state["n_iter"] == 2
    m = FSLL.resume("s3://bucket/crash", storage_options=s3, scheduler=client)
    _same_model(m, local_model, exact=False)


def test_a_missing_or_altered_chunk_object_is_named(s3, monkeypatch):
    stop_after(monkeypatch, 3)
    with pytest.raises(Crash):
        FSLL(store="s3://bucket/damaged", storage_options=s3, **KW).fit(_data())
    monkeypatch.undo()
    root = URLRoot("s3://bucket/damaged", s3)
    spec = root.table_spec("zarr", "dbar", (2, 3, 4, 5, 2, 3), root.read_json("fsll_state.json")["chunks"])
    coords = (spec.grid[0] - 1, spec.grid[1] - 1) + (0,) * (len(spec.grid) - 2)
    name = "dbar/c/" + "/".join(map(str, coords))
    chunk = f"{root.path}/{name}"
    data = root.fs.cat_file(chunk)
    root.fs.pipe_file(chunk, data[:-1] + bytes([data[-1] ^ 1]))  # one bit of the checksum
    with pytest.raises(IntegrityError, match=f"{name}: chunk checksum mismatch"):
        storage.read(spec, storage.base.chunk_slices(spec, coords))
    root.fs.rm(chunk)
    with pytest.raises(IntegrityError, match=f"{name}: chunk object is missing.*restart=True"):
        FSLL.resume("s3://bucket/damaged", storage_options=s3)


def test_a_second_writer_is_refused_and_of_two_racing_writers_one_wins(s3):
    root = URLRoot("s3://bucket/locked", s3)
    with ObjectLock(root, purpose="fit"):
        with pytest.raises(StoreLockedError, match=r"held by pid \d+ on .*\(fit since.*one writer per store"):
            FSLL(store="s3://bucket/locked", storage_options=s3, **KW).fit(_data())
        with pytest.raises(StoreLockedError, match="cannot read it now"):
            ObjectLock(root).acquire(shared=True)
    assert not root.exists("fsll.lock")
    won, barrier = [], threading.Barrier(6)

    def race():
        lk = ObjectLock(URLRoot("s3://bucket/race", s3))
        barrier.wait()
        try:
            lk.acquire()
            won.append(lk)
        except StoreLockedError:
            pass

    threads = [threading.Thread(target=race) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1  # the conditional create lets exactly one through
    won[0].release()


def test_a_stale_lease_is_taken_over_and_its_holder_learns_it_lost_the_lock(s3, monkeypatch):
    root = URLRoot("s3://bucket/stale", s3)
    dead = ObjectLock(root).acquire()
    dead._stop.set()  # the holder stops renewing (its machine died, say)
    with pytest.raises(StoreLockedError, match="delete .*fsll.lock or wait 60 s"):
        ObjectLock(root).acquire()  # within its lease: refused at once
    later = url_store._now() + url_store.LEASE + url_store.CLOCK_SLACK + 1
    monkeypatch.setattr(url_store, "_now", lambda: later)  # a lease later, without waiting for it
    heir = ObjectLock(root).acquire()
    assert heir.recovered["token"] == dead._token
    with pytest.raises(OSError):
        dead._put(if_match=dead._etag)  # its renewal is refused: the object changed
    dead._lost = "the store's lock was lost"
    with pytest.raises(StoreLockedError, match="lost"):
        dead.check()
    heir.release()
    assert not root.exists("fsll.lock")


def test_url_store_refusals(s3):
    with pytest.raises(ValueError, match="memmap.* is local only"):
        FSLL(store="s3://bucket/mm", storage_options=s3, backend="memmap", **KW).fit(_data())
    URLRoot("s3://bucket/user", s3).write_bytes("notes.txt", b"mine")
    with pytest.raises(ValueError, match="s3://bucket/user is not empty and is not an fsll-ooc store.*notes.txt"):
        FSLL(store="s3://bucket/user", storage_options=s3, **KW).fit(_data())
    assert URLRoot("s3://bucket/user", s3).read_bytes("notes.txt") == b"mine"
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        FSLL.resume("s3://bucket/nothing-here", storage_options=s3)
    with pytest.raises(ValueError, match="storage_options must be plain JSON"):
        FSLL(store="s3://bucket/x", storage_options={"f": object()}, **KW).fit(_data())


def test_the_command_line_fits_and_resumes_a_url_store(s3, tmp_path, capsys):
    import json

    from fsll_ooc.cli import main

    X = _data()
    csv = tmp_path / "d.csv"
    np.savetxt(csv, X, fmt="%d", delimiter=",", header=",".join(f"v{i}" for i in range(6)), comments="")
    opts = json.dumps(s3)
    assert main(["fit", str(csv), "-o", str(tmp_path / "m.json"), "--store", "s3://bucket/cli", "--storage-options",
                 opts, "--cardinalities", "2,3,4,5,2,3", "--max-iter", "3", "--epsilon", "1e-4", "-q"]) == 0
    assert FitStore("s3://bucket/cli", storage_options=s3).read().status == "complete"
    capsys.readouterr()
    assert main(["resume", "s3://bucket/cli", "--storage-options", opts, "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["store"] == "s3://bucket/cli"
    assert main(["resume", "s3://bucket/cli", "--storage-options", "[1]"]) == 2
    assert "--storage-options must be a JSON object" in capsys.readouterr().err


_KILLED_FIT = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import pytest
from fsll_ooc import FSLL
from test_url_store import KW, _data
import interrupts

interrupts.on_persist(pytest.MonkeyPatch(), 4, lambda: os.kill(os.getpid(), signal.SIGKILL))
FSLL(store="s3://bucket/killed", storage_options={opts!r}, **KW).fit(_data())
"""


def test_a_killed_fit_resumes_from_the_url_store_once_its_lease_runs_out(s3, local_model, monkeypatch):
    import os
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_FIT.format(tests=tests, opts=s3)],
                            stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == -9, err[-2000:]
    root = URLRoot("s3://bucket/killed", s3)
    assert root.exists("fsll.lock")  # a killed writer leaves its lock behind
    assert FitStore("s3://bucket/killed", storage_options=s3).read().status == "running"
    with pytest.raises(StoreLockedError, match=rf"held by pid {proc.pid} .*wait 60 s"):
        FSLL.resume("s3://bucket/killed", storage_options=s3)  # its lease still runs
    later = url_store._now() + url_store.LEASE + url_store.CLOCK_SLACK + 1
    monkeypatch.setattr(url_store, "_now", lambda: later)  # a lease later
    m = FSLL.resume("s3://bucket/killed", storage_options=s3)
    _same_model(m, local_model, exact=False)
    assert not root.exists("fsll.lock")


def test_storage_options_are_kept_out_of_the_repr_and_the_store(s3):
    m = FSLL(store="s3://bucket/x", storage_options={"key": "AKIA-SECRET", "secret": "s3cr3t"})
    assert "s3cr3t" not in repr(m) and "AKIA" not in repr(m) and "'secret': '...'" in repr(m)


class _BlockingFS:
    """An fsspec stand-in whose removal waits until it is let go (a server that has not answered)."""

    def __init__(self):
        self.release = threading.Event()
        self.removed = []

    def rm(self, path, recursive=False):
        self.release.wait()
        self.removed.append(path)


def test_a_scratch_removal_never_blocks_the_thread_a_collection_ran_it_in():
    """A reader's scratch removal is a finalizer: a garbage collection may run it in the very
    thread that must answer its requests (an in-process server's, an event loop's). Outside the
    main thread it returns at once and the removal finishes in a thread of its own; in the main
    thread (at exit) it waits for the removal, as an exit must."""
    fs = _BlockingFS()
    returned = threading.Event()

    def collector():  # stands for the server thread a collection happened to run in
        url_store._remove_quietly(fs, "bucket/store/readers/x")
        returned.set()

    t = threading.Thread(target=collector)
    t.start()
    assert returned.wait(60), "the finalizer waited for its own removal outside the main thread"
    assert fs.removed == []  # the removal is still waiting on the 'server'
    fs.release.set()
    t.join()
    for th in threading.enumerate():
        if th.name == "fsll-ooc-scratch-removal":
            th.join()
    assert fs.removed == ["bucket/store/readers/x"]

    done = _BlockingFS()
    done.release.set()
    url_store._remove_quietly(done, "bucket/store/readers/y")  # main thread: removed on return
    assert done.removed == ["bucket/store/readers/y"]
