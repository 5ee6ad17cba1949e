"""Command-line interface: ``fsll-ooc <command> ...`` (also ``python -m fsll_ooc.cli``).

Commands (each has ``--help``):

* ``demo``   fit the paper's dataset(s) and print the paper-style result row(s);
* ``fit``    read a text (``.csv``/``.tsv``/``.txt``), ``.npy`` or ``.parquet`` file, fit a
  model (in core, or out of core with ``--store``), save it;
* ``resume`` continue an interrupted out-of-core fit from its store;
* ``info``   summary of a saved model and its terms sorted by their share of the cost
  reduction (:func:`fsll_ooc.queries.interactions`);
* ``sample`` draw samples from a saved model, as CSV with the original labels;
* ``score``  mean log-likelihood of a data file under a saved model;
* ``plot``   save PNGs: cost per iteration and the interaction graph;
* ``plan``   the chunk plan of a fit (memory, disk, passes) before anything is allocated;
  ``tools/plan_memory.py`` is the same command.

``MODEL`` arguments are a file written by ``fit``, or the store directory of a
completed out-of-core fit (then queries stream over its tables).

Exit codes: 0 success; 2 bad input or usage, or a refusal that says what to do: a store
or model file that is damaged or altered (the message names the file), a store locked
by another writer, a full disk, a budget the fit cannot meet (printed as one line
``fsll-ooc: error: ...`` on stderr, no traceback); 1 unexpected failure (one line,
``--debug`` shows the traceback); 3 ``plan`` found the problem infeasible; 130 / 143
stopped by Ctrl-C / SIGTERM (one line, with the resume command when a store holds the
fit).  Progress bars go to stderr, and only when stderr is a terminal and ``--quiet``
is not given; warnings are one line ``fsll-ooc: warning: ...``.

No command replaces a file it did not write: ``fit`` replaces a model file (recognised
by its format header) and ``plot`` its PNGs (their ``Software: fsll-ooc`` text chunk);
anything else needs ``--force``, and a command's input is never its output.

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
import re
import signal
import sys
import time
import traceback
import warnings
from typing import Any, Sequence

import numpy as np

from . import __version__
from .machine import free_disk, total_memory
from .validation import check_store_path, read_only_fs
from .io import DataError, decode, encode, encode_with, read_table
from .queries import labels as _labels_of
from .queries import describe_factor as _describe_factor, factor_text as _factor_text  # noqa: F401 (term text)

PROG = "fsll-ooc"
#: Exit code of ``plan`` (and ``tools/plan_memory.py``) when the problem does not fit.
EXIT_INFEASIBLE = 3

# ----------------------------------------------------------------- error plumbing

#: ``(store, model path)`` of the out-of-core fit running now: an interrupted one says how to resume.
_RESUME_STORE: tuple | None = None


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


def _refusals() -> tuple:
    """The library's clear refusals (exit 2): imported only when an error reaches ``main``."""
    from .storage.lock import StoreLockedError
    from .planner import PlanError
    from .storage import DiskFullError, IntegrityError

    return (IntegrityError, StoreLockedError, DiskFullError, PlanError)


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
    from .estimator import FSLL

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


def _load_model(path: str, averages: bool = False):
    """A model file, or the store directory of a completed out-of-core fit; with
    ``averages``, also an average's file (an :class:`~fsll_ooc.FSLLAverage`)."""
    if not os.path.lexists(path):
        raise FileNotFoundError(f"no such model file: '{path}'")
    if os.path.isdir(path):
        from .storage.fit_store import STATE_FILE, FitStore

        store = FitStore(path)
        if not store.exists():
            raise DataError(f"'{path}' is a directory but not an fsll-ooc store (no {STATE_FILE})")
        with _user_input():
            status = store.read().status
            if status != "complete":
                raise DataError(f"the fit in store '{path}' is not complete (status {status!r}); "
                                f"finish it with: {PROG} resume {path}")
            return _model_class().resume(path, progress=False)
    from . import model_file

    with _user_input():
        if model_file.is_average(path):
            if not averages:
                raise DataError(f"'{path}' holds an average of several models (FSLLAverage); this command "
                                f"needs one model's file (info, sample and score take an average)")
            from .average import FSLLAverage

            return FSLLAverage.load(path)
        return _model_class().load(path)


def _check_writable(path: str, what: str, store: str | None = None) -> None:
    """Fail early (before a long fit) when ``path`` cannot be written: a directory, a missing
    or read-only directory, or a place inside a store (``store``, or any directory holding a
    fit's state), whose files only the fit may write."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise DataError(f"cannot write the {what} to '{path}': it is a directory")
    if not os.path.isdir(parent):
        raise DataError(f"cannot write the {what} to '{path}': directory '{parent}' does not exist")
    if not os.access(parent, os.W_OK):
        ro = " (a read-only file system)" if read_only_fs(parent) else ""
        raise DataError(f"cannot write the {what} to '{path}': directory '{parent}' is not writable{ro}")
    from .storage.fit_store import STATE_FILE

    up, stores = parent, {os.path.realpath(store)} if store is not None else set()
    while True:
        if os.path.realpath(up) in stores or os.path.exists(os.path.join(up, STATE_FILE)):
            raise DataError(f"cannot write the {what} to '{path}': it is inside the store '{up}', whose files "
                            "only a fit writes; write it outside the store")
        if os.path.dirname(up) == up:
            break
        up = os.path.dirname(up)


#: Bytes of a model file per term or history entry and variable (an index digit with its comma,
#: the numbers and field names around them: measured files take less), and the terms allowed for.
_MODEL_BYTES_PER_ENTRY = (4, 200)
_MODEL_ENTRIES = 20_000


def _check_room(path: str, what: str, n_vars: int) -> None:
    """Before a fit: the model file's directory has room for it (``_MODEL_ENTRIES`` terms and
    as many history entries, far more than fits make), so that a fit never ends unsaved."""
    per_var, fixed = _MODEL_BYTES_PER_ENTRY
    need = 2 * _MODEL_ENTRIES * (per_var * n_vars + fixed)
    free = free_disk(os.path.dirname(os.path.abspath(path)))
    if free < need:
        from .planner import format_bytes

        raise DataError(f"cannot write the {what} to '{path}': its file system has {format_bytes(free)} free, and a "
                        f"model of {n_vars} variables may take up to {format_bytes(need)}; free some space or "
                        "write it elsewhere (checked before fitting, so that a fit never ends unsaved)")



#: How a file this command line wrote starts: a model file (its format header) and the
#: PNGs of ``plot`` (a text chunk naming fsll-ooc).  Such files may be replaced without --force.
_MODEL_HEAD = re.compile(rb'^\s*\{\s*"format"\s*:\s*"fsll-ooc-model"')
_PNG_MARK = b"fsll-ooc"


def _written_by_us(path: str, kind: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    if kind == "model":
        return bool(_MODEL_HEAD.match(head))
    if kind == "png":
        return head.startswith(b"\x89PNG") and _PNG_MARK in head
    return False


def _check_output(path: str, what: str, force: bool, kind: str | None = None, inputs: Sequence[str] = (),
                  store: str | None = None) -> None:
    """Refuse to replace a file the user has (``--force`` allows it); a file of ``kind``
    that fsll-ooc wrote may be replaced.  An input of the same command is never replaced."""
    _check_writable(path, what, store)
    for src in inputs:
        if src is not None and os.path.exists(src) and os.path.exists(path) and os.path.samefile(src, path):
            raise DataError(f"'{path}' is the input data; write the {what} to another file")
    if os.path.lexists(path) and not force and not (kind is not None and _written_by_us(path, kind)):
        raise DataError(f"'{path}' exists and was not written by {PROG}; choose another file, or pass "
                        f"--force to replace it")


# ---------------------------------------------------------------- argument types

def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    return v


def _storage_options(s: str) -> dict:
    """``--storage-options``: a JSON object of fsspec options for a store given by URL."""
    try:
        obj = json.loads(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--storage-options must be a JSON object, e.g. "
                                         f"'{{\"endpoint_url\": \"http://127.0.0.1:9000\"}}' ({e})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"--storage-options must be a JSON object, got {type(obj).__name__}")
    return obj


_STORAGE_OPTIONS_HELP = ("fsspec options (a JSON object) for a --store given by URL, e.g. "
                         "'{\"endpoint_url\": \"http://minio:9000\"}'; S3 credentials can also come from the "
                         "usual AWS_* environment variables")


def _epsilon(s: str):
    """``--epsilon``: ``auto`` or a positive number."""
    if s.strip().lower() == "auto":
        return "auto"
    try:
        return _positive_float(s)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive number, got {s!r}") from None


def _int_at_least(low: int, what: str):
    """An argument type: an integer ``>= low`` (``what`` words the error)."""
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            v = None
        if v is None or v < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
        return v
    return parse


_positive_int = _int_at_least(1, "a positive integer")
_nonneg_int = _int_at_least(0, "an integer >= 0")


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


def _add_read_options(p, drop: bool = True) -> None:
    """The options that say how to read a text data file (and which columns to leave out)."""
    g = p.add_argument_group("reading text files (.csv, .tsv, .txt)")
    g.add_argument("--sep", metavar="CHAR", type=_separator,
                   help="the delimiter, e.g. ';' or '\\t' (default: sniffed among , ; tab |; tab for .tsv)")
    g.add_argument("--no-header", action="store_true",
                   help="the first line is data; columns are named X0, X1, ...")
    g.add_argument("--na-values", metavar="S1,S2", type=lambda v: [x for x in v.split(",")],
                   help="more strings that mark a missing cell, e.g. '?' (missing cells are errors)")
    g.add_argument("--keep-na", action="store_true",
                   help="read NA, None, null, NaN, ... as labels, not as missing cells (an empty field "
                        "is still missing)")
    if drop:
        g.add_argument("--drop", metavar="NAME", action="append", default=[],
                       help="leave this column out (repeat, or NAME1,NAME2)")


def _separator(s: str) -> str:
    s = {"\\t": "\t", "tab": "\t", "TAB": "\t", "space": " "}.get(s, s)
    if len(s) != 1:
        raise argparse.ArgumentTypeError(f"expected one character (or '\\t' for a tab), got {s!r}")
    return s


def _read_data(args, path: str):
    """``read_table`` with the command's reading options, ``--drop`` applied."""
    data = read_table(path, sep=getattr(args, "sep", None), header=not getattr(args, "no_header", False),
                      na_values=getattr(args, "na_values", None), keep_na=getattr(args, "keep_na", False),
                      missing=getattr(args, "missing", None) == "em")
    drop = [c.strip() for d in getattr(args, "drop", None) or [] for c in d.split(",") if c.strip()]
    if drop:
        if not hasattr(data, "columns"):
            raise DataError("--drop needs named columns (a .csv, .tsv, .txt or .parquet file)")
        names = [str(c) for c in data.columns]
        unknown = [c for c in drop if c not in names]
        if unknown:
            raise DataError(f"--drop: no column {', '.join(repr(c) for c in unknown)} in {path} "
                            f"(columns: {', '.join(names[:12])}{', ...' if len(names) > 12 else ''})")
        data = data.drop(columns=drop)
        if data.shape[1] == 0:
            raise DataError("--drop leaves no column to fit")
    return data


# -------------------------------------------------------------------------- demo

def _register_demo(sub) -> None:
    from .datasets import PAPER_DATASETS
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
    p.add_argument("--epsilon", type=_epsilon, default=1e-4,
                   help="stopping threshold on the cost improvement: a number or 'auto' "
                        "(default: %(default)s, the paper's setting, so the rows compare with its table)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=_cmd_demo)


def _load_kernels() -> None:
    """Compile (first run after installing) or load from numba's cache the kernels a fit uses."""
    from . import kernels
    kernels.prepare_fit(cards=(2,))  # the paper's datasets are binary


_DEMO_HEADER = ("data", "N", "KL(pd||p)", "KL(p*||p)", "#basis", "iterations", "seconds")
_DEMO_FMT = "{:<10} {:>7} {:>10} {:>10} {:>7} {:>11} {:>8}"


def _cmd_demo(args) -> int:
    from . import datasets
    FSLL = _model_class()
    names = list(datasets.PAPER_DATASETS) if args.all else [args.dataset]
    progress = _show_progress(args)
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
        _print_json(rows if args.all else rows[0])
    return 0


# --------------------------------------------------------------------------- fit

def _register_fit(sub) -> None:
    p = sub.add_parser(
        "fit", help="fit a model to a data file and save it",
        description="Read DATA (text: .csv, .tsv or .txt with a header row, delimiter sniffed; "
                    ".npy or .parquet; one column per variable, one row per sample), encode its "
                    "categories, fit an FSLL model and save it to MODEL. Text/Parquet columns: "
                    "integers >= 0 are codes 0..max, other values are labels (sorted). An "
                    "interrupted --store fit is continued with 'fsll-ooc resume STORE'.")
    p.add_argument("data", metavar="DATA", help="input file (.csv, .tsv, .txt, .npy or .parquet)")
    p.add_argument("--out", "-o", required=True, metavar="MODEL",
                   help="where to save the model (an existing file is replaced only if fsll-ooc wrote it, "
                        "or with --force)")
    p.add_argument("--cardinalities", type=_cardinality_list, metavar="K1,K2,...",
                   help="declared number of categories per column, e.g. 2,3,4 (integer columns "
                        "are then codes 0..k-1; unseen codes are kept)")
    p.add_argument("--missing", choices=["em"], default=None,
                   help="'em': fit rows with missing cells (empty fields and NA markers) by EM, missing "
                        "at random (in core, or out of core with --store); without it a missing cell is an error")
    p.add_argument("--epsilon", type=_epsilon, default="auto",
                   help="stopping threshold on the cost improvement: 'auto' (default: 0.1/N with "
                        "corrective steps, see help(fsll_ooc.FSLL)) or a number; 1e-4 is the paper's setting")
    p.add_argument("--max-iter", type=_positive_int, default=None, metavar="N",
                   help="stop after N iterations (default: no limit)")
    p.add_argument("--store", metavar="DIR",
                   help="fit out of core: keep the working tables in this directory (Zarr v3); "
                        "check the budget first with 'fsll-ooc plan'. The finished store can be "
                        "given as MODEL to info/sample/score/plot. A URL (s3://bucket/fit, gs://...) "
                        "puts the store on an object store that every --scheduler worker reaches.")
    p.add_argument("--storage-options", type=_storage_options, metavar="JSON", help=_STORAGE_OPTIONS_HELP)
    p.add_argument("--memory-limit", metavar="SIZE",
                   help="memory budget such as 4GiB; the planner picks a chunk layout within it "
                        "(default: the machine's RAM in core; 2 GiB out of core)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run the chunk passes on a dask.distributed cluster, e.g. tcp://host:8786 "
                        "(every worker must see the --store directory or URL)")
    p.add_argument("--force", action="store_true",
                   help="replace MODEL even if fsll-ooc did not write it; with --store, start the fit of "
                        "an interrupted store again instead of refusing")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar (the summary is still printed)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _add_read_options(p)
    p.set_defaults(func=_cmd_fit)


def _connect(address: str):
    """A ``dask.distributed.Client`` for ``address``; a refused connection is the user's input."""
    from dask.distributed import Client

    try:
        return Client(address, timeout="10s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise DataError(f"cannot connect to the dask scheduler at '{address}': {exc}") from None


def _cmd_fit(args) -> int:
    from .planner import PlanError, parse_bytes

    _check_output(args.out, "model", args.force, kind="model", inputs=[args.data], store=args.store)
    if args.store is not None and os.path.isfile(args.store):
        raise DataError(f"--store must be a directory, but '{args.store}' is a file")
    if args.store is not None:
        check_store_path(args.store)
    if args.store is not None and not args.force:
        _refuse_interrupted_store(args.store, args.out, args.storage_options)
    FSLL = _model_class()
    with _user_input():
        memory = parse_bytes(args.memory_limit) if args.memory_limit is not None else None
        data, mask = _read_data(args, args.data), None
        if args.missing == "em":
            from .missing import MISSING, split_missing

            data, mask = split_missing(data)
        enc = _encode_or_advise(data, args.cardinalities, args.store)
        codes = enc.codes if mask is None else np.where(mask, MISSING, enc.codes)
        del data
        _check_budget(enc.cardinalities, enc.names, memory, args.store)
        _check_room(args.out, "model", enc.n_vars)
    client = _connect(args.scheduler) if args.scheduler else None
    global _RESUME_STORE
    _RESUME_STORE = (args.store, args.out) if args.store is not None else None
    try:
        with _user_input():
            model = FSLL(cardinalities=enc.cardinalities, epsilon=args.epsilon, max_iter=args.max_iter,
                         store=args.store, memory_limit=memory, scheduler=client, progress=_show_progress(args),
                         missing=args.missing, storage_options=args.storage_options)
        _flush_warnings()  # what the reading found, before a fit that may take long
        t0 = time.perf_counter()
        try:
            with _user_input():  # fit validates the codes (e.g. the size of the joint table)
                model.fit(codes, feature_names=enc.names, categories=enc.categories)
        except PlanError as exc:  # the budget does not fit the problem: the user's input
            raise DataError(str(exc)) from exc
        seconds = time.perf_counter() - t0
    finally:
        if client is not None:
            client.close()
    _RESUME_STORE = None
    _save(model, args.out, args.store)
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
        "cost": float(model.cost_),
        "kl_data": float(model.kl_data_),
        "seconds": seconds,
        "store": args.store,
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
    print(f"  saved to {args.out}" + (f" (tables in store {args.store})" if args.store else ""))
    return 0


def _save(model, out: str, store: str | None) -> None:
    """``model.save(out)``; a full disk (checked before the fit, but space can go) is a
    refusal that says where the model still is."""
    import errno

    try:
        model.save(out)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        kept = (f"the fit is kept in store '{store}': free some space, then save it with: {PROG} resume {store} -o {out}"
                if store is not None else "the model is lost: free some space and fit again")
        raise DataError(f"cannot save the model to '{out}': the disk is full ({_os_message(exc)}); {kept}") from None


def _check_budget(cards, names, memory: int | None, store: str | None) -> None:
    """Refusals before the fit, in the command line's words: a memory limit below what the
    process itself needs, or a joint table too large for this machine (which size would fit)."""
    from .planner import BASE_OVERHEAD, TABLES, format_bytes

    if memory is not None and memory <= BASE_OVERHEAD:
        raise DataError(f"--memory-limit {format_bytes(memory)} is below the {format_bytes(BASE_OVERHEAD)} reserve the "
                        f"process keeps for itself (Python, numpy, the compiled kernels) before any table; give "
                        f"at least 1GiB (e.g. --memory-limit 2GiB)")
    cells = math.prod(cards)
    machine = total_memory()
    if store is None and machine is not None and not _fits_in_memory(machine)(cards):
        raise DataError(f"{len(cards)} variables make a joint table of {cells:,} cells, whose tables need "
                        f"{format_bytes((TABLES + 1) * 8 * cells)}, more than this machine's "
                        f"{format_bytes(machine)} of memory; in memory, {_practical(cards, names, _fits_in_memory(machine))}; "
                        f"or fit out of core with --store DIR (check the disk it needs with "
                        f"'{PROG} plan --data FILE')")


def _encode_or_advise(data, cardinalities=None, store: str | None = None):
    """``encode``; a joint table beyond every limit gets the practical size here and ``--drop``
    (in memory without a store; within the format's limit and the free disk with one)."""
    try:
        return encode(data, cardinalities=cardinalities)
    except DataError as exc:
        cards = getattr(exc, "cardinalities", None)
        if cards is None:
            raise
        from .io import MAX_CELLS
        from .planner import TABLES

        if store is None:
            fits, where = _fits_in_memory(total_memory() or 2**30), "in memory"
        else:
            disk = _store_free_disk(store)
            room = MAX_CELLS if disk is None else min(MAX_CELLS, disk // (TABLES * 8))
            fits, where = (lambda ks: math.prod(ks) <= room), ("on this disk" if disk is not None else "in the store")
        raise DataError(f"{len(cards)} variables are too many: {exc}; {where}, "
                        f"{_practical(cards, exc.names, fits)}") from None


def _practical(cards, names, fits) -> str:
    """Which size is practical here, and how to get there: leave out the variables with the
    most categories first until ``fits(cards)`` (a planner check) holds."""
    keep, dropped = practical_subset(cards, fits)
    if keep is None:
        return "no subset of these variables fits (even one variable's tables do not)"
    drop = [str(names[j]) if names is not None else f"X{j}" for j in dropped]
    if not drop:
        return "fewer variables would fit"
    cells = math.prod(cards[i] for i in keep)
    shown = ",".join(drop[:6]) + (",..." if len(drop) > 6 else "")
    return (f"{len(keep)} of these {len(cards)} variables ({cells:,} cells) would fit; leave the others out, "
            f"e.g. --drop {shown}")


def practical_subset(cards, fits) -> tuple:
    """``(kept indices, dropped indices)``: the variables with the most categories left out
    first until ``fits(kept cardinalities)``; ``(None, None)`` when no subset fits."""
    order = sorted(range(len(cards)), key=lambda j: (-cards[j], -j))
    dropped, log2 = 0, sum(math.log2(k) for k in cards)
    while dropped < len(cards) - 1 and log2 > 40.5:  # beyond the format's limit: no need to ask
        log2 -= math.log2(cards[order[dropped]])
        dropped += 1
    gone = set(order[:dropped])
    while True:
        keep = [i for i in range(len(cards)) if i not in gone]
        if fits(tuple(cards[i] for i in keep)):
            break
        if dropped >= len(cards) - 1 or cards[order[dropped]] == 1:
            return None, None
        gone.add(order[dropped])
        dropped += 1
    return keep, order[:dropped]


def _fits_in_memory(memory: int):
    from .planner import BASE_OVERHEAD, TABLES

    return lambda cards: BASE_OVERHEAD + (TABLES + 1) * 8 * math.prod(cards) <= memory


def _store_free_disk(store: str) -> int | None:
    """Free bytes where ``store`` goes (None for an object store given by URL: it does not say)."""
    from .storage.url_store import local_path

    path = local_path(store)
    return free_disk(path) if path is not None else None


def _store_status(store: str, storage_options: dict | None = None):
    """The verified state of the fit in ``store`` (None: no fsll-ooc fit there)."""
    from .storage.fit_store import FitStore

    with _user_input():
        fs = FitStore(store, storage_options=storage_options)
    if not fs.exists():
        return None
    with _user_input():
        return fs.read()


def _refuse_interrupted_store(store: str, out: str, storage_options: dict | None = None) -> None:
    stored = _store_status(store, storage_options)
    if stored is None or stored.status == "complete":
        return
    it = stored.state.get("n_iter") if isinstance(stored.state, dict) else None
    at = f" (stopped after iteration {it})" if isinstance(it, int) else ""
    raise DataError(f"store '{store}' holds an interrupted fit{at}; continue it with: {PROG} resume {store} "
                    f"-o {out} (or pass --force to delete it and fit again)")


def _fmt_num(x, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


# -------------------------------------------------------------------------- info

def _register_info(sub) -> None:
    p = sub.add_parser(
        "info", help="summary of a saved model and its terms, most important first",
        description="Print a saved model's summary and its selected terms, sorted by their share "
                    "of the fit's cost reduction (the gain of the iteration that appended the term "
                    "plus its later adjustments). A term adds theta * Phi_y(x) to log p(x) (up to "
                    "log Z). Each variable in a term is shown with the categories on which its "
                    "basis function is +1 (e.g. 'colour=red'; -1 elsewhere); Phi_y(x) is the "
                    "product, i.e. +1 when an even number of the shown conditions fail. Order = "
                    "number of variables in the term: order >= 2 terms are interactions.")
    p.add_argument("model", metavar="MODEL", help="a model saved by 'fsll-ooc fit' (or a completed store)")
    p.add_argument("--top", type=_nonneg_int, default=20, metavar="K",
                   help="show the K most important terms; 0 shows all (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print summary and terms as JSON")
    p.set_defaults(func=_cmd_info)


def _nan_to_none(x):
    return None if isinstance(x, float) and math.isnan(x) else x


def _cmd_info(args) -> int:
    model = _load_model(args.model, averages=True)
    if hasattr(model, "members_"):
        return _info_average(args, model)
    return _info_model(args, model)


def _term_rows(model) -> list[dict]:
    """The rows of ``info``: a model's terms (:func:`fsll_ooc.queries.interactions`), most important first."""
    from .queries import interactions

    return [{"term": t["term"], "variables": list(t["variables"]), "order": t["order"], "theta": t["theta"],
             "share": _nan_to_none(t["share"]), "y": list(t["y"]), "factors": t["factors"]}
            for t in interactions(model, as_frame=False)]


def _print_table_head(what: str, path, names, ks) -> None:
    """The first lines of ``info``: what the file holds, its variables and table size."""
    print(f"{what} {path}")
    print(f"  variables   {len(ks)}: " + ", ".join(f"{nm} ({k})" for nm, k in zip(names, ks)))
    print(f"  joint table {math.prod(ks):,} cells")


def _print_terms(terms: list[dict], more: str = "") -> None:
    """``info``'s table of terms (rank, share, theta, order, the term in words)."""
    print(f"  {'#':>4}  {'share':>6}  {'theta':>9}  {'order':>5}  term{more}")
    for r, t in enumerate(terms, 1):
        share = "n/a" if t["share"] is None else f"{100 * t['share']:.1f}%"
        print(f"  {r:>4}  {share:>6}  {t['theta']:>+9.4f}  {t['order']:>5}  {t['term']}")


def _info_average(args, avg) -> int:
    """``info`` of an average: its members' summaries, and each member's most important terms."""
    names, cats = _labels_of(avg)
    ks = tuple(int(k) for k in avg.cardinalities_)
    members = []
    for k, m in enumerate(avg.members_):
        terms = _term_rows(m)
        members.append({"member": k, "n_bases": int(m.n_bases_), "n_iter": m.n_iter_, "converged": m.converged_,
                        "cost": _float(m.cost_), "kl_data": _float(m.kl_data_), "n_samples": m.n_samples_,
                        "n_terms": len(terms), "terms": terms if args.top == 0 else terms[:args.top]})
    summary = {"model": args.model, "average_of": len(members), "n_vars": len(ks), "names": names,
               "cardinalities": list(ks), "categories": cats, "cells": math.prod(ks), "n_samples": avg.n_samples_,
               "members": members}
    if args.json:
        _print_json(summary)
        return 0
    _print_table_head(f"FSLL average of {len(members)} models", args.model, names, ks)
    print(f"  fitted on   {summary['n_samples']:,} samples (each member on a random four fifths of them)")
    print("  the model is the mean of the members' distributions; it has no single set of terms, so each")
    print("  member's terms are listed with their share of that member's cost reduction")
    for mem in members:
        more = "" if len(mem["terms"]) == mem["n_terms"] else f" (top {len(mem['terms'])} of {mem['n_terms']})"
        print(f"\nmember {mem['member']}: bases {mem['n_bases']}   iterations {mem['n_iter']}   "
              f"cost {_fmt_num(mem['cost'])}" + ("" if mem["converged"] else "   (stopped before convergence)"))
        if mem["terms"]:
            _print_terms(mem["terms"], more)
    return 0


def _info_model(args, model) -> int:
    names, cats = _labels_of(model)
    ks = tuple(int(k) for k in model.cardinalities_)
    terms = _term_rows(model)
    shown = terms if args.top == 0 else terms[:args.top]
    by_order: dict[int, int] = {}
    for t in terms:
        by_order[t["order"]] = by_order.get(t["order"], 0) + 1
    summary = {
        "model": args.model,
        "n_vars": len(ks),
        "names": names,
        "cardinalities": list(ks),
        "categories": cats,
        "cells": math.prod(ks),
        "n_samples": model.n_samples_,
        "n_bases": int(model.n_bases_),
        "n_iter": model.n_iter_,
        "converged": model.converged_,
        "cost": _float(model.cost_),  # None when the model file has none
        "kl_data": _float(model.kl_data_),
        "n_terms": len(terms),
        "terms_by_order": {str(o): c for o, c in sorted(by_order.items())},
        "terms": shown,
    }
    if args.json:
        _print_json(summary)
        return 0
    _print_table_head("FSLL model", args.model, names, ks)
    print(f"  fitted on   {summary['n_samples']:,} samples"
          + ("" if summary["converged"] else " (stopped before convergence)"))
    print(f"  bases       {summary['n_bases']}   iterations {summary['n_iter']}   "
          f"cost {_fmt_num(summary['cost'])}   KL(pd||p) {_fmt_num(summary['kl_data'])}")
    if summary["cost"] is not None:
        print("              cost: the MDL cost the fit minimised (KL(pd||p) + the parameters' code length,")
        print(f"              nats per sample; lower is better); for a log-likelihood use '{PROG} score'")
    if not terms:
        print("  no terms: the model is the uniform distribution")
        return 0
    print("  terms       " + ", ".join(f"{c} of order {o}" for o, c in sorted(by_order.items())))
    more = "" if len(shown) == len(terms) else f" (top {len(shown)} of {len(terms)}; --top 0 shows all)"
    print(f"\nterms by share of the cost reduction{more}:")
    _print_terms(shown)
    return 0


# ------------------------------------------------------------------------ resume

def _register_resume(sub) -> None:
    p = sub.add_parser(
        "resume", help="continue an interrupted out-of-core fit from its store",
        description="Continue the fit kept in STORE (a 'fit --store' that was interrupted: Ctrl-C, a "
                    "kill, a full disk) from its last iteration, to the same model an uninterrupted fit "
                    "gives, and save it. On a finished store it only saves the model.")
    p.add_argument("store", metavar="STORE", help="the --store directory (or URL) of the interrupted fit")
    p.add_argument("--out", "-o", metavar="MODEL",
                   help="save the model here too (an existing file is replaced only if fsll-ooc wrote it, "
                        "or with --force); the finished store itself can serve as MODEL")
    p.add_argument("--restart", action="store_true",
                   help="rebuild the tables from the data kept in the store and fit again (for a store "
                        "whose tables were damaged)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run the passes on a dask.distributed cluster")
    p.add_argument("--storage-options", type=_storage_options, metavar="JSON", help=_STORAGE_OPTIONS_HELP)
    p.add_argument("--force", action="store_true", help="replace MODEL even if fsll-ooc did not write it")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_resume)


def _cmd_resume(args) -> int:
    from .planner import PlanError

    from .storage.url_store import local_path

    if local_path(args.store) is not None and not os.path.isdir(local_path(args.store)):
        raise DataError(f"no store directory '{args.store}'")
    if _store_status(args.store, args.storage_options) is None:
        raise DataError(f"'{args.store}' is not an fsll-ooc store (no fit state in it)")
    if args.out is not None:
        _check_output(args.out, "model", args.force, kind="model", store=args.store)
    global _RESUME_STORE
    _RESUME_STORE = (args.store, args.out)
    client = _connect(args.scheduler) if args.scheduler else None
    t0 = time.perf_counter()
    try:
        with _user_input():
            model = _model_class().resume(args.store, scheduler=client, progress=_show_progress(args),
                                          restart=args.restart, storage_options=args.storage_options)
    except PlanError as exc:
        raise DataError(str(exc)) from exc
    finally:
        if client is not None:
            client.close()
    seconds = time.perf_counter() - t0
    _RESUME_STORE = None
    if args.out is not None:
        _save(model, args.out, args.store)
    summary = {"store": args.store, "model": args.out, "n_bases": int(model.n_bases_),
               "n_iter": int(model.n_iter_), "cost": _float(getattr(model, "cost_", None)),
               "kl_data": _float(getattr(model, "kl_data_", None)), "seconds": seconds}
    if args.json:
        _print_json(summary)
        return 0
    print(f"finished the fit in store {args.store}")
    print(f"  bases {summary['n_bases']}   iterations {summary['n_iter']}   cost {_fmt_num(summary['cost'])}   "
          f"KL(pd||p) {_fmt_num(summary['kl_data'])}   time {seconds:.2f} s")
    if args.out is not None:
        print(f"  saved to {args.out}")
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
    p.add_argument("--out", "-o", metavar="FILE.csv",
                   help="write here instead of stdout (an existing file only with --force)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument("--json", action="store_true",
                   help="write the samples to stdout as a JSON list of records instead of CSV")
    p.set_defaults(func=_cmd_sample)


def _cmd_sample(args) -> int:
    model = _load_model(args.model, averages=True)
    if args.json and args.out is not None:
        raise UsageError("--json writes to stdout; it cannot be combined with --out")
    if args.out is not None and not args.out.lower().endswith(".csv"):
        raise DataError(f"--out must name a .csv file, got '{args.out}'")
    if args.out is not None:
        _check_output(args.out, "samples", args.force, inputs=[args.model])
    names, cats = _labels_of(model)
    with _user_input():  # e.g. more samples, or a larger table, than memory holds
        codes = model.sample(args.n, random_state=args.seed, as_frame=False)
    df = decode(codes, cats, names)
    if args.json:
        _print_json([{nm: cats[j][int(c)] for j, (nm, c) in enumerate(zip(names, row))} for row in codes])
    elif args.out is None:
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
    p.add_argument("data", metavar="DATA", help="data file (.csv, .tsv, .txt, .npy or .parquet)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_read_options(p, drop=False)
    p.set_defaults(func=_cmd_score)


def _cmd_score(args) -> int:
    model = _load_model(args.model, averages=True)
    names, cats = _labels_of(model)
    has_names = model.feature_names_in_ is not None
    with _user_input():
        data = _read_data(args, args.data)
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


# -------------------------------------------------------------------------- plot

def _register_plot(sub) -> None:
    p = sub.add_parser(
        "plot", help="save PNGs: cost per iteration and the interaction graph",
        description="Save two PNG files: PREFIX-cost.png (cost and number of bases per iteration; "
                    "needs the fit history, which 'fsll-ooc fit' saves) and PREFIX-interactions.png "
                    "(variables on a circle; an edge's width is the strength of the pairwise terms "
                    "of its two variables, higher-order terms are hubs joined to their variables, "
                    "a variable's ring is the strength of its single-variable terms). Strength is "
                    "the share of the cost reduction (or |theta| with --weight theta). "
                    "Needs matplotlib: pip install \"fsll-ooc[docs]\".")
    p.add_argument("model", metavar="MODEL", help="a model saved by 'fsll-ooc fit' (or a completed store)")
    p.add_argument("--out-dir", "-d", default=".", metavar="DIR",
                   help="directory for the PNGs, created if needed (default: current directory)")
    p.add_argument("--prefix", metavar="NAME",
                   help="file name prefix (default: the model file name without extension)")
    p.add_argument("--weight", choices=("auto", "share", "theta"), default="auto",
                   help="edge strength: share of the cost reduction, |theta|, or auto (share when "
                        "the model has a fit history; default)")
    p.add_argument("--top", type=_nonneg_int, default=40, metavar="K",
                   help="draw the K strongest edges/hyperedges; 0 draws all (default: %(default)s)")
    p.add_argument("--dpi", type=_positive_int, default=120, help="resolution (default: %(default)s)")
    p.add_argument("--force", action="store_true",
                   help="replace existing PNG files even if fsll-ooc did not write them")
    p.add_argument("--json", action="store_true", help="print the written paths as JSON")
    p.set_defaults(func=_cmd_plot)


def _cmd_plot(args) -> int:
    from .plotting import save_plots

    model = _load_model(args.model)
    if os.path.isfile(args.out_dir):
        raise DataError(f"--out-dir '{args.out_dir}' is a file, not a directory")
    prefix = args.prefix or os.path.splitext(os.path.basename(os.path.normpath(args.model)))[0] or "model"
    for suffix in ("cost", "interactions"):
        target = os.path.join(args.out_dir, f"{prefix}-{suffix}.png")
        if os.path.isdir(args.out_dir):
            _check_output(target, "picture", args.force, kind="png", inputs=[args.model])
    paths = save_plots(model, args.out_dir, prefix, dpi=args.dpi, weight=args.weight,
                       top=None if args.top == 0 else args.top)
    if args.json:
        _print_json({"model": args.model, "files": paths})
    else:
        for path in paths:
            print(f"wrote {path}")
    return 0


# -------------------------------------------------------------------------- plan

def _register_plan(sub) -> None:
    p = sub.add_parser(
        "plan", help="the chunk plan of a fit: memory, disk, passes (exit 3 if it does not fit)",
        description="Plan a fit before anything is allocated: from the cardinalities (given, or read "
                    "from a data file) and your memory and disk budget, print the chunk layout, "
                    "the passes per iteration, the bytes moved, the peak memory and the disk the "
                    "store needs, and whether it fits. Exit code 0: feasible; 3: infeasible (the "
                    "report says what would fit); 2: bad input. 'python tools/plan_memory.py' is "
                    "the same command.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--cards", metavar="SPEC",
                     help="cardinalities, e.g. 2x20,3x4 (twenty binary and four ternary variables) or 2,3,4")
    src.add_argument("--data", metavar="FILE", help="a data file (.csv, .npy, .parquet): use its cardinalities")
    p.add_argument("--memory", metavar="SIZE",
                   help="memory budget, e.g. 4GiB (default: this machine's RAM)")
    p.add_argument("--disk", metavar="SIZE",
                   help="free disk for the store, e.g. 100GiB (default: the free space of --store, "
                        "else not checked)")
    p.add_argument("--store", metavar="DIR", help="where the store would go (its free space is the disk budget)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                   help="table dtype (default: %(default)s; fits use float64)")
    p.add_argument("--workers", type=_positive_int, default=2, metavar="N",
                   help="tasks running at once: threads or dask workers (default: %(default)s)")
    p.add_argument("--out-of-core", action="store_true",
                   help="plan an out-of-core fit even if the tables fit in memory")
    p.add_argument("--disk-speed", metavar="SIZE",
                   help="the disk's speed per second for the time estimate, e.g. 200MB (default: measured "
                        "with a 128 MiB file in the --store directory; in core the memory's speed is measured)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    _add_read_options(p)
    p.set_defaults(func=_cmd_plan)


def _plan_duration(args, p):
    """The time estimate of a plan: at ``--disk-speed``, or at a speed measured here (the
    disk of ``--store`` out of core, the memory in core); None when there is nothing to measure."""
    from functools import partial

    from .learn.batch import AUTO_MIN_CELLS
    from .machine import disk_speed, memory_speed
    from .planner import estimate_duration, parse_bytes

    estimate_duration = partial(estimate_duration, batched_by_default=p.layout.size >= AUTO_MIN_CELLS)

    if args.disk_speed is not None and p.out_of_core:
        with _user_input():
            speed = parse_bytes(args.disk_speed)
        return estimate_duration(p, speed, speed, "given with --disk-speed")
    if not p.out_of_core:
        speed = memory_speed()
        return estimate_duration(p, speed, speed, "memory, measured: a copy of 64 MiB; compute comes on top")
    from .storage.url_store import local_path

    if args.store is None or local_path(args.store) is None:  # an object store: no disk to measure
        return None
    where = os.path.abspath(local_path(args.store))
    while not os.path.isdir(where):
        where = os.path.dirname(where)
    if free_disk(where) < 1 * 2**30:
        return None
    try:
        write, read = disk_speed(where)
    except OSError:
        return None
    return estimate_duration(p, read, write, f"measured in {where}: 128 MiB written with fsync, read back "
                                             "uncached")


def _cmd_plan(args) -> int:
    from .planner import PASSES_PER_TERM, parse_bytes, parse_cards, plan

    names = None
    with _user_input():
        if args.cards is not None:
            cards = parse_cards(args.cards)
        else:
            data = _read_data(args, args.data)
            names = [str(c) for c in data.columns] if hasattr(data, "columns") else None
            cards = tuple(_encode_or_advise(data).cardinalities)
        memory = parse_bytes(args.memory) if args.memory is not None else total_memory()
        disk = parse_bytes(args.disk) if args.disk is not None else (
            _store_free_disk(args.store) if args.store is not None else None)
        p = plan(cards, dtype=args.dtype, memory_limit=memory, disk_free=disk, workers=args.workers,
                 out_of_core=True if args.out_of_core else None)
    advice = None
    if not p.feasible:
        def fits(ks):
            return plan(ks, dtype=args.dtype, memory_limit=memory, disk_free=disk, workers=args.workers,
                        out_of_core=True if args.out_of_core else None).feasible

        advice = f"! within this budget, {_practical(cards, names, fits)} (fit and plan --data take --drop)"
    duration = _plan_duration(args, p) if p.task_bytes else None
    rows = duration.rows() if duration is not None else [
        ("time", "give --store DIR (its disk is measured) or --disk-speed 200MB for an estimate")]
    report = _cli_words(p.report(extra=rows if p.task_bytes else ()), "plan")
    if args.json:
        L = p.layout
        _print_json({
            "cards": list(cards), "cells": math.prod(cards), "dtype": p.dtype, "feasible": p.feasible,
            "problems": list(p.problems), "out_of_core": p.out_of_core, "workers": p.workers,
            "layout": {"a": L.a, "c": L.c, "chunk_shape": list(L.chunk_shape),
                       "n_a_bands": L.n_a_bands, "n_b_bands": L.n_b_bands},
            "memory_limit": p.memory_limit, "disk_free": p.disk_free, "task_bytes": p.task_bytes,
            "peak_memory": p.peak_memory, "disk_bytes": p.disk_bytes,
            "bytes_per_iteration": p.bytes_per_iteration,
            "bytes_per_iteration_worst": p.bytes_per_iteration_worst, "report": report, "advice": advice,
            "duration": None if duration is None else {
                "read_speed": duration.read_speed, "write_speed": duration.write_speed, "source": duration.source,
                "seconds_per_pass": duration.seconds_per_pass,
                "seconds_per_100_terms": {how: duration.seconds(100, k) for how, k in PASSES_PER_TERM.items()}}})
    else:
        print(report)
        if advice:
            print(f"  {advice}")
    return 0 if p.feasible else EXIT_INFEASIBLE


def plan_main(argv: Sequence[str] | None = None) -> int:
    """``fsll-ooc plan ARGS`` as a function (the body of ``tools/plan_memory.py``)."""
    return main(["plan", *(sys.argv[1:] if argv is None else argv)])


# -------------------------------------------------------------------------- main

#: One function per command; each adds its sub-parser.  Append new ones here.
_REGISTRARS = [_register_demo, _register_fit, _register_resume, _register_info, _register_sample,
               _register_score, _register_plot, _register_plan]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Full-span log-linear (FSLL) models of discrete data: fit, inspect, "
                    "sample, score, plot, plan. Exit codes: 0 ok, 2 bad input or usage, 1 "
                    "unexpected failure, 3 infeasible plan.")
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
    global _RESUME_STORE
    _RESUME_STORE = None
    try:
        with _one_line_warnings(), _terminate_as_interrupt():
            return int(args.func(args) or 0)
    except (DataError, UsageError) as exc:
        _err(_with_notes(_cli_words(str(exc), args.command)))
        return 2
    except _refusals() as exc:  # damaged or locked store, full disk, infeasible budget: said plainly
        _err(_with_notes(_cli_words(str(exc), args.command)))
        return 2
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        _err(_with_notes(_os_message(exc)))
        return 2
    except KeyboardInterrupt as exc:
        _PENDING_WARNINGS.clear()
        sig = getattr(exc, "signum", signal.SIGINT)
        name = "terminated" if sig == signal.SIGTERM else "interrupted"
        if _RESUME_STORE is not None:
            store, out = _RESUME_STORE
            _err(f"{name}; the fit is kept in store '{store}': continue it with: {PROG} resume {store}"
                 + (f" -o {out}" if out else ""))
        else:
            _err(name)
        _silence_stderr()  # library threads winding down after an interrupt would print tracebacks
        return 128 + int(sig)
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


def _cli_words(message: str, command: str | None) -> str:
    """The library's advice in the command line's words: flags, not Python arguments."""
    memory = "--memory" if command == "plan" else "--memory-limit"
    m = message
    m = re.sub(r"FSLL\.resume\((['\"])(.+?)\1, restart=True\)", rf"{PROG} resume \2 --restart", m)
    m = re.sub(r"FSLL\.resume\((['\"])(.+?)\1\)", rf"{PROG} resume \2", m)
    m = m.replace("FSLL.resume(store, restart=True)", f"{PROG} resume STORE --restart")
    m = m.replace("FSLL.resume(store)", f"{PROG} resume STORE")
    m = m.replace("pass store=PATH to fit out of core", "fit out of core with --store DIR")
    m = m.replace("needs store=PATH", "needs --store DIR")
    m = m.replace("give a store (out of core)", "give --store DIR (out of core)")
    m = re.sub(r"\bmemory_limit\b", memory, m)
    m = re.sub(r"\bdisk_free >= ", "--disk >= " if command == "plan" else "free space >= ", m)
    if command == "plan":
        m = re.sub(r"\bdtype float32\b", "--dtype float32", m)
    return m


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same clean stop runs."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM stops a command as Ctrl-C does (only possible in the main thread)."""
    def handler(signum, frame):
        raise _Terminated()

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


#: Warnings of the running command not yet printed (see :func:`_one_line_warnings`).
_PENDING_WARNINGS: list = []


@contextlib.contextmanager
def _one_line_warnings():
    """A warning is one line ``fsll-ooc: warning: ...`` on stderr (no source line), each once.

    They wait until the command succeeds, or until :func:`_flush_warnings` (before a long
    fit): a command that fails says one line, its error, with the pending warnings as notes
    (a file that reads as one column explains the error that follows)."""
    seen = set()
    _PENDING_WARNINGS.clear()

    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        if text not in seen:
            seen.add(text)
            _PENDING_WARNINGS.append(text)

    with warnings.catch_warnings():
        warnings.simplefilter("always", UserWarning)
        warnings.showwarning = show
        yield
        _flush_warnings()


def _flush_warnings() -> None:
    for text in _PENDING_WARNINGS:
        print(f"{PROG}: warning: {text}", file=sys.stderr, flush=True)
    _PENDING_WARNINGS.clear()


def _with_notes(message: str) -> str:
    """An error line with the warnings not yet printed, as notes."""
    notes = "".join(f" (note: {w})" for w in _PENDING_WARNINGS)
    _PENDING_WARNINGS.clear()
    return message + notes


def _silence_stderr() -> None:
    if sys.stderr is not sys.__stderr__:  # called in process (tests, notebooks): leave their stderr alone
        return
    with contextlib.suppress(Exception):
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        sys.stderr = open(os.devnull, "w")


def _os_message(exc: OSError) -> str:
    if exc.filename is not None and exc.strerror:
        return f"{exc.strerror}: '{exc.filename}'"
    return str(exc)


if __name__ == "__main__":
    raise SystemExit(main())
