"""Fully corrective step: re-optimise every selected parameter jointly (damped Newton).

The greedy search of the paper moves one coordinate per iteration.  Coordinates
interact (the ``Phi_y`` are correlated under ``p_theta``, and the +-1 basis of a
variable whose cardinality is not a power of two is not even orthogonal under the
uniform distribution), so a support that the search has *selected* is usually far
from *converged*: the values keep creeping by many small ``adjust`` moves, each
below ``epsilon``, while the search spends its budget elsewhere.

On a fixed support ``S`` the MDL cost is ``KL(q || p_theta) + const``, a smooth convex
function of ``theta_S`` with (``docs/design.md``, "What one iteration costs", for the products)

* gradient  ``g_y = thetabar_y - dbar_y``,
* Hessian   ``H_yy' = Cov_p(Phi_y, Phi_y') = <Phi_y Phi_y'>_p - thetabar_y thetabar_y'``.

``<Phi_y Phi_y'>_p`` is a short signed sum of dual-table cells: per axis, a
Walsh-Hadamard pair gives the single index ``y_i XOR y'_i``; a +-1 pair gives ``y'_i``
(``y_i = 0``), ``y_i`` (``y'_i = 0``), ``0`` (``y_i = y'_i``) or
``-phi_0 - phi_{y_i} - phi_{y'_i}`` (three terms, both non-zero and different); see
:func:`fsll_ooc.basis.product_matrix`.  :func:`pair_products` expands all pairs of
the support at once; the engine *gathers* the ``thetabar`` cells they name
(:meth:`fsll_ooc.engine.Engine.gather`, reads only the chunks holding them, so the
Hessian costs ``O(|S|^2)`` numbers and never a dense ``|X| x |S|`` matrix).

One Newton round is: gather -> solve ``H s = -g`` (Cholesky, tiny ridge) -> try
``theta_S + alpha s`` by an exact re-derivation of the duals
(:meth:`~fsll_ooc.engine.Engine.resync`, which also returns the exact ``log Z``, so
the trial's cost ``-H(q) + log Z - sum theta_y dbar_y + sum r_y`` is exact) ->
accept only if the cost went down (backtracking ``alpha = 1, 1/2, 1/4, ...``).  The
cost is therefore monotone, the support and the penalty do not change, and at the
end the dual table is exact for the accepted parameters.  Rounds stop when the
Newton decrement ``g^T H^-1 g / 2`` (the predicted remaining gain) is below ``tol``, or
after a full Newton step whose next decrement is predicted below ``tol``
(:func:`next_decrement`) once the decrement it leaves is below ``leave`` (``10 tol``: at
the learner's default ``tol = epsilon / 10``, less than a greedy step must gain; later
phases take it up).

Work per round: one gather (``O(|S|^2)`` cells, touched chunks only) and one or more
resyncs (each about 2-3 table passes; timings in ``docs/benchmarks.md``).
"""
from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass

import numpy as np

from .. import basis
from ..engine import Table
from ..kernels import products as kernel_products
from .cells import unique_inverse

__all__ = ["Products", "CandidateOrder", "pair_products", "moment_matrix", "RefineResult", "next_decrement", "refine", "write_duals", "closure_candidates", "joint_append",
           "family_terms", "family_move"]


def _strides(cards) -> np.ndarray:
    s = np.ones(len(cards), dtype=np.int64)
    for i in range(len(cards) - 2, -1, -1):
        s[i] = s[i + 1] * cards[i + 1]
    return s


def _walsh_axes(cards) -> np.ndarray:
    """Per axis: does it use the Walsh-Hadamard basis (the product kernels' ``walsh``)."""
    return np.array([basis.is_walsh(int(k)) for k in cards], bool)


def pair_products(cards, dig_a: np.ndarray, dig_b: np.ndarray):
    """Expand ``Phi_a Phi_b = sum_k coef_k Phi_{flat_k}`` for many pairs at once.

    ``dig_a``, ``dig_b``: ``(P, n)`` integer digit arrays (pair ``j`` is
    ``(dig_a[j], dig_b[j])``).  Returns ``(pair, flat, coef)``: term ``k`` belongs to
    pair ``pair[k]``, is the basis function with flat (C-order) index ``flat[k]``
    and has coefficient ``coef[k]`` (``+-1``).  A pair has ``3^t`` terms where ``t``
    is the number of +-1 axes on which both digits are non-zero and different.

    >>> pair_products((3,), np.array([[1]]), np.array([[2]]))[1:]   # phi_1 phi_2 = -phi_0 - phi_1 - phi_2
    (array([0, 1, 2]), array([-1., -1., -1.]))
    """
    dig_a = np.asarray(dig_a, dtype=np.int64)
    dig_b = np.asarray(dig_b, dtype=np.int64)
    P = dig_a.shape[0]
    idx = np.arange(P, dtype=np.int64)
    return _expand(cards, dig_a, dig_b, idx, idx)


def _expand(cards, dig_a: np.ndarray, dig_b: np.ndarray, ia: np.ndarray, ib: np.ndarray):
    """:func:`pair_products` of the pairs ``(dig_a[ia[j]], dig_b[ib[j]])``, pair by pair in one
    compiled call (:func:`fsll_ooc.kernels.products.expand`; a pair's terms in the order of
    the axis-by-axis expansion).  When every axis is Walsh-Hadamard the flat index of a
    product is the XOR of the two flat indices (each digit owns its own bits).
    """
    cards = tuple(int(k) for k in cards)
    strides = _strides(cards)
    P = len(ia)
    walsh = _walsh_axes(cards)
    if walsh.all():
        fa = dig_a @ strides if len(dig_a) else np.zeros(0, np.int64)
        fb = dig_b @ strides if len(dig_b) else np.zeros(0, np.int64)
        return np.arange(P, dtype=np.int64), fa[ia] ^ fb[ib], np.ones(P)
    return kernel_products.expand(np.ascontiguousarray(dig_a, np.int64), np.ascontiguousarray(dig_b, np.int64),
                                  np.asarray(ia, np.int64), np.asarray(ib, np.int64), strides, walsh)


def _digits(cards, flat: np.ndarray) -> np.ndarray:
    return np.stack(np.unravel_index(np.asarray(flat, np.int64), tuple(cards)), axis=1).astype(np.int64)


def _fresh_pairs(old: np.ndarray, fresh: np.ndarray):
    """Pairs ``(i, j)`` for each ``j`` of ``fresh`` (ascending): every ``i`` of ``old``, then
    every ``i`` of ``fresh`` up to ``j``; as index arrays ``(I, J)`` in that order."""
    n_o, F = len(old), len(fresh)
    lengths = n_o + np.arange(1, F + 1, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    q = np.repeat(np.arange(F, dtype=np.int64), lengths)
    r = np.arange(int(lengths.sum()), dtype=np.int64) - starts[q]
    fresh = np.asarray(fresh, np.int64)
    I = np.where(r < n_o, old[np.minimum(r, max(n_o - 1, 0))] if n_o else 0, fresh[np.maximum(r - n_o, 0)])
    return I.astype(np.int64), fresh[q]


class Products:
    """Expansion of all pairs ``i <= j`` of a support, cached across corrective phases.

    When the support changes, pairs of surviving members are kept (re-indexed) and
    only pairs with a new member are expanded.
    """

    def __init__(self, cards):
        self.cards = tuple(cards)
        self.support = np.zeros(0, np.int64)
        self.pair = np.zeros(0, np.int64)  # term -> pair index (into I, J)
        self.flat = np.zeros(0, np.int64)
        self.coef = np.zeros(0)
        self.I = np.zeros(0, np.int64)
        self.J = np.zeros(0, np.int64)
        self.checked = None  # the last matrix (never written to) that passed :func:`_solve`'s check

    def update(self, support: np.ndarray) -> None:
        support = np.asarray(support, np.int64)
        if np.array_equal(support, self.support):
            return
        n_old = len(self.support)
        if len(support) > n_old and np.array_equal(support[:n_old], self.support) and \
                not np.isin(support[n_old:], self.support).any():
            # members appended at the end (the usual change): every cached pair stays where it is
            self._append(support, np.arange(n_old, len(support), dtype=np.int64))
        else:
            self._update(support)

    def _update(self, support: np.ndarray) -> None:
        """:meth:`update` to any support: the surviving pairs re-indexed, then the new members'."""
        # remap[k]: the new position of old member k, -1 if it left (members are distinct)
        remap = np.full(len(self.support), -1, dtype=np.int64)
        if len(support) and len(self.support):
            order = np.argsort(support, kind="stable")
            k = np.minimum(np.searchsorted(support[order], self.support), len(support) - 1)
            found = support[order][k] == self.support
            remap[found] = order[k[found]]
        if len(self.I):
            keep_pair = (remap[self.I] >= 0) & (remap[self.J] >= 0)
            new_index = np.cumsum(keep_pair) - 1
            keep_term = keep_pair[self.pair]
            self.pair = new_index[self.pair[keep_term]]
            self.flat = self.flat[keep_term]
            self.coef = self.coef[keep_term]
            self.I = remap[self.I[keep_pair]]
            self.J = remap[self.J[keep_pair]]
        self._append(support, np.nonzero(~np.isin(support, self.support))[0].astype(np.int64))

    def _append(self, support: np.ndarray, fresh: np.ndarray) -> None:
        """Expand the pairs of the new members (positions ``fresh`` of ``support``) after the
        cached ones (re-indexed to ``support`` already); ``support`` becomes the support."""
        if len(fresh):
            m = len(support)
            isnew = np.zeros(m, bool)
            isnew[fresh] = True
            # pairs (i, j) with j new and (i new and i <= j, or i old)
            I, J = _fresh_pairs(np.nonzero(~isnew)[0], fresh)
            digits = _digits(self.cards, support)
            pair, flat, coef = _expand(self.cards, digits, digits, I, J)
            self.pair = np.concatenate([self.pair, pair + len(self.I)])
            self.flat = np.concatenate([self.flat, flat])
            self.coef = np.concatenate([self.coef, coef])
            self.I = np.concatenate([self.I, I.astype(np.int64)])
            self.J = np.concatenate([self.J, J.astype(np.int64)])
        self.support = support.copy()


def _cells_to_read(engine, flat: np.ndarray, size: int):
    """``(cells, inv)``: the cells to read for the values at ``flat`` and where each of ``flat``
    is among them (``values = read(cells)[inv]``).  Out of core the duplicates go first (a read
    goes through the chunks); in core a read is an index and ``flat`` is read as it is
    (``inv`` None), which costs less than finding its distinct cells."""
    if engine.out_of_core:
        return unique_inverse(flat, size)
    return np.asarray(flat, np.int64), None


def _table_array(engine) -> np.ndarray | None:
    """The dual table ``thetabar`` as one flat C-order float64 array of this process (an in-core
    fit of one band, where a gather is an index into it), else None."""
    return engine.table_array(Table.THETABAR)


def _pair_sums_at(cards, table: np.ndarray, dig_a: np.ndarray, dig_b: np.ndarray, ia: np.ndarray, ib: np.ndarray):
    """``pair_sums`` of the pairs ``(dig_a[ia[j]], dig_b[ib[j]])`` read off ``table`` (:func:`_table_array`)
    without writing their expansion out: the sums of :func:`_expand` + a gather + ``pair_sums``, bit
    for bit."""
    cards = tuple(int(k) for k in cards)
    walsh = _walsh_axes(cards)
    return kernel_products.pair_sums_at(np.ascontiguousarray(dig_a, np.int64), np.ascontiguousarray(dig_b, np.int64),
                                        np.asarray(ia, np.int64), np.asarray(ib, np.int64), _strides(cards), walsh,
                                        table)


def _pair_sums_grid(cards, table: np.ndarray, dig_a: np.ndarray, dig_b: np.ndarray) -> np.ndarray:
    """:func:`_pair_sums_at` of every pair of a row of ``dig_a`` and a row of ``dig_b``, as a
    ``(len(dig_a), len(dig_b))`` matrix (the same sums, bit for bit)."""
    cards = tuple(int(k) for k in cards)
    walsh = _walsh_axes(cards)
    return kernel_products.pair_sums_grid(np.ascontiguousarray(dig_a, np.int64), np.ascontiguousarray(dig_b, np.int64),
                                          _strides(cards), walsh, table)


def moment_matrix(prod: Products, cells: np.ndarray) -> np.ndarray:
    """``M[i, j] = <Phi_i Phi_j>_p`` of the support from ``cells[k] = thetabar[prod.flat[k]]``."""
    return kernel_products.moment_matrix(prod.pair, prod.coef, np.asarray(cells, np.float64), prod.I, prod.J,
                                         len(prod.support))


def _cross_moments(cards, rows: np.ndarray, cols: np.ndarray):
    """Expansion of all pairs ``(rows[i], cols[j])``: (pair -> (i, j) as i * len(cols) + j, flat, coef)."""
    a = _digits(cards, rows)
    b = _digits(cards, cols)
    ia = np.repeat(np.arange(len(rows)), len(cols))
    ib = np.tile(np.arange(len(cols)), len(rows))
    return _expand(cards, a, b, ia, ib)


@dataclass
class RefineResult:
    """What one corrective phase did."""

    rounds: int = 0          # Newton rounds that moved theta
    trials: int = 0          # exact cost evaluations (resyncs)
    gathers: int = 0
    delta: float = 0.0       # cost change (<= 0)
    decrement: float = math.inf  # last Newton decrement g^T H^-1 g / 2 (predicted remaining gain)
    scan: object = None      # with ``top``: the scan of the final dual table, run in its re-derivation
    pending: bool = False    # ``write=False``: the dual table still describes the parameters before
    swept: tuple = None      # ``table_current=False``: (cells, exact duals there) of the first sweep


_BLAS = []  # (controller, release) made once (finding the loaded libraries takes milliseconds)
_BLAS_LOCK = threading.Lock()
_BLAS_HELD = {"solves": 0, "limiter": None}  # solves under way in this process; the limit they share


def _blas_controller():
    """threadpoolctl's controller and its ``release()``, which lets the calling thread set
    OpenBLAS's process-wide limit (threadpoolctl lets only the first thread that set one set
    it again: the limit of a solve in another thread would silently do nothing)."""
    with _BLAS_LOCK:
        if not _BLAS:
            import threadpoolctl

            openblas = getattr(threadpoolctl, "OpenBLASController", None)
            clear = getattr(openblas, "clear_controlling_thread", None)
            _BLAS.append((threadpoolctl.ThreadpoolController(),
                          (lambda: clear(force=True)) if clear is not None else (lambda: None)))
        return _BLAS[0]


@contextlib.contextmanager
def _one_blas_thread():
    """Small dense solves run far faster on one BLAS thread next to busy numba threads; and
    a solve's bits depend on how many threads LAPACK splits it between, so every solve runs
    on one.  BLAS's thread count is one setting of the whole process: the solves of fits
    running at once in several threads share one limit, set when the first begins and lifted
    when the last ends, by whichever thread that is (a limit per solve would let one fit's
    solve run on every BLAS thread while another's ended: other bits than the fit alone)."""
    ctl, release = _blas_controller()
    with _BLAS_LOCK:
        if _BLAS_HELD["solves"] == 0:
            release()
            _BLAS_HELD["limiter"] = ctl.limit(limits=1, user_api="blas")
            release()
        _BLAS_HELD["solves"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_HELD["solves"] -= 1
            if _BLAS_HELD["solves"] == 0:
                release()
                _BLAS_HELD["limiter"].restore_original_limits()
                release()
                _BLAS_HELD["limiter"] = None


def _solve(H: np.ndarray, g: np.ndarray, memo: Products | None = None) -> np.ndarray:
    """``H^-1 g`` for a symmetric positive (semi)definite ``H``, robustly.  ``memo``: the
    :class:`Products` of the support, which keeps the last matrix that passed the Cholesky
    check (a solve for several right-hand sides with that matrix again skips the check)."""
    with _one_blas_thread():
        return _solve_inner(H, g, memo)


def _solve_inner(H: np.ndarray, g: np.ndarray, memo: Products | None = None) -> np.ndarray:
    diag = np.diag(H)
    scale = float(np.max(np.abs(diag))) or 1.0
    for ridge in (1e-12, 1e-9, 1e-6):
        # ``H + ridge * scale * I``: every entry plus 0.0 off the diagonal, plus ``ridge * scale`` on it
        c = ridge * scale
        if math.isfinite(c):
            A = H + 0.0
            A[np.diag_indices(len(H))] = diag + c
        else:
            A = H + c * np.eye(len(H))
        try:
            # positive definite?  (a joint selection solves with the matrix of the corrective
            # phase's last round, checked just before: the same bits pass the same check)
            passed = memo.checked if memo is not None else None
            if not (g.ndim == 2 and passed is not None and passed.shape == A.shape and np.array_equal(passed, A)):
                np.linalg.cholesky(A)
                if memo is not None:
                    memo.checked = A
            x = np.linalg.solve(A, g)
            if np.all(np.isfinite(x)):
                return x
        except np.linalg.LinAlgError:
            continue
    w, V = np.linalg.eigh(H)
    w = np.maximum(w, 1e-9 * max(float(w.max()), 1e-300))
    return V @ ((V.T @ g) / w[:, None] if g.ndim == 2 else (V.T @ g) / w)


#: Joint selection: candidate x support pairs expanded at most (the closure candidates are
#: cut to stay within it; each pair of +-1 digits can expand to 3^t product cells).
MAX_CROSS_PAIRS = 2**20

#: Supports larger than this are not refined jointly (the dense Hessian would need
#: ``8 |S|^2`` bytes and ``|S|^3 / 3`` flops per round); the greedy search goes on alone.
MAX_SUPPORT = 4000

#: Joint selection in a batched fit (its corrective phases run by compute sweeps): a candidate
#: whose variance given the support and the earlier picks (its Schur complement) is below this
#: fraction of its own variance is not picked.  It is all but a combination of terms already
#: there under ``p_theta`` (on survey-like data, a conditional table that is nearly a
#: function of another variable); its quadratic-model gain ``u^2 / (2 s)`` divides two tiny
#: numbers (predicted gains of 0.01-10^6 nats a row where the selection then gained 10^-5
#: or nothing), and its Newton step shrinks the refinement's first trials to
#: ``alpha ~ 10^-8``.  0: no such limit (every fit in one step per pass).
JOINT_MIN_SCHUR = 1e-4

#: Joint selection in a batched fit: a selection whose quadratic model predicts a gain of more
#: than this many ``epsilon`` ends its refinement at the first round predicted to be the last
#: (:func:`refine` with ``leave=inf``), without a further round when the decrement read after
#: it is still above ``10 tol``: a large selection is followed by a batch (whose corrective
#: phase refines the whole support again) or by another selection (which does too), and the
#: whole-support rounds of such a tail converge only linearly (a re-derivation each).  A
#: selection predicted to gain less (the last ones of a fit) converges as any phase.  None:
#: every selection converges.
JOINT_SETTLE_GAIN = 100.0

#: Batched fits: a batch whose steps gained more than this many ``epsilon`` ends the corrective
#: phase it runs before its re-derivation (``Search.batch``) at the first round predicted to be
#: the last (:func:`refine` with ``leave=inf``), as a large joint selection does
#: (:data:`JOINT_SETTLE_GAIN`): every batch and selection after it refines the whole support
#: again, and the round it would add when the decrement read after it is still above
#: ``10 tol`` is one more re-derivation, for a rest of a few ``epsilon`` that converges only
#: linearly.  None: every batch's phase converges.
BATCH_SETTLE_GAIN = 100.0

#: Batched fits: the first Newton round of a corrective phase (of a batch, of a joint
#: selection, or one the search starts) moves no parameter by more than this (``first_step``
#: of :func:`refine`; the later rounds by at most ``max_step``).  A joint selection's new terms
#: start at 0, and where one runs off towards ``-inf`` its first full Newton step overshoots
#: by far: on two survey-like tables the first round's trials that moved a parameter by more
#: than 1.2 were rejected 22 times in 28 (the cost up by as much as 20 nats a row where a fall
#: was predicted), each a sweep and a halving.  None: the first round as every other.
FIRST_ROUND_MAX_STEP = 1.0

#: Batched fits: a joint selection is tried (once per state) before the next batch when the last
#: batch lowered the cost by less per table operation (pass or compute sweep: its steps, its
#: corrective phase and its re-derivation) than the last joint selection did, divided by this
#: factor (``Search.run``).  A joint selection otherwise runs only when no single move gains
#: ``epsilon``, which a fit's tail of small batches delays by many batches.  Acts only after a
#: first selection has run (its gain per operation is the bar), and once per batch: after a
#: selection the next one it starts waits for a batch to be measured; a selection tried this way
#: that appends nothing sets the bar to 0 until a selection appends again.  None (the default):
#: off; at 4 the table operations of fits like the 2^30 one's fell 14-22 %, but held-out
#: log-likelihood moved by up to -0.2 % (``docs/design.md``).
JOINT_TAIL_FACTOR = None


_START, _CURRENT, _STALE = "start", "current", "stale"  # what the dual table holds during a phase


def next_decrement(dec: float) -> float:
    """The Newton decrement predicted after a full Newton step from one of ``dec``:
    ``2 dec^2 / (1 - sqrt(2 dec))^4``, the bound of a self-concordant cost (``lambda^2 / 2``
    with ``lambda' <= (lambda / (1 - lambda))^2``); infinite from ``dec >= 1/2``.  The cost here is
    not self-concordant in general: on the measured fits the next decrement was 0.5-2.2x this
    where the rounds converge quadratically, and far above it where parameters run off to
    ``-inf`` (a 4-5x fall per round), which :func:`refine` then leaves to later phases.

    >>> round(next_decrement(1e-4) / 1e-8, 3)   # 2e-8, a little more
    2.117
    """
    lam = math.sqrt(2.0 * dec)
    return 2.0 * dec * dec / (1.0 - lam) ** 4 if lam < 1.0 else math.inf


def refine(engine, state, *, tol: float, max_rounds: int = 8, max_halvings: int = 12,
           max_step: float = 4.0, products: Products | None = None, top: int | None = None,
           joint: int = 0, sweep: bool = False, write: bool = True, table_current: bool = True,
           leave: float | None = None, first_step: float | None = None) -> RefineResult:
    """Damped Newton on ``theta`` restricted to the support of ``state`` (in place).

    ``tol``: stop when the predicted remaining gain (Newton decrement / 2) is below
    it; a round whose full Newton step predicts the next decrement below ``tol``
    (:func:`next_decrement`), or the ``max_rounds``-th, is the last one, unless the
    decrement read after it (where the table then holds its duals, a gather) is still
    above ``leave`` (default ``10 tol``); ``decrement`` of the result is the last one read,
    else the predicted one.  ``max_step``: the first trial of a round is scaled so that no parameter moves
    by more than this (keeps ``exp`` in range far from the optimum); ``first_step`` (if given):
    the same limit for the first round (:data:`FIRST_ROUND_MAX_STEP` in batched fits).  On return the
    engine's dual table is exact for ``state.theta`` if any round moved it (else it
    is untouched) and ``state.log_z`` is exact.  The support never changes.
    ``top``: where the engine scans in a re-derivation's last pass at no extra pass
    (:attr:`fsll_ooc.engine.Engine.scan_in_resync`), every re-derivation also scans
    (:meth:`~fsll_ooc.engine.Engine.resync_scan`, the ``top`` best appends) and
    ``scan`` of the result is that of the final table, which the learner then needs
    not scan again; else ``scan`` is None.  ``joint``: those scans also keep the ``joint +
    |S|`` best cells by second-order score, from which a joint selection right after
    takes its candidates without a pass of its own (:func:`joint_append`, ``scan``).

    ``sweep``: every trial is a compute sweep (:meth:`~fsll_ooc.engine.Engine.sweep`: the
    exact ``log Z`` and the duals the next round needs, no table read or written) but the
    last round's first, which is the table's re-derivation itself (``docs/design.md``,
    "Corrective phases between passes"): a phase of ``R`` rounds costs ``R - 1`` sweeps and
    one re-derivation instead of ``R`` re-derivations.  When that trial is rejected the
    table is re-derived again at the end (for the accepted parameters, or for the
    parameters the phase started from when no round moved: ``pending`` is then False).
    ``write=False`` (with ``sweep``): every trial is a sweep and the re-derivation is left
    to the caller (``pending`` of the result; :func:`write_duals`).
    ``table_current=False`` (with ``sweep``): the dual table does not describe ``state.theta``
    (a batch's steps not yet applied): the first round reads its duals and the exact
    ``log Z`` off a sweep; when no round moves, the table is left as it was for the caller
    to re-derive (``pending``).
    """
    out = RefineResult()
    fuse = top is not None and engine.scan_in_resync
    last = [None]  # the scan of the table's current contents (fused re-derivations only)

    def rederive(sup, th, lz):
        last[0] = None
        if not fuse:
            return engine.resync(sup, th, lz)
        lz, last[0] = engine.resync_scan(sup, th, lz, top, joint=joint + len(sup) if joint else 0)
        return lz

    m = len(state.theta)
    if m == 0 or m > MAX_SUPPORT:
        out.decrement = 0.0 if m == 0 else math.inf
        out.pending = not table_current
        return out
    # insertion order: appends extend the support at the end, so the pair cache only grows
    support = np.fromiter(state.theta.keys(), dtype=np.int64, count=m)
    prod = products if products is not None else Products(state.cards)
    prod.update(support)
    theta = np.fromiter(state.theta.values(), dtype=np.float64, count=m)
    dbar = np.fromiter(map(state.dbar.__getitem__, state.theta), dtype=np.float64, count=m)
    pen = state.total_penalty()

    def cost_of(th, log_z):
        return -state.entropy_q + log_z - float(th @ dbar) + pen

    log_z = state.log_z
    # what the dual table holds: what it held at the start (_START), the duals of ``theta``
    # (_CURRENT), or those of other parameters (_STALE: a trial re-derived it)
    table = _START
    uniq, inv = _cells_to_read(engine, np.concatenate([prod.flat, support]), math.prod(state.cards))
    known = None  # with ``sweep``: the duals at ``uniq`` of ``theta`` once a round moved it
    if not table_current:
        if not sweep:
            raise ValueError("refine(table_current=False) needs sweep=True")
        log_z, known = engine.sweep(support, theta, log_z, uniq)
        out.trials += 1
        out.swept = (uniq, known)
        state.log_z = log_z
    cur_cost = state.cost()
    start_cost = cur_cost
    leave = 10.0 * tol if leave is None else leave
    checked = False  # the last round was the predicted last one: its decrement is read to check it
    while True:
        if known is None:
            vals = engine.gather(uniq)
            out.gathers += 1
        else:
            vals = known
        cell = vals if inv is None else vals[inv]
        tb_s = cell[len(prod.flat):]
        H = moment_matrix(prod, cell[:len(prod.flat)])
        H -= np.outer(tb_s, tb_s)
        g = tb_s - dbar
        step = -_solve(H, g, prod)
        dec = 0.5 * float(-(g @ step))
        out.decrement = dec
        if not (dec > tol) or not np.isfinite(dec) or (checked and dec <= leave) or out.rounds >= max_rounds:
            break
        limit = max_step if first_step is None or out.rounds else min(max_step, first_step)
        alpha = min(1.0, limit / max(float(np.max(np.abs(step))), 1e-300))
        # the last round: no round after it, or a full Newton step whose next decrement is
        # predicted below ``tol``; with sweeps its first trial is the table's re-derivation
        after = next_decrement(dec) if alpha == 1.0 else math.inf
        final = after <= tol or out.rounds == max_rounds - 1
        accepted = False
        for h in range(max_halvings):
            trial = theta + alpha * step
            by_table = not sweep or (write and final and h == 0)
            try:
                if by_table:
                    table = _STALE
                    lz = rederive(support, trial, log_z)
                else:
                    lz, at = engine.sweep(support, trial, log_z, uniq)
            except (FloatingPointError, OverflowError, ValueError):
                lz = math.nan
            out.trials += 1
            c = cost_of(trial, lz) if math.isfinite(lz) else math.inf
            # accept only a real decrease (beyond round-off of the cost, ~1e-13 relative)
            if c < cur_cost - 1e-13 * max(1.0, abs(cur_cost)):
                theta, log_z, cur_cost = trial, lz, c
                if by_table:
                    table = _CURRENT
                else:
                    known = at
                    if table == _CURRENT:
                        table = _STALE
                accepted = True
                break
            alpha *= 0.5
        if not accepted:
            break
        out.rounds += 1
        if final:
            if table == _CURRENT:  # the table holds the round's duals: its decrement costs a gather
                checked, known = True, None
                continue
            out.decrement = after if h == 0 else math.inf
            break
    if out.rounds:
        for y, v in zip(support, theta):
            state.theta[int(y)] = float(v)
        state.log_z = log_z
        if table == _CURRENT:
            out.scan = last[0]
        elif not sweep:
            state.log_z = rederive(support, theta, log_z)
            out.trials += 1
            out.scan = last[0]
        elif write:
            out.scan = write_duals(engine, state, top, joint)
        else:
            out.pending = True
        out.delta = state.cost() - start_cost
    elif table == _STALE:  # every trial rejected, one of them re-derived the table: the duals of theta again
        state.log_z = rederive(support, theta, state.log_z)
        out.scan = last[0]
    elif not table_current:
        out.pending = True
    return out


def write_duals(engine, state, top: int | None, joint: int = 0):
    """Re-derive the dual table exactly for ``state.theta`` (sets the exact ``state.log_z``);
    with ``top`` and where the engine scans inside a re-derivation, also the scan of the new
    table (as :func:`refine`'s ``scan``, ``joint`` cells kept), else None."""
    support = np.fromiter(state.theta.keys(), dtype=np.int64, count=len(state.theta))
    theta = np.fromiter(state.theta.values(), dtype=np.float64, count=len(state.theta))
    if top is None or not engine.scan_in_resync:
        state.log_z = engine.resync(support, theta, state.log_z)
        return None
    state.log_z, scan = engine.resync_scan(support, theta, state.log_z, top,
                                           joint=joint + len(support) if joint else 0)
    return scan


@dataclass
class JointResult:
    """What one joint selection did."""

    added: list          # flat indices appended (empty: nothing accepted)
    gains: list = None   # predicted gain of each appended term when it was picked (penalty included)
    delta: float = 0.0   # cost change (<= -epsilon when something was added)
    estimate: float = 0.0  # predicted gain (quadratic model, penalties included), > 0
    candidates: int = 0
    trials: int = 0
    refine: RefineResult | None = None


def closure_candidates(cards, support: np.ndarray, limit: int) -> np.ndarray:
    """Terms on the variable sets the support already uses, not yet in it (at most ``limit``).

    For every member ``y`` of the support, every ``y' != 0`` whose non-zero axes lie
    inside those of ``y`` (any digits there).  A conditional table over a family of
    many-valued variables needs many such terms in the +-1 basis; the greedy search
    finds the family through one of them, but the others score poorly one at a time
    (their 1-D gains do not pay the penalty) and so do not reach the top-k pass's
    list, although together with the support re-adapting they do pay.  Variable sets
    are taken in support order (the earliest, strongest terms first); sets with more
    than ``4 * limit`` cells are skipped; the list is cut at ``limit``.
    """
    support = np.asarray(support, np.int64)
    if len(support) == 0 or limit <= 0:
        return np.zeros(0, np.int64)
    strides = _strides(cards)
    ks, ss = [int(k) for k in cards], strides.tolist()
    have = set(support.tolist()) | {0}  # y = 0 is the constant, never a parameter
    out, total = [], 0
    nonzero = _digits(cards, support) != 0
    # the first row of each variable set, in support order (a set seen before adds nothing)
    if nonzero.shape[1] <= 62:  # a set as a bit mask: one integer per row to tell the sets apart
        masks = nonzero @ (np.int64(1) << np.arange(nonzero.shape[1], dtype=np.int64))
        first = np.sort(np.unique(masks, return_index=True)[1])
    else:
        first = np.sort(np.unique(nonzero, axis=0, return_index=True)[1])
    rows, cols = np.nonzero(nonzero[first])
    ends = np.searchsorted(rows, np.arange(1, len(first) + 1)).tolist()
    cols = cols.tolist()
    for a, b in zip([0] + ends[:-1], ends):
        axes = cols[a:b]
        size = math.prod(ks[i] for i in axes)
        if size > 4 * limit:
            continue
        # every digit combination on ``axes`` (the last axis fastest), as flat indices
        if size <= _SMALL_SET:
            flat = [0]
            for i in axes:
                flat = [f + x * ss[i] for f in flat for x in range(ks[i])]
        else:
            cells = np.zeros(1, np.int64)
            for i in axes:
                cells = (cells[:, None] + np.arange(ks[i], dtype=np.int64) * strides[i]).reshape(-1)
            flat = cells.tolist()
        flat = [f for f in flat if f not in have]
        have.update(flat)
        out.extend(flat)
        total += len(flat)
        if total >= limit:
            break
    return np.array(out[:limit], dtype=np.int64)


#: :func:`closure_candidates` lists the cells of a variable set of at most this many cells in
#: Python (a set's few cells cost less than the arrays that would hold them).
_SMALL_SET = 64


class CandidateOrder:
    """Which of two joint-selection candidates comes first in their pair's expansion.

    A pair's terms are summed in the order of its expansion (:func:`_expand`), which depends
    on which member is ``a``; the candidates' pairs are expanded as a :class:`Products` cache
    kept across selections would (the order of the learner before the columns were read
    lazily, so the sums keep their bits): ``a`` is the member that joined the candidate list
    first (stayed in it since), and of two that joined together, the earlier in that list.
    """

    def __init__(self):
        self.key = {}  # flat -> (the update it joined at, its position in that update's list)
        self.updates = 0
        self.rank = np.zeros(0, np.int64)

    def update(self, flat_c: np.ndarray) -> None:
        """The candidate list is now ``flat_c`` (distinct flat indices)."""
        flats = np.asarray(flat_c, np.int64).tolist()
        if flats == list(self.key):
            return
        old, n = self.key, self.updates
        self.key = {f: old.get(f, (n, i)) for i, f in enumerate(flats)}
        self.updates += 1
        keys = list(self.key.values())
        order = sorted(range(len(keys)), key=keys.__getitem__)
        self.rank = np.empty(len(keys), np.int64)
        self.rank[order] = np.arange(len(keys), dtype=np.int64)

    def pairs_with(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ia, ib)``: the pair of every candidate ``i`` (in list order) with candidate ``c``."""
        i = np.arange(len(self.rank), dtype=np.int64)
        first = self.rank <= self.rank[c]
        return np.where(first, i, c), np.where(first, c, i)

    def all_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ia, ib)`` of every pair ``i <= j`` of the list (the diagonal included)."""
        i, j = np.triu_indices(len(self.rank))
        first = self.rank[i] <= self.rank[j]
        return np.where(first, i, j).astype(np.int64), np.where(first, j, i).astype(np.int64)


def joint_append(engine, state, *, epsilon: float, tol: float, n_candidates: int = 256, max_new: int = 32,
                 max_rounds: int = 8, products: Products | None = None, n_closure: int = 0,
                 cand_order: CandidateOrder | None = None, top: int | None = None, scan=None,
                 joint: int = 0, sweep: bool = False) -> JointResult:
    """Append the candidates that pay for themselves *jointly*, then refine (in place).

    The greedy search scores a candidate ``y`` by its 1-D gain with every other
    parameter frozen, ``g_y^2 / (2 Var(Phi_y))`` to second order.  A candidate
    correlated with the support can gain far more once the support re-adapts: the
    second-order gain is then ``u_y^2 / (2 s_y)`` with the Schur complement
    ``s_y = Var(Phi_y) - h_y^T H^-1 h_y`` (``h_y = Cov(Phi_S, Phi_y)``) and
    ``u_y = g_y - h_y^T H^-1 g_S`` (an example from the paper's data in
    ``docs/benchmarks_quality.md``).  This runs a forward selection on that
    quadratic model over the ``n_candidates`` best cells of a top-k pass
    (:meth:`~fsll_ooc.engine.Engine.top_candidates`) and up to ``n_closure`` unused
    terms on the support's variable sets (:func:`closure_candidates`; on
    Bayesian-network data with 3-5-valued variables these are what the top-k list
    misses), conditioning the remaining
    candidates on each pick (``O(K^2)`` per pick), and keeps the picks whose predicted
    gain exceeds ``r_y + epsilon``.  They are appended at ``theta_y = 0`` and the
    whole support is refined (:func:`refine`); the result is kept only if the exact
    cost fell by at least ``epsilon`` (else the best single pick is tried, else the
    state is restored).  Gathers: ``|S|^2 + K |S|`` product cells, and the ``K^2 / 2`` of the
    candidates' own pairs: in core only their diagonal and the picks' columns, one gather per
    pick; out of core all of them in the same gather (``cand_order``: a
    :class:`CandidateOrder` kept across selections).  ``top``,
    ``joint``: as for :func:`refine` (the accepted refinement's ``scan``).  ``scan``: the
    scan of the dual table as it is; when it kept enough cells by second-order score
    (``joint`` of :func:`refine`), the candidates come from it, not from a pass.  ``sweep``:
    as for :func:`refine` (its last trial re-derives the table; a selection that is not
    kept costs one more re-derivation, which restores it); with ``sweep`` (a batched fit) a
    candidate nearly in the span of the support under ``p_theta`` is not picked
    (:data:`JOINT_MIN_SCHUR`) and a selection predicted to gain much ends its refinement at
    the first round predicted to be the last (:data:`JOINT_SETTLE_GAIN`); its first round moves
    no parameter by more than :data:`FIRST_ROUND_MAX_STEP`.
    """
    out = JointResult(added=[])
    m = len(state.theta)
    if m + n_candidates + n_closure > MAX_SUPPORT:
        return out
    support = np.fromiter(state.theta.keys(), dtype=np.int64, count=m)
    prod = products if products is not None else Products(state.cards)
    prod.update(support)
    with engine.purpose_of("joint-top"):
        flat_c, _ = engine.top_candidates(n_candidates + m, scan=scan)
    flat_c = flat_c[~np.isin(flat_c, support)][:n_candidates]
    if m:
        n_closure = min(n_closure, max(MAX_CROSS_PAIRS // m - len(flat_c), 0))
    if n_closure:
        extra = closure_candidates(state.cards, support, n_closure)
        flat_c = np.concatenate([flat_c, extra[~np.isin(extra, flat_c)]])
    K = len(flat_c)
    out.candidates = K
    if K == 0:
        return out
    cards = state.cards
    order = cand_order if cand_order is not None else CandidateOrder()
    order.update(flat_c)
    dig_c = _digits(cards, flat_c)
    # in core the candidate x support pairs are summed straight off the table (no expansion
    # written out, no gather of its cells); out of core expanded and read in the one gather
    table = _table_array(engine)
    if table is not None or not m:
        cs_pair, cs_flat, cs_coef = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    else:
        cs_pair, cs_flat, cs_coef = _cross_moments(cards, flat_c, support)
    # in core the candidates' own pairs are expanded and read for the diagonal and the picks'
    # columns only (a gather per pick costs microseconds); out of core all of them, in the one
    # gather (a gather reads whole chunks)
    lazy = not engine.out_of_core
    if lazy:
        cc_pair, cc_coef = np.zeros(0, np.int64), np.zeros(0)
        cc_flat = np.zeros(1, np.int64)  # the cell y = 0: every candidate's square
    else:
        cc_a, cc_b = order.all_pairs()
        cc_pair, cc_flat, cc_coef = _expand(cards, dig_c, dig_c, cc_a, cc_b)
    n1, n2, n3 = len(prod.flat), len(cs_flat), len(cc_flat)
    uniq, inv = _cells_to_read(engine, np.concatenate([prod.flat, cs_flat, cc_flat, support, flat_c]), math.prod(cards))
    cell = engine.gather(uniq)
    if inv is not None:
        cell = cell[inv]
    d_c = engine.gather(flat_c, table=Table.DBAR)
    o = n1 + n2 + n3
    tb_s, tb_c = cell[o:o + m], cell[o + m:]
    d_s = np.array([state.dbar[int(y)] for y in support])
    if lazy:
        # every candidate's square is Phi_0: its pair sum is 0 + 1 * thetabar_0 (the full matrix's numbers)
        h_diag = np.full(K, 0.0 + 1.0 * float(cell[n1 + n2])) - tb_c * tb_c

        if table is not None:  # the candidates' row sums, strides and axes' kinds once per selection
            dig_k = np.ascontiguousarray(dig_c, np.int64)
            strides_k = _strides(cards)
            walsh_k = _walsh_axes(cards)
            rows_k = kernel_products.row_sums(dig_k, dig_k, strides_k)

        def h_col(c):  # column c of H_cc: the pairs (i, c), each expanded as the full matrix's would be
            if table is not None:  # (the pairs of :meth:`CandidateOrder.pairs_with`, read off the table)
                col = kernel_products.pair_sums_column(dig_k, c, order.rank, strides_k, walsh_k, table, *rows_k)
            else:
                ia, ib = order.pairs_with(c)
                pair, flat, coef = _expand(cards, dig_c, dig_c, ia, ib)
                col = kernel_products.pair_sums(pair, coef, engine.gather(flat), K)
            col -= tb_c * tb_c[c]
            return col
    else:
        s_cc = kernel_products.pair_sums(cc_pair, cc_coef, cell[n1 + n2:n1 + n2 + n3], len(cc_a))
        M = np.zeros((K, K))
        M[cc_a, cc_b] = s_cc
        M[cc_b, cc_a] = s_cc
        H_cc = M - np.outer(tb_c, tb_c)
        h_diag = np.diag(H_cc)

        def h_col(c):
            return H_cc[:, c]
    g_c = tb_c - d_c
    family = state.penalty_code != "paper"
    if family:  # each candidate's marginal code length, updated as picks fill its family
        counts = state.family_counts()
        fam_c = state._families(flat_c.tolist())
        fam_id = {}
        fam_ix = np.array([fam_id.setdefault(f, len(fam_id)) for f in fam_c], dtype=np.int64)
        # (no candidate is in the support: one more member of its family)
        r_c = np.array(state.add_prices(fam_id, counts))[fam_ix]
    else:
        r_c = np.array([state.penalty(int(y)) for y in flat_c])
    if m:
        H_ss = moment_matrix(prod, cell[:n1]) - np.outer(tb_s, tb_s)
        if table is not None:
            H_cs = _pair_sums_grid(cards, table, dig_c, _digits(cards, support))
        else:
            H_cs = kernel_products.pair_sums(cs_pair, cs_coef, cell[n1:n1 + n2], K * m).reshape(K, m)
        H_cs -= np.outer(tb_c, tb_s)
        X = _solve(H_ss, np.concatenate([H_cs.T, (tb_s - d_s)[:, None]], axis=1), prod)
        u = g_c - H_cs @ X[:, K]
        # of ``H_cs H_ss^-1 H_sc`` (K x K) only the diagonal and the picks' columns are read
        HX_diag = np.einsum("kj,jk->k", H_cs, X[:, :K])
    else:
        X, u = None, g_c

    def sig_col(c):  # column c of ``sig = H_cc - H_cs H_ss^-1 H_sc``, the candidates given the support
        return h_col(c) - H_cs @ X[:, c] if X is not None else h_col(c).copy()

    chosen, picked_gain = [], []
    floor = 1e-12
    # ``sig`` conditioned on the picks so far, kept implicitly: its diagonal ``dg`` and the
    # picks' columns ``cols`` (a column of the conditioned ``sig`` is the original column
    # less one rank-one term per earlier pick, in pick order: the numbers of an in-place
    # update of the whole matrix, at ``O(K)`` per pick and earlier pick instead of ``O(K^2)``)
    dg = h_diag - HX_diag if X is not None else h_diag.copy()
    cols = []
    low = h_diag * JOINT_MIN_SCHUR if sweep and JOINT_MIN_SCHUR else None  # (a batched fit)
    for _ in range(min(max_new, K)):
        ok = dg > floor
        if low is not None:
            ok &= dg > low
        ok[chosen] = False
        if not ok.any():
            break
        gain = np.where(ok, u * u / (2.0 * np.where(ok, dg, 1.0)) - r_c, -np.inf)
        c = int(np.argmax(gain))
        if not gain[c] > epsilon:
            break
        chosen.append(c)
        picked_gain.append(float(gain[c]))
        if family:
            a = fam_c[c]
            counts[a] = counts.get(a, 0) + 1
            r_c[fam_ix == fam_ix[c]] = state.term_code().add(a, counts[a])
        col = sig_col(c)
        for prev, piv in cols:
            col -= prev * prev[c] / piv
        piv = col[c]
        dg -= col * col / piv
        cols.append((col, piv))
        u = u - col * (u[c] / col[c])
    if not chosen:
        return out
    out.estimate = float(sum(picked_gain))
    for sel in ([chosen, chosen[:1]] if len(chosen) > 1 else [chosen]):
        before = state.cost()
        theta0, dbar0, log_z0 = dict(state.theta), dict(state.dbar), state.log_z
        for c in sel:
            state.theta[int(flat_c[c])] = 0.0
            state.dbar[int(flat_c[c])] = float(d_c[c])
        # with sweeps the refinement's last trial is the table's re-derivation (restored below
        # when the selection is not kept)
        # a large selection in a batched fit leaves the tail of its convergence to the phases after it
        settle = sweep and JOINT_SETTLE_GAIN is not None and out.estimate > JOINT_SETTLE_GAIN * epsilon
        rr = refine(engine, state, tol=tol, max_rounds=max_rounds, products=prod, top=top, joint=joint,
                    sweep=sweep, leave=math.inf if settle else None,
                    first_step=FIRST_ROUND_MAX_STEP if sweep else None)
        out.trials += 1
        after = state.cost()
        if rr.rounds and after < before - epsilon:
            if rr.pending:
                rr.scan = write_duals(engine, state, top, joint)
                rr.pending = False
            out.added = [int(flat_c[c]) for c in sel]
            out.gains = picked_gain[:len(sel)]
            out.delta = after - before
            out.refine = rr
            return out
        state.theta, state.dbar, state.log_z = theta0, dbar0, log_z0
        if rr.rounds and not rr.pending:  # the dual table moved: restore it
            sup0 = np.fromiter(theta0.keys(), dtype=np.int64, count=len(theta0))
            state.log_z = engine.resync(sup0, np.fromiter(theta0.values(), np.float64, len(theta0)), log_z0)
    return out


def family_terms(cards, families, limit: int) -> np.ndarray:
    """Every term whose non-zero variables are exactly one of ``families``, family by family
    in the given order, skipping a family that would take the list past ``limit`` terms and
    the families of binary variables (one member each, which the support holds already)."""
    strides = _strides(cards)
    out = [_family_block(cards, strides, axes) for axes in _families_within(cards, families, limit)]
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _families_within(cards, families, limit: int, sizes: dict | None = None) -> list:
    """The families :func:`family_terms` lists, in order.  ``sizes``: a memo of each family's
    number of terms (the product of its ``cards - 1``), filled in as they are found."""
    out, total = [], 0
    less = [k - 1 for k in cards]
    sizes = {} if sizes is None else sizes
    for axes in families:
        M = sizes.get(axes)
        if M is None:
            M = sizes[axes] = math.prod(map(less.__getitem__, axes))
        if M <= 1 or total + M > limit:
            continue
        out.append(axes)
        total += M
    return out


def _family_block(cards, strides, axes) -> np.ndarray:
    """The terms whose non-zero variables are exactly ``axes`` (C order)."""
    grids = np.meshgrid(*[np.arange(1, cards[i]) for i in axes], indexing="ij")
    return sum(g.reshape(-1).astype(np.int64) * strides[i] for g, i in zip(grids, axes))


def _family_candidates(engine, state, limit: int):
    """``(cand, dd, fam_ix, fams)`` of :func:`family_move`: the terms of :func:`family_terms` on
    the support's families, their targets, the position of each one's family in ``fams`` (the
    families listed).  Memoised on the support's families; each family's terms and targets are
    built and gathered once per state (the memo goes with :meth:`FitState.targets_changed`)."""
    support = tuple(state.theta)
    memo = state.__dict__.get("_family_memo")
    if memo is not None and memo[3] == support:  # (an adjust leaves the support as it was)
        return memo[1]
    named = tuple(dict.fromkeys(state._families(support)))
    if memo is not None and memo[0] == named:
        state.__dict__["_family_memo"] = memo[:3] + (support,)
        return memo[1]
    parts = memo[2] if memo is not None else {}
    fams = _families_within(state.cards, named, limit, state.__dict__.setdefault("_family_sizes", {}))
    fresh = [a for a in fams if a not in parts]
    if fresh:
        strides = _strides(state.cards)
        blocks = [_family_block(state.cards, strides, a) for a in fresh]
        flat = np.concatenate(blocks)
        dd = np.asarray(engine.gather(flat, table=0), np.float64)
        at = 0
        for a, b in zip(fresh, blocks):
            parts[a] = (b, dd[at:at + len(b)])
            at += len(b)
    if fams:
        cand = np.concatenate([parts[a][0] for a in fams])
        dd = np.concatenate([parts[a][1] for a in fams])
        fam_ix = np.repeat(np.arange(len(fams), dtype=np.int64), [len(parts[a][0]) for a in fams])
    else:
        cand, dd, fam_ix = np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
    out = (cand, dd, fam_ix, fams)
    state.__dict__["_family_memo"] = (named, out, parts, support)
    return out


def _family_scores(engine, state, limit: int, counts: dict):
    """What :func:`family_move` scores the unused terms on the named families by, all but their
    duals: ``(cand, dd, log1p(dd), 1 + dd, log1p(-dd), 1 - dd, r)`` of the terms of
    :func:`_family_candidates` not in the support (``r``: each one's marginal code length).  They
    change only with the support (memoised on it, the code and the candidates)."""
    found = _family_candidates(engine, state, limit)
    support, code = tuple(state.theta), state.term_code()
    memo = state.__dict__.get("_family_scores")
    if memo is not None and memo[0] == support and memo[1] is code and memo[2] is found:
        return memo[3]
    cand, dd, fam_ix, fams = found
    keep = ~np.fromiter(map(state.theta.__contains__, cand.tolist()), bool, len(cand))
    cand, dd, fam_ix = cand[keep], dd[keep], fam_ix[keep]
    # (none is in the support: each costs one more member of its family)
    r = np.array(state.add_prices(fams, counts))[fam_ix]
    out = (cand, dd, np.log1p(dd), 1.0 + dd, np.log1p(-dd), 1.0 - dd, r)
    state.__dict__["_family_scores"] = (support, code, found, out)
    return out


def family_move(engine, state, best, limit: int):
    """The best single move under the family code, from the scan's best and the named families.

    The engine's scan prices every cell as a new family's first member (the paper's ``r_y``,
    which the family code charges a first member).  A cell on a family the support already
    names costs less: the scan's append is re-priced, and the unused terms on the named
    families (:func:`family_terms`, at most ``limit``) are scored by the 1-D closed form
    with their marginal code length; the better of the two is returned as
    ``(delta, move, flat, thetabar_y, dbar_y)``.  Their ``dbar`` is gathered once per family.
    """
    delta, move, y, t, d = best
    counts = state.family_counts()
    if move == "append":  # (the difference first: it is exactly 0 where the prices agree)
        delta = delta + (state.marginal_penalties([y], counts)[0] - state.penalty(y))
    if limit <= 0 or not state.theta:
        return delta, move, y, t, d
    cand, dd, l1pd, ompd, l1md, omd, r = _family_scores(engine, state, limit, counts)
    if not len(cand):
        return delta, move, y, t, d
    table = _table_array(engine)
    tt = table[cand] if table is not None else np.asarray(engine.gather(cand), np.float64)
    lim = 1.0 - 2.0**-52
    tc = np.clip(tt, -lim, lim)
    gain = 0.5 * (ompd * (np.log1p(tc) - l1pd) + omd * (np.log1p(-tc) - l1md)) + r
    i = int(np.argmin(gain))
    if gain[i] < delta:
        return float(gain[i]), "append", int(cand[i]), float(tt[i]), float(dd[i])
    return delta, move, y, t, d
