"""Interleaved A/B speed comparison of two source trees of fsll-ooc, in one run.

Usage: python bench/ab.py REF_TREE NEW_TREE [--rounds 5]

Each round runs one fresh interpreter per tree (A, B, then B, A: alternating, so a
change in the machine's load hits both alike) with ``PYTHONPATH`` set to the tree;
each measures, after loading the kernels: warm fits of Ising5x4S and BN20-54L (best of
3, epsilon 1e-4; wall clock and the CPU time of all threads, which a busy machine
inflates less), the median seconds per iteration of 30 iterations on a 2^20 binary
table (the fused update + scan), a full transform of a 2^20 table (best of 3), and the
CPU time of one update + scan pass of a 2^10 table (the Python around a pass).
The best of all rounds is reported per tree, with the ratio new / ref.  Run it under
``nice`` on a shared machine and report ``uptime`` with the result.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
from fsll_ooc import FSLL, datasets
from fsll_ooc.kernels.transform import transform_inplace
sys.path.insert(0, BENCH)
from ab import best_seconds, structured_binary

out = {}
for name in ("Ising5x4S", "BN20-54L"):
    X, _ = datasets.paper_dataset(name, seed=0)
    FSLL(epsilon=1e-4, progress=False, max_iter=2).fit(X)  # load the kernels
    ts, cs = [], []
    for _ in range(3):
        t, c = time.perf_counter(), time.process_time()
        FSLL(epsilon=1e-4, progress=False).fit(X)
        ts.append(time.perf_counter() - t)
        cs.append(time.process_time() - c)
    out[name + " fit (s)"] = min(ts)
    out[name + " fit, CPU of all threads (s)"] = min(cs)
n = 20
X = structured_binary(n)  # the data of bench/perf.py's iteration rows too
m = FSLL(epsilon=1e-4, progress=False, max_iter=30, resync_every=10**9).fit(X)
out["2^20 iteration (ms)"] = 1e3 * float(np.median(np.diff([h["time"] for h in m.history_[1:]])))
a = np.random.default_rng(1).random((2,) * n)
out["2^20 transform (ms)"] = 1e3 * best_seconds(lambda: transform_inplace(a))
# the Python around one pass: update + scan of a 2^10 table (kernel time ~ nothing), CPU time
from fsll_ooc.engine import Step
eng = FSLL(epsilon=1e-4, progress=False, max_iter=2).fit(structured_binary(10))._engine
digits = (1,) + (0,) * 9
step = Step(digits, 0.0, float(eng.gather(np.array([512]))[0]))  # delta 0: the table stays as it is
none = np.zeros(0, np.int64)
best = float("inf")
for _ in range(5):
    c = time.process_time()
    for _ in range(400):
        eng.update_scan(step, none)
    best = min(best, (time.process_time() - c) / 400)
out["2^10 pass, CPU (us)"] = 1e6 * best
print(json.dumps(out))
"""


def structured_binary(n: int, rows: int = 20000) -> np.ndarray:
    """``rows`` samples of ``n`` binary variables with structure, so that iterations pick
    terms of several orders (seeded by ``n``)."""
    import numpy as np

    rng = np.random.default_rng(n)
    X = rng.integers(0, 2, size=(rows, n))
    for j in range(1, n):
        flip = rng.random(rows) < 0.2
        X[:, j] = np.where(flip, X[:, j], X[:, j - 1] ^ X[:, (j * 7) % j])
    return X


def best_seconds(f, reps: int = 3) -> float:
    """The best wall-clock seconds of ``reps`` calls of ``f()``."""
    import time

    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def run(tree: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    code = CHILD.replace("BENCH", repr(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    best = {"ref": {}, "new": {}}
    for r in range(args.rounds):
        order = ("ref", "new") if r % 2 == 0 else ("new", "ref")
        for which in order:
            res = run(getattr(args, which))
            print(f"round {r} {which}: {res}  load {os.getloadavg()[0]:.1f}", flush=True)
            for k, v in res.items():
                best[which][k] = min(v, best[which].get(k, float("inf")))
    print(f"\n| measure | ref (best of {args.rounds}) | new (best of {args.rounds}) | new / ref |\n|---|---|---|---|")
    for k in best["ref"]:
        print(f"| {k} | {best['ref'][k]:.4g} | {best['new'][k]:.4g} | {best['new'][k] / best['ref'][k]:.3f} |")


if __name__ == "__main__":
    main()
