"""The uncertainty formulas against hand-computed values, plus properties that must hold for any input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragate.uncertainty import (
    disagreement,
    entropy,
    log_softmax,
    margin,
    margin_uncertainty,
    mean_entropy,
    mean_margin_uncertainty,
    normalised_nll,
    topk_entropy,
)

LN2 = math.log(2)

# ---- hand-computed values --------------------------------------------------------------------------------------


def test_entropy_of_known_distributions() -> None:
    # p = (1/2, 1/4, 1/4): H = 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2
    assert entropy(np.log([0.5, 0.25, 0.25])) == pytest.approx(1.5 * LN2, abs=1e-12)
    assert entropy(np.log([0.25] * 4)) == pytest.approx(math.log(4), abs=1e-12)
    assert entropy([0.0, -np.inf, -np.inf]) == pytest.approx(0.0, abs=1e-12)  # a certain step
    # raw logits work too: logits (2, 2) are a fair coin
    assert entropy([2.0, 2.0]) == pytest.approx(LN2, abs=1e-12)


def test_topk_entropy_is_labelled_lower_bound() -> None:
    # top-2 of (1/2, 1/4, 1/8, 1/8): the tail 1/4 is one bucket, so H_k = H(1/2, 1/4, 1/4) = 1.5 ln 2
    full = entropy(np.log([0.5, 0.25, 0.125, 0.125]))
    approx = topk_entropy(np.log([0.5, 0.25]))
    assert approx == pytest.approx(1.5 * LN2, abs=1e-12)
    assert full == pytest.approx(1.75 * LN2, abs=1e-12)
    assert approx < full
    # complete top-k: exact
    assert topk_entropy(np.log([0.5, 0.5])) == pytest.approx(LN2, abs=1e-12)
    with pytest.raises(ValueError, match="> 1"):
        topk_entropy([0.0, 0.0])  # probabilities 1 + 1


def test_margin_and_link() -> None:
    assert margin([-0.1, -2.5, -3.0]) == pytest.approx(2.4)
    assert margin([-2.5, -0.1]) == pytest.approx(2.4)  # order does not matter
    assert margin_uncertainty(0.0) == 1.0
    assert margin_uncertainty(3.0, beta=3.0) == pytest.approx(math.exp(-1))
    assert margin_uncertainty(6.0) == pytest.approx(math.exp(-2))  # beta defaults to 3 (TARG)
    # U_mar over gaps (0, 3, 6) with beta 3: (1 + e^-1 + e^-2) / 3
    expected = (1 + math.exp(-1) + math.exp(-2)) / 3
    assert mean_margin_uncertainty([0.0, 3.0, 6.0]) == pytest.approx(expected)
    assert mean_margin_uncertainty([0.0, 3.0, 6.0], k=1) == 1.0
    with pytest.raises(ValueError, match="top-2"):
        margin([-0.1])
    with pytest.raises(ValueError, match="beta"):
        margin_uncertainty(1.0, beta=0)


def test_mean_entropy_prefix() -> None:
    assert mean_entropy([1.0, 2.0, 3.0, 10.0], k=3) == pytest.approx(2.0)
    assert mean_entropy([1.0, 2.0], k=20) == pytest.approx(0.15)  # a draft shorter than k: Eq. 1 divides by k
    assert mean_entropy([1.0, 2.0], k=20, divide_by="present") == pytest.approx(1.5)  # before issue 51
    with pytest.raises(ValueError, match="empty draft"):
        mean_entropy([], k=20)


def test_normalised_nll() -> None:
    # DTR Eq. 3: probabilities 0.5 and 0.25 -> u = (ln 2 + ln 4) / 2 = 1.5 ln 2
    assert normalised_nll([math.log(0.5), math.log(0.25)]) == pytest.approx(1.5 * LN2)
    assert normalised_nll([0.0, 0.0]) == 0.0
    with pytest.raises(ValueError, match="empty answer"):
        normalised_nll([])


def test_disagreement_hand_computed() -> None:
    samples = [["a", "b", "c"], ["a", "b", "d"], ["a", "x", "c"], ["a", "b", "c"], ["a", "b"]]
    # step 1: all 'a' -> 0; step 2: b x4 -> 1 - 4/5 = 0.2; step 3: c x3, d, <end> -> 1 - 3/5 = 0.4
    assert disagreement(samples) == pytest.approx((0 + 0.2 + 0.4) / 3)
    assert disagreement(samples, k=2) == pytest.approx(0.1)
    assert disagreement([[1, 2], [1, 2]]) == 0.0
    assert disagreement([[], []]) == 0.0
    # all different at every step: (N-1)/N, TARG Lemma 2's bound
    assert disagreement([[i] for i in range(5)]) == pytest.approx(4 / 5)


# ---- properties ------------------------------------------------------------------------------------------------

logits_vectors = st.lists(st.floats(-30, 30, allow_nan=False), min_size=2, max_size=50)


@given(logits_vectors)
def test_entropy_bounds(logits: list[float]) -> None:
    h = entropy(logits)
    assert -1e-9 <= h <= math.log(len(logits)) + 1e-9


@given(logits_vectors, st.integers(1, 10))
def test_topk_entropy_never_exceeds_exact(logits: list[float], k: int) -> None:
    lp = log_softmax(np.asarray(logits))
    top = np.sort(lp)[::-1][:k]
    assert topk_entropy(top) <= entropy(lp) + 1e-9


@given(logits_vectors)
def test_margin_link_in_unit_interval_and_decreasing(logits: list[float]) -> None:
    lp = log_softmax(np.asarray(logits))
    g = margin(list(lp))
    assert g >= 0
    u = margin_uncertainty(g)
    assert 0 < u <= 1
    assert margin_uncertainty(g + 1.0) < u or u < 1e-300


@given(st.lists(st.floats(-50, 0, allow_nan=False), min_size=1, max_size=40))
def test_nll_nonnegative_and_bounded_by_worst_token(logprobs: list[float]) -> None:
    u = normalised_nll(logprobs)
    assert -1e-12 <= u <= -min(logprobs) + 1e-9


@settings(max_examples=200)
@given(st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=7), st.integers(1, 8))
def test_disagreement_bounds(samples: list[list[int]], k: int) -> None:
    n = len(samples)
    d = disagreement(samples, k=k)
    assert 0 <= d <= (n - 1) / n + 1e-12
    # identical samples never disagree
    assert disagreement([samples[0]] * n, k=k) == 0.0
