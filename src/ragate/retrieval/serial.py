"""A retriever that one thread uses at a time (:class:`ragate.Pipeline` and the service share one across threads)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragate.retrieval.types import Hit, Passage, Retriever, ScoredHits


class SerialRetriever(Retriever):
    """A retriever used by one thread at a time (a fast tokenizer shared across threads raises "Already
    borrowed"; FAISS and bm25s are fine, but one lock is simpler than knowing which)."""

    def __init__(self, inner: Retriever) -> None:
        self.inner, self.kind, self._lock = inner, inner.kind, threading.Lock()
        self.score_kind = inner.score_kind

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        with self._lock:
            return self.inner.search(queries, k)

    def scored_search(self, queries: Sequence[str], k: int) -> list[ScoredHits]:
        with self._lock:
            return self.inner.scored_search(queries, k)

    def __len__(self) -> int:
        return len(self.inner)

    def passage(self, passage_id: str) -> Passage:
        with self._lock:
            return self.inner.passage(passage_id)

    @property
    def has_embeddings(self) -> bool:
        return self.inner.has_embeddings

    @property
    def searches_by_vector(self) -> bool:
        return self.inner.searches_by_vector

    @property
    def encoder(self) -> Any:
        """The inner retriever's query encoder (dense, or hybrid's dense half), for identity checks (SKR)."""
        return getattr(self.inner, "encoder", None) or getattr(
            getattr(self.inner, "dense", None), "encoder", None
        )

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        with self._lock:
            return self.inner.embed_queries(queries)

    def passage_embeddings(self, passage_ids: Sequence[str]) -> np.ndarray:
        with self._lock:
            return self.inner.passage_embeddings(passage_ids)

    def search_by_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        with self._lock:
            return self.inner.search_by_vectors(vectors, k)

    def close(self) -> None:
        self.inner.close()
