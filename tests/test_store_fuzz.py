"""Property test over store files: any damage either resumes to the uninterrupted model or is refused by name.

A small out-of-core fit (several chunks per table, both backends) is stopped after a few
iterations; hypothesis draws one damage to the store's files (two chunks swapped, a chunk
moved from another table, truncated, bytes replaced, a file replaced by a symbolic link,
the table copied from another fit) and ``FSLL.resume`` must then either give exactly the
model of the uninterrupted fit or raise a one-line ``ValueError`` (an ``IntegrityError``)
naming a file of the store; never a different model (``docs/reliability.md``).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import interrupts
from fsll_ooc import FSLL

LAYOUT = (1, 2)
DAMAGES = ("swap", "move", "truncate", "replace", "symlink", "foreign")


def data(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = np.stack([rng.integers(0, k, 300) for k in (2, 3, 4, 2)], axis=1)
    X[:, 1], X[:, 3] = X[:, 0], X[:, 2] % 2  # dependences: iterations left when stopped
    return X


def fit(store, backend, seed=0, **kw):
    return FSLL(progress=False, store=store, backend=backend, layout=LAYOUT, scheduler="serial", epsilon=1e-4,
                **kw).fit(data(seed))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Per backend: the reference model, and pristine copies of a stopped fit and of another fit's."""
    mp = pytest.MonkeyPatch()
    out = {}
    for backend in ("zarr", "memmap"):
        d = tmp_path_factory.mktemp(backend)
        ref = fit(d / "ref", backend)
        for name, seed in (("stopped", 0), ("other", 1)):
            interrupts.stop_after(mp, 4)
            with pytest.raises(interrupts.Crash):
                fit(d / name, backend, seed)
            mp.undo()
        out[backend] = (ref, d)
    return out


def chunks(store: Path, backend: str, table: str):
    """(file, offset, size) of every chunk of ``table`` (memmap: bands of its file)."""
    if backend == "zarr":
        return [(p, 0, p.stat().st_size) for p in sorted((store / table / "c").rglob("*")) if p.is_file()]
    path = store / f"{table}.f64"
    n = os.path.getsize(str(path) + ".crc32c") // 4
    size = path.stat().st_size // n
    return [(path, i * size, size) for i in range(n)]


def get(part):
    with open(part[0], "rb") as fh:
        fh.seek(part[1])
        return fh.read(part[2])


def put(part, b):
    with open(part[0], "r+b") as fh:
        fh.seek(part[1])
        fh.write(b)


def side(part, backend, value=None):
    """Read (or write) a memmap band's side-file entry; zarr keeps the codec CRC in the chunk."""
    if backend == "zarr":
        return None
    path, off, size = part
    with open(str(path) + ".crc32c", "r+b") as fh:
        fh.seek(4 * (off // size))
        if value is None:
            return fh.read(4)
        fh.write(value)


def damage(store: Path, other: Path, backend: str, kind: str, draw) -> None:
    table = draw(st.sampled_from(("dbar", "thetabar", "scratch")))
    parts = chunks(store, backend, table)
    i = draw(st.integers(0, len(parts) - 1))
    if kind == "swap":
        j = draw(st.integers(0, len(parts) - 1))
        a, b = get(parts[i]), get(parts[j])
        ca, cb = side(parts[i], backend), side(parts[j], backend)
        put(parts[i], b)
        put(parts[j], a)
        if backend == "memmap":
            side(parts[i], backend, cb)
            side(parts[j], backend, ca)
    elif kind == "move":
        src = chunks(store, backend, draw(st.sampled_from(("dbar", "thetabar", "scratch"))))[i]
        put(parts[i], get(src))
        if backend == "memmap":
            side(parts[i], backend, side(src, backend))
    elif kind == "truncate":
        path = parts[i][0]
        os.truncate(path, draw(st.integers(0, max(path.stat().st_size - 1, 0))))
    elif kind == "replace":
        raw = bytearray(get(parts[i]))
        k = draw(st.integers(0, len(raw) - 1))
        raw[k] = (raw[k] + draw(st.integers(1, 255))) % 256
        put(parts[i], bytes(raw))
    elif kind == "symlink":  # the chunk file (memmap: the table file) becomes a link to a copy of itself
        path = parts[i][0]
        copy = store.parent / f"link-target-{path.name}"
        shutil.copy(path, copy)
        path.unlink()
        os.symlink(copy, path)
    else:  # the table, with its checksums, copied from another fit with the same cardinalities
        interrupts.copy_table(other, store, backend, table)


@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("backend", ["zarr", "memmap"])
@settings(max_examples=3, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(draw=st.data())
def test_damaged_store_resumes_to_the_same_model_or_is_refused_by_name(stores, tmp_path_factory, backend, kind,
                                                                       draw):
    ref, d = stores[backend]
    work = tmp_path_factory.mktemp("w")
    store = work / "s"
    shutil.copytree(d / "stopped", store, symlinks=True)
    damage(store, d / "other", backend, kind, draw.draw)
    try:
        m = FSLL.resume(store, progress=False)
    except ValueError as e:
        msg = str(e)
        assert "\n" not in msg and msg.startswith(str(store)), msg
        event(f"{backend} {kind}: refused")
        return
    event(f"{backend} {kind}: the uninterrupted model")
    assert m.theta_ == ref.theta_ and m.n_iter_ == ref.n_iter_ and m.cost_ == ref.cost_
