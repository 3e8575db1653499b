"""The learned route policy fitted on labelled traffic (issue 78: labels per route from traffic), as a route
calibration file that ``Pipeline(method="route", calibration=FILE)`` and ``ragate serve --calibration`` answer with.

A feedback store keeps, with each route answer, its two paths: the closed-book route's answer and the
one-retrieval route's (:func:`ragate.learning.learner.route_answers`), and the first route's answer NLL and tokens
(:func:`first_answer_features`; what the learned policy reads once the first route has answered). A reference on
the answer (``Pipeline.feedback(answer, reference=...)``, ``POST /v1/feedback``) labels both paths (``closed-wrong``,
``retrieved-wrong``), shadow work answering the one the cascade did not run. Where both are labelled, the answer is a
row of a route table of those two routes (:class:`ragate.report.routes.RouteTable`: scores from the labels, the
closed-book route 0 retrievals and the one-retrieval route 1), and :func:`ragate.report.route_budget.route_calibration`
fits the learned policy on it exactly as it does on an eval run's records. The store does not record which routes
answered: it is the store of one route pipeline, whose routes are the ones given here (``ragate calibrate --gate route --policy
learned --from-store FILE --budget B``; :func:`calibrate_routes_from_store`). Traffic labels no multi-step route:
the policy routes between the two paths (a policy over more routes is fitted from a run of every route,
``--from-sweep``).

Put in force by the pipeline that kept the answers (``Pipeline.learn_routes(use=True)``, ``ragate serve
--refit-every N`` on a route method; shadow work on, so that the answers stopped closed-book get both labels), a
new fit is first compared with the decisions the policy in force made on the labelled answers it decided (each
answer keeps its policy's digest, :func:`policy_digest`), as a learned gate is compared with the gate in force
(:class:`ragate.learning.fit.Comparison`): the policy in force stopped some answers at the closed-book route; the
new policy, cross-fitted on halves of those answers, stops as many (those where its P(right) of the closed-book
route most exceeds the one-retrieval route's), and the two are scored by the paths they end on. Stopping as many,
the two spend the same retrievals, so the paired difference in EM says which picks better
(:func:`learn_from_traffic`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.learning.fit import MIN_COMPARED, Paired, gap_verdict
from ragate.learning.store import FeedbackRules
from ragate.methods.spec import RouteSpec
from ragate.methods.trace import RouteInfo
from ragate.report.routes import RouteTable

FIRST_NLL, FIRST_TOKENS = "route_first_nll", "route_first_tokens"  # the store's names of the first answer's features
DECIDED_BY = "route_policy:"  # an answer's features keep "route_policy:DIGEST" of the policy that chose its route
MIN_ROWS = 20  # answers with both paths labelled before a policy is fitted


def policy_digest(route: RouteSpec) -> str:
    """The digest of a route policy's decisions: its routes, policy, stop thresholds, checks and fitted model
    (not the learned policy's lambda, which a live budget moves); kept with each answer (:data:`DECIDED_BY`) so a
    new fit is compared with the decisions of the policy in force only."""
    from ragate.state.route_budget import fit_digest

    stops = None if route.stop_nll is None else [s if math.isfinite(s) else str(s) for s in route.stop_nll]
    fit = {"routes": list(route.routes), "policy": route.policy, "stops": stops, "agree": route.agree,
           "evidence": route.evidence, "model": None if route.model is None else fit_digest(route.model)}  # fmt: skip
    return hashlib.sha256(json.dumps(fit, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Traffic:
    """The store's labelled route answers as a route table (oldest first), the (model, engine) pairs that answered
    them, and for each one whether the policy that answered it stopped closed-book and that policy's digest (None
    where the store did not keep it)."""

    table: RouteTable
    models: set[tuple[str, str]]
    stopped: np.ndarray
    decided_by: tuple[str | None, ...]


def first_answer_features(info: RouteInfo | None, first: str) -> dict[str, float]:
    """The first route's answer NLL (where there is one) and tokens, as the store keeps them with a route answer;
    none where the first route did not answer first (Adaptive-RAG's classifier may skip it)."""
    if info is None or not info.ran or info.ran[0] != first or not info.tokens:
        return {}
    nll = info.nll[0] if info.nll else None
    return {FIRST_TOKENS: float(info.tokens[0]), **({FIRST_NLL: float(nll)} if nll is not None and math.isfinite(nll) else {})}


def traffic_route_table(store: FeedbackRules, routes: Sequence[str]) -> Traffic:
    """The route table of the store's answers whose two paths are both labelled and that keep the first answer's
    features, oldest first (``routes``: the closed-book route and the one-retrieval route, in that order), with
    what answered them (:class:`Traffic`), read once."""
    closed, opened = store.labelled("closed-wrong"), store.labelled("retrieved-wrong")
    open_wrong = dict(zip(opened.ids, opened.y.tolist(), strict=True))
    rows, models, stopped, decided_by = [], set(), [], []
    for answer_id, question, features, wrong in zip(closed.ids, closed.questions, closed.features, closed.y.tolist(), strict=True):
        row = store.get(answer_id) if answer_id in open_wrong and FIRST_TOKENS in features else None
        if row is not None and row.closed_answer is not None and row.open_answer is not None:
            rows.append((answer_id, question, features, row.closed_answer, row.open_answer, wrong, open_wrong[answer_id]))
            models.add((str(row.model.get("model")), str(row.model.get("engine", "llama.cpp"))))
            stopped.append(not row.retrieved)
            decided_by.append(next((k[len(DECIDED_BY) :] for k in row.features if k.startswith(DECIDED_BY)), None))
    n = len(rows)
    right = np.array([[not r[5], not r[6]] for r in rows], dtype=float).reshape(n, 2)
    tokens = np.array([[r[2][FIRST_TOKENS], math.nan] for r in rows], dtype=float).reshape(n, 2)
    table = RouteTable(
        tuple(routes), tuple(r[0] for r in rows), tuple(r[1] for r in rows), ("traffic",) * n,
        tuple((r[3], r[4]) for r in rows), {"em": right, "f1": right, "acc": right},
        {"retrievals": np.tile([0.0, 1.0], (n, 1)), "lm_calls": np.full((n, 2), math.nan), "tokens": tokens,
         "seconds": np.full((n, 2), math.nan)},
        np.array([[r[2].get(FIRST_NLL, math.nan), math.nan] for r in rows], dtype=float).reshape(n, 2),
        np.full((n, 2), math.nan),
    )  # fmt: skip
    return Traffic(table, models, np.array(stopped, dtype=bool), tuple(decided_by))


def calibrate_routes_from_store(store: FeedbackRules, routes: Sequence[str], budget: float) -> dict[str, Any]:
    """The learned route policy's calibration over the store's labelled route answers (see the module docstring),
    for ``budget`` mean retrievals per question, as a calibration of the model that answered them; refused, naming
    the fix, below :data:`MIN_ROWS` labelled answers or where several models answered them."""
    check_traffic_routes(routes)
    return _fit(traffic_route_table(store, routes), store.name, budget)


def learn_from_traffic(
    store: FeedbackRules, routes: Sequence[str], budget: float, *, in_force: str, first: bool
) -> dict[str, Any]:
    """:func:`calibrate_routes_from_store`, read once, with its comparison (``compared``) with the policy in force
    (``in_force``: its :func:`policy_digest`) over the labelled answers that policy decided
    (:func:`compare_with_in_force`): the comparison, ``earns`` and a ``summary``. Where none can be made (that policy
    stopped, or went on for, fewer than 3 of them), it earns its place only as the ``first`` policy fitted on
    traffic: a fitted policy in force is replaced only by one shown to pick as well."""
    check_traffic_routes(routes)
    traffic = traffic_route_table(store, routes)
    found = _fit(traffic, store.name, budget)
    mine = np.array([d == in_force for d in traffic.decided_by], dtype=bool)
    rows = np.flatnonzero(mine)
    compared = compare_with_in_force(traffic.table.take(rows), traffic.stopped[rows]) if len(rows) else None
    if compared is not None:
        return found | {"compared": compared.as_dict() | {"summary": compared.summary()}}
    stopped = int(traffic.stopped[rows].sum())
    head = "it goes in force, the first policy fitted on traffic" if first else (
        "it stays a candidate: the policy fitted on traffic in force is replaced only by one shown to pick as well")
    return found | {"compared": {"n": len(rows), "stopped": stopped, "earns": first, "summary": (
        f"no comparison with the route policy in force yet (of these labelled answers it decided {len(rows)}, "
        f"{stopped} stopped closed-book; a comparison needs 3 stopped and 3 not): {head}")}}  # fmt: skip


def check_traffic_routes(routes: Sequence[str]) -> None:
    """Traffic labels two paths: the routes must be a closed-book route and a one-retrieval route, in that order."""
    if len(routes) != 2:
        raise RagateError(
            f"traffic labels two routes, the closed-book route's answer and the one-retrieval route's: give those two "
            f"(--routes CLOSED,ONE-RETRIEVAL), not {len(routes)}; a policy over more routes is fitted from a run of "
            "every route (--from-sweep RUN)"
        )
    from ragate.methods.route import route_cost, route_specs

    if [route_cost(s) for s in route_specs(RouteSpec(tuple(routes)))] != [0, 1]:
        raise RagateError(
            f"the store's two paths are a closed-book route's answer and a one-retrieval route's: {', '.join(routes)} "
            "are not (e.g. --routes no-retrieval,standard-rag or wo-rag,single-rag)"
        )


def _fit(traffic: Traffic, name: str, budget: float) -> dict[str, Any]:
    from ragate.report.route_budget import route_calibration

    table, models = traffic.table, set(traffic.models)
    if len(table) < MIN_ROWS:
        raise RagateError(
            f"{name} holds {len(table)} route answers with both paths labelled; the route policy needs "
            f"{MIN_ROWS} (give {MIN_ROWS - len(table)} more references: Pipeline.feedback(answer, reference=...) or "
            "POST /v1/feedback on route answers, with shadow work on so the path not run is answered)"
        )
    if len(models) > 1:
        raise RagateError(
            f"{name}'s labelled route answers come from several models ({', '.join(f'{m} on {e}' for m, e in sorted(models))}): "
            "a route policy belongs to one model; learn from a store of one model's answers"
        )
    model, engine = models.pop()
    found = route_calibration(table, budget, "em", policy="learned")
    return found | {"source": "traffic", "dev": name, "model": model, "engine": engine}


@dataclass(frozen=True)
class RouteComparison(Paired):
    """A traffic-fitted route policy against the decisions of the route method in force on the same labelled
    answers, ``stopped`` of which it stopped at the closed-book route: each one's EM over the paths it ends on
    (the new policy cross-fitted and stopping as many) and the paired difference (:class:`ragate.learning.fit.Paired`)."""

    stopped: int = 0

    def summary(self) -> str:
        head = "it earns its place" if self.earns else "it picks worse: the policy in force stays"
        return (
            f"against the route policy in force on {self.n} labelled answers ({self.stopped} stopped closed-book by "
            f"each): EM {100 * self.learned:.1f} vs {100 * self.in_force:.1f}, paired {100 * self.gap[0]:+.1f} "
            f"[{100 * self.gap[1]:+.1f}, {100 * self.gap[2]:+.1f}] points ({gap_verdict(self.gap)}): {head}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n, "stopped": self.stopped, "learned_em": round(self.learned, 4),
            "in_force_em": round(self.in_force, 4), "gap": [round(v, 4) for v in self.gap], "earns": self.earns,
        }  # fmt: skip


def compare_with_in_force(
    table: RouteTable, stopped: np.ndarray, *, seed: int = 0, samples: int = 1000, interval_seed: int | None = None
) -> RouteComparison | None:
    """The learned policy fitted on one half of ``table``'s answers (:func:`ragate.report.routes.fit_learned`)
    stopping, on the other half and then the reverse, the answers where P(closed-book right) - P(one retrieval
    right) is highest, as many in all as the policy in force stopped (``stopped``, one flag per row), against the
    policy in force's own stops; None where it stopped, or went on for, fewer than
    :data:`ragate.learning.fit.MIN_COMPARED` answers (no rate at which to compare them). ``seed`` splits the halves
    and, unless ``interval_seed`` is given, seeds the bootstrap of ``samples`` resamples."""
    from ragate.eval.metrics import paired_bootstrap_diff
    from ragate.methods.route_policy import right_probabilities
    from ragate.report.routes import fit_learned, halves, learned_x

    stops = np.asarray(stopped, dtype=bool)
    n, k = len(table), int(stops.sum())
    if min(k, n - k) < MIN_COMPARED:
        return None
    x, right = learned_x(table), table.scores["em"] > 0
    margin = np.zeros(n)
    for scored, trained in halves(n, seed):
        p = right_probabilities(fit_learned(table.take(trained), "em", 1.0), x[scored])
        margin[scored] = p[:, 0] - p[:, 1]
    mine = np.zeros(n, dtype=bool)
    mine[np.argsort(-margin, kind="stable")[:k]] = True
    ours = np.where(mine, right[:, 0], right[:, 1]).astype(float)
    theirs = np.where(stops, right[:, 0], right[:, 1]).astype(float)
    low, high = paired_bootstrap_diff(
        ours.tolist(), theirs.tolist(), samples=samples, seed=seed if interval_seed is None else interval_seed
    )
    return RouteComparison(n, float(ours.mean()), float(theirs.mean()), (float((ours - theirs).mean()), low, high), stopped=k)


def budget_for(budget: float | None, live: object, calibration: dict[str, Any] | None) -> float:
    """The budget a route policy is fitted for: ``budget``, else the live route budget's (``live``, a pipeline's
    budget controller), else the calibration file's in force; refused, naming the fix, where there is none."""
    from ragate.eval.records import is_number
    from ragate.state.route_budget import RouteBudgetController

    if budget is not None:
        return budget
    if isinstance(live, RouteBudgetController):
        return float(live.budget)
    if calibration is not None and is_number(calibration.get("budget")):
        return float(calibration["budget"])
    raise RagateError(
        "give the budget a route policy is fitted for (mean retrievals per question): learn_routes(0.5), or serve a "
        "--calibration file that has one (ragate calibrate --gate route --from-sweep RUN --budget 0.5); this "
        "pipeline holds no live route budget and serves no calibration file with one"
    )


def check_in_force(shadow: bool, budget: float | None, live: object) -> None:
    """What putting a traffic-fitted policy in force needs: shadow work (``shadow``), and no budget other than the
    live route budget's (``live``, a pipeline's budget controller); refused naming the fix."""
    from ragate.state.route_budget import RouteBudgetController

    if not shadow:
        raise RagateError(
            "an answer the policy in force stops closed-book gets its one-retrieval answer, and so both labels, "
            "from shadow work only: without it the policy would be fitted and compared on the answers it sent "
            "on alone; give shadow= (serve --shadow SHARE, e.g. 0.05: references settle the missing path first)"
        )
    if budget is not None and isinstance(live, RouteBudgetController) and budget != live.budget:
        raise RagateError(
            f"the live route budget holds {live.budget:g} retrievals per question; a policy put in force is fitted "
            f"for it, not {budget:g}: learn_routes(use=True) without a budget (or use=False to keep a file for "
            f"{budget:g})"
        )
