"""Ranking helpers shared by the retrievers: argument checks, deterministic top-k, reciprocal-rank fusion."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ragate.retrieval.types import Hit, Passage

RRF_K = 60


def check_queries(queries: Sequence[str], k: int) -> None:
    """A list (not one string) of non-empty strings and ``k >= 1``; errors say how to fix the call."""
    if isinstance(queries, str):
        raise TypeError("search takes a list of queries: wrap a single query as [query]")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    for i, query in enumerate(queries):
        if not isinstance(query, str) or not query.strip():
            raise ValueError(f"query {i} is empty: pass a non-empty question or search string")


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Rows of the ``k`` highest scores, best first, ties broken by lower row (deterministic), in O(n)."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    kth = np.partition(scores, len(scores) - k)[len(scores) - k]  # the k-th highest score
    above = np.flatnonzero(scores > kth)
    above = above[np.lexsort((above, -scores[above]))]
    tied = np.flatnonzero(scores == kth)[: k - len(above)]  # flatnonzero is already in row order
    return np.concatenate([above, tied]).astype(np.int64)


def reciprocal_rank_fusion(
    rankings: Sequence[np.ndarray], *, k: int = RRF_K
) -> tuple[np.ndarray, np.ndarray]:
    """Fuse ranked lists of rows (best first) by reciprocal rank (Cormack, Clarke & Büttcher, SIGIR 2009).

    ``score(d) = Σ_r 1 / (k + rank_r(d))`` with 1-based ranks; a list that does not contain ``d`` adds nothing.
    Returns (rows, scores), best first, ties broken by lower row.
    """
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, row in enumerate(ranking.tolist(), start=1):
            fused[row] = fused.get(row, 0.0) + 1.0 / (k + rank)
    rows = np.fromiter(fused.keys(), dtype=np.int64, count=len(fused))
    scores = np.fromiter(fused.values(), dtype=np.float64, count=len(fused))
    order = np.lexsort((rows, -scores))
    return rows[order], scores[order]


def make_hits(rows: np.ndarray, scores: np.ndarray, passage_of_row: Callable[[int], Passage]) -> list[Hit]:
    """Hits with 1-based ranks for rows already in rank order."""
    return [
        Hit(passage_of_row(int(row)), float(score), rank)
        for rank, (row, score) in enumerate(zip(rows.tolist(), scores.tolist(), strict=True), start=1)
    ]
