"""Command-line interface: ``fsll-ooc <command> ...`` (also ``python -m fsll_ooc.cli``).

Commands (each has ``--help``):

* ``demo``   fit the paper's dataset(s) and print the paper-style result row(s);
* ``fit``    read a ``.csv``/``.npy``/``.parquet`` file, fit a model, save it;
* ``info``   summary of a saved model and its terms sorted by ``|theta|``;
* ``sample`` draw samples from a saved model, as CSV with the original labels;
* ``score``  mean log-likelihood of a data file under a saved model.

Exit codes: 0 success; 2 bad input or usage (printed as one line
``fsll-ooc: error: ...`` on stderr, no traceback); 1 unexpected failure (one line,
``--debug`` shows the traceback).  Progress bars go to stderr, and only when stderr is
a terminal and ``--quiet`` is not given.

Adding a command: write ``_register_<name>(subparsers)`` that adds a sub-parser and
sets ``func=`` to a function ``(args) -> int``, and append it to ``_REGISTRARS``.
Raise :class:`~fsll_ooc.io.DataError` (or use ``with _user_input():``) for problems
with the user's input so that they exit with code 2.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback
from typing import Any, Sequence

import numpy as np

from . import __version__
from .io import DataError, decode, encode, encode_with, read_table

PROG = "fsll-ooc"

#: Table 1 of the paper (Java, i7-6700K): KL(pd||p), KL(p*||p), #basis, seconds.
PAPER_TABLE1 = {
    "Ising5x4S": (2.501, 0.012, 31, 5),
    "Ising5x4L": (0.476, 0.004, 37, 9),
    "BN20-37S": (4.355, 0.317, 39, 5),
    "BN20-37L": (0.697, 0.026, 105, 12),
    "BN20-54S": (3.288, 0.697, 41, 5),
    "BN20-54L": (0.430, 0.057, 192, 23),
}


# ----------------------------------------------------------------- error plumbing

class UsageError(Exception):
    """Bad command line; reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage + exit; we report one line
        raise UsageError(f"{message} (see '{self.prog} --help')")


@contextlib.contextmanager
def _user_input():
    """Inside this block a ``ValueError`` is the user's fault (exit 2), not a bug."""
    try:
        yield
    except DataError:
        raise
    except ValueError as exc:
        raise DataError(str(exc)) from exc


def _err(message: str) -> None:
    one_line = " ".join(str(message).split())
    print(f"{PROG}: error: {one_line}", file=sys.stderr)


def _show_progress(args) -> bool:
    if getattr(args, "quiet", False):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _model_class():
    """The estimator class (imported lazily: ``--help`` stays fast)."""
    try:
        from . import FSLL  # type: ignore[attr-defined]
    except ImportError:
        from .model import FSLL
    return FSLL


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    return str(o)


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=_json_default, allow_nan=True))


def _float(x) -> float | None:
    try:
        return None if x is None else float(x)
    except (TypeError, ValueError):
        return None


def _load_model(path: str):
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such model file: '{path}'")
    with _user_input():
        return _model_class().load(path)


def _check_writable(path: str, what: str) -> None:
    """Fail early (before a long fit) when ``path`` cannot be written."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise DataError(f"cannot write the {what} to '{path}': it is a directory")
    if not os.path.isdir(parent):
        raise DataError(f"cannot write the {what} to '{path}': directory '{parent}' does not exist")
    if not os.access(parent, os.W_OK):
        raise DataError(f"cannot write the {what} to '{path}': directory '{parent}' is not writable")


def _set_labels(model, names, categories) -> None:
    if hasattr(model, "set_labels"):
        model.set_labels(list(names), [list(c) for c in categories])
    else:  # older model without the helper
        model.feature_names_in_ = list(names)
        model.categories_ = [list(c) for c in categories]


def _labels_of(model) -> tuple[list, list]:
    """(names, categories) of a model; defaults X0.. and 0..k-1 when it has none."""
    ks = tuple(int(k) for k in model.cardinalities_)
    names = getattr(model, "feature_names_in_", None)
    cats = getattr(model, "categories_", None)
    names = list(names) if names is not None else [f"X{i}" for i in range(len(ks))]
    cats = [list(c) for c in cats] if cats is not None else [list(range(k)) for k in ks]
    return names, cats


# ---------------------------------------------------------------- argument types

def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    return v


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def _nonneg_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {s!r}")
    return v


def _cardinality_list(s: str) -> tuple:
    parts = [p.strip() for p in s.split(",")]
    try:
        ks = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 2,3,4, got {s!r}") from None
    if any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError(f"cardinalities must be >= 1, got {s!r}")
    return ks


# -------------------------------------------------------------------------- demo

def _kl_true(p_true: np.ndarray, p_model: np.ndarray) -> float:
    """KL(p* || p) in nats with 0 ln 0 = 0."""
    a = np.asarray(p_true, dtype=np.float64).ravel()
    b = np.asarray(p_model, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise RuntimeError(f"true table has {a.size} cells, the model's {b.size}")
    m = a > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(a[m] * (np.log(a[m]) - np.log(b[m]))))


def _kl_data(model, codes: np.ndarray) -> float:
    """KL(pd || p) in nats: from the model when it stores it, else from the data."""
    v = _float(getattr(model, "kl_data_", None))
    if v is not None:
        return v
    _, counts = np.unique(codes, axis=0, return_counts=True)
    pd_ = counts / codes.shape[0]
    entropy = -float(np.sum(pd_ * np.log(pd_)))
    return -float(np.mean(model.log_prob(codes))) - entropy


def _register_demo(sub) -> None:
    from .datasets import PAPER_DATASETS
    p = sub.add_parser(
        "demo", help="fit the paper's dataset(s) and print the paper-style row(s)",
        description="Fit FSLL(epsilon=1e-4) to one of the paper's datasets (or all six) and "
                    "print KL(pd||p), KL(p*||p), the number of bases, iterations and seconds, "
                    "next to the paper's Table 1 row. The BN tables are random, so only "
                    "magnitudes are comparable with the paper for BN20-*.")
    p.add_argument("--dataset", default="BN20-37S", choices=PAPER_DATASETS, metavar="NAME",
                   help=f"one of {', '.join(PAPER_DATASETS)} (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="dataset seed (default: %(default)s)")
    p.add_argument("--all", action="store_true", help="run all six datasets (takes minutes)")
    p.add_argument("--epsilon", type=_positive_float, default=1e-4,
                   help="stopping threshold on the cost improvement (default: %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=_cmd_demo)


_DEMO_HEADER = ("data", "N", "KL(pd||p)", "KL(p*||p)", "#basis", "iterations", "seconds")
_DEMO_FMT = "{:<10} {:>7} {:>10} {:>10} {:>7} {:>11} {:>8}"


def _cmd_demo(args) -> int:
    from . import datasets
    FSLL = _model_class()
    names = list(datasets.PAPER_DATASETS) if args.all else [args.dataset]
    progress = _show_progress(args)
    rows = []
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
            "kl_data": _kl_data(model, X),
            "kl_true": _kl_true(p_true, model.probabilities()),
            "n_bases": int(model.n_bases_),
            "n_iter": int(model.n_iter_),
            "seconds": seconds,
        }
        rows.append(row)
        if not args.json:
            print(_DEMO_FMT.format(name, row["n_samples"], f"{row['kl_data']:.3f}",
                                   f"{row['kl_true']:.3f}", row["n_bases"], row["n_iter"],
                                   f"{seconds:.2f}"), flush=True)
            ref = PAPER_TABLE1.get(name)
            if ref is not None:
                print(_DEMO_FMT.format("  (paper)", "", f"{ref[0]:.3f}", f"{ref[1]:.3f}", ref[2],
                                       "", ref[3]), flush=True)
    if args.json:
        for row in rows:
            ref = PAPER_TABLE1.get(row["data"])
            if ref is not None:
                row["paper"] = dict(zip(("kl_data", "kl_true", "n_bases", "seconds"), ref))
        _print_json(rows if args.all else rows[0])
    return 0


# --------------------------------------------------------------------------- fit

def _register_fit(sub) -> None:
    p = sub.add_parser(
        "fit", help="fit a model to a data file and save it",
        description="Read DATA (.csv with a header row, .npy or .parquet; one column per "
                    "variable, one row per sample), encode its categories, fit an FSLL model "
                    "and save it to MODEL. CSV/Parquet columns: integers >= 0 are codes "
                    "0..max, other values are labels (sorted).")
    p.add_argument("data", metavar="DATA", help="input file (.csv, .npy or .parquet)")
    p.add_argument("--out", "-o", required=True, metavar="MODEL", help="where to save the model")
    p.add_argument("--cardinalities", type=_cardinality_list, metavar="K1,K2,...",
                   help="declared number of categories per column, e.g. 2,3,4 (integer columns "
                        "are then codes 0..k-1; unseen codes are kept)")
    p.add_argument("--epsilon", type=_positive_float, default=1e-4,
                   help="stopping threshold on the cost improvement (default: %(default)s)")
    p.add_argument("--max-iter", type=_positive_int, default=None, metavar="N",
                   help="stop after N iterations (default: no limit)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar (the summary is still printed)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_fit)


def _cmd_fit(args) -> int:
    _check_writable(args.out, "model")
    FSLL = _model_class()
    with _user_input():
        data = read_table(args.data)
        enc = encode(data, cardinalities=args.cardinalities)
        del data
        model = FSLL(cardinalities=enc.cardinalities, epsilon=args.epsilon,
                     max_iter=args.max_iter, progress=_show_progress(args))
    t0 = time.perf_counter()
    model.fit(enc.codes)
    seconds = time.perf_counter() - t0
    _set_labels(model, enc.names, enc.categories)
    model.save(args.out)
    summary = {
        "data": args.data,
        "model": args.out,
        "n_samples": enc.n_samples,
        "n_vars": enc.n_vars,
        "names": enc.names,
        "cardinalities": list(enc.cardinalities),
        "cells": math.prod(enc.cardinalities),
        "n_bases": int(model.n_bases_),
        "n_iter": int(model.n_iter_),
        "cost": _float(getattr(model, "cost_", None)),
        "kl_data": _float(getattr(model, "kl_data_", None)),
        "seconds": seconds,
    }
    if args.json:
        _print_json(summary)
        return 0
    ks = ", ".join(f"{nm}:{k}" for nm, k in zip(enc.names, enc.cardinalities))
    print(f"fitted {args.data}: {enc.n_samples} samples, {enc.n_vars} variables "
          f"({ks}; {summary['cells']:,} cells)")
    print(f"  bases {summary['n_bases']}   iterations {summary['n_iter']}   "
          f"cost {_fmt_num(summary['cost'])}   KL(pd||p) {_fmt_num(summary['kl_data'])}   "
          f"time {seconds:.2f} s")
    print(f"  saved to {args.out}")
    return 0


def _fmt_num(x, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


# -------------------------------------------------------------------------- info

def _register_info(sub) -> None:
    p = sub.add_parser(
        "info", help="summary of a saved model and its terms sorted by |theta|",
        description="Print a saved model's summary and its selected terms sorted by |theta|. "
                    "A term adds theta * Phi_y(x) to log p(x) (up to log Z). Each variable in "
                    "a term is shown with the categories on which its basis function is +1 "
                    "(e.g. 'colour=red'; -1 elsewhere); Phi_y(x) is the product, i.e. +1 when "
                    "an even number of the shown conditions fail.")
    p.add_argument("model", metavar="MODEL", help="a model saved by 'fsll-ooc fit'")
    p.add_argument("--top", type=_nonneg_int, default=20, metavar="K",
                   help="show the K largest terms; 0 shows all (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print summary and terms as JSON")
    p.set_defaults(func=_cmd_info)


def _is_walsh(k: int) -> bool:
    return k >= 1 and (k & (k - 1)) == 0


def _plus_set(k: int, j: int) -> list[int]:
    """Categories l where the local basis function phi_j(l) is +1."""
    if _is_walsh(k):
        return [l for l in range(k) if bin(j & l).count("1") % 2 == 0]
    return [j]


def _describe_factor(name: str, cats: list, k: int, j: int) -> dict:
    plus = _plus_set(k, j)
    return {
        "var": name,
        "index": j,
        "basis": "walsh" if _is_walsh(k) else "indicator",
        "plus": [cats[l] for l in plus],
    }


def _factor_text(f: dict, limit: int = 6) -> str:
    plus = f["plus"]
    if len(plus) == 1:
        return f"{f['var']}={plus[0]}"
    shown = ",".join(str(v) for v in plus[:limit])
    if len(plus) > limit:
        shown += f",...({len(plus)})"
    return f"{f['var']} in {{{shown}}}"


def _terms(model, names, cats) -> list[dict]:
    ks = tuple(int(k) for k in model.cardinalities_)
    out = []
    for y, theta in dict(model.theta_).items():
        y = tuple(int(v) for v in y)
        theta = float(theta)
        if not any(y) or theta == 0.0:
            continue
        factors = [_describe_factor(names[i], cats[i], ks[i], yi) for i, yi in enumerate(y) if yi]
        out.append({"y": list(y), "theta": theta, "order": len(factors), "factors": factors})
    out.sort(key=lambda t: (-abs(t["theta"]), t["order"], t["y"]))
    return out


def _cmd_info(args) -> int:
    model = _load_model(args.model)
    names, cats = _labels_of(model)
    ks = tuple(int(k) for k in model.cardinalities_)
    terms = _terms(model, names, cats)
    shown = terms if args.top == 0 else terms[:args.top]
    summary = {
        "model": args.model,
        "n_vars": len(ks),
        "names": names,
        "cardinalities": list(ks),
        "categories": cats,
        "cells": math.prod(ks),
        "n_samples": getattr(model, "n_samples_", None),
        "n_bases": int(getattr(model, "n_bases_", len(terms))),
        "n_iter": getattr(model, "n_iter_", None),
        "converged": getattr(model, "converged_", None),
        "cost": _float(getattr(model, "cost_", None)),
        "kl_data": _float(getattr(model, "kl_data_", None)),
        "n_terms": len(terms),
        "terms": shown,
    }
    if args.json:
        _print_json(summary)
        return 0
    print(f"FSLL model {args.model}")
    print(f"  variables   {len(ks)}: " + ", ".join(f"{nm} ({k})" for nm, k in zip(names, ks)))
    print(f"  joint table {summary['cells']:,} cells")
    if summary["n_samples"] is not None:
        print(f"  fitted on   {summary['n_samples']:,} samples"
              + ("" if summary["converged"] in (None, True) else " (stopped before convergence)"))
    print(f"  bases       {summary['n_bases']}   iterations {summary['n_iter']}   "
          f"cost {_fmt_num(summary['cost'])}   KL(pd||p) {_fmt_num(summary['kl_data'])}")
    if not terms:
        print("  no terms: the model is the uniform distribution")
        return 0
    more = "" if len(shown) == len(terms) else f" (top {len(shown)} of {len(terms)}; --top 0 shows all)"
    print(f"\nterms by |theta|{more}:")
    print(f"  {'#':>4}  {'theta':>10}  {'order':>5}  term")
    for r, t in enumerate(shown, 1):
        text = " * ".join(_factor_text(f) for f in t["factors"])
        print(f"  {r:>4}  {t['theta']:>+10.4f}  {t['order']:>5}  {text}")
    return 0


# ------------------------------------------------------------------------ sample

def _register_sample(sub) -> None:
    p = sub.add_parser(
        "sample", help="draw samples from a saved model (CSV with the original labels)",
        description="Draw N i.i.d. samples from a saved model and write them as CSV (header "
                    "row, original labels) to stdout or to --out.")
    p.add_argument("model", metavar="MODEL", help="a model saved by 'fsll-ooc fit'")
    p.add_argument("-n", "--n-samples", dest="n", type=_positive_int, required=True, metavar="N",
                   help="number of samples")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh entropy)")
    p.add_argument("--out", "-o", metavar="FILE.csv", help="write here instead of stdout")
    p.set_defaults(func=_cmd_sample)


def _cmd_sample(args) -> int:
    model = _load_model(args.model)
    if args.out is not None and not args.out.lower().endswith(".csv"):
        raise DataError(f"--out must name a .csv file, got '{args.out}'")
    if args.out is not None:
        _check_writable(args.out, "samples")
    names, cats = _labels_of(model)
    codes = model.sample(args.n, random_state=args.seed)
    df = decode(codes, cats, names)
    if args.out is None:
        df.to_csv(sys.stdout, index=False, lineterminator="\n")
    else:
        df.to_csv(args.out, index=False, lineterminator="\n")
    return 0


# ------------------------------------------------------------------------- score

def _register_score(sub) -> None:
    p = sub.add_parser(
        "score", help="mean log-likelihood of a data file under a saved model",
        description="Mean log-likelihood (natural log, nats per sample) of DATA under MODEL. "
                    "Columns are matched by name when both have names, else by position; "
                    "labels are mapped with the model's categories (unknown labels are errors).")
    p.add_argument("model", metavar="MODEL", help="a model saved by 'fsll-ooc fit'")
    p.add_argument("data", metavar="DATA", help="data file (.csv, .npy or .parquet)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cmd_score)


def _cmd_score(args) -> int:
    model = _load_model(args.model)
    names, cats = _labels_of(model)
    has_names = getattr(model, "feature_names_in_", None) is not None
    with _user_input():
        data = read_table(args.data)
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
        _print_json(result)
    else:
        print(f"mean log-likelihood {result['mean_log_likelihood']:.6f} nats per sample "
              f"({result['n_samples']} samples of {args.data}; "
              f"total {result['total_log_likelihood']:.4f})")
    return 0


# -------------------------------------------------------------------------- main

#: One function per command; each adds its sub-parser.  Append new ones here.
_REGISTRARS = [_register_demo, _register_fit, _register_info, _register_sample, _register_score]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Full-span log-linear (FSLL) models of discrete data: fit, inspect, "
                    "sample, score.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of unexpected failures")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad input/usage, 1 unexpected failure)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        _err(str(exc))
        return 2
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return int(args.func(args) or 0)
    except (DataError, UsageError) as exc:
        _err(str(exc))
        return 2
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        _err(_os_message(exc))
        return 2
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:  # e.g. 'fsll-ooc sample ... | head'
        with contextlib.suppress(Exception):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except ImportError as exc:  # a missing optional dependency: say which, no traceback
        _err(str(exc))
        return 1
    except Exception as exc:  # noqa: BLE001 - last resort: one line, exit 1
        if getattr(args, "debug", False):
            traceback.print_exc()
        _err(f"unexpected failure: {type(exc).__name__}: {exc}"
             + ("" if getattr(args, "debug", False) else f" (run '{PROG} --debug ...' for the traceback)"))
        return 1


def _os_message(exc: OSError) -> str:
    if exc.filename is not None and exc.strerror:
        return f"{exc.strerror}: '{exc.filename}'"
    return str(exc)


if __name__ == "__main__":
    raise SystemExit(main())
