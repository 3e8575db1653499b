"""The learned route policy fitted on labelled traffic (ragate.learning.route_traffic): a route pipeline with a
feedback store keeps each answer's two paths and what the learned policy reads of the first answer; references
label both paths; ``ragate calibrate --gate route --policy learned --from-store`` fits the policy on those rows
from the very features the live policy computes, and the file it writes answers through ``Pipeline``."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.cli.main import main
from ragate.errors import RagateError
from ragate.learning.route_traffic import MIN_ROWS, calibrate_routes_from_store, traffic_route_table
from ragate.learning.store import FeedbackStore
from ragate.methods.route_policy import answer_vector, question_vector
from ragate.pipeline import Pipeline
from ragate.report.routes import learned_x
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index

ROUTES = ("no-retrieval", "standard-rag")
QUESTIONS = ("Who wrote Hamlet?", "When did the war end?", "Which city is the capital of France?",
             "How many moons does Mars have?", "Where was the treaty signed?")  # fmt: skip


def _traffic(store: Path, n: int, seed: int = 0) -> list[tuple[str, list[float]]]:
    """``n`` route answers kept in ``store``, every one running both routes (no stage stops: the answers differ
    and no NLL is low enough), each labelled by a reference: the closed-book answer is right where its NLL is low.
    Returns each answer's question and the features the live learned policy would read once the first route
    answered (the question's, then the first answer's)."""
    rng = random.Random(seed)
    plan, gens = [], []
    for i in range(n):
        nll = rng.uniform(0.05, 2.0)
        right = rng.random() < 1.0 - nll / 2.0
        words = ["Paris", " city"] if i % 3 else ["Paris"]
        gens += [make_generation(words, [-nll * len(words) / len(words)] * len(words), prompt_tokens=40 + i),
                 make_generation(["Lyon"], [-1.5])]  # fmt: skip
        plan.append((f"{QUESTIONS[i % len(QUESTIONS)]} ({i})", "Paris" if right else "Nice"))
    seen = []
    with open_index(demo_index()) as demo, Pipeline(
        method="route", routes=list(ROUTES), threshold=-1.0, lm=ScriptedBackend(gens), retriever=demo,
        feedback_store=store,
    ) as rag:  # fmt: skip
        for question, reference in plan:
            ans = rag.answer(question)
            info = ans.trace.route
            assert info is not None and info.ran == ROUTES and info.answers[1] == "Lyon"
            first = answer_vector(info.nll[0], info.answers[0], info.tokens[0])
            seen.append((question, [*question_vector([question])[0].tolist(), *first]))
            rag.feedback(ans, reference=reference)
    return seen


def test_the_traffic_table_holds_the_features_the_live_policy_reads(tmp_path: Path) -> None:
    seen = _traffic(tmp_path / "f.db", 12)
    with FeedbackStore(tmp_path / "f.db") as store:
        table, models = traffic_route_table(store, ROUTES)
    assert len(models) == 1 and next(iter(models))[0] == "scripted"  # the model that answered, from each row
    assert table.questions == tuple(q for q, _ in seen)
    np.testing.assert_allclose(learned_x(table), np.array([x for _, x in seen]), rtol=0, atol=1e-12)
    assert table.costs["retrievals"].tolist() == [[0.0, 1.0]] * 12
    assert set(table.scores["em"][:, 1].tolist()) == {0.0}  # "Lyon" is never the reference


def test_calibrate_from_the_store_writes_a_learned_policy_that_pipeline_serves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "f.db"
    _traffic(store, MIN_ROWS + 10, seed=1)
    out = tmp_path / "route.json"
    argv = ["calibrate", "--gate", "route", "--policy", "learned", "--from-store", str(store), "--budget", "0.5",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    said = capsys.readouterr().out
    cal = json.loads(out.read_text())
    assert cal["policy"] == "learned" and cal["routes"] == list(ROUTES) and cal["source"] == "traffic"
    assert cal["n"] == MIN_ROWS + 10 and cal["costs"] == [0.0, 1.0] and cal["dev_retrievals"] <= 0.5 + 1e-9
    assert f"fitted on {MIN_ROWS + 10} labelled route answers" in said
    with FeedbackStore(store) as opened:
        assert calibrate_routes_from_store(opened, ROUTES, 0.5)["lambda"] == cal["lambda"]
    assert cal["model"] == "scripted"  # the model that answered the store's rows
    served = tmp_path / "served.json"  # served as the default model's, which the scripted backend stands in for
    served.write_text(json.dumps(cal | {"model": "smollm2-135m", "engine": "llama.cpp"}))
    with open_index(demo_index()) as demo:
        lm = ScriptedBackend([make_generation(["Paris"], [-0.05], prompt_tokens=40)])
        with Pipeline(method="route", calibration=served, lm=lm, retriever=demo) as rag:
            ans = rag.answer("Who wrote Hamlet? (0)")
        info = ans.trace.route
        assert info is not None and [c.kind for c in info.checks] == ["learned", "learned"]
        assert math.isclose(info.checks[1].threshold, cal["lambda"])  # the price of the one retrieval


def test_too_few_labels_other_policies_and_more_routes_are_refused_naming_the_fix(tmp_path: Path) -> None:
    store = tmp_path / "f.db"
    _traffic(store, 5)
    with FeedbackStore(store) as opened:
        with pytest.raises(RagateError, match=f"holds 5 route answers with both paths labelled.*give {MIN_ROWS - 5} more"):
            calibrate_routes_from_store(opened, ROUTES, 0.5)
        with pytest.raises(RagateError, match="traffic labels two routes"):
            calibrate_routes_from_store(opened, (*ROUTES, "standard-rag-pairs-prompts"), 0.5)
        with pytest.raises(RagateError, match="are not \\(e.g. --routes no-retrieval,standard-rag"):
            calibrate_routes_from_store(opened, ("wo-rag", "ircot"), 0.5)  # a multi-step route is not the second path
    base = ["calibrate", "--gate", "route", "--from-store", str(store)]
    assert main([*base, "--budget", "0.5"]) == 2  # the cascade's thresholds come from a run
    assert main([*base, "--policy", "learned"]) == 2  # no budget
    assert main(["calibrate", "--gate", "targ-margin", "--from-store", str(store), "--budget", "0.5"]) == 2
    assert main(["calibrate", "--gate", "route", "--policy", "learned", "--from-store", str(tmp_path / "none.db"),
                 "--budget", "0.5"]) == 2  # fmt: skip


def test_a_reference_on_an_answer_whose_retrieval_path_did_not_run_waits_for_it() -> None:
    """A policy that went straight past the one-retrieval route (closed-book answer known, no retrieval answer,
    retrieved) leaves that path's label pending on a reference, so the route alone is run to label it; a plain
    answer's pending label is its other path's, as before."""
    from ragate.learning.store import StoredAnswer, pending_labels

    def row(retrieved: bool, closed: str | None, opened: str | None) -> StoredAnswer:
        return StoredAnswer("a", "q", "route", "dtr", "x", retrieved, {}, None, {}, closed, opened)

    assert pending_labels(row(True, "Paris", None), "Paris") == ("retrieved-wrong",)
    assert pending_labels(row(True, None, "x"), "Paris") == ("closed-wrong",)
    assert pending_labels(row(False, "x", None), "Paris") == ("retrieved-wrong",)
    assert pending_labels(row(True, "Paris", "x"), "Paris") == () and pending_labels(row(True, None, None), None) == ()


def test_a_route_pipeline_learns_its_policy_from_its_own_store(tmp_path: Path) -> None:
    """``Pipeline.learn_routes(budget)`` on the pipeline that kept the answers: the same file as the command's,
    written beside the store; a pipeline of a gate method, or without a store, is refused naming the fix."""
    store = tmp_path / "f.db"
    _traffic(store, MIN_ROWS, seed=2)
    with Pipeline(method="route", routes=list(ROUTES), lm=ScriptedBackend([]), feedback_store=store) as rag:
        found = rag.learn_routes(0.5)
    assert Path(found["path"]) == tmp_path / "route-learned-0.5.json"
    assert json.loads(Path(found["path"]).read_text())["lambda"] == found["lambda"]
    with FeedbackStore(store) as opened:
        assert calibrate_routes_from_store(opened, ROUTES, 0.5)["lambda"] == found["lambda"]
    with Pipeline(method="dtr", lm=ScriptedBackend([]), feedback_store=tmp_path / "g.db") as rag, \
            pytest.raises(RagateError, match="fits a route method's policy"):  # fmt: skip
        rag.learn_routes(0.5)
    with Pipeline(method="route", routes=list(ROUTES), lm=ScriptedBackend([])) as rag, \
            pytest.raises(RagateError, match="keeps no labels"):  # fmt: skip
        rag.learn_routes(0.5)
