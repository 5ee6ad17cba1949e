"""Fits running at once in several threads of one process give the bits of the same fits
alone (FSLLAverage(n_jobs=k) relies on it).

The learner's dense solves run on one BLAS thread (LAPACK's result depends on how many
threads it splits a solve between), and BLAS's thread count is one setting of the whole
process: the solves of concurrent fits share one limit, whichever thread sets or lifts it.
Here the main thread sets BLAS's thread count to 2 first, as a user's script may, which
(with threadpoolctl's rule that only the thread that set a limit may set one again) left
the fits in other threads solving on 2 BLAS threads: other bits in the last digits.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import threadpoolctl

from fsll_ooc import FSLL, FSLLAverage, datasets
from fsll_ooc.learn import corrective

CARDS = (3, 4, 5, 3, 4, 5, 3, 4, 5, 3)  # large enough for multi-threaded LAPACK in the corrective solves


def _data(n, seed):
    p, _ = datasets.random_bayesnet(CARDS, 2, seed=np.random.SeedSequence([seed, 11]))
    return datasets.sample_table(p, n, seed=np.random.SeedSequence([seed, 7, n]))


def _fit(X):
    m = FSLL(progress=False, cardinalities=CARDS).fit(X)
    return dict(m.theta_), m.cost_, m.log_z_


def _blas_threads():
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


@pytest.fixture
def blas_two_threads():
    if not _blas_threads():
        pytest.skip("no BLAS library threadpoolctl can control")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):  # set by this (the main) thread
        yield


def test_fits_at_once_in_threads_give_the_bits_of_the_fits_alone(blas_two_threads):
    data = [_data(3000, 0), _data(2000, 1)]
    alone = [_fit(X) for X in data]
    assert all(len(a[0]) > 10 for a in alone)
    for pair in ([0, 1], [0, 0]):  # two datasets, and one dataset twice
        with ThreadPoolExecutor(2) as ex:
            together = list(ex.map(lambda i: _fit(data[i]), pair))
        for i, got in zip(pair, together):
            assert got == alone[i]  # terms, theta, cost and log Z to the last bit
    with ThreadPoolExecutor(1) as ex:  # one fit in another thread than the one that set BLAS's threads
        assert ex.submit(_fit, data[1]).result() == alone[1]
    assert _blas_threads() == [2] * len(_blas_threads())  # the process's own setting is back


def test_average_members_fitted_at_once_are_the_members_one_after_the_other(blas_two_threads):
    X = _data(2000, 1)
    one = FSLLAverage(n_members=2, progress=False, cardinalities=CARDS).fit(X)
    two = FSLLAverage(n_members=2, n_jobs=2, progress=False, cardinalities=CARDS).fit(X)
    for a, b in zip(one.members_, two.members_):
        assert (a.theta_, a.cost_, a.log_z_) == (b.theta_, b.cost_, b.log_z_)


def test_one_blas_thread_holds_for_every_solve_under_way_in_any_thread(blas_two_threads):
    entered, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with corrective._one_blas_thread():
            seen["first"] = _blas_threads()
            entered.set()
            second_in.wait(120)
        first_out.set()

    def second():
        entered.wait(120)
        with corrective._one_blas_thread():
            second_in.set()
            first_out.wait(120)
            seen["second after the first left"] = _blas_threads()
        seen["after both"] = _blas_threads()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    k = len(_blas_threads())
    assert seen == {"first": [1] * k, "second after the first left": [1] * k, "after both": [2] * k}
