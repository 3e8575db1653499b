"""Routes as one method (ragate.methods.route): the cascade answers with the cheapest route and pays for the next
only where the answer fails its checks (its normalised NLL, agreement with the route before, found in its
passages); bad routes are
refused before any model call. A scripted backend gives the exact log-probabilities the checks read; SmolLM2 and
the demo index run the method as a user meets it (``ragate.Pipeline``, ``ragate ask``)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.errors import RagateError
from ragate.methods import get_method, run_method
from ragate.methods.configure import configure_method
from ragate.methods.route import answers_agree, route_cost, route_specs
from ragate.methods.trace import Stage, Trace
from ragate.pipeline import Pipeline
from ragate.retrieval.demo import demo_dir, demo_index
from ragate.retrieval.index import open_index

SINGLE = ["no-retrieval", "standard-rag", "standard-rag-pairs-prompts"]


@pytest.fixture(scope="module")
def demo() -> Iterator[Any]:
    with open_index(demo_index()) as retriever:
        yield retriever


def said(text: str, nll: float) -> Any:
    """An answer whose every token has log-probability -nll (its normalised NLL is nll)."""
    tokens = text.split(" ")
    tokens = [tokens[0], *[" " + t for t in tokens[1:]]]
    return make_generation(tokens, [-nll] * len(tokens))


def route(routes: list[str], *, stops: tuple[float, ...] | None = None, evidence: bool = False) -> Any:
    spec = configure_method(get_method("route"), None, None, None, None, None, routes=routes)
    if stops is None:
        return spec
    return spec.with_(route=spec.route.__class__(**{**vars(spec.route), "stop_nll": stops, "evidence": evidence}))


def test_a_confident_closed_book_answer_stops_the_cascade_at_the_first_route(demo: Any) -> None:
    lm = ScriptedBackend([said("Paris", 0.01)])
    trace = run_method(route(SINGLE[:2], stops=(0.5,)), "What is the capital of France?", lm, demo)
    assert trace.answer == "Paris" and not trace.retrieved and len(lm.calls) == 1  # the next route never ran
    assert trace.route is not None and trace.route.taken == "no-retrieval"
    [check] = trace.route.checks
    assert (check.kind, check.stop, check.threshold) == ("nll", True, 0.5) and math.isclose(check.score or 0, 0.01)
    assert trace.to_json()["route"]["taken"] == "no-retrieval"


def test_an_unsure_answer_pays_for_the_next_route_and_its_answer_is_the_answer(demo: Any) -> None:
    lm = ScriptedBackend([said("Lyon", 2.0), said("Paris", 0.3)])
    trace = run_method(route(SINGLE[:2], stops=(0.5,)), "What is the capital of France?", lm, demo)
    assert trace.answer == "Paris" and trace.retrieved and trace.documents and len(lm.calls) == 2
    assert trace.route is not None and trace.route.taken == "standard-rag"
    assert [(c.route, c.kind, c.stop) for c in trace.route.checks] == [("no-retrieval", "nll", False)]
    names = [s.name for s in trace.stages]
    assert names[0] == "answer" and "retrieve" in names and names[-1] == "answer"  # both routes' stages, in order
    assert trace.tokens == sum(s.prompt_tokens + s.completion_tokens for s in trace.stages)
    assert trace.answer_nll is not None and math.isclose(trace.answer_nll, 0.3)  # the answering route's, alone


def test_an_answer_that_agrees_with_the_route_before_stops_short_of_the_last_route(demo: Any) -> None:
    lm = ScriptedBackend([said("France", 2.0), said("southern France", 2.0)])  # the demo passages say "France"
    trace = run_method(route(SINGLE, stops=(0.5, 0.5), evidence=True), "What is the capital of France?", lm, demo)
    assert trace.route is not None and trace.route.taken == "standard-rag" and len(lm.calls) == 2
    kinds = [(c.kind, c.stop) for c in trace.route.checks]
    assert kinds == [("nll", False), ("nll", False), ("agree", True), ("supported", True)]
    assert "agree and supported check met" in trace.gate.reason
    lm = ScriptedBackend([said("Paris", 2.0), said("Lyon", 2.0), said("Marseille", 2.0)])
    trace = run_method(route(SINGLE, stops=(0.5, 0.5)), "What is the capital of France?", lm, demo)
    assert trace.route is not None and trace.route.taken == SINGLE[2] and trace.answer == "Marseille"
    assert len(lm.calls) == 3 and not any(c.stop for c in trace.route.checks)


def test_an_answer_not_found_in_its_passages_does_not_stop_the_cascade(demo: Any) -> None:
    """The evidence check vetoes: "Paris" agrees with the closed-book answer and its NLL is under the threshold,
    but none of the passages the demo index returns says it, so the cascade pays for the next route; with
    ``evidence`` off (the default) the same answers stop there."""
    question = "What is the capital of France?"
    lm = ScriptedBackend([said("Paris", 2.0), said("Paris", 0.1), said("Lyon", 2.0)])
    trace = run_method(route(SINGLE, stops=(0.5, 0.5), evidence=True), question, lm, demo)
    assert trace.route is not None and trace.route.taken == SINGLE[2] and len(lm.calls) == 3
    checks = [(c.route, c.kind, c.score, c.stop) for c in trace.route.checks]
    assert checks == [("no-retrieval", "nll", 2.0, False), ("standard-rag", "nll", pytest.approx(0.1), False),
                      ("standard-rag", "supported", 0.0, False)]  # fmt: skip  (vetoed: no check stopped it)
    assert trace.gate.score == pytest.approx(0.1)  # the decision's score: the last NLL check read
    lm = ScriptedBackend([said("Paris", 2.0), said("yes", 0.1)])  # yes/no: the evidence check says nothing
    trace = run_method(route(SINGLE, stops=(0.5, 0.5), evidence=True), "Is Paris in France?", lm, demo)
    assert trace.route is not None and trace.route.taken == "standard-rag" and len(lm.calls) == 2
    assert [c.kind for c in trace.route.checks] == ["nll", "nll"]
    spec = route(SINGLE, stops=(0.5, 0.5))
    assert not spec.route.evidence
    lm = ScriptedBackend([said("Paris", 2.0), said("Paris", 0.1), said("Lyon", 2.0)])
    trace = run_method(spec, question, lm, demo)
    assert trace.route is not None and trace.route.taken == "standard-rag" and len(lm.calls) == 2
    assert [c.kind for c in trace.route.checks] == ["nll", "nll"]


def test_answers_agree_as_normalised_words() -> None:
    assert answers_agree("Paris", "paris, France") and answers_agree("The Louvre", "louvre")
    assert not answers_agree("Paris", "Parisian") and not answers_agree("", "") and not answers_agree("Paris", "Lyon")


def test_the_answer_nll_reads_the_calls_that_wrote_the_answer() -> None:
    from ragate.gates.base import GateDecision

    def trace(*stages: Stage) -> Trace:
        return Trace("m", "q", "a", False, GateDecision(False, 0.0, 0.0, ""), (), (), stages)

    draft = Stage("draft", 10, 4, 0.1, logprob=-2.0)
    assert trace(draft).answer_nll == 0.5  # the draft kept as the answer
    answer = Stage("answer", 50, 2, 0.1, logprob=-3.0)
    assert trace(Stage("draft", 10, 4, 0.1, True, logprob=-9.0), Stage("retrieve", 0, 0, 0.1), answer).answer_nll == 1.5
    assert trace(Stage("answer", 50, 2, 0.1)).answer_nll is None  # no log-probabilities given
    assert trace(Stage("answer", 50, 0, 0.1, logprob=0.0)).answer_nll is None  # nothing generated
    assert Stage.of("answer", said("a b", 0.25)).logprob == -0.5


@pytest.mark.parametrize(
    ("routes", "words"),
    [
        (["no-retrieval"], "two routes or more"),
        (["no-retrieval", "no-retrieval"], "given twice"),
        (["standard-rag", "no-retrieval"], "cheapest first"),
        (["wo-rag", "standard-rag"], "one format"),
        (["no-retrieval", "route"], "itself a route method"),
        (["no-retrieval", "standrd-rag"], "Did you mean 'standard-rag'"),
    ],
)
def test_bad_routes_are_refused_before_the_model_loads(routes: list[str], words: str) -> None:
    with pytest.raises(RagateError, match=words):
        Pipeline(method="route", routes=routes, model="no-such-model-anywhere")  # refused before the model loads


def test_routes_go_with_the_route_method_and_stop_thresholds_match_the_stages() -> None:
    with pytest.raises(RagateError, match="routes= goes with method='route'"):
        Pipeline(method="dtr", routes=["no-retrieval", "standard-rag"], model="no-such-model-anywhere")
    spec = get_method("route")
    assert spec.route is not None
    with pytest.raises(RagateError, match="give 2 stop thresholds, not 1"):
        route_specs(spec.route.__class__(spec.route.routes, stop_nll=(0.5,)))
    assert [route_cost(s) for s in route_specs(spec.route)] == [0, 1, 2]  # wo-rag, single-rag, ircot
    assert spec.with_threshold(0.7).route.stop_nll == (0.7, 0.7)  # type: ignore[union-attr]


def test_savings_are_beside_always_taking_the_last_route(demo: Any) -> None:
    """Measured where the cascade went on to the last route (its own stages), estimated from those answers where
    it stopped before, unknown until one has; the routes run before the answering one are the decision's cost."""
    from ragate.answers.savings import AlwaysRetrieveCost

    costs = AlwaysRetrieveCost()
    spec = route(SINGLE[:2], stops=(0.5,))
    sure = run_method(spec, "What is the capital of France?", ScriptedBackend([said("Paris", 0.01)]), demo)
    first = costs.savings(sure)
    assert (first.how, first.always, first.gate.tokens) == ("unknown", None, 0)
    unsure = run_method(spec, "Which city is it?", ScriptedBackend([said("Lyon", 2.0), said("Paris", 0.3)]), demo)
    went = costs.savings(unsure)
    closed = sum(s.prompt_tokens + s.completion_tokens for s in unsure.stages[: unsure.route.stages[0]])  # type: ignore[union-attr]
    assert went.how == "measured" and went.gate.tokens == closed > 0
    assert went.always is not None and went.always.tokens == unsure.tokens - closed
    again = costs.savings(sure)
    assert again.how == "estimated" and again.always == went.always and "took standard-rag" in again.estimator
    assert again.saved is not None and again.saved.tokens == went.always.tokens - sure.tokens


def test_a_route_method_has_no_gate_to_run_alone(demo: Any) -> None:
    from ragate.methods.runner import decide

    with pytest.raises(ValueError, match="no gate to run before the answer"):
        decide(route(SINGLE[:2]), "q", ScriptedBackend([]), demo)


def test_pipeline_and_ask_answer_with_routes_on_smollm2(smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    question = json.loads((demo_dir() / "questions.jsonl").read_text().splitlines()[0])["question"]
    with Pipeline(method="route", routes=["no-retrieval", "standard-rag"], max_tokens=8, threshold=0.0) as rag:
        ans = rag.answer(question)
        saved = rag.savings(ans.trace)  # beside always taking the last route: measured, as it took it
    assert ans.trace.route is not None and ans.trace.route.taken == "standard-rag"  # no answer has NLL 0
    first = ans.trace.route.stages[0]  # the closed-book route's stages, paid before the last route
    assert saved.how == "measured" and saved.spent.tokens == ans.trace.tokens > 0
    assert saved.gate.tokens == sum(s.prompt_tokens + s.completion_tokens for s in ans.trace.stages[:first]) > 0
    assert saved.always is not None and saved.always.tokens == ans.trace.tokens - saved.gate.tokens
    assert saved.saved is not None and saved.saved.tokens == -saved.gate.tokens  # the cascade cost more here
    assert ans.retrieved and ans.documents and ans.trace.route.checks[0].score is not None
    assert ans.to_json()["route"]["checks"][0]["kind"] == "nll"
    from ragate.cli.main import main

    capsys.readouterr()
    argv = ["ask", question, "--method", "route", "--routes", "no-retrieval,standard-rag", "--max-tokens", "8"]
    assert main([*argv, "--json", "--quiet"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["route"]["routes"] == ["no-retrieval", "standard-rag"] and record["route"]["checks"]
    assert main(["ask", question, "--method", "route", "--routes", "standard-rag,no-retrieval"]) == 2
    err = capsys.readouterr().err
    assert "cheapest first" in err and "Traceback" not in err


def test_the_page_says_in_words_why_a_route_answered() -> None:
    from ragate.methods.trace import RouteCheck, RouteInfo
    from ragate.service.plain import route_reason

    routes = ("wo-rag", "single-rag", "ircot")

    def said(taken: str, *checks: tuple[str, str, float, bool]) -> str:
        return route_reason(RouteInfo(routes, taken, tuple(RouteCheck(r, k, s, 1.0, stop) for r, k, s, stop in checks)))

    assert said("wo-rag", ("wo-rag", "nll", 0.1, True)) == (
        "answered by wo-rag: its answer was confident enough, so no costlier route ran"
    )
    assert said("single-rag", ("wo-rag", "nll", 2.0, False), ("single-rag", "nll", 2.0, False),
                ("single-rag", "agree", 1.0, True), ("single-rag", "supported", 1.0, True)) == (
        "answered by single-rag: its answer agreed with the route before it and its passages hold it, so no "
        "costlier route ran"
    )  # fmt: skip
    assert "an answer not found in its passages went on" in said(
        "ircot", ("wo-rag", "nll", 2.0, False), ("single-rag", "agree", 1.0, False), ("single-rag", "supported", 0.0, False)
    )
    assert "passages" not in said(  # it failed its checks anyway: the evidence check changed nothing
        "ircot", ("wo-rag", "nll", 2.0, False), ("single-rag", "agree", 0.0, False), ("single-rag", "supported", 0.0, False)
    )
    assert "question classifier (Adaptive-RAG) chose it" in said("ircot", ("ircot", "classifier", 0.7, True))
    assert "learned policy" in said("single-rag", ("wo-rag", "learned", 0.1, False), ("single-rag", "learned", 0.4, True))
