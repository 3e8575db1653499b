"""Budget calibration (TARG section 3.3) and the gate-only call it scores with."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.eval.calibrate import retrieval_rate, threshold_for_budget
from ragate.methods import decide, get_method, run_method


def test_threshold_for_budget_hand_values() -> None:
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert threshold_for_budget(scores, 0.2) == 0.8  # 0.9 and 1.0 lie above: 2 of 10
    assert threshold_for_budget(scores, 0.0) == 1.0  # nothing above the largest
    assert retrieval_rate(scores, threshold_for_budget(scores, 1.0)) == 1.0
    assert threshold_for_budget(scores, 0.25) == 0.8  # 0.25 * 10 is not whole: stay within budget


@given(st.lists(st.floats(-5, 5), min_size=1, max_size=60), st.floats(0, 1))
def test_calibrated_rate_never_exceeds_the_budget(scores: list[float], budget: float) -> None:
    assert retrieval_rate(scores, threshold_for_budget(scores, budget)) <= budget + 1e-12


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_budget_outside_unit_interval_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="budget"):
        threshold_for_budget([0.1], bad)


def test_no_scores_is_refused() -> None:
    with pytest.raises(ValueError, match="no dev scores"):
        threshold_for_budget([], 0.5)


def test_decide_pays_only_for_the_gate_and_scores_like_run_method() -> None:
    unsure = make_generation(["Maybe", " Bob"], [-2.0, -3.0])
    lm = ScriptedBackend([unsure])
    decision = decide(get_method("dtr"), "Who?", lm)
    assert len(lm.calls) == 1 and decision.retrieve  # the draft only: no retrieval, no answer
    judge = ScriptedBackend([make_generation(["Yes"], [-0.1])])
    assert decide(get_method("llm-judge"), "Who?", judge).retrieve is True and len(judge.calls) == 1
    spec = get_method("dtr")
    calm = spec.with_(gate=replace(spec.gate, threshold=10.0))
    lm2 = ScriptedBackend([unsure])
    trace = run_method(calm, "Who?", lm2, None)
    assert trace.gate.score == decision.score == pytest.approx(2.5) and not trace.retrieved
