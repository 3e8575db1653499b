"""Any search as a ragate retriever: a function ``search(query, k)``, or an object with a ``search(query, k)``
method, that returns the top documents as strings or dicts.

Each result is a string (the text) or a mapping with ``text`` and optionally ``title``, ``id``, ``score`` and
``source``. A result without an id gets ``"f"`` + 12 hex digits of the sha1 of its title and text, so the same
document has the same id in every search; one without a score gets 1/rank. The selectors that compare
embeddings (DTR's and PAIRS's DPR-AIS, PAIRS's embedding agreement, SKR) need vectors of one encoder for queries
and documents: ragate embeds the documents your search returns itself, with its own encoder (all-MiniLM-L6-v2
unless told otherwise), so a plain search is enough for every method except HyDE (which searches *by* a vector).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.retrieval.encoders import Encoder, load_encoder
from ragate.retrieval.types import Hit, Passage, Retriever

SearchFunction = Callable[[str, int], Sequence[Any]]
MAX_KEPT = 100_000  # passages (and their embeddings) remembered by id, oldest dropped first


MAX_RESULT_CHARS = 200_000  # one search result's title and text: far past any model's context, cheap to refuse


class SearchError(RagateError):
    """The user's search function failed or returned something that is not a list of documents."""


def passage_id(title: str, text: str) -> str:
    """The stable id of a document that came without one."""
    return "f" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:12]


class FunctionRetriever(Retriever):
    """A :class:`~ragate.retrieval.types.Retriever` over ``search`` (see the module docstring).

    ``encoder`` (a loaded :class:`Encoder`, a name or a model directory; None: the default) embeds queries and
    returned documents for the methods that compare embeddings; it is loaded on first use. ``len()`` is the
    number of distinct documents seen so far (a search function has no fixed corpus)."""

    kind = "function"

    def __init__(
        self,
        search: Any,
        *,
        encoder: Encoder | str | Path | None = None,
        name: str | None = None,
        corpus: Iterable[str] | None = None,
    ):
        if isinstance(search, Retriever):
            raise TypeError("this is already a ragate retriever: pass it as retriever=, not search=")
        fn = getattr(search, "search", None)
        if not callable(fn):
            fn = search if callable(search) else None
        if fn is None:
            raise TypeError(
                "search must be a function (query, k) -> list of str or dict(text, title?, id?, score?, source?), "
                f"or an object with such a search method; got {type(search).__name__}"
            )
        self._search: SearchFunction = fn
        self.name = name or getattr(search, "__name__", None) or type(search).__name__
        self.corpus: tuple[str, ...] | None = None  # the texts it searches, for the gates that count terms
        if corpus is not None:
            texts = tuple(corpus)
            if bad := next((t for t in texts if not isinstance(t, str)), None):
                raise RagateError(f"corpus= takes the documents' texts (str), not {type(bad).__name__}")
            if not texts:
                raise RagateError("corpus= is empty: give the texts of the documents your search function searches")
            self.corpus = texts
        self._encoder_spec = encoder
        self._encoder: Encoder | None = encoder if isinstance(encoder, Encoder) else None
        self._passages: OrderedDict[str, Passage] = OrderedDict()
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.RLock()

    # -- search -----------------------------------------------------------------------------------------------
    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [self._one(query, k) for query in queries]

    def _one(self, query: str, k: int) -> list[Hit]:
        try:
            results = self._search(query, k)
        except RagateError:
            raise
        except Exception as err:
            raise SearchError(
                f"the search function {self.name!r} failed on the query {query[:60]!r}: {type(err).__name__}: {err}"
            ) from err
        if isinstance(results, str | bytes | Mapping) or not isinstance(results, Sequence):
            raise SearchError(
                f"the search function {self.name!r} returned {type(results).__name__}; return a list of documents "
                "(each a str, or a dict with 'text' and optionally 'title', 'id', 'score', 'source')"
            )
        hits: list[Hit] = []
        seen: set[str] = set()
        for position, result in enumerate(results):
            passage, score = self._passage(result, position)
            if passage.id in seen:
                continue
            seen.add(passage.id)
            hits.append(Hit(passage, 1.0 / (len(hits) + 1) if score is None else score, len(hits) + 1))
            if len(hits) == k:
                break
        with self._lock:
            for hit in hits:
                self._keep(self._passages, hit.id, hit.passage)
        return hits

    def _passage(self, result: Any, position: int) -> tuple[Passage, float | None]:
        where = f"result {position} of the search function {self.name!r}"
        text: Any
        title: Any
        if isinstance(result, str):
            text, title, pid, score, source = result, "", None, None, None
        elif isinstance(result, Mapping):
            text, title = result.get("text"), result.get("title") or ""
            pid, score, source = result.get("id"), result.get("score"), result.get("source")
            if not isinstance(text, str):
                raise SearchError(f"{where} has no 'text' string (keys: {', '.join(map(str, result))})")
            if not isinstance(title, str) or not (source is None or isinstance(source, str)):
                raise SearchError(f"{where}: 'title' and 'source' must be strings")
            if pid is not None and (isinstance(pid, bool) or not isinstance(pid, str | int) or not str(pid)):
                raise SearchError(f"{where}: 'id' must be a non-empty string or integer, not {pid!r}")
            if score is not None and (
                isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score)
            ):
                raise SearchError(f"{where}: 'score' must be a finite number, not {score!r}")
        else:
            raise SearchError(f"{where} is a {type(result).__name__}; return a str or a dict with 'text'")
        if len(text) + len(title) > MAX_RESULT_CHARS:  # before anything tokenises it (10 MB took 30 s to refuse)
            raise SearchError(
                f"{where} holds {len(text) + len(title):,} characters, more than the {MAX_RESULT_CHARS:,}-character "
                "cap on one search result (MAX_RESULT_CHARS): return passages, not whole documents (ragate index "
                "build cuts documents into passages)"
            )
        try:
            text.encode("utf-8")
            title.encode("utf-8")
        except UnicodeEncodeError:
            raise SearchError(f"{where} holds a lone surrogate: return valid Unicode text") from None
        pid = str(pid) if pid is not None else passage_id(title, text)
        return Passage(pid, title, text, source), None if score is None else float(score)

    def __len__(self) -> int:
        with self._lock:
            return len(self._passages)

    def passage(self, passage_id: str) -> Passage:
        with self._lock:
            if passage_id not in self._passages:
                raise KeyError(f"no document with id {passage_id!r} among those the search function returned")
            return self._passages[passage_id]

    # -- embeddings (ragate's encoder) ----------------------------------------------------------------------------
    @property
    def has_embeddings(self) -> bool:
        return True

    @property
    def encoder(self) -> Encoder:
        with self._lock:
            if self._encoder is None:
                self._encoder = load_encoder(self._encoder_spec)  # type: ignore[arg-type]
            return self._encoder

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.encoder.encode_queries(list(queries))

    def passage_embeddings(self, passage_ids: Sequence[str]) -> np.ndarray:
        with self._lock:
            missing = [pid for pid in dict.fromkeys(passage_ids) if pid not in self._vectors]
            if missing:
                texts = [self.passage(pid).contents for pid in missing]
                for pid, vector in zip(missing, self.encoder.encode_documents(texts), strict=True):
                    self._keep(self._vectors, pid, np.asarray(vector, dtype=np.float32))
            return np.stack([self._vectors[pid] for pid in passage_ids])

    @staticmethod
    def _keep(store: OrderedDict[str, Any], key: str, value: Any) -> None:
        store[key] = value
        store.move_to_end(key)
        while len(store) > MAX_KEPT:
            store.popitem(last=False)

    def close(self) -> None:
        with self._lock:
            self._passages.clear()
            self._vectors.clear()
