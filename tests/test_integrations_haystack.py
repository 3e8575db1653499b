"""ragate's gate in Haystack, on the real package: real ``Pipeline``s with ``InMemoryBM25Retriever`` over the demo
passages, ``AnswerBuilder``, SmolLM2 as ragate's model, the demo's two questions.

Haystack's telemetry is switched off before it is imported (``HAYSTACK_TELEMETRY_ENABLED=False``): it would
otherwise write a user id under the home folder and post usage data."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_integrations import CALIBRATION, RAG_QUESTION, SKIP_QUESTION, K, demo_passages, run_doc_snippets

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"  # read once, when haystack is first imported
pytest.importorskip("haystack")

from haystack import Document, Pipeline
from haystack.components.builders import AnswerBuilder
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from ragate.integrations.haystack import RagateGenerator, RagateRouter

PASSAGES = demo_passages()


@pytest.fixture(scope="module")
def store() -> InMemoryDocumentStore:
    store = InMemoryDocumentStore()
    store.write_documents(
        [Document(id=p["id"], content=p["text"], meta={"title": p["title"]}) for p in PASSAGES]
    )
    return store


@pytest.fixture(scope="module")
def generator(store: InMemoryDocumentStore, llama_backend: Any) -> Iterator[RagateGenerator]:
    """The answering component over Haystack's BM25 retriever (its pipeline shared by this module's tests)."""
    bm25 = InMemoryBM25Retriever(document_store=store)
    options = {"method": "targ-margin", "calibration": CALIBRATION, "k": K, "lm": llama_backend}
    with RagateGenerator(retriever=bm25, **options) as llm:
        yield llm


def test_haystack_is_not_sending_telemetry() -> None:
    from haystack.telemetry import _telemetry

    assert _telemetry.telemetry is None


def test_the_router_sends_the_query_to_the_retriever_only_when_ragate_retrieves(
    generator: RagateGenerator, store: InMemoryDocumentStore
) -> None:
    rag = Pipeline()
    rag.add_component("gate", RagateRouter(pipeline=generator.pipeline))
    rag.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=K))
    rag.connect("gate.retrieve", "retriever.query")

    skip = rag.run({"gate": {"query": SKIP_QUESTION}})
    assert skip == {"gate": {"skip": SKIP_QUESTION}}  # the retriever never ran
    found = rag.run({"gate": {"query": RAG_QUESTION}})
    assert set(found) == {"retriever"}
    chosen = generator.pipeline.retrieve(RAG_QUESTION)  # TARG reads the question's top k of this retriever
    assert chosen.retrieved
    assert [d.id for d in found["retriever"]["documents"]] == [d.id for d in chosen.documents]


def test_the_generator_answers_alone_or_from_the_documents_ragate_chose(
    generator: RagateGenerator, store: InMemoryDocumentStore
) -> None:
    rag = Pipeline()
    rag.add_component("llm", generator)
    rag.add_component("answer", AnswerBuilder())
    rag.connect("llm.replies", "answer.replies")
    rag.connect("llm.documents", "answer.documents")
    rag.connect("llm.meta", "answer.meta")

    def ask(question: str) -> Any:
        return rag.run({"llm": {"query": question}, "answer": {"query": question}})["answer"]["answers"][0]

    skip = ask(SKIP_QUESTION)
    assert skip.meta["ragate"]["retrieved"] is False and skip.documents == [] and skip.data.strip()

    chosen = generator.pipeline.retrieve(RAG_QUESTION)
    rag_answer = ask(RAG_QUESTION)
    assert rag_answer.meta["ragate"]["retrieved"] is True and rag_answer.data.strip()
    assert len(chosen.documents) == K
    assert [d.id for d in rag_answer.documents] == [d.id for d in chosen.documents]
    originals = {d.id: d for d in store.filter_documents()}
    for rank, doc in enumerate(rag_answer.documents, 1):  # AnswerBuilder's copies of ragate's copies of yours
        original = originals[doc.id]
        assert doc.content == original.content and doc.meta["title"] == original.meta["title"]
        assert doc.meta["ragate_rank"] == rank and "ragate_rank" not in original.meta


def test_the_docs_snippets_run(smollm2_path: Path, tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    namespace = run_doc_snippets("haystack", tmp_path, monkeypatch)
    out = capsys.readouterr().out.splitlines()
    assert isinstance(namespace["gate"], RagateRouter)
    assert out[0] == str({"gate": {"skip": SKIP_QUESTION}})  # the router: skipped
    assert out[1].startswith("{'retriever': {'documents': [")  # the router: retrieved
    assert "'retrieved': True" in out[2] and "['p" in out[2]  # the answer, the documents read, the decision
    assert out[3] == "['gate'] False True"  # skipped: the router's own reply, no generator ran
    assert out[4] == "['gate', 'llm'] True True"  # retrieved: your generator read Haystack's documents


def test_a_two_branch_pipeline_with_your_generator_answers_both_and_drafts_once(
    store: InMemoryDocumentStore, smollm2_path: Path
) -> None:
    """Haystack's own Pipeline: ragate's router on top; its skip branch carries the model's own answer (the draft
    continued), its retrieve branch runs Haystack's BM25 retriever, PromptBuilder and the user's generator
    (ragate's generator type over the same SmolLM2, loaded once). The generator never runs on a skip."""
    from haystack.components.builders import PromptBuilder

    from ragate.integrations.haystack import RagateLLMGenerator

    template = "{% for d in documents %}{{ d.content }}\n{% endfor %}\nQuestion: {{ query }}\nAnswer:"
    with RagateLLMGenerator(model=str(smollm2_path), max_tokens=24) as llm:
        gate = RagateRouter(model_of=llm.pipeline, method="targ-margin", calibration=CALIBRATION, answer_skipped=True)
        with gate:
            assert gate.pipeline.lm is llm.pipeline.lm  # one model in memory
            rag = Pipeline()
            rag.add_component("gate", gate)
            rag.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=K))
            rag.add_component("prompt", PromptBuilder(template=template, required_variables=["query"]))
            rag.add_component("llm", llm)
            rag.connect("gate.retrieve", "retriever.query")
            rag.connect("gate.retrieve", "prompt.query")
            rag.connect("retriever.documents", "prompt.documents")
            rag.connect("prompt.prompt", "llm.prompt")

            skip = rag.run({"gate": {"query": SKIP_QUESTION}})
            assert set(skip) == {"gate"}  # nothing behind the retrieve socket ran: no generator call
            [reply] = skip["gate"]["replies"]
            alone = gate.pipeline.answer(SKIP_QUESTION)
            assert reply.strip() and reply == alone.text  # the draft, continued
            [meta] = skip["gate"]["meta"]
            assert meta["ragate"]["retrieved"] is False and meta["ragate"]["reason"]
            assert meta["ragate"]["savings"]["spent"]["tokens"] == alone.tokens  # the same tokens: one call

            rag_out = rag.run({"gate": {"query": RAG_QUESTION}})
            assert rag_out["gate"]["meta"][0]["ragate"]["retrieved"] is True
            [answer] = rag_out["llm"]["replies"]
            assert answer.strip() and rag_out["llm"]["meta"][0]["usage"]["completion_tokens"] > 0


def test_ragates_decision_is_a_span_of_the_apps_haystack_trace(generator: RagateGenerator) -> None:
    """An app's own Haystack tracer (the interface Langfuse, Datadog and OpenTelemetry tracers implement) receives
    ragate's span inside the component's span, with the decision as tags; no question text unless the app turned
    content tracing on."""
    import contextlib
    import contextvars

    from haystack import tracing

    current: contextvars.ContextVar[Any] = contextvars.ContextVar("current", default=None)
    finished: list[Any] = []

    class Recorded(tracing.Span):
        def __init__(self, name: str, parent: Any) -> None:
            self.name, self.parent, self.tags = name, parent, {}

        def set_tag(self, key: str, value: Any) -> None:
            self.tags[key] = value

    class AppTracer(tracing.Tracer):
        @contextlib.contextmanager
        def trace(self, operation_name: str, tags: Any = None, parent_span: Any = None) -> Iterator[Any]:
            span = Recorded(operation_name, parent_span or current.get())
            span.set_tags(tags or {})
            token = current.set(span)
            try:
                yield span
            finally:
                current.reset(token)
                finished.append(span)

        def current_span(self) -> Any:
            return current.get()

    rag = Pipeline()
    rag.add_component("gate", RagateRouter(pipeline=generator.pipeline))
    tracing.enable_tracing(AppTracer())
    try:
        rag.run({"gate": {"query": SKIP_QUESTION}})
    finally:
        tracing.disable_tracing()
    [ours] = [s for s in finished if s.name == "ragate.route"]
    assert ours.parent is not None and ours.parent.name == "haystack.component.run"
    assert ours.parent.tags["haystack.component.name"] == "gate"
    assert ours.tags["ragate.retrieved"] is False and ours.tags["ragate.method"] == "targ-margin"
    assert ours.tags["ragate.score"] <= ours.tags["ragate.threshold"] and ours.tags["ragate.reason"]
    assert "ragate.query" not in ours.tags  # content tracing is off
