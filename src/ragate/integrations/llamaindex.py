"""ragate's gate in LlamaIndex (``pip install 'ragate[llamaindex]'``):

- :class:`RagateLLM`: the model ragate's gate drafts with, as a LlamaIndex LLM (loaded once; use it as your app's
  ``llm`` and ``Settings.llm``);
- :class:`RagateQueryEngine`: both branches answered over your retriever. With ``llm=`` your LLM reads the nodes
  through LlamaIndex's response synthesizer; where the gate skips, the answer is the model's own (its draft
  continued when ``llm`` is a :class:`RagateLLM`: the draft is never paid twice; else your LLM answers the bare
  question). Never "Empty Response";
- :class:`RagateSelector`: ragate's gate as a ``RouterQueryEngine`` selector (the reason in the response's
  ``metadata["selector_result"]``), with :meth:`RagateSelector.direct_engine` for the branch that does not retrieve;
- :class:`RagateRetriever`: your retriever behind the gate (no nodes when the model knows; inside
  ``RetrieverQueryEngine`` that means LlamaIndex's "Empty Response": use :class:`RagateQueryEngine` there).

Every response carries ``metadata["ragate"]``: the decision (``method``, ``retrieved``, ``score``, ``threshold``,
``reason``) and ``savings`` (what the gate saved against always retrieving, as ``ragate serve`` reports it; where
your LLM read the nodes, with that read's cost from the usage your LLM reported).

In LlamaIndex's accounting: each call of ragate's model (the gate's draft, its continuation, ragate's own answer) is
an LLM call, sent through the component's callback manager (so ``TokenCountingHandler`` counts it, with its token
counts) and as ``LLMCompletionStartEvent`` / ``LLMCompletionEndEvent`` to the instrumentation; the query engines
send ``QueryStartEvent`` / ``QueryEndEvent`` as LlamaIndex's own do.
A node's score (``NodeWithScore.score``) is the score ragate's method ranked it by: your retriever's own (else 1/rank)
for a method that keeps the question's top k, the AIS score for DTR and PAIRS (docs/integrations.md)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ragate.integrations._common import (
    DirectAnswers,
    FrameworkSearch,
    OwnsPipeline,
    closed_on_error,
    collecting,
    missing,
    open_model_pipeline,
    open_pipeline,
    record,
    result_record,
)
from ragate.integrations._llamaindex_calls import _QueryEvents, _reading, _report_calls

try:
    from llama_index.core import get_response_synthesizer
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.base.base_selector import BaseSelector, SelectorResult, SingleSelection
    from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseGen, LLMMetadata
    from llama_index.core.base.response.schema import Response
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.events import BaseEvent
    from llama_index.core.llms import LLM
    from llama_index.core.llms.callbacks import llm_completion_callback
    from llama_index.core.llms.custom import CustomLLM
    from llama_index.core.query_engine import CustomQueryEngine
    from llama_index.core.response_synthesizers import BaseSynthesizer
    from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode
except ImportError as err:
    raise missing("LlamaIndex (llama-index-core)", "llamaindex", err) from err

if TYPE_CHECKING:
    from ragate.answers.answer import Document
    from ragate.pipeline import Pipeline


dispatcher = get_dispatcher(__name__)  # LlamaIndex's instrumentation: the app's span and event handlers see ragate


class RagateDecisionEvent(BaseEvent):
    """ragate's decision on one query, sent to LlamaIndex's instrumentation (``get_dispatcher().add_event_handler``)
    inside the span of the engine, selector or retriever that made it: method, retrieved, score, threshold, reason
    and savings (None where your LLM read the nodes)."""

    method: str
    retrieved: bool
    score: float
    threshold: float
    reason: str
    savings: dict[str, Any] | None = None

    @classmethod
    def class_name(cls) -> str:
        return "RagateDecisionEvent"


def _announce(record: dict[str, Any]) -> None:
    dispatcher.event(RagateDecisionEvent(**record))


def as_search(retriever: BaseRetriever) -> FrameworkSearch[NodeWithScore]:
    """A LlamaIndex retriever as a ragate search function: ``ragate.Pipeline(search=as_search(retriever))``.

    Each node becomes ``{"id": node_id, "text", "title": metadata["title"], "score"}``; the retriever's own
    ``similarity_top_k`` bounds how many it returns."""

    def convert(found: NodeWithScore) -> dict[str, Any]:
        node = found.node
        text = node.get_content(metadata_mode=MetadataMode.NONE)
        return record(node.node_id, text, node.metadata.get("title"), found.score)

    return FrameworkSearch(lambda query, k: retriever.retrieve(query), convert, type(retriever).__name__)


def _nodes(documents: tuple[Document, ...], seen: dict[str, Any]) -> list[NodeWithScore]:
    """ragate's chosen documents as your retriever's own nodes, scored by ragate (a new ``TextNode`` for one that
    came from the pipeline's own index)."""
    out = []
    for doc in documents:
        original = seen.get(doc.id)
        if isinstance(original, NodeWithScore):
            out.append(NodeWithScore(node=original.node, score=doc.score))
        else:
            meta = {"title": doc.title, "source": doc.source} if doc.source else {"title": doc.title}
            out.append(
                NodeWithScore(node=TextNode(id_=doc.id, text=doc.text, metadata=meta), score=doc.score)
            )
    return out


class RagateRetriever(OwnsPipeline, BaseRetriever):
    """Your retriever behind ragate's gate: no nodes when the gate says the model knows, else the nodes ragate's
    method chooses from what your retriever returns (each your own node, scored by ragate).

    Usage example::

        from llama_index.retrievers.bm25 import BM25Retriever
        from ragate.integrations.llamaindex import RagateRetriever

        bm25 = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=5)
        with RagateRetriever(bm25, method="targ-margin", calibration="targ-margin.json") as retriever:
            nodes = retriever.retrieve("Who wrote Hamlet?")  # [] when the model knows

    :param retriever: your LlamaIndex retriever (its ``similarity_top_k`` should cover ragate's ``k``).
    :param pipeline: a ready :class:`ragate.Pipeline` instead (you close it); it searches with its own ``search=``
        (e.g. ``as_search(retriever)``) or index.
    :param options: :class:`ragate.Pipeline`'s keywords: ``method`` (a registered gate's name works too),
        ``calibration`` or ``threshold`` or ``budget``, ``model`` or ``base_url`` (your model server), ``k``, ...
    """

    def __init__(
        self,
        retriever: BaseRetriever | None = None,
        *,
        pipeline: Pipeline | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
        **options: Any,
    ) -> None:
        if retriever is None and pipeline is None:
            raise TypeError("RagateRetriever needs retriever= (your LlamaIndex retriever) or pipeline=")
        search = as_search(retriever) if retriever is not None else None
        self.pipeline, self._owned = open_pipeline("RagateRetriever", pipeline, options, search)
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @dispatcher.span
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        with collecting() as seen:
            chosen = self.pipeline.retrieve(query_bundle.query_str)
        _report_calls(self.callback_manager, self.pipeline, chosen.trace)
        _announce(result_record(self.pipeline, chosen, read_elsewhere=True))
        return _nodes(chosen.documents, seen) if chosen.retrieved else []


class RagateLLM(OwnsPipeline, CustomLLM):
    """The model of a :class:`ragate.Pipeline` as a LlamaIndex LLM: greedy completions from the very model the gate
    drafts with, loaded once (:meth:`ragate.Pipeline.complete`).

    Usage example::

        from ragate.integrations.llamaindex import RagateLLM, RagateQueryEngine

        llm = RagateLLM(model="qwen2.5-coder-1.5b")           # or RagateLLM(pipeline=your_pipeline)
        engine = RagateQueryEngine(bm25, llm=llm, method="targ-margin", calibration="targ-margin.json")

    :param pipeline: a ready :class:`ragate.Pipeline` whose model answers (you close it).
    :param max_tokens: the completion length (default: the pipeline's answer length).
    :param callback_manager: LlamaIndex's callback manager for its calls (default: ``Settings.callback_manager``'s
        handlers); each completion reports its tokens in ``raw["usage"]``, where ``TokenCountingHandler`` reads them.
    :param options: :class:`ragate.Pipeline`'s keywords (``model``, ``backend``, ``base_url``, ``threads``, ...)
        when no pipeline is given; this LLM then owns it (``close()``).
    """

    pipeline: Any = None
    max_tokens: int | None = None
    _owned: bool = PrivateAttr(default=False)

    def __init__(
        self,
        pipeline: Pipeline | None = None,
        *,
        max_tokens: int | None = None,
        callback_manager: CallbackManager | None = None,
        **options: Any,
    ):
        built, owned = open_model_pipeline("RagateLLM", pipeline, options)
        fields: dict[str, Any] = {"pipeline": built, "max_tokens": max_tokens}
        if callback_manager is not None:
            fields["callback_manager"] = callback_manager
        with closed_on_error(built, owned):
            super().__init__(**fields)
        self._owned = owned

    @classmethod
    def class_name(cls) -> str:
        return "RagateLLM"

    @property
    def metadata(self) -> LLMMetadata:
        lm = self.pipeline.lm
        return LLMMetadata(
            context_window=int(getattr(lm, "max_context", 0) or 4096),
            num_output=self.max_tokens or self.pipeline.spec.max_tokens,
            model_name=self.pipeline.model_label,
        )

    def _completion(self, prompt: str) -> CompletionResponse:
        text, stage = self.pipeline.complete(prompt, max_tokens=self.max_tokens)
        usage = {"prompt_tokens": stage.prompt_tokens, "completion_tokens": stage.completion_tokens}
        raw = {"usage": usage | {"total_tokens": stage.prompt_tokens + stage.completion_tokens}}
        return CompletionResponse(text=text, raw=raw, additional_kwargs={"ragate": usage})

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._completion(prompt)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        response = self._completion(prompt)  # one LLM call (not complete(): that would report a second)

        def one() -> CompletionResponseGen:
            yield CompletionResponse(
                text=response.text, delta=response.text, raw=response.raw, additional_kwargs=response.additional_kwargs
            )

        return one()


def _own_model(llm: LLM | None, pipeline: Pipeline) -> bool:
    """Whether ``llm`` is the model ``pipeline`` drafts with (so its skipped answer is the draft continued)."""
    return isinstance(llm, RagateLLM) and llm.pipeline.lm is pipeline.lm


class RagateQueryEngine(OwnsPipeline, _QueryEvents, CustomQueryEngine):
    """A query engine that answers with ragate's gate over your retriever; both branches answer.

    Without ``llm=``: ragate's method answers both branches with its own prompts (the gate's draft continued when it
    skips; the nodes it chose from your retriever's when it retrieves). With ``llm=``: your LLM reads the nodes
    through LlamaIndex's response synthesizer (``response_synthesizer=`` to choose one); where the gate skips, a
    :class:`RagateLLM` of the same model gives the draft continued (no second call), another LLM answers the bare
    question (the gate then needs a model of its own: ``model=``, or a gate that reads none, e.g.
    ``method="corpus-coverage"``).

    The response's ``source_nodes`` are the nodes read (none when it did not retrieve) and ``metadata["ragate"]``
    the decision and the savings. Where your LLM read the nodes, the savings are measured with that read: the
    prompt and completion tokens your LLM reported for the calls the synthesizer made (``raw["usage"]``, as
    LlamaIndex's ``TokenCountingHandler`` reads them; this query's calls only) and the read's time; the skips
    after it get an estimate from them. Where your LLM reports no usage (or streams), they stay None.

    ragate's own model calls (the gate's draft, its continuation) go to this engine's ``callback_manager`` (by
    default ``Settings.callback_manager``'s handlers) and to the instrumentation as LLM calls; ``query`` sends
    ``QueryStartEvent`` and ``QueryEndEvent``.

    Usage example::

        from ragate.integrations.llamaindex import RagateLLM, RagateQueryEngine

        llm = RagateLLM(model="qwen2.5-coder-1.5b")
        with RagateQueryEngine(bm25, llm=llm, method="targ-margin") as engine:
            response = engine.query("What is the capital of Japan?")   # the model's own answer, no nodes
            print(response, response.metadata["ragate"], response.source_nodes)

    :param retriever: your LlamaIndex retriever.
    :param pipeline: a ready :class:`ragate.Pipeline` instead (you close it).
    :param llm: the LLM that reads the nodes (and answers skipped questions when it is not ragate's model).
    :param response_synthesizer: how ``llm`` reads them (default ``get_response_synthesizer(llm=llm,
        callback_manager=callback_manager)``).
    :param callback_manager: LlamaIndex's callback manager (default: ``Settings.callback_manager``'s handlers):
        ragate's model calls go through it as LLM calls, and the default synthesizer gives it to ``llm``.
    :param options: :class:`ragate.Pipeline`'s keywords (``method``, ``calibration``, ``budget``, ``base_url``,
        ...); with a :class:`RagateLLM` and no ``model=``, the gate drafts with that LLM's model (loaded once).
    """

    retriever: BaseRetriever | None = None
    pipeline: Any = None
    llm: Any = None
    synthesizer: Any = None
    _owned: bool = PrivateAttr(default=False)

    def __init__(
        self,
        retriever: BaseRetriever | None = None,
        *,
        pipeline: Pipeline | None = None,
        llm: LLM | None = None,
        response_synthesizer: BaseSynthesizer | None = None,
        callback_manager: CallbackManager | None = None,
        **options: Any,
    ) -> None:
        if retriever is None and pipeline is None:
            raise TypeError("RagateQueryEngine needs retriever= (your LlamaIndex retriever) or pipeline=")
        if response_synthesizer is not None and llm is None:
            raise TypeError("response_synthesizer= reads with your LLM: give llm= too")
        if isinstance(llm, RagateLLM) and pipeline is None and not {"model", "base_url", "lm"} & set(options):
            options["model_of"] = llm.pipeline  # the gate drafts with the LLM's model: loaded once
        search = as_search(retriever) if retriever is not None else None
        built, owned = open_pipeline("RagateQueryEngine", pipeline, options, search)
        fields: dict[str, Any] = {"retriever": retriever, "pipeline": built, "llm": llm}
        if llm is not None:
            # LlamaIndex's synthesizer puts its callback manager on the LLM: this engine's, where one is given
            fields["synthesizer"] = response_synthesizer or get_response_synthesizer(
                llm=llm, callback_manager=callback_manager
            )
        if callback_manager is not None:
            fields["callback_manager"] = callback_manager
        with closed_on_error(built, owned):
            super().__init__(**fields)
        self._owned = owned

    @dispatcher.span
    def custom_query(self, query_str: str) -> Response:
        if self.llm is None:
            with collecting() as seen:
                answer = self.pipeline.answer(query_str)
            _report_calls(self.callback_manager, self.pipeline, answer.trace)
            meta = {"ragate": result_record(self.pipeline, answer)}
            _announce(meta["ragate"])
            return Response(answer.text, source_nodes=_nodes(answer.documents, seen), metadata=meta)
        own = _own_model(self.llm, self.pipeline)
        with collecting() as seen:
            chosen = self.pipeline.retrieve(query_str, answer_skipped=own)
        _report_calls(self.callback_manager, self.pipeline, chosen.trace)
        if chosen.retrieved:
            with _reading() as reads:  # your LLM's calls in this read, with the usage each reported
                start = time.perf_counter()
                response = self.synthesizer.synthesize(query_str, nodes=_nodes(chosen.documents, seen))
                seconds = time.perf_counter() - start
            meta = {
                "ragate": result_record(self.pipeline, chosen, read_elsewhere=True, read=reads.cost(seconds))
            }
            _announce(meta["ragate"])
            response.metadata = (response.metadata or {}) | meta
            return response  # type: ignore[no-any-return]
        meta = {"ragate": result_record(self.pipeline, chosen, read_elsewhere=True)}
        _announce(meta["ragate"])
        text = chosen.answer if own and chosen.answer is not None else self.llm.complete(query_str).text
        return Response(text, source_nodes=[], metadata=meta)


class RagateSelector(OwnsPipeline, BaseSelector):
    """ragate's gate as a LlamaIndex selector: in a ``RouterQueryEngine`` of two tools, the one that answers from
    the model's own knowledge where the gate skips, the retrieving one where it retrieves; the gate's reason is the
    selection's (``response.metadata["selector_result"]``).

    Only the gate runs to decide (no search); where it skips, it also writes the model's own answer (its draft
    continued), which :meth:`direct_engine`'s engine returns, so the draft is paid once.

    Usage example::

        from llama_index.core.query_engine import RouterQueryEngine, RetrieverQueryEngine
        from llama_index.core.tools import QueryEngineTool
        from ragate.integrations.llamaindex import RagateLLM, RagateSelector

        llm = RagateLLM(model="qwen2.5-coder-1.5b")
        selector = RagateSelector(model_of=llm.pipeline, method="targ-margin", calibration="targ-margin.json")
        router = RouterQueryEngine(
            selector=selector,
            query_engine_tools=[
                QueryEngineTool.from_defaults(selector.direct_engine(), description="the model's own knowledge"),
                QueryEngineTool.from_defaults(RetrieverQueryEngine.from_args(bm25, llm=llm), description="documents"),
            ],
            llm=llm,
        )

    :param pipeline: a ready :class:`ragate.Pipeline` (you close it).
    :param direct: the index of the tool that answers without retrieval (default 0).
    :param retrieve: the index of the retrieving tool (default 1).
    :param callback_manager: where ragate's model calls (the gate's draft, its continuation) go as LLM calls
        (default: ``Settings.callback_manager``'s handlers).
    :param options: :class:`ragate.Pipeline`'s keywords (``model_of=`` a :class:`RagateLLM`'s pipeline shares its
        model; ``search=as_search(retriever)`` and ``corpus=`` for a gate that reads your documents, e.g.
        ``method="corpus-coverage"``).
    """

    def __init__(
        self,
        pipeline: Pipeline | None = None,
        *,
        direct: int = 0,
        retrieve: int = 1,
        callback_manager: CallbackManager | None = None,
        **options: Any,
    ) -> None:
        from ragate.integrations._common import router_search

        if direct == retrieve:
            raise TypeError(f"direct= and retrieve= name the same tool ({direct}): give two different indices")
        self.pipeline, self._owned = open_pipeline(
            "RagateSelector", pipeline, options, router_search(options, None) if pipeline is None else None
        )
        self.direct, self.retrieve = direct, retrieve
        self.answers = DirectAnswers()
        self.callback_manager = callback_manager or CallbackManager()

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        pass

    @dispatcher.span
    def _select(self, choices: Any, query: QueryBundle) -> SelectorResult:
        if len(choices) <= max(self.direct, self.retrieve):
            raise ValueError(
                f"RagateSelector chooses between tool {self.direct} (no retrieval) and tool {self.retrieve} "
                f"(retrieval); the router has {len(choices)}"
            )
        chosen = self.pipeline.retrieve(query.query_str, answer_skipped=True, select=False)
        _report_calls(self.callback_manager, self.pipeline, chosen.trace)
        record = result_record(self.pipeline, chosen, read_elsewhere=True)
        _announce(record)
        if not chosen.retrieved:
            self.answers.keep(chosen.question, chosen, record)
        index = self.retrieve if chosen.retrieved else self.direct
        reason = f"ragate {chosen.method}: {chosen.decision.reason}"
        return SelectorResult(selections=[SingleSelection(index=index, reason=reason)])

    async def _aselect(self, choices: Any, query: QueryBundle) -> SelectorResult:
        return self._select(choices, query)

    def direct_engine(self) -> RagateDirectEngine:
        """The query engine of the tool that answers without retrieval: the answer this selector kept for the
        question (the gate's draft continued), or, for a question it did not route, the model's own answer."""
        return RagateDirectEngine(selector=self)


class RagateDirectEngine(_QueryEvents, CustomQueryEngine):
    """The no-retrieval branch of a :class:`RagateSelector`'s router (see :meth:`RagateSelector.direct_engine`)."""

    selector: Any = None

    def custom_query(self, query_str: str) -> Response:
        selector: RagateSelector = self.selector
        kept = selector.answers.take(query_str)
        if kept is None:  # a question this selector did not route: the model answers it closed-book
            chosen = selector.pipeline.retrieve(query_str, method="no-retrieval", answer_skipped=True, select=False)
            _report_calls(self.callback_manager, selector.pipeline, chosen.trace)
            kept = (chosen, result_record(selector.pipeline, chosen))
        chosen, meta = kept
        return Response(chosen.answer or "", source_nodes=[], metadata={"ragate": meta})

