"""Corpus-aware gates: what the user's documents hold, alone or beside how sure the model is.

A confidence gate (DTR's UGT, TARG's entropy and margin, ...) measures how sure the model is, not whether the
answer lives in the user's documents. Over private documents a small model answers confidently and wrongly (a
product's own constants, options and defaults it never saw), and a confidence gate lets those answers through. The
evidence a corpus gives is of another kind: whether the question's terms, weighted by how rare they are in the
corpus, are found together in one of the passages the search returns.

**Coverage** (:func:`idf_coverage`, :func:`corpus_evidence`): over the question's BM25 terms Q (lower case, English
stop words and question words dropped, Snowball stems; each term once) and a passage's terms P,

    coverage(q, p) = sum_{t in Q and P} idf(t) / sum_{t in Q} idf(t),   idf(t) = ln((N + 1) / (df(t) + 1))

with df(t) the number of the index's N passages holding t (the counts of :func:`ragate.gates.nomodel.
doc_frequencies`); the evidence is the largest coverage over the question's top-5 passages (TARG's reader: the
search the method runs anyway, so a "retrieve" reads those very hits). It lies in [0, 1] whatever the encoder or
retriever: 1 when one passage holds every term, 0 when none holds any. A term no passage holds has the largest
weight, ln(N + 1), and can never be covered, so a question about something the corpus lacks ("Who wrote Hamlet?"
over a library's manual) scores low even when its common words match; a term in every passage ("libffi" in
libffi's manual) weighs ~0.

**The gates.** ``corpus-coverage`` retrieves when the evidence is > tau (it reads no model). ``corpus-or-margin``
retrieves when the model is unsure *or* the corpus clearly holds the answer: its score is
``max(coverage, U_mar)`` with U_mar TARG's margin score (Eq. 2, k = 20, beta = 3; also in [0, 1]), so one tau
bounds both and a budget calibrates them jointly from unlabelled questions, like every gate (``ragate calibrate
--questions``, ``serve --budget``). When the search alone settles "retrieve" (coverage > tau) no draft is
generated at all, the same decision as the full score (the max can only be larger); the score recorded is then
the coverage, a lower bound, and the reason says so. Sweeps and calibration, which rank whole scores, always draft.

What these gates cannot see: whether the passage that covers the terms *answers* the question (a manual that names
every term of the question in an unrelated paragraph still scores high), nor anything about the model. The
coverage needs the corpus's document frequencies: an index with a passage store (``ragate index build``), or a
search function given the corpus's texts once (``ragate.Pipeline(search=..., corpus=texts)``; the framework
adapters forward it); Milvus has none.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ragate.gates.base import Gate, GateContext, GateDecision, threshold_decision
from ragate.gates.nomodel import QUESTION_WORDS, SIGNAL_K, DocFrequencies, doc_frequencies, rarity_score
from ragate.gates.targ import TargMargin

_WH = frozenset(
    (*QUESTION_WORDS, "whom", "whose")
)  # BM25 keeps them (not English stop words): they say nothing
_WORDS = re.compile(r"\w+")


def idf_coverage(
    question_terms: Iterable[str], passage_terms: Iterable[str], idf: Callable[[str], float]
) -> float:
    """The idf-weighted share of the question's distinct terms found in the passage's (0.0 for a question with
    no term of positive weight)."""
    terms = set(question_terms)
    found = set(passage_terms)
    total = sum(idf(t) for t in terms)
    if total <= 0.0:
        return 0.0
    return sum(idf(t) for t in terms if t in found) / total


@dataclass(frozen=True)
class Evidence:
    """The corpus evidence for one question: the best ``coverage`` among its ``k`` passages, the rank of the
    passage that gave it (None when no passage covers a term), and the question's terms (BM25's form)."""

    coverage: float
    rank: int | None
    k: int
    terms: tuple[str, ...]

    def describe(self) -> str:
        if not self.terms:
            return "the question has no content term"
        where = (
            f"passage {self.rank} of the top-{self.k}"
            if self.rank is not None
            else f"none of the top-{self.k}"
        )
        return f"idf-weighted coverage {self.coverage:.3g} of {len(self.terms)} question terms by {where}"


def corpus_evidence(question: str, passages: Sequence[str], freqs: DocFrequencies) -> Evidence:
    """:func:`idf_coverage` of ``question`` by each of ``passages`` (best first, as searched): the largest."""
    asked = " ".join(w for w in _WORDS.findall(question) if w.casefold() not in _WH)
    tokenized = freqs.terms([asked, *passages])
    q_terms = tuple(dict.fromkeys(tokenized[0]))

    def idf(term: str) -> float:
        return rarity_score(freqs.of(term), freqs.n)

    best, rank = 0.0, None
    for i, p_terms in enumerate(tokenized[1:], start=1):
        value = idf_coverage(q_terms, p_terms, idf)
        if value > best:
            best, rank = value, i
    return Evidence(best, rank, len(passages), q_terms)


def _evidence(ctx: GateContext) -> Evidence:
    retriever = ctx.need_retriever()
    found = ctx.scored_search(SIGNAL_K)
    with ctx.timed("corpus-evidence", overhead=True):
        return corpus_evidence(ctx.question, [h.passage.text for h in found.hits], doc_frequencies(retriever))


class CorpusCoverage(Gate):
    name = "corpus-coverage"
    description = (
        "retrieve when one of the question's top-5 passages holds its terms, weighted by their rarity in the corpus "
        "(idf-weighted coverage in [0, 1]; reads no model)"
    )
    default_tau = 0.5
    tau_source = (
        "ragate's choice: half the question's idf weight found in one passage; calibrate it to a budget"
    )
    reads_index = True
    counts_terms = True
    like = "targ-margin"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        found = _evidence(ctx)
        return threshold_decision(self.name, found.coverage, tau, f" ({found.describe()}; no LM call)")


class CorpusOrMargin(TargMargin):
    name = "corpus-or-margin"
    description = (
        "retrieve when the corpus clearly holds the question's terms OR the model is unsure: max(idf-weighted "
        "coverage, TARG's margin score), one tau for both"
    )
    default_tau = 0.25
    tau_source = (
        "TARG's margin default (the midpoint of Table 1's 0.15-0.35, Qwen2.5-7B), shared by the coverage: "
        "calibrate it to a budget"
    )
    reads_index = True
    counts_terms = True

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        found = _evidence(ctx)
        if found.coverage > tau and ctx.early_exit:
            return GateDecision(
                True,
                found.coverage,
                tau,
                f"{self.name}: {found.describe()} > tau = {tau:g}: retrieve without a draft (the score is that "
                "coverage, a lower bound of max(coverage, U))",
            )
        margin = TargMargin.decide(self, ctx, tau)
        score = max(found.coverage, margin.score)
        retrieve = score > tau
        return GateDecision(
            retrieve,
            score,
            tau,
            f"{self.name} max(coverage {found.coverage:.4g}, U {margin.score:.4g}) = {score:.4g} "
            f"{'>' if retrieve else '<='} tau = {tau:g} ({found.describe()}; {margin.reason})",
        )
