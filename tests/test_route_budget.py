"""A route cascade's stop thresholds for a budget of mean retrievals per question (ragate.report.route_budget),
from records of every route over the same questions, saved as a calibration file that ``Pipeline(method="route",
calibration=FILE)`` and ``ragate ask --calibration`` serve with; a budget the routes cannot reach, a damaged file
and a file for other routes are refused, naming the fix."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.cli.main import main
from ragate.errors import RagateError
from ragate.eval.thresholds import read_calibration
from ragate.gates.base import GateDecision
from ragate.methods.trace import Stage, Trace
from ragate.pipeline import Pipeline
from ragate.report.route_budget import calibrate_routes, reach, route_calibration
from ragate.report.routes import cascade, outcome, route_table
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index
from ragate.retrieval.types import Hit, Passage
from ragate.text import extract_answer, supported

ROUTES = ("no-retrieval", "standard-rag", "standard-rag-pairs-prompts")


def _record(qid: str, j: int, answer: str, nll: float | None, right: bool, passage: str) -> dict[str, Any]:
    """Route ``j``'s eval record of question ``qid``: ``j`` retrievals, its answer's NLL, one passage read."""
    logprob = None if nll is None else -nll * 10
    stages = (Stage("answer", 100 * (j + 1), 10, 0.5 + j, logprob=logprob),)
    documents = (Hit(Passage(f"p{qid}{j}", "A title", passage), 1.0, 1),) if j else ()
    trace = Trace(ROUTES[j], "q", answer, j > 0, GateDecision(j > 0, 0.0, 0.0, ""), (), documents, stages)
    passages = [f"{h.passage.title} {h.passage.text}" for h in documents]
    return {
        "id": qid, "dataset": "demo", "method": ROUTES[j], "question": f"question {qid}?", "answers": ["x"],
        "prediction": answer, "scores": {"em": float(right), "f1": float(right), "acc": float(right)},
        "retrieved": j > 0, "retrievals": j, "prompt_tokens": 100 * (j + 1), "completion_tokens": 10,
        "overhead_tokens": 0, "seconds": 0.5 + j,
        "supported": supported(extract_answer(answer), passages) if passages else None, "trace": trace.to_json(),
    }  # fmt: skip


def _records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    records = []
    for i in range(n):
        for j in range(3):
            answer, passage = rng.choice(["Paris", "Lyon", "Nice"]), rng.choice(["Paris and Lyon", "Nice"])
            records.append(_record(f"q{i}", j, answer, rng.uniform(0, 2), rng.random() < 0.2 + 0.25 * j, passage))
    return records


@pytest.fixture(scope="module")
def table() -> Any:
    return route_table(_records(90), ROUTES)


def test_records_pooled_over_datasets_keep_questions_that_share_an_id() -> None:
    """2WikiMultihopQA and MuSiQue both number their questions 0, 1, ...: pooled, each dataset's question is its
    own row (a question is its dataset and id), in the order of the first route's records."""
    two = _records(5, seed=1)
    pooled = [r | {"dataset": "2wikimultihopqa"} for r in two] + [r | {"dataset": "musique"} for r in _records(5, seed=2)]
    table = route_table(pooled, ROUTES)
    assert len(table) == 10 and table.datasets == ("2wikimultihopqa",) * 5 + ("musique",) * 5
    assert table.ids == tuple(f"q{i}" for i in range(5)) * 2
    assert table.scores["em"][:5].tolist() == route_table(two, ROUTES).scores["em"].tolist()


def test_the_thresholds_keep_the_cascade_within_the_budget_and_the_reach_is_what_cascades_spend(table: Any) -> None:
    low, high = reach(table)
    every = outcome(table, "", cascade(table, (-math.inf, -math.inf)), "em", pays="every")
    assert low == 0.0 and math.isclose(high, float(every.costs["retrievals"].mean())) and high > 1.0
    for budget in (0.3, 0.8, high):
        cal = route_calibration(table, budget)
        stops = [-math.inf if s is None else s for s in cal["stops"]]
        spent = outcome(table, "", cascade(table, stops), "em", pays="every").costs["retrievals"].mean()
        assert math.isclose(cal["dev_retrievals"], float(spent)) and spent <= budget + 1e-9
        assert cal["routes"] == list(ROUTES) and cal["reach"] == [low, high] and cal["n"] == 90
    assert route_calibration(table, high)["dev_score"] >= route_calibration(table, 0.3)["dev_score"]


@pytest.mark.parametrize("budget, words", [(9.0, "above what the routes can reach"), (-1.0, "not -1.0")])
def test_a_budget_the_routes_cannot_reach_is_refused_naming_their_range(table: Any, budget: float, words: str) -> None:
    with pytest.raises(RagateError, match=words) as err:
        route_calibration(table, budget)
    if budget > 0:
        assert f"give --budget {reach(table)[1]:.2f} or less" in str(err.value)
    first_retrieves = route_table([r for r in _records(30) if r["method"] != ROUTES[0]], ROUTES[1:])
    low = reach(first_retrieves, evidence=True)[0]  # a cascade that starts by retrieving spends one at the least
    assert reach(first_retrieves)[0] == 1.0 < low  # and more where the evidence check sends answers on
    with pytest.raises(RagateError, match=rf"below what the routes can reach.*give --budget {low:.2f} or more"):
        route_calibration(first_retrieves, 0.5, evidence=True)
    route_calibration(first_retrieves, round(low, 2), evidence=True)  # the range's end as printed is accepted
    route_calibration(table, round(reach(table)[1], 2))


def test_records_without_log_probabilities_or_evidence_say_what_the_file_can_hold() -> None:
    records = _records(40)
    for r in records:
        r.pop("supported")
    cal = route_calibration(route_table(records, ROUTES), 0.8, evidence=True)
    assert cal["evidence"] is False  # tuned without the check the records cannot replay, so served without it
    for r in records:
        r["trace"]["stages"][0]["logprob"] = None
    with pytest.raises(RagateError, match="hold no log-probabilities, so no NLL stop threshold can be tuned"):
        route_calibration(route_table(records, ROUTES), 0.8)


def test_the_fitted_numbers_give_scikit_learns_probabilities(table: Any) -> None:
    """:class:`Linear` is the fitted model's arithmetic, binary and multinomial, to rounding."""
    import numpy as np

    from ragate.methods.route_policy import Linear
    from ragate.report.routes import _classifier, learned_x, route_labels

    x = learned_x(table)
    for y in ((table.scores["em"][:, 1] > 0).astype(int), route_labels(table, "em")):
        model = _classifier().fit(x, y)
        assert len(np.unique(y)) >= 2
        np.testing.assert_allclose(Linear.from_sklearn(model).probabilities(x), model.predict_proba(x), atol=1e-12)


def test_the_file_serves_the_route_method_with_its_thresholds_and_checks(table: Any, tmp_path: Path) -> None:
    cal = route_calibration(table, 0.8) | {"stops": [None, 0.5], "agree": False}
    path = tmp_path / "route.json"
    path.write_text(json.dumps(cal))
    assert read_calibration(path)["stops"] == [None, 0.5]
    with open_index(demo_index()) as demo:
        lm = ScriptedBackend([make_generation(["Paris"], [-0.01]), make_generation(["Lyon"], [-0.1]),
                              make_generation(["Nice"], [-2.0])])  # fmt: skip
        with Pipeline(method="route", calibration=path, lm=lm, retriever=demo) as rag:
            route = rag.spec.route
            assert route is not None and route.routes == ROUTES and route.stop_nll == (-math.inf, 0.5)
            assert not route.agree and not route.evidence  # as tuned: the file's checks, not the defaults
            ans = rag.answer("What is the capital of France?")
        # the first stage never stops on NLL (null), however sure; the second stops at NLL 0.1 <= 0.5, and "Lyon",
        # in none of the demo passages, stops there: the file's cascade has no evidence check
        assert ans.trace.route is not None and ans.trace.route.taken == "standard-rag" and len(lm.calls) == 2
        checks = [(c.kind, c.threshold, c.stop) for c in ans.trace.route.checks]
        assert checks == [("nll", -math.inf, False), ("nll", 0.5, True)]
        with pytest.raises(RagateError, match="calibrated on the routes no-retrieval,standard-rag,standard-rag-pairs"):
            Pipeline(method="route", routes=["no-retrieval", "standard-rag"], calibration=path, lm=lm, retriever=demo)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"stops": [0.5]}, "'stops' must hold 2 thresholds"),
        ({"stops": [0.5, "low"]}, "each a finite number, or null"),
        ({"routes": "no-retrieval"}, "'routes' must name two routes or more"),
        ({"evidence": "yes"}, "'evidence' must be true or false"),
        ({"budget": -2}, "'budget' must be mean retrievals per question"),
    ],
)
def test_a_damaged_route_calibration_is_refused_naming_the_field(
    table: Any, tmp_path: Path, change: dict[str, Any], words: str
) -> None:
    path = tmp_path / "route.json"
    path.write_text(json.dumps(route_calibration(table, 0.8) | change))
    with pytest.raises(RagateError, match=words):
        read_calibration(path)


@pytest.fixture()
def run_dir(tmp_path: Path) -> Iterator[Path]:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": "smollm2-135m", "engine": "llama.cpp"}))
    (run / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(60, seed=1)))
    yield run


def test_ragate_calibrate_writes_the_route_file_from_a_run(run_dir: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "cal.json"
    argv = ["calibrate", "--gate", "route", "--from-sweep", str(run_dir), "--routes", ",".join(ROUTES)]
    assert main([*argv, "--budget", "0.8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    cal = read_calibration(out)
    assert cal["model"] == "smollm2-135m" and cal["routes"] == list(ROUTES) and cal["dev_retrievals"] <= 0.8
    assert f"saved {out}" in printed and "the routes reach 0.00 to" in printed
    assert calibrate_routes([run_dir], ROUTES, 0.8) | {"dev": str(out)} == cal | {"dev": str(out)}
    assert main([*argv, "--budget", "7", "--out", str(out)]) == 2
    assert "above what the routes can reach" in capsys.readouterr().err
    assert main([*argv[:-2], "--routes", "standard-rag,no-retrieval", "--budget", "0.8"]) == 2
    assert "cheapest first" in capsys.readouterr().err
    assert main(["calibrate", "--gate", "route", "--questions", str(run_dir / "config.json"), "--budget", "1"]) == 2
    assert "pass --from-sweep RUN" in capsys.readouterr().err
    assert main(["eval", "--dataset", "demo", "--methods", "route", "--calibration", str(out)]) == 2
    assert "ragate eval does not take" in capsys.readouterr().err
    assert read_calibration(out)["evidence"] is False  # off by default
    assert main([*argv, "--budget", "0.8", "--evidence", "--out", str(out)]) == 0
    assert read_calibration(out)["evidence"] is True
    assert main([*argv, "--budget", "0.8", "--model", "qwen2.5-coder-1.5b"]) == 2
    assert "drop --model (the run's model is the file's)" in capsys.readouterr().err
    assert main([*argv, "--policy", "learned", "--budget", "0.8", "--no-agree"]) == 2
    assert "use them with --policy cascade" in capsys.readouterr().err
    lines = (run_dir / "questions.jsonl").read_text().splitlines()
    (run_dir / "questions.jsonl").write_text("\n".join([lines[0].replace('"supported": true', '"supported": "yes"')
                                                         .replace('"supported": null', '"supported": "yes"'), *lines[1:]]))  # fmt: skip
    assert main([*argv, "--budget", "0.8", "--out", str(out)]) == 2
    assert '"supported" must be true, false or null' in capsys.readouterr().err


def test_ragate_ask_answers_with_the_route_file_on_smollm2(
    smollm2_path: Path, run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's path: a file calibrated on runs of SmolLM2 (the default model), then ``ragate ask --calibration``;
    a file of another model is refused before the model loads."""
    out = tmp_path / "cal.json"
    argv = ["calibrate", "--gate", "route", "--from-sweep", str(run_dir), "--routes", ",".join(ROUTES[:2])]
    assert main([*argv, "--budget", "0.5", "--out", str(out)]) == 0
    capsys.readouterr()
    question = "What is the capital of France?"
    assert main(["ask", question, "--method", "route", "--calibration", str(out), "--max-tokens", "8", "--json",
                 "--quiet"]) == 0  # fmt: skip
    record = json.loads(capsys.readouterr().out)
    stop = read_calibration(out)["stops"][0]
    assert record["route"]["routes"] == list(ROUTES[:2])
    assert record["route"]["checks"][0]["threshold"] == stop  # a stage that never stops on NLL: null, as in the file
    adaptive = tmp_path / "adaptive.json"
    assert main([*argv, "--policy", "adaptive-rag", "--out", str(adaptive)]) == 0
    assert "Adaptive-RAG's question classifier" in capsys.readouterr().out
    assert main(["ask", question, "--method", "route", "--calibration", str(adaptive), "--max-tokens", "8",
                 "--json", "--quiet"]) == 0  # fmt: skip
    record = json.loads(capsys.readouterr().out)
    assert {c["kind"] for c in record["route"]["checks"]} == {"classifier"} and record["route"]["taken"] in ROUTES
    other = tmp_path / "other.json"
    other.write_text(json.dumps(read_calibration(out) | {"model": "qwen2.5-coder-1.5b"}))
    assert main(["ask", question, "--method", "route", "--calibration", str(other)]) == 2
    assert "was calibrated with model 'qwen2.5-coder-1.5b'" in capsys.readouterr().err


QUESTIONS = ("Who wrote Hamlet?", "When did the war end in 1945?", "Which city is the capital of France?",
             "How many moons does Mars have?", "Where was the treaty signed?", "What year did 3 ships sink?")  # fmt: skip


def _policy_scenario(n: int, seed: int) -> tuple[dict[str, dict[str, Trace]], list[dict[str, Any]]]:
    """Every route's answer to ``n`` questions of several kinds (so that the question's features vary), with
    outcomes that depend on the question word and the first answer's NLL, as scripted traces and their records."""
    rng = random.Random(seed)
    traces: dict[str, dict[str, Trace]] = {}
    records = []
    for i in range(n):
        qid, question = f"q{i}", f"{rng.choice(QUESTIONS)} ({i})"
        traces[qid] = {}
        nll0 = rng.uniform(0, 2)
        for j in range(3):
            record = _record(qid, j, rng.choice(["Paris", "Lyon", "Nice", "x y"]), nll0 if j == 0 else rng.uniform(0, 2),
                             rng.random() < (0.6 - 0.25 * nll0 if j == 0 else 0.3 + 0.1 * j + 0.2 * question.startswith("Who")),
                             "Paris and Lyon")  # fmt: skip
            record["question"] = question
            trace = record["trace"]
            traces[qid][ROUTES[j]] = Trace(
                ROUTES[j], question, trace["answer"], j > 0, GateDecision(j > 0, 0.0, 0.0, ""), (),
                (Hit(Passage(f"p{qid}{j}", "A title", "Paris and Lyon"), 1.0, 1),) if j else (),
                (Stage("answer", 100 * (j + 1), 10, 0.5 + j, logprob=trace["stages"][0]["logprob"]),),
            )  # fmt: skip
            records.append(record)
    return traces, records


@pytest.mark.parametrize("policy, budget", [("adaptive-rag", None), ("learned", 0.8), ("calibrated", 0.8)])
def test_a_fitted_policy_chooses_live_the_route_it_chose_in_the_replay(
    policy: str, budget: float | None, tmp_path: Path
) -> None:
    """The calibration file's numbers are the fitted model's: served through Pipeline's path (the file read,
    checked and put in the route spec), the live route method takes, on every question, the route the replay's
    fit takes, and runs only what the policy pays for (adaptive-rag: the one route; learned: the first, then its
    choice if another)."""
    from ragate.methods import get_method
    from ragate.methods.configure import calibrated
    from ragate.methods.route import run_route
    from ragate.methods.route_policy import adaptive_choice, learned_values
    from ragate.report.routes import fit_adaptive, fit_learned, learned_x

    traces, records = _policy_scenario(160, seed=7)
    table = route_table(records, ROUTES)
    path = tmp_path / f"{policy}.json"
    path.write_text(json.dumps(route_calibration(table, budget, policy=policy)))
    spec, tau = calibrated(get_method("route"), read_calibration(path), path, routes_given=False)
    assert tau is None and spec.route is not None and spec.route.policy == policy
    if policy == "adaptive-rag":
        replayed = adaptive_choice(fit_adaptive(table, "em"), table.question_x)[0]
    elif policy == "calibrated":
        from ragate.report.route_fit import checked, fit_calibrated, stage_p

        model = fit_calibrated(table, "em", 0.8)
        replayed = checked(stage_p(table, list(model.right)), model.stops, len(ROUTES) - 1)
        assert spec.route.model is not None and spec.route.model.stops == model.stops
    else:
        model = fit_learned(table, "em", 0.8)
        replayed = learned_values(model, learned_x(table)).argmax(axis=1)
        assert spec.route.model is not None and spec.route.model.lam == model.lam
    assert len(set(replayed.tolist())) >= 2  # the fit tells questions apart: the comparison compares something
    for i, qid in enumerate(table.ids):
        ran: list[str] = []

        def run(s: Any, qid: str = qid, ran: list[str] = ran) -> Trace:
            ran.append(s.name)
            return traces[qid][s.name]

        live = run_route(spec, table.questions[i], run)
        assert live.route is not None and live.route.taken == ROUTES[replayed[i]], qid
        want = {"adaptive-rag": [ROUTES[replayed[i]]], "calibrated": list(ROUTES[: replayed[i] + 1]),
                "learned": list(dict.fromkeys([ROUTES[0], ROUTES[replayed[i]]]))}[policy]  # fmt: skip
        assert ran == want and [c.stop for c in live.route.checks].count(True) == (policy != "calibrated" or replayed[i] < 2)
        assert live.answer == traces[qid][ROUTES[replayed[i]]].answer


def _served(data: dict[str, Any], tmp_path: Path) -> Any:
    """The route method a calibration file serves (Pipeline's path)."""
    from ragate.methods import get_method
    from ragate.methods.configure import calibrated

    path = tmp_path / "served.json"
    path.write_text(json.dumps(data))
    return calibrated(get_method("route"), read_calibration(path), path, routes_given=False)[0]


def test_a_calibrated_cascade_with_no_thresholds_within_the_budget_stops_at_every_stage_once_saved(
    table: Any, tmp_path: Path
) -> None:
    """Nothing within the target: every stage stops (the cheapest cascade), written as a threshold a probability
    always meets, not as a null that reads back as never stopping."""
    from ragate.report.route_fit import checked, fit_calibrated, stage_p

    model = fit_calibrated(table, "em", -1.0)
    assert model.stops == (0.0, 0.0)
    assert (checked(stage_p(table, list(model.right)), model.stops, 2) == 0).all()
    data = {"method": "route", "policy": "calibrated", "routes": list(ROUTES), **model.to_json()}
    served = _served(data, tmp_path)
    assert served.route.model.stops == (0.0, 0.0)


def test_a_fitted_policy_file_with_bad_numbers_is_refused(table: Any, tmp_path: Path) -> None:
    learned = route_calibration(table, 0.8, policy="learned")
    adaptive = route_calibration(table, None, policy="adaptive-rag")
    calibrated = route_calibration(table, 0.8, policy="calibrated")
    cases = [
        (calibrated | {"stops": [0.5]}, "'stops' must hold 2 thresholds"),
        (calibrated | {"right": calibrated["right"][:1]}, "'right' must hold one fit per stage"),
        (calibrated | {"features": ["answer_nll"]}, "was fitted on the features"),
        (learned | {"lambda": -1}, "'lambda' must be a number, 0 or more"),
        (learned | {"lambda": 10**400}, "'lambda' must be a number, 0 or more"),
        (learned | {"costs": [0, 1]}, "'costs' must hold each route's mean retrievals"),
        (learned | {"costs": [1, 1, 2]}, "'costs' starts with 0"),
        (learned | {"right": [0.5, 0.5]}, "'right' must hold one fit per route"),
        (learned | {"right": [5.0, *learned["right"][1:]]}, "is a probability, not 5.0"),
        (learned | {"policy": "bandit"}, "'policy' must be cascade, calibrated, adaptive-rag or learned"),
        (learned | {"features": ["words"]}, "was fitted on the features"),
        (learned | {"model": 3}, "'model' cannot be 3"),
    ]
    assert isinstance(adaptive["classifier"], dict)  # the scenario's labels hold several routes
    classifier = adaptive["classifier"]
    cases.append((adaptive | {"classifier": classifier | {"scale": [0.0] * len(classifier["scale"])}}, "one positive scale"))
    cases.append((adaptive | {"classifier": classifier | {"classes": [0, 0, 2][: len(classifier["classes"])]}},
                  "names a route twice"))  # fmt: skip
    cases.append((adaptive | {"classifier": 7}, "'classifier' names route 7 of 3"))

    def narrow(fit: dict[str, Any]) -> dict[str, Any]:  # a fit that agrees with itself, over 3 features
        return fit | {"mean": fit["mean"][:3], "scale": fit["scale"][:3], "coef": [r[:3] for r in fit["coef"]]}

    assert all(isinstance(f, dict) for f in (*learned["right"], *calibrated["right"]))
    cases += [
        (adaptive | {"classifier": narrow(classifier)}, "a fitted model reads 3 features, and the adaptive-rag"),
        (learned | {"right": [learned["right"][0], narrow(learned["right"][1]), learned["right"][2]]},
         "a fitted model reads 3 features, and the learned policy's are 18"),
        (calibrated | {"right": [narrow(calibrated["right"][0]), calibrated["right"][1]]},
         "a fitted model reads 3 features, and the calibrated policy's are 7"),
    ]  # fmt: skip
    for data, words in cases:
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(data))
        with pytest.raises(RagateError, match=words):
            read_calibration(path)
    with pytest.raises(RagateError, match="adaptive-rag chooses the route from the question alone"):
        _served(adaptive, tmp_path).with_threshold(0.5)
    served = _served(calibrated, tmp_path).with_threshold(0.25)  # each stage's P(right) to stop at
    assert served.route is not None and served.route.model is not None and served.route.model.stops == (0.25, 0.25)
    with pytest.raises(RagateError, match="adaptive-rag has no budget"):
        route_calibration(table, 0.8, policy="adaptive-rag")
    high = learned["reach"][1]
    with pytest.raises(RagateError, match=rf"above what the routes can reach.*give --budget {high:.2f} or less"):
        route_calibration(table, high + 1, policy="learned")


def test_serve_answers_with_the_route_file_over_http(smollm2_path: Path, run_dir: Path, tmp_path: Path) -> None:
    """A real ``ragate serve`` on 127.0.0.1 with a cascade's calibration file: ``/v1/answer`` carries the route,
    each check with its threshold from the file, and the reason in words; a file for other routes than
    ``--routes`` stops the server at start with the fix."""
    import httpx
    from test_service import _free_port, _serve, _stop

    cal = tmp_path / "route.json"
    assert main(["calibrate", "--gate", "route", "--from-sweep", str(run_dir), "--routes", ",".join(ROUTES[:2]),
                 "--budget", "0.5", "--out", str(cal)]) == 0  # fmt: skip
    cal.write_text(json.dumps(read_calibration(cal) | {"stops": [None]}))  # the first stage never stops on NLL
    proc, url = _serve(["--method", "route", "--calibration", str(cal)], tmp_path / "serve.log")
    try:
        r = httpx.post(f"{url}/v1/answer", json={"question": "Who wrote Hamlet?", "options": {"max_tokens": 8}},
                       timeout=120)  # fmt: skip
        assert r.status_code == 200, r.text
        body = r.json()
        route = body["route"]
        assert route["routes"] == list(ROUTES[:2]) and route["taken"] in ROUTES[:2]
        # JSON has no infinity: the threshold -inf (never stops on NLL) reads null, as every non-finite number
        assert route["checks"][0]["kind"] == "nll" and route["checks"][0]["threshold"] is None
        assert f"answered by {route['taken']}" in json.dumps(body)
    finally:
        _stop(proc)
    args = ["--method", "route", "--routes", "no-retrieval,standard-rag-pairs-prompts", "--calibration", str(cal)]
    command = [sys.executable, "-m", "ragate.cli.main", "serve", *args, "--port", str(_free_port())]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "calibrated on the routes no-retrieval,standard-rag" in done.stderr


def test_a_route_answer_keeps_its_routes_answers_as_the_two_paths_and_shadow_runs_only_a_missing_route(
    tmp_path: Path,
) -> None:
    """With a feedback store and shadow work, a route answer's closed-book route and first retrieving route are
    the store's two paths: where the cascade ran both, they are its twins and their disagreement its silver label
    at once, and a reference labels both (no shadow call); where it stopped closed-book, shadow work runs the
    one-retrieval route alone (one call, never the cascade again). A learned gate is not put in force over routes."""
    question = "What is the capital of France?"
    with open_index(demo_index()) as demo:
        lm = ScriptedBackend([make_generation(["Paris"], [-2.0]), make_generation(["Lyon"], [-2.0]),
                              make_generation(["Nice"], [-0.01]), make_generation(["Nice"], [-2.0])])  # fmt: skip
        store = tmp_path / "feedback.db"
        with Pipeline(method="route", routes=list(ROUTES[:2]), threshold=0.5, lm=lm, retriever=demo,
                      feedback_store=store, shadow=1.0) as rag:  # fmt: skip
            went_on = rag.answer(question)
            assert went_on.trace.route is not None and went_on.trace.route.ran == ROUTES[:2]
            assert went_on.trace.route.answers == ("Paris", "Lyon") and len(lm.calls) == 2
            row = rag.learner.store.get(went_on.id)
            assert (row.closed_answer, row.open_answer) == ("Paris", "Lyon")
            assert rag.feedback(went_on, reference="Paris").labels == (("closed-wrong", False), ("retrieved-wrong", True))
            assert rag.learner.store.counts()["retrieval-changed"] == {"retrieve": 1, "no_retrieve": 0}
            stopped = rag.answer(question)  # "Nice" at NLL 0.01 <= 0.5: the closed-book route answers
            assert stopped.trace.route is not None and stopped.trace.route.taken == ROUTES[0]
            assert rag.learner.shadow.wait(60)
            assert len(lm.calls) == 4 and lm.calls[-1] != lm.calls[-2]  # one shadow call: standard-rag's, alone
            row = rag.learner.store.get(stopped.id)
            assert (row.closed_answer, row.open_answer) == ("Nice", "Nice")
            with pytest.raises(RagateError, match="a learned gate does not steer a route method"):
                rag.learn()


def test_a_word_on_an_answer_from_a_later_route_labels_only_a_path_that_wrote_it(tmp_path: Path) -> None:
    """``correct=`` judges the answer's text: where a route after the one-retrieval route answered, it labels the
    one-retrieval path only where that route wrote the same answer (it was "Lyon" and the answer "Nice": no label;
    both "Lyon": labelled), and the stored retrieval path is that route's answer, never the later route's."""
    question = "What is the capital of France?"
    with open_index(demo_index()) as demo:
        lm = ScriptedBackend([make_generation([a], [-2.0]) for a in ("Paris", "Lyon", "Nice", "Paris", "Lyon", "Lyon")])
        with Pipeline(method="route", routes=list(ROUTES), threshold=0.5, lm=lm, retriever=demo,
                      feedback_store=tmp_path / "f.db") as rag:  # fmt: skip
            other = rag.answer(question)
            assert other.trace.route is not None and other.trace.route.taken == ROUTES[2] and other.text == "Nice"
            row = rag.learner.store.get(other.id)
            assert (row.closed_answer, row.open_answer) == ("Paris", "Lyon")
            assert rag.feedback(other, correct=False).labels == ()
            same = rag.answer(question)
            assert same.text == "Lyon" and rag.feedback(same, correct=True).labels == (("retrieved-wrong", False),)
            assert rag.feedback(other, reference="Nice").labels == (("closed-wrong", True), ("retrieved-wrong", True))


def test_feedback_on_an_unsampled_route_answer_runs_the_missing_route_alone(tmp_path: Path) -> None:
    """A route answer shadow work did not sample: a reference on it settles the missing path by running the
    one-retrieval route alone (one call: its retrieval prompt), not the cascade again; routes with no retrieving
    route keep no twins and cost no shadow call."""
    question = "What is the capital of France?"
    with open_index(demo_index()) as demo:
        lm = ScriptedBackend([make_generation(["Nice"], [-0.01]), make_generation(["Paris"], [-2.0])])
        with Pipeline(method="route", routes=list(ROUTES[:2]), threshold=0.5, lm=lm, retriever=demo,
                      feedback_store=tmp_path / "a.db", shadow=1e-12) as rag:  # fmt: skip
            ans = rag.answer(question)  # stops at the closed-book route: the retrieval path is missing
            assert len(lm.calls) == 1 and ans.trace.route is not None and ans.trace.route.taken == ROUTES[0]
            result = rag.feedback(ans, reference="Paris")
            assert result.labels == (("closed-wrong", True),) and result.pending == ("retrieved-wrong",)
            assert rag.learner.shadow.wait(60) and len(lm.calls) == 2
            assert "Beijing" not in str(lm.calls[0]) and "Beijing" in str(lm.calls[1])  # the second read the passages
            row = rag.learner.store.get(ans.id)
            assert (row.closed_answer, row.open_answer) == ("Nice", "Paris")
        lm = ScriptedBackend([make_generation(["Nice"], [-2.0]), make_generation(["Nice"], [-2.0])])
        with Pipeline(method="route", routes=["no-retrieval", "no-retrieval-pairs-prompts"], threshold=0.5, lm=lm,
                      retriever=demo, feedback_store=tmp_path / "b.db", shadow=1.0) as rag, warnings.catch_warnings():
            warnings.simplefilter("error")  # the store takes the answer without a fault
            ans = rag.answer(question)
            row = rag.learner.store.get(ans.id)
            assert row.open_answer is None and len(lm.calls) == 2  # no shadow call: nothing stands for retrieval


def test_a_route_the_backend_cannot_run_is_refused_before_any_call() -> None:
    """A backend without log-probabilities (a server that gives none) cannot run the chain-of-thought routes: the
    pipeline refuses them when it is made, naming the first route it cannot run, before any model call."""
    from ragate.backends.base import Capabilities
    from ragate.errors import CapabilityError

    bare = Capabilities(logprobs=False, top_k=0, attentions=False, sampling=True, chat_template=True,
                        full_distribution=False, token_ids=False, prefix_cache=False)  # fmt: skip
    lm = ScriptedBackend([], capabilities=bare)
    with open_index(demo_index()) as demo, pytest.raises(CapabilityError) as refused:
        Pipeline(method="route", routes=["wo-rag", "single-rag", "dragin"], lm=lm, retriever=demo)
    assert lm.calls == []
    said = str(refused.value)
    assert "the route method cannot run its route 'wo-rag'" in said and "returns no logprobs" in said
    assert "--fallback" not in said  # a route and a dynamic method have no gate to swap (it was offered)
    with open_index(demo_index()) as demo, pytest.raises(CapabilityError) as refused:  # single-shot routes too
        Pipeline(method="route", routes=["no-retrieval", "dtr"], lm=lm, retriever=demo)
    said = str(refused.value)
    assert "the route method cannot run its route 'dtr'" in said and "returns no logprobs" in said
    assert "--fallback" not in said and not lm.calls
