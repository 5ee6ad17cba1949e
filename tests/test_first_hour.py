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
    ax = plot_interactions(_model(n, terms, names), top=None)
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
