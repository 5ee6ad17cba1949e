"""The engine: turns the learner's whole-table requests into band tasks over the planned layout."""
from .engine import *  # noqa: F401,F403
from .engine import __all__  # noqa: F401
