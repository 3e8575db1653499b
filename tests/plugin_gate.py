"""A gate as a user writes one, in their own module: nothing in ragate's source is edited for it to run.

Registered by the decorator when this module is imported (in-process use), and found through an entry point of
the group ``ragate.gates`` by the ``ragate`` command (tests/test_user_gate.py installs one for a subprocess).
"""

from __future__ import annotations

import math

import ragate


@ragate.register_gate("min-prob")
class MinProb(ragate.Gate):
    """Retrieve when the least likely token of the model's direct answer has probability below 1 - tau."""

    description = "retrieve when the direct answer's least likely token is unlikely"
    need = ragate.Need(token_logprobs=True)
    default_tau = 0.5
    tau_source = "this test's choice: calibrate it to a budget"

    def score(self, ctx: ragate.GateContext) -> float:
        draft = ctx.draft()  # the greedy direct answer, which is also the answer when the gate says "no"
        return 1.0 - math.exp(min(draft.logprobs, default=0.0))


@ragate.register_gate("faulty")
class Faulty(ragate.Gate):
    """A gate with bugs, as users write them: what it does wrong is named in the question (a test device)."""

    description = "fails in the way the question names: raise, word, none, nan; else scores 0"
    default_tau = 0.5
    tau_source = "this test's choice"

    def score(self, ctx: ragate.GateContext) -> float:
        question = ctx.question.lower()
        if "raise" in question:
            raise ValueError("my gate's bug")
        if "word" in question:
            return "high"  # type: ignore[return-value]
        if "none" in question:
            return None  # type: ignore[return-value]
        if "nan" in question:
            return math.nan
        return 0.0
