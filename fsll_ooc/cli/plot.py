"""``fsll-ooc plot``: PNGs of the cost per iteration and the interaction graph.
"""
from __future__ import annotations

import os

from ..io import DataError
from . import common


def register(sub) -> None:
    p = sub.add_parser(
        "plot", help="save PNGs: cost per iteration and the interaction graph",
        description="Save two PNG files: PREFIX-cost.png (cost and number of bases per iteration; "
                    "needs the fit history, which 'fsll-ooc fit' saves) and PREFIX-interactions.png "
                    "(variables on a circle; an edge's width is how strongly its two variables depend "
                    "on each other: their mutual information under the model; with --weight share or "
                    "theta, the strength of the model's terms instead: pairwise terms as edges, "
                    "higher-order terms as hubs joined to their variables, single-variable terms as "
                    "rings; those depend on how the categories are coded). An average (fit --average) "
                    "draws each member's cost and the mixture's mutual information. "
                    "Needs matplotlib: pip install \"fsll-ooc[docs]\".")
    p.add_argument("model", metavar="MODEL", help="a model saved by 'fsll-ooc fit' (or a completed store)")
    p.add_argument("--out-dir", "-d", default=".", metavar="DIR",
                   help="directory for the PNGs, created if needed (default: current directory)")
    p.add_argument("--prefix", metavar="NAME",
                   help="file name prefix (default: the model file name without extension)")
    p.add_argument("--weight", choices=("mi", "share", "theta", "auto"), default="mi",
                   help="edge width: mutual information of the pair (default), the terms' share of the "
                        "cost reduction, their |theta|, or auto (share when the model has a fit history)")
    p.add_argument("--top", type=common.nonneg_int, default=40, metavar="K",
                   help="draw the K strongest edges/hyperedges; 0 draws all (default: %(default)s)")
    p.add_argument("--dpi", type=common.positive_int, default=120, help="resolution (default: %(default)s)")
    p.add_argument("--force", action="store_true",
                   help="replace existing PNG files even if fsll-ooc did not write them")
    p.add_argument("--json", action="store_true", help="print the written paths as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..plotting import save_plots

    model = common.load_model(args.model, averages=True)
    if os.path.isfile(args.out_dir):
        raise DataError(f"--out-dir '{args.out_dir}' is a file, not a directory")
    prefix = args.prefix or os.path.splitext(os.path.basename(os.path.normpath(args.model)))[0] or "model"
    for suffix in ("cost", "interactions"):
        target = os.path.join(args.out_dir, f"{prefix}-{suffix}.png")
        if os.path.isdir(args.out_dir):
            common.check_output(target, "picture", args.force, kind="png", inputs=[args.model])
    paths = save_plots(model, args.out_dir, prefix, dpi=args.dpi, weight=args.weight,
                       top=None if args.top == 0 else args.top)
    if args.json:
        common.print_json({"model": args.model, "files": paths})
    else:
        for path in paths:
            print(f"wrote {path}")
    return 0
