"""DTR's uncertainty-guided triggering (UGT): retrieve when the model is unsure of its own greedy answer.

u = -(1/T) * sum_t log P(a_t | q, a_<t)   (DTR Eqs. 2-3; T = answer tokens, end-of-sequence excluded)

The paper answers without retrieval when u is "no greater than" the threshold, so ragate retrieves iff u > tau
(``compare="gt"``, the default). The authors' code retrieves iff u >= tau (``compare="ge"``), which also makes
tau = 0 mean "always". The paper reports tau in {0.001, 0.005, 0.01}; 0.001 is the code's default and ragate's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from ragate.gates.base import Gate, GateContext, GateDecision, Need, TokenUncertainty
from ragate.types import Generation
from ragate.uncertainty import normalised_nll

if TYPE_CHECKING:
    from ragate.gates.spec import GateSpec

DEFAULT_TAU = 0.001
UGT_TAUS = (0.001, 0.005, 0.01)


def ugt(draft: Generation, tau: float = DEFAULT_TAU, *, compare: Literal["gt", "ge"] = "gt") -> GateDecision:
    """Decide from the greedy direct answer ``draft`` (DTR Eq. 3). An empty answer retrieves (u = +inf)."""
    if len(draft) == 0:
        return GateDecision(True, math.inf, tau, "empty answer: nothing to be sure of")
    u = normalised_nll(draft.logprobs)
    retrieve = u > tau if compare == "gt" else u >= tau
    sign = (">" if compare == "gt" else ">=") if retrieve else ("<=" if compare == "gt" else "<")
    return GateDecision(retrieve, u, tau, f"normalised answer NLL u = {u:.4g} {sign} tau = {tau:g}")


class UGT(Gate):
    """DTR's gate: the normalised NLL of the greedy direct answer, which is also the answer when it says "no"."""

    description = "DTR's UGT: normalised NLL of the model's own greedy answer (Eq. 3)"
    need = Need(token_logprobs=True)  # Eq. 1: NLL of the greedy answer's own tokens
    default_tau = DEFAULT_TAU
    tau_source = "DTR section 4 and the authors' code (Qwen2.5-7B / Llama-3-8B); too low for small models"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        return ugt(ctx.draft(), tau, compare=ctx.params.compare)

    def token_uncertainty(self, draft: Generation, params: GateSpec) -> TokenUncertainty:
        values = tuple(-lp for lp in draft.logprobs)
        return TokenUncertainty("-log p (their mean is u)", values, len(values))
