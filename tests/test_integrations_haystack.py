"""ragate's gate in Haystack, on the real package: real ``Pipeline``s with ``InMemoryBM25Retriever`` over the demo
passages, ``AnswerBuilder``, SmolLM2 as ragate's model, the demo's two questions.

Haystack's telemetry is switched off before it is imported (``HAYSTACK_TELEMETRY_ENABLED=False``): it would
otherwise write a user id under the home folder and post usage data."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_integrations import CALIBRATION, RAG_QUESTION, SKIP_QUESTION, K, demo_passages, run_doc_snippets

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"  # read once, when haystack is first imported
pytest.importorskip("haystack")

from haystack import Document, Pipeline, tracing
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
    assert out[3] == "['gate', 'savings'] True True measured"  # your generator read; its usage measured the read
    assert out[4] == "['gate'] False True estimated"  # skipped: the router's own reply, no generator ran
    saved = namespace["record"]["savings"]["saved"]
    assert isinstance(saved["tokens"], int) and out[5] == str(saved)  # the skip's tokens saved, a number
    assert out[6] == str({"retrieve": SKIP_QUESTION}) and out[7] == str({"skip": RAG_QUESTION})  # corpus-coverage
    assert out[8] == str({"retrieve": RAG_QUESTION}) and out[9] == "False"  # one pipeline, shared


def test_a_two_branch_pipeline_with_your_generator_answers_both_drafts_once_and_measures_savings(
    store: InMemoryDocumentStore, smollm2_path: Path
) -> None:
    """Haystack's own Pipeline: ragate's router on top; its skip branch carries the model's own answer (the draft
    continued), its retrieve branch runs Haystack's BM25 retriever, PromptBuilder and the user's generator
    (ragate's generator type over the same SmolLM2, loaded once). The generator never runs on a skip. RagateSavings
    after the generator measures the retrieval from the usage the generator reports, so the skip after it reports
    the tokens it saved; a generator that reports no usage leaves the savings unknown."""
    from haystack.components.builders import PromptBuilder
    from haystack.dataclasses import ChatMessage

    from ragate.integrations.haystack import RagateLLMGenerator, RagateSavings

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
            rag.add_component("savings", RagateSavings())
            rag.connect("gate.retrieve", "retriever.query")
            rag.connect("gate.retrieve", "prompt.query")
            rag.connect("retriever.documents", "prompt.documents")
            rag.connect("prompt.prompt", "llm.prompt")
            rag.connect("gate.routed", "savings.routed")
            rag.connect("llm.replies", "savings.replies")
            rag.connect("llm.meta", "savings.meta")

            rag_out = rag.run({"gate": {"query": RAG_QUESTION}}, include_outputs_from={"gate"})
            assert set(rag_out) == {"gate", "savings"}
            [routed_meta] = rag_out["gate"]["meta"]
            assert routed_meta["ragate"]["retrieved"] is True
            assert routed_meta["ragate"]["savings"] is None  # not known until the generator has read
            [answer] = rag_out["savings"]["replies"]
            [read] = rag_out["savings"]["meta"]
            usage = read["usage"]  # the generator's own report, passed on
            assert answer.strip() and usage["completion_tokens"] > 0
            measured = read["ragate"]["savings"]
            assert read["ragate"]["retrieved"] is True and measured["how"] == "measured"
            read_tokens = usage["prompt_tokens"] + usage["completion_tokens"]
            assert measured["always_retrieve"]["tokens"] == read_tokens  # always retrieving: the read alone
            draft_tokens = routed_meta["usage"]["total_tokens"]  # the gate's draft, as a generator reports it
            assert measured["spent"]["tokens"] == draft_tokens + read_tokens and draft_tokens > 0
            assert measured["saved"]["tokens"] == -draft_tokens  # on a retrieval the gate only cost
            assert measured["always_retrieve"]["seconds"] > 0  # from the decision to the generator's replies

            skip = rag.run({"gate": {"query": SKIP_QUESTION}})
            assert set(skip) == {"gate"}  # nothing behind the retrieve socket ran: no generator call
            [reply] = skip["gate"]["replies"]
            alone = gate.pipeline.answer(SKIP_QUESTION)
            assert reply.strip() and reply == alone.text  # the draft, continued
            [meta] = skip["gate"]["meta"]
            assert meta["ragate"]["retrieved"] is False and meta["ragate"]["reason"]
            savings = meta["ragate"]["savings"]
            assert savings["spent"]["tokens"] == alone.tokens == meta["usage"]["total_tokens"]  # one call
            assert savings["how"] == "estimated" and savings["always_retrieve"]["tokens"] == read_tokens
            assert isinstance(savings["saved"]["tokens"], int)
            assert savings["saved"]["tokens"] == read_tokens - alone.tokens

            routed = rag_out["gate"]["routed"]  # the same retrieval, read by generators that report otherwise
            unknown = RagateSavings().run(routed=routed, replies=["an answer"], meta=[{"model": "no usage"}])
            assert unknown["replies"] == ["an answer"] and unknown["meta"][0]["model"] == "no usage"
            assert unknown["meta"][0]["ragate"]["savings"] is None  # never guessed
            chat_usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
            chat_reply = ChatMessage.from_assistant("x", meta={"usage": chat_usage})  # a chat generator's
            chat = RagateSavings().run(routed=routed, replies=[chat_reply])
            assert chat["replies"] == ["x"] and chat["meta"][0]["usage"] == chat_usage
            assert chat["meta"][0]["ragate"]["savings"]["always_retrieve"]["tokens"] == 9  # a chat reply's usage


class Recorded(tracing.Span):
    def __init__(self, name: str, parent: Any) -> None:
        self.name, self.parent, self.tags = name, parent, {}

    def set_tag(self, key: str, value: Any) -> None:
        self.tags[key] = value


class AppTracer(tracing.Tracer):
    """An app's own Haystack tracer (the interface Langfuse, Datadog and OpenTelemetry tracers implement), keeping
    every span it finished with its parent and tags."""

    def __init__(self) -> None:
        self.finished: list[Recorded] = []
        self._current: contextvars.ContextVar[Any] = contextvars.ContextVar("current", default=None)

    @contextlib.contextmanager
    def trace(self, operation_name: str, tags: Any = None, parent_span: Any = None) -> Iterator[Any]:
        span = Recorded(operation_name, parent_span or self._current.get())
        span.set_tags(tags or {})
        token = self._current.set(span)
        try:
            yield span
        finally:
            self._current.reset(token)
            self.finished.append(span)

    def current_span(self) -> Any:
        return self._current.get()


@contextlib.contextmanager
def traced(*, content: bool = False) -> Iterator[list[Recorded]]:
    """The spans an app's tracer gets inside the block (with Haystack's content tracing on where ``content``)."""
    app, before = AppTracer(), tracing.tracer.is_content_tracing_enabled
    tracing.enable_tracing(app)
    tracing.tracer.is_content_tracing_enabled = content
    try:
        yield app.finished
    finally:
        tracing.disable_tracing()
        tracing.tracer.is_content_tracing_enabled = before


def test_ragates_decision_is_a_span_of_the_apps_haystack_trace(generator: RagateGenerator) -> None:
    """An app's own Haystack tracer receives ragate's span inside the component's span, with the decision as tags;
    no question text unless the app turned content tracing on."""
    rag = Pipeline()
    rag.add_component("gate", RagateRouter(pipeline=generator.pipeline))
    with traced() as finished:
        rag.run({"gate": {"query": SKIP_QUESTION}})
    [ours] = [s for s in finished if s.name == "ragate.route"]
    assert ours.parent is not None and ours.parent.name == "haystack.component.run"
    assert ours.parent.tags["haystack.component.name"] == "gate"
    assert ours.tags["ragate.retrieved"] is False and ours.tags["ragate.method"] == "targ-margin"
    assert ours.tags["ragate.score"] <= ours.tags["ragate.threshold"] and ours.tags["ragate.reason"]
    assert "ragate.query" not in ours.tags  # content tracing is off


def test_the_gates_draft_is_an_llm_call_in_haystacks_accounting(generator: RagateGenerator) -> None:
    """The router's model calls (the draft and, on a skip, its continuation) are counted where Haystack counts a
    generator's: the router's ``meta`` has their ``usage`` and ``model`` as a generator's has, and the app's trace
    a ``haystack.chat_generator.run`` span (Haystack's own for an LLM a component calls inside) whose output is a
    ChatMessage reply with that usage in its meta, the same tokens as ragate's own record of what it spent."""
    from haystack.dataclasses import ChatMessage

    rag = Pipeline()
    rag.add_component("gate", RagateRouter(pipeline=generator.pipeline, answer_skipped=True))
    with traced(content=True) as finished:
        out = rag.run({"gate": {"query": SKIP_QUESTION}})
    [meta] = out["gate"]["meta"]
    usage = meta["usage"]
    assert meta["model"] == generator.pipeline.model_label and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["total_tokens"] == meta["ragate"]["savings"]["spent"]["tokens"]  # every token it spent

    [call] = [s for s in finished if s.name == "haystack.chat_generator.run"]
    assert call.parent is not None and call.parent.name == "ragate.route"
    assert call.parent.parent.tags["haystack.component.name"] == "gate"
    assert call.tags["haystack.component.type"] == "RagateRouter"
    [reply] = call.tags["haystack.component.output"]["replies"]
    assert isinstance(reply, ChatMessage) and reply.text == out["gate"]["replies"][0]
    assert reply.meta == {"model": meta["model"], "usage": usage}
    [component_span] = [s for s in finished if s.tags.get("haystack.component.name") == "gate"]
    assert component_span.tags["haystack.component.output"]["meta"][0]["usage"] == usage  # a generator's form
