"""Routes as one method: closed-book, one retrieval or many, chosen per question by a cascade that checks each
route's answer before paying for the next route.

The papers' baselines already hold three routes (closed-book ``wo-rag`` / ``no-retrieval``, one retrieval
``single-rag`` / ``standard-rag``, many ``ircot`` / ``dragin`` / ``etc``), each right on different questions;
Adaptive-RAG (Jeong et al., NAACL 2024) chooses among them from the question alone. The cascade (policy
"cascade") reads each answer instead: it answers with the cheapest route and stops where that answer checks out,
else pays for the next route. Two checks cost no model call: the answer's normalised NLL (DTR Eqs. 2-3,
:attr:`ragate.methods.trace.Trace.answer_nll`) at most the stage's threshold, and, from the second route on, the
answer agreeing with the route before it (PAIRS's agreement, read after the answer rather than before it). A third,
the evidence check (``RouteSpec.evidence``, off by default), vetoes: an answer written from documents stops the
cascade only where it is found whole in them (:func:`ragate.text.supported`, the ``supported`` field of eval
records; a yes/no answer is exempt, as the check says nothing about it). It is off by default because a veto sends
answers on to costlier routes, so under a budget the thresholds must stop more answers closed-book; ``ragate report
RUN --routes ...`` replays the cascade with and without it where the records hold ``supported``.

Two other policies choose from features instead, with a model fitted on records (``RouteSpec.policy``
"adaptive-rag" and "learned", :mod:`ragate.methods.route_policy`; a route calibration file carries them).

:func:`check_routes` refuses, before any model call, routes that are unknown, repeated, in mixed answer formats
(chain-of-thought and single-shot) or not ordered by cost (closed-book, then one retrieval, then many).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ragate.errors import RagateError
from ragate.gates.base import GateDecision
from ragate.methods.route_policy import answers_agree
from ragate.methods.spec import POLICY_NAMES, ROUTE_POLICIES, MethodSpec, RouteSpec
from ragate.methods.trace import RouteCheck, RouteInfo, Trace

COSTS = ("closed-book", "one retrieval", "many retrievals")


def route_cost(spec: MethodSpec) -> int:
    """A route's cost class, the order routes must come in: 0 closed-book, 1 one retrieval (a single-shot method
    that may retrieve, or a dynamic one that retrieves once before writing), 2 many (a dynamic method whose
    trigger retrieves while it writes)."""
    if not spec.retrieves:
        return 0
    if spec.dynamic is not None and spec.dynamic.trigger != "none":
        return 2
    return 1


def route_specs(route: RouteSpec) -> list[MethodSpec]:
    """The routes' methods, checked (:func:`check_routes`), with the answer length and number of documents the
    route method sets (``RouteSpec.max_tokens``, ``RouteSpec.k``), where it sets them."""
    from ragate.methods.registry import get_method

    if route.policy not in ROUTE_POLICIES:
        raise RagateError(f"unknown route policy {route.policy!r}: {POLICY_NAMES}")
    if route.policy != "cascade" and route.model is None:
        raise RagateError(
            f"route policy {route.policy!r} chooses with a fitted model: ragate calibrate --gate route --policy "
            f"{route.policy} --from-sweep RUN, then --calibration FILE (Pipeline(calibration=FILE))"
        )
    specs = [get_method(name) for name in route.routes]
    check_routes(specs, route)
    return [s.with_limits(route.max_tokens, route.k) for s in specs]


def check_routes(specs: list[MethodSpec], route: RouteSpec) -> None:
    """Refuse, naming the fix: fewer than two routes, a route repeated or itself a route method, routes in two
    answer formats, routes not ordered by cost, or stop thresholds that do not match the stages."""
    names = [s.name for s in specs]
    if len(specs) < 2:
        raise RagateError(f"a route method needs two routes or more, cheapest first (got {names})")
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise RagateError(f"route {twice[0]!r} is given twice: each route once, cheapest first")
    if nested := [s.name for s in specs if s.route is not None]:
        raise RagateError(f"{nested[0]!r} is itself a route method: give the methods it routes between")
    if len({s.dynamic is not None for s in specs}) > 1:
        cot = [s.name for s in specs if s.dynamic is not None]
        raise RagateError(
            f"routes answer in one format so that their answers compare: {', '.join(cot)} write a chain of thought "
            "and the rest answer directly; route between wo-rag, single-rag and ircot/dragin/etc, or between "
            f"no-retrieval, standard-rag/dtr and a single-shot method (got {names})"
        )
    costs = [route_cost(s) for s in specs]
    for before, after, a, b in zip(names, names[1:], costs, costs[1:], strict=False):
        if b < a:
            raise RagateError(
                f"routes go cheapest first: {after!r} ({COSTS[b]}) comes after {before!r} ({COSTS[a]}); order "
                "them closed-book, then one retrieval, then many"
            )
    if route.stop_nll is not None and len(route.stop_nll) != len(specs) - 1:
        raise RagateError(
            f"{len(specs)} routes have {len(specs) - 1} stop checks (the last route's answer is the answer): give "
            f"{len(specs) - 1} stop thresholds, not {len(route.stop_nll)}"
        )


def with_calibration(spec: MethodSpec, cal: Mapping[str, Any], path: object, *, routes_given: bool) -> MethodSpec:
    """The route method ``spec`` with the stop thresholds and checks of a route calibration (``ragate calibrate
    --gate route``, read by :func:`ragate.eval.thresholds.read_calibration`): its routes, unless the caller named
    others (refused: thresholds belong to the routes they were tuned on); a null threshold never stops on NLL."""
    route = spec.route
    if route is None:
        raise RagateError(f"{path} calibrates the route method: use it with method 'route', not {spec.name!r}")
    routes = tuple(cal["routes"])
    if routes_given and routes != route.routes:
        raise RagateError(
            f"{path} was calibrated on the routes {','.join(routes)}, not {','.join(route.routes)}: drop routes= "
            f"(--routes) to take the file's, or rerun ragate calibrate --gate route --routes {','.join(route.routes)}"
        )
    policy = cal.get("policy", "cascade")
    if policy == "cascade":
        stops = tuple(-math.inf if s is None else float(s) for s in cal["stops"])
        route = replace(route, routes=routes, stop_nll=stops, agree=cal.get("agree", True),
                        evidence=cal.get("evidence", False))  # fmt: skip
    else:
        from ragate.methods.route_policy import RoutePolicyModel

        model = RoutePolicyModel.from_json(policy, cal, len(routes), str(path))
        route = replace(route, routes=routes, policy=policy, model=model, stop_nll=None)
    try:
        route_specs(route)  # routes this version knows, in order
    except RagateError as err:
        raise RagateError(f"{path}: {err}") from None
    return spec.with_(route=route)


def stop_thresholds(route: RouteSpec) -> tuple[float, ...]:
    """Each stage's NLL stop threshold: as given, else DTR's default tau for every stage."""
    if route.stop_nll is not None:
        return route.stop_nll
    from ragate.gates.registry import get_gate

    return (float(get_gate("ugt").default_tau),) * (len(route.routes) - 1)


def check_answer(
    route: RouteSpec, name: str, trace: Trace, before: Trace | None, threshold: float
) -> tuple[bool, list[RouteCheck]]:
    """The stop checks on the answer of route ``name`` (no model call): whether the cascade stops there, and each
    check in the order read: its normalised NLL at most ``threshold``; else (with ``route.agree``, a route
    ``before`` it) agreement with that route's answer; then (with ``route.evidence``, documents read) the answer
    found in them, without which it does not stop."""
    nll = trace.answer_nll
    stop = nll is not None and nll <= threshold
    checks = [RouteCheck(name, "nll", nll, threshold, stop)]
    if route.agree and before is not None and not stop:
        stop = answers_agree(trace.answer, before.answer)
        checks.append(RouteCheck(name, "agree", float(stop), 1.0, stop))
    if route.evidence and (found := trace.supported) is not None:
        if stop and not found:  # vetoed: the checks that would have stopped it did not
            checks = [replace(c, stop=False) for c in checks]
        stop = stop and found
        checks.append(RouteCheck(name, "supported", float(found), 1.0, stop))
    return stop, checks


def _in_turn(
    specs: list[MethodSpec],
    run: Callable[[MethodSpec], Trace],
    check: Callable[[int, MethodSpec, Trace, Trace | None], tuple[bool, list[RouteCheck]]],
) -> tuple[list[tuple[int, Trace]], list[RouteCheck]]:
    """Each route in turn until ``check`` on its answer (the route before's given) says stop, the last otherwise."""
    checks: list[RouteCheck] = []
    ran: list[tuple[int, Trace]] = []
    for i, route_spec in enumerate(specs):
        trace = run(route_spec)
        ran.append((i, trace))
        if i == len(specs) - 1:
            break
        stop, met = check(i, route_spec, trace, ran[i - 1][1] if i else None)
        checks += met
        if stop:
            break
    return ran, checks


def _cascade(
    route: RouteSpec, specs: list[MethodSpec], run: Callable[[MethodSpec], Trace]
) -> tuple[list[tuple[int, Trace]], list[RouteCheck]]:
    """The cascade: each route in turn until one's answer checks out (:func:`check_answer`), the last otherwise."""
    stops = stop_thresholds(route)
    return _in_turn(specs, run, lambda i, s, trace, before: check_answer(route, s.name, trace, before, stops[i]))


def _calibrated(
    route: RouteSpec, specs: list[MethodSpec], run: Callable[[MethodSpec], Trace]
) -> tuple[list[tuple[int, Trace]], list[RouteCheck]]:
    """The cascade whose checks a fit per stage combines: each route in turn until P(its answer is right), from
    what the answer shows (:func:`ragate.methods.route_policy.stage_vector`), is at least the stage's threshold
    (a "calibrated" check: that probability and the threshold)."""
    import numpy as np

    from ragate.methods.route_policy import stage_vector

    model = route.model
    if model is None:  # route_specs refuses it; here for the type checker
        raise ValueError("the calibrated cascade has no fitted model")

    def check(i: int, s: MethodSpec, trace: Trace, before: Trace | None) -> tuple[bool, list[RouteCheck]]:
        assert model is not None
        x = np.array([stage_vector(trace.answer_nll, trace.answer, before.answer if before else None,
                                   trace.supported)])  # fmt: skip
        fit = model.right[i]
        p = fit if isinstance(fit, float) else float(fit.probabilities(x)[0, 1])
        stop = p >= model.stops[i]
        return stop, [RouteCheck(s.name, "calibrated", p, model.stops[i], stop)]

    return _in_turn(specs, run, check)


def _chosen(
    route: RouteSpec, specs: list[MethodSpec], question: str, run: Callable[[MethodSpec], Trace]
) -> tuple[list[tuple[int, Trace]], list[RouteCheck]]:
    """A policy that chooses from features (:mod:`ragate.methods.route_policy`): ``adaptive-rag`` runs the one route
    its classifier gives the question (a "classifier" check per route: its probability, the chosen one's beside
    it); ``learned`` runs the first route, then the route of the highest P(right) - lambda * cost, if another (a
    "learned" check per route: its P(right), and its price lambda * cost as the threshold)."""
    import numpy as np

    from ragate.methods.route_policy import (
        Linear,
        answer_vector,
        learned_values,
        question_vector,
        right_probabilities,
    )

    model = route.model
    if model is None:  # route_specs refuses it; here for the type checker
        raise ValueError(f"route policy {route.policy!r} has no fitted model")
    x = question_vector([question])
    if route.policy == "adaptive-rag":
        if isinstance(model.choose, Linear):
            probs, classes = model.choose.probabilities(x)[0].tolist(), model.choose.classes
        else:
            probs, classes = [1.0], (int(model.choose or 0),)
        i = classes[int(np.argmax(probs))]
        checks = [RouteCheck(specs[c].name, "classifier", p, max(probs), c == i) for c, p in zip(classes, probs, strict=True)]
        return [(i, run(specs[i]))], checks
    first = run(specs[0])
    features = np.hstack([x, [answer_vector(first.answer_nll, first.answer, first.tokens)]])
    right = right_probabilities(model, features)[0].tolist()
    i = int(np.argmax(learned_values(model, features)[0]))
    price = [model.lam * c for c in model.costs]
    checks = [RouteCheck(s.name, "learned", p, c, j == i) for j, (s, p, c) in enumerate(zip(specs, right, price, strict=True))]
    return [(0, first), *([(i, run(specs[i]))] if i else [])], checks


def run_route(
    spec: MethodSpec,
    question: str,
    run: Callable[[MethodSpec], Trace],
) -> Trace:
    """Answer ``question`` with the route method ``spec``: ``run`` answers with one route's method; the cascade
    stops at the first route whose answer checks out (see the module docstring): its NLL at most the stage's
    threshold or (from the second route on, with ``agree``) agreeing with the route before, and (with
    ``evidence``) found in the documents it read, if it read any. The trace carries every route's
    stages in order, the last route's answer, documents and dynamic record, and the path (``Trace.route``)."""
    route = spec.route
    if route is None:
        raise ValueError(f"method {spec.name!r} is not a route method")
    specs = route_specs(route)
    if route.policy == "cascade":
        ran, checks = _cascade(route, specs, run)
    elif route.policy == "calibrated":
        ran, checks = _calibrated(route, specs, run)
    else:
        ran, checks = _chosen(route, specs, question, run)
    traces = [t for _, t in ran]
    final = traces[-1]
    taken = specs[ran[-1][0]].name
    info = RouteInfo(
        tuple(route.routes), taken, tuple(checks), tuple(len(t.stages) for t in traces),
        tuple(specs[i].name for i, _ in ran), tuple(t.answer for t in traces), tuple(t.retrieved for t in traces),
        tuple(t.answer_nll for t in traces), tuple(t.tokens for t in traces),
    )  # fmt: skip
    met = [c.kind for c in checks if c.route == taken and c.stop]
    reason = f"answered by {taken}" + (f" ({' and '.join(met)} check met)" if met else "")
    # the check that decided: the one that stopped at (or chose) the route taken, else the last NLL check passed by
    last = next((c for c in checks if c.route == taken and c.stop and c.kind != "supported"), None) or next(
        (c for c in reversed(checks) if c.kind == "nll" and c.score is not None), None
    )
    decision = GateDecision(
        any(t.retrieved for t in traces),
        last.score if last is not None and last.score is not None else 0.0,
        last.threshold if last is not None else 0.0,
        reason,
    )
    return Trace(
        spec.name,
        question,
        final.answer,
        decision.retrieve,
        decision,
        tuple(q for t in traces for q in t.queries),
        final.documents,
        tuple(s for t in traces for s in t.stages),
        dynamic=final.dynamic,
        route=info,
    )

