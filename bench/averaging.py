#!/usr/bin/env python
"""Averaging fitted distributions (bagging) against the single default fit.

For each case (``bench/quality.py``'s synthetic data at a size and seed, or MSNBC's
train/test split of ``bench/realdata.py``) the default ``FSLL()`` is fitted once, then
the members of each averaged variant; every fit's wall-clock is recorded and a variant's
time is the sum of the fits it needs.  The averaged model is the mean of the members'
probability tables (an equal-weight mixture).  Variants:

* ``default``: ``FSLL()`` on all rows;
* ``choice2``: the mean of the default fit and the model the default's penalty-scale
  choice fitted on four fifths of the rows under the chosen scale (no extra fit);
* ``boot K``: ``FSLL()`` on K bootstrap resamples (N rows drawn with replacement);
* ``bootS K``: the same resamples fitted under the scale the default chose on all rows
  (no choice inside the members: a bootstrap copy of a row can land in both the
  choice's training and held-out parts); time includes the default fit;
* ``half K``: ``FSLL()`` on K half-samples (N/2 rows drawn without replacement);
* ``sub80 K``: ``FSLL()`` on K subsamples of 4N/5 rows drawn without replacement (the
  size of the penalty-scale choice's own training part);
* ``sub80S K``: the same subsamples fitted under the scale the default chose (no choice
  inside the members); time includes the default fit;
* ``sub80W K``: as ``sub80S``, each member starting from the default's model (the warm
  start of ``docs/design.md``, "Choosing the penalty scale"); time includes the default fit.
* ``FSLLAverage``: :class:`fsll_ooc.FSLLAverage` as a user fits it (``n_members="auto"``,
  its own seeded subsamples of four fifths), timed as one ``fit``.
* ``fold K``: the rows cut into five folds (a seeded shuffle); member ``k`` is fitted on
  the other four folds under scale 1, continued under 1/2, and is the model of the scale
  that scores fold ``k`` higher (the scale choice's own sub-fit, with fold ``k`` as its
  held-out rows: no final fit); K = 4 (the first four folds) and 5 (all).  Not built into
  ``FSLLAverage``: measured as a way to less work per member.
* ``part K``: one ``FSLL(penalty_scale=1)`` fit on all rows; member ``k`` is a ``fold``
  member on ``sub80`` member ``k``'s rows (held out: the other fifth) whose fit under scale 1
  starts from the half of that fit's terms with the largest gains; time includes the shared
  fit.  Not built: measured as a way to cheaper members that keep their diversity.

K-member variants of K = 4 reuse the first 4 members of K = 8.  Quality: ``KL(p* || p)``
(nats) on the synthetic data, mean held-out log-likelihood per test row on MSNBC and
adult (``bench/realdata.py``'s splits; with its paired difference to the default over
the test rows).

Usage::

    python bench/averaging.py run --cases BN-mix:10000:0 BN-mix:10000:1 msnbc --raw out.jsonl
    python bench/averaging.py report out.jsonl [more.jsonl ...]
    python bench/averaging.py parallel --roots OLD_TREE NEW_TREE --cases BN-mix:10000:0 --reps 3 --raw par.jsonl
    python bench/averaging.py parallel-report par.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from fsll_ooc import FSLL, FSLLAverage, datasets  # noqa: E402
from fsll_ooc import fitting  # noqa: E402
from fsll_ooc.learn import select  # noqa: E402
from quality import synthetic  # noqa: E402

KS = (4, 8)


def table_of(theta: list, log_z: float, cards) -> np.ndarray:
    """The normalised table of a model given as ``[[flat term, value], ...]``."""
    from fsll_ooc.kernels.transform import transform_inplace

    t = np.zeros(cards)
    for y, v in theta:
        t.reshape(-1)[int(y)] = v
    transform_inplace(t, transpose=True, first_use="reference")
    t -= t.max()
    np.exp(t, out=t)
    return t / t.sum()


class Capture:
    """Wraps :func:`fsll_ooc.learn.select.choose_scale` to keep the last choice made."""

    def __init__(self):
        self.last = None
        self._orig = select.choose_scale

    def __call__(self, *a, **k):
        self.last = self._orig(*a, **k)
        return self.last


def timed_fit(X, cards, start=None, **kw):
    """``FSLL(**kw).fit(X)`` and its seconds; ``start``: ``(scale, model)`` to fit under that
    scale from that model (:func:`fsll_ooc.fitting.start_of`) instead of choosing."""
    t0 = time.perf_counter()
    m = FSLL(cardinalities=cards, progress=False, **kw)
    choose = fitting.choose_penalty_scale
    if start is not None:
        fitting.choose_penalty_scale = lambda *a: select.ScaleChoice(start[0], start=start[1])
    try:
        m = m.fit(X)
    finally:
        fitting.choose_penalty_scale = choose
    return m, time.perf_counter() - t0


def load_case(case: str):
    """(X_train, cards, quality function of a probability table, label)."""
    if case in ("msnbc", "adult"):
        from realdata import DEFAULT_DATA, load_set

        tr, te, cards, _ = load_set(case, DEFAULT_DATA)
        flat = np.ravel_multi_index(tuple(te.T), cards)
        return tr, cards, (lambda p: np.log(p.reshape(-1)[flat])), case
    fam, n, seed = case.split(":")
    X, p_true = synthetic(fam, int(n), int(seed))
    return X, p_true.shape, (lambda p: datasets.kl_divergence(p_true, p)), case


KINDS = ("boot", "bootS", "half", "sub80", "sub80S", "sub80W", "FSLLAverage", "fold", "part")


def strongest(start: dict, share: float) -> dict:
    """The terms of ``start`` (:func:`fsll_ooc.fitting.start_of`) with the largest gains, the
    fraction ``share`` of them, with their values (a start the learner continues from)."""
    order = np.argsort(-np.asarray(start["gain"]), kind="stable")[: int(len(start["theta"]) * share)]
    keep = sorted(int(i) for i in order)
    return {"theta": [start["theta"][i] for i in keep], "log_z": start["log_z"],
            "gain": [start["gain"][i] for i in keep]}


def fold_member(X, cards, train, held, start=None):
    """The ``fold`` member: ``FSLL(penalty_scale=1)`` on ``X[train]``, continued under 1/2 as
    the scale choice continues its sub-fit; the model of the scale whose mean log-likelihood
    of ``X[held]`` is higher (ties to 1), as a table.  ``start``: the fit under scale 1 starts
    from that model (:func:`fsll_ooc.fitting.warm_start`) instead of the uniform one."""
    from fsll_ooc.learn import learn

    if start is None:
        sub = FSLL(cardinalities=cards, progress=False, penalty_scale=1.0).fit(X[train])
    else:
        sub, _ = timed_fit(X[train], cards, start=(1.0, start))
    models = [(float(np.mean(sub.log_prob(X[held]))), np.asarray(sub.probabilities()).reshape(cards))]
    state, specs = sub._state, sub._engine.ctx.specs
    state.set_penalty_scale(0.5)
    state.converged = False
    engine = fitting.make_engine(sub, sub.plan_, specs, state.n_samples, penalty_scale=0.5)
    learn(engine, state, fitting.options(sub), fresh=False)
    fitting.set_fitted(sub, state, plan=sub.plan_, engine=engine)
    score = float(np.mean(sub.log_prob(X[held])))
    return np.asarray(sub.probabilities()).reshape(cards) if score > models[0][0] else models[0][1]


def run_case(case: str, out, k_max: int = max(KS), kinds=KINDS):
    X, cards, quality, label = load_case(case)
    N = len(X)
    cap = Capture()
    select.choose_scale = cap
    c0 = time.process_time()
    try:
        m0, t0 = timed_fit(X, cards)
    finally:
        select.choose_scale = cap._orig
    cpu0 = time.process_time() - c0
    part_cpu = {}
    p0 = np.asarray(m0.probabilities()).reshape(cards)
    s0 = float(m0.penalty_scale_)
    choice = cap.last
    rows = [("default", 1, [p0], t0)]
    if choice is not None and choice.start is not None:
        p_sub = table_of(choice.start["theta"], choice.start["log_z"], cards)
        rows.append(("choice2", 2, [p0, p_sub], t0))
    if "FSLLAverage" in kinds:
        t = time.perf_counter()
        avg = FSLLAverage(cardinalities=cards, progress=False).fit(X)
        rows.append(("FSLLAverage", avg.n_members_, [np.asarray(avg.probabilities()).reshape(cards)],
                     time.perf_counter() - t))
        kinds = [k for k in kinds if k != "FSLLAverage"]
    if "fold" in kinds:
        folds = np.array_split(np.random.default_rng([9, N]).permutation(N), 5)
        ps, secs = [], []
        for k in range(5):
            t = time.perf_counter()
            train = np.sort(np.concatenate([folds[j] for j in range(5) if j != k]))
            ps.append(fold_member(X, cards, train, np.sort(folds[k])))
            secs.append(time.perf_counter() - t)
        rows += [("fold4", 4, ps[:4], sum(secs[:4])), ("fold5", 5, ps, sum(secs))]
        kinds = [k for k in kinds if k != "fold"]
    if "part" in kinds:  # one fit under scale 1 on all rows; each member starts from its strongest half
        t, c = time.perf_counter(), time.process_time()
        shared = FSLL(cardinalities=cards, progress=False, penalty_scale=1.0).fit(X)
        start = strongest(fitting.start_of(shared._state), 0.5)
        ps, secs, cpu = [], [time.perf_counter() - t], [time.process_time() - c]
        for k in range(k_max):
            t, c = time.perf_counter(), time.process_time()
            sub80 = np.sort(np.random.default_rng([8, N, k]).permutation(N)[: 4 * N // 5])
            held = np.setdiff1d(np.arange(N), sub80)
            ps.append(fold_member(X, cards, sub80, held, start=start))
            secs.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        part_cpu = {K: sum(cpu[: K + 1]) for K in KS if K <= k_max}
        rows += [(f"part{K}", K, ps[:K], sum(secs[: K + 1])) for K in KS if K <= k_max]
        kinds = [k for k in kinds if k != "part"]
    members = {kind: [] for kind in kinds}
    times = {kind: [] for kind in kinds}
    rng = np.random.default_rng([7, N])  # member k's rows do not depend on the kinds run
    for k in range(k_max):
        idx = rng.integers(0, N, size=N)
        half = np.sort(rng.permutation(N)[: N // 2])
        sub80 = np.sort(np.random.default_rng([8, N, k]).permutation(N)[: 4 * N // 5])
        for kind, kw, rows_k in (("boot", {}, idx), ("bootS", {"penalty_scale": s0}, idx), ("half", {}, half),
                                 ("sub80", {}, sub80), ("sub80S", {"penalty_scale": s0}, sub80),
                                 ("sub80W", {"start": (s0, fitting.start_of(m0._state))}, sub80)):
            if kind not in kinds:
                continue
            m, t = timed_fit(X[rows_k], cards, **kw)
            members[kind].append(np.asarray(m.probabilities()).reshape(cards))
            times[kind].append(t)
    for K in (k for k in KS if k <= k_max):
        for kind in kinds:
            extra = t0 if kind in ("bootS", "sub80S", "sub80W") else 0.0
            rows.append((f"{kind}{K}", K, members[kind][:K], extra + sum(times[kind][:K])))
    load = os.getloadavg()[0]
    q0 = quality(p0)
    for name, K, ps, secs in rows:
        p = np.mean(ps, axis=0)
        q = quality(p)
        rec = {"case": label, "variant": name, "K": K, "seconds": secs, "default_seconds": t0, "scale": s0,
               "load": load, "n_terms_default": int(m0.n_bases_), "default_cpu": cpu0}
        if name.startswith("part"):
            rec["cpu"] = part_cpu[K]
        if isinstance(q, np.ndarray):  # held-out log-likelihood per test row
            d = q - q0
            rec.update(ll=float(q.mean()), ll_se=float(q.std(ddof=1) / np.sqrt(len(q))),
                       diff=float(d.mean()), diff_se=float(d.std(ddof=1) / np.sqrt(len(d))))
        else:
            rec["kl"] = float(q)
        print(json.dumps(rec), flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()


VARIANTS = ("default", "choice2", "boot4", "boot8", "bootS4", "bootS8", "half4", "half8", "sub804", "sub808",
            "sub80S4", "sub80S8", "sub80W4", "sub80W8", "FSLLAverage", "fold4", "fold5", "part4", "part8")


def _label(v: str) -> str:
    for K in KS:
        if v.endswith(str(K)) and v[: -len(str(K))] in KINDS:
            return f"{v[: -len(str(K))]} {K}"
    return v


def _data(key: str) -> str:
    if ":" not in key:
        return key
    fam, n = key.split(":")
    return f"{fam} N=1e{int(round(np.log10(int(n))))}"


def report(paths) -> None:
    """Markdown tables over the raw files: quality per data set and variant (mean over the
    seeds run; the real data's paired difference to the default), seconds, and KL per seed.
    A data set whose variants ran on different seeds gets one row per set of seeds, each
    with the variants run on all of them (means over the same seeds only)."""
    groups: dict = {}  # data -> variant -> seed -> record; the first record counts
    for path in paths:
        for line in open(path):
            if line.strip():
                r = json.loads(line)
                data, _, seed = r["case"].rpartition(":") if ":" in r["case"] else (r["case"], "", "—")
                groups.setdefault(data, {}).setdefault(r["variant"], {}).setdefault(seed, r)
    cols = [v for v in VARIANTS if any(v in g for g in groups.values())]
    rows = []  # (data, seeds, {variant: [records]})
    for data, by in groups.items():
        for seeds in sorted({tuple(sorted(s)) for s in by.values()}, key=len, reverse=True):
            rows.append((data, seeds, {v: [by[v][s] for s in seeds] for v in by if set(seeds) <= set(by[v])}))

    def quality(v, rs):
        if "kl" in rs[0]:
            return f"{np.mean([r['kl'] for r in rs]):.4f}"
        return f"{rs[0]['ll']:.4f}" if v == "default" else f"{rs[0]['diff']:+.4f} ± {rs[0]['diff_se']:.4f}"

    def seconds(v, rs):
        if v == "default":
            return f"{np.mean([r['seconds'] for r in rs]):.1f}"
        return f"{np.mean([r['seconds'] / r['default_seconds'] for r in rs]):.1f}x"

    for title, cell in (("Quality: KL(p*||p) (mean over the seeds), real data: held-out log-likelihood gain over "
                         "the default [nats/row] ± SE (paired)", quality),
                        ("Seconds (mean over the seeds; the default's, then each variant's over the default's)",
                         seconds)):
        print(f"{title}\n\n| data | seeds | " + " | ".join(_label(v) for v in cols) + " |")
        print("|---|---|" + "---|" * len(cols))
        for data, seeds, by in rows:
            cells = [cell(v, by[v]) if v in by else "" for v in cols]
            print(f"| {_data(data)} | {' '.join(seeds)} | " + " | ".join(cells) + " |")
        print()
    print("Per seed (KL): default / sub80 4 / sub80 8\n")
    for data, by in groups.items():
        if "sub804" in by and "kl" in next(iter(by["default"].values())):
            per = [f"seed {s}: " + " / ".join(f"{by[v][s]['kl']:.4f}" if s in by.get(v, {}) else "—"
                                               for v in ("default", "sub804", "sub808")) for s in sorted(by["default"])]
            print(f"* {_data(data)}: " + "; ".join(per))


# One timed fit in a fresh interpreter on the code of ROOT (argv: root, data .npz, variant
# as JSON).  It imports the package and fits a small table first (the kernels loaded, as in
# a session after its first fit), then times the fit: wall-clock, this process's CPU
# seconds and those of the processes it started and waited for (worker processes).
_ONE = """import hashlib, json, resource, sys, time
root, data, variant = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, root)
import numpy as np
from fsll_ooc import FSLL, FSLLAverage, datasets
d = np.load(data)
X, p_true = d["X"], d["p"]
cards = p_true.shape
FSLL(progress=False).fit(np.random.default_rng(0).integers(0, 3, size=(200, 6)))
try:  # a child the warm-up started to compile kernels ends before the timing (its CPU is not the fit's)
    from fsll_ooc.kernels import ahead
    for _, child in list(ahead._children.values()):
        child.wait()
except Exception:
    pass
kind, kw = variant
make = FSLL if kind == "fit" else FSLLAverage
child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
t0, c0 = time.perf_counter(), time.process_time()
m = make(progress=False, cardinalities=cards, **kw).fit(X)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
kids = (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)
members = getattr(m, "members_", [m])
digest = hashlib.sha1(repr([sorted(mm.theta_.items()) for mm in members]).encode()).hexdigest()[:12]
kl = float(datasets.kl_divergence(p_true, np.asarray(m.probabilities()).reshape(cards)))
print(json.dumps({"wall": wall, "cpu": cpu, "cpu_children": kids, "K": len(members), "members": digest, "kl": kl}))
"""

#: The variants of ``parallel``: (label, root index (0 old, 1 new), class, parameters).
PAR_VARIANTS = (("FSLL()", 1, "fit", {}),
                ("old FSLLAverage()", 0, "avg", {}),
                ("new FSLLAverage()", 1, "avg", {}),
                ("old FSLLAverage(n_jobs=2)", 0, "avg", {"n_jobs": 2}),
                ("new FSLLAverage(n_jobs=2)", 1, "avg", {"n_jobs": 2}))


def parallel(cases, reps: int, roots, raw) -> None:
    """``FSLL()`` against ``FSLLAverage()`` of two trees (``roots``: old, new), each fit in a
    fresh interpreter (after a warm-up fit), interleaved (the variants' order turns with the
    repetition), with the 1-minute load before each; wall-clock seconds, CPU seconds of the
    fitting process and of its worker processes, the cores used (CPU over wall-clock), KL to
    the true distribution, and a digest of the members' terms (the same members in both
    trees and whatever ``n_jobs``)."""
    import tempfile

    commits = [subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=r, capture_output=True,
                              text=True).stdout.strip() for r in roots]
    print(f"old {roots[0]} at {commits[0]}, new {roots[1]} at {commits[1]}; {os.uname().nodename}, "
          f"{os.cpu_count()} cores", flush=True)
    out = open(raw, "a") if raw else None
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for case in cases:
            X, p_true = synthetic(*case.split(":")[:1], *map(int, case.split(":")[1:]))
            files[case] = os.path.join(tmp, case.replace(":", "_") + ".npz")
            np.savez(files[case], X=X, p=p_true)
        print("| data | rep | variant | s wall | CPU s (fit process + workers) | cores used | KL | members | load |\n"
              "|---|---|---|---|---|---|---|---|---|", flush=True)
        for root in dict.fromkeys(roots):  # numba's cache of each tree filled before anything is timed
            subprocess.run([sys.executable, "-c", _ONE, root, files[cases[0]], json.dumps(["avg", {"n_members": 2}])],
                           capture_output=True, check=True)
        for rep in range(reps):
            for case in cases:
                order = list(PAR_VARIANTS)
                order = order[rep % len(order):] + order[: rep % len(order)]
                for label, root, kind, kw in order:
                    load = os.getloadavg()[0]
                    res = subprocess.run([sys.executable, "-c", _ONE, roots[root], files[case], json.dumps([kind, kw])],
                                         capture_output=True, text=True)
                    if res.returncode:
                        raise SystemExit(res.stderr)
                    r = json.loads(res.stdout.strip().splitlines()[-1])
                    cpu = r["cpu"] + r["cpu_children"]
                    print(f"| {case} | {rep} | {label} | {r['wall']:.2f} | {cpu:.2f} ({r['cpu']:.2f} + "
                          f"{r['cpu_children']:.2f}) | {cpu / r['wall']:.2f} | {r['kl']:.4f} | {r['K']} {r['members']} | "
                          f"{load:.1f} |", flush=True)
                    if out:
                        out.write(json.dumps(dict(r, case=case, rep=rep, variant=label, load=load,
                                                  commit=commits[root])) + "\n")
                        out.flush()


def parallel_report(paths) -> None:
    """Per case and variant: median wall-clock and CPU seconds over the repetitions, and
    both over ``FSLL()``'s of the same repetition (median of the ratios)."""
    rows = [json.loads(line) for p in paths for line in open(p) if line.strip()]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    labels = [v[0] for v in PAR_VARIANTS]
    print("| data | variant | K | s wall | / FSLL() | CPU s | / FSLL() | cores used | KL | reps | load |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        fit = {r["rep"]: r for r in rows if r["case"] == case and r["variant"] == "FSLL()"}
        for v in labels:
            rs = [r for r in rows if r["case"] == case and r["variant"] == v and r["rep"] in fit]
            if not rs:
                continue
            cpu = [r["cpu"] + r["cpu_children"] for r in rs]
            wr = [r["wall"] / fit[r["rep"]]["wall"] for r in rs]
            cr = [(r["cpu"] + r["cpu_children"]) / (fit[r["rep"]]["cpu"] + fit[r["rep"]]["cpu_children"]) for r in rs]
            print(f"| {case} | {v} | {rs[0]['K']} | {np.median([r['wall'] for r in rs]):.2f} | {np.median(wr):.2f}x | "
                  f"{np.median(cpu):.2f} | {np.median(cr):.2f}x | {np.median([c / r['wall'] for c, r in zip(cpu, rs)]):.2f} | "
                  f"{rs[0]['kl']:.4f} | {len(rs)} | {min(r['load'] for r in rs):.1f}-{max(r['load'] for r in rs):.1f} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--cases", nargs="+", required=True, help="FAMILY:N:SEED (BN-mix, Potts-mix), msnbc or adult")
    r.add_argument("--raw", required=True, help="JSON lines appended to")
    r.add_argument("--k-max", type=int, default=max(KS))
    r.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    rp = sub.add_parser("report")
    rp.add_argument("raw", nargs="+")
    tp = sub.add_parser("parallel", help="wall-clock and CPU seconds of FSLLAverage() of two trees against one "
                                         "FSLL() fit, interleaved, each fit in a fresh interpreter")
    tp.add_argument("--cases", nargs="+", default=["BN-mix:10000:0", "BN-mix:1000:0"])
    tp.add_argument("--reps", type=int, default=2)
    tp.add_argument("--roots", nargs=2, default=[ROOT, ROOT], metavar=("OLD", "NEW"),
                    help="trees whose fsll_ooc is timed (old, new)")
    tp.add_argument("--raw", help="JSON lines appended to")
    tpr = sub.add_parser("parallel-report", help="medians over the repetitions of parallel's raw files")
    tpr.add_argument("raw", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "report":
        report(a.raw)
        return
    if a.cmd == "parallel":
        parallel(a.cases, a.reps, a.roots, a.raw)
        return
    if a.cmd == "parallel-report":
        parallel_report(a.raw)
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}, load {os.getloadavg()}", flush=True)
    FSLL(progress=False).fit(np.random.default_rng(0).integers(0, 3, size=(200, 6)))  # compile kernels
    with open(a.raw, "a") as out:
        for case in a.cases:
            run_case(case, out, a.k_max, a.kinds)


if __name__ == "__main__":
    main()
