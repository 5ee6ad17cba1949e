"""What the search memoises between passes gives what a fresh computation gives, bit for bit."""
from __future__ import annotations

import numpy as np

from fsll_ooc import FSLL, datasets
from fsll_ooc.learn import corrective, greedy


def _fitted(cards=(3, 4, 2, 3), n=3000, seed=4):
    p, _ = datasets.random_bayesnet(cards, 2, seed=seed)
    X = datasets.sample_table(p, n, seed=seed + 1)
    return FSLL(cardinalities=cards, progress=False).fit(X)


def _fresh_family_move(engine, state, best, limit):
    """:func:`corrective.family_move` as it was computed before its scores were memoised."""
    delta, move, y, t, d = best
    counts = state.family_counts()
    if move == "append":
        delta = delta + (state.marginal_penalties([y], counts)[0] - state.penalty(y))
    cand, dd, fam_ix, fams = corrective._family_candidates(engine, state, limit)
    keep = ~np.fromiter(map(state.theta.__contains__, cand.tolist()), bool, len(cand))
    if not keep.any():
        return delta, move, y, t, d
    cand, dd, fam_ix = cand[keep], dd[keep], fam_ix[keep]
    tt = np.asarray(engine.gather(cand), np.float64)
    code = state.term_code()
    r = np.array([code.add(a, counts.get(a, 0)) for a in fams])[fam_ix]
    lim = 1.0 - 2.0**-52
    tc = np.clip(tt, -lim, lim)
    gain = 0.5 * ((1.0 + dd) * (np.log1p(tc) - np.log1p(dd)) + (1.0 - dd) * (np.log1p(-tc) - np.log1p(-dd))) + r
    i = int(np.argmin(gain))
    if gain[i] < delta:
        return float(gain[i]), "append", int(cand[i]), float(tt[i]), float(dd[i])
    return delta, move, y, t, d


def test_family_move_memo_matches_a_fresh_computation_as_the_support_changes():
    m = _fitted()
    st, eng = m.fit_state_, m.engine_
    assert st.penalty_code == "family"
    members = list(st.theta)
    best = (float("inf"), "none", -1, 0.0, 0.0)  # (any candidate beats it)
    seen = 0
    # the support shrinks, regrows, is reordered: the memo follows it (and the same support twice)
    for keep in (members, members[:-1], members[:-3], members, members[::-1], members[::-1]):
        saved = dict(st.theta)
        st.theta = {y: saved.get(y, 0.1) for y in keep}
        st.dbar = {y: st.dbar.get(y, 0.0) for y in keep}
        got = corrective.family_move(eng, st, best, 512)
        want = _fresh_family_move(eng, st, best, 512)
        assert got == want
        seen += got[1] == "append"
    assert seen  # some support left terms to append on its families


def test_support_penalties_memo_is_marginal_penalties():
    m = _fitted()
    st = m.fit_state_
    ys = list(st.theta)
    want = st.marginal_penalties(ys)
    assert st.penalties(ys) == want and st.penalties(ys) == want  # computed, then memoised
    out = st.penalties(ys)
    out[0] = -1.0  # a caller's list is its own
    assert st.penalties(ys) == want
    assert st.penalties(ys[:-1]) == st.marginal_penalties(ys[:-1])  # not the support: not memoised
    y = ys.pop()
    v = st.theta.pop(y)  # the support changes: priced again
    assert st.penalties(ys) == st.marginal_penalties(ys)
    st.theta[y] = v
    st.set_penalty_scale(0.5)  # another scale: priced again
    ys.append(y)
    assert st.penalties(ys) == st.marginal_penalties(ys)


def test_settle_allocator_once_per_process(monkeypatch):
    first = greedy.settle_allocator()
    assert greedy.settle_allocator() is first  # asked once
    monkeypatch.setattr(greedy, "_ALLOCATOR", [])
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")  # the user's own setting wins
    assert greedy.settle_allocator() is False


def test_digits_and_family_counts_memos():
    import math

    import pytest

    from fsll_ooc.learn.state import FitState

    cards = (3, 2, 4)
    st = FitState(cards, 100, 1.0, penalty_code="family")
    for flat in range(math.prod(cards)):
        want = tuple(int(v) for v in np.unravel_index(flat, cards))
        assert st.digits(flat) == want and st.digits(np.int64(flat)) == want  # computed, then memoised
    with pytest.raises(ValueError):
        st.digits(math.prod(cards))
    ys = [5, 1, 7, 3, 2, 9]  # families in the order of their first member, counted
    want: dict = {}
    for y in ys:
        a = tuple(i for i, v in enumerate(st.digits(y)) if v)
        want[a] = want.get(a, 0) + 1
    got = st._count_families(ys)
    assert got == want and list(got) == list(want) and type(got) is dict


def test_support_prices_and_totals_are_the_per_term_ones():
    """The support's prices (one per family) and code length (its counts memoised) are
    :meth:`marginal_penalties` and the count from scratch, bit for bit, as the support changes."""
    m = _fitted()
    st = m.fit_state_
    members = list(st.theta)
    for keep in (members, members[:-1], members[::-1], members[:2], members):
        saved = dict(st.theta)
        st.theta = {y: saved.get(y, 0.1) for y in keep}
        ys = list(st.theta)
        assert st.penalties(ys) == st.marginal_penalties(ys)
        code, lengths = st.term_code(), {}
        want = sum(code.total(*key) for key in st._count_families(ys).items())
        assert st.total_penalty() == want == st.total_penalty_of(ys)
        assert st.total_penalty_of(ys[:-1]) == sum(code.total(*k) for k in st._count_families(ys[:-1]).items())
        assert st.family_counts() == st._count_families(ys)


def test_families_found_together_are_the_families_one_by_one():
    from fsll_ooc.learn.state import FitState

    for cards in ((3, 2, 4), (2,) * 17, (5, 3, 2, 2, 7)):
        size = int(np.prod(cards))
        ys = np.random.default_rng(len(cards)).integers(0, size, 300).tolist() + [0, size - 1]
        together = FitState(cards, 100, 1.0, penalty_code="family")
        alone = FitState(cards, 100, 1.0, penalty_code="family")
        got = together._families(ys)
        want = [alone.family(y) for y in ys]
        assert got == want and all(type(a) is tuple and all(type(i) is int for i in a) for a in got)


def test_one_memo_of_add_prices():
    """FitState's add prices (the support's, the marginal ones, many at once) are kept in the
    code's own memo (:meth:`fsll_ooc.cost.TermCode.add_memo`), each a fresh code's price bit for bit."""
    from fsll_ooc import cost as C

    m = _fitted()
    st = m.fit_state_
    code = st.term_code()
    ys = list(st.theta)
    counts = st.family_counts()
    families = [(0,), (1,), (0, 1), (0, 2), (1, 2, 3)] + [st.family(y) for y in ys]
    prices = [st.penalties(ys), st.marginal_penalties(ys[:3] + [1, 2, 5]), st.add_prices(families, counts)]
    assert "add" not in st.__dict__.get("_code_memos", (None, {}))[1]  # (the state keeps the totals only)
    fresh = C.TermCode(st.cards, st.n_samples, st.penalty_code, st.penalty_scale, st.further_price)
    memo = code.add_memo()
    for key, v in memo.items():
        assert v == fresh._add(*key) or (v == np.inf and fresh._add(*key) == np.inf)
    want = [counts.get(a, 0) for a in families]
    assert prices[2] == [fresh.add(a, c) for a, c in zip(families, want)]
    assert all((a, c) in memo for a, c in zip(families, want))


def test_penalty_tally_is_the_total_from_scratch_after_every_change():
    """PenaltyTally (a batch's code length, updated term by term) is ``total_penalty_of`` of the
    support after every append and removal, bit for bit, under either code: families joining,
    growing, losing their first member (its place in the sum moves) and coming back."""
    from fsll_ooc.learn.state import FitState, PenaltyTally

    cards = (3, 4, 2, 3, 2)
    size = int(np.prod(cards))
    rng = np.random.default_rng(7)
    for code in ("paper", "family"):
        for scale in (1.0, 0.5):
            st = FitState(cards, 900, 2.0, penalty_code=code, penalty_scale=scale)
            ys = [int(y) for y in rng.choice(np.arange(1, size), 6, replace=False)]
            tally = PenaltyTally(st, ys)
            assert tally.total == st.total_penalty_of(ys)
            for _ in range(300):
                if ys and rng.random() < 0.35:
                    ys.pop(int(rng.integers(len(ys))))
                    tally.reset(ys)
                else:
                    y = int(rng.integers(1, size))
                    if y in ys:
                        continue
                    ys.append(y)
                    tally.append(y)
                assert tally.total == st.total_penalty_of(ys)
