"""CRAG-lite (TARG section 5.1): retrieve once, let the model grade what came back, act on the grades.

CRAG (Yan et al. 2024, section 4) trains a retrieval evaluator that scores each retrieved document, and takes
one of three actions from two thresholds: *Correct* (some document scores above the upper one: refine the
documents and read them), *Incorrect* (every document below the lower one: discard them and search the web with
a rewritten query) and *Ambiguous* (otherwise: both). The training-free "lite" form TARG compares against
(section 5.1) keeps at most one retrieval call and one reflection cycle. Here the base model is the evaluator:
one yes/no prompt per passage, graded by P(yes) (:func:`ragate.gates.judge.p_yes`; 1/0.5/0 from the reply's word
without logprobs), and

- correct / ambiguous: the answer reads the passages graded at least ``lower`` (CRAG's refinement, at passage
  granularity instead of its knowledge strips);
- incorrect: the closed-book answer (``incorrect="closed-book"``, the default: TARG's one-retrieval bound), or
  CRAG's own action in one step (``"rewrite"``): the model writes a search query and the answer reads its
  top-k, a second retrieval call.

TARG prints neither its CRAG-lite prompts nor its thresholds: the prompts below are ragate's, and ``upper`` /
``lower`` (0.7 / 0.3 on P(yes)) are ragate's defaults, not CRAG's (CRAG tunes them per dataset for its T5
evaluator's scores). The method searches for every question, so its retrieval rate is 1 by construction; the
trace's ``documents`` say whether the answer read any.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ragate.gates.base import GateDecision
from ragate.gates.judge import first_word, p_yes, word_score
from ragate.methods.question import QuestionRun
from ragate.methods.spec import CragSpec
from ragate.methods.trace import Trace
from ragate.retrieval.types import Hit
from ragate.types import Generation, GenerationRequest

Action = Literal["correct", "ambiguous", "incorrect"]

GRADE_PROMPT = (  # CRAG's retrieval evaluator as a yes/no prompt (ragate's wording)
    "Question: {question}\nPassage: {passage}\n\n"
    "Does this passage contain information that helps answer the question? Reply with one word: Yes or No."
)
REWRITE_PROMPT = (  # CRAG section 4.3's query rewriting for search (ragate's wording)
    "Rewrite the question below as a short search query of keywords. Reply with the query only, on one line.\n"
    "Question: {question}"
)
GRADE_TOKENS = 4
REWRITE_TOKENS = 32


def grade(reply: Generation) -> float:
    """P(relevant) of one passage: P(yes) among yes/no, or 1/0.5/0 from the reply's first word."""
    probability = p_yes(reply)
    return word_score(first_word(reply)) if probability is None else probability


def action(grades: Sequence[float], upper: float, lower: float) -> Action:
    """CRAG's action from the evaluator's scores (section 4.2): any >= ``upper`` correct, all < ``lower``
    incorrect, else ambiguous."""
    if not grades:
        return "incorrect"
    if max(grades) >= upper:
        return "correct"
    if max(grades) < lower:
        return "incorrect"
    return "ambiguous"


def kept(hits: Sequence[Hit], grades: Sequence[float], lower: float) -> list[Hit]:
    """The passages graded at least ``lower``, in retrieval order (all of them when none is)."""
    chosen = [h for h, g in zip(hits, grades, strict=True) if g >= lower]
    return chosen or list(hits)


def run_crag_lite(run: QuestionRun, crag: CragSpec) -> Trace:
    """One question through CRAG-lite: search, grade each passage, act. At most one grading cycle."""
    spec, prompts = run.spec, run.spec.prompts
    hits = run.search([run.question], spec.selector.k)[0]
    requests = [
        GenerationRequest(
            run.messages(GRADE_PROMPT, passage=h.passage.contents),
            max_tokens=GRADE_TOKENS,
            top_logprobs=min(5, run.lm.capabilities.top_k),
        )
        for h in hits
    ]
    grades = [grade(g) for g in run.generate("grade", requests, overhead=True)]
    act = action(grades, crag.upper, crag.lower)
    shown = ", ".join(f"{g:.2f}" for g in grades)
    documents: tuple[Hit, ...] = ()
    if act != "incorrect":
        documents = tuple(kept(hits, grades, crag.lower))
        how = f"read the {len(documents)} of {len(hits)} passages graded >= {crag.lower:g}"
    elif crag.incorrect == "rewrite":
        query = run.one("rewrite", REWRITE_PROMPT, max_tokens=REWRITE_TOKENS, overhead=True, top_logprobs=0)
        rewritten = query.text.strip().split("\n", 1)[0].strip() or run.question
        documents = tuple(run.search([rewritten], spec.selector.k)[0])
        how = f"searched again with the rewritten query {rewritten[:60]!r}"
    else:
        how = "answered closed-book"
    if documents:
        context = prompts.format_passages([h.passage for h in documents])
        answer = run.one("answer", prompts.with_context, context=context).text
    else:
        answer = run.one("answer", prompts.direct).text
    decision = GateDecision(
        True,
        max(grades, default=0.0),
        crag.upper,
        f"CRAG-lite: {act} (passage grades P(relevant) {shown}; upper {crag.upper:g}, lower {crag.lower:g}): {how}",
    )
    return Trace(
        spec.name,
        run.question,
        prompts.answer_text(answer),
        True,
        decision,
        tuple(run.queries),
        documents,
        tuple(run.stages),
    )
