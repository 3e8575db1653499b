"""ragate's gate in LangChain and LangGraph, on the real packages: langchain-community's BM25 retriever (rank-bm25)
over the demo passages in an LCEL chain and a LangGraph ``StateGraph``, SmolLM2 as ragate's model, the demo's two
questions; a registered gate and a budget through the router."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from test_integrations import CALIBRATION, RAG_QUESTION, SKIP_QUESTION, K, demo_passages, run_doc_snippets

pytest.importorskip("langchain_core")
pytest.importorskip("rank_bm25")
with warnings.catch_warnings():  # langchain-community warns on import that it is being sunset
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.retrievers import BM25Retriever

from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from ragate.integrations.langchain import RagateRetriever, RagateRouter, document_id

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:langchain_community")


def lower_words(text: str) -> list[str]:
    return text.lower().split()


@pytest.fixture(scope="module")
def docs() -> dict[str, Document]:
    return {p["id"]: Document(p["text"], id=p["id"], metadata={"title": p["title"]}) for p in demo_passages()}


@pytest.fixture(scope="module")
def bm25(docs: dict[str, Document]) -> BM25Retriever:
    return BM25Retriever.from_documents(list(docs.values()), k=5, preprocess_func=lower_words)


@pytest.fixture(scope="module")
def retriever(bm25: BM25Retriever, llama_backend: Any) -> Iterator[RagateRetriever]:
    """The retriever over langchain-community's BM25 (its pipeline shared by this module's tests)."""
    options = {"method": "targ-margin", "calibration": CALIBRATION, "k": K, "lm": llama_backend}
    with RagateRetriever(retriever=bm25, **options) as r:
        yield r


def test_an_lcel_chain_reads_nothing_or_the_documents_ragate_chose(
    retriever: RagateRetriever, docs: dict[str, Document]
) -> None:
    seen: list[list[Document]] = []

    def reader(inputs: dict[str, Any]) -> str:  # stands where the user's prompt and chat model go
        seen.append(inputs["documents"])
        return f"{len(inputs['documents'])} documents for {inputs['question']}"

    chain = {"documents": retriever, "question": RunnablePassthrough()} | RunnableLambda(reader)
    assert chain.invoke(SKIP_QUESTION).startswith("0 documents")
    assert seen == [[]] and retriever.pipeline.decide(SKIP_QUESTION).retrieve is False  # the gate skipped

    chosen = retriever.pipeline.retrieve(RAG_QUESTION)
    assert chosen.retrieved and len(chosen.documents) == K
    chain.invoke(RAG_QUESTION)
    read = seen[-1]
    assert [d.id for d in read] == [d.id for d in chosen.documents]  # ragate's choice, in its order
    for rank, doc in enumerate(read, 1):
        original = docs[doc.id]
        assert (
            doc.page_content == original.page_content and doc.metadata["title"] == original.metadata["title"]
        )
        assert doc.metadata["ragate_rank"] == rank and "ragate_score" not in original.metadata  # a copy
        decision = doc.metadata["ragate"]  # the decision travels with each document
        assert decision["retrieved"] is True and decision["score"] > decision["threshold"] and decision["reason"]


def test_a_langgraph_conditional_edge_retrieves_only_when_ragate_says_so(
    retriever: RagateRetriever, bm25: BM25Retriever
) -> None:
    pytest.importorskip("langgraph")
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict, total=False):
        question: str
        documents: list[Document]
        answered: bool

    router = RagateRouter(pipeline=retriever.pipeline)
    graph = StateGraph(State)
    graph.add_node("retrieve", lambda state: {"documents": bm25.invoke(state["question"])[:K]})
    graph.add_node("answer", lambda state: {"answered": True})
    graph.add_conditional_edges(START, router, {"retrieve": "retrieve", "answer": "answer"})
    graph.add_edge("retrieve", "answer")
    graph.add_edge("answer", END)
    app = graph.compile()

    skip = app.invoke({"question": SKIP_QUESTION})
    assert skip["answered"] and "documents" not in skip  # the retrieve node never ran
    rag = app.invoke({"question": RAG_QUESTION})
    chosen = retriever.pipeline.retrieve(RAG_QUESTION)  # TARG reads the question's top k
    assert [d.id for d in rag["documents"]] == [d.id for d in chosen.documents]
    assert router.invoke(SKIP_QUESTION) == "answer" and router.route(RAG_QUESTION) == "retrieve"


def test_the_router_takes_a_registered_gate_and_a_budget(llama_backend: Any) -> None:
    import plugin_gate  # noqa: F401 - registers the user's gate "min-prob" (tests/plugin_gate.py)

    with RagateRouter(method="min-prob", threshold=-1.0, lm=llama_backend) as always:
        assert always.invoke({"question": SKIP_QUESTION}) == "retrieve"
    with RagateRouter(method="min-prob", threshold=1.0, lm=llama_backend) as never:
        assert never.invoke({"question": RAG_QUESTION}) == "answer"
    with RagateRouter(method="targ-margin", budget=0.5, window=20, lm=llama_backend) as budgeted:
        routes = [budgeted.route(q) for q in (SKIP_QUESTION, RAG_QUESTION)]
        assert budgeted.pipeline.budget is not None
        assert budgeted.pipeline.budget.rate() == routes.count("retrieve") / 2  # the budget counted both


def test_documents_without_an_id_get_a_stable_one() -> None:
    one = Document("Greasers live on the East Side.", metadata={"title": "The Outsiders"})
    assert document_id(one) == document_id(Document(one.page_content, metadata=dict(one.metadata)))
    assert document_id(one) != document_id(Document(one.page_content)) and document_id(one).startswith("lc")
    assert document_id(Document("x", id="mine")) == "mine"


def test_the_docs_snippets_run(smollm2_path: Path, tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    pytest.importorskip("langgraph")
    namespace = run_doc_snippets("langchain", tmp_path, monkeypatch)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{SKIP_QUESTION} []" and out[1].startswith(f"{RAG_QUESTION} [('p")
    assert out[2] == "dict_keys(['question', 'documents'])"  # the graph retrieved
    assert isinstance(namespace["router"], RagateRouter)
    route, how, saved, answered = out[3].split()
    assert (route, how, answered) == ("retrieve", "measured", "True")  # your chat model read the documents
    assert int(saved) < 0  # always retrieving costs your read; this answer the gate's draft too
    route, how, saved, answered = out[4].split()
    assert (route, how, answered) == ("answer", "estimated", "True")  # skipped: the state holds the answer
    assert int(saved) > 0  # the read it did not make, estimated from the one before
    counted = namespace["usage"].usage_metadata  # LangChain's usage callback: the drafts and the read
    assert out[5] == str(counted) and list(counted) == [namespace["chat"].pipeline.model_label]
    assert out[6].startswith("retrieve corpus-coverage score ")  # the corpus gate over BM25, no ragate index
    assert "BM25Retriever" in namespace["corpus_gate"].pipeline.index_name  # your retriever searched


def test_a_langgraph_app_with_your_chat_model_answers_both_branches_and_drafts_once(
    bm25: BM25Retriever, smollm2_path: Path
) -> None:
    """The adaptive-RAG graph with the user's own chat model (ragate's chat model type over SmolLM2, loaded once):
    the gate node writes the route, decision and savings into the state; on a retrieval the chat model reads the
    retriever's documents in the user's node, wrapped by ``gate.reading``, and the tokens its reply reported are the
    measured savings; on the skip after it the state's answer is the draft continued, the chat model is never
    called, and the tokens saved are a number (estimated from that read). LangChain's own usage callback counts the
    gate's model work as a chat-model call (``ragate draft``) beside the chat model's."""
    pytest.importorskip("langgraph")
    from langchain_core.callbacks import BaseCallbackHandler, get_usage_metadata_callback
    from langchain_core.messages import AIMessage
    from langchain_core.prompts import ChatPromptTemplate
    from langgraph.graph import END, START, StateGraph

    from ragate.integrations.langchain import DRAFT_RUN, RagateChatModel, RagateGateNode

    class State(TypedDict, total=False):
        question: str
        route: str
        ragate: dict[str, Any]
        documents: list[Document]
        answer: str

    names: list[str] = []  # the chat-model calls LangChain's callbacks saw

    class Calls(BaseCallbackHandler):
        def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
            names.append(kwargs.get("name") or "your chat model")

    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from the documents."), ("human", "{documents}\n\nQuestion: {question}")]
    )
    replies: list[AIMessage] = []
    chat = RagateChatModel(model=str(smollm2_path), max_tokens=24)
    with chat, RagateGateNode(model_of=chat.pipeline, method="targ-margin", calibration=CALIBRATION) as gate:
        assert gate.pipeline.lm is chat.pipeline.lm  # one model in memory

        def search(state: State) -> State:
            return {"documents": bm25.invoke(state["question"])}

        def read(state: State) -> State:
            text = "\n\n".join(d.page_content for d in state["documents"])
            replies.append((prompt | chat).invoke({"documents": text, "question": state["question"]}))
            return {"answer": replies[-1].text}

        graph = StateGraph(State)
        graph.add_node("gate", gate)
        graph.add_node("search", search)
        graph.add_node("read", gate.reading(read))
        graph.add_edge(START, "gate")
        graph.add_conditional_edges("gate", lambda s: s["route"], {"answer": END, "retrieve": "search"})
        graph.add_edge("search", "read")
        graph.add_edge("read", END)
        app = graph.compile()

        calls = Calls()
        with get_usage_metadata_callback() as usage:
            rag = app.invoke({"question": RAG_QUESTION}, config={"callbacks": [calls]})
            assert rag["route"] == "retrieve" and names == [DRAFT_RUN, "your chat model"]
            assert rag["answer"].strip() and rag["ragate"]["retrieved"] is True and len(rag["documents"]) == 5
            [reply] = replies
            assert reply.usage_metadata is not None
            read_tokens = reply.usage_metadata["total_tokens"]  # what LangChain's message says the read cost
            measured = rag["ragate"]["savings"]
            assert measured["how"] == "measured" and measured["always_retrieve"]["tokens"] == read_tokens
            draft = measured["gate"]["tokens"]
            assert draft > 0 and measured["spent"]["tokens"] == draft + read_tokens
            assert measured["saved"]["tokens"] == -draft  # the gate's draft was the price of deciding
            assert gate.read(rag, None) == {}  # a read is counted once

            skip = app.invoke({"question": SKIP_QUESTION}, config={"callbacks": [calls]})
        assert skip["route"] == "answer" and names[2:] == [DRAFT_RUN]  # no second call on a skip
        assert skip["ragate"]["retrieved"] is False and skip["ragate"]["reason"] and "id" not in skip["ragate"]
        assert skip["ragate"]["score"] <= skip["ragate"]["threshold"]
        savings = skip["ragate"]["savings"]
        assert savings["how"] == "estimated" and savings["always_retrieve"]["tokens"] == read_tokens
        saved = savings["saved"]["tokens"]
        assert isinstance(saved, int) and saved == read_tokens - savings["spent"]["tokens"]
        alone = gate.pipeline.answer(SKIP_QUESTION)  # ragate's own closed-book answer: the draft, continued
        assert skip["answer"].strip() and skip["answer"] == alone.text
        assert savings["spent"]["tokens"] == alone.tokens  # the same tokens: no second call

        # LangChain's own usage callback counted the gate's drafts (and the skip's continuation) and the read
        [(model, counted)] = usage.usage_metadata.items()
        assert model == chat.pipeline.model_label
        assert counted["total_tokens"] == measured["spent"]["tokens"] + savings["spent"]["tokens"]


def test_a_read_whose_llm_reports_no_usage_leaves_the_savings_unknown(retriever: RagateRetriever) -> None:
    """The reading node's LLM (langchain_core's fake chat model) reports no usage: the retrieval's savings stay
    None (never guessed) and the estimate learns nothing; the usage an LLM result reports in ``llm_output`` counts."""
    from langchain_core.language_models import FakeListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, LLMResult

    from ragate.integrations.langchain import RagateGateNode, reported_usage

    gate = RagateGateNode(pipeline=retriever.pipeline)  # the module's pipeline: one draft of SmolLM2
    decided = gate.invoke({"question": RAG_QUESTION})
    assert decided["route"] == "retrieve" and decided["ragate"]["savings"] is None and decided["ragate"]["id"]
    fake = FakeListChatModel(responses=["East Side"])
    node = gate.reading(lambda state: {"answer": fake.invoke(state["question"]).text})
    after = node.invoke({"question": RAG_QUESTION, **decided})
    assert after["answer"] == "East Side" and after["ragate"]["savings"] is None
    assert after["ragate"]["score"] == decided["ragate"]["score"]  # the same decision

    message = ChatGeneration(message=AIMessage("x"))
    assert reported_usage(LLMResult(generations=[[message]])) is None
    legacy = {"token_usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}
    assert reported_usage(LLMResult(generations=[[message]], llm_output=legacy)) == (7, 2)


def test_each_read_counts_its_own_calls_across_threads() -> None:
    """Concurrent reads (threads, as LangGraph runs parallel nodes) each count only their own LLM calls."""
    import threading

    from langchain_core.language_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from ragate.integrations.langchain import _READ_USAGE, ReadUsage

    costs: dict[int, Any] = {}

    def read(i: int) -> None:
        usage = ReadUsage()
        _READ_USAGE.set(usage)  # each thread starts with a context of its own
        for _ in range(i):
            reply = AIMessage("ok", usage_metadata={"input_tokens": 10 * i, "output_tokens": 1, "total_tokens": 0})
            GenericFakeChatModel(messages=iter([reply])).invoke("question")
        costs[i] = usage.cost()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(1, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {i: c.tokens for i, c in costs.items()} == {i: i * (10 * i + 1) for i in range(1, 6)}
    assert ReadUsage().cost() is None  # no call: unknown
