"""Disk throughput of a fit's update passes, against the disk's own direct-I/O rate in the same run.

A fit's passes differ: the setup writes tables (targets, initial duals), an update pass
reads the duals and the targets and writes the duals back (three tables' worth of
bytes).  This script times the update passes alone (one step per pass, the paper's
search, ``epsilon=1e-4``), so that their rate is not lifted by the setup's write-only
passes, and measures the disk under ``--dir`` with direct I/O (``O_DIRECT``, in 16 MiB
blocks, as ``dd``) in the same child process and the same memory cgroup: 1 GiB before
and after the fit, and ``--probe-mib`` after every round of the variants below (this
shared disk's rate swings by a factor of two within minutes).  The disk's rate for an
update pass is the harmonic mean of its read and write rates with reads weighted 2:1
(two tables read, one written): ``3 / (2 / read + 1 / write)``; the report compares
each variant with the median of the probes and gives the range.

Variants (``--variants``) of the band I/O are switched pass by pass within one fit
(``A B A B ...``), so a swing of the shared machine's speed hits every variant alike;
they move the same bytes and give the same model:

* ``serial``: a band task reads its duals, then its targets, updates, then writes, each
  transfer through the per-thread bounce buffer, then checksummed (the code before);
* ``overlap``: direct transfers straight into and out of page-aligned band arrays on a
  transfer thread, the checksums computed meanwhile
  (:data:`fsll_ooc.storage.memmap.OVERLAP`), the targets read after the duals;
* ``ahead``: the library's default: ``overlap``, and the targets (and a two-pass update's
  partner band) read on a background thread while the duals are read
  (:data:`fsll_ooc.engine.tasks.READ_AHEAD`);
* ``via-zarr`` (``--backend zarr``): ``ahead``, but the zarr tables' band chunks read and
  written through zarr and the page cache (the code before); the other variants move a
  zarr table's band chunks with the backend's own chunk-file I/O
  (:data:`fsll_ooc.storage.zarr_tables.OWN_IO`, direct I/O as for memmap);
* ``lane1`` (``--backend zarr``): ``ahead`` with one transfer thread per band
  (:data:`fsll_ooc.storage.zarr_tables.LANES` = 1: one chunk file in flight) instead of two.

An update is one pass (``task_update_scan``), or two (``task_partner`` then
``task_update_scan`` reading ``scratch``) when the step's variables span both kinds of
band; both passes of an update run under the same variant and are counted together.

Runs the case in a child process under a memory cgroup of ``--cap`` bytes (as
``bench/scale.py``; root only, else without the cap).  Disk: ``3 * 8 * 2^case`` bytes
under ``--dir``.  Usage::

    python bench/pass_io.py --case 28 --dir /work/big --iters 13 --variants serial overlap ahead
    python bench/pass_io.py --backend zarr --case 28 --dir /work/big --iters 13 --variants via-zarr ahead
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _scale():
    """The data generator, disk probe and cgroup helpers of ``bench/scale.py``."""
    spec = importlib.util.spec_from_file_location("_bench_scale", Path(__file__).with_name("scale.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def set_variant(name: str) -> None:
    """Switch the band I/O of this process to variant ``name`` (see the module docstring)."""
    from fsll_ooc.engine import tasks
    from fsll_ooc.storage import memmap, zarr_tables

    memmap.OVERLAP = name in ("overlap", "ahead", "via-zarr", "lane1")
    tasks.READ_AHEAD = name in ("ahead", "via-zarr", "lane1")
    zarr_tables.OWN_IO = name != "via-zarr"
    zarr_tables.LANES = 1 if name == "lane1" else 2


def disk_mix(read: float, write: float) -> float:
    """The disk's rate for an update pass's mix: two table reads for one write."""
    return 3.0 / (2.0 / read + 1.0 / write)


def child(args) -> None:
    sc = _scale()
    cgroup = sc.enter_cgroup(args.cap)
    from fsll_ooc import FSLL
    from fsll_ooc.engine import engine as engine_mod
    from fsll_ooc.engine.tasks import task_partner, task_update_scan
    from fsll_ooc.learn import LearnOptions
    from fsll_ooc.storage import direct_io, memmap

    direct_io.DIRECT_IO = True
    before = sc.disk_throughput(args.dir)
    probes = []  # (write, read) of the disk between rounds of updates
    passes = []  # (kind of pass, variant, bytes, seconds)
    run = engine_mod.Engine._run
    counter = {"update": 0, "after_partner": False}

    def timed(self, kind, fn, argfn, reduce=True):
        variant = ""
        if fn is task_partner or fn is task_update_scan:
            if counter["after_partner"]:  # the second pass of a two-pass update: the same variant
                counter["update"] -= 1
            variant = args.variants[counter["update"] % len(args.variants)]
            counter["update"] += 1
            counter["after_partner"] = fn is task_partner
            set_variant(variant)
        b0, s0 = self.bytes_moved, time.perf_counter()
        try:
            return run(self, kind, fn, argfn, reduce)
        finally:
            passes.append((fn.__name__, variant, self.bytes_moved - b0, time.perf_counter() - s0))
            set_variant("ahead")
            if fn is task_update_scan and counter["update"] % len(args.variants) == 0:
                probes.append(sc.disk_throughput(args.dir, args.probe_mib * 2**20))  # after each round

    engine_mod.Engine._run = timed
    spent = {}  # with --profile: seconds inside band reads, writes, checksums and kernels, summed over threads
    if args.profile:
        from fsll_ooc import kernels, storage

        def clock(mod, name):
            f = getattr(mod, name)

            def g(*a, **k):
                s = time.perf_counter()
                try:
                    return f(*a, **k)
                finally:
                    spent[name] = spent.get(name, 0.0) + time.perf_counter() - s
            setattr(mod, name, g)
        for name in ("read", "write"):
            clock(storage, name)
        from fsll_ooc.storage import zarr_tables

        clock(memmap, "crc32c")  # the checksums of band transfers (on the tasks' threads)
        clock(zarr_tables, "crc32c")
        for name in ("update_scan_xor", "update_scan_perm", "update_scan_explicit"):
            clock(kernels, name)
    cards = (2,) * int(args.case)
    parents, cpts = sc.random_bn(cards, 3, seed=0)
    X = sc.ancestral_sample(cards, parents, cpts, 100_000, seed=1)
    store = Path(args.dir) / f"pass_io_{args.case}.{args.backend}"
    t0 = time.perf_counter()
    m = FSLL(store=store, backend=args.backend, memory_limit=args.cap, max_iter=args.iters, epsilon=1e-4,
             penalty_scale=1.0, learn_options=LearnOptions(epsilon=1e-4, batch=False))
    m.fit(X)
    fit_s = time.perf_counter() - t0
    after = sc.disk_throughput(args.dir)
    shutil.rmtree(store, ignore_errors=True)
    out = {"case": args.case, "backend": args.backend, "layout": [m.plan_.layout.a, m.plan_.layout.c],
           "fit_seconds": fit_s,
           "disk_before": before, "disk_after": after, "disk_rounds": probes, "passes": passes, "cgroup": cgroup,
           "rss_peak": sc.rss_peak(), "cgroup_peak": sc.cgroup_peak(), "n_iter": m.n_iter_, "spent": spent}
    print("RESULT " + json.dumps(out), flush=True)


def report(res: dict) -> str:
    (w0, r0), (w1, r1) = res["disk_before"], res["disk_after"]
    probes = [res["disk_before"]] + res.get("disk_rounds", []) + [res["disk_after"]]
    mixes = sorted(disk_mix(r_, w_) for w_, r_ in probes)
    mix = float(np.median(mixes))
    lines = [f"case 2^{res['case']} ({res.get('backend', 'memmap')}), layout a={res['layout'][0]} "
             f"c={res['layout'][1]}, {res['n_iter']} iterations, "
             f"fit {res['fit_seconds']:.1f} s; peak RSS {res['rss_peak'] / 2**30:.2f} GiB, cgroup peak "
             f"{(res['cgroup_peak'] or 0) / 2**30:.2f} GiB ({res['cgroup']})",
             f"disk direct I/O (before / after the fit): read {r0 / 1e6:.0f} / {r1 / 1e6:.0f} MB/s, write "
             f"{w0 / 1e6:.0f} / {w1 / 1e6:.0f} MB/s; the update-pass mix (reads 2:1) of {len(probes)} probes "
             f"(before, after every round of variants, after): median {mix / 1e6:.0f} MB/s, range "
             f"{mixes[0] / 1e6:.0f}-{mixes[-1] / 1e6:.0f}; " + ", ".join(
                 f"{r_ / 1e6:.0f}/{w_ / 1e6:.0f}" for w_, r_ in probes) + " (read/write MB/s)",
             "| variant | update passes | GB | s | MB/s | % of disk mix (median; range) | s per pass (each) |",
             "|---|---|---|---|---|---|---|"]
    for v in dict.fromkeys(p[1] for p in res["passes"] if p[1]):
        ps = [p for p in res["passes"] if p[1] == v]
        if len(ps) > 1 and ps[0][0] == "task_update_scan":
            ps = ps[1:]  # the first update compiles the kernels
        b, s = sum(p[2] for p in ps), sum(p[3] for p in ps)
        lines.append(f"| {v} | {len(ps)} | {b / 1e9:.1f} | {s:.1f} | {b / s / 1e6:.0f} | {100 * b / s / mix:.0f} % "
                     f"({100 * b / s / mixes[-1]:.0f}-{100 * b / s / mixes[0]:.0f} %) | "
                     + ", ".join(f"{p[3]:.2f}{'p' if p[0] == 'task_partner' else ''}" for p in ps) + " |")
    other = [p for p in res["passes"] if not p[1]]
    b, s = sum(p[2] for p in other), sum(p[3] for p in other)
    lines.append(f"other passes (setup): {len(other)}, {b / 1e9:.1f} GB in {s:.1f} s")
    if res.get("spent"):
        lines.append("seconds inside (all passes, summed over threads): " +
                     ", ".join(f"{k} {v:.1f}" for k, v in res["spent"].items()))
    return "\n".join(lines)


def main(argv=None):
    from fsll_ooc.planner import parse_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="28", help="log2 of the number of cells (binary variables)")
    ap.add_argument("--cap", default="4GiB")
    ap.add_argument("--backend", choices=("memmap", "zarr"), default="memmap",
                    help="zarr: compare --variants via-zarr ahead (through zarr, the backend's own chunk I/O)")
    ap.add_argument("--dir", default="scratch")
    ap.add_argument("--iters", type=int, default=8, help="iterations (update passes) of the fit")
    ap.add_argument("--variants", nargs="+", default=["serial", "overlap", "ahead"],
                    choices=("serial", "overlap", "ahead", "via-zarr", "lane1"))
    ap.add_argument("--probe-mib", type=int, default=512, help="MiB written and read by each disk probe between rounds")
    ap.add_argument("--profile", action="store_true",
                    help="sum the seconds of band reads, writes, checksums and kernels")
    ap.add_argument("--json", default=None, help="also write the raw result here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.cap = parse_bytes(args.cap)
    if args.child:
        return child(args)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    need = 3 * 8 * 2 ** int(args.case)
    if need * 1.05 > shutil.disk_usage(args.dir).free:
        sys.exit(f"needs {need / 2**30:.1f} GiB free in {args.dir}")
    print(f"load {os.getloadavg()}", flush=True)
    cmd = [sys.executable, __file__, "--child", "--case", args.case, "--cap", str(args.cap), "--dir", args.dir,
           "--backend", args.backend, "--probe-mib", str(args.probe_mib),
           "--iters", str(args.iters), "--variants", *args.variants] + (["--profile"] if args.profile else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    stdout, _ = proc.communicate()
    for base in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")):
        try:
            (base / f"fsll_bench_{proc.pid}").rmdir()
        except OSError:
            pass
    res = [json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not res:
        sys.exit(f"the child failed (exit {proc.returncode})")
    print(report(res[0]))
    print(f"load {os.getloadavg()}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res[0], indent=1))


if __name__ == "__main__":
    main()
