"""OpenTelemetry spans for every answer: one span per answer, with the gate, each retrieval and each generation
as child spans, named and attributed after the OpenTelemetry GenAI semantic conventions (``gen_ai.*``) and
OpenInference's span kinds (``openinference.span.kind``: CHAIN, LLM, RETRIEVER).

ragate depends only on ``opentelemetry-api`` (``pip install "ragate[trace]"``): the spans go to whatever tracer
provider the application set up (an OTLP exporter, Phoenix, Jaeger...); without one, the API's no-op tracer
drops them. Without the API installed, tracing is off. ``ragate ask/serve --trace FILE`` sets up the
SDK to write the spans as JSON lines (:func:`trace_to_file`).

The answer span is live (opened before the pipeline runs, so spans of the user's own search function or HTTP client
nest inside it); its children are laid out after the answer from the stages the trace recorded, each with its
measured duration, one after the other. Text (the question, the answer, documents, the gate's reason, which may
quote the model's answers) is recorded only when asked: ``content=True``, or the GenAI convention's environment
variable ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragate.methods.trace import Stage, Trace

log = logging.getLogger("ragate.tracing")

CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SCOPE = "ragate"
KIND = "openinference.span.kind"


def capture_content(content: bool | None) -> bool:
    """Whether spans carry text: ``content`` if given, else the GenAI environment variable (default off)."""
    if content is not None:
        return content
    return os.environ.get(CONTENT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Tracing:
    """Where a pipeline's spans go (``provider``: a tracer provider; None: the application's global one) and
    whether they carry text (``content``; None: the environment variable)."""

    provider: Any = None
    content: bool | None = None
    _warned: dict[str, float] = field(default_factory=dict, compare=False, repr=False)  # what failed, and when

    def tracer(self) -> Any:
        """The tracer, or None without ``opentelemetry-api``."""
        try:
            from opentelemetry import trace
        except ImportError:  # tracing is an optional extra
            return None
        from ragate.version import __version__

        if self.provider is not None:
            return self.provider.get_tracer(SCOPE, __version__)
        return trace.get_tracer(SCOPE, __version__)

    @contextlib.contextmanager
    def span(self, name: str, method: str, *, model: str, engine: str) -> Iterator[Any]:
        """The live span of one answer (``ragate.answer`` or ``ragate.retrieve``), current while the pipeline
        runs; yields it for :meth:`finish` (None when tracing is off). An exception marks it as an error."""
        tracer = self.tracer()
        if tracer is None:
            yield None
            return
        from opentelemetry.trace import Status, StatusCode

        attributes = {
            KIND: "CHAIN", "gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": name,
            "ragate.method": method, "gen_ai.request.model": model, "ragate.engine": engine,
        }  # fmt: skip
        # a side channel: a tracer or span processor that raises costs a warning, never the answer
        try:
            opened = tracer.start_as_current_span(name, attributes=attributes, record_exception=False)
            span = opened.__enter__()
        except Exception as err:  # noqa: BLE001 (any failure of the tracing side channel)
            self._failed("start a span", err)
            yield None
            return
        try:
            yield span
        except BaseException as err:
            try:
                span.set_status(Status(StatusCode.ERROR, type(err).__name__))
                span.set_attribute("error.type", type(err).__name__)
                opened.__exit__(type(err), err, err.__traceback__)
            except Exception as other:  # noqa: BLE001
                if other is not err:
                    self._failed("end a span", other)
            raise
        try:
            opened.__exit__(None, None, None)
        except Exception as err:  # noqa: BLE001
            self._failed("end a span", err)

    def finish(self, span: Any, trace: Trace, *, model: str, engine: str) -> None:
        """Give the answer span its attributes and its children from ``trace`` (a no-op when ``span`` is None); a
        tracer that raises costs a warning, not the answer."""
        if span is None:
            return
        try:
            if span.is_recording():
                _fill(self.tracer(), span, trace, model, engine, capture_content(self.content))
        except Exception as err:  # noqa: BLE001
            self._failed("record the answer's spans", err)

    def _failed(self, what: str, err: BaseException) -> None:
        """Log a tracing failure, once a minute per kind (the answers go on)."""
        key = f"{what}: {type(err).__name__}"
        now = time.monotonic()
        if now - self._warned.get(key, -math.inf) >= 60.0:
            self._warned[key] = now
            log.warning("tracing failed to %s (%s: %s); the answer goes on without it", what, type(err).__name__, err)


def _fill(tracer: Any, span: Any, trace: Trace, model: str, engine: str, content: bool) -> None:
    from opentelemetry import trace as otel

    prompt = sum(s.prompt_tokens for s in trace.stages)
    completion = sum(s.completion_tokens for s in trace.stages)
    span.set_attributes({
        "ragate.retrieved": trace.retrieved,
        "ragate.tokens": prompt + completion,
        "ragate.seconds": trace.seconds,
        "gen_ai.usage.input_tokens": prompt,
        "gen_ai.usage.output_tokens": completion,
        "llm.token_count.prompt": prompt,
        "llm.token_count.completion": completion,
        "llm.token_count.total": prompt + completion,
    })  # fmt: skip
    if content:
        span.set_attributes({"input.value": trace.question, "output.value": trace.answer})
    parent = otel.set_span_in_context(span)
    cursor = time.time_ns() - int(trace.seconds * 1e9)  # the stages, laid end to end, finish now
    stages = list(trace.stages)
    gate_stages = trace.gate_stages or 0
    if trace.gate_stages is not None:
        gate_span = tracer.start_span("ragate.gate", parent, attributes=_gate_attributes(trace, content),
                                      start_time=cursor)  # fmt: skip
        inner = otel.set_span_in_context(gate_span)
        for stage in stages[:gate_stages]:
            cursor = _stage_span(tracer, inner, stage, cursor, model, engine, gate=True)
        gate_span.end(end_time=cursor)
    events = list(trace.dynamic.retrievals) if trace.dynamic is not None else []
    retrievals = 0
    for stage in stages[gate_stages:]:
        if stage.name == "retrieve":
            documents = _documents_for(trace, retrievals, events)
            retrievals += 1
            cursor = _retrieve_span(tracer, parent, stage, cursor, documents, trace, content)
        else:
            cursor = _stage_span(tracer, parent, stage, cursor, model, engine, gate=False)


def _gate_attributes(trace: Trace, content: bool) -> dict[str, Any]:
    g = trace.gate
    gate = trace.stages[: trace.gate_stages or 0]
    attributes: dict[str, Any] = {
        KIND: "CHAIN",
        "ragate.method": trace.method,
        "ragate.gate.decision": "retrieve" if g.retrieve else "skip",
        "ragate.gate.retrieve": g.retrieve,
        "ragate.gate.tokens": sum(s.prompt_tokens + s.completion_tokens for s in gate),
    }
    if math.isfinite(g.score):  # NaN is no value a backend can plot
        attributes["ragate.gate.score"] = float(g.score)
    if g.threshold is not None and math.isfinite(g.threshold):
        attributes["ragate.gate.threshold"] = float(g.threshold)
    if content:  # a reason may quote the model's answers (PAIRS)
        attributes["ragate.gate.reason"] = g.reason
    return attributes


def _documents_for(trace: Trace, i: int, events: list[Any]) -> list[tuple[str, float | None, str | None]]:
    """(id, score, text) of what retrieval ``i`` found: a dynamic method's i-th event, else the documents read."""
    if events:
        if i >= len(events):
            return []
        return [(doc_id, None, None) for doc_id in events[i].doc_ids]
    return [(h.id, float(h.score), h.passage.text) for h in trace.documents]


def _stage_span(
    tracer: Any, parent: Any, stage: Stage, start: int, model: str, engine: str, *, gate: bool
) -> int:
    """An LM call's span (or a step without tokens, e.g. a kNN vote, as a CHAIN span); returns its end."""
    end = start + int(stage.seconds * 1e9)
    lm = bool(stage.prompt_tokens or stage.completion_tokens)
    attributes: dict[str, Any] = {
        "ragate.stage": stage.name,
        "ragate.overhead": stage.overhead,
        "ragate.gate": gate,
    }
    if lm:
        attributes |= {
            KIND: "LLM",
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": engine,
            "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": stage.prompt_tokens,
            "gen_ai.usage.output_tokens": stage.completion_tokens,
            "llm.model_name": model,
            "llm.token_count.prompt": stage.prompt_tokens,
            "llm.token_count.completion": stage.completion_tokens,
            "llm.token_count.total": stage.prompt_tokens + stage.completion_tokens,
        }
        if stage.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = (stage.finish_reason,)
        name = f"chat {model}"
    else:
        attributes[KIND] = "CHAIN"
        name = f"ragate.{stage.name}"
    span = tracer.start_span(name, parent, attributes=attributes, start_time=start)
    span.end(end_time=end)
    return end


def _retrieve_span(
    tracer: Any, parent: Any, stage: Stage, start: int, documents: list[tuple[str, float | None, str | None]],
    trace: Trace, content: bool,
) -> int:  # fmt: skip
    end = start + int(stage.seconds * 1e9)
    attributes: dict[str, Any] = {
        KIND: "RETRIEVER", "gen_ai.operation.name": "retrieval", "ragate.stage": stage.name,
        "ragate.documents": len(documents),
    }  # fmt: skip
    for i, (doc_id, score, text) in enumerate(documents):
        attributes[f"retrieval.documents.{i}.document.id"] = doc_id
        if score is not None and math.isfinite(score):
            attributes[f"retrieval.documents.{i}.document.score"] = score
        if content and text is not None:
            attributes[f"retrieval.documents.{i}.document.content"] = text
    if content and trace.queries:
        attributes["input.value"] = attributes["gen_ai.retrieval.query.text"] = trace.queries[0]
    span = tracer.start_span("ragate.retrieve", parent, attributes=attributes, start_time=start)
    span.end(end_time=end)
    return end


def trace_to_file(path: str | Path) -> Any:
    """A tracer provider of the OpenTelemetry SDK that writes every span to ``path``, one JSON object a line
    (appended; ``shutdown()`` flushes and closes it), under the service name ``ragate`` (``OTEL_SERVICE_NAME`` to
    change it). Needs ``opentelemetry-sdk`` (``pip install "ragate[trace]"``).
    It is this process's global provider too, so the spans of instrumented libraries land in the same file."""
    from ragate.errors import RagateError

    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError:
        raise RagateError(
            '--trace writes spans with the OpenTelemetry SDK, which is not installed: pip install "ragate[trace]"'
        ) from None
    target = Path(path)
    if target.is_dir():
        raise RagateError(f"--trace {path}: that is a directory; name a file to append the spans to")
    if target.is_fifo() or target.is_socket():  # opening it would wait for a reader, without a word
        raise RagateError(f"--trace {path}: that is a FIFO or a socket; name a file to append the spans to")
    try:
        out = target.open("a", encoding="utf-8")
    except OSError as err:
        raise RagateError(f"--trace {path}: cannot open it for writing ({err.strerror})") from None
    exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
    from ragate.version import __version__

    # the service's name in every span's resource (else "unknown_service:python"); OTEL_SERVICE_NAME overrides it
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "ragate"}
    resource = Resource.create({**named, "service.version": __version__})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider
