"""The hint for a paper's tau used, uncalibrated, with another model: which gates' defaults are a paper's, a model's
size from its name, and one line per pipeline and gate (ask, serve and Pipeline), none once tau is set."""

from __future__ import annotations

import logging

import pytest

import ragate
from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.methods import get_method
from ragate.methods.paper_tau import model_size, tau_hint

TOKENS = ["Seven", " years", ".", "\n"]
LOGPROBS = [-0.9, -1.5, -0.4, -2.0]
TOPS = [
    [(t, lp), (alt, lp - 0.2)]
    for t, lp, alt in zip(TOKENS, LOGPROBS, ["Two", " days", "!", "."], strict=True)
]
DOCS = [{"text": "The Brewmaster 3000 kettle comes with a warranty of seven years.", "title": "warranty"}]


def _lm(model: str) -> ScriptedBackend:
    return ScriptedBackend(lambda _: make_generation(TOKENS, LOGPROBS, TOPS), model=model)


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("smollm2-135m", 0.135),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", 0.135),
        ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1.5),
        ("Meta-Llama-3.1-8B-Instruct", 8.0),
        ("Qwen2.5-7B-Instruct-1M", 7.0),
        ("gpt-4o-mini", None),
        ("/models/qwen2.5/model.gguf", None),
    ],
)
def test_a_model_size_is_read_from_its_name(name: str, size: float | None) -> None:
    assert model_size(name) == size


def test_which_defaults_are_a_papers_and_when_the_hint_applies() -> None:
    hint = tau_hint(get_method("targ-margin"), "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    assert hint is not None and "\n" not in hint
    assert hint.startswith("ragate: hint: targ-margin decides at tau = 0.25, TARG's value for Qwen2.5-7B")
    assert "ragate calibrate --gate targ-margin --questions FILE" in hint and "(1.5B)" in hint
    dtr = tau_hint(get_method("dtr"), "smollm2-135m")
    assert dtr is not None and "tau = 0.001, DTR's value" in dtr and "--gate dtr " in dtr
    assert "size unknown" in (tau_hint(get_method("targ-entropy-present"), "my-server-model") or "")
    assert tau_hint(get_method("targ-margin"), "Qwen2.5-7B-Instruct-Q4_K_M.gguf") is None  # the paper's size
    assert tau_hint(get_method("dtr"), "Llama-3-8B") is None
    assert tau_hint(get_method("targ-margin").with_threshold(0.3), "smollm2-135m") is None  # tau given
    for method in ("verbal-confidence", "self-eval", "standard-rag", "etc", "crag-lite"):  # not a paper's tau
        assert tau_hint(get_method(method), "smollm2-135m") is None, method


def _hints(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("ragate: hint:")]


def test_the_hint_appears_once_when_no_calibration_is_given(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ragate")
    with ragate.Pipeline("targ-margin", lm=_lm("smollm2-135m"), search=lambda q, k: DOCS) as rag:
        for question in ("How long is the warranty?", "Who sells the kettles?", "When is the desk open?"):
            rag.answer(question)
        rag.retrieve("Which kettles were recalled?")
        rag.decide("Where is the service desk?")
        assert len(_hints(caplog)) == 1 and "targ-margin decides at tau = 0.25" in _hints(caplog)[0]
        rag.answer("How long is the warranty?", method="dtr")  # another gate with a paper's tau: its own line
        rag.answer("How long is the warranty?", method="dtr")
    assert len(_hints(caplog)) == 2 and "dtr decides at tau = 0.001" in _hints(caplog)[1]


@pytest.mark.parametrize(
    "options",
    [{"threshold": 0.3}, {"budget": 0.5}],
    ids=["threshold", "budget"],
)
def test_no_hint_once_tau_is_set(caplog: pytest.LogCaptureFixture, options: dict[str, float]) -> None:
    caplog.set_level(logging.WARNING, logger="ragate")
    with ragate.Pipeline("targ-margin", lm=_lm("smollm2-135m"), search=lambda q, k: DOCS, **options) as rag:
        rag.answer("How long is the warranty?")
        rag.decide("Who sells the kettles?")
    assert _hints(caplog) == []


def test_calibrating_gives_no_hint_and_sets_tau(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ragate")
    with ragate.Pipeline("targ-margin", lm=_lm("smollm2-135m"), search=lambda q, k: DOCS) as rag:
        with pytest.warns(RuntimeWarning, match="distinct score"):  # the scripted model scores alike
            rag.calibrate(["How long is the warranty?", "Who sells the kettles?"], budget=0.5)  # no hint
        rag.answer("How long is the warranty?")  # at the calibrated tau
        rag.answer("Which kettles were recalled?", threshold=0.2)  # a call's own tau
    assert _hints(caplog) == []
