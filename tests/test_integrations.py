"""``ragate.integrations`` apart from any framework: importing it imports none, a missing framework names its
extra, the adapters refuse unclear arguments before any model loads, and a search keeps the framework's objects
per call.

Shared with tests/test_integrations_*.py: the demo's questions and calibration, the demo passages, and the runner
of docs/integrations.md's snippets."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import ragate
from ragate.errors import RagateError
from ragate.integrations._common import (
    FrameworkSearch,
    MissingFrameworkError,
    collecting,
    open_pipeline,
    question_of,
    record,
)

DEMO = Path(ragate.__file__).parent / "data" / "demo"
CALIBRATION = DEMO / "targ-margin-smollm2-135m-budget-0.5.json"  # the Makefile's DEMO_CALIBRATION
SKIP_QUESTION = "what is the main mineral in lithium batteries"  # the Makefile's DEMO_SKIP_QUESTION
RAG_QUESTION = "where do the greasers live in the outsiders"  # DEMO_RAG_QUESTION
K = 3  # documents read: the demo's passages are long and SmolLM2 reads slowly on two cores
DOC = Path(__file__).parents[1] / "docs" / "integrations.md"
SECTIONS = {"llamaindex": "LlamaIndex", "langchain": "LangChain and LangGraph", "haystack": "Haystack"}
FRAMEWORKS = {"llamaindex": "llama_index", "langchain": "langchain_core", "haystack": "haystack"}


def demo_passages() -> list[dict[str, Any]]:
    """The 400 demo passages (``{"id", "title", "text", "source"}``)."""
    lines = (DEMO / "passages.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def doc_section(extra: str) -> str:
    """docs/integrations.md's section for one framework, up to the next ``## `` heading."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(
        rf"^## {re.escape(SECTIONS[extra])}\n(.*?)(?=^## |\Z)", text, flags=re.DOTALL | re.MULTILINE
    )
    assert match, f"docs/integrations.md has no section '## {SECTIONS[extra]}'"
    return match.group(1)


def doc_snippets(extra: str) -> list[str]:
    """The ```python blocks of one framework's section, in order."""
    return re.findall(r"```python\n(.*?)```", doc_section(extra), flags=re.DOTALL)


def run_doc_snippets(extra: str, where: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run one section's snippets in order, in one namespace, in the folder ``where``; returns the namespace."""
    monkeypatch.chdir(where)
    namespace: dict[str, Any] = {"__name__": f"integrations_{extra}"}
    for block in doc_snippets(extra):
        exec(compile(block, f"{DOC}:{SECTIONS[extra]}", "exec"), namespace)  # noqa: S102 - the project's own docs
    return namespace


def test_importing_ragate_integrations_imports_no_framework() -> None:
    code = (
        "import sys, ragate, ragate.integrations, ragate.integrations._common; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'llama_index', 'langchain_core', 'langchain', "
        "'langgraph', 'haystack', 'torch', 'llama_cpp'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("extra", sorted(FRAMEWORKS))
def test_a_missing_framework_names_the_extra_to_install(extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = FRAMEWORKS[extra]
    for name in [root, *(m for m in sys.modules if m.startswith(root + "."))]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, f"ragate.integrations.{extra}", raising=False)
    with pytest.raises(MissingFrameworkError, match=re.escape(f"pip install 'ragate[{extra}]'")) as err:
        importlib.import_module(f"ragate.integrations.{extra}")
    assert isinstance(err.value, RagateError)
    assert isinstance(err.value, ImportError)  # pytest.importorskip and `except ImportError` still catch it


def test_the_adapters_refuse_unclear_arguments_before_any_model_loads() -> None:
    ready = object.__new__(ragate.Pipeline)  # never used: each check comes first
    with pytest.raises(RagateError, match=r"pipeline= or the Pipeline keywords \(calibration, method\)"):
        open_pipeline("X", ready, {"method": "targ-margin", "calibration": CALIBRATION})
    with pytest.raises(RagateError, match="pipeline= or retriever="):
        open_pipeline("X", ready, {}, search=lambda q, k: [])
    with pytest.raises(RagateError, match="takes a ragate.Pipeline, not str"):
        open_pipeline("X", "targ-margin", {})  # type: ignore[arg-type]
    with pytest.raises(
        RagateError, match="'calibraton' is not a ragate.Pipeline keyword. Did you mean 'calibration'"
    ):
        open_pipeline("X", None, {"calibraton": CALIBRATION}, search=lambda q, k: [])
    with pytest.raises(RagateError, match="the retriever you pass is the pipeline's search; drop index="):
        open_pipeline("X", None, {"index": "my-index/"}, search=lambda q, k: [])
    with pytest.raises(RagateError, match="give threshold= or calibration="):  # ragate.Pipeline's own checks
        open_pipeline("X", None, {"threshold": 0.5, "calibration": CALIBRATION}, search=lambda q, k: [])


def test_a_search_keeps_the_framework_objects_of_its_own_call_only() -> None:
    corpus = {f"q{i}": [{"key": f"q{i}-{j}", "body": f"text {i} {j}"} for j in range(4)] for i in range(8)}
    search = FrameworkSearch(
        lambda q, k: corpus[q], lambda d: record(d["key"], d["body"], score=float("nan")), "S"
    )
    first = [{"id": "q0-0", "text": "text 0 0"}, {"id": "q0-1", "text": "text 0 1"}]
    assert search("q0", 2) == first  # k kept, and a NaN score left out
    start, seen_by = threading.Barrier(8), {}

    def call(query: str) -> None:
        with collecting() as seen:
            start.wait()  # every thread inside its call at once
            search(query, 3)
            seen_by[query] = seen

    threads = [threading.Thread(target=call, args=(q,)) for q in corpus]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for query, seen in seen_by.items():
        assert list(seen) == [f"{query}-{j}" for j in range(3)]
        assert all(seen[key] is corpus[query][j] for j, key in enumerate(seen))  # the objects themselves


def test_records_and_questions_are_read_strictly() -> None:
    assert record(7, "t", title=3, score=True) == {"id": "7", "text": "t"}  # no str title, no bool score
    assert record("a", None, "T", 2) == {"id": "a", "text": "", "title": "T", "score": 2.0}
    with pytest.raises(RagateError, match="has no id"):
        record("", "some text")
    assert question_of("q?", "question") == "q?" == question_of({"question": "q?"}, "question")
    with pytest.raises(RagateError, match="no 'question' key .* question_key="):
        question_of({"messages": []}, "question")
    with pytest.raises(RagateError, match="the question is a int"):
        question_of({"question": 3}, "question")


@pytest.mark.parametrize("extra", sorted(SECTIONS))
def test_each_framework_is_shown_in_short_snippets_with_its_install_line(extra: str) -> None:
    section = doc_section(extra)
    assert f'pip install "ragate[{extra}]"' in section
    snippets = doc_snippets(extra)
    assert snippets and all(len(block.splitlines()) <= 15 for block in snippets)
    assert f"from ragate.integrations.{extra} import" in "".join(snippets)
