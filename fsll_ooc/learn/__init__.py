"""Learning: the paper's greedy algorithm over any engine, and the fully corrective steps.

``state`` (:class:`FitState`, the sparse model of a fit), ``greedy`` (:func:`learn` and
its :class:`LearnOptions`), ``corrective`` (joint Newton phases and joint selection),
``batch`` (several steps per table pass), ``checks`` (the learner's invariants).
"""
from . import batch, checks, corrective, greedy, state  # noqa: F401
from .greedy import AUTO_C, REFINE_MODES, LearnOptions, auto_epsilon, learn, resolve_epsilon, resolve_refine
from .state import FitState

__all__ = ["FitState", "LearnOptions", "learn", "auto_epsilon", "resolve_epsilon", "resolve_refine", "AUTO_C",
           "REFINE_MODES"]
