"""The learned gate: its file, its fit and reports, the feedback store, hidden states from the answer's own
prefill, and the loop through ``ragate.Pipeline`` (shadow answers and feedback as labels, learn, the gate in force,
the cascade) with SmolLM2."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ragate.errors import RagateError
from ragate.gates.learned import load_learned, save_learned
from ragate.learning.scores import (
    MIN_CLASS,
    Labelled,
    cascade_probabilities,
    check_labels,
    choose_band,
    ece,
    learn_gate,
)
from ragate.learning.store import FeedbackStore, UnknownAnswer, answer_correct, answers_agree, pending_labels
from ragate.uncertainty import paired_auroc_gap

DEMO_SWEEP = Path(__file__).parent.parent / "docs" / "results" / "runs" / "sweep-demo-smollm2-135m-80"
DEMO_FAMILY = "targ|question|k=5|n=5|cos|hyde=1|rep=5|ce=None|max=64"


def _synthetic(n: int = 200, seed: int = 0, signal_in_hidden: bool = True) -> Labelled:
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.4
    hidden = rng.normal(size=(n, 24))
    if signal_in_hidden:
        hidden[:, 3] += 1.5 * y  # one direction of the state says "needs retrieval"
    scalars = np.column_stack([rng.integers(3, 20, n).astype(float), (rng.random(n) < 0.2).astype(float)])
    draft = rng.normal(size=n) + 1.0 * y
    return Labelled(
        tuple(f"q{i}" for i in range(n)),
        ("words", "digit", "targ-entropy"),
        np.column_stack([scalars, draft]),
        hidden,
        y,
    )


def test_a_fit_refuses_too_few_labels_naming_how_many_more() -> None:
    y = np.array([True] * 4 + [False] * 40)
    with pytest.raises(RagateError, match=f"{MIN_CLASS - 4} more 'retrieve' labels"):
        check_labels(y)
    with pytest.raises(RagateError) as err:  # short of both classes: both are counted
        check_labels(np.zeros(0, dtype=bool), "closed-wrong")
    both = f"{MIN_CLASS} more 'retrieve' and {MIN_CLASS} more 'no-retrieve' labels of closed-wrong"
    assert both in str(err.value)
    one = f"so {MIN_CLASS - 3} more 'no-retrieve' labels of retrieval-changed"
    with pytest.raises(RagateError, match=one):
        check_labels(np.array([True] * 12 + [False] * 3), "retrieval-changed")


def test_the_default_label_is_the_one_the_store_can_fit() -> None:
    from ragate.learning.fit import choose_label

    def counts(gold: tuple[int, int], silver: tuple[int, int]) -> dict[str, dict[str, int]]:
        return {
            kind: {"retrieve": n[0], "no_retrieve": n[1]}
            for kind, n in (("closed-wrong", gold), ("retrieval-changed", silver))
        }

    assert choose_label(counts((10, 12), (50, 50)))[0] == "closed-wrong"  # gold wherever it can be fitted
    label, why = choose_label(counts((3, 0), (11, 10)))
    assert label == "retrieval-changed" and "closed-wrong has 3 and 0" in why
    assert f"{MIN_CLASS - 3} more 'retrieve' and {MIN_CLASS} more 'no-retrieve'" in why
    with pytest.raises(RagateError) as err:  # neither: the refusal names both kinds' counts
        choose_label(counts((0, 0), (4, 12)))
    said = str(err.value)
    assert "closed-wrong (gold) has 0 'retrieve' and 0 'no-retrieve'" in said and "4 and 12" in said
    assert f"{MIN_CLASS} more 'retrieve' and {MIN_CLASS} more 'no-retrieve' labels of closed-wrong" in said
    assert f"or {MIN_CLASS - 4} more 'retrieve' of retrieval-changed" in said


def test_the_learned_gate_ranks_a_signal_and_says_nothing_of_noise() -> None:
    gate, report, _p = learn_gate(_synthetic(), label="closed-wrong", components=4)
    auc, lo, _ = report["cheap_auroc"]  # cross-fitted: no question scored by a model that saw it
    assert auc > 0.75 and lo > 0.6
    assert report["cheap_ece"] < 0.15
    _, noise, _p = learn_gate(_synthetic(signal_in_hidden=False, seed=3), label="closed-wrong", components=4)
    _, nlo, nhi = noise["cheap_auroc"]
    assert nlo < 0.6 and nhi > 0.4  # random labels: nothing established beyond chance
    assert "targ-entropy" not in gate.cheap.features


def test_the_cascade_drafts_the_band_it_was_given() -> None:
    data = _synthetic(300)
    gate, report, _p = learn_gate(data, label="closed-wrong", components=4, cascade_share=0.3)
    assert gate.full is not None and gate.band is not None
    assert abs(float(report["drafted_share"]) - 0.3) < 0.02
    assert report["full_auroc"][0] >= report["cheap_auroc"][0] - 0.02  # the draft's score helps, not hurts
    p = np.array([0.1, 0.45, 0.5, 0.55, 0.9])
    band = choose_band(p, 0.6)
    mixed, drafted = cascade_probabilities(p, np.full(5, 0.7), band)
    assert drafted.tolist() == [False, True, True, True, False]
    assert mixed.tolist() == [0.1, 0.7, 0.7, 0.7, 0.9]


def test_ece_and_paired_gap_are_what_they_say() -> None:
    y = np.array([True, False] * 50)
    assert ece(np.where(y, 1.0, 0.0), y) == 0.0
    assert ece(np.full(100, 0.9), y) == pytest.approx(0.4)
    perfect, flat = np.where(y, 0.9, 0.1), np.full(100, 0.5)
    gap, lo, _ = paired_auroc_gap(perfect, flat, y)
    assert gap == pytest.approx(0.5) and lo > 0


def test_the_gate_file_round_trips_and_a_damaged_one_names_the_fix(tmp_path: Path) -> None:
    data = _synthetic()
    gate, _, _p = learn_gate(data, label="retrieval-changed", components=4, cascade_share=0.2)
    path = save_learned(gate, tmp_path / "gate.json")
    again = load_learned(path)
    cheap = data.select(["words", "digit"])
    assert np.allclose(
        again.cheap.probabilities(cheap.scalars, cheap.hidden),
        gate.cheap.probabilities(cheap.scalars, cheap.hidden),
        atol=1e-6,
    )
    assert again.label == "retrieval-changed" and again.band == gate.band
    good = json.loads(path.read_text())
    damaged = {
        "not json": "{",
        "wrong format": json.dumps({**good, "format": "x"}),
        "nan": json.dumps(
            {**good, "cheap": {**good["cheap"], "coef": [float("nan")] * len(good["cheap"]["coef"])}}
        ).replace("NaN", "NaN"),
        "short coef": json.dumps({**good, "cheap": {**good["cheap"], "coef": [1.0]}}),
        "band": json.dumps({**good, "band": [0.9, 0.1]}),
        "unknown feature": json.dumps({**good, "cheap": {**good["cheap"], "features": ["nope", "digit"]}}),
    }
    for name, text in damaged.items():
        bad = tmp_path / f"{name.replace(' ', '-')}.json"
        bad.write_text(text)
        with pytest.raises(RagateError, match="learn") as err:
            load_learned(bad)
        assert str(bad) in str(err.value) or "learned gate" in str(err.value), name
    with pytest.raises(RagateError, match="not found"):
        load_learned(tmp_path / "missing.json")
    wrong = data.hidden[:, :10] if data.hidden is not None else None
    with pytest.raises(RagateError, match="another model"):
        gate.cheap.probabilities(cheap.scalars, wrong)


def test_what_a_learned_gate_needs_follows_its_file(tmp_path: Path) -> None:
    from ragate.backends.base import Capabilities
    from ragate.errors import CapabilityError
    from ragate.methods import get_method
    from ragate.methods.needs import method_support, require

    data = _synthetic()
    text_only = Capabilities(False, 0, False, False, True, False, False, False, continues=False)
    local = Capabilities(True, 1 << 30, False, True, True, True, True, False, hidden_states=True)
    plain, _, _p = learn_gate(data.select(["words", "digit"], hidden=False), label="closed-wrong")
    hidden, _, _p = learn_gate(data, label="closed-wrong", components=4)
    cascade, _, _p = learn_gate(data, label="closed-wrong", components=4, cascade_share=0.2)
    spec = get_method("learned")
    runs = {}
    for name, gate in (("plain", plain), ("hidden", hidden), ("cascade", cascade)):
        with_file = spec.with_(
            gate=replace(spec.gate, weights=str(save_learned(gate, tmp_path / f"{name}.json")))
        )
        runs[name] = {
            caps: method_support(with_file, c)[0] for caps, c in (("text", text_only), ("local", local))
        }
        if name == "hidden":
            with pytest.raises(CapabilityError, match="no hidden state.*--no-hidden"):
                require(with_file, text_only, engine="openai")
    # a file learned without the hidden state and without a cascade reads the question alone: any backend
    assert runs == {
        "plain": {"text": "exact", "local": "exact"},
        "hidden": {"text": "unavailable", "local": "exact"},
        "cascade": {"text": "unavailable", "local": "exact"},
    }


def _record(store: FeedbackStore, i: int, *, retrieved: bool = False, answer: str = "Paris") -> str:
    aid = f"a{i}"
    store.record_answer(
        aid, question=f"question {i}?", method="targ-entropy", prompts="targ-question-first", answer=answer,
        retrieved=retrieved, features={"words": 2.0}, hidden=np.arange(4, dtype=np.float32) + i,
        model={"model": "m.gguf", "engine": "llama.cpp"},
    )  # fmt: skip
    return aid


def test_the_feedback_store_keeps_labels_bounded_and_names_unknown_ids(tmp_path: Path) -> None:
    with FeedbackStore(tmp_path / "fb.db", max_answers=3) as store:
        for i in range(5):
            _record(store, i, retrieved=i % 2 == 1)
        assert store.counts()["answers"] == 3 and store.get("a0") is None  # the oldest went
        with pytest.raises(UnknownAnswer, match="no answer 'a0'"):
            store.feedback("a0", correct=True)
        assert store.feedback("a4", correct=False) == [("closed-wrong", True)]  # a closed-book answer judged
        # every word labels the route the answer took: a retrieved answer judged right
        assert store.feedback("a3", correct=True) == [("retrieved-wrong", False)]
        assert pending_labels(store.get("a3"), "Paris") == ("closed-wrong",)  # its closed-book twin is not known
        store.set_twin("a3", closed="London")
        assert store.feedback("a3", reference="Paris") == [("closed-wrong", True), ("retrieved-wrong", False)]
        assert pending_labels(store.get("a3"), "Paris") == ()
        counts = store.counts()
        assert counts["retrieved-wrong"] == {"wrong": 0, "right": 1} and counts["closed-wrong"]["retrieve"] == 2
        with pytest.raises(RagateError, match="characters"):
            store.feedback("a4", reference="x" * 5000)
        with pytest.raises(RagateError, match="correct .* or a reference"):
            store.feedback("a4")
        rows = store.labelled("closed-wrong")
        assert rows.ids == ("a3", "a4") and rows.y.tolist() == [True, True]
        assert np.array_equal(rows.hidden[1], np.arange(4, dtype=np.float32) + 4)
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(RagateError, match="damaged or not SQLite"):
        FeedbackStore(tmp_path / "junk.db")


def test_an_acknowledged_label_survives_kill_9(tmp_path: Path) -> None:
    db = tmp_path / "fb.db"
    script = textwrap.dedent(
        f"""
        import os, signal, numpy as np
        from ragate.learning.store import FeedbackStore
        s = FeedbackStore({str(db)!r})
        for i in range(20):
            s.record_answer(f"a{{i}}", question="q", method="m", prompts="p", answer="x", retrieved=False,
                            features={{}}, hidden=None, model={{"model": "m"}})
            s.add_label(f"a{{i}}", source="feedback", kind="closed-wrong", value=bool(i % 2))
            print(i, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == -signal.SIGKILL
    acknowledged = len(out.stdout.split())
    with FeedbackStore(db) as store:
        assert len(store.labelled("closed-wrong").ids) == acknowledged == 20


def test_answers_agree_on_normalised_tokens() -> None:
    assert answers_agree("The answer is Paris.", "the answer is paris")
    assert not answers_agree("Paris", "London")


# -- with SmolLM2 -----------------------------------------------------------------------------------------------
def test_the_hidden_state_comes_from_the_answers_own_prefill(llama_backend: object) -> None:
    from ragate.eval.calls import CallCache
    from ragate.methods import get_method
    from ragate.methods.question import QuestionRun

    lm = CallCache(llama_backend, None, "smollm2", exact_prefixes=True)  # type: ignore[arg-type]
    spec = get_method("targ-entropy")
    run = QuestionRun(spec, "Who wrote Hamlet?", lm, None)
    hidden = run.hidden_state()
    assert hidden is not None and hidden.shape == (576,) and np.all(np.isfinite(hidden))
    before = llama_backend.evaluated_tokens  # type: ignore[attr-defined]
    draft = run.draft(20)
    # the draft starts from the kept prompt: only its generated tokens are evaluated, not the prompt again
    assert llama_backend.evaluated_tokens - before <= len(draft)  # type: ignore[attr-defined]
    again = QuestionRun(spec, "Who wrote Hamlet?", lm, None).hidden_state()
    assert again is not None and np.array_equal(hidden, again)
    other = QuestionRun(spec, "What is the capital of France?", lm, None).hidden_state()
    assert other is not None and not np.allclose(hidden, other)


def test_a_pipeline_answers_with_the_learned_gate(demo_gate: Path, llama_backend: object) -> None:
    from ragate.pipeline import Pipeline

    with Pipeline("learned", gate_weights=demo_gate, lm=llama_backend) as rag:  # type: ignore[arg-type]
        a = rag.answer("Who wrote the novel Pride and Prejudice?")
        assert "cheap stage" in a.decision.reason and "no draft" in a.decision.reason
        assert 0.0 <= a.decision.score <= 1.0
        assert any(s.name == "prefill" for s in a.stages) and a.text


def test_sweep_eval_calibrate_and_report_take_a_learned_gate(
    demo_gate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The set-up check reads a learned gate's file with its own loader (not no-model-lr's), refuses the questions
    it was fitted on, and the gate is swept, evaluated, calibrated and reported like any other."""
    from ragate.cli.main import main

    questions = tmp_path / "questions.jsonl"  # not the demo questions the gate was fitted on
    questions.write_text(
        json.dumps({"id": "0", "question": "Who wrote Hamlet?", "answers": ["Shakespeare"]}) + "\n"
        + json.dumps({"id": "1", "question": "What is the capital of France?", "answers": ["Paris"]}) + "\n"
    )  # fmt: skip
    run = ["--dataset", str(questions), "--methods", "learned", "--gate-weights", str(demo_gate), "--quiet"]
    assert main(["sweep", *run, "--out", str(tmp_path / "sweep")]) == 0
    records = [json.loads(line) for line in (tmp_path / "sweep" / "sweep.jsonl").open()]
    assert len(records) == 2 and all(0.0 <= r["gates"]["learned"]["score"] <= 1.0 for r in records)
    recorded = json.loads((tmp_path / "sweep" / "config.json").read_text())["gate_weights_file"]
    assert recorded["gate"] == "learned" and recorded["label"] == "retrieval-changed"
    assert recorded["questions"] == 80 and "hidden" in recorded["features"]
    assert main(["eval", *run, "--out", str(tmp_path / "eval")]) == 0
    answers = [json.loads(line) for line in (tmp_path / "eval" / "questions.jsonl").open()]
    swept = [r["gates"]["learned"]["score"] for r in records]
    assert [a["gate_score"] for a in answers] == pytest.approx(swept)
    cal = tmp_path / "cal.json"
    assert main(["calibrate", "--gate", "learned", "--from-sweep", str(tmp_path / "sweep"), "--budget", "0.5",
                 "--out", str(cal)]) == 0  # fmt: skip
    assert json.loads(cal.read_text())["gate"] == "learned"
    assert main(["report", str(tmp_path / "eval"), "--sweep", str(tmp_path / "sweep")]) == 0
    assert (tmp_path / "eval" / "report" / "report.md").is_file()
    capsys.readouterr()
    demo = ["--dataset", "demo", "--limit", "2", "--gate-weights", str(demo_gate), "--quiet"]
    assert main(["sweep", *demo, "--methods", "learned", "--out", str(tmp_path / "leak")]) == 2
    assert "2 of this run's 2 questions trained the gate weights" in capsys.readouterr().err
    assert main(["sweep", *demo, "--methods", "learned,no-model-lr", "--out", str(tmp_path / "two")]) == 2
    assert "one file, read by one trained gate" in capsys.readouterr().err


def test_the_pipeline_learns_from_sweeps_shadow_answers_and_feedback_and_puts_the_cascade_in_force(
    tmp_path: Path, llama_backend: object
) -> None:
    from ragate.learning.fit import import_sweep
    from ragate.pipeline import Pipeline

    demo = Path(__file__).parent.parent / "src/ragate/data/demo/questions.jsonl"
    questions = [json.loads(line)["question"] for line in demo.open()]
    with Pipeline(
        "targ-entropy", lm=llama_backend, feedback_store=tmp_path / "fb.db", shadow=1.0, threshold=1.0, k=3,  # type: ignore[arg-type]
    ) as rag:  # fmt: skip
        assert rag.learner.store is not None and rag.learner.shadow is not None
        imported = import_sweep(rag.learner.store, DEMO_SWEEP, rag.lm, family=DEMO_FAMILY, limit=50)  # labelled runs
        assert imported == 50 and import_sweep(rag.learner.store, DEMO_SWEEP, rag.lm, family=DEMO_FAMILY, limit=50) == 0
        answers = [rag.answer(q) for q in questions[:6]]  # live traffic: shadow answers label it
        assert all(a.id for a in answers) and len({a.id for a in answers}) == 6
        assert rag.learner.shadow.wait(300) and rag.learner.shadow.describe()["done"] == 6
        closed = (
            next(a for a in answers if not a.retrieved) if any(not a.retrieved for a in answers) else None
        )
        if closed is not None:
            said = rag.feedback(closed, correct=False)
            assert said.labels == (("closed-wrong", True),) and said.pending == ()
        counts = rag.learner.store.counts()
        changed = counts["retrieval-changed"]
        assert changed["retrieve"] + changed["no_retrieve"] == 56
        learned = rag.learn(tmp_path / "gate.json", label="retrieval-changed", cascade=0.4)
        assert rag.spec.gate.kind == "learned" and rag.learner.gate_file == str(learned.path)
        assert abs(float(learned.report["drafted_share"]) - 0.4) < 0.05
        later = [rag.answer(q) for q in questions[6:16]]
        reasons = [a.decision.reason for a in later]
        assert any("draft stage" in r for r in reasons) and any("cheap stage" in r for r in reasons), reasons

        from ragate.service.refit import Refit  # serve --refit-every: a new label, a new gate in force

        refit = Refit(rag, 1, tmp_path / "refit.json")
        rag.learner.store.add_label(later[0].id, source="feedback", kind="retrieval-changed", value=True)
        refit.check()
        refit.wait(300)
        assert refit.fits == 1 and refit.last_error is None, json.dumps(refit.describe())
        assert rag.learner.gate_file == str(tmp_path / "refit.json") and (tmp_path / "refit.json").is_file()


def test_gate_learn_on_a_store_prints_its_report_and_refuses_what_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragate.cli.main import main

    data = _synthetic(120)
    with FeedbackStore(tmp_path / "fb.db") as store:
        for i, (x, h, y) in enumerate(zip(data.scalars, data.hidden, data.y, strict=True)):  # type: ignore[arg-type]
            store.record_answer(
                f"a{i}", question=f"question {i}?", method="learned", prompts="targ-question-first", answer="x",
                retrieved=False, features={"words": float(x[0]), "targ-entropy": float(x[2])}, hidden=h,
                model={"model": "m.gguf", "engine": "llama.cpp"},
            )  # fmt: skip
            store.add_label(f"a{i}", source="feedback", kind="closed-wrong", value=bool(y))
    out = tmp_path / "gate.json"
    assert main(["gate", "learn", "--store", str(tmp_path / "fb.db"), "--out", str(out), "--cascade", "0.3"]) == 0
    printed = capsys.readouterr().out
    assert "learning 'closed-wrong'" in printed and "cross-fitted AUROC" in printed and "cascade AUROC" in printed
    assert "chosen by cross-fitting" in printed and "AUROC (cross-fitted) against labels: 50:" in printed
    gate = load_learned(out)
    assert gate.band is not None and gate.meta["model"]["model"] == "m.gguf" and len(gate.meta["questions"]) == 120
    assert main(["gate", "learn", "--store", str(tmp_path / "none.db"), "--out", str(out)]) == 2
    assert "no feedback store" in capsys.readouterr().err
    assert main(["gate", "learn", "--store", str(tmp_path / "fb.db"), "--out", str(tmp_path / "gate.txt")]) == 2
    assert "FILE.json" in capsys.readouterr().err
    store_arg = ["--store", str(tmp_path / "fb.db")]
    assert main(["gate", "feedback", *store_arg, "--id", "a3", "--wrong"]) == 0
    assert json.loads(capsys.readouterr().out)["labels"] == [{"kind": "closed-wrong", "retrieve": True}]
    assert main(["gate", "feedback", *store_arg, "--id", "nope", "--correct"]) == 2
    assert "no answer 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("answer", "reference", "right"),
    [
        ("It was 10 years.", "1", False),  # a number is a whole token: "1" is not in "10"
        ("The cat sat.", "cat", True),
        ("concatenate the lists", "cat", False),
        ("Tulsa, Oklahoma", "tulsa oklahoma", True),
        ("in 1965", "1965", True),
    ],
)
def test_a_reference_is_found_as_whole_words(answer: str, reference: str, right: bool) -> None:
    assert answer_correct(answer, reference) is right


def test_gate_learn_says_which_label_it_chose_and_refuses_naming_both_kinds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragate.cli.main import main

    data = _synthetic(40)
    db = tmp_path / "fb.db"
    with FeedbackStore(db) as store:  # shadow's silver labels on every answer, gold on three
        for i, (x, h, y) in enumerate(zip(data.scalars, data.hidden, data.y, strict=True)):  # type: ignore[arg-type]
            store.record_answer(
                f"a{i}", question=f"question {i}?", method="learned", prompts="targ-question-first", answer="x",
                retrieved=False, features={"words": float(x[0])}, hidden=h, model={"model": "m.gguf"},
            )  # fmt: skip
            store.add_label(f"a{i}", source="shadow", kind="retrieval-changed", value=bool(y))
            if i < 3:
                store.add_label(f"a{i}", source="feedback", kind="closed-wrong", value=True)
    out = tmp_path / "gate.json"
    args = ["gate", "learn", "--store", str(db), "--out", str(out), "--components", "4", "--C", "0.1"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "closed-wrong 3 'retrieve', 0 'no-retrieve'" in printed
    assert "learning 'retrieval-changed' (the default: shadow answers' silver labels" in printed
    assert "closed-wrong has 3 and 0" in printed and "questions labelled retrieval-changed" in printed
    assert load_learned(out).label == "retrieval-changed"
    assert main([*args, "--label", "closed-wrong"]) == 2  # asked for: refused, counting both classes
    assert f"{MIN_CLASS - 3} more 'retrieve' and {MIN_CLASS} more 'no-retrieve' labels of closed-wrong" in (
        capsys.readouterr().err
    )
    with FeedbackStore(tmp_path / "few.db") as store:
        for i in range(2):
            store.record_answer(
                f"a{i}", question=f"q{i}?", method="learned", prompts="targ-question-first", answer="x",
                retrieved=False, features={}, hidden=None, model={"model": "m.gguf"},
            )  # fmt: skip
    assert main(["gate", "learn", "--store", str(tmp_path / "few.db"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "closed-wrong (gold) has 0 'retrieve' and 0 'no-retrieve'" in err and "silver) 0 and 0" in err


def test_feedback_on_a_retrieved_answer_labels_it_and_queues_its_closed_book_twin(
    llama_backend: object, tmp_path: Path
) -> None:
    """A reference on a retrieved answer whose closed-book twin nobody computed: the retrieval route is labelled at
    once, and the twin is queued with the reference (ahead of sampled work), which then gives closed-wrong."""
    import ragate

    with ragate.Pipeline(
        "standard-rag", lm=llama_backend, feedback_store=tmp_path / "fb.db", shadow=1e-9, k=2,  # type: ignore[arg-type]
    ) as rag:  # fmt: skip  (a shadow worker that samples nothing by itself)
        assert rag.learner.shadow is not None and rag.learner.store is not None
        ans = rag.answer("where do the greasers live in the outsiders")
        assert ans.retrieved and ans.id and rag.learner.shadow.describe()["sampled"] == 0
        said = rag.feedback(ans, reference="Tulsa, Oklahoma")
        assert [kind for kind, _ in said.labels] == ["retrieved-wrong"] and said.pending == ("closed-wrong",)
        assert rag.learner.shadow.wait(300)
        seen = rag.learner.shadow.describe()
        assert seen["done"] == 1 and seen["failed"] == 0, seen
        counts = rag.learner.store.counts()
        assert sum(counts["closed-wrong"].values()) == 1 and sum(counts["retrieved-wrong"].values()) == 1
        row = rag.learner.store.get(ans.id)
        assert row is not None and row.closed_answer is not None  # the twin came from the shadow context
        assert rag.learner.turns is not None and rag.learner.turns.describe()["shadow_steps"] > 0
    assert getattr(llama_backend, "step", None) is None  # the caller's backend is left without the pipeline's turns


def _store_for_comparison(path: Path, *, gate_ranks: bool, n: int = 60, seed: int = 0) -> FeedbackStore:
    """Labelled answers whose hidden states carry the label (a learned gate ranks them well), scored when they were
    answered by a targ-entropy gate that ranks them perfectly (``gate_ranks``) or at random."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.5
    store = FeedbackStore(path)
    for i in range(n):
        hidden = rng.normal(size=16).astype(np.float32)
        hidden[2] += 1.2 * y[i]
        gate_score = float(y[i]) + 0.01 * i if gate_ranks else float(rng.random())
        store.record_answer(
            f"a{i}", question=f"question {i}?", method="targ-entropy", prompts="targ-question-first",
            answer="x", retrieved=False, features={"words": 3.0, "gate:targ-entropy": gate_score}, hidden=hidden,
            model={"model": "smollm2-135m", "engine": "llama.cpp"},
        )  # fmt: skip
        store.add_label(f"a{i}", source="feedback", kind="closed-wrong", value=bool(y[i]))
    return store


@pytest.mark.parametrize("gate_ranks", [True, False])
def test_a_learned_gate_is_compared_with_the_gate_that_scored_the_answers(tmp_path: Path, gate_ranks: bool) -> None:
    from ragate.learning.fit import learn_from_store

    with _store_for_comparison(tmp_path / "fb.db", gate_ranks=gate_ranks) as store:
        learned = learn_from_store(store, tmp_path / "gate.json", label=None, prompts="targ-question-first")
    compared = learned.comparison
    assert compared is not None and compared.gate == "targ-entropy" and compared.n == 60
    if gate_ranks:  # the gate in force ranks every label right: the new one cannot beat it
        assert compared.in_force == 1.0 and not compared.earns and "stays in force" in learned.summary()
    else:
        assert compared.earns and compared.learned > compared.in_force and "earns its place" in learned.summary()
    saved = load_learned(tmp_path / "gate.json").meta["report"]["compared"]
    assert saved["gate"] == "targ-entropy" and saved["earns"] is compared.earns  # the file records it


def test_pipeline_learn_puts_a_gate_in_force_only_when_it_earns_it(llama_backend: object, tmp_path: Path) -> None:
    import ragate

    _store_for_comparison(tmp_path / "fb.db", gate_ranks=True).close()
    with ragate.Pipeline("targ-entropy", lm=llama_backend, feedback_store=tmp_path / "fb.db") as rag:  # type: ignore[arg-type]
        learned = rag.learn(tmp_path / "gate.json")
        assert learned.comparison is not None and not learned.comparison.earns
        assert rag.spec.gate.kind == "targ-entropy" and rag.learner.gate_file is None  # the gate in force stays
        assert not (tmp_path / "gate.json").exists() and learned.path == tmp_path / "gate.candidate.json"
    _store_for_comparison(tmp_path / "fb2.db", gate_ranks=False).close()
    with ragate.Pipeline("targ-entropy", lm=llama_backend, feedback_store=tmp_path / "fb2.db") as rag:  # type: ignore[arg-type]
        for q in ("Who wrote Hamlet?", "What is the capital of France?"):
            rag.answer(q)  # the traffic's rate: the new gate's tau keeps it
        rate = rag.learner.band.rate()
        learned = rag.learn(tmp_path / "gate2.json")
        assert learned.comparison is not None and learned.comparison.earns
        assert rag.spec.gate.kind == "learned" and rag.learner.gate_file == str(tmp_path / "gate2.json")
        tau = rag.spec.gate.threshold
        assert rate is not None and tau is not None
        assert abs(float(np.mean(np.array(learned.cross_fitted) > tau)) - rate) <= 0.05


def test_a_learned_gate_fitted_elsewhere_warns_what_it_was_fitted_on(demo_gate: Path, llama_backend: object) -> None:
    import ragate

    fitted_on = r"was fitted on .* questions, \d+% of them labelled 'retrieve'"
    with (
        pytest.warns(RuntimeWarning, match=fitted_on),
        ragate.Pipeline("learned", gate_weights=demo_gate, lm=llama_backend) as rag,  # type: ignore[arg-type]
    ):
        assert rag.spec.gate.kind == "learned"
