"""``fsll-ooc resume``: continue an interrupted out-of-core fit from its store.
"""
from __future__ import annotations

import os
import time

from ..io import DataError
from . import common


def register(sub) -> None:
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
    p.add_argument("--memory-limit", metavar="SIZE",
                   help="memory budget such as 4GiB for this run, in place of the one the fit was started with")
    p.add_argument("--storage-options", type=common.storage_options, metavar="JSON", help=common.STORAGE_OPTIONS_HELP)
    p.add_argument("--force", action="store_true", help="replace MODEL even if fsll-ooc did not write it")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..planner import PlanError, parse_bytes

    from ..storage.url_store import local_path

    if local_path(args.store) is not None and not os.path.isdir(local_path(args.store)):
        raise DataError(f"no store directory '{args.store}'")
    if common.store_status(args.store, args.storage_options) is None:
        raise DataError(f"'{args.store}' is not an fsll-ooc store (no fit state in it)")
    if args.out is not None:
        common.check_output(args.out, "model", args.force, kind="model", store=args.store)
    with common.user_input():
        memory = parse_bytes(args.memory_limit) if args.memory_limit is not None else None
    common.RESUME_STORE = (args.store, args.out)
    client = common.connect(args.scheduler) if args.scheduler else None
    t0 = time.perf_counter()
    try:
        with common.user_input():
            model = common.model_class().resume(args.store, scheduler=client, progress=common.show_progress(args),
                                          restart=args.restart, memory_limit=memory,
                                          storage_options=args.storage_options)
    except PlanError as exc:
        raise DataError(str(exc)) from exc
    finally:
        if client is not None:
            client.close()
    seconds = time.perf_counter() - t0
    common.RESUME_STORE = None
    if args.out is not None:
        common.save(model, args.out, args.store)
    summary = {"store": args.store, "model": args.out, "n_bases": int(model.n_bases_),
               "n_iter": int(model.n_iter_), "cost": common.float_or_none(getattr(model, "cost_", None)),
               "kl_data": common.float_or_none(getattr(model, "kl_data_", None)), "seconds": seconds}
    if args.json:
        common.print_json(summary)
        return 0
    print(f"finished the fit in store {args.store}")
    print(f"  bases {summary['n_bases']}   iterations {summary['n_iter']}   cost {common.fmt_num(summary['cost'])}   "
          f"KL(pd||p) {common.fmt_num(summary['kl_data'])}   time {seconds:.2f} s")
    if args.out is not None:
        print(f"  saved to {args.out}")
    return 0
