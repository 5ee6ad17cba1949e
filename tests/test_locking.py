"""The store lock: one writer, shared readers, stale locks recovered (flock and lock-directory fallback)."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from fsll_ooc.storage import lock as locking
from fsll_ooc.storage.lock import StoreLock, StoreLockedError, pid_alive, read_holder


@pytest.fixture(params=["flock", "lock-dir"])
def mechanism(request, monkeypatch):
    """Every test runs with flock(2) and with the lock directory used where flock is missing."""
    monkeypatch.setattr(locking, "USE_FLOCK", request.param == "flock")
    monkeypatch.setattr(locking, "READER_WAIT", 0.2)
    return request.param


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_one_writer_at_a_time_and_the_refusal_names_the_holder(tmp_path, mechanism):
    with StoreLock(tmp_path, purpose="resume") as lk:
        assert lk.held and not lk.shared
        with pytest.raises(StoreLockedError, match=rf"held by pid {os.getpid()} on .*\(resume since") as ei:
            StoreLock(tmp_path).acquire()
        assert ei.value.holder["purpose"] == "resume" and "one writer per store" in str(ei.value)
        with pytest.raises(StoreLockedError, match="cannot read it now"):
            StoreLock(tmp_path).acquire(shared=True)
        with pytest.raises(RuntimeError, match="already held"):
            lk.acquire()
    assert not lk.held
    with StoreLock(tmp_path) as again:  # free once released
        assert again.held and again.recovered is None
    assert read_holder(tmp_path)["state"] == "released" if mechanism == "flock" else read_holder(tmp_path) is None


def test_readers_share_and_keep_writers_out(tmp_path, mechanism):
    StoreLock(tmp_path).acquire().release()  # a store a writer used
    r1 = StoreLock(tmp_path, purpose="read").acquire(shared=True)
    r2 = StoreLock(tmp_path, purpose="read").acquire(shared=True)
    assert r1.shared and r2.shared
    if mechanism == "flock":  # readers hold the flock shared: a writer waits READER_WAIT, then gives up
        t0 = time.monotonic()
        with pytest.raises(StoreLockedError, match=r"in use by another process \(reading\)"):
            StoreLock(tmp_path).acquire()
        assert time.monotonic() - t0 >= locking.READER_WAIT
    r1.release()
    r2.release()
    with StoreLock(tmp_path) as w:
        assert w.held


def test_a_dead_writers_lock_is_recovered_and_reported(tmp_path, mechanism):
    dead = {"pid": _dead_pid(), "host": socket.gethostname(), "purpose": "fit", "since": "then",
            "start": None, "token": "x", "state": "held"}
    if mechanism == "flock":  # the kernel dropped its flock when it died; only the record remains
        (tmp_path / locking.LOCK_FILE).write_text(json.dumps(dead))
    else:
        (tmp_path / locking.LOCK_DIR).mkdir()
        (tmp_path / locking.LOCK_DIR / "holder.json").write_text(json.dumps(dead))
    with StoreLock(tmp_path) as lk:
        assert lk.recovered["pid"] == dead["pid"]
        assert read_holder(tmp_path)["pid"] == os.getpid()
    with StoreLock(tmp_path) as lk:
        assert lk.recovered is None


def test_lock_directory_staleness(tmp_path, monkeypatch):
    monkeypatch.setattr(locking, "USE_FLOCK", False)
    d = tmp_path / locking.LOCK_DIR
    # a live pid whose start time differs was reused by a later process: stale
    d.mkdir()
    (d / "holder.json").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                               "state": "held", "start": 1.0}))
    with StoreLock(tmp_path) as lk:
        assert lk.recovered["pid"] == os.getpid()
    # a lock directory without a record: being created (young) is respected, an old one is stale
    d.mkdir()
    with pytest.raises(StoreLockedError):
        StoreLock(tmp_path).acquire()
    old = time.time() - 60
    os.utime(d, (old, old))
    with StoreLock(tmp_path) as lk:
        assert lk.held and lk.recovered["pid"] is None
    # a reader refuses a live writer's lock directory and ignores a dead one's
    d.mkdir()
    (d / "holder.json").write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(),
                                               "state": "held", "start": None}))
    with StoreLock(tmp_path).acquire(shared=True) as r:
        assert r.shared


def test_pid_alive():
    me = os.getpid()
    assert pid_alive(me) and pid_alive(me, locking._start_time(me))
    assert not pid_alive(me, locking._start_time(me) + 100.0)  # same pid, another process
    assert not pid_alive(_dead_pid())
    assert not pid_alive(2**40)
