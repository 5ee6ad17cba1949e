"""First use after installing vs later: the seconds numba's compiling adds to each path.

Each path the defaults take runs in a fresh process twice against one numba cache:
first with the cache empty (what the first run after installing sees: every kernel
compiled), then again (the kernels loaded from the cache: a warm start).  The processes
share nothing else, so "cold - warm" is the compile time the path pays.  numba's
compile events name the kernels and specialisations each path compiles.

    PYTHONPATH=. python bench/coldstart.py                    # all paths, a table
    PYTHONPATH=. python bench/coldstart.py --paths in_core --json
    PYTHONPATH=. python bench/coldstart.py --kernels          # + which kernels compile, and how long
    PYTHONPATH=. python bench/coldstart.py --trees A B --rounds 3   # two source trees, interleaved
    python bench/coldstart.py --venv /tmp/cs-venv             # pip install into a fresh venv first

With ``--venv DIR`` each tree is installed by ``pip install TREE`` (not editable) into a
new virtual environment under ``DIR`` (pip's cache supplies the dependencies' wheels),
and each run starts in an empty directory with numba's cache where a user's is
(``__pycache__`` beside the installed kernels, emptied before each cold run).  Without
it, the tree is imported through ``PYTHONPATH`` and numba caches in a directory of our
own (``NUMBA_CACHE_DIR``).

Paths (the data: a 20-variable paper dataset, 2^20 cells; ``--data`` for another):

* ``in_core``: ``FSLL().fit(X)`` (the default: ``epsilon="auto"``, corrective steps);
* ``paper``: ``FSLL(epsilon=1e-4).fit(X)`` (the paper's algorithm);
* ``out_of_core``: ``FSLL(store=...).fit(X)`` in 2 x 2 bands (chunked; 10 iterations);
* ``queries``: a saved model loaded in a new process: ``marginal``, ``conditional``,
  ``mode``, ``log_prob``;
* ``sample``: the same, ``model.sample(10_000)``;
* ``demo``: the ``fsll-ooc demo`` command (its kernel warm-up and its fit).

Every path is timed from the start of the process (imports included) to the end of
its work, so what a user waits for is what is measured: wall seconds, and the CPU
seconds of the process and of the processes it started (a fit compiles the update +
scan kernels in a second process on its first run after installing:
``fsll_ooc.kernels.ahead``), user + system, all threads, which a busy machine
inflates far less than the wall clock.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
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
    FSLL(store=store, layout=(1, 2), epsilon=1e-4, max_iter=10, progress=False).fit(X)  # 2 x 2 bands
elif path == "setup":  # the model the query paths load (not timed)
    FSLL(epsilon=1e-4, progress=False).fit(X).save(os.path.join(workdir, "model.json"))
elif path in ("queries", "sample"):  # a saved model in a new process
    m = FSLL.load(os.path.join(workdir, "model.json"))
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
rc = resource.getrusage(resource.RUSAGE_CHILDREN)  # processes the package started and waited for
out = {"path": path, "work_seconds": work, "total_seconds": total, "import_seconds": t_import,
       "cpu_seconds": ru.ru_utime + ru.ru_stime + rc.ru_utime + rc.ru_stime,
       "child_cpu_seconds": rc.ru_utime + rc.ru_stime}
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


class Install:
    """Where a child imports ``fsll_ooc`` from and where numba caches its kernels.

    ``tree`` alone: the source tree on ``PYTHONPATH`` (``None``: as this script imports it), the
    cache in a directory of our own (``NUMBA_CACHE_DIR``).  With ``venv``: a virtual
    environment with the package installed by ``pip install TREE`` (not editable), run
    from an empty directory, numba's cache where a user's is (``__pycache__`` beside the
    installed kernels), emptied for each cold run: the first run after installing.
    """

    def __init__(self, tree: str | None, venv: str | None = None):
        self.tree, self.venv = tree, venv
        self._cache = None if venv else tempfile.mkdtemp(prefix="numba-cache-")
        self.python = os.path.join(venv, "bin", "python") if venv else sys.executable
        if venv:
            self.site = subprocess.run([self.python, "-c", "import fsll_ooc, os; print(os.path.dirname(fsll_ooc.__file__))"],
                                       capture_output=True, text=True, check=True, cwd=tempfile.gettempdir()).stdout.strip()

    @classmethod
    def fresh_venv(cls, tree: str, venv: str) -> "Install":
        """Create ``venv`` (replacing an old one) and ``pip install`` the tree into it (pip's
        cache supplies the wheels of the dependencies); prints the seconds it took."""
        shutil.rmtree(venv, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "--disable-pip-version-check",
                        os.path.abspath(tree)], check=True)
        print(f"# {venv}: fresh venv, pip install {tree}: {time.perf_counter() - t0:.0f} s", flush=True)
        return cls(tree, venv)

    def clear_cache(self) -> None:
        if self.venv:
            for f in glob.glob(os.path.join(self.site, "**", "__pycache__", "*.nb[ic]"), recursive=True):
                os.remove(f)
        else:
            shutil.rmtree(self._cache, ignore_errors=True)
            os.makedirs(self._cache)

    def env(self) -> dict:
        env = dict(os.environ)
        if self.venv:
            env.pop("PYTHONPATH", None)
            env.pop("NUMBA_CACHE_DIR", None)
        else:
            env["NUMBA_CACHE_DIR"] = self._cache
            if self.tree is not None:  # import fsll_ooc from this source tree
                env["PYTHONPATH"] = os.path.abspath(self.tree)
            elif env.get("PYTHONPATH"):  # as given, but the children run in a directory of their own
                env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep))
        return env

    def close(self) -> None:
        if self._cache:
            shutil.rmtree(self._cache, ignore_errors=True)


def run_child(path: str, data: str, inst: Install, workdir: str, events: bool = False) -> dict:
    env = inst.env()
    if events:
        env["COLDSTART_EVENTS"] = "1"
    with tempfile.TemporaryDirectory(prefix="coldstart-", dir=workdir) as work:
        if os.path.exists(os.path.join(workdir, "model.json")):
            shutil.copy(os.path.join(workdir, "model.json"), work)
        t0 = time.perf_counter()
        proc = subprocess.run([inst.python, "-c", _CHILD, path, data, work], env=env, capture_output=True,
                              text=True, cwd=work)
        wall = time.perf_counter() - t0
        if path == "setup" and proc.returncode == 0:
            shutil.copy(os.path.join(work, "model.json"), workdir)
    if proc.returncode != 0:
        raise RuntimeError(f"path {path} failed:\n{proc.stderr[-3000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("COLDSTART ")][-1]
    out = json.loads(line[len("COLDSTART "):])
    out["process_seconds"] = wall
    return out


def measure(paths, installs, data: str, rounds: int = 1, warm_runs: int = 1, events: bool = False,
            quiet: bool = False) -> list[dict]:
    """Each round, each path, each install in turn (interleaved): a cold run (numba's cache
    emptied), then ``warm_runs`` warm ones (the best is kept).  One row per run of a path."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="coldstart-work-") as workdir:
        for inst in installs:  # the saved model of the query paths (fitted warm, then the cache emptied)
            if {"queries", "sample"} & set(paths):
                run_child("setup", data, inst, workdir)
        for rnd in range(rounds):
            for path in paths:
                for inst in installs:
                    inst.clear_cache()
                    cold = run_child(path, data, inst, workdir, events)
                    warm = min((run_child(path, data, inst, workdir) for _ in range(warm_runs)),
                               key=lambda r: r["process_seconds"])
                    row = {"path": path, "tree": inst.tree, "venv": inst.venv, "round": rnd,
                           "cold_seconds": cold["process_seconds"], "warm_seconds": warm["process_seconds"],
                           "extra_seconds": cold["process_seconds"] - warm["process_seconds"],
                           "cold_cpu": cold["cpu_seconds"], "warm_cpu": warm["cpu_seconds"],
                           "extra_cpu": cold["cpu_seconds"] - warm["cpu_seconds"],
                           "cold_child_cpu": cold["child_cpu_seconds"],
                           "extra_own_cpu": cold["cpu_seconds"] - cold["child_cpu_seconds"] - warm["cpu_seconds"],
                           "load": os.getloadavg()[0]}
                    if events:
                        row["compiles"] = cold.get("compiles", [])
                    rows.append(row)
                    if not quiet:
                        print_row(row, events)
    return rows


def print_row(row: dict, events: bool = False) -> None:
    tag = f"[{row['tree']}] " if row["tree"] else ""
    print(tag + f"{row['path']:<12} wall: cold {row['cold_seconds']:6.2f} s  warm {row['warm_seconds']:5.2f} s  "
          f"(+{row['extra_seconds']:5.2f})   cpu: cold {row['cold_cpu']:6.2f} s (second process "
          f"{row['cold_child_cpu']:4.2f})  warm {row['warm_cpu']:5.2f} s  (+{row['extra_cpu']:5.2f})  "
          f"load {row['load']:.1f}", flush=True)
    if events:
        comp = sorted(row["compiles"], key=lambda c: -c[2])
        print(f"    {len(comp)} compilations, {sum(c[2] for c in comp):.1f} s (nested ones counted in their callers too)")
        for name, sig, sec in comp[:25]:
            print(f"    {sec:6.2f} s  {name}{sig[:110]}")


def summary(rows: list[dict]) -> list[str]:
    """A markdown table: per path and install, the medians over the rounds."""
    out = ["| path | source | rounds | cold wall (s) | warm wall (s) | first use adds, wall (s) | cold CPU (s) | "
           "of which the second process | warm CPU (s) | first use adds, CPU (s) | of which in the path's own "
           "process | load |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = []
    for r in rows:
        if (r["path"], r["tree"]) not in keys:
            keys.append((r["path"], r["tree"]))
    for path, tree in keys:
        rs = [r for r in rows if r["path"] == path and r["tree"] == tree]

        def med(k):
            return statistics.median(r[k] for r in rs)

        rng = lambda k: f"{med(k):.1f}" + (f" ({min(r[k] for r in rs):.1f}-{max(r[k] for r in rs):.1f})" if len(rs) > 1 else "")
        out.append(f"| {path} | {tree or 'this tree'} | {len(rs)} | {rng('cold_seconds')} | {rng('warm_seconds')} | "
                   f"**{rng('extra_seconds')}** | {rng('cold_cpu')} | {med('cold_child_cpu'):.1f} | {rng('warm_cpu')} | "
                   f"{rng('extra_cpu')} | {rng('extra_own_cpu')} | "
                   f"{min(r['load'] for r in rs):.1f}-{max(r['load'] for r in rs):.1f} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--data", default="BN20-37S", help="paper dataset name (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=1, help="cold + warm measurements per path (medians reported)")
    ap.add_argument("--warm-runs", type=int, default=1, help="warm runs per cold one (the minimum is reported)")
    ap.add_argument("--kernels", action="store_true", help="list the kernels each cold run compiles")
    ap.add_argument("--trees", nargs="+", metavar="DIR",
                    help="source trees to compare (each path runs on each tree in turn, interleaved); "
                         "default: the fsll_ooc this script imports")
    ap.add_argument("--venv", metavar="DIR",
                    help="install each tree (default: this script's tree) into a fresh virtual environment "
                         "under DIR with pip, and measure the installed package (the first run after installing)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if args.venv:
        trees = args.trees or [here]
        installs = [Install.fresh_venv(t, os.path.join(args.venv, f"venv-{i}")) for i, t in enumerate(trees)]
    else:
        installs = [Install(t) for t in (args.trees or [None])]
    try:
        rows = measure(args.paths, installs, args.data, args.rounds, args.warm_runs, args.kernels, quiet=args.json)
    finally:
        for inst in installs:
            inst.close()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
