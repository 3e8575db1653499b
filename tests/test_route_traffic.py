"""The learned route policy fitted on labelled traffic (ragate.learning.route_traffic): a route pipeline with a
feedback store keeps each answer's two paths and what the learned policy reads of the first answer; references
label both paths; ``ragate calibrate --gate route --policy learned --from-store`` fits the policy on those rows
from the very features the live policy computes, and the file it writes answers through ``Pipeline``."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragate.backends.base import Generation
from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.cli.main import main
from ragate.errors import RagateError
from ragate.learning.route_traffic import MIN_ROWS, calibrate_routes_from_store, traffic_route_table
from ragate.learning.store import FeedbackStore
from ragate.methods import run_method
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
        traffic = traffic_route_table(store, ROUTES)
    table, models = traffic.table, traffic.models
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


def _mixed_traffic(store: Path, n: int, seed: int) -> None:
    """``n`` answers of a closed-book / one-retrieval cascade that stops where the closed-book answer's NLL is at
    most 1, each labelled by a reference "Paris": the closed-book answer is right more often where its NLL is
    low, the retrieval answer on 60% of questions; where the cascade stopped, shadow work answers the retrieval
    route alone (waited for, so the scripted calls stay in order)."""
    rng = random.Random(seed)
    with open_index(demo_index()) as demo:
        queue: list[Generation] = []
        lm = ScriptedBackend(lambda _: queue.pop(0))
        with Pipeline(method="route", routes=list(ROUTES), threshold=1.0, lm=lm, retriever=demo,
                      feedback_store=store, shadow=1e-12) as rag:  # fmt: skip
            for i in range(n):
                nll = rng.uniform(0.05, 2.0)
                closed = "Paris" if rng.random() < 1.0 - nll / 2.0 else "Nice"
                opened = "Paris" if rng.random() < 0.6 else "Lyon"
                queue[:] = [make_generation([closed], [-nll], prompt_tokens=40 + i), make_generation([opened], [-1.0])]
                ans = rag.answer(f"{QUESTIONS[i % len(QUESTIONS)]} ({i})")
                rag.feedback(ans, reference="Paris")
                assert rag.learner.shadow is not None and rag.learner.shadow.wait(60)


def test_the_comparison_with_the_policy_in_force_says_which_picks_better(tmp_path: Path) -> None:
    """At the in-force policy's own number of closed-book stops: against the oracle's stops (the closed-book answer
    right) the new policy picks worse; against the reverse, better; with too few stops, no comparison."""
    from ragate.learning.route_traffic import compare_with_in_force

    store = tmp_path / "f.db"
    _traffic(store, 40, seed=3)
    with FeedbackStore(store) as opened:
        table = traffic_route_table(opened, ROUTES).table
    closed_right = table.scores["em"][:, 0] > 0
    assert 3 <= closed_right.sum() <= len(table) - 3
    best = compare_with_in_force(table, closed_right)
    assert best is not None and not best.earns and best.gap[0] < 0 and best.in_force == closed_right.mean()
    assert best.stopped == int(closed_right.sum()) and "the policy in force stays" in best.summary()
    worst = compare_with_in_force(table, ~closed_right)
    assert worst is not None and worst.earns and worst.gap[1] > 0 and worst.in_force == 0.0
    assert "higher" in worst.summary() and worst.as_dict()["earns"] is True
    assert compare_with_in_force(table, np.arange(len(table)) < 2) is None


@pytest.mark.parametrize("seed", [0, 2])  # seed 0: it picks worse (a candidate); 2: it earns its place
def test_a_route_policy_learned_with_use_goes_in_force_only_where_it_picks_as_well(tmp_path: Path, seed: int) -> None:
    """``learn_routes(use=True)`` on the cascade's own labelled traffic: the comparison with the cascade's stops on
    those answers decides; in force, the pipeline answers with the learned policy's checks, else the fit stays a
    candidate file beside the store and the cascade answers on."""
    store = tmp_path / "f.db"
    _mixed_traffic(store, 36, seed)
    lm = ScriptedBackend([make_generation(["Paris"], [-0.05], prompt_tokens=40), make_generation(["Paris"], [-1.0])])
    with open_index(demo_index()) as demo, Pipeline(
        method="route", routes=list(ROUTES), threshold=1.0, lm=lm, retriever=demo, feedback_store=store, shadow=1e-12
    ) as rag:  # fmt: skip
        found = rag.learn_routes(0.5, use=True)
        compared = found["compared"]
        assert compared["n"] == 36 and 3 <= compared["stopped"] <= 33 and "gap" in compared
        assert found["in_force"] is compared["earns"]
        written = json.loads(Path(found["path"]).read_text())
        assert written["compared"] == compared and written["lambda"] == found["lambda"]
        route = rag.spec.route
        assert route is not None
        assert compared["earns"] is (seed == 2)  # both ways are tested
        if compared["earns"]:
            assert Path(found["path"]).name == "route-learned-0.5.json" and route.policy == "learned"
            assert rag.calibration is not None and rag.calibration["lambda"] == found["lambda"]
            info = rag.answer("Who wrote Hamlet? (0)").trace.route
            assert info is not None and info.checks[0].kind == "learned"
        else:
            assert Path(found["path"]).name == "route-learned-0.5.candidate.json" and route.policy == "cascade"
            assert "the policy in force stays" in compared["summary"]


def test_a_first_route_policy_goes_in_force_and_what_cannot_be_learned_is_refused(tmp_path: Path) -> None:
    """Traffic the cascade never stopped closed-book gives no comparison: the first fit goes in force (as a
    first learned gate does), saying so; a later fit with no comparison against that fitted policy's own
    decisions stays a candidate. Refused, naming the fix: no shadow work (the answers stopped closed-book would
    never get both labels), use= on more routes than traffic labels, and no budget where the pipeline holds
    neither a live route budget nor a calibration file with one."""
    store = tmp_path / "f.db"
    _traffic(store, MIN_ROWS, seed=2)
    with Pipeline(method="route", routes=list(ROUTES), lm=ScriptedBackend([]), feedback_store=store) as rag, \
            pytest.raises(RagateError, match="give shadow="):  # fmt: skip
        rag.learn_routes(0.5, use=True)
    with Pipeline(method="route", routes=list(ROUTES), threshold=-1.0, lm=ScriptedBackend([]), feedback_store=store,
                  shadow=1e-12) as rag:  # the policy that answered the traffic
        with pytest.raises(RagateError, match="give the budget a route policy is fitted for"):
            rag.learn_routes(use=True)
        found = rag.learn_routes(0.5, use=True)
        compared = found["compared"]
        assert found["in_force"] and compared["n"] == MIN_ROWS and compared["stopped"] == 0
        assert "it goes in force, the first policy fitted on traffic" in compared["summary"]
        assert rag.spec.route is not None and rag.spec.route.policy == "learned"
        again = rag.learn_routes(use=True)  # the budget now the calibration's in force; none of its decisions labelled
        assert not again["in_force"] and again["compared"]["n"] == 0 and "it stays a candidate" in again["compared"]["summary"]
        assert again["path"].endswith("route-learned-0.5.candidate.json")
        assert rag.calibration is not None and rag.calibration["lambda"] == found["lambda"]  # the first stays
    with Pipeline(method="route", routes=[*ROUTES, "standard-rag-pairs-prompts"], lm=ScriptedBackend([]), feedback_store=store) as rag, \
            pytest.raises(RagateError, match="this pipeline routes among no-retrieval, standard-rag, standard-rag-pairs-prompts"):  # fmt: skip
        rag.learn_routes(0.5, use=True)


def test_a_live_route_budget_takes_the_policy_put_in_force_and_its_window_starts_anew(tmp_path: Path) -> None:
    """A pipeline holding a live route budget: a fit for another budget is refused; one for the live budget that
    goes in force becomes the controller's policy (its window emptied, lambda the new fit's), and an answer the old
    policy gave after that is left out of the window."""
    store, elsewhere = tmp_path / "f.db", tmp_path / "elsewhere.db"
    _mixed_traffic(store, 36, seed=2)
    _mixed_traffic(elsewhere, 36, seed=1)  # the policy in force is fitted on other answers
    first = tmp_path / "first.json"
    with Pipeline(method="route", routes=list(ROUTES), lm=ScriptedBackend([]), feedback_store=elsewhere) as rag:
        fitted = {k: v for k, v in rag.learn_routes(0.5).items() if k not in ("source", "path")}  # as from a sweep
        first.write_text(json.dumps(fitted | {"model": "smollm2-135m", "engine": "llama.cpp"}))
    lm = ScriptedBackend([make_generation(["Paris"], [-0.05], prompt_tokens=40), make_generation(["Paris"], [-1.0])] * 4)
    with open_index(demo_index()) as demo, Pipeline(
        method="route", calibration=first, budget=0.5, lm=lm, retriever=demo, feedback_store=store, shadow=1e-12
    ) as rag:  # fmt: skip
        with pytest.raises(RagateError, match="the live route budget holds 0.5 retrievals per question"):
            rag.learn_routes(0.8, use=True)
        old = rag.spec
        rag.answer("Who wrote Hamlet? (0)")
        assert rag.budget is not None and rag.budget.snapshot()["window_requests"] == 1
        found = rag.learn_routes(use=True)
        assert found["budget"] == 0.5 and found["in_force"] is found["compared"]["earns"]
    assert found["compared"]["n"] == 0  # the file's policy decided none of the labelled answers: no comparison
    assert found["in_force"]  # the first fitted on traffic (the file in force was fitted elsewhere)
    assert rag.spec.route is not None and rag.spec.route.model is not None
    assert rag.budget.snapshot()["window_requests"] == 0 and rag.budget.tau == rag.spec.route.model.lam
    with open_index(demo_index()) as demo:
        trace = run_method(old, "Who wrote Hamlet? (1)", lm, demo)
    rag.budget.observe_trace(trace, old)  # answered by the old policy after the swap: not the new window's
    assert rag.budget.snapshot()["window_requests"] == 0 and rag.budget.snapshot()["observed"] == 2


def test_the_service_refit_learns_a_route_policy_and_refuses_routes_it_cannot(tmp_path: Path) -> None:
    """``ragate serve --refit-every N --method route``: the refit fits the route policy from the store (the first
    one goes in force, /healthz's summary says why); a route server whose policy traffic cannot learn (more routes
    than the two it labels, or no budget) is refused when it is made, naming the fix."""
    from ragate.service.refit import Refit

    store = tmp_path / "f.db"
    _traffic(store, MIN_ROWS, seed=2)
    with Pipeline(method="route", routes=list(ROUTES), lm=ScriptedBackend([]), feedback_store=store,
                  shadow=1e-12) as rag, pytest.raises(RagateError, match="give the budget a route policy is fitted for"):  # fmt: skip
        Refit(rag, 5, None)
    cal = tmp_path / "cascade.json"  # a cascade calibration with a budget: the refit fits for it
    cal.write_text(json.dumps({"method": "route", "policy": "cascade", "routes": list(ROUTES), "stops": [None],
                               "budget": 0.5, "model": "smollm2-135m", "engine": "llama.cpp"}))  # fmt: skip
    with Pipeline(method="route", calibration=cal, lm=ScriptedBackend([]), feedback_store=store, shadow=1e-12) as rag:
        refit = Refit(rag, 5, None)
        refit.last_fit_labels -= 5  # as if five labels came since
        refit.check()
        refit.wait(60)
        said = refit.describe()
        assert said["fits"] == 1 and said["last_error"] is None and said["last_in_force"] is True, said
        assert "route policy" in said["last_summary"] and "it goes in force" in said["last_summary"]
        assert rag.spec.route is not None and rag.spec.route.policy == "learned"
    with Pipeline(method="route", routes=[*ROUTES, "standard-rag-pairs-prompts"], lm=ScriptedBackend([]),
                  feedback_store=store) as rag, pytest.raises(RagateError, match="learn with use=False"):  # fmt: skip
        Refit(rag, 5, None)


def test_a_route_server_whose_policy_traffic_cannot_learn_is_refused_when_made(tmp_path: Path) -> None:
    """``ragate serve --method route --refit-every N`` without a budget to fit for: refused as the app is made,
    naming the fix, before any model call."""
    from ragate.service.app import create_app
    from ragate.service.settings import ServiceSettings

    settings = ServiceSettings(method="route", routes=ROUTES, refit_every=5, feedback_store=str(tmp_path / "f.db"),
                               shadow=1e-12)  # fmt: skip
    lm = ScriptedBackend([])
    with open_index(demo_index()) as demo, pytest.raises(RagateError, match="give the budget a route policy is fitted"):
        create_app(settings, lm, demo)
    assert lm.calls == []
    with pytest.raises(ValueError, match="--refit-cascade makes the refit's learned gate a cascade"):
        ServiceSettings(method="route", refit_every=5, refit_cascade=0.3, shadow=1e-12)


def test_a_real_route_server_learns_its_policy_from_references_and_puts_it_in_force(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """A real ``ragate serve --method route --feedback-store F --refit-every N`` on 127.0.0.1 with SmolLM2, serving
    a cascade file that never stops closed-book. The store already holds earlier labelled route answers of this
    model (written through the store, as the server writes them: its first answer's row gives the model and the
    features' shape); a user's reference on a new answer brings N labels, the refit fits the learned route policy,
    /healthz says it went in force (no comparison: the cascade stopped none) and the next answer is chosen by its
    learned checks."""
    import time

    import httpx
    from test_service import _serve, _stop

    from ragate.learning.route_traffic import FIRST_NLL, FIRST_TOKENS

    cal = tmp_path / "cascade.json"
    cal.write_text(json.dumps({"method": "route", "policy": "cascade", "routes": list(ROUTES), "stops": [None],
                               "agree": True, "budget": 0.5, "model": "smollm2-135m"}))  # fmt: skip
    store = tmp_path / "feedback.db"
    proc, url = _serve(["--method", "route", "--calibration", str(cal), "--feedback-store", str(store),
                        "--shadow", "1e-12", "--refit-every", "5"], tmp_path / "serve.log")  # fmt: skip

    def ask(question: str) -> dict[str, Any]:
        r = httpx.post(f"{url}/v1/answer", json={"question": question, "options": {"max_tokens": 4}}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    try:
        first = ask("Who wrote Hamlet?")
        assert first["route"]["ran"] == list(ROUTES), first["route"]
        rng = random.Random(0)
        with FeedbackStore(store) as kept:
            row = kept.get(first["id"])
            assert row is not None and {FIRST_NLL, FIRST_TOKENS} <= set(row.features)
            for i in range(MIN_ROWS - 1):  # earlier traffic: both paths answered and labelled by a reference
                closed, opened = rng.choice(["Paris", "Nice"]), rng.choice(["Paris", "Lyon"])
                kept.record_answer(
                    f"earlier{i}", question=f"{QUESTIONS[i % len(QUESTIONS)]} ({i})", method=row.method,
                    prompts=row.prompts, answer=opened, retrieved=True, hidden=None, model=row.model,
                    features={FIRST_NLL: rng.uniform(0.1, 2.0), FIRST_TOKENS: float(rng.randint(30, 60))},
                    paths=(closed, opened),
                )  # fmt: skip
                kept.add_label(f"earlier{i}", source="feedback", kind="closed-wrong", value=closed != "Paris")
                kept.add_label(f"earlier{i}", source="feedback", kind="retrieved-wrong", value=opened != "Paris")
        f = httpx.post(f"{url}/v1/feedback", json={"id": first["id"], "reference": first["answer"]}, timeout=60)
        assert f.status_code == 200, f.text
        deadline = time.monotonic() + 120
        while True:
            refit = httpx.get(f"{url}/healthz", timeout=30).json()["learning"]["refit"]
            if refit["fits"] or refit["last_error"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert refit["fits"] == 1 and refit["last_error"] is None and refit["last_in_force"] is True, refit
        assert "route policy" in refit["last_summary"] and "it goes in force" in refit["last_summary"]
        learned = json.loads((tmp_path / "route-learned-0.5.json").read_text())
        assert learned["source"] == "traffic" and learned["n"] == MIN_ROWS
        assert ask("When did the war end?")["route"]["checks"][0]["kind"] == "learned"
    finally:
        _stop(proc)
