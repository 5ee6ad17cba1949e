#!/usr/bin/env python
"""EM under the family code (the default) against EM under the paper's code, same rows.

The mixed-cardinality Bayesian network of ``bench/missing.py`` (cards 2,3,4,5,2,3,4,5,3,2,
N = 5000), cells removed completely at random (MCAR) or at random given the first two
columns (MAR) at 5, 20 and 40 %: ``KL(p* || p)`` and seconds of ``FSLL(missing="em")``
(the family code, as an ordinary default fit) and ``FSLL(missing="em", penalty="paper")``
(the code EM fits used before), fitted alternately.

Usage::

    python bench/em_code.py
"""
from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.dirname(HERE), HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from fsll_ooc import FSLL, datasets  # noqa: E402
from missing import MIX_CARDS, RATES, remove_cells  # noqa: E402


def main() -> None:
    p, _ = datasets.random_bayesnet(MIX_CARDS, 2, seed=11)
    X = datasets.sample_table(p, 5000, seed=12)
    print("| mechanism | cells removed | KL EM family code | KL EM paper's code | s family | s paper | "
          "terms family / paper | rounds family / paper |")
    print("|---|---|---|---|---|---|---|---|")
    for mech in ("MCAR", "MAR"):
        for rate in RATES:
            Xm = remove_cells(X, rate, mech, seed=int(rate * 1000) + (mech == "MAR"))
            out = {}
            for code in ("family", "paper"):
                t = time.perf_counter()
                m = FSLL(progress=False, missing="em", cardinalities=p.shape,
                         penalty=None if code == "family" else "paper").fit(Xm)
                out[code] = (datasets.kl_divergence(p, m.probabilities()), time.perf_counter() - t, m.n_bases_,
                             m.em_rounds_)
            f, q = out["family"], out["paper"]
            print(f"| {mech} | {(Xm < 0).mean():.1%} | {f[0]:.4f} | {q[0]:.4f} | {f[1]:.1f} | {q[1]:.1f} | "
                  f"{f[2]} / {q[2]} | {f[3]} / {q[3]} |", flush=True)
    print(f"\n1-minute load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
