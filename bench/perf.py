"""In-core speed: the paper's six datasets, iteration cost in copy units, transform cost, a profile.

Usage: python bench/perf.py [--out docs/benchmarks_perf.md] [--sizes 20 24 26] [--skip-profile]
       [--skip-compile] [--compile-rounds 1] [--venv-dir DIR] [--skip-busy] [--reps 3]
Memory: about 3 GiB at 2^26 (three tables of 512 MiB plus temporaries); disk: a
fresh virtual environment (about 500 MB, deleted after) for the first-use measurement.
Time: a few minutes on 2 cores, plus a minute or two for the fresh install.

"Copy units": seconds of the measured operation divided by the seconds numpy needs to
copy one float64 table of the same |X| (``np.copyto``), measured in the same run.
Wall-clock times are best-of-N; the CPU time of the same runs is printed next to them
because on a shared machine the wall clock also counts other jobs' time slices.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from ab import best_seconds, structured_binary  # noqa: E402
from paper_table import PAPER, machine  # noqa: E402

from fsll_ooc import FSLL, datasets  # noqa: E402


def copy_seconds(size: int, reps: int = 7) -> float:
    a = np.random.default_rng(0).random(size)
    b = np.empty_like(a)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t)
    return min(ts)


def cold_fit_seconds(name: str) -> float:
    """Fit in a fresh interpreter (numba's on-disk cache warm, nothing else)."""
    code = ("import time; t=time.perf_counter(); from fsll_ooc import FSLL, datasets; "
            f"X,_=datasets.paper_dataset({name!r}, seed=0); t1=time.perf_counter(); FSLL(epsilon=1e-4, progress=False).fit(X); "
            "print(time.perf_counter()-t1)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(r.stdout.strip().splitlines()[-1])


def compile_rows(rounds: int = 1, venv_dir: str | None = None) -> list[str]:
    """First use after installing, per path the defaults take: ``pip install`` this tree into
    a fresh virtual environment, then each path cold (numba's cache empty) and warm, in
    separate processes (:mod:`coldstart`)."""
    from coldstart import PATHS, Install, measure, summary

    with tempfile.TemporaryDirectory(prefix="perf-venv-", dir=venv_dir) as base:
        inst = Install.fresh_venv(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                  os.path.join(base, "venv"))
        rows = measure(PATHS, [inst], "BN20-37S", rounds=rounds)
    return summary(rows)


def _best_fit(X, reps: int, threads: int):
    """Best of ``reps`` warm fits with the kernels on ``threads`` threads: (wall s, CPU s of all
    threads, iterations)."""
    from fsll_ooc.kernels import threadpool

    saved = threadpool.num_threads
    if threads == 1:
        threadpool.num_threads = lambda: 1
    try:
        warm = []
        for _ in range(reps):
            t, c = time.perf_counter(), time.process_time()
            m = FSLL(epsilon=1e-4, progress=False).fit(X)
            warm.append((time.perf_counter() - t, time.process_time() - c))
    finally:
        threadpool.num_threads = saved
    return (*min(warm), m.n_iter_)


def paper_rows(reps: int = 3):
    from fsll_ooc.kernels import threadpool

    X0, _ = datasets.paper_dataset("Ising5x4S", seed=0)
    FSLL(epsilon=1e-4, progress=False, max_iter=2).fit(X0)  # compile / load the kernels once
    nt = threadpool.num_threads()
    lines = [f"| data | iterations | cold fit (s) | warm fit (s, best of {reps}) | CPU of that fit (s, all threads) | "
             f"same, kernels on 1 thread (s) | copy of a 2^20 table just before (ms) | load | paper (s) | "
             "speed-up vs paper | target (1/20) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    print(f"kernel threads: {nt}", flush=True)
    for name in datasets.PAPER_DATASETS:
        X, _ = datasets.paper_dataset(name, seed=0)
        cold = cold_fit_seconds(name)
        cp = copy_seconds(2**20)  # how fast the machine moves memory right now (it varies, shared host)
        w, cpu, iters = _best_fit(X, reps, nt)
        w1, _, _ = _best_fit(X, reps, 1)
        paper = PAPER[name][3]
        lines.append(f"| {name} | {iters} | {cold:.2f} | {w:.2f} | {cpu:.2f} | {w1:.2f} | {cp * 1e3:.2f} | "
                     f"{os.getloadavg()[0]:.1f} | "
                     f"{paper} | {paper / w:.1f}x | {paper / 20:.2f} s {'met' if w <= paper / 20 else 'missed'} |")
        print(lines[-1], flush=True)
    return lines


def busy_rows(reps: int = 3):
    """The same fits while another program keeps one core busy (a Python busy loop):
    what a user on a shared machine gets, with the kernels on all threads and on one."""
    from fsll_ooc.kernels import threadpool

    nt = threadpool.num_threads()
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        lines = [f"| data | warm fit, kernels on {nt} threads (s, best of {reps}) | kernels on 1 thread (s) | "
                 "paper (s) | speed-up vs paper |", "|---|---|---|---|---|"]
        for name in datasets.PAPER_DATASETS:
            X, _ = datasets.paper_dataset(name, seed=0)
            w, _, _ = _best_fit(X, reps, nt)
            w1, _, _ = _best_fit(X, reps, 1)
            paper = PAPER[name][3]
            lines.append(f"| {name} | {w:.2f} | {w1:.2f} | {paper} | {paper / w:.1f}x |")
            print(lines[-1], flush=True)
    finally:
        hog.kill()
        hog.wait()
    return lines


def iteration_rows(sizes, reps: int = 3):
    lines = [f"| \\|X\\| | copy of one table (ms) | s / iteration (median of 30, best of {reps} fits) | copy units | "
             "full transform (ms) | transform copy units |",
             "|---|---|---|---|---|---|"]
    from fsll_ooc.kernels.transform import transform_inplace

    for lg in sizes:
        n = int(lg)
        size = 2**n
        cp = copy_seconds(size)
        X = structured_binary(n)
        its = []
        for _ in range(reps):  # the best of the per-fit medians
            m = FSLL(epsilon=1e-4, progress=False, max_iter=30, resync_every=10**9).fit(X)
            times = np.diff([h["time"] for h in m.history_[1:]])
            its.append(float(np.median(times)) if len(times) else float("nan"))
        it = min(its)
        t = np.random.default_rng(1).random((2,) * n)
        tr = best_seconds(lambda: transform_inplace(t))
        lines.append(f"| 2^{n} | {cp * 1e3:.2f} | {it * 1e3:.2f} ms | {it / cp:.1f} | {tr * 1e3:.1f} | {tr / cp:.1f} |")
        print(lines[-1], flush=True)
    return lines


def numpy_iteration_seconds(n: int) -> float:
    """The same fused update + scan written with plain numpy ufuncs (what numba replaces)."""
    rng = np.random.default_rng(0)
    t = rng.uniform(-0.01, 0.01, 2**n)
    d = rng.uniform(-0.01, 0.01, 2**n)
    r = np.full(2**n, 0.007)
    perm = np.arange(2**n) ^ 5
    ch, sh = np.cosh(0.1), np.sinh(0.1)
    ts = []
    for _ in range(5):
        s = time.perf_counter()
        new = (ch * t + sh * t[perm]) / (ch + sh * t[5])
        diff = new - d
        lb = r - diff * diff / (1 - new * new)
        cand = np.nonzero(lb < 0)[0]
        if len(cand):
            a, dd = new[cand], d[cand]
            ex = 0.5 * ((1 + dd) * (np.log1p(a) - np.log1p(dd)) + (1 - dd) * (np.log1p(-a) - np.log1p(-dd))) + r[cand]
            int(cand[np.argmin(ex)])
        ts.append(time.perf_counter() - s)
    return min(ts)


def numba_rows(sizes):
    """What the compiled kernels buy: numpy-only vs compiled, same machine, same run."""
    from fsll_ooc import basis, kernels

    try:
        from fsll_ooc.kernels.transform import transform_inplace
    except ImportError:  # pragma: no cover
        return ["(fast_transform not available)"]
    from fsll_ooc.kernels import threadpool

    lines = ["| \\|X\\| | update+scan, numpy (ms) | numba, runs paired (ms) | numba, gathered (ms) | "
             f"numba {threadpool.num_threads()} threads, runs paired (ms) | transform, numpy (ms) | "
             "transform, numba (ms) |",
             "|---|---|---|---|---|---|---|"]
    for lg in sizes:
        n = int(lg)
        rng = np.random.default_rng(0)
        P, Q = 2 ** (n - 14), 2**14
        t = rng.uniform(-0.01, 0.01, (P, Q))
        d = rng.uniform(-0.01, 0.01, (P, Q))
        rP, rQ = np.full(P, 0.0035), np.full(Q, 0.0035)
        res = {}
        # mask 1024: partner runs paired directly; mask 5: partners gathered (a step on the last variables)
        for key, mq, par in (("pair", 1024, False), ("gather", 5, False), ("pair2", 1024, True)):
            kernels.update_scan_xor(t, d, rP, rQ, 0.0, 0, mq, 1.0, 0.0, 1.0, parallel=par)
            ts = []
            for _ in range(7):
                s = time.perf_counter()
                kernels.update_scan_xor(t, d, rP, rQ, 0.0, 0, mq, 1.0, 0.0, 1.0, parallel=par)
                ts.append(time.perf_counter() - s)
            res[key] = min(ts)
        g = rng.random((2,) * n)
        s = time.perf_counter()
        basis.transform(g)
        tnp = time.perf_counter() - s
        transform_inplace(g.copy())
        s = time.perf_counter()
        transform_inplace(g)
        tnb = time.perf_counter() - s
        lines.append(f"| 2^{n} | {numpy_iteration_seconds(n) * 1e3:.1f} | {res['pair'] * 1e3:.1f} | "
                     f"{res['gather'] * 1e3:.1f} | {res['pair2'] * 1e3:.1f} | {tnp * 1e3:.0f} | {tnb * 1e3:.0f} |")
        print(lines[-1], flush=True)
    return lines


def profile_text() -> str:
    X, _ = datasets.paper_dataset("BN20-54L", seed=0)
    FSLL(epsilon=1e-4, progress=False, max_iter=2).fit(X)
    # wall clock: the kernels run on several threads, whose CPU time process_time() would add up
    pr = cProfile.Profile(time.perf_counter)
    pr.enable()
    FSLL(epsilon=1e-4, progress=False).fit(X)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
    body = [l for l in s.getvalue().splitlines() if l.strip()]
    return "\n".join(body[:30])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--sizes", nargs="+", default=["20", "24", "26"])
    ap.add_argument("--skip-profile", action="store_true")
    ap.add_argument("--skip-paper", action="store_true")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--compile-rounds", type=int, default=1, help="cold + warm runs per path in the fresh venv")
    ap.add_argument("--venv-dir", default=None, help="where the fresh venv goes (default: the temp directory)")
    ap.add_argument("--skip-busy", action="store_true",
                    help="skip the paper's datasets with another program busy on one core")
    ap.add_argument("--reps", type=int, default=3, help="warm fits per dataset (the best is reported)")
    args = ap.parse_args(argv)
    t0 = time.time()
    parts = [f"Machine: {machine()}. Load average at start: {os.getloadavg()[0]:.2f}.\n"]
    if not args.skip_paper:
        parts += ["### The paper's datasets (epsilon 1e-4)\n", *paper_rows(args.reps), ""]
        if not args.skip_busy:
            parts += ["### The same, with another program busy on one core\n", *busy_rows(args.reps), ""]
    parts += ["### One iteration and one full transform, in copy units\n", *iteration_rows(args.sizes, args.reps), ""]
    parts += ["### What numba buys (same run)\n", *numba_rows(args.sizes[:2]), ""]
    if not args.skip_compile:
        parts += ["### First use after installing (a fresh venv; each path cold, then warm)\n",
                  *compile_rows(args.compile_rounds, args.venv_dir), ""]
    if not args.skip_profile:
        parts += ["### Profile of one BN20-54L fit (cProfile on the wall clock, sorted by own time)\n", "```", profile_text(), "```", ""]
    parts.append(f"Total benchmark time: {time.time() - t0:.0f} s; load average at the end: {os.getloadavg()[0]:.2f}.\n")
    text = "\n".join(parts)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
