"""A new user's first hour, tested from the user's side: API calls and CLI runs.

Each test is something a first-time user does and what they must see: pictures that
stay readable for many variables, no silent wrong answer, no lost file, no refusal
without a way forward.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

# ------------------------------------------------------------------ pictures


def _model(n: int, terms: dict, names=None):
    """A fitted-model stand-in with the attributes the pictures read, and a history in
    which term ``y`` was appended with gain ``terms[y]`` (so its share is known)."""
    hist = [{"iter": 0, "move": "init", "cost": 5.0, "n_bases": 0, "delta": 0.0}]
    cost = 5.0
    theta = {}
    for it, (group, gain) in enumerate(terms.items(), 1):
        y = tuple(1 if i in group else 0 for i in range(n))
        cost -= gain
        hist.append({"iter": it, "move": "append", "y": list(y), "delta": -gain, "cost": cost, "n_bases": it})
        theta[y] = 0.3
    ks = (2,) * n
    return types.SimpleNamespace(cardinalities_=ks, theta_=theta, history_=hist, n_samples_=1000,
                                 epsilon="auto", feature_names_in_=names or [f"v{i}" for i in range(n)],
                                 categories_=[[0, 1]] * n)


def test_pair_strengths_split_each_term_over_its_pairs():
    from fsll_ooc.plotting import pair_strengths

    # gains 4 (single), 2 (pair), 3 (triple), 1 (pair 0-1 once more): total 10
    m = _model(4, {(0,): 4.0, (0, 1): 2.0, (0, 1, 2): 3.0})
    m.history_.append({"iter": 4, "move": "adjust", "y": [1, 1, 0, 0], "delta": -1.0, "cost": 0.0, "n_bases": 3})
    p = pair_strengths(m)
    expected = np.zeros((4, 4))
    expected[0, 0] = 0.4
    expected[0, 1] = expected[1, 0] = 0.3 + 0.1          # the pair whole, a third of the triple
    expected[0, 2] = expected[2, 0] = expected[1, 2] = expected[2, 1] = 0.1
    np.testing.assert_allclose(p, expected, atol=1e-12)
    # the upper triangle holds all of the interactions' share
    assert np.triu(p, 1).sum() == pytest.approx(0.6)


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("n", [5, 17, 30])
def test_interaction_view_readable_for_many_variables(n):
    pytest.importorskip("matplotlib")
    from fsll_ooc.plotting import plot_interactions

    rng = np.random.default_rng(n)
    terms = {(i,): 0.5 for i in range(n)}
    for i in range(n):
        terms[(i, (i + 1) % n)] = float(rng.uniform(0.1, 1.0))
    # higher orders 3 .. min(n, 12): more orders than a legend of colours can tell apart
    for o in range(3, min(n, 12) + 1):
        terms[tuple(sorted(rng.choice(n, o, replace=False)))] = float(rng.uniform(0.05, 0.3))
    names = [f"variable_{i}" for i in range(n)]
    ax = plot_interactions(_model(n, terms, names), top=None, weight="share")  # the terms' view: hubs, orders
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    # the pairwise-share heatmap stands beside the graph, one row and column per variable
    heat = [a for a in fig.axes if a.images]
    assert len(heat) == 1 and heat[0].images[0].get_array().shape == (n, n)
    assert [t.get_text() for t in heat[0].get_yticklabels()] == names
    # every order drawn has its own colour (a legend entry or a colour-bar level)
    orders = sorted({len(g) for g in terms if len(g) >= 2})
    colours = {}
    for line in ax.lines:
        colours.setdefault(line.get_color() if isinstance(line.get_color(), str) else tuple(line.get_color()),
                           None)
    assert len(colours) >= len(orders)
    # no variable's label under the legend or the title, and none outside the figure
    labels = [t for t in ax.texts if t.get_text().startswith("variable_")]
    assert len(labels) == n
    blockers = [ax.get_legend().get_window_extent(renderer), ax.title.get_window_extent(renderer)]
    fig_box = fig.bbox
    for t in labels:
        box = t.get_window_extent(renderer)
        assert not any(_boxes_overlap(box, b) for b in blockers), t.get_text()
        assert fig_box.x0 <= box.x0 and box.x1 <= fig_box.x1 and fig_box.y0 <= box.y0 and box.y1 <= fig_box.y1


def test_cost_plot_log_scale_integer_ticks():
    pytest.importorskip("matplotlib")
    from fsll_ooc.plotting import plot_cost

    terms = {(i,): 1.0 / (i + 1) ** 2 for i in range(3)}    # 3 iterations: a linear axis would show 0.5 steps
    ax = plot_cost(_model(4, terms))
    ax.figure.canvas.draw()
    assert ax.get_yscale() == "log"
    for a in ax.figure.axes:
        ticks = [t for t in a.get_xticks() if a.get_xlim()[0] <= t <= a.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    gain = [a for a in ax.figure.axes if a is not ax and a.get_yscale() == "log" and a.get_ylabel()]
    assert len(gain) == 1            # the gain of each move, on a log scale, below the cost


# ------------------------------------------------------- helpers for the rest

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd

from fsll_ooc import FSLL, cli

ROOT = Path(__file__).resolve().parents[1]
TODO = pytest.mark.xfail(strict=True, reason="being implemented")


def run(*argv):
    """``fsll-ooc ARGV`` in process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("default")
        rc = cli.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def one_line_error(rc, out, err, *frags, code=2):
    assert rc == code, (rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsll-ooc: error: ") and "Traceback" not in err, err
    for f in frags:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def survey(n=400, seed=0):
    """Labels with names that are not X0, X1, ...: E (education), O, T (travel)."""
    rng = np.random.default_rng(seed)
    e = rng.choice(["high", "uni"], n)
    o = np.where(rng.random(n) < np.where(e == "uni", 0.8, 0.3), "emp", "self")
    t = np.where(rng.random(n) < np.where(o == "emp", 0.7, 0.2), "car", rng.choice(["train", "other"], n))
    return pd.DataFrame({"E": e, "O": o, "T": t})


@pytest.fixture(scope="module")
def df():
    return survey()


@pytest.fixture(scope="module")
def model(df):
    return FSLL(progress=False).fit(df)


# ------------------------------------------------- no silent wrong answers


def test_dataframe_columns_are_matched_by_name(model, df):
    base = model.score(df)
    assert model.score(df[["T", "E", "O"]]) == base                 # reordered: the same answer
    np.testing.assert_array_equal(model.log_prob(df[["O", "T", "E"]]), model.log_prob(df))
    with pytest.raises(ValueError, match=r"'T'") as e:               # a missing column is named
        model.score(df[["E", "O"]])
    assert "'T'" in str(e.value)
    with pytest.raises(ValueError) as e:                             # renamed: both names said
        model.score(df.rename(columns={"O": "occupation"}))
    assert "'O'" in str(e.value) and "'occupation'" in str(e.value)
    codes = np.array([[0, 0, 0], [1, 1, 2]])                         # codes stay positional
    assert model.log_prob(codes).shape == (2,)


def test_errors_name_the_models_variables(model):
    with pytest.raises(ValueError) as e:
        model.log_prob(np.array([[0, 0, 7]]))                        # a code out of range for T
    assert "'T'" in str(e.value) and "X2" not in str(e.value)


def test_sample_returns_labels_when_the_model_has_them(model, df):
    s = model.sample(50, random_state=3)
    assert isinstance(s, pd.DataFrame) and list(s.columns) == ["E", "O", "T"]
    assert set(s["T"]) <= {"car", "other", "train"}
    codes = model.sample(50, random_state=3, as_frame=False)        # the codes, as before
    assert codes.dtype == np.int64 and codes.shape == (50, 3)
    assert [list(s[c]) for c in s.columns] == [[model.categories_[j][v] for v in codes[:, j]] for j in range(3)]
    plain = FSLL(progress=False).fit(np.array([[0, 1], [1, 0], [1, 1]] * 20))
    assert isinstance(plain.sample(4, random_state=0), np.ndarray)  # a model of codes samples codes


# ------------------------------------------------------------ no lost files


@pytest.fixture()
def csv_file(tmp_path, df):
    p = tmp_path / "data.csv"
    df.to_csv(p, index=False)
    return p


def test_fit_never_overwrites_its_data_or_a_foreign_file(csv_file, tmp_path):
    before = csv_file.read_bytes()
    one_line_error(*run("fit", csv_file, "-o", csv_file, "--quiet"), "data.csv")
    assert csv_file.read_bytes() == before
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}')
    one_line_error(*run("fit", csv_file, "-o", notes, "--quiet"), "--force")
    assert notes.read_text() == '{"mine": true}'
    assert run("fit", csv_file, "-o", notes, "--quiet", "--force")[0] == 0
    model_file = tmp_path / "m.json"
    assert run("fit", csv_file, "-o", model_file, "--quiet")[0] == 0
    assert run("fit", csv_file, "-o", model_file, "--quiet", "--epsilon", "1e-3")[0] == 0  # its own file


def test_sample_and_plot_never_overwrite_a_foreign_file(csv_file, tmp_path):
    model_file = tmp_path / "m.json"
    assert run("fit", csv_file, "-o", model_file, "--quiet")[0] == 0
    before = csv_file.read_bytes()
    one_line_error(*run("sample", model_file, "-n", 5, "--out", csv_file), "--force")
    assert csv_file.read_bytes() == before
    assert run("sample", model_file, "-n", 5, "--out", csv_file, "--force")[0] == 0
    assert len(csv_file.read_text().splitlines()) == 6
    pytest.importorskip("matplotlib")
    foreign = tmp_path / "m-interactions.png"
    foreign.write_bytes(b"not mine")
    one_line_error(*run("plot", model_file, "-d", tmp_path), "--force")
    assert foreign.read_bytes() == b"not mine"
    assert run("plot", model_file, "-d", tmp_path, "--force")[0] == 0
    assert run("plot", model_file, "-d", tmp_path)[0] == 0         # its own pictures are replaced


def _interrupted_store(df, store, monkeypatch, after=4):
    import interrupts

    interrupts.stop_after(monkeypatch, after)
    with pytest.raises(interrupts.Crash):
        FSLL(progress=False, store=str(store), layout=(1, 2), scheduler="serial", epsilon=1e-4).fit(df)
    monkeypatch.undo()


def test_fit_on_an_interrupted_store_never_wipes_it_and_resume_finishes_it(df, csv_file, tmp_path, monkeypatch):
    store = tmp_path / "fit.zarr"
    _interrupted_store(df, store, monkeypatch)
    files = sorted(p.relative_to(store) for p in store.rglob("*"))
    line = one_line_error(*run("fit", csv_file, "-o", tmp_path / "m.json", "--store", store, "--quiet",
                               "--epsilon", "1e-4"), f"fsll-ooc resume {store}")
    assert "FSLL.resume" not in line and "store=" not in line      # the CLI's own words
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == files
    rc, out, err = run("resume", store, "-o", tmp_path / "m.json", "--quiet")
    assert rc == 0, err
    ref = FSLL(progress=False, epsilon=1e-4).fit(df)
    m = FSLL.load(tmp_path / "m.json")
    assert m.n_iter_ == ref.n_iter_ and m.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    assert list(m.feature_names_in_) == ["E", "O", "T"]


def _default_sigint():
    """In the child: Ctrl-C as at a terminal.  A test run started in the background by a
    shell without job control inherits an ignored SIGINT, and Python keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_cleanly_with_the_resume_command(tmp_path, sig):
    # a fit that runs for seconds after its state says "running" (about 120 iterations), so that
    # the signal lands inside it and not in the interpreter's exit
    rng = np.random.default_rng(1)
    X = (rng.random((20_000, 18)) < 0.3).astype(int)
    for i in range(1, 18):
        X[:, i] ^= X[:, i - 1] & (rng.random(len(X)) < 0.5)
    data = tmp_path / "d.csv"
    pd.DataFrame(X, columns=[f"v{i}" for i in range(18)]).to_csv(data, index=False)
    store = tmp_path / "s"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "fsll_ooc.cli", "fit", str(data), "-o", str(tmp_path / "m.json"),
                          "--store", str(store), "--memory-limit", "600MiB", "--quiet", "--epsilon", "1e-7"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path),
                         preexec_fn=_default_sigint)
    state = store / "fsll_state.json"
    while p.poll() is None and not (state.exists() and "running" in state.read_text(errors="replace")):
        time.sleep(0.05)
    p.send_signal(sig)
    try:  # a guard against a hang, not a time limit on the work: the stop takes a second or two
        _, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        pytest.fail(f"the fit did not stop within 300 s of the signal: {err}")
    assert p.returncode == 128 + sig, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "Task was destroyed" not in err, err
    assert f"fsll-ooc resume {store}" in lines[0]


# ------------------------------------------------------- files as people have them


@pytest.mark.parametrize("sep,ext", [("\t", ".csv"), (";", ".csv"), ("\t", ".tsv"), ("|", ".txt")])
def test_delimiters_are_sniffed(tmp_path, df, sep, ext):
    p = tmp_path / f"d{ext}"
    df.to_csv(p, sep=sep, index=False)
    rc, out, err = run("fit", p, "-o", tmp_path / "m.json", "--json", "--quiet")
    assert rc == 0, err
    assert json.loads(out)["names"] == ["E", "O", "T"]


def test_sep_no_header_na_options_and_whitespace(tmp_path):
    p = tmp_path / "raw.csv"
    p.write_text("a;b\nNone;x\nlow;y\nNone;x\nlow;y\n")
    rc, out, err = run("fit", p, "-o", tmp_path / "m.json", "--sep", ";", "--keep-na", "--json", "--quiet")
    assert rc == 0, err
    m = FSLL.load(tmp_path / "m.json")
    assert m.categories_[0] == ["None", "low"]                      # 'None' is a real state here
    q = tmp_path / "headless.csv"
    q.write_text("0,1\n1,0\n1,1\n0,0\n")
    rc, out, err = run("fit", q, "-o", tmp_path / "h.json", "--no-header", "--json", "--quiet")
    assert rc == 0, err and json.loads(out)["n_samples"] == 4
    r = tmp_path / "gaps.csv"
    r.write_text("a,b\nx,?\ny,1\nx,1\n")
    one_line_error(*run("fit", r, "-o", tmp_path / "g.json", "--na-values", "?", "--quiet"), "missing", "line 2")
    w = tmp_path / "spaces.csv"
    w.write_text("a, b\nx, y\ny ,y\nx,y\n")
    rc, out, err = run("fit", w, "-o", tmp_path / "w.json", "--json", "--quiet")
    assert rc == 0 and json.loads(out)["names"] == ["a", "b"]
    assert FSLL.load(tmp_path / "w.json").categories_ == [["x", "y"], ["y"]]
    assert "whitespace" in err                                      # said once, not silently


def test_one_column_file_warns(tmp_path):
    p = tmp_path / "one.csv"
    p.write_text("a b c\n1 2 3\n0 1 2\n")
    rc, out, err = run("fit", p, "-o", tmp_path / "m.json", "--quiet")
    assert "one column" in err and "--sep" in err


# ------------------------------------------------- refusals with a way forward


def test_too_many_variables_says_what_is_practical(tmp_path):
    rc, out, err = run("plan", "--cards", "3x37", "--memory", "4GiB")
    assert rc == 3, err                                             # infeasible, not "bad input"
    assert "variables" in out and "--drop" in out
    p = tmp_path / "wide.csv"
    pd.DataFrame(np.zeros((5, 37), dtype=int) + np.arange(5)[:, None] % 3,
                 columns=[f"c{i}" for i in range(37)]).to_csv(p, index=False)
    line = one_line_error(*run("fit", p, "-o", tmp_path / "m.json", "--quiet"), "--drop")
    assert "2**40" not in line or "variables" in line


def test_too_small_memory_limit_names_the_real_cause_in_cli_words(csv_file, tmp_path):
    line = one_line_error(*run("fit", csv_file, "-o", tmp_path / "m.json", "--memory-limit", "10MB", "--quiet"))
    assert "store=" not in line and "--memory-limit" in line
    assert "reserve" in line or "interpreter" in line


def test_drop_columns(csv_file, tmp_path):
    rc, out, err = run("fit", csv_file, "-o", tmp_path / "m.json", "--drop", "O", "--json", "--quiet")
    assert rc == 0, err and json.loads(out)["names"] == ["E", "T"]


# ------------------------------------------------------------- small things


def test_info_explains_the_cost_and_warnings_are_one_line(csv_file, tmp_path):
    assert run("fit", csv_file, "-o", tmp_path / "m.json", "--quiet")[0] == 0
    rc, out, _ = run("info", tmp_path / "m.json")
    assert "log-likelihood" in out and "MDL" in out
    p = tmp_path / "sparse.csv"
    p.write_text("a,b\n" + "".join(f"{v},{v % 2}\n" for v in (0, 9, 0, 9)))
    rc, out, err = run("fit", p, "-o", tmp_path / "s.json", "--quiet")
    assert rc == 0 and "unused" in err
    assert all(ln.startswith("fsll-ooc: warning: ") for ln in err.strip().splitlines()), err


def test_one_row_warns(tmp_path):
    with pytest.warns(UserWarning, match="sample"):
        FSLL(progress=False).fit(np.array([[0, 1, 1]]))


def test_model_file_is_compact(model, tmp_path):
    model.save(tmp_path / "m.json")
    text = (tmp_path / "m.json").read_text()
    assert len(text.splitlines()) < 40 + len(model.history_) + len(model.theta_)   # a term per line
    again = FSLL.load(tmp_path / "m.json")
    assert again.theta_ == model.theta_ and again.categories_ == model.categories_


# ------------------------------------------------------------ waiting, and knowing


def test_time_left_estimate_from_shrinking_gains():
    from fsll_ooc.progress import estimate_iterations_left

    gains = [0.5 ** t for t in range(12)]                 # halves every iteration
    left = estimate_iterations_left(gains, 0.5 ** 20)     # 2^-11 now: 9 halvings to 2^-20
    assert left == pytest.approx(9.0)
    assert estimate_iterations_left([1e-3] * 12, 1e-6) is None        # not shrinking: no estimate
    assert estimate_iterations_left([0.1, 0.05], 1e-6) is None        # too few


def test_progress_in_words_and_the_real_count_after_a_resume(df, tmp_path, monkeypatch, capsys):
    store = tmp_path / "s"
    _interrupted_store(df, store, monkeypatch, after=6)
    from fsll_ooc import storage

    done = storage.read_json(store / "fsll_state.json", checksum=True)["state"]["n_iter"]
    assert done >= 3
    capsys.readouterr()
    m = FSLL.resume(str(store), progress=True)
    err = capsys.readouterr().err
    assert "fitting" in err and "terms" in err and "task_" not in err and "fsll fit" not in err
    counts = [int(tok) for tok in re.findall(r"fitting: (\d+) iterations", err)]
    assert counts and counts[0] == done and counts[-1] == m.n_iter_   # counts on from the store
