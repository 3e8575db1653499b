"""Adaptive information selection (AIS): score a candidate document by its similarity to the question q and to
the model-written pseudo-context p, both cosines of L2-normalised embeddings.

With s1 = <d, q> = cos(theta1) and s2 = <d, p> = cos(theta2):

- ``cos`` (DTR Eq. 7 = PAIRS Eq. 4, the papers' form and ragate's default):
  s(d) = cos(theta1 + theta2) = s1*s2 - sqrt(1 - s1^2)*sqrt(1 - s2^2).
  Eq. 7 rises again once theta1 + theta2 > pi (s1 = s2 = -1 would score +1, the best possible); ragate clamps the
  angle sum at pi, which equals Eq. 7 whenever theta1 + theta2 <= pi (always when s1, s2 >= 0).
  ``cos-literal`` keeps the printed formula for comparison.
- ``sum`` (DTR Eq. 4 = PAIRS Eq. 1; what the DTR authors' code ranks by): s(d) = s1 + s2.
- ``dynamic`` (PAIRS Eqs. 5 and 8): alpha = 0.058*theta0 + 0.455 with theta0 = angle(q, p) in radians;
  s(d) = -(alpha*theta1 + (1 - alpha)*theta2). The authors' code fits 0.05848 and 0.45520 (``DYNAMIC_ALPHA_CODE``).

Similarities are clipped to [-1, 1] before ``arccos``, as floating-point inner products of unit vectors can
leave the interval by an ulp.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

AISScore = Literal["cos", "cos-literal", "sum", "dynamic"]
AIS_SCORES: tuple[AISScore, ...] = ("cos", "cos-literal", "sum", "dynamic")
DYNAMIC_ALPHA_PAPER = (0.058, 0.455)  # PAIRS Eq. 8
DYNAMIC_ALPHA_CODE = (0.05848, 0.45520)  # the authors' fit, agent/reranker.py in ChenWangHKU/DTR


def _clip(x: np.ndarray | float) -> np.ndarray:
    return np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0)


def cos_sum_angles(s1: np.ndarray | float, s2: np.ndarray | float, *, clamp: bool = True) -> np.ndarray:
    """cos(theta1 + theta2) from the two cosines (DTR Eq. 7); ``clamp`` caps the angle sum at pi (see module)."""
    a, b = _clip(s1), _clip(s2)
    literal = a * b - np.sqrt(1.0 - a * a) * np.sqrt(1.0 - b * b)
    if not clamp:
        return literal
    return np.where(np.arccos(a) + np.arccos(b) > np.pi, -1.0, literal)


def dynamic_alpha(qp_similarity: float, coefficients: tuple[float, float] = DYNAMIC_ALPHA_PAPER) -> float:
    """alpha = a*theta0 + b (PAIRS Eq. 8), theta0 = arccos <q, p> in radians; in [0.455, 0.637] for the paper's fit."""
    slope, intercept = coefficients
    return float(slope * np.arccos(_clip(qp_similarity)) + intercept)


def dynamic_score(s1: np.ndarray | float, s2: np.ndarray | float, alpha: float) -> np.ndarray:
    """-(alpha*theta1 + (1 - alpha)*theta2) (PAIRS Eq. 5, negated so that higher is better)."""
    return -(alpha * np.arccos(_clip(s1)) + (1.0 - alpha) * np.arccos(_clip(s2)))


def ais_scores(
    s1: np.ndarray,
    s2: np.ndarray,
    score: AISScore = "cos",
    *,
    qp_similarity: float | None = None,
    alpha_coefficients: tuple[float, float] = DYNAMIC_ALPHA_PAPER,
) -> np.ndarray:
    """Scores of candidates with similarities ``s1`` to the question and ``s2`` to the pseudo-context.

    ``dynamic`` needs ``qp_similarity`` = <q, p>, from which alpha is computed (PAIRS Eq. 8).
    """
    if score == "cos":
        return cos_sum_angles(s1, s2)
    if score == "cos-literal":
        return cos_sum_angles(s1, s2, clamp=False)
    if score == "sum":
        return _clip(s1) + _clip(s2)
    if score == "dynamic":
        if qp_similarity is None:
            raise ValueError(
                "the dynamic AIS score needs qp_similarity = <q, p> to compute alpha (PAIRS Eq. 8)"
            )
        return dynamic_score(s1, s2, dynamic_alpha(qp_similarity, alpha_coefficients))
    raise ValueError(f"unknown AIS score {score!r}; choose one of {', '.join(AIS_SCORES)}")


def top_k_stable(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best scores, best first; ties keep candidate order (question-path documents first)."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return order[: max(0, k)]
