"""Smoothing the final parameters, seed by seed: ``FSLL(smoothing="auto")`` against ``FSLL()``.

For each data set and size, on each seed: KL(p*||p) of the fit without smoothing
(``smoothing=1``, the paper's target) and with ``smoothing="auto"`` (the same search; only the
final parameters differ), the number of
pseudo-rows chosen, and with ``--oracle`` the best fixed number of pseudo-rows in hindsight
(1, 2, 4, ..., 256 fitted one after the other, the closest kept: what a perfect choice would
give).  Per row: mean KL, the seeds where ``"auto"`` is closer / further / the same, the
worst ratio, and the seconds of each fit (the choice's refits included).

The data: pgmpy's example networks (``asia``, ``survey``, ``sachs``) sampled as in
``bench/quality.py``'s peers study, and its mixed-cardinality sets (``BN-mix``,
``Potts-mix``).  Needs pgmpy (the example networks); about a minute per row at ten seeds
on 2 cores (BN-mix with ``--oracle``: five).

    python bench/smoothing.py --rows survey:1000 sachs:1000 --seeds 0 1 2 3 4 5 6 7 8 9
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import quality as Q  # noqa: E402

from fsll_ooc import FSLL, datasets  # noqa: E402

ROWS = ("survey:1000", "survey:10000", "asia:1000", "asia:10000", "sachs:1000", "sachs:10000",
        "BN-mix:1000", "Potts-mix:1000")
ORACLE = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)


def draw(name: str, n: int, seed: int):
    """``(X, p_true)``: the rows of ``bench/quality.py``'s peers study for this seed."""
    if name in ("BN-mix", "Potts-mix"):
        return Q.synthetic(name, n, seed)
    p = Q.example_network(name)
    return Q.example_rows(p, n, seed), p


def kl_of(m, p) -> float:
    return datasets.kl_divergence(p, np.asarray(m.probabilities()).reshape(p.shape))


def one_row(name: str, n: int, seeds, start, oracle: bool) -> dict:
    out = {"plain": [], "auto": [], "chosen": [], "t_plain": [], "t_auto": [], "oracle": []}
    for s in seeds:
        X, p = draw(name, n, s)
        t0 = time.perf_counter()
        plain = FSLL(progress=False, start=start, smoothing=1.0).fit(X)
        t1 = time.perf_counter()
        auto = FSLL(progress=False, start=start, smoothing="auto").fit(X)
        t2 = time.perf_counter()
        out["plain"].append(kl_of(plain, p))
        out["auto"].append(kl_of(auto, p))
        out["chosen"].append(float(auto.smoothing_))
        out["t_plain"].append(t1 - t0)
        out["t_auto"].append(t2 - t1)
        if oracle:
            out["oracle"].append(min(kl_of(FSLL(progress=False, start=start, smoothing=a).fit(X), p) for a in ORACLE))
        print(f"  {name} N={n:,} seed {s}: KL {out['plain'][-1]:.5g} -> {out['auto'][-1]:.5g} "
              f"(a = {auto.smoothing_:g})", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", default=list(ROWS), help="NAME:N pairs")
    ap.add_argument("--seeds", nargs="+", type=int, default=list(range(10)))
    ap.add_argument("--start", choices=["default", "network"], default="default",
                    help="where the search starts (FSLL's start: None or 'network')")
    ap.add_argument("--oracle", action="store_true", help="also the best fixed number of pseudo-rows in hindsight")
    args = ap.parse_args(argv)
    start = None if args.start == "default" else "network"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"python bench/smoothing.py {' '.join(argv if argv is not None else sys.argv[1:])}  "
          f"(commit {commit}, load {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    Q.warm_up()
    lines = ["| data | N | seeds | KL smoothing=1 | KL smoothing=\"auto\" | closer / further / same | worst ratio "
             "| pseudo-rows chosen | best fixed in hindsight | s smoothing=1 | s auto |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in args.rows:
        name, _, n = row.partition(":")
        r = one_row(name, int(n), args.seeds, start, args.oracle)
        plain, auto = np.array(r["plain"]), np.array(r["auto"])
        closer, further = int(np.sum(auto < plain)), int(np.sum(auto > plain))
        chosen = " ".join(f"{a:g}" for a in r["chosen"])
        best = Q.fmt(float(np.mean(r["oracle"]))) if r["oracle"] else "-"
        lines.append(f"| {name} | {int(n):,} | {args.seeds[0]}-{args.seeds[-1]} | {Q.fmt(float(plain.mean()))} | "
                     f"{Q.fmt(float(auto.mean()))} | {closer} / {further} / {len(plain) - closer - further} | "
                     f"{float(np.max(auto / plain)):.2f} | {chosen} | {best} | {np.mean(r['t_plain']):.2f} | "
                     f"{np.mean(r['t_auto']):.2f} |")
        print(lines[-1], flush=True)
    print(f"(load {os.getloadavg()[0]:.1f} at the end)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
