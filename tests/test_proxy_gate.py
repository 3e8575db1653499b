"""Proxy gates (issue 51, item 4): SmolLM2's draft, through llama.cpp, decides for another model.

With a second llama.cpp model (Qwen2.5-Coder-1.5B, where installed) the proxy's score is exactly the score
SmolLM2's own TARG margin gate gives the question, and the answer is the large model's; with a real HTTP server
that returns no logprobs (``benchmarks/latency_server.py --no-logprobs``), where TARG's gates are refused, the
proxy gate runs through ``ragate.Pipeline`` and ``ragate eval``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragate.backends.scripted import SCRIPTED_CAPABILITIES, ScriptedBackend, make_generation
from ragate.errors import CapabilityError, RagateError
from ragate.methods import get_method, run_method

SERVER = Path(__file__).resolve().parents[1] / "benchmarks" / "latency_server.py"
QUESTION = "who got the first nobel prize in physics"


def test_a_proxy_gate_without_a_proxy_names_the_fix_and_the_option_goes_with_proxy_gates_only() -> None:
    from ragate.methods.configure import configure_method

    lm = ScriptedBackend(
        lambda request: make_generation(["Paris"], [-0.1]), capabilities=SCRIPTED_CAPABILITIES
    )
    with pytest.raises(RagateError, match="drafts with a small proxy model, and none is open"):
        run_method(get_method("proxy-margin"), QUESTION, lm, None)
    with pytest.raises(RagateError, match="--proxy-model goes with a proxy gate"):
        configure_method(get_method("targ-margin"), None, None, None, None, None, proxy_model="smollm2-135m")
    spec = configure_method(get_method("proxy-entropy"), None, None, None, None, None, proxy_model="x.gguf")
    assert spec.gate.proxy == "x.gguf"


def test_smollm2_decides_for_the_1_5b_model_with_its_own_targ_score(llama_backend: Any) -> None:
    from ragate.models import model_spec, model_status
    from ragate.pipeline import Pipeline

    if not model_status(model_spec("qwen2.5-coder-1.5b")).installed:
        pytest.skip("the second llama.cpp model is not installed: ragate models install qwen2.5-coder-1.5b")
    own = run_method(get_method("targ-margin").with_threshold(1e9), QUESTION, llama_backend, None)
    with Pipeline("proxy-margin", model="qwen2.5-coder-1.5b", threshold=1e9, max_tokens=16) as rag:
        answer = rag.answer(QUESTION)
    assert (
        answer.decision.score == own.gate.score and not answer.retrieved
    )  # the proxy's draft, scored by Eq. 2
    names = [(s.name, s.overhead) for s in answer.stages]
    assert names == [("proxy-draft", True), ("answer", False)]  # the 1.5B model writes the answer
    assert answer.stages[0].completion_tokens == own.stages[0].completion_tokens


@pytest.fixture(scope="module")
def text_only_server() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--latency", "0.01", "--no-logprobs"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().decode().strip()
    assert url.startswith("http://127.0.0.1:"), url
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_the_proxy_gate_decides_for_a_server_that_returns_no_logprobs(
    text_only_server: str, tmp_path: Path
) -> None:
    from ragate.cli.main import main
    from ragate.pipeline import Pipeline

    with pytest.raises(CapabilityError, match="no logprobs"):
        Pipeline("targ-margin", backend="openai", base_url=text_only_server)
    with Pipeline("proxy-margin", backend="openai", base_url=text_only_server, threshold=1e9) as rag:
        answer = rag.answer(QUESTION)
        assert rag.lm.capabilities.logprobs is False
    assert "proxy margin" in answer.decision.reason and answer.text and not answer.retrieved
    assert [s.name for s in answer.stages] == ["proxy-draft", "answer"]
    out = tmp_path / "run"
    argv = ["eval", "--dataset", "demo", "--limit", "2", "--methods", "proxy-margin", "--backend", "openai"]
    assert main([*argv, "--base-url", text_only_server, "--out", str(out), "--quiet"]) == 0
    rows = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("proxy margin" in r["trace"]["gate"]["reason"] for r in rows)
    assert all(r["trace"]["stages"][0]["name"] == "proxy-draft" and r["overhead_tokens"] > 0 for r in rows)
