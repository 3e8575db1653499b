"""ragate's gate in LlamaIndex, on the real packages: llama-index-retrievers-bm25 over the demo passages, SmolLM2
as ragate's model (and as LlamaIndex's own LLM, through llama-index-llms-llama-cpp), the demo's two questions.

LlamaIndex runs offline here: its BM25 retriever is given the nodes (no download), and every LLM is local."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_integrations import CALIBRATION, RAG_QUESTION, SKIP_QUESTION, K, demo_passages, run_doc_snippets

pytest.importorskip("llama_index.core")
pytest.importorskip("llama_index.retrievers.bm25")

from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import TextNode
from llama_index.retrievers.bm25 import BM25Retriever

from ragate.integrations.llamaindex import RagateQueryEngine, RagateRetriever


@pytest.fixture(scope="module")
def nodes() -> dict[str, TextNode]:
    passages = demo_passages()
    return {p["id"]: TextNode(id_=p["id"], text=p["text"], metadata={"title": p["title"]}) for p in passages}


@pytest.fixture(scope="module")
def engine(nodes: dict[str, TextNode], llama_backend: Any) -> Iterator[RagateQueryEngine]:
    """The query engine over LlamaIndex's BM25 retriever (its pipeline shared by this module's tests)."""
    bm25 = BM25Retriever.from_defaults(nodes=list(nodes.values()), similarity_top_k=5)
    options = {"method": "targ-margin", "calibration": CALIBRATION, "k": K, "lm": llama_backend}
    with RagateQueryEngine(bm25, **options) as engine:
        yield engine


def test_the_query_engine_answers_alone_or_from_the_nodes_ragate_chose(
    engine: RagateQueryEngine, nodes: dict[str, TextNode]
) -> None:
    chosen = engine.pipeline.retrieve(RAG_QUESTION)  # what ragate's method picks from LlamaIndex's BM25
    assert chosen.retrieved and len(chosen.documents) == K

    skip = engine.query(SKIP_QUESTION)
    assert skip.metadata is not None and skip.metadata["ragate"]["retrieved"] is False  # the gate skipped
    assert skip.source_nodes == [] and str(skip).strip()  # no nodes, and the draft is the answer

    rag = engine.query(RAG_QUESTION)
    assert rag.metadata is not None and rag.metadata["ragate"]["retrieved"] is True
    assert rag.metadata["ragate"]["score"] > rag.metadata["ragate"]["threshold"]
    assert [n.node_id for n in rag.source_nodes] == [d.id for d in chosen.documents]
    assert [n.score for n in rag.source_nodes] == [d.score for d in chosen.documents]  # ragate's scores
    for found in rag.source_nodes:  # the user's own nodes, metadata included
        assert found.node.get_content() == nodes[found.node_id].get_content() and found.node.metadata["title"]
    assert str(rag).strip()


def test_the_retriever_feeds_llamaindexs_own_query_engine(
    engine: RagateQueryEngine, smollm2_path: Path
) -> None:
    pytest.importorskip("llama_index.llms.llama_cpp")
    from llama_index.llms.llama_cpp import LlamaCPP

    llm = LlamaCPP(model_path=str(smollm2_path), max_new_tokens=16, context_window=2048, verbose=False)
    retriever = RagateRetriever(pipeline=engine.pipeline)  # a ready pipeline, searching LlamaIndex's BM25
    query_engine = RetrieverQueryEngine.from_args(retriever, llm=llm)  # its LLM reads what ragate chose

    assert retriever.retrieve(SKIP_QUESTION) == []
    skip = query_engine.query(SKIP_QUESTION)
    assert skip.source_nodes == []  # LlamaIndex's engine saw no nodes

    chosen = engine.pipeline.retrieve(RAG_QUESTION)
    rag = query_engine.query(RAG_QUESTION)
    assert len(chosen.documents) == K
    assert [n.node_id for n in rag.source_nodes] == [d.id for d in chosen.documents]
    assert str(rag).strip()  # SmolLM2, through LlamaIndex, answered from them


def test_a_pipeline_with_a_search_of_its_own_gives_new_nodes(llama_backend: Any) -> None:
    import ragate

    def kettles(query: str, k: int) -> list[dict[str, str]]:
        return [
            {"id": "kettle", "title": "Warranty", "text": "The Brewmaster 3000 has a seven-year warranty."}
        ]

    with ragate.Pipeline(method="targ-margin", search=kettles, threshold=-1.0, k=1, lm=llama_backend) as rag:
        [found] = RagateRetriever(pipeline=rag).retrieve("How long is the Brewmaster 3000 warranty?")
    assert (
        isinstance(found.node, TextNode) and found.node_id == "kettle"
    )  # a node of its own, not one of yours
    assert found.node.metadata["title"] == "Warranty"


def test_the_docs_snippets_run(smollm2_path: Path, tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    namespace = run_doc_snippets("llamaindex", tmp_path, monkeypatch)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("False []")  # skipped: no nodes
    assert out[1].startswith("True ['p")  # retrieved: the nodes ragate chose
    assert out[2] == "[]" and isinstance(namespace["engine"], RagateQueryEngine)
