"""The cascade with its checks combined by a calibrated fit (issue 78's ``cascade``): at each stage, P(this route's
answer is right) from everything its answer shows at no model call, and the stage stops where that probability
is at least its threshold, each stage's threshold chosen for a target cost; replayed from records, cross-fitted.

The features of route j's answer (:func:`stage_x`): its normalised NLL (DTR Eqs. 2-3; 0 where none is recorded,
with a column saying whether one is), from the second route on whether it agrees with the route before's
(:func:`ragate.methods.route.answers_agree`), whether the passages it read hold it (``supported``; 0 with a column
saying whether the record says), its words (log) and whether it is empty. A logistic regression per stage
(scikit-learn's, standardised, as every route policy here) gives P(right); the thresholds come from a grid of
each stage's probabilities' quantiles, the most accurate cascade within the target (ties: fewer retrievals).
Both the fits and the thresholds are made on one half of the questions and scored on the other
(:func:`ragate.report.routes.halves`).
"""

from __future__ import annotations

import math

import numpy as np

from ragate.methods.route_policy import Linear, RoutePolicyModel, stage_vector
from ragate.report.routes import GRID, RouteTable, _classifier, combinations, halves, most_accurate_within


def stage_x(table: RouteTable, j: int) -> np.ndarray:
    """The features of route ``j``'s answer to each question, as the live cascade reads them
    (:func:`ragate.methods.route_policy.stage_vector`)."""
    rows = []
    for i, answers in enumerate(table.answers):
        nll, found = table.nll[i, j], table.supported[i, j]
        rows.append(stage_vector(nll if math.isfinite(nll) else None, answers[j], answers[j - 1] if j else None,
                                 None if math.isnan(found) else bool(found)))  # fmt: skip
    return np.array(rows, dtype=float).reshape(len(table), -1)


def fit_stages(table: RouteTable, metric: str) -> list[Linear | float]:
    """Per stage (every route but the last), P(right) of its answer: a logistic fit, or the constant share right
    where the questions hold one outcome."""
    right = table.scores[metric] > 0
    fits: list[Linear | float] = []
    for j in range(len(table.routes) - 1):
        y = right[:, j]
        if len(np.unique(y)) < 2:
            fits.append(float(y.mean()) if len(y) else 0.0)
        else:
            fits.append(Linear.from_sklearn(_classifier().fit(stage_x(table, j), y)))
    return fits


def stage_p(table: RouteTable, fits: list[Linear | float]) -> np.ndarray:
    """P(right) of each stage's answer to each question, (n, stages)."""
    return np.column_stack([
        np.full(len(table), f) if isinstance(f, float) else f.probabilities(stage_x(table, j))[:, 1]
        for j, f in enumerate(fits)
    ])  # fmt: skip


def checked(p: np.ndarray, stops: tuple[float, ...], last: int) -> np.ndarray:
    """The route taken: the first stage whose P(right) is at least its threshold, the last route otherwise."""
    taken = np.full(len(p), last)
    for j in reversed(range(p.shape[1])):
        taken = np.where(p[:, j] >= stops[j], j, taken)
    return taken


def tune(table: RouteTable, p: np.ndarray, target: float, metric: str) -> tuple[float, ...]:
    """The thresholds whose cascade on ``table`` is the most accurate with mean retrievals at most ``target``
    (ties: fewer retrievals); inf: that stage never stops. Nothing within: stop at every stage (0: a probability
    is at least 0; -inf would be written as null, which reads as never stopping)."""
    grids = [[math.inf, *sorted({float(np.quantile(p[:, j], q)) for q in GRID})] for j in range(p.shape[1])]
    last = len(table.routes) - 1
    best = most_accurate_within(table, combinations(grids), lambda stops: checked(p, stops, last), target, metric,
                                pays="every")  # fmt: skip
    return best if best is not None else (0.0,) * p.shape[1]


def fit_calibrated(table: RouteTable, metric: str, target: float) -> RoutePolicyModel:
    """The calibrated cascade fitted on every question of ``table``: the stage fits and the thresholds for
    ``target`` mean retrievals (what ``ragate calibrate --gate route --policy calibrated`` saves)."""
    fits = fit_stages(table, metric)
    return RoutePolicyModel("calibrated", right=tuple(fits), stops=tune(table, stage_p(table, fits), target, metric))


def calibrated_cascade(table: RouteTable, metric: str, target: float, *, seed: int = 0) -> np.ndarray:
    """Each question's route under the stage fits and thresholds made on the other half of the questions."""
    last = len(table.routes) - 1
    taken = np.full(len(table), last)
    for scored, trained in halves(len(table), seed):
        if not len(scored) or not len(trained):
            continue
        train = table.take(trained)
        fits = fit_stages(train, metric)
        stops = tune(train, stage_p(train, fits), target, metric)
        taken[scored] = checked(stage_p(table.take(scored), fits), stops, last)
    return taken
