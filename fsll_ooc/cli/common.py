"""The command line's shared layer: the parser and argument types, reading data and models,
the checks on output files and stores, JSON output and the errors every command reports.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
from typing import Sequence

import numpy as np

from ..machine import free_disk, total_memory
from ..validation import read_only_fs
from ..io import DataError, encode, read_table

PROG = "fsll-ooc"


EXIT_INFEASIBLE = 3


#: ``(store, model path)`` of the out-of-core fit running now: an interrupted one says how to resume.
RESUME_STORE: tuple | None = None


class UsageError(Exception):
    """Bad command line; reported as one line, exit code 2."""


@contextlib.contextmanager
def user_input():
    """Inside this block a ``ValueError`` is the user's fault (exit 2), not a bug."""
    try:
        yield
    except DataError:
        raise
    except ValueError as exc:
        raise DataError(str(exc)) from exc


def show_progress(args) -> bool:
    if getattr(args, "quiet", False):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def model_class():
    """The estimator class (imported lazily: ``--help`` stays fast)."""
    from ..estimator import FSLL

    return FSLL


def json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    return str(o)


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=json_default, allow_nan=True))


def float_or_none(x) -> float | None:
    try:
        return None if x is None else float(x)
    except (TypeError, ValueError):
        return None


def load_model(path: str, averages: bool = False):
    """A model file, or the store directory of a completed out-of-core fit; with
    ``averages``, also an average's file (an :class:`~fsll_ooc.FSLLAverage`)."""
    if not os.path.lexists(path):
        raise FileNotFoundError(f"no such model file: '{path}'")
    if os.path.isdir(path):
        from ..storage.fit_store import STATE_FILE, FitStore

        store = FitStore(path)
        if not store.exists():
            raise DataError(f"'{path}' is a directory but not an fsll-ooc store (no {STATE_FILE})")
        with user_input():
            status = store.read().status
            if status != "complete":
                raise DataError(f"the fit in store '{path}' is not complete (status {status!r}); "
                                f"finish it with: {PROG} resume {path}")
            return model_class().resume(path, progress=False)
    from .. import model_file

    with user_input():
        if model_file.is_average(path):
            if not averages:
                raise DataError(f"'{path}' holds an average of several models (FSLLAverage); this command "
                                f"needs one model's file (info, sample and score take an average)")
            from ..average import FSLLAverage

            return FSLLAverage.load(path)
        return model_class().load(path)


def check_writable(path: str, what: str, store: str | None = None) -> None:
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
    from ..storage.fit_store import STATE_FILE

    up, stores = parent, {os.path.realpath(store)} if store is not None else set()
    while True:
        if os.path.realpath(up) in stores or os.path.exists(os.path.join(up, STATE_FILE)):
            raise DataError(f"cannot write the {what} to '{path}': it is inside the store '{up}', whose files "
                            "only a fit writes; write it outside the store")
        if os.path.dirname(up) == up:
            break
        up = os.path.dirname(up)


#: How a file this command line wrote starts: a model file (its format header) and the
#: PNGs of ``plot`` (a text chunk naming fsll-ooc).  Such files may be replaced without --force.
MODEL_HEAD = re.compile(rb'^\s*\{\s*"format"\s*:\s*"fsll-ooc-model"')


PNG_MARK = b"fsll-ooc"


def written_by_us(path: str, kind: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    if kind == "model":
        return bool(MODEL_HEAD.match(head))
    if kind == "png":
        return head.startswith(b"\x89PNG") and PNG_MARK in head
    return False


def check_output(path: str, what: str, force: bool, kind: str | None = None, inputs: Sequence[str] = (),
                  store: str | None = None) -> None:
    """Refuse to replace a file the user has (``--force`` allows it); a file of ``kind``
    that fsll-ooc wrote may be replaced.  An input of the same command is never replaced."""
    check_writable(path, what, store)
    for src in inputs:
        if src is not None and os.path.exists(src) and os.path.exists(path) and os.path.samefile(src, path):
            raise DataError(f"'{path}' is the input data; write the {what} to another file")
    if os.path.lexists(path) and not force and not (kind is not None and written_by_us(path, kind)):
        raise DataError(f"'{path}' exists and was not written by {PROG}; choose another file, or pass "
                        f"--force to replace it")


def positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    return v


def storage_options(s: str) -> dict:
    """``--storage-options``: a JSON object of fsspec options for a store given by URL."""
    try:
        obj = json.loads(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--storage-options must be a JSON object, e.g. "
                                         f"'{{\"endpoint_url\": \"http://127.0.0.1:9000\"}}' ({e})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"--storage-options must be a JSON object, got {type(obj).__name__}")
    return obj


STORAGE_OPTIONS_HELP = ("fsspec options (a JSON object) for a --store given by URL, e.g. "
                         "'{\"endpoint_url\": \"http://minio:9000\"}'; S3 credentials can also come from the "
                         "usual AWS_* environment variables")


def epsilon(s: str):
    """``--epsilon``: ``auto`` or a positive number."""
    if s.strip().lower() == "auto":
        return "auto"
    try:
        return positive_float(s)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive number, got {s!r}") from None


def int_at_least(low: int, what: str):
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


positive_int = int_at_least(1, "a positive integer")


nonneg_int = int_at_least(0, "an integer >= 0")


def add_read_options(p, drop: bool = True) -> None:
    """The options that say how to read a text data file (and which columns to leave out)."""
    g = p.add_argument_group("reading text files (.csv, .tsv, .txt)")
    g.add_argument("--sep", metavar="CHAR", type=separator,
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
        g.add_argument("--categorical", metavar="NAME", action="append", default=[],
                       help="read this column's numbers as labels: only the values that occur become "
                            "categories (not 0..max) (repeat, or NAME1,NAME2)")
        g.add_argument("--ordered", metavar="NAME", action="append", default=[],
                       help="this column's categories are ordered (e.g. low < mid < high, sorted as read): "
                            "the model keeps their order instead of the canonical one (repeat, or NAME1,NAME2)")


def separator(s: str) -> str:
    s = {"\\t": "\t", "tab": "\t", "TAB": "\t", "space": " "}.get(s, s)
    if len(s) != 1:
        raise argparse.ArgumentTypeError(f"expected one character (or '\\t' for a tab), got {s!r}")
    return s


def read_data(args, path: str):
    """``read_table`` with the command's reading options, ``--drop`` applied."""
    data = read_table(path, sep=getattr(args, "sep", None), header=not getattr(args, "no_header", False),
                      na_values=getattr(args, "na_values", None), keep_na=getattr(args, "keep_na", False),
                      missing=getattr(args, "missing", None) == "em")
    drop = name_list(args, "drop", data, path)
    if drop:
        data = data.drop(columns=drop)
        if data.shape[1] == 0:
            raise DataError("--drop leaves no column to fit")
    categorical = name_list(args, "categorical", data, path)
    if categorical:
        import pandas as pd

        data = data.copy()
        for c in categorical:  # the values that occur, in their natural order
            col = data[c]
            data[c] = pd.Categorical(col, categories=sorted(col.dropna().unique().tolist(), key=label_key))
    return data


def label_key(v):
    """Sort key of labels: numbers by value, then everything else by its text."""
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
        return (0, float(v), "")
    return (1, 0.0, str(v))


def name_list(args, option: str, data, path: str) -> list[str]:
    """The column names given to ``--OPTION`` (repeated or comma-separated), each checked to exist."""
    given = [c.strip() for d in getattr(args, option, None) or [] for c in d.split(",") if c.strip()]
    if not given:
        return []
    if not hasattr(data, "columns"):
        raise DataError(f"--{option} needs named columns (a .csv, .tsv, .txt or .parquet file)")
    names = [str(c) for c in data.columns]
    unknown = [c for c in given if c not in names]
    if unknown:
        raise DataError(f"--{option}: no column {', '.join(repr(c) for c in unknown)} in {path} "
                        f"(columns: {', '.join(names[:12])}{', ...' if len(names) > 12 else ''})")
    return given


def connect(address: str):
    """A ``dask.distributed.Client`` for ``address``; a refused connection is the user's input."""
    from dask.distributed import Client

    try:
        return Client(address, timeout="10s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise DataError(f"cannot connect to the dask scheduler at '{address}': {exc}") from None


def save(model, out: str, store: str | None) -> None:
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
        raise DataError(f"cannot save the model to '{out}': the disk is full ({os_message(exc)}); {kept}") from None


def encode_or_advise(data, cardinalities=None, store: str | None = None):
    """``encode``; a joint table beyond every limit gets the practical size here and ``--drop``
    (in memory without a store; within the format's limit and the free disk with one)."""
    try:
        return encode(data, cardinalities=cardinalities)
    except DataError as exc:
        cards = getattr(exc, "cardinalities", None)
        if cards is None:
            raise
        from ..io import MAX_CELLS
        from ..planner import TABLES

        if store is None:
            fits, where = fits_in_memory(total_memory() or 2**30), "in memory"
        else:
            disk = store_free_disk(store)
            room = MAX_CELLS if disk is None else min(MAX_CELLS, disk // (TABLES * 8))
            fits, where = (lambda ks: math.prod(ks) <= room), ("on this disk" if disk is not None else "in the store")
        file = f"{exc.file}: " if getattr(exc, "file", None) else ""
        raise DataError(f"{file}{len(cards)} variables are too many: {getattr(exc, 'detail', exc)}; {where}, "
                        f"{practical(cards, exc.names, fits)}") from None


def practical(cards, names, fits) -> str:
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


def fits_in_memory(memory: int):
    from ..planner import BASE_OVERHEAD, TABLES

    return lambda cards: BASE_OVERHEAD + (TABLES + 1) * 8 * math.prod(cards) <= memory


def store_free_disk(store: str) -> int | None:
    """Free bytes where ``store`` goes (None for an object store given by URL: it does not say)."""
    from ..storage.url_store import local_path

    path = local_path(store)
    return free_disk(path) if path is not None else None


def store_status(store: str, storage_options: dict | None = None):
    """The verified state of the fit in ``store`` (None: no fsll-ooc fit there)."""
    from ..storage.fit_store import FitStore

    with user_input():
        fs = FitStore(store, storage_options=storage_options)
    if not fs.exists():
        return None
    with user_input():
        return fs.read()


def fmt_num(x, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def cli_words(message: str, command: str | None) -> str:
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


#: Warnings of the running command not yet printed (see :func:`_one_line_warnings`).
PENDING_WARNINGS: list = []


def flush_warnings() -> None:
    for text in PENDING_WARNINGS:
        print(f"{PROG}: warning: {text}", file=sys.stderr, flush=True)
    PENDING_WARNINGS.clear()


def os_message(exc: OSError) -> str:
    if exc.filename is not None and exc.strerror:
        return f"{exc.strerror}: '{exc.filename}'"
    return str(exc)
