"""Run the code of the docs, refresh the printed outputs and the tutorial's pictures.

    python docs/make_figures.py             # run docs/*.md, rewrite their outputs, copy images to docs/img/
    python docs/make_figures.py --check     # run only, change nothing; exit 1 on the first failure
    python docs/make_figures.py tutorial.md # one file

``tests/test_docs.py`` runs the same code with this module's parser, so an example that
stops working fails the tests.  Conventions in the Markdown files:

* a `` ```python `` block is executed; the blocks of one file share a namespace and run
  in order in a fresh temporary directory; when a block ends with an expression, its
  value is printed, as in a notebook;
* in a `` ```bash `` block each line ``fsll-ooc ...`` or ``python tools/plan_memory.py ...``
  runs in process; a trailing ``# exit N`` gives the expected exit code (default 0);
  ``pip ...`` lines are not run (installation); any other command is an error;
* a `` ```text `` block directly after a code block shows that block's output (stdout
  and stderr, as a terminal would); this
  script rewrites it from the actual output (the tests do not compare outputs, since
  numbers change with the learner; regenerate them after such changes);
* ``<!-- not run: reason -->`` on the line before a block skips it;
* PNG files the code writes under ``img/`` are copied to ``docs/img/`` (the pictures
  in the Markdown are those files).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import io
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
FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->\s*$")
EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")


@dataclass
class Block:
    lang: str               # "python", "bash", "text", ...
    code: str
    line: int               # 1-based line of the first code line
    end: int                # 0-based index of the closing fence
    skip: str | None = None  # reason given by <!-- not run: ... -->
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
        skip = NOT_RUN.match(prev.strip())
        blocks.append(Block(m.group(1).lower(), "\n".join(lines[i + 1:j]), i + 2, j, skip.group(1) if skip else None))
        i = j + 1
    for a, b in zip(blocks, blocks[1:]):
        between = lines[a.end + 1:b.line - 2]
        if a.lang in ("python", "bash") and b.lang == "text" and not any(s.strip() for s in between):
            a.output = (b.line - 1, b.end)
    return blocks


class DocError(AssertionError):
    """An example in the docs failed; the message names file and line."""


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


def run_file(path: Path, workdir: Path) -> list[str | None]:
    """Run the blocks of ``path`` in ``workdir``; returns each block's captured output."""
    import numpy as np

    path = Path(path).resolve()
    ns: dict = {"__name__": "__docs__"}
    outputs: list[str | None] = []
    old = os.getcwd()
    os.chdir(workdir)
    try:
        with _display_options(), np.printoptions(precision=4, suppress=True):
            for b in parse(path):
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
    return outputs


@contextlib.contextmanager
def _display_options():
    import pandas as pd

    with pd.option_context("display.width", 100, "display.max_columns", 12, "display.precision", 4):
        yield


def rewrite_outputs(path: Path, outputs: list[str | None]) -> bool:
    """Replace each code block's ``text`` output block by what it printed; True if changed."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    edits = [(b.output, out) for b, out in zip(parse(path), outputs) if b.output is not None and out is not None]
    for (first, last), out in sorted(edits, reverse=True):
        lines[first:last] = [ln.rstrip() for ln in out.rstrip("\n").splitlines()]
    new = "\n".join(lines) + "\n"
    if new != path.read_text(encoding="utf-8"):
        path.write_text(new, encoding="utf-8")
        return True
    return False


def markdown_files() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="Markdown files in docs/ (default: all)")
    ap.add_argument("--check", action="store_true", help="run only; change no file")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("MPLBACKEND", "Agg")
    files = [DOCS / f if not os.path.isabs(f) else Path(f) for f in args.files] or markdown_files()
    for f in files:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                outputs = run_file(f, Path(tmp))
            except DocError as exc:
                print(f"FAILED {exc}", file=sys.stderr)
                return 1
            if args.check:
                print(f"ok      {f.name}")
                continue
            changed = rewrite_outputs(f, outputs)
            images = sorted((Path(tmp) / "img").glob("*.png")) if (Path(tmp) / "img").is_dir() else []
            for img in images:
                (DOCS / "img").mkdir(exist_ok=True)
                shutil.copy2(img, DOCS / "img" / img.name)
            print(f"{'updated' if changed else 'ok     '} {f.name}"
                  + (f" ({len(images)} image(s) -> docs/img/)" if images else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
