"""Budget calibration (TARG section 3.3) and the gate-only call it scores with."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.methods import decide, get_method, run_method
from ragate.tuning.calibrate import retrieval_rate, threshold_for_budget


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


# -- conservative calibration (issue H.1) ----------------------------------------------------------------------


def test_the_conservative_threshold_is_the_first_order_statistic_the_binomial_allows() -> None:
    from scipy.stats import binom

    from ragate.tuning.calibrate import conservative_threshold

    scores = [i / 100 for i in range(100)]  # 0.00 .. 0.99
    bound = conservative_threshold(scores, 0.2, 0.95)
    k = bound.k
    assert binom.cdf(k - 1, 100, 0.8) >= 0.95 > binom.cdf(k - 2, 100, 0.8)
    assert bound.tau == scores[k - 1] and k > 80  # above the plain quantile's 80th score
    assert (
        retrieval_rate(scores, bound.tau) < 0.2 == retrieval_rate(scores, threshold_for_budget(scores, 0.2))
    )
    low, high = bound.rate_interval
    assert low < bound.expected_rate == (100 - k + 1) / 101 < high < 0.2 + 0.05


@pytest.mark.parametrize("ties", [False, True])
def test_the_conservative_threshold_exceeds_the_budget_in_at_most_delta_of_dev_sets(ties: bool) -> None:
    """2,000 dev sets of 200 scores: the plain quantile overshoots the true rate about half the time, the
    conservative threshold in at most 5% (+ Monte Carlo error), also when scores tie (a 5-valued gate)."""
    import numpy as np

    from ragate.tuning.calibrate import conservative_threshold

    rng = np.random.default_rng(0)
    budget, delta = 0.3, 0.05
    plain_over = conservative_over = 0
    trials = 2000
    for _ in range(trials):
        dev = rng.random(200)
        if ties:
            dev = np.floor(dev * 5) / 5  # values 0, .2, .4, .6, .8: the true rate above tau is 0.8 - tau

        def true_rate(tau: float) -> float:
            return max(0.0, 0.8 - tau) if ties else 1.0 - tau

        plain_over += true_rate(threshold_for_budget(dev, budget)) > budget
        conservative_over += true_rate(conservative_threshold(dev, budget, 1 - delta).tau) > budget
    if not ties:
        assert 0.35 < plain_over / trials < 0.65
    assert conservative_over / trials <= delta + 0.015


def test_too_few_dev_questions_for_the_confidence_is_a_named_error() -> None:
    from ragate.tuning.calibrate import conservative_threshold

    with pytest.raises(
        ValueError, match="cannot bound a retrieval rate of 0.05 at confidence 0.95: score at least 59"
    ):
        conservative_threshold([0.1] * 20, 0.05, 0.95)
    for budget, confidence in ((0.0, 0.9), (1.0, 0.9), (0.3, 1.0), (0.3, 0.0)):
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            conservative_threshold([0.1, 0.2], budget, confidence)


def test_the_batch_bound_holds_for_the_realised_rate_of_a_finite_test_set() -> None:
    """The population bound covers the dev draw only: on test sets of 100 it is over budget more often than
    delta. The batch bound (beta-binomial) covers the test set's noise too."""
    import numpy as np

    from ragate.tuning.calibrate import conservative_threshold

    rng = np.random.default_rng(1)
    budget, delta, trials = 0.3, 0.05, 2000
    over = {"population": 0, "batch": 0}
    for _ in range(trials):
        dev, test = rng.random(150), rng.random(100)
        for how, batch in (("population", None), ("batch", 100)):
            tau = conservative_threshold(dev, budget, 1 - delta, batch=batch).tau
            over[how] += float(np.mean(test > tau)) > budget
    assert over["batch"] / trials <= delta + 0.015 < over["population"] / trials
    with pytest.raises(ValueError, match="batch must be"):
        conservative_threshold([0.1, 0.2], 0.3, 0.9, batch=0)


def test_a_calibration_of_another_gate_or_model_is_refused(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    from pathlib import Path

    from ragate.cli.main import main

    cal = Path(str(tmp_path)) / "cal.json"
    base = ["eval", "--dataset", "demo", "--limit", "1", "--out", str(Path(str(tmp_path)) / "run")]
    cal.write_text(json.dumps({"method": "targ-margin", "tau": 0.3, "model": None, "engine": "llama.cpp"}))
    assert main([*base, "--methods", "dtr", "--calibration", str(cal)]) == 2
    assert "calibrates 'targ-margin', which this run does not evaluate (dtr)" in capsys.readouterr().err
    cal.write_text(
        json.dumps({"method": "dtr", "tau": 0.3, "model": "qwen2.5-coder-1.5b", "engine": "llama.cpp"})
    )
    assert main([*base, "--methods", "dtr", "--calibration", str(cal)]) == 2
    assert (
        "calibrated with model 'qwen2.5-coder-1.5b', this run uses the default model"
        in capsys.readouterr().err
    )


def test_cross_fitted_taus_never_use_the_questions_own_scores() -> None:
    from ragate.tuning.calibrate import cross_fitted_taus, halves, threshold_for_budget

    ids = [f"q{i}" for i in range(8)]
    scores = [0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6, 0.4]
    half = halves(ids)
    assert sorted(half) == [0, 0, 0, 0, 1, 1, 1, 1]  # balanced
    assert halves(ids[::-1]) == half[::-1]  # by id, not by the order a run wrote the records in
    taus = cross_fitted_taus(scores, 0.5, half)
    for k in (0, 1):  # each half at the tau of the other half's scores
        other = [s for s, h in zip(scores, half) if h != k]
        assert {t for t, h in zip(taus, half) if h == k} == {threshold_for_budget(other, 0.5)}
    for i in range(len(scores)):  # moving one question's own score never moves its own threshold
        changed = [*scores[:i], 100.0, *scores[i + 1 :]]
        assert cross_fitted_taus(changed, 0.5, half)[i] == taus[i]
    with pytest.raises(ValueError, match="both halves"):
        cross_fitted_taus([0.5], 0.3, halves(["q0"]))


def test_a_budget_that_cuts_inside_one_of_two_modes_is_warned_with_both() -> None:
    """A mix of two kinds of question (e.g. 30 general and 70 document questions) scores in two groups; a budget of
    0.5 puts tau inside the document group, and the result says so, with both groups and the budget that routes
    by kind. At that budget there is no warning; nor for one spread of scores (normal or uniform)."""
    import numpy as np

    from ragate.eval.thresholds import threshold_from_scores, two_modes

    rng = np.random.default_rng(0)
    mix = [*rng.normal(0.2, 0.05, 30), *rng.normal(0.8, 0.05, 70)]
    warned = threshold_from_scores(mix, 0.5)["warning"]
    assert "two groups, 30 around 0.194" in warned and "70 around 0.808" in warned
    assert "cuts inside the upper one (70 questions)" in warned and "a budget of 0.70" in warned
    found = threshold_from_scores(mix, 0.7)  # the budget that routes by kind: the upper group exactly
    assert "warning" not in found and found["retrieval_rate"] == 0.7
    for seed in range(20):
        one = np.random.default_rng(seed)
        assert two_modes(one.normal(0.5, 0.2, 200).tolist()) is None
        assert threshold_from_scores(one.uniform(0, 1, 100).tolist(), 0.5).get("warning") is None


def test_threshold_for_budget_takes_the_budget_as_written() -> None:
    """1 - 0.7 is 0.30000000000000004 in floats: the quantile must not move one question up for it."""
    scores = [i / 100 for i in range(100)]
    assert retrieval_rate(scores, threshold_for_budget(scores, 0.7)) == 0.7


def test_calibrate_takes_threads() -> None:
    from ragate.cli.main import build_parser

    args = build_parser().parse_args(["calibrate", "--gate", "targ-margin", "--questions", "q.txt", "--budget",
                                      "0.3", "--threads", "1", "--batch-threads", "2"])  # fmt: skip
    assert (args.threads, args.batch_threads) == ("1", "2")
