"""TARG section 5.1's expanded baselines on hand-made inputs: self-eval, Self-RAG-lite, CRAG-lite and SKR (its
kNN vote, its label file, and the rule that it never votes with its own test questions)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragate.backends.scripted import ScriptedBackend, make_generation, text_generation
from ragate.errors import RagateError
from ragate.gates import skr
from ragate.methods import get_method, run_method
from ragate.methods.crag_lite import action, kept
from ragate.methods.spec import CragSpec


def yes_no(p_yes: float) -> Any:
    """A one-token reply whose first step puts ``p_yes`` on "Yes" and the rest on "No"."""
    word = "Yes" if p_yes > 0.5 else "No"
    top = [("Yes", math.log(p_yes)), ("No", math.log(1 - p_yes))]
    return make_generation([word], [dict(top)[word]], [top])


def answer(text: str) -> Any:
    return make_generation([text], [-0.05])


@pytest.fixture
def dense(wiki_dense: Any) -> Any:
    return wiki_dense


# --- self-eval: TARG's "do you need to search for this?"


def test_self_eval_retrieves_on_yes_and_answers_closed_book_on_no(dense: Any) -> None:
    lm = ScriptedBackend([yes_no(0.8), answer("Alexander Fleming")])
    trace = run_method(get_method("self-eval"), "Who discovered penicillin?", lm, dense)
    assert trace.retrieved and trace.gate.score == pytest.approx(0.8) and len(trace.documents) == 5
    assert "Do you need to search for this?" in lm.calls[0].prompt[-1].content  # type: ignore[union-attr]
    assert lm.calls[0].max_tokens == 4 and "Fleming" in lm.calls[1].prompt[-1].content  # type: ignore[union-attr]
    lm = ScriptedBackend([yes_no(0.3), answer("Paris")])
    trace = run_method(get_method("self-eval"), "Capital of France?", lm, dense)
    assert not trace.retrieved and trace.answer == "Paris" and not trace.documents
    assert trace.gate.score == pytest.approx(0.3) and "without searching" in trace.gate.reason
    assert [(s.name, s.overhead) for s in trace.stages] == [("self-eval", True), ("answer", False)]
    # a threshold moves the decision on the same reply
    lm = ScriptedBackend([yes_no(0.3), answer("Paris")])
    spec = get_method("self-eval")
    lowered = spec.with_(gate=spec.gate.__class__("self-eval", threshold=0.2))
    assert run_method(lowered, "Capital of France?", lm, dense).retrieved


def test_self_eval_without_logprobs_reads_the_word() -> None:
    from ragate.gates.self_eval import self_eval

    assert self_eval(text_generation("No, I know this.")).retrieve is False
    assert self_eval(text_generation("Yes.")).retrieve is True
    unclear = self_eval(text_generation("Perhaps"))
    assert unclear.retrieve and unclear.score == 0.5 and "unclear reply" in unclear.reason


# --- Self-RAG-lite: draft, one reflection, at most one retrieval


def test_self_rag_lite_keeps_a_supported_draft_and_retrieves_for_one_that_needs_evidence(dense: Any) -> None:
    lm = ScriptedBackend([answer("Paris"), yes_no(0.1)])
    trace = run_method(get_method("self-rag-lite"), "Capital of France?", lm, dense)
    assert not trace.retrieved and trace.answer == "Paris" and len(lm.calls) == 2  # the draft is the answer
    reflection = lm.calls[1].prompt[-1].content  # type: ignore[union-attr]
    assert "Draft answer: Paris" in reflection and "needs evidence" in reflection
    lm = ScriptedBackend([answer("Louis Pasteur"), yes_no(0.9), answer("Alexander Fleming")])
    trace = run_method(get_method("self-rag-lite"), "Who discovered penicillin?", lm, dense)
    assert trace.retrieved and trace.answer == "Alexander Fleming" and len(lm.calls) == 3
    assert [s.name for s in trace.stages] == ["draft", "reflect", "retrieve", "answer"]
    assert trace.gate.score == pytest.approx(0.9) and "needs evidence" in trace.gate.reason


# --- CRAG-lite: grade the top-k, act on the grades


def test_crag_actions_follow_its_two_thresholds() -> None:
    assert action([0.1, 0.8, 0.2], 0.7, 0.3) == "correct"
    assert action([0.1, 0.29], 0.7, 0.3) == "incorrect"
    assert action([0.3, 0.5], 0.7, 0.3) == "ambiguous"  # lower is inclusive, upper is reached at >=
    assert action([], 0.7, 0.3) == "incorrect"
    assert kept(["a", "b", "c"], [0.9, 0.1, 0.3], 0.3) == ["a", "c"]  # type: ignore[list-item]
    assert kept(["a", "b"], [0.1, 0.2], 0.3) == ["a", "b"]  # type: ignore[list-item]


def test_crag_lite_reads_only_the_passages_it_graded_relevant(dense: Any) -> None:
    grades = [0.9, 0.1, 0.4, 0.2, 0.05]
    lm = ScriptedBackend([*(yes_no(g) for g in grades), answer("Alexander Fleming")])
    trace = run_method(get_method("crag-lite"), "Who discovered penicillin?", lm, dense)
    assert len(lm.calls) == 6 and trace.retrieved and trace.answer == "Alexander Fleming"
    assert len(trace.documents) == 2 and "correct" in trace.gate.reason  # the 0.9 and the 0.4 passages
    graded = [c.prompt[-1].content for c in lm.calls[:5]]  # type: ignore[union-attr]
    assert all("Passage:" in g for g in graded)
    read = lm.calls[5].prompt[-1].content  # type: ignore[union-attr]
    assert all(d.passage.text[:40] in read for d in trace.documents)
    assert [s.name for s in trace.stages].count("retrieve") == 1


def test_crag_lite_incorrect_answers_closed_book_or_rewrites_once(dense: Any) -> None:
    lm = ScriptedBackend([*(yes_no(0.1) for _ in range(5)), answer("Paris")])
    trace = run_method(get_method("crag-lite"), "Capital of France?", lm, dense)
    assert trace.answer == "Paris" and not trace.documents and "answered closed-book" in trace.gate.reason
    assert "Passage" not in lm.calls[-1].prompt[-1].content  # type: ignore[union-attr]
    rewrite = ScriptedBackend(
        [
            *(yes_no(0.1) for _ in range(5)),
            answer("penicillin discovery Fleming"),
            answer("Alexander Fleming"),
        ]
    )
    trace = run_method(get_method("crag-lite-rewrite"), "Who found the mould drug?", rewrite, dense)
    assert trace.queries == ("Who found the mould drug?", "penicillin discovery Fleming")
    assert [s.name for s in trace.stages].count("retrieve") == 2 and len(trace.documents) == 5
    assert any("penicillin" in d.passage.text.lower() for d in trace.documents)
    assert get_method("crag-lite").crag == CragSpec()


def test_crag_lite_is_not_a_gate_to_sweep() -> None:
    from ragate.methods import decide

    with pytest.raises(ValueError, match="grades what it found"):
        decide(get_method("crag-lite"), "q?", ScriptedBackend([]), None)


# --- SKR: the kNN vote and its label file


def _labels(minilm: Any, dense: Any, questions: list[str], retrieve: list[bool], **meta: Any) -> skr.LabelSet:
    from ragate.methods.runner import encoder_identity

    embeddings = np.asarray(dense.embed_queries(questions), dtype=np.float32)
    base = {"encoder": encoder_identity(dense), "model": {"engine": "scripted", "model": "scripted"}}
    return skr.LabelSet(
        tuple(f"t{i}" for i in range(len(questions))),
        tuple(questions),
        np.array(retrieve, dtype=bool),
        embeddings,
        base | meta,
    )


TRAIN = [
    "Who discovered penicillin?",
    "Which scientist found penicillin in 1928?",
    "Who first isolated penicillin from mould?",
    "What is the capital of France?",
    "Which city is the French capital?",
    "Paris is the capital of which country?",
]


def test_skr_vote_is_the_share_of_the_nearest_labelled_questions(minilm: Any, dense: Any) -> None:
    labels = _labels(minilm, dense, TRAIN, [True, True, True, False, False, False])
    query = dense.embed_queries(["Who was the discoverer of penicillin?"])[0]
    assert skr.vote(query, labels, k=3) == (1.0, 3, 0)  # the three penicillin questions
    share, voters, _ = skr.vote(query, labels, k=5)
    assert (share, voters) == (pytest.approx(0.6), 5)
    assert skr.vote(query, labels, k=50)[1] == 6  # no more voters than labels
    france = dense.embed_queries(["Name the capital city of France."])[0]
    assert skr.vote(france, labels, k=2)[0] == 0.0
    d = skr.skr_decision(0.6, 0.5, 5)
    assert d.retrieve and "3 of the 5 nearest" in d.reason
    assert not skr.skr_decision(0.5, 0.5, 4).retrieve  # a tie does not retrieve: share must exceed tau


def test_skr_never_votes_with_the_question_itself(minilm: Any, dense: Any) -> None:
    labels = _labels(minilm, dense, TRAIN, [True, False, False, False, False, False])
    own = dense.embed_queries([TRAIN[0]])[0]
    assert skr.vote(own, labels, k=1) == (1.0, 1, 0)  # with itself as a neighbour, it copies its own label
    share, voters, excluded = skr.vote(own, labels, k=1, exclude="  who discovered PENICILLIN ")
    assert (share, voters, excluded) == (0.0, 1, 1)  # excluded by its normalised text: its neighbour votes
    with pytest.raises(RagateError, match="no question other than this one"):
        skr.vote(own, _labels(minilm, dense, TRAIN[:1], [True]), exclude=TRAIN[0])


def test_skr_method_reads_the_label_file_and_checks_encoder_and_model(
    minilm: Any, dense: Any, tmp_path: Path, tiny_encoder_dir: Path
) -> None:
    path = skr.save_labels(
        _labels(minilm, dense, TRAIN, [True, True, True, False, False, False]), tmp_path / "l.npz"
    )
    spec = get_method("skr")
    spec = spec.with_(gate=spec.gate.__class__("skr", labels=str(path), neighbours=3))
    lm = ScriptedBackend([answer("Alexander Fleming")])
    trace = run_method(spec, "Who was the discoverer of penicillin?", lm, dense)
    assert trace.retrieved and trace.gate.score == 1.0 and len(lm.calls) == 1  # the vote costs no LM call
    lm = ScriptedBackend([answer("Paris")])
    trace = run_method(spec, "What is the capital of France?", lm, dense)
    assert not trace.retrieved and trace.answer == "Paris" and "did not vote" in trace.gate.reason
    with pytest.raises(RagateError, match="what model 'scripted'"):
        run_method(spec, "Who?", ScriptedBackend([], model="another-model"), dense)
    with pytest.raises(RagateError, match="needs a label set"):
        run_method(get_method("skr"), "Who?", ScriptedBackend([]), dense)
    other = skr.LabelSet(*(getattr(skr.load_labels(path), f) for f in ("ids", "questions", "retrieve",
                         "embeddings")), {"encoder": {"name": "tiny-64", "dim": 64}, "model": {}})  # fmt: skip
    with pytest.raises(RagateError, match="refit the labels with this index"):
        skr.check_encoder(other, dense.encoder.identity(), "this index")


def test_skr_label_file_round_trips_without_pickle_and_damage_is_named(
    minilm: Any, dense: Any, tmp_path: Path
) -> None:
    labels = _labels(minilm, dense, TRAIN, [True, False, True, False, False, False], dataset="demo")
    path = skr.save_labels(labels, tmp_path / "labels.npz")
    back = skr.load_labels(path)
    assert back.questions == labels.questions and back.retrieve.tolist() == labels.retrieve.tolist()
    assert np.array_equal(back.embeddings, labels.embeddings) and back.meta["dataset"] == "demo"
    with np.load(path, allow_pickle=False) as data:  # plain arrays: loads with pickle refused
        assert set(data.files) == {"ids", "questions", "retrieve", "embeddings", "meta"}
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(RagateError, match="not an SKR label set"):
        skr.load_labels(path)
    with pytest.raises(RagateError, match="skr fit"):
        skr.load_labels(tmp_path / "missing.npz")
    np.savez(tmp_path / "other.npz", meta=np.array('{"format": "something else"}'))
    with pytest.raises(RagateError, match="format ragate-skr-labels"):
        skr.load_labels(tmp_path / "other.npz")


def test_eval_refuses_test_questions_that_are_skr_training_questions(
    minilm: Any, dense: Any, tmp_path: Path
) -> None:
    from ragate.eval.datasets import load_dataset
    from ragate.eval.run import EvalConfig, check_no_leak

    examples = load_dataset("demo", limit=6)
    train = [ex.question for ex in examples[3:]]
    path = skr.save_labels(_labels(minilm, dense, train, [True, False, True]), tmp_path / "l.npz")
    config = EvalConfig("demo", ("skr", "targ-margin"), skr_labels=str(path))
    with pytest.raises(RagateError, match="3 of this run's 6 questions are training questions"):
        check_no_leak(config, examples)
    recorded = check_no_leak(config, examples[:3])  # a disjoint split passes and is recorded
    assert recorded is not None and recorded["questions"] == 3 and len(recorded["sha256"]) == 64
    with pytest.raises(RagateError, match="--skr-labels"):
        check_no_leak(EvalConfig("demo", ("skr",)), examples[:3])
    assert check_no_leak(EvalConfig("demo", ("targ-margin",)), examples) is None
    # a resume notices a label set refit at the same path (by content: the .npz's own bytes carry zip times)
    from ragate.eval.run import open_run

    refit = skr.save_labels(_labels(minilm, dense, train, [True, False, True]), tmp_path / "l.npz")
    assert skr.load_labels(refit).content_sha256 == recorded["content_sha256"]
    config = EvalConfig("demo", ("skr",), skr_labels=str(path), limit=3)
    (tmp_path / "run").mkdir()
    saved, _ = open_run(config, tmp_path / "run", resume=False, examples=None, accept_rebuilt_index=False)
    (tmp_path / "run" / "config.json").write_text(json.dumps(config.to_json() | saved))
    open_run(config, tmp_path / "run", resume=True, examples=None, accept_rebuilt_index=False)
    skr.save_labels(_labels(minilm, dense, train, [False, False, True]), tmp_path / "l.npz")
    with pytest.raises(RagateError, match="was refit since this run began"):
        open_run(config, tmp_path / "run", resume=True, examples=None, accept_rebuilt_index=False)
    assert [ex.id for ex in EvalConfig("demo", ("skr",), offset=3, limit=2).examples()] == [
        ex.id for ex in examples[3:5]
    ]


def test_skr_end_to_end_from_a_training_sweep_on_smollm2(
    smollm2_path: Path, minilm: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's path on the demo index: sweep a training split, fit, ask; and eval refuses the same split."""
    from ragate.cli.main import main

    sweep, labels = tmp_path / "train", tmp_path / "labels.npz"
    assert main(["sweep", "--dataset", "demo", "--methods", "targ-margin", "--offset", "5", "--limit", "6",
                 "--out", str(sweep), "--quiet"]) == 0  # fmt: skip
    recorded = json.loads((sweep / "results.json").read_text())  # as an eval run records it (issue G)
    assert recorded["questions"] == 6 and recorded["methods"] == ["targ-margin"]
    assert recorded["provenance"]["model"]["sha256"] and recorded["provenance"]["git"]["commit"]
    assert recorded["dataset_files"][0]["sha256"] and recorded["config"]["offset"] == 5
    assert main(["skr", "fit", "--sweep", str(sweep), "--out", str(labels)]) == 0
    fitted_out = capsys.readouterr().out
    assert "6 training questions of demo" in fitted_out and "model smollm2-135m" in fitted_out  # the default
    fitted = skr.load_labels(labels)
    assert (
        fitted.meta["offset"] == 5
        and fitted.meta["model"]["sha256"]
        and fitted.meta["encoder"]["dim"] == 384
        and fitted.meta["model"]["model"] == "smollm2-135m"  # the name the run's backend reports
    )
    assert main(["ask", "who got the first nobel prize in physics", "--method", "skr", "--skr-labels",
                 str(labels), "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "skr" and "nearest training questions" in out["gate"]["reason"]
    assert main(["eval", "--dataset", "demo", "--methods", "skr", "--skr-labels", str(labels), "--limit", "8",
                 "--out", str(tmp_path / "leak"), "--quiet"]) == 2  # fmt: skip
    assert "3 of this run's 8 questions are training questions" in capsys.readouterr().err
    config = json.loads((sweep / "config.json").read_text())
    config["provenance"]["model"]["sha256"] = "0" * 64  # as if the model file had changed since the sweep
    (sweep / "config.json").write_text(json.dumps(config))
    assert main(["skr", "fit", "--sweep", str(sweep), "--out", str(tmp_path / "again.npz")]) == 2
    assert "ran model file sha256 000000000000" in capsys.readouterr().err


# --- a sweep gains gates without recomputing its answers; the budget-matched table


def _scripted_answers(request: Any) -> Any:
    text = request.prompt[-1].content
    if "Do you need to search for this?" in text:
        return yes_no(0.9 if "nobel" in text.lower() else 0.2)
    gap = 0.1 + len(text) % 7  # question-dependent top-1/top-2 gaps: the margin gate's scores differ
    return make_generation(["Wilhelm", " Röntgen"], [-0.5, -0.2], [[("Wilhelm", -0.5), ("Albert", -0.5 - gap)],
                           [(" Röntgen", -0.2), (" Einstein", -0.2 - gap)]])  # fmt: skip


def test_a_sweep_gains_gates_on_its_stored_answers_and_the_budget_table_reads_it(
    minilm: Any, tmp_path: Path
) -> None:
    from ragate.eval.datasets import load_dataset
    from ragate.eval.records import read_records
    from ragate.eval.run import EvalConfig
    from ragate.eval.sweep import sweep_pass
    from ragate.report.matched import matched_markdown, matched_table, parse_budgets, references
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    examples = load_dataset("demo", limit=4)
    lm = ScriptedBackend(_scripted_answers)
    with open_index(demo_index()) as index:
        first = sweep_pass(EvalConfig("demo", ("targ-margin",), limit=4), tmp_path / "s", examples=examples, lm=lm,
                           retriever=index, progress=False, cache=False)  # fmt: skip
        before = len(lm.calls)
        both = EvalConfig("demo", ("targ-margin", "self-eval"), limit=4)
        grown = sweep_pass(both, tmp_path / "s", examples=examples, lm=lm, retriever=index, progress=False,
                           resume=True, cache=False)  # fmt: skip
    added = lm.calls[before:]
    assert len(added) == 4 and all("Do you need to search" in c.prompt[-1].content for c in added)  # type: ignore[union-attr]
    assert len(grown) == 4 == len(read_records(tmp_path / "s" / "sweep.jsonl"))  # one record per question
    for old, new in zip(first, grown, strict=True):
        assert (new["closed"], new["open"]) == (old["closed"], old["open"])
        assert new["gates"]["targ-margin"] == old["gates"]["targ-margin"]
        assert new["methods"] == ["targ-margin", "self-eval"]
    assert json.loads((tmp_path / "s" / "config.json").read_text())["methods"] == ["targ-margin", "self-eval"]
    with pytest.raises(RagateError, match="cannot resume"):
        sweep_pass(EvalConfig("demo", ("self-eval",), limit=4), tmp_path / "s", examples=examples, lm=lm,
                   retriever=index, progress=False, resume=True, cache=False)  # fmt: skip

    rows = matched_table(grown, (), parse_budgets("0.5,0.25"))
    assert [(r["budget"], r["method"]) for r in rows] == [
        (0.25, "targ-margin"), (0.25, "self-eval"), (0.5, "targ-margin"), (0.5, "self-eval"),
    ]  # fmt: skip
    for r in rows:
        assert (
            r["retrieval_rate"] <= r["budget"]
            and r["ci_vs_always"][0] <= r["delta_vs_always"] <= r["ci_vs_always"][1]
        )
    blind = matched_table(grown, (), (0.5,), select="quantile")  # tau = F^-1(1 - rho): 2 of 4 questions
    assert [r["retrieval_rate"] for r in blind] == [0.5, 0.25]  # self-eval: three questions tie at 0.2
    assert all("ci_vs_random" in r for r in blind)
    markdown = matched_markdown(rows, references(grown))
    assert "Always-RAG EM" in markdown and markdown.count("\n| 0.5 |") == 2
    with pytest.raises(RagateError, match="in \\(0, 1\\]"):
        parse_budgets("0.2,1.5")
    from ragate.report.tables import write_report

    write_report(tmp_path / "s", tmp_path / "r", budgets=(0.5,))
    assert "## Budget-matched comparison" in (tmp_path / "r" / "report.md").read_text()
    with pytest.raises(RagateError, match="no questions.jsonl there"):
        write_report(tmp_path / "s", tmp_path / "r", budgets=(0.5,), with_runs=[tmp_path])
    # an eval run with another model, or a method passed twice, is refused by name
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    record = {
        "id": grown[0]["id"],
        "method": "crag-lite",
        "retrieved": True,
        "scores": {"em": 1.0, "f1": 1.0, "acc": 1.0},
        "seconds": 1,
    }  # what the report reads of a record; the readers check the fields a record has
    provenance = config["provenance"] | {"model": config["provenance"]["model"] | {"sha256": "0" * 64}}
    for name, other in (("e1", {}), ("e2", {"provenance": provenance})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config | other | {"kind": "eval"}))
        (tmp_path / name / "questions.jsonl").write_text(json.dumps(record) + "\n")
    write_report(tmp_path / "s", tmp_path / "r", budgets=(0.5,), with_runs=[tmp_path / "e1"])
    assert "| 0.5 | crag-lite | 100.0 (over budget) |" in (tmp_path / "r" / "report.md").read_text()
    with pytest.raises(RagateError, match="another model file than the sweep"):
        write_report(tmp_path / "s", tmp_path / "r", budgets=(0.5,), with_runs=[tmp_path / "e2"])
    with pytest.raises(RagateError, match="--sweep .* another model file than the run"):  # and the other way
        write_report(tmp_path / "e2", tmp_path / "r2", sweep=tmp_path / "s")
    with pytest.raises(RagateError, match="has crag-lite again"):
        write_report(tmp_path / "s", tmp_path / "r", budgets=(0.5,), with_runs=[tmp_path / "e1"] * 2)
    # one method at two thresholds (TARG's FLARE θ = 0.3 and 0.5): two rows, named by θ
    (tmp_path / "e3").mkdir()
    (tmp_path / "e3" / "config.json").write_text(json.dumps(config | {"thresholds": {"crag-lite": 0.3}}))
    (tmp_path / "e3" / "questions.jsonl").write_text(json.dumps(record | {"retrieved": False}) + "\n")
    write_report(tmp_path / "s", tmp_path / "r", budgets=(0.5,), with_runs=[tmp_path / "e1", tmp_path / "e3"])
    table = (tmp_path / "r" / "report.md").read_text()
    assert (
        "| 0.5 | crag-lite | 100.0 (over budget) | 1.00 |" in table and "| 0.5 | crag-lite θ=0.3 | " in table
    )


def test_calibrate_names_the_way_to_a_budget_for_skr() -> None:
    from ragate.tuning.calibrate import calibrate

    with pytest.raises(RagateError, match="sweep it instead"):
        calibrate(method="skr", dev="demo", budget=0.3)


def test_a_method_with_one_operating_point_enters_the_budget_table_at_its_own_rate() -> None:
    from ragate.report.matched import single_point

    reference = {
        f"q{i}": {
            "closed": {"scores": {"em": 0.0}, "seconds": 1.0},
            "open": {"scores": {"em": 1.0}, "seconds": 3.0},
        }
        for i in range(4)
    }
    records = [
        {
            "id": f"q{i}",
            "method": "crag-lite",
            "retrieved": True,
            "scores": {"em": float(i < 3)},
            "seconds": 5.0,
        }
        for i in range(4)
    ]
    low = single_point(records, "crag-lite", 0.5, reference)
    assert low["within_budget"] is False and low["retrieval_rate"] == 1.0 and low["em"] == 0.75
    assert low["delta_vs_always"] == pytest.approx(-0.25) and low["delta_latency"] == pytest.approx(4.0)
    assert low["delta_vs_random"] == pytest.approx(-0.25)  # at rate 1 the random gate is Always-RAG
    assert single_point(records, "crag-lite", 1.0, reference)["within_budget"] is True
    with pytest.raises(RagateError, match="no answered questions"):
        single_point(records, "flare", 1.0, reference)


def test_a_method_that_retrieved_more_than_once_is_marked_not_bounded_in_the_budget_table() -> None:
    """TARG section 5.1 bounds every baseline to one retrieval: FLARE at its own settings retrieves more, and
    its row says so (before issue M the table showed it as if bounded)."""
    from ragate.report.matched import DEFAULT_BUDGETS, matched_markdown, single_point

    closed, opened = {"scores": {"em": 0.0}, "seconds": 1.0}, {"scores": {"em": 1.0}, "seconds": 3.0}
    reference = {f"q{i}": {"closed": closed, "open": opened} for i in range(4)}
    flare = [
        {
            "id": f"q{i}",
            "method": "flare",
            "retrieved": True,
            "retrievals": [1, 3, 2, 3][i],
            "scores": {"em": 1.0},
            "seconds": 5.0,
        }
        for i in range(4)
    ]
    once = [r | {"method": "flare-once", "retrievals": 1} for r in flare]
    rows = [single_point(flare, "flare", 1.0, reference), single_point(once, "flare-once", 1.0, reference)]
    table = matched_markdown(rows, [], "em")
    assert "| flare | 100.0 (not bounded: 2.2 retrievals/q) |" in table
    assert "| flare-once | 100.0 |" in table
    assert {0.05, 0.1, 0.15, 0.3} <= set(DEFAULT_BUDGETS)  # TARG's regime, about 5-30% (Table 4: ~15%)


def test_targ_reads_the_question_then_the_context() -> None:
    """TARG Eq. 5: x = B(q) ⊕ C, the question first (before issue M ragate put the passages first)."""
    from ragate.methods.prompts import TARG, TARG_CONTEXT_FIRST

    prompt = TARG.with_context.format(question="Q?", context="[T] passage")
    assert prompt.index("Q?") < prompt.index("[T] passage")
    old = TARG_CONTEXT_FIRST.with_context.format(question="Q?", context="[T] passage")
    assert old.index("[T] passage") < old.index("Q?")
    assert get_method("targ-margin").prompts is TARG and get_method("self-eval").prompts is TARG


def test_a_reader_leaves_a_live_sweep_file_as_it_is(tmp_path: Path) -> None:
    from ragate.eval.sweep import compact

    path = tmp_path / "sweep.jsonl"
    answer = {"prediction": "x", "scores": {"em": 0.0, "f1": 0.0, "acc": 0.0}, "seconds": 1.0, "tokens": 3}
    line = json.dumps({"id": "q0", "family": "f", "methods": [], "closed": answer, "open": answer, "gates": {}})
    path.write_text(line + "\n" + line[:10])  # a writer is in the middle of its next line
    before = path.read_bytes()
    assert len(compact(path)) == 1 and path.read_bytes() == before
    assert len(compact(path, rewrite=True)) == 1 and path.read_text() == line + "\n"


def test_a_report_names_the_records_still_in_worker_part_files(tmp_path: Path) -> None:
    from ragate.report.tables import unfolded_records

    assert unfolded_records(tmp_path) is None
    line = json.dumps({"id": "q1", "family": "f", "gates": {}})
    (tmp_path / "sweep.part1.jsonl").write_text(line + "\n" + line.replace("q1", "q2") + "\n")
    said = unfolded_records(tmp_path)
    assert said is not None and said.startswith("2 records in the part files of sweep.jsonl")
    assert (tmp_path / "sweep.part1.jsonl").exists()  # read, never folded by a reader


def test_serve_answers_skr_with_the_label_set_it_was_started_with(
    minilm: Any, dense: Any, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from ragate.service.app import create_app
    from ragate.service.settings import ServiceSettings

    path = skr.save_labels(
        _labels(minilm, dense, TRAIN, [True, True, True, False, False, False]), tmp_path / "l.npz"
    )
    with pytest.raises(ValueError, match="needs --skr-labels FILE"):
        ServiceSettings(method="skr")
    with pytest.raises(ValueError, match="goes with --method skr"):
        ServiceSettings(method="dtr", skr_labels=str(path))
    lm = ScriptedBackend([answer("Alexander Fleming")])
    with TestClient(create_app(ServiceSettings(method="skr", skr_labels=str(path)), lm, dense)) as http:
        got = http.post("/v1/answer", json={"question": "Who was the discoverer of penicillin?"})
        assert got.status_code == 200, got.text  # the label set's 6 questions (k = 10 > 6) vote 3 to 3
        assert "3 of the 6 nearest training questions" in got.json()["gate"]["reason"]
    with TestClient(create_app(ServiceSettings(method="no-retrieval"), ScriptedBackend([]), dense)) as http:
        got = http.post("/v1/answer", json={"question": "Who?", "method": "skr"})
        assert got.status_code == 400 and "--skr-labels FILE" in got.text


def test_a_sweep_refuses_a_fallback_gate_and_names_the_stand_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragate.cli.main import main

    args = ["sweep", "--dataset", "demo", "--methods", "targ-margin", "--fallback", "verbal-confidence"]
    assert main([*args, "--out", str(tmp_path / "s"), "--quiet"]) == 2
    assert "sweep the stand-in itself (--methods verbal-confidence)" in capsys.readouterr().err


def test_an_interval_that_touches_zero_only_through_float_noise_is_not_established() -> None:
    """Against a random gate's fractional expectation, a bound that is exactly 0 comes out of float sums as
    +-1e-17; the verdict must not turn on that noise."""
    from ragate.eval.metrics import paired_bootstrap_diff
    from ragate.report.matched import _compare

    chosen, reference = [0.1 + 0.2] * 10, [0.3] * 10  # equal in exact arithmetic, 5.6e-17 apart in floats
    assert paired_bootstrap_diff(chosen, reference) == (0.0, 0.0)
    compared = _compare(chosen, reference, reference, 0.5)  # the random gate's expectation is 0.3 too
    assert compared["verdict_vs_random"] == compared["verdict"] == "not established"
