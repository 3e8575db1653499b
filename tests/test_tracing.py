"""OpenTelemetry spans of ``ragate.Pipeline``'s answers, read back with the SDK's in-memory exporter: SmolLM2 on
llama.cpp, TARG's margin gate over a real dense index, thresholds that make it skip or retrieve. Attribute names
are checked against the OpenTelemetry GenAI and OpenInference semantic-convention packages."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _module in ("opentelemetry.sdk", "openinference.semconv"):
    if importlib.util.find_spec(_module.split(".")[0]) is None or importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed: pip install 'ragate[trace,dev]'", allow_module_level=True)

from openinference.semconv.trace import DocumentAttributes, OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as G

import ragate

QUESTION = "Who discovered penicillin?"
KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND


@pytest.fixture(scope="module")
def traced(smollm2_path: Path, wiki_dense: Any) -> Iterator[tuple[InMemorySpanExporter, Any, Any]]:
    """Two pipelines over one in-memory exporter: without text in the spans (the default) and with it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with (
        ragate.Pipeline(
            method="targ-margin", retriever=wiki_dense, tracer_provider=provider, max_tokens=8
        ) as plain,
        ragate.Pipeline(
            method="targ-margin",
            retriever=wiki_dense,
            tracer_provider=provider,
            max_tokens=8,
            trace_content=True,
        ) as content,
    ):
        yield exporter, plain, content


def _spans(
    exporter: InMemorySpanExporter, answer: ReadableSpan | None = None
) -> dict[str, list[ReadableSpan]]:
    """The finished spans by name (those of the last answer), after clearing the exporter."""
    spans = list(exporter.get_finished_spans())
    exporter.clear()
    root = [s for s in spans if s.name == "ragate.answer"][-1] if answer is None else answer
    trace_id = root.context.trace_id
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        if s.context.trace_id == trace_id:
            out.setdefault("chat" if s.name.startswith("chat ") else s.name, []).append(s)
    return out


def _all_text(spans: dict[str, list[ReadableSpan]]) -> str:
    return json.dumps([dict(s.attributes or {}) for group in spans.values() for s in group], default=str)


def test_an_answer_that_retrieved_has_gate_retriever_and_generation_spans(traced: Any) -> None:
    exporter, plain, _ = traced
    exporter.clear()
    ans = plain.answer(QUESTION, threshold=-1.0, k=2)
    assert ans.retrieved
    spans = _spans(exporter)
    [root], [gate], [retrieve] = spans["ragate.answer"], spans["ragate.gate"], spans["ragate.retrieve"]
    draft, answer = sorted(spans["chat"], key=lambda s: s.start_time or 0)
    assert root.parent is None and gate.parent is not None and gate.parent.span_id == root.context.span_id
    assert retrieve.parent.span_id == answer.parent.span_id == root.context.span_id  # type: ignore[union-attr]
    assert draft.parent.span_id == gate.context.span_id  # type: ignore[union-attr]  # the gate's own draft

    a = dict(root.attributes or {})
    assert a[KIND] == OpenInferenceSpanKindValues.CHAIN.value and a["ragate.method"] == "targ-margin"
    assert a[G.GEN_AI_USAGE_INPUT_TOKENS] + a[G.GEN_AI_USAGE_OUTPUT_TOKENS] == ans.tokens
    g = dict(gate.attributes or {})
    assert g["ragate.gate.score"] == pytest.approx(ans.decision.score) and g["ragate.gate.threshold"] == -1.0
    assert g["ragate.gate.decision"] == "retrieve" and g["ragate.gate.retrieve"] is True
    assert g["ragate.gate.tokens"] == ans.stages[0].prompt_tokens + ans.stages[0].completion_tokens > 0
    r = dict(retrieve.attributes or {})
    assert (
        r[KIND] == OpenInferenceSpanKindValues.RETRIEVER.value and r[G.GEN_AI_OPERATION_NAME] == "retrieval"
    )
    docs = SpanAttributes.RETRIEVAL_DOCUMENTS
    ids = [r[f"{docs}.{i}.{DocumentAttributes.DOCUMENT_ID}"] for i in range(len(ans.documents))]
    assert ids == [d.id for d in ans.documents] and r["ragate.documents"] == 2
    assert r[f"{docs}.0.{DocumentAttributes.DOCUMENT_SCORE}"] == pytest.approx(ans.documents[0].score)
    for span, stage in ((draft, ans.stages[0]), (answer, ans.stages[-1])):
        s = dict(span.attributes or {})
        assert s[KIND] == OpenInferenceSpanKindValues.LLM.value and s[G.GEN_AI_OPERATION_NAME] == "chat"
        assert s["ragate.stage"] == stage.name and span.name == f"chat {plain.model_label}"
        assert (s[G.GEN_AI_USAGE_INPUT_TOKENS], s[G.GEN_AI_USAGE_OUTPUT_TOKENS]) == (
            stage.prompt_tokens, stage.completion_tokens
        )  # fmt: skip
        assert s[SpanAttributes.LLM_TOKEN_COUNT_TOTAL] == stage.prompt_tokens + stage.completion_tokens
        assert s[G.GEN_AI_REQUEST_MODEL] == plain.model_label and s[G.GEN_AI_PROVIDER_NAME] == "llama.cpp"
    assert draft.end_time <= answer.start_time and root.start_time <= gate.start_time  # type: ignore[operator]


def test_an_answer_that_did_not_retrieve_has_no_retriever_span(traced: Any) -> None:
    exporter, plain, _ = traced
    exporter.clear()
    ans = plain.answer(QUESTION, threshold=1000.0)
    assert not ans.retrieved
    spans = _spans(exporter)
    assert "ragate.retrieve" not in spans and len(spans["ragate.gate"]) == 1
    assert dict(spans["ragate.gate"][0].attributes or {})["ragate.gate.decision"] == "skip"
    assert len(spans["chat"]) == len([s for s in ans.stages if s.prompt_tokens or s.completion_tokens])


def test_no_text_in_spans_unless_the_user_opts_in(traced: Any) -> None:
    exporter, plain, content = traced
    exporter.clear()
    ans = plain.answer(QUESTION, threshold=-1.0, k=2)
    text = _all_text(_spans(exporter))
    for secret in (QUESTION, ans.text.strip(), ans.documents[0].text[:40], ans.decision.reason):
        assert secret not in text, secret
    shown = content.answer(QUESTION, threshold=-1.0, k=2)
    spans = _spans(exporter)
    root = dict(spans["ragate.answer"][0].attributes or {})
    assert root[SpanAttributes.INPUT_VALUE] == QUESTION and root[SpanAttributes.OUTPUT_VALUE] == shown.text
    r = dict(spans["ragate.retrieve"][0].attributes or {})
    docs = SpanAttributes.RETRIEVAL_DOCUMENTS
    assert r[f"{docs}.0.{DocumentAttributes.DOCUMENT_CONTENT}"] == shown.documents[0].text
    assert r[G.GEN_AI_RETRIEVAL_QUERY_TEXT] == QUESTION
    assert dict(spans["ragate.gate"][0].attributes or {})["ragate.gate.reason"] == shown.decision.reason


def test_the_environment_variable_of_the_genai_conventions_turns_text_on(
    traced: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter, plain, _ = traced
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    exporter.clear()
    plain.answer(QUESTION, threshold=1000.0)
    assert dict(_spans(exporter)["ragate.answer"][0].attributes or {})[SpanAttributes.INPUT_VALUE] == QUESTION


def test_a_failed_answer_is_an_error_span_and_retrieve_alone_is_traced(traced: Any) -> None:
    exporter, plain, _ = traced
    exporter.clear()
    with pytest.raises(ragate.RagateError):
        plain.answer(QUESTION, method="hyde-typo")
    exporter.clear()  # a bad method fails before any span: nothing to see
    assert not exporter.get_finished_spans()
    found = plain.retrieve(QUESTION, threshold=-1.0, k=2)
    spans = list(exporter.get_finished_spans())
    assert [s.name for s in spans if s.parent is None] == ["ragate.retrieve"]
    retriever = [s for s in spans if dict(s.attributes or {}).get(KIND) == "RETRIEVER"]
    assert len(retriever) == 1 and dict(retriever[0].attributes or {})["ragate.documents"] == len(
        found.documents
    )


def test_ask_writes_its_spans_to_a_file(smollm2_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "spans.jsonl"
    cmd = [sys.executable, "-m", "ragate.cli.main", "ask", QUESTION, "--method", "no-retrieval", "--max-tokens",
           "4", "--quiet", "--trace", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    spans = [json.loads(line) for line in out.read_text().splitlines()]
    assert {s["name"] for s in spans} >= {"ragate.answer"} and QUESTION not in out.read_text()
    root = next(s for s in spans if s["name"] == "ragate.answer")
    assert (
        root["attributes"]["ragate.method"] == "no-retrieval"
        and root["attributes"]["ragate.retrieved"] is False
    )
    bad = subprocess.run(
        [*cmd[:-2], "--trace", str(tmp_path)], check=False, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode != 0 and "that is a directory" in bad.stderr and "Traceback" not in bad.stderr
