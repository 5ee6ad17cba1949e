"""``fsll-ooc score``: mean log-likelihood of a data file under a saved model.
"""
from __future__ import annotations


import numpy as np

from ..io import DataError, unknown_labels
from ..queries import labels as _labels_of
from . import common


def register(sub) -> None:
    p = sub.add_parser(
        "score", help="mean log-likelihood of a data file under a saved model",
        description="Mean log-likelihood (natural log, nats per sample) of DATA under MODEL. "
                    "Columns are matched by name when both have names, else by position; "
                    "labels are mapped with the model's categories. A missing cell (an empty "
                    "field, NA, ...) is summed out under the model, as Python's model.score() does. "
                    "A label the model never saw is an error, or with --unseen skip its row is "
                    "left out (and counted).")
    p.add_argument("model", metavar="MODEL", help="a model saved by 'fsll-ooc fit'")
    p.add_argument("data", metavar="DATA", help="data file (.csv, .tsv, .txt, .npy or .parquet)")
    p.add_argument("--unseen", choices=("error", "skip"), default="error",
                   help="a row with a label the model never saw: an error (default) or left out")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    common.add_read_options(p, drop=False)
    p.set_defaults(func=run, missing="em")  # missing cells are read as missing, then summed out


def model_frame(model, data, path: str):
    """``data`` as a DataFrame with exactly the model's observed columns, in its order (by name
    when both have names, else by position)."""
    import pandas as pd

    names, _ = _labels_of(model)
    names = names[:len(names) - int(getattr(model, "n_hidden_", 0) or 0)]
    if hasattr(data, "columns") and model.feature_names_in_ is not None:
        cols = [str(c) for c in data.columns]
        lacking = [nm for nm in names if nm not in cols]
        if lacking:
            raise DataError(f"{path} lacks the model's column(s) {', '.join(repr(c) for c in lacking[:8])} "
                            f"(its columns: {', '.join(cols[:12])}{', ...' if len(cols) > 12 else ''}); columns "
                            "are matched by name")
        return data.set_axis(cols, axis=1)[names]
    arr = data.to_numpy(dtype=object) if hasattr(data, "columns") else np.asarray(data)
    if arr.ndim != 2 or arr.shape[1] != len(names):
        raise DataError(f"the model has {len(names)} variables but {path} has "
                        f"{arr.shape[1] if arr.ndim == 2 else 1} columns")
    return pd.DataFrame(arr, columns=names)


def run(args) -> int:
    model = common.load_model(args.model, averages=True)
    _, cats = _labels_of(model)
    with common.user_input():
        data = common.read_data(args, args.data)
        first_line = (getattr(data, "attrs", None) or {}).get("fsll_first_line")
        frame = model_frame(model, data, args.data)
        bad = unknown_labels(cats[:frame.shape[1]], frame)
        skipped = 0
        if bad.any():
            r, j = (int(v) for v in np.argwhere(bad)[0])
            if args.unseen == "error":
                where = f"line {r + first_line} of {args.data}" if first_line is not None else args.data
                raise DataError(f"column '{frame.columns[j]}': unknown category {frame.iat[r, j]!r} at row {r} "
                                f"({where}); {int(bad.any(axis=1).sum())} row(s) hold labels the model never "
                                "saw: --unseen skip leaves them out")
            keep = ~bad.any(axis=1)
            skipped = int((~keep).sum())
            frame = frame[keep]
        if len(frame) == 0:
            raise DataError(f"no row of {args.data} is left to score ({skipped} skipped for unseen labels)")
        X = frame if model.categories_ is not None else frame.to_numpy(dtype=float)
        logp = np.asarray(model.log_prob(X), dtype=np.float64)
    holes = int(frame.isna().to_numpy().any(axis=1).sum())
    result = {
        "model": args.model,
        "data": args.data,
        "n_samples": int(len(frame)),
        "mean_log_likelihood": float(np.mean(logp)),
        "total_log_likelihood": float(np.sum(logp)),
        "rows_with_missing_cells": holes,
        "skipped_unseen": skipped,
    }
    if args.json:
        common.print_json(result)
    else:
        extra = "".join([f"; {holes} with missing cells, summed out" if holes else "",
                         f"; {skipped} skipped for labels the model never saw" if skipped else ""])
        print(f"mean log-likelihood {result['mean_log_likelihood']:.6f} nats per sample "
              f"({result['n_samples']} samples of {args.data}{extra}; "
              f"total {result['total_log_likelihood']:.4f})")
    return 0
