#!/usr/bin/env python
"""The transforms of a fit's sweeps and re-derivations, full against sparse.

A default fit of ``bench/learner.py``'s case (``--case``, default ``survey``) is run once and
every band transform it asks for is recorded with what it knew: a band built from the sparse
``theta`` (``nonzero``: the inverse transform of a sweep or re-derivation) or read at a few
cells only (``needed``: a sweep's forward transform).  A sample of them (``--every``) is then
replayed on one thread, each timed as :func:`fsll_ooc.kernels.transform.transform_inplace`
(every fibre) and as :func:`fsll_ooc.kernels.transform.transform_sparse` (only the fibres
those cells need), the best of ``--repeats`` in CPU seconds (less swayed by a shared
machine than the wall clock), and the two results compared bit for bit.

Usage::

    python bench/sweep_transforms.py --case survey --every 5
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def record(case: str):
    """The band transforms of one default fit of ``case``: ``(shape, axes, transpose, nonzero,
    needed)``, after a warm-up fit."""
    sys.path.insert(0, HERE)
    from learner import case_data

    from fsll_ooc import FSLL
    from fsll_ooc.engine import tasks

    calls = []
    orig = tasks._transform_band

    def wrap(band, positions, transpose, parallel=False, nonzero=None, needed=None):
        if positions:
            calls.append((band.shape, tuple(positions), bool(transpose),
                          None if nonzero is None else np.unique(nonzero),
                          None if needed is None else np.unique(needed)))
        return orig(band, positions, transpose, parallel, nonzero, needed)

    Xtr, _, cards = case_data(case)
    FSLL(cardinalities=cards, progress=False).fit(Xtr[: max(len(Xtr) // 10, 200)])
    tasks._transform_band = wrap
    try:
        FSLL(cardinalities=cards, progress=False).fit(Xtr)
    finally:
        tasks._transform_band = orig
    return calls


def replay(calls, every: int, repeats: int, seed: int = 0) -> dict:
    """CPU milliseconds of the full and the sparse transform per kind of call (one thread)."""
    from fsll_ooc.kernels import transform as ft

    rng = np.random.default_rng(seed)
    out: dict = {}
    for shape, axes, tr, nonzero, needed in calls[::every]:
        kind = "nonzero" if nonzero is not None else ("needed" if needed is not None else None)
        if kind is None:
            continue
        if nonzero is not None:
            a0 = np.zeros(shape)
            a0.reshape(-1)[nonzero] = rng.standard_normal(nonzero.size) * 0.1
        else:
            a0 = rng.standard_normal(shape)
        res = {}
        for name, fn in (("full", lambda a: ft.transform_inplace(a, axes, transpose=tr, parallel=False)),
                         ("sparse", lambda a: ft.transform_sparse(a, axes, transpose=tr, nonzero=nonzero,
                                                                  needed=needed, parallel=False))):
            best = np.inf
            for _ in range(repeats):
                a = a0.copy()
                t0 = time.process_time()
                fn(a)
                best = min(best, time.process_time() - t0)
            res[name] = (best, a)
        at = slice(None) if needed is None else needed
        same = np.array_equal(res["full"][1].reshape(-1)[at].view(np.int64),
                              res["sparse"][1].reshape(-1)[at].view(np.int64))
        row = out.setdefault(kind, {"calls": 0, "cells": 0, "full": 0.0, "sparse": 0.0, "same": True})
        row["calls"] += 1
        row["cells"] += (nonzero if nonzero is not None else needed).size
        row["full"] += res["full"][0] * 1e3
        row["sparse"] += res["sparse"][0] * 1e3
        row["same"] &= bool(same)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", default="survey")
    ap.add_argument("--every", type=int, default=5, help="replay every k-th recorded transform")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    calls = record(args.case)
    out = replay(calls, args.every, args.repeats)
    load = os.getloadavg()[0]
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load {load:.2f}; case {args.case}, "
          f"{len(calls)} transforms recorded, every {args.every}th replayed on one thread")
    print("| transform | calls | mean cells given | full [ms/call] | sparse [ms/call] | same bits |")
    print("|---|---|---|---|---|---|")
    for kind, label in (("nonzero", "inverse, from the sparse theta"), ("needed", "forward, read at the cells")):
        r = out.get(kind)
        if r:
            n = r["calls"]
            print(f"| {label} | {n} | {r['cells'] / n:.0f} | {r['full'] / n:.1f} | {r['sparse'] / n:.1f} | "
                  f"{'yes' if r['same'] else 'NO'} |")


if __name__ == "__main__":
    main()
