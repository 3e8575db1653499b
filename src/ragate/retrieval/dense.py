"""Dense retrieval: FAISS inner product over L2-normalised passage embeddings (inner product = cosine).

Flat (exact, the default): ``embeddings.npy`` is memory-mapped and searched with ``faiss.knn`` and
``METRIC_INNER_PRODUCT``, the exhaustive kernel ``IndexFlatIP.search`` runs, without copying the matrix into a
FAISS index: the operating system pages it in and shares it between processes. Memory is 4·dim bytes a passage
(384-d: 1.5 KB; 1M passages ≈ 1.5 GB; 10M ≈ 15 GB) and a query costs O(n·dim).

HNSW (``hnsw=True``, approximate): a ``faiss.IndexHNSWFlat`` graph with ``M`` neighbours per node, built with
``ef_construction`` and searched with ``ef_search`` (higher = better recall, slower). It is written in FAISS's
own binary format (``hnsw.faiss``, no pickle) and read with ``IO_FLAG_MMAP_IFC``: its vectors are memory-mapped
from that file, only the graph (about M·2·4 bytes a passage at level 0) is loaded into RAM. The vectors are thus
on disk twice (``embeddings.npy`` serves ``passage_embeddings``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ragate.errors import IndexFormatError
from ragate.retrieval.encoders import Encoder
from ragate.retrieval.ranking import check_queries, make_hits
from ragate.retrieval.store import PassageStore, iter_passage_file, load_array, rebuild_hint
from ragate.retrieval.types import Hit, Passage, Retriever

EMBEDDINGS = "embeddings.npy"
HNSW_FILE = "hnsw.faiss"
ENCODE_CHUNK = 2048
RECENT_BATCHES = 64  # query batches a dense retriever keeps the vectors of (DenseRetriever._encode)


@dataclass(frozen=True)
class HNSWParams:
    """FAISS HNSW settings: graph degree ``M``, build-time and search-time beam widths."""

    m: int = 32
    ef_construction: int = 200
    ef_search: int = 128

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def build_embeddings(
    passages_file: Path,
    n: int,
    out_file: Path,
    encoder: Encoder,
    *,
    batch_size: int = 32,
    progress: bool = True,
) -> None:
    """Embed every stored passage (``Passage.contents``) into a float32 ``.npy`` written in chunks."""
    out = np.lib.format.open_memmap(out_file, mode="w+", dtype=np.float32, shape=(n, encoder.dim))
    stream = iter_passage_file(passages_file)
    row = 0
    with tqdm(total=n, desc=f"embed ({encoder.name})", unit=" passages", disable=not progress) as bar:
        while chunk := list(islice(stream, ENCODE_CHUNK)):
            vectors = encoder.encode_documents([p.contents for p in chunk], batch_size=batch_size)
            out[row : row + len(chunk)] = vectors
            row += len(chunk)
            bar.update(len(chunk))
    if row != n:
        raise RuntimeError(f"embedded {row} passages, expected {n}")
    out.flush()
    del out


def build_hnsw(embeddings_file: Path, out_file: Path, params: HNSWParams, *, progress: bool = True) -> None:
    """Build an HNSW graph over the stored embeddings (FAISS keeps its own copy while building)."""
    import faiss

    vectors = load_array(embeddings_file)
    index = faiss.IndexHNSWFlat(vectors.shape[1], params.m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = params.ef_construction
    step = 10_000
    for start in tqdm(range(0, len(vectors), step), desc="hnsw", unit=" chunks", disable=not progress):
        index.add(np.ascontiguousarray(vectors[start : start + step]))
    faiss.write_index(index, str(out_file))


class DenseRetriever(Retriever):
    """Nearest passages by inner product of normalised embeddings; scores are cosines in [-1, 1]."""

    kind = "dense"
    score_kind = "cosine"  # inner products of L2-normalised vectors

    def __init__(
        self,
        embeddings: np.ndarray,
        passages: PassageStore,
        encoder: Encoder,
        *,
        hnsw: Any = None,
    ) -> None:
        if embeddings.shape != (len(passages), encoder.dim):
            raise ValueError(
                f"embeddings of shape {embeddings.shape} do not match {len(passages)} passages × dim {encoder.dim}"
            )
        self.embeddings = embeddings
        self.passages = passages
        self.encoder = encoder
        self.hnsw = hnsw
        # the last query batches embedded: DPR-AIS searches with [question, pseudo-context], then compares the
        # same two vectors with the documents'; a batch is looked up whole, so a vector is the one the same batch
        # gave, whatever else ran before (answers do not depend on the order of questions or methods)
        self._recent: OrderedDict[tuple[str, ...], np.ndarray] = OrderedDict()
        self._recent_lock = threading.Lock()
        # one encoding at a time: torch already spreads one over the cores, and 16 threads encoding at once spend
        # half again the CPU per call (benchmarks/encoder_concurrency.py); the vectors are the same either way
        self._encode_lock = threading.Lock()

    @classmethod
    def load(
        cls,
        root: Path,
        passages: PassageStore,
        encoder: Encoder,
        *,
        hnsw: bool = False,
        ef_search: int | None = None,
    ) -> DenseRetriever:
        index: Any = None
        if hnsw:
            import faiss

            try:
                index = faiss.read_index(
                    str(root / HNSW_FILE), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY
                )
            except RuntimeError as err:  # faiss's own errors, e.g. a cut or foreign file
                raise IndexFormatError(
                    f"{root / HNSW_FILE} cannot be read ({str(err).splitlines()[0]}); rebuild the index with "
                    f"`{rebuild_hint(root)}`"
                ) from None
            if ef_search is not None:
                index.hnsw.efSearch = ef_search
        embeddings = load_array(root / EMBEDDINGS)
        if embeddings.dtype != np.float32 or embeddings.shape != (len(passages), encoder.dim):
            raise IndexFormatError(
                f"{root / EMBEDDINGS} holds {embeddings.dtype} {embeddings.shape}, expected float32 "
                f"({len(passages)}, {encoder.dim}); rebuild the index with `{rebuild_hint(root)}`"
            )
        return cls(embeddings, passages, encoder, hnsw=index)

    def __len__(self) -> int:
        return len(self.passages)

    def passage(self, passage_id: str) -> Passage:
        return self.passages.get(passage_id)

    @property
    def searches_by_vector(self) -> bool:
        return True

    @property
    def has_embeddings(self) -> bool:
        return True

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        check_queries(queries, 1)
        return self._encode(queries)

    def _encode(self, queries: Sequence[str]) -> np.ndarray:
        """The encoder's vectors for this batch of queries, from the last :data:`RECENT_BATCHES` batches when the
        same batch was embedded there (a copy: callers may change theirs)."""
        key = tuple(queries)
        with self._recent_lock:
            kept = self._recent.get(key)
            if kept is not None:
                self._recent.move_to_end(key)
                return kept.copy()
        with self._encode_lock:
            vectors = self.encoder.encode_queries(queries)
        with self._recent_lock:
            self._recent[key] = vectors.copy()
            while len(self._recent) > RECENT_BATCHES:
                self._recent.popitem(last=False)
        return vectors

    def passage_embeddings(self, passage_ids: Sequence[str]) -> np.ndarray:
        """The stored (normalised float32) vectors of these passages, one row per id, in order."""
        rows = self.passages.rows_of(passage_ids)
        return np.asarray(self.embeddings[rows], dtype=np.float32).reshape(len(rows), self.encoder.dim)

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (scores, rows) for normalised query vectors, each of shape ``(len(vectors), min(k, n))``."""
        import faiss

        k = min(k, len(self.passages))
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if self.hnsw is not None:
            # efSearch below k would cut the result list short.
            if self.hnsw.hnsw.efSearch < k:
                params = faiss.SearchParametersHNSW(efSearch=k)  # type: ignore[attr-defined]
                scores, rows = self.hnsw.search(vectors, k, params=params)
            else:
                scores, rows = self.hnsw.search(vectors, k)
        else:
            scores, rows = faiss.knn(vectors, self.embeddings, k, metric=faiss.METRIC_INNER_PRODUCT)
        # the build refuses NaN vectors: a NaN score means the file was changed since
        if not np.isfinite(scores[rows >= 0]).all():
            raise IndexFormatError(
                f"{EMBEDDINGS} of the index holding {len(self.passages)} passages at {self.passages.root} gives NaN "
                f"or infinite scores (damaged); rebuild the index with `{rebuild_hint(self.passages.root)}`"
            )
        return scores, rows

    def search_rows(self, queries: Sequence[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, the top rows and their scores (the hybrid retriever fuses these)."""
        check_queries(queries, k)
        if not queries:
            return []
        scores, rows = self.search_vectors(self._encode(queries), k)
        out = []
        for q_rows, q_scores in zip(rows, scores, strict=True):
            keep = q_rows >= 0  # HNSW marks missing neighbours with -1
            out.append((q_rows[keep].astype(np.int64), q_scores[keep]))
        return out

    def search_by_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        scores, rows = self.search_vectors(vectors, k)
        return [
            make_hits(r[r >= 0].astype(np.int64), s[r >= 0], self.passages.by_row)
            for r, s in zip(rows, scores, strict=True)
        ]

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [
            make_hits(rows, scores, self.passages.by_row) for rows, scores in self.search_rows(queries, k)
        ]

    def close(self) -> None:
        self.hnsw = None
        self.passages.close()
