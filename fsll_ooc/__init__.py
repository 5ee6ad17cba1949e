"""fsll-ooc: full-span log-linear models of discrete data, in core or out of core.

>>> from fsll_ooc import FSLL, datasets
>>> X, p_true = datasets.paper_dataset("Ising5x4S", seed=0)
>>> X.shape, p_true.shape == (2,) * 20
((1000, 20), True)
"""
__version__ = "0.1.0"

from . import datasets  # noqa: E402
from .estimator import FSLL  # noqa: E402
from .average import FSLLAverage  # noqa: E402
from .planner import PlanError, plan  # noqa: E402

__all__ = ["FSLL", "FSLLAverage", "datasets", "plan", "PlanError", "__version__"]
