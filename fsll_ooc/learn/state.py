"""The state of a fit: the sparse model and its bookkeeping, enough to continue it."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

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

    def digits(self, flat: int) -> tuple[int, ...]:
        """The multi-index (C order) of flat index ``flat``."""
        flat = int(flat)
        if not 0 <= flat < math.prod(self.cards):
            raise ValueError(f"flat index {flat} out of range for cardinalities {self.cards}")
        out = []
        for k in reversed(self.cards):
            flat, x = divmod(flat, k)
            out.append(x)
        return tuple(reversed(out))

    def penalty(self, flat: int) -> float:
        """``r_y`` of flat index ``y`` (memoised: the learner asks for the support every iteration)."""
        cache = self.__dict__.setdefault("_r_cache", {})
        r = cache.get(flat)
        if r is None:
            weights = self.__dict__.get("_r_weights")
            if weights is None:
                weights = self.__dict__["_r_weights"] = C.penalty_weights(self.cards, self.n_samples)
            r = cache[flat] = C.penalty(self.digits(flat), *weights)
        return r

    def penalties(self, flats) -> list[float]:
        """``r_y`` of several flat indices (Python ints), memoised like :meth:`penalty`."""
        cache = self.__dict__.setdefault("_r_cache", {})
        try:
            return list(map(cache.__getitem__, flats))
        except KeyError:  # new terms (usually the one appended last): fill them in
            for y in flats:
                if y not in cache:
                    self.penalty(y)
            return list(map(cache.__getitem__, flats))

    def cost(self) -> float:
        """``KL(q || p_theta) + sum_y r_y`` from the sparse state (exact; ``O(#terms)``)."""
        kl = -self.entropy_q + self.log_z - sum(map(operator.mul, self.theta.values(),
                                                    map(self.dbar.__getitem__, self.theta)))
        return kl + sum(self.penalties(self.theta))

    def to_json(self) -> dict:
        """A JSON-ready dict of the whole state (what a store's state file keeps)."""
        return {
            "cards": list(self.cards), "n_samples": self.n_samples, "entropy_q": self.entropy_q,
            "theta": [[int(y), float(v)] for y, v in self.theta.items()],
            "dbar": [[int(y), float(v)] for y, v in self.dbar.items()],
            "log_z": self.log_z, "n_iter": self.n_iter, "converged": self.converged, "history": self.history,
        }

    @classmethod
    def from_json(cls, obj: dict) -> "FitState":
        """The state saved by :meth:`to_json`."""
        return cls(tuple(obj["cards"]), int(obj["n_samples"]), float(obj["entropy_q"]),
                   {int(y): float(v) for y, v in obj["theta"]}, {int(y): float(v) for y, v in obj["dbar"]},
                   float(obj["log_z"]), int(obj["n_iter"]), bool(obj["converged"]), list(obj["history"]))
