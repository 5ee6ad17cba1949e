"""Choosing the penalty scale from the training data alone (``penalty_scale="auto"``).

The MDL cost's code length is an asymptotic price: ``ln N / 2`` per parameter plus the
index of each term.  On data from a Bayesian network over many-valued variables, or
binary data at a thousand rows, the model closest to the truth is found under half that
price; on Ising and Potts data under the full price (``docs/benchmarks_quality.md``).  No
single scale is best, so the fit asks the data: it holds out one fifth of the rows (a
seeded shuffle, so a fit is repeatable), fits the same learner on the rest under the
first scale of :data:`fsll_ooc.cost.PENALTY_SCALES` and continues that search under each
further one (a lighter penalty mostly adds terms, so the search goes on from the model
it has), and keeps the scale whose model gives the held-out rows the higher
log-likelihood (ties to the full code).  The final fit on every row under that scale
starts from that scale's model (its terms and parameters) and continues the same search
to convergence on all rows (``docs/design.md``, "Choosing the penalty scale").

With ``further_price="auto"`` the same held-out rows also choose the price of a family's
further terms (:class:`fsll_ooc.cost.TermCode`): after the scales under the full price,
the fit under the first scale is continued under the cheaper price, at each scale in
turn, and the best of every (scale, price) pair is kept (ties to the earlier one: the
full code at scale 1 first).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from .. import cost as C

__all__ = ["HOLDOUT", "MIN_ROWS", "SEED", "ScaleChoice", "holdout_split", "choose_scale"]

#: One row in this many is held out to score the scales.
HOLDOUT = 5
#: Below this many rows the held-out part is too small to choose by: the full code is kept.
MIN_ROWS = 100
#: Seed of the shuffle that picks the held-out rows (a fit is repeatable).
SEED = 0
#: With fewer rows than this, every one of the :data:`HOLDOUT` folds is held out in turn
#: (cross-validation: each row scored once, the scores summed; the models of the first fold
#: are the starts); 0: one fold at any size.  An experiment's setting (not an option).
FOLDS_BELOW = 0


@dataclass
class ScaleChoice:
    """The chosen scale and what chose it."""

    scale: float
    #: mean held-out log-likelihood per row (nats) of each scale tried; empty if none was
    scores: dict = field(default_factory=dict)
    #: why no choice was made (``""`` when the scales were compared)
    reason: str = ""
    #: the chosen scale's model on the training rows, where the final fit starts
    #: (``{"theta": [[flat, value], ...], "log_z": float}``; None if no choice was made)
    start: dict | None = None
    #: the chosen price of a family's further terms (:data:`fsll_ooc.cost.FURTHER_PRICES`)
    price: str = "full"
    #: the chosen setting's model on each split's training rows (``start`` first); empty if
    #: no choice was made
    fold_models: list = field(default_factory=list)


def holdout_split(n_rows: int, fold: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(train, held_out)`` row indices: a seeded shuffle, every :data:`HOLDOUT`-th row held out
    (from position ``fold`` of the shuffle)."""
    order = np.random.default_rng(SEED).permutation(n_rows)
    held = np.sort(order[fold::HOLDOUT])
    train = np.sort(np.setdiff1d(order, held, assume_unique=True))
    return train, held


def choose_scale(fit_path, codes: np.ndarray, scales=C.PENALTY_SCALES, prices=None) -> ScaleChoice:
    """The scale of ``scales`` whose fit on the training part scores the held-out rows best.

    ``fit_path(train_codes, scales)`` fits the learner on those rows under each penalty
    scale in turn and yields, per scale, ``(log_prob, model)``: a function giving the
    log-likelihood of each row of a code array, and the model (kept as
    :attr:`ScaleChoice.start` of the chosen scale).  The first scale wins ties (the full
    MDL code comes first).  With fewer than :data:`MIN_ROWS` rows the first scale is
    returned unscored.

    ``prices`` (several of :data:`fsll_ooc.cost.FURTHER_PRICES`, ``further_price="auto"``):
    ``fit_path`` gets ``(scale, price)`` pairs instead, every scale of the first price, then
    of the next; the best pair wins (ties to the earlier), :attr:`ScaleChoice.scores` is
    keyed by the pairs and :attr:`ScaleChoice.price` is the chosen price.
    """
    scales = tuple(float(s) for s in scales)
    settings = scales if prices is None else tuple((s, p) for p in prices for s in scales)
    price = "full" if prices is None else prices[0]
    n = int(codes.shape[0])
    if n < MIN_ROWS:
        return ScaleChoice(scales[0], reason=f"only {n} rows (fewer than {MIN_ROWS})", price=price)
    scores, models = {}, {}
    folds = HOLDOUT if n < FOLDS_BELOW else 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the sub-fits' small-sample warnings
        for fold in range(folds):
            train, held = holdout_split(n, fold)
            for key, (log_prob, model) in zip(settings, fit_path(codes[train], settings)):
                if folds == 1:
                    scores[key] = float(np.mean(log_prob(codes[held])))
                else:
                    scores[key] = scores.get(key, 0.0) + float(np.sum(log_prob(codes[held]))) / n
                models.setdefault(key, []).append(model)
    best = settings[0]
    for key in settings[1:]:
        if scores[key] > scores[best]:
            best = key
    if prices is None:
        return ScaleChoice(best, scores, start=models[best][0], fold_models=models[best])
    return ScaleChoice(best[0], scores, start=models[best][0], price=best[1], fold_models=models[best])
