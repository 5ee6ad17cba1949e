"""Plot the out-of-core scaling figures of ``bench/scale.py`` (docs/scale.png).

Reads the JSON result blocks that ``bench/scale.py`` prints (one per case) from its
logs and draws seconds per iteration and bytes moved per iteration against |X|, with
converged fits marked.  Needs matplotlib (``pip install -e ".[bench]"``).

Usage::

    python bench/plot_scale.py scratch/scale_bin.log scratch/scale_bn30.log \\
        scratch/conv/conv26.log --out docs/scale.png
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def read_results(paths) -> list[dict]:
    """Every result dict printed (indented JSON starting with ``{`` at column 0) in ``paths``."""
    out = []
    for path in paths:
        block = None
        for line in Path(path).read_text().splitlines():
            if line == "{":
                block = [line]
            elif block is not None:
                block.append(line)
                if line == "}":
                    obj = json.loads("\n".join(block))
                    if "cells" in obj and "failed" not in obj:
                        out.append(obj)
                    block = None
    return out


def plot(results: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((r for r in results if "workers" not in r["case"]), key=lambda r: r["cells"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for conv, marker, label in ((False, "o", "capped run"), (True, "*", "converged fit")):
        sel = [r for r in rows if bool(r["converged"]) == conv]
        if not sel:
            continue
        x = [math.log2(r["cells"]) for r in sel]
        ax1.scatter(x, [r["sec_per_iter_median"] for r in sel], marker=marker, s=80 if conv else 40, label=label)
        ax2.scatter(x, [r["bytes_per_iter"] / 2**30 for r in sel], marker=marker, s=80 if conv else 40)
        for r, xi in zip(sel, x):
            if conv:
                ax1.annotate(f"{r['n_iter']} it, {r['fit_seconds'] / 60:.0f} min", (xi, r["sec_per_iter_median"]),
                             textcoords="offset points", xytext=(6, -10), fontsize=8)
    ax1.set_yscale("log")
    ax1.set_xlabel("log2 |X|")
    ax1.set_ylabel("seconds per iteration (median)")
    ax1.set_title("Iteration time under a 4 GiB cap")
    ax1.legend(fontsize=8)
    ax2.set_yscale("log")
    ax2.set_xlabel("log2 |X|")
    ax2.set_ylabel("GiB read + written per iteration")
    ax2.set_title("Bytes moved per iteration")
    for ax in (ax1, ax2):
        ax.axvline(25, color="grey", ls=":", lw=1)
        ax.text(25.1, ax.get_ylim()[0] * 1.5, "paper's limit", color="grey", fontsize=8, rotation=90)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--out", default="docs/scale.png")
    args = ap.parse_args(argv)
    res = read_results(args.logs)
    if not res:
        ap.error("no results found in the logs")
    plot(res, Path(args.out))
    print(f"{len(res)} results -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
