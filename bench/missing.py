#!/usr/bin/env python
"""Incomplete rows and hidden variables: EM against the usual work-arounds.

Parts (``--parts``):

* ``synth``: data with a known ``p*`` (the paper's S datasets, 20 binary variables,
  N = 1000; a mixed-cardinality Bayesian network, cards 2,3,4,5,2,3,4,5,3,2,
  two parents per node, N = 5000; and BN20-37L, N = 100,000, at 20 % MCAR only,
  for the seconds per round at a large N), with 5, 20 and 40 % of the cells removed
  completely at random (MCAR) or at random given the first two columns, which stay
  observed (MAR: a cell of a row with ``X0 = 0`` is removed with 0.4 times the rate,
  with ``X0 != 0`` 1.6 times, capped at 0.95).  ``KL(p* || p)`` of
  ``FSLL(missing="em")``, of a fit on the complete rows only ("drop"), and of a fit
  with "missing" as one more category of every incomplete variable ("category":
  ``p`` is its table restricted to the real categories and renormalised; only where
  that table fits, ``(k+1)^n`` cells), and EM's rounds and seconds per round.
* ``mechanisms``: the survey-like case: pgmpy's ``survey`` network (6 variables, 2-3
  states) and a random Bayesian network over cardinalities 2-4 (``MECH_CARDS``, two
  parents per node), N = 20,000, 6 % (and 20 %) of the cells removed completely at
  random (MCAR), at random given the first two columns (MAR, as above), or not at random
  (MNAR: a cell is removed with 1.6 times the rate when its own value is 0, 0.4 times
  otherwise); seeds 0, 1, 2.  ``KL(p* || p)`` of EM (``FSLL(missing="em")``), the fit
  on the complete rows (``FSLL()``), the fit on the rows with each missing cell set to its
  column's mode, and pgmpy's hill climbing (BIC, BDeu(1) parameters) on the complete
  rows; seconds of EM, of the complete-row fit and of a default fit of the full table.
* ``seeds``: the survey-like MCAR case (both ``mechanisms`` networks, 6 % of the cells
  removed completely at random) on more seeds (``--mcar-seeds``, default 0-19): per seed
  ``KL(p* || p)`` of EM and of the complete-row fit, whether their terms are the same, which
  of EM's two runs was kept (from the held-out choice's model or the complete rows' fit), and
  what a guard would have chosen that also offers the complete-row model to EM's held-out
  choice: the complete training rows' default fit (the same four fifths of the rows as EM's
  held-out choice), scored by the same held-out rows' observed-data log-likelihood, the
  higher score winning.
* ``time``: seconds of EM (6 % MCAR) against a default fit of the same table with no cell
  missing, interleaved, three times, on the two ``mechanisms`` networks (seed 0).
* ``hidden``: ``FSLL(hidden=["auto"])`` on data from a latent-class model with 2, 3, 4, 5
  planted classes (6 observed variables, cards 3,4,5,3,4,5; each class puts 0.8 of its
  mass on a value of its own per variable); the number of states chosen, the held-out
  score of each number tried, and the adjusted Rand index of the posterior's argmax.
* ``latent``: a latent-class model: a hidden variable with 3 states over 12
  observed ones (cards 2 and 3 alternating), each observed variable's conditional
  ``Dirichlet(0.5)`` given the class; 3000 training and 3000 test rows.  Held-out
  log-likelihood per row of ``FSLL()`` and ``FSLL(hidden=[3])``, and the adjusted
  Rand index of the posterior's argmax against the true classes.
* ``ooc``: seconds per EM round in core against out of core (zarr and memmap stores
  with the chunk layout ``--ooc-layout``, default ``4,8``: 16 A-bands and 16 B-bands of
  2^16 cells, as a table larger than memory is cut), interleaved (core, zarr, memmap, core, ...) on BN20-37S (2^20 cells,
  N = 1000) with 20 % of the cells removed completely at random; each round's table
  passes (E-step, M-step) and the largest ``|theta|`` difference from the in-core model.
* ``adult``: the UCI Adult file's categorical columns workclass, marital-status,
  occupation, relationship, race, sex, Salary ('?' is missing), and the same with
  native-country; rows shuffled with seed 0, the first 80 % for training.  Held-out
  log-likelihood per test row (missing cells marginalised) of EM on every training
  row against the fit on the complete training rows.

Usage::

    python bench/missing.py [--parts synth mechanisms hidden latent adult ooc] [--quick] [--json out.json]
                            [--adult ../shared/data/adult/adult.csv]

Prints a markdown report (for ``docs/benchmarks_quality.md``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (ROOT, HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from fsll_ooc import FSLL, datasets  # noqa: E402
from fsll_ooc.datasets import kl_divergence as kl  # noqa: E402
from fsll_ooc.missing import MISSING  # noqa: E402

RATES = (0.05, 0.2, 0.4)
MIX_CARDS = (2, 3, 4, 5, 2, 3, 4, 5, 3, 2)
ADULT_COLS = ["workclass", "marital-status", "occupation", "relationship", "race", "sex", "Salary"]
ADULT_WIDE = ADULT_COLS[:-1] + ["native-country", "Salary"]
CATEGORY_LIMIT = 2**22  # largest "missing as a category" table fitted


def remove_cells(X: np.ndarray, rate: float, mechanism: str, seed: int) -> np.ndarray:
    """``X`` with cells removed (``-1``): MCAR, MAR given columns 0 and 1 (kept), or MNAR (a
    cell's chance depends on its own value: 1.6 times the rate at 0, 0.4 times elsewhere)."""
    rng = np.random.default_rng(seed)
    u = rng.random(X.shape)
    if mechanism == "MCAR":
        drop = u < rate
    elif mechanism == "MNAR":
        drop = u < np.where(X == 0, 1.6 * rate, 0.4 * rate).clip(max=0.95)
    else:
        prob = np.where(X[:, :1] == 0, 0.4 * rate, 1.6 * rate).clip(max=0.95)
        drop = u < prob
        drop[:, :2] = False
    out = X.copy()
    out[drop] = MISSING
    return out


def fit_timed(model, X):
    t = time.perf_counter()
    model.fit(X)
    return model, time.perf_counter() - t


def category_table(Xm: np.ndarray, cards) -> np.ndarray | None:
    """'Missing' as one more category: fit, then the table on the real categories, renormalised."""
    cards2 = tuple(k + 1 if (Xm[:, i] < 0).any() else k for i, k in enumerate(cards))
    if math.prod(cards2) > CATEGORY_LIMIT:
        return None
    Xc = np.where(Xm < 0, np.array(cards)[None, :], Xm)
    m = FSLL(progress=False, cardinalities=cards2).fit(Xc)
    p = m.probabilities()[tuple(slice(0, k) for k in cards)]
    return p / p.sum()


def synth(quick: bool) -> list[dict]:
    cases = [("Ising5x4S", *datasets.paper_dataset("Ising5x4S", seed=0)[::-1]),
             ("BN20-37S", *datasets.paper_dataset("BN20-37S", seed=0)[::-1]),
             ("BN20-54S", *datasets.paper_dataset("BN20-54S", seed=0)[::-1])]
    pmix, _ = datasets.random_bayesnet(MIX_CARDS, 2, seed=11)
    cases.append(("BN-mix", pmix, datasets.sample_table(pmix, 5000, seed=12)))
    grid = {name: [(m, r) for m in ("MCAR", "MAR") for r in (RATES[1:2] if quick else RATES)] for name, *_ in cases}
    if quick:
        cases = cases[1:2] + cases[3:]
    else:  # one large-N case, for the seconds per round
        cases.append(("BN20-37L", *datasets.paper_dataset("BN20-37L", seed=0)[::-1]))
        grid["BN20-37L"] = [("MCAR", 0.2)]
    rows = []
    for name, p_true, X in cases:
        cards = p_true.shape
        full, t_full = fit_timed(FSLL(progress=False), X)
        for mech, rate in grid[name]:
            Xm = remove_cells(X, rate, mech, seed=int(rate * 1000) + (mech == "MAR"))
            keep = (Xm >= 0).all(axis=1)
            em, t_em = fit_timed(FSLL(progress=False, missing="em", cardinalities=cards), Xm)
            if keep.sum() > 0:
                drop, t_drop = fit_timed(FSLL(progress=False, cardinalities=cards), Xm[keep])
                kl_drop = kl(p_true, drop.probabilities())
            else:
                kl_drop, t_drop = None, None
            t = time.perf_counter()
            pc = category_table(Xm, cards)
            t_cat = time.perf_counter() - t
            rounds = em.em_history_
            per_round = (rounds[-1]["time"] - rounds[0]["time"]) / max(1, len(rounds) - 1)
            row = {"data": name, "N": len(X), "cells": int(math.prod(cards)), "mechanism": mech, "rate": rate,
                   "cells_missing": float((Xm < 0).mean()), "complete_rows": int(keep.sum()),
                   "kl_full": kl(p_true, full.probabilities()), "kl_em": kl(p_true, em.probabilities()),
                   "kl_drop": kl_drop, "kl_category": None if pc is None else kl(p_true, pc),
                   "em_rounds": em.em_rounds_, "em_converged": bool(em.em_converged_),
                   "em_first_round_s": rounds[0]["time"], "em_round_s": per_round, "em_s": t_em,
                   "drop_s": t_drop, "category_s": t_cat if pc is not None else None, "full_s": t_full}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


MECH_CARDS = (2, 3, 4, 2, 3, 4, 2, 3, 4, 3)
MECH_N = 20_000


def survey_network():
    """``p*`` of pgmpy's ``survey`` network (``bench/quality.py``'s :func:`example_network`), or
    None without pgmpy."""
    try:
        from quality import example_network

        return example_network("survey")
    except Exception:  # noqa: BLE001 - no pgmpy, or its file not shipped
        return None


def mech_cases(seeds):
    """``(name, seed, p*, rows)`` of the ``mechanisms`` cases: pgmpy's survey network (when
    pgmpy is there), then the random network over ``MECH_CARDS``, ``MECH_N`` rows per seed."""
    ps = survey_network()
    nets = ([("survey", lambda seed: ps)] if ps is not None else []) + [
        ("BN 2-4", lambda seed: datasets.random_bayesnet(MECH_CARDS, 2, seed=np.random.SeedSequence([seed, 21]))[0])]
    for name, net in nets:
        for seed in seeds:
            p_true = net(seed)
            yield name, seed, p_true, datasets.sample_table(p_true, MECH_N, seed=np.random.SeedSequence([seed, 22]))


def mode_filled(Xm: np.ndarray) -> np.ndarray:
    """Each missing cell set to its column's most frequent observed value."""
    out = Xm.copy()
    for j in range(Xm.shape[1]):
        col = Xm[:, j]
        seen = col[col >= 0]
        out[col < 0, j] = np.bincount(seen).argmax() if len(seen) else 0
    return out


def mechanisms(quick: bool) -> list[dict]:
    from reproduce_paper import fit_pgmpy

    rows = []
    for name, seed, p_true, X in mech_cases((0,) if quick else (0, 1, 2)):
        cards = p_true.shape
        full, t_full = fit_timed(FSLL(progress=False, cardinalities=cards), X)
        for mech in ("MCAR", "MAR", "MNAR"):
            for rate in ((0.06,) if quick else (0.06, 0.2)):
                Xm = remove_cells(X, rate, mech, seed=1000 * seed + int(rate * 100) + 7 * ("MCAR", "MAR", "MNAR").index(mech))
                keep = (Xm >= 0).all(axis=1)
                em, t_em = fit_timed(FSLL(progress=False, missing="em", cardinalities=cards), Xm)
                cc, t_cc = fit_timed(FSLL(progress=False, cardinalities=cards), Xm[keep])
                mo, t_mo = fit_timed(FSLL(progress=False, cardinalities=cards), mode_filled(Xm))
                t = time.perf_counter()
                p_hc, _, _ = fit_pgmpy("HC-BIC+BDeu", Xm[keep], cards)
                t_hc = time.perf_counter() - t
                row = {"data": name, "seed": seed, "N": MECH_N, "mechanism": mech, "rate": rate,
                       "cells_missing": float((Xm < 0).mean()), "rows_incomplete": float(1 - keep.mean()),
                       "kl_full": kl(p_true, full.probabilities()), "kl_em": kl(p_true, em.probabilities()),
                       "kl_cc": kl(p_true, cc.probabilities()), "kl_mode": kl(p_true, mo.probabilities()),
                       "kl_hc_cc": kl(p_true, p_hc), "em_scale": em.penalty_scale_, "cc_scale": cc.penalty_scale_,
                       "em_rounds": em.em_rounds_, "em_s": t_em, "cc_s": t_cc, "mode_s": t_mo, "hc_s": t_hc,
                       "full_s": t_full, "load": os.getloadavg()[0]}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def mcar_seeds(seeds) -> list[dict]:
    """EM against the complete-row fit at 6 % MCAR on many seeds, and the held-out guard (module doc)."""
    from fsll_ooc.missing import distinct_rows, split_counts

    rows = []
    for name, seed, p_true, X in mech_cases(seeds):
        cards = p_true.shape
        Xm = remove_cells(X, 0.06, "MCAR", seed=1000 * seed + 6)  # as ``mechanisms`` removes them
        keep = (Xm >= 0).all(axis=1)
        em, t_em = fit_timed(FSLL(progress=False, missing="em", cardinalities=cards), Xm)
        cc, t_cc = fit_timed(FSLL(progress=False, cardinalities=cards), Xm[keep])
        # the guard: EM's held-out rows score the complete-row model of EM's training rows
        d, counts = distinct_rows(Xm)
        tc, hc = split_counts(counts)
        Xt, Xh = np.repeat(d, tc, axis=0), np.repeat(d, hc, axis=0)
        cct = FSLL(progress=False, cardinalities=cards).fit(Xt[(Xt >= 0).all(axis=1)])
        s_cc = float(np.mean(cct.log_prob(Xh)))
        s_em = max(em.penalty_scale_scores_.values())
        k_em, k_cc = kl(p_true, em.probabilities()), kl(p_true, cc.probabilities())
        row = {"data": name, "seed": seed, "N": MECH_N, "cells_missing": float((Xm < 0).mean()),
               "rows_incomplete": float(1 - keep.mean()), "kl_em": k_em, "kl_cc": k_cc,
               "same_terms": set(em.theta_) == set(cc.theta_), "terms_em": em.n_bases_, "terms_cc": cc.n_bases_,
               "em_scale": em.penalty_scale_, "cc_scale": cc.penalty_scale_, "heldout_em": s_em,
               "heldout_cc": s_cc, "guard_kl": k_cc if s_cc > s_em else k_em, "em_s": t_em, "cc_s": t_cc,
               "em_run": em.em_history_[-1].get("restart", 0),
               "load": os.getloadavg()[0]}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def em_time(reps: int = 3) -> list[dict]:
    """Seconds of EM against a default fit of the same table with no cell missing, interleaved
    (complete fit, EM, complete fit, EM, ...): the survey-like cases at 6 % MCAR, seed 0."""
    cases = [("BN 2-4", datasets.random_bayesnet(MECH_CARDS, 2, seed=np.random.SeedSequence([0, 21]))[0])]
    ps = survey_network()
    if ps is not None:
        cases.insert(0, ("survey", ps))
    rows = []
    for name, p_true in cases:
        X = datasets.sample_table(p_true, MECH_N, seed=np.random.SeedSequence([0, 22]))
        Xm = remove_cells(X, 0.06, "MCAR", seed=6)
        for rep in range(reps):
            full, t_full = fit_timed(FSLL(progress=False, cardinalities=p_true.shape), X)
            em, t_em = fit_timed(FSLL(progress=False, missing="em", cardinalities=p_true.shape), Xm)
            row = {"data": name, "rep": rep, "full_s": t_full, "em_s": t_em, "em_rounds": em.em_rounds_,
                   "load": os.getloadavg()[0]}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def planted_classes(k: int, n: int, seed: int):
    """Rows of a latent-class model with ``k`` classes and their classes
    (:func:`fsll_ooc.datasets.latent_classes`)."""
    return datasets.latent_classes(k, n, seed=seed)


def hidden_auto(quick: bool) -> list[dict]:
    rows = []
    for k in ((3,) if quick else (2, 3, 4, 5)):
        for seed in ((0,) if quick else (0, 1)):
            X, z = planted_classes(k, 3000, seed=100 * k + seed)
            m, t = fit_timed(FSLL(progress=False, hidden=["auto"], random_state=seed), X[:2000])
            row = {"planted": k, "seed": seed, "chosen": int(m.cardinalities_[-1]), "scores": m.hidden_scores_,
                   "scale": m.penalty_scale_, "ari_test": ari(z[2000:], m.predict_hidden(X[2000:]).argmax(axis=1)),
                   "s": t, "load": os.getloadavg()[0]}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def ari(a: np.ndarray, b: np.ndarray) -> float:
    """Adjusted Rand index of two labellings (Hubert & Arabie 1985)."""
    _, ia = np.unique(a, return_inverse=True)
    _, ib = np.unique(b, return_inverse=True)
    table = np.zeros((ia.max() + 1, ib.max() + 1))
    np.add.at(table, (ia, ib), 1.0)
    comb = lambda x: x * (x - 1) / 2.0  # noqa: E731
    s_ij, s_a, s_b = comb(table).sum(), comb(table.sum(1)).sum(), comb(table.sum(0)).sum()
    expected = s_a * s_b / comb(len(a))
    return float((s_ij - expected) / (0.5 * (s_a + s_b) - expected))


def latent(quick: bool) -> list[dict]:
    rows = []
    for seed in ((0,) if quick else (0, 1, 2)):
        rng = np.random.default_rng(100 + seed)
        cards = tuple(2 + (i % 2) for i in range(12))
        K = 3
        pi = rng.dirichlet(np.ones(K) * 5)
        cond = [rng.dirichlet(np.ones(k) * 0.5, size=K) for k in cards]

        def draw(n):
            z = rng.choice(K, size=n, p=pi)
            X = np.stack([(rng.random(n)[:, None] > np.cumsum(c[z], axis=1)).sum(axis=1) for c in cond], axis=1)
            return np.minimum(X, np.array(cards) - 1), z

        Xtr, ztr = draw(3000)
        Xte, zte = draw(3000)
        plain, t_plain = fit_timed(FSLL(progress=False, cardinalities=cards), Xtr)
        hid, t_hid = fit_timed(FSLL(progress=False, cardinalities=cards, hidden=[K], random_state=seed), Xtr)
        # the truth's own held-out log-likelihood (the best any model can do on average)
        lp_true = np.log(sum(pi[k] * np.prod([cond[i][k, Xte[:, i]] for i in range(12)], axis=0) for k in range(K)))
        row = {"seed": seed, "ll_plain": plain.score(Xte), "ll_hidden": hid.score(Xte),
               "ll_true": float(lp_true.mean()),
               "ari_train": ari(ztr, hid.predict_hidden(Xtr).argmax(axis=1)),
               "ari_test": ari(zte, hid.predict_hidden(Xte).argmax(axis=1)),
               "bases_plain": plain.n_bases_, "bases_hidden": hid.n_bases_, "em_rounds": hid.em_rounds_,
               "plain_s": t_plain, "hidden_s": t_hid,
               "hidden_terms": int(sum(1 for y in hid.theta_ if y[-1]))}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def adult(path: str, cols) -> dict:
    import pandas as pd

    df = pd.read_csv(path, sep=", ", engine="python", na_values=["?"], keep_default_na=False)[cols]
    for c in cols:  # every label of the file (test rows may hold labels absent from training)
        df[c] = pd.Categorical(df[c], categories=sorted(df[c].dropna().unique()))
    order = np.random.default_rng(0).permutation(len(df))
    cut = int(0.8 * len(df))
    tr, te = df.iloc[order[:cut]].reset_index(drop=True), df.iloc[order[cut:]].reset_index(drop=True)
    complete_tr = tr.dropna()
    em, t_em = fit_timed(FSLL(progress=False, missing="em"), tr)
    drop, t_drop = fit_timed(FSLL(progress=False), complete_tr)
    te_complete = te.dropna()
    inc = te[te.isna().any(axis=1)]
    out = {"columns": len(cols), "rows": len(df), "rows_incomplete": int(df.isna().any(axis=1).sum()), "train": len(tr),
           "train_complete": len(complete_tr), "test": len(te), "test_incomplete": len(inc),
           "cells": int(math.prod(len(df[c].cat.categories) for c in cols)),
           "ll_em_all": em.score(te), "ll_drop_all": drop.score(te),
           "ll_em_complete": em.score(te_complete), "ll_drop_complete": drop.score(te_complete),
           "ll_em_incomplete": em.score(inc), "ll_drop_incomplete": drop.score(inc),
           "em_rounds": em.em_rounds_, "em_s": t_em, "drop_s": t_drop,
           "bases_em": em.n_bases_, "bases_drop": drop.n_bases_}
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def out_of_core(layout: tuple, reps: int = 2) -> list[dict]:
    import shutil
    import tempfile

    X, p_true = datasets.paper_dataset("BN20-37S", seed=0)
    Xm = remove_cells(X, 0.2, "MCAR", seed=200)
    rows, ref = [], None
    for rep in range(reps):
        for where in ("core", "zarr", "memmap"):
            d = tempfile.mkdtemp(prefix="fsll-em-ooc-")
            try:
                kw = {} if where == "core" else {"store": os.path.join(d, "s"), "backend": where, "layout": layout}
                m, t = fit_timed(FSLL(progress=False, missing="em", **kw), Xm)
                p = m.probabilities()
                k = kl(p_true, np.asarray(p.compute() if hasattr(p, "compute") else p))
            finally:
                shutil.rmtree(d, ignore_errors=True)
            h = m.em_history_
            if ref is None:
                ref = m
            diff = max((abs(v - ref.theta_.get(y, 0.0)) for y, v in m.theta_.items()), default=0.0)
            row = {"where": where, "rep": rep, "layout": [m.plan_.layout.a, m.plan_.layout.c], "rounds": m.em_rounds_, "s": t,
                   "first_round_s": h[0]["time"], "round_s": (h[-1]["time"] - h[0]["time"]) / max(1, len(h) - 1),
                   "passes_e": [e["passes_e"] for e in h], "passes_m": [e["passes_m"] for e in h],
                   "iters": [e["iters"] for e in h], "theta_diff": diff, "same_support": set(m.theta_) == set(ref.theta_),
                   "kl": k}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def fmt(v, nd=4):
    return "–" if v is None else f"{v:.{nd}f}"


def report(res: dict) -> str:
    L = []
    if "mechanisms" in res:
        L += ["| data | mechanism | cells removed | rows incomplete | KL full data | KL EM | KL complete rows | "
              "KL mode-imputed | KL pgmpy HC+BDeu, complete rows | EM ≤ complete rows | scale EM / complete rows | "
              "EM rounds | s EM | s complete rows | s full-table fit |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        groups: dict = {}
        for r in res["mechanisms"]:
            groups.setdefault((r["data"], r["mechanism"], r["rate"]), []).append(r)
        mean = lambda rs, k: float(np.mean([r[k] for r in rs]))  # noqa: E731
        for (d, mech, rate), rs in groups.items():
            wins = sum(r["kl_em"] <= r["kl_cc"] for r in rs)
            L.append(f"| {d} (N={rs[0]['N']:,}) | {mech} | {100 * mean(rs, 'cells_missing'):.1f} % | "
                     f"{100 * mean(rs, 'rows_incomplete'):.0f} % | {mean(rs, 'kl_full'):.5f} | {mean(rs, 'kl_em'):.5f} | "
                     f"{mean(rs, 'kl_cc'):.5f} | {mean(rs, 'kl_mode'):.5f} | {mean(rs, 'kl_hc_cc'):.5f} | "
                     f"{wins}/{len(rs)} | {' '.join('%g/%g' % (r['em_scale'], r['cc_scale']) for r in rs)} | "
                     f"{' '.join(str(r['em_rounds']) for r in rs)} | {mean(rs, 'em_s'):.2f} | {mean(rs, 'cc_s'):.2f} | "
                     f"{mean(rs, 'full_s'):.2f} |")
        L.append("")
    if "seeds" in res:
        L += ["| data | seed | rows incomplete | KL EM | KL complete rows | EM / complete rows | same terms (EM / "
              "complete) | scale EM / complete | EM run kept | held-out EM | held-out complete-row model | guard picks "
              "| KL guard |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["seeds"]:
            L.append(f"| {r['data']} | {r['seed']} | {100 * r['rows_incomplete']:.0f} % | {r['kl_em']:.6f} | "
                     f"{r['kl_cc']:.6f} | {r['kl_em'] / r['kl_cc']:.2f} | "
                     f"{'yes' if r['same_terms'] else 'no'} ({r['terms_em']} / {r['terms_cc']}) | "
                     f"{r['em_scale']:g} / {r['cc_scale']:g} | "
                     f"{('held-out model', 'complete rows')[r.get('em_run', 0)]} | {r['heldout_em']:.5f} | {r['heldout_cc']:.5f} | "
                     f"{'complete rows' if r['heldout_cc'] > r['heldout_em'] else 'EM'} | {r['guard_kl']:.6f} |")
        by: dict = {}
        for r in res["seeds"]:
            by.setdefault(r["data"], []).append(r)
        L.append("")
        for d, rs in by.items():
            ratio = [r["kl_em"] / r["kl_cc"] for r in rs]
            L.append(f"* {d}: EM at least as close on {sum(x <= 1 for x in ratio)} of {len(rs)} seeds; mean KL EM "
                     f"{np.mean([r['kl_em'] for r in rs]):.6f}, complete rows {np.mean([r['kl_cc'] for r in rs]):.6f}, "
                     f"guard {np.mean([r['guard_kl'] for r in rs]):.6f} (guard at least as close as the complete rows on "
                     f"{sum(r['guard_kl'] <= r['kl_cc'] for r in rs)} of {len(rs)}); ratio EM / complete rows "
                     f"median {np.median(ratio):.2f}, range {min(ratio):.2f}-{max(ratio):.2f}.")
        L.append("")
    if "time" in res:
        L += ["| data | rep | s default fit, no cell missing | s EM, 6 % MCAR | EM rounds | EM / fit | EM / (fit x rounds) "
              "| load |", "|---|---|---|---|---|---|---|---|"]
        for r in res["time"]:
            L.append(f"| {r['data']} | {r['rep']} | {r['full_s']:.2f} | {r['em_s']:.2f} | {r['em_rounds']} | "
                     f"{r['em_s'] / r['full_s']:.2f} | {r['em_s'] / (r['full_s'] * r['em_rounds']):.2f} | {r['load']:.1f} |")
        L.append("")
    if "hidden" in res:
        L += ["| planted classes | seed | states chosen | held-out LL per number of states tried | scale | ARI (test rows) "
              "| s |", "|---|---|---|---|---|---|---|"]
        for r in res["hidden"]:
            sc = ", ".join(f"{k}: {v:.4f}" for k, v in sorted(r["scores"].items(), key=lambda kv: int(kv[0])))
            L.append(f"| {r['planted']} | {r['seed']} | {r['chosen']} | {sc} | {r['scale']:g} | {r['ari_test']:.3f} "
                     f"| {r['s']:.1f} |")
        L.append("")
    if "synth" in res:
        L += ["| data | mechanism | cells removed | complete rows | KL full data | KL EM | KL drop rows | "
              "KL 'missing' category | EM rounds | s first round | s per later round |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["synth"]:
            L.append(f"| {r['data']} (N={r['N']:,}) | {r['mechanism']} | {100 * r['cells_missing']:.1f} % | "
                     f"{r['complete_rows']:,} | {fmt(r['kl_full'])} | {fmt(r['kl_em'])} | {fmt(r['kl_drop'])} | "
                     f"{fmt(r['kl_category'])} | {r['em_rounds']}{'' if r['em_converged'] else ' (cap)'} | "
                     f"{r['em_first_round_s']:.2f} | {r['em_round_s']:.2f} |")
        L.append("")
    if "latent" in res:
        L += ["| seed | held-out LL FSLL() | held-out LL hidden=[3] | truth's LL | ARI train | ARI test | "
              "bases plain / hidden | EM rounds | s plain / hidden |", "|---|---|---|---|---|---|---|---|---|"]
        for r in res["latent"]:
            L.append(f"| {r['seed']} | {r['ll_plain']:.4f} | {r['ll_hidden']:.4f} | {r['ll_true']:.4f} | "
                     f"{r['ari_train']:.3f} | {r['ari_test']:.3f} | {r['bases_plain']} / {r['bases_hidden']} | "
                     f"{r['em_rounds']} | {r['plain_s']:.1f} / {r['hidden_s']:.1f} |")
        L.append("")
    if "ooc" in res:
        L += ["| where | layout (a, c) | rounds | s total | s first round | s per later round | passes per round "
              "(E-step + M-step) | max abs theta diff from in core | KL(p*\|\|p) |",
              "|---|---|---|---|---|---|---|---|---|"]
        for r in res["ooc"]:
            passes = ", ".join(f"{e}+{m}" for e, m in zip(r["passes_e"], r["passes_m"]))
            L.append(f"| {r['where']} (run {r['rep'] + 1}) | {tuple(r['layout'])} | {r['rounds']} | {r['s']:.1f} | "
                     f"{r['first_round_s']:.2f} | {r['round_s']:.2f} | {passes} | {r['theta_diff']:.1e}"
                     f"{'' if r['same_support'] else ' (support differs)'} | {r['kl']:.4f} |")
        L.append("")
    for a in res.get("adult", []):
        L += [f"{a['columns']} columns, {a['cells']:,} cells, {a['rows_incomplete']:,} of {a['rows']:,} rows incomplete:", "","| test rows | held-out LL, EM on all rows | held-out LL, complete rows only |", "|---|---|---|",
              f"| all {a['test']:,} | {a['ll_em_all']:.4f} | {a['ll_drop_all']:.4f} |",
              f"| {a['test'] - a['test_incomplete']:,} complete | {a['ll_em_complete']:.4f} | "
              f"{a['ll_drop_complete']:.4f} |",
              f"| {a['test_incomplete']:,} incomplete (observed cells) | {a['ll_em_incomplete']:.4f} | "
              f"{a['ll_drop_incomplete']:.4f} |", "",
              f"Training: {a['train']:,} rows ({a['train_complete']:,} complete), {a['cells']:,} cells; EM "
              f"{a['em_rounds']} rounds, {a['em_s']:.1f} s, {a['bases_em']} bases; complete rows "
              f"{a['drop_s']:.1f} s, {a['bases_drop']} bases.", ""]
    return "\n".join(L)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="+", default=["synth", "mechanisms", "hidden", "latent", "adult"],
                    choices=["synth", "mechanisms", "seeds", "time", "hidden", "latent", "adult", "ooc"])
    ap.add_argument("--ooc-layout", default="4,8", help="chunk layout 'a,c' of the out-of-core fits of --parts ooc")
    ap.add_argument("--mcar-seeds", type=int, nargs="+", default=list(range(20)),
                    help="seeds of --parts seeds (default 0-19)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--adult", default=os.path.join(ROOT, "..", "shared", "data", "adult", "adult.csv"))
    a = ap.parse_args(argv)
    res = {}
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:  # pragma: no cover
        commit = "?"
    res["meta"] = {"commit": commit, "python": platform.python_version(), "cores": os.cpu_count(),
                   "load_before": os.getloadavg()}
    if "synth" in a.parts:
        res["synth"] = synth(a.quick)
    if "mechanisms" in a.parts:
        res["mechanisms"] = mechanisms(a.quick)
    if "seeds" in a.parts:
        res["seeds"] = mcar_seeds(a.mcar_seeds[:1] if a.quick else a.mcar_seeds)
    if "time" in a.parts:
        res["time"] = em_time(1 if a.quick else 3)
    if "hidden" in a.parts:
        res["hidden"] = hidden_auto(a.quick)
    if "latent" in a.parts:
        res["latent"] = latent(a.quick)
    if "ooc" in a.parts:
        res["ooc"] = out_of_core(tuple(int(v) for v in a.ooc_layout.split(",")), reps=1 if a.quick else 2)
    if "adult" in a.parts:
        if os.path.exists(a.adult):
            res["adult"] = [adult(a.adult, ADULT_COLS)] + ([] if a.quick else [adult(a.adult, ADULT_WIDE)])
        else:
            print(f"skipping adult: {a.adult} not found", file=sys.stderr)
    res["meta"]["load_after"] = os.getloadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(f"Commit {commit}; load average {res['meta']['load_before'][0]:.1f} before, "
          f"{res['meta']['load_after'][0]:.1f} after.\n")
    print(report(res))


if __name__ == "__main__":
    main()
