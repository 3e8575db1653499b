"""A route cascade's stop thresholds for a budget in mean retrievals per question, chosen from an eval run that
answered every question with every route (no model call), saved as a calibration file for the route method.

A route's answer to a question does not depend on the other routes, so the run's records hold what any cascade
would answer and pay (:mod:`ragate.report.routes`). :func:`route_calibration` tunes one NLL stop threshold per
stage (:func:`ragate.report.routes.tune_stops`: the most accurate cascade whose mean retrievals, paying for every
route it ran, stay within the budget) over all the run's questions, the thresholds to serve with. How well such
thresholds carry to other questions is what ``ragate report RUN --routes ...`` measures (cross-fitted, with
intervals); the file records the in-sample accuracy and cost only as what the thresholds did where they were
chosen.

Records without log-probabilities (runs before stages kept them) cannot tune an NLL threshold and are refused;
records without ``supported`` (runs before 2026-12-05) tune, and save, a cascade without the evidence check. A
budget the routes cannot reach is refused, naming the range: below the cheapest cascade (every stage stopping
wherever its answer's NLL is recorded and its evidence allows) or above the dearest (no stage stopping on NLL, so
only agreement stops). The other two policies (:mod:`ragate.methods.route_policy`) are fitted on every question
the same way: ``adaptive-rag``'s question classifier (no budget), the ``learned`` policy's per-route fits and the
lambda whose choices stay within the budget (its reach: the first route alone, to the first and the dearest).
``ragate calibrate --gate route [--policy P] --from-sweep RUN --budget B`` writes the file;
``ragate ask/serve --calibration FILE`` and ``Pipeline(method="route", calibration=FILE)`` serve with it
(:func:`ragate.methods.route.with_calibration`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.methods.route_policy import adaptive_choice, learned_values
from ragate.methods.spec import POLICY_NAMES
from ragate.report.route_fit import checked, fit_calibrated, stage_p
from ragate.report.routes import (
    Pays,
    RouteTable,
    cascade,
    fit_adaptive,
    fit_learned,
    learned_x,
    outcome,
    read_route_table,
    tune_stops,
)


def spent(table: RouteTable, taken: np.ndarray, pays: Pays) -> float:
    """Mean retrievals per question of the routes ``taken``, paid as ``pays`` says (:func:`outcome`)."""
    return float(outcome(table, "", taken, "em", pays=pays).costs["retrievals"].mean())


def reach(table: RouteTable, *, agree: bool = True, evidence: bool = False) -> tuple[float, float]:
    """The least and the most mean retrievals per question a cascade over ``table``'s routes can spend: every
    stage stopping wherever its checks allow (thresholds +inf), and no stage stopping on NLL (thresholds -inf)."""
    stages = len(table.routes) - 1
    low, high = (spent(table, cascade(table, (stop,) * stages, agree=agree, evidence=evidence), "every")
                 for stop in (math.inf, -math.inf))  # fmt: skip
    return low, high


def policy_reach(table: RouteTable) -> tuple[float, float]:
    """The least and the most mean retrievals per question the learned policy can spend: the first route always
    runs, then one route (itself, or another)."""
    costs = [spent(table, np.full(len(table), j), "first") for j in range(len(table.routes))]
    return min(costs), max(costs)


def _check_budget(table: RouteTable, budget: float, low: float, high: float, dearest: str) -> None:
    """Refuse a budget outside the routes' reach as printed (two decimals: the range's ends as printed are
    accepted; the cheapest choice then spends its own least)."""
    spend = f"over {len(table)} questions these routes ({', '.join(table.routes)}) spend {low:.2f} to {high:.2f} "
    if budget < min(low, round(low, 2)) - 1e-9:
        raise RagateError(
            f"a budget of {budget:g} retrievals per question is below what the routes can reach: {spend}"
            f"retrievals per question; give --budget {low:.2f} or more, or put a closed-book route first"
        )
    if budget > max(high, round(high, 2)) + 1e-9:
        raise RagateError(
            f"a budget of {budget:g} retrievals per question is above what the routes can reach: {spend}"
            f"retrievals per question ({dearest}); give --budget {high:.2f} or less, or answer every question "
            f"with the last route (--method {table.routes[-1]})"
        )


def route_calibration(
    table: RouteTable,
    budget: float | None,
    metric: str = "em",
    *,
    policy: str = "cascade",
    agree: bool = True,
    evidence: bool = False,
) -> dict[str, Any]:
    """The calibration of the route method over ``table``'s routes: for the cascade (at most ``budget`` mean
    retrievals per question) its stop thresholds (None: that stage never stops on NLL) and the checks they were
    tuned with; for ``adaptive-rag`` (no budget) its question classifier; for ``learned`` (a budget) its fits and
    lambda; and what the policy did on these questions (accuracy, mean retrievals) beside the routes' reach."""
    if policy == "adaptive-rag":
        if budget is not None:
            raise RagateError("adaptive-rag has no budget: its classifier chooses from the question alone; drop --budget")
        model = fit_adaptive(table, metric)
        taken = adaptive_choice(model, table.question_x)[0] if len(table) else np.zeros(0, dtype=int)
        return _policy_file(table, model.to_json(), policy, metric, outcome(table, "", taken, metric, pays="taken"))
    if not (isinstance(budget, int | float) and math.isfinite(budget) and budget >= 0):
        raise RagateError(f"--budget is mean retrievals per question for a route method, not {budget!r}: e.g. 0.8")
    if policy == "learned":
        low, high = policy_reach(table)
        _check_budget(table, budget, low, high, "the first route, then the dearest")
        fitted = fit_learned(table, metric, budget)
        taken = np.argmax(learned_values(fitted, learned_x(table)), axis=1)
        row = outcome(table, "", taken, metric, pays="first")
        return _policy_file(table, fitted.to_json(), policy, metric, row) | {"budget": float(budget), "reach": [low, high]}
    if policy == "calibrated":
        # every question stopping at the first route, and none stopping before the last
        low, high = (spent(table, np.full(len(table), j), "every") for j in (0, len(table.routes) - 1))
        _check_budget(table, budget, low, high, "no stage stopping")
        fitted = fit_calibrated(table, metric, budget)
        taken = checked(stage_p(table, list(fitted.right)), fitted.stops, len(table.routes) - 1)
        row = outcome(table, "", taken, metric, pays="every")
        return _policy_file(table, fitted.to_json(), policy, metric, row) | {"budget": float(budget), "reach": [low, high]}
    if policy != "cascade":
        raise RagateError(f"unknown route policy {policy!r}: {POLICY_NAMES}")
    if not table.has_nll:
        raise RagateError(
            f"the records of {', '.join(table.routes[:-1])} hold no log-probabilities, so no NLL stop threshold can "
            "be tuned: answer the questions again with this ragate (ragate eval --methods "
            f"{','.join(table.routes)}; its records keep each stage's log-probability), on a backend that gives them"
        )
    evidence = evidence and table.has_evidence  # tuned without a check the records cannot replay: served without it
    low, high = reach(table, agree=agree, evidence=evidence)
    dearest = "the dearest cascade stops on agreement alone" if agree else "the dearest cascade runs every route"
    _check_budget(table, budget, low, high, dearest)
    stops = tune_stops(table, budget, metric, agree=agree, evidence=evidence)
    row = outcome(table, "", cascade(table, stops, agree=agree, evidence=evidence), metric, pays="every")
    return {
        "method": "route", "policy": "cascade", "objective": "budget", "routes": list(table.routes),
        "stops": [s if math.isfinite(s) else None for s in stops], "agree": agree, "evidence": evidence,
        "budget": float(budget), "metric": metric, "n": len(table),
        "dev_score": float(row.score.mean()), "dev_retrievals": float(row.costs["retrievals"].mean()),
        "reach": [low, high],
    }  # fmt: skip


def _policy_file(table: RouteTable, fitted: dict[str, Any], policy: str, metric: str, row: Any) -> dict[str, Any]:
    return {
        "method": "route", "policy": policy, "routes": list(table.routes), **fitted, "metric": metric,
        "n": len(table), "dev_score": float(row.score.mean()) if len(table) else 0.0,
        "dev_retrievals": float(row.costs["retrievals"].mean()) if len(table) else 0.0,
    }  # fmt: skip


def calibrate_routes(
    run_dirs: Sequence[str | Path],
    routes: Sequence[str],
    budget: float | None,
    metric: str = "em",
    *,
    policy: str = "cascade",
    agree: bool = True,
    evidence: bool = False,
) -> dict[str, Any]:
    """:func:`route_calibration` over the records of eval runs (the first run's model and engine recorded, as a
    calibration of that model; runs of another model are refused)."""
    from ragate.eval.rundir import read_run_config
    from ragate.eval.thresholds import model_name
    from ragate.methods.route import route_specs
    from ragate.methods.spec import RouteSpec

    route_specs(RouteSpec(tuple(routes)))  # unknown, repeated or misordered routes: refused before reading
    configs = [read_run_config(Path(d)) for d in run_dirs]
    models = {(model_name(c.get("model"), c.get("engine", "llama.cpp")), c.get("engine", "llama.cpp")) for c in configs}
    if len(models) > 1:
        raise RagateError(
            f"the runs answered with different models ({', '.join(f'{m} on {e}' for m, e in sorted(models, key=str))}): "
            "stop thresholds belong to one model; give runs of one model"
        )
    table = read_route_table(run_dirs, routes)
    found = route_calibration(table, budget, metric, policy=policy, agree=agree, evidence=evidence)
    model, engine = models.pop()
    return found | {"dev": " + ".join(str(d) for d in run_dirs), "model": model, "engine": engine, "source": "run"}
