#!/usr/bin/env python
"""Held-out log-likelihood on real data: FL against the tools people use instead.

Datasets (``--data``, default ``../shared/data`` next to the project; the README there
names the sources):

* ``msnbc``: 17 binary page categories; trained on ``msnbc.train.data`` (38,843 rows),
  scored on ``msnbc.test.data`` (58,265 rows), the benchmark's own split.
* ``adult``: the UCI Adult census file, its categorical columns workclass, education,
  marital-status, occupation, relationship, race, sex and Salary (8 columns,
  7 x 16 x 7 x 14 x 6 x 5 x 2 x 2 = 1,317,120 cells).  native-country (41 values, 91 % of
  the rows one value) is left out: it multiplies the table by 41 to 2^25.7 cells, a
  fit beyond this benchmark's minutes; ``adult9`` keeps it (``--sets adult9``).  Rows
  with a missing cell (``?``) in the chosen columns are dropped (2,399 rows) until
  incomplete rows are supported; the rest are shuffled with seed 0 and the first 80 %
  train, the last 20 % test.  Categories are coded from all complete rows, so a test
  category never seen in training still has a place in every model.

Synthetic sets (``bench/learner.py``, networks with strong conditional tables): ``survey``
(cardinalities 7,5,9,9,3,4,4,2,2,2,3,2, 13,000 + 3,000 rows), ``sachs-like`` (11 ternary
variables) and ``nltcs-like`` (16 binary variables, NLTCS's shape; NLTCS itself is not
available here).

Systems: ``FL-auto`` (``FSLL()``, the default), ``FL-paper-code`` (``FSLL(penalty="paper")``:
the default search under the paper's code of the terms, the default before the family code),
``FL-paper`` (``FSLL(epsilon=1e-4)``, the paper's algorithm), ``FL-smooth``
(``FSLL(smoothing="auto")``), ``FL-network`` (``FSLL(start="network")``, which smooths and
chooses the further terms' price by default), ``FL-network-plain`` (the same start without
either: ``smoothing=1``, ``further_price="full"``), and pgmpy's structure learners with BDeu(1) parameters: hill climbing
with the BIC score (``HC-BIC``), the Chow-Liu tree (``Chow-Liu``), ``MMHC`` (max-min
parents and children, then hill climbing with BIC) and ``PC`` (stable PC, chi-square
tests at 0.01, the CPDAG oriented to a DAG by pgmpy), and pyAgrum's greedy hill climbing
(``pyAgrum-GHC``: BIC score, Laplace-smoothed parameters, C++, in this process; the best of
``--repeats`` fits, as for FL).  Each pgmpy search runs in a child
process capped at ``--cap`` seconds; a search that does not finish is reported as
"capped" with no score.

Reported per system: the mean held-out log-likelihood per test row (nats) with its
standard error over rows, the paired per-row difference to the best peer (mean and
standard error: rows are the same, so the pair's noise is far smaller than either
score's), fit wall-clock time (pgmpy: structure search plus parameters) and model size
(FL: non-zero parameters; networks: free CPD parameters).

Usage::

    python bench/realdata.py [--sets msnbc adult] [--cap 600] [--raw docs/data/realdata.json]
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time
from datetime import datetime, timezone

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from fsll_ooc import FSLL  # noqa: E402
from reproduce_paper import cpd_tables, fit_network, fix_hash_seed, machine_line, search_edges  # noqa: E402

DEFAULT_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
ADULT_COLUMNS = ("workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
                 "Salary")
ADULT9_COLUMNS = ADULT_COLUMNS[:-1] + ("native-country", "Salary")
FL_SYSTEMS = {"FL-auto": {}, "FL-scale1": {"penalty_scale": 1.0},
              "FL-paper-code": {"penalty": "paper", "penalty_scale": 1.0}, "FL-paper": {"epsilon": 1e-4},
              "FL-smooth": {"smoothing": "auto"}, "FL-network": {"start": "network"},
              "FL-network-plain": {"start": "network", "smoothing": 1.0, "further_price": "full"}}
PEERS = ("HC-BIC", "Chow-Liu", "MMHC", "PC", "pyAgrum-GHC")
SYNTHETIC = ("survey", "sachs-like", "nltcs-like")  # bench/learner.py's strong networks


# --------------------------------------------------------------------------- data
def load_msnbc(data_dir):
    """(train, test, cards, column names) of the MSNBC split."""
    d = os.path.join(data_dir, "msnbc")
    tr = np.loadtxt(os.path.join(d, "msnbc.train.data"), delimiter=",", dtype=np.int64)
    te = np.loadtxt(os.path.join(d, "msnbc.test.data"), delimiter=",", dtype=np.int64)
    cards = tuple(int(k) for k in np.maximum(tr.max(axis=0), te.max(axis=0)) + 1)
    return tr, te, cards, [f"page{i}" for i in range(tr.shape[1])]


def load_adult(data_dir, columns=ADULT_COLUMNS, seed=0, train_frac=0.8):
    """(train, test, cards, columns): complete rows of ``columns``, seeded shuffle, 80/20."""
    import pandas as pd

    df = pd.read_csv(os.path.join(data_dir, "adult", "adult.csv"), sep=",", skipinitialspace=True,
                     dtype=str)[list(columns)]
    df = df[~(df == "?").any(axis=1)]
    codes = np.stack([pd.Categorical(df[c]).codes for c in columns], axis=1).astype(np.int64)
    cards = tuple(int(len(pd.Categorical(df[c]).categories)) for c in columns)
    order = np.random.default_rng(seed).permutation(len(codes))
    cut = int(round(train_frac * len(codes)))
    return codes[order[:cut]], codes[order[cut:]], cards, list(columns)


def load_set(name, data_dir):
    if name == "msnbc":
        return load_msnbc(data_dir)
    if name == "adult":
        return load_adult(data_dir)
    if name == "adult9":
        return load_adult(data_dir, ADULT9_COLUMNS)
    if name in SYNTHETIC:
        from learner import case_data

        Xtr, Xte, cards = case_data(name)
        return Xtr, Xte, cards, [f"X{i}" for i in range(len(cards))]
    raise ValueError(f"unknown data set {name!r}")


# --------------------------------------------------------------------------- pgmpy peers
def _structure(kind, X, queue):
    """Child process: the edges of one pgmpy structure search (or the error text)."""
    try:
        edges, seconds = search_edges(kind, X)
        queue.put(("ok", edges, seconds))
    except Exception as exc:  # reported in the table, the run goes on
        queue.put(("error", f"{type(exc).__name__}: {exc}", 0.0))


def structure(kind, X, cap):
    """(edges, seconds) of a search in a child process, or (None, cap) if it ran past ``cap`` s."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_structure, args=(kind, X, q), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    try:
        status, edges, seconds = q.get(timeout=cap)
    except Exception:  # queue.Empty: the search is still running at the cap
        proc.terminate()
        proc.join()
        return None, time.perf_counter() - t0, "capped"
    proc.join()
    if status != "ok":
        return None, seconds, edges
    return edges, seconds, "ok"


def bn_log_prob(model, cards, X):
    """Per-row natural-log likelihood of a fitted pgmpy network (columns ``X0..X{n-1}``).

    CPD columns of parent configurations never seen (NaN or all zero) are uniform, as in
    the joint tables of ``bench/reproduce_paper.py``.
    """
    out = np.zeros(len(X))
    n_params = 0
    for axes, full, k in cpd_tables(model, cards):
        with np.errstate(divide="ignore"):
            out += np.log(full[tuple(X[:, a] for a in axes)])
        n_params += k
    return out, n_params


def fit_pyagrum(Xtr, Xte, cards, repeats=1):
    """pyAgrum's greedy hill climbing (BIC score, Laplace smoothing 1 for the parameters; C++):
    structure and parameters in one ``learnBN``, timed from the data frame on; the best of
    ``repeats`` fits (on a shared machine its threads make a single fit's time swing by 100x)."""
    import pandas as pd
    import pyagrum as gum

    names = [f"X{i}" for i in range(len(cards))]
    df = pd.DataFrame({n: Xtr[:, i].astype(str) for i, n in enumerate(names)})
    seconds = math.inf
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        template = gum.BayesNet()
        for n, k in zip(names, cards):  # every value a label, in order (also those the training rows lack)
            template.add(gum.LabelizedVariable(n, n, [str(v) for v in range(k)]))
        learner = gum.BNLearner(df, template)
        learner.useGreedyHillClimbing()
        learner.useScoreBIC()
        learner.useSmoothingPrior(1.0)
        bn = learner.learnBN()
        seconds = min(seconds, time.perf_counter() - t0)
    ll = np.zeros(len(Xte))
    n_params = 0
    for n in names:
        cpt = bn.cpt(n)
        axes = [names.index(v) for v in reversed(cpt.names)]  # toarray's axes: the names reversed
        table = cpt.toarray()
        with np.errstate(divide="ignore"):
            ll += np.log(table[tuple(Xte[:, a] for a in axes)])
        n_params += table.size // cards[names.index(n)] * (cards[names.index(n)] - 1)
    return {"status": "ok", "time": seconds, "size": n_params, "ll": ll, "edges": len(bn.arcs())}


def fit_peer(kind, Xtr, Xte, cards, cap, repeats=1):
    if kind == "pyAgrum-GHC":
        return fit_pyagrum(Xtr, Xte, cards, repeats)
    edges, t_struct, status = structure(kind, Xtr, cap)
    if edges is None:
        return {"status": status, "time": t_struct}
    model, t_params = fit_network(edges, Xtr, cards, 1.0)
    seconds = t_struct + t_params
    ll, n_params = bn_log_prob(model, cards, Xte)
    return {"status": "ok", "time": seconds, "size": n_params, "ll": ll, "edges": len(edges)}


# --------------------------------------------------------------------------- FL
def fit_fl(Xtr, Xte, cards, repeats=1, **kw):
    """Fit FL (best of ``repeats`` wall-clock times; the fits are deterministic) and score it."""
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        m = FSLL(cardinalities=cards, progress=False, **kw).fit(Xtr)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return {"status": "ok", "time": best, "size": int(m.n_bases_), "ll": np.asarray(m.log_prob(Xte)),
            "n_iter": int(m.n_iter_), "model": m}


def warm_up():
    X = np.random.default_rng(0).integers(0, 3, size=(200, 6))
    for kw in FL_SYSTEMS.values():
        FSLL(progress=False, **kw).fit(X)


# --------------------------------------------------------------------------- summary
def summarise(results):
    """Per system: mean log-likelihood per row, its SE, paired difference to the best peer."""
    ok = {s: r for s, r in results.items() if r["status"] == "ok" and np.all(np.isfinite(r["ll"]))}
    peers = [s for s in ok if s in PEERS]
    best_peer = max(peers, key=lambda s: ok[s]["ll"].mean()) if peers else None
    rows = {}
    for s, r in results.items():
        row = {"status": r["status"], "time": float(r["time"])}
        if r["status"] == "ok":
            ll = r["ll"]
            row.update(size=int(r["size"]), ll=float(ll.mean()),
                       se=float(ll.std(ddof=1) / math.sqrt(len(ll))) if np.all(np.isfinite(ll)) else math.nan)
            if best_peer is not None and s in ok:
                d = ll - ok[best_peer]["ll"]
                row.update(diff=float(d.mean()), diff_se=float(d.std(ddof=1) / math.sqrt(len(d))))
            for k in ("n_iter", "edges"):
                if k in r:
                    row[k] = int(r[k])
        rows[s] = row
    return rows, best_peer


def table_lines(name, rows, best_peer, n_train, n_test, cards):
    head = [f"### {name} ({n_train:,} training rows, {n_test:,} test rows, cardinalities "
            f"{'x'.join(map(str, cards))} = {math.prod(cards):,} cells)", "",
            f"| system | held-out log-likelihood [nats/row] | ± SE | vs {best_peer} (paired) | fit time [s] "
            "| model size |", "|---|---|---|---|---|---|"]
    for s, r in sorted(rows.items(), key=lambda kv: -kv[1].get("ll", -math.inf)):
        if r["status"] != "ok":
            head.append(f"| {s} | {r['status']} | | | {r['time']:.0f} | |")
            continue
        diff = "—" if s == best_peer else (f"{r['diff']:+.4f} ± {r['diff_se']:.4f}" if "diff" in r else "")
        head.append(f"| {s} | {r['ll']:.4f} | {r['se']:.4f} | {diff} | {r['time']:.2f} | {r['size']:,} |")
    return head


SECTION_TITLE = "Real data: held-out log-likelihood (bench/realdata.py)"


def markdown(out, cmd, commit, figure=None):
    """The report section (``## SECTION_TITLE``) from the JSON summary ``out``."""
    md = [f"## {SECTION_TITLE}", "",
          f"Generated by `{cmd}` at commit {commit}, started {out['started']}. Machine: {out['machine']}. "
          f"pgmpy structure searches capped at {out['cap']:.0f} s each (a child process, ended at the cap). "
          "Each data set's 1-minute load average during its fits (min / median / max) is in its heading; "
          "the machine was shared with other developers' jobs, so times are indicative only.", "",
          "Columns: mean held-out log-likelihood per test row (nats; higher is better) and its standard "
          "error over rows; the paired per-row difference to the best peer (same rows, so its standard "
          "error is far smaller than either score's); `fit` wall-clock (pgmpy: structure search plus "
          "BDeu(1) parameters); model size (FL: non-zero parameters; networks: free CPD parameters).", ""]
    for name, info in out["sets"].items():
        lo, med, hi = info["load"]
        lines = table_lines(name, info["systems"], info["best_peer"], info["n_train"], info["n_test"], info["cards"])
        lines[0] += f", load {lo:.0f} / {med:.0f} / {hi:.0f}"
        md += lines + [""]
    if figure:
        md += [f"![held-out log-likelihood against the best peer, and fit time]({figure})", ""]
    return md


def plot(out, path):
    """One panel per data set: each system's held-out log-likelihood minus the best peer's
    (paired per row, with two standard errors), and its fit time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(out["sets"])
    fig, axes = plt.subplots(len(sets), 2, figsize=(11, 2.2 + 1.6 * len(sets)), squeeze=False)
    for row, name in zip(axes, sets):
        info = out["sets"][name]
        items = [(s, r) for s, r in info["systems"].items() if r["status"] == "ok" and "diff" in r]
        items.sort(key=lambda kv: kv[1]["diff"])
        ys = np.arange(len(items))
        colors = ["C1" if s.startswith("FL") else "C7" for s, _ in items]
        row[0].barh(ys, [r["diff"] for _, r in items], xerr=[2 * r["diff_se"] for _, r in items], color=colors)
        row[0].set_yticks(ys)
        row[0].set_yticklabels([s for s, _ in items], fontsize=8)
        row[0].axvline(0, color="k", lw=0.8)
        row[0].set_title(f"{name}: held-out log-likelihood − {info['best_peer']}'s [nats/row]", fontsize=9)
        row[1].barh(ys, [r["time"] for _, r in items], color=colors)
        row[1].set_yticks(ys)
        row[1].set_yticklabels([s for s, _ in items], fontsize=8)
        row[1].set_xscale("log")
        row[1].set_title(f"{name}: fit time [s]", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA, help="folder holding msnbc/ and adult/")
    ap.add_argument("--sets", nargs="+", default=["msnbc", "adult"], choices=["msnbc", "adult", "adult9", *SYNTHETIC])
    ap.add_argument("--systems", nargs="+", default=list(FL_SYSTEMS) + list(PEERS))
    ap.add_argument("--cap", type=float, default=600.0, help="seconds allowed to each pgmpy structure search")
    ap.add_argument("--repeats", type=int, default=1,
                    help="fits per FL system and of pyAgrum (the fastest time is kept)")
    ap.add_argument("--raw", default=None, help="write the per-system summary as JSON here")
    ap.add_argument("--plot", default=None, help="draw the comparison into this PNG")
    ap.add_argument("--md", default=None, help="write the report section (markdown) here")
    ap.add_argument("--from-raw", default=None, help="write --md/--plot from this JSON instead of fitting")
    ap.add_argument("--keep-from", default=None,
                    help="a JSON of an earlier run: the rows of systems not run now are copied from it, marked "
                         "as such (results of unchanged systems, or searches that hit the cap)")
    args = ap.parse_args(argv)
    cmd = "python bench/realdata.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.from_raw:
        with open(args.from_raw, encoding="utf-8") as fh:
            out = json.load(fh)
        return _write(args, out, out.get("cmd", cmd))
    warm_up()
    out = {"machine": machine_line(), "started": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
           "cap": args.cap, "sets": {}}
    for name in args.sets:
        Xtr, Xte, cards, cols = load_set(name, args.data)
        print(f"== {name}: train {Xtr.shape}, test {Xte.shape}, cards {cards}", flush=True)
        results, loads = {}, []
        for s in args.systems:
            if s in FL_SYSTEMS:
                r = fit_fl(Xtr, Xte, cards, repeats=args.repeats, **FL_SYSTEMS[s])
                r.pop("model")
            else:
                r = fit_peer(s, Xtr, Xte, cards, args.cap, args.repeats)
            loads.append(os.getloadavg()[0])
            results[s] = r
            msg = f"{r['ll'].mean():.4f}" if r["status"] == "ok" else r["status"]
            print(f"  {s:10s} ll={msg} time={r['time']:.2f}s size={r.get('size')} load={loads[-1]:.1f}",
                  flush=True)
        rows, best_peer = summarise(results)
        for s, row in _kept_rows(args.keep_from, name, args.systems).items():
            if "diff" in row and row["vs"] != best_peer:  # paired against another system: not comparable
                row = {k: v for k, v in row.items() if k not in ("diff", "diff_se")}
            rows[f"{s} (earlier run)"] = row
        out["sets"][name] = {"columns": cols, "cards": list(cards), "n_train": len(Xtr), "n_test": len(Xte),
                             "best_peer": best_peer, "systems": rows,
                             "load": [min(loads), float(np.median(loads)), max(loads)]}
        print("\n".join(table_lines(name, rows, best_peer, len(Xtr), len(Xte), cards)), flush=True)
    out["cmd"], out["commit"] = cmd.strip(), _commit()
    if args.raw:
        os.makedirs(os.path.dirname(os.path.abspath(args.raw)), exist_ok=True)
        with open(args.raw, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return _write(args, out, cmd.strip())


def _kept_rows(path, name, systems):
    """The rows of the systems not in ``systems`` from an earlier run's JSON (``{}`` without one)."""
    if not path:
        return {}
    with open(path, encoding="utf-8") as fh:
        old = json.load(fh)
    info = old["sets"].get(name)
    if info is None:
        return {}
    return {s: dict(r, vs=info["best_peer"]) for s, r in info["systems"].items()
            if s not in systems and not s.endswith("(earlier run)")}


def _commit():
    import subprocess
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return "unknown"


def _write(args, out, cmd):
    if args.plot:
        plot(out, args.plot)
    if args.md:
        fig = os.path.relpath(args.plot, os.path.dirname(os.path.abspath(args.md))) if args.plot else None
        with open(args.md, "w", encoding="utf-8") as fh:
            fh.write("\n".join(markdown(out, cmd, out.get("commit", "unknown"), fig)) + "\n")
    return out


if __name__ == "__main__":
    fix_hash_seed()
    main()
