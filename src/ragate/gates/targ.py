"""TARG's prefix gates: score a short no-context draft (k = 20 tokens by default) and retrieve iff U > tau.

- entropy (Eq. 1): U = mean over the first k steps of the step entropy H_t (exact when the backend gives the
  full distribution, else the labelled top-k approximation);
- margin (Eq. 2): U = mean of exp(-g_t / beta), g_t the top-1/top-2 logit gap, beta = 3;
- variance (Eq. 3): N = 5 extra prefixes sampled at T = 0.7; d_t = 1 - (share of the most common token at t),
  U = mean d_t in [0, (N-1)/N].

A draft that ends before k tokens is scored on the steps it has (end-of-sequence is not a step); an empty draft
retrieves. Thresholds are model-specific: calibrate tau to a retrieval budget (TARG section 3.3) rather than
reusing the paper's numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ragate.gates.base import Gate, GateContext, GateDecision, Need, TokenUncertainty
from ragate.types import Generation, GenerationRequest
from ragate.uncertainty import (
    DEFAULT_MARGIN_BETA,
    disagreement,
    margin_uncertainty,
    mean_entropy,
    mean_margin_uncertainty,
)

if TYPE_CHECKING:
    from ragate.methods.spec import GateSpec

DEFAULT_PREFIX = 20
DEFAULT_SAMPLES = 5
DEFAULT_SAMPLE_TEMPERATURE = 0.7


def _decide(name: str, u: float, tau: float, detail: str = "") -> GateDecision:
    retrieve = u > tau
    return GateDecision(
        retrieve, u, tau, f"{name} U = {u:.4g} {'>' if retrieve else '<='} tau = {tau:g}{detail}"
    )


def _empty(tau: float) -> GateDecision:
    return GateDecision(True, math.inf, tau, "empty draft: nothing to score")


def targ_entropy(draft: Generation, tau: float, *, k: int = DEFAULT_PREFIX) -> GateDecision:
    """TARG Eq. 1 over the draft's first ``k`` steps."""
    if len(draft) == 0:
        return _empty(tau)
    entropies, exact = draft.step_entropies()
    detail = "" if exact else " (top-k entropy approximation)"
    return _decide("mean entropy", mean_entropy(entropies, k), tau, detail)


def targ_margin(
    draft: Generation, tau: float, *, k: int = DEFAULT_PREFIX, beta: float = DEFAULT_MARGIN_BETA
) -> GateDecision:
    """TARG Eq. 2 over the draft's first ``k`` steps; needs at least the top-2 log-probabilities per step."""
    if len(draft) == 0:
        return _empty(tau)
    return _decide(f"margin (beta={beta:g})", mean_margin_uncertainty(draft.top1_top2_gaps, k, beta), tau)


def targ_variance(samples: Sequence[Generation], tau: float, *, k: int = DEFAULT_PREFIX) -> GateDecision:
    """TARG Eq. 3 across N sampled prefixes of the same prompt: their token ids when the backend has them, else
    their token strings; a text-only backend (no per-token output) gives neither, and then the first ``k`` words
    of each sample stand in for its tokens (an approximation, said in the reason)."""
    if not samples:
        raise ValueError("the variance gate needs the N sampled prefixes (N = 5 by default)")
    by_words = all(not s.tokens for s in samples)
    sequences = [s.text.split() if by_words else (s.token_ids or s.tokens) for s in samples]
    if all(len(s) == 0 for s in sequences):
        return _empty(tau)
    unit = " (words: no per-token output)" if by_words else ""
    return _decide(f"disagreement over {len(samples)} samples", disagreement(sequences, k), tau, unit)


_CALIBRATE = "model-specific: calibrate it to a budget (section 3.3)"
_ENTROPY_TAU = f"TARG Table 1 (Qwen2.5-7B) uses 0.80 on TriviaQA and PopQA, 0.85 on NQ-Open; {_CALIBRATE}"
_MARGIN_TAU = f"the midpoint of TARG Table 1's 0.15-0.35 (Qwen2.5-7B); {_CALIBRATE}"
_VARIANCE_TAU = (
    "inside TARG Table 1's 0.40-0.75 (Qwen2.5-7B; 0.60 on NQ-Open), below its midpoint 0.575: ragate's choice, "
    f"not a value of the paper; {_CALIBRATE}"
)


class TargEntropy(Gate):
    description = "TARG: mean entropy of a 20-token draft (Eq. 1)"
    need = Need(token_logprobs=True, top_k=1, entropy=True)
    default_tau = 0.8
    tau_source = _ENTROPY_TAU
    like = "targ-entropy"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        return targ_entropy(ctx.draft(ctx.params.prefix), tau, k=ctx.params.prefix)

    def token_uncertainty(self, draft: Generation, params: GateSpec) -> TokenUncertainty:
        entropies, exact = draft.step_entropies()
        measure = "entropy H" + ("" if exact else " (top-k approximation)")
        return TokenUncertainty(measure, tuple(entropies), min(params.prefix, len(entropies)))


class TargMargin(Gate):
    description = "TARG: mean exp(-gap/beta) of a 20-token draft (Eq. 2)"
    need = Need(token_logprobs=True, top_k=2)  # the top-1/top-2 gap is exact from the top-2 logprobs
    default_tau = 0.25
    tau_source = _MARGIN_TAU
    like = "targ-margin"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        p = ctx.params
        return targ_margin(ctx.draft(p.prefix), tau, k=p.prefix, beta=p.beta)

    def token_uncertainty(self, draft: Generation, params: GateSpec) -> TokenUncertainty:
        values = tuple(margin_uncertainty(g, params.beta) for g in draft.top1_top2_gaps)
        return TokenUncertainty(
            f"margin exp(-g/{params.beta:g})", values, min(params.prefix, len(values)), 1.0
        )


class TargVariance(Gate):
    description = "TARG: disagreement of N sampled 20-token drafts (Eq. 3)"
    need = Need(sampling=True, tokens=True)  # sampled prefixes' tokens, else their words
    default_tau = 0.5
    tau_source = _VARIANCE_TAU
    like = "targ-variance"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        p = ctx.params
        ctx.draft(p.prefix)  # the greedy draft: the answer when the gate says "no"
        requests = [
            GenerationRequest(
                ctx.messages(ctx.prompts.direct),
                max_tokens=p.prefix,
                temperature=p.sample_temperature,
                seed=ctx.seed * 1000 + i,
                top_logprobs=0,
            )
            for i in range(p.samples)
        ]
        return targ_variance(ctx.generate("samples", requests, overhead=True), tau, k=p.prefix)
