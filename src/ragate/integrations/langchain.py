"""ragate's gate in LangChain and LangGraph (``pip install 'ragate[langchain]'``):

- :class:`RagateChatModel`: the model ragate's gate drafts with, as a LangChain chat model (loaded once);
- :class:`RagateGateNode`: a LangGraph node that writes the route, the decision (score, τ, reason), the savings and,
  where the gate skips, the model's own answer (its draft continued: never paid twice) into the graph's state;
- :class:`RagateRetriever`: your retriever behind the gate (no documents when the model knows);
- :class:`RagateRouter`: the gate as a Runnable returning ``"retrieve"`` or ``"answer"`` (a conditional edge).

A document ragate returns is a copy of your retriever's with ``ragate_rank`` (its place in ragate's choice),
``ragate_score`` (the score ragate's method ranked it by: your retriever's own score where it gives one, else 1/rank,
for a method that keeps the question's top k; the AIS score s(d) = cos(θ1 + θ2) for DTR and PAIRS) and ``ragate``
(the decision: method, retrieved, score, threshold, reason) in its metadata."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from ragate.integrations._common import (
    FrameworkSearch,
    OwnsPipeline,
    Route,
    closed_on_error,
    collecting,
    decide,
    decision_record,
    missing,
    open_model_pipeline,
    open_pipeline,
    question_of,
    record,
    result_record,
    route,
    router_search,
)

try:
    from langchain_core.callbacks import CallbackManagerForLLMRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import Runnable, RunnableConfig
    from pydantic import PrivateAttr
except ImportError as err:
    raise missing("LangChain (langchain-core)", "langchain", err) from err

if TYPE_CHECKING:
    from ragate.answers import Document as Chosen
    from ragate.pipeline import Pipeline


def document_id(doc: Document) -> str:
    """A LangChain document's id: its own, else ``"lc"`` + 16 hex digits of the sha1 of its text and metadata (the
    same document gets the same id in every search)."""
    if doc.id:
        return str(doc.id)
    meta = json.dumps(doc.metadata, sort_keys=True, default=str)
    return "lc" + hashlib.sha1(f"{doc.page_content}\n{meta}".encode()).hexdigest()[:16]


def as_search(retriever: BaseRetriever) -> FrameworkSearch[Document]:
    """A LangChain retriever as a ragate search function: ``ragate.Pipeline(search=as_search(retriever))``.

    Each document becomes ``{"id": document_id(doc), "text": page_content, "title": metadata["title"], "score":
    metadata["score"]}``; the retriever's own ``k`` bounds how many it returns."""

    def convert(doc: Document) -> dict[str, Any]:
        return record(
            document_id(doc), doc.page_content, doc.metadata.get("title"), doc.metadata.get("score")
        )

    return FrameworkSearch(lambda query, k: retriever.invoke(query), convert, type(retriever).__name__)


def _documents(
    chosen: tuple[Chosen, ...], seen: dict[str, Any], decision: dict[str, Any] | None = None
) -> list[Document]:
    """ragate's chosen documents as copies of your retriever's own, with ``ragate_score``, ``ragate_rank`` and the
    decision (``ragate``) added to their metadata (a new ``Document`` for one that came from the pipeline's own
    index)."""
    out = []
    for doc in chosen:
        scored = {"ragate_score": doc.score, "ragate_rank": doc.rank, **({"ragate": decision} if decision else {})}
        original = seen.get(doc.id)
        if isinstance(original, Document):
            out.append(original.model_copy(update={"metadata": {**original.metadata, **scored}}))
        else:
            meta = {"title": doc.title, **({"source": doc.source} if doc.source else {}), **scored}
            out.append(Document(page_content=doc.text, metadata=meta, id=doc.id))
    return out


class RagateRetriever(OwnsPipeline, BaseRetriever):
    """Your retriever behind ragate's gate: no documents when the gate says the model knows, else the documents
    ragate's method chooses from what your retriever returns (copies of yours, with ``ragate_score`` and
    ``ragate_rank`` in their metadata). A retriever is a Runnable: use it in LCEL chains as any other.

    Usage example::

        from langchain_community.retrievers import BM25Retriever
        from ragate.integrations.langchain import RagateRetriever

        bm25 = BM25Retriever.from_documents(docs, k=5)
        with RagateRetriever(retriever=bm25, method="targ-margin", budget=0.3) as retriever:
            docs = retriever.invoke("Who wrote Hamlet?")  # [] when the model knows

    :param retriever: your LangChain retriever (its ``k`` should cover ragate's ``k``).
    :param pipeline: a ready :class:`ragate.Pipeline` instead (you close it); it searches with its own ``search=``
        (e.g. ``as_search(retriever)``) or index.
    :param options: :class:`ragate.Pipeline`'s keywords: ``method`` (a registered gate's name works too),
        ``calibration`` or ``threshold`` or ``budget``, ``model`` or ``base_url`` (your model server), ``k``, ...;
        and LangChain's ``tags`` and ``metadata``.
    """

    retriever: BaseRetriever | None = None
    pipeline: Any = None
    _owned: bool = PrivateAttr(default=False)

    def __init__(
        self, *, retriever: BaseRetriever | None = None, pipeline: Pipeline | None = None, **options: Any
    ):
        if retriever is None and pipeline is None:
            raise TypeError("RagateRetriever needs retriever= (your LangChain retriever) or pipeline=")
        own: dict[str, Any] = {key: options.pop(key) for key in ("tags", "metadata") if key in options}
        search = as_search(retriever) if retriever is not None else None
        built, owned = open_pipeline("RagateRetriever", pipeline, options, search)
        with closed_on_error(built, owned):
            fields: dict[str, Any] = {"retriever": retriever, "pipeline": built, **own}
            super().__init__(**fields)
        self._owned = owned

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        with collecting() as seen:
            chosen = self.pipeline.retrieve(query)
        if not chosen.retrieved:
            return []
        return _documents(chosen.documents, seen, decision_record(chosen.method, chosen.decision))


class RagateRouter(OwnsPipeline, Runnable[Any, str]):
    """ragate's gate as a Runnable: ``"retrieve"`` when the model should read, ``"answer"`` when it knows. Its
    input is the question, or a state (a dict or an object) holding it under ``question_key``, so it serves as a
    LangGraph conditional edge as it is: ``graph.add_conditional_edges(START, router, {"retrieve": ...,
    "answer": ...})``.

    Only the gate runs (under a ``budget``, ragate's retrieval with it, so the budget counts every decision).

    Usage example::

        from ragate.integrations.langchain import RagateRouter

        with RagateRouter(method="targ-margin", calibration="targ-margin.json") as router:
            router.invoke("Who wrote Hamlet?")  # "answer": the model knows
            router.route("Where do the greasers live in The Outsiders?")  # "retrieve"

    :param retriever: your LangChain retriever, for a gate that compares the question with documents, or a budget
        that counts retrievals (optional: without it the router searches nothing).
    :param pipeline: a ready :class:`ragate.Pipeline` instead (you close it).
    :param question_key: where a state holds the question.
    :param options: :class:`ragate.Pipeline`'s keywords (``method``, ``calibration``, ``budget``, ``base_url``,
        ...).
    """

    name: str | None = "RagateRouter"

    def __init__(
        self,
        *,
        retriever: BaseRetriever | None = None,
        pipeline: Pipeline | None = None,
        question_key: str = "question",
        **options: Any,
    ) -> None:
        search = as_search(retriever) if retriever is not None else None
        if pipeline is None:
            search = router_search(options, search)
        self.pipeline, self._owned = open_pipeline("RagateRouter", pipeline, options, search)
        self.question_key = question_key

    def route(self, question: str) -> Route:
        """``"retrieve"`` or ``"answer"`` for ``question``."""
        return route(decide(self.pipeline, question))

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> str:
        return self._call_with_config(
            lambda value: self.route(question_of(value, self.question_key)), input, config
        )


ROLES = {"human": "user", "user": "user", "ai": "assistant", "assistant": "assistant", "system": "system"}


class RagateChatModel(OwnsPipeline, BaseChatModel):
    """The model of a :class:`ragate.Pipeline` as a LangChain chat model: greedy replies from the very model the
    gate drafts with, loaded once (:meth:`ragate.Pipeline.complete`; the model's chat template renders the
    messages, whose text never becomes template control tokens).

    Usage example::

        from ragate.integrations.langchain import RagateChatModel, RagateGateNode

        chat = RagateChatModel(model="qwen2.5-coder-1.5b")    # or RagateChatModel(pipeline=your_pipeline)
        gate = RagateGateNode(model_of=chat.pipeline, method="targ-margin", calibration="targ-margin.json")

    :param pipeline: a ready :class:`ragate.Pipeline` whose model answers (you close it).
    :param max_tokens: the reply length (default: the pipeline's answer length).
    :param options: :class:`ragate.Pipeline`'s keywords (``model``, ``backend``, ``base_url``, ``threads``, ...)
        when no pipeline is given; this chat model then owns it (``close()``).
    """

    pipeline: Any = None
    max_tokens: int | None = None
    _owned: bool = PrivateAttr(default=False)

    def __init__(self, *, pipeline: Pipeline | None = None, max_tokens: int | None = None, **options: Any):
        built, owned = open_model_pipeline("RagateChatModel", pipeline, options)
        with closed_on_error(built, owned):
            fields: dict[str, Any] = {"pipeline": built, "max_tokens": max_tokens}
            super().__init__(**fields)
        self._owned = owned

    @property
    def _llm_type(self) -> str:
        return "ragate"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.pipeline.model_label, "engine": self.pipeline.lm.engine}

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        turns = []
        for message in messages:
            role = ROLES.get(message.type)
            if role is None:
                raise ValueError(f"RagateChatModel reads system, human and ai messages, not {message.type!r}")
            turns.append((role, message.text if hasattr(message, "text") else str(message.content)))
        text, stage = self.pipeline.complete(turns, max_tokens=self.max_tokens)
        if stop:  # LangChain's stop words: cut at the first
            cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
            text = text[:cut]
        usage = {
            "input_tokens": stage.prompt_tokens,
            "output_tokens": stage.completion_tokens,
            "total_tokens": stage.prompt_tokens + stage.completion_tokens,
        }
        message = AIMessage(content=text, usage_metadata=usage)  # type: ignore[arg-type]
        return ChatResult(generations=[ChatGeneration(message=message)])


class RagateGateNode(OwnsPipeline, Runnable[Any, dict[str, Any]]):
    """ragate's gate as a LangGraph node: from a state holding the question it returns the update ``{route_key:
    "retrieve" | "answer", "ragate": {method, retrieved, score, threshold, reason, savings}}`` and, where the gate
    skips, ``{answer_key: the model's own answer}`` (the gate's draft, continued: the "answer" branch needs no
    second call). Route on it with ``graph.add_conditional_edges("gate", lambda s: s["route"], {...})``.

    Only the gate runs (no search): your graph's retrieving branch searches with your retriever and reads with your
    chat model (:class:`RagateChatModel` of the same model: ``model_of=chat.pipeline`` loads it once).

    :param pipeline: a ready :class:`ragate.Pipeline` (you close it).
    :param question_key: where the state holds the question.
    :param route_key: / :param answer_key: the state keys it writes.
    :param options: :class:`ragate.Pipeline`'s keywords (``method``, ``calibration``, ``budget``, ``model_of``, ...).
    """

    name: str | None = "RagateGateNode"

    def __init__(
        self,
        *,
        pipeline: Pipeline | None = None,
        question_key: str = "question",
        route_key: str = "route",
        answer_key: str = "answer",
        **options: Any,
    ) -> None:
        search = router_search(options, None) if pipeline is None else None
        self.pipeline, self._owned = open_pipeline("RagateGateNode", pipeline, options, search)
        self.question_key, self.route_key, self.answer_key = question_key, route_key, answer_key

    def update(self, question: str) -> dict[str, Any]:
        """The state update for ``question``."""
        chosen = self.pipeline.retrieve(question, answer_skipped=True, select=False)
        out: dict[str, Any] = {
            self.route_key: "retrieve" if chosen.retrieved else "answer",
            "ragate": result_record(self.pipeline, chosen, read_elsewhere=True),
        }
        if not chosen.retrieved:
            out[self.answer_key] = chosen.answer or ""
        return out

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._call_with_config(
            lambda value: self.update(question_of(value, self.question_key)), input, config
        )

