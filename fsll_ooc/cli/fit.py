"""``fsll-ooc fit``: read a data file, fit a model (in core, or out of core with ``--store``), save it.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

from ..machine import free_disk, total_memory
from ..validation import check_store_path
from ..io import DataError
from . import common


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
        from ..planner import format_bytes

        raise DataError(f"cannot write the {what} to '{path}': its file system has {format_bytes(free)} free, and a "
                        f"model of {n_vars} variables may take up to {format_bytes(need)}; free some space or "
                        "write it elsewhere (checked before fitting, so that a fit never ends unsaved)")


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


def register(sub) -> None:
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
    p.add_argument("--average", type=common.positive_int, default=None, metavar="K",
                   help="fit K models, each on its own random four fifths of the rows, and save their "
                        "average (FSLLAverage: a lower held-out loss for about K times the time)")
    p.add_argument("--epsilon", type=common.epsilon, default="auto",
                   help="stopping threshold on the cost improvement: 'auto' (default: 0.1/N with "
                        "corrective steps, see help(fsll_ooc.FSLL)) or a number; 1e-4 is the paper's setting")
    p.add_argument("--max-iter", type=common.positive_int, default=None, metavar="N",
                   help="stop after N iterations (default: no limit)")
    p.add_argument("--store", metavar="DIR",
                   help="fit out of core: keep the working tables in this directory (Zarr v3); "
                        "check the budget first with 'fsll-ooc plan'. The finished store can be "
                        "given as MODEL to info/sample/score/plot. A URL (s3://bucket/fit, gs://...) "
                        "puts the store on an object store that every --scheduler worker reaches.")
    p.add_argument("--storage-options", type=common.storage_options, metavar="JSON", help=common.STORAGE_OPTIONS_HELP)
    p.add_argument("--memory-limit", metavar="SIZE",
                   help="memory budget such as 4GiB; the planner picks a chunk layout within it "
                        "(default: in core the machine's RAM; out of core the control group's limit if "
                        "one is set, else none: the layout with the fewest chunks, whose peak "
                        "'fsll-ooc plan --out-of-core' shows)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run the chunk passes on a dask.distributed cluster, e.g. tcp://host:8786 "
                        "(every worker must see the --store directory or URL)")
    p.add_argument("--force", action="store_true",
                   help="replace MODEL even if fsll-ooc did not write it; with --store, start the fit of "
                        "an interrupted store again instead of refusing")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar (the summary is still printed)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    common.add_read_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..planner import PlanError, parse_bytes

    common.check_output(args.out, "model", args.force, kind="model", inputs=[args.data], store=args.store)
    if args.store is not None and os.path.isfile(args.store):
        raise DataError(f"--store must be a directory, but '{args.store}' is a file")
    if args.store is not None:
        check_store_path(args.store)
    if args.store is not None and not args.force:
        _refuse_interrupted_store(args.store, args.out, args.storage_options)
    FSLL = common.model_class()
    with common.user_input():
        memory = parse_bytes(args.memory_limit) if args.memory_limit is not None else None
        data, mask = common.read_data(args, args.data), None
        if args.missing == "em":
            from ..missing import MISSING, split_missing

            data, mask = split_missing(data)
        if args.average is not None and args.missing == "em":
            raise DataError("--average does not take --missing em (an average's members are fitted on complete "
                            "rows); fit one model with --missing em, or leave the incomplete rows out")
        ordered = common.name_list(args, "ordered", data, args.data)
        enc = common.encode_or_advise(data, args.cardinalities, args.store)
        codes = enc.codes if mask is None else np.where(mask, MISSING, enc.codes)
        del data
        _check_budget(enc.cardinalities, enc.names, memory, args.store)
        _check_room(args.out, "model", enc.n_vars)
    client = common.connect(args.scheduler) if args.scheduler else None
    common.RESUME_STORE = (args.store, args.out) if args.store is not None else None
    try:
        with common.user_input():
            params = dict(cardinalities=enc.cardinalities, epsilon=args.epsilon, max_iter=args.max_iter,
                          store=args.store, memory_limit=memory, scheduler=client,
                          progress=common.show_progress(args), storage_options=args.storage_options)
            if args.average is not None:
                from ..average import FSLLAverage

                model = FSLLAverage(n_members=args.average, **params)
            else:
                model = FSLL(missing=args.missing, **params)
        common.flush_warnings()  # what the reading found, before a fit that may take long
        t0 = time.perf_counter()
        try:
            with common.user_input():  # fit validates the codes (e.g. the size of the joint table)
                model.fit(codes, feature_names=enc.names, categories=enc.categories,
                          ordered=sorted(set(ordered) | {enc.names[j] for j in enc.ordered}))
        except PlanError as exc:  # the budget does not fit the problem: the user's input
            raise DataError(str(exc)) from exc
        seconds = time.perf_counter() - t0
    finally:
        if client is not None:
            client.close()
    common.RESUME_STORE = None
    common.save(model, args.out, args.store)
    summary = {
        "data": args.data,
        "model": args.out,
        "n_samples": enc.n_samples,
        "n_vars": enc.n_vars,
        "names": enc.names,
        "cardinalities": list(enc.cardinalities),
        "cells": math.prod(enc.cardinalities),
        "seconds": seconds,
        "store": args.store,
    }
    members = getattr(model, "members_", None)
    if members:
        summary["average_of"] = len(members)
        summary["members"] = [{"n_bases": int(m.n_bases_), "n_iter": int(m.n_iter_), "cost": float(m.cost_),
                               "kl_data": float(m.kl_data_)} for m in members]
    else:
        summary.update(n_bases=int(model.n_bases_), n_iter=int(model.n_iter_), cost=float(model.cost_),
                       kl_data=float(model.kl_data_))
    if args.json:
        common.print_json(summary)
        return 0
    ks = ", ".join(f"{nm}:{k}" for nm, k in zip(enc.names, enc.cardinalities))
    print(f"fitted {args.data}: {enc.n_samples} samples, {enc.n_vars} variables "
          f"({ks}; {summary['cells']:,} cells)")
    if members:
        print(f"  average of {len(members)} models, each fitted on a random four fifths of the rows; "
              f"time {seconds:.2f} s")
        for k, mm in enumerate(summary["members"]):
            print(f"  member {k}: bases {mm['n_bases']}   iterations {mm['n_iter']}   "
                  f"cost {common.fmt_num(mm['cost'])}")
    else:
        print(f"  bases {summary['n_bases']}   iterations {summary['n_iter']}   "
              f"cost {common.fmt_num(summary['cost'])}   KL(pd||p) {common.fmt_num(summary['kl_data'])}   "
              f"time {seconds:.2f} s")
    print(f"  saved to {args.out}" + (f" (tables in store {args.store})" if args.store else ""))
    return 0


def _check_budget(cards, names, memory: int | None, store: str | None) -> None:
    """Refusals before the fit, in the command line's words: a memory limit below what the
    process itself needs, or a joint table too large for this machine (which size would fit)."""
    from ..planner import BASE_OVERHEAD, TABLES, format_bytes

    if memory is not None and memory <= BASE_OVERHEAD:
        raise DataError(f"--memory-limit {format_bytes(memory)} is below the {format_bytes(BASE_OVERHEAD)} reserve the "
                        f"process keeps for itself (Python, numpy, the compiled kernels) before any table; give "
                        f"at least 1GiB (e.g. --memory-limit 2GiB)")
    cells = math.prod(cards)
    machine = total_memory()
    if store is None and machine is not None and not common.fits_in_memory(machine)(cards):
        raise DataError(f"{len(cards)} variables make a joint table of {cells:,} cells, whose tables need "
                        f"{format_bytes((TABLES + 1) * 8 * cells)}, more than this machine's "
                        f"{format_bytes(machine)} of memory; in memory, {common.practical(cards, names, common.fits_in_memory(machine))}; "
                        f"or fit out of core with --store DIR (check the disk it needs with "
                        f"'{common.PROG} plan --data FILE')")


def _refuse_interrupted_store(store: str, out: str, storage_options: dict | None = None) -> None:
    stored = common.store_status(store, storage_options)
    if stored is None or stored.status == "complete":
        return
    it = stored.state.get("n_iter") if isinstance(stored.state, dict) else None
    at = f" (stopped after iteration {it})" if isinstance(it, int) else ""
    raise DataError(f"store '{store}' holds an interrupted fit{at}; continue it with: {common.PROG} resume {store} "
                    f"-o {out} (or pass --force to delete it and fit again)")
