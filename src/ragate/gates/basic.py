"""The trivial gates: never, always, and a seeded random gate, the honest control for any comparison."""

from __future__ import annotations

import hashlib

from ragate.errors import RagateError
from ragate.gates.base import Gate, GateContext, GateDecision


def never() -> GateDecision:
    """No retrieval: answer from the model's parameters (the papers' No Retrieval / Never-RAG)."""
    return GateDecision(False, 0.0, 0.0, "never retrieves")


def always() -> GateDecision:
    """Retrieve for every question (Standard RAG / Always-RAG)."""
    return GateDecision(True, 1.0, 0.0, "always retrieves")


def random_gate(key: str, rate: float, seed: int = 0) -> GateDecision:
    """Retrieve for a fraction ``rate`` of questions, chosen by a hash of (seed, key): reproducible, independent
    of order and of the model. Compare a gate with this at the same retrieval rate to show it beats chance.

    The score is 1 - u for a uniform u in [0, 1) derived from the hash, and the threshold 1 - rate, so that
    retrieving means score > threshold like every other gate.
    """
    if not 0.0 <= rate <= 1.0:  # a RagateError: the caller's threshold, not a fault of the gate
        raise RagateError(f"the random gate's threshold is its retrieval rate, in [0, 1]; got {rate}")
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    score, threshold = 1.0 - u, 1.0 - rate
    return GateDecision(score > threshold, score, threshold, f"random draw {u:.3f} vs rate {rate:g}")


class Never(Gate):
    description = "never retrieves: the answer comes from the model's parameters"
    tau_source = "none: the decision ignores tau"
    thresholded = False
    budget_control = False

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        return never()


class Always(Never):
    description = "retrieves for every question"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        return always()


class Random(Gate):
    """The control: retrieve for a seeded share ``rate`` of questions (``GateSpec.rate``, default 0.5)."""

    description = "retrieves for a seeded random share of questions (the control)"
    default_tau = 0.5
    tau_source = "the rate's complement: tau = 1 - rate (set the rate, not tau)"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        return random_gate(ctx.question, ctx.params.rate, ctx.seed)
