"""``fsll-ooc demo``: fit the paper's dataset(s) and print the paper-style result row(s).
"""
from __future__ import annotations

import sys
import time

from . import common


def register(sub) -> None:
    from ..datasets import PAPER_DATASETS
    p = sub.add_parser(
        "demo", help="fit the paper's dataset(s) and print the paper-style row(s)",
        description="Fit FSLL(epsilon=1e-4) to one of the paper's datasets (or all six) and "
                    "print KL(pd||p), KL(p*||p), the number of bases, iterations and seconds, "
                    "next to the paper's Table 1 row. The BN tables are random, so only "
                    "magnitudes are comparable with the paper for BN20-*. The compiled kernels "
                    "are loaded first (compiled on the first run after installing, several seconds; "
                    "reported on stderr), so the seconds are the fit's own.")
    p.add_argument("--dataset", default="BN20-37S", choices=PAPER_DATASETS, metavar="NAME",
                   help=f"one of {', '.join(PAPER_DATASETS)} (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="dataset seed (default: %(default)s)")
    p.add_argument("--all", action="store_true", help="run all six datasets (takes minutes)")
    p.add_argument("--epsilon", type=common.epsilon, default=1e-4,
                   help="stopping threshold on the cost improvement: a number or 'auto' "
                        "(default: %(default)s, the paper's setting, so the rows compare with its table)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run)


def _load_kernels() -> None:
    """Compile (first run after installing) or load from numba's cache the kernels a fit uses."""
    from .. import kernels
    kernels.prepare_fit(cards=(2,))  # the paper's datasets are binary


_DEMO_HEADER = ("data", "N", "KL(pd||p)", "KL(p*||p)", "#basis", "iterations", "seconds")


_DEMO_FMT = "{:<10} {:>7} {:>10} {:>10} {:>7} {:>11} {:>8}"


def run(args) -> int:
    from .. import datasets
    FSLL = common.model_class()
    names = list(datasets.PAPER_DATASETS) if args.all else [args.dataset]
    progress = common.show_progress(args)
    rows = []
    # the compiled kernels first, so that "seconds" is the fit alone (as the paper's column);
    # the first run after installing compiles them (several seconds), later ones load them
    if not args.quiet:
        print("fsll-ooc: loading the compiled kernels (the first run after installing compiles "
              "them, several seconds)...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    _load_kernels()
    kernel_seconds = time.perf_counter() - t0
    if not args.quiet:
        print(f"fsll-ooc: kernels ready in {kernel_seconds:.1f} s", file=sys.stderr, flush=True)
    if not args.json:
        print(_DEMO_FMT.format(*_DEMO_HEADER))
    for name in names:
        X, p_true = datasets.paper_dataset(name, seed=args.seed)
        model = FSLL(epsilon=args.epsilon, progress=progress)
        t0 = time.perf_counter()
        model.fit(X)
        seconds = time.perf_counter() - t0
        row = {
            "data": name,
            "seed": args.seed,
            "n_samples": int(X.shape[0]),
            "kl_data": float(model.kl_data_),
            "kl_true": datasets.kl_divergence(p_true, model.probabilities()),
            "n_bases": int(model.n_bases_),
            "n_iter": int(model.n_iter_),
            "seconds": seconds,
            "kernel_load_seconds": kernel_seconds,
        }
        rows.append(row)
        if not args.json:
            print(_DEMO_FMT.format(name, row["n_samples"], f"{row['kl_data']:.3f}",
                                   f"{row['kl_true']:.3f}", row["n_bases"], row["n_iter"],
                                   f"{seconds:.2f}"), flush=True)
            ref = datasets.PAPER_TABLE1.get((name, "FL"))
            if ref is not None:
                print(_DEMO_FMT.format("  (paper)", "", f"{ref[0]:.3f}", f"{ref[1]:.3f}", ref[2],
                                       "", ref[3]), flush=True)
    if args.json:
        for row in rows:
            ref = datasets.PAPER_TABLE1.get((row["data"], "FL"))
            if ref is not None:
                row["paper"] = dict(zip(("kl_data", "kl_true", "n_bases", "seconds"), ref))
        common.print_json(rows if args.all else rows[0])
    return 0
