"""Interleaved A/B of fit wall time between two source trees, at the default and at epsilon=1e-4.

    git archive OLD_COMMIT | tar -x -C /tmp/old          # a tree of each version
    python bench/ab_fit_time.py /tmp/old /path/to/new 6  # 6 processes per side, alternating

Each child process imports its tree, compiles with a short fit, then fits the paper's
``BN20-37L`` three times per setting and reports the fastest and the cost (which must
agree between the trees).  Prints each child's result, then median and min per side.
"""
import json
import subprocess
import sys

OLD, NEW = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
CHILD = r'''
import time, json, numpy as np
from fsll_ooc import FSLL, datasets
X, _ = datasets.paper_dataset("BN20-37L", seed=0)
FSLL(progress=False, max_iter=3).fit(X)  # compile / warm up
out = {}
for eps in ("auto", 1e-4):
    ts = []
    for _ in range(3):
        t = time.perf_counter(); m = FSLL(epsilon=eps, progress=False).fit(X); ts.append(time.perf_counter() - t)
    out[str(eps)] = [min(ts), repr(m.cost_)]
print(json.dumps(out))
'''
res = {"old": [], "new": []}
for r in range(rounds):
    for tag, path in (("old", OLD), ("new", NEW)) if r % 2 == 0 else (("new", NEW), ("old", OLD)):
        p = subprocess.run([sys.executable, "-c", CHILD], env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"}, cwd=path,
                           capture_output=True, text=True)
        res[tag].append(json.loads(p.stdout.strip().splitlines()[-1]))
        print(tag, res[tag][-1], flush=True)
for tag in res:
    for eps in ("auto", "0.0001"):
        ts = sorted(x[eps][0] for x in res[tag])
        print(f"{tag} eps={eps}: median {ts[len(ts)//2]:.2f} s, min {ts[0]:.2f} s, runs {['%.2f' % t for t in ts]}")
