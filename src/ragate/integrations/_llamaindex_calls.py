"""ragate's model calls and your LLM's reads in LlamaIndex's accounting (for :mod:`ragate.integrations.llamaindex`):
each call of ragate's model reported as a LlamaIndex LLM call (callback manager and instrumentation events), the
usage your LLM reports for a read of the chosen nodes collected per query, and the query events LlamaIndex's own
query engines send."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ragate.answers.savings import Cost
from ragate.integrations._common import missing, usage_cost

try:
    from llama_index.core.base.llms.types import CompletionResponse
    from llama_index.core.base.response.schema import RESPONSE_TYPE, Response
    from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events import BaseEvent
    from llama_index.core.instrumentation.events.llm import (
        LLMChatEndEvent,
        LLMCompletionEndEvent,
        LLMCompletionStartEvent,
    )
    from llama_index.core.instrumentation.events.query import QueryEndEvent, QueryStartEvent
    from llama_index.core.schema import QueryBundle, QueryType
except ImportError as err:
    raise missing("LlamaIndex (llama-index-core)", "llamaindex", err) from err

if TYPE_CHECKING:
    from ragate.methods.trace import Stage, Trace
    from ragate.pipeline import Pipeline

# the adapter's own dispatcher (one per name): its spans and events are the adapter's
dispatcher = get_dispatcher("ragate.integrations.llamaindex")


# -- ragate's model calls in LlamaIndex's accounting ---------------------------------------------------------------
def _report_calls(callback_manager: CallbackManager | None, pipeline: Pipeline, trace: Trace) -> None:
    """Each call of ragate's model in ``trace`` (the gate's draft, its continuation, ragate's answer: every stage
    with tokens) as one LlamaIndex LLM call, with the tokens the model reported."""
    lm_stages = [s for s in trace.stages if s.prompt_tokens or s.completion_tokens]
    for stage in lm_stages:
        if stage.name == "draft" and trace.draft is not None:
            text = trace.draft.text
        elif stage is lm_stages[-1] and stage.name in ("answer", "continue"):
            text = trace.answer
        else:
            text = ""
        ragate_model_call(callback_manager, pipeline, trace, stage, text)


@dispatcher.span
def ragate_model_call(
    callback_manager: CallbackManager | None, pipeline: Pipeline, trace: Trace, stage: Stage, text: str
) -> None:
    """One call of ragate's model, after it ran, as LlamaIndex reports an LLM's: ``LLMCompletionStartEvent`` and
    ``LLMCompletionEndEvent`` in a span of its own, and an ``LLM`` event through ``callback_manager``, whose
    ``CompletionResponse`` carries the call's usage in ``raw["usage"]`` (where ``TokenCountingHandler`` reads it).
    The prompt is the question (ragate's prompt around it stays inside ragate)."""
    usage = {
        "prompt_tokens": stage.prompt_tokens,
        "completion_tokens": stage.completion_tokens,
        "total_tokens": stage.prompt_tokens + stage.completion_tokens,
    }
    response = CompletionResponse(
        text=text, raw={"usage": usage, "ragate_stage": stage.name, "seconds": stage.seconds}
    )
    model = {"class_name": "ragate", "model": pipeline.model_label, "method": trace.method, "stage": stage.name}
    extra = {"ragate_stage": stage.name}
    dispatcher.event(LLMCompletionStartEvent(model_dict=model, prompt=trace.question, additional_kwargs=extra))
    if callback_manager is not None:
        start: dict[str, Any] = {
            EventPayload.PROMPT: trace.question,
            EventPayload.ADDITIONAL_KWARGS: extra,
            EventPayload.SERIALIZED: model,
        }
        event_id = callback_manager.on_event_start(CBEventType.LLM, payload=start)
        end: dict[str, Any] = {EventPayload.PROMPT: trace.question, EventPayload.COMPLETION: response}
        callback_manager.on_event_end(CBEventType.LLM, payload=end, event_id=event_id)
    dispatcher.event(LLMCompletionEndEvent(prompt=trace.question, response=response))


# -- what your LLM's read cost, from the usage it reported -----------------------------------------------------------
_PROMPT_KEYS = ("prompt_tokens", "input_tokens", "prompt_token_count")
_COMPLETION_KEYS = ("completion_tokens", "output_tokens", "candidates_token_count")


def reported_usage(response: Any) -> tuple[Any, Any] | None:
    """The prompt and completion tokens an LLM response reports, read where LlamaIndex's ``TokenCountingHandler``
    reads them (``raw["usage"]`` or ``raw["usage_metadata"]``, a dict or a pydantic model, under OpenAI's, Anthropic's
    or Gemini's names); None where it reports none (``TokenCountingHandler`` would estimate them with a tokenizer:
    ragate does not guess)."""
    raw = getattr(response, "raw", None)
    try:
        found = raw if isinstance(raw, Mapping) else dict(raw or {})
    except (TypeError, ValueError):
        return None
    usage = found.get("usage", found.get("usage_metadata", {}))
    if usage is None:
        usage = getattr(response, "additional_kwargs", None)
    if not usage:
        return None
    if not isinstance(usage, Mapping):
        dump = getattr(usage, "model_dump", None)
        if not callable(dump):
            return None
        usage = dump()
        if not isinstance(usage, Mapping):
            return None
    prompt = next((usage[k] for k in _PROMPT_KEYS if k in usage), None)
    completion = next((usage[k] for k in _COMPLETION_KEYS if k in usage), None)
    return None if prompt is None or completion is None else (prompt, completion)


class _Reads:
    """The LLM calls that ended inside one read (one query's only) and the usage each reported."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._raws: list[Any] = []
        self._usages: list[tuple[Any, Any] | None] = []

    def add(self, response: Any) -> None:
        raw = getattr(response, "raw", None)
        with self._lock:
            # a call that wraps another (a CustomLLM's chat calling its complete) ends twice with the same raw
            # response: counted once
            if raw is not None and any(seen is raw for seen in self._raws):
                return
            self._raws.append(raw)
            self._usages.append(None if response is None else reported_usage(response))

    def cost(self, seconds: float) -> Cost | None:
        """What the read cost: every call's tokens and the read's time; None where no call ended inside it (a
        streamed response ends later) or one reported no usage."""
        with self._lock:
            usages = list(self._usages)
        costs = [None if u is None else usage_cost(u[0], u[1], 0.0) for u in usages]
        if not costs or any(c is None for c in costs):
            return None
        return Cost(sum(c.tokens for c in costs if c is not None), max(0.0, seconds))


# The read of the query running in this context (per thread and per asyncio task; the tasks a synthesizer starts
# inside the read copy the context, so they add to the same read); None outside one.
_READ: contextvars.ContextVar[_Reads | None] = contextvars.ContextVar("ragate_llamaindex_read", default=None)


class _ReadUsage(BaseEventHandler):
    """On LlamaIndex's root dispatcher: the LLM end events of a read in progress go to that read."""

    @classmethod
    def class_name(cls) -> str:
        return "RagateReadUsage"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        reads = _READ.get()
        if reads is not None and isinstance(event, LLMCompletionEndEvent | LLMChatEndEvent):
            reads.add(event.response)


_USAGE = _ReadUsage()
_USAGE_LOCK = threading.Lock()


@contextlib.contextmanager
def _reading() -> Iterator[_Reads]:
    """The LLM calls made inside this block, by this query only (an app's other queries, in other threads or
    tasks, add to their own)."""
    root = get_dispatcher()
    with _USAGE_LOCK:
        if not any(h is _USAGE for h in root.event_handlers):
            root.add_event_handler(_USAGE)
    reads = _Reads()
    token = _READ.set(reads)
    try:
        yield reads
    finally:
        _READ.reset(token)


class _QueryEvents:
    """``query`` and ``aquery`` as LlamaIndex's own query engines run them: a ``QueryStartEvent`` and a
    ``QueryEndEvent`` to the instrumentation, a ``query`` trace on the callback manager (``CustomQueryEngine``'s own
    send no events)."""

    if TYPE_CHECKING:  # what the query engine it is mixed into has
        callback_manager: CallbackManager

        def custom_query(self, query_str: str) -> Any: ...

        async def acustom_query(self, query_str: str) -> Any: ...

    @dispatcher.span
    def query(self, str_or_query_bundle: QueryType) -> RESPONSE_TYPE:
        dispatcher.event(QueryStartEvent(query=str_or_query_bundle))
        with self.callback_manager.as_trace("query"):
            response = _response(self.custom_query(_query_str(str_or_query_bundle)))
        dispatcher.event(QueryEndEvent(query=str_or_query_bundle, response=response))
        return response

    @dispatcher.span
    async def aquery(self, str_or_query_bundle: QueryType) -> RESPONSE_TYPE:
        dispatcher.event(QueryStartEvent(query=str_or_query_bundle))
        with self.callback_manager.as_trace("query"):
            response = _response(await self.acustom_query(_query_str(str_or_query_bundle)))
        dispatcher.event(QueryEndEvent(query=str_or_query_bundle, response=response))
        return response


def _query_str(query: QueryType) -> str:
    return query.query_str if isinstance(query, QueryBundle) else str(query)


def _response(raw: Any) -> RESPONSE_TYPE:
    return Response(raw) if isinstance(raw, str) else raw  # type: ignore[no-any-return]
