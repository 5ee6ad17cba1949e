#!/usr/bin/env python
"""A pass's work on one in-core band at 1, 2, ... threads: the best of ``--reps`` runs each.

Rows (a ``2^k`` float64 band, each row the same numbers at every thread count):

* ``sweep``: a corrective phase's sweep task (sparse fill, ``T^T``, ``exp``, normalise, ``T``,
  read off 200 cells: :func:`fsll_ooc.engine.tasks.task_fill`);
* ``exp+normalise``: the elementwise steps alone (:func:`fsll_ooc.kernels.bandops.elementwise`;
  ``numpy`` is numpy's whole-array calls, the one-thread path of before);
* ``transform``: one full transform;
* ``second-order top-k``: a joint selection's candidates (:func:`fsll_ooc.engine.tasks.second_order_top`);
* ``batch top-k``: a batch scan's 64 best appends (:func:`fsll_ooc.kernels.scan.top_appends_threads`).

The best of several runs is the figure least disturbed by other programs on a shared
machine.  Usage::

    python bench/band_ops.py --log2 22 24 --threads 1 2 --reps 7
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def best_of(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2", type=int, nargs="+", default=[22, 24])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)

    from fsll_ooc import cost
    from fsll_ooc.engine import tasks
    from fsll_ooc.engine.bands import band_geometry
    from fsll_ooc.kernels import bandops, scan, threadpool
    from fsll_ooc.kernels.transform import transform_inplace
    from fsll_ooc.planner import Layout

    print(f"load {os.getloadavg()[0]:.1f}; best of {args.reps} runs, ms")
    print("| band | work | numpy | " + " | ".join(f"{n} thread{'s' if n > 1 else ''}" for n in args.threads) + " |")
    print("|---|---|---|" + "---|" * len(args.threads))
    for k in args.log2:
        cards = (2,) * k
        L = Layout(cards, 0, 0)
        r0, w = cost.penalty_weights(cards, 100_000)
        ctx = tasks.Context(L, (None, None, None), r0, tuple(w), True)
        geom = band_geometry(cards, 0, 0, "A", tuple(w))
        rng = np.random.default_rng(0)
        band = rng.normal(0, 1, 2**k)
        sup = np.unique(rng.integers(0, 2**k, 300))
        theta = rng.normal(0, 0.3, sup.size)
        cells = rng.integers(0, 2**k, 200)
        sweep_ops = (("T", L.a_axes, True), ("exp", 0.0), ("normalize",), ("T", L.a_axes, False),
                     ("take", cells, np.arange(cells.size)))
        t = rng.uniform(-0.5, 0.5, (geom.P, geom.Q))
        d = t + rng.normal(0, 0.01, t.shape)
        rows = {}

        def numpy_exp():
            x = band.copy()
            x -= 0.5
            np.exp(x, out=x)
            x /= float(x.sum())

        rows["exp+normalise"] = [best_of(numpy_exp, args.reps)]
        rows["sweep"] = [float("nan")]
        rows["transform"] = [float("nan")]
        rows["second-order top-k"] = [float("nan")]
        rows["batch top-k"] = [float("nan")]
        for n in args.threads:
            threadpool.set_num_threads(n)
            x = band.copy()
            rows["exp+normalise"].append(best_of(
                lambda: (x.__setitem__(slice(None), band), bandops.elementwise(x, (("exp", 0.5), ("normalize",)), n)),
                args.reps))
            rows["sweep"].append(best_of(lambda: tasks.task_fill(ctx, "A", 0, None, sup, theta, sweep_ops), args.reps))
            y = band.reshape(cards).copy()
            rows["transform"].append(best_of(lambda: transform_inplace(y, parallel=n > 1), args.reps))
            rows["second-order top-k"].append(best_of(lambda: tasks.second_order_top(ctx, "A", 0, t, d, 64),
                                                      args.reps))
            rows["batch top-k"].append(best_of(lambda: scan.top_appends_threads(t, d, geom.rP, geom.rQ, r0, 64, 0, n),
                                               args.reps))
        threadpool.set_num_threads(None)
        for name, vals in rows.items():
            print(f"| 2^{k} | {name} | " + " | ".join("" if v != v else f"{1e3 * v:.1f}" for v in vals) + " |")
    print("(exp+normalise: each run starts from a copy of the same band)")


if __name__ == "__main__":
    main()
