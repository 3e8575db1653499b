"""Prompt-state reuse on every path that answers (issue P): ``ragate.Pipeline`` (so ``ask`` and ``serve``) and the
dynamic loops compute each call from a cleared cache, its prompt started from a kept prompt state where the engine
offers one; turning the states off changes no answer, and a long-running server keeps them within their bound.

Real SmolLM2 on llama.cpp, the demo index, the demo questions; a real ``ragate serve`` process for the bound.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from test_targ_baselines import TRAIN  # SKR's six training questions

from ragate.eval.provenance import model_identity
from ragate.gates import skr
from ragate.methods import MethodSpec, all_methods, run_method
from ragate.methods.runner import encoder_identity
from ragate.methods.spec import RERANK_SELECTORS
from ragate.pipeline import Pipeline
from ragate.retrieval.demo import demo_dir
from ragate.types import GenerationRequest, Message

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python is not installed (pip install 'ragate[llamacpp]')", allow_module_level=True)

QUESTIONS = [json.loads(line)["question"] for line in (demo_dir() / "questions.jsonl").open()][:2]
LONG_QUESTION = (
    "In which year did the author of the novel Pride and Prejudice publish her first book, and who was the "
    "publisher of that first edition?"
)


def _short(spec: MethodSpec) -> MethodSpec:
    """The method with short generations, one document and, for a dynamic method, the three-exemplar set (the
    test's time: the authors' eight exemplars double each dynamic answer's prompt); its prompts, calls and
    decisions otherwise its own."""
    spec = spec.with_(max_tokens=12, pseudo_max_tokens=24, expansion_max_tokens=24)
    spec = spec.with_(selector=replace(spec.selector, k=1))
    return spec.with_(dynamic=replace(spec.dynamic, max_tokens=24, k=1, exemplars="ragate-3")) if spec.dynamic is not None else spec


def _with_files(spec: MethodSpec, rag: Pipeline, where: Path, cross_encoder: Path) -> MethodSpec:
    """The files a method reads: SKR a label set fitted for this model and the demo index's encoder (its training
    questions embedded by that encoder, as ``ragate skr fit`` does), the trained gate no-model-lr weights for this
    model and index (a hand-set regression over every signal), the rerank selectors a cross-encoder (built from
    MiniLM's body, conftest.py); any other method as it is."""
    if spec.selector.kind in RERANK_SELECTORS:
        return spec.with_(selector=replace(spec.selector, cross_encoder=str(cross_encoder)))
    if spec.gate.kind == "no-model-lr":
        from ragate.gates import nomodel

        names = nomodel.FEATURES
        meta = {"label": "closed-wrong", "model": model_identity(rag.lm.model, rag.lm.engine), "score_kind": "cosine",
                "index": nomodel.index_corpus(rag.retriever), "encoder": encoder_identity(rag.retriever)}  # fmt: skip
        ones = np.ones(len(names))
        weights = nomodel.GateWeights(names, np.zeros(len(names)), ones, ones / len(names), 0.0, meta)
        path = nomodel.save_weights(weights, where / "gate-weights.json")
        return spec.with_(gate=replace(spec.gate, weights=str(path)))
    if spec.gate.kind == "learned":  # a cascade over the hidden state that always drafts (band 0-1)
        from ragate.gates.learned import LearnedGateFile, Probe, save_learned

        rng = np.random.default_rng(0)
        dim = int(rag.lm.hidden_state("x").shape[0])  # type: ignore[attr-defined]

        def probe(features: tuple[str, ...]) -> Probe:
            width = len(features) + 2
            return Probe(
                features, np.zeros(width), np.ones(width), rng.normal(size=width) * 0.1, 0.0, (1.0, 0.0),
                np.zeros(dim), rng.normal(size=(2, dim)) / np.sqrt(dim),
            )  # fmt: skip

        gate = LearnedGateFile(
            probe(("words",)), probe(("words", "targ-entropy", "targ-margin")), (0.0, 1.0),
            {"label": "closed-wrong", "model": {"model": rag.lm.model}},
        )  # fmt: skip
        path = save_learned(gate, where / "learned-gate.json")
        return spec.with_(gate=replace(spec.gate, weights=str(path)))
    if spec.gate.kind != "skr":
        return spec
    path = where / "skr-labels.npz"
    if not path.exists():
        embeddings = np.asarray(rag.retriever.embed_queries(TRAIN), dtype=np.float32)
        meta = {"encoder": encoder_identity(rag.retriever), "model": model_identity(rag.lm.model, rag.lm.engine)}
        ids = tuple(f"t{i}" for i in range(len(TRAIN)))
        skr.save_labels(skr.LabelSet(ids, tuple(TRAIN), np.array([True, False] * 3), embeddings, meta), path)
    return spec.with_(gate=replace(spec.gate, labels=str(path)))


def _seen(trace: Any) -> tuple[Any, ...]:
    stages = tuple((s.name, s.prompt_tokens, s.completion_tokens) for s in trace.stages)
    return trace.answer, trace.retrieved, trace.gate.score, tuple(h.id for h in trace.documents), stages


@pytest.fixture(scope="module")
def twins(smollm2_path: Path) -> Iterator[dict[str, Pipeline]]:
    from ragate.backends.llamacpp import LlamaCppBackend

    pipelines = {}
    for name, nbytes in (("on", 256 * 2**20), ("off", 0)):
        lm = LlamaCppBackend(smollm2_path, name="smollm2-135m", n_ctx=2048, prompt_state_bytes=nbytes)
        pipelines[name] = Pipeline(lm=lm)
        pipelines[name]._owned.append(lm)  # closed with the pipeline
    yield pipelines
    for p in pipelines.values():
        p.close()


def test_every_method_answers_the_same_with_prompt_states_on_and_off(
    twins: dict[str, Pipeline], tmp_path: Path, cross_encoder_dir: Path
) -> None:
    methods = {  # the proxy gates draft with a second model (tests/test_proxy_gate.py); their answer is a direct one;
        # a route method answers with other methods, each compared here on its own
        name: _with_files(_short(spec), twins["on"], tmp_path, cross_encoder_dir)
        for name, spec in all_methods().items()
        if not spec.gate.kind.startswith("proxy-") and spec.route is None
    }
    assert len(methods) >= 44 and {"skr", "rerank", "dpr-ais-rerank"} <= set(methods)
    seen: dict[str, dict[str, Any]] = {}
    from ragate.eval.calls import CallCache, CallStore

    for mode, rag in twins.items():
        # the reference (no prompt states) computes a call many methods make alike once (tests/test_calls.py: a
        # stored call is the computed one); the methods under test compute every call
        lm = rag.lm if mode == "on" else CallCache(
            rag.lm.inner, CallStore(tmp_path / "reference.sqlite"), "smollm2-no-states", exact_prefixes=True  # type: ignore[attr-defined]
        )  # fmt: skip
        with lm.tally() as tally:
            # every method in turn on one backend: each answer starts after all the states the earlier ones left
            seen[mode] = {
                (name, q): _seen(run_method(spec, q, lm, rag.retriever))
                for q in QUESTIONS[:1]  # one (time); questions before: test_an_answer_does_not_depend_on_...
                for name, spec in methods.items()
            }
        if lm is not rag.lm:
            lm.store.close()  # type: ignore[union-attr]
        if mode == "on":
            assert tally.reused_tokens > 0  # the states were used (else this test compares nothing)
            states = rag.prompt_states
            assert states is not None and 0 < states["bytes"] <= states["max_bytes"]
        else:
            assert tally.reused_tokens == 0 and rag.prompt_states == {"kept": 0, "bytes": 0, "max_bytes": 0}
    differ = [key for key, value in seen["on"].items() if seen["off"][key] != value]
    assert not differ, differ


def test_the_reading_prompt_starts_from_the_drafts_state(twins: dict[str, Pipeline]) -> None:
    """TARG's reader puts the question first (x = B(q) + C), so the draft's prompt state starts it; with the
    documents first only the system message is shared."""
    rag = twins["on"]
    raw = rag.lm.inner  # type: ignore[attr-defined]
    reused = {}
    for name in ("targ-always", "targ-always-context-first"):
        raw.drop_prompt_states()
        spec = _short(all_methods()[name])
        spec = spec.with_(gate=replace(spec.gate, kind="targ-margin", threshold=-1.0))  # a draft, then retrieve
        with rag.lm.tally() as tally:  # type: ignore[attr-defined]
            trace = run_method(spec, LONG_QUESTION, rag.lm, rag.retriever)
        assert trace.retrieved and [s.name for s in trace.stages if s.prompt_tokens] == ["draft", "answer"]
        reused[name] = tally.reused_tokens
    # the documents-first reader shares the system message (16 tokens after the cut to a multiple of 16); the
    # question-first one the question too
    assert reused["targ-always-context-first"] == 16 and reused["targ-always"] >= 48, reused


def test_a_prompt_evaluated_before_is_restored_whole_with_its_logits(twins: dict[str, Pipeline]) -> None:
    """TARG's N samples after its greedy draft, or a question asked again: nothing of the prompt is evaluated, and
    the generation is the same bit for bit."""
    calls = twins["on"].lm
    raw = calls.inner  # type: ignore[attr-defined]
    raw.drop_prompt_states()
    request = GenerationRequest((Message("user", LONG_QUESTION),), max_tokens=6, top_logprobs=3)
    first = calls.generate([request])[0]
    before = raw.evaluated_tokens
    with calls.tally() as again:  # type: ignore[attr-defined]
        second = calls.generate([request])[0]
    assert again.reused_tokens == first.prompt_tokens and again.hits == 0
    assert raw.evaluated_tokens - before < len(second.token_ids)  # only the generated tokens
    fields = ("token_ids", "logprobs", "entropies", "top_logprobs", "text", "finish_reason", "prompt_tokens")
    assert all(getattr(first, f) == getattr(second, f) for f in fields)


def test_a_reuse_block_inside_another_counts_its_own_tokens_and_the_outer_one_goes_on(twins: dict[str, Pipeline]) -> None:
    """A call cache's block (each computed call opens one) inside an engine block of the caller's: the inner call
    reuses the state the outer block kept and counts it, and after it the outer block reuses again and counts
    only its own tokens."""
    calls = twins["on"].lm
    raw = calls.inner  # type: ignore[attr-defined]
    raw.drop_prompt_states()
    request = GenerationRequest((Message("user", LONG_QUESTION + " (nested)"),), max_tokens=2)
    with raw.exact_prefix_reuse() as outer:
        raw.clear_cache()
        first = raw.generate([request])[0]
        assert outer.tokens == 0  # nothing kept before it
        raw.clear_cache()
        with calls.tally() as inner:  # type: ignore[attr-defined]
            calls.generate([request])
        assert inner.reused_tokens == first.prompt_tokens and outer.tokens == 0
        raw.clear_cache()
        raw.generate([request])
    assert outer.tokens == first.prompt_tokens and outer.seconds > 0


def test_an_answer_does_not_depend_on_the_questions_before_it(twins: dict[str, Pipeline]) -> None:
    rag = twins["on"]
    first = rag.answer(QUESTIONS[0], method="etc", max_tokens=24)
    rag.answer(QUESTIONS[1], method="etc", max_tokens=24)
    again = rag.answer(QUESTIONS[0], method="etc", max_tokens=24)
    assert _seen(first.trace) == _seen(again.trace)


def test_a_server_keeps_its_prompt_states_within_their_bound(smollm2_path: Path, tmp_path: Path) -> None:
    """160 distinct questions through one ``ragate serve`` process: the kept states stay under
    ``--prompt-state-mb`` (8 MB, reached within the first ten questions) and the process does not grow with the
    questions (unbounded, each question would keep about a megabyte: the last 100 would add about 100 MB)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_service import _serve, _stop

    log = tmp_path / "serve.log"
    proc, url = _serve(["--method", "no-retrieval", "--prompt-state-mb", "8"], log, env={"RAGATE_API_KEY": ""})
    try:
        rss = {}
        with httpx.Client(base_url=url, timeout=60) as client:
            for i in range(160):
                body = {"question": f"What is the number {i} known for in mathematics?", "options": {"max_tokens": 1}}
                assert client.post("/v1/answer", json=body).status_code == 200
                if i + 1 in (60, 160):
                    rss[i + 1] = _rss_mb(proc)
                    states = client.get("/healthz").json()["prompt_states"]
                    assert states["max_bytes"] == 8 * 2**20 and 0 < states["bytes"] <= states["max_bytes"]
                    assert 0 < states["kept"] < 30  # about 1 MB each under an 8 MB bound
        assert rss[160] - rss[60] < 64, rss  # 100 more questions, well under a megabyte each
    finally:
        _stop(proc)


def _rss_mb(proc: subprocess.Popen[bytes]) -> float:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")
