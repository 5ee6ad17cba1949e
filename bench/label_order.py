#!/usr/bin/env python
"""What the basis order of the categories does to a fit's quality.

Unordered labels go into a canonical basis order (``FSLL(category_order="frequency")``,
the default for labelled data: most frequent first), so that a model does not depend on
how the labels are spelled.  This script fits the same data under several orders and
reports the quality of each:

* ``given``: the codes as they come (sorted labels, or the generator's codes);
* ``frequency``: most frequent first (the default for labels);
* ``rarest``: least frequent first (the same canonical ranking, reversed);
* ``relabel r``: the given order after a random relabelling of every variable (seed r),
  the spread a user gets from the spelling of the labels alone.

Data: the mixed-cardinality rows of ``bench/quality.py`` (Potts-mix and BN-mix, cards
3, 4, 5, N = 1e3 and 1e4; quality ``KL(p* || p)`` against the true table, lower is
better; the paper's six are binary, where the order cannot change the model) and, with
``--data`` holding it, ``adult`` (``bench/realdata.py``'s 8 categorical columns; mean
held-out log-likelihood per test row, higher is better).

Usage::

    python bench/label_order.py [--seeds 0 1] [--relabel 3] [--data ../shared/data] [--skip-adult]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from fsll_ooc import FSLL, datasets  # noqa: E402
from fsll_ooc.io import frequency_order  # noqa: E402
from quality import synthetic  # noqa: E402
from realdata import DEFAULT_DATA, load_adult  # noqa: E402


def relabelled(X, cards, perms):
    return np.stack([perms[i][X[:, i]] for i in range(len(cards))], axis=1)


def orders(X, cards, n_relabel):
    """``(name, relabelling per variable or None, category_order)`` of every variant."""
    freq = frequency_order(X, cards)
    rare = [None if o is None else np.argsort(o[::-1]) for o in freq]  # code -> its rank, rarest first
    out = [("given", None, "given"), ("frequency", None, "frequency"),
           ("rarest", [np.arange(k) if r is None else r for r, k in zip(rare, cards)], "given")]
    for r in range(n_relabel):
        rng = np.random.default_rng(100 + r)
        out.append((f"relabel {r}", [rng.permutation(k) for k in cards], "given"))
    return out


def fit(X, cards, how):
    t = time.perf_counter()
    m = FSLL(progress=False, cardinalities=tuple(cards), category_order=how).fit(X)
    return m, time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000])
    ap.add_argument("--relabel", type=int, default=3, help="random relabellings per data set")
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--skip-adult", action="store_true")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}; load {os.getloadavg()[0]:.2f} at the start")
    print("| data | seed | order | KL(p*‖p) / held-out LL | terms | s |")
    print("|---|---|---|---|---|---|")
    for fam in ("Potts-mix", "BN-mix"):
        for n in args.sizes:
            for seed in args.seeds:
                X, p_true = synthetic(fam, n, seed)
                cards = p_true.shape
                for name, perms, how in orders(X, cards, args.relabel):
                    Y = X if perms is None else relabelled(X, cards, perms)
                    m, s = fit(Y, cards, how)
                    p = m.probabilities()
                    if perms is not None:  # back to the generator's codes: p_Y[perm[x]] is p_X[x]
                        for i, pm in enumerate(perms):
                            p = np.take(p, pm, axis=i)
                    kl = datasets.kl_divergence(p_true, p)
                    print(f"| {fam} N={n} | {seed} | {name} | {kl:.5f} | {m.n_bases_} | {s:.1f} |", flush=True)
    if not args.skip_adult and os.path.isdir(os.path.join(args.data, "adult")):
        tr, te, cards, _ = load_adult(args.data)
        for name, perms, how in orders(tr, cards, args.relabel):
            A = tr if perms is None else relabelled(tr, cards, perms)
            B = te if perms is None else relabelled(te, cards, perms)
            m, s = fit(A, cards, how)
            print(f"| adult | - | {name} | {m.score(B):.5f} | {m.n_bases_} | {s:.1f} |", flush=True)
    print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
