"""The state of a fit: the sparse model and its bookkeeping, enough to continue it."""
from __future__ import annotations

import collections
import math
import operator
from dataclasses import dataclass, field

import numpy as np

from .. import cost as C

__all__ = ["FitState"]


@dataclass
class FitState:
    """Everything needed to continue a fit: the sparse model and its bookkeeping."""

    cards: tuple[int, ...]
    n_samples: int
    entropy_q: float  # H(q) of the smoothed target
    theta: dict[int, float] = field(default_factory=dict)  # flat index -> theta_y
    dbar: dict[int, float] = field(default_factory=dict)  # flat index -> dbar_y on the support
    log_z: float = 0.0
    n_iter: int = 0
    converged: bool = False
    history: list[dict] = field(default_factory=list)
    penalty_code: str = "paper"  # the code of the support: "paper" (Eq. 9) or "family" (cost.TermCode)
    penalty_scale: float = 1.0  # multiplies the code length (1.0: the code as it is)
    further_price: str = "full"  # the family code's price of a family's further terms (cost.TermCode)
    smoothing: float = 1.0  # pseudo-rows of the final parameters' target (1.0: the paper's q, the search's)

    def digits(self, flat: int) -> tuple[int, ...]:
        """The multi-index (C order) of flat index ``flat`` (memoised: the learner asks for the
        same terms' digits at every step and record)."""
        cache = self.__dict__.setdefault("_digits_cache", {})
        out = cache.get(flat)
        if out is not None:
            return out
        flat = key = int(flat)
        if not 0 <= flat < math.prod(self.cards):
            raise ValueError(f"flat index {flat} out of range for cardinalities {self.cards}")
        digits = []
        for k in reversed(self.cards):
            flat, x = divmod(flat, k)
            digits.append(x)
        out = cache[key] = tuple(reversed(digits))
        return out

    def penalty(self, flat: int) -> float:
        """The paper's ``r_y`` of flat index ``y`` (memoised: the learner asks for the support every
        iteration); under the family code it is the price of a family's first member, the
        price the engine's scan uses; times :attr:`penalty_scale`."""
        cache = self.__dict__.setdefault("_r_cache", {})
        r = cache.get(flat)
        if r is None:
            weights = self.__dict__.get("_r_weights")
            if weights is None:
                weights = self.__dict__["_r_weights"] = C.penalty_weights(
                    self.cards, self.n_samples, self.penalty_scale)
            r = cache[flat] = C.penalty(self.digits(flat), *weights)
        return r

    def penalties(self, flats) -> list[float]:
        """``r_y`` of several flat indices (Python ints), memoised like :meth:`penalty`; under the
        family code, their marginal code lengths (:meth:`marginal_penalties`)."""
        if self.penalty_code != "paper":
            support = tuple(self.theta)
            if len(flats) != len(support) or tuple(flats) != support:
                return self.marginal_penalties(flats)
            # the support's own prices (the learner asks for them after every pass): memoised on it
            code = self.term_code()
            memo = self.__dict__.get("_support_penalties")
            if memo is None or memo[0] != support or memo[1] is not code:
                memo = self.__dict__["_support_penalties"] = (support, code, self._support_prices(support, code))
            return list(memo[2])
        cache = self.__dict__.setdefault("_r_cache", {})
        try:
            return list(map(cache.__getitem__, flats))
        except KeyError:  # new terms (usually the one appended last): fill them in
            for y in flats:
                if y not in cache:
                    self.penalty(y)
            return list(map(cache.__getitem__, flats))

    def set_penalty_scale(self, scale: float) -> None:
        """Price the support under another penalty scale from now on (the memoised prices go)."""
        self.penalty_scale = float(scale)
        for key in ("_r_cache", "_r_weights", "_term_code"):
            self.__dict__.pop(key, None)

    def set_further_price(self, price: str) -> None:
        """Price a family's further terms by ``price`` from now on (:class:`fsll_ooc.cost.TermCode`)."""
        self.further_price = C.resolve_further_price(price, self.penalty_code)
        self.__dict__.pop("_term_code", None)

    def targets_changed(self) -> None:
        """The target table was recomputed (EM's M-step): targets memoised from it go (the
        family candidates' ``dbar`` of :func:`fsll_ooc.learn.corrective.family_move`)."""
        self.__dict__.pop("_family_memo", None)

    def term_code(self) -> C.TermCode:
        """The support's code (:class:`fsll_ooc.cost.TermCode` of :attr:`penalty_code`)."""
        code = self.__dict__.get("_term_code")
        if (code is None or code.kind != self.penalty_code or code.scale != self.penalty_scale
                or code.further != self.further_price):
            code = self.__dict__["_term_code"] = C.TermCode(self.cards, self.n_samples, self.penalty_code,
                                                            self.penalty_scale, self.further_price)
        return code

    def family(self, flat: int) -> tuple[int, ...]:
        """The variables of term ``flat`` (its non-zero digits; memoised)."""
        cache = self.__dict__.setdefault("_family_cache", {})
        a = cache.get(flat)
        if a is None:
            a = cache[flat] = self.term_code().family(self.digits(flat))
        return a

    def family_counts(self) -> dict[tuple[int, ...], int]:
        """Members in the support of each family (variable set): a new dict, memoised on the
        support (its terms in order; the learner asks for it several times per iteration)."""
        return dict(self._support_counts(tuple(self.theta)))

    def _support_counts(self, support: tuple) -> dict[tuple[int, ...], int]:
        """:meth:`_count_families` of ``support`` (the support's terms in order), memoised on it
        (the dict is the memo's: not to be changed)."""
        memo = self.__dict__.get("_family_counts")
        if memo is None or memo[0] != support:
            memo = self.__dict__["_family_counts"] = (support, self._count_families(support))
        return memo[1]

    def _support_prices(self, support: tuple, code: C.TermCode) -> list[float]:
        """:meth:`marginal_penalties` of the support's own terms (each one's family has it among
        its members): one price per family, each member given its family's."""
        get, add = code.add_memo().get, code.add
        per = {}
        for a, c in self._support_counts(support).items():
            v = get((a, c - 1))
            per[a] = add(a, c - 1) if v is None else v
        return list(map(per.__getitem__, self._families(support)))

    def _families(self, ys) -> list[tuple[int, ...]]:
        """:meth:`family` of each of ``ys`` (one look-up each once memoised; those not seen yet
        found together, :meth:`_fill_families`)."""
        cache = self.__dict__.setdefault("_family_cache", {})
        try:
            return list(map(cache.__getitem__, ys))
        except KeyError:  # some not seen yet
            self._fill_families([y for y in ys if y not in cache])
            get = cache.get
            return [get(y) or self.family(y) for y in ys]

    def _fill_families(self, ys) -> None:
        """Memoise :meth:`family` of ``ys`` (flat indices) at once: their non-zero digits as a bit
        mask each, one tuple per distinct mask (the same tuples :meth:`family` makes)."""
        n = len(self.cards)
        size = math.prod(self.cards)
        if len(ys) < 8 or n > 62 or size > 2**62 or not all(0 <= y < size for y in ys):
            return  # (few, or out of range: :meth:`family` one by one, which raises)
        flat = np.fromiter(ys, np.int64, len(ys))
        nonzero = np.stack(np.unravel_index(flat, self.cards), axis=1) != 0
        masks = nonzero @ (np.int64(1) << np.arange(n, dtype=np.int64))
        distinct, first = np.unique(masks, return_index=True)
        # the non-zero axes of one row per distinct mask, row by row in axis order
        rows, axes = np.nonzero(nonzero[first])
        ends = np.searchsorted(rows, np.arange(1, len(first) + 1)).tolist()
        axes = axes.tolist()
        of_mask = dict(zip(distinct.tolist(), (tuple(axes[a:b]) for a, b in zip([0] + ends[:-1], ends))))
        cache = self.__dict__.setdefault("_family_cache", {})
        for y, mk in zip(ys, masks.tolist()):
            cache[y] = of_mask[mk]

    def _count_families(self, ys) -> dict[tuple[int, ...], int]:
        """Members of each family among ``ys``, the families in the order of their first member."""
        return dict(collections.Counter(self._families(ys)))

    def marginal_penalties(self, flats, counts=None) -> list[float]:
        """Code length a member gives back when removed, a non-member costs when added."""
        code = self.term_code()
        counts = self.family_counts() if counts is None else counts
        get, add = code.add_memo().get, code.add
        theta, out = self.theta, []
        for y, a in zip(flats, self._families(flats)):
            m = counts.get(a, 0) - (y in theta)
            v = get((a, m))
            out.append(add(a, m) if v is None else v)
        return out

    def add_prices(self, families, counts: dict) -> list[float]:
        """The code length of one more member of each of ``families`` (variable sets) that has
        ``counts.get(a, 0)`` members now: ``term_code().add``, memoised by (family, members)."""
        code = self.term_code()
        memo = code.add_memo()
        keys = [(a, counts.get(a, 0)) for a in families]
        if any(k not in memo for k in keys):  # (a joint selection's candidates: many new families at once)
            return code.add_many(keys)
        return list(map(memo.__getitem__, keys))

    def _code_memo(self, code: C.TermCode) -> dict:
        """A memo of ``code``'s :meth:`~fsll_ooc.cost.TermCode.total` by ``(family, members)``; it
        goes with the code (a new scale or code kind starts a new one).  (Its ``add`` has its own
        memo: :meth:`~fsll_ooc.cost.TermCode.add_memo`.)"""
        memo = self.__dict__.get("_code_memos")
        if memo is None or memo[0] is not code:
            memo = self.__dict__["_code_memos"] = (code, {})
        return memo[1]

    def total_penalty(self) -> float:
        """The support's code length (the cost's penalty part).  Memoised on the support (its
        terms in order), the code and the scale: the learner asks for it at every cost
        evaluation, mostly of the same support, and the same sum gives the same bits."""
        key = (tuple(self.theta), self.penalty_code, self.penalty_scale, self.further_price)
        memo = self.__dict__.get("_total_penalty")
        if memo is not None and memo[0] == key:
            return memo[1]
        total = self.total_penalty_of(key[0])
        self.__dict__["_total_penalty"] = (key, total)
        return total

    def total_penalty_of(self, ys) -> float:
        """:meth:`total_penalty` of the support ``ys`` (flat indices, Python ints, in the
        support's order) instead of this state's: the same sums in the same order."""
        if self.penalty_code == "paper":
            return sum(self.penalties(ys))
        ys = tuple(ys)
        counts = self._support_counts(ys) if ys == tuple(self.theta) else self._count_families(ys)
        return sum(self._family_lengths(counts).values())

    def _family_lengths(self, counts: dict) -> dict:
        """The code length of each family of ``counts`` (family -> members), in its order."""
        code = self.term_code()
        lengths = self._code_memo(code)
        out = {}
        for key in counts.items():
            v = lengths.get(key)
            if v is None:
                v = lengths[key] = code.total(*key)
            out[key[0]] = v
        return out

    def family_length(self, family: tuple, members: int) -> float:
        """The code length of ``family`` with ``members`` members (memoised as
        :meth:`total_penalty_of` sums it)."""
        code = self.term_code()
        lengths = self._code_memo(code)
        key = (family, members)
        v = lengths.get(key)
        if v is None:
            v = lengths[key] = code.total(*key)
        return v

    def cost(self) -> float:
        """``KL(q || p_theta)`` plus the support's code length (:meth:`total_penalty`; the paper's
        ``sum_y r_y``) from the sparse state (exact; ``O(#terms)``)."""
        kl = -self.entropy_q + self.log_z - sum(map(operator.mul, self.theta.values(),
                                                    map(self.dbar.__getitem__, self.theta)))
        return kl + self.total_penalty()

    def to_json(self) -> dict:
        """A JSON-ready dict of the whole state (what a store's state file keeps)."""
        return {
            "cards": list(self.cards), "n_samples": self.n_samples, "entropy_q": self.entropy_q,
            "theta": [[int(y), float(v)] for y, v in self.theta.items()],
            "dbar": [[int(y), float(v)] for y, v in self.dbar.items()],
            "log_z": self.log_z, "n_iter": self.n_iter, "converged": self.converged, "history": self.history,
            "penalty_code": self.penalty_code, "penalty_scale": self.penalty_scale,
            **({} if self.further_price == "full" else {"further_price": self.further_price}),
            **({} if self.smoothing == 1.0 else {"smoothing": self.smoothing}),
        }

    @classmethod
    def from_json(cls, obj: dict) -> "FitState":
        """The state saved by :meth:`to_json`."""
        return cls(tuple(obj["cards"]), int(obj["n_samples"]), float(obj["entropy_q"]),
                   {int(y): float(v) for y, v in obj["theta"]}, {int(y): float(v) for y, v in obj["dbar"]},
                   float(obj["log_z"]), int(obj["n_iter"]), bool(obj["converged"]), list(obj["history"]),
                   C.resolve_penalty(obj.get("penalty_code", "paper"), None),
                   C.checked_penalty_scale(obj.get("penalty_scale", 1.0)),
                   C.checked_further_price(obj.get("further_price", "full")),
                   C.checked_smoothing(obj.get("smoothing", 1.0)))


class PenaltyTally:
    """:meth:`FitState.total_penalty_of` of a support that changes one term at a time (a batch's
    steps, :func:`fsll_ooc.learn.batch.step_costs`), the same bits without counting the
    support again after each append: the parts the full sum adds keep their order (a new
    term's price joins the end; under the family code its family's count goes up where the
    family stands, or the family joins the end), and :attr:`total` is the same ``sum`` of them.
    A removal can move a family's first member, so :meth:`reset` counts the support afresh."""

    def __init__(self, state: FitState, ys):
        self.state = state
        self.paper = state.penalty_code == "paper"
        self.reset(ys)

    def reset(self, ys) -> None:
        """Start over from the support ``ys`` (flat indices in the support's order)."""
        st = self.state
        if self.paper:
            self.parts = st.penalties(list(ys))
            self.total = sum(self.parts)
        else:
            self.counts = st._count_families(ys)
            self.parts = st._family_lengths(self.counts)
            self.total = sum(self.parts.values())

    def append(self, y: int) -> None:
        """Term ``y`` (not in the support) joins its end."""
        st = self.state
        if self.paper:
            self.parts.append(st.penalty(y))
            self.total = sum(self.parts)
        else:
            a = st.family(y)
            m = self.counts[a] = self.counts.get(a, 0) + 1
            self.parts[a] = st.family_length(a, m)
            self.total = sum(self.parts.values())
