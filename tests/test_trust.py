"""Nothing a file or a store says is believed unchecked: model files of any size, finished
stores whose state was rewritten with a valid checksum, and what the command line makes of them.

The oracle for log Z is the dense transform of the whole table (``basis.transform``, itself
checked against brute force in ``tests/test_basis.py``) or brute force on tiny tables."""
import itertools
import json
import math
import shutil

import numpy as np
import pytest

from fsll_ooc import FSLL, basis, cli, model_file, storage
from fsll_ooc.learn import FitState
from fsll_ooc.storage import IntegrityError


def _dense_log_z(cards, theta):
    table = np.zeros(cards)
    for y, v in theta.items():
        table.reshape(-1)[y] = v
    log_p = basis.transform(table, transpose=True)
    top = log_p.max()
    return float(top + math.log(np.exp(log_p - top).sum()))


def _brute_log_z(cards, theta):
    total = []
    for x in itertools.product(*[range(k) for k in cards]):
        s = 0.0
        for y, v in theta.items():
            d = np.unravel_index(y, cards)
            s += v * math.prod(basis.local_matrix(k)[yi, xi] for k, yi, xi in zip(cards, d, x))
        total.append(s)
    top = max(total)
    return top + math.log(sum(math.exp(t - top) for t in total))


@pytest.mark.parametrize("seed", range(12))
def test_log_partition_is_exact_in_blocks_and_groups(seed):
    rng = np.random.default_rng(seed)
    cards = tuple(int(k) for k in rng.choice([1, 2, 3, 4, 5], rng.integers(1, 6)))
    size = math.prod(cards)
    k = int(rng.integers(0, min(size - 1, 7) + 1))
    theta = {int(y): float(rng.normal()) for y in rng.choice(np.arange(1, size), k, replace=False)} if k else {}
    want = _brute_log_z(cards, theta)
    for block in (1, 2, 3, 8, 2**22):  # one cell at a time .. the whole table at once
        assert model_file.log_partition(cards, theta, block) == pytest.approx(want, rel=1e-12, abs=1e-12)


def _big_model(n_vars=21, seed=0):
    """A model of 2^21 cells whose terms join every variable, with its log Z from the dense transform."""
    rng = np.random.default_rng(seed)
    cards = (2,) * n_vars
    theta = {1 << i: float(rng.normal(0, 0.3)) for i in range(n_vars)}
    theta.update({(1 << i) | (1 << (i + 1)): float(rng.normal(0, 0.2)) for i in range(n_vars - 1)})
    theta[(1 << 1) | (1 << (n_vars // 2)) | (1 << (n_vars - 2))] = 0.4
    return cards, theta, _dense_log_z(cards, theta)


def _save(path, cards, theta, log_z):
    state = FitState(cards, 100, 0.0, dict(theta), {}, log_z, 5, True, [])
    model_file.save(path, model_file.ModelFile(state, {}))


@pytest.mark.parametrize("shift", [-30.0, -1e-3, 0.5])
def test_a_large_model_file_with_another_log_z_is_refused(tmp_path, monkeypatch, shift):
    """2^21 cells (above the old in-memory check): log_z lowered or raised is refused by name;
    the honest file loads with the same log Z; the check runs in blocks of 2^12 cells here."""
    monkeypatch.setattr(model_file, "LOG_Z_BLOCK_CELLS", 2**12)
    cards, theta, log_z = _big_model()
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    _save(good, cards, theta, log_z)
    assert model_file.load(good).state.log_z == log_z
    _save(bad, cards, theta, log_z + shift)
    with pytest.raises(ValueError, match=r"bad\.json: malformed .*log_z .* (does not match|is impossible)"):
        model_file.load(bad)
    rc = cli.main(["info", str(bad)])
    assert rc == 2


def test_a_model_beyond_the_checked_size_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(model_file, "CHECK_LOG_Z_CELLS", 2**10)
    cards = (2,) * 12
    theta = {(1 << i) | (1 << (i + 1)): 0.1 for i in range(11)}  # one group of 2^12 cells
    path = tmp_path / "m.json"
    _save(path, cards, theta, _dense_log_z(cards, theta))
    with pytest.raises(ValueError, match=r"m\.json: .*needs a table of 4,096 cells .*limit of the check is 1,024"):
        model_file.load(path)
    # variables in separate groups are checked one group at a time
    theta = {1 << i: 0.1 for i in range(12)}
    _save(path, cards, theta, _dense_log_z(cards, theta))
    assert len(model_file.load(path).state.theta) == 12


def test_every_loaded_model_sums_to_one(tmp_path):
    """Whatever loads answers probabilities that sum to 1 and agree with exp(log_prob)."""
    cards, theta, log_z = _big_model(n_vars=10, seed=3)
    path = tmp_path / "m.json"
    _save(path, cards, theta, log_z)
    m = FSLL.load(path)
    p = np.asarray(m.probabilities()).reshape(-1)
    X = np.array(list(itertools.product(*[range(k) for k in cards])))
    assert p.sum() == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_allclose(np.exp(m.log_prob(X)), p, rtol=1e-10)


# ----------------------------------------------------------------------------- finished stores

def _data(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.integers(0, [2, 3, 4, 2], size=(n, 4))
    X[:, 1] = (X[:, 0] + X[:, 1] * (rng.random(n) < 0.2)) % 3
    return X


@pytest.fixture(scope="module")
def finished_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("finished") / "s"
    FSLL(store=str(root), layout=(1, 1), epsilon=1e-4).fit(_data())
    return root


def _edit(state, theta):
    out = dict(state)
    out["theta"] = theta
    return out


#: (case, edit of the stored state, words of the one-line refusal)
STORE_EDITS = [
    ("log_z + 0.5", lambda st: {**st, "log_z": st["log_z"] + 0.5}, "does not match the parameters"),
    ("NaN theta", lambda st: _edit(st, [[st["theta"][0][0], float("nan")]] + st["theta"][1:]), "finite number"),
    ("theta index twice", lambda st: _edit(st, st["theta"] + [st["theta"][0]]), "appears twice"),
    ("index 999999", lambda st: _edit(st, st["theta"] + [[999999, 0.1]]), "999999 is not a cell"),
    ("n_samples -5", lambda st: {**st, "n_samples": -5}, "n_samples must be an integer >= 1"),
    ("target outside [-1, 1]", lambda st: {**st, "dbar": [[y, 2.5] for y, _ in st["dbar"]]}, "not a number in [-1, 1]"),
]


@pytest.mark.parametrize("case,edit,words", STORE_EDITS, ids=[c[0] for c in STORE_EDITS])
def test_an_edited_finished_store_is_refused_by_name(finished_store, tmp_path, capsys, case, edit, words):
    store = tmp_path / "s"
    shutil.copytree(finished_store, store)
    sf = store / "fsll_state.json"
    obj = storage.read_json(sf, checksum=True)
    obj["state"] = edit(obj["state"])
    storage.write_json_atomic(sf, obj, checksum=True)  # a new, valid checksum: anyone who can write the store
    with pytest.raises(IntegrityError) as e:
        FSLL.resume(str(store))
    msg = str(e.value)
    assert msg.startswith(f"{sf}: the stored model cannot be trusted") and words in msg, msg
    assert "restart=True" in msg and "\n" not in msg
    capsys.readouterr()
    for argv in (["info", str(store)], ["resume", str(store), "-o", str(tmp_path / "m.json")]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "fsll_state.json" in err and words in err, err
    assert not (tmp_path / "m.json").exists()  # never a model file that info would refuse


def test_a_finished_store_resumed_to_a_file_gives_a_file_that_loads(finished_store, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert cli.main(["resume", str(finished_store), "-o", str(out)]) == 0
    assert cli.main(["info", str(out)]) == 0
    a, b = FSLL.resume(str(finished_store)), FSLL.load(out)
    assert a.theta_ == b.theta_ and a.log_z_ == b.log_z_


def test_a_direct_write_of_a_value_that_cannot_be_converted_keeps_no_descriptor(tmp_path, monkeypatch):
    import os

    from fsll_ooc.storage import direct_io

    monkeypatch.setattr(direct_io, "DIRECT_IO", True)
    spec = storage.create_table("memmap", tmp_path, "t", (8, 512), (1, 512), fit_id="f")  # chunks of 4 KiB
    storage.write(spec, (slice(0, 2), slice(None)), np.ones((2, 512)))  # direct I/O works here
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(ValueError):
            storage.write(spec, (slice(0, 2), slice(None)), np.full((2, 512), "x", dtype=object))
    assert len(os.listdir("/proc/self/fd")) == before
    np.testing.assert_array_equal(storage.read(spec, (slice(0, 2), slice(None))), np.ones((2, 512)))


def test_a_partial_zarr_read_never_follows_a_link(tmp_path):
    spec = storage.create_table("zarr", tmp_path, "t", (4, 6), (2, 3), fit_id="f")
    storage.write(spec, (slice(None), slice(None)), np.arange(24.0).reshape(4, 6))
    chunk = tmp_path / "t" / "c" / "0" / "0"
    copy = tmp_path / "elsewhere"
    shutil.copy(chunk, copy)
    chunk.unlink()
    chunk.symlink_to(copy)  # the same bytes behind a link
    with pytest.raises(IntegrityError, match=r"t/c/0/0: chunk file is not a regular file"):
        storage.read(spec, (slice(0, 1), slice(0, 2)))  # part of one chunk: read through zarr
    with pytest.raises(IntegrityError, match=r"t/c/0/0: chunk file is not a regular file"):
        storage.check_table(spec)


def test_the_writer_lock_outlives_band_writes_still_in_flight(tmp_path, monkeypatch):
    """A write still running when a writer leaves keeps the store's lock until it ends."""
    import threading

    from fsll_ooc.storage import fit_store
    from fsll_ooc.storage.fit_store import FitStore
    from fsll_ooc.storage.lock import StoreLockedError

    monkeypatch.setattr(fit_store, "QUIESCE_SECONDS", 0.01)
    root = tmp_path / "s"
    spec = storage.create_table("memmap", root, "t", (4, 512), (1, 512), fit_id="f")
    impl, go, started = storage.get_backend("memmap"), threading.Event(), threading.Event()
    write = impl.write

    def slow_write(spec, key, value):
        started.set()
        go.wait()
        write(spec, key, value)

    monkeypatch.setattr(impl, "write", slow_write)
    writer = threading.Thread(target=storage.write, args=(spec, (slice(0, 1), slice(None)), np.ones((1, 512))))
    with FitStore(root, "memmap").writing("fit", "fitting"):
        writer.start()
        started.wait()
    with pytest.raises(StoreLockedError):  # the write still runs: the lock is still held
        with FitStore(root, "memmap").writing("fit", "fitting"):
            pass
    go.set()
    writer.join()
    for t in threading.enumerate():
        if t.name == "fsll-release-lock":
            t.join()
    with FitStore(root, "memmap").writing("fit", "fitting"):  # released once the write ended
        pass
    np.testing.assert_array_equal(storage.read(spec, (slice(0, 1), slice(None))), np.ones((1, 512)))


def test_keeping_a_file_twice_between_state_writes_leaves_the_stored_one_intact(tmp_path):
    from fsll_ooc.learn import FitState as State
    from fsll_ooc.planner import plan
    from fsll_ooc.storage.fit_store import FitStore

    fs = FitStore(tmp_path / "s", "zarr")
    p = fs.account(plan((2, 3), out_of_core=True))
    params = {"epsilon": 1e-4, "max_iter": None, "resync_every": 256}
    with fs.writing("fit", "fitting", p):
        fs.begin(p, params, None, np.array([0, 4]), np.array([3, 2]), State((2, 3), 5, 0.0),
                 files={"w": np.array([1.0])})
        fs.keep("w", np.array([2.0]))  # the state on disk names the first file still
        fs.keep("w", np.array([3.0]))  # again before the next state write
        reader = FitStore(tmp_path / "s")
        reader.read()
        assert reader.read_kept("w").tolist() == [1.0]  # a kill now: the state's file is intact
        fs.write_state(State((2, 3), 5, 0.0), "starting")
    reader.read()
    assert reader.read_kept("w").tolist() == [3.0]


def test_a_damaged_soft_counts_file_is_refused_with_the_way_back(tmp_path, monkeypatch):
    """EM out of core stopped inside an M-step, then its soft counts (or its rows) file altered:
    the resume is refused in one line naming the file, with the way back (``restart=True`` for
    the soft counts, which it rebuilds from the rows, to the model of the whole fit; fitting
    again for the rows themselves)."""
    import interrupts
    import test_missing_ooc as t
    from test_missing import _holes

    from fsll_ooc import datasets
    from fsll_ooc.storage.fit_store import FitStore

    p, _ = datasets.random_bayesnet(t.CARDS, 2, seed=3)
    X = _holes(datasets.sample_table(p, 300, seed=1), 0.3, seed=2)
    store = tmp_path / "s"
    fit = lambda: t._ooc(X, store, penalty_scale=1.0)  # noqa: E731
    writes, whole = t._state_writes(monkeypatch, fit)
    n = 1 + next(i for i, w in enumerate(writes) if w[1] == "m-step" and w[3] == 0 and w[4] > w[5])
    for kept, words in (("soft", f"FSLL.resume({str(store)!r}, restart=True) fits again"), ("rows", "run fit() again")):
        interrupts.stop_after(monkeypatch, n)
        with pytest.raises(interrupts.Crash):
            fit()
        monkeypatch.undo()
        fs = FitStore(store)
        fs.read()
        path = store / fs._meta["files"][kept]["file"]
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(bytes(data))
        with pytest.raises(IntegrityError) as e:
            FSLL.resume(str(store), progress=False)
        msg = str(e.value)
        assert msg.startswith(f"{path}: the fit's {kept} file does not match its checksum") and words in msg, msg
        assert "\n" not in msg
        if kept == "soft":
            t.assert_same(FSLL.resume(str(store), progress=False, restart=True), whole)


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_errors_about_a_data_files_values_name_the_file(tmp_path, capsys, ext):
    """Too many labels in a column, a value that is no label, a missing value, a joint table
    beyond the limit: one line naming the file (first, where no line of it is named), exit 2."""
    import pandas as pd

    n = 70_000
    frames = {
        "many": (pd.DataFrame({"a": [f"l{i}" for i in range(n)], "b": ["x", "y"] * (n // 2)}),
                 "column 'a' would have 70,000 categories"),
        "joint": (pd.DataFrame({f"c{i}": [f"v{j}" for j in range(300)] for i in range(8)}),
                  "8 variables are too many: the joint table would have"),
        "frac": (pd.DataFrame({"a": [1.5, 2.0, 3.0], "b": [1, 2, 3]}), "column 'a': non-integer value 1.5"),
    }
    if ext == "parquet":  # (a CSV file's missing cell is refused by its own reader, naming the line)
        frames["na"] = (pd.DataFrame({"a": ["x", None, "y"], "b": ["x", "y", "z"]}), "column 'a': missing value")
    for name, (df, words) in frames.items():
        path = tmp_path / f"{name}.{ext}"
        df.to_csv(path, index=False) if ext == "csv" else df.to_parquet(path)
        assert cli.main(["fit", str(path), "-o", str(tmp_path / "m.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("fsll-ooc: error: ") and path.name in err[0] and words in err[0], err
    # the library names it too, for a table that read_table read
    from fsll_ooc.io import DataError, encode, read_table

    with pytest.raises(DataError, match=rf"^many\.{ext}: column 'a' would have 70,000 categories"):
        encode(read_table(tmp_path / f"many.{ext}"))
