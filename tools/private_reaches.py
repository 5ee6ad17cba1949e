"""Count the tests' reaches into private names of the package: ``obj._name`` attribute
reads and writes, ``from fsll_ooc... import _name``, and ``setattr``/``monkeypatch.setattr``
of a ``"_name"`` string (dunder names and the tests' own helpers are not counted).

    python tools/private_reaches.py [tests-dir]     # totals, then each name with its count
"""
from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def reaches(tests: Path) -> collections.Counter:
    """``Counter({(file, name): count})`` of private reaches in the test files under ``tests``."""
    out = collections.Counter()
    for path in sorted(tests.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        own |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                out[(path.name, node.attr)] += 1
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fsll_ooc"):
                for a in node.names:
                    if _private(a.name):
                        out[(path.name, a.name)] += 1
            elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
                  and getattr(node.func, "attr", getattr(node.func, "id", "")) == "setattr"
                  and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
                out[(path.name, node.args[1].value)] += 1
        for key in [k for k in out if k[0] == path.name and k[1] in own]:
            del out[key]  # the test module's own helpers
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    tests = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "tests"
    r = reaches(tests)
    by_name = collections.Counter()
    for (_, name), n in r.items():
        by_name[name] += n
    files = {f for f, _ in r}
    print(f"{sum(r.values())} private reaches in {len(files)} test files, {len(by_name)} distinct names")
    for name, n in by_name.most_common():
        print(f"  {n:3d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
