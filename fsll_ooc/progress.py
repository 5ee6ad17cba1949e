"""Progress bars in a user's words: what a fit is doing, how far it is, and about how long is left.

* :class:`FitProgress` wraps the fit's bar (tqdm): the iteration count (continuing from
  the store's count when a fit is resumed), the number of terms, the cost and, once a few
  iterations have run, an estimate of the time left;
* :func:`pass_words` names a pass over the tables of an out-of-core fit ("updating
  tables, scanning candidates") instead of the function that runs it.

How the time left is estimated: the learner stops when the best move gains less than
``epsilon`` (nats per sample).  The gains of the recent iterations (the cost decreases)
shrink roughly geometrically, so a straight line through ``log(gain)`` against the
iteration, over the last :data:`WINDOW` iterations, says after how many more iterations
the gain reaches ``epsilon``; times the recent seconds per iteration, that is the time
left.  It is shown as ``~`` and only while the gains shrink (a rough guide, not a promise:
the corrective steps and the closing joint selection add iterations it cannot foresee).
"""
from __future__ import annotations

import math
import sys
import time
from collections import deque

__all__ = ["FitProgress", "pass_words", "estimate_iterations_left", "WINDOW"]

#: Iterations the time-left estimate looks back on (and needs before it is shown).
WINDOW = 12

_PASS_WORDS = {
    "task_fill": "writing tables",
    "task_map": "transforming tables",
    "task_uniform_duals": "starting tables",
    "task_update_scan": "updating tables, scanning candidates",
    "task_partner": "updating tables",
    "task_top_candidates": "scanning candidates",
}


def pass_words(fn) -> str:
    """What a pass running ``fn`` over the tables does, in a user's words."""
    name = getattr(fn, "__name__", "")
    return _PASS_WORDS.get(name, "working on tables")


def estimate_iterations_left(gains, epsilon: float) -> float | None:
    """Iterations until the gain falls below ``epsilon``, from the recent ``gains`` (a
    line through their logarithms); None when they do not shrink or are too few."""
    g = [(i, math.log(v)) for i, v in enumerate(gains) if v > 0]
    if len(g) < max(4, len(gains) // 2) or epsilon <= 0:
        return None
    n = len(g)
    mx = sum(i for i, _ in g) / n
    my = sum(y for _, y in g) / n
    sxx = sum((i - mx) ** 2 for i, _ in g)
    if sxx == 0:
        return None
    slope = sum((i - mx) * (y - my) for i, y in g) / sxx
    if slope >= 0:
        return None
    now = my + slope * (len(gains) - 1 - mx)
    left = (math.log(epsilon) - now) / slope
    return max(left, 0.0)


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class FitProgress:
    """The fit's progress bar: ``fitting: 123 iterations [terms 41, cost 0.3921, ~1m20s left]``.

    Takes what the learner gives a tqdm bar (``update``, ``set_postfix(cost=, bases=)``)
    and shows it in words.  ``start``: the iteration the fit resumes from.
    """

    def __init__(self, epsilon: float | None, start: int = 0, file=None, clock=time.perf_counter):
        from tqdm.auto import tqdm

        self.bar = tqdm(desc="fitting", unit=" iterations", initial=int(start), file=file or sys.stderr,
                        dynamic_ncols=True, bar_format="{desc}: {n_fmt}{unit} [{elapsed}{postfix}]")
        self.epsilon = epsilon
        self.clock = clock
        self.gains: deque = deque(maxlen=WINDOW)
        self.times: deque = deque(maxlen=WINDOW + 1)
        self.times.append(clock())
        self.cost = None
        self.left = None

    def update(self, n: int = 1) -> None:
        self.times.append(self.clock())
        self.bar.update(n)

    def set_postfix(self, cost=None, bases=None, refresh: bool = False, **_) -> None:
        c = float(cost) if cost is not None else None
        if c is not None and self.cost is not None:
            self.gains.append(self.cost - c)
        self.cost = c if c is not None else self.cost
        words = []
        if bases is not None:
            words.append(f"terms {bases}")
        if self.cost is not None:
            words.append(f"cost {self.cost:.4f}")
        if self.epsilon is not None and len(self.gains) >= WINDOW and len(self.times) > 1:
            its = estimate_iterations_left(list(self.gains), self.epsilon)
            per_it = (self.times[-1] - self.times[0]) / (len(self.times) - 1)
            if its is not None:
                words.append(f"~{_fmt_seconds(its * per_it)} left")
        self.bar.set_postfix_str(", ".join(words), refresh=refresh)

    def close(self) -> None:
        self.bar.close()
