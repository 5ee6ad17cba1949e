"""First use after installing vs later: the seconds numba's compiling adds to each path.

Each path the defaults take runs in a fresh process twice against one numba cache
directory: first with the directory empty (what the first run after installing sees:
every kernel compiled), then again (the kernels loaded from the cache: a warm start).
The processes share nothing else, so "cold - warm" is the compile time the path pays.
numba's compile events name the kernels and specialisations each path compiles.

    PYTHONPATH=. python bench/coldstart.py                    # all paths, a table
    PYTHONPATH=. python bench/coldstart.py --paths in_core --json
    PYTHONPATH=. python bench/coldstart.py --kernels          # + which kernels compile, and how long

Paths (the data: a 20-variable paper dataset, 2^20 cells; ``--data`` for another):

* ``in_core``: ``FSLL().fit(X)`` (the default: ``epsilon="auto"``, corrective steps);
* ``paper``: ``FSLL(epsilon=1e-4).fit(X)`` (the paper's algorithm);
* ``out_of_core``: ``FSLL(store=..., memory_limit=...).fit(X)`` with bands (chunked);
* ``queries``: a fitted model's ``marginal``, ``conditional``, ``mode``, ``log_prob``;
* ``sample``: ``model.sample(10_000)``;
* ``demo``: the ``fsll-ooc demo`` command (its kernel warm-up and its fit).

Every path is timed from the start of the process (imports included) to the end of
its work, so what a user waits for is what is measured: wall seconds, and the CPU
seconds of the process (user + system, all threads), which a busy machine inflates
far less (compiling is single-threaded work; a warm fit's kernels use every core).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PATHS = ("in_core", "paper", "out_of_core", "queries", "sample", "demo")

# The child: runs one path, prints one JSON line.  Kept as source text so that the
# child imports nothing of this script.
_CHILD = r'''
import json, os, sys, tempfile, time
t_start = time.perf_counter()
_rec = None
if os.environ.get("COLDSTART_EVENTS"):
    from numba.core import event as ev

    _rec = ev.RecordingListener()
    ev.register("numba:compile", _rec)
import numpy as np
path, data_name, workdir = sys.argv[1], sys.argv[2], sys.argv[3]
t_import = time.perf_counter()
from fsll_ooc import FSLL, datasets
t_import = time.perf_counter() - t_import
X, _ = datasets.paper_dataset(data_name, seed=0)
t0 = time.perf_counter()
if path == "in_core":
    FSLL(progress=False).fit(X)
elif path == "paper":
    FSLL(epsilon=1e-4, progress=False).fit(X)
elif path == "out_of_core":
    store = os.path.join(workdir, "store")
    m = FSLL(store=store, memory_limit="1GiB", layout=(4, 12), epsilon=1e-4, max_iter=10, progress=False).fit(X)
elif path in ("queries", "sample"):
    m = FSLL(epsilon=1e-4, max_iter=5, progress=False).fit(X)  # the model to ask; same kernels as 'paper'
    t0 = time.perf_counter()
    if path == "queries":
        m.marginal([0, 1]); m.conditional(0, given={1: 0}); m.mode(k=3); m.log_prob(X[:100])
    else:
        m.sample(10_000, random_state=0)
elif path == "demo":
    from fsll_ooc import cli
    import io, contextlib
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = cli.main(["demo", "--dataset", data_name, "--quiet"])
    assert rc == 0
work = time.perf_counter() - t0
total = time.perf_counter() - t_start
import resource
ru = resource.getrusage(resource.RUSAGE_SELF)
out = {"path": path, "work_seconds": work, "total_seconds": total, "import_seconds": t_import,
       "cpu_seconds": ru.ru_utime + ru.ru_stime}
if _rec is not None:  # pair each compile's start and end: seconds per kernel and signature
    starts, comp = {}, []
    for stamp, e in _rec.buffer:
        d = e.data.get("dispatcher")
        key = id(d), str(e.data.get("args"))
        if e.is_start:
            starts[key] = stamp
        else:
            f = getattr(d, "py_func", None)
            comp.append([f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', d)}",
                         str(e.data.get("args")), stamp - starts.pop(key, stamp)])
    out["compiles"] = comp
print("COLDSTART " + json.dumps(out))
'''


def run_child(path: str, data: str, cache_dir: str, events: bool, tree: str | None = None) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    if tree is not None:  # import fsll_ooc from this source tree
        env["PYTHONPATH"] = os.path.abspath(tree)
    if events:
        env["COLDSTART_EVENTS"] = "1"
    with tempfile.TemporaryDirectory(prefix="coldstart-") as work:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _CHILD, path, data, work], env=env, capture_output=True,
                              text=True)
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"path {path} failed:\n{proc.stderr[-3000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("COLDSTART ")][-1]
    out = json.loads(line[len("COLDSTART "):])
    out["process_seconds"] = wall
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--data", default="BN20-37S", help="paper dataset name (default: %(default)s)")
    ap.add_argument("--warm-runs", type=int, default=1, help="warm runs per path (the minimum is reported)")
    ap.add_argument("--kernels", action="store_true", help="list the kernels each cold run compiles")
    ap.add_argument("--trees", nargs="+", metavar="DIR",
                    help="source trees to compare (each path runs on each tree in turn, interleaved); "
                         "default: the fsll_ooc this script imports")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for path, tree in [(p, t) for p in args.paths for t in (args.trees or [None])]:
        with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
            cold = run_child(path, args.data, cache, args.kernels, tree)
            warm = min((run_child(path, args.data, cache, False, tree) for _ in range(args.warm_runs)),
                       key=lambda r: r["process_seconds"])
        row = {"path": path, "tree": tree, "cold_seconds": cold["process_seconds"], "warm_seconds": warm["process_seconds"],
               "cold_work": cold["work_seconds"], "warm_work": warm["work_seconds"],
               "extra_seconds": cold["process_seconds"] - warm["process_seconds"],
               "cold_cpu": cold["cpu_seconds"], "warm_cpu": warm["cpu_seconds"],
               "extra_cpu": cold["cpu_seconds"] - warm["cpu_seconds"]}
        if args.kernels:
            row["compiles"] = cold.get("compiles", [])
        rows.append(row)
        if not args.json:
            print((f"[{tree}] " if tree else "") + f"{path:<12} wall: cold {row['cold_seconds']:7.2f} s  warm {row['warm_seconds']:6.2f} s  "
                  f"(+{row['extra_seconds']:6.2f})   cpu: cold {row['cold_cpu']:6.2f} s  warm {row['warm_cpu']:6.2f} s  "
                  f"(+{row['extra_cpu']:6.2f})", flush=True)
            if args.kernels:
                comp = sorted(row["compiles"], key=lambda c: -c[2])
                total = sum(c[2] for c in comp)
                print(f"    {len(comp)} compilations, {total:.1f} s (nested ones counted in their callers too)")
                for name, sig, sec in comp[:25]:
                    print(f"    {sec:6.2f} s  {name}{sig[:110]}")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
