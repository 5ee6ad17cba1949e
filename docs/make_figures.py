"""Run the code of the docs, check or refresh what they print, and draw every picture.

    python docs/make_figures.py             # run docs/*.md and README.md, rewrite outputs that differ,
                                            # redraw every picture (docs/img/ and the benchmark figures)
    python docs/make_figures.py --check     # change nothing; exit 1 when an output or a figure differs
    python docs/make_figures.py tutorial.md # one file (its pictures too)
    python docs/make_figures.py --figures   # only the benchmark figures

This script is the only way the pictures of the docs are made, and ``tests/test_docs.py``
runs the same code with the same comparisons, so an example that stops working, an output
that no longer matches what the code prints, or a figure whose data changed fails the
tests.  Conventions in the Markdown files:

* a `` ```python `` block is executed; the blocks of one file share a namespace and run
  in order in a fresh temporary directory; when a block ends with an expression, its
  value is printed, as in a notebook;
* in a `` ```bash `` block each line ``fsll-ooc ...`` or ``python tools/plan_memory.py ...``
  runs in process; a trailing ``# exit N`` gives the expected exit code (default 0);
  ``pip ...`` lines are not run (installation); any other command is an error;
* a `` ```text `` block directly after a code block shows that block's output (stdout
  and stderr, as a terminal would).  It is compared with what the code prints now
  (:func:`compare`): text exactly (runs of white space are one space), integers exactly,
  a decimal number within one unit of its last printed digit (or a millionth of it),
  and measured times not at all (``time 0.71 s``, a ``'time':`` entry).  This script
  rewrites only the blocks that differ;
* ``<!-- not run: reason -->`` on the line before a block skips it; a block that prints
  must show its output, unless ``<!-- output not shown: reason -->`` precedes it;
* PNG files the code writes under ``img/`` are copied to ``docs/img/`` (the pictures
  in the Markdown are those files); the benchmark figures (``docs/*.png``) are drawn by
  the plotting functions of the ``bench/`` scripts from the data the docs keep
  (``BENCH_FIGURES``).  Pixels differ between matplotlib versions, so what is checked
  is the data each figure plots (:func:`figure_data`: titles, labels, the points of
  lines and markers, bars, texts, images), kept in ``docs/data/figures.json``.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
FIGURE_DATA = DOCS / "data" / "figures.json"
FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->\s*$")
NOT_SHOWN = re.compile(r"^<!--\s*output not shown:\s*(.+?)\s*-->\s*$")
EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")


@dataclass
class Block:
    lang: str               # "python", "bash", "text", ...
    code: str
    line: int               # 1-based line of the first code line
    end: int                # 0-based index of the closing fence
    skip: str | None = None  # reason given by <!-- not run: ... -->
    hidden: str | None = None  # reason given by <!-- output not shown: ... -->
    output: tuple[int, int] | None = None  # 0-based [first, last) lines of the following text block


def parse(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, code blocks linked to their output block."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: unclosed code fence")
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        skip, hidden = NOT_RUN.match(prev.strip()), NOT_SHOWN.match(prev.strip())
        blocks.append(Block(m.group(1).lower(), "\n".join(lines[i + 1:j]), i + 2, j, skip.group(1) if skip else None,
                            hidden.group(1) if hidden else None))
        i = j + 1
    for a, b in zip(blocks, blocks[1:]):
        between = lines[a.end + 1:b.line - 2]
        if a.lang in ("python", "bash") and b.lang == "text" and not any(s.strip() for s in between):
            a.output = (b.line - 1, b.end)
    return blocks


class DocError(AssertionError):
    """An example in the docs failed; the message names file and line."""


# ------------------------------------------------------------------ comparing outputs

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|(?<![\w.])[-+]?\.\d+")
# measured, not computed: masked on both sides before comparing
VOLATILE = [
    (re.compile(r"\btime\s+[-+]?[\d.]+(?:e[-+]?\d+)?\s*(?:ms|s|min|h)\b"), "time <measured>"),
    (re.compile(r"""(['"](?:time|seconds|wall_s)['"]:\s*)[-+]?[\d.]+(?:e[-+]?\d+)?"""), r"\1<measured>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "0x<address>"),
    # a plan whose speed was measured on this machine, and the times that follow from it
    (re.compile(r"^(\s*speed\s+)[^\n]*measured[^\n]*\n(\s*time / pass\s+)[^\n]*\n(\s*time / 100 terms\s+)[^\n]*$",
                re.M), r"\1<measured>\n\2<measured>\n\3<measured>"),
    # the plan's whole-fit estimate, from the memory speed measured on this machine
    (re.compile(r"^(\s*fit estimate / 100 terms\s+)[^\n]*$", re.M), r"\1<measured>"),
]
RTOL = 1e-6


def _mask(text: str) -> str:
    for pattern, repl in VOLATILE:
        text = pattern.sub(repl, text)
    return text


def _tokens(text: str) -> list[str | tuple[float, float, str]]:
    """Text pieces (white space collapsed) and numbers ``(value, unit of the last digit, as printed)``;
    the unit is 0 for integers (compared exactly)."""
    text = _mask(text)
    out: list = []
    pos = 0
    for m in NUMBER.finditer(text):
        piece = " ".join(text[pos:m.start()].split())
        if piece:
            out.extend(piece.split(" "))
        s = m.group(0)
        mant, _, exp = s.replace(",", "").lower().partition("e")
        if "." in mant or exp:
            whole, dot, frac = mant.partition(".")
            # numpy prints 1.0 as "1." next to "0.028": its precision, not a unit of 1
            unit = (10.0 ** -len(frac) if frac else 1e-4 if dot else 1.0) * 10.0 ** int(exp or 0)
        else:
            unit = 0.0
        out.append((float(mant + ("e" + exp if exp else "")), unit, s))
        pos = m.end()
    piece = " ".join(text[pos:].split())
    if piece:
        out.extend(piece.split(" "))
    return out


def _same_number(want: tuple, got: tuple) -> bool:
    (a, unit, _), (b, _, _) = want, got
    if unit == 0.0:
        return a == b and (got[1] == 0.0)
    return abs(a - b) <= max(unit * 1.0000001, RTOL * abs(a))


def compare(expected: str, actual: str) -> str | None:
    """None when ``actual`` matches the documented ``expected`` output, else where it differs."""
    want, got = _tokens(expected), _tokens(actual)
    for k, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, tuple) and isinstance(g, tuple):
            if _same_number(w, g):
                continue
        elif w == g:
            continue
        shown = lambda t: t[2] if isinstance(t, tuple) else t  # noqa: E731
        before = " ".join(shown(t) for t in want[max(0, k - 6):k])
        return f"after {before!r}: the docs show {shown(w)!r}, the code prints {shown(g)!r}"
    if len(want) != len(got):
        shown = lambda t: t[2] if isinstance(t, tuple) else t  # noqa: E731
        extra = want[len(got):] if len(want) > len(got) else got[len(want):]
        who = "the docs show more" if len(want) > len(got) else "the code prints more"
        return f"{who}: {' '.join(shown(t) for t in extra[:12])!r}"
    return None


# ------------------------------------------------------------------ running the blocks

def _run_python(block: Block, ns: dict, where: str) -> None:
    tree = ast.parse(block.code, filename=where)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body = tree.body[:-1]
    exec(compile(tree, where, "exec"), ns)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), where, "eval"), ns)
        if value is not None:
            print(repr(value))


def _commands(code: str) -> list[tuple[int, str]]:
    out, buf, start = [], "", 0
    for k, raw in enumerate(code.splitlines()):
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not buf:
            start = k
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf and not buf.startswith("#"):
            out.append((start, buf))
        buf = ""
    return out


def _run_bash(block: Block, where: str) -> None:
    from fsll_ooc import cli

    for k, cmd in _commands(block.code):
        loc = f"{where.rsplit(':', 1)[0]}:{block.line + k}"
        if cmd.startswith("pip "):
            continue
        m = EXIT.search(cmd)
        want = int(m.group(1)) if m else 0
        cmd = EXIT.sub("", cmd)
        argv = shlex.split(cmd, comments=True)
        if argv[:1] == ["fsll-ooc"]:
            rc = cli.main(argv[1:])
        elif argv[:2] == ["python", "tools/plan_memory.py"]:
            rc = cli.plan_main(argv[2:])
        else:
            raise DocError(f"{loc}: cannot run {cmd!r} (only fsll-ooc and tools/plan_memory.py commands run; "
                           "put other commands in a block marked <!-- not run: reason -->)")
        if rc != want:
            raise DocError(f"{loc}: {cmd!r} exited with {rc}, the docs say {want}")


@dataclass
class Result:
    """What running one Markdown file gave."""
    outputs: list           # per block: the captured output, None when not run
    figures: dict           # picture path (relative to the run directory) -> figure_data
    blocks: list


def run_file(path: Path, workdir: Path) -> Result:
    """Run the blocks of ``path`` in ``workdir``: each block's captured output, and the data
    of every figure saved."""
    import numpy as np

    path = Path(path).resolve()
    ns: dict = {"__name__": "__docs__"}
    outputs: list[str | None] = []
    figures: dict = {}
    blocks = parse(path)
    old = os.getcwd()
    os.chdir(workdir)
    try:
        with _display_options(), np.printoptions(precision=4, suppress=True), capture_figures(figures, workdir):
            for b in blocks:
                if b.skip or b.lang not in ("python", "bash"):
                    outputs.append(None)
                    continue
                where = f"{path.name}:{b.line}"
                buf = io.StringIO()
                try:
                    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
                        if b.lang == "python":
                            _run_python(b, ns, where)
                        else:
                            _run_bash(b, where)
                except DocError:
                    raise
                except Exception as exc:
                    raise DocError(f"{where}: the {b.lang} block failed: {type(exc).__name__}: {exc}\n"
                                   f"--- output so far ---\n{buf.getvalue()}") from exc
                outputs.append(buf.getvalue())
    finally:
        os.chdir(old)
    return Result(outputs, figures, blocks)


def output_differences(path: Path, result: Result) -> list[str]:
    """``FILE:LINE: ...`` for every documented output that the code no longer prints."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    out = []
    for b, got in zip(result.blocks, result.outputs):
        if got is None:
            continue
        if b.output is None:
            if got.strip() and not b.hidden:
                out.append(f"{Path(path).name}:{b.line}: the block prints {got.strip()[:60]!r}..., "
                           "which the docs do not show (a ```text block right after it)")
            continue
        first, last = b.output
        why = compare("\n".join(lines[first:last]), got)
        if why:
            out.append(f"{Path(path).name}:{first + 1}: {why}")
    return out


@contextlib.contextmanager
def _display_options():
    import pandas as pd

    with pd.option_context("display.width", 100, "display.max_columns", 12, "display.precision", 4):
        yield


def rewrite_outputs(path: Path, result: Result) -> bool:
    """Replace each ``text`` output block that differs from what its code printed; True if changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    edits = []
    for b, out in zip(result.blocks, result.outputs):
        if out is None:
            continue
        if b.output is None:
            if out.strip() and not b.hidden:   # a new output block after the closing fence
                edits.append(((b.end + 1, b.end + 1), ["", "```text", *out.rstrip("\n").splitlines(), "```"]))
            continue
        first, last = b.output
        if compare("\n".join(lines[first:last]), out) is not None:
            edits.append((b.output, out.rstrip("\n").splitlines()))
    for (first, last), new in sorted(edits, key=lambda e: e[0], reverse=True):
        lines[first:last] = [ln.rstrip() for ln in new]
    new = "\n".join(lines) + "\n"
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


# ------------------------------------------------------------------ figure data

def _rounded(x: float):
    if x is None or not math.isfinite(x):
        return None if x is None or math.isnan(x) else ("inf" if x > 0 else "-inf")
    return float(f"{x:.4g}")


def _numbers(values) -> list | dict:
    """Numbers to 4 significant digits; more than 64 of them as a summary."""
    import numpy as np

    a = np.ma.filled(np.ma.asarray(values, dtype=np.float64), np.nan).ravel()
    if a.size <= 64:
        return [_rounded(float(v)) for v in a]
    fin = a[np.isfinite(a)]
    summary = {"n": int(a.size), "finite": int(fin.size)}
    if fin.size:
        summary.update(min=_rounded(float(fin.min())), max=_rounded(float(fin.max())),
                       mean=_rounded(float(fin.mean())), sum_abs=_rounded(float(np.abs(fin).sum())))
    return summary


def figure_data(fig) -> list[dict]:
    """What a figure shows, independent of fonts and pixels: per axes its title, labels and
    scales, the data of its lines, markers, line collections, bars and other patches (in
    data coordinates), its texts and legend, and the arrays of its images."""
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Rectangle

    axes = []
    for ax in fig.axes:
        d: dict = {"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                   "scale": [ax.get_xscale(), ax.get_yscale()]}
        d["lines"] = [[ln.get_label() if not ln.get_label().startswith("_") else "",
                       _numbers(ln.get_xydata())] for ln in ax.lines]
        cols = []
        for c in ax.collections:
            item: dict = {}
            if isinstance(c, LineCollection):
                segs = c.get_segments()
                item["segments"] = _numbers([p for s in segs for p in s]) if segs else []
                item["widths"] = _numbers(c.get_linewidths())
            else:
                offsets = c.get_offsets()
                if len(offsets):
                    item["offsets"] = _numbers(offsets)
                sizes = c.get_sizes() if hasattr(c, "get_sizes") else []
                if len(sizes):
                    item["sizes"] = _numbers(sizes)
                arr = c.get_array()
                if arr is not None:
                    item["array"] = _numbers(arr)
            if item:
                cols.append(item)
        d["collections"] = cols
        patches = []
        for p in ax.patches:
            if isinstance(p, Rectangle):
                patches.append(_numbers([p.get_x(), p.get_y(), p.get_width(), p.get_height()]))
            else:
                verts = p.get_patch_transform().transform(p.get_path().vertices)
                patches.append(_numbers([verts.min(axis=0), verts.max(axis=0)]))
        d["patches"] = patches
        d["texts"] = [t.get_text() for t in ax.texts if t.get_text()]
        leg = ax.get_legend()
        d["legend"] = [t.get_text() for t in leg.get_texts()] if leg is not None else []
        d["images"] = [_numbers(im.get_array()) for im in ax.images]
        axes.append(d)
    return axes


def compare_figure(want, got, where: str = "") -> str | None:
    """None when two :func:`figure_data` agree (numbers to a relative 2e-3), else where not."""
    if isinstance(want, dict) and isinstance(got, dict):
        if sorted(want) != sorted(got):
            return f"{where}: keys {sorted(want)} against {sorted(got)}"
        for k in want:
            why = compare_figure(want[k], got[k], f"{where}.{k}")
            if why:
                return why
        return None
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return f"{where}: {len(want)} items in the stored data, {len(got)} drawn now"
        for k, (w, g) in enumerate(zip(want, got)):
            why = compare_figure(w, g, f"{where}[{k}]")
            if why:
                return why
        return None
    if isinstance(want, float) and isinstance(got, (int, float)) or isinstance(got, float) and isinstance(want, int):
        if abs(want - got) <= 2e-3 * max(abs(want), abs(got)) + 1e-12:
            return None
        return f"{where}: {want} stored, {got} drawn now"
    if isinstance(want, str) and isinstance(got, str):
        why = compare(want, got)
        return f"{where}: {why}" if why else None
    return None if want == got else f"{where}: {want!r} stored, {got!r} drawn now"


@contextlib.contextmanager
def capture_figures(store: dict, workdir: Path):
    """Record :func:`figure_data` of every figure saved to a file while inside."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        yield
        return
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        if isinstance(fname, (str, os.PathLike)):
            key = os.path.relpath(os.path.abspath(os.fspath(fname)), workdir)
            store[Path(key).as_posix()] = figure_data(self)
        return original(self, fname, *args, **kwargs)

    Figure.savefig = savefig
    try:
        yield
    finally:
        Figure.savefig = original


def load_figure_data() -> dict:
    return json.loads(FIGURE_DATA.read_text(encoding="utf-8")) if FIGURE_DATA.is_file() else {}


def save_figure_data(updates: dict) -> bool:
    data = load_figure_data()
    new = dict(sorted({**data, **updates}.items()))
    if new == data:
        return False
    FIGURE_DATA.parent.mkdir(parents=True, exist_ok=True)
    lines = []   # one line per axes: a change shows which panel of which picture moved
    for k, (name, axes) in enumerate(new.items()):
        lines.append(f" {json.dumps(name)}: [")
        lines += [f"  {json.dumps(ax, ensure_ascii=False)}" + ("," if j < len(axes) - 1 else "")
                  for j, ax in enumerate(axes)]
        lines.append(" ]" + ("," if k < len(new) - 1 else ""))
    FIGURE_DATA.write_text("{\n" + "\n".join(lines) + "\n}\n", encoding="utf-8")
    return True


def doc_pictures(result: Result) -> dict:
    """The figures a docs page saved under ``img/`` (the ones it shows), keyed by ``img/NAME``."""
    return {k: v for k, v in result.figures.items() if k.startswith("img/") and k.endswith(".png")}


# ------------------------------------------------------------------ benchmark figures

def _bench(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import importlib
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _md_table(path: Path, header_start: str) -> list[list[str]]:
    """The rows of the first Markdown table whose header row starts with ``header_start``."""
    rows, inside = [], False
    for line in (DOCS / path).read_text(encoding="utf-8").splitlines():
        if not inside and line.startswith(header_start):
            inside = True
            continue
        if inside:
            if not line.startswith("|"):
                break
            if set(line) <= set("|-: "):
                continue
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    if not rows:
        raise DocError(f"{path}: no table starting with {header_start!r}")
    return rows


def _float(s: str) -> float:
    return math.inf if s == "inf" else float(s)


def _paper_results():
    results: dict = {}
    for d, seed, m, kl_d, kl_t, n, t in _md_table("benchmarks_paper.md", "| data | seed | model |"):
        results.setdefault((d, m), []).append(
            {"seed": int(seed), "kl_data": _float(kl_d), "kl_true": _float(kl_t), "n_params": int(n), "time": float(t)})
    names = list(dict.fromkeys(d for d, _ in results))
    models = list(dict.fromkeys(m for _, m in results))
    return results, names, models


def _draw_paper_kl(path):
    results, names, models = _paper_results()
    _bench("reproduce_paper").plot(results, names, models, "kl_true", "KL(p* ‖ p) [nat], log scale",
                                   "Distance to the true distribution (lower is better; bar = mean, "
                                   "whiskers = min..max over seeds)", path)


def _draw_paper_time(path):
    results, names, models = _paper_results()
    _bench("reproduce_paper").plot(results, names, models, "time", "fit time [s], log scale",
                                   "Wall-clock fit time (lower is better; bar = mean, whiskers = min..max "
                                   "over seeds)", path)


def _draw_samples_curve(path):
    lines = (DOCS / "benchmarks_samples.md").read_text(encoding="utf-8").splitlines()
    header = next(ln for ln in lines if ln.startswith("| model | N = "))
    sizes = [int(c.strip()[4:].replace(",", "")) for c in header.strip().strip("|").split("|")[1:]]
    rows = _md_table("benchmarks_samples.md", "| model | N = ")
    results = {(r[0], n): {"kl_true": _float(v)} for r in rows for n, v in zip(sizes, r[1:])}
    _bench("samples_curve").plot(results, sizes, [r[0] for r in rows], path)


def _draw_quality(path):
    raw = json.loads((DOCS / "data" / "quality" / "quality.json").read_text(encoding="utf-8"))
    _bench("quality").plot({(d, s): rs for d, s, rs in raw["results"]}, raw["names"], path)


def _draw_realdata(path):
    raw = json.loads((DOCS / "data" / "quality" / "realdata.json").read_text(encoding="utf-8"))
    _bench("realdata").plot(raw, path)


SCALE_SERIES = [   # as benchmarks.md section 4 names them
    ("paper rule, before", ["converged_22_24.log", "converged_26.log"]),
    ("paper rule", ["summary_paper_22_26.log"]),
    ("default rule", ["summary_default_22_28.log", "summary_bn30.log"]),
    ("default rule, 2026-12-07", ["quiet_20_28_2026-12-07.log", "bn30_fresh_2026-12-07.log"]),
]


def _draw_scale(path):
    ps = _bench("plot_scale")
    logs = DOCS / "data" / "scale"
    ps.plot(ps.series([f"{label}={','.join(str(logs / f) for f in files)}" for label, files in SCALE_SERIES]),
            Path(path))
    import matplotlib.pyplot as plt

    plt.close("all")


# picture in docs/ -> the function that draws it from the data the docs keep
BENCH_FIGURES = {
    "paper_kl.png": _draw_paper_kl,          # bench/reproduce_paper.py; data: benchmarks_paper.md, "Every run"
    "paper_time.png": _draw_paper_time,
    "samples_curve.png": _draw_samples_curve,  # bench/samples_curve.py; data: benchmarks_samples.md
    "quality_kl.png": _draw_quality,          # bench/quality.py; data: docs/data/quality/quality.json
    "realdata.png": _draw_realdata,           # bench/realdata.py; data: docs/data/quality/realdata.json
    "scale.png": _draw_scale,                 # bench/plot_scale.py; data: the logs in docs/data/scale/
}


def draw_bench_figures(out_dir: Path, names=None) -> dict:
    """Draw the benchmark figures into ``out_dir``; their :func:`figure_data` by name."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    data: dict = {}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for name, draw in BENCH_FIGURES.items():
        if names is not None and name not in names:
            continue
        captured: dict = {}
        with capture_figures(captured, Path(out_dir)):
            draw(str(Path(out_dir) / name))
        if name not in captured:
            raise DocError(f"{name}: its drawing function saved no figure under that name")
        data[name] = captured[name]
    return data


# ------------------------------------------------------------------ command line

def markdown_files() -> list[Path]:
    return sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]


def _runnable(path: Path) -> bool:
    return any(b.lang in ("python", "bash") and not b.skip for b in parse(path))


def _keep_pictures(drawn_in: Path, pictures: dict, stored: dict) -> None:
    """Copy the pictures whose data changed (or that are missing) into docs/ and record their data;
    a picture whose data did not change keeps its PNG (pixels vary between matplotlib versions)."""
    for name, data in pictures.items():
        if compare_figure(stored.get(name), data, "") is not None or not (DOCS / name).is_file():
            (DOCS / name).parent.mkdir(exist_ok=True)
            shutil.copy2(drawn_in / name, DOCS / name)
    save_figure_data({k: v for k, v in pictures.items() if compare_figure(stored.get(k), v, "") is not None})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="Markdown files in docs/ (default: all, and README.md)")
    ap.add_argument("--check", action="store_true", help="change no file; exit 1 when anything differs")
    ap.add_argument("--figures", action="store_true", help="only the benchmark figures")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("MPLBACKEND", "Agg")
    stored = load_figure_data()
    failed = False
    files = [] if args.figures else (
        [DOCS / f if not os.path.isabs(f) and not (ROOT / f).is_file() else ROOT / f for f in args.files]
        or markdown_files())
    for f in files:
        if not _runnable(f):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                result = run_file(f, Path(tmp))
            except DocError as exc:
                print(f"FAILED {exc}", file=sys.stderr)
                return 1
            pictures = doc_pictures(result)
            diffs = output_differences(f, result)
            diffs += [f"{f.name}: {k}{why}" for k, v in pictures.items()
                      if (why := compare_figure(stored.get(k), v, "")) is not None]
            if args.check:
                failed |= bool(diffs)
                print("\n".join(f"DIFFERS {d}" for d in diffs) if diffs else f"ok      {f.name}")
                continue
            changed = rewrite_outputs(f, result)
            _keep_pictures(Path(tmp), pictures, stored)
            print(f"{'updated' if changed else 'ok     '} {f.name}"
                  + (f" ({len(pictures)} picture(s) -> docs/img/)" if pictures else ""))
    if args.figures or not args.files:
        with tempfile.TemporaryDirectory() as tmp:
            drawn = draw_bench_figures(Path(tmp))
            for name, data in drawn.items():
                why = compare_figure(stored.get(name), data, "")
                failed |= args.check and why is not None
                print(f"{('DIFFERS' if args.check else 'redrawn') if why else 'ok     '} {name}{why or ''}")
            if not args.check:
                _keep_pictures(Path(tmp), drawn, stored)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
