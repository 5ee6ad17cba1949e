"""The joint-selection rules of batched fits on and off, in one tree: held-out log-likelihood,
terms and time of a default fit of a ``bench/learner.py`` case.

``python bench/joint_rules.py CASE SETTING [SETTING ...]``: CASE as ``bench/learner.py``'s
(``24``, ``26``, ``28``: ``bench/scale.py``'s binary networks, in core; ``survey``, ...);
each SETTING ``on`` (``JOINT_MIN_SCHUR = 1e-4``, ``JOINT_SETTLE_GAIN = 100``, the defaults)
or ``off`` (``0`` and ``None``), one fit each, in this process, a JSON line each.  In core a
2^28 fit needs about 14 GiB of memory.
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402

import fsll_ooc.learn.corrective as C  # noqa: E402
from fsll_ooc import FSLL  # noqa: E402
from learner import case_data  # noqa: E402


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or any(s not in ("on", "off") for s in argv[1:]):
        print(__doc__)
        return 2
    case = argv[0]
    Xtr, Xte, cards = case_data(case)
    for setting in argv[1:]:
        C.JOINT_MIN_SCHUR, C.JOINT_SETTLE_GAIN = (1e-4, 100.0) if setting == "on" else (0.0, None)
        t = time.perf_counter()
        m = FSLL(cardinalities=cards, progress=False).fit(Xtr)
        dt = time.perf_counter() - t
        print(json.dumps({"case": case, "rules": setting, "s": round(dt, 2), "ll": float(np.mean(m.log_prob(Xte))),
                          "terms": int(m.n_bases_), "iters": int(m.n_iter_)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
