"""The pure planner, alone: layouts, costs, refusals."""
import math

import pytest

from fsll_ooc.planner import Layout, PlanError, parse_bytes, parse_cards, plan


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
    p = plan((2,) * 34, memory_limit="4GiB", disk_free="10GiB", out_of_core=True)
    assert not p.feasible
    assert any("disk" in s and "float32" in s for s in p.problems)
    assert "INFEASIBLE" in p.report()


def test_infeasible_memory_names_the_limit():
    p = plan((2,) * 40, memory_limit="512MiB", disk_free=None, out_of_core=True)
    assert not p.feasible and "memory_limit >=" in p.problems[0]


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
