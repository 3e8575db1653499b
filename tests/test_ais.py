"""AIS scoring (DTR Eq. 7, PAIRS Eqs. 1, 4, 5, 8) on known vectors, including the s = +-1 edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragate.selection.ais import (
    DYNAMIC_ALPHA_CODE,
    ais_scores,
    cos_sum_angles,
    dynamic_alpha,
    top_k_stable,
)

S1 = np.array([1.0, 0.6, 0.5, 1.0, 0.0, -1.0])
S2 = np.array([1.0, 0.8, 0.5, 0.0, 0.0, -1.0])


def test_cos_hand_computed() -> None:
    # (1,1): theta sum 0 -> 1; (0.6,0.8): 0.48 - 0.8*0.6 = 0 (theta1+theta2 = pi/2 exactly);
    # (0.5,0.5): 0.25 - 0.75 = -0.5; (1,0): 0; (0,0): -1 (pi/2 + pi/2 = pi); (-1,-1): 2*pi -> clamped to -1
    assert ais_scores(S1, S2, "cos") == pytest.approx([1.0, 0.0, -0.5, 0.0, -1.0, -1.0], abs=1e-12)


def test_cos_literal_shows_the_edge_case_it_gets_wrong() -> None:
    literal = ais_scores(S1, S2, "cos-literal")
    assert literal[-1] == pytest.approx(1.0)  # a document opposite to both q and p would score best
    assert literal[:-1] == pytest.approx(ais_scores(S1, S2, "cos")[:-1], abs=1e-12)


def test_sum() -> None:
    assert ais_scores(S1, S2, "sum") == pytest.approx([2.0, 1.4, 1.0, 1.0, 0.0, -2.0])


def test_dynamic_alpha_and_score() -> None:
    # <q,p> = 0 -> theta0 = pi/2: paper alpha = 0.058*pi/2 + 0.455, code 0.05848*pi/2 + 0.45520
    assert dynamic_alpha(0.0) == pytest.approx(0.546106, abs=1e-6)
    assert dynamic_alpha(0.0, DYNAMIC_ALPHA_CODE) == pytest.approx(0.547061, abs=1e-6)
    assert dynamic_alpha(1.0) == pytest.approx(0.455)  # p = q
    alpha = dynamic_alpha(0.0)
    scores = ais_scores(S1, S2, "dynamic", qp_similarity=0.0)
    assert scores[0] == pytest.approx(0.0)  # both angles 0
    assert scores[3] == pytest.approx(-(1 - alpha) * math.pi / 2)  # theta1 = 0, theta2 = pi/2
    assert scores[5] == pytest.approx(-math.pi)  # both pi
    with pytest.raises(ValueError, match="qp_similarity"):
        ais_scores(S1, S2, "dynamic")


def test_similarities_a_hair_outside_unit_interval_are_clipped() -> None:
    out = ais_scores(np.array([1.0000001]), np.array([1.0000001]), "cos")
    assert out == pytest.approx([1.0]) and not np.isnan(out).any()


def test_top_k_stable_keeps_candidate_order_on_ties() -> None:
    assert list(top_k_stable(np.array([0.5, 0.9, 0.5, 0.9]), 3)) == [1, 3, 0]
    assert list(top_k_stable(np.array([0.1]), 5)) == [0]


unit = st.floats(-1.0, 1.0, allow_nan=False)


@given(unit, unit)
def test_cos_is_symmetric_bounded_and_ranks_like_minus_angle_sum(a: float, b: float) -> None:
    s = float(cos_sum_angles(a, b))
    assert -1.0 - 1e-12 <= s <= 1.0 + 1e-12
    assert s == pytest.approx(float(cos_sum_angles(b, a)), abs=1e-12)
    # with the clamp, cos(theta1+theta2) is decreasing in the angle sum
    theta = math.acos(a) + math.acos(b)
    assert s == pytest.approx(math.cos(min(theta, math.pi)), abs=1e-9)
