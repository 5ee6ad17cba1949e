"""The pure planner, alone: layouts, costs, refusals."""
import math
import re

import pytest
from hypothesis import given, settings, strategies as st

from fsll_ooc.validation import MAX_CATEGORIES, MAX_CELLS
from fsll_ooc.planner import (MAX_CHUNKS, MIN_CHUNK_HARD, Layout, PlanError, min_memory, parse_bytes, parse_cards,
                              plan)


def test_in_core_is_one_chunk():
    p = plan((2, 3, 4, 5))
    assert p.feasible and not p.out_of_core
    assert (p.layout.a, p.layout.c) == (0, 0)
    assert p.layout.chunk_shape == (2, 3, 4, 5) and p.layout.n_a_bands == 1


@pytest.mark.parametrize("cards", [(2,) * 30, (2,) * 26, (3, 5, 6, 2, 4) * 3, (6, 5, 4, 3, 2) * 4, (4,) * 14])
@pytest.mark.parametrize("mem", ["1GiB", "4GiB", "16GiB"])
def test_out_of_core_layout_respects_the_memory_limit(cards, mem):
    p = plan(cards, memory_limit=mem, disk_free="1TiB", out_of_core=True, workers=2)
    L = p.layout
    if p.feasible:
        assert p.peak_memory <= parse_bytes(mem)
        assert L.a_band_elements * L.n_a_bands == math.prod(cards)
        assert L.b_band_elements * L.n_b_bands == math.prod(cards)
        # every variable is local to one of the two band kinds
        assert set(L.a_axes) | set(L.b_axes) == set(range(len(cards)))
        assert p.bytes_per_iteration == 3 * 8 * math.prod(cards)
        assert p.disk_bytes == 3 * 8 * math.prod(cards)
    else:
        assert p.problems and ("memory_limit" in p.problems[0] or "disk" in p.problems[0])


def test_infeasible_disk_says_what_would_fit():
    p = plan((2,) * 34, memory_limit="16GiB", disk_free="10GiB", out_of_core=True)
    assert not p.feasible
    assert any("disk" in s and "disk_free >= " in s for s in p.problems)
    assert "INFEASIBLE" in p.report()
    assert plan((2,) * 34, memory_limit="16GiB", disk_free=_advice(p, "disk_free"), out_of_core=True).feasible


def test_infeasible_memory_names_the_limit():
    p = plan((2,) * 40, memory_limit="512MiB", disk_free=None, out_of_core=True)
    assert not p.feasible and "memory_limit >=" in p.problems[0]
    assert plan((2,) * 40, memory_limit=_advice(p, "memory_limit"), out_of_core=True).feasible


def _advice(p, what: str) -> str:
    """The size a plan's problems advise for ``what`` (``memory_limit`` or ``disk_free``)."""
    m = [re.search(rf"{what} >= ([0-9.]+[KMGT]iB|[0-9]+B)", s) for s in p.problems]
    m = [x for x in m if x]
    assert len(m) == 1, p.problems
    return m[0].group(1)


# ----------------------------------------------------------------- total and honest

#: Cardinalities as people have them: mostly small, some large, up to a few over the limits.
CARDS = st.lists(st.one_of(st.integers(1, 6), st.integers(7, 70_000)), min_size=1, max_size=48)
MEMORY = st.integers(2**20, 2**41)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(CARDS, MEMORY, st.integers(1, 4), st.booleans())
def test_the_planners_advice_is_feasible(cards, mem, workers, ooc):
    """Any request gets a plan; a feasible one keeps its promises, an infeasible one advises
    a memory limit (the least that works) and a disk size that, taken, give a feasible plan."""
    cards = tuple(cards)
    p = plan(cards, memory_limit=mem, disk_free="64GiB", workers=workers, out_of_core=ooc or None)
    size = math.prod(cards)
    if size > MAX_CELLS or max(cards) > MAX_CATEGORIES:
        assert not p.feasible and any("limit" in s for s in p.problems) and "INFEASIBLE" in p.report()
        return
    L = p.layout
    if p.out_of_core and not any("memory_limit" in s for s in p.problems):
        chunks = size // p.chunk_elements
        assert chunks <= MAX_CHUNKS and p.chunk_elements >= min(MIN_CHUNK_HARD, size)
        assert p.peak_memory <= mem
        assert L.a_band_elements * L.n_a_bands == size and L.b_band_elements * L.n_b_bands == size
    if p.feasible:
        assert p.peak_memory <= mem and p.disk_bytes <= 64 * 2**30
        return
    kw = dict(workers=workers, out_of_core=ooc or None)
    if any("memory_limit" in s for s in p.problems):
        advised = _advice(p, "memory_limit")
        least = min_memory(cards, workers=workers, out_of_core=True if ooc else None)
        assert parse_bytes(advised) >= least > mem
        assert plan(cards, memory_limit=least, **kw).feasible  # the least that works works,
        assert plan(cards, memory_limit=parse_bytes(advised), **kw).feasible  # so does the advice,
        assert not plan(cards, memory_limit=least - 1, **kw).feasible  # and less does not
        mem = parse_bytes(advised)
    if any("disk" in s for s in p.problems):
        p2 = plan(cards, memory_limit=mem, disk_free=_advice(p, "disk_free"), **kw)
        assert p2.feasible, p2.problems


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(CARDS, st.integers(2**20, 2**36))
def test_the_advised_subset_fits(cards, mem):
    """``plan``'s "leave these out" advice (as the command line gives it): the kept
    variables plan feasibly within the same budget."""
    from fsll_ooc.cli import practical_subset

    cards = tuple(cards)

    def fits(ks):
        return plan(ks, memory_limit=mem, disk_free="64GiB").feasible

    if fits(cards):
        return
    keep, dropped = practical_subset(cards, fits)
    if keep is None:
        assert not fits((1,)) or not fits(tuple(k for k in cards if k == 1) or (1,))
        return
    assert sorted(keep + list(dropped)) == list(range(len(cards))) and dropped
    assert fits(tuple(cards[i] for i in keep))


@pytest.mark.parametrize("spec", ["2x100000", "2x1000000000000", "9" * 40, "2x" + "9" * 40])
def test_absurd_requests_are_refused_at_once(spec):
    with pytest.raises(PlanError, match="limit|cannot read"):
        plan(parse_cards(spec))


@pytest.mark.parametrize("cards,word", [((2,) * 2000, "2**40"), ((2,) * 80, "2**40"), ((70_000, 2), "2**16"),
                                        ((2,) * 10_000, "2**40")])
def test_tables_beyond_the_limits_are_infeasible_plans(cards, word):
    p = plan(cards, memory_limit="4GiB")
    assert not p.feasible and word in " ".join(p.problems)
    assert "INFEASIBLE" in p.report() and len(p.report()) < 2000


def test_the_issue_cases_of_a_small_memory_limit_are_consistent():
    """2^26 cells: every limit below the least that works is refused with the same advice,
    and that advice works."""
    least = min_memory((2,) * 26)
    advice = {_advice(plan((2,) * 26, memory_limit=m), "memory_limit") for m in (512 * 2**20, 540 * 2**20, least - 1)}
    assert len(advice) == 1 and parse_bytes(advice.pop()) >= least
    assert plan((2,) * 26, memory_limit=least).feasible


def test_chunk_files_per_table_are_bounded():
    """The 20 variables of a medical network (~2^30 cells): at 1 GiB more than MAX_CHUNKS
    chunks would be needed, so the plan says which limit keeps them within the bound."""
    child = (2, 2, 3, 3, 5, 2, 2, 3, 3, 2, 5, 6, 2, 3, 2, 3, 4, 3, 3, 2)
    p = plan(child, memory_limit="1GiB", out_of_core=True)
    assert not p.feasible and "chunks per table" in p.problems[0]
    p = plan(child, memory_limit=_advice(p, "memory_limit"), out_of_core=True)
    assert p.feasible and math.prod(child) // p.chunk_elements <= MAX_CHUNKS
    for mem in ("2GiB", "4GiB", "16GiB", None):
        p = plan(child, memory_limit=mem, out_of_core=True)
        assert p.feasible and math.prod(child) // p.chunk_elements <= MAX_CHUNKS


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1, 0, True, "inf", "0GiB", "1e999GiB"])
def test_byte_sizes_that_are_not_sizes(bad):
    with pytest.raises(PlanError):
        parse_bytes(bad)


def test_passes_for_axes():
    L = Layout((2,) * 10, 3, 6)
    assert L.passes_for([5, 9]) == ("A",)
    assert L.passes_for([0, 7]) == ("B",)
    assert L.passes_for([0, 4]) == ("A", "B")


@pytest.mark.parametrize("text,want", [("2x3,5", (2, 2, 2, 5)), ("2,3,4", (2, 3, 4)), ("3x2", (3, 3))])
def test_parse_cards(text, want):
    assert parse_cards(text) == want


@pytest.mark.parametrize("bad", ["", "2y3", "0", "a,b"])
def test_parse_cards_errors(bad):
    with pytest.raises(PlanError):
        parse_cards(bad)


def test_parse_bytes():
    assert parse_bytes("4GiB") == 4 * 2**30 and parse_bytes("2 MB") == 2 * 10**6 and parse_bytes(None) is None
    with pytest.raises(PlanError, match="cannot read"):
        parse_bytes("lots")
    with pytest.raises(PlanError):
        Layout((2, 2), 2, 1)


# ----------------------------------------------------------------- duration

def _plan_json(capsys, *argv):
    import json

    from fsll_ooc import cli

    rc = cli.main(["plan", *map(str, argv), "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_duration_at_a_given_disk_speed(capsys):
    """2^30 cells: a pass reads dbar and thetabar (16 GiB) and writes thetabar (8 GiB); at
    100 MB/s that is 24 GiB / 1e8 B/s, and 100 terms take 1.7 (or 0.15) passes each."""
    from fsll_ooc.planner import PASSES_PER_TERM

    rc, out = _plan_json(capsys, "--cards", "2x30", "--memory", "4GiB", "--disk-speed", "100MB")
    assert rc == 0
    d = out["duration"]
    assert d["read_speed"] == d["write_speed"] == 1e8 and "--disk-speed" in d["source"]
    assert math.isclose(d["seconds_per_pass"], 24 * 2**30 / 1e8)
    assert sorted(PASSES_PER_TERM.values()) == [0.15, 1.7]
    for how, k in PASSES_PER_TERM.items():
        assert math.isclose(d["seconds_per_100_terms"][how], 100 * k * 24 * 2**30 / 1e8)
    line = next(ln for ln in out["report"].splitlines() if "time / 100 terms" in ln)
    assert line.index("at 0.15 passes/term, several steps per pass (the default here)") < line.index("at 1.7")
    assert "about 4 min" in out["report"]
    rc, out = _plan_json(capsys, "--cards", "2x20", "--memory", "4GiB", "--disk-speed", "100MB", "--out-of-core")
    line = next(ln for ln in out["report"].splitlines() if "time / 100 terms" in ln)
    assert line.index("at 1.7 passes/term, one step per pass (the default here)") < line.index("at 0.15")


def test_duration_is_measured_in_the_store_directory_or_in_memory(capsys, tmp_path):
    rc, out = _plan_json(capsys, "--cards", "2x24", "--memory", "1GiB", "--store", tmp_path / "s", "--out-of-core")
    assert rc == 0 and out["out_of_core"]
    d = out["duration"]
    assert str(tmp_path) in d["source"] and d["read_speed"] > 0 and d["write_speed"] > 0
    assert list(tmp_path.iterdir()) == []  # the measuring file is gone, the store not created
    rc, out = _plan_json(capsys, "--cards", "2x10", "--memory", "4GiB")
    assert rc == 0 and not out["out_of_core"] and "memory" in out["duration"]["source"]
    rc, out = _plan_json(capsys, "--cards", "2x24", "--memory", "1GiB", "--out-of-core")  # nothing to measure
    assert out["duration"] is None and "--disk-speed" in out["report"]


def test_a_full_disk_is_an_infeasible_plan_not_a_malformed_request():
    p = plan((2,) * 20, memory_limit="4GiB", disk_free=0, out_of_core=True)
    assert not p.feasible and "only 0 B is free" in p.problems[0]


def test_fit_estimate_is_the_learners_work_per_term_or_the_disk(capsys, tmp_path):
    """The whole-fit estimate: per term, TERM_SECONDS plus TERM_TABLE_COPIES copies of the
    table at the memory speed; out of core the passes' I/O when that is longer."""
    from fsll_ooc.planner import TERM_SECONDS, TERM_TABLE_COPIES, estimate_duration

    p = plan((2,) * 20, memory_limit="4GiB")
    d = estimate_duration(p, 1e9, 1e9, memory_speed=8e9)
    assert math.isclose(d.fit_seconds(100), 100 * (TERM_SECONDS + TERM_TABLE_COPIES * 8 * 2**20 / 8e9))
    assert estimate_duration(p, 1e9, 1e9).fit_seconds(100) is None
    q = plan((2,) * 30, memory_limit="4GiB", out_of_core=True)
    slow = estimate_duration(q, 1e6, 1e6, memory_speed=8e9)  # a very slow disk: the passes decide
    assert math.isclose(slow.fit_seconds(100), slow.seconds(100, 1.7))


def test_plan_with_a_store_is_out_of_core_with_names_and_a_disk_figure(capsys, tmp_path):
    import pandas as pd

    df = pd.DataFrame({"region": ["a", "b", "c"] * 20, "work": ["x", "y"] * 30, "sex": ["f"] * 30 + ["m"] * 30})
    df.to_csv(tmp_path / "d.csv", index=False)
    rc, out = _plan_json(capsys, "--data", tmp_path / "d.csv", "--store", tmp_path / "s", "--memory", "1GiB")
    assert rc == 0 and out["out_of_core"] and out["disk_bytes"] > 0   # what fit --store then does
    assert "region" in out["report"] and "X0" not in out["report"]
    assert out["duration"]["fit_seconds_per_100_terms"] > 0
