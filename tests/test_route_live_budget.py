"""The live route budget (ragate.state.route_budget): the learned route policy's price of a retrieval, lambda, set
before each request from the last W requests so that mean retrievals per question hold at the budget where the
file's lambda, tuned on other questions, does not; its state kept across restarts; settings it cannot honour
refused before the model loads; ``ragate serve --method route --budget`` over HTTP."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_route_budget import ROUTES, _policy_scenario

from ragate.backends.scripted import ScriptedBackend
from ragate.errors import RagateError
from ragate.eval.thresholds import read_calibration
from ragate.methods import get_method
from ragate.methods.configure import calibrated
from ragate.methods.route import run_route
from ragate.methods.spec import MethodSpec
from ragate.methods.trace import Stage, Trace
from ragate.pipeline import Pipeline
from ragate.report.route_budget import route_calibration
from ragate.report.routes import route_table
from ragate.state.route_budget import RouteBudgetController, price_for


def test_the_price_is_the_smallest_lambda_whose_mean_cost_is_within_the_level() -> None:
    """Against a dense grid: at the price the window's mean cost is within the level, and at any grid lambda
    clearly below it the mean cost is above (the price is the smallest, so the policy stays as accurate as the
    level allows)."""
    rng = np.random.default_rng(0)
    costs = np.array([0.0, 1.0, 2.3])
    grid = np.linspace(0, 3, 30001)
    for _ in range(20):
        rows = rng.uniform(0, 1, size=(rng.integers(10, 60), 3))
        level = float(rng.uniform(0, 2.3))

        def mean_cost(lam: float, rows: np.ndarray = rows) -> float:
            return float(costs[(rows - lam * costs).argmax(axis=1)].mean())

        lam = price_for(rows, costs, level)
        assert mean_cost(lam) <= level + 1e-12
        below = grid[grid < lam - 1e-6]
        assert all(mean_cost(g) > level for g in below[-50:]), (lam, level)
    assert price_for(np.array([[0.2, 0.9, 0.95]] * 10), costs, 2.3) < 1e-9  # within the level at once: no price
    # ties on rounded probabilities go to the cheaper route, whatever the routes' order: at level 0 nothing spends
    for order in ([0.0, 1.0, 2.3], [0.0, 2.3, 1.0]):
        cost = np.array(order)
        for _ in range(50):
            rows = np.round(rng.uniform(0, 1, size=(30, 3)), 2)
            lam = price_for(rows, cost, 0.0)
            assert cost[(rows - lam * cost).argmax(axis=1)].mean() == 0.0


def _stream() -> tuple[dict[str, dict[str, Trace]], Any, list[str]]:
    """Every route's scripted answer to 240 questions, each route's retrievals as stages (route j: j retrievals),
    the route table of the first 120 (the fit's) and the ids of the other 120 (the traffic)."""
    traces, records = _policy_scenario(240, seed=3)
    for qid in traces:
        for j, name in enumerate(ROUTES):
            t = traces[qid][name]
            traces[qid][name] = replace(t, stages=(*[Stage("retrieve", 0, 0, 0.0)] * j, *t.stages))
    fit = [r for r in records if int(r["id"][1:]) < 120]
    return traces, route_table(fit, ROUTES), [f"q{i}" for i in range(120, 240)]


def _learned(table: Any, budget: float, tmp_path: Path) -> tuple[Path, MethodSpec]:
    path = tmp_path / f"learned-{budget}.json"
    path.write_text(json.dumps(route_calibration(table, budget, policy="learned")))
    spec, _ = calibrated(get_method("route"), read_calibration(path), path, routes_given=False)
    return path, spec


def _answer(spec: MethodSpec, lam: float, question: str, traces: dict[str, Trace]) -> Trace:
    return run_route(spec.with_threshold(lam), question, lambda s: traces[s.name])


def test_the_controller_holds_mean_retrievals_where_the_files_lambda_does_not(tmp_path: Path) -> None:
    """A file tuned for 1.4 retrievals per question, served with a live budget of 0.6: the fixed lambda spends
    about 1.4 on the new questions, the controller about 0.6 once its window fills; every request's lambda is
    the one it set before it, and its mean over the window is what it reports."""
    traces, table, traffic = _stream()
    _, spec = _learned(table, 1.4, tmp_path)
    assert spec.route is not None and spec.route.model is not None
    fixed = [_answer(spec, spec.route.model.lam, traces[q][ROUTES[0]].question, traces[q]) for q in traffic]
    spent_fixed = np.mean([sum(s.name == "retrieve" for s in t.stages) for t in fixed])
    live = RouteBudgetController(0.6, 40, spec, None)
    spent = []
    for q in traffic:
        lam = live.tau
        trace = _answer(spec, lam, traces[q][ROUTES[0]].question, traces[q])
        assert trace.route is not None and [c.threshold for c in trace.route.checks] == [lam * c for c in spec.route.model.costs]
        live.observe_trace(trace)
        spent.append(sum(s.name == "retrieve" for s in trace.stages))
    assert spent_fixed > 1.0, spent_fixed  # the file's price spends what it was tuned for, not the live budget
    assert abs(np.mean(spent[40:]) - 0.6) < 0.15, np.mean(spent[40:])
    assert live.rate() == pytest.approx(np.mean(spent[-40:]))
    assert live.tau > spec.route.model.lam  # a dearer retrieval than the file's: it spends less
    snap = live.snapshot()
    assert snap["unit"] == "mean retrievals per question" and snap["threshold_name"] == "lambda"
    assert snap["observed"] == 120 and snap["window_requests"] == 40 and snap["tau"] == live.tau


def test_the_state_is_kept_across_restarts_and_a_damaged_or_foreign_one_is_refused(tmp_path: Path) -> None:
    traces, table, traffic = _stream()
    _, spec = _learned(table, 1.4, tmp_path)
    state = tmp_path / "state" / "budget-route.json"
    live = RouteBudgetController(0.6, 20, spec, state, model="m")
    for q in traffic[:30]:
        live.observe_trace(_answer(spec, live.tau, traces[q][ROUTES[0]].question, traces[q]))
    again = RouteBudgetController(0.6, 20, spec, state, model="m")
    assert again.tau == live.tau and again.rate() == live.rate() and again.tau != spec.route.model.lam  # type: ignore[union-attr]
    with pytest.raises(RagateError, match="not 'other'.*another --budget-state file"):
        RouteBudgetController(0.6, 20, spec, state, model="other")
    _, refit = _learned(route_table(_policy_scenario(200, seed=5)[1], ROUTES), 1.0, tmp_path)
    fresh = RouteBudgetController(0.6, 20, refit, state, model="m")  # a refitted file: its window starts anew
    assert fresh.rate() is None and fresh.tau == refit.route.model.lam  # type: ignore[union-attr]
    data = json.loads(state.read_text())
    for change, words in [({"lambda": -1}, "'lambda' must be"), ({"rows": [[0.5, 0.5]]}, "lists of 3 probabilities"),
                          ({"spent": [1.0]}, "one count of retrievals"), ({"rows": [[2.0, 0.1, 0.1]] * 20}, "lists of 3")]:  # fmt: skip
        state.write_text(json.dumps(data | change))
        with pytest.raises(RagateError, match=words):
            RouteBudgetController(0.6, 20, spec, state, model="m")
    state.write_text('{"rows": [[0.1, 0.2, NaN]]')
    with pytest.raises(RagateError, match="not a readable budget state"):
        RouteBudgetController(0.6, 20, spec, state, model="m")


def test_settings_the_route_budget_cannot_honour_are_refused_before_the_model_loads(tmp_path: Path) -> None:
    """A scripted backend with no answers: any model call would fail, so each refusal comes first."""
    _, table, _ = _stream()
    learned, _ = _learned(table, 1.4, tmp_path)
    cascade = tmp_path / "cascade.json"
    cascade.write_text(json.dumps(route_calibration(table, 0.8)))
    lm = ScriptedBackend([])
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "a live route budget moves the learned policy's price.*cascade policy's stop thresholds"),
        ({"calibration": cascade}, "calibrate --gate route --policy learned"),
        ({"calibration": learned, "budget": 9.0}, r"above 0 and at most 2\.00 .*not 9\.0"),
        ({"calibration": learned, "budget": 0.0}, "above 0 and at most"),
        ({"calibration": learned, "window": 3}, "--window 3 is too short"),
        ({"calibration": learned, "state": "redis://127.0.0.1:1/0"}, "a route budget keeps its own window"),
    ]
    # a first route that retrieves: the policy prices only the routes after it, so no lambda holds B
    _, records = _policy_scenario(60, seed=3)
    retrieving = tmp_path / "retrieving-first.json"
    retrieving.write_text(json.dumps(route_calibration(route_table(records, ROUTES[1:]), 1.5, policy="learned")))
    cases.append(({"calibration": retrieving, "budget": 1.5}, "the first route 'standard-rag' may retrieve too"))
    for given, words in cases:
        with pytest.raises(RagateError, match=words):
            Pipeline(method="route", lm=lm, **({"budget": 0.5} | given))
    with Pipeline(method="route", calibration=retrieving, lm=lm) as rag:  # without a live budget it serves
        assert rag.spec.route is not None and rag.spec.route.routes == ROUTES[1:]
    with Pipeline(method="route", calibration=learned, budget=0.5, lm=lm) as rag:
        assert isinstance(rag.budget, RouteBudgetController) and rag.budget.budget == 0.5
        with pytest.raises(ValueError, match="routes each question by checking its routes. answers"):
            rag.decide("Who wrote Hamlet?")


def test_serve_holds_a_route_budget_and_reports_it_over_http(smollm2_path: Path, tmp_path: Path) -> None:
    """A real ``ragate serve --method route --calibration LEARNED --budget B`` on 127.0.0.1 with SmolLM2: each
    answer says lambda was set by the controller, in mean retrievals per question, and ``GET /v1/budget`` counts
    the requests and keeps lambda beside what they spent."""
    import httpx
    from test_service import _serve, _stop

    _, records = _policy_scenario(120, seed=3)
    two = [r for r in records if r["method"] in ROUTES[:2]]
    cal = tmp_path / "learned.json"
    cal.write_text(json.dumps(route_calibration(route_table(two, ROUTES[:2]), 0.5, policy="learned")
                              | {"model": "smollm2-135m", "routes": list(ROUTES[:2])}))  # fmt: skip
    state = tmp_path / "budget.json"
    proc, url = _serve(["--method", "route", "--calibration", str(cal), "--budget", "0.5", "--window", "10",
                        "--budget-state", str(state)], tmp_path / "serve.log")  # fmt: skip
    try:
        r = httpx.post(f"{url}/v1/answer", json={"question": "Who wrote Hamlet?", "options": {"max_tokens": 4}},
                       timeout=120)  # fmt: skip
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["route"]["checks"][0]["kind"] == "learned"
        assert body["budget"]["unit"] == "mean retrievals per question" and body["budget"]["budget"] == 0.5
        b = httpx.get(f"{url}/v1/budget", timeout=30).json()
        assert b["enabled"] and b["threshold_name"] == "lambda" and b["observed"] == 1 and b["window_requests"] == 1
        assert b["window_rate"] == pytest.approx(np.mean([p["retrievals"] for p in b["history"]]))
        assert math.isfinite(b["tau"]) and json.loads(state.read_text())["fit"]
    finally:
        _stop(proc)


def test_a_policy_put_in_force_starts_the_window_anew(tmp_path: Path) -> None:
    """``refit`` (a traffic-fitted policy went in force): the window held the old fit's probabilities, so it is
    emptied, lambda is the new fit's, and the state file says the new fit's digest."""
    traces, table, ids = _stream()
    _, first = _learned(table, 0.5, tmp_path)
    _, second = _learned(table.take(np.arange(60)), 1.0, tmp_path)
    state = tmp_path / "route-state.json"
    controller = RouteBudgetController(0.5, 20, first, state)
    for qid in ids[:15]:
        controller.observe_trace(_answer(first, controller.tau, traces[qid][ROUTES[0]].question, traces[qid]))
    assert controller.snapshot()["window_requests"] == 15
    controller.refit(second)
    assert second.route is not None and second.route.model is not None
    assert controller.tau == second.route.model.lam and controller.snapshot()["window_requests"] == 0
    saved = json.loads(state.read_text())
    assert saved["rows"] == [] and saved["lambda"] == second.route.model.lam
    assert saved["fit"] != RouteBudgetController(0.5, 20, first, None).digest
    assert RouteBudgetController(0.5, 20, second, state).snapshot()["window_requests"] == 0  # its own state reads back
