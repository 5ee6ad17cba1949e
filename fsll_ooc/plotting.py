"""Pictures of a fitted model: its cost per iteration and how its variables interact.

matplotlib is optional (``pip install "fsll-ooc[docs]"``) and imported only when a
function here is called.  The functions draw on matplotlib ``Figure`` objects, not on
``pyplot``'s global state, so they work headless, in threads and in notebooks:

* :func:`plot_cost`: cost (MDL, nats per sample, log scale) and number of bases per
  iteration, one marker per kind of move (append, adjust, remove, ...), and below it
  the gain of each move (log scale) against the stopping threshold;
* :func:`plot_interactions`: variables on a circle; an edge joins two variables that
  share pairwise terms (width: their strength), a higher-order term is a hyperedge,
  drawn as a small hub joined to each of its variables (colour: its order); a
  variable's ring shows the strength of its single-variable terms.  On a new figure
  the pairwise-share heatmap (:func:`plot_pair_shares`) stands beside it, which stays
  readable for 10-30 variables where a graph of many hyperedges does not;
* :func:`plot_pair_shares`: a variables x variables heatmap: the strength of all terms
  that contain both variables (log colour scale, colour bar);
* :func:`save_plots`: the cost and the interaction pictures as PNG files (what
  ``fsll-ooc plot`` does).

"Strength" of a group of variables is the summed ``share`` of the cost reduction of
the terms on exactly that group (see :func:`fsll_ooc.queries.interactions`), or the
summed ``|theta|`` when the model has no fit history or ``weight="theta"``.

Example
-------
>>> import numpy as np
>>> from fsll_ooc import FSLL, datasets
>>> X, _ = datasets.paper_dataset("Ising5x4S", seed=0)
>>> m = FSLL(progress=False).fit(X[:, :4])       # one row of the Ising grid: a chain
>>> sorted(g for g in interaction_strengths(m) if len(g) == 2)
[(0, 1), (1, 2), (2, 3)]
>>> ax = plot_interactions(m)                    # doctest: +SKIP
>>> ax.figure.savefig("graph.png")               # doctest: +SKIP
"""
from __future__ import annotations

import math
import os
from collections import defaultdict

import numpy as np

from .queries import dependence, interactions, labels

__all__ = ["plot_cost", "plot_interactions", "plot_pair_shares", "save_plots", "interaction_strengths",
           "pair_strengths"]

_INSTALL = 'plotting needs matplotlib; install it with: pip install "fsll-ooc[docs]" (or pip install matplotlib)'
_MOVE_STYLE = {"append": ("o", "#1f77b4"), "adjust": ("s", "#ff7f0e"), "remove": ("x", "#d62728")}
_OTHER_STYLES = [("D", "#9467bd"), ("^", "#8c564b"), ("v", "#e377c2"), ("P", "#17becf")]
#: Colours of the term orders 2, 3, ... when at most this many orders are drawn (a legend);
#: more orders take colours from a colour map with a colour bar.
_ORDER_COLOURS = ["#1f77b4", "#2ca02c", "#9467bd", "#d62728", "#ff7f0e", "#8c564b"]
#: Written into the PNGs of :func:`save_plots`: ``fsll-ooc plot`` replaces files that carry it
#: without ``--force`` (they are its own).
_PNG_METADATA = {"Software": "fsll-ooc"}
#: What ``weight`` may be (see :func:`interaction_strengths`).
WEIGHTS = ("mi", "auto", "share", "theta")
#: Up to this many variables the graph draws the hull of a higher-order term and two-line labels.
_SMALL_GRAPH = 10


def _new_figure(figsize, n_axes: int = 1, **grid):
    """A new Agg-backed ``Figure`` and its axes (no pyplot: no GUI, no global state)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(_INSTALL) from exc
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    if n_axes == 1:
        return fig, fig.add_subplot()
    return fig, fig.subplots(**grid)


def _check_mpl() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(_INSTALL) from exc


def _log_axis(axis) -> None:
    """Log scale with plain-number labels at 1, 2, 5 x 10^k (a few decades read at a glance)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _integer_axis(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _stop_threshold(model) -> float | None:
    """The learner's stopping threshold (nats per sample) of a fitted model, when known."""
    eps, n = getattr(model, "epsilon", None), getattr(model, "n_samples_", None)
    if eps is None or not n:
        return None
    from .learn.greedy import resolve_epsilon

    try:
        return resolve_epsilon(eps, int(n))
    except (TypeError, ValueError):
        return None


def plot_cost(model, ax=None):
    """Cost per iteration (left axis, log scale) and number of bases (right axis, dashed).

    On a new figure (``ax=None``) a second panel below shows the gain of each move (the
    cost decrease, log scale) and the stopping threshold: the long flat tail of a fit
    is many small moves, each still above the threshold.  Returns the cost ``Axes``
    (``ax.figure.savefig(path)`` saves the figure).  Needs ``history_``: a model fitted
    in this session or loaded from a file saved with one.
    """
    _check_mpl()
    if getattr(model, "members_", None) is not None:
        return _plot_member_costs(model, ax)
    hist = [h for h in (getattr(model, "history_", None) or []) if h.get("cost") is not None]
    if not hist:
        raise ValueError("this model has no fit history (history_) to plot")
    gain_ax = None
    if ax is None:
        _, (ax, gain_ax) = _new_figure((7.6, 5.6), 2, nrows=2, sharex=True,
                                       gridspec_kw={"height_ratios": (2.2, 1.0)})
    it = np.array([h["iter"] for h in hist])
    cost = np.array([h["cost"] for h in hist], dtype=float)
    nb = np.array([h.get("n_bases", 0) for h in hist])
    ax.plot(it, cost, color="0.3", lw=1.2, zorder=1)
    moves = [h.get("move") for h in hist]
    others = iter(_OTHER_STYLES)
    styles = {}
    for move in dict.fromkeys(m for m in moves if m not in (None, "init")):
        styles[move] = _MOVE_STYLE.get(move) or next(others, ("*", "0.4"))
        sel = np.array([m == move for m in moves])
        ax.scatter(it[sel], cost[sel], marker=styles[move][0], s=18, color=styles[move][1], label=move, zorder=2)
    if np.all(cost > 0):
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
    _clip_first_step(ax, it, cost)
    ax.set_ylabel("cost: KL + MDL penalty (nats per sample)")
    ax.set_title(f"fit: cost {cost[-1]:.4f} after {int(it[-1])} iterations, {int(nb[-1])} bases")
    ax.grid(alpha=0.3, which="both")
    _integer_axis(ax.xaxis)
    right = ax.twinx()
    right.step(it, nb, where="post", color="#2ca02c", ls="--", lw=1.0, label="bases")
    right.set_ylabel("number of bases", color="#2ca02c")
    right.tick_params(axis="y", colors="#2ca02c")
    _integer_axis(right.yaxis)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = right.get_legend_handles_labels()
    # outside, right of the bases axis: never over the curves
    ax.legend(h1 + h2, l1 + l2, loc="upper left", bbox_to_anchor=(1.16, 1.0), fontsize="small", frameon=False)
    if gain_ax is None:
        ax.set_xlabel("iteration")
        return ax
    gain = np.array([-float(h.get("delta") or 0.0) for h in hist])
    for move, (marker, colour) in styles.items():
        sel = np.array([m == move for m in moves]) & (gain > 0)
        gain_ax.scatter(it[sel], gain[sel], marker=marker, s=12, color=colour, zorder=2)
    eps = _stop_threshold(model)
    if eps is not None:
        gain_ax.axhline(eps, color="#d62728", lw=1.0, ls=":", zorder=1)
        gain_ax.annotate(f"stop below {eps:.2g}", (1.0, eps), xycoords=("axes fraction", "data"),
                         xytext=(-2, 3), textcoords="offset points", ha="right", va="bottom",
                         fontsize="x-small", color="#d62728")
    if np.any(gain > 0):
        gain_ax.set_yscale("log")
    gain_ax.set_ylabel("gain of the move")
    gain_ax.set_xlabel("iteration")
    gain_ax.grid(alpha=0.3)
    _integer_axis(gain_ax.xaxis)
    return ax


def _clip_first_step(ax, it, cost) -> None:
    """When the first move's drop dwarfs all the later ones, scale the axis to the later
    costs and write the starting cost at the top instead of flattening the rest."""
    if len(cost) < 3:
        return
    rest = cost[1:]
    lo, hi = float(rest.min()), float(rest.max())
    span = hi - lo
    if not span > 0 or cost[0] - hi <= 2 * span:
        return
    if ax.get_yscale() == "log":
        top = hi * (hi / lo) ** 0.08
        bottom = lo / (hi / lo) ** 0.05
    else:
        top, bottom = hi + 0.08 * span, lo - 0.05 * span
    ax.set_ylim(bottom, top)
    ax.annotate(f"start: {cost[0]:.4g} (off the scale, above)", (float(it[0]), top), xycoords="data",
                xytext=(4, -4), textcoords="offset points", ha="left", va="top", fontsize="x-small",
                color="0.3", arrowprops=None)


def _plot_member_costs(avg, ax=None):
    """The cost per iteration of each member of an average, one line each."""
    if ax is None:
        _, ax = _new_figure((7.6, 4.2))
    drawn = 0
    for k, m in enumerate(avg.members_):
        hist = [h for h in (getattr(m, "history_", None) or []) if h.get("cost") is not None]
        if not hist:
            continue
        it = np.array([h["iter"] for h in hist])
        cost = np.array([h["cost"] for h in hist], dtype=float)
        ax.plot(it, cost, lw=1.2, label=f"member {k}: {cost[-1]:.4f}, {len(m.theta_)} bases")
        drawn += 1
    if not drawn:
        raise ValueError("the members of this average have no fit history (history_) to plot")
    ax.set_title(f"average of {len(avg.members_)} models: each member's fit")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cost (nats per sample)")
    ax.grid(alpha=0.3)
    _integer_axis(ax.xaxis)
    ax.legend(fontsize="small", frameon=False)
    return ax


def interaction_strengths(model, weight: str = "auto") -> dict[tuple[int, ...], float]:
    """Strength of each group of variables that has terms: ``{(i, j, ...): strength}``.

    ``weight``: ``"mi"`` (the mutual information of each pair of variables under the
    model, :func:`fsll_ooc.queries.dependence`: a property of the distribution),
    ``"share"`` (summed share of the cost reduction of the terms on exactly that group),
    ``"theta"`` (summed ``|theta|``) or ``"auto"`` (share when the model has a fit
    history, else ``|theta|``; an average: ``"mi"``).  Shares and ``|theta|`` depend on
    the basis, i.e. on how the categories are coded; MI does not.
    """
    return _strengths(model, weight)[0]


def _strengths(model, weight: str) -> tuple[dict[tuple[int, ...], float], str]:
    if weight not in WEIGHTS:
        raise ValueError(f"weight must be one of {', '.join(map(repr, WEIGHTS))}, got {weight!r}")
    if weight == "mi" or (weight == "auto" and getattr(model, "members_", None) is not None):
        names, _ = labels(model)
        dep = dependence(model, conditional=False)
        return {(names.index(a), names.index(b)) if names.index(a) < names.index(b) else
                (names.index(b), names.index(a)): float(v) for a, b, v in zip(dep["a"], dep["b"], dep["mi"])
                if v > 0}, "mi"
    rows = interactions(model, as_frame=False)
    if weight == "auto":
        weight = "share" if rows and not any(math.isnan(r["share"]) for r in rows) else "theta"
    out: dict[tuple[int, ...], float] = defaultdict(float)
    for r in rows:
        group = tuple(i for i, v in enumerate(r["y"]) if v)
        w = abs(r["theta"]) if weight == "theta" else r["share"]
        out[group] += 0.0 if math.isnan(w) else w
    return dict(out), weight


def pair_strengths(model, weight: str = "auto") -> np.ndarray:
    """The numbers behind :func:`plot_pair_shares`: an ``(n, n)`` symmetric array.

    Entry ``[i, j]`` (``i != j``) is the strength of the terms that contain both
    variables ``i`` and ``j``, each term's strength split evenly over the
    ``o (o - 1) / 2`` pairs of its ``o`` variables (so a pair term counts whole, and
    the upper triangle sums to the strength of all interactions); the diagonal is the
    strength of the single-variable terms.  ``weight`` as in :func:`interaction_strengths`.
    """
    return _pair_matrix(len(model.cardinalities_), _strengths(model, weight)[0])


def _pair_matrix(n: int, strengths) -> np.ndarray:
    out = np.zeros((n, n))
    for g, s in strengths.items():
        if len(g) == 1:
            out[g[0], g[0]] += s
            continue
        idx = np.array(g)
        each = s / (len(g) * (len(g) - 1) / 2)
        out[np.ix_(idx, idx)] += each
        out[idx, idx] -= each
    return out


def _order_colours(orders: list[int]):
    """``(colour of an order, legend handles or None, (cmap, norm) for a colour bar or None)``."""
    if len(orders) <= len(_ORDER_COLOURS):
        colours = {o: _ORDER_COLOURS[i] for i, o in enumerate(orders)}
        return colours, None
    from matplotlib import colormaps
    from matplotlib.colors import BoundaryNorm, ListedColormap

    base = colormaps["viridis"]  # its yellow end is too pale on white: stop at 85 %
    cmap = ListedColormap([base(0.85 * i / (len(orders) - 1)) for i in range(len(orders))])
    norm = BoundaryNorm(np.arange(len(orders) + 1) - 0.5, len(orders))
    colours = {o: cmap(i) for i, o in enumerate(orders)}
    return colours, (cmap, norm)


def plot_interactions(model, ax=None, weight: str = "mi", top: int | None = 40,
                      min_strength: float = 0.0, pairs: bool | None = None):
    """The interaction graph of the variables (see the module docstring).

    ``weight``: what an edge's width shows (see :func:`interaction_strengths`; default
    ``"mi"``, the mutual information of the pair under the model: edges only, no hubs or
    rings); ``top``: draw only the ``top`` strongest pair/hyperedges (None: all);
    ``min_strength``: drop groups weaker than this; ``pairs``: draw the pairwise-share
    heatmap (:func:`plot_pair_shares`) beside the graph; the default (None) does so on a
    new figure (``ax=None``) of two or more variables.  Returns the graph's ``Axes``
    (``ax.figure`` holds both).
    """
    _check_mpl()
    from matplotlib.cm import ScalarMappable
    from matplotlib.lines import Line2D
    from matplotlib.patches import Circle, Polygon

    names, _ = labels(model)
    ks = tuple(int(k) for k in model.cardinalities_)
    n = len(ks)
    strengths, weight = _strengths(model, weight)
    heat_ax = None
    if ax is None:
        size = 5.5 + 0.08 * n
        if pairs is None:
            pairs = n >= 2
        if pairs:
            fig, (ax, heat_ax) = _new_figure((2 * size + 0.6, size), 2, ncols=2,
                                             gridspec_kw={"width_ratios": (1.0, 0.95)})
        else:
            fig, ax = _new_figure((size, size))
    elif pairs:
        raise ValueError("pairs=True needs a new figure (ax=None); draw the heatmap into your own "
                         "axes with plot_pair_shares(model, ax=...)")
    single = {g[0]: s for g, s in strengths.items() if len(g) == 1}
    groups = sorted(((s, g) for g, s in strengths.items() if len(g) >= 2 and s > min_strength), reverse=True)
    if top is not None:
        groups = groups[:top]
    smax = max([s for s, _ in groups] + list(single.values()) + [1e-300])
    angle = np.pi / 2 - 2 * np.pi * np.arange(n) / max(n, 1)
    xy = np.c_[np.cos(angle), np.sin(angle)]
    node_r = min(0.12, 1.1 / max(n, 1) + 0.03)
    small = n <= _SMALL_GRAPH

    orders = sorted({len(g) for _, g in groups})
    colour_of, colour_bar = _order_colours(orders)
    for s, g in sorted(groups):  # weakest first, so strong ones are drawn on top
        frac = math.sqrt(s / smax)  # square root: weak couplings stay visible beside strong ones
        colour = colour_of[len(g)]
        lw = 0.6 + 7.0 * frac
        alpha = 0.35 + 0.6 * frac
        if len(g) == 2:
            (x0, y0), (x1, y1) = xy[g[0]], xy[g[1]]
            ax.plot([x0, x1], [y0, y1], color=colour, lw=lw, alpha=alpha, solid_capstyle="round", zorder=1)
            continue
        pts = xy[list(g)]
        hub = pts.mean(axis=0)
        if small:  # with many variables the hulls would cover the whole disc
            ax.add_patch(Polygon(pts, closed=True, facecolor=colour, edgecolor="none", alpha=0.06 + 0.14 * frac,
                                 zorder=0))
        for p in pts:
            ax.plot([hub[0], p[0]], [hub[1], p[1]], color=colour, lw=lw, alpha=alpha, zorder=1)
        ax.add_patch(Circle(hub, 0.02 + 0.02 * frac, facecolor=colour, edgecolor="white", zorder=2))

    for i in range(n):
        frac = single.get(i, 0.0) / smax
        ax.add_patch(Circle(xy[i], node_r, facecolor="white", edgecolor="#444444",
                            lw=1.0 + 6.0 * frac, zorder=3))
        x, y = xy[i] * (1 + node_r + 0.06)
        if small:
            ax.text(x, y, f"{names[i]}\n({ks[i]})", ha="left" if x > 0.3 else "right" if x < -0.3 else "center",
                    va="bottom" if y > 0.3 else "top" if y < -0.3 else "center", fontsize="small", zorder=4)
        else:  # radial labels: many names around the circle without overlapping
            deg = math.degrees(angle[i]) % 360
            left = 90 < deg < 270
            ax.text(x, y, f"{names[i]} ({ks[i]})", rotation=deg - 180 if left else deg,
                    rotation_mode="anchor", ha="right" if left else "left", va="center",
                    fontsize="small" if n <= 20 else "x-small", zorder=4)

    legend = []
    if colour_bar is None:
        legend = [Line2D([], [], color=colour_of[o], lw=3,
                         label="pair terms" if o == 2 else f"order-{o} terms (hub)") for o in orders]
    if weight != "mi":
        legend.append(Line2D([], [], marker="o", ls="none", markerfacecolor="white", markeredgecolor="#444444",
                             markeredgewidth=3, markersize=10, label="single-variable terms (ring)"))
    elif legend:
        legend[0].set_label("pairs: mutual information")
    # below the drawing, outside the axes: never on top of a variable's label
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize="small",
              frameon=False)
    if colour_bar is not None:
        cmap, norm = colour_bar
        bar = ax.figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, location="left", shrink=0.6,
                                 ticks=range(len(orders)))
        bar.ax.set_yticklabels([str(o) for o in orders])
        bar.set_label("order of the term (2 = pair; hubs for 3 and more)")
    what = {"share": "share of the cost reduction", "theta": "|theta|",
            "mi": f"mutual information (max {smax:.3g} nats)"}[weight]
    more = "" if top is None or len(strengths) - len(single) <= top else f", strongest {top}"
    ax.set_title(f"{n} variables\nwidth: {what}{more}", fontsize="medium")
    lim = _graph_limit(ax, n, node_r, names, ks, small)
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_aspect("equal")
    ax.axis("off")
    if heat_ax is not None:
        _draw_pair_shares(model, heat_ax, strengths, weight, names, n)
    return ax


def _graph_limit(ax, n: int, node_r: float, names, ks, small: bool) -> float:
    """Half-width of the graph's data window so that the labels outside the circle stay inside it."""
    ring = 1.0 + node_r + 0.06
    if small:
        return ring + 0.4
    points = 0.5 * (8.3 if n <= 20 else 6.9) * max(len(f"{nm} ({k})") for nm, k in zip(names, ks))
    bbox = ax.get_position()
    fig_w, fig_h = ax.figure.get_size_inches()
    axes_points = 72 * min(bbox.width * fig_w, bbox.height * fig_h)
    return ring / max(1.0 - 2.0 * points / axes_points, 0.35)


def plot_pair_shares(model, ax=None, weight: str = "mi"):
    """Heatmap of :func:`pair_strengths`: which pairs of variables share terms, and how much.

    Cell ``(i, j)`` is the strength of the terms containing both variables, each term's
    split evenly over its pairs of variables (log colour scale; blank: no common term);
    the diagonal is blank (single-variable terms are the rings of
    :func:`plot_interactions`).  All terms count, not only the strongest.  Returns the
    ``Axes``.
    """
    _check_mpl()
    names, _ = labels(model)
    n = len(model.cardinalities_)
    strengths, weight = _strengths(model, weight)
    if ax is None:
        size = 4.5 + 0.12 * n
        _, ax = _new_figure((size + 1.2, size))
    _draw_pair_shares(model, ax, strengths, weight, names, n)
    return ax


def _draw_pair_shares(model, ax, strengths, weight: str, names: list, n: int) -> None:
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    m = _pair_matrix(n, strengths)
    np.fill_diagonal(m, 0.0)
    shown = np.ma.masked_less_equal(m, 0.0)
    share = weight == "share"
    scale = 100.0 if share else 1.0
    mi = weight == "mi"
    cmap = colormaps["magma_r"].with_extremes(bad="#f4f4f4")
    if shown.count():
        vmax = float(shown.max()) * scale
        vmin = max(float(shown.min()) * scale, vmax * 1e-3)
        norm = LogNorm(vmin=vmin, vmax=vmax)
        image = ax.imshow(shown * scale, cmap=cmap, norm=norm, interpolation="nearest")
        bar = ax.figure.colorbar(image, ax=ax, shrink=0.8)
        _log_axis(bar.ax.yaxis)
        bar.set_label("mutual information (nats)" if mi else
                      "% of the cost reduction (a term's share split over its pairs)" if share else
                      "|theta| of the terms containing both (split over their pairs)")
        if n <= 8:  # small enough to print the numbers
            for i, j in zip(*np.nonzero(m)):
                ax.text(j, i, f"{m[i, j] * scale:.2g}", ha="center", va="center", fontsize="x-small",
                        color="white" if norm(m[i, j] * scale) > 0.6 else "black")
    else:
        ax.imshow(shown, cmap=cmap)
        ax.text(0.5, 0.5, "no dependence" if mi else "no interactions", transform=ax.transAxes, ha="center",
                va="center")
    size = "small" if n <= 12 else "x-small" if n <= 20 else 6
    if n <= 8:
        ax.set_xticks(range(n), names, rotation=30, ha="right", rotation_mode="anchor", fontsize=size)
    else:
        ax.set_xticks(range(n), names, rotation=90, fontsize=size)
    ax.set_yticks(range(n), names, fontsize=size)
    ax.set_xticks(np.arange(n + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(n + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", lw=0.5)
    ax.tick_params(which="minor", length=0)
    ax.set_title("pairs of variables: mutual information" if mi else "pairs of variables: their common terms",
                 fontsize="medium")


def save_plots(model, out_dir=".", prefix: str = "model", dpi: int = 120, **graph_options) -> list[str]:
    """Save ``<prefix>-cost.png`` (if the model has a history) and ``<prefix>-interactions.png``.

    Creates ``out_dir`` if needed; returns the paths written.  ``graph_options`` go to
    :func:`plot_interactions` (the interactions picture holds the graph and, for two or
    more variables, the pairwise-share heatmap).
    """
    _check_mpl()
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    histories = [getattr(m, "history_", None) for m in getattr(model, "members_", None) or [model]]
    if any(h.get("cost") is not None for hist in histories for h in (hist or [])):
        ax = plot_cost(model)
        path = os.path.join(out_dir, f"{prefix}-cost.png")
        ax.figure.savefig(path, dpi=dpi, metadata=_PNG_METADATA)
        paths.append(path)
    ax = plot_interactions(model, **graph_options)
    path = os.path.join(out_dir, f"{prefix}-interactions.png")
    ax.figure.savefig(path, dpi=dpi, metadata=_PNG_METADATA)
    paths.append(path)
    return paths
