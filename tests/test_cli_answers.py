"""The command line from a user's side: scoring rows with holes, unseen labels, EM models
in ``info``, the dependence table, ``fit --average``, ``--categorical`` / ``--ordered`` and
the warnings about integer and id columns."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from fsll_ooc import FSLL, FSLLAverage, cli

N = 600


@pytest.fixture(scope="module")
def frames():
    rng = np.random.default_rng(3)
    region = rng.choice(["pacific", "north", "south", "east", "west"], N, p=[.4, .2, .2, .1, .1])
    region2 = np.where(rng.random(N) < 0.7, region, rng.choice(["pacific", "north", "south"], N))
    sex = rng.choice(["f", "m"], N)
    work = np.where(rng.random(N) < 0.85, np.where(sex == "f", "yes", "no"), "no")
    df = pd.DataFrame({"region": region, "region2": region2, "sex": sex, "work": work}).astype(object)
    holes = df.mask(rng.random(df.shape) < 0.1)
    return df, holes


@pytest.fixture(scope="module")
def em_model(frames, tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_answers")
    _, holes = frames
    holes.iloc[:450].to_csv(d / "train.csv", index=False)
    holes.iloc[450:].to_csv(d / "test.csv", index=False)
    assert cli.main(["fit", str(d / "train.csv"), "-o", str(d / "m.json"), "--missing", "em", "-q"]) == 0
    return d


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_score_of_rows_with_holes_equals_python(capsys, em_model, frames):
    rc, out, err = run(capsys, "score", em_model / "m.json", em_model / "test.csv", "--json")
    assert rc == 0, err
    got = json.loads(out)
    m = FSLL.load(em_model / "m.json")
    test = pd.read_csv(em_model / "test.csv")
    assert got["n_samples"] == len(test) and got["rows_with_missing_cells"] == int(test.isna().any(axis=1).sum()) > 0
    assert got["mean_log_likelihood"] == pytest.approx(m.score(test), abs=1e-10)


def test_unseen_labels_error_or_skip(capsys, em_model, frames):
    test = pd.read_csv(em_model / "test.csv")
    test.iloc[3, 0] = "mars"
    test.to_csv(em_model / "unseen.csv", index=False)
    rc, out, err = run(capsys, "score", em_model / "m.json", em_model / "unseen.csv")
    assert rc == 2 and "'mars'" in err and "--unseen skip" in err and len(err.strip().splitlines()) == 1
    rc, out, err = run(capsys, "score", em_model / "m.json", em_model / "unseen.csv", "--unseen", "skip", "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["skipped_unseen"] == 1 and got["n_samples"] == len(test) - 1
    m = FSLL.load(em_model / "m.json")
    assert got["mean_log_likelihood"] == pytest.approx(m.score(test.drop(index=3)), abs=1e-10)


def test_info_of_an_em_model_says_so_and_shows_dependence_first(capsys, em_model):
    rc, out, err = run(capsys, "info", em_model / "m.json")
    assert rc == 0, err
    assert "EM (missing cells)" in out and "observed-data log-likelihood" in out
    assert out.index("which variables depend on each other") < out.index("terms by share")
    m = FSLL.load(em_model / "m.json")
    assert m.em_rounds_ >= 1 and math.isfinite(m.em_loglik_)
    rc, out, err = run(capsys, "info", em_model / "m.json", "--json")
    info = json.loads(out)
    assert info["em"]["rounds"] == m.em_rounds_ and info["em"]["loglik"] == pytest.approx(m.em_loglik_)
    dep = m.dependence()
    assert [(r["a"], r["b"]) for r in info["dependence"]] == list(zip(dep["a"], dep["b"]))
    top = {info["dependence"][0]["a"], info["dependence"][0]["b"]}
    assert top in ({"region", "region2"}, {"sex", "work"})


def test_fit_average_then_info_score_plot(capsys, frames, tmp_path):
    df, _ = frames
    df.to_csv(tmp_path / "d.csv", index=False)
    rc, out, err = run(capsys, "fit", tmp_path / "d.csv", "-o", tmp_path / "avg.json", "--average", "3", "-q")
    assert rc == 0, err
    assert "average of 3 models" in out
    avg = FSLLAverage.load(tmp_path / "avg.json")
    assert len(avg.members_) == 3
    rc, out, err = run(capsys, "score", tmp_path / "avg.json", tmp_path / "d.csv", "--json")
    assert json.loads(out)["mean_log_likelihood"] == pytest.approx(avg.score(df), abs=1e-10)
    rc, out, err = run(capsys, "info", tmp_path / "avg.json")
    assert rc == 0 and "members' MI" in out
    pytest.importorskip("matplotlib")
    rc, out, err = run(capsys, "plot", tmp_path / "avg.json", "-d", tmp_path / "png", "--json")
    assert rc == 0, err
    assert all((tmp_path / "png" / f"avg-{s}.png").stat().st_size > 0 for s in ("cost", "interactions"))


def test_categorical_ordered_and_integer_warnings(capsys, tmp_path):
    rng = np.random.default_rng(0)
    n = 400
    df = pd.DataFrame({"prestige": rng.choice(np.arange(0, 87, 3), n), "grade": rng.choice(["lo", "mid", "hi"], n),
                       "id": np.arange(n), "x": rng.integers(0, 2, n)})
    df.to_csv(tmp_path / "p.csv", index=False)
    rc, out, err = run(capsys, "fit", tmp_path / "p.csv", "-o", tmp_path / "m.json", "-q", "--drop", "id")
    assert rc == 0, err
    assert "'prestige'" in err and "--categorical prestige" in err
    assert FSLL.load(tmp_path / "m.json").cardinalities_[0] == 85  # 0..84: the values' span
    rc, out, err = run(capsys, "fit", tmp_path / "p.csv", "-o", tmp_path / "m2.json", "-q", "--drop", "id",
                       "--categorical", "prestige", "--ordered", "grade")
    assert rc == 0, err
    assert "prestige" not in err
    m = FSLL.load(tmp_path / "m2.json")
    assert m.cardinalities_[0] == 29 and m.categories_[0] == list(range(0, 87, 3))
    assert list(m.basis_order_[1]) == [0, 1, 2]  # kept: hi, lo, mid as read (sorted)
    rc, out, err = run(capsys, "fit", tmp_path / "p.csv", "-o", tmp_path / "m3.json", "-q", "--categorical", "prestige")
    assert "'id'" in err and "--drop id" in err
    rc, out, err = run(capsys, "fit", tmp_path / "p.csv", "-o", tmp_path / "m4.json", "-q", "--categorical", "nope")
    assert rc == 2 and "--categorical: no column 'nope'" in err


def test_fit_average_refuses_em(capsys, frames, tmp_path):
    _, holes = frames
    holes.to_csv(tmp_path / "h.csv", index=False)
    rc, out, err = run(capsys, "fit", tmp_path / "h.csv", "-o", tmp_path / "a.json", "--average", "2",
                       "--missing", "em", "-q")
    assert rc == 2 and "--average" in err


def test_license_changelog_and_version_match_the_package():
    import pathlib
    import re

    import fsll_ooc

    root = pathlib.Path(__file__).resolve().parent.parent
    pyproject = (root / "pyproject.toml").read_text()
    assert re.search(r'license\s*=\s*\{\s*text\s*=\s*"MIT"\s*\}', pyproject)
    assert (root / "LICENSE").read_text().startswith("MIT License")
    version = re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.M).group(1)
    assert fsll_ooc.__version__ == version
    assert f"## {version}" in (root / "CHANGELOG.md").read_text()
