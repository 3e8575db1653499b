"""The LLM-judge / self-eval gate: ask the model whether it needs external information (DTR Fig. 15; TARG's
Self-Eval gate, "do you need to search for this?").

The decision reads the reply: "Yes" retrieves, "No" does not, anything else retrieves (conservatively). The score
is P(yes) = p(yes) / (p(yes) + p(no)) from the first step's top log-probabilities (case and leading-space variants
summed), so the judge can also be thresholded and swept like any other gate.
"""

from __future__ import annotations

import math

from ragate.gates.base import Gate, GateContext, GateDecision, Need
from ragate.text import normalize_answer
from ragate.types import Generation

JUDGE_PROMPT = (  # DTR Appendix D, Figure 15
    "{question}\n"
    'Determine whether external information is needed to answer the question accurately. Respond with "Yes" if '
    'additional information is required, or "No" if the question can be answered without it.'
)


def p_yes(reply: Generation) -> float | None:
    """P(yes) among yes/no at the reply's first step; 0.5 when neither appears in the top-k list; None when the
    reply carries no alternatives (a backend without top-k logprobs)."""
    if len(reply) == 0 or not reply.top_logprobs[0]:
        return None
    yes = no = 0.0
    for alt in reply.top_logprobs[0]:
        word = alt.token.strip().lower()
        if word == "yes":
            yes += math.exp(alt.logprob)
        elif word == "no":
            no += math.exp(alt.logprob)
    return yes / (yes + no) if yes + no > 0 else 0.5


def first_word(reply: Generation) -> str:
    words = normalize_answer(reply.text).split()
    return words[0] if words else ""


def word_score(word: str) -> float:
    """A reply's P(yes) read from its first word, for a backend without logprobs: 1 "yes", 0 "no", else 0.5."""
    return {"yes": 1.0, "no": 0.0}.get(word, 0.5)


def yes_no_gate(reply: Generation, tau: float, *, yes: str, no: str) -> GateDecision:
    """A yes/no reply as a thresholded gate: retrieve iff P(yes) > ``tau``; without logprobs, iff the reply
    says "yes" (a reply that is neither retrieves, conservatively). ``yes``/``no`` say what each answer means.

    With logprobs the rule is exactly score > tau, which is what a sweep replays at every threshold; so a reply
    with neither word among its top-k (P(yes) = 0.5) does not retrieve at tau = 0.5, while the same unclear reply
    from a text-only backend does (there is no score to threshold, only the word)."""
    word = first_word(reply)
    probability = p_yes(reply)
    if probability is None:
        score = word_score(word)
        retrieve, how = word != "no", "from the reply text, no logprobs"
    else:
        score, how = probability, f"P(yes) = {probability:.3f}"
        retrieve = probability > tau
    if word not in ("yes", "no"):
        said = f"unclear reply {reply.text.strip()[:40]!r}"
    else:
        said = yes if word == "yes" else no
    return GateDecision(retrieve, score, tau, f"{said} ({how}; retrieve iff P(yes) > {tau:g})")


def llm_judge(reply: Generation) -> GateDecision:
    """Decide from the judge's reply text; the score is :func:`p_yes` (threshold 0.5), or, without logprobs, the
    reply's own word: 1 for "yes", 0 for "no", 0.5 otherwise (a text-only score: too coarse to sweep)."""
    first = first_word(reply)
    probability = p_yes(reply)
    score = word_score(first) if probability is None else probability
    how = "from the reply text, no logprobs" if probability is None else f"P(yes) = {score:.3f}"
    if first == "yes":
        return GateDecision(True, score, 0.5, f"the model says it needs information ({how})")
    if first == "no":
        return GateDecision(False, score, 0.5, f"the model says it can answer ({how})")
    return GateDecision(
        True, score, 0.5, f"unclear judge reply {reply.text.strip()[:40]!r}: retrieve to be safe ({how})"
    )


class LLMJudge(Gate):
    description = "ask the model whether it needs external information (DTR Fig. 15)"
    need = Need(token_logprobs=True, top_k=2, text_fallback=True)  # P(yes); else the reply's first word
    default_tau = 0.5
    tau_source = "the reply's own verdict: 'Yes' retrieves (P(yes) is recorded as the score)"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        return llm_judge(ctx.one("judge", JUDGE_PROMPT, max_tokens=4, overhead=True))
