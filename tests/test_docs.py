"""The docs are true to the code: what they print, draw, link, cite and list.

* Every code block of ``docs/*.md`` and ``README.md`` runs (one namespace per file, in an
  empty temporary directory), with the parser and runner of ``docs/make_figures.py``,
  and every output the docs show is what the code prints now (``make_figures.compare``:
  text and integers exactly, decimals to their last printed digit, measured times not
  at all).  ``python docs/make_figures.py`` rewrites the outputs that differ.
* Every picture is drawn by ``docs/make_figures.py``: the data each one plots is
  compared with ``docs/data/figures.json``.
* Links and anchors resolve (as GitHub renders headings); commits cited exist; every
  benchmark figure and table names its script, machine, load and commit, and a figure
  measured before a change to ``fsll_ooc/`` says it is history; every test the docs name
  exists, and every promise of reliability.md section 5 cites one.
* api.md gives every public function's signature as ``inspect.signature`` has it and
  every field of the result types; README's module table and design.md's map name every
  module; the guide's command table gives every option of every command.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load_runner():
    spec = importlib.util.spec_from_file_location("docs_make_figures", DOCS / "make_figures.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


runner = _load_runner()
FILES = runner.markdown_files()
USER_DOCS = ("guide.md", "api.md", "tutorial.md", "model-format.md")
REGENERATE = "run python docs/make_figures.py and review the diff"


def _runnable(path: Path) -> list:
    return [b for b in runner.parse(path) if b.lang in ("python", "bash") and not b.skip]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# ------------------------------------------------------------- examples and their outputs

@pytest.mark.parametrize("path", [f for f in FILES if _runnable(f)], ids=lambda p: p.name)
def test_examples_print_what_the_docs_show(path, tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    code = "\n".join(b.code for b in _runnable(path))
    if ("plot" in code or "matplotlib" in code) and importlib.util.find_spec("matplotlib") is None:
        pytest.skip('needs matplotlib: pip install "fsll-ooc[docs]"')
    result = runner.run_file(path, tmp_path)
    problems = runner.output_differences(path, result)
    # the pictures the docs show are the ones their code draws, with the data they plot
    stored = runner.load_figure_data()
    for ref in re.findall(r"!\[[^\]]*\]\((img/[^)]+)\)", _text(path)):
        assert (tmp_path / ref).is_file(), f"{path.name}: the code does not draw {ref}"
        assert (DOCS / ref).is_file(), f"{path.name}: {ref} is missing in docs/; {REGENERATE}"
    for ref, data in runner.doc_pictures(result).items():
        why = runner.compare_figure(stored.get(ref), data, "")
        if why:
            problems.append(f"{path.name}: {ref} plots other data than docs/data/figures.json{why}")
    assert not problems, "the docs no longer show what the code prints; " + REGENERATE + ":\n" + "\n".join(problems)


def test_compare_rules():
    same = runner.compare
    assert same("bases 27   cost 0.1679   time 0.71 s", "bases 27 cost 0.1680 time 12.5 s") is None
    assert "'27'" in same("bases 27 cost 0.1679", "bases 32 cost 0.1679")
    assert same("cost 0.1679", "cost 0.1681") is not None          # two units of the last digit
    assert same("share 29.8%", "share 29.9%") is None
    assert same("4,000 rows", "4000 rows") is None
    assert same("n 2", "n 2.0") is not None                         # an integer stays an integer
    assert same("[0.    1.   ]", "[0.0001 1.]") is None               # numpy's padding of round values
    assert same("{'time': 0.0004}", "{'time': 3.5}") is None
    assert same("{'cost': 0.0004}", "{'cost': 3.5}") is not None
    assert "more" in same("a b", "a b c")
    assert same("X6=0 * H0", "H0=0 * H0") is not None
    measured = ("  speed                    17,272 MB/s write, 17,272 MB/s read (memory, measured: a copy)\n"
                "  time / pass              about 3.3e-08 s (384 B read, 192 B written)\n"
                "  time / 100 terms         about 5.7e-06 s at 1.7 passes/term\n  verdict  FEASIBLE")
    assert same(measured, measured.replace("17,272", "9,001").replace("3.3e-08", "6e-08")) is None
    given = measured.replace("measured: a copy", "given with --disk-speed")
    assert same(given, given.replace("17,272", "9,001")) is not None


def test_parser_links_outputs_and_skips(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("# t\n\n```python\nprint(1 + 1)\n```\n\n```text\nold\n```\n\n"
                  "<!-- not run: needs a cluster of 100 nodes -->\n```bash\ndask scheduler\n```\n"
                  "```bash\nfsll-ooc plan --cards 2x40 --memory 1GiB --disk 1GiB   # exit 3\n```\n")
    blocks = runner.parse(md)
    assert [b.lang for b in blocks] == ["python", "text", "bash", "bash"]
    assert blocks[0].output is not None and blocks[2].skip == "needs a cluster of 100 nodes"
    result = runner.run_file(md, tmp_path)
    assert result.outputs[0] == "2\n" and result.outputs[2] is None
    diff, plan_output = runner.output_differences(md, result)
    assert diff.startswith("x.md:8:") and "'old'" in diff and "'2'" in diff
    assert plan_output.startswith("x.md:16: the block prints 'fsll-ooc plan:")
    assert runner.rewrite_outputs(md, result)
    assert "```text\n2\n```" in md.read_text()
    assert not runner.rewrite_outputs(md, runner.run_file(md, tmp_path))   # nothing left to rewrite
    md.write_text("```python\nprint('shown')\n```\n\n<!-- output not shown: too long to be of use -->\n"
                  "```python\nprint('hidden')\n```\n")
    result = runner.run_file(md, tmp_path)
    [diff] = runner.output_differences(md, result)          # a block that prints shows it
    assert diff.startswith("x.md:2:") and "'shown'" in diff
    assert runner.rewrite_outputs(md, result)
    assert md.read_text().startswith("```python\nprint('shown')\n```\n\n```text\nshown\n```\n")
    assert runner.output_differences(md, runner.run_file(md, tmp_path)) == []
    md.write_text("```bash\nfsll-ooc plan --cards 2x40 --memory 1GiB --disk 1GiB\n```\n")
    with pytest.raises(runner.DocError, match="exited with 3, the docs say 0"):
        runner.run_file(md, tmp_path)
    md.write_text("```python\n1 / 0\n```\n")
    with pytest.raises(runner.DocError, match=r"x.md:2: the python block failed: ZeroDivisionError"):
        runner.run_file(md, tmp_path)


def test_skipped_blocks_say_why():
    for path in FILES:
        for b in runner.parse(path):
            if b.skip is not None:
                assert len(b.skip) > 10, f"{path.name}:{b.line}: say why the block is not run"
            if b.hidden is not None:
                assert len(b.hidden) > 10, f"{path.name}:{b.line}: say why the output is not shown"


def test_bash_blocks_only_hold_runnable_commands():
    for path in FILES:
        for b in _runnable(path):
            if b.lang != "bash":
                continue
            for k, cmd in runner._commands(b.code):
                ok = cmd.startswith(("fsll-ooc ", "python tools/plan_memory.py ", "pip "))
                assert ok, f"{path.name}:{b.line + k}: {cmd!r} would not run in the tests"


# ------------------------------------------------------------- pictures

def _image_refs(path: Path) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", _text(path))


def test_every_picture_is_drawn_by_make_figures():
    stored = runner.load_figure_data()
    shown = {(p.parent / ref).resolve().relative_to(DOCS).as_posix() for p in FILES for ref in _image_refs(p)}
    on_disk = {p.relative_to(DOCS).as_posix() for p in list(DOCS.glob("*.png")) + list(DOCS.glob("img/*.png"))}
    drawn = set(runner.BENCH_FIGURES) | {k for k in stored if k.startswith("img/")}
    assert shown <= on_disk, f"pictures shown but missing: {sorted(shown - on_disk)}; {REGENERATE}"
    assert on_disk <= drawn, (f"pictures in docs/ that docs/make_figures.py does not draw: "
                              f"{sorted(on_disk - drawn)}; draw them there or delete them")
    assert set(stored) <= on_disk and set(stored) >= set(runner.BENCH_FIGURES), \
        f"docs/data/figures.json and the pictures disagree; {REGENERATE}"
    unused = on_disk - shown
    assert not unused, f"pictures no page shows: {sorted(unused)}"


def test_benchmark_figures_plot_the_data_the_docs_keep(tmp_path):
    pytest.importorskip("matplotlib", reason='drawing needs matplotlib: pip install "fsll-ooc[docs]"')
    stored = runner.load_figure_data()
    drawn = runner.draw_bench_figures(tmp_path)
    problems = [f"{name}{why}" for name, data in drawn.items()
                if (why := runner.compare_figure(stored.get(name), data, "")) is not None]
    assert not problems, f"benchmark figures differ from docs/data/figures.json; {REGENERATE}:\n" + "\n".join(problems)


def test_figure_data_sees_what_is_plotted(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [0.5, 0.25, 0.125], label="cost")
    ax.bar([0, 1], [3.0, 4.0])
    ax.set_title("t")
    a = runner.figure_data(fig)
    ax.lines[0].set_ydata([0.5, 0.25, 0.126])
    b = runner.figure_data(fig)
    plt.close(fig)
    assert runner.compare_figure(a, a, "") is None
    assert "0.125" in runner.compare_figure(a, b, "")
    assert a[0]["patches"] == [[-0.4, 0.0, 0.8, 3.0], [0.6, 0.0, 0.8, 4.0]]


# ------------------------------------------------------------- links

def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())    # a link's text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in _text(path).splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = _slug(m.group(1))
            n = seen.get(s, 0)
            out.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
    out |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", _text(path)))
    return out


def _links(path: Path):
    in_fence = False
    for k, line in enumerate(_text(path).splitlines(), 1):
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            yield k, target


def test_slugs_are_githubs():
    assert _slug("`fsll_ooc.queries`") == "fsll_oocqueries"
    assert _slug("Averaging fits on subsamples (bench/averaging.py)") == "averaging-fits-on-subsamples-benchaveragingpy"
    assert _slug("5. Statistical quality beyond the paper") == "5-statistical-quality-beyond-the-paper"


def test_links_and_anchors_resolve():
    broken = []
    for path in FILES:
        for line, target in _links(path):
            if re.match(r"^[a-z]+:", target):       # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.name}:{line}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{path.name}:{line}: {target} (no heading gives #{anchor})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_user_docs_exist_and_link():
    for name in USER_DOCS:
        assert (DOCS / name).is_file(), name
    guide = _text(DOCS / "guide.md")
    for name in ("tutorial.md", "api.md", "model-format.md"):
        assert f"({name}" in guide, f"guide.md does not link {name}"


# ------------------------------------------------------------- provenance

HASH = re.compile(r"(?<![\w/.-])[0-9a-f]{7,40}(?![\w/-])")


def _cited_commits() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in FILES:
        for k, line in enumerate(_text(path).splitlines(), 1):
            for h in HASH.findall(line):
                if re.search(r"[a-f]", h) and re.search(r"\d", h):
                    out.setdefault(h, []).append(f"{path.name}:{k}")
    return out


def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def _need_history():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the commits the docs cite cannot be looked up here")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: the commits the docs cite are older than its history "
                    "(git fetch --unshallow to check them)")


def test_commits_cited_exist():
    _need_history()
    cited = _cited_commits()
    assert cited, "found no commit in the docs: the pattern is wrong"
    # An ancestor of HEAD, not merely an object in this clone: a commit rebased away survives
    # in the clone it was written in and nowhere else.
    missing = [f"{h} ({', '.join(where)})" for h, where in sorted(cited.items())
               if _git("merge-base", "--is-ancestor", h, "HEAD").returncode != 0]
    assert not missing, ("commits cited in the docs that are not in this branch's history "
                         "(rebased away, or never landed):\n" + "\n".join(missing))


IMAGE = re.compile(r"^!\[[^\]]*\]\(([^)\s]+\.png)\)\s*$")


def _captions():
    """(page, picture, the paragraph after it, images between skipped) for every benchmark picture."""
    for path in sorted(DOCS.glob("benchmarks*.md")):
        lines = _text(path).splitlines()
        for k, line in enumerate(lines):
            m = IMAGE.match(line)
            if not m:
                continue
            j = k + 1
            while j < len(lines) and (not lines[j].strip() or IMAGE.match(lines[j])):
                j += 1
            para = []
            while j < len(lines) and lines[j].strip():
                para.append(lines[j])
                j += 1
            yield path, m.group(1), "\n".join(para)


def test_benchmark_figures_name_script_machine_load_and_commit():
    _need_history()
    problems = []
    captions = list(_captions())
    assert {p for _, p, _ in captions} == set(runner.BENCH_FIGURES), \
        "the benchmark pages show the figures docs/make_figures.py draws, and only those"
    for path, picture, caption in captions:
        where = f"{path.name}: {picture}"
        scripts = re.findall(r"bench/\w+\.py", caption)
        commits = [h for h in HASH.findall(caption) if re.search(r"\d", h) and re.search(r"[a-f]", h)]
        if not scripts or not all((ROOT / s).is_file() for s in scripts):
            problems.append(f"{where}: the caption names no existing bench/ script")
        if not commits:
            problems.append(f"{where}: the caption names no commit")
        if not re.search(r"\bload\b", caption) or not re.search(r"\bcores?\b", caption):
            problems.append(f"{where}: the caption gives no machine (cores) or no load")
        if "make_figures.py" not in caption:
            problems.append(f"{where}: the caption does not say it is drawn by docs/make_figures.py")
        if commits and not re.search(r"\bhistory\b", caption, re.I):
            if _git("diff", "--quiet", commits[0], "HEAD", "--", "fsll_ooc").returncode:
                problems.append(f"{where}: fsll_ooc/ changed since commit {commits[0]}; measure again "
                                "or mark the figure as history")
    assert not problems, "\n".join(problems)


def _provenance(text: str) -> tuple[bool, bool, bool]:
    commits = [h for h in HASH.findall(text) if re.search(r"\d", h) and re.search(r"[a-f]", h)]
    return bool(re.search(r"bench/\w+\.py", text)), bool(commits), bool(re.search(r"\bload\b", text))


def test_benchmark_tables_name_script_commit_and_load():
    """Every table of measurements on the benchmark pages has, in its subsection, its section's
    opening or the page's opening, the script that measured it, a commit and the load."""
    problems = []
    for path in sorted(DOCS.glob("benchmarks*.md")):
        text = _text(path)
        preamble = re.split(r"^## ", text, flags=re.M)[0]
        for heading, body in _sections(text)[1:]:
            parts = re.split(r"^(### .+)$", body, flags=re.M)
            for sub, part in [(heading, parts[0])] + list(zip(parts[1::2], parts[2::2])):
                if "|---" not in part:
                    continue
                found = [any(t) for t in zip(_provenance(part), _provenance(parts[0]), _provenance(preamble))]
                missing = [what for what, ok in zip(("the bench/ script", "the commit", "the load"), found) if not ok]
                if missing:
                    problems.append(f"{path.name}, {sub.strip()}: does not name {' or '.join(missing)}")
    assert not problems, "\n".join(problems)


def test_reliability_promises_cite_tests_that_exist():
    text = _text(DOCS / "reliability.md")
    start = text.index("\n## 5.")
    section = text[start:text.index("\n## ", start + 1)]
    promises = re.findall(r"^\* \*\*(.+?)\*\*((?:.|\n)*?)(?=^\* |\n\n|\Z)", section, re.M)
    assert len(promises) >= 5, "the promises are bullets starting with a bold sentence"
    tests = {p.name: _text(p) for p in (ROOT / "tests").glob("test_*.py")}
    problems = []
    for title, body in promises:
        cited = re.findall(r"`(?:tests/)?(test_\w+?)(?:\.py)?(?:::(test_\w+))?`", title + body)
        if not cited:
            problems.append(f"'{title}': cites no test")
        for a, b in cited:
            name = b or a
            if a + ".py" in tests and not b:
                continue                      # a test file
            files = [f for f in tests if not b or f == a + ".py"]
            if not any(re.search(rf"^\s*def {name}\(", tests[f], re.M) for f in files):
                problems.append(f"'{title}': cites {name}, which no test defines")
    assert not problems, "reliability.md section 5:\n" + "\n".join(problems)


def test_every_test_the_docs_cite_exists():
    """A test named in the docs (`test_name`, `tests/test_file.py`, `test_file.py::test_name`,
    `test_prefix_*`) is defined in tests/."""
    sources = "\n".join(_text(p) for p in (ROOT / "tests").glob("*.py"))
    defined = set(re.findall(r"^\s*(?:async )?def (test_\w+)\(", sources, re.M))
    problems = []
    for path in FILES:
        text = _text(path)
        for f in set(re.findall(r"\btests/([\w/]+\.py)\b", text)):
            if not (ROOT / "tests" / f).is_file():
                problems.append(f"{path.name}: tests/{f} does not exist")
        for name in set(re.findall(r"(?<![\w/.])(test_\w+\*?)(?![\w.(])", text)):
            if name.endswith("*"):
                ok = any(d.startswith(name[:-1]) for d in defined)
            else:
                ok = name in defined or (ROOT / "tests" / f"{name}.py").is_file()
            if not ok:
                problems.append(f"{path.name}: cites {name}, which no test defines")
    assert not problems, "\n".join(sorted(problems))


# ------------------------------------------------------------- API and command line

def _api_text() -> str:
    return _text(DOCS / "api.md")


def test_api_reference_covers_the_estimator():
    from fsll_ooc import FSLL

    text = _api_text()
    public = [n for n in dir(FSLL) if not n.startswith("_")]
    missing = [n for n in public if f"`{n}" not in text and f"{n}(" not in text]
    assert not missing, f"docs/api.md does not describe FSLL.{missing}; add them to its method table"
    params = [p for p in FSLL().get_params() if f"`{p}`" not in text]
    assert not params, f"docs/api.md does not describe the FSLL parameters {params}"


def test_api_reference_covers_the_average():
    from fsll_ooc import FSLLAverage

    text = _api_text()
    section = text[text.index("## `fsll_ooc.FSLLAverage`"):]
    public = [n for n in dir(FSLLAverage) if not n.startswith("_")]
    missing = [n for n in public if f"`{n}" not in section and f"{n}(" not in section]
    assert not missing, f"docs/api.md does not describe FSLLAverage.{missing}"


# modules whose every public name api.md mentions (``__all__``; storage: its public names)
MODULES = ["queries", "plotting", "io", "planner", "datasets", "missing", "executors", "learn", "average",
           "model_file", "storage", "cli"]
# modules whose every public function api.md gives with its full signature, in the module's section
SIGNED = ["queries", "plotting", "io", "planner", "datasets", "missing", "executors", "learn", "cli"]


def _public_names(module: str) -> list[str]:
    mod = importlib.import_module(f"fsll_ooc.{module}")
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    # a package without __all__: what it defines or re-exports, not its submodules
    return [n for n in dir(mod) if not n.startswith("_") and not inspect.ismodule(getattr(mod, n))
            and getattr(getattr(mod, n), "__module__", mod.__name__).startswith(mod.__name__)]


@pytest.mark.parametrize("module", MODULES)
def test_api_reference_covers_module(module):
    text = _api_text()
    missing = [n for n in _public_names(module) if not re.search(rf"\b{re.escape(n)}\b", text)]
    assert not missing, f"docs/api.md does not mention fsll_ooc.{module}.{missing}"
    assert f"fsll_ooc.{module}" in text, f"docs/api.md has no word on fsll_ooc.{module}"


def test_module_tables_name_every_module():
    """README's and api.md's module tables and design.md's map name every module of the package."""
    package = ROOT / "fsll_ooc"
    modules = sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py")
                     if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts)
    readme, design = _text(ROOT / "README.md"), _text(DOCS / "design.md")
    map_ = design[design.index("## The map"):design.index("\n## ", design.index("## The map") + 1)]
    problems = []
    for rel in modules:
        name = rel.rsplit("/", 1)[-1]
        if not re.search(rf"(?<![\w/]){re.escape(name)}\b", readme) and rel not in readme:
            problems.append(f"README.md's module table does not name {rel}")
        if name not in map_:
            problems.append(f"design.md's map does not name {rel}")
    for path in (ROOT / "README.md", DOCS / "design.md", DOCS / "api.md", DOCS / "guide.md", DOCS / "reliability.md"):
        for ref in set(re.findall(r"fsll_ooc/[\w/]+\.py", _text(path))):
            if not (ROOT / ref).is_file():
                problems.append(f"{path.name} names {ref}, which does not exist")
    assert not problems, "\n".join(problems)


def _sections(text: str) -> list[tuple[str, str]]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return [("", parts[0])] + list(zip(parts[1::2], parts[2::2]))


def _signature_spans(text: str) -> list[str]:
    """api.md writes a signature in bold (**`name(a, b=1)`**) or in the first cell of a table
    row (| `name(a, b=1)`, `other(x)` | ...); other backticked calls are examples."""
    spans = re.findall(r"\*\*`([^`]+)`\*\*", text, flags=re.S)
    for row in re.findall(r"^\|([^|\n]*)\|", text, flags=re.M):
        spans += re.findall(r"`([^`]+)`", row)
    return spans


def _documented_signatures(text: str):
    """(name, parameters, whether ``...`` elides some, the text) for every signature of api.md."""
    for span in _signature_spans(text):
        span = " ".join(span.split())
        m = re.fullmatch(r"([A-Za-z_][\w.]*)\((.*)\)", span)
        if not m:
            continue
        name, args = m.group(1), m.group(2)
        elided = bool(re.search(r"(^|,)\s*\.\.\.\s*(,|$)", args))
        args = re.sub(r"(^|,)\s*\.\.\.\s*(?=,|$)", "", args).strip(", ")
        try:
            fn = ast.parse(f"def f({args}): pass").body[0]
        except SyntaxError:
            continue                                    # an example call, not a signature
        a = fn.args
        positional = a.posonlyargs + a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        params = [(p.arg, d) for p, d in zip(positional, defaults)]
        if a.vararg:
            params.append(("*" + a.vararg.arg, None))
        params += [(p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
        if a.kwarg:
            params.append(("**" + a.kwarg.arg, None))
        yield name.rsplit(".", 1)[-1], params, elided, span


def _real_params(obj) -> dict[str, object]:
    out = {}
    for k, p in enumerate(inspect.signature(obj).parameters.values()):
        if k == 0 and p.name == "self":
            continue
        out[{"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(p.kind.name, "") + p.name] = p.default
    return out


def _namespaces() -> dict[str, dict]:
    """api.md section heading -> the public callables whose signatures that section gives."""
    import fsll_ooc
    from fsll_ooc import FSLL, FSLLAverage

    def methods(cls):
        return {n: getattr(cls, n) for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}

    def module(m):
        mod = importlib.import_module(f"fsll_ooc.{m}")
        return {n: getattr(mod, n) for n in _public_names(m) if callable(getattr(mod, n))}

    return {
        "`fsll_ooc.FSLL`": {"FSLL": FSLL, **methods(FSLL)},
        "`fsll_ooc.FSLLAverage`": {"FSLLAverage": FSLLAverage, **methods(FSLLAverage)},
        "Planning": {**module("planner"), "plan": fsll_ooc.plan},
        **{f"`fsll_ooc.{m}`": module(m) for m in SIGNED if m != "planner"},
    }


def _needs_signature(obj) -> bool:
    """Functions, methods and the classes users make; not exceptions, interfaces or results."""
    if isinstance(obj, type):
        return not (issubclass(obj, BaseException) or inspect.isabstract(obj) or dataclasses.is_dataclass(obj)
                    or obj.__name__ in ("Executor", "TableBackend"))
    try:
        inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    return True


def _check_signature(where, params, elided, real) -> list[str]:
    problems = []
    names = [p for p, _ in params]
    unknown = [p for p in names if p not in real]
    if unknown:
        problems.append(f"{where}: no parameter {unknown} in the code")
    if not elided and sorted(names) != sorted(real):
        problems.append(f"{where}: the code has the parameters {list(real)}")
    for p, d in params:
        if p not in real or p.startswith("*"):
            continue
        if d is None:
            if real[p] is not inspect.Parameter.empty:
                problems.append(f"{where}: {p} has the default {real[p]!r} in the code")
            continue
        try:
            value = ast.literal_eval(d)
        except ValueError:
            continue                                    # a name such as DEFAULT: not compared
        if real[p] is inspect.Parameter.empty or value != real[p] or type(value) is not type(real[p]):
            shown = "no default" if real[p] is inspect.Parameter.empty else repr(real[p])
            problems.append(f"{where}: {p}={ast.unparse(d)} in the docs, {shown} in the code")
    return problems


def test_api_signatures_match_the_code():
    spaces = _namespaces()
    problems, documented = [], set()
    for heading, body in _sections(_api_text()):
        space = spaces.get(heading.strip())
        if space is None:
            continue
        for name, params, elided, span in _documented_signatures(body):
            obj = space.get(name)
            if obj is None or not _needs_signature(obj) and not isinstance(obj, type):
                continue
            try:
                real = _real_params(obj)
            except (TypeError, ValueError):
                continue
            found = _check_signature(f"api.md, {heading.strip()}: `{span[:70]}`", params, elided, real)
            problems += found
            if not elided and not found:
                documented.add((heading.strip(), name))
    undocumented = [f"{h}: {n}" for h, space in spaces.items() for n, obj in space.items()
                    if (h, n) not in documented and _needs_signature(obj)]
    assert not problems and not undocumented, (
        "docs/api.md and inspect.signature disagree:\n" + "\n".join(problems)
        + ("\nno full signature (bold, or first cell of a table row) in docs/api.md for:\n"
           + "\n".join(undocumented) if undocumented else ""))


def test_api_result_types_list_their_fields():
    """The dataclasses api.md describes (plans, EM results, options) name every field there."""
    text = _api_text()
    problems = []
    for heading, space in _namespaces().items():
        body = dict(_sections(text)).get(heading, "")
        for name, obj in space.items():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj):
                missing = [f.name for f in dataclasses.fields(obj)
                           if not f.name.startswith("_") and not re.search(rf"`{f.name}\b|\b{f.name}[`=(]", body)]
                if missing:
                    problems.append(f"{heading}: {name} fields {missing}")
    assert not problems, "docs/api.md does not describe:\n" + "\n".join(problems)


def _cli_section() -> str:
    guide = _text(DOCS / "guide.md")
    start = guide.index("## The command line")
    return guide[start:guide.index("\n## ", start + 1)]


def _subcommands():
    from fsll_ooc import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, sub.choices


def _flags(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def test_guide_covers_every_command_and_option():
    parser, commands = _subcommands()
    section = _cli_section()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `fsll-ooc (\w+)[^|]*\|.*$", section, re.M)}
    problems = []
    for name, sub in commands.items():
        row = rows.get(name)
        if row is None:
            problems.append(f"no row for `fsll-ooc {name}` in the guide's command table")
            continue
        shown = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", row))
        for flag in sorted(_flags(sub) - shown):
            problems.append(f"fsll-ooc {name} {flag}: not in its row of the guide's command table")
        for flag in sorted(shown - _flags(sub)):
            problems.append(f"fsll-ooc {name} {flag}: in the guide's command table, but not an option of the command")
    for flag in sorted(_flags(parser)):
        if flag not in section:
            problems.append(f"fsll-ooc {flag}: not in the guide's command-line section")
    assert not problems, "\n".join(problems)
