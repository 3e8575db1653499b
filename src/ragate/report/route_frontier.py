"""The routes' frontier: every policy replayed from the records of every route over the same questions, each
row what that policy answered and paid per question (:mod:`ragate.report.routes` holds the table and the
policies, :mod:`ragate.report.route_fit` the cascade with calibrated checks)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ragate.report.route_fit import calibrated_cascade
from ragate.report.routes import (
    DEFAULT_TARGETS,
    RouteTable,
    Row,
    adaptive_rag,
    cascade,
    cross_fitted,
    learned,
    oracle,
    outcome,
)


def frontier(
    table: RouteTable,
    metric: str = "em",
    *,
    targets: Sequence[float] = DEFAULT_TARGETS,
    seed: int = 0,
) -> list[Row]:
    """Every fixed route, the cascade on agreement alone, the cross-fitted cascade at each target (where the
    records hold log-probabilities), the same with the evidence check (where the records hold ``supported``), the
    cascade whose checks a fit per stage combines (:mod:`ragate.report.route_fit`; where they hold log-probabilities),
    the learned policy and Adaptive-RAG's question classifier (cross-fitted) and the oracle."""
    n = len(table)
    rows = [
        outcome(table, f"always {r}", np.full(n, j), metric, pays="taken") for j, r in enumerate(table.routes)
    ]
    never = [-math.inf] * (len(table.routes) - 1)
    rows.append(outcome(table, "cascade: agreement", cascade(table, never), metric, pays="every"))
    last = float(table.costs["retrievals"][:, -1].mean())
    for evidence in (False, True) if table.has_evidence else (False,):
        for share in targets:
            name = f"cascade: NLL + agreement{' + evidence' if evidence else ''}, ≤ {share:g} × {table.routes[-1]}'s retrievals"
            if not table.has_nll:
                rows.append(Row(name, np.full(n, -1), np.full(n, np.nan), {}, "no log-probabilities in the records"))
                continue
            taken = cross_fitted(table, share * last, metric, seed=seed, evidence=evidence)
            rows.append(outcome(table, name, taken, metric, pays="every", note="thresholds cross-fitted"))
    if table.has_nll:  # the checks combined by a fit per stage (ragate.report.route_fit)
        for share in targets:
            name = f"cascade: calibrated checks, ≤ {share:g} × {table.routes[-1]}'s retrievals"
            taken = calibrated_cascade(table, metric, share * last, seed=seed)
            rows.append(outcome(table, name, taken, metric, pays="every", note="fits and thresholds cross-fitted"))
    for share in targets:
        name = f"learned: P(right) of each route − λ·retrievals, ≤ {share:g} × {table.routes[-1]}'s retrievals"
        taken = learned(table, metric, share * last, seed=seed)
        rows.append(outcome(table, name, taken, metric, pays="first", note="cross-fitted"))
    rows.append(outcome(table, "adaptive-rag: question classifier", adaptive_rag(table, metric, seed=seed), metric,
                        pays="taken", note="cross-fitted"))  # fmt: skip
    rows.append(outcome(table, "oracle (cheapest right route)", oracle(table, metric), metric, pays="taken"))
    return rows
