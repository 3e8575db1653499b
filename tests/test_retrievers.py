"""One retrieval suite run on every retriever (BM25, dense flat, dense HNSW, hybrid, Milvus on milvus-lite), all
real components on a 40-passage Wikipedia-style corpus; plus bm25s against a reference BM25 and RRF by hand."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from ragate.retrieval.bm25 import BM25Params, BM25Retriever, tokenize_queries
from ragate.retrieval.encoders import Encoder
from ragate.retrieval.index import build_index, open_index
from ragate.retrieval.ranking import RRF_K, reciprocal_rank_fusion, top_k
from ragate.retrieval.types import Passage, Retriever

RELEVANT = {
    "Who discovered the antibacterial effect of penicillin?": "w27",
    "Which composer wrote nine symphonies and kept composing after he became deaf?": "w15",
    "When did Apollo 11 land humans on the Moon?": "w12",
    "Who invented the World Wide Web at CERN?": "w24",
    "What is the largest hot desert in the world?": "w16",
    "Who painted The Starry Night?": "w30",
    "first ascent of Mount Everest by Hillary and Norgay": "w06",
}
KINDS = ["bm25", "dense-flat", "dense-hnsw", "hybrid", "milvus"]


def open_retriever(kind: str, where: Path, minilm: Encoder) -> Retriever:
    if kind == "milvus":
        from ragate.retrieval.milvus import MilvusRetriever

        return MilvusRetriever.open(where / "milvus.db", encoder=minilm)
    return open_index(where / kind, encoder=minilm if kind != "bm25" else None)


def build_retriever(kind: str, where: Path, passages: list[Passage], minilm: Encoder) -> Retriever:
    if kind == "milvus":
        pytest.importorskip("milvus_lite")
        from ragate.retrieval.milvus import MilvusRetriever

        return MilvusRetriever.build(
            passages, where / "milvus.db", encoder=minilm, insert_batch=16, progress=False
        )
    index_kind = "dense" if kind.startswith("dense") else kind
    build_index(passages, where / kind, index_kind, encoder=minilm, hnsw=kind == "dense-hnsw", progress=False)  # type: ignore[arg-type]
    return open_retriever(kind, where, minilm)


@pytest.fixture(scope="module")
def index_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("indexes")


@pytest.fixture(scope="module", params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def retriever(
    kind: str, index_root: Path, wiki_passages: list[Passage], minilm: Encoder
) -> Iterator[Retriever]:
    r = build_retriever(kind, index_root, wiki_passages, minilm)
    yield r
    r.close()


@pytest.fixture(scope="module")
def by_kind(
    index_root: Path, wiki_passages: list[Passage], minilm: Encoder
) -> Iterator[Callable[[str], Retriever]]:
    """Open (building if needed) a retriever of a given kind, for the cross-retriever comparisons."""
    opened: list[Retriever] = []

    def get(kind: str) -> Retriever:
        exists = (index_root / ("milvus.db" if kind == "milvus" else kind)).exists()
        r = (
            open_retriever(kind, index_root, minilm)
            if exists
            else build_retriever(kind, index_root, wiki_passages, minilm)
        )
        opened.append(r)
        return r

    yield get
    for r in opened:
        r.close()


# ----------------------------------------------------------------------------- the shared suite


def test_relevant_passage_ranks_first(retriever: Retriever) -> None:
    results = retriever.search(list(RELEVANT), 3)
    assert [hits[0].id for hits in results] == list(RELEVANT.values())


def test_hits_are_ranked_and_sorted(retriever: Retriever, wiki_passages: list[Passage]) -> None:
    originals = {p.id: p for p in wiki_passages}
    for hits in retriever.search(list(RELEVANT), 10):
        assert [h.rank for h in hits] == list(range(1, 11))
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert len({h.id for h in hits}) == 10
        for h in hits:
            assert h.passage == originals[h.id]  # title, text and source come back intact


def test_k_handling(retriever: Retriever, wiki_passages: list[Passage]) -> None:
    query = ["Who painted The Starry Night?"]
    assert len(retriever.search(query, 1)[0]) == 1
    assert len(retriever) == len(wiki_passages)
    everything = retriever.search(query, 1000)[0]
    assert sorted(h.id for h in everything) == sorted(p.id for p in wiki_passages)
    with pytest.raises(ValueError, match="k must be at least 1"):
        retriever.search(query, 0)


def test_batch_equals_one_query_at_a_time(retriever: Retriever) -> None:
    queries = list(RELEVANT)
    batched = retriever.search(queries, 5)
    for query, hits in zip(queries, batched, strict=True):
        (single,) = retriever.search([query], 5)
        assert [h.id for h in single] == [h.id for h in hits]
        np.testing.assert_allclose([h.score for h in single], [h.score for h in hits], rtol=1e-5, atol=1e-6)


def test_empty_and_bad_queries(retriever: Retriever) -> None:
    assert retriever.search([], 5) == []
    with pytest.raises(ValueError, match="query 1 is empty"):
        retriever.search(["fine", "  "], 5)
    with pytest.raises(TypeError, match="wrap a single query"):
        retriever.search("not a list", 5)  # type: ignore[arg-type]


def test_passage_lookup(retriever: Retriever, wiki_passages: list[Passage]) -> None:
    for p in wiki_passages[::7]:
        assert retriever.passage(p.id) == p
    with pytest.raises(KeyError, match="no-such-id"):
        retriever.passage("no-such-id")


def test_reopened_index_gives_identical_results(
    kind: str, retriever: Retriever, index_root: Path, minilm: Encoder
) -> None:
    queries = list(RELEVANT)
    before = retriever.search(queries, 8)
    with open_retriever(kind, index_root, minilm) as again:
        after = again.search(queries, 8)
    for a, b in zip(before, after, strict=True):
        assert [h.id for h in a] == [h.id for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-6)


def test_embeddings(retriever: Retriever, wiki_passages: list[Passage], minilm: Encoder) -> None:
    ids = [p.id for p in wiki_passages[:5]]
    if not retriever.has_embeddings:
        with pytest.raises(NotImplementedError, match="dense or hybrid"):
            retriever.passage_embeddings(ids)
        return
    stored = retriever.passage_embeddings(ids[::-1])
    assert stored.dtype == np.float32 and stored.shape == (5, 384)
    fresh = minilm.encode_documents([p.contents for p in wiki_passages[:5]][::-1])
    np.testing.assert_allclose(stored, fresh, atol=1e-5)
    q = retriever.embed_queries(["Who painted The Starry Night?"])
    np.testing.assert_allclose(q, minilm.encode_queries(["Who painted The Starry Night?"]), atol=1e-6)
    with pytest.raises(KeyError):
        retriever.passage_embeddings(["no-such-id"])


# ----------------------------------------------------------------------------- across retrievers


def test_milvus_matches_faiss_flat(by_kind: Callable[[str], Retriever]) -> None:
    """The Milvus retriever gives the FAISS flat index's top ids and scores on the same vectors."""
    pytest.importorskip("milvus_lite")
    dense, milvus = by_kind("dense-flat"), by_kind("milvus")
    queries = [
        *RELEVANT,
        "ancient civilisation along a river",
        "a famous painter",
        "sports invented in America",
    ]
    for d_hits, m_hits in zip(dense.search(queries, 10), milvus.search(queries, 10), strict=True):
        assert [h.id for h in d_hits] == [h.id for h in m_hits]
        np.testing.assert_allclose([h.score for h in d_hits], [h.score for h in m_hits], atol=1e-4)


def test_hnsw_matches_flat_on_a_small_corpus(by_kind: Callable[[str], Retriever]) -> None:
    flat, hnsw = by_kind("dense-flat"), by_kind("dense-hnsw")
    for a, b in zip(flat.search(list(RELEVANT), 10), hnsw.search(list(RELEVANT), 10), strict=True):
        assert [h.id for h in a] == [h.id for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-5)


def test_hybrid_is_rrf_of_bm25_and_dense(by_kind: Callable[[str], Retriever]) -> None:
    bm25, dense, hybrid = by_kind("bm25"), by_kind("dense-flat"), by_kind("hybrid")
    query = ["ancient civilisation along the longest river"]
    lexical = [h for h in bm25.search(query, 40)[0] if h.score > 0]
    semantic = dense.search(query, 40)[0]
    expected: Counter[str] = Counter()
    for hits in (lexical, semantic):
        for h in hits:
            expected[h.id] += 1 / (RRF_K + h.rank)
    fused = hybrid.search(query, 40)[0]
    assert len(fused) == 40
    for h in fused:
        assert h.score == pytest.approx(expected[h.id], abs=1e-12)
    assert fused[0].score <= 2 / (RRF_K + 1)


# ----------------------------------------------------------------------------- BM25 against a reference


def reference_bm25(docs: list[list[str]], query: list[str], k1: float, b: float) -> np.ndarray:
    """Lucene BM25 written out: idf = ln(1 + (N - df + 0.5)/(df + 0.5)), tf part tf/(tf + k1(1 - b + b|d|/avgdl))."""
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    df = Counter(t for d in docs for t in set(d))
    scores = np.zeros(n)
    for i, doc in enumerate(docs):
        tf = Counter(doc)
        for term in query:
            if tf[term] == 0:
                continue
            idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
            scores[i] += idf * tf[term] / (tf[term] + k1 * (1 - b + b * len(doc) / avgdl))
    return scores


@pytest.mark.parametrize(("k1", "b"), [(1.5, 0.75), (0.9, 0.4), (2.0, 1.0)])
def test_bm25s_matches_reference_bm25(tmp_path: Path, k1: float, b: float) -> None:
    import Stemmer

    passages = [
        Passage("a", "Cats", "The cat sat on the mat. Cats like mats and warm mats."),
        Passage("b", "Dogs", "A dog chased the cat around the garden; the dog barked."),
        Passage("c", "Birds", "Birds sing in the garden at dawn."),
        Passage("d", "", "Mats, rugs and carpets cover floors in a house with a cat and a dog."),
        Passage("e", "Fish", "Goldfish swim."),
    ]
    params = BM25Params(k1=k1, b=b)
    build_index(passages, tmp_path / "bm25", "bm25", bm25_params=params, progress=False)
    retriever = open_index(tmp_path / "bm25")
    assert isinstance(retriever, BM25Retriever)
    stemmer = Stemmer.Stemmer("english")
    docs = tokenize_queries([p.contents for p in passages], params, stemmer)  # bm25s's own tokens
    for query in ["cat on a mat", "garden dog dog", "birds at dawn", "goldfish", "carpets in the house"]:
        (terms,) = tokenize_queries([query], params, stemmer)
        expected = reference_bm25(docs, terms, k1, b)
        np.testing.assert_allclose(retriever.score_all(query), expected, atol=1e-5)
        hits = retriever.search([query], 5)[0]
        order = sorted(range(5), key=lambda i: (-expected[i], i))
        assert [h.id for h in hits] == [passages[i].id for i in order]
    # No query term in the corpus: every passage scores 0 and they come in row order.
    assert not retriever.score_all("zebra").any()
    assert [(h.id, h.score) for h in retriever.search(["zebra"], 3)[0]] == [
        ("a", 0.0),
        ("b", 0.0),
        ("c", 0.0),
    ]
    retriever.close()


# ----------------------------------------------------------------------------- pure ranking helpers


def test_top_k_is_deterministic_with_ties() -> None:
    scores = np.array([0.5, 2.0, 0.5, 3.0, 0.5, 0.0], dtype=np.float32)
    assert top_k(scores, 3).tolist() == [3, 1, 0]
    assert top_k(scores, 4).tolist() == [3, 1, 0, 2]
    assert top_k(scores, 100).tolist() == [3, 1, 0, 2, 4, 5]


def test_reciprocal_rank_fusion() -> None:
    rows, scores = reciprocal_rank_fusion([np.array([7, 3, 5]), np.array([3, 9])], k=60)
    assert rows.tolist() == [3, 7, 9, 5]
    assert scores.tolist() == pytest.approx([1 / 62 + 1 / 61, 1 / 61, 1 / 62, 1 / 63])


# ----------------------------------------------------------------------------- Milvus specifics


def test_milvus_from_stored_vectors_and_its_errors(
    by_kind: Callable[[str], Retriever], index_root: Path, wiki_passages: list[Passage], minilm: Encoder
) -> None:
    """A dense index moves to Milvus without re-encoding; a second collection, mismatch and misuse errors."""
    pytest.importorskip("milvus_lite")
    from ragate.errors import EncoderMismatchError, IndexFormatError
    from ragate.retrieval.milvus import MilvusRetriever

    dense = by_kind("dense-flat")
    uri = index_root / "milvus.db"
    moved = MilvusRetriever.build(
        wiki_passages,
        uri,
        encoder=minilm,
        vectors=dense.embeddings,  # type: ignore[attr-defined]
        collection="from_dense",
        index_type="AUTOINDEX",
        progress=False,
    )
    try:
        assert len(moved) == len(wiki_passages) and moved.manifest["params"]["index_type"] == "AUTOINDEX"
        for a, b in zip(dense.search(list(RELEVANT), 5), moved.search(list(RELEVANT), 5), strict=True):
            assert [h.id for h in a] == [h.id for h in b]
            np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-4)
        ids = [p.id for p in wiki_passages[:3]]
        np.testing.assert_array_equal(moved.passage_embeddings(ids), dense.passage_embeddings(ids))
    finally:
        moved.close()

    with pytest.raises(IndexFormatError, match="already exists.*overwrite=True"):
        MilvusRetriever.build(wiki_passages[:2], uri, encoder=minilm, collection="from_dense", progress=False)
    with pytest.raises(IndexFormatError, match="no collection 'nope'"):
        MilvusRetriever.open(uri, collection="nope", encoder=minilm)
    e5_style = minilm.with_identity(
        name="minilm-e5-style", query_prefix="query: ", document_prefix="passage: "
    )
    with pytest.raises(EncoderMismatchError, match="built with encoder 'all-MiniLM-L6-v2'"):
        MilvusRetriever.open(uri, collection="from_dense", encoder=e5_style)
    replaced = MilvusRetriever.build(
        wiki_passages[:2], uri, encoder=minilm, collection="from_dense", overwrite=True, progress=False
    )
    with replaced:
        assert len(replaced) == 2 and len(replaced.search(["anything at all"], 10)[0]) == 2
    with MilvusRetriever.open(
        uri, collection="from_dense"
    ) as reopened:  # the encoder recorded in the collection
        assert reopened.encoder.name == "all-MiniLM-L6-v2" and len(reopened) == 2
        assert not [c for c in reopened.client.list_collections() if "__building_" in c]
