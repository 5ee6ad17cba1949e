"""The package's import graph, read from the code: circles, imports that run upward, and
private names (``_x``) one module takes from another.

Every ``import`` of an ``fsll_ooc`` module counts, at module level or inside a function
(a lazy import is still a dependency).  ``LAYERS`` declares the order, lowest first; a
module may import its own layer or any layer below it.  A module in no layer is
reported.

    python tools/import_graph.py          # the report
    python tools/import_graph.py --dot    # the graph for graphviz
    python tools/import_graph.py --map    # every module: layer, lines, job (docs/design.md)
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fsll_ooc"

#: Layers, lowest first; a module (or a folder, by its prefix) belongs to the first entry
#: naming it.
LAYERS = [
    ("base", ["validation", "machine", "progress", "threads"]),
    ("math", ["basis", "cost", "kernels"]),
    ("planning", ["planner"]),
    ("storage", ["storage"]),
    ("execution", ["executors", "engine"]),
    ("learning", ["learn"]),
    ("data", ["io"]),
    ("model", ["queries", "model_file", "fitting", "missing", "estimator", "average", "plotting"]),
    ("user", ["baselines", "datasets", "cli", "__init__"]),
]


def modules(root: Path = ROOT) -> dict[str, Path]:
    """``{dotted name relative to the package: path}`` for every module of the package."""
    pkg = root / PACKAGE
    out = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = list(path.relative_to(pkg).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: set) -> str | None:
    """The longest known module that ``name`` names or lies in."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in known:
            return cand
        parts.pop()
    return None


def edges(root: Path = ROOT) -> dict[str, set]:
    """``{module: {modules it imports}}`` inside the package (self-imports dropped)."""
    mods = modules(root)
    known = set(mods)
    graph = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        if mod == "__init__":
            base = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == PACKAGE or a.name.startswith(PACKAGE + "."):
                        targets.append(a.name[len(PACKAGE) + 1:])
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                    prefix = ".".join(anchor + ([node.module] if node.module else []))
                elif node.module and (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
                    prefix = node.module[len(PACKAGE) + 1:]
                else:
                    continue
                for a in node.names:  # `from . import x` may name a module
                    sub = f"{prefix}.{a.name}" if prefix else a.name
                    targets.append(sub if sub in known else prefix)
            for t in targets:
                r = _resolve(t, known) if t else None
                if r and r != mod:
                    graph[mod].add(r)
    return graph


def private_uses(root: Path = ROOT) -> list[tuple[str, str]]:
    """``(module, "other.name")`` for every private name (``_x``) a module takes from another
    module of the package: ``from .other import _x`` or ``other._x`` after ``from . import other``."""
    mods = modules(root)
    known = set(mods)
    out = set()
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = [] if mod == "__init__" else (mod.split(".") if is_pkg else mod.split(".")[:-1])
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}  # local name -> module of the package
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                anchor = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(anchor + ([node.module] if node.module else []))
                for a in node.names:
                    sub = f"{prefix}.{a.name}" if prefix else a.name
                    if sub in known:
                        aliases[a.asname or a.name] = sub
                    elif a.name.startswith("_") and not a.name.startswith("__") and prefix != mod:
                        out.add((mod, f"{prefix}.{a.name}"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and aliases[node.value.id] != mod):
                out.add((mod, f"{aliases[node.value.id]}.{node.attr}"))
    return sorted(out)


def layer_of(mod: str) -> int | None:
    """Index in ``LAYERS`` of the layer holding ``mod`` (by module or folder name)."""
    for i, (_, names) in enumerate(LAYERS):
        for n in names:
            if mod == n or mod.startswith(n + "."):
                return i
    return None


def circles(graph: dict[str, set]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _package_of(mod: str) -> str:
    return mod.rsplit(".", 1)[0] if "." in mod else ""


def upward(graph: dict[str, set]) -> list[tuple[str, str]]:
    """Imports from a lower layer to a higher one.  A package's ``__init__`` re-exporting
    its own modules is not one."""
    out = []
    for a, bs in graph.items():
        la = layer_of(a)
        for b in bs:
            lb = layer_of(b)
            if la is not None and lb is not None and lb > la:
                out.append((a, b))
    return sorted(out)


def unplaced(graph: dict[str, set]) -> list[str]:
    """Modules in no declared layer."""
    return sorted(m for m in graph if layer_of(m) is None)


def job(path: Path) -> str:
    """The first sentence of a module's docstring (its job), on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    cut = text.find(". ")
    return text if cut < 0 else text[:cut + 1]


def package_map(root: Path = ROOT) -> str:
    """A markdown table of every module: its layer, lines and job, lowest layer first."""
    mods = modules(root)
    rows = sorted(mods, key=lambda m: (layer_of(m) if layer_of(m) is not None else -1, m))
    out = ["| layer | module | lines | job |", "|---|---|---|---|"]
    for m in rows:
        i = layer_of(m)
        name = str(mods[m].relative_to(root / PACKAGE))
        lines = len(mods[m].read_text().splitlines())
        out.append(f"| {LAYERS[i][0] if i is not None else '?'} | `{name}` | {lines} | {job(mods[m]).replace('|', '/')} |")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--map" in argv:
        print(package_map())
        return 0
    graph = edges()
    if "--dot" in argv:
        print("digraph fsll_ooc {")
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    c, u, p = circles(graph), upward(graph), unplaced(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports")
    print(f"circles: {len(c)}")
    for comp in c:
        print("  " + " <-> ".join(comp))
    print(f"upward imports: {len(u)}")
    for a, b in u:
        print(f"  {a} -> {b}")
    if p:
        print("in no layer: " + ", ".join(p))
    priv = private_uses()
    print(f"private names used across modules: {len(priv)}")
    for a, b in priv:
        print(f"  {a} uses {b}")
    return 1 if (c or u or p or priv) else 0


if __name__ == "__main__":
    sys.exit(main())
