"""Pictures of a fitted model: its cost per iteration and the interaction graph of its variables.

matplotlib is optional (``pip install "fsll-ooc[docs]"``) and imported only when a
function here is called.  The functions draw on matplotlib ``Figure`` objects, not on
``pyplot``'s global state, so they work headless, in threads and in notebooks:

* :func:`plot_cost`: cost (MDL, nats) and number of bases per iteration, one marker
  per kind of move (append, adjust, remove, ...);
* :func:`plot_interactions`: variables on a circle; an edge joins two variables that
  share pairwise terms (width: their strength), a higher-order term is a hyperedge,
  drawn as a small hub joined to each of its variables; a variable's ring shows the
  strength of its single-variable terms;
* :func:`save_plots`: both, as PNG files (what ``fsll-ooc plot`` does).

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

from .queries import interactions, labels

__all__ = ["plot_cost", "plot_interactions", "save_plots", "interaction_strengths"]

_INSTALL = 'plotting needs matplotlib; install it with: pip install "fsll-ooc[docs]" (or pip install matplotlib)'
_MOVE_STYLE = {"append": ("o", "#1f77b4"), "adjust": ("s", "#ff7f0e"), "remove": ("x", "#d62728")}
_OTHER_STYLES = [("D", "#9467bd"), ("^", "#8c564b"), ("v", "#e377c2"), ("P", "#17becf")]
_ORDER_COLOURS = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def _figure(figsize):
    """A new Agg-backed ``Figure`` and its axes (no pyplot: no GUI, no global state)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(_INSTALL) from exc
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _check_mpl() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(_INSTALL) from exc


def plot_cost(model, ax=None):
    """Cost per iteration (left axis, nats) and number of bases (right axis, dashed).

    Returns the ``Axes`` (``ax.figure.savefig(path)`` saves it).  Needs ``history_``:
    a model fitted in this session or loaded from a file saved with one.
    """
    _check_mpl()
    hist = [h for h in (getattr(model, "history_", None) or []) if h.get("cost") is not None]
    if not hist:
        raise ValueError("this model has no fit history (history_) to plot")
    if ax is None:
        _, ax = _figure((6.4, 4.0))
    it = np.array([h["iter"] for h in hist])
    cost = np.array([h["cost"] for h in hist], dtype=float)
    nb = np.array([h.get("n_bases", 0) for h in hist])
    ax.plot(it, cost, color="0.3", lw=1.2, zorder=1)
    moves = [h.get("move") for h in hist]
    others = iter(_OTHER_STYLES)
    for move in dict.fromkeys(m for m in moves if m not in (None, "init")):
        marker, colour = _MOVE_STYLE.get(move) or next(others, ("*", "0.4"))
        sel = np.array([m == move for m in moves])
        ax.scatter(it[sel], cost[sel], marker=marker, s=18, color=colour, label=move, zorder=2)
    ax.set_xlabel("iteration")
    ax.set_ylabel("cost: KL + MDL penalty (nats per sample)")
    ax.set_title(f"fit: cost {cost[-1]:.4f} after {int(it[-1])} iterations, {int(nb[-1])} bases")
    ax.grid(alpha=0.3)
    right = ax.twinx()
    right.step(it, nb, where="post", color="#2ca02c", ls="--", lw=1.0, label="bases")
    right.set_ylabel("number of bases", color="#2ca02c")
    right.tick_params(axis="y", colors="#2ca02c")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = right.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="center right", fontsize="small")
    return ax


def interaction_strengths(model, weight: str = "auto") -> dict[tuple[int, ...], float]:
    """Strength of each group of variables that has terms: ``{(i, j, ...): strength}``.

    ``weight``: ``"share"`` (summed share of the cost reduction), ``"theta"``
    (summed ``|theta|``) or ``"auto"`` (share when the model has a fit history).
    """
    return _strengths(model, weight)[0]


def _strengths(model, weight: str) -> tuple[dict[tuple[int, ...], float], str]:
    if weight not in ("auto", "share", "theta"):
        raise ValueError(f"weight must be 'auto', 'share' or 'theta', got {weight!r}")
    rows = interactions(model, as_frame=False)
    if weight == "auto":
        weight = "share" if rows and not any(math.isnan(r["share"]) for r in rows) else "theta"
    out: dict[tuple[int, ...], float] = defaultdict(float)
    for r in rows:
        group = tuple(i for i, v in enumerate(r["y"]) if v)
        w = abs(r["theta"]) if weight == "theta" else r["share"]
        out[group] += 0.0 if math.isnan(w) else w
    return dict(out), weight


def plot_interactions(model, ax=None, weight: str = "auto", top: int | None = 40,
                      min_strength: float = 0.0):
    """The interaction graph of the variables (see the module docstring).

    ``top``: draw only the ``top`` strongest pair/hyperedges (None: all);
    ``min_strength``: drop groups weaker than this.  Returns the ``Axes``.
    """
    _check_mpl()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Circle, Polygon

    names, _ = labels(model)
    ks = tuple(int(k) for k in model.cardinalities_)
    n = len(ks)
    strengths, weight = _strengths(model, weight)
    single = {g[0]: s for g, s in strengths.items() if len(g) == 1}
    groups = sorted(((s, g) for g, s in strengths.items() if len(g) >= 2 and s > min_strength), reverse=True)
    if top is not None:
        groups = groups[:top]
    if ax is None:
        size = 5.5 + 0.08 * n
        _, ax = _figure((size, size))
    smax = max([s for s, _ in groups] + list(single.values()) + [1e-300])
    angle = np.pi / 2 - 2 * np.pi * np.arange(n) / max(n, 1)
    xy = np.c_[np.cos(angle), np.sin(angle)]
    node_r = min(0.12, 1.1 / max(n, 1) + 0.03)

    orders = sorted({len(g) for _, g in groups})
    for s, g in sorted(groups):  # weakest first, so strong ones are drawn on top
        frac = s / smax
        colour = _ORDER_COLOURS[min(len(g) - 2, len(_ORDER_COLOURS) - 1)]
        lw = 0.6 + 7.0 * frac
        if len(g) == 2:
            (x0, y0), (x1, y1) = xy[g[0]], xy[g[1]]
            ax.plot([x0, x1], [y0, y1], color=colour, lw=lw, alpha=0.35 + 0.6 * frac, solid_capstyle="round",
                    zorder=1)
            continue
        pts = xy[list(g)]
        hub = pts.mean(axis=0)
        ax.add_patch(Polygon(pts, closed=True, facecolor=colour, edgecolor="none", alpha=0.06 + 0.14 * frac,
                             zorder=0))
        for p in pts:
            ax.plot([hub[0], p[0]], [hub[1], p[1]], color=colour, lw=lw, alpha=0.35 + 0.6 * frac, zorder=1)
        ax.add_patch(Circle(hub, 0.02 + 0.02 * frac, facecolor=colour, edgecolor="white", zorder=2))

    for i in range(n):
        frac = single.get(i, 0.0) / smax
        ax.add_patch(Circle(xy[i], node_r, facecolor="white", edgecolor="#444444",
                            lw=1.0 + 6.0 * frac, zorder=3))
        x, y = xy[i] * (1 + node_r + 0.06)
        ax.text(x, y, f"{names[i]}\n({ks[i]})", ha="left" if x > 0.3 else "right" if x < -0.3 else "center",
                va="bottom" if y > 0.3 else "top" if y < -0.3 else "center",
                fontsize="small" if n <= 20 else "x-small", zorder=4)

    legend = [Line2D([], [], color=_ORDER_COLOURS[min(o - 2, len(_ORDER_COLOURS) - 1)], lw=3,
                     label="pair terms" if o == 2 else f"order-{o} terms (hub)") for o in orders]
    legend.append(Line2D([], [], marker="o", ls="none", markerfacecolor="white", markeredgecolor="#444444",
                         markeredgewidth=3, markersize=10, label="single-variable terms (ring)"))
    ax.legend(handles=legend, loc="lower center", bbox_to_anchor=(0.5, -0.02), ncol=2, fontsize="small",
              frameon=False)
    what = "share of cost reduction" if weight == "share" else "|theta|"
    more = "" if top is None or len(strengths) - len(single) <= top else f" (strongest {top})"
    ax.set_title(f"interactions of {n} variables: width = {what}{more}")
    lim = 1.0 + node_r + 0.45
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim - 0.25, lim)
    ax.set_aspect("equal")
    ax.axis("off")
    return ax


def save_plots(model, out_dir=".", prefix: str = "model", dpi: int = 120, **graph_options) -> list[str]:
    """Save ``<prefix>-cost.png`` (if the model has a history) and ``<prefix>-interactions.png``.

    Creates ``out_dir`` if needed; returns the paths written.  ``graph_options`` go to
    :func:`plot_interactions`.
    """
    _check_mpl()
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    if any(h.get("cost") is not None for h in (getattr(model, "history_", None) or [])):
        ax = plot_cost(model)
        path = os.path.join(out_dir, f"{prefix}-cost.png")
        ax.figure.savefig(path, dpi=dpi)
        paths.append(path)
    ax = plot_interactions(model, **graph_options)
    path = os.path.join(out_dir, f"{prefix}-interactions.png")
    ax.figure.savefig(path, dpi=dpi)
    paths.append(path)
    return paths

