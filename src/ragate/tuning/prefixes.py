"""TARG's prefix length k chosen with tau for a retrieval budget (TARG A.8), from a sweep's records.

For each k of the grid the gate is read after k draft tokens (``targ-margin@k=5``; k = 20 is ``targ-margin``
itself), tau_k = F^-1(1 - budget) over its own dev scores (section 3.3), and the dev EM at that budget is the
sweep's exact lookup (closed-book answer below tau_k, retrieval answer above). The chosen k has the best dev EM,
ties to the shorter draft (it costs less). Each row also says how often k's decisions agree with k = 20's at the
same budget: how much of the full-draft gate an anytime gate keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ragate.errors import RagateError
from ragate.eval.sweep import finite_scores, point
from ragate.eval.thresholds import check_budget_value, threshold_for_budget

FULL_PREFIX = 20  # TARG's k (section 3.3); ragate's anytime gates read 5 or 10
ANYTIME_GATES = ("targ-entropy", "targ-margin")
ANYTIME_PREFIXES = (5, 10)


def prefix_method(gate: str, k: int) -> str:
    """The method reading ``gate`` (targ-entropy or targ-margin) after ``k`` draft tokens."""
    if gate not in ANYTIME_GATES:
        raise RagateError(
            f"--prefixes reads TARG's entropy or margin gate after k tokens, not {gate!r}: use "
            f"{' or '.join(ANYTIME_GATES)}"
        )
    if k == FULL_PREFIX:
        return gate
    if k not in ANYTIME_PREFIXES:
        shown = ", ".join(str(p) for p in (*ANYTIME_PREFIXES, FULL_PREFIX))
        raise RagateError(f"prefix length {k} has no gate: choose k from {shown}")
    return f"{gate}@k={k}"


def parse_prefixes(text: str) -> tuple[int, ...]:
    """``"5,10,20"`` as (5, 10, 20); a malformed list is a RagateError naming the accepted form."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise RagateError(
            f"--prefixes takes comma-separated k values such as 5,10,20, not {text!r}"
        ) from None
    if not values or len(set(values)) != len(values):
        raise RagateError(f"--prefixes takes distinct k values such as 5,10,20, not {text!r}")
    return values


def choose_prefix(
    records: Sequence[dict[str, Any]], gate: str, prefixes: Sequence[int], budget: float, metric: str = "em"
) -> dict[str, Any]:
    """Per k: tau_k, the dev rate and ``metric`` at ``budget``, agreement with k = 20 (when 20 is in the grid);
    and the chosen row. ``records`` are a sweep's (``ragate.eval.sweep``) with every variant scored."""
    check_budget_value(budget)
    methods = {k: prefix_method(gate, k) for k in prefixes}
    rows = [r for r in records if all(m in r.get("gates", {}) for m in methods.values())]
    if not rows:
        missing = [m for m in methods.values() if not any(m in r.get("gates", {}) for r in records)]
        raise RagateError(
            f"the sweep scored no question with every gate of the grid (missing: {', '.join(missing) or 'none'}): "
            f"resume it with --methods {','.join(methods.values())}"
        )
    table: list[dict[str, Any]] = []
    decided: dict[int, list[bool]] = {}
    for k, method in methods.items():
        scores = finite_scores([r["gates"][method]["score"] for r in rows])
        tau = threshold_for_budget(scores, budget)
        decided[k] = [s > tau for s in scores]
        at = point(rows, decided[k])  # the sweep's exact lookup: retrieval answer above tau_k, closed-book below
        table.append({"k": k, "method": method, "tau": tau, "retrieval_rate": at["retrieval_rate"], metric: at[metric]})
    if FULL_PREFIX in decided:
        full = decided[FULL_PREFIX]
        for row in table:
            same = sum(a == b for a, b in zip(decided[row["k"]], full, strict=True))
            row["agreement_with_k20"] = same / len(rows)
    best = max(table, key=lambda row: (row[metric], -row["k"]))
    return {"n": len(rows), "budget": budget, "metric": metric, "prefixes": table, "chosen": best}
