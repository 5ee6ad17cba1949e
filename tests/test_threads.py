"""Every core busy: a band's elementwise ops and sums on threads (numpy's bits), the
``pool`` executor (band tasks on the kernels' threads) and the thread count."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from fsll_ooc import FSLL, datasets
from fsll_ooc.engine import engine
from fsll_ooc.executors import DaskExecutor, PoolExecutor, SerialExecutor, make_executor
from fsll_ooc.kernels import bandops, threadpool

import oracle
from test_engine import _data, _engine
from test_executors import _assert_same, _concat, _failing_pass, _passes, _square

OPS = [
    (("exp", 1.5), ("sum",)),
    (("exp", -0.25), ("normalize",), ("scale", 0.75), ("add", 2.0), ("sum",)),
    (("add", 1e-3), ("normalize",)),
    (("scale", -3.0), ("exp", 0.0), ("sum",), ("scale", 2.0)),
]


def _numpy_ops(x, ops):
    """The reference: numpy's calls on the whole array (as the engine's serial path)."""
    total = None
    for op in ops:
        if op[0] == "exp":
            x -= op[1]
            np.exp(x, out=x)
        elif op[0] == "sum":
            total = float(x.sum())
        elif op[0] == "normalize":
            total = float(x.sum())
            x /= total
        elif op[0] == "scale":
            x *= op[1]
        elif op[0] == "add":
            x += op[1]
    return total


@pytest.mark.parametrize("n", [128, 129, 1000, 4096 + 24, 3**8, 2**14 + 1])
@pytest.mark.parametrize("leaf", [128, 256, 1000])
def test_leaf_sums_added_up_the_tree_are_numpys_sum(n, leaf):
    x = np.random.default_rng(n).normal(0, 1, n) * np.exp(np.random.default_rng(leaf).normal(0, 8, n))
    bounds, program = bandops.leaves(n, leaf)
    assert bounds[0] == 0 and bounds[-1] == n and np.all(np.diff(bounds) <= leaf) and np.all(np.diff(bounds) > 0)
    sums = [np.add.reduce(x[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    assert bandops.tree_sum(sums, program) == float(x.sum())


def test_leaves_refuse_a_leaf_below_the_unrolled_block():
    with pytest.raises(ValueError, match="at least 128"):
        bandops.leaves(1000, 64)


@pytest.mark.parametrize("ops", OPS)
@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("n", [5000, 3**9])
def test_elementwise_ops_on_threads_keep_numpys_bits(ops, n_threads, n):
    a = np.random.default_rng(7).normal(0, 2, n)
    want = a.copy()
    total = _numpy_ops(want, ops)
    got = a.copy()
    assert bandops.elementwise(got, ops, n_threads, leaf=256) == total
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


def test_scatter_add_is_add_at():
    rng = np.random.default_rng(3)
    local = rng.integers(0, 50, 400)  # repeated positions add up in order
    values = rng.normal(size=400)
    want = np.zeros(50)
    np.add.at(want, local, values)
    got = np.zeros(50)
    bandops.scatter_add(got, local, values)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(IndexError, match="outside the band of 50 cells"):
        bandops.scatter_add(got, np.array([50]), np.array([1.0]))
    with pytest.raises(IndexError):
        bandops.scatter_add(got, np.array([-1]), np.array([1.0]))
    with pytest.raises(ValueError, match="2 positions but 1 values"):
        bandops.scatter_add(got, np.array([0, 1]), np.array([1.0]))


@pytest.fixture
def small_pieces(monkeypatch):
    """The threaded paths on tiny tables: every band split into leaves of 128 cells, score
    blocks and top-k pieces of a few rows, on 3 threads."""
    monkeypatch.setattr(bandops, "PARALLEL_MIN", 1)
    monkeypatch.setattr(bandops, "LEAF", 128)
    from fsll_ooc.engine import engine, tasks
    from fsll_ooc.kernels import scan
    monkeypatch.setattr(tasks, "SCORE_BLOCK", 64)
    monkeypatch.setattr(engine, "PARALLEL_SCAN_MIN_CELLS", 1)  # the scans' kernels and top-k on threads
    monkeypatch.setattr(scan, "TOP_PIECE", 32)
    threadpool.set_num_threads(3)
    yield
    threadpool.set_num_threads(None)


CARDS = [((2, 3, 4, 5, 3), 600, 0), ((4, 2, 2, 3, 3, 2), 900, 2)]


def _fit(cards, n, seed, epsilon):
    p, _ = datasets.random_bayesnet(cards, 2, seed=seed)
    X = datasets.sample_table(p, n, seed=seed + 100)
    m = FSLL(cardinalities=cards, epsilon=epsilon, progress=False).fit(X)
    return X, m


@pytest.mark.parametrize("cards,n,seed", CARDS)
@pytest.mark.parametrize("epsilon", [1e-4, "auto"])
def test_threaded_band_ops_give_the_serial_fit(cards, n, seed, epsilon, small_pieces):
    """The fit with every band's ops, sums, fills and scores split between threads is the
    fit with none split, to the last bit (the paper's search and the default)."""
    _, got = _fit(cards, n, seed, epsilon)
    threadpool.set_num_threads(1)
    bandops.PARALLEL_MIN = 2**62
    engine.PARALLEL_SCAN_MIN_CELLS = 2**62
    _, want = _fit(cards, n, seed, epsilon)
    assert (got.cost_, got.log_z_, got.n_iter_, got.theta_) == (want.cost_, want.log_z_, want.n_iter_, want.theta_)


def test_threaded_fit_equals_brute_force(small_pieces):
    cards, n, seed = CARDS[0]
    X, m = _fit(cards, 400, seed, 1e-4)
    want, costs = oracle.learn(X, cards)
    flat = {int(np.ravel_multi_index(y, cards)): v for y, v in m.theta_.items()}
    assert set(flat) == set(np.nonzero(want)[0].tolist())
    for y, v in flat.items():
        assert v == pytest.approx(want[y], abs=1e-9)
    assert m.cost_ == pytest.approx(costs[-1], abs=1e-10)


def test_thread_count_is_settable():
    try:
        threadpool.set_num_threads(3)
        assert threadpool.num_threads() == 3
        threadpool.set_num_threads(None)
        assert threadpool.num_threads() >= 1
        for bad in (0, -1, 1.5, True, "2"):
            with pytest.raises(ValueError, match="positive integer"):
                threadpool.set_num_threads(bad)
    finally:
        threadpool.set_num_threads(None)


def test_parallel_for_runs_every_piece_and_raises_the_first_error():
    out = [0] * 50
    threadpool.parallel_for(3, 50, lambda i: out.__setitem__(i, i + 1))
    assert out == list(range(1, 51))
    seen = []

    def work(i):
        seen.append(i)
        if i == 3:
            raise KeyError("piece 3")

    with pytest.raises(KeyError, match="piece 3"):
        threadpool.parallel_for(2, 1000, work)
    assert 3 in seen and len(seen) < 1000  # the pieces after the failure were skipped

    def nested(i):  # a piece that runs a parallel loop itself runs it on its own thread
        inner = [0] * 4
        threadpool.parallel_for(2, 4, lambda j: inner.__setitem__(j, j))
        out[i] = sum(inner)

    threadpool.parallel_for(2, 6, nested)
    assert out[:6] == [6] * 6


def _interrupted_at(k, count=6):
    """parallel_for(2, count) with KeyboardInterrupt raised in the caller at its k-th
    bytecode (as Ctrl-C lands between any two);
    returns whether it was raised, and the pieces begun and ended when the call left."""
    begun, ended = [], []

    def work(i):
        begun.append(i)
        time.sleep(0.001)  # the helper is inside a piece while the caller runs
        ended.append(i)

    seen = [0]
    def trace(frame, event, arg):
        # parallel_for's own bytecodes only: a trace function can raise between taking a
        # lock and the ``with`` block of C-level locks in other code, where no signal lands
        if frame.f_code is not threadpool.parallel_for.__code__:
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            seen[0] += 1
            if seen[0] == k:
                raise KeyboardInterrupt
        return trace

    sys.settrace(trace)
    try:
        threadpool.parallel_for(2, count, work)
        raised = False
    except KeyboardInterrupt:
        raised = True
    finally:
        sys.settrace(None)
    return raised, begun, list(begun), list(ended)


def test_parallel_for_interrupted_anywhere_leaves_no_piece_running_and_its_helpers_free():
    # Ctrl-C in the main thread used to leave a helper blocked on a lock the caller had taken
    # (or still running the rest of the pass): the interpreter's exit then waited for it for ever
    k, interrupted = 0, 0
    while True:
        k += 1
        raised, live, begun, ended = _interrupted_at(k)
        assert sorted(begun) == sorted(ended)  # every piece that began has ended
        # the helper takes new work (a generous guard against a hang, not a timing) ...
        assert threadpool.helpers(2).submit(int).result(timeout=120) == 0
        assert live == begun  # ... and began no piece after the call had left
        if not raised:  # k is past the last bytecode: the call ran to its end
            assert sorted(begun) == list(range(6))
            break
        interrupted += 1
    assert interrupted > 20  # the interrupt was tried at many places


# ----------------------------------------------------------------------------- the pool executor

def test_pool_executor_by_name_and_thread_count():
    assert isinstance(make_executor("pool"), PoolExecutor)
    assert make_executor("pool").parallel_kernels is False  # several bands at once: one thread each
    with pytest.raises(ValueError, match="positive integer"):
        PoolExecutor(threads=0)
    ex = PoolExecutor(threads=2)
    barrier = threading.Barrier(2, timeout=30)
    # two tasks meet at the barrier: only possible when two run at once
    assert ex.run(lambda i: (barrier.wait(), i)[1], [(0,), (1,)]) == [0, 1]


def test_pool_run_and_reduce_keep_band_order_and_dasks_reduction():
    ex = PoolExecutor(threads=3)
    args = [(i, 1) for i in range(20)]
    assert ex.run(_square, args) == [(i * i + 1,) for i in range(20)]
    assert ex.run_reduce(_square, args, _concat) == tuple(i * i + 1 for i in range(20))
    # float sums that depend on the order of the additions: the same tree as dask's
    vals = [(1e16,), (1.0,), (-1e16,), (3.5,), (1e-3,)] * 7
    add = lambda x: x  # noqa: E731
    plus = lambda a, b: a + b  # noqa: E731
    assert ex.run_reduce(add, vals, plus) == DaskExecutor("threads").run_reduce(add, vals, plus)


def test_pool_gives_the_same_bands_as_serial_and_dask(tmp_path):
    ref = _passes(SerialExecutor(), tmp_path / "serial")
    _assert_same(ref, _passes(PoolExecutor(threads=2), tmp_path / "pool"))
    _assert_same(ref, _passes(PoolExecutor(threads=1), tmp_path / "pool1"))


@pytest.mark.parametrize("reduce", [False, True])
def test_pool_pass_ends_before_its_error_is_raised(reduce):
    begun = _failing_pass(PoolExecutor(threads=2), reduce)
    assert begun != set(range(6))  # the tasks not begun when band 0 failed were skipped


def test_out_of_core_fit_on_the_pool_is_the_dask_fit(tmp_path):
    p, _ = datasets.random_bayesnet((2, 3, 4, 5, 2, 3), 2, seed=4)
    X = datasets.sample_table(p, 500, seed=5)
    fits = []
    for sched in ("threads", "pool"):
        m = FSLL(epsilon=1e-4, store=tmp_path / sched, backend="memmap", layout=(2, 2), max_iter=25,
                 scheduler=sched, progress=False).fit(X)
        fits.append((m.cost_, m.log_z_, m.n_iter_, m.theta_))
    assert fits[0] == fits[1]


def test_engine_stats_are_a_snapshot(tmp_path):
    cards = (2, 3, 4)
    eng = _engine(cards, (0, 0), "numpy", tmp_path, _data(cards))
    eng.update_scan(None, np.zeros(0, np.int64))
    eng.sweep(np.zeros(1, np.int64), np.zeros(1), float(np.log(24)), np.arange(3))
    st = eng.stats
    # the setup (targets and the duals of theta = 0) in one pass, then the scan
    assert (st.passes, st.sweeps, st.gathers) == (eng.passes, eng.sweeps, 0) == (2, 1, 0)
    assert eng.passes_by(3) == {"other/A/task_fill_and_uniform_duals": 1, "other/A/task_update_scan": 1}
    assert st.bytes_moved == eng.bytes_moved > 0
    assert st.table_seconds == st.pass_seconds + st.sweep_seconds > 0
    assert st.host_share(st.table_seconds * 2) == pytest.approx(0.5)
    assert st.host_share(0.0) == 0.0
    eng.gather(np.array([1, 2]))
    assert eng.stats.gathers == 1 and st.gathers == 0  # a snapshot: the old one stays as it was
    with pytest.raises(AttributeError):
        st.passes = 0


@pytest.mark.parametrize("shape,k,skip", [((37, 19), 5, 0), ((8, 64), 12, -1), ((200, 3), 40, 0), ((5, 7), 50, -1)])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_top_appends_on_threads_keep_the_same_candidates(shape, k, skip, n_threads, monkeypatch):
    """The threaded top-k (pieces of a few rows, merged) is the one-thread kernel's, ties included."""
    from fsll_ooc.kernels import scan

    monkeypatch.setattr(scan, "TOP_PIECE", 16)
    rng = np.random.default_rng(sum(shape) + k)
    P, Q = shape
    t = rng.uniform(-0.6, 0.6, shape)
    d = np.where(rng.random(shape) < 0.3, t, rng.uniform(-0.9, 0.9, shape))
    d[1::3] = d[0]  # repeated rows: equal changes, decided by position
    t[1::3] = t[0]
    rP, rQ = np.zeros(P), rng.uniform(0.0, 0.05, Q)
    want = scan.top_appends(t, d, rP, rQ, 0.01, k, skip)
    got = scan.top_appends_threads(t, d, rP, rQ, 0.01, k, skip, n_threads)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert (want[1] >= 0).sum() > 0


def test_thread_count_follows_numba_num_threads():
    """``NUMBA_NUM_THREADS`` in the environment sets the kernels' and the pool's thread count
    (how bench/cores.py measures 1..16 threads)."""
    import os
    import subprocess
    import sys

    code = ("from fsll_ooc.kernels import threadpool; from fsll_ooc.executors import make_executor; "
            "print(threadpool.num_threads(), make_executor(None, 4)._n())")
    env = dict(os.environ, NUMBA_NUM_THREADS="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "3"]


@pytest.mark.parametrize("threads, scheduler, want", [(3, None, 3), (1, None, 2), (1, "pool5", 5)])
def test_out_of_core_plan_budgets_the_tasks_the_pool_runs(tmp_path, threads, scheduler, want):
    """Out of core, the plan's memory budget holds as many band tasks as the executor runs
    at once: the local pool's threads (at least 2) or an executor's own ``threads``."""
    X, _ = datasets.paper_dataset("BN20-37S", seed=0)
    sched = PoolExecutor(threads=5) if scheduler == "pool5" else None
    try:
        threadpool.set_num_threads(threads)
        m = FSLL(store=str(tmp_path / "s"), memory_limit="1GiB", layout=(3, 10), max_iter=3, scheduler=sched,
                 progress=False).fit(X)
    finally:
        threadpool.set_num_threads(None)
    assert m.plan_.workers == want
    assert isinstance(m.engine_.executor, PoolExecutor) and m.engine_.executor.threads == want
