"""Retrieval data types: a passage of the corpus, a search hit, and the retriever interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ragate.types import Closeable


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of the corpus: a Wikipedia paragraph or a chunk of a longer document.

    ``source`` names where it came from (a QA file, a document's path); ``span`` is the chunk's character range
    ``[start, end)`` in its document's extracted text, when it was cut from one (``ragate index build --docs``).
    """

    id: str
    title: str
    text: str
    source: str | None = None
    span: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a passage needs a non-empty id")

    @property
    def contents(self) -> str:
        """``"title\\ntext"``, the form FlashRAG indexes and the encoders embed (just ``text`` without a title)."""
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass(frozen=True)
class Hit:
    """A passage returned for a query, with its score under the retriever that found it and its 1-based rank."""

    passage: Passage
    score: float
    rank: int

    @property
    def id(self) -> str:
        return self.passage.id


@dataclass(frozen=True, eq=False)
class ScoredHits:
    """One query's hits (what :meth:`Retriever.search` returns) and the similarity scores its ranking rests on, best
    first (``kind``: "cosine" for a dense index or a hybrid index's dense half, "bm25", or "score" for a retriever
    that says nothing of its scale). A gate that reads no model reads these (:mod:`ragate.gates.nomodel`)."""

    hits: list[Hit]
    scores: np.ndarray
    kind: str


class Retriever(Closeable, ABC):
    """Ranked search over a corpus. ``search`` is batched: a list of queries in, one ranked list per query out.

    Retrievers that hold passage embeddings (dense, hybrid, Milvus) also answer ``embed_queries`` and
    ``passage_embeddings`` with L2-normalised float32 vectors from the same encoder, which DTR's and PAIRS's
    adaptive information selection need (cosine = inner product).
    """

    kind: str
    score_kind: str = "score"  # what a hit's score is: "cosine", "bm25", "rrf" (ranks only), "score" (unknown)

    @abstractmethod
    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def passage(self, passage_id: str) -> Passage:
        """The passage with this id; ``KeyError`` naming the id when the corpus has none."""

    def scored_search(self, queries: Sequence[str], k: int) -> list[ScoredHits]:
        """:meth:`search` and, per query, the similarity scores its ranking rests on: the hits' own scores here; a
        hybrid index, whose fused scores carry only ranks, gives its dense half's cosines (one search either way)."""
        return [
            ScoredHits(hits, np.array([h.score for h in hits], dtype=np.float64), self.score_kind)
            for hits in self.search(queries, k)
        ]

    @property
    def has_embeddings(self) -> bool:
        return False

    @property
    def searches_by_vector(self) -> bool:
        """Whether :meth:`search_by_vectors` works (HyDE needs it)."""
        return False

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        raise NotImplementedError(f"a {self.kind} retriever holds no embeddings; use a dense or hybrid index")

    def passage_embeddings(self, passage_ids: Sequence[str]) -> np.ndarray:
        raise NotImplementedError(f"a {self.kind} retriever holds no embeddings; use a dense or hybrid index")

    def search_by_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Nearest passages to already-encoded, normalised query vectors (HyDE averages several encodings)."""
        raise NotImplementedError(
            f"a {self.kind} retriever cannot search by vector; use a dense or hybrid index"
        )
