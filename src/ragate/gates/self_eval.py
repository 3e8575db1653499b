"""TARG's Self-Eval gate (TARG section 5.1): the model is asked, before it answers, whether it needs to search.

TARG gives the question it asks ("do you need to search for this?") but not its template; the wording below puts
that question after the user's and asks for a one-word reply. The score is P(yes) among yes/no at the reply's
first step (:func:`ragate.gates.judge.p_yes`), so the gate can be swept and calibrated like TARG's own; without
logprobs it decides from the reply's first word. DTR's differently worded judge stays ``llm-judge``.
"""

from __future__ import annotations

from ragate.gates.base import Gate, GateContext, GateDecision, Need
from ragate.gates.judge import yes_no_gate
from ragate.types import Generation

SELF_EVAL_PROMPT = (  # TARG section 5.1: "do you need to search for this?" (the template in ragate's words)
    "{question}\n\nDo you need to search for this? Reply with one word: Yes or No."
)
DEFAULT_SELF_EVAL_TAU = 0.5
MAX_TOKENS = 4


def self_eval(reply: Generation, tau: float = DEFAULT_SELF_EVAL_TAU) -> GateDecision:
    """Retrieve iff P(yes) > ``tau`` (the reply's "yes" without logprobs)."""
    return yes_no_gate(
        reply,
        tau,
        yes="the model says it needs to search",
        no="the model says it can answer without searching",
    )


class SelfEval(Gate):
    description = "TARG's Self-Eval gate: the model is asked 'do you need to search for this?'"
    need = Need(token_logprobs=True, top_k=2, text_fallback=True)  # P(yes), as the judge
    default_tau = DEFAULT_SELF_EVAL_TAU
    tau_source = "P(yes) = 0.5: the reply's own verdict"
    budget_control = False
    like = "self-eval"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        return self_eval(ctx.one("self-eval", SELF_EVAL_PROMPT, max_tokens=MAX_TOKENS, overhead=True), tau)
