"""Tests of the command-line interface (in-process through main(), plus one subprocess)."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from fsll_ooc import cli
from fsll_ooc.cli import common
from fsll_ooc.queries import describe_factor, factor_text
from fsll_ooc.io import encode_with

N_ROWS = 300


@pytest.fixture(scope="module")
def data_csv(tmp_path_factory):
    """3 dependent columns with mixed labels: strings, integer codes, bools."""
    rng = np.random.default_rng(7)
    colour = rng.choice(["red", "green", "blue"], size=N_ROWS, p=[0.5, 0.3, 0.2])
    size = np.where(colour == "red", rng.integers(0, 2, N_ROWS), rng.integers(0, 4, N_ROWS))
    ok = (size >= 2) ^ (rng.random(N_ROWS) < 0.1)
    path = tmp_path_factory.mktemp("cli") / "data.csv"
    pd.DataFrame({"colour": colour, "size": size, "ok": ok}).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def model_path(data_csv):
    out = data_csv.parent / "model.fsll"
    assert cli.main(["fit", str(data_csv), "--out", str(out), "--quiet"]) == 0
    return out


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_usage_error(rc, out, err, *frags):
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fsll-ooc: error: "), err
    assert "Traceback" not in err
    for frag in frags:
        assert frag in lines[0], (frag, lines[0])


# ------------------------------------------------------------------- happy paths

def test_fit_prints_summary_and_saves(capsys, data_csv, tmp_path):
    out_path = tmp_path / "m.fsll"
    rc, out, err = run(capsys, "fit", data_csv, "--out", out_path)
    assert rc == 0, err
    assert f"{N_ROWS} samples, 3 variables" in out
    assert "colour:3, size:4, ok:2; 24 cells" in out
    assert "bases" in out and "cost" in out and f"saved to {out_path}" in out
    assert out_path.exists()
    assert err == ""            # stderr is not a TTY under capsys: no progress bar


def test_fit_json(capsys, data_csv, tmp_path):
    rc, out, _ = run(capsys, "fit", data_csv, "-o", tmp_path / "m.fsll", "--json", "--epsilon", "1e-3")
    assert rc == 0
    s = json.loads(out)
    assert s["n_samples"] == N_ROWS and s["n_vars"] == 3
    assert s["names"] == ["colour", "size", "ok"] and s["cardinalities"] == [3, 4, 2]
    assert s["n_bases"] >= 1 and s["cost"] > 0 and s["seconds"] >= 0


def test_model_keeps_labels(model_path):
    m = common.model_class().load(model_path)
    assert list(m.feature_names_in_) == ["colour", "size", "ok"]
    assert [list(c) for c in m.categories_] == [["blue", "green", "red"], [0, 1, 2, 3], [False, True]]
    assert tuple(m.cardinalities_) == (3, 4, 2)


def test_info_text_and_json(capsys, model_path):
    rc, out, _ = run(capsys, "info", model_path)
    assert rc == 0
    assert "variables   3: colour (3), size (4), ok (2)" in out
    assert "joint table 24 cells" in out
    assert "terms by share of the cost reduction" in out
    assert "share" in out and "%" in out
    rc, out, _ = run(capsys, "info", model_path, "--json", "--top", "0")
    assert rc == 0
    info = json.loads(out)
    terms = info["terms"]
    assert len(terms) == info["n_terms"] >= 1
    shares = [t["share"] for t in terms]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    assert sum(info["terms_by_order"].values()) == len(terms)
    m = common.model_class().load(model_path)
    assert [t["term"] for t in terms] == list(m.interactions()["term"])
    for t in terms:
        assert t["order"] == len(t["factors"]) == len(t["variables"]) == sum(1 for v in t["y"] if v)
        assert t["term"] == " * ".join(factor_text(f) for f in t["factors"])
        for f in t["factors"]:
            assert f["var"] in ("colour", "size", "ok")
            assert f["basis"] == ("indicator" if f["var"] == "colour" else "walsh")
    rc, out, _ = run(capsys, "info", model_path, "--json", "--top", "1")
    assert len(json.loads(out)["terms"]) == 1


def test_info_sample_and_score_take_an_average(capsys, data_csv, tmp_path):
    from fsll_ooc import FSLLAverage

    df = pd.read_csv(data_csv)
    avg = FSLLAverage(n_members=3, progress=False).fit(df)
    path = tmp_path / "avg.json"
    avg.save(path)
    rc, out, _ = run(capsys, "info", path, "--json", "--top", "0")
    assert rc == 0
    info = json.loads(out)
    assert info["average_of"] == 3 and info["names"] == ["colour", "size", "ok"] and info["n_samples"] == len(df)
    for k, (mem, m) in enumerate(zip(info["members"], avg.members_)):
        assert mem["member"] == k and mem["n_bases"] == m.n_bases_ == mem["n_terms"] == len(mem["terms"])
        assert sorted(tuple(t["y"]) for t in mem["terms"]) == sorted(m.theta_)
    rc, out, _ = run(capsys, "info", path, "--top", "1")
    assert rc == 0 and "FSLL average of 3 models" in out and out.count("\nmember ") == 3
    # score: the mixture's log-likelihood, the mean of the members' probabilities
    rc, out, _ = run(capsys, "score", path, data_csv, "--json")
    assert rc == 0
    mean = np.mean([np.exp(m.log_prob(df)) for m in avg.members_], axis=0)
    assert json.loads(out)["mean_log_likelihood"] == pytest.approx(float(np.mean(np.log(mean))), rel=1e-12)
    rc, out, _ = run(capsys, "sample", path, "-n", 40, "--seed", 1)
    assert rc == 0
    drawn = pd.read_csv(io.StringIO(out))
    assert list(drawn.columns) == ["colour", "size", "ok"] and len(drawn) == 40
    assert set(drawn["colour"]) <= {"red", "green", "blue"}
    # plot: each member's cost, and the mixture's dependence
    pytest.importorskip("matplotlib")
    rc, out, err = run(capsys, "plot", path, "--out-dir", tmp_path / "png")
    assert rc == 0, err
    assert (tmp_path / "png" / "avg-interactions.png").exists() and (tmp_path / "png" / "avg-cost.png").exists()


def test_info_term_labels():
    # colour: k=3 (indicator basis), size: k=4 (Walsh), ok: k=2 (Walsh)
    cats = [["blue", "green", "red"], [0, 1, 2, 3], [False, True]]
    f = describe_factor("colour", cats[0], 3, 2)
    assert factor_text(f) == "colour=red"
    f = describe_factor("size", cats[1], 4, 1)
    assert f["plus"] == [0, 2] and factor_text(f) == "size in {0,2}"
    f = describe_factor("ok", cats[2], 2, 1)
    assert factor_text(f) == "ok=False"


def test_sample_stdout_and_file(capsys, model_path, tmp_path):
    rc, out, _ = run(capsys, "sample", model_path, "-n", 50, "--seed", 3)
    assert rc == 0
    df = pd.read_csv(io.StringIO(out))
    assert list(df.columns) == ["colour", "size", "ok"] and len(df) == 50
    assert set(df["colour"]) <= {"blue", "green", "red"}
    assert set(df["size"]) <= {0, 1, 2, 3} and set(df["ok"]) <= {False, True}
    rc, out2, _ = run(capsys, "sample", model_path, "-n", 50, "--seed", 3)
    assert out2 == out                       # same seed, same samples
    target = tmp_path / "s.csv"
    rc, out3, _ = run(capsys, "sample", model_path, "-n", 20, "--out", target)
    assert rc == 0 and out3 == ""
    assert len(pd.read_csv(target)) == 20


def test_score_matches_model(capsys, model_path, data_csv):
    rc, out, _ = run(capsys, "score", model_path, data_csv, "--json")
    assert rc == 0
    res = json.loads(out)
    m = common.model_class().load(model_path)
    df = pd.read_csv(data_csv)
    codes = encode_with(m.categories_, df, names=m.feature_names_in_)
    expected = float(np.mean(m.log_prob(codes)))
    assert res["n_samples"] == N_ROWS
    assert res["mean_log_likelihood"] == pytest.approx(expected, rel=1e-12)
    assert -np.log(24) - 1 < res["mean_log_likelihood"] < 0
    rc, out, _ = run(capsys, "score", model_path, data_csv)
    assert rc == 0 and "mean log-likelihood" in out and "nats per sample" in out


def test_score_columns_by_name(capsys, model_path, tmp_path, data_csv):
    df = pd.read_csv(data_csv)
    f = tmp_path / "reordered.csv"
    df[["ok", "colour", "size"]].head(40).to_csv(f, index=False)
    rc, out, _ = run(capsys, "score", model_path, f, "--json")
    assert rc == 0 and json.loads(out)["n_samples"] == 40


def test_fit_npy_with_cardinalities(capsys, tmp_path):
    X = np.random.default_rng(0).integers(0, 2, size=(200, 3))
    np.save(tmp_path / "x.npy", X)
    rc, out, _ = run(capsys, "fit", tmp_path / "x.npy", "-o", tmp_path / "x.fsll",
                     "--cardinalities", "2,3,2", "--json")
    assert rc == 0
    assert json.loads(out)["cardinalities"] == [2, 3, 2]
    rc, out, _ = run(capsys, "info", tmp_path / "x.fsll")
    assert rc == 0 and "X0 (2), X1 (3), X2 (2)" in out


def test_progress_only_on_a_tty(capsys, data_csv, tmp_path, monkeypatch):
    seen = []
    real = common.model_class()

    class Spy(real):
        def __init__(self, *a, **kw):
            seen.append(kw.get("progress"))
            super().__init__(*a, **kw)

    monkeypatch.setattr(common, "model_class", lambda: Spy)
    assert run(capsys, "fit", data_csv, "-o", tmp_path / "m.fsll")[0] == 0
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert run(capsys, "fit", data_csv, "-o", tmp_path / "m.fsll", "--quiet")[0] == 0
    assert seen == [False, False]


def test_help_for_every_command(capsys):
    for cmd in ([], ["demo"], ["fit"], ["info"], ["sample"], ["score"], ["plot"], ["plan"]):
        rc, out, _ = run(capsys, *cmd, "--help")
        assert rc == 0 and "usage: fsll-ooc" in out
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and "fsll-ooc" in out


# ---------------------------------------------------------------------- demo

def test_demo_row(capsys, monkeypatch):
    from fsll_ooc import datasets

    def small(name, seed=0):                   # a 4-variable stand-in, fast
        p = datasets.ising_grid(2, 2, coupling=0.5)
        return datasets.sample_table(p, 500, seed=seed), p

    monkeypatch.setattr(datasets, "paper_dataset", small)
    rc, out, err = run(capsys, "demo", "--dataset", "Ising5x4S")
    assert rc == 0
    assert "kernels ready in" in err  # loaded (or compiled) before the timed fit, said on stderr
    lines = out.splitlines()
    assert lines[0].split() == ["data", "N", "KL(pd||p)", "KL(p*||p)", "#basis", "iterations", "seconds"]
    assert lines[1].split()[:2] == ["Ising5x4S", "500"]
    assert lines[2].split() == ["(paper)", "2.501", "0.012", "31", "5"]
    rc, out, _ = run(capsys, "demo", "--all", "--json")
    rows = json.loads(out)
    assert [r["data"] for r in rows] == list(datasets.PAPER_DATASETS)
    assert all(r["kl_true"] >= 0 and r["kl_data"] >= 0 for r in rows)
    assert all(r["kernel_load_seconds"] >= 0 and r["seconds"] > 0 for r in rows)


# -------------------------------------------------------------------- errors

def test_error_missing_file(capsys, tmp_path):
    assert_usage_error(*run(capsys, "fit", tmp_path / "nope.csv", "-o", tmp_path / "m"), "no such file")
    assert_usage_error(*run(capsys, "info", tmp_path / "nope.fsll"), "no such model file")
    assert_usage_error(*run(capsys, "score", tmp_path / "nope.fsll", tmp_path / "d.csv"), "no such model")


def test_error_ragged_csv(capsys, tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("a,b,c\n1,x,2\n2,y\n")
    assert_usage_error(*run(capsys, "fit", f, "-o", tmp_path / "m"), "r.csv, line 3", "2 fields")


def test_error_out_of_range_cardinality(capsys, data_csv, tmp_path):
    assert_usage_error(*run(capsys, "fit", data_csv, "-o", tmp_path / "m", "--cardinalities", "3,3,2"),
                       "column 'size'", "declared cardinality 3", "line ")
    assert_usage_error(*run(capsys, "fit", data_csv, "-o", tmp_path / "m", "--cardinalities", "3,4"),
                       "2 cardinalities", "3 columns")
    assert_usage_error(*run(capsys, "fit", data_csv, "-o", tmp_path / "m", "--cardinalities", "a,b"),
                       "--cardinalities", "comma-separated")


def test_error_unsupported_extension_and_usage(capsys, tmp_path):
    assert_usage_error(*run(capsys, "fit", tmp_path / "d.xlsx", "-o", tmp_path / "m"),
                       "unsupported file type '.xlsx'", ".csv, .tsv, .txt, .npy, .parquet")
    assert_usage_error(*run(capsys, "fit", tmp_path / "d.csv"), "--out")
    assert_usage_error(*run(capsys), "required")
    assert_usage_error(*run(capsys, "frobnicate"), "invalid choice")
    assert_usage_error(*run(capsys, "fit", "d.csv", "-o", "m", "--epsilon", "0"), "positive number")


def test_error_score_unknown_category(capsys, model_path, tmp_path):
    f = tmp_path / "new.csv"
    f.write_text("colour,size,ok\nred,1,True\npurple,0,False\n")
    assert_usage_error(*run(capsys, "score", model_path, f),
                       "column 'colour'", "unknown category 'purple'", "line 3")
    f.write_text("colour,size\nred,1\n")
    assert_usage_error(*run(capsys, "score", model_path, f), "lacks the model's column(s) 'ok'")


def test_error_sample_args(capsys, model_path, tmp_path):
    assert_usage_error(*run(capsys, "sample", model_path, "-n", 0), "positive integer")
    assert_usage_error(*run(capsys, "sample", model_path, "-n", 3, "--out", tmp_path / "s.txt"), ".csv")
    assert_usage_error(*run(capsys, "sample", model_path, "-n", 3, "--out", tmp_path / "no" / "s.csv"),
                       "does not exist")


def test_error_unwritable_model_path_before_fitting(capsys, data_csv, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "model_class", lambda: pytest.fail("must not fit"))
    assert_usage_error(*run(capsys, "fit", data_csv, "-o", tmp_path / "no" / "m.fsll"),
                       "cannot write the model", "does not exist")
    assert_usage_error(*run(capsys, "fit", data_csv, "-o", tmp_path), "is a directory")


def test_error_not_a_model_file(capsys, tmp_path):
    f = tmp_path / "bad.fsll"
    f.write_text("{}")
    assert_usage_error(*run(capsys, "info", f), "not an fsll-ooc model file")


def test_unexpected_failure_exit_1(capsys, data_csv, tmp_path, monkeypatch):
    class Broken:
        def __init__(self, **kw):
            pass

        def fit(self, codes, **labels):
            raise RuntimeError("boom")

    monkeypatch.setattr(common, "model_class", lambda: Broken)
    rc, out, err = run(capsys, "fit", data_csv, "-o", tmp_path / "m")
    assert rc == 1
    assert err.strip().splitlines() == [
        "fsll-ooc: error: unexpected failure: RuntimeError: boom (run 'fsll-ooc --debug ...' for the traceback)"]
    rc, out, err = run(capsys, "--debug", "fit", data_csv, "-o", tmp_path / "m")
    assert rc == 1 and "Traceback" in err and "boom" in err


def test_subprocess_entry_point(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fsll_ooc.cli", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for cmd in ("demo", "fit", "info", "sample", "score", "plot", "plan"):
        assert cmd in r.stdout
    r = subprocess.run([sys.executable, "-m", "fsll_ooc.cli", "fit", str(tmp_path / "x.csv"), "-o", "m"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"fsll-ooc: error: no such file: '{tmp_path / 'x.csv'}'"]


# ------------------------------------------------------------- sample --json

def test_sample_json(capsys, model_path):
    rc, out, _ = run(capsys, "sample", model_path, "-n", 5, "--seed", 1, "--json")
    assert rc == 0
    rows = json.loads(out)
    assert len(rows) == 5 and set(rows[0]) == {"colour", "size", "ok"}
    assert rows[0]["colour"] in ("blue", "green", "red") and isinstance(rows[0]["ok"], bool)
    rc, csv_out, _ = run(capsys, "sample", model_path, "-n", 5, "--seed", 1)
    assert pd.read_csv(io.StringIO(csv_out))["colour"].tolist() == [r["colour"] for r in rows]
    assert_usage_error(*run(capsys, "sample", model_path, "-n", 5, "--json", "--out", "x.csv"), "--json")


# ---------------------------------------------------------------------- plot

def test_plot_writes_pngs(capsys, model_path, tmp_path):
    pytest.importorskip("matplotlib")
    rc, out, err = run(capsys, "plot", model_path, "--out-dir", tmp_path / "figs")
    assert rc == 0, err
    cost, graph = tmp_path / "figs" / "model-cost.png", tmp_path / "figs" / "model-interactions.png"
    assert out.splitlines() == [f"wrote {cost}", f"wrote {graph}"]
    for f in (cost, graph):
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc, out, _ = run(capsys, "plot", model_path, "-d", tmp_path, "--prefix", "x", "--weight", "theta",
                     "--top", 0, "--json")
    assert rc == 0 and json.loads(out)["files"] == [str(tmp_path / "x-cost.png"), str(tmp_path / "x-interactions.png")]
    f = tmp_path / "file"
    f.write_text("")
    assert_usage_error(*run(capsys, "plot", model_path, "-d", f), "is a file")


def test_plot_without_matplotlib_exit_1(capsys, model_path, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError
    rc, out, err = run(capsys, "plot", model_path, "-d", tmp_path)
    assert rc == 1
    assert err.strip() == ('fsll-ooc: error: plotting needs matplotlib; install it with: '
                           'pip install "fsll-ooc[docs]" (or pip install matplotlib)')


# ---------------------------------------------------------------------- plan

def test_plan_feasible_infeasible_bad_input(capsys, data_csv):
    rc, out, _ = run(capsys, "plan", "--cards", "2x20,3x4", "--memory", "4GiB", "--disk", "100GiB")
    assert rc == 0 and out.startswith("fsll-ooc plan: 24 variables") and "FEASIBLE" in out
    rc, out, _ = run(capsys, "plan", "--cards", "2x34", "--memory", "4GiB", "--disk", "100GiB")
    assert rc == cli.EXIT_INFEASIBLE == 3 and "INFEASIBLE" in out and "! the store needs" in out
    rc, out, _ = run(capsys, "plan", "--cards", "2x30", "--memory", "4GiB", "--disk", "100GiB",
                     "--workers", 2, "--json")
    p = json.loads(out)
    assert rc == 0 and p["feasible"] and p["out_of_core"] and p["cells"] == 2**30
    assert p["peak_memory"] <= 4 * 2**30 and p["report"].startswith("fsll-ooc plan: 30 variables")
    rc, out, _ = run(capsys, "plan", "--data", data_csv, "--json")
    assert rc == 0 and json.loads(out)["cards"] == [3, 4, 2]
    assert_usage_error(*run(capsys, "plan", "--cards", "2x3,a"), "cannot read cardinalities 'a'")
    assert_usage_error(*run(capsys, "plan", "--cards", "2x3", "--memory", "lots"), "cannot read 'lots'")
    assert_usage_error(*run(capsys, "plan"), "one of the arguments --cards --data is required")
    assert_usage_error(*run(capsys, "plan", "--cards", "2", "--data", data_csv), "not allowed with")


def test_plan_memory_tool_is_the_same_command(tmp_path):
    import pathlib

    tool = pathlib.Path(__file__).resolve().parents[1] / "tools" / "plan_memory.py"
    args = ["--cards", "2x34", "--memory", "4GiB", "--disk", "100GiB"]
    r = subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert r.stdout.rstrip("\n") == cli_plan_report(args)


def cli_plan_report(args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.plan_main(args) == 3
    return out.getvalue().rstrip("\n")


# ------------------------------------------------------- out of core via the CLI

def test_fit_out_of_core_and_use_the_store(capsys, data_csv, tmp_path):
    store = tmp_path / "fit.zarr"
    rc, out, err = run(capsys, "fit", data_csv, "-o", tmp_path / "m.json", "--store", store,
                       "--memory-limit", "1GiB", "--json")
    assert rc == 0, err
    assert json.loads(out)["store"] == str(store) and (store / "fsll_state.json").exists()
    rc, info_file, _ = run(capsys, "info", tmp_path / "m.json", "--json")
    rc2, info_store, _ = run(capsys, "info", store, "--json")
    assert rc == rc2 == 0
    a, b = json.loads(info_file), json.loads(info_store)
    assert [t["term"] for t in a["terms"]] == [t["term"] for t in b["terms"]]
    assert b["names"] == ["colour", "size", "ok"]
    rc, out, _ = run(capsys, "sample", store, "-n", 7, "--seed", 0)
    df = pd.read_csv(io.StringIO(out))
    assert rc == 0 and len(df) == 7 and set(df["colour"]) <= {"blue", "green", "red"}
    assert_usage_error(*run(capsys, "info", tmp_path), "not an fsll-ooc store")
    assert_usage_error(*run(capsys, "fit", data_csv, "-o", tmp_path / "m2.json", "--memory-limit", "x"),
                       "cannot read 'x' as a size")


def _interrupted_cli_fit(capsys, data_csv, tmp_path, monkeypatch):
    """The store of a CLI fit stopped by a Ctrl-C after its third state write."""
    from fsll_ooc.storage.fit_store import FitStore

    store = tmp_path / "s"
    orig, calls = FitStore.write_state, [0]

    def write_state(self, *a):
        orig(self, *a)
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt  # as a user's Ctrl-C

    monkeypatch.setattr(FitStore, "write_state", write_state)
    assert run(capsys, "fit", data_csv, "-o", tmp_path / "m.json", "--store", store, "--quiet")[0] == 130
    monkeypatch.undo()
    return store


def test_resume_takes_a_memory_limit(capsys, data_csv, tmp_path, monkeypatch):
    """`resume --memory-limit` replaces the fit's own limit for that run, as FSLL.resume does."""
    from fsll_ooc import FSLL

    store = _interrupted_cli_fit(capsys, data_csv, tmp_path, monkeypatch)
    assert_usage_error(*run(capsys, "resume", store, "--memory-limit", "lots"), "cannot read 'lots' as a size")
    seen, resume = [], FSLL.resume.__func__

    def spy(cls, *a, **k):
        seen.append(k.get("memory_limit"))
        return resume(cls, *a, **k)

    monkeypatch.setattr(FSLL, "resume", classmethod(spy))
    rc, _, _ = run(capsys, "resume", store, "--memory-limit", "2GiB", "-o", tmp_path / "m.json", "--quiet")
    assert rc == 0 and seen == [2 * 2**30]
    monkeypatch.undo()
    assert FSLL.load(tmp_path / "m.json").theta_ == FSLL.resume(store, progress=False).theta_


def test_labels_of_a_cli_fit_live_in_its_store(capsys, data_csv, tmp_path, monkeypatch):
    """A CLI fit stopped midway and resumed in Python keeps its names and labels; a later
    library fit into the same store does not show them."""
    from fsll_ooc import FSLL

    store = _interrupted_cli_fit(capsys, data_csv, tmp_path, monkeypatch)
    assert not (tmp_path / "m.json").exists() and not (store / "fsll_cli_labels.json").exists()
    m = FSLL.resume(store, progress=False)
    assert m.feature_names_in_ == ["colour", "size", "ok"]
    assert m.categories_ == [["blue", "green", "red"], [0, 1, 2, 3], [False, True]]
    rc, out, _ = run(capsys, "info", store, "--json")
    assert rc == 0 and json.loads(out)["names"] == ["colour", "size", "ok"]
    FSLL(progress=False, store=store).fit(np.array([[0, 1], [1, 0], [1, 1]] * 20))
    assert FSLL.resume(store, progress=False).feature_names_in_ is None
    rc, out, _ = run(capsys, "info", store, "--json")
    assert rc == 0 and json.loads(out)["names"] == ["X0", "X1"]


def test_fit_bad_scheduler_address(capsys, data_csv, tmp_path, monkeypatch):
    import dask.distributed as distributed

    def refuse(address, timeout=None):  # what Client does after its timeout, without the wait
        raise OSError(f"Timed out trying to connect to {address} after {timeout}")

    monkeypatch.setattr(distributed, "Client", refuse)
    assert_usage_error(*run(capsys, "fit", data_csv, "-o", tmp_path / "m.json", "--scheduler", "tcp://127.0.0.1:1"),
                       "cannot connect to the dask scheduler at 'tcp://127.0.0.1:1'")


def test_info_and_plot_without_history(capsys, model_path, tmp_path):
    doc = json.loads(model_path.read_text())
    doc["history"] = []
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc))
    rc, out, _ = run(capsys, "info", bare)
    assert rc == 0 and " n/a " in out
    rc, out, _ = run(capsys, "info", bare, "--json")
    terms = json.loads(out)["terms"]
    assert all(t["share"] is None for t in terms)
    thetas = [abs(t["theta"]) for t in terms]
    assert thetas == sorted(thetas, reverse=True)       # then ordered by |theta|
    pytest.importorskip("matplotlib")
    rc, out, _ = run(capsys, "plot", bare, "-d", tmp_path)
    assert rc == 0 and out.splitlines() == [f"wrote {tmp_path / 'bare-interactions.png'}"]


@pytest.mark.parametrize("argv", [("plan", "--cards", "2x10", "--memory", "-5GiB"),
                                  ("plan", "--cards", "2x10", "--disk", "-1")])
def test_a_negative_size_is_read_as_the_options_value(capsys, argv):
    """``--memory -5GiB`` is the option's value (argparse alone reads it as another option
    and says "expected one argument"); the size's own check refuses it in one line."""
    assert_usage_error(*run(capsys, *argv), "cannot read", repr(argv[-1]))


def test_plan_budgets_the_threads_a_fit_runs_out_of_core(capsys):
    """``plan`` without ``--workers`` budgets as many tasks as a fit out of core runs at once:
    this machine's threads, at least 2 (the fit's own plan, ``fitting.workers``)."""
    import json

    from fsll_ooc.kernels import threadpool

    try:
        threadpool.set_num_threads(5)
        rc, out, err = run(capsys, "plan", "--cards", "2x24", "--memory", "1GiB", "--json")
    finally:
        threadpool.set_num_threads(None)
    assert rc == 0, err
    assert json.loads(out)["workers"] == 5
    rc, out, err = run(capsys, "plan", "--cards", "2x24", "--memory", "1GiB", "--json", "--workers", "3")
    assert rc == 0 and json.loads(out)["workers"] == 3
