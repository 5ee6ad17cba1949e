#!/usr/bin/env python
"""How the in-core fit scales with cores: the 2^24 fits of ``bench/scale.py``'s data at 1..16 threads.

Fits (each in a child process with ``NUMBA_NUM_THREADS`` set to the thread count: the
compiled kernels' helper threads, :mod:`fsll_ooc.kernels.threadpool`, and numba's own):

* ``default``: ``FSLL()`` on the binary 2^24 network, 10^5 rows, in core;
* ``paper``: ``FSLL(epsilon=1e-4, max_iter=150)``, the paper's rule, 150 iterations.

``--commit C`` (repeatable) measures the code of commit ``C`` of this repository (a
temporary detached git worktree, removed afterwards); ``--root DIR=LABEL`` a code tree as
it is (a copy without git, say); default: this checkout.  Commits
are interleaved, thread count by thread count.  Prints one markdown table: wall seconds
of the timed fit (after a warm-up fit in the same child), the speed-up over one thread,
held-out log-likelihood and terms (the same model at every thread count).

Usage (about 3-5 minutes per commit on 16 cores)::

    python bench/cores.py --commit <old> --commit <new> --threads 1 2 4 8 16
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from learner import commit_of, run_child  # noqa: E402

FITS = {"default": {}, "paper": {"epsilon": 1e-4, "max_iter": 150}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", action="append", default=None, help="a commit to measure (repeatable)")
    ap.add_argument("--root", action="append", default=None, metavar="DIR[=LABEL]",
                    help="a code tree to measure, as it is (repeatable; for a copy without git)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--fits", nargs="+", default=list(FITS), choices=list(FITS))
    ap.add_argument("--case", default="24", help="bench/learner.py case (default: 24, the 2^24 network)")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="fsll-cores-")
    roots = []
    try:
        for c in args.commit or []:
            path = os.path.join(tmp, c.replace("/", "_"))
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, c], check=True,
                           capture_output=True)
            roots.append(path)
        labels = {r: commit_of(r) for r in roots}
        for spec in args.root or []:
            path, _, label = spec.partition("=")
            roots.append(os.path.abspath(path))
            labels[roots[-1]] = label or os.path.basename(os.path.abspath(path))
        if not roots:
            roots, labels = [ROOT], {ROOT: commit_of(ROOT)}
        print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.2f}; case {args.case}")
        print("| fit | commit | threads | wall s | speed-up | held-out LL | terms | load |")
        print("|---|---|---|---|---|---|---|---|")
        for fit in args.fits:
            one = {}
            for threads in args.threads:
                for root in roots:
                    r = run_child(root, args.case, threads, args.repeats, FITS[fit])
                    c = labels[root]
                    if "error" in r:
                        print(f"| {fit} | {c} | {threads} | error: {r['error'][0]} | | | | |", flush=True)
                        continue
                    one.setdefault(root, r["time"])
                    print(f"| {fit} | {c} | {threads} | {r['time']:.2f} | {one[root] / r['time']:.2f}x | "
                          f"{r['ll']:.5f} | {r['terms']} | {os.getloadavg()[0]:.2f} |", flush=True)
    finally:
        for path in roots:
            if path.startswith(tmp):
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
