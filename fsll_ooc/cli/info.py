"""``fsll-ooc info``: a saved model (or average) and its terms by their share of the cost reduction.
"""
from __future__ import annotations

import math

import numpy as np

from ..model_file import em_summary
from ..queries import labels as _labels_of
from . import common


def register(sub) -> None:
    p = sub.add_parser(
        "info", help="summary of a saved model: which variables depend on each other, and its terms",
        description="Print a saved model's summary; then which pairs of variables depend on each other "
                    "most (their mutual information under the model, and given all the other variables); "
                    "then its selected terms, sorted by their share "
                    "of the fit's cost reduction (the gain of the iteration that appended the term "
                    "plus its later adjustments). A term adds theta * Phi_y(x) to log p(x) (up to "
                    "log Z). Each variable in a term is shown with the categories on which its "
                    "basis function is +1 (e.g. 'colour=red'; -1 elsewhere); Phi_y(x) is the "
                    "product, i.e. +1 when an even number of the shown conditions fail. Order = "
                    "number of variables in the term: order >= 2 terms are interactions.")
    p.add_argument("model", metavar="MODEL", help="a model saved by 'fsll-ooc fit' (or a completed store)")
    p.add_argument("--top", type=common.nonneg_int, default=20, metavar="K",
                   help="show the K most important terms; 0 shows all (default: %(default)s)")
    p.add_argument("--pairs", type=common.nonneg_int, default=12, metavar="K",
                   help="show the K most dependent pairs of variables; 0 shows all (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print summary and terms as JSON")
    p.set_defaults(func=run)


def _nan_to_none(x):
    return None if isinstance(x, float) and math.isnan(x) else x


def run(args) -> int:
    model = common.load_model(args.model, averages=True)
    if hasattr(model, "members_"):
        return _info_average(args, model)
    return _info_model(args, model)


def _term_rows(model) -> list[dict]:
    """The rows of ``info``: a model's terms (:func:`fsll_ooc.queries.interactions`), most important first."""
    from ..queries import interactions

    return [{"term": t["term"], "variables": list(t["variables"]), "order": t["order"], "theta": t["theta"],
             "share": _nan_to_none(t["share"]), "y": list(t["y"]), "factors": t["factors"]}
            for t in interactions(model, as_frame=False)]


def _print_table_head(what: str, path, names, ks) -> None:
    """The first lines of ``info``: what the file holds, its variables and table size."""
    print(f"{what} {path}")
    print(f"  variables   {len(ks)}: " + ", ".join(f"{nm} ({k})" for nm, k in zip(names, ks)))
    print(f"  joint table {math.prod(ks):,} cells")


def _print_terms(terms: list[dict], more: str = "") -> None:
    """``info``'s table of terms (rank, share, theta, order, the term in words)."""
    print(f"  {'#':>4}  {'share':>6}  {'theta':>9}  {'order':>5}  term{more}")
    for r, t in enumerate(terms, 1):
        share = "n/a" if t["share"] is None else f"{100 * t['share']:.1f}%"
        print(f"  {r:>4}  {share:>6}  {t['theta']:>+9.4f}  {t['order']:>5}  {t['term']}")


def _info_average(args, avg) -> int:
    """``info`` of an average: its members' summaries, and each member's most important terms."""
    names, cats = _labels_of(avg)
    ks = tuple(int(k) for k in avg.cardinalities_)
    members = []
    for k, m in enumerate(avg.members_):
        terms = _term_rows(m)
        members.append({"member": k, "n_bases": int(m.n_bases_), "n_iter": m.n_iter_, "converged": m.converged_,
                        "cost": common.float_or_none(m.cost_), "kl_data": common.float_or_none(m.kl_data_), "n_samples": m.n_samples_,
                        "n_terms": len(terms), "terms": terms if args.top == 0 else terms[:args.top]})
    summary = {"model": args.model, "average_of": len(members), "n_vars": len(ks), "names": names,
               "cardinalities": list(ks), "categories": cats, "cells": math.prod(ks), "n_samples": avg.n_samples_,
               "dependence": _dependence_rows(avg), "members": members}
    if args.json:
        common.print_json(summary)
        return 0
    _print_table_head(f"FSLL average of {len(members)} models", args.model, names, ks)
    print(f"  fitted on   {summary['n_samples']:,} samples (each member on a random four fifths of them)")
    print("  the model is the mean of the members' distributions; it has no single set of terms, so each")
    print("  member's terms are listed with their share of that member's cost reduction")
    _print_dependence(summary["dependence"], args.pairs)
    for mem in members:
        more = "" if len(mem["terms"]) == mem["n_terms"] else f" (top {len(mem['terms'])} of {mem['n_terms']})"
        print(f"\nmember {mem['member']}: bases {mem['n_bases']}   iterations {mem['n_iter']}   "
              f"cost {common.fmt_num(mem['cost'])}" + ("" if mem["converged"] else "   (stopped before convergence)"))
        if mem["terms"]:
            _print_terms(mem["terms"], more)
    return 0


def _info_model(args, model) -> int:
    names, cats = _labels_of(model)
    ks = tuple(int(k) for k in model.cardinalities_)
    terms = _term_rows(model)
    shown = terms if args.top == 0 else terms[:args.top]
    by_order: dict[int, int] = {}
    for t in terms:
        by_order[t["order"]] = by_order.get(t["order"], 0) + 1
    summary = {
        "model": args.model,
        "n_vars": len(ks),
        "names": names,
        "cardinalities": list(ks),
        "categories": cats,
        "cells": math.prod(ks),
        "n_samples": model.n_samples_,
        "n_bases": int(model.n_bases_),
        "n_iter": model.n_iter_,
        "converged": model.converged_,
        "cost": common.float_or_none(model.cost_),  # None when the model file has none
        "kl_data": common.float_or_none(model.kl_data_),
        "n_terms": len(terms),
        "terms_by_order": {str(o): c for o, c in sorted(by_order.items())},
        "em": em_summary(model),
        "dependence": _dependence_rows(model),
        "terms": shown,
    }
    if args.json:
        common.print_json(summary)
        return 0
    _print_table_head("FSLL model", args.model, names, ks)
    print(f"  fitted on   {summary['n_samples']:,} samples"
          + ("" if summary["converged"] else " (stopped before convergence)"))
    em = summary["em"]
    if em is not None:
        print(f"  fitted by   EM (missing cells): {em['rounds']} rounds"
              + ("" if em["converged"] else " (stopped before convergence)")
              + f", observed-data log-likelihood {common.fmt_num(em['loglik'])} nats per row")
        print("              (KL(pd||p) below is measured against the data completed by the model)")
    print(f"  bases       {summary['n_bases']}   iterations {summary['n_iter']}   "
          f"cost {common.fmt_num(summary['cost'])}   KL(pd||p) {common.fmt_num(summary['kl_data'])}")
    if summary["cost"] is not None:
        print("              cost: the MDL cost the fit minimised (KL(pd||p) + the parameters' code length,")
        print(f"              nats per sample; lower is better); for a log-likelihood use '{common.PROG} score'")
    if not terms:
        print("  no terms: the model is the uniform distribution")
        return 0
    print("  terms       " + ", ".join(f"{c} of order {o}" for o, c in sorted(by_order.items())))
    _print_dependence(summary["dependence"], args.pairs)
    more = "" if len(shown) == len(terms) else f" (top {len(shown)} of {len(terms)}; --top 0 shows all)"
    print(f"\nterms by share of the cost reduction{more}")
    print("(a term's share depends on how the categories are coded; which variables go together is the table above):")
    _print_terms(shown)
    return 0


def _dependence_rows(model) -> list[dict]:
    """``model.dependence()`` as plain rows (NaN as None)."""
    return [{k: (_nan_to_none(v) if isinstance(v, float) else int(v) if isinstance(v, np.integer) else v)
             for k, v in r.items()} for r in model.dependence().to_dict("records")]


def _print_dependence(rows: list[dict], top: int) -> None:
    """``info``'s table of the most dependent pairs of variables."""
    if not rows:
        return
    shown = rows if top == 0 else rows[:top]
    more = "" if len(shown) == len(rows) else f"; top {len(shown)} of {len(rows)}, --pairs 0 shows all"
    print(f"\nwhich variables depend on each other (mutual information under the model, nats{more}):")
    spread = "mi_min" in rows[0]
    w = max(4, *(len(str(r["a"])) for r in shown), *(len(str(r["b"])) for r in shown))
    print(f"  {'#':>4}  {'a':<{w}}  {'b':<{w}}  {'MI':>8}  {'MI given the rest':>17}"
          + ("  members' MI" if spread else "  terms"))
    for k, r in enumerate(shown, 1):
        cmi = "n/a" if r["cmi"] is None else f"{r['cmi']:.4f}"
        last = f"  {r['mi_min']:.4f}-{r['mi_max']:.4f}" if spread else f"  {r['terms']:>5}"
        print(f"  {k:>4}  {str(r['a']):<{w}}  {str(r['b']):<{w}}  {r['mi']:>8.4f}  {cmi:>17}" + last)
