"""Fingerprint of the learner's results, to check that a refactor or a speed-up keeps the bits.

Fits the paper's six datasets at ``epsilon=1e-4`` (the paper's algorithm) and at the
default, plus short out-of-core fits on both persistent backends and two default fits large
enough to take several terms per pass (``batched/22``: ``bench/learner.py``'s 2^22 binary
network; ``batched/survey``: its survey-like table of mixed cardinalities under the family
code), and prints (or writes) each fit's cost, iterations, terms, log Z and KL(p_d || p_theta)
as exact reprs (the batched rows also a digest of the terms, their values and the search's
history, and the penalty scale's held-out scores).
Compare two runs with ``diff``:

    python bench/fingerprint.py /tmp/after.json && diff docs/data/fingerprint/reference.json /tmp/after.json

``docs/data/fingerprint/reference.json`` holds the figures of the code before the package
restructuring (commit 42d3508), with the default's rows (``/auto``) since the fit on all
rows starts from the penalty scale's held-out model (``docs/design.md``, "Choosing the
penalty scale"; the rows at ``epsilon=1e-4`` and out of core are unchanged); every change since that did not mean to
change results reproduces it exactly.  The ``/auto`` rows were written again, unchanged in
code, at d76f901 on a fresh install of the dependencies (numpy 2.4.6, numba 0.68.1): their last
one or two digits follow the libraries' floating point and the processor (numba compiles for the
machine it runs on: on an AMD EPYC VM with AVX-512, five of the six ``/auto`` rows differ from
the reference, written on an Intel Xeon, in their last one to three digits, the same
iterations and terms), the paper-rule rows do not.  So a change is checked against a
fingerprint of the code before it taken on the same machine.  The
``BN20-37L/auto`` and ``BN20-54L/auto`` rows moved in their last two or three digits (the same
iterations and terms) when a corrective phase's last Newton round became the dual table's
re-derivation and the joint selection began to read its product cells as they are.
The ``batched/*`` rows were written on the AMD EPYC VM when they were added (before them, no
row took a batch: the paper's tables have 2^20 cells, below ``fsll_ooc.learn.batch.AUTO_MIN_CELLS``).  Takes 2-3 minutes on an idle 2-core machine.
"""
import argparse
import hashlib
import json
import tempfile

from learner import case_data  # bench/learner.py, beside this script

from fsll_ooc import FSLL, datasets

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                             epilog="Prints the fingerprint as JSON; with OUT also writes it there.")
ap.add_argument("out", nargs="?", metavar="OUT", help="file to write the fingerprint to (replaced)")
args = ap.parse_args()

out = {}
for name in datasets.PAPER_DATASETS:
    X, _ = datasets.paper_dataset(name, seed=0)
    for eps in (1e-4, "auto"):
        m = FSLL(epsilon=eps, progress=False).fit(X)
        out[f"{name}/{eps}"] = [repr(m.cost_), m.n_iter_, m.n_bases_, repr(m.log_z_), repr(m.kl_data_)]
X, _ = datasets.paper_dataset("BN20-37S", seed=0)
for backend in ("memmap", "zarr"):
    with tempfile.TemporaryDirectory() as d:
        m = FSLL(epsilon=1e-4, store=d + "/s", backend=backend, memory_limit="1GiB", progress=False,
                 layout=(3, 10), max_iter=40).fit(X)
        out[f"ooc/{backend}"] = [repr(m.cost_), m.n_iter_, m.n_bases_, repr(m.log_z_)]
for case in ("22", "survey"):
    X, _, cards = case_data(case)
    m = FSLL(cardinalities=cards, progress=False).fit(X)
    st = m.fit_state_
    digest = hashlib.sha256(repr((sorted(st.theta.items()), [{k: v for k, v in e.items() if k != "time"}
                                                              for e in st.history])).encode()).hexdigest()[:32]
    out[f"batched/{case}"] = [repr(m.cost_), m.n_iter_, m.n_bases_, repr(m.log_z_), repr(m.kl_data_), digest,
                              repr(m.penalty_scale_scores_)]
text = json.dumps(out, indent=1)
if args.out:
    with open(args.out, "w") as fh:
        fh.write(text)
print(text)
