"""Learning: the paper's greedy algorithm over any engine, and the fully corrective steps."""
from . import corrective, greedy  # noqa: F401
from .greedy import *  # noqa: F401,F403
from .greedy import __all__  # noqa: F401
