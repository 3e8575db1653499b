"""BM25 on bm25s: English stop words removed, Snowball (PyStemmer) stems, Lucene's BM25 variant.

Score of passage d for query q (bm25s ``method="lucene"``, its default; Kamphuis et al., ECIR 2020)::

    score(q, d) = Σ_{t ∈ q ∩ d} idf(t) · tf(t, d) / (tf(t, d) + k1 · (1 − b + b · |d| / avgdl))
    idf(t)      = ln(1 + (N − df(t) + 0.5) / (df(t) + 0.5))

with ``k1 = 1.5`` and ``b = 0.75`` by default (bm25s's and Lucene's common setting; :class:`BM25Params`).
Query terms repeated in the query count once per occurrence, as in bm25s. A passage sharing no term with the
query scores 0; such passages fill a result list after every matching passage, in row order, so a search
always returns ``min(k, len(index))`` hits.

On disk (``bm25/`` in the index directory) are bm25s's own files: the CSC score matrix as three ``.npy`` arrays
(saved with ``allow_pickle=False``, loaded memory-mapped) and ``vocab.index.json`` / ``params.index.json``.
bm25s's ``save``/``load`` never pickle with the default ``allow_pickle=False``; the corpus is not handed to bm25s
(the index keeps its own passage store).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import IndexFormatError
from ragate.retrieval.ranking import check_queries, make_hits, top_k
from ragate.retrieval.store import PassageStore, iter_passage_file, rebuild_hint
from ragate.retrieval.types import Hit, Passage, Retriever

BM25_DIR = "bm25"


@dataclass(frozen=True)
class BM25Params:
    """BM25 settings. ``k1`` saturates term frequency, ``b`` normalises by passage length (0 = none)."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    stopwords: str = "en"
    stemmer: str = "english"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BM25Params:
        return cls(**{k: data[k] for k in ("k1", "b", "method", "stopwords", "stemmer") if k in data})


def _make_stemmer(name: str) -> Any:
    import Stemmer

    return Stemmer.Stemmer(name)


def make_tokenizer(params: BM25Params) -> Any:
    """A bm25s tokenizer (lower-case, ``\\w\\w+`` words, stop words, Snowball stems) for these params."""
    import bm25s

    return bm25s.tokenization.Tokenizer(
        lower=True, stopwords=params.stopwords, stemmer=_make_stemmer(params.stemmer)
    )


def tokenize_queries(queries: Sequence[str], params: BM25Params, stemmer: Any) -> list[list[str]]:
    """Stemmed query terms, the same tokenisation bm25s applies to passages; empty terms dropped."""
    import bm25s

    tokens = bm25s.tokenize(
        list(queries), stopwords=params.stopwords, stemmer=stemmer, return_ids=False, show_progress=False
    )
    return [[t for t in q if t] for q in tokens]


def build_bm25(passages_file: Path, n: int, out_dir: Path, params: BM25Params, *, progress: bool) -> None:
    """Tokenise the stored passages (streamed from ``passages_file``) and write the bm25s index to ``out_dir``."""
    import bm25s

    tokenizer = make_tokenizer(params)
    texts: Iterator[str] = (p.contents for p in iter_passage_file(passages_file))
    ids = tokenizer.tokenize(texts, length=n, update_vocab=True, return_as="ids", show_progress=progress)
    model = bm25s.BM25(k1=params.k1, b=params.b, method=params.method)
    model.index(
        bm25s.tokenization.Tokenized(ids=ids, vocab=tokenizer.get_vocab_dict()), show_progress=progress
    )
    model.save(str(out_dir), allow_pickle=False, show_progress=False)


def _matrix_fault(model: Any, n: int) -> str | None:
    """What is inconsistent in a loaded bm25s score matrix (CSC: one column of passage scores per vocabulary
    term), checked in time linear in the vocabulary (the stored scores' rows are not scanned: a cold read of
    gigabytes at every open; a row outside the index fails the search, which names the index); None when whole."""
    scores = model.scores or {}
    data, indices, indptr = (scores.get(k) for k in ("data", "indices", "indptr"))
    if not all(isinstance(a, np.ndarray) and a.ndim == 1 for a in (data, indices, indptr)):
        return "the score matrix lacks one of its arrays (data, indices, indptr)"
    assert isinstance(data, np.ndarray) and isinstance(indices, np.ndarray) and isinstance(indptr, np.ndarray)
    if scores.get("num_docs") != n:
        return f"the scores are for {scores.get('num_docs')!r} passages, the index holds {n}"
    if data.dtype.kind != "f" or indices.dtype.kind not in "iu" or indptr.dtype.kind not in "iu":
        return "an array has the wrong type (data: floats, indices and indptr: integers)"
    if len(indptr) != len(model.vocab_dict) + 1 or len(indptr) == 0:
        return f"indptr has {len(indptr)} entries for a vocabulary of {len(model.vocab_dict)} terms"
    if indptr[0] != 0 or indptr[-1] != len(data) or len(indices) != len(data) or np.any(np.diff(indptr) < 0):
        return "indptr does not delimit the stored scores"
    ids = list(model.vocab_dict.values())
    if not all(isinstance(i, int) and 0 <= i < len(indptr) - 1 for i in ids):
        return "the vocabulary names a term outside the score matrix"
    return None


class BM25Retriever(Retriever):
    """Lexical retrieval over a bm25s index whose score arrays are memory-mapped."""

    kind = "bm25"
    score_kind = "bm25"

    def __init__(
        self, model: Any, passages: PassageStore, params: BM25Params, bm25_dir: Path = Path(BM25_DIR)
    ) -> None:
        self.model = model
        self.bm25_dir = bm25_dir
        self.passages = passages
        self.params = params
        self._stemmer = _make_stemmer(params.stemmer)

    @classmethod
    def load(cls, bm25_dir: Path, passages: PassageStore, params: BM25Params) -> BM25Retriever:
        import bm25s

        try:
            model = bm25s.BM25.load(str(bm25_dir), mmap=True, allow_pickle=False, load_corpus=False)
            bad = [
                name for name, array in (model.scores or {}).items()
                if isinstance(array, np.ndarray) and array.dtype == object
            ]  # fmt: skip
            if bad or not isinstance(model.vocab_dict, dict):
                raise ValueError(
                    f"arrays {bad} are not numeric" if bad else "the vocabulary is not a JSON object"
                )
            fault = _matrix_fault(model, len(passages))
            if fault:
                raise ValueError(fault)
            # the stop words and stemmer the build recorded
            tokenize_queries(["a probe"], params, _make_stemmer(params.stemmer))
        except (ValueError, TypeError, KeyError, OSError, EOFError, AttributeError) as err:
            # truncated or malformed JSON, an object-dtype or truncated array, a missing file
            raise IndexFormatError(
                f"{bm25_dir}: the BM25 files cannot be read ({type(err).__name__}: {err}); rebuild the index "
                f"with `{rebuild_hint(bm25_dir.parent)}`"
            ) from None
        return cls(model, passages, params, bm25_dir)

    def __len__(self) -> int:
        return len(self.passages)

    def passage(self, passage_id: str) -> Passage:
        return self.passages.get(passage_id)

    def score_all(self, query: str) -> np.ndarray:
        """BM25 score of every passage for one query (float32, row order)."""
        (terms,) = tokenize_queries([query], self.params, self._stemmer)
        token_ids = self.model.get_tokens_ids(terms)
        if not token_ids:
            return np.zeros(len(self.passages), dtype=np.float32)
        try:
            scores = np.asarray(self.model.get_scores_from_ids(token_ids), dtype=np.float32)
        except (ValueError, IndexError, TypeError) as err:  # arrays that passed the load checks but disagree
            scores, fault = None, f"{type(err).__name__}: {err}"
        if scores is None or scores.shape != (len(self.passages),):
            fault = fault if scores is None else f"{scores.shape[0]} scores for {len(self.passages)} passages"
            raise IndexFormatError(
                f"{self.bm25_dir}: the BM25 arrays do not fit together ({fault}); rebuild the index with "
                f"`{rebuild_hint(self.bm25_dir.parent)}`"
            )
        return scores

    def search_rows(self, queries: Sequence[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, the top rows and their scores (the hybrid retriever fuses these)."""
        check_queries(queries, k)
        out = []
        for query in queries:
            scores = self.score_all(query)
            rows = top_k(scores, k)
            out.append((rows, scores[rows]))
        return out

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [
            make_hits(rows, scores, self.passages.by_row) for rows, scores in self.search_rows(queries, k)
        ]

    def close(self) -> None:
        self.passages.close()
