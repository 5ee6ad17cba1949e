"""``fsll-ooc score``: mean log-likelihood of a data file under a saved model.
"""
from __future__ import annotations


import numpy as np

from ..io import encode_with
from ..queries import labels as _labels_of
from . import common


def register(sub) -> None:
    p = sub.add_parser(
        "score", help="mean log-likelihood of a data file under a saved model",
        description="Mean log-likelihood (natural log, nats per sample) of DATA under MODEL. "
                    "Columns are matched by name when both have names, else by position; "
                    "labels are mapped with the model's categories (unknown labels are errors).")
    p.add_argument("model", metavar="MODEL", help="a model saved by 'fsll-ooc fit'")
    p.add_argument("data", metavar="DATA", help="data file (.csv, .tsv, .txt, .npy or .parquet)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    common.add_read_options(p, drop=False)
    p.set_defaults(func=run)


def run(args) -> int:
    model = common.load_model(args.model, averages=True)
    names, cats = _labels_of(model)
    has_names = model.feature_names_in_ is not None
    with common.user_input():
        data = common.read_data(args, args.data)
        by_name = has_names and hasattr(data, "columns")
        codes = encode_with(cats, data, names=names if by_name else None)
    logp = np.asarray(model.log_prob(codes), dtype=np.float64)
    result = {
        "model": args.model,
        "data": args.data,
        "n_samples": int(codes.shape[0]),
        "mean_log_likelihood": float(np.mean(logp)),
        "total_log_likelihood": float(np.sum(logp)),
    }
    if args.json:
        common.print_json(result)
    else:
        print(f"mean log-likelihood {result['mean_log_likelihood']:.6f} nats per sample "
              f"({result['n_samples']} samples of {args.data}; "
              f"total {result['total_log_likelihood']:.4f})")
    return 0
