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
    assert out[3].startswith("answer ") and out[3].endswith(" True")  # skipped: the state holds the answer
    assert out[4].startswith("retrieve ") and out[4].endswith(" True")  # your chat model read the documents


def test_a_langgraph_app_with_your_chat_model_answers_both_branches_and_drafts_once(
    bm25: BM25Retriever, smollm2_path: Path
) -> None:
    """The adaptive-RAG graph with the user's own chat model (ragate's chat model type over SmolLM2, loaded once):
    the gate node writes the route, decision and savings into the state; on a skip the state's answer is the
    draft continued and the chat model is never called; on a retrieval the chat model reads the retriever's
    documents. LangChain's own callbacks count the chat model's calls."""
    pytest.importorskip("langgraph")
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.prompts import ChatPromptTemplate
    from langgraph.graph import END, START, StateGraph

    from ragate.integrations.langchain import RagateChatModel, RagateGateNode

    class State(TypedDict, total=False):
        question: str
        route: str
        ragate: dict[str, Any]
        documents: list[Document]
        answer: str

    class Calls(BaseCallbackHandler):
        chat = 0

        def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
            Calls.chat += 1

    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from the documents."), ("human", "{documents}\n\nQuestion: {question}")]
    )
    chat = RagateChatModel(model=str(smollm2_path), max_tokens=24)
    with chat, RagateGateNode(model_of=chat.pipeline, method="targ-margin", calibration=CALIBRATION) as gate:
        assert gate.pipeline.lm is chat.pipeline.lm  # one model in memory

        def search(state: State) -> State:
            return {"documents": bm25.invoke(state["question"])}

        def read(state: State) -> State:
            text = "\n\n".join(d.page_content for d in state["documents"])
            reply = (prompt | chat).invoke({"documents": text, "question": state["question"]})
            return {"answer": reply.text}

        graph = StateGraph(State)
        graph.add_node("gate", gate)
        graph.add_node("search", search)
        graph.add_node("read", read)
        graph.add_edge(START, "gate")
        graph.add_conditional_edges("gate", lambda s: s["route"], {"answer": END, "retrieve": "search"})
        graph.add_edge("search", "read")
        graph.add_edge("read", END)
        app = graph.compile()

        calls = Calls()
        skip = app.invoke({"question": SKIP_QUESTION}, config={"callbacks": [calls]})
        assert skip["route"] == "answer" and Calls.chat == 0  # no second call on a skip
        assert skip["ragate"]["retrieved"] is False and skip["ragate"]["reason"]
        assert skip["ragate"]["score"] <= skip["ragate"]["threshold"]
        assert skip["ragate"]["savings"]["spent"]["tokens"] > 0
        alone = gate.pipeline.answer(SKIP_QUESTION)  # ragate's own closed-book answer: the draft, continued
        assert skip["answer"].strip() and skip["answer"] == alone.text
        assert skip["ragate"]["savings"]["spent"]["tokens"] == alone.tokens  # the same tokens: no second call

        rag = app.invoke({"question": RAG_QUESTION}, config={"callbacks": [calls]})
        assert rag["route"] == "retrieve" and Calls.chat == 1 and len(rag["documents"]) == 5
        assert rag["answer"].strip() and rag["ragate"]["retrieved"] is True
