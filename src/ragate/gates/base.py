"""The result every gate returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GateDecision:
    """Whether to retrieve, the gate's score and the threshold it was compared with, and why, in words.

    ``score`` is oriented so that higher means "more reason to retrieve" for every gate, which makes thresholds,
    budgets and sweeps uniform (``retrieve == score > threshold`` unless the gate says otherwise in ``reason``).
    """

    retrieve: bool
    score: float
    threshold: float
    reason: str
