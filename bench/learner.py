#!/usr/bin/env python
"""The learner's own work: default fits timed on the tables where the search, not the passes, is the cost.

Cases (``--cases``):

* ``24``, ``22``: ``bench/scale.py``'s binary networks (``2^24``/``2^22`` cells, 10^5 rows), in core;
* ``survey``: a survey-like table, cardinalities 7,5,9,9,3,4,4,2,2,2,3,2 (``2^22.6`` cells),
  13,000 training rows and 3,000 held-out rows from a random Bayesian network with strong
  conditional tables (:func:`strong_bn`: one parent each, rows drawn from a Dirichlet(0.3));
* ``sachs-like``: 11 ternary variables (``3^11`` cells), 7,466 + 2,000 rows, up to 2 parents each;
* ``nltcs-like``: 16 binary variables, 16,181 + 3,236 rows, up to 2 parents (NLTCS's shape; the data set
  itself is not available here).

Each fit is timed warm (a first fit of the same case compiles and loads the kernels, then
``--repeats`` timed fits; the fastest is kept) and scored on the held-out rows (mean
log-likelihood per row, nats); the table gives the fastest fit's wall time and the least CPU
time of the process over the timed fits (all its threads; steadier than the wall clock on a
shared machine).  ``--roots A B`` runs each case under several checkouts of the
project, interleaved (A, B, A, B, ...) in child processes, for before/after figures on a
shared machine; ``--threads`` sets ``NUMBA_NUM_THREADS`` (and the fit's helper threads) of
the children.

``--phases`` also adds up, in each child's fastest fit, the wall time of the learner's
phases (:data:`PHASES`: the penalty scale's sub-fits, the table passes and sweeps and what
runs in them, the batches and their sub-table search, the corrective phases...) and prints
them as a second table: a profile on the wall clock, without a profiler's own cost.

Usage::

    python bench/learner.py --cases 24 survey --threads 1 2 --roots /path/old /path/new --rounds 2
    python bench/learner.py --cases 24 --threads 1 --roots /path/old /path/new --phases --repeats 1
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SURVEY_CARDS = (7, 5, 9, 9, 3, 4, 4, 2, 2, 2, 3, 2)
#: case -> (cardinalities, training rows, held-out rows, parents per variable)
CASES = {"survey": (SURVEY_CARDS, 13_000, 3_000, 1), "sachs-like": ((3,) * 11, 7_466, 2_000, 2),
         "nltcs-like": ((2,) * 16, 16_181, 3_236, 2)}


def strong_bn(cards, n_parents=2, alpha=0.3, seed=0):
    """A random Bayesian network with strong dependencies: each variable has up to ``n_parents``
    parents among the earlier ones, and each row of its conditional table is drawn from a
    symmetric Dirichlet(``alpha``) (``alpha < 1``: most rows put most mass on one value)."""
    rng = np.random.default_rng(seed)
    parents, cpts = [], []
    for i, k in enumerate(cards):
        ps = sorted(rng.choice(i, size=min(i, n_parents), replace=False).tolist()) if i else []
        shape = [cards[p] for p in ps] + [k]
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        cpts.append(rng.dirichlet(np.full(k, alpha), size=rows).reshape(shape))
        parents.append(ps)
    return parents, cpts


def sample(cards, parents, cpts, n, seed):
    """``n`` rows by ancestral sampling (``bench/scale.py``'s sampler)."""
    sys.path.insert(0, HERE)
    from scale import ancestral_sample

    return ancestral_sample(cards, parents, cpts, n, seed)


def case_data(case: str, seed: int = 0):
    """``(train, test, cards)`` of a case."""
    if case in CASES:
        cards, n_train, n_test, n_parents = CASES[case]
        parents, cpts = strong_bn(cards, n_parents=n_parents, seed=seed)
        return sample(cards, parents, cpts, n_train, seed + 1), sample(cards, parents, cpts, n_test, seed + 2), cards
    sys.path.insert(0, HERE)
    from scale import ancestral_sample, random_bn

    cards = (2,) * int(case)
    parents, cpts = random_bn(cards, 3, 0)
    return ancestral_sample(cards, parents, cpts, 100_000, 1), ancestral_sample(cards, parents, cpts, 10_000, 2), cards


#: ``--phases``: (module, attribute, label) of the functions whose wall time a child adds up
#: (inclusive: a phase's time holds the phases it calls; a name a tree lacks is left out).
PHASES = [("fsll_ooc.fitting", "choose_penalty_scale", "penalty-scale sub-fits"),
          ("fsll_ooc.engine.engine", "Engine._run", "table passes and sweeps"),
          ("fsll_ooc.engine.tasks", "_transform_band", "in passes: transforms"),
          ("fsll_ooc.kernels.bandops", "elementwise", "in passes: elementwise steps and sums"),
          ("fsll_ooc.engine.tasks", "second_order_top", "in passes: joint candidates"),
          ("fsll_ooc.engine.tasks", "_sparse_band", "in passes: sparse fills"),
          ("fsll_ooc.kernels", "top_appends_threads", "in passes: top-k appends"),
          ("fsll_ooc.learn.greedy", "Search.batch", "batches (steps, pass, corrective phase)"),
          ("fsll_ooc.kernels.search", "search_sub", "in batches: sub-table search"),
          ("fsll_ooc.learn.corrective", "refine", "corrective phases"),
          ("fsll_ooc.learn.corrective", "joint_append", "joint selections"),
          ("fsll_ooc.engine.engine", "Engine.gather", "gathers")]


def _time_phases() -> dict:
    """Wrap the :data:`PHASES` functions so that each adds its wall time to the returned dict."""
    import functools
    import importlib

    acc: dict = {}
    for mod_name, attr, label in PHASES:
        try:
            owner = importlib.import_module(mod_name)
            names = attr.split(".")
            for nm in names[:-1]:
                owner = getattr(owner, nm)
            fn = getattr(owner, names[-1])
        except (ImportError, AttributeError):
            continue

        def timed(*a, _fn=fn, _label=label, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[_label] = acc.get(_label, 0.0) + time.perf_counter() - t0

        # a compiled kernel keeps its dispatcher's attributes (the search asks it for signatures)
        setattr(owner, names[-1], _Timed(fn, timed) if hasattr(fn, "typeof_pyval") else functools.wraps(fn)(timed))
    return acc


class _Timed:
    """A numba dispatcher that times its calls and answers for it otherwise."""

    def __init__(self, disp, timed):
        self._disp, self._timed = disp, timed

    def __call__(self, *a, **k):
        return self._timed(*a, **k)

    def __getattr__(self, name):
        return getattr(self._disp, name)


def child(case: str, repeats: int, kw: dict, phases: bool = False) -> dict:
    """One case in this process: a warm-up fit, then the timed ones (with ``phases``, the wall
    time of each of :data:`PHASES` in the fastest)."""
    from fsll_ooc import FSLL

    acc = _time_phases() if phases else {}
    Xtr, Xte, cards = case_data(case)
    FSLL(cardinalities=cards, progress=False, **kw).fit(Xtr[: max(len(Xtr) // 10, 200)])
    times, cpus, split = [], [], {}
    for _ in range(repeats):
        acc.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        m = FSLL(cardinalities=cards, progress=False, **kw).fit(Xtr)
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if times[-1] == min(times):
            split = dict(acc)
    ll = float(np.mean(m.log_prob(Xte)))
    return {"case": case, "time": min(times), "times": times, "cpu": min(cpus), "ll": ll, "terms": int(m.n_bases_),
            "iters": int(m.n_iter_), "phases": split}


def run_child(root: str, case: str, threads: int, repeats: int, kw: dict, phases: bool = False) -> dict:
    path = os.pathsep.join([root] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = dict(os.environ, PYTHONPATH=path, NUMBA_NUM_THREADS=str(threads),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case, "--repeats", str(repeats),
           "--kw", json.dumps(kw)] + (["--phases"] if phases else [])
    out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"case": case, "error": out.stderr.strip().splitlines()[-1:] or ["?"]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def commit_of(root: str) -> str:
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return "?"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["24", "survey"])
    ap.add_argument("--roots", nargs="+", default=[os.path.dirname(HERE)], help="project checkouts to compare")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds over the roots")
    ap.add_argument("--repeats", type=int, default=2, help="timed fits per child (the fastest is kept)")
    ap.add_argument("--kw", default="{}", help="FSLL keyword arguments as JSON (default: the defaults)")
    ap.add_argument("--phases", action="store_true",
                    help="also add up the wall time of the learner's phases (PHASES) and print them")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    kw = json.loads(args.kw)
    if args.child:
        print(json.dumps(child(args.child, args.repeats, kw, args.phases)))
        return
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} CPUs; fits {kw or 'default'}")
    print("| case | threads | root (commit) | round | fit s (best of repeats) | CPU s (best) | held-out LL | terms | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    runs = []
    for case in args.cases:
        for threads in args.threads:
            for rnd in range(args.rounds):
                for root in args.roots:
                    r = run_child(root, case, threads, args.repeats, kw, args.phases)
                    load = os.getloadavg()[0]
                    if "error" in r:
                        print(f"| {case} | {threads} | {root} ({commit_of(root)}) | {rnd} | error: {r['error'][0]} | | | | |")
                        continue
                    print(f"| {case} | {threads} | {root} ({commit_of(root)}) | {rnd} | {r['time']:.2f} "
                          f"({', '.join(f'{t:.2f}' for t in r['times'])}) | {r['cpu']:.2f} | {r['ll']:.5f} | {r['terms']} | "
                          f"{load:.2f} |",
                          flush=True)
                    runs.append((f"{case}, {threads} thr, {commit_of(root)}, round {rnd}", r))
    if args.phases and runs:  # the fastest fit of each child, phase by phase (inclusive wall seconds)
        print("\n| phase (inclusive) | " + " | ".join(name for name, _ in runs) + " |")
        print("|---|" + "---|" * len(runs))
        print("| whole fit | " + " | ".join(f"{r['time']:.2f}" for _, r in runs) + " |")
        for _, _, label in PHASES:
            cells = [r["phases"].get(label) for _, r in runs]
            if any(c is not None for c in cells):
                print(f"| {label} | " + " | ".join("" if c is None else f"{c:.2f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
