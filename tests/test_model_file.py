"""The model file on its own: round trip, and refusal of damaged or foreign files."""
import json

import numpy as np
import pytest

from fsll_ooc import FSLL, model_file


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2, 300)
    X = np.c_[a, (a + (rng.random(300) < 0.2)) % 2, rng.integers(0, 3, 300)]
    return FSLL(progress=False).fit(X, feature_names=["a", "b", "c"],
                                    categories=[["no", "yes"], [False, True], [1.5, 2.5, 3.5]])


def test_round_trip(model, tmp_path):
    model.save(tmp_path / "m.json")
    m = FSLL.load(tmp_path / "m.json")
    assert m.theta_ == model.theta_ and m.cardinalities_ == model.cardinalities_
    for k in ("log_z_", "n_samples_", "n_iter_", "cost_", "kl_data_", "converged_", "history_",
              "feature_names_in_", "categories_"):
        assert getattr(m, k) == getattr(model, k), k
    assert m.get_params() == {**FSLL().get_params(), **{k: model.get_params()[k] for k in FSLL._SAVED_PARAMS}}
    np.testing.assert_allclose(m.probabilities(), model.probabilities(), rtol=1e-12)
    mf = model_file.load(tmp_path / "m.json")
    model_file.save(tmp_path / "again.json", mf)
    assert (tmp_path / "again.json").read_text() == (tmp_path / "m.json").read_text()


@pytest.mark.parametrize("damage,word", [
    (lambda t: t[: len(t) // 2], "invalid JSON"),
    (lambda t: t.replace('"fsll-ooc-model"', '"other"'), "format"),
    (lambda t: t.replace('"version": 1', '"version": 99'), "newer"),
    (lambda t: json.dumps({**json.loads(t), "theta": [[[5, 0, 0], 1.0]]}), "does not fit"),
    (lambda t: json.dumps({**json.loads(t), "log_z": None}), "malformed"),
    (lambda t: json.dumps({**json.loads(t), "cardinalities": [2, 2**17, 3]}), "malformed"),
    (lambda t: json.dumps({**json.loads(t), "history": [{"cost": "x"}]}), "not a number"),
    (lambda t: json.dumps({**json.loads(t), "feature_names": ["a"]}), "labels"),
    (lambda t: json.dumps({**json.loads(t), "params": {"nonsense": 1}}), "malformed"),
])
def test_damaged_files_are_refused(model, tmp_path, damage, word):
    model.save(tmp_path / "m.json")
    (tmp_path / "bad.json").write_text(damage((tmp_path / "m.json").read_text()))
    with pytest.raises(ValueError, match=word) as ei:
        FSLL.load(tmp_path / "bad.json")
    assert "bad.json" in str(ei.value)


def test_learn_options_reach_the_learner_and_are_kept(tmp_path):
    from fsll_ooc.learn import LearnOptions

    rng = np.random.default_rng(4)
    X = rng.integers(0, 3, (200, 3))
    seen = []
    opts = LearnOptions(refine_rounds=3, joint=False, on_finish=lambda eng, st: seen.append(st.n_iter))
    m = FSLL(progress=False, learn_options=opts).fit(X)
    assert seen == [m.n_iter_] and m.get_params()["learn_options"] is opts
    m.save(tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text())["params"]["learn_options"]["refine_rounds"] == 3
    back = FSLL.load(tmp_path / "m.json").get_params()["learn_options"]
    assert back == LearnOptions(refine_rounds=3, joint=False)  # on_finish is not kept
    s = FSLL(progress=False, store=tmp_path / "s", learn_options=LearnOptions(joint_max_new=2)).fit(X)
    assert FSLL.resume(tmp_path / "s", progress=False).learn_options == LearnOptions(joint_max_new=2)
    ref = FSLL(progress=False, learn_options=LearnOptions(joint_max_new=2)).fit(X)
    assert set(s.theta_) == set(ref.theta_) and s.cost_ == pytest.approx(ref.cost_, abs=1e-10)
    with pytest.raises(ValueError, match="learn_options sets epsilon"):
        FSLL(learn_options=LearnOptions(epsilon=1e-3)).fit(X)
    with pytest.raises(ValueError, match="learn_options must be"):
        FSLL(learn_options={"joint": False}).fit(X)
