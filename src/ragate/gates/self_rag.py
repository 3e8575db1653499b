"""Self-RAG-lite (TARG section 5.1): draft an answer, reflect once on whether it needs evidence, retrieve once if so.

Self-RAG (Asai et al. 2024, section 3) trains reflection tokens: *Retrieve* (is evidence needed?) and *IsSup*
(is the output supported?). The training-free "lite" form TARG compares against asks the base model both
questions about its own closed-book draft in one prompt, at most one reflection cycle and one retrieval.
TARG does not print its prompt; the one below is ragate's, in Self-RAG's terms. The score is P(yes) for "needs
evidence" (:func:`ragate.gates.judge.p_yes`); when the gate says no, the draft is the answer.
"""

from __future__ import annotations

from ragate.gates.base import Gate, GateContext, GateDecision, Need
from ragate.gates.judge import yes_no_gate
from ragate.types import Generation

SELF_RAG_LITE_PROMPT = (  # Self-RAG's Retrieve / IsSup questions, one reflection step (ragate's wording)
    "Question: {question}\nDraft answer: {draft}\n\n"
    "Is this draft fully supported by what you know for certain, or does it need evidence from a search before "
    "it can be trusted? Reply with one word: Yes if it needs evidence, No if it is supported."
)
DEFAULT_SELF_RAG_TAU = 0.5
MAX_TOKENS = 4


def self_rag_lite(reply: Generation, tau: float = DEFAULT_SELF_RAG_TAU) -> GateDecision:
    """Retrieve iff P(yes: the draft needs evidence) > ``tau`` (the reply's "yes" without logprobs)."""
    return yes_no_gate(
        reply, tau, yes="the model says its draft needs evidence", no="the model says its draft is supported"
    )


class SelfRagLite(Gate):
    description = "Self-RAG-lite: draft, one reflection on whether it needs evidence, retrieve once if so"
    need = Need(token_logprobs=True, top_k=2, text_fallback=True)
    default_tau = DEFAULT_SELF_RAG_TAU
    tau_source = "P(yes) = 0.5: the reply's own verdict"
    budget_control = False
    like = "self-rag-lite"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        draft = ctx.draft()
        reply = ctx.one(
            "reflect",
            SELF_RAG_LITE_PROMPT,
            max_tokens=MAX_TOKENS,
            overhead=True,
            draft=ctx.prompts.answer_text(draft.text) or "(no answer)",
        )
        return self_rag_lite(reply, tau)
