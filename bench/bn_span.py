#!/usr/bin/env python
"""BN-mix at N = 1e4: the true network's span against the default fit, under the default's cost.

For each seed of ``bench/quality.py``'s BN-mix data set: the log-linear model whose support
is the true network's span (every term on a non-empty subset of a family ``{i} u pa(i)``),
fitted to FL's own target ``q = (counts + 1/|X|) / (N + 1)`` by iterative proportional
fitting (its maximum likelihood), and the default ``FSLL()``; for both, ``KL(q || .)`` plus
the half-scale family code of the support (the default's cost at the scale it chooses
here) and ``KL(p* || .)``.

Usage::

    python bench/bn_span.py [--seeds 0 1 2] [--n 10000]
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.dirname(HERE), HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from fsll_ooc import FSLL, cost as C, datasets  # noqa: E402
from quality import MIX_CARDS, synthetic  # noqa: E402


def span_fit(q: np.ndarray, families, sweeps: int = 300) -> np.ndarray:
    """Iterative proportional fitting of the family marginals of ``q`` from the uniform table."""
    m = np.full(q.shape, 1.0 / q.size)
    for _ in range(sweeps):
        for f in families:
            other = tuple(a for a in range(q.ndim) if a not in f)
            m = m * (q.sum(axis=other, keepdims=True) / m.sum(axis=other, keepdims=True))
    return m / m.sum()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=10_000)
    a = ap.parse_args(argv)
    cards, size = MIX_CARDS, int(np.prod(MIX_CARDS))
    print("| seed | true span: terms | cost | KL(p*‖.) | default fit: terms | cost | KL(p*‖.) |")
    print("|---|---|---|---|---|---|---|")
    for seed in a.seeds:
        X, p = synthetic("BN-mix", a.n, seed)
        _, s = datasets.random_bayesnet(cards, 2, seed=np.random.SeedSequence([int(seed), 11]))
        counts = np.zeros(cards)
        np.add.at(counts, tuple(X.T), 1.0)
        q = (counts + 1.0 / size) / (len(X) + 1.0)
        fams = [tuple(sorted((i,) + tuple(pa))) for i, pa in enumerate(s["parents"])]
        m = span_fit(q, fams)
        sets = {c for f in fams for r in range(1, len(f) + 1) for c in itertools.combinations(f, r)}
        code = C.TermCode(cards, len(X), "family", 0.5)
        cost_span = float(np.sum(q * (np.log(q) - np.log(m)))) + sum(code.total(c, code.members(c)) for c in sets)
        fl = FSLL(cardinalities=cards, progress=False).fit(X)
        assert fl.penalty_scale_ == 0.5, "the comparison prices the span at the scale the default chose"
        print(f"| {seed} | {sum(code.members(c) for c in sets)} | {cost_span:.5f} | {datasets.kl_divergence(p, m):.4f} "
              f"| {fl.n_bases_} | {fl.cost_:.5f} | {datasets.kl_divergence(p, np.asarray(fl.probabilities())):.4f} |",
              flush=True)


if __name__ == "__main__":
    main()
