"""Dual-path retrieval (DPR) with adaptive information selection (AIS): DTR Section 4.2 / Algorithm 1, which PAIRS
Algorithm 1 repeats.

1. Retrieve the top n documents for the question q and the top n for the pseudo-context p (n = 5 per path).
2. Merge by document id, question-path documents first (at most 2n candidates).
3. Score every candidate by its cosine to q (s1) and to p (s2), whichever path found it, and keep the best k
   (k = 3) under an AIS score (:mod:`ragate.selection.ais`; ``cos``, DTR Eq. 7, by default).

Ablations from the papers: ``paths="question"`` or ``"pseudo"`` (w/o DPR: one path retrieves the top 2n, then AIS,
as PAIRS defines it) and :func:`fixed_split` (w/o AIS: a documents from the question path and b from the
pseudo-context path, e.g. 2q+1p and 1q+2p; duplicates of a question-path document are skipped on the second path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ragate.retrieval.types import Hit, Retriever
from ragate.selection.ais import DYNAMIC_ALPHA_PAPER, AISScore, ais_scores, top_k_stable

Paths = Literal["both", "question", "pseudo"]


@dataclass(frozen=True)
class Scored:
    """A kept document with its similarities to q and p and its AIS score."""

    hit: Hit
    s1: float
    s2: float
    score: float


def merge_by_id(*ranked: list[Hit]) -> list[Hit]:
    """Concatenate ranked lists, keeping the first occurrence of each document id."""
    seen: set[str] = set()
    merged = []
    for hits in ranked:
        for hit in hits:
            if hit.id not in seen:
                seen.add(hit.id)
                merged.append(hit)
    return merged


def dpr_ais(
    retriever: Retriever,
    question: str,
    pseudo_context: str,
    *,
    n: int = 5,
    k: int = 3,
    score: AISScore = "cos",
    paths: Paths = "both",
    alpha_coefficients: tuple[float, float] = DYNAMIC_ALPHA_PAPER,
) -> list[Scored]:
    """The k documents DPR-AIS keeps for ``question`` given the model's ``pseudo_context`` (best first).

    ``retriever`` must hold embeddings (dense, hybrid or Milvus): AIS compares vectors of one encoder.
    """
    if not retriever.has_embeddings:
        raise ValueError(
            f"DPR-AIS needs passage embeddings; a {retriever.kind} index has none: build a dense or hybrid index"
        )
    if paths == "both":
        q_hits, p_hits = retriever.search([question, pseudo_context], n)
        candidates = merge_by_id(q_hits, p_hits)
    else:
        query = question if paths == "question" else pseudo_context
        candidates = retriever.search([query], 2 * n)[0]
    if not candidates:
        return []
    q_vec, p_vec = retriever.embed_queries([question, pseudo_context])
    docs = retriever.passage_embeddings([h.id for h in candidates])
    s1, s2 = docs @ q_vec, docs @ p_vec
    scores = ais_scores(
        s1, s2, score, qp_similarity=float(q_vec @ p_vec), alpha_coefficients=alpha_coefficients
    )
    keep = top_k_stable(scores, k)
    return [Scored(candidates[i], float(s1[i]), float(s2[i]), float(scores[i])) for i in keep]


def fixed_split(
    retriever: Retriever, question: str, pseudo_context: str, *, from_question: int, from_pseudo: int
) -> list[Hit]:
    """The w/o-AIS ablation: the first ``from_question`` question-path documents, then the next
    ``from_pseudo`` pseudo-context-path documents not already taken (2q+1p: 2 and 1; 1q+2p: 1 and 2)."""
    depth = from_question + from_pseudo
    q_hits, p_hits = retriever.search([question, pseudo_context], depth)
    taken = q_hits[:from_question]
    ids = {h.id for h in taken}
    extra = [h for h in p_hits if h.id not in ids][:from_pseudo]
    return taken + extra


def rerank_scores(question_scores: np.ndarray, pseudo_scores: np.ndarray) -> np.ndarray:
    """PAIRS Eq. 7: s(d) = K(d, q) + K(d, p), the sum of a cross-encoder's raw scores for the two pairings."""
    return np.asarray(question_scores, dtype=np.float64) + np.asarray(pseudo_scores, dtype=np.float64)
