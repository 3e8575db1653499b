"""The papers' prompts, verbatim, each with its source. Each is sent as one user message through the model's chat
template. ``{question}`` is the question; ``{context}`` the formatted documents or the pseudo-context.

See docs/notes/single-shot-methods-spec.md for how these compare with the authors' code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ragate.gates.judge import JUDGE_PROMPT
from ragate.gates.self_eval import SELF_EVAL_PROMPT
from ragate.gates.self_rag import SELF_RAG_LITE_PROMPT
from ragate.gates.verbal import VERBAL_PROMPT
from ragate.retrieval.types import Passage
from ragate.text import extract_tagged_answer


@dataclass(frozen=True)
class PromptSet:
    """The prompts one paper's family of methods uses."""

    name: str
    direct: str  # answer without documents
    with_context: str  # answer with documents ({context})
    pseudo_context: str  # write a passage that answers the question
    system: str | None = None
    tagged_answers: bool = False  # answers come inside <answer>...</answer> (PAIRS Fig. 9)

    def answer_text(self, generated: str) -> str:
        """The answer in a generated reply: the tagged span for tagged prompt sets, else the text, stripped."""
        return extract_tagged_answer(generated) if self.tagged_answers else generated.strip()

    def format_passages(self, passages: Sequence[Passage]) -> str:
        return "\n".join(f"{p.title}: {p.text}" if p.title else p.text for p in passages)


DTR = PromptSet(
    name="dtr",
    direct="{question}\nAnswer the question using a single word or phrase.",  # Appendix D, Fig. 11
    # Fig. 12 lists the passages after the question, then the instruction.
    with_context="{question}\n{context}\nAnswer the question based on the above context using a single word or phrase.",
    pseudo_context="{question}\nWrite a passage to answer this question.",  # Fig. 13
)

PAIRS = PromptSet(  # PAIRS Fig. 9 (a) pseudo-context, (b) direct answer, (c) answer with context
    name="pairs",
    direct=(
        "Your task is to answer the given question. Please directly provide the concise answer inside <answer> and "
        "</answer> without detailed description, e.g., <answer>Beijing</answer>.\nQuestion: {question}"
    ),
    with_context=(
        "Your task is to answer the given question based on the Context. Please directly provide the answer inside "
        "<answer> and </answer> without detailed description, e.g., <answer>Beijing</answer>.\n"
        "Context: {context}\nQuestion: {question}"
    ),
    pseudo_context="Your task is to write a detailed passage to answer the given question.\nQuestion: {question}",
    tagged_answers=True,
)


@dataclass(frozen=True)
class TargPromptSet(PromptSet):
    """TARG formats each retrieved passage as ``[title] text`` (section 4) after the base prompt B(q)."""

    def format_passages(self, passages: Sequence[Passage]) -> str:
        return "\n".join(f"[{p.title}] {p.text}" if p.title else p.text for p in passages)


TARG = TargPromptSet(  # TARG A.12 "Default" template as the system message; x = B(q) ⊕ C (Eq. 5)
    name="targ-question-first",  # a new name: sweeps' stored families name the prompts that made the answers
    direct="{question}",
    with_context="{question}\n\n{context}",  # the question, then the context, as x = B(q) ⊕ C
    pseudo_context=DTR.pseudo_context,
    system="You are a helpful assistant. Answer concisely and factually.",
)
# Before 2026-11-26 the TARG reader put the context first, under the name "targ"; the runs of docs/results.md up to
# then used this form, and their sweeps' families still say "targ", which is this set.
TARG_CONTEXT_FIRST = TargPromptSet(
    name="targ",
    direct=TARG.direct,
    with_context="{context}\n\n{question}",
    pseudo_context=TARG.pseudo_context,
    system=TARG.system,
)

COT = "Answer the following question:\n{question}\nGive the rationale before answering"  # DTR Fig. 14
HYDE = (
    "Please write a passage to answer the question\nQuestion: {question}\nPassage:"  # HyDE (Gao et al., 2023)
)
JUDGE = JUDGE_PROMPT  # DTR Fig. 15
VERBAL = VERBAL_PROMPT  # Tian et al. 2023, verbalised confidence (gates/verbal.py)
SELF_EVAL = SELF_EVAL_PROMPT  # TARG section 5.1's Self-Eval gate (gates/self_eval.py)
SELF_RAG_LITE = SELF_RAG_LITE_PROMPT  # TARG section 5.1's Self-RAG-lite reflection (gates/self_rag.py)

PROMPT_SETS = {p.name: p for p in (DTR, PAIRS, TARG, TARG_CONTEXT_FIRST)}
