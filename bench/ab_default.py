#!/usr/bin/env python
"""The default fit of two source trees, interleaved: KL(p*||p) or held-out log-likelihood and time.

Each fit runs in its own process (``PYTHONPATH`` set to the tree, kernels warmed up on a
small table first), in the order: the default ``FSLL()`` of ``--before``, the default of
``--after``, then ``FSLL(penalty_scale=1.0)`` (FL-scale1) and ``FSLL(penalty="paper",
penalty_scale=1.0)`` (FL-paper-code) of ``--after``, one case after another, so that
the machine's load falls alike on all four.  Cases are ``NAME:N:SEED`` (``N`` ``-`` for
the paper's datasets) from ``bench/quality.py``, or ``msnbc`` / ``adult`` from
``bench/realdata.py`` (held-out log-likelihood per test row; the per-row values are saved
next to the output for paired differences).  Writes one JSON line per fit; ``--report``
prints the markdown tables from such a file.

Usage::

    python bench/ab_default.py --before /path/to/main --after . --out ab.jsonl \\
        BN-mix:10000:0 Potts-mix:1000:0 BN20-37S:-:0 msnbc adult
    python bench/ab_default.py --report ab.jsonl
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys

import numpy as np

SYSTEMS = {"FL-auto": {}, "FL-scale1": {"penalty_scale": 1.0},
           "FL-paper-code": {"penalty": "paper", "penalty_scale": 1.0}}
REAL = ("msnbc", "adult")
HERE = os.path.dirname(os.path.abspath(__file__))


def one(system: str, case: str, out_dir: str, arm: str) -> dict:
    """Fit ``system`` on ``case`` in this process (the tree on ``sys.path`` first) and score it."""
    import time

    from fsll_ooc import FSLL, datasets

    name, n, seed = (case.split(":") + ["-", "0"])[:3]
    if name in REAL:
        from realdata import DEFAULT_DATA, load_set

        X, Xte, cards, _ = load_set(name, DEFAULT_DATA)
    else:
        from quality import load

        X, p = load(name, None if n == "-" else int(n), int(seed))
        cards = p.shape
    warm = np.random.default_rng(0).integers(0, 3, size=(300, 6))
    for kw in SYSTEMS.values():  # kernels loaded and compiled before the timed fit
        FSLL(progress=False, **kw).fit(warm)
    t0 = time.perf_counter()
    m = FSLL(cardinalities=cards, progress=False, **SYSTEMS[system]).fit(X)
    dt = time.perf_counter() - t0
    out = {"arm": arm, "system": system, "case": case, "time": dt, "params": int(m.n_bases_),
           "cost": float(m.cost_), "n_iter": int(m.n_iter_), "scale": float(m.penalty_scale_),
           "load1": os.getloadavg()[0]}
    if name in REAL:
        ll = np.asarray(m.log_prob(Xte))
        np.save(os.path.join(out_dir, f"ll-{name}-{arm}-{system}.npy"), ll)
        out["heldout"] = float(ll.mean())
    else:
        out["kl"] = datasets.kl_divergence(p, np.asarray(m.probabilities()).reshape(p.shape))
    return out


def run(before: str, after: str, cases, out: str) -> None:
    runs = [("before", before, "FL-auto"), ("after", after, "FL-auto"), ("after", after, "FL-scale1"),
            ("after", after, "FL-paper-code")]
    out_dir = os.path.dirname(os.path.abspath(out))
    for case in cases:
        for arm, tree, system in runs:
            tree = os.path.abspath(tree)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.path.join(tree, "bench")]))
            code = (f"import json, sys; sys.path[:0] = [{tree!r}, {os.path.join(tree, 'bench')!r}, {HERE!r}]; "
                    f"import ab_default; print(json.dumps(ab_default.one({system!r}, {case!r}, {out_dir!r}, {arm!r})))")
            res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=out_dir)
            if res.returncode != 0:
                raise RuntimeError(f"{arm} {system} {case} failed:\n{res.stderr}")
            with open(out, "a") as f:
                f.write(res.stdout.strip().splitlines()[-1] + "\n")


def report(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    by = collections.defaultdict(dict)
    for r in rows:
        by[r["case"]][(r["arm"], r["system"])] = r
    keys = (("before", "FL-auto"), ("after", "FL-auto"), ("after", "FL-scale1"), ("after", "FL-paper-code"))
    groups = collections.defaultdict(list)
    for case, d in by.items():
        if all(k in d for k in keys) and case.split(":")[0] not in REAL:
            name, n, _ = case.split(":")
            groups[name if n == "-" else f"{name} N=1e{int(round(math.log10(int(n))))}"].append(d)
    print("| data | seeds | KL before | KL after | FL-scale1 | FL-paper-code | cost after < before | "
          "time before [s] | time after [s] | after / FL-scale1 | after / FL-paper-code | before / FL-paper-code |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, ds in groups.items():
        mean = lambda k, f: float(np.mean([d[k][f] for d in ds]))  # noqa: E731

        def ratio(a, b):
            r = [d[a]["time"] / d[b]["time"] for d in ds]
            return f"{np.mean(r):.2f}" + (f" ({min(r):.1f}-{max(r):.1f})" if len(r) > 1 else "")

        lower = sum(d[keys[1]]["cost"] < d[keys[0]]["cost"] for d in ds)
        print(f"| {name} | {len(ds)} | {mean(keys[0], 'kl'):.4f} | {mean(keys[1], 'kl'):.4f} | "
              f"{mean(keys[2], 'kl'):.4f} | {mean(keys[3], 'kl'):.4f} | {lower}/{len(ds)} | "
              f"{mean(keys[0], 'time'):.2f} | {mean(keys[1], 'time'):.2f} | {ratio(keys[1], keys[2])} | "
              f"{ratio(keys[1], keys[3])} | {ratio(keys[0], keys[3])} |")
    out_dir = os.path.dirname(os.path.abspath(path))
    for name in REAL:
        d = by.get(name)
        if not d:
            continue
        base = np.load(os.path.join(out_dir, f"ll-{name}-before-FL-auto.npy"))
        print(f"\n{name}\n\n| system | held-out [nats/row] | paired vs before | fit [s] | terms | scale |")
        print("|---|---|---|---|---|---|")
        for arm, system in keys:
            r = d[(arm, system)]
            diff = np.load(os.path.join(out_dir, f"ll-{name}-{arm}-{system}.npy")) - base
            print(f"| {system} ({arm}) | {r['heldout']:.4f} | {diff.mean():+.4f} ± "
                  f"{diff.std(ddof=1) / math.sqrt(diff.size):.4f} | {r['time']:.2f} | {r['params']} | {r['scale']:g} |")
    loads = [r["load1"] for r in rows]
    print(f"\n1-minute load after each fit: min {min(loads):.1f}, median {np.median(loads):.1f}, "
          f"max {max(loads):.1f} ({len(rows)} fits)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--before", help="source tree of the default before the change")
    ap.add_argument("--after", default=os.path.dirname(HERE), help="source tree after it (default: this one)")
    ap.add_argument("--out", default="ab_default.jsonl")
    ap.add_argument("--report", default=None, help="print the tables of this JSON-lines file instead of fitting")
    a = ap.parse_args(argv)
    if a.report:
        report(a.report)
        return
    if not a.before or not a.cases:
        ap.error("--before and at least one case are needed to fit")
    run(a.before, a.after, a.cases, a.out)


if __name__ == "__main__":
    main()
