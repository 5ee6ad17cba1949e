"""The package's structure, read from its code by ``tools/import_graph.py``: no import
circles, no import from a lower layer to a higher one, every module in a declared layer,
and no module taking another module's private names."""
import importlib.util
from pathlib import Path

_TOOL = Path(__file__).resolve().parent.parent / "tools" / "import_graph.py"
_spec = importlib.util.spec_from_file_location("import_graph", _TOOL)
graph_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(graph_tool)

#: Private names still shared across modules, each with its reason.
ALLOWED_PRIVATE: set = set()


def test_graph_sees_the_package():
    g = graph_tool.edges()
    assert {"estimator", "validation", "storage.memmap", "learn.greedy", "cli"} <= set(g)
    assert "validation" in g["io"] and "learn" in g["estimator"]  # module-level and package imports


def test_no_import_circles():
    assert graph_tool.circles(graph_tool.edges()) == []


def test_no_upward_imports():
    assert graph_tool.upward(graph_tool.edges()) == []


def test_every_module_has_a_layer():
    assert graph_tool.unplaced(graph_tool.edges()) == []


def test_no_private_names_across_modules():
    assert set(graph_tool.private_uses()) - ALLOWED_PRIVATE == set()


def test_the_tool_finds_a_circle_and_an_upward_import():
    g = {"planner": {"learn.batch"}, "learn.batch": {"planner"}, "cost": set()}
    assert graph_tool.circles(g) == [["learn.batch", "planner"]]
    assert graph_tool.upward(g) == [("planner", "learn.batch")]


def test_the_estimator_class_stays_thin():
    """``FSLL`` keeps the scikit-learn surface; how a fit runs, queries, persistence and EM
    live in their own modules (``fitting``, ``queries``, ``model_file``, ``missing``)."""
    import ast
    import inspect

    from fsll_ooc import estimator

    cls = next(n for n in ast.parse(inspect.getsource(estimator)).body
               if isinstance(n, ast.ClassDef) and n.name == "FSLL")
    assert cls.end_lineno - cls.lineno + 1 <= 450
