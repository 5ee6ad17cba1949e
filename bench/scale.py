"""Out-of-core scaling: binary |X| = 2^22 .. 2^28 and a mixed-cardinality BN of ~2^30 cells.

Each case runs in a child process.  As root, the child is first moved into a fresh
memory cgroup (v1 ``memory.limit_in_bytes`` or v2 ``memory.max``) of ``--cap`` bytes,
which counts the page cache too, so the figures mean "fits a laptop with that much
memory".  Without root the script says so and measures without the cap.

Needs: disk ``3 * 8 * |X|`` bytes per case under ``--dir`` (checked first: 2^28 needs
6 GiB, the 2^30 BN 27 GiB); memory: ``--cap`` (default 4 GiB).

Usage::

    python bench/scale.py --cases 22 24 26 28 bn30 --cap 4GiB --dir /work/scratch \\
        --max-iter 40 --out docs/benchmarks_scale.md
    python bench/scale.py --cases 26 --workers 1 2 --max-iter 20     # LocalCluster speed-up
    python bench/scale.py --cases 26 --resume --dir /work/scratch    # to convergence, resumable
    python bench/scale.py --cases bn30:12 --layout 4,7 --penalty-scale 1 --epsilon auto --backend memmap

``--resume`` keeps the case's store and, when an earlier run was interrupted (killed,
session ended), continues it with ``FSLL.resume``; the wall time of every session is
recorded next to the store (``*.sessions.json``) and summed into the fit time.
``--epsilon`` defaults to the paper's 1e-4 (``auto`` is the library's default rule);
``--backend memmap`` uses raw files instead of Zarr (``--direct off on``: their band I/O
through the page cache and with ``O_DIRECT``, interleaved); ``--batch off on`` runs each case
one step per pass (the paper's search) and with several steps per pass, interleaved
(default ``auto``: the library's rule).

Disk: before each case the script measures the disk's sequential throughput under
``--dir`` with direct I/O (``O_DIRECT``, as ``dd iflag=direct``; 1 GiB written then read
in 16 MiB blocks), and reports the fit's table passes (count, bytes read plus written, and
their wall time) next to it.  A default fit (``penalty_scale="auto"``) whose tables fit in
memory first chooses its penalty scale by two sub-fits in memory on four fifths of the rows;
their passes are counted apart (``passes`` is every pass, ``fit_passes`` those of the fit
over the store's tables, which passes per term and pass MB/s in the table are about;
``fit_passes_by`` splits the latter by what the learner ran them for, ``Engine.passes_by``).

Data: a random Bayesian network (each variable has up to 3 parents among earlier
ones, conditional tables drawn from a flat Dirichlet), 10^5 training samples and
10^4 held-out samples drawn by ancestral sampling (no dense table is ever built).
Host share: the part of the fit's wall time spent outside every engine's table passes and
sweeps (``Engine.stats``; the penalty scale's sub-fits included), the learner's own work.

Quality: held-out ``mean(log p*(x) - log p(x))``, an unbiased estimate of
``KL(p* || p)``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BN30_CARDS = (2, 3, 4, 5, 6, 2, 3, 4, 5, 6, 2, 3, 4, 5, 2, 3, 3)  # 1,119,744,000 cells = 2^30.06


def case_cards(case: str) -> tuple:
    """The cardinalities of a case: ``"26"`` is 26 binary variables, ``"bn30"`` the mixed
    network, ``"bn30:12"`` its first 12 variables (the same network restricted: the generator
    draws variable by variable, so the first ones' tables and samples are the same)."""
    if case == "bn30":
        return BN30_CARDS
    if case.startswith("bn30:"):
        return BN30_CARDS[:int(case[5:])]
    return (2,) * int(case)


def random_bn(cards, n_parents, seed):
    rng = np.random.default_rng(seed)
    parents, cpts = [], []
    for i, k in enumerate(cards):
        ps = sorted(rng.choice(i, size=min(i, n_parents), replace=False).tolist()) if i else []
        shape = [cards[p] for p in ps] + [k]
        cpts.append(rng.dirichlet(np.ones(k), size=int(np.prod(shape[:-1], dtype=np.int64))).reshape(shape))
        parents.append(ps)
    return parents, cpts


def ancestral_sample(cards, parents, cpts, n, seed):
    rng = np.random.default_rng(seed)
    X = np.zeros((n, len(cards)), np.int64)
    for i, (ps, cpt) in enumerate(zip(parents, cpts)):
        probs = cpt[tuple(X[:, p] for p in ps)] if ps else np.broadcast_to(cpt, (n, cards[i]))
        cdf = np.cumsum(probs, axis=1)
        X[:, i] = np.minimum((rng.random((n, 1)) * cdf[:, -1:] > cdf).sum(axis=1), cards[i] - 1)
    return X


def true_logp(X, parents, cpts):
    out = np.zeros(len(X))
    for i, (ps, cpt) in enumerate(zip(parents, cpts)):
        out += np.log(cpt[tuple(X[:, p] for p in ps) + (X[:, i],)])
    return out


def disk_throughput(directory, size: int = 2**30, block: int = 2**24) -> tuple[float, float]:
    """Sequential (write, read) bytes per second of ``directory``'s disk with direct I/O
    (the page cache bypassed, as ``dd oflag=direct`` / ``iflag=direct``)."""
    import mmap

    path = Path(directory) / f".fsll_disk_probe_{os.getpid()}"
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    buf.write(np.random.default_rng(0).bytes(block))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
        t0 = time.perf_counter()
        for off in range(0, size, block):
            os.pwritev(fd, [buf], off)
        os.fsync(fd)
        w = size / (time.perf_counter() - t0)
        os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        t0 = time.perf_counter()
        for off in range(0, size, block):
            os.preadv(fd, [buf], off)
        r = size / (time.perf_counter() - t0)
        os.close(fd)
    finally:
        buf.close()
        path.unlink(missing_ok=True)
    return w, r


def enter_cgroup(cap: int) -> str:
    """Move this process into a new memory cgroup of ``cap`` bytes; returns a description."""
    if os.geteuid() != 0:
        return "not root: no memory cgroup, the cap is not enforced"
    name = f"fsll_bench_{os.getpid()}"
    v1 = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup")
    try:
        if v1.is_dir():
            cg = v1 / name
            cg.mkdir(exist_ok=True)
            (cg / "memory.limit_in_bytes").write_text(str(cap))
            (cg / "cgroup.procs").write_text(str(os.getpid()))
            return f"cgroup v1 {cg} memory.limit_in_bytes={cap}"
        if (v2 / "cgroup.controllers").exists():
            cg = v2 / name
            cg.mkdir(exist_ok=True)
            (cg / "memory.max").write_text(str(cap))
            (cg / "cgroup.procs").write_text(str(os.getpid()))
            return f"cgroup v2 {cg} memory.max={cap}"
    except OSError as e:
        return f"could not set up a memory cgroup ({e}); the cap is not enforced"
    return "no memory cgroup hierarchy found; the cap is not enforced"


def remove_cgroup(pid: int) -> None:
    """Remove the memory cgroup :func:`enter_cgroup` made for the ended child ``pid`` (empty now)."""
    for base in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")):
        try:
            (base / f"fsll_bench_{pid}").rmdir()
        except OSError:
            pass


def rss_peak() -> int:
    """This process's own peak RSS in bytes: ``VmHWM``, because ``ru_maxrss`` survives
    fork/exec on Linux and would report a larger parent's size."""
    try:
        return int([line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0].split()[1]) * 1024
    except (OSError, IndexError):  # no procfs
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cgroup_peak() -> int | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        parts = line.split(":")
        if "memory" in parts[1].split(",") or parts[1] == "":
            base = Path("/sys/fs/cgroup/memory" if parts[1] else "/sys/fs/cgroup") / parts[2].lstrip("/")
            for f in ("memory.max_usage_in_bytes", "memory.peak"):
                if (base / f).exists():
                    return int((base / f).read_text())
    return None


class _Heartbeat:
    """Record this session's wall time (every 30 s) next to the store, so that a fit that is
    interrupted and resumed in later sessions can report its total fit time."""

    def __init__(self, path: Path, past: list, store: Path):
        import threading

        self.path, self.past, self.store = path, list(past), store
        self.t0 = time.perf_counter()
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _write(self):
        state = self.store / "fsll_state.json"
        n_iter = None
        try:
            n_iter = json.loads(state.read_text())["state"]["n_iter"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        rec = {"started": self.started, "seconds": time.perf_counter() - self.t0, "n_iter": n_iter}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.past + [rec], indent=1))
        os.replace(tmp, self.path)

    def _loop(self):
        while not self._stop.wait(30):
            self._write()

    def stop(self):
        self._stop.set()
        self._write()


def _merged(counts) -> dict:
    out: dict = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))


def _trace(hist) -> list:
    """``[move, steps, passes after, trials]`` per iteration, a batch's steps as one entry."""
    out = []
    for h in hist[1:]:
        b = h.get("batch")
        if b is not None and out and out[-1][0] == f"batch {b}":
            out[-1][1] += 1
            out[-1][2] = h.get("passes")
            continue
        out.append([f"batch {b}" if b is not None else h["move"], 1, h.get("passes"), h.get("trials")])
    return out


def _batch_choice(args):
    """The ``batch`` learner option of a run: off, on, the library's rule, or given options."""
    if args.batch == "off":
        return False
    if args.batch_options:
        from fsll_ooc.learn.batch import BatchOptions

        fields = {k: v for k, v in json.loads(args.batch_options).items() if not k.startswith("engine.")}
        if args.batch == "on":
            return BatchOptions(**fields)
        from fsll_ooc.learn import batch as B

        return BatchOptions(**fields) if B.resolve_batch("auto", args.epsilon, math.prod(case_cards(args.case))) \
            else False
    return {"on": True, "auto": "auto"}[args.batch]


def _table_seconds(engine) -> float:
    """Wall time of an engine's passes and sweeps (``Engine.stats``; the attributes on older trees)."""
    st = getattr(engine, "stats", None)
    if st is not None:
        return st.pass_seconds + st.sweep_seconds
    return engine.pass_seconds + getattr(engine, "sweep_seconds", 0.0)


def child(args) -> None:
    """Run one case (in the child process) and print one JSON line."""
    cgroup = enter_cgroup(args.cap)
    from fsll_ooc import FSLL, fitting
    from fsll_ooc.learn import LearnOptions
    from fsll_ooc.storage import direct_io

    direct_io.DIRECT_IO = {"on": True, "off": False, "auto": "auto"}[args.direct]
    # the engines that learn (a fitted model answers queries through a reader engine of its own)
    engines = []  # (estimator, engine): the fit's own, and those of the penalty scale's sub-fits
    make = fitting.make_engine

    # "engine.NAME" keys of --batch-options: attributes set on every engine (the same fit
    # with an engine behaviour off and on, e.g. "engine.one_band_scan_in_resync")
    engine_attrs = {k[7:]: v for k, v in json.loads(args.batch_options or "{}").items() if k.startswith("engine.")}

    def recording(self, *a, **k):
        engines.append((self, make(self, *a, **k)))
        for name, value in engine_attrs.items():
            if not hasattr(engines[-1][1], name):
                raise SystemExit(f"--batch-options: the engine has no attribute {name!r}")
            setattr(engines[-1][1], name, value)
        return engines[-1][1]

    fitting.make_engine = recording

    cards = case_cards(args.case)
    parents, cpts = random_bn(cards, 3, seed=0)
    X = ancestral_sample(cards, parents, cpts, args.n, seed=1)
    H = ancestral_sample(cards, parents, cpts, 10_000, seed=2)
    suffix = "zarr" if args.backend == "zarr" else "mm"
    store = Path(args.dir) / f"scale_{args.case}_{args.workers}_{args.batch}_{args.direct}.{suffix}"
    client = cluster = None
    if args.workers:
        from distributed import Client, LocalCluster

        # each worker gets an equal share of the cap; the planner sees the cluster's thread count
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                               memory_limit=args.cap // (args.workers + 1), dashboard_address=None)
        client = Client(cluster)
    sessions = store.with_name(store.name + ".sessions.json")
    resuming = args.resume and (store / "fsll_state.json").exists()
    past = json.loads(sessions.read_text()) if resuming and sessions.exists() else []
    beat = _Heartbeat(sessions, past, store)
    t0 = time.perf_counter()
    if resuming:
        m = FSLL.resume(store, scheduler=client, progress=args.progress)
    else:
        m = FSLL(store=store, backend=args.backend, memory_limit=args.cap, max_iter=args.max_iter,
                 epsilon=args.epsilon, progress=args.progress, scheduler=client, penalty=args.penalty,
                 penalty_scale=args.penalty_scale, layout=args.layout,
                 learn_options=LearnOptions(epsilon=args.epsilon,
                                            batch=_batch_choice(args)))
        m.fit(X)
    total = time.perf_counter() - t0
    beat.stop()
    if client is not None:
        client.close()
        cluster.close()
    hist = m.history_
    iter_times = np.diff([h["time"] for h in hist[1:]]) if len(hist) > 2 else np.array([np.nan])
    logp = m.log_prob(H)
    kl_heldout = float(np.mean(true_logp(H, parents, cpts) - logp))
    appends = sum(1 for h in hist if h["move"] == "append") + sum(int(h.get("value", 0)) for h in hist
                                                                   if h["move"] == "joint-append")
    out = {
        # the search's course: one entry per iteration outside a batch, one per batch (its steps
        # summed), with the pass count after it
        "trace": _trace(hist),
        "case": args.case + (f" ({args.workers} workers)" if args.workers else ""), "cells": math.prod(cards),
        "cards": list(cards), "n_samples": args.n, "backend": args.backend, "epsilon": args.epsilon,
        "layout": [m.plan_.layout.a, m.plan_.layout.c], "chunk": list(m.plan_.layout.chunk_shape),
        "plan_peak": m.plan_.peak_memory, "disk": m.plan_.disk_bytes,
        "bytes_per_iter": m.plan_.bytes_per_iteration,
        # wall time of every session of this fit (a fit may be resumed across sessions)
        "fit_seconds": total + sum(p["seconds"] for p in past), "sessions": len(past) + 1,
        "setup_seconds": hist[1]["time"] if len(hist) > 1 else total,
        "sec_per_iter_median": float(np.median(iter_times)) if iter_times.size else float("nan"),
        "n_iter": m.n_iter_, "converged": m.converged_,
        "n_bases": m.n_bases_, "kl_data": m.kl_data_, "kl_heldout": kl_heldout,
        "heldout_loglik": float(np.mean(logp)), "batch": args.batch + (f" {args.batch_options}" if
                                                                       args.batch_options else ""),
        "appends": appends,
        "direct_io": args.direct if args.backend == "memmap" else None,
        "passes": sum(e.passes for _, e in engines), "bytes_moved": sum(e.bytes_moved for _, e in engines),
        "pass_seconds": sum(e.pass_seconds for _, e in engines),
        # the passes of the fit itself over the store's tables, and of its bytes and seconds; the rest
        # are the penalty scale's sub-fits (in memory, on four fifths of the rows)
        "fit_passes": sum(e.passes for o, e in engines if o is m),
        "fit_bytes_moved": sum(e.bytes_moved for o, e in engines if o is m),
        "fit_pass_seconds": sum(e.pass_seconds for o, e in engines if o is m),
        # the fit's passes by what the learner ran them for (Engine.passes_by): "batch" one-pass
        # batches, "batch-span" re-derivations of batches across both kinds of band, "batch-refine"
        # the re-derivation ending a corrective phase inside a batch, "refine" and "joint" Newton
        # trials (with sweeps: the re-derivation ending the phase), "joint-top" the joint
        # selections' top-k passes, "step" single steps, "periodic" periodic re-derivations,
        # "other" setup and scans
        "fit_passes_by": _merged([e.passes_by(1) for o, e in engines if o is m and hasattr(e, "passes_by")]),
        # compute sweeps (Engine.sweep: a corrective phase's trials, no table read or written)
        "fit_sweeps": sum(getattr(e, "sweeps", 0) for o, e in engines if o is m),
        "fit_sweep_seconds": sum(getattr(e, "sweep_seconds", 0.0) for o, e in engines if o is m),
        # the learner's own time (host): the wall time outside every engine's passes and sweeps
        # (Engine.stats), the scale choice's sub-fits included
        "host_seconds": total - sum(_table_seconds(e) for _, e in engines),
        "host_share": (total - sum(_table_seconds(e) for _, e in engines)) / total,
        "penalty_scale": getattr(m, "penalty_scale_", None),
        "disk_write": args.disk[0], "disk_read": args.disk[1],
        "rss_peak": rss_peak(), "cgroup_peak": cgroup_peak(),
        "cgroup": cgroup,
    }
    print("RESULT " + json.dumps(out), flush=True)
    if not args.keep:
        shutil.rmtree(store, ignore_errors=True)


def main(argv=None):
    from fsll_ooc.planner import format_bytes, parse_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["22", "24", "26", "28", "bn30"])
    ap.add_argument("--cap", default="4GiB")
    ap.add_argument("--dir", default="scratch")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--max-iter", type=int, default=None)
    ap.add_argument("--epsilon", type=lambda v: v if v == "auto" else float(v), default=1e-4,
                    help="stopping threshold: a number (default: the paper's 1e-4) or 'auto'")
    ap.add_argument("--batch", nargs="+", choices=("off", "on", "auto"), default=["auto"],
                    help="one step per pass (off), several steps per pass (on), the library's rule (auto, "
                         "the default); each case runs every choice")
    ap.add_argument("--direct", nargs="+", choices=("off", "on", "auto"), default=["auto"],
                    help="memmap backend: band I/O with O_DIRECT (on), through the page cache (off), or the "
                         "library's rule (auto, the default); each case runs every choice")
    ap.add_argument("--batch-options", nargs="+", default=None,
                    help="JSON fields of BatchOptions for the batched runs ('auto' and 'on'), e.g. "
                         "'{\"max_cells\": 16384}'; each case runs every one given, interleaved")
    ap.add_argument("--penalty-scale", type=lambda v: v if v == "auto" else float(v), default=None,
                    help="the penalty scale (default: the library's; 1.0 fits out of core from the start, "
                         "without the in-memory sub-fits that choose the scale)")
    ap.add_argument("--layout", type=lambda v: tuple(int(x) for x in v.split(",")), default=None,
                    help="explicit chunk layout cut points a,c (default: the planner's)")
    ap.add_argument("--penalty", choices=("paper", "family"), default=None,
                    help="the code of the terms (default: the library's, 'family' with epsilon 'auto')")
    ap.add_argument("--disk", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--backend", choices=("zarr", "memmap"), default="zarr")
    ap.add_argument("--resume", action="store_true",
                    help="continue the case's store if an earlier (interrupted) run left one; implies --keep")
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--workers", type=int, nargs="*", default=[0],
                    help="dask.distributed LocalCluster sizes to run each case with (0: default threads)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.cap = parse_bytes(args.cap)
    if args.child:
        args.case = args.child
        args.workers = args.workers[0]
        args.batch = args.batch[0]
        args.batch_options = args.batch_options[0] if args.batch_options else None
        args.direct = args.direct[0]
        args.disk = [float(x) for x in args.disk.split(",")] if args.disk else [math.nan, math.nan]
        return child(args)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    rows = []
    runs = [(c, w, b, io, bo) for c in args.cases for w in args.workers for b in args.batch for io in args.direct
            for bo in (args.batch_options or [None])]
    for case, workers, batch, direct, batch_options in runs:
        cells = math.prod(case_cards(case))
        need = 3 * 8 * cells
        free = shutil.disk_usage(args.dir).free
        if need * 1.05 > free:
            print(f"skip {case}: needs {format_bytes(need)} of disk, {format_bytes(free)} free in {args.dir}")
            continue
        dw, dr = disk_throughput(args.dir)
        print(f"case {case} (batch {batch}, direct I/O {direct}): {cells:,} cells, disk {format_bytes(need)}, memory cap "
              f"{format_bytes(args.cap)}; disk direct I/O write {dw / 1e6:.0f} MB/s, read {dr / 1e6:.0f} MB/s; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        cmd = [sys.executable, __file__, "--child", case, "--cap", str(args.cap), "--dir", args.dir, "--n", str(args.n),
               "--workers", str(workers), "--backend", args.backend, "--epsilon", str(args.epsilon),
               "--batch", batch, "--direct", direct, "--disk", f"{dw},{dr}"]
        if batch_options is not None:
            cmd += ["--batch-options", batch_options]
        if args.penalty:
            cmd += ["--penalty", args.penalty]
        if args.penalty_scale is not None:
            cmd += ["--penalty-scale", str(args.penalty_scale)]
        if args.layout is not None:
            cmd += ["--layout", ",".join(map(str, args.layout))]
        if args.resume:
            cmd += ["--resume", "--keep"]
        if args.max_iter is not None:
            cmd += ["--max-iter", str(args.max_iter)]
        if args.keep:
            cmd.append("--keep")
        if args.progress:
            cmd.append("--progress")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        stdout, _ = proc.communicate()
        remove_cgroup(proc.pid)
        res = [json.loads(l[7:]) for l in stdout.splitlines() if l.startswith("RESULT ")]
        if proc.returncode != 0 or not res:
            print(f"case {case} failed with exit code {proc.returncode}")
            rows.append({"case": case, "failed": proc.returncode})
            continue
        rows.append(res[0])
        print(json.dumps(res[0], indent=1), flush=True)
    text = table(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def table(rows) -> str:
    from fsll_ooc.planner import format_bytes

    head = ("| case | batch | direct I/O | cells | iterations | terms | passes (fit + scale choice) | passes/term (fit) | "
            "GB moved (fit) | fit s | pass MB/s (fit) | disk MB/s (read/write) | peak RSS | cgroup peak | held-out log-lik | "
            "held-out KL(p*‖p) est. | fit passes by purpose | appends | passes/append | sweeps (s) | host share |")
    out = [head, "|" + "---|" * head.count("|")[:-1] if False else "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "failed" in r:
            out.append(f"| {r['case']} | failed (exit {r['failed']}) |")
            continue
        conv = "" if r["converged"] else " (capped)"
        cg = format_bytes(r["cgroup_peak"]) if r.get("cgroup_peak") else "n/a"
        fp = r.get("fit_passes", r["passes"])
        mbs = r.get("fit_bytes_moved", r["bytes_moved"]) / max(r.get("fit_pass_seconds", r["pass_seconds"]), 1e-9) / 1e6
        io = r.get("direct_io") or "n/a"
        out.append(f"| {r['case']} | {r['batch']} | {io} | 2^{math.log2(r['cells']):.2f} | {r['n_iter']}{conv} | "
                   f"{r['n_bases']} | {fp} + {r['passes'] - fp} | {fp / max(r['n_bases'], 1):.3f} | "
                   f"{r.get('fit_bytes_moved', r['bytes_moved']) / 1e9:.1f} | {r['fit_seconds']:.1f} | {mbs:.0f} | "
                   f"{r['disk_read'] / 1e6:.0f}/{r['disk_write'] / 1e6:.0f} | {format_bytes(r['rss_peak'])} | {cg} | "
                   f"{r['heldout_loglik']:.4f} | {r['kl_heldout']:.4f} | "
                   f"{', '.join(f'{k} {v}' for k, v in r.get('fit_passes_by', {}).items())} | "
                   f"{r.get('appends', '')} | {fp / max(r.get('appends', 0), 1):.3f} | "
                   f"{r.get('fit_sweeps', 0)} ({r.get('fit_sweep_seconds', 0.0):.1f}) | "
                   f"{_pct(r.get('host_share'))} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
