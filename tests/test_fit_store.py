"""The store of an out-of-core fit on its own: states, resume from each status, refusals, locks."""
import json

import numpy as np
import pytest

import interrupts

from fsll_ooc import FSLL, storage
from fsll_ooc.learn import FitState
from fsll_ooc.planner import plan as make_plan
from fsll_ooc.storage import IntegrityError
from fsll_ooc.storage.fit_store import COUNTS_FILE, STATE_FILE, FitStore
from fsll_ooc.storage.lock import StoreLock, StoreLockedError

CARDS = (2, 3, 4)
LAYOUT = (1, 2)


@pytest.fixture(scope="module")
def X():
    rng = np.random.default_rng(5)
    a = rng.integers(0, 2, 200)
    return np.c_[a, (a + rng.integers(0, 2, 200)) % 3, rng.integers(0, 4, 200)]


@pytest.fixture(scope="module")
def ref(X):  # the full code's weight: a fit long enough to stop at every status (no warm start)
    return FSLL(progress=False, penalty_scale=1.0).fit(X)


def _plan(fs):
    return fs.account(make_plan(CARDS, out_of_core=True, layout=LAYOUT))


def _begun(tmp_path, labels=None):
    fs = FitStore(tmp_path / "s", "zarr")
    p = _plan(fs)
    with fs.writing("fit", "fitting", p):
        fs.begin(p, {"epsilon": 1e-4, "max_iter": None, "resync_every": 256}, labels,
                 np.array([0, 5, 23]), np.array([4, 1, 2]), FitState(CARDS, 7, 0.0))
    return fs, p


def test_state_moves_starting_running_complete(tmp_path):
    fs, p = _begun(tmp_path, (["a", "b", "c"], None))
    assert fs.read().status == "starting" and fs.resumable
    uniq, counts = fs.read_counts(CARDS, 7)
    assert uniq.tolist() == [0, 5, 23] and counts.tolist() == [4, 1, 2]
    with fs.writing("fit", "fitting"):
        specs = fs.create_tables(CARDS, p.layout.chunk_shape)
        st = FitState(CARDS, 7, 0.0)
        fs.tables_ready(specs, st)
        assert fs.read().status == "running"
        st.n_iter = 3
        fs.checkpoint(st)
        stored = fs.read()
        assert stored.status == "running" and FitState.from_json(stored.state).n_iter == 3
        fs.complete(st, 0.25)
    stored = fs.read()
    assert (stored.status, stored.kl_data, stored.feature_names, stored.backend) == ("complete", 0.25, ["a", "b", "c"], "zarr")
    with pytest.raises(IntegrityError, match="chunk file is missing"):  # dbar was never written
        fs.open_tables(CARDS, p.layout.chunk_shape)
    storage.write(specs[0], (slice(None),) * 3, np.ones(CARDS))
    storage.flush(specs[0])
    assert fs.open_tables(CARDS, p.layout.chunk_shape)[0].path == specs[0].path  # fingerprints match


def test_a_new_fit_forgets_the_old_state_and_labels(tmp_path):
    fs, _ = _begun(tmp_path, (["a", "b", "c"], [[0, 1], [0, 1, 2], list("wxyz")]))
    fs2, _ = _begun(tmp_path, None)
    stored = FitStore(tmp_path / "s").read()
    assert stored.feature_names is None and stored.categories is None


@pytest.mark.parametrize("stop_after", [1, 2, 6])  # starting / running at iteration 0 / running later
def test_resume_from_each_status(X, ref, tmp_path, monkeypatch, stop_after):
    interrupts.stop_after(monkeypatch, stop_after)
    with pytest.raises(interrupts.Crash):
        FSLL(progress=False, penalty_scale=1.0, store=tmp_path / "s", layout=LAYOUT, scheduler="serial").fit(
            X, feature_names=["a", "b", "c"])
    monkeypatch.undo()
    assert FitStore(tmp_path / "s").read().status == ("starting" if stop_after == 1 else "running")
    m = FSLL.resume(tmp_path / "s", progress=False)
    assert set(m.theta_) == set(ref.theta_) and m.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    assert m.feature_names_in_ == ["a", "b", "c"]
    assert FitStore(tmp_path / "s").read().status == "complete"
    again = FSLL.resume(tmp_path / "s", progress=False)  # complete: opened for reading
    assert again.theta_ == m.theta_ and again.feature_names_in_ == ["a", "b", "c"]


def test_refuses_a_directory_that_is_not_a_store(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("precious")
    with pytest.raises(ValueError, match="notes.txt|not empty|not an fsll-ooc"):
        FitStore(tmp_path / "d", "zarr").check_new()
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        FitStore(tmp_path / "d").require_state()
    (tmp_path / "d" / STATE_FILE).write_text(json.dumps({"format": "something else"}))
    with pytest.raises(IntegrityError):
        FitStore(tmp_path / "d").read()
    assert (tmp_path / "d" / "notes.txt").read_text() == "precious"


def test_altered_data_file_is_refused(tmp_path):
    fs, _ = _begun(tmp_path)
    (tmp_path / "s" / COUNTS_FILE).write_bytes((tmp_path / "s" / COUNTS_FILE).read_bytes()[:-1] + b"\x01")
    fs = FitStore(tmp_path / "s")
    fs.read()
    with pytest.raises(IntegrityError, match="checksum"):
        fs.read_counts(CARDS, 7)


def test_the_writer_lock_is_held_while_writing(tmp_path):
    fs, p = _begun(tmp_path)
    with fs.writing("fit", "fitting"):
        with pytest.raises(StoreLockedError):
            StoreLock(tmp_path / "s", purpose="another").acquire()
        with pytest.raises(StoreLockedError):
            with FitStore(tmp_path / "s").writing("resume", "resuming the fit"):
                pass
    StoreLock(tmp_path / "s", purpose="after").acquire().release()  # released on the way out


@pytest.mark.parametrize("backend", ["zarr", "memmap"])
def test_the_plan_counts_the_checksums(tmp_path, backend):
    p = make_plan(CARDS, out_of_core=True, layout=LAYOUT)
    fs = FitStore(tmp_path / "s", backend)
    extra = fs.account(p).disk_bytes - p.disk_bytes
    assert extra == 3 * storage.overhead_bytes(backend, CARDS, p.layout.chunk_shape) > 0
    fs.create_tables(CARDS, p.layout.chunk_shape)
    assert fs.disk_available() >= extra  # what the tables hold counts as available to their fit
