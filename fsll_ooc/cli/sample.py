"""``fsll-ooc sample``: draw samples from a saved model, as CSV with the original labels.
"""
from __future__ import annotations

import sys

from ..io import DataError, decode
from ..queries import labels as _labels_of
from . import common


def register(sub) -> None:
    p = sub.add_parser(
        "sample", help="draw samples from a saved model (CSV with the original labels)",
        description="Draw N i.i.d. samples from a saved model and write them as CSV (header "
                    "row, original labels) to stdout or to --out.")
    p.add_argument("model", metavar="MODEL", help="a model saved by 'fsll-ooc fit'")
    p.add_argument("-n", "--n-samples", dest="n", type=common.positive_int, required=True, metavar="N",
                   help="number of samples")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh entropy)")
    p.add_argument("--out", "-o", metavar="FILE.csv",
                   help="write here instead of stdout (an existing file only with --force)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument("--json", action="store_true",
                   help="write the samples to stdout as a JSON list of records instead of CSV")
    p.set_defaults(func=run)


def run(args) -> int:
    model = common.load_model(args.model, averages=True)
    if args.json and args.out is not None:
        raise common.UsageError("--json writes to stdout; it cannot be combined with --out")
    if args.out is not None and not args.out.lower().endswith(".csv"):
        raise DataError(f"--out must name a .csv file, got '{args.out}'")
    if args.out is not None:
        common.check_output(args.out, "samples", args.force, inputs=[args.model])
    names, cats = _labels_of(model)
    with common.user_input():  # e.g. more samples, or a larger table, than memory holds
        codes = model.sample(args.n, random_state=args.seed, as_frame=False)
    df = decode(codes, cats, names)
    if args.json:
        common.print_json([{nm: cats[j][int(c)] for j, (nm, c) in enumerate(zip(names, row))} for row in codes])
    elif args.out is None:
        df.to_csv(sys.stdout, index=False, lineterminator="\n")
    else:
        df.to_csv(args.out, index=False, lineterminator="\n")
    return 0
