"""The tail rule of batched fits (a joint selection when batches stop paying) on and off, in one
tree: held-out log-likelihood, terms, table operations and joint selections of default fits.

``python bench/tail_rule.py [--cases CASE ...] [--seeds S ...] [--settings F ...] [--scale CASE ...]``

Each SETTING is a value of :data:`fsll_ooc.learn.corrective.JOINT_TAIL_FACTOR` (``None``: off)
or ``NAME=VALUE[,NAME=VALUE]`` of that module's constants.  ``--cases``/``--seeds``: as
``bench/settle_rules.py`` (in core, one process; ``survey`` tables by seed, ``22``/``24``
``bench/scale.py``'s binary networks); one JSON line per fit: held-out LL, cost, terms, table
passes and sweeps by purpose (the penalty scale's sub-fits included), and the joint selections
tried (``joints``), appended (``joints_kept``) and of them tried by the rule (``rule_joints``,
``rule_kept``).  ``--scale CASE``: ``bench/scale.py``'s case out of core (``memmap``, the
library's defaults, ``--cap``, default 4 GiB, under ``--dir``), one child process per setting,
the same figures plus the fit's wall time and held-out KL estimate.  ``--scale-args ARG ...``
(last): one ``bench/scale.py`` child in this process with the first SETTING, e.g. a stored
fit resumed with the rule on (as root the process moves itself into a memory cgroup of ``--cap``,
``fsll_bench_PID``, left empty at its end: ``rmdir`` it)::

    python bench/tail_rule.py --settings 4 --scale-args --child bn30 --dir DIR --backend memmap \
        --epsilon auto --cap 4GiB --resume --keep --progress
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import settle_rules  # noqa: E402

import fsll_ooc.learn.corrective as C  # noqa: E402
from fsll_ooc.learn import greedy as G  # noqa: E402


def _setting(setting: str) -> str:
    """A setting as ``bench/settle_rules.py`` reads it."""
    return setting if "=" in setting else f"JOINT_TAIL_FACTOR={setting}"


def _apply(setting: str) -> None:
    settle_rules.apply(_setting(setting))


def _joints():
    """Count the joint selections tried and kept, and those the rule tried."""
    counts = Counter()
    joint, due = G.Search.joint, G.Search.joint_due

    def due_t(self):
        d = due(self)
        self._rule_now = d
        return d

    def joint_t(self):
        rule = getattr(self, "_rule_now", False)
        self._rule_now = False
        r = joint(self)
        counts["joints"] += 1
        counts["joints_kept"] += r is not None
        counts["rule_joints"] += rule
        counts["rule_kept"] += rule and r is not None
        return r

    G.Search.joint, G.Search.joint_due = joint_t, due_t
    return counts, lambda: (setattr(G.Search, "joint", joint), setattr(G.Search, "joint_due", due))


def in_core(case, seed, setting):
    counts, undo = _joints()
    refine, solve = C.refine, C._solve
    try:
        out = settle_rules.run(case, seed, _setting(setting), False)
    finally:
        undo()
        C.refine, C._solve = refine, solve
    print(json.dumps({"case": case, "seed": seed, "setting": setting, **dict(counts)}), flush=True)
    return out


def scale_child(case, setting, directory, cap):
    import scale

    _apply(setting)
    counts, _ = _joints()
    ops, _ = settle_rules._counted()
    scale.main(["--child", case, "--dir", directory, "--backend", "memmap", "--epsilon", "auto", "--cap", cap])
    print("TAIL " + json.dumps({**dict(counts), "passes_all": sum(n for (k, _), n in ops.items() if k == "pass"),
                                "sweeps_all": sum(n for (k, _), n in ops.items() if k == "sweep")}), flush=True)


def out_of_core(case, setting, directory, cap):
    import scale

    cmd = [sys.executable, __file__, "--scale-child", case, "--settings", setting, "--dir", directory, "--cap", cap]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    text, _ = proc.communicate()
    scale.remove_cgroup(proc.pid)
    res = [json.loads(l[7:]) for l in text.splitlines() if l.startswith("RESULT ")]
    tail = [json.loads(l[5:]) for l in text.splitlines() if l.startswith("TAIL ")]
    if not res or not tail:
        print(json.dumps({"case": case, "setting": setting, "failed": text[-2000:]}), flush=True)
        return
    r, t = res[0], tail[0]
    out = {"case": case, "setting": setting, "s": round(r["fit_seconds"], 1), "ll": r["heldout_loglik"],
           "kl": r["kl_heldout"], "kl_data": r["kl_data"], "terms": r["n_bases"], "iters": r["n_iter"], "converged": r["converged"],
           "fit_passes": r["fit_passes"], "fit_sweeps": r["fit_sweeps"],
           "fit_ops": r["fit_passes"] + r["fit_sweeps"], "ops": t["passes_all"] + t["sweeps_all"],
           "passes_by": r["fit_passes_by"], "scale": r["penalty_scale"], "cgroup_peak": r["cgroup_peak"],
           **{k: v for k, v in t.items()}}
    print(json.dumps(out), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=[])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--settings", nargs="+", default=["None", "4"])
    ap.add_argument("--scale", nargs="*", default=[])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--cap", default="4GiB")
    ap.add_argument("--scale-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--scale-args", nargs=argparse.REMAINDER, default=None,
                    help="run bench/scale.py's main with these arguments, in this process, under the first setting")
    args = ap.parse_args(argv)
    if args.scale_args is not None:
        import scale

        _apply(args.settings[0])
        return scale.main(args.scale_args)
    if args.scale_child:
        return scale_child(args.scale_child, args.settings[0], args.dir, args.cap)
    for case in args.cases:
        for seed in (args.seeds if case == "survey" else [0]):
            for setting in args.settings:
                in_core(case, seed, setting)
                for name, v in settle_rules.DEFAULTS.items():
                    setattr(C, name, v)
    for case in args.scale:
        for setting in args.settings:
            with tempfile.TemporaryDirectory(dir=args.dir) as d:
                out_of_core(case, setting, d, args.cap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
