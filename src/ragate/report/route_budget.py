"""A route cascade's stop thresholds for a budget in mean retrievals per question, chosen from an eval run that
answered every question with every route (no model call), saved as a calibration file for the route method.

A route's answer to a question does not depend on the other routes, so the run's records hold what any cascade
would answer and pay (:mod:`ragate.report.routes`). :func:`route_calibration` tunes one NLL stop threshold per
stage (:func:`ragate.report.routes.tune_stops`: the most accurate cascade whose mean retrievals, paying for every
route it ran, stay within the budget) over all the run's questions, the thresholds to serve with. How well such
thresholds carry to other questions is what ``ragate report RUN --routes ...`` measures (cross-fitted, with
intervals); the file records the in-sample accuracy and cost only as what the thresholds did where they were
chosen.

A budget the routes cannot reach is refused, naming the range: below the cheapest cascade (every stage stopping
wherever its answer's NLL is recorded and its evidence allows) or above the dearest (no stage stopping on NLL, so
only agreement stops). ``ragate calibrate --gate route --from-sweep RUN --budget B`` writes the file;
``ragate ask/serve --calibration FILE`` and ``Pipeline(method="route", calibration=FILE)`` serve with it
(:func:`ragate.methods.route.with_calibration`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragate.errors import RagateError
from ragate.report.routes import RouteTable, cascade, outcome, read_route_table, tune_stops


def reach(table: RouteTable, *, agree: bool = True, evidence: bool = True) -> tuple[float, float]:
    """The least and the most mean retrievals per question a cascade over ``table``'s routes can spend: every
    stage stopping wherever its checks allow (thresholds +inf), and no stage stopping on NLL (thresholds -inf)."""
    stages = len(table.routes) - 1
    spent = []
    for stop in (math.inf, -math.inf):
        taken = cascade(table, (stop,) * stages, agree=agree, evidence=evidence)
        spent.append(float(outcome(table, "", taken, "em", pays="every").costs["retrievals"].mean()))
    return spent[0], spent[1]


def route_calibration(
    table: RouteTable, budget: float, metric: str = "em", *, agree: bool = True, evidence: bool = True
) -> dict[str, Any]:
    """The calibration of the route method over ``table``'s routes for at most ``budget`` mean retrievals per
    question: its stop thresholds (None: that stage never stops on NLL), the checks they were tuned with, and
    what they did on these questions (accuracy, mean retrievals) beside the routes' reach."""
    if not (isinstance(budget, int | float) and math.isfinite(budget) and budget >= 0):
        raise RagateError(f"--budget is mean retrievals per question for a route method, not {budget!r}: e.g. 0.8")
    low, high = reach(table, agree=agree, evidence=evidence)
    spend = f"over {len(table)} questions these routes ({', '.join(table.routes)}) spend {low:.2f} to {high:.2f} "
    if budget < low - 1e-9:
        raise RagateError(
            f"a budget of {budget:g} retrievals per question is below what the routes can reach: {spend}"
            f"retrievals per question; give --budget {low:.2f} or more, or put a closed-book route first"
        )
    if budget > high + 1e-9:
        raise RagateError(
            f"a budget of {budget:g} retrievals per question is above what the routes can reach: {spend}"
            f"retrievals per question (the dearest cascade stops on agreement alone); give --budget {high:.2f} or "
            f"less, or answer every question with the last route (--method {table.routes[-1]})"
        )
    stops = tune_stops(table, budget, metric, agree=agree, evidence=evidence)
    row = outcome(table, "", cascade(table, stops, agree=agree, evidence=evidence), metric, pays="every")
    return {
        "method": "route", "objective": "budget", "routes": list(table.routes),
        "stops": [s if math.isfinite(s) else None for s in stops], "agree": agree, "evidence": evidence,
        "budget": float(budget), "metric": metric, "n": len(table),
        "dev_score": float(row.score.mean()), "dev_retrievals": float(row.costs["retrievals"].mean()),
        "reach": [low, high],
    }  # fmt: skip


def calibrate_routes(
    run_dirs: Sequence[str | Path], routes: Sequence[str], budget: float, metric: str = "em"
) -> dict[str, Any]:
    """:func:`route_calibration` over the records of eval runs (the first run's model and engine recorded, as a
    calibration of that model; runs of another model are refused)."""
    from ragate.eval.rundir import read_run_config
    from ragate.methods.route import route_specs
    from ragate.methods.spec import RouteSpec

    route_specs(RouteSpec(tuple(routes)))  # unknown, repeated or misordered routes: refused before reading
    configs = [read_run_config(Path(d)) for d in run_dirs]
    models = {(c.get("model"), c.get("engine", "llama.cpp")) for c in configs}
    if len(models) > 1:
        raise RagateError(
            f"the runs answered with different models ({', '.join(f'{m} on {e}' for m, e in sorted(models, key=str))}): "
            "stop thresholds belong to one model; give runs of one model"
        )
    table = read_route_table(run_dirs, routes)
    found = route_calibration(table, budget, metric)
    model, engine = models.pop()
    return found | {"dev": " + ".join(str(d) for d in run_dirs), "model": model, "engine": engine, "source": "run"}
