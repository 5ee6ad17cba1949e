#!/usr/bin/env python
"""``FSLLAverage`` members one after the other against members in worker processes, on idle cores.

For each case: one ``FSLL()`` fit, then, ``--reps`` times in turn, ``FSLLAverage(n_jobs=1)``,
``FSLLAverage()`` (``n_jobs=None``: workers only when the first member took at least
``average.MIN_MEMBER_SECONDS``), ``FSLLAverage()`` with that threshold at 0 (workers
always, where the cores are idle) and ``FSLLAverage(n_jobs=2)`` (one worker whatever the
load), with wall-clock and this process's CPU seconds.  The
members are the same in every variant (tests); only the time differs.  Run it on an idle
machine: ``n_jobs=None`` counts the cores the 1-minute load leaves idle, which includes
the workers of the variant before it.

Cases: ``BN-mix:N`` (``bench/quality.py``'s mixed-cardinality Bayesian network, seed 0) or a
paper dataset name (``BN20-37S``)::

    python bench/average_jobs.py --cases BN-mix:10000 BN-mix:1000 BN20-37S --reps 2
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fsll_ooc import FSLL, FSLLAverage, average, datasets  # noqa: E402


def data(case: str):
    if case.startswith("BN-mix:"):
        import quality

        return quality.synthetic("BN-mix", int(case.split(":")[1]), 0)[0]
    return datasets.paper_dataset(case, seed=0)[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["BN-mix:10000", "BN-mix:1000", "BN20-37S"])
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args(argv)
    default = average.MIN_MEMBER_SECONDS
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}, "
          f"MIN_MEMBER_SECONDS {default}")
    print("| case | variant | rep | wall s | CPU s (this process) | load |")
    print("|---|---|---|---|---|---|")
    for case in a.cases:
        X = data(case)
        t = time.perf_counter()
        FSLL(progress=False).fit(X)
        print(f"| {case} | one FSLL() fit | 0 | {time.perf_counter() - t:.2f} | | {os.getloadavg()[0]:.2f} |", flush=True)
        for rep in range(a.reps):
            for name, nj, threshold in (("n_jobs=1", 1, default), ("n_jobs=None", None, default),
                                        ("n_jobs=None, workers always", None, 0.0), ("n_jobs=2", 2, default)):
                average.MIN_MEMBER_SECONDS = threshold
                c0, t = os.times(), time.perf_counter()
                FSLLAverage(n_jobs=nj, progress=False).fit(X)
                wall, c1 = time.perf_counter() - t, os.times()
                cpu = c1.user - c0.user + c1.system - c0.system
                print(f"| {case} | {name} | {rep} | {wall:.2f} | {cpu:.2f} | {os.getloadavg()[0]:.2f} |", flush=True)
        average.MIN_MEMBER_SECONDS = default


if __name__ == "__main__":
    main()
