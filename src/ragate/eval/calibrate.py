"""Thresholds from a retrieval budget (TARG section 3.3) or from dev accuracy.

Every gate's score is oriented so that a higher score means "retrieve" and the gate retrieves iff score > tau
(``GateDecision``). A budget rho (the share of questions allowed to retrieve) gives tau = F^-1(1 - rho), the
empirical (1 - rho)-quantile of the dev scores, so that at most a share rho of the dev questions score above it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def threshold_for_budget(scores: Sequence[float], budget: float) -> float:
    """tau = F^-1(1 - budget) over ``scores`` (TARG section 3.3), the inverted-CDF quantile: the smallest score
    s with F(s) >= 1 - budget, so the share of scores strictly above tau is at most ``budget``.

    A budget of 1 returns a value below every score (always retrieve), 0 the largest score (never retrieve).
    """
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"budget must be a share of questions in [0, 1], got {budget}")
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no dev scores to calibrate on: score at least one question first")
    if not np.all(np.isfinite(values)):
        raise ValueError("dev scores contain NaN or infinity: check the gate's drafts")
    if budget >= 1.0:
        return float(np.nextafter(values.min(), -np.inf))
    return float(np.quantile(values, 1.0 - budget, method="inverted_cdf"))


def retrieval_rate(scores: Sequence[float], tau: float) -> float:
    """The share of ``scores`` above ``tau``: the rate a gate with that threshold retrieves at."""
    values = np.asarray(scores, dtype=np.float64)
    return float(np.mean(values > tau)) if values.size else 0.0
