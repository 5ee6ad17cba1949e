"""Where a running (or stopped) ``bench/scale.py`` fit stands, read from its store's state file.

Prints the fit pass by pass (iteration, seconds since the fit began, table passes so far,
terms, cost, move, batch number) and, with ``--heldout``, the held-out log-likelihood of
the current model (its ``theta`` and ``log Z`` as the state keeps them) on the script's
held-out sample, with the estimate of KL(p*||p).  Reading the state does not disturb the
fit; a stopped fit continues with ``python bench/scale.py ... --resume`` (same arguments).

Usage::

    python bench/store_progress.py /work/big-bn30/scale_bn30_0_auto_auto.mm --case bn30 --heldout
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import scale  # noqa: E402  (bench/scale.py: the data of each case)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path, help="the case's store directory (under bench/scale.py's --dir)")
    ap.add_argument("--case", default="bn30", help="the case the store was fitted on (default: %(default)s)")
    ap.add_argument("--heldout", action="store_true", help="also score the current model on the held-out sample")
    args = ap.parse_args(argv)
    from fsll_ooc import FSLL, fitting
    from fsll_ooc.learn import FitState

    obj = json.loads((args.store / "fsll_state.json").read_text())
    st = FitState.from_json(obj["state"])
    if tuple(st.cards) != tuple(scale.case_cards(args.case)):
        raise SystemExit(f"the store's cardinalities {st.cards} are not those of case {args.case!r}")
    print(f"status {obj['status']}, iterations {st.n_iter}, terms {len(st.theta)}, converged {st.converged}")
    print("iteration  seconds  passes  terms  cost  move  batch")
    last = None
    for h in st.history:
        p = h.get("passes")
        if p is not None and p != last:
            print(h["iter"], round(h["time"], 1), p, h["n_bases"], round(h["cost"], 6), h["move"], h.get("batch"))
            last = p
    if args.heldout:
        m = FSLL(cardinalities=tuple(st.cards), progress=False)
        fitting.set_fitted(m, st)
        parents, cpts = scale.random_bn(tuple(st.cards), 3, seed=0)
        H = scale.ancestral_sample(tuple(st.cards), parents, cpts, 10_000, seed=2)
        lp = m.log_prob(H)
        print(json.dumps({"n_iter": st.n_iter, "terms": len(st.theta), "heldout_loglik": float(np.mean(lp)),
                          "kl_heldout": float(np.mean(scale.true_logp(H, parents, cpts) - lp))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
