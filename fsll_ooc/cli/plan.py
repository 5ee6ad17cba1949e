"""``fsll-ooc plan``: the chunk plan of a fit (memory, disk, passes) before anything is allocated.
"""
from __future__ import annotations

import math
import os

from ..kernels import threadpool
from ..machine import free_disk, total_memory
from . import common


def register(sub) -> None:
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
    p.add_argument("--workers", type=common.positive_int, default=None, metavar="N",
                   help="tasks running at once: threads or dask workers (default: this machine's "
                        "threads, at least 2, as a fit out of core runs them)")
    p.add_argument("--out-of-core", action="store_true",
                   help="plan an out-of-core fit even if the tables fit in memory")
    p.add_argument("--disk-speed", metavar="SIZE",
                   help="the disk's speed per second for the time estimate, e.g. 200MB (default: measured "
                        "with a 128 MiB file in the --store directory; in core the memory's speed is measured)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    common.add_read_options(p)
    p.set_defaults(func=run)


def _plan_duration(args, p):
    """The time estimate of a plan: at ``--disk-speed``, or at a speed measured here (the
    disk of ``--store`` out of core, the memory in core); None when there is nothing to measure."""
    from functools import partial

    from ..learn.batch import AUTO_MIN_CELLS
    from ..machine import disk_speed, memory_speed
    from ..planner import estimate_duration, parse_bytes

    estimate_duration = partial(estimate_duration, batched_by_default=p.layout.size >= AUTO_MIN_CELLS,
                                memory_speed=memory_speed())

    if args.disk_speed is not None and p.out_of_core:
        with common.user_input():
            speed = parse_bytes(args.disk_speed)
        return estimate_duration(p, speed, speed, "given with --disk-speed")
    if not p.out_of_core:
        speed = memory_speed()
        return estimate_duration(p, speed, speed, "memory, measured: a copy of 64 MiB; the passes alone")
    from ..storage.url_store import local_path

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


def run(args) -> int:
    from ..planner import PASSES_PER_TERM, parse_bytes, parse_cards, plan

    names = None
    with common.user_input():
        if args.cards is not None:
            cards = parse_cards(args.cards)
        else:
            data = common.read_data(args, args.data)
            names = [str(c) for c in data.columns] if hasattr(data, "columns") else None
            cards = tuple(common.encode_or_advise(data).cardinalities)
        memory = parse_bytes(args.memory) if args.memory is not None else total_memory()
        disk = parse_bytes(args.disk) if args.disk is not None else (
            common.store_free_disk(args.store) if args.store is not None else None)
        if args.workers is None:  # as fitting.workers: the pool's threads out of core
            args.workers = max(2, threadpool.num_threads())
        # a fit with --store keeps its tables there: out of core, whatever the memory
        out_of_core = True if args.out_of_core or args.store is not None else None
        p = plan(cards, dtype=args.dtype, memory_limit=memory, disk_free=disk, workers=args.workers,
                 out_of_core=out_of_core)
    advice = None
    if not p.feasible:
        def fits(ks):
            return plan(ks, dtype=args.dtype, memory_limit=memory, disk_free=disk, workers=args.workers,
                        out_of_core=out_of_core).feasible

        advice = f"! within this budget, {common.practical(cards, names, fits)} (fit and plan --data take --drop)"
    duration = _plan_duration(args, p) if p.task_bytes else None
    rows = duration.rows() if duration is not None else [
        ("time", "give --store DIR (its disk is measured) or --disk-speed 200MB for an estimate")]
    report = common.cli_words(p.report(extra=rows if p.task_bytes else (), names=names), "plan")
    if args.json:
        L = p.layout
        common.print_json({
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
                "seconds_per_100_terms": {how: duration.seconds(100, k) for how, k in PASSES_PER_TERM.items()},
                "fit_seconds_per_100_terms": duration.fit_seconds(100)}})
    else:
        print(report)
        if advice:
            print(f"  {advice}")
    return 0 if p.feasible else common.EXIT_INFEASIBLE
