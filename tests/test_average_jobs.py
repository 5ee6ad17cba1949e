"""FSLLAverage(n_jobs=k): members fitted by this process and k - 1 worker processes at
once are the members fitted one after the other, bit for bit; a worker's error is raised
here, and no worker process outlives the fit."""
from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from fsll_ooc import FSLLAverage, average, datasets
from fsll_ooc.kernels import threadpool
from fsll_ooc.planner import PlanError

CARDS = (2, 3, 4, 5)


@pytest.fixture(scope="module")
def codes():
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=3)
    return datasets.sample_table(p, 600, seed=1)


@pytest.fixture(scope="module")
def serial(codes):
    return FSLLAverage(n_members=3, random_state=5, n_jobs=1, progress=False).fit(codes)


def _same(a, b):
    assert a.n_members_ == b.n_members_
    for x, y in zip(a.members_, b.members_):  # terms, parameters, cost, log Z: to the last bit
        assert (x.theta_, x.cost_, x.log_z_, x.n_samples_) == (y.theta_, y.cost_, y.log_z_, y.n_samples_)
        assert x.engine_ is None and y.engine_ is None


@pytest.fixture
def spy(monkeypatch):
    """The worker processes a fit starts (their ``subprocess.Popen``)."""
    made = []
    real = average._Worker.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        made.append(self.proc)

    monkeypatch.setattr(average._Worker, "__init__", init)
    return made


@pytest.fixture
def started(monkeypatch):
    """This process fits a member only once a worker has started (on these small members
    it would otherwise fit them all before any worker is ready, and end the workers)."""
    import threading

    ready = threading.Event()
    real_start, real_member = average._Worker.start, average._Job.member

    def start(self):
        real_start(self)
        ready.set()

    def member(self, *a):
        ready.wait(120)
        return real_member(self, *a)

    monkeypatch.setattr(average._Worker, "start", start)
    monkeypatch.setattr(average._Job, "member", member)
    return ready


def test_members_in_worker_processes_are_the_serial_members(codes, serial, spy, started):
    before = threadpool.num_threads()
    par = FSLLAverage(n_members=3, random_state=5, n_jobs=2, progress=False).fit(codes)
    assert threadpool.num_threads() == before  # this process's kernel threads as they were
    assert len(spy) == 1  # this process and one worker
    assert [p.returncode for p in spy] == [0]  # asked to end, and ended
    _same(par, serial)
    np.testing.assert_array_equal(par.probabilities(), serial.probabilities())
    three = FSLLAverage(n_members=3, random_state=5, n_jobs=8, progress=False).fit(codes)  # at most K - 1 workers
    assert len(spy) == 1 + 2 and all(p.poll() is not None for p in spy)
    _same(three, serial)


def test_labelled_rows_and_large_codes_through_a_file(codes, serial, spy, started, monkeypatch):
    monkeypatch.setattr(average, "SEND_BYTES", 0)  # the codes go through a temporary file
    par = FSLLAverage(n_members=3, random_state=5, n_jobs=3, progress=False).fit(codes)
    assert len(spy) == 2
    _same(par, serial)
    import pandas as pd

    df = pd.DataFrame({f"v{j}": np.array(list("abcde"))[codes[:, j]] for j in range(4)})
    one = FSLLAverage(n_members=2, n_jobs=1, progress=False).fit(df)
    two = FSLLAverage(n_members=2, n_jobs=2, progress=False).fit(df)
    _same(one, two)
    assert two.feature_names_in_ == one.feature_names_in_ and two.categories_ == one.categories_


def test_n_jobs_none_uses_the_cores_on_large_tables_only(codes, monkeypatch):
    avg = FSLLAverage(n_members=4, progress=False)
    assert avg.n_jobs is None and avg.get_params()["n_jobs"] is None
    monkeypatch.setattr(average, "available_cores", lambda: 2)
    assert avg._resolved_jobs(4, CARDS) == 1  # 120 cells: a member takes less than a worker's start
    assert avg._resolved_jobs(4, (3, 4, 5) * 4) == 2
    assert avg._resolved_jobs(1, (3, 4, 5) * 4) == 1
    assert FSLLAverage(store="x")._resolved_jobs(4, (3, 4, 5) * 4) == 1  # out of core: one after the other
    assert FSLLAverage(n_jobs=3)._resolved_jobs(2, CARDS) == 2
    monkeypatch.setattr(average, "available_cores", lambda: 1)
    assert avg._resolved_jobs(4, (3, 4, 5) * 4) == 1


def test_n_jobs_none_keeps_workers_only_when_a_member_is_slow(codes, serial, spy, monkeypatch):
    """With ``n_jobs=None`` the first member is fitted here and timed while the workers
    start; they fit members only if it took at least ``MIN_MEMBER_SECONDS``, else they are
    ended at once: the same members either way."""
    monkeypatch.setattr(average, "available_cores", lambda: 2)
    monkeypatch.setattr(average, "PARALLEL_CELLS", 1)
    monkeypatch.setattr(average, "MIN_MEMBER_SECONDS", float("inf"))
    taken = []
    real_fit = average._Worker.fit
    monkeypatch.setattr(average._Worker, "fit", lambda self, k, bits: taken.append(k) or real_fit(self, k, bits))
    here = FSLLAverage(n_members=3, random_state=5, progress=False).fit(codes)
    assert len(spy) == 1 and spy[0].poll() is not None and taken == []  # started, ended, no member
    _same(here, serial)


def test_n_jobs_none_workers_take_members_once_started(codes, serial, spy, started, monkeypatch):
    monkeypatch.setattr(average, "available_cores", lambda: 2)
    monkeypatch.setattr(average, "PARALLEL_CELLS", 1)
    monkeypatch.setattr(average, "MIN_MEMBER_SECONDS", 0.0)
    before = threadpool.num_threads()
    there = FSLLAverage(n_members=3, random_state=5, progress=False).fit(codes)
    assert len(spy) == 1 and [p.returncode for p in spy] == [0]  # one worker, asked to end, ended
    assert threadpool.num_threads() == before
    _same(there, serial)
    np.testing.assert_array_equal(there.probabilities(), serial.probabilities())


def test_a_worker_still_starting_when_no_member_is_left_is_ended(codes, serial, spy):
    import threading

    release = threading.Event()
    real_start = average._Worker.start

    def start(self):  # a worker that starts only after this process has fitted every member
        release.wait(120)
        real_start(self)

    real_member = average._Job.member
    done = []

    def member(self, *a):
        out = real_member(self, *a)
        done.append(a[0])
        if len(done) == 3:
            release.set()
        return out

    import pytest as _pt

    with _pt.MonkeyPatch.context() as mp:
        mp.setattr(average._Worker, "start", start)
        mp.setattr(average._Job, "member", member)
        par = FSLLAverage(n_members=3, random_state=5, n_jobs=2, progress=False).fit(codes)
    assert sorted(done) == [0, 1, 2] and len(spy) == 1 and spy[0].poll() is not None
    _same(par, serial)


def test_parameters_no_process_can_receive_use_threads(codes, serial, spy):
    from fsll_ooc.learn import LearnOptions

    opts = LearnOptions(on_finish=lambda *a: None)  # a lambda: not picklable
    one = FSLLAverage(n_members=3, random_state=5, n_jobs=1, progress=False, learn_options=opts).fit(codes)
    two = FSLLAverage(n_members=3, random_state=5, n_jobs=2, progress=False, learn_options=opts).fit(codes)
    assert spy == []
    _same(one, two)


def test_a_members_error_is_raised_here_and_the_workers_end(codes, spy):
    with pytest.raises(PlanError, match="infeasible fit"):  # every member's plan fails: memory_limit of 1 byte
        FSLLAverage(n_members=4, n_jobs=2, progress=False, memory_limit=1).fit(codes)
    assert len(spy) == 1 and all(p.poll() is not None for p in spy)


def test_a_worker_error_carries_its_traceback(codes, monkeypatch):
    import threading

    answered = threading.Event()
    real_fit = average._Worker.fit

    def fit(self, k, bits):
        try:
            return real_fit(self, k, bits)
        finally:
            answered.set()

    def member(self, k, *rows):  # this process waits for the worker's answer, then gives a placeholder
        answered.wait(300)
        return None

    monkeypatch.setattr(average._Worker, "fit", fit)
    monkeypatch.setattr(average._Job, "member", member)
    with pytest.raises(PlanError, match="infeasible fit") as err:  # the worker's plan: memory_limit of 1 byte
        FSLLAverage(n_members=2, n_jobs=2, progress=False, memory_limit=1).fit(codes)
    assert isinstance(err.value.__cause__, average._RemoteError)
    assert "member 1, in a worker process" in str(err.value.__cause__)  # this process took member 0
    assert "Traceback" in str(err.value.__cause__)


def test_a_worker_that_dies_is_reported(codes, spy, monkeypatch):
    monkeypatch.setattr(average, "_WORKER", "import sys\nsys.exit(3)\n")
    real_member = average._Job.member

    def member(self, *a):  # this process goes on once the worker has died
        while spy[0].poll() is None:
            time.sleep(0.01)
        return real_member(self, *a)

    monkeypatch.setattr(average._Job, "member", member)
    with pytest.raises(RuntimeError, match=r"ended unexpectedly \(exit code 3\); n_jobs=1"):
        FSLLAverage(n_members=4, n_jobs=2, progress=False).fit(codes)
    assert len(spy) == 1 and spy[0].returncode == 3


def test_an_interrupt_here_ends_the_workers(codes, spy, monkeypatch):
    def member(self, k, *rows):
        raise KeyboardInterrupt

    monkeypatch.setattr(average._Job, "member", member)  # this process only; the worker fits as usual
    with pytest.raises(KeyboardInterrupt):
        FSLLAverage(n_members=6, n_jobs=2, progress=False).fit(codes)
    assert len(spy) == 1 and spy[0].poll() is not None


def test_a_worker_that_cannot_start_leaves_the_members_here(codes, serial, monkeypatch):
    def fail(self, *a, **k):
        raise OSError("no processes here")

    monkeypatch.setattr(average._Worker, "__init__", fail)
    with pytest.warns(RuntimeWarning, match="could not start a worker process .no processes here"):
        par = FSLLAverage(n_members=3, random_state=5, n_jobs=2, progress=False).fit(codes)
    _same(par, serial)


def test_a_workers_warnings_are_given_here(spy, started):
    X = np.random.default_rng(0).integers(0, 2, (10, 3))  # members on 8 rows: "fitting on only 8 samples"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FSLLAverage(n_members=4, n_jobs=2, progress=False).fit(X)
    assert len(spy) == 1
    assert sum("fitting on only 8 samples" in str(w.message) for w in caught) == 4


def test_available_cores_are_the_idle_ones(monkeypatch):
    monkeypatch.setattr(average, "_cores", lambda: 4)
    monkeypatch.setattr(average.os, "getloadavg", lambda: (1.7, 0.0, 0.0))
    assert average.available_cores() == 4  # this process's own core
    monkeypatch.setattr(average.os, "getloadavg", lambda: (2.7, 0.0, 0.0))
    assert average.available_cores() == 3  # and one core's worth of other programs' work
    monkeypatch.setattr(average.os, "getloadavg", lambda: (9.0, 0.0, 0.0))
    assert average.available_cores() == 1

    def unknown():
        raise OSError

    monkeypatch.setattr(average.os, "getloadavg", unknown)
    assert average.available_cores() == 4
