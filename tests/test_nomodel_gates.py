"""Gates that read no model (issue 51, build item 3): each signal on hand-built inputs, the search the gate makes
read by the reader (one search, no LM call before the decision), the document frequencies from a BM25 side and
from one cached pass, the trained gate fitted on the demo sweep with scikit-learn, its JSON round trip, damaged and
mismatched weights refused, and every entry point (ask, eval, sweep, calibrate, serve's settings, the budget
controller) taking the gates."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.errors import RagateError
from ragate.gates import nomodel as nm
from ragate.gates.registry import gate_names, get_gate
from ragate.methods import METHODS, get_method, run_method
from ragate.retrieval.bm25 import BM25Params
from ragate.types import GenerationRequest

GATES = (
    "retrieval-top1", "retrieval-gap", "retrieval-dispersion", "question-length", "question-numeric",
    "question-rarity", "no-model-lr",
)  # fmt: skip
DEMO_SWEEP = Path(__file__).parents[1] / "docs" / "results" / "runs" / "sweep-demo-smollm2-135m-80"
DEMO_FAMILY = "targ|question|k=5|n=5|cos|hyde=1|rep=5|ce=None|max=64"  # the sweep's TARG family (before issue S)


# -- signals on hand-built inputs -------------------------------------------------------------------------------


def test_retrieval_signals_exact() -> None:
    s = nm.retrieval_signals([0.5, 0.9, 0.7], "cosine")  # any order: sorted best first
    assert (s.top1, s.k, s.kind) == (0.9, 3, "cosine")
    assert s.gap == pytest.approx(0.2)
    assert s.dispersion == pytest.approx(math.sqrt((0.2**2 + 0.0 + 0.2**2) / 3))  # population std
    one = nm.retrieval_signals([12.5], "bm25")
    assert (one.top1, one.gap, one.dispersion) == (12.5, 0.0, 0.0)
    flat = nm.retrieval_signals([3.0, 3.0, 3.0, 3.0], "bm25")
    assert (flat.gap, flat.dispersion) == (0.0, 0.0)
    with pytest.raises(RagateError, match="no passage"):
        nm.retrieval_signals([])
    with pytest.raises(RagateError, match="not a finite number"):
        nm.retrieval_signals([0.3, float("nan")])


@pytest.mark.parametrize(
    ("question", "wh"),
    [
        ("Who wrote Hamlet?", "who"),
        ("whose portrait is on the 20 dollar bill", "who"),
        ("To whom was it given?", "who"),
        ("what is the capital of france", "what"),
        ("When did the Titanic sink?", "when"),
        ("where do the greasers live in the outsiders", "where"),
        ("In which year did Apollo 11 land?", "which"),
        ("Why is the sky blue?", "why"),
        ("How did Rome fall?", "how"),
        ("how many moons does mars have", "how-many"),
        ("How much does a blue whale weigh?", "how-many"),
        ("Is Paris the capital of France?", "yes-no"),
        ("did the beatles play in hamburg", "yes-no"),
        ("the south west wind blows across nigeria between", "other"),
        ("", "other"),
    ],
)
def test_question_word(question: str, wh: str) -> None:
    assert nm.question_word(question) == wh


def test_question_signals_exact() -> None:
    assert nm.question_signals("When did the Titanic sink?") == nm.QuestionSignals(5, "when", False, True)
    assert nm.question_signals("what is 2 plus 2") == nm.QuestionSignals(5, "what", True, False)
    assert nm.question_signals("Who won the 1998 World Cup?").date  # a year, and a digit
    assert nm.question_signals("What year did Apollo 11 land?") == nm.QuestionSignals(6, "what", True, True)
    assert nm.question_signals("which century was the printing press invented in").date
    assert nm.question_signals("who was born on 4 march") == nm.QuestionSignals(6, "who", True, True)
    assert nm.question_signals("Which queen was born in May?").date  # "May" capitalised, not first
    assert not nm.question_signals("May I ask who wrote Emma?").date  # the auxiliary
    assert nm.question_signals("May I ask who wrote Emma?").wh == "yes-no"
    assert nm.question_signals("who wrote the odyssey") == nm.QuestionSignals(4, "who", False, False)
    assert nm.question_signals("the 12345 route").date is False  # five digits: not a year


def test_entity_words_and_rarity_on_hand_built_frequencies() -> None:
    q = "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?"
    assert nm.entity_words(q) == ["Corliss", "Archer", "Kiss", "Tell"]
    assert nm.entity_words("Hamlet was written by whom?") == ["Hamlet"]  # a first word that names something
    assert nm.entity_words("In which city is the Eiffel Tower?") == ["Eiffel", "Tower"]
    assert nm.entity_words("who got the first nobel prize in physics") == ["got", "first", "nobel", "prize", "physics"]
    freqs = nm.DocFrequencies(
        10, {"corliss": 0, "archer": 1, "kiss": 2, "tell": 3}, np.array([1, 3, 1, 5]), BM25Params(), "hand-built"
    )
    r = nm.rarity(q, freqs)
    assert (r.term, r.df, r.n) == ("corliss", 1, 10)  # a tie at df 1: the alphabetically first term
    assert r.score == pytest.approx(math.log(11 / 2))
    assert nm.rarity("Who is Fleming?", freqs) == nm.Rarity("Fleming", "fleme", 0, 10, math.log(11))  # unseen
    assert nm.rarity("What is it?", freqs) == nm.Rarity(None, None, None, 10, 0.0)  # only stop words
    assert nm.rarity_score(0, 399) == pytest.approx(math.log(400))
    assert nm.rarity_score(399, 399) == 0.0


def test_feature_vector_order_and_one_hot() -> None:
    s = nm.Signals(
        nm.RetrievalSignals(0.8, 0.1, 0.05, 5, "cosine"),
        nm.QuestionSignals(7, "when", True, True),
        nm.Rarity("X", "x", 2, 9, math.log(10 / 3)),
    )
    v = s.vector(nm.FEATURES)
    assert v[:6].tolist() == [0.8, 0.1, 0.05, 7.0, 1.0, 1.0]
    one_hot = v[6:16]
    assert one_hot.sum() == 1.0 and nm.QUESTION_WORDS[int(np.argmax(one_hot))] == "when"
    assert v[16] == pytest.approx(math.log(10 / 3)) and len(v) == len(nm.FEATURES) == 17


# -- the registry -------------------------------------------------------------------------------------------------


def test_registry_lists_the_gates_and_their_methods() -> None:
    assert set(GATES) <= set(gate_names(builtin_only=True))
    for name in GATES:
        gate = get_gate(name)
        assert gate.name == name and gate.need.describe() == "text only"  # nothing from the backend
        spec = METHODS[name]
        assert spec.gate.kind == name and spec.selector.kind == "question" and spec.selector.k == nm.SIGNAL_K
        assert spec.prompts == get_method("targ-margin").prompts  # TARG's reader: one sweep family
    assert get_gate("no-model-lr").reads_weights and not get_gate("retrieval-top1").reads_weights
    assert not get_gate("question-length").reads_index and get_gate("question-rarity").reads_index


# -- the search the gate makes is the reader's ------------------------------------------------------------------


@pytest.fixture(scope="module")
def wiki_hybrid(minilm: Any, wiki_passages: list[Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from ragate.retrieval.index import build_index, open_index

    root = Path(tmp_path_factory.mktemp("wiki-hybrid")) / "hybrid"
    build_index(wiki_passages, root, "hybrid", encoder=minilm, progress=False)
    with open_index(root, encoder=minilm) as retriever:
        yield retriever


def _answer(text: str) -> Any:
    return make_generation([text], [-0.1])


def test_retrieval_gate_decides_with_no_lm_call_and_the_reader_reads_its_search(wiki_hybrid: Any) -> None:
    from ragate.answers.savings import retrieval_path

    lm = ScriptedBackend([_answer("1921")])
    spec = get_method("retrieval-top1").with_threshold(0.1)  # retrieve
    trace = run_method(spec, "When did Albert Einstein receive the Nobel Prize?", lm, wiki_hybrid)
    assert trace.retrieved and len(lm.calls) == 1  # the reading answer only
    assert [s.name for s in trace.stages] == ["retrieve", "answer"] and trace.gate_stages == 1
    assert not trace.stages[0].overhead  # the reader read the gate's hits: no second search
    found = wiki_hybrid.scored_search(["When did Albert Einstein receive the Nobel Prize?"], 5)[0]
    assert [h.id for h in trace.documents] == [h.id for h in found.hits] and trace.documents[0].id == "w01"
    assert found.kind == "cosine" and trace.gate.score == pytest.approx(float(found.scores[0]))
    assert "Albert Einstein" in str(lm.calls[0].prompt[-1].content)  # type: ignore[union-attr]
    assert "no LM call" in trace.gate.reason
    assert retrieval_path(trace).seconds == pytest.approx(sum(s.seconds for s in trace.stages))

    lm = ScriptedBackend([_answer("1921")])
    trace = run_method(spec.with_threshold(0.99), "When did Albert Einstein win it?", lm, wiki_hybrid)
    assert not trace.retrieved and not trace.documents and len(lm.calls) == 1  # the direct answer
    assert [(s.name, s.overhead) for s in trace.stages] == [("retrieve", True), ("answer", False)]
    assert "Einstein was a German-born" not in str(lm.calls[0].prompt)


def test_hybrid_scored_search_is_its_search(wiki_hybrid: Any) -> None:
    q = ["Which river is the longest in Africa?", "Who painted The Starry Night?"]
    assert [[h.id for h in hits] for hits in wiki_hybrid.search(q, 5)] == [
        [h.id for h in found.hits] for found in wiki_hybrid.scored_search(q, 5)
    ]
    dense = wiki_hybrid.dense.search(q, 5)
    for found, hits in zip(wiki_hybrid.scored_search(q, 5), dense, strict=True):
        assert found.scores.tolist() == pytest.approx([h.score for h in hits])  # the dense half's cosines


@pytest.mark.parametrize("name", ["question-length", "question-numeric"])
def test_question_gates_read_nothing_but_the_question(name: str) -> None:
    lm = ScriptedBackend([_answer("1969")])
    trace = run_method(get_method(name).with_threshold(100.0), "What year did Apollo 11 land?", lm, None)
    assert not trace.retrieved and [s.name for s in trace.stages] == ["answer"] and trace.gate_stages == 0
    assert len(lm.calls) == 1  # the direct answer, generated after the decision


def test_question_numeric_and_length_scores() -> None:
    lm = ScriptedBackend([_answer("x"), _answer("y")])
    spec = get_method("question-numeric").with_threshold(2.0)  # never retrieves: scores only
    assert run_method(spec, "What year did Apollo 11 land?", lm, None).gate.score == 1.0
    assert run_method(spec, "who wrote the odyssey", lm, None).gate.score == 0.0
    lm = ScriptedBackend([_answer("x")])
    assert run_method(get_method("question-length").with_threshold(99), "a b c", lm, None).gate.score == 3.0


# -- document frequencies -----------------------------------------------------------------------------------------


def test_doc_frequencies_from_bm25_equal_a_pass_and_the_pass_is_cached(
    wiki_hybrid: Any, wiki_dense: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAGATE_HOME", str(tmp_path / "home"))
    from_bm25 = nm.doc_frequencies(wiki_hybrid)
    assert from_bm25.source == "bm25 index" and from_bm25.n == 40
    root = nm.index_root(wiki_dense)
    assert root is not None
    (root / nm.DOC_FREQ_FILE).unlink(missing_ok=True)
    nm._FREQS.clear()
    passed = nm.doc_frequencies(wiki_dense)
    assert passed.n == 40 and str(root / nm.DOC_FREQ_FILE) in passed.source
    terms = set(from_bm25.vocab) | set(passed.vocab)
    assert {t: from_bm25.of(t) for t in terms} == {t: passed.of(t) for t in terms}  # the same counts
    assert from_bm25.of("nobel") == 2 and from_bm25.of("physicist") >= 1
    cached = json.loads((root / nm.DOC_FREQ_FILE).read_text())
    assert cached["format"] == nm.DOC_FREQ_FORMAT and cached["passages"] == 40 and cached["df"]["nobel"] == 2
    nm._FREQS.clear()
    assert "cached" in nm.doc_frequencies(wiki_dense).source
    (root / nm.DOC_FREQ_FILE).write_text('{"format": "ragate-doc-freq", "df": ')  # damaged: counted again
    nm._FREQS.clear()
    assert nm.doc_frequencies(wiki_dense).of("nobel") == 2
    assert json.loads((root / nm.DOC_FREQ_FILE).read_text())["df"]["nobel"] == 2


def test_rarity_gate_over_an_index(wiki_hybrid: Any) -> None:
    lm = ScriptedBackend([_answer("Fleming")])
    trace = run_method(get_method("question-rarity"), "Who discovered Penicillin?", lm, wiki_hybrid)
    df = nm.doc_frequencies(wiki_hybrid).of("penicillin")
    assert df >= 1 and trace.gate.score == pytest.approx(math.log(41 / (df + 1)))
    assert [s.name for s in trace.stages] == ["rarity", "answer"] and len(lm.calls) == 1
    assert "'penicillin'" in trace.gate.reason


# -- the trained combination ----------------------------------------------------------------------------------------


def _weights(model: dict[str, Any], corpus: dict[str, Any] | None, **meta: Any) -> nm.GateWeights:
    names = ("top1", "words", "rarity")
    return nm.GateWeights(
        names, np.array([0.5, 10.0, 3.0]), np.array([0.1, 4.0, 1.0]), np.array([1.0, 0.5, -0.25]), -0.2,
        {"label": "closed-wrong", "model": model, "index": corpus, "encoder": meta.pop("encoder", None),
         "score_kind": "cosine", **meta},
    )  # fmt: skip


def test_weights_score_round_trip_and_refusals(wiki_hybrid: Any, tmp_path: Path) -> None:
    from ragate.methods.runner import encoder_identity

    scripted = {"engine": "scripted", "model": "scripted"}
    corpus = nm.index_corpus(wiki_hybrid)
    assert corpus is not None and corpus["kind"] == "hybrid" and corpus["passages"] == 40
    w = _weights(scripted, corpus, encoder=encoder_identity(wiki_hybrid))
    x = np.array([0.7, 14.0, 2.0])
    z = -0.2 + 1.0 * 2.0 + 0.5 * 1.0 - 0.25 * -1.0
    assert w.score(x) == pytest.approx(1 / (1 + math.exp(-z)))
    path = nm.save_weights(w, tmp_path / "w.json")
    loaded = nm.load_weights(path)
    assert loaded.features == w.features and loaded.intercept == w.intercept
    assert loaded.score(x) == w.score(x) and loaded.meta["model"] == scripted
    assert b"pickle" not in path.read_bytes() and json.loads(path.read_text())["format"] == nm.WEIGHTS_FORMAT

    spec = get_method("no-model-lr")
    spec = spec.with_(gate=replace(spec.gate, weights=str(path)))
    lm = ScriptedBackend([_answer("1921")])
    trace = run_method(spec.with_threshold(0.0), "When did Albert Einstein get the Nobel Prize?", lm, wiki_hybrid)
    assert trace.retrieved and len(lm.calls) == 1 and trace.stages[0].name == "retrieve"
    assert not trace.stages[0].overhead and "P(closed-wrong)" in trace.gate.reason

    with pytest.raises(RagateError, match="needs fitted weights"):
        run_method(get_method("no-model-lr"), "q?", ScriptedBackend([]), wiki_hybrid)
    other_model = _weights({"engine": "llama.cpp", "model": "qwen"}, corpus)
    with pytest.raises(RagateError, match="fitted on what model 'qwen'"):
        nm.check_weights(other_model, model=scripted, encoder=None, corpus=corpus, score_kind="cosine")
    other_index = _weights(scripted, {**corpus, "passages_sha256": "0" * 64})
    with pytest.raises(RagateError, match="fitted over an index of 40 passages"):
        nm.check_weights(other_index, model=scripted, encoder=None, corpus=corpus, score_kind="cosine")
    with pytest.raises(RagateError, match="no index directory"):
        nm.check_weights(w, model=scripted, encoder=None, corpus=None, score_kind="cosine")
    with pytest.raises(RagateError, match="read 'cosine' search scores, but this run gives 'bm25'"):
        nm.check_weights(w, model=scripted, encoder=None, corpus=corpus, score_kind="bm25")
    other_encoder = {"name": "tiny-64", "dim": 64, "query_prefix": ""}
    with pytest.raises(RagateError, match="encoder 'all-MiniLM-L6-v2'.*embeds with 'tiny-64'"):
        nm.check_weights(w, model=scripted, encoder=other_encoder, corpus=corpus, score_kind="cosine")
    # the same refusal through a run, before any LM call
    nm.save_weights(other_index, tmp_path / "other.json")
    lm = ScriptedBackend([])
    with pytest.raises(RagateError, match="fitted over an index"):
        run_method(spec.with_(gate=replace(spec.gate, weights=str(tmp_path / "other.json"))), "q?", lm, wiki_hybrid)
    assert not lm.calls


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: "{" + d[:40], "not valid JSON"),
        (lambda d: d.replace('"ragate-gate-weights"', '"ragate-skr-labels"'), "not a gate weights file"),
        (lambda d: d.replace('"format_version": 1', '"format_version": 9'), "format version 9"),
        (lambda d: d.replace('"intercept": -0.2', '"intercept": NaN'), "intercept must be a finite number"),
        (lambda d: d.replace("1.0,\n  0.5", "NaN,\n  0.5"), "coef holds NaN"),
        (lambda d: d.replace('"rarity"', '"popularity"'), "unknown features"),
        (lambda d: d.replace('"rarity"', '"words"'), "named twice"),
        (lambda d: d.replace("0.1,\n  4.0", "-0.1,\n  4.0"), "every scale must be positive"),
        (lambda d: d.replace("0.1,\n  4.0,\n  1.0", "0.1,\n  4.0"), "scale has 2 values for 3 features"),
        (lambda d: d.replace('"closed-wrong"', '"whatever"'), "label must be one of"),
        (lambda d: d.replace('"model": {', '"model": ["x", {').replace('"scripted"\n }', '"scripted"\n }]'),
         "model must be an object"),
    ],
)
def test_a_damaged_weights_file_is_refused_clearly(edit: Any, message: str, tmp_path: Path) -> None:
    path = nm.save_weights(_weights({"engine": "scripted", "model": "scripted"}, None), tmp_path / "w.json")
    text = path.read_text()
    damaged = edit(text)
    assert damaged != text
    path.write_text(damaged)
    with pytest.raises(RagateError, match=message) as err:
        nm.load_weights(path)
    assert "ragate gate fit" in str(err.value)
    with pytest.raises(RagateError, match="not found: fit them with `ragate gate fit"):
        nm.load_weights(tmp_path / "missing.json")


@pytest.fixture(scope="module")
def demo_weights(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, minilm: Any) -> Path:
    """The trained gate fitted on the demo sweep (80 questions, SmolLM2, the demo index) by the CLI."""
    from ragate.cli.main import main

    out = tmp_path_factory.mktemp("weights") / "demo.json"
    argv = ["gate", "fit", "--sweep", str(DEMO_SWEEP), "--out", str(out), "--metric", "acc", "--family", DEMO_FAMILY]
    assert main(argv) == 0
    return out


def test_fit_on_the_demo_sweep_round_trips_and_matches_scikit_learn(demo_weights: Path) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from ragate.learning.gatefit import feature_matrix, record_label
    from ragate.learning.sweeps import sweep_questions
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    weights = nm.load_weights(demo_weights)
    meta = weights.meta
    assert weights.features == nm.FEATURES and meta["label"] == "closed-wrong" and meta["metric"] == "acc"
    assert meta["n"] == 80 and meta["positives"] == 76 and meta["score_kind"] == "cosine"
    assert meta["model"]["sha256"] and meta["index"]["passages"] == 400 and meta["encoder"]["dim"] == 384
    assert len(meta["questions"]) == 80 and meta["fit"]["library"] == "scikit-learn"
    assert 0.5 <= meta["auroc"]["training"] <= 1.0 and meta["auroc"]["folds"] == 4
    found = sweep_questions(DEMO_SWEEP, family=DEMO_FAMILY, metric="acc", method="no-model-lr")
    texts = [found.questions[r["id"]] for r in found.records]
    y = np.array([record_label(r, "closed-wrong", "acc") for r in found.records])
    with open_index(demo_index()) as retriever:
        x, kind = feature_matrix(texts, nm.FEATURES, retriever)
    assert kind == "cosine" and x.shape == (80, 17)
    scaler = StandardScaler().fit(x)
    reference = LogisticRegression(C=1.0, max_iter=1000).fit(scaler.transform(x), y)
    expected = reference.predict_proba(scaler.transform(x))[:, 1]
    assert [weights.score(row) for row in x] == pytest.approx(expected.tolist(), abs=1e-9)


def test_fit_refuses_one_label_and_a_gate_without_weights(tmp_path: Path) -> None:
    from ragate.learning.gatefit import fit_gate

    with pytest.raises(RagateError, match="all 80 records .* labelled 'closed-wrong' = True by em"):
        fit_gate(DEMO_SWEEP, family=DEMO_FAMILY, metric="em")
    with pytest.raises(RagateError, match="reads no fitted weights"):
        fit_gate(DEMO_SWEEP, gate="retrieval-top1")
    with pytest.raises(RagateError, match="no records of the family"):
        fit_gate(DEMO_SWEEP, metric="acc")  # today's TARG family is question-first: name the sweep's


def test_ask_runs_the_trained_gate_with_no_lm_call_before_deciding(
    demo_weights: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragate.cli.main import main

    argv = ["ask", "who got the first nobel prize in physics", "--method", "no-model-lr", "--gate-weights",
            str(demo_weights), "--json", "--quiet", "--max-tokens", "8", "--threshold", "0.0"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    stages = out["stages"]
    assert [s["name"] for s in stages] == ["retrieve", "gate-score", "answer"]
    assert stages[0]["prompt_tokens"] == stages[1]["prompt_tokens"] == 0  # decided before any LM call
    assert out["retrieved"] and not stages[0]["overhead"] and "no LM call" in out["gate"]["reason"]
    assert main(["ask", "q?", "--gate-weights", str(demo_weights), "--quiet"]) == 2
    assert "--gate-weights goes with --method no-model-lr" in capsys.readouterr().err


def test_ask_refuses_weights_for_another_gate(demo_weights: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ragate.cli.main import main

    assert main(["ask", "q?", "--method", "targ-margin", "--gate-weights", str(demo_weights)]) == 2
    assert "--gate-weights goes with a trained gate" in capsys.readouterr().err


# -- every entry point takes them ---------------------------------------------------------------------------------


def _scripted_weights(tmp_path: Path, retriever: Any) -> Path:
    from ragate.methods.runner import encoder_identity

    corpus = nm.index_corpus(retriever)
    w = _weights({"engine": "scripted", "model": "scripted"}, corpus, encoder=encoder_identity(retriever))
    return nm.save_weights(w, tmp_path / "scripted.json")


def _echo(request: GenerationRequest) -> Any:
    return make_generation(["Paris"], [-0.5], [[("Paris", -0.5), ("Lyon", -2.0)]])


def test_sweep_and_calibration_take_the_gates(wiki_hybrid: Any, tmp_path: Path) -> None:
    from ragate.eval.run import EvalConfig
    from ragate.eval.sweep import frontier, sweep_pass
    from ragate.tuning.calibrate import check_calibratable, threshold_from_scores

    weights = _scripted_weights(tmp_path, wiki_hybrid)
    methods = ("targ-margin", *GATES)
    for name in GATES:
        check_calibratable(get_method(name))  # every one has a threshold to calibrate
    config = EvalConfig("demo", methods, limit=4, gate_weights=str(weights))
    lm = ScriptedBackend(_echo)
    records = sweep_pass(config, tmp_path / "sweep", progress=False, lm=lm, retriever=wiki_hybrid, cache=False)
    assert len(records) == 4 and {r["family"] for r in records} == {records[0]["family"]}  # one family
    for name in GATES:
        scores = [r["gates"][name]["score"] for r in records]
        assert all(math.isfinite(s) for s in scores), name
        assert frontier(records, name)["points"]
        threshold_from_scores(scores, 0.5)
    saved = json.loads((tmp_path / "sweep" / "config.json").read_text())
    assert saved["gate_weights"] == str(weights) and saved["gate_weights_file"]["sha256"]
    with pytest.raises(RagateError, match="--gate-weights FILE"):
        sweep_pass(EvalConfig("demo", ("no-model-lr",), limit=2), tmp_path / "s2", progress=False, lm=lm,
                   retriever=wiki_hybrid, cache=False)  # fmt: skip


def test_eval_refuses_the_weights_training_questions(wiki_hybrid: Any, tmp_path: Path) -> None:
    from ragate.eval.datasets import load_dataset
    from ragate.eval.run import EvalConfig, check_weights_leak

    examples = load_dataset("demo")[:3]
    w = nm.load_weights(_scripted_weights(tmp_path, wiki_hybrid))
    trained = replace(w, meta={**w.meta, "questions": [nm.question_digest(examples[1].question.upper() + "?")]})
    path = nm.save_weights(trained, tmp_path / "trained.json")
    with pytest.raises(RagateError, match="1 of this run's 3 questions trained the gate weights"):
        check_weights_leak(EvalConfig("demo", ("no-model-lr",), gate_weights=str(path)), examples)
    assert check_weights_leak(EvalConfig("demo", ("targ-margin",)), examples) is None


def test_pipeline_decide_calibrate_and_budget_take_them(wiki_hybrid: Any, tmp_path: Path) -> None:
    from ragate.pipeline import Pipeline

    questions = ["Who painted the Mona Lisa?", "What is the capital of Japan?", "Who discovered penicillin?",
                 "How tall is Mount Everest?"]  # fmt: skip
    with Pipeline("retrieval-top1", lm=ScriptedBackend(_echo), retriever=wiki_hybrid, budget=0.5) as rag:
        decision = rag.decide(questions[0])
        assert "no LM call" in decision.reason and not rag.lm.calls  # type: ignore[attr-defined]
        for q in questions:
            rag.answer(q)
        assert rag.budget is not None and rag.budget.tau != get_gate("retrieval-top1").default_tau
    weights = _scripted_weights(tmp_path, wiki_hybrid)
    with Pipeline(
        "no-model-lr", lm=ScriptedBackend(_echo), retriever=wiki_hybrid, gate_weights=weights
    ) as rag:
        cal = rag.calibrate(questions, 0.5)
        assert cal.n == 4 and cal.gate == "no-model-lr" and not rag.lm.calls  # type: ignore[attr-defined]
    with pytest.raises(RagateError, match="--gate-weights goes with a trained gate"):
        Pipeline("question-length", lm=ScriptedBackend(_echo), retriever=wiki_hybrid, gate_weights=weights)


def test_calibrate_from_dev_opens_the_index_for_a_gate_that_searches(smollm2_path: Path, minilm: Any) -> None:
    from ragate.tuning.calibrate import calibrate

    found = calibrate(method="retrieval-gap", dev="demo", budget=0.5, limit=6, progress=False)
    assert found["n"] == 6 and found["gate"] == "retrieval-gap" and math.isfinite(found["tau"])
    assert found["dev_retrieval_rate"] <= 0.5


def test_service_settings_pair_the_weights_with_the_trained_gate(demo_weights: Path) -> None:
    from ragate.service.settings import ServiceSettings

    ServiceSettings(method="no-model-lr", gate_weights=str(demo_weights))
    ServiceSettings(method="retrieval-top1")
    with pytest.raises(ValueError, match="needs --gate-weights FILE"):
        ServiceSettings(method="no-model-lr")
    with pytest.raises(ValueError, match="--gate-weights goes with --method no-model-lr"):
        ServiceSettings(method="targ-margin", gate_weights=str(demo_weights))
