"""The private-documents benchmark's data (benchmarks/private_docs): the questions load as a ragate dataset, every
gold id is its gold file's document id in an index built as the README says (``--docs .`` from inside docs/,
.html and .rst both read), every gold answer occurs in its gold file's passages, and the questions' own search
finds the gold file (recall@3 through the metric ``ragate eval`` reports)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from ragate.eval.datasets import load_dataset
from ragate.eval.metrics import doc_id, recall_at_k, regex_match
from ragate.retrieval.store import iter_passage_file

BENCH = Path(__file__).parents[1] / "benchmarks" / "private_docs"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from ragate.retrieval.documents import index_documents
    from ragate.retrieval.index import open_index

    out = tmp_path_factory.mktemp("private") / "index"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(BENCH / "docs")
        index_documents(["."], out, "bm25", progress=False)
    retriever = open_index(out)
    yield out, retriever
    retriever.close()


def test_questions_load_as_a_dataset() -> None:
    examples = load_dataset(str(BENCH / "questions.jsonl"))
    assert len(examples) == 43 and all(e.kind == "regex" for e in examples)
    docs = [e for e in examples if e.id.startswith("doc-")]
    assert len(docs) == 29 and all(len(e.gold_ids) == 1 for e in docs)
    assert all(not e.gold_ids for e in examples if e.id.startswith("general-"))


def test_gold_ids_name_the_gold_files_and_hold_the_answers(built: Any) -> None:
    out, _ = built
    files = {f["source"]: f for f in json.loads((out / "documents.json").read_text())["files"]}
    assert len(files) == 25 and sum(s.endswith(".rst") for s in files) == 5  # .rst read as text
    texts: dict[str, list[str]] = {}
    for passage in iter_passage_file(out / "passages.jsonl"):
        texts.setdefault(doc_id(passage.id), []).append(passage.text)
    for line in (BENCH / "questions.jsonl").read_text().splitlines():
        row = json.loads(line)
        for name, gold in zip(row["gold_files"], row["gold_ids"], strict=True):
            assert {doc_id(p) for p in files[name]["passages"]} == {gold}, row["id"]
            assert any(regex_match(t, row["answers"]) for t in texts[gold]), row["id"]


def test_the_questions_own_search_finds_the_gold_file(built: Any) -> None:
    _, retriever = built
    examples = [e for e in load_dataset(str(BENCH / "questions.jsonl")) if e.gold_ids]
    hits = retriever.search([e.question for e in examples], 3)
    recall = [
        recall_at_k([h.id for h in found], e.gold_ids, 3) for e, found in zip(examples, hits, strict=True)
    ]
    assert statistics.fmean(r or 0.0 for r in recall) >= 0.8  # BM25 alone; the benchmark's hybrid index: 100%
