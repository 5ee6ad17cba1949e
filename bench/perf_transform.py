"""Speed of fast_transform.transform_inplace against a plain copy and the numpy reference.

Prints a markdown table (and writes it with ``--out FILE``).  "Copy units" are
seconds of the transform divided by seconds of ``np.copyto(b, a)`` for a table of
the same size, both measured in the same run (minimum over repetitions, interleaved).

Cold timings run in fresh processes: "cold, compile" with an empty numba cache (the
first call compiles every kernel), "cold, cached" with numba's on-disk cache filled
(the first call only loads the kernels).

    python bench/perf_transform.py [--quick] [--out docs/benchmarks_transform.md]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CASES = [
    ("binary 2^20", (2,) * 20),
    ("binary 2^22", (2,) * 22),
    ("binary 2^24", (2,) * 24),
    ("mixed, odd cards outer", (3, 5, 6, 2, 4, 3) + (2,) * 11),
    ("mixed, odd cards inner", (2,) * 11 + (3, 5, 6, 2, 4, 3)),
]

_COLD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from fsll_ooc.kernels import transform as ft
t1 = time.perf_counter()
a = np.random.default_rng(0).random(%(shape)r)
t2 = time.perf_counter()
ft.transform_inplace(a)
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "first": t3 - t2}))
"""


def _cold(shape, cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", _COLD % {"shape": tuple(shape)}], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        return info.get("Model name", "?").strip(), info.get("CPU(s)", "?").strip(), \
            info.get("L2 cache", "?").strip(), info.get("L3 cache", "?").strip()
    except Exception:
        return platform.processor() or "?", str(os.cpu_count()), "?", "?"


def _tmin(f, reps, clock=time.perf_counter):
    best = float("inf")
    for _ in range(reps):
        t = clock()
        f()
        best = min(best, clock() - t)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, no cold runs, no 2^24 reference")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", help="also write the markdown to this file")
    args = ap.parse_args(argv)

    import numba

    from fsll_ooc import basis
    from fsll_ooc.kernels import threadpool, transform as ft, transform_plan

    ft.warmup()
    reps = 3 if args.quick else args.reps
    rows = []
    cache_dir = tempfile.mkdtemp(prefix="fsll-numba-cache-")
    for name, shape in CASES:
        a = np.random.default_rng(1).random(shape)
        b = np.empty_like(a)
        size = a.size
        # interleave copy and transform so that both see the same machine state
        tc = tp = ts = cc = cs = float("inf")
        for _ in range(reps):
            tc = min(tc, _tmin(lambda: np.copyto(b, a), 1))
            tp = min(tp, _tmin(lambda: ft.transform_inplace(a, parallel=True), 1))
            ts = min(ts, _tmin(lambda: ft.transform_inplace(a, parallel=False), 1))
            # the same on the thread's CPU clock: robust to other processes' load
            cc = min(cc, _tmin(lambda: np.copyto(b, a), 1, time.thread_time))
            cs = min(cs, _tmin(lambda: ft.transform_inplace(a, parallel=False), 1, time.thread_time))
        ref = None
        if not (args.quick and size > 1 << 22):
            ref = _tmin(lambda: basis.transform(a), 1 if size > 1 << 22 else 2)
        cold = cached = None
        if not args.quick:
            fresh = tempfile.mkdtemp(prefix="fsll-numba-cold-")
            cold = _cold(shape, fresh)["first"]          # empty cache: compiles
            cached = _cold(shape, fresh)["first"]        # same cache, new process: loads
        rows.append(dict(name=name, shape=shape, size=size, copy=tc, ref=ref, par=tp, ser=ts, cpu_units=cs / cc,
                         cold=cold, cached=cached, passes=transform_plan.plan(shape).npasses))
    model, ncpu, l2, l3 = _cpu_model()
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    fmt = lambda v, d=4: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    lines = [
        "# fast_transform benchmarks",
        "",
        f"Machine: {model}, {ncpu} CPU(s), L2 {l2}, L3 {l3}; numpy {np.__version__}, numba "
        f"{numba.__version__}, Python {platform.python_version()}; "
        f"threads used: {threadpool.num_threads()}; load average at the end: "
        + ", ".join(f"{x:.2f}" if isinstance(x, float) else str(x) for x in load) + ".",
        "",
        "float64, full transform (all axes, forward). Times in seconds, minimum over "
        f"{reps} interleaved repetitions; copy units = transform time / `np.copyto` time of the "
        "same table in the same run. *cold, compile*: first call in a fresh process with an "
        "empty numba cache; *cold, cached*: first call in a fresh process with the cache "
        "filled (kernels loaded from disk). The CPU-clock column times copy and transform "
        "(1 thread) with `time.thread_time`, which other processes' load does not inflate.",
        "",
        "| table | cards | \\|X\\| | passes | copy s | numpy ref s | fast cold, compile s | "
        "fast cold, cached s | fast warm s (2 thr) | fast warm s (1 thr) | copy units (2 thr) | "
        "copy units (1 thr) | copy units (1 thr, CPU clock) | speed-up vs numpy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cards = "x".join(str(k) for k in r["shape"]) if len(set(r["shape"])) > 1 else f"2^{len(r['shape'])}"
        speedup = "-" if r["ref"] is None else f"{r['ref'] / r['par']:.0f}x"
        lines.append(
            f"| {r['name']} | {cards} | {r['size']:,} | {r['passes']} | {fmt(r['copy'])} | {fmt(r['ref'], 3)} | "
            f"{fmt(r['cold'], 2)} | {fmt(r['cached'], 3)} | {fmt(r['par'])} | {fmt(r['ser'])} | "
            f"{r['par'] / r['copy']:.2f} | {r['ser'] / r['copy']:.2f} | {r['cpu_units']:.2f} | {speedup} |")
    lines += [
        "",
        "Plans (`kernels.transform_plan.plan(shape).describe()`: passes over memory, then the sweeps of",
        "each pass; `r8d@h` = radix-8 butterflies at stride h with descending stages, `pm` = +-1 axis):",
        "",
        "```",
    ]
    for name, shape in CASES:
        lines.append(transform_plan.plan(shape).describe())
    lines += [
        "```",
        "",
        "Reproduce: `python bench/perf_transform.py --out docs/benchmarks_transform.md` "
        "(`--quick`: no cold runs, fewer repetitions).  Wall-clock columns are only meaningful "
        "on an otherwise idle machine; see the load average above.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
