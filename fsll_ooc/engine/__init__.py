"""The engine: turns the learner's whole-table requests into band tasks over the planned layout.

``engine`` holds the :class:`Engine` (the passes the learner asks for; build one with
:meth:`Engine.create`), ``tasks`` the band tasks and their picklable ``Context``,
``bands`` the band geometry.
"""
from .engine import PARALLEL_SCAN_MIN_CELLS, Engine, EngineStats
from .tasks import Context, ScanResult, Step, Table

__all__ = ["Engine", "EngineStats", "ScanResult", "Step", "Table", "Context", "PARALLEL_SCAN_MIN_CELLS"]
