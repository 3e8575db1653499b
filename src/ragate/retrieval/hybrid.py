"""Hybrid retrieval: BM25 and dense rankings fused by reciprocal rank (RRF, Cormack et al., SIGIR 2009).

For each query both retrievers rank their top ``depth = max(k, fusion_depth)`` passages (``fusion_depth`` = 100
by default); the fused score of passage d is::

    score(d) = 1 / (60 + rank_bm25(d)) + 1 / (60 + rank_dense(d))

with 1-based ranks and a term left out when d is not in that list (BM25 passages scoring 0, i.e. sharing no term
with the query, are not ranked at all). A passage first in both lists scores 2/61 ≈ 0.0328. Only ranks matter,
so the two score scales need no calibration. The hybrid index directory holds both the BM25 arrays and the
embeddings over one shared passage store; ``passage_embeddings`` returns the dense vectors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ragate.retrieval.bm25 import BM25Retriever
from ragate.retrieval.dense import DenseRetriever
from ragate.retrieval.ranking import RRF_K, check_queries, make_hits, reciprocal_rank_fusion
from ragate.retrieval.types import Hit, Passage, Retriever, ScoredHits

FUSION_DEPTH = 100


class HybridRetriever(Retriever):
    """BM25 + dense over the same passages, fused by reciprocal rank with constant ``rrf_k`` (60)."""

    kind = "hybrid"
    score_kind = "rrf"

    def __init__(
        self,
        bm25: BM25Retriever,
        dense: DenseRetriever,
        *,
        fusion_depth: int = FUSION_DEPTH,
        rrf_k: int = RRF_K,
    ) -> None:
        if len(bm25) != len(dense):
            raise ValueError(f"BM25 has {len(bm25)} passages but dense has {len(dense)}: build them together")
        self.bm25 = bm25
        self.dense = dense
        self.passages = dense.passages
        self.fusion_depth = fusion_depth
        self.rrf_k = rrf_k

    def __len__(self) -> int:
        return len(self.dense)

    def passage(self, passage_id: str) -> Passage:
        return self.passages.get(passage_id)

    @property
    def searches_by_vector(self) -> bool:
        return True

    @property
    def has_embeddings(self) -> bool:
        return True

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.dense.embed_queries(queries)

    def passage_embeddings(self, passage_ids: Sequence[str]) -> np.ndarray:
        return self.dense.passage_embeddings(passage_ids)

    def search_by_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """By vector there is no BM25 side: the dense half answers."""
        return self.dense.search_by_vectors(vectors, k)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [found.hits for found in self.scored_search(queries, k)]

    def scored_search(self, queries: Sequence[str], k: int) -> list[ScoredHits]:
        """The fused hits and, as their similarity scores, the dense half's top-k cosines (the fused scores carry
        only ranks: the first hit's is 2/61 whenever both halves agree on it)."""
        check_queries(queries, k)
        depth = max(k, self.fusion_depth)
        lexical = self.bm25.search_rows(queries, depth)
        semantic = self.dense.search_rows(queries, depth)
        results = []
        for (bm25_rows, bm25_scores), (dense_rows, dense_scores) in zip(lexical, semantic, strict=True):
            rows, scores = reciprocal_rank_fusion([bm25_rows[bm25_scores > 0], dense_rows], k=self.rrf_k)
            hits = make_hits(rows[:k], scores[:k], self.passages.by_row)
            results.append(ScoredHits(hits, np.asarray(dense_scores[:k], dtype=np.float64), "cosine"))
        return results

    def close(self) -> None:
        self.bm25.close()
        self.dense.close()
