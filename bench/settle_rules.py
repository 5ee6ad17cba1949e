"""The settle rules of batched fits' corrective phases on and off, in one tree: held-out
log-likelihood, terms, table operations and Newton rounds of default fits.

``python bench/settle_rules.py [--cases CASE ...] [--seeds S ...] [--settings on off] [--detail]``

CASE as ``bench/learner.py``'s (``survey`` by default; ``22``, ``24``: ``bench/scale.py``'s binary
networks, in core); ``--seeds``: the tables of a survey-like case (``strong_bn``'s seed; 0 is
``bench/learner.py``'s table); each SETTING ``on`` (the module constants at their defaults) or
``off`` (:data:`fsll_ooc.learn.corrective.BATCH_SETTLE_GAIN` and
:data:`fsll_ooc.learn.corrective.FIRST_ROUND_MAX_STEP` None) or ``NAME=VALUE[,NAME=VALUE]`` of
that module's constants, one fit each, in this process, a JSON line each: held-out LL, terms,
table passes and compute sweeps of the whole fit (the penalty scale's sub-fits included; by
purpose), and the corrective phases' rounds and trials by purpose (``batch-refine``,
``refine``, ``joint``).  ``--detail`` also prints every phase's rounds, trials and Newton
decrements.
"""
import argparse
import json
import os
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402

import fsll_ooc.learn.corrective as C  # noqa: E402
from fsll_ooc import FSLL  # noqa: E402
from learner import case_data  # noqa: E402

DEFAULTS = {name: getattr(C, name) for name in dir(C) if name.isupper()}
OFF = {"BATCH_SETTLE_GAIN": None, "FIRST_ROUND_MAX_STEP": None}


def apply(setting: str) -> None:
    """Set the module constants of ``setting`` (``on``, ``off`` or ``NAME=VALUE[,NAME=VALUE]``)."""
    values = DEFAULTS if setting == "on" else OFF if setting == "off" else \
        {k: eval(v) for k, v in (kv.split("=") for kv in setting.split(","))}
    for name, v in values.items():
        if hasattr(C, name):
            setattr(C, name, v)


def _traced():
    """Wrap ``refine`` and ``_solve`` to record each phase's purpose, rounds, trials and decrements."""
    log = []
    refine, solve = C.refine, C._solve
    cur = []

    def solve_t(H, g, memo=None):
        x = solve(H, g, memo)
        if cur and g.ndim == 1:
            cur[-1]["dec"].append(float(0.5 * (g @ x)))
        return x

    def refine_t(engine, state, **kw):
        rec = {"purpose": engine.purpose, "dec": [], "m": len(state.theta)}
        cur.append(rec)
        s0, p0 = engine.sweeps, engine.passes
        try:
            rr = refine(engine, state, **kw)
        finally:
            cur.pop()
        rec.update(rounds=rr.rounds, trials=rr.trials, sweeps=engine.sweeps - s0, passes=engine.passes - p0,
                   delta=rr.delta)
        log.append(rec)
        return rr

    C.refine, C._solve = refine_t, solve_t
    return log


def _counted():
    """Count every engine's passes and sweeps by purpose (the penalty scale's sub-fits included)."""
    from fsll_ooc.engine import engine as E

    counts = Counter()
    run_ = E.Engine._run

    def run_t(self, kind, fn, argfn, reduce=True, sweep=False):
        counts[("sweep" if sweep else "pass", self.purpose or "other")] += 1
        return run_(self, kind, fn, argfn, reduce, sweep)

    E.Engine._run = run_t
    return counts, lambda: setattr(E.Engine, "_run", run_)


def run(case, seed, setting, detail):
    Xtr, Xte, cards = case_data(case, seed) if seed else case_data(case)
    apply(setting)
    log = _traced()
    counts, undo = _counted()
    t = time.perf_counter()
    try:
        m = FSLL(cardinalities=cards, progress=False).fit(Xtr)
    finally:
        undo()
    dt = time.perf_counter() - t
    passes = sum(n for (k, _), n in counts.items() if k == "pass")
    sweeps = sum(n for (k, _), n in counts.items() if k == "sweep")
    rounds, trials, phases = Counter(), Counter(), Counter()
    for r in log:
        rounds[r["purpose"]] += r["rounds"]
        trials[r["purpose"]] += r["trials"]
        phases[r["purpose"]] += 1
    out = {"case": case, "seed": seed, "rules": setting, "s": round(dt, 2),
           "ll": float(np.mean(m.log_prob(Xte))), "cost": float(m.cost_), "scale": float(m.penalty_scale_),
           "terms": int(m.n_bases_), "iters": int(m.n_iter_),
           "passes": passes, "sweeps": sweeps, "ops": passes + sweeps,
           "passes_by": {p: n for (k, p), n in sorted(counts.items()) if k == "pass"},
           "sweeps_by": {p: n for (k, p), n in sorted(counts.items()) if k == "sweep"},
           "phases": dict(phases), "rounds": dict(rounds), "trials": dict(trials)}
    print(json.dumps(out), flush=True)
    if detail:
        for r in log:
            print(f"  {r['purpose']:<14} m={r['m']:4d} rounds={r['rounds']} trials={r['trials']} "
                  f"sw={r['sweeps']} pa={r['passes']} delta={r['delta']:.3e} dec=" +
                  " ".join(f"{d:.2e}" for d in r["dec"]), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["survey"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--settings", nargs="+", default=["on", "off"],
                    help="on, off, or NAME=VALUE[,NAME=VALUE] of the module's constants")
    ap.add_argument("--detail", action="store_true")
    args = ap.parse_args(argv)
    refine, solve = C.refine, C._solve
    for case in args.cases:
        for seed in (args.seeds if case == "survey" else [0]):
            for setting in args.settings:
                run(case, seed, setting, args.detail)
                C.refine, C._solve = refine, solve
                for name, v in DEFAULTS.items():
                    setattr(C, name, v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
