"""Every example in docs/*.md and README.md runs, and the docs cover the public API.

The code blocks of one file run in order, in one namespace, in an empty temporary
directory, with the parser and runner of ``docs/make_figures.py`` (which also
regenerates the outputs shown in the docs and the tutorial's pictures).  Outputs are
not compared: numbers legitimately change with the learner.
"""
from __future__ import annotations

import importlib.util
import re
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
FILES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
USER_DOCS = ("guide.md", "api.md", "tutorial.md", "model-format.md")


def _runnable(path: Path) -> list:
    return [b for b in runner.parse(path) if b.lang in ("python", "bash") and not b.skip]


@pytest.mark.parametrize("path", [f for f in FILES if _runnable(f)], ids=lambda p: p.name)
def test_examples_run(path, tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    code = "\n".join(b.code for b in _runnable(path))
    if ("plot" in code or "matplotlib" in code) and importlib.util.find_spec("matplotlib") is None:
        pytest.skip('needs matplotlib: pip install "fsll-ooc[docs]"')
    runner.run_file(path, tmp_path)
    # the pictures the docs show are the ones their code makes
    for ref in re.findall(r"!\[[^\]]*\]\((img/[^)]+)\)", path.read_text(encoding="utf-8")):
        assert (tmp_path / ref).is_file(), f"{path.name}: the code does not produce {ref}"
        assert (DOCS / ref).is_file(), f"{path.name}: {ref} is missing in docs/; run python docs/make_figures.py"


def test_user_docs_exist_and_link():
    for name in USER_DOCS:
        assert (DOCS / name).is_file(), name
    guide = (DOCS / "guide.md").read_text(encoding="utf-8")
    for name in ("tutorial.md", "api.md", "model-format.md"):
        assert f"({name}" in guide, f"guide.md does not link {name}"


def test_skipped_blocks_say_why():
    for path in FILES:
        for b in runner.parse(path):
            if b.skip is not None:
                assert len(b.skip) > 10, f"{path.name}:{b.line}: say why the block is not run"


def test_bash_blocks_only_hold_runnable_commands():
    for path in FILES:
        for b in _runnable(path):
            if b.lang != "bash":
                continue
            for k, cmd in runner._commands(b.code):
                ok = cmd.startswith(("fsll-ooc ", "python tools/plan_memory.py ", "pip "))
                assert ok, f"{path.name}:{b.line + k}: {cmd!r} would not run in the tests"


def test_parser_links_outputs_and_skips(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("# t\n\n```python\nprint(1 + 1)\n```\n\n```text\nold\n```\n\n"
                  "<!-- not run: needs a cluster of 100 nodes -->\n```bash\ndask scheduler\n```\n"
                  "```bash\nfsll-ooc plan --cards 2x40 --memory 1GiB --disk 1GiB   # exit 3\n```\n")
    blocks = runner.parse(md)
    assert [b.lang for b in blocks] == ["python", "text", "bash", "bash"]
    assert blocks[0].output is not None and blocks[2].skip == "needs a cluster of 100 nodes"
    outputs = runner.run_file(md, tmp_path)
    assert outputs[0] == "2\n" and outputs[2] is None
    assert runner.rewrite_outputs(md, outputs)
    assert "```text\n2\n```" in md.read_text()
    md.write_text("```bash\nfsll-ooc plan --cards 2x40 --memory 1GiB --disk 1GiB\n```\n")
    with pytest.raises(runner.DocError, match="exited with 3, the docs say 0"):
        runner.run_file(md, tmp_path)
    md.write_text("```python\n1 / 0\n```\n")
    with pytest.raises(runner.DocError, match=r"x.md:2: the python block failed: ZeroDivisionError"):
        runner.run_file(md, tmp_path)


# ------------------------------------------------------------- API coverage

def _api_text() -> str:
    return (DOCS / "api.md").read_text(encoding="utf-8")


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


@pytest.mark.parametrize("module", ["queries", "plotting", "io", "planner", "datasets"])
def test_api_reference_covers_module(module):
    import importlib

    mod = importlib.import_module(f"fsll_ooc.{module}")
    text = _api_text()
    missing = [n for n in mod.__all__ if n not in text]
    assert not missing, f"docs/api.md does not mention fsll_ooc.{module}.{missing}"


def test_guide_covers_every_command():
    from fsll_ooc import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    guide = (DOCS / "guide.md").read_text(encoding="utf-8")
    missing = [c for c in sub.choices if f"fsll-ooc {c}" not in guide]
    assert not missing, f"docs/guide.md does not describe the commands {missing}"
