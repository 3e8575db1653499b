"""ragate's gate in Haystack (``pip install 'ragate[haystack]'``):

- :class:`RagateRouter`: a router component with the sockets ``retrieve`` and ``skip`` (``ConditionalRouter``'s
  style); with ``answer_skipped=True`` a skipped query also comes with the model's own answer on ``replies`` (the
  gate's draft continued: the skip branch needs no generator and pays no second call) and the decision on ``meta``;
- :class:`RagateLLMGenerator`: the model the gate drafts with as a Haystack generator (``prompt`` in, ``replies``
  out), loaded once, for your retrieving branch's ``PromptBuilder``;
- :class:`RagateSavings`: after your own generator on the retrieving branch, your generator's replies with the
  decision and the savings, measured from the usage your generator reports (which feeds the estimate that a skip's
  tokens saved come from);
- :class:`RagateGenerator`: both branches in one component, answered with ragate's method over your retriever.

The model calls ragate makes (the gate's draft and its continuation; a RagateGenerator's answer) are an LLM call
in Haystack's accounting: ``meta`` carries their ``usage`` and ``model`` as a generator's does, and in the app's
Haystack trace they are a ``haystack.chat_generator.run`` span whose output holds a reply with that usage.

Haystack sends anonymous usage data unless ``HAYSTACK_TELEMETRY_ENABLED=False`` is set before it is imported."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import time
from collections.abc import Callable, Iterator, Mapping
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
    usage_cost,
)

try:
    from haystack import Document, component, tracing
    from haystack.dataclasses import ChatMessage
except ImportError as err:
    raise missing("Haystack (haystack-ai)", "haystack", err) from err

if TYPE_CHECKING:
    from ragate.answers.answer import Document as Chosen
    from ragate.answers.answer import Retrieval
    from ragate.methods.trace import Stage
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


def _usage(stages: tuple[Stage, ...]) -> dict[str, int] | None:
    """The tokens of ragate's model calls among ``stages`` in the form Haystack's generators report them (OpenAI's
    ``usage``); None where the model made no call (a gate that reads no model)."""
    calls = [s for s in stages if s.prompt_tokens or s.completion_tokens]
    if not calls:
        return None
    prompt, completion = sum(s.prompt_tokens for s in calls), sum(s.completion_tokens for s in calls)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@contextlib.contextmanager
def _llm_call(owner: Any, name: str, query: str) -> Iterator[Callable[[str, dict[str, int] | None, str], None]]:
    """ragate's model calls for one query as an LLM call in the app's Haystack trace: a
    ``haystack.chat_generator.run`` span, the one Haystack's own components open around a generator they call
    inside (``LLMMessagesRouter``, ``LLMRanker``), which tracers and Haystack's usage accounting count as an LLM
    call. What it yields records the reply, with the calls' ``usage`` and ``model`` in its meta, as the span's
    ``haystack.component.output`` (a content tag, as a generator's replies are: kept where the app turned content
    tracing on); a span with no call in it gets no reply. ``name``: the span's component name (``ragate.draft``,
    ``ragate.answer``), ``owner``'s class its component type."""
    if not tracing.is_tracing_enabled():
        yield lambda text, usage, model: None
        return
    tags = {"haystack.component.name": name, "haystack.component.type": type(owner).__name__}
    with tracing.tracer.trace("haystack.chat_generator.run", tags=tags) as span:
        span.set_content_tag("haystack.component.input", {"messages": [ChatMessage.from_user(query)]})

        def done(text: str, usage: dict[str, int] | None, model: str) -> None:
            if usage is not None:
                reply = ChatMessage.from_assistant(text, meta={"model": model, "usage": usage})
                span.set_content_tag("haystack.component.output", {"replies": [reply]})

        yield done


def _accounted(pipeline: Pipeline, stages: tuple[Stage, ...], record: dict[str, Any]) -> dict[str, Any]:
    """One ``meta`` dict: ragate's record under ``"ragate"`` and, where ragate's model made calls, their ``model``
    and ``usage`` as a Haystack generator's meta has them (AnswerBuilder and tracers read them there)."""
    usage = _usage(stages)
    return {"ragate": record, **({"model": pipeline.model_label, "usage": usage} if usage else {})}


def _tag(span: Any, record: dict[str, Any]) -> None:
    """The decision (and the tokens saved, where known) as the span's tags."""
    if span is None:
        return
    tags: dict[str, Any] = {f"ragate.{k}": v for k, v in record.items() if k != "savings" and v is not None}
    saved = (record.get("savings") or {}).get("saved")
    if saved:
        tags["ragate.saved_tokens"] = saved["tokens"]
    span.set_tags(tags)


@dataclasses.dataclass(frozen=True, eq=False)
class Routed:
    """A query :class:`RagateRouter` sent to your retrieving branch, on its ``routed`` socket: the router's pipeline
    (whose running estimate of always retrieving's cost the read feeds), the gate's retrieval and when it was sent,
    for the :class:`RagateSavings` after your generator. Haystack passes it on as it is: it is never changed, and a
    copy would copy the model."""

    pipeline: Pipeline = dataclasses.field(repr=False)
    retrieval: Retrieval = dataclasses.field(repr=False)
    sent: float = dataclasses.field(repr=False)  # time.perf_counter() when the router sent the query on

    def __deepcopy__(self, memo: dict[int, Any]) -> Routed:
        return self

    def __repr__(self) -> str:
        return f"Routed(method={self.retrieval.method!r}, retrieved={self.retrieval.retrieved})"


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

    With ``answer_skipped=True``, a query sent to ``retrieve`` also goes out on ``routed``: connect it to a
    :class:`RagateSavings` after your generator, which measures that retrieval's cost from your generator's usage.

    :param retriever: your retriever component, for a gate that compares the question with documents, or a
        budget that counts retrievals (optional: without it the router searches nothing); ``corpus=`` (your
        documents' texts) with it lets the corpus gates (``corpus-coverage``, ...) run over it.
    :param pipeline: a ready :class:`ragate.Pipeline` instead (you close it), e.g. one built with
        ``search=as_search(retriever)`` that several components share.
    :param answer_skipped: a skip also carries the model's own answer (``replies``), and every query ``meta``.
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

    @component.output_types(
        retrieve=str, skip=str, replies=list[str], meta=list[dict[str, Any]], routed=Routed
    )
    def run(self, query: str) -> dict[str, Any]:
        """Route ``query``.

        :param query: the question.
        :returns: ``{"retrieve": query}`` when the gate says the model should read, else ``{"skip": query}``;
            with ``answer_skipped``, also ``meta`` (one dict: the decision and savings under ``"ragate"``, and the
            ``usage`` and ``model`` of the model's calls, as a generator's meta has them), on a skip ``replies``
            (the model's own answer, its draft continued), and with ``retrieve`` ``routed`` (for
            :class:`RagateSavings`).
        """
        with _span("ragate.route", query) as span:
            if not self.answer_skipped:
                decision = decide(self.pipeline, query)
                _tag(span, decision_record(self.pipeline.method, decision))
                return {"retrieve" if decision.retrieve else "skip": query}
            with _llm_call(self, "ragate.draft", query) as called:
                chosen = self.pipeline.retrieve(query, answer_skipped=True, select=False)
                draft = chosen.trace.draft
                said = chosen.answer if chosen.answer is not None else draft.text if draft is not None else ""
                called(said, _usage(chosen.stages), self.pipeline.model_label)
            decided = result_record(self.pipeline, chosen, read_elsewhere=True)
            meta = [_accounted(self.pipeline, chosen.stages, decided)]
            _tag(span, decided)
        if chosen.retrieved:
            routed = Routed(self.pipeline, chosen, time.perf_counter())
            return {"retrieve": query, "meta": meta, "routed": routed}
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


def _read_usage(replies: list[Any], meta: list[dict[str, Any]] | None) -> tuple[int, int] | None:
    """The prompt and completion tokens your generator reported for its call: the ``usage`` in its ``meta`` (a
    generator's) or in its replies' ``meta`` (a chat generator's ``ChatMessage``). Several replies that carry the
    same usage carry the call's (OpenAI's with n > 1), counted once; different ones are added up. None where any
    is missing: the read's cost is then unknown, never guessed."""
    metas = list(meta) if meta else [r.meta for r in replies if isinstance(r, ChatMessage)]
    usages: list[Mapping[str, Any]] = []
    for m in metas:
        usage = m.get("usage") if isinstance(m, Mapping) else None
        if not isinstance(usage, Mapping):
            return None
        if usage not in usages:
            usages.append(usage)
    if not usages:
        return None
    prompt, completion = 0, 0
    for usage in usages:
        p = next((usage[n] for n in ("prompt_tokens", "input_tokens") if n in usage), None)
        c = next((usage[n] for n in ("completion_tokens", "output_tokens") if n in usage), None)
        if not isinstance(p, int) or not isinstance(c, int) or isinstance(p, bool) or isinstance(c, bool):
            return None
        prompt, completion = prompt + p, completion + c
    return prompt, completion


@component
class RagateSavings:
    """Your generator's replies on the retrieving branch, with ragate's decision and savings: after your own
    generator, it takes its ``replies`` (and ``meta``, a generator's) and :class:`RagateRouter`'s ``routed``, and
    measures what that retrieval cost as always retrieving would pay it: the prompt and completion tokens your
    generator reports (``meta["usage"]``, a chat generator's in its replies' ``meta``) and the seconds from the
    router's decision to your generator's replies (your retriever, prompt builder and generator). That measure
    feeds the router's running estimate, so a later skip reports the tokens and seconds it saved. Where your
    generator reports no usage, the savings stay unknown (None).

    Usage example::

        rag.add_component("savings", RagateSavings())
        rag.connect("gate.routed", "savings.routed")
        rag.connect("llm.replies", "savings.replies")
        rag.connect("llm.meta", "savings.meta")  # a generator's; a chat generator's usage is in its replies

    Stateless: runs of one pipeline at the same time each carry their own ``routed``.
    """

    @component.output_types(replies=list[str], meta=list[dict[str, Any]])
    def run(
        self,
        routed: Routed,
        replies: list[str] | list[ChatMessage],
        meta: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Add the decision and savings to your generator's replies.

        :param routed: the router's ``routed`` output for this query.
        :param replies: your generator's replies (strings, or a chat generator's ``ChatMessage`` s).
        :param meta: your generator's ``meta`` (one dict per reply), where it has that output.
        :returns: ``replies`` (their texts) and ``meta`` (one dict per reply: your generator's meta for it, a
            chat reply's own, with ragate's record under ``"ragate"``; the savings ``measured`` with your
            generator's read), which fit ``AnswerBuilder``.
        """
        seconds = time.perf_counter() - routed.sent
        counts = _read_usage(list(replies), meta)
        read = usage_cost(*counts, seconds) if counts is not None else None
        decided = result_record(routed.pipeline, routed.retrieval, read_elsewhere=True, read=read)
        given = list(meta or [])
        texts, metas = [], []
        for i, reply in enumerate(replies):
            texts.append((reply.text or "") if isinstance(reply, ChatMessage) else reply)
            own = given[i] if i < len(given) else reply.meta if isinstance(reply, ChatMessage) else {}
            metas.append({**own, "ragate": decided})
        return {"replies": texts, "meta": metas}


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
            (one dict, with the gate's decision under ``"ragate"``, and the ``usage`` and ``model`` of ragate's model
            calls as a generator's meta has them).
        """
        with _span("ragate.answer", query) as span, collecting() as seen:
            with _llm_call(self, "ragate.answer", query) as called:
                answer = self.pipeline.answer(query)
                called(answer.text, _usage(answer.trace.stages), self.pipeline.model_label)
            meta = _accounted(self.pipeline, answer.trace.stages, result_record(self.pipeline, answer))
            _tag(span, meta["ragate"])
        documents = _documents(answer.documents, seen, decision_record(answer.method, answer.decision))
        return {"replies": [answer.text], "documents": documents, "meta": [meta]}
