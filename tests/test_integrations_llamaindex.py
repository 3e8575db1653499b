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
    assert out[3].startswith("False ") and out[3] != "False Empty Response"  # your LLM's skip: the draft, continued
    assert out[4].startswith("ragate targ-margin: ") and out[4].endswith(" 0")  # routed to the model's knowledge
    assert out[5].startswith("ragate targ-margin: ") and out[5].endswith(" 5")  # to your query engine's 5 nodes
    # corpus= and search=as_search(bm25): corpus-coverage routes with no model call, the other way round here
    assert out[6].startswith("ragate corpus-coverage: corpus-coverage score ") and out[6].endswith(" 0")
    assert out[7].startswith("ragate corpus-coverage: corpus-coverage score ") and out[7].endswith(" 5")
    # your LLM's read measured from its usage, then a skip's estimate; the draft and the read in the token counter
    how, saved = out[8].split()
    assert how == "measured" and int(saved) < 0  # minus the gate's draft: always retrieving would have read too
    how, saved = out[9].split()
    assert how == "estimated" and int(saved) > 0
    assert out[10].startswith("[(") and out[10].count("(") >= 3  # the draft, the read, the skip's draft
    assert out[11] == "['QueryStartEvent', 'LLMCompletionStartEvent', 'LLMCompletionEndEvent', 'LLMCompletionStartEvent']"


@pytest.fixture(scope="module")
def own_llm(smollm2_path: Path) -> Iterator[Any]:
    """SmolLM2 as the app's LLM (ragate's LLM type): loaded here, once, for the gate and the reading alike."""
    from ragate.integrations.llamaindex import RagateLLM

    with RagateLLM(model=str(smollm2_path), max_tokens=24) as llm:
        yield llm


def test_your_llm_answers_both_branches_and_the_draft_is_paid_once(
    own_llm: Any, nodes: dict[str, TextNode]
) -> None:
    """Both branches with the app's LLM, counted by LlamaIndex's own TokenCountingHandler: the retrieving answer's
    savings are measured with the read's usage as the app's LLM reported it, and the skip after it gets a number of
    tokens saved; ragate's draft is an LLM call in the counter, with its exact tokens."""
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler

    bm25 = BM25Retriever.from_defaults(nodes=list(nodes.values()), similarity_top_k=5)
    counter = TokenCountingHandler()
    options = {"method": "targ-margin", "calibration": CALIBRATION, "k": K}
    before = own_llm.callback_manager  # the synthesizer gives the engine's to the LLM: the module's LLM gets it back
    try:
        with RagateQueryEngine(bm25, llm=own_llm, callback_manager=CallbackManager([counter]), **options) as engine:
            assert engine.pipeline.lm is own_llm.pipeline.lm  # the gate drafts with the app's model: loaded once
            rag = engine.query(RAG_QUESTION)
            meta = rag.metadata["ragate"]
            assert meta["retrieved"] is True and str(rag).strip() and str(rag) != "Empty Response"
            draft, read = counter.llm_token_counts  # ragate's draft, then the app's LLM reading LlamaIndex's prompt
            assert draft.prompt == RAG_QUESTION and "Context information" in read.prompt
            savings = meta["savings"]
            assert savings["how"] == "measured" and "your LLM's read" in savings["estimator"]
            assert savings["gate"]["tokens"] == draft.total_token_count > 0  # the counter has the draft's own count
            assert savings["always_retrieve"]["tokens"] == read.total_token_count > 0  # as the LLM reported it
            assert savings["spent"]["tokens"] == draft.total_token_count + read.total_token_count
            assert savings["saved"]["tokens"] == -draft.total_token_count
            chosen = engine.pipeline.retrieve(RAG_QUESTION)
            assert [n.node_id for n in rag.source_nodes] == [d.id for d in chosen.documents]

            skip = engine.query(SKIP_QUESTION)
            meta = skip.metadata["ragate"]
            assert meta["retrieved"] is False and meta["reason"] and meta["score"] <= meta["threshold"]
            assert str(skip).strip() and str(skip) != "Empty Response" and skip.source_nodes == []
            saved = meta["savings"]["saved"]["tokens"]
            assert meta["savings"]["how"] == "estimated" and isinstance(saved, int) and not isinstance(saved, bool)
            assert saved == read.total_token_count - meta["savings"]["spent"]["tokens"]  # the one read, less the gate
            skipped = counter.llm_token_counts[2:]  # the draft (and its continuation): ragate's calls, counted
            assert skipped and skipped[0].prompt == SKIP_QUESTION
            assert sum(c.total_token_count for c in skipped) == meta["savings"]["spent"]["tokens"]
            # the answer is the draft continued: the same text and tokens as ragate's own closed-book answer, and
            # the stages are the gate's draft (and its continuation) only: no second call of the app's LLM
            alone = engine.pipeline.answer(SKIP_QUESTION)
            assert not alone.retrieved and str(skip) == alone.text
            assert meta["savings"]["spent"]["tokens"] == alone.tokens
            assert {s.name for s in alone.stages} <= {"draft", "continue"}
            assert len(skipped) == len(alone.stages)
    finally:
        own_llm.callback_manager = before


def test_a_read_counts_its_own_queries_calls_and_only_reported_usage() -> None:
    """The usage a read adds up comes from its own context: two reads at once in two threads, their LLM end events
    interleaved on LlamaIndex's dispatcher, each get their own calls; a call that reports no usage (or a read with
    no call) leaves the cost unknown; a chat that wraps a completion (the same raw response) counts once."""
    import threading

    from llama_index.core.base.llms.types import ChatMessage, ChatResponse, CompletionResponse
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMCompletionEndEvent

    from ragate.integrations._llamaindex_calls import _reading, reported_usage

    def response(prompt: int, completion: int) -> CompletionResponse:
        return CompletionResponse(text="x", raw={"usage": {"prompt_tokens": prompt, "completion_tokens": completion}})

    assert reported_usage(response(3, 4)) == (3, 4)
    assert reported_usage(CompletionResponse(text="x")) is None  # nothing reported: not guessed
    gemini = CompletionResponse(text="x", raw={"usage_metadata": {"prompt_token_count": 5, "candidates_token_count": 1}})
    assert reported_usage(gemini) == (5, 1)

    root, turns, costs = get_dispatcher(), threading.Barrier(2), {}

    def read(name: str, prompt: int) -> None:
        with _reading() as reads:
            for _ in range(3):
                turns.wait()  # both reads are open: their events interleave
                root.event(LLMCompletionEndEvent(prompt=name, response=response(prompt, 1)))
        costs[name] = reads.cost(0.5)

    threads = [threading.Thread(target=read, args=(name, n)) for name, n in (("a", 10), ("b", 100))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert costs["a"] is not None and costs["a"].tokens == 3 * 11 and costs["a"].seconds == 0.5
    assert costs["b"] is not None and costs["b"].tokens == 3 * 101

    with _reading() as reads:
        inner = response(7, 2)
        root.event(LLMCompletionEndEvent(prompt="p", response=inner))
        chat = ChatResponse(message=ChatMessage(content="x"), raw=inner.raw)  # CustomLLM.chat around complete
        root.event(LLMChatEndEvent(messages=[], response=chat))
    assert reads.cost(1.0) is not None and reads.cost(1.0).tokens == 9  # type: ignore[union-attr]
    with _reading() as reads:
        root.event(LLMCompletionEndEvent(prompt="p", response=response(7, 2)))
        root.event(LLMCompletionEndEvent(prompt="p", response=CompletionResponse(text="no usage")))
    assert reads.cost(1.0) is None
    with _reading() as reads:
        pass
    assert reads.cost(1.0) is None  # no call seen (a streamed read ends after the engine returns)
    root.event(LLMCompletionEndEvent(prompt="p", response=response(7, 2)))  # outside any read: nobody's


def test_another_llm_answers_the_skipped_question(
    llama_backend: Any, nodes: dict[str, TextNode], smollm2_path: Path
) -> None:
    pytest.importorskip("llama_index.llms.llama_cpp")
    from llama_index.llms.llama_cpp import LlamaCPP

    llm = LlamaCPP(model_path=str(smollm2_path), max_new_tokens=16, context_window=2048, verbose=False)
    bm25 = BM25Retriever.from_defaults(nodes=list(nodes.values()), similarity_top_k=5)
    options = {"method": "targ-margin", "calibration": CALIBRATION, "k": K, "lm": llama_backend}
    with RagateQueryEngine(bm25, llm=llm, **options) as two:
        skip = two.query(SKIP_QUESTION)
    assert skip.metadata["ragate"]["retrieved"] is False
    assert str(skip).strip() and str(skip) != "Empty Response"  # LlamaIndex's LLM answered the bare question


def test_the_selector_routes_a_router_query_engine(own_llm: Any, nodes: dict[str, TextNode]) -> None:
    from llama_index.core.query_engine import RouterQueryEngine
    from llama_index.core.tools import QueryEngineTool

    from ragate.integrations.llamaindex import RagateSelector

    bm25 = BM25Retriever.from_defaults(nodes=list(nodes.values()), similarity_top_k=K)
    with RagateSelector(model_of=own_llm.pipeline, method="targ-margin", calibration=CALIBRATION) as selector:
        router = RouterQueryEngine(
            selector=selector,
            query_engine_tools=[
                QueryEngineTool.from_defaults(selector.direct_engine(), description="the model's own knowledge"),
                QueryEngineTool.from_defaults(RetrieverQueryEngine.from_args(bm25, llm=own_llm), description="docs"),
            ],
            llm=own_llm,
        )
        skip = router.query(SKIP_QUESTION)
        [why] = skip.metadata["selector_result"].selections
        assert why.index == 0 and why.reason.startswith("ragate targ-margin: ")
        assert skip.metadata["ragate"]["retrieved"] is False and str(skip).strip()
        assert str(skip) == selector.pipeline.answer(SKIP_QUESTION).text  # the draft, continued: paid once
        assert len(selector.answers._kept) == 0  # taken by the branch that answered

        rag = router.query(RAG_QUESTION)
        [why] = rag.metadata["selector_result"].selections
        assert why.index == 1 and rag.source_nodes and str(rag).strip()


def test_corpus_coverage_routes_over_llamaindexs_own_bm25_with_no_ragate_index() -> None:
    """The private-documents benchmark's files read, split and searched by LlamaIndex's own components; ragate gets
    the nodes' texts once (corpus=) and decides with no model and no ragate index: the document questions go to
    retrieval, the general ones do not. Without corpus= the gate is refused before any model loads."""
    import json

    from llama_index.core import SimpleDirectoryReader
    from llama_index.core.node_parser import SentenceSplitter

    from ragate.errors import IndexNeedError

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "private_docs"
    docs = SimpleDirectoryReader(str(root / "docs"), recursive=True).load_data()
    found = SentenceSplitter(chunk_size=256, chunk_overlap=20).get_nodes_from_documents(docs)
    bm25 = BM25Retriever.from_defaults(nodes=found, similarity_top_k=5)
    with pytest.raises(IndexNeedError, match="counts terms in your corpus.*corpus=texts"):
        RagateRetriever(bm25, method="corpus-coverage", model="/no/such/model.gguf")  # refused before it loads

    questions = [json.loads(line) for line in (root / "questions.jsonl").read_text().splitlines()]
    texts = [node.get_content() for node in found]
    with RagateRetriever(bm25, method="corpus-coverage", corpus=texts) as gate:
        routed = {
            kind: [gate.pipeline.decide(q["question"]).retrieve for q in questions if q["category"] == kind]
            for kind in ("docs", "general")
        }
        assert len(routed["docs"]) == 29 and sum(routed["docs"]) >= 24  # 25 of 29 here
        assert len(routed["general"]) == 14 and sum(routed["general"]) == 0
        [node] = gate.retrieve(questions[0]["question"])[:1]
        assert "ffi_prep_cif_var" in node.node.get_content()  # the document question reads LlamaIndex's node


def test_ragates_decision_reaches_llamaindexs_instrumentation(engine: RagateQueryEngine) -> None:
    """An app's event and span handlers on LlamaIndex's root dispatcher see ragate's decision as an event, inside a
    span of ragate's engine that is inside LlamaIndex's own query span; the query's QueryStartEvent and QueryEndEvent
    (as LlamaIndex's own engines send them) around it; and each call of ragate's model as an LLM call."""
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.llm import LLMCompletionEndEvent, LLMCompletionStartEvent
    from llama_index.core.instrumentation.events.query import QueryEndEvent, QueryStartEvent
    from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler

    from ragate.integrations.llamaindex import RagateDecisionEvent

    seen: list[Any] = []

    class AppEvents(BaseEventHandler):
        def handle(self, event: Any, **kwargs: Any) -> None:
            seen.append(event)

    root = get_dispatcher()
    events, spans, counter = AppEvents(), SimpleSpanHandler(), TokenCountingHandler()
    root.add_event_handler(events)
    root.add_span_handler(spans)
    before, engine.callback_manager = engine.callback_manager, CallbackManager([counter])
    try:
        response = engine.query(SKIP_QUESTION)
    finally:
        root.event_handlers.remove(events)
        root.span_handlers.remove(spans)
        engine.callback_manager = before
    kinds = QueryStartEvent | QueryEndEvent | LLMCompletionStartEvent | LLMCompletionEndEvent | RagateDecisionEvent
    flow = [e for e in seen if isinstance(e, kinds)]
    assert isinstance(flow[0], QueryStartEvent) and flow[0].query == SKIP_QUESTION
    assert isinstance(flow[-1], QueryEndEvent) and flow[-1].response is response
    assert isinstance(flow[-2], RagateDecisionEvent)  # after ragate's model calls
    calls = [e for e in flow if isinstance(e, LLMCompletionEndEvent)]  # the draft (and its continuation)
    assert calls and calls[0].response.raw["ragate_stage"] == "draft" and calls[0].prompt == SKIP_QUESTION
    counted = [c.total_token_count for c in counter.llm_token_counts]  # TokenCountingHandler, on the engine's
    assert [e.response.raw["usage"]["total_tokens"] for e in calls] == counted
    assert sum(counted) == response.metadata["ragate"]["savings"]["spent"]["tokens"] > 0
    query_span = next(s for s in spans.completed_spans if s.id_ == flow[0].span_id)
    assert query_span.id_.startswith("RagateQueryEngine.query") and flow[-1].span_id == query_span.id_
    [decision] = [e for e in seen if isinstance(e, RagateDecisionEvent)]
    assert decision.retrieved is False and decision.method == "targ-margin" and decision.reason
    assert decision.score <= decision.threshold and decision.savings is not None
    ours = next(s for s in spans.completed_spans if s.id_ == decision.span_id)
    assert ours.id_.startswith("RagateQueryEngine.custom_query")
    parent = next(s for s in spans.completed_spans if s.id_ == ours.parent_id)
    assert "query" in parent.id_  # LlamaIndex's own query span holds ragate's
    call = next(s for s in spans.completed_spans if s.id_ == calls[0].span_id)  # each call in a span of its own
    assert call.id_.startswith("ragate_model_call") and call.parent_id == ours.id_
