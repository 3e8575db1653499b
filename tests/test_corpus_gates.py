"""Corpus-aware gates (ragate.gates.corpus): the idf-weighted coverage on a hand-computed example, the evidence over
a real index of the private-documents benchmark (its manual's questions covered, general questions not), the
``corpus-or-margin`` rule max(coverage, U_mar) with no draft when the search settles "retrieve" (and a full draft
where sweeps need the whole score), and the gates as methods of every entry point."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.gates import corpus
from ragate.gates.nomodel import DocFrequencies, doc_frequencies
from ragate.gates.registry import gate_names, get_gate
from ragate.methods import get_method, run_method
from ragate.methods.runner import decide
from ragate.retrieval.bm25 import BM25Params
from ragate.uncertainty import margin_uncertainty

BENCH = Path(__file__).parents[1] / "benchmarks" / "private_docs"


def test_idf_coverage_by_hand() -> None:
    idf = {"closur": 2.0, "memori": 1.0, "environ": 3.0, "libffi": 0.0}.__getitem__
    # question terms {closur, memori, environ, libffi}: total weight 6; the passage holds closur and libffi
    assert corpus.idf_coverage(
        ["closur", "memori", "environ", "libffi", "closur"], ["libffi", "closur"], idf
    ) == (pytest.approx(2.0 / 6.0))
    assert corpus.idf_coverage(["closur", "memori"], ["closur", "memori", "x"], idf) == 1.0
    assert corpus.idf_coverage(["libffi"], ["libffi"], idf) == 0.0  # no term of positive weight
    assert corpus.idf_coverage([], ["libffi"], idf) == 0.0


def test_corpus_evidence_weights_rare_terms_and_takes_the_best_passage() -> None:
    # 10 passages: "closure" in 1, "memory" in 4, "libffi" in all 10; "hamlet" in none
    vocab = {"closur": 0, "memori": 1, "libffi": 2}
    freqs = DocFrequencies(10, vocab, __import__("numpy").array([1, 4, 10]), BM25Params(), "test")
    found = corpus.corpus_evidence(
        "Which libffi closure memory?", ["libffi memory", "the closure memory of libffi"], freqs
    )
    idf = {t: math.log(11 / (df + 1)) for t, df in (("closur", 1), ("memori", 4), ("libffi", 10))}
    assert set(found.terms) == {"closur", "memori", "libffi"}
    assert found.rank == 2 and found.k == 2 and found.coverage == pytest.approx(1.0)
    first = corpus.corpus_evidence("Which libffi closure memory?", ["libffi memory"], freqs)
    assert first.coverage == pytest.approx((idf["memori"] + idf["libffi"]) / sum(idf.values()))
    absent = corpus.corpus_evidence("Who wrote Hamlet?", ["libffi memory"], freqs)
    assert absent.coverage == 0.0 and absent.rank is None and "none of the top-1" in absent.describe()


@pytest.fixture(scope="module")
def private_bm25(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A BM25 index of the private-documents benchmark's documents (libffi's manual, awscli's topics)."""
    from ragate.retrieval.documents import index_documents
    from ragate.retrieval.index import open_index

    out = tmp_path_factory.mktemp("private") / "index"
    index_documents([BENCH / "docs"], out, "bm25", progress=False)
    retriever = open_index(out)
    yield retriever
    retriever.close()


def test_document_questions_are_covered_and_general_ones_are_not(private_bm25: Any) -> None:
    rows = [json.loads(line) for line in (BENCH / "questions.jsonl").read_text().splitlines()]
    freqs = doc_frequencies(private_bm25)
    values: dict[str, list[float]] = {"docs": [], "general": []}
    for row in rows:
        hits = private_bm25.search([row["question"]], 5)[0]
        values[row["category"]].append(
            corpus.corpus_evidence(row["question"], [h.passage.text for h in hits], freqs).coverage
        )
    assert len(values["docs"]) == 29 and len(values["general"]) == 14
    docs, general = sorted(values["docs"]), sorted(values["general"])
    # the evidence ranks them apart: the median document question is covered far more than any but a few general
    assert docs[len(docs) // 2] > 0.6 > general[len(general) // 2]
    assert sum(v > 0.5 for v in general) <= 2


def _draft(gaps: list[float]) -> Any:
    tokens = [f"t{i} " for i in range(len(gaps))]
    return make_generation(
        tokens, [-0.01] * len(gaps), [[(t, -0.01), ("x", -0.01 - g)] for t, g in zip(tokens, gaps)]
    )


def test_corpus_or_margin_is_the_max_and_skips_the_draft_when_the_search_settles(private_bm25: Any) -> None:
    question = "Which environment variable names the first directory libffi tries for closure memory?"
    spec = get_method("corpus-or-margin")
    hits = private_bm25.search([question], 5)[0]
    ev = corpus.corpus_evidence(question, [h.passage.text for h in hits], doc_frequencies(private_bm25))
    assert ev.coverage > 0.5

    # tau below the coverage: "retrieve" from the search alone, no draft; the reader's call is the only one
    lm = ScriptedBackend([make_generation(["LIBFFI_TMPDIR"], [-0.1])])
    trace = run_method(spec.with_threshold(ev.coverage - 0.01), question, lm, private_bm25)
    assert trace.retrieved and len(lm.calls) == 1 and "without a draft" in trace.gate.reason
    assert trace.gate.score == pytest.approx(ev.coverage)

    # the same threshold where the whole score is needed (sweeps, calibration): a full draft, the same decision
    gaps = [9.0] * 20  # a confident draft: U = exp(-3) ~ 0.05
    lm = ScriptedBackend([_draft(gaps)])
    decision = decide(spec.with_threshold(ev.coverage - 0.01), question, lm, private_bm25)
    assert decision.retrieve and decision.score == pytest.approx(ev.coverage)
    assert len(lm.calls) == 1  # the draft

    # tau above the coverage: the margin decides; an unsure draft retrieves with score U
    unsure = [0.1] * 20
    u = sum(margin_uncertainty(g, 3.0) for g in unsure) / 20
    lm = ScriptedBackend([_draft(unsure)])
    decision = decide(spec.with_threshold(ev.coverage + 0.01), question, lm, private_bm25)
    assert u > ev.coverage + 0.01 and decision.retrieve and decision.score == pytest.approx(u)
    lm = ScriptedBackend([_draft(gaps), make_generation(["x"], [-0.1])])
    trace = run_method(spec.with_threshold(ev.coverage + 0.01), question, lm, private_bm25)
    assert not trace.retrieved and trace.gate.score == pytest.approx(ev.coverage)  # max(coverage, ~0.05)


def test_registered_with_targs_reader() -> None:
    assert {"corpus-coverage", "corpus-or-margin"} <= set(gate_names())
    for name in ("corpus-coverage", "corpus-or-margin"):
        spec = get_method(name)
        assert spec.gate.kind == name and spec.selector.kind == "question" and spec.selector.k == 5
        assert get_gate(name).reads_index
    assert get_gate("corpus-coverage").need.top_k == 0 and get_gate("corpus-or-margin").need.top_k == 2


def test_a_pipeline_calibrates_corpus_coverage_on_unlabelled_questions_and_routes_by_the_corpus(
    private_bm25: Any,
) -> None:
    """Calibrated for a budget of the document questions' share (29 of 43) on the benchmark's questions, with no
    answer read and no LM call, the gate then sends a document question to retrieval and a general one away."""
    from ragate.pipeline import Pipeline

    rows = [json.loads(line) for line in (BENCH / "questions.jsonl").read_text().splitlines()]
    echo = make_generation(["ok"], [-0.1])
    with Pipeline("corpus-coverage", lm=ScriptedBackend([echo] * 4), retriever=private_bm25) as rag:
        cal = rag.calibrate([r["question"] for r in rows], 29 / 43)
        assert cal.gate == "corpus-coverage" and cal.n == 43 and not rag.lm.calls  # type: ignore[attr-defined]
        assert rag.decide("Which environment variable sets the AWS CLI's retry_mode?").retrieve
        assert not rag.decide("Who painted the Mona Lisa?").retrieve
        assert not rag.lm.calls  # type: ignore[attr-defined]
