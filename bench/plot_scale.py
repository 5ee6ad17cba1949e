"""Plot the out-of-core scaling figures of ``bench/scale.py`` (docs/scale.png).

Reads the JSON result blocks that ``bench/scale.py`` prints (one per case) from its
logs, in named series, and draws against |X|: the wall time of each fit and the passes
over the tables per term of its model.  Converged fits are filled markers, fits that
stopped before converging hollow ones.  Needs matplotlib (``pip install -e ".[bench]"``).

Usage::

    python bench/plot_scale.py \\
        "paper rule, before=docs/data/scale/converged_22_24.log,docs/data/scale/converged_26.log" \\
        "paper rule=docs/data/scale/summary_paper_22_26.log" \\
        "default rule=docs/data/scale/summary_default_22_28.log,docs/data/scale/summary_bn30.log" \\
        --out docs/scale.png

A series is ``LABEL=LOG[,LOG...]``; a bare log path is a series named after the file.
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


def fit_passes(r: dict) -> int | None:
    """Every pass over the tables of a fit: those over its store and, for a default fit whose
    tables fit in memory, those of its penalty scale's sub-fits in memory (``passes``); a
    hand-made block for a fit run in several sessions gives ``fit_passes_total``.  None for
    older logs, which did not count passes (such a series is left out of the right panel)."""
    for key in ("fit_passes_total", "passes"):
        if key in r:
            return int(r[key])
    return None


def series(specs) -> list[tuple[str, list[dict]]]:
    """``[(label, results)]`` from ``LABEL=LOG[,LOG...]`` (or a bare path) strings."""
    out = []
    for spec in specs:
        label, _, paths = spec.rpartition("=")
        paths = paths.split(",")
        rows = [r for r in read_results(paths) if "workers" not in r["case"]]
        out.append((label or Path(paths[0]).stem, sorted(rows, key=lambda r: r["cells"])))
    return out


def plot(groups: list[tuple[str, list[dict]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, (label, rows) in enumerate(groups):
        color = f"C{k}"
        x = [math.log2(r["cells"]) for r in rows]
        minutes = [r["fit_seconds"] / 60 for r in rows]
        ax1.plot(x, minutes, color=color, lw=1, alpha=0.6)
        counted = [(xi, r) for xi, r in zip(x, rows) if fit_passes(r) is not None]
        ax2.plot([xi for xi, _ in counted], [fit_passes(r) / max(r["n_bases"], 1) for _, r in counted],
                 color=color, lw=1, alpha=0.6)
        for r, xi, mi in zip(rows, x, minutes):
            face = color if r["converged"] else "none"
            ax1.scatter([xi], [mi], marker="o", s=45, facecolors=face, edgecolors=color,
                        label=label if r is rows[0] else None)
            ax1.annotate(f"{mi:.0f} min" if mi >= 1 else f"{mi * 60:.0f} s", (xi, mi),
                         textcoords="offset points", xytext=(5, -10), fontsize=7, color=color)
            if fit_passes(r) is None:
                continue
            pi = fit_passes(r) / max(r["n_bases"], 1)
            ax2.scatter([xi], [pi], marker="o", s=45, facecolors=face, edgecolors=color)
            ax2.annotate(f"{fit_passes(r)} / {r['n_bases']}", (xi, pi), textcoords="offset points",
                         xytext=(5, 4), fontsize=7, color=color)
    ax1.set_yscale("log")
    ax1.set_ylabel("wall time of the fit (minutes)")
    ax1.set_title("Time to fit under a 4 GiB cap")
    ax1.legend(fontsize=8, loc="upper left")
    ax2.set_yscale("log")
    ax2.set_ylabel("passes over the tables per term (all of the fit's)")
    ax2.set_title("Passes per term of the model")
    ax2.axhline(0.15, color="grey", ls="--", lw=1)
    ax2.text(22.1, 0.16, "0.15", color="grey", fontsize=8)
    for ax in (ax1, ax2):
        ax.set_xlabel("log2 |X|  (filled: converged, hollow: stopped before)")
        ax.axvline(25, color="grey", ls=":", lw=1)
        ax.text(25.1, ax.get_ylim()[0] * 1.5, "paper's limit", color="grey", fontsize=8, rotation=90)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("series", nargs="+", help="LABEL=LOG[,LOG...] or a bare log path")
    ap.add_argument("--out", default="docs/scale.png")
    args = ap.parse_args(argv)
    groups = series(args.series)
    if not any(rows for _, rows in groups):
        ap.error("no results found in the logs")
    plot(groups, Path(args.out))
    print(f"{sum(len(r) for _, r in groups)} results in {len(groups)} series -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
