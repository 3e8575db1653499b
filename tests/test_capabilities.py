"""Issue I: what each backend can give and what each method needs; text-only gates; top-k entropy estimators."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragate.backends.base import Capabilities
from ragate.backends.scripted import SCRIPTED_CAPABILITIES, TEXT_ONLY, ScriptedBackend, text_generation
from ragate.errors import CapabilityError, RagateError
from ragate.gates.registry import gate_names
from ragate.gates.verbal import parse_guess, parse_probability, verbal_confidence
from ragate.methods import METHODS, get_method, run_method
from ragate.methods.needs import capability_report, method_support, require
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index
from ragate.retrieval.types import Retriever
from ragate.types import GenerationRequest
from ragate.uncertainty import entropy, log_softmax, topk_entropy


@pytest.fixture(scope="module")
def demo() -> Iterator[Retriever]:
    with open_index(demo_index()) as retriever:
        yield retriever


FULL = replace(SCRIPTED_CAPABILITIES, top_k=100, full_distribution=True)
TOP1 = replace(SCRIPTED_CAPABILITIES, top_k=1)


def _text_lm(reply: str = "Guess: Paris\nProbability: 0.9") -> ScriptedBackend:
    """A backend that returns text only, as an API without logprobs does; it fails any request for top-k."""

    def script(request: GenerationRequest) -> object:
        assert request.top_logprobs == 0, "a text-only backend was asked for alternatives"
        return text_generation(reply if "probability" in str(request.prompt).lower() else "Paris")

    return ScriptedBackend(script, capabilities=TEXT_ONLY)  # type: ignore[arg-type]


def test_support_of_every_gate_on_each_kind_of_backend() -> None:
    text = capability_report(TEXT_ONLY)["gates"]
    builtin = {g: text[g] for g in gate_names(builtin_only=True)}  # a test module may have registered more
    assert builtin == {
        "never": "exact", "always": "exact", "random": "exact", "ugt": "unavailable", "pairs": "exact",
        "pairs-exclude-num": "exact", "pairs-embedding": "exact", "pairs-lenient": "exact", "targ-entropy": "unavailable",
        "targ-margin": "unavailable", "targ-entropy-present": "unavailable", "targ-margin-present": "unavailable",
        "targ-entropy@k=5": "unavailable", "targ-entropy@k=10": "unavailable", "targ-margin@k=5": "unavailable",
        "targ-margin@k=10": "unavailable",
        "targ-variance": "approximate", "llm-judge": "text", "verbal-confidence": "exact",
        "self-eval": "text", "self-rag-lite": "text", "skr": "exact", "retrieval-top1": "exact", "retrieval-gap": "exact",
        "retrieval-dispersion": "exact", "question-length": "exact", "question-numeric": "exact",
        "question-rarity": "exact", "no-model-lr": "exact", "corpus-coverage": "exact",
        "corpus-or-margin": "unavailable", "proxy-margin": "exact", "proxy-entropy": "exact",
        "learned": "unavailable",
    }  # fmt: skip
    assert set(text) == set(gate_names())
    top20 = capability_report(SCRIPTED_CAPABILITIES)["gates"]
    assert top20["targ-entropy"] == "approximate" and top20["targ-margin"] == top20["ugt"] == "exact"
    top1 = capability_report(TOP1)["gates"]
    assert top1["targ-margin"] == "unavailable" and top1["llm-judge"] == "text"
    assert set(capability_report(FULL)["gates"].values()) == {"exact"}
    no_sampling = replace(TEXT_ONLY, sampling=False)
    assert method_support(get_method("targ-variance"), no_sampling)[0] == "unavailable"


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_on_a_text_only_backend_errs_clearly_or_runs(name: str, demo: Retriever) -> None:
    """Each gate family against a backend stripped of logprobs: the named error, or a run whose scores come from
    text (never a silent score computed from missing logprobs)."""
    spec = METHODS[name]
    status, _ = method_support(spec, TEXT_ONLY)
    lm = _text_lm()
    if status == "unavailable":
        with pytest.raises(CapabilityError) as e:
            run_method(spec, "Where is the Louvre?", lm, None)
        message = str(e.value)
        assert (
            "no logprobs" in message
            and "Methods that run on it:" in message
            and "verbal-confidence" in message
        )
        assert not lm.calls  # refused before any call was paid
        # a single-shot method may keep its selector with another gate; a dynamic or route method has none to swap
        assert ("--fallback" in message) == (spec.dynamic is None and spec.route is None), message
    elif spec.gate.kind == "skr":  # runs text-only, given a label set (tests/test_targ_baselines.py)
        with pytest.raises(RagateError, match="pass --skr-labels FILE"):
            run_method(spec, "Where is the Louvre?", lm, demo)
        assert not lm.calls
    elif spec.gate.kind == "no-model-lr":  # runs text-only, given weights (tests/test_nomodel_gates.py)
        with pytest.raises(RagateError, match="pass --gate-weights FILE"):
            run_method(spec, "Where is the Louvre?", lm, demo)
        assert not lm.calls
    elif spec.gate.kind.startswith("proxy-"):  # runs text-only beside a proxy (tests/test_proxy_gate.py)
        with pytest.raises(RagateError, match="none is open beside 'scripted'"):
            run_method(spec, "Where is the Louvre?", lm, demo)
        assert not lm.calls
    elif spec.selector.kind in ("dpr-ais-rerank", "rerank"):  # run with a cross-encoder (tests/test_dpr.py)
        with pytest.raises(RagateError, match="--cross-encoder DIR"):
            run_method(spec, "Where is the Louvre?", lm, demo)
        assert not lm.calls
    else:
        trace = run_method(spec, "Where is the Louvre?", lm, demo)
        assert trace.answer and trace.gate.reason
        if spec.gate.kind == "llm-judge":
            assert "no logprobs" in trace.gate.reason


def test_fallback_runs_the_named_gate_and_says_so() -> None:
    spec = require(get_method("targ-entropy"), TEXT_ONLY, engine="openai", fallback="verbal-confidence")
    assert spec.name == "targ-entropy:fallback=verbal-confidence" and spec.gate.kind == "verbal-confidence"
    assert spec.selector == get_method("targ-entropy").selector  # the method keeps its selector and prompts
    trace = run_method(spec, "Where is the Louvre?", _text_lm(), None)
    assert trace.method == spec.name and not trace.retrieved and trace.answer == "Paris"
    assert "stated probability 0.9" in trace.gate.reason
    with pytest.raises(CapabilityError, match="fallback gate 'ugt' cannot run either"):
        require(get_method("targ-entropy"), TEXT_ONLY, engine="openai", fallback="ugt")
    with pytest.raises(CapabilityError, match="unknown fallback gate"):
        require(get_method("targ-entropy"), TEXT_ONLY, engine="openai", fallback="entropy")
    with pytest.raises(CapabilityError, match="dynamic method"):
        require(get_method("etc"), TEXT_ONLY, engine="openai", fallback="pairs")
    assert require(get_method("dtr"), SCRIPTED_CAPABILITIES, engine="x", fallback="pairs").name == "dtr"


def test_requests_ask_only_for_what_the_backend_gives(demo: Retriever) -> None:
    lm = _text_lm("Guess: Rome\nProbability: 20%")
    trace = run_method(get_method("verbal-confidence"), "Capital of Italy?", lm, demo)
    assert trace.retrieved and trace.gate.score == pytest.approx(0.8) and len(trace.documents) == 3
    assert all(c.top_logprobs == 0 for c in lm.calls)


@pytest.mark.parametrize(
    ("reply", "p", "guess"),
    [
        ("Guess: Paris\nProbability: 0.9", 0.9, "Paris"),
        ("Guess: 1912\nConfidence: 80%", 0.8, "1912"),
        ("Paris, probability 0.3", 0.3, "Paris"),
        ("Guess: Bob\nProbability: very high", 0.9, "Bob"),
        ("Guess: x\nProbability: 4 out of 5", 0.8, "x"),
        ("Guess: Marie Curie\nProbability: .65", 0.65, "Marie Curie"),
        ("Guess: 42\nProbability: 85", 0.85, "42"),
        ("Guess: 42\nProbability: 850", None, "42"),
        ("I do not know", None, "I do not know"),
    ],
)
def test_verbal_confidence_parses_stated_probabilities(reply: str, p: float | None, guess: str) -> None:
    assert parse_probability(reply) == (None if p is None else pytest.approx(p))
    assert parse_guess(reply) == guess
    d = verbal_confidence(reply, 0.5)
    assert d.retrieve == (p is None or 1 - p > 0.5)
    assert d.score == pytest.approx(1.0 if p is None else 1 - p)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-8, 8, allow_nan=False), min_size=30, max_size=300),
    st.integers(1, 25),
)
def test_topk_entropy_estimators_bound_the_exact_entropy(logits: list[float], k: int) -> None:
    lp = log_softmax(np.array(logits))
    exact = entropy(lp)
    top = sorted(lp.tolist(), reverse=True)[:k]
    lumped = topk_entropy(top, "lumped")
    capped = topk_entropy(top, "capped")
    uniform = topk_entropy(top, "uniform", vocab_size=len(lp)) if k < len(lp) else exact
    assert lumped <= capped + 1e-9 <= exact + 2e-9 <= uniform + 3e-9
    if k >= len(lp):
        assert math.isclose(lumped, exact, abs_tol=1e-9)


def test_a_dynamic_method_the_backend_cannot_run_is_not_offered_a_fallback_gate() -> None:
    """`ragate ask --method ircot` over a chat endpoint was told to keep its selector with `--fallback GATE`,
    which then refused it: a dynamic method has no gate to swap."""
    chat = replace(SCRIPTED_CAPABILITIES, continues=False)
    for caps, why in ((chat, "cannot continue the model's own text"), (TEXT_ONLY, "returns no logprobs")):
        with pytest.raises(CapabilityError) as refused:
            require(get_method("ircot"), caps, engine="openai")
        said = str(refused.value)
        assert said.startswith("method 'ircot' cannot run on the openai backend") and why in said, said
        assert "--fallback" not in said and "Methods that run on it: " in said


def test_capability_error_on_too_few_alternatives_names_the_numbers() -> None:
    caps = Capabilities(
        logprobs=True, top_k=1, attentions=False, sampling=False, chat_template=True, full_distribution=False,
        token_ids=False, prefix_cache=False,
    )  # fmt: skip
    with pytest.raises(CapabilityError, match="top-1 logprobs, 2 are needed"):
        require(get_method("targ-margin"), caps, engine="openai")


def test_eval_refuses_before_answering_or_records_the_fallback(tmp_path: Path) -> None:
    from ragate.eval.datasets import load_dataset
    from ragate.eval.run import EvalConfig, run_eval

    examples = load_dataset("demo", limit=2)
    lm = _text_lm("Guess: Paris\nProbability: 0.95")
    with pytest.raises(CapabilityError, match="'dtr' needs token logprobs"):
        run_eval(
            EvalConfig("demo", ("dtr",), limit=2), tmp_path / "a", lm=lm, examples=examples, progress=False
        )
    assert not lm.calls and not (tmp_path / "a" / "questions.jsonl").exists()
    config = EvalConfig("demo", ("dtr",), limit=2, fallback="verbal-confidence")
    results = run_eval(config, tmp_path / "b", lm=lm, examples=examples, progress=False)
    (row,) = results["summary"]
    assert row["method"] == "dtr" and row["n"] == 2 and row["retrieval_rate"] == 0
    assert results["config"]["fallback"] == "verbal-confidence"


def test_targ_variance_on_a_text_only_backend_compares_words_not_nothing() -> None:
    """Without per-token output the sampled drafts' words stand in for their tokens: disagreement is measured,
    not read as an empty draft (which would retrieve for every question)."""
    texts = ["Paris is the capital", "Paris is a city", "Lyon is the capital", "Paris is the capital"]

    def script(request: GenerationRequest) -> object:
        seed = request.seed or 0
        return text_generation("Paris is the capital" if request.greedy else texts[seed % len(texts)])

    spec = get_method("targ-variance").with_(gate=replace(get_method("targ-variance").gate, samples=4))
    trace = run_method(spec, "Capital of France?", ScriptedBackend(script, capabilities=TEXT_ONLY), None)
    # words 1-4: (Paris x3, Lyon) -> 1/4; (is x4) -> 0; (the x3, a) -> 1/4; (capital x3, city) -> 1/4
    assert trace.gate.score == pytest.approx(0.75 / 4) and "words" in trace.gate.reason
    assert not trace.retrieved and trace.answer == "Paris is the capital"
