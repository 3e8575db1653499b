"""ragate's gate in Haystack (``pip install 'ragate[haystack]'``):

- :class:`RagateRouter`: a router component with the sockets ``retrieve`` and ``skip`` (``ConditionalRouter``'s
  style); with ``answer_skipped=True`` a skipped query also comes with the model's own answer on ``replies`` (the
  gate's draft continued: the skip branch needs no generator and pays no second call) and the decision on ``meta``;
- :class:`RagateLLMGenerator`: the model the gate drafts with as a Haystack generator (``prompt`` in, ``replies``
  out), loaded once, for your retrieving branch's ``PromptBuilder``;
- :class:`RagateGenerator`: both branches in one component, answered with ragate's method over your retriever.

Haystack sends anonymous usage data unless ``HAYSTACK_TELEMETRY_ENABLED=False`` is set before it is imported."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ragate.integrations._common import (
    FrameworkSearch,
    OwnsPipeline,
    collecting,
    decide,
    decision_record,
    missing,
    open_model_pipeline,
    open_pipeline,
    record,
    result_record,
    router_search,
)

try:
    from haystack import Document, component, tracing
except ImportError as err:
    raise missing("Haystack (haystack-ai)", "haystack", err) from err

if TYPE_CHECKING:
    from ragate.answers import Document as Chosen
    from ragate.pipeline import Pipeline


def as_search(retriever: Any) -> FrameworkSearch[Document]:
    """A Haystack retriever component (``run(query=..., top_k=...) -> {"documents": [...]}``) as a ragate search
    function: ``ragate.Pipeline(search=as_search(retriever))``. Each document becomes ``{"id", "text": content,
    "title": meta["title"], "score"}``; ragate's ``k`` is passed as ``top_k`` where ``run`` takes it."""
    run = getattr(retriever, "run", None)
    if not callable(run):
        raise TypeError(
            f"retriever= takes a Haystack retriever component (with run(query=...)), not {retriever!r}"
        )
    takes_top_k = "top_k" in inspect.signature(run).parameters

    def fetch(query: str, k: int) -> list[Document]:
        found = run(query=query, top_k=k) if takes_top_k else run(query=query)
        return list(found["documents"])

    def convert(doc: Document) -> dict[str, Any]:
        return record(doc.id, doc.content, doc.meta.get("title"), doc.score)

    return FrameworkSearch(fetch, convert, type(retriever).__name__)


def _documents(
    chosen: tuple[Chosen, ...], seen: dict[str, Any], decision: dict[str, Any] | None = None
) -> list[Document]:
    """ragate's chosen documents as copies of your retriever's own, with ``ragate_score`` (the score ragate's method
    ranked it by: your retriever's own, else 1/rank, for a top-k method; the AIS score for DTR and PAIRS),
    ``ragate_rank`` and the decision (``ragate``) added to their ``meta`` (a new ``Document`` for one that came from
    the pipeline's own index)."""
    out = []
    for doc in chosen:
        scored = {"ragate_score": doc.score, "ragate_rank": doc.rank, **({"ragate": decision} if decision else {})}
        original = seen.get(doc.id)
        if isinstance(original, Document):
            out.append(dataclasses.replace(original, meta={**original.meta, **scored}))
        else:
            meta = {"title": doc.title, **({"source": doc.source} if doc.source else {}), **scored}
            out.append(Document(id=doc.id, content=doc.text, meta=meta, score=doc.score))
    return out


@contextlib.contextmanager
def _span(name: str, query: str) -> Iterator[Any]:
    """A span of the app's Haystack trace around ragate's work (whatever tracer the app enabled: its current span,
    the component's, is the parent); None when tracing is off. The query's text is a tag only where the app turned
    content tracing on."""
    if not tracing.is_tracing_enabled():
        yield None
        return
    with tracing.tracer.trace(name) as span:
        span.set_content_tag("ragate.query", query)
        yield span


def _tag(span: Any, record: dict[str, Any]) -> None:
    """The decision (and the tokens saved, where known) as the span's tags."""
    if span is None:
        return
    tags: dict[str, Any] = {f"ragate.{k}": v for k, v in record.items() if k != "savings" and v is not None}
    saved = (record.get("savings") or {}).get("saved")
    if saved:
        tags["ragate.saved_tokens"] = saved["tokens"]
    span.set_tags(tags)


@component
class RagateRouter(OwnsPipeline):
    """Routes a query by ragate's gate, in the style of ``ConditionalRouter``: to ``retrieve`` when the model
    should read, to ``skip`` when it knows. Each socket carries the query; only the chosen one is emitted, so the
    components behind the other do not run.

    Usage example::

        from haystack import Pipeline
        from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
        from ragate.integrations.haystack import RagateRouter

        rag = Pipeline()
        rag.add_component("gate", RagateRouter(method="targ-margin", calibration="targ-margin.json"))
        rag.add_component("retriever", InMemoryBM25Retriever(document_store=store))
        rag.connect("gate.retrieve", "retriever.query")
        rag.run({"gate": {"query": "Who wrote Hamlet?"}})  # {"gate": {"skip": "Who wrote Hamlet?"}}

    :param retriever: your retriever component, for a gate that compares the question with documents, or a
        budget that counts retrievals (optional: without it the router searches nothing).
    :param pipeline: a ready :class:`ragate.Pipeline` instead (you close it).
    :param options: :class:`ragate.Pipeline`'s keywords: ``method`` (a registered gate's name works too),
        ``calibration`` or ``threshold`` or ``budget``, ``model`` or ``base_url`` (your model server), ...
    """

    def __init__(
        self,
        *,
        retriever: Any = None,
        pipeline: Pipeline | None = None,
        answer_skipped: bool = False,
        **options: Any,
    ) -> None:
        search = as_search(retriever) if retriever is not None else None
        if pipeline is None:
            search = router_search(options, search)
        self.pipeline, self._owned = open_pipeline("RagateRouter", pipeline, options, search)
        self.answer_skipped = answer_skipped

    @component.output_types(retrieve=str, skip=str, replies=list[str], meta=list[dict[str, Any]])
    def run(self, query: str) -> dict[str, Any]:
        """Route ``query``.

        :param query: the question.
        :returns: ``{"retrieve": query}`` when the gate says the model should read, else ``{"skip": query}``;
            with ``answer_skipped``, also ``meta`` (one dict, the decision and savings under ``"ragate"``) and, on a
            skip, ``replies`` (the model's own answer, its draft continued).
        """
        with _span("ragate.route", query) as span:
            if not self.answer_skipped:
                decision = decide(self.pipeline, query)
                _tag(span, decision_record(self.pipeline.method, decision))
                return {"retrieve" if decision.retrieve else "skip": query}
            chosen = self.pipeline.retrieve(query, answer_skipped=True, select=False)
            meta = [{"ragate": result_record(self.pipeline, chosen, read_elsewhere=True)}]
            _tag(span, meta[0]["ragate"])
        if chosen.retrieved:
            return {"retrieve": query, "meta": meta}
        return {"skip": query, "replies": [chosen.answer or ""], "meta": meta}


@component
class RagateLLMGenerator(OwnsPipeline):
    """The model of a :class:`ragate.Pipeline` as a Haystack generator: ``prompt`` in, ``replies`` and ``meta``
    (tokens) out; greedy, from the very model the gate drafts with, loaded once (:meth:`ragate.Pipeline.complete`).

    Usage example::

        from ragate.integrations.haystack import RagateLLMGenerator, RagateRouter

        llm = RagateLLMGenerator(model="qwen2.5-coder-1.5b")
        gate = RagateRouter(model_of=llm.pipeline, method="targ-margin", answer_skipped=True)

    :param pipeline: a ready :class:`ragate.Pipeline` whose model answers (you close it).
    :param max_tokens: the reply length (default: the pipeline's answer length).
    :param options: :class:`ragate.Pipeline`'s keywords (``model``, ``backend``, ``base_url``, ...).
    """

    def __init__(self, *, pipeline: Pipeline | None = None, max_tokens: int | None = None, **options: Any):
        self.pipeline, self._owned = open_model_pipeline("RagateLLMGenerator", pipeline, options)
        self.max_tokens = max_tokens

    @component.output_types(replies=list[str], meta=list[dict[str, Any]])
    def run(self, prompt: str) -> dict[str, Any]:
        """Generate the reply to ``prompt``.

        :param prompt: the prompt (a user message, rendered with the model's chat template).
        :returns: ``replies`` (one) and ``meta`` (its model and token counts).
        """
        text, stage = self.pipeline.complete(prompt, max_tokens=self.max_tokens)
        usage = {"prompt_tokens": stage.prompt_tokens, "completion_tokens": stage.completion_tokens}
        return {"replies": [text], "meta": [{"model": self.pipeline.model_label, "usage": usage}]}


@component
class RagateGenerator(OwnsPipeline):
    """Answers a query with ragate over your retriever component: the model's own answer (the gate's draft) when
    the gate says it knows, else its answer from the documents ragate chooses from your retriever's. Its outputs
    fit ``AnswerBuilder``'s inputs.

    Usage example::

        from haystack import Pipeline
        from haystack.components.builders import AnswerBuilder
        from ragate.integrations.haystack import RagateGenerator

        rag = Pipeline()
        rag.add_component("llm", RagateGenerator(retriever=InMemoryBM25Retriever(store), method="targ-margin",
                                                  base_url="http://localhost:8080/v1"))
        rag.add_component("answer", AnswerBuilder())
        rag.connect("llm.replies", "answer.replies")
        rag.connect("llm.documents", "answer.documents")

    :param retriever: your retriever component (``run(query=..., top_k=...)``).
    :param pipeline: a ready :class:`ragate.Pipeline` instead (you close it).
    :param options: :class:`ragate.Pipeline`'s keywords (``method``, ``calibration``, ``budget``, ``base_url``,
        ...).
    """

    def __init__(self, *, retriever: Any = None, pipeline: Pipeline | None = None, **options: Any) -> None:
        if retriever is None and pipeline is None:
            raise TypeError(
                "RagateGenerator needs retriever= (your Haystack retriever component) or pipeline="
            )
        self.retriever = retriever
        search = as_search(retriever) if retriever is not None else None
        self.pipeline, self._owned = open_pipeline("RagateGenerator", pipeline, options, search)

    def warm_up(self) -> None:
        """Warm up your retriever component, if it has to be."""
        warm_up = getattr(self.retriever, "warm_up", None)
        if callable(warm_up):
            warm_up()

    @component.output_types(replies=list[str], documents=list[Document], meta=list[dict[str, Any]])
    def run(self, query: str) -> dict[str, Any]:
        """Answer ``query``.

        :param query: the question.
        :returns: ``replies`` (the answer), ``documents`` (those read: copies of your retriever's with
            ``ragate_score`` and ``ragate_rank`` in their meta; empty when the model answered alone) and ``meta``
            (one dict, with the gate's decision under ``"ragate"``).
        """
        with _span("ragate.answer", query) as span, collecting() as seen:
            answer = self.pipeline.answer(query)
            meta = {"ragate": result_record(self.pipeline, answer)}
            _tag(span, meta["ragate"])
        documents = _documents(answer.documents, seen, decision_record(answer.method, answer.decision))
        return {"replies": [answer.text], "documents": documents, "meta": [meta]}
