"""Proxy gates: a small local model's draft decides for a large model (SlimPLM's idea, Tan et al., ACL 2024).

``proxy-margin`` and ``proxy-entropy`` score a k = 20-token no-context draft with TARG's Eq. 2 and Eq. 1, as
``targ-margin`` and ``targ-entropy`` do, but the draft comes from the proxy model (SmolLM2-135M through llama.cpp by
default; ``GateSpec.proxy``, ``Pipeline(proxy_model=)`` or ``ragate ask --proxy-model`` name another), not from the
model that answers. The answering model is asked for nothing but its answer, so the gate works in front of an
OpenAI-compatible server that returns no logprobs, and its draft costs a 135M model's decode instead of the large
one's. The price: the proxy's uncertainty is not the large model's, so the gate ranks questions by what the small
model finds hard (``ragate calibrate`` sets its tau like any gate's; a tau belongs to the proxy it was set with).

When the gate says "no" the large model answers the question directly (the proxy's draft is never an answer).
"""

from __future__ import annotations

from typing import ClassVar

from ragate.gates.base import Gate, GateContext, GateDecision, Need
from ragate.gates.targ import targ_entropy, targ_margin

_TAU = (
    "no paper value: the scale is the proxy model's (TARG Table 1's tau is for Qwen2.5-7B drafting for itself); "
    "calibrate it to a budget (ragate calibrate)"
)


class ProxyMargin(Gate):
    description = "TARG's margin (Eq. 2) over a small proxy model's 20-token draft (default SmolLM2-135M)"
    need = Need()  # the answering model is asked for text only; the proxy gives the top-2 logprobs
    default_tau = 0.25
    tau_source = _TAU
    like = "targ-margin"
    drafts_with_proxy: ClassVar[bool] = True

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        p = ctx.params
        draft = ctx.proxy_draft(p.prefix, top_logprobs=2)
        found = targ_margin(draft, tau, k=p.prefix, beta=p.beta)
        return GateDecision(found.retrieve, found.score, tau, f"proxy {found.reason}")


class ProxyEntropy(Gate):
    description = (
        "TARG's mean entropy (Eq. 1) over a small proxy model's 20-token draft (default SmolLM2-135M)"
    )
    need = Need()
    default_tau = 0.8
    tau_source = _TAU
    like = "targ-entropy"
    drafts_with_proxy: ClassVar[bool] = True

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        draft = ctx.proxy_draft(ctx.params.prefix, top_logprobs=1)
        found = targ_entropy(draft, tau, k=ctx.params.prefix)
        return GateDecision(found.retrieve, found.score, tau, f"proxy {found.reason}")
