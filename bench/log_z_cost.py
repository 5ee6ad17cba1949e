"""Cost of checking a model's log Z when it is loaded (``fsll_ooc.model_file.log_partition``).

A model of ``n`` binary variables whose terms join them all into one group (a chain of
pairs plus every single variable, and 3-variable terms up to ``--terms``): the worst case
of the check, which recomputes the log Z of a ``2^n``-cell table in blocks of
``LOG_Z_BLOCK_CELLS`` cells.  Prints, per size, the best of ``--repeats`` timings and the
peak resident memory of the process, with the machine's load (``/proc/loadavg``).

Usage::

    python bench/log_z_cost.py                 # 2^20, 2^22, 2^24
    python bench/log_z_cost.py --sizes 20 24 26 --repeats 2
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fsll_ooc.model_file import LOG_Z_BLOCK_CELLS, log_partition  # noqa: E402


def model(n: int, terms: int, seed: int = 0) -> dict:
    """``{flat index: value}`` of a one-group model of ``n`` binary variables."""
    rng = np.random.default_rng(seed)
    theta = {1 << i: 0.1 for i in range(n)}
    theta.update({(1 << i) | (1 << (i + 1)): 0.05 for i in range(n - 1)})
    while len(theta) < min(terms, n + (n - 1) + n * (n - 1) * (n - 2) // 6):
        vs = rng.choice(n, 3, replace=False)
        theta[int(sum(1 << int(v) for v in vs))] = float(rng.normal(0, 0.01))
    return theta


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 22, 24], help="log2 of the cells")
    ap.add_argument("--terms", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    print(f"block {LOG_Z_BLOCK_CELLS:,} cells; load {open('/proc/loadavg').read().split()[:3]}")
    for n in a.sizes:
        theta = model(n, a.terms)
        best = min(_time(lambda: log_partition((2,) * n, theta)) for _ in range(a.repeats))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
        print(f"2^{n} cells, {len(theta)} terms: {best:.2f} s ({best / 2**n * 1e9:.1f} ns per cell), "
              f"peak RSS {rss:.0f} MiB", flush=True)
    print(f"load {open('/proc/loadavg').read().split()[:3]}")


def _time(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
