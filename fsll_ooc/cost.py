"""The MDL cost of the paper and the closed-form cost change of each candidate (pure math).

Cost (paper Eq. 9, natural logs)::

    cost(theta) = KL(q || p_theta) + sum_{y: theta_y != 0} r_y,
    r_y = (ln N / 2 + sum_{i: y_i != 0} ln(n (k_i - 1))) / N.

``r_y`` is separable: ``r_y = r0 + sum_i w_i [y_i != 0]`` with ``r0 = ln N / (2N)`` and
``w_i = ln(n (k_i - 1)) / N``, so it is generated per block by broadcasting and never
stored as a table.

**The family code** (:class:`TermCode`, ``penalty="family"``, the default with
``epsilon="auto"``) replaces ``sum_y r_y`` by a code that names each variable set once and
sends its terms as one subset; a family's first term costs exactly ``r_y`` (so the scan's
price is exact for new families), further terms less (``docs/design.md``, "The family code").

**The positivity rule.** The target ``q`` is the empirical distribution with one
pseudo-sample spread uniformly over all ``|X|`` cells::

    q = (N p_d + u) / (N + 1),   i.e.   dbar_y = (N <Phi_y>_{p_d} + <Phi_y>_u) / (N + 1).

(``<Phi_y>_u = 0`` for ``y != 0`` when every variable uses the Walsh-Hadamard basis; the
+-1 basis is not orthogonal, so there the uniform term is not zero.)

``q`` is a strictly positive distribution, so every target ``dbar_y`` lies strictly
inside ``(-1, 1)`` and every coordinate optimum ``theta_y`` is finite, even for a
category never seen in the data or a constant column (where the raw ``p_d`` would ask
for ``theta_y = +-inf``).  For a binary variable never seen at 1 the rule gives that
value about half a pseudo-count (Jeffreys-like), and it moves every other target by a
relative ``O(1/N)``.  ``kl_data_`` reported by the estimator is the KL divergence from
the raw ``p_d``; the optimised and reported ``cost_`` uses ``q``.

Candidate changes (paper Eq. 14-16), with ``t = thetabar_y`` and ``d = dbar_y``::

    kl_step(d, t, s) = (1+d)/2 ln((1+t)/(1+s)) + (1-d)/2 ln((1-t)/(1-s))
    append: kl_step(d, t, d) + r_y      adjust: kl_step(d, t, d)
    remove: kl_step(d, t, tanh(atanh(t) - theta_y)) - r_y
    lower bound of append: r_y - (t - d)^2 / (1 - t^2)

>>> round(delta_append(0.5, 0.0, 0.01), 6)
-0.120812
>>> delta_append(0.5, 0.0, 0.01) >= lower_bound(0.5, 0.0, 0.01)
True
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from . import kernels as _kernels

__all__ = [
    "PENALTIES",
    "TermCode",
    "resolve_penalty",
    "resolve_penalty_scale",
    "checked_penalty_scale",
    "PENALTY_SCALES",
    "resolve_smoothing",
    "checked_smoothing",
    "FURTHER_PRICES",
    "resolve_further_price",
    "checked_further_price",
    "penalty_weights",
    "penalty",
    "kl_step",
    "delta_append",
    "delta_adjust",
    "delta_remove",
    "kl_shift",
    "optimum_theta",
    "best_support_move",
    "lower_bound",
    "target_entropy",
    "empirical_entropy",
]


def penalty_weights(cards: Sequence[int], n_samples: int, scale: float = 1.0) -> tuple[float, np.ndarray]:
    """``(r0, w)`` with ``r_y = r0 + sum_i w[i] * (y_i != 0)``, times ``scale`` (the penalty
    scale; ``1.0`` is the paper's code, computed without a multiplication)."""
    n = len(cards)
    N = float(n_samples)
    r0 = math.log(N) / (2.0 * N)
    w = np.array([math.log(n * (k - 1)) / N if k > 1 else 0.0 for k in cards])
    if scale != 1.0:
        r0, w = scale * r0, scale * w
    return r0, w


def penalty(y: Sequence[int], r0: float, w: np.ndarray) -> float:
    """``r_y`` of one index ``y``."""
    return r0 + float(sum(w[i] for i, v in enumerate(y) if v != 0))


def kl_step(d: float, t: float, s: float) -> float:
    """``KL(q||p')-KL(q||p)`` when ``thetabar_y`` moves from ``t`` to ``s`` along coordinate ``y``.

    A half whose weight ``1 +- d`` is zero is zero (``0 ln 0 = 0``): a target of exactly
    ``+-1``, reachable only by rounding, gives the limit rather than NaN.  The compiled
    copies (:mod:`fsll_ooc.kernels.search`) are tested against this one."""
    a = 0.0 if d == -1.0 else (1.0 + d) * (math.log1p(t) - math.log1p(s))
    b = 0.0 if d == 1.0 else (1.0 - d) * (math.log1p(-t) - math.log1p(-s))
    return 0.5 * (a + b)


def delta_append(d: float, t: float, r: float) -> float:
    """Cost change of appending ``theta_y`` at its 1-D optimum (``thetabar_y -> d``)."""
    return kl_step(d, t, d) + r


def delta_adjust(d: float, t: float) -> float:
    """Cost change of moving a present ``theta_y`` to its 1-D optimum."""
    return kl_step(d, t, d)


def optimum_theta(theta: float, d: float, t: float) -> float:
    """``theta_y`` at its 1-D optimum: the value that moves ``thetabar_y`` from ``t`` to ``d``.

    ``theta + atanh(d) - atanh(t)`` (paper Eq. 11 solved for ``theta_y``), the duals
    clipped to ``+-(1 - 2^-52)`` so that the result is finite.
    """
    return theta + _atanh(d) - _atanh(t)


def best_support_move(ys: np.ndarray, t: np.ndarray, d: np.ndarray, theta: np.ndarray,
                      r: np.ndarray) -> tuple[float, int, int]:
    """The best *adjust* or *remove* move over the support: ``(delta, i, move)``.

    ``ys``: the support's flat indices (int64); ``t``, ``d``: ``thetabar`` and ``dbar``
    there; ``theta``, ``r``: its parameters and penalties (float64).  ``delta`` is the
    lowest of :func:`delta_adjust` and :func:`delta_remove` over the support, ``i`` its
    position (``-1`` when the support is empty) and ``move`` 0 (adjust) or 1 (remove);
    ties go to the lowest change, then the lowest ``y``, then adjust before remove.
    Evaluated by one compiled call (:func:`fsll_ooc.kernels.support_moves`, the same
    formulas in the same order of operations): the learner calls it right after a
    pass, when the caches are cold and numpy calls are slow (``docs/design.md``).
    """
    return _kernels.support_moves(ys, t, d, theta, r)


def _atanh(t: float) -> float:
    lim = 1.0 - 2.0**-52
    return math.atanh(min(max(t, -lim), lim))


def _lncosh(x: float) -> float:
    x = abs(x)
    return x + math.log1p(math.exp(-2.0 * x)) - math.log(2.0)


def kl_shift(d: float, t: float, step: float) -> float:
    """``KL`` change when ``theta_y`` moves by ``step`` from a point where ``thetabar_y = t``.

    ``= ln cosh(a + step) - ln cosh(a) - d step`` with ``a = atanh t``: the integral of
    paper Eq. 13 written in ``theta``, stable even when the new dual saturates at +-1.
    """
    a = _atanh(t)
    return _lncosh(a + step) - _lncosh(a) - d * step


def delta_remove(d: float, t: float, theta: float, r: float) -> float:
    """Cost change of removing a present ``theta_y``."""
    return kl_shift(d, t, -theta) - r


def lower_bound(d: float, t: float, r: float) -> float:
    """Cheap lower bound of :func:`delta_append` (paper Eq. 17); at a dual of exactly ``+-1``
    (reachable only by rounding) its limit: ``r`` at the target, ``-inf`` elsewhere."""
    den = 1.0 - t * t
    if den == 0.0:
        return r if t == d else -math.inf
    return r - (t - d) ** 2 / den


def _xlogx(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def empirical_entropy(counts: np.ndarray, n_samples: int) -> float:
    """Entropy (nats) of ``p_d`` from the counts of its occupied cells (``0 ln 0 = 0``)."""
    p = np.asarray(counts, dtype=np.float64) / n_samples
    return float(-_xlogx(p).sum())


def target_entropy(counts: np.ndarray, n_samples: int, size: int) -> float:
    """Entropy of the smoothed target ``q = (N p_d + u)/(N+1)`` from occupied-cell counts.

    ``size`` is ``|X|``; cost ``O(#occupied cells)``, no table.
    """
    counts = np.asarray(counts, dtype=np.float64)
    q0 = 1.0 / (size * (n_samples + 1.0))
    q = (counts + 1.0 / size) / (n_samples + 1.0)
    empty = size - counts.size
    return float(-_xlogx(q).sum() - empty * q0 * math.log(q0))


# --------------------------------------------------------------------------- the family code
#: Codes for the term indices: the paper's (every term sends its variables and values) and
#: the family code (a variable set is named once; its terms are sent as one subset).
PENALTIES = ("paper", "family")


def resolve_penalty(penalty, epsilon) -> str:
    """``"paper"`` or ``"family"`` from ``penalty`` (``None``: ``"family"`` with
    ``epsilon="auto"``, ``"paper"`` with a numeric epsilon, so ``epsilon=1e-4`` alone is the
    paper's algorithm and cost)."""
    if penalty is None:
        return "family" if isinstance(epsilon, str) and epsilon == "auto" else "paper"
    if isinstance(penalty, str) and penalty in PENALTIES:
        return penalty
    raise ValueError(f"penalty must be None or one of {PENALTIES}, got {penalty!r}")


#: The penalty scales ``penalty_scale="auto"`` chooses between (the first is the MDL code).
PENALTY_SCALES = (1.0, 0.5)


def resolve_penalty_scale(scale, epsilon):
    """``"auto"`` or a positive float from ``penalty_scale`` (``None``: ``"auto"`` with
    ``epsilon="auto"``, ``1.0`` with a numeric epsilon, so ``epsilon=1e-4`` alone is the
    paper's algorithm and cost)."""
    if scale is None:
        return "auto" if isinstance(epsilon, str) and epsilon == "auto" else 1.0
    if isinstance(scale, str):
        if scale == "auto":
            return "auto"
    elif not isinstance(scale, bool) and isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0:
        return float(scale)
    raise ValueError(f"penalty_scale must be None, 'auto' or a positive number, got {scale!r}")


def checked_penalty_scale(v) -> float:
    """A penalty scale read from a file: a positive finite number (a file is not trusted)."""
    return _number_from_file(resolve_penalty_scale, "penalty_scale", v)


def _number_from_file(resolve, name: str, v) -> float:
    """``resolve(v, None)`` where it is a number (a file holds the number a fit used, never
    ``"auto"``), else ``ValueError`` naming ``name``."""
    s = resolve(v, None)
    if not isinstance(s, float):
        raise ValueError(f"{name} must be a positive number, got {v!r}")
    return s


def resolve_smoothing(smoothing, epsilon, start=None):
    """``"auto"`` or a positive float from ``smoothing``, the pseudo-rows of the target the
    final parameters fit (``q = (counts + a / |X|) / (N + a)``; the search always runs on the
    paper's ``a = 1``).  ``None``: ``"auto"`` with ``start="network"`` and ``epsilon="auto"``
    (a network's learner smooths its tables too), else ``1.0``, the paper's target."""
    if smoothing is None:
        return "auto" if start == "network" and isinstance(epsilon, str) and epsilon == "auto" else 1.0
    if isinstance(smoothing, str):
        if smoothing == "auto":
            return "auto"
    elif (not isinstance(smoothing, bool) and isinstance(smoothing, (int, float, np.integer, np.floating))
          and math.isfinite(smoothing) and smoothing > 0):
        return float(smoothing)
    raise ValueError(f"smoothing must be None, 'auto' or a positive number of pseudo-rows, got {smoothing!r}")


def checked_smoothing(v) -> float:
    """Pseudo-rows read from a file: a positive finite number (a file is not trusted)."""
    return _number_from_file(resolve_smoothing, "smoothing", v)


#: Prices of a family's further terms under the family code: ``"full"`` (``ln N / 2`` per
#: parameter, as its first term) and ``"aic"`` (one nat per parameter, AIC's price).
FURTHER_PRICES = ("full", "aic")


def resolve_further_price(price, penalty=None, start=None):
    """``"full"``, ``"aic"`` or ``"auto"`` from ``further_price`` (``None``: ``"auto"`` with
    ``start="network"`` under the family code, else ``"full"``, the family code as it is).
    ``penalty``: the resolved code of the terms; a price other than ``"full"`` needs the
    family code (the paper's code has no families to price)."""
    if price is None:
        return "auto" if start == "network" and penalty == "family" else "full"
    if not isinstance(price, str) or price not in FURTHER_PRICES + ("auto",):
        raise ValueError(f"further_price must be None, 'auto' or one of {FURTHER_PRICES}, got {price!r}")
    if price != "full" and penalty == "paper":
        raise ValueError(f"further_price={price!r} prices the further terms of the family code; "
                         "penalty='paper' has no families (use penalty='family' or further_price='full')")
    return price


def checked_further_price(v) -> str:
    """A further-terms price read from a file: one of :data:`FURTHER_PRICES` (not ``"auto"``)."""
    price = resolve_further_price(v)
    if price == "auto":
        raise ValueError("further_price must be 'full' or 'aic' in a fitted state, got 'auto'")
    return price


class TermCode:
    """Description length (nats per sample) of a support, family by family.

    A *family* is the set ``A`` of variables on which a term's digits are non-zero; it has
    ``M_A = prod_{i in A} (k_i - 1)`` possible members.  A family with ``m`` members costs

    * ``paper``:  ``m (ln N / 2 + sum_{i in A} ln(n (k_i - 1))) / N`` (every member names the
      variables and sends its digits: paper Eq. 9);
    * ``family``: ``(m ln N / 2 + sum_{i in A} ln n + ln C(M_A, m)) / N`` (the variables are
      named once; the members are sent as one of the ``C(M_A, m)`` subsets of the family).

    The family code equals the paper's when every variable is binary (``M_A = 1``) and for
    a family's first member (``ln C(M_A, 1) = ln M_A``); each further member costs
    ``(ln N / 2 + ln((M_A - m) / (m + 1))) / N`` instead of the full price (``docs/design.md``,
    "The family code").

    ``further`` (family code only) is the price of a family's further members:
    ``"full"`` as above; ``"aic"``: each further member costs one nat instead of ``ln N / 2``
    (AIC's price of a parameter), ``(1 + ln((M_A - m) / (m + 1))) / N``, so a family with
    ``m`` members costs ``(ln N / 2 + (m - 1) + sum_{i in A} ln n + ln C(M_A, m)) / N``; its
    first member keeps the full price (the scan's), so a new interaction still pays
    ``ln N / 2`` and its naming (``docs/design.md``, "A family's further terms").

    ``scale`` multiplies every code length (the penalty scale, ``docs/design.md``, "Choosing
    the penalty scale"); ``1.0`` leaves them as above, bit for bit.
    """

    def __init__(self, cards: Sequence[int], n_samples: int, kind: str = "paper", scale: float = 1.0,
                 further: str = "full"):
        if kind not in PENALTIES:
            raise ValueError(f"penalty must be one of {PENALTIES}, got {kind!r}")
        if further not in FURTHER_PRICES:
            raise ValueError(f"further_price must be one of {FURTHER_PRICES}, got {further!r}")
        self.kind = kind
        self.further = further
        self.scale = float(scale)
        self.cards = tuple(int(k) for k in cards)
        self.N = float(n_samples)
        self.r0, self.w = penalty_weights(self.cards, n_samples)
        n = len(self.cards)
        self.name_w = [math.log(n) / self.N if k > 1 else 0.0 for k in self.cards]
        #: the price per parameter of a family's further member (its first one pays ``r0``)
        self.r1 = self.r0 if further == "full" or kind == "paper" else 1.0 / self.N

    def _scaled(self, x: float) -> float:
        return x if self.scale == 1.0 else self.scale * x

    def family(self, digits: Sequence[int]) -> tuple[int, ...]:
        """The variables of a term (its non-zero digits)."""
        return tuple(i for i, v in enumerate(digits) if v)

    def members(self, axes: Sequence[int]) -> int:
        """``M_A``: how many terms have exactly these non-zero variables."""
        return math.prod(self.cards[i] - 1 for i in axes)

    def add(self, axes: Sequence[int], m: int) -> float:
        """Code length of one more member of family ``axes``, which has ``m`` now (``inf`` if
        the family is full).  Memoised (the learner prices the same families over and over)."""
        key = (tuple(axes), int(m))
        memo = self.__dict__.setdefault("_add_memo", {})
        v = memo.get(key)
        if v is None:
            v = memo[key] = self._add(*key)
        return v

    def add_memo(self) -> dict:
        """The memo of :meth:`add`: ``{(family, members): price}`` (a family a tuple of variables,
        ``members`` an int).  A caller may look prices up in it, and calls :meth:`add` (which
        fills it) or :meth:`add_many` for those it lacks; it is not to be written otherwise."""
        return self.__dict__.setdefault("_add_memo", {})

    def add_many(self, keys) -> list[float]:
        """:meth:`add` of each ``(axes, m)`` of ``keys``, memoised the same way; those not priced
        yet (under the family code) all at once, by the same operations in the same order."""
        memo = self.__dict__.setdefault("_add_memo", {})
        keys = [(tuple(a), int(m)) for a, m in keys]
        todo = [k for k in dict.fromkeys(keys) if k not in memo]
        if len(todo) >= 16 and self.kind != "paper":
            values = self._add_many(todo)
            if values is not None:
                memo.update(zip(todo, values))
        return [memo[k] if k in memo else self.add(*k) for k in keys]

    def _add_many(self, keys: list) -> list[float] | None:
        """:meth:`_add` of many ``(axes, m)`` (family code), or None where a family's number of
        members might not be exact as a float (more than ``2^52``)."""
        n = len(keys)
        less = [k - 1 for k in self.cards]
        bits = [math.log2(v) if v > 1 else 0.0 for v in less]
        axes = [k[0] for k in keys]
        if max(sum(bits[i] for i in a) for a in axes) > 52:
            return None
        ms = np.fromiter((k[1] for k in keys), np.int64, n)
        lens = np.fromiter(map(len, axes), np.int64, n)
        idx = np.fromiter(itertools.chain.from_iterable(axes), np.int64, int(lens.sum()))
        starts = np.cumsum(lens) - lens
        name_w = np.asarray(self.name_w, np.float64)
        less = np.asarray(less, np.int64)
        name = np.zeros(n)  # sum(name_w[i] for i in axes), term by term in axis order
        M = np.ones(n, np.int64)  # members(axes)
        for p in range(int(lens.max()) if n else 0):
            has = np.nonzero(lens > p)[0]
            j = idx[starts[has] + p]
            name[has] = name[has] + name_w[j]
            M[has] = M[has] * less[j]
        name = np.where(ms == 0, name, 0.0)
        full = ms >= M
        free = (M - ms).tolist()
        logs = {}
        lg = np.array([0.0 if f else (logs[a] if a in logs else logs.setdefault(a, math.log(a)))
                       - (logs[b] if b in logs else logs.setdefault(b, math.log(b)))
                       for f, a, b in zip(full.tolist(), free, (ms + 1).tolist())])
        x = (np.where(ms == 0, self.r0, self.r1) + lg / self.N) + name
        if self.scale != 1.0:
            x = self.scale * x
        x[full] = math.inf
        return x.tolist()

    def _add(self, axes: tuple, m: int) -> float:
        if self.kind == "paper":
            return self._scaled(self.r0 + float(sum(self.w[i] for i in axes)))
        name = float(sum(self.name_w[i] for i in axes)) if m == 0 else 0.0
        M = self.members(axes)
        if m >= M:
            return math.inf
        return self._scaled((self.r0 if m == 0 else self.r1) + (math.log(M - m) - math.log(m + 1)) / self.N + name)

    def total(self, axes: Sequence[int], m: int) -> float:
        """Code length of family ``axes`` with ``m`` members."""
        if m == 0:
            return 0.0
        if self.kind == "paper":
            return self._scaled(m * (self.r0 + float(sum(self.w[i] for i in axes))))
        M = self.members(axes)
        log_comb = math.lgamma(M + 1.0) - math.lgamma(m + 1.0) - math.lgamma(M - m + 1.0)
        per = m * self.r0 if self.further == "full" else self.r0 + (m - 1) * self.r1
        return self._scaled(per + log_comb / self.N + float(sum(self.name_w[i] for i in axes)))
