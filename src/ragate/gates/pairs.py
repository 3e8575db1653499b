"""PAIRS's parametric verification: answer directly (a1) and from a self-written pseudo-context (a2); if the two
agree, the model's knowledge is trusted and the question is answered without retrieval.

The paper says the answers must "converge (the same or demonstrating semantic consistency)" without a rule;
ragate's default is exact match of the ``<answer>`` contents after SQuAD normalisation. ``pairs-lenient`` also
counts containment as agreement: one normalised answer occurs, as whole words, inside the other ("new york" and
"new york city", "1948" and "november 29 1948"), ragate's reading of "semantic consistency" for short answers
(the paper names no rule). ``embedding`` agreement
(cosine of the two answers' embeddings >= a threshold) is the semantic option; its threshold is ragate's choice,
not the paper's. "Exclude num" (PAIRS Table 5): an answer with a digit always retrieves, as numbers are where the
model's agreeing answers are most often hallucinated.
"""

from __future__ import annotations

from ragate.gates.base import Gate, GateContext, GateDecision
from ragate.text import extract_tagged_answer, has_digit, normalize_answer
from ragate.types import Generation

DEFAULT_EMBEDDING_AGREEMENT = 0.9  # ragate's choice: the paper gives no threshold


def contains_words(a: str, b: str) -> bool:
    """Whether one of two normalised answers occurs in the other as a run of whole words (both non-empty)."""
    x, y = a.split(), b.split()
    if not x or not y:
        return False
    short, long = (x, y) if len(x) <= len(y) else (y, x)
    return any(long[i : i + len(short)] == short for i in range(len(long) - len(short) + 1))


def pairs_agreement(
    direct: str, with_pseudo_context: str, *, exclude_numbers: bool = False, lenient: bool = False
) -> GateDecision:
    """Retrieve unless the two answers agree after extraction and normalisation: equal, or (``lenient``) one
    inside the other as whole words (:func:`contains_words`). Score 1 = disagree, 0 = agree."""
    a1, a2 = (
        normalize_answer(extract_tagged_answer(direct)),
        normalize_answer(extract_tagged_answer(with_pseudo_context)),
    )
    agree = (a1 == a2 or (lenient and contains_words(a1, a2))) and a1 != ""
    if agree and exclude_numbers and has_digit(a1):
        return GateDecision(True, 1.0, 0.5, f"answers agree ({a1!r}) but contain a number: retrieve anyway")
    if agree:
        return GateDecision(False, 0.0, 0.5, f"direct and pseudo-context answers agree: {a1!r}")
    return GateDecision(True, 1.0, 0.5, f"answers differ: {a1!r} vs {a2!r}")


def pairs_embedding_agreement(
    direct: str,
    with_pseudo_context: str,
    similarity: float,
    *,
    threshold: float = DEFAULT_EMBEDDING_AGREEMENT,
    exclude_numbers: bool = False,
) -> GateDecision:
    """Retrieve unless the answers' embedding cosine ``similarity`` reaches ``threshold``. Score = 1 - similarity."""
    a1 = normalize_answer(extract_tagged_answer(direct))
    score, limit = 1.0 - similarity, 1.0 - threshold
    if exclude_numbers and has_digit(a1):
        return GateDecision(True, score, limit, f"answer {a1!r} contains a number: retrieve anyway")
    retrieve = score > limit
    verdict = "differ" if retrieve else "agree"
    return GateDecision(
        retrieve, score, limit, f"answers {verdict}: cosine {similarity:.3f} vs {threshold:g}"
    )


class Pairs(Gate):
    """PAIRS section 3.1: the direct answer a1 (the answer when they agree), a pseudo-context p (kept for DPR-AIS),
    and the answer a2 from p. The score is 1 when the answers differ, 0 when they agree."""

    description = "PAIRS: retrieve unless the direct and pseudo-context answers agree"
    default_tau = 0.5
    tau_source = "none: the score is 0 (agree) or 1 (differ)"
    budget_control = False
    like = "pairs"

    def answers(self, ctx: GateContext) -> tuple[Generation, Generation]:
        a1 = ctx.draft()
        p = ctx.pseudo_context()
        a2 = ctx.one("pseudo-answer", ctx.prompts.with_context, context=p, overhead=True)
        return a1, a2

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        a1, a2 = self.answers(ctx)
        return pairs_agreement(a1.text, a2.text)


class PairsExcludeNumbers(Pairs):
    description = "PAIRS, but answers with numbers always retrieve (Table 5)"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        a1, a2 = self.answers(ctx)
        return pairs_agreement(a1.text, a2.text, exclude_numbers=True)


class PairsLenient(Pairs):
    description = "PAIRS, the answers agreeing also when one contains the other (ragate's reading)"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        a1, a2 = self.answers(ctx)
        return pairs_agreement(a1.text, a2.text, lenient=True)


class PairsEmbedding(Pairs):
    """Semantic agreement: the two answers' cosine under the index's encoder. ``tau`` is the *similarity* at or
    above which they agree (default 0.9), not a score threshold."""

    description = "PAIRS with semantic agreement: the answers' embedding cosine >= tau"
    default_tau = DEFAULT_EMBEDDING_AGREEMENT
    tau_source = "ragate's choice (the paper gives no threshold): the cosine at which two answers agree"
    needs_embeddings = True
    budget_control = True

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        a1, a2 = self.answers(ctx)
        v1, v2 = ctx.embed([extract_tagged_answer(a1.text) or "-", extract_tagged_answer(a2.text) or "-"])
        return pairs_embedding_agreement(a1.text, a2.text, float(v1 @ v2), threshold=tau)
