"""ragate's gate in LangChain and LangGraph (``pip install 'ragate[langchain]'``):

- :class:`RagateChatModel`: the model ragate's gate drafts with, as a LangChain chat model (loaded once);
- :class:`RagateGateNode`: a LangGraph node that writes the route, the decision (score, τ, reason), the savings and,
  where the gate skips, the model's own answer (its draft continued: never paid twice) into the graph's state;
  ``gate.reading(your_node)`` counts what your LLM's read of the documents cost (LangChain's own usage reports),
  so the savings of the next skips are known;
- :class:`RagateRetriever`: your retriever behind the gate (no documents when the model knows);
- :class:`RagateRouter`: the gate as a Runnable returning ``"retrieve"`` or ``"answer"`` (a conditional edge).

A document ragate returns is a copy of your retriever's with ``ragate_rank`` (its place in ragate's choice),
``ragate_score`` (the score ragate's method ranked it by: your retriever's own score where it gives one, else 1/rank,
for a method that keeps the question's top k; the AIS score s(d) = cos(θ1 + θ2) for DTR and PAIRS) and ``ragate``
(the decision: method, retrieved, score, threshold, reason) in its metadata.

The gate's model work (its draft and, on a skip, the continuation) is reported to the run's LangChain callbacks as
one chat-model call named ``ragate draft``, with its token usage: LangChain's usage callback
(``get_usage_metadata_callback``) and tracers such as LangSmith count it beside your own LLM's calls."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ragate.integrations._common import (
    DirectAnswers,
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
    usage_cost,
)

try:
    from langchain_core.callbacks import (
        BaseCallbackHandler,
        CallbackManager,
        CallbackManagerForChainRun,
        CallbackManagerForLLMRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.documents import Document
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langchain_core.outputs import ChatGeneration, ChatResult, LLMResult
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import Runnable, RunnableConfig
    from langchain_core.runnables.base import coerce_to_runnable
    from langchain_core.tracers.context import register_configure_hook
    from pydantic import PrivateAttr
except ImportError as err:
    raise missing("LangChain (langchain-core)", "langchain", err) from err

if TYPE_CHECKING:
    from uuid import UUID

    from ragate.answers.answer import Document as Chosen
    from ragate.answers.answer import Retrieval
    from ragate.answers.savings import Cost
    from ragate.pipeline import Pipeline

DRAFT_RUN = "ragate draft"  # the name of the chat-model call the gate's model work is reported as


def reported_usage(response: LLMResult) -> tuple[int, int] | None:
    """The prompt and completion tokens an LLM reported for one call, from LangChain's own usage reporting: the
    replies' ``AIMessage.usage_metadata``, else the ``LLMResult.llm_output`` token usage (``token_usage`` or
    ``usage``: ``prompt_tokens``/``completion_tokens`` or ``input_tokens``/``output_tokens``); None where it
    reported none, or counts that are not whole numbers."""

    def whole(*counts: Any) -> bool:
        return all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)

    prompt = completion = 0
    found = False
    for generations in response.generations:
        for generation in generations:
            message = getattr(generation, "message", None)
            usage = message.usage_metadata if isinstance(message, AIMessage) else None
            if not usage:
                continue
            if not whole(usage.get("input_tokens"), usage.get("output_tokens")):
                return None
            prompt, completion = prompt + usage["input_tokens"], completion + usage["output_tokens"]
            found = True
    if found:
        return prompt, completion
    output = response.llm_output or {}
    usage = output.get("token_usage") or output.get("usage")
    if isinstance(usage, Mapping):
        p = usage.get("prompt_tokens", usage.get("input_tokens"))
        c = usage.get("completion_tokens", usage.get("output_tokens"))
        if isinstance(p, int) and isinstance(c, int) and whole(p, c):
            return p, c
    return None


class ReadUsage(BaseCallbackHandler):
    """What the LLM calls made inside one read cost, as LangChain reports each (:func:`reported_usage`): their
    prompt and completion tokens and their seconds (each call's start to its end). :meth:`cost` is None where no
    call was made, or one reported no usage or failed: the read's cost is then unknown, never guessed. ragate's
    own ``ragate draft`` calls are not the read's and are left out. Safe to share between threads."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._started: dict[UUID, float] = {}
        self.calls = self.unreported = self.prompt_tokens = self.completion_tokens = 0
        self.seconds = 0.0

    def _start(self, run_id: UUID, kwargs: dict[str, Any]) -> None:
        if kwargs.get("name") != DRAFT_RUN:
            with self._lock:
                self._started[run_id] = time.perf_counter()

    def on_llm_start(
        self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._start(run_id, kwargs)

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._start(run_id, kwargs)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        usage = reported_usage(response)
        with self._lock:
            started = self._started.pop(run_id, None)
            if started is None:  # a call started outside the read, or ragate's own draft
                return
            self.calls += 1
            self.seconds += time.perf_counter() - started
            if usage is None:
                self.unreported += 1
            else:
                self.prompt_tokens += usage[0]
                self.completion_tokens += usage[1]

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            if self._started.pop(run_id, None) is not None:
                self.calls += 1
                self.unreported += 1  # what a failed call cost is not reported

    def cost(self) -> Cost | None:
        """What the read cost, or None where that is not known."""
        with self._lock:
            if not self.calls or self.unreported:
                return None
            return usage_cost(self.prompt_tokens, self.completion_tokens, self.seconds)


# The ReadUsage of the read running in this context (thread or asyncio task): every callback manager LangChain
# configures inside it gets the handler, inherited by the calls below (how langchain_core's own
# ``get_usage_metadata_callback`` works; one variable, registered once).
_READ_USAGE: ContextVar[ReadUsage | None] = ContextVar("ragate_read_usage", default=None)
register_configure_hook(_READ_USAGE, True)


def reported_as_llm_call(
    callbacks: CallbackManager | None, pipeline: Pipeline, question: str, call: Callable[[], Retrieval]
) -> Retrieval:
    """``call()`` (the gate's :meth:`ragate.Pipeline.retrieve`), reported to ``callbacks`` as one chat-model call
    named ``ragate draft`` from its start to its end: the question in, the draft (or on a skip the model's own
    answer) out, and as usage the tokens of every model call the gate made (``usage_metadata``, with the model's
    name in ``response_metadata``, and ``llm_output["token_usage"]``), so LangChain's usage callback and tracers
    count it. A gate that reads no model reports 0 tokens."""
    if callbacks is None:
        return call()
    label = pipeline.model_label
    callbacks.add_metadata({"ls_provider": "ragate", "ls_model_name": label, "ls_model_type": "chat"}, False)
    serialized = {"lc": 1, "type": "not_implemented", "id": ["ragate", "integrations", "langchain", "draft"]}
    runs = callbacks.on_chat_model_start(
        serialized,
        [[HumanMessage(question)]],
        name=DRAFT_RUN,
        invocation_params={"_type": "ragate", "model": label, "method": pipeline.method},
    )
    try:
        result = call()
    except BaseException as err:
        for run in runs:
            run.on_llm_error(err)
        raise
    prompt = sum(s.prompt_tokens for s in result.stages)
    completion = sum(s.completion_tokens for s in result.stages)
    draft = result.trace.draft
    text = result.answer if result.answer is not None else (draft.text if draft is not None else "")
    usage = {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}
    meta = {"model_name": label}
    message = AIMessage(content=text, usage_metadata=usage, response_metadata=meta)  # type: ignore[arg-type]
    tokens = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    output = LLMResult(
        generations=[[ChatGeneration(message=message)]], llm_output={"token_usage": tokens, "model_name": label}
    )
    for run in runs:
        run.on_llm_end(output)
    return result


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
            chosen = reported_as_llm_call(
                run_manager.get_child(), self.pipeline, query, lambda: self.pipeline.retrieve(query)
            )
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
        meta = {"model_name": self.pipeline.model_label}  # LangChain's usage callback counts calls by model
        message = AIMessage(content=text, usage_metadata=usage, response_metadata=meta)  # type: ignore[arg-type]
        return ChatResult(generations=[ChatGeneration(message=message)])


class RagateGateNode(OwnsPipeline, Runnable[Any, dict[str, Any]]):
    """ragate's gate as a LangGraph node: from a state holding the question it returns the update ``{route_key:
    "retrieve" | "answer", "ragate": {method, retrieved, score, threshold, reason, savings}}`` and, where the gate
    skips, ``{answer_key: the model's own answer}`` (the gate's draft, continued: the "answer" branch needs no
    second call). Route on it with ``graph.add_conditional_edges("gate", lambda s: s["route"], {...})``.

    Only the gate runs: your graph's retrieving branch searches with your retriever and reads with your chat model
    (:class:`RagateChatModel` of the same model: ``model_of=chat.pipeline`` loads it once, or any other). A gate
    that searches (the corpus gates) searches with ``search=as_search(your_retriever)`` and ``corpus=`` your
    documents' texts.

    The savings: on a skip, what always retrieving costs, estimated from the retrievals your LLM read before;
    on a retrieval, None until your reading node, wrapped as ``graph.add_node("read", gate.reading(read))``,
    has run: its LLM calls' usage (as LangChain reports it) is then the read's cost, the state's ``ragate``
    gets the measured savings, and the estimate learns from it. A retrieving decision carries an ``id`` that the
    read finds it by. The gate's model work is reported to LangChain's callbacks as a chat-model call
    (``ragate draft``, with its token usage).

    :param pipeline: a ready :class:`ragate.Pipeline` (you close it).
    :param question_key: where the state holds the question.
    :param route_key: / :param answer_key: the state keys it writes.
    :param options: :class:`ragate.Pipeline`'s keywords (``method``, ``calibration``, ``budget``, ``model_of``,
        ``search``, ``corpus``, ...).
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
        self._unread = DirectAnswers()  # the retrieving decisions whose read has not been counted yet, by id

    def update(self, question: str, *, callbacks: CallbackManager | None = None) -> dict[str, Any]:
        """The state update for ``question``; ``callbacks``: where the gate's model work is reported as a
        chat-model call."""
        chosen = reported_as_llm_call(
            callbacks,
            self.pipeline,
            question,
            lambda: self.pipeline.retrieve(question, answer_skipped=True, select=False),
        )
        record = result_record(self.pipeline, chosen, read_elsewhere=True)
        out: dict[str, Any] = {self.route_key: "retrieve" if chosen.retrieved else "answer", "ragate": record}
        if chosen.retrieved:
            record["id"] = uuid.uuid4().hex
            self._unread.keep(record["id"], chosen, record)
        else:
            out[self.answer_key] = chosen.answer or ""
        return out

    def read(self, state: Any, cost: Cost | None) -> dict[str, Any]:
        """The state update once your LLM has read the documents of the retrieving decision in ``state``'s
        ``ragate``: ``{"ragate": the decision, with its savings measured}``, where ``cost`` is what the read cost
        (``ragate.integrations._common.usage_cost(prompt_tokens, completion_tokens, seconds)`` from your LLM's
        usage; None: unknown, and the savings stay None). It also feeds the estimate a skip's savings come from.
        ``{}`` where the state holds no decision of this node's still unread (a skip, or a read counted already).
        :meth:`reading` calls it for you."""
        record = state.get("ragate") if isinstance(state, Mapping) else getattr(state, "ragate", None)
        key = record.get("id") if isinstance(record, Mapping) else None
        kept = self._unread.take(key) if isinstance(key, str) else None
        if kept is None:
            return {}
        chosen, earlier = kept
        return {"ragate": {**earlier, **result_record(self.pipeline, chosen, read_elsewhere=True, read=cost)}}

    def reading(self, node: Any) -> Runnable[Any, Any]:
        """Your reading node (a function of the state, or a Runnable), with what its LLM calls cost counted:
        ``graph.add_node("read", gate.reading(read))``. Its update gets the ``ragate`` decision with measured
        savings (:meth:`read`): the tokens each call reported (``AIMessage.usage_metadata``, or the LLM's
        ``llm_output`` token usage) and the seconds from each call's start to its end. Where a call reports no
        usage, the savings stay unknown."""
        return RagateRead(self, node)

    def _invoke(self, value: Any, run_manager: CallbackManagerForChainRun) -> dict[str, Any]:
        return self.update(question_of(value, self.question_key), callbacks=run_manager.get_child())

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._call_with_config(self._invoke, input, config)


class RagateRead(Runnable[Any, Any]):
    """A LangGraph node that runs your reading node with its LLM calls' usage counted
    (:meth:`RagateGateNode.reading`): your node's update (a dict, or None), plus ``ragate`` with the savings."""

    def __init__(self, gate: RagateGateNode, node: Any) -> None:
        self.gate, self.node = gate, coerce_to_runnable(node)
        self.name = getattr(node, "__name__", None) or self.node.get_name()

    def _merged(self, state: Any, update: Any, usage: ReadUsage) -> Any:
        counted = self.gate.read(state, usage.cost())
        if update is None:
            return counted
        if not isinstance(update, Mapping):
            raise TypeError(
                f"RagateGateNode.reading: your node returned a {type(update).__name__}; return a dict (the state "
                "update) to get the savings in it"
            )
        return {**update, **counted}

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        usage = ReadUsage()
        token = _READ_USAGE.set(usage)
        try:
            update = self.node.invoke(input, config, **kwargs)
        finally:
            _READ_USAGE.reset(token)
        return self._merged(input, update, usage)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        usage = ReadUsage()
        token = _READ_USAGE.set(usage)
        try:
            update = await self.node.ainvoke(input, config, **kwargs)
        finally:
            _READ_USAGE.reset(token)
        return self._merged(input, update, usage)
