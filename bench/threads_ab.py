#!/usr/bin/env python
"""Fits at 1, 2, ... threads, two source trees interleaved: wall time, the time in table
passes and sweeps, the host share, and the model (terms, KL to the data).

Data: the random Bayesian networks of ``bench/scale.py`` (binary, ``2^k`` cells, 10^5 rows).
Each fit runs in its own process with ``NUMBA_NUM_THREADS`` set to the thread count and
``PYTHONPATH`` to the tree, after a small warm-up fit (kernels loaded or compiled); the
order is case, mode, repeat, thread count, tree, so the machine's load falls alike on
every arm.  ``default``: ``FSLL()``; ``paper``: ``epsilon=1e-4`` with ``max_iter=150``.
In core by default; ``--store DIR``: out of core, a memmap store under ``DIR`` planned for
``--cap`` of memory (the planner's limit, no cgroup), removed after each fit;
``--schedulers`` (out of core): the ``scheduler`` values to compare on the ``after`` tree
(``default`` is the library's choice, also the ``before`` tree's).

Usage::

    python bench/threads_ab.py --before /path/to/old --after . --cases 22 24 --threads 1 2 \\
        --modes default paper --repeat 2 --out /tmp/threads.jsonl
    python bench/threads_ab.py --before /path/to/old --after . --cases 26 --modes default --threads 2 \
        --store /work/scratch --schedulers default pool --repeat 2 --out /tmp/ooc.jsonl
    python bench/threads_ab.py --report /tmp/threads.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def one(case: int, mode: str, store: str | None = None, cap: str = "4GiB", scheduler: str = "default") -> dict:
    """The fit, in this process (the tree first on ``sys.path``)."""
    import shutil

    import numpy as np

    sys.path.insert(0, str(HERE))
    from scale import ancestral_sample, random_bn

    from fsll_ooc import FSLL

    cards = (2,) * case
    parents, cpts = random_bn(cards, 3, seed=0)
    X = ancestral_sample(cards, parents, cpts, 100_000, seed=1)
    FSLL(progress=False).fit(np.random.default_rng(0).integers(0, 2, size=(300, 10)))
    FSLL(progress=False, epsilon=1e-4, max_iter=20).fit(np.random.default_rng(0).integers(0, 2, size=(300, 10)))
    engines = []
    try:  # the engines of the fit and of the penalty scale's sub-fits (older trees: a method of FSLL)
        from fsll_ooc import fitting as owner
        name = "make_engine"
    except ImportError:
        owner, name = FSLL, "_make_engine"
    make = getattr(owner, name)

    def recording(*a, **k):
        engines.append(make(*a, **k))
        return engines[-1]

    setattr(owner, name, recording if owner is not FSLL else lambda self, *a, **k: recording(self, *a, **k))
    kw = {} if mode == "default" else {"epsilon": 1e-4, "max_iter": 150}
    if store:
        kw.update(store=Path(store) / f"threads_ab_{os.getpid()}.mm", backend="memmap", memory_limit=cap)
        if scheduler != "default":
            kw["scheduler"] = scheduler
    t0 = time.perf_counter()
    try:
        m = FSLL(progress=False, **kw).fit(X)
        wall = time.perf_counter() - t0
    finally:
        if store:
            shutil.rmtree(kw["store"], ignore_errors=True)
    passes = sum(e.pass_seconds for e in engines)
    sweeps = sum(getattr(e, "sweep_seconds", 0.0) for e in engines)
    return {"wall": wall, "pass_s": passes, "sweep_s": sweeps, "host_share": (wall - passes - sweeps) / wall,
            "n_bases": int(m.n_bases_), "n_iter": int(m.n_iter_), "kl_data": float(m.kl_data_),
            "passes": sum(e.passes for e in engines)}


def report(path: str) -> str:
    import statistics

    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    groups: dict = {}
    for r in rows:
        arm = r["arm"] + (f" ({r['scheduler']})" if r.get("scheduler", "default") != "default" else "")
        groups.setdefault((r["case"], r["mode"], arm, r["threads"]), []).append(r)
    out = ["| case | mode | tree | threads | wall s (median) | runs | passes + sweeps s | host share | terms | KL(p_d‖p) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for (case, mode, arm, th), rs in sorted(groups.items()):
        med = statistics.median(r["wall"] for r in rs)
        out.append(f"| 2^{case} | {mode} | {arm} | {th} | {med:.2f} | {', '.join(format(r['wall'], '.2f') for r in rs)} | "
                   f"{statistics.median(r['pass_s'] + r['sweep_s'] for r in rs):.2f} | "
                   f"{100 * statistics.median(r['host_share'] for r in rs):.0f} % | {rs[0]['n_bases']} | "
                   f"{rs[0]['kl_data']:.6f} |")
    out.append("")
    out.append("| case | mode | tree | speed-up 1 -> max threads (medians) |")
    out.append("|---|---|---|---|")
    for case, mode, arm in sorted({k[:3] for k in groups}):
        ths = sorted(k[3] for k in groups if k[:3] == (case, mode, arm))
        if len(ths) > 1:
            w = {t: statistics.median(r["wall"] for r in groups[(case, mode, arm, t)]) for t in ths}
            out.append(f"| 2^{case} | {mode} | {arm} | {w[ths[0]] / w[ths[-1]]:.2f}x ({ths[0]} -> {ths[-1]}) |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=None)
    ap.add_argument("--after", default=".")
    ap.add_argument("--cases", type=int, nargs="+", default=[22, 24])
    ap.add_argument("--modes", nargs="+", choices=("default", "paper"), default=["default", "paper"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", default=None)
    ap.add_argument("--store", default=None)
    ap.add_argument("--cap", default="4GiB")
    ap.add_argument("--schedulers", nargs="+", default=["default"])
    ap.add_argument("--child", nargs=5, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        case, mode, store, cap, sched = args.child
        print("RESULT " + json.dumps(one(int(case), mode, store or None, cap, sched)), flush=True)
        return
    if args.report:
        print(report(args.report))
        return
    arms = ([("before", args.before, "default")] if args.before else []) + [
        ("after", args.after, sc) for sc in (args.schedulers if args.store else ["default"])]
    out = open(args.out, "a") if args.out else None
    for case in args.cases:
        for mode in args.modes:
            for rep in range(args.repeat):
                for th in args.threads:
                    for arm, tree, sched in arms:
                        env = dict(os.environ, NUMBA_NUM_THREADS=str(th), PYTHONPATH=str(Path(tree).resolve()))
                        load = os.getloadavg()[0]
                        proc = subprocess.run([sys.executable, __file__, "--child", str(case), mode, args.store or "",
                                               args.cap, sched], env=env,
                                              capture_output=True, text=True)
                        res = [json.loads(l[7:]) for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
                        if proc.returncode or not res:
                            print(f"{arm} 2^{case} {mode} {th} threads failed:\n{proc.stderr[-2000:]}", flush=True)
                            continue
                        row = {"case": case, "mode": mode, "arm": arm, "scheduler": sched, "threads": th, "rep": rep,
                               "load1": load, "store": bool(args.store),
                               **res[0]}
                        print(json.dumps(row), flush=True)
                        if out:
                            out.write(json.dumps(row) + "\n")
                            out.flush()
    if out:
        out.close()
        print(report(args.out))


if __name__ == "__main__":
    main()
