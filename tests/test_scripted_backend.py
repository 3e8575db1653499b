"""The scripted backend (for exact unit tests of methods): it answers from a script and records every call."""

from __future__ import annotations

import math

import pytest

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.errors import CapabilityError
from ragate.types import GenerationRequest


def test_make_generation_fills_offsets_and_tops() -> None:
    gen = make_generation(["Jane", " Austen"], [math.log(0.9), math.log(0.5)])
    assert gen.text == "Jane Austen" and gen.offsets == ((0, 4), (4, 11))
    assert gen.top_logprobs[1][0].token == " Austen"
    entropies, exact = gen.step_entropies()
    assert not exact  # only top-1 known: the labelled top-k approximation
    assert entropies[1] == pytest.approx(-2 * 0.5 * math.log(0.5))


def test_scripted_backend_counts_calls_and_answers_in_order() -> None:
    gens = [make_generation(["a"], [-0.1]), make_generation(["b"], [-0.2])]
    backend = ScriptedBackend(gens)
    out = backend.generate([GenerationRequest("q1"), GenerationRequest("q2")])
    assert [g.text for g in out] == ["a", "b"]
    assert [r.prompt for r in backend.calls] == ["q1", "q2"]
    with pytest.raises(AssertionError, match="ran out"):
        backend.generate([GenerationRequest("q3")])


def test_scripted_backend_from_a_function_and_capability_checks() -> None:
    backend = ScriptedBackend(lambda r: make_generation([str(r.max_tokens)], [0.0]))
    assert backend.generate([GenerationRequest("x", max_tokens=7)])[0].text == "7"
    with pytest.raises(CapabilityError, match="attentions"):
        backend.generate([GenerationRequest("x", attentions=True)])
    with pytest.raises(TypeError, match="list"):
        backend.generate(GenerationRequest("x"))  # type: ignore[arg-type]
