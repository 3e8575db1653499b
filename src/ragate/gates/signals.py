"""What the no-model gates read (:mod:`ragate.gates.nomodel`): the question's search scores, its own words, and the
corpus frequency of its rarest entity-like term (each index's BM25 document frequencies, counted once and cached)."""

from __future__ import annotations

import functools
import json
import math
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.fileio import atomic_writer

SIGNAL_K = 5  # the search depth the retrieval signals read: TARG's top-5, the search the methods run anyway
RETRIEVAL_FEATURES = ("top1", "gap", "dispersion")
QUESTION_WORDS = ("who", "what", "when", "where", "which", "why", "how", "how-many", "yes-no", "other")
QUESTION_FEATURES = ("words", "digit", "date", *(f"wh={w}" for w in QUESTION_WORDS), "rarity")
FEATURES = (*RETRIEVAL_FEATURES, *QUESTION_FEATURES)
FEATURE_SETS = {"all": FEATURES, "retrieval": RETRIEVAL_FEATURES, "question": QUESTION_FEATURES}
DOC_FREQ_FILE = "doc_freq.json"
DOC_FREQ_FORMAT = "ragate-doc-freq"


# -- retrieval-side signals -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetrievalSignals:
    """The top-k scores' best value, top-1/top-2 gap and dispersion (population standard deviation), ``k`` scores
    of ``kind`` ("cosine", "bm25", ...). With one score the gap and dispersion are 0."""

    top1: float
    gap: float
    dispersion: float
    k: int
    kind: str


def retrieval_signals(scores: Sequence[float] | np.ndarray, kind: str = "cosine") -> RetrievalSignals:
    """The signals of one question's top-k similarity scores (any order: they are sorted best first)."""
    s = np.sort(np.asarray(scores, dtype=np.float64).reshape(-1))[::-1]
    if s.size == 0:
        raise RagateError("the search returned no passage: an empty index gives no retrieval signal")
    if not np.all(np.isfinite(s)):
        raise RagateError(f"the search returned a score that is not a finite number ({s.tolist()[:5]})")
    gap = float(s[0] - s[1]) if s.size > 1 else 0.0
    return RetrievalSignals(float(s[0]), gap, float(np.std(s)), int(s.size), kind)


# -- question-side signals --------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+")
_WH = {
    "who": "who", "whom": "who", "whose": "who", "what": "what", "when": "when", "where": "where",
    "which": "which", "why": "why", "how": "how",
}  # fmt: skip
_AUXILIARIES = frozenset({
    "is", "are", "was", "were", "am", "be", "been", "do", "does", "did", "can", "could", "will", "would", "shall",
    "should", "may", "might", "must", "has", "have", "had", "isn", "aren", "wasn", "weren", "don", "doesn", "didn",
})  # fmt: skip
# "may" counts only capitalised and not as the first word, where it is the auxiliary
_MONTHS = frozenset({
    "january", "february", "march", "april", "june", "july", "august", "september", "october", "november",
    "december",
})  # fmt: skip
_DATE_ASK = re.compile(r"\b(?:what|which)\s+(?:year|date|day|month|century|decade)s?\b", re.IGNORECASE)
_YEAR = re.compile(r"(?<!\d)(?:1\d{3}|20\d{2})(?!\d)")
# words that start a question without naming anything (never entity-like as the first word)
_OPENERS = frozenset({
    *_WH, *_AUXILIARIES, "in", "on", "at", "of", "for", "from", "to", "by", "the", "a", "an", "name", "list", "give",
    "tell", "according", "during", "since", "after", "before", "as",
})  # fmt: skip


@dataclass(frozen=True)
class QuestionSignals:
    """``words``: the number of ``\\w+`` words; ``wh``: the question word (one of :data:`QUESTION_WORDS`);
    ``digit``: the question holds a digit; ``date``: it asks for a date ("when", "what/which year|date|day|month|
    century|decade") or names one (a month, a year 1000-2099)."""

    words: int
    wh: str
    digit: bool
    date: bool


def question_word(question: str) -> str:
    """The question word: "yes-no" when the first word is an auxiliary (is, did, can, ...); else the first question word anywhere
    (whom/whose count as who; "how many"/"how much" as how-many); else "other"."""
    words = [w.casefold() for w in _WORD.findall(question)]
    if not words:
        return "other"
    if words[0] in _AUXILIARIES:
        return "yes-no"
    for i, word in enumerate(words):
        if word == "how" and i + 1 < len(words) and words[i + 1] in ("many", "much"):
            return "how-many"
        if word in _WH:
            return _WH[word]
    return "other"


def asks_date(question: str, wh: str | None = None) -> bool:
    """Whether the question asks for a date or names one (see :class:`QuestionSignals`)."""
    if (wh or question_word(question)) == "when" or _DATE_ASK.search(question) or _YEAR.search(question):
        return True
    words = _WORD.findall(question)
    return any(w.casefold() in _MONTHS or (w == "May" and i > 0) for i, w in enumerate(words))


def question_signals(question: str) -> QuestionSignals:
    """The question-side signals of ``question`` (its text alone)."""
    wh = question_word(question)
    digit = any(c.isdigit() for c in question)
    return QuestionSignals(len(_WORD.findall(question)), wh, digit, asks_date(question, wh))


def entity_words(question: str) -> list[str]:
    """The question's entity-like words: its capitalised words (a word starting with an upper-case letter; the
    first word only when it is not a question or function word), else (a lower-cased question) every word that is
    not a question or function word. Stop words are dropped later, by BM25's tokenizer."""
    words = _WORD.findall(question)
    named = [w for i, w in enumerate(words) if w[:1].isupper() and not (i == 0 and w.casefold() in _OPENERS)]
    return named or [w for w in words if w.casefold() not in _OPENERS]


def rarity_score(df: int, n: int) -> float:
    """ln((n + 1) / (df + 1)): 0 for a term in every passage, ln(n + 1) for one in none (higher: rarer)."""
    return math.log((n + 1) / (df + 1))


@dataclass(frozen=True)
class Rarity:
    """The rarest entity-like term (``term``, BM25's form of ``word``), its document frequency ``df`` among ``n``
    passages and the score ``ln((n + 1) / (df + 1))``; a question without a content term scores 0 (term None)."""

    word: str | None
    term: str | None
    df: int | None
    n: int
    score: float


# -- document frequencies ----------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DocFrequencies:
    """How many of ``n`` passages hold each BM25 term (``vocab`` term -> row of ``counts``), the tokenizer's
    settings (``params``, a :class:`~ragate.retrieval.bm25.BM25Params`), and where the counts came from."""

    n: int
    vocab: Mapping[str, int]
    counts: np.ndarray
    params: Any
    source: str

    def of(self, term: str) -> int:
        row = self.vocab.get(term)
        return 0 if row is None else int(self.counts[row])

    @functools.cached_property
    def _stemmer(self) -> Any:
        from ragate.retrieval.bm25 import _make_stemmer

        return _make_stemmer(self.params.stemmer)

    def terms(self, words: Sequence[str]) -> list[list[str]]:
        """Each word as BM25 tokenizes it (lower case, stop words dropped, stemmed): zero or more terms."""
        if not words:
            return []
        from ragate.retrieval.bm25 import tokenize_queries

        return tokenize_queries(list(words), self.params, self._stemmer)


def rarity(question: str, freqs: DocFrequencies) -> Rarity:
    """The corpus frequency of the question's rarest entity-like term (:func:`entity_words`), as a popularity proxy;
    ties go to the alphabetically first term."""
    words = entity_words(question)
    pairs = [(w, t) for w, terms in zip(words, freqs.terms(words), strict=True) for t in terms]
    if not pairs:
        return Rarity(None, None, None, freqs.n, 0.0)
    word, term = min(pairs, key=lambda p: (freqs.of(p[1]), p[1]))
    df = freqs.of(term)
    return Rarity(word, term, df, freqs.n, rarity_score(df, freqs.n))


def _inner(retriever: Any) -> Any:
    """The retriever inside wrappers (``SerialRetriever.inner``)."""
    for _ in range(8):
        inner = getattr(retriever, "inner", None)
        if inner is None:
            return retriever
        retriever = inner
    return retriever


def index_root(retriever: Any) -> Path | None:
    """The index directory a retriever reads (its passage store's), or None (a search function, Milvus)."""
    root = getattr(getattr(_inner(retriever), "passages", None), "root", None)
    return Path(root) if root is not None else None


@functools.lru_cache(maxsize=8)
def _manifest(root: str, mtime_ns: int) -> dict[str, Any]:
    from ragate.retrieval.store import read_manifest

    return read_manifest(Path(root))


def index_corpus(retriever: Any) -> dict[str, Any] | None:
    """What the signals depend on in the index: its kind, passage count and passages' sha256 (from its
    manifest), or None for a retriever without an index directory."""
    root = index_root(retriever)
    if root is None or not (root / "manifest.json").is_file():
        return None
    manifest = _manifest(str(root.resolve()), (root / "manifest.json").stat().st_mtime_ns)
    texts = (manifest.get("files") or {}).get("passages.jsonl") or {}
    return {
        "kind": manifest.get("kind"),
        "passages": manifest.get("passages"),
        "passages_sha256": texts.get("sha256"),
    }


_FREQS: dict[tuple[str, str | None], DocFrequencies] = {}
_GIVEN: weakref.WeakKeyDictionary[Any, DocFrequencies] = weakref.WeakKeyDictionary()  # per search function
_FREQS_LOCK = threading.Lock()


def doc_frequencies(retriever: Any) -> DocFrequencies:
    """The document frequency of every BM25 term in ``retriever``'s passages: from its BM25 side when it has one
    (the column sizes of the score matrix: no pass), else one pass over ``passages.jsonl``, cached beside the
    index (:data:`DOC_FREQ_FILE`) or under RAGATE_HOME. Kept in memory per index for the process."""
    from ragate.retrieval.bm25 import BM25Retriever

    inner = _inner(retriever)
    texts = getattr(inner, "corpus", None)  # a search function given the corpus (Pipeline(corpus=))
    if isinstance(texts, tuple) and texts:
        with _FREQS_LOCK:
            counted = _GIVEN.get(inner)
            if counted is None:
                name = getattr(inner, "name", "?")
                counted = _GIVEN[inner] = frequencies_of(texts, f"the corpus given with search function {name!r}")
            return counted
    root = index_root(retriever)
    if root is None:
        raise RagateError(
            f"the corpus-frequency signal counts terms in an index's passages, and this {getattr(retriever, 'kind', '?')} "
            "retriever has no index directory: use an index built by `ragate index build`, or give a search "
            "function the corpus's texts (ragate.Pipeline(search=..., corpus=texts))"
        )
    corpus = index_corpus(retriever) or {}
    key = (str(root.resolve()), corpus.get("passages_sha256"))
    with _FREQS_LOCK:
        found = _FREQS.get(key)
        if found is not None:
            return found
        bm25 = inner if isinstance(inner, BM25Retriever) else getattr(inner, "bm25", None)
        if isinstance(bm25, BM25Retriever):
            indptr = np.asarray(bm25.model.scores["indptr"])
            counts = np.diff(indptr).astype(np.int64)
            found = DocFrequencies(len(bm25), dict(bm25.model.vocab_dict), counts, bm25.params, "bm25 index")
        else:
            found = _passage_pass(root, corpus.get("passages_sha256"))
        _FREQS[key] = found
        return found


def has_term_counts(retriever: Any) -> bool:
    """Whether :func:`doc_frequencies` can count terms for ``retriever``: an index directory, or a search function
    given the corpus."""
    texts = getattr(_inner(retriever), "corpus", None)
    return index_root(retriever) is not None or (isinstance(texts, tuple) and bool(texts))


def _count_terms(texts: Iterable[str], params: Any) -> tuple[int, dict[str, int]]:
    """How many ``texts``, and in how many of them each BM25 term occurs (``params``' tokenizer), in batches."""
    from ragate.retrieval.bm25 import _make_stemmer, tokenize_queries

    stemmer = _make_stemmer(params.stemmer)
    df: dict[str, int] = {}
    n = 0
    batch: list[str] = []

    def count(chunk: list[str]) -> None:
        for terms in tokenize_queries(chunk, params, stemmer):
            for term in set(terms):
                df[term] = df.get(term, 0) + 1

    for text in texts:
        n += 1
        batch.append(text)
        if len(batch) == 4096:
            count(batch)
            batch = []
    count(batch)
    return n, df


def _frequencies(n: int, df: dict[str, int], params: Any, source: str) -> DocFrequencies:
    vocab = {term: i for i, term in enumerate(df)}
    return DocFrequencies(n, vocab, np.fromiter(df.values(), dtype=np.int64, count=len(df)), params, source)


def frequencies_of(texts: Iterable[str], source: str) -> DocFrequencies:
    """Document frequencies of BM25's terms (its default tokenizer) over ``texts``: a corpus handed over once
    (checked where it was given: ``FunctionRetriever(corpus=)``)."""
    from ragate.retrieval.bm25 import BM25Params

    params = BM25Params()
    return _frequencies(*_count_terms(texts, params), params, source)


def _passage_pass(root: Path, sha: str | None) -> DocFrequencies:
    """Document frequencies from one pass over ``root/passages.jsonl`` (BM25's default tokenizer), read from or
    written to the cache file (atomically; plain JSON)."""
    from ragate.models import ragate_home
    from ragate.retrieval.bm25 import BM25Params
    from ragate.retrieval.store import PASSAGES, iter_passage_file

    params = BM25Params()
    places = [root / DOC_FREQ_FILE]
    if sha:
        places.append(ragate_home() / "doc-freq" / f"{sha}.json")
    for place in places:
        cached = _read_doc_freq(place, sha, params)
        if cached is not None:
            return cached
    n, df = _count_terms((p.contents for p in iter_passage_file(root / PASSAGES)), params)
    record = {"format": DOC_FREQ_FORMAT, "format_version": 1, "passages_sha256": sha, "passages": n,
              "tokenizer": params.to_json(), "df": df}  # fmt: skip
    data = json.dumps(record, ensure_ascii=False, sort_keys=True).encode()
    for place in places:
        try:
            with atomic_writer(place) as f:
                f.write(data)
            where = str(place)
            break
        except OSError:
            continue
    else:
        where = "not cached: no writable place"
    return _frequencies(n, df, params, f"passages.jsonl pass ({where})")


def _read_doc_freq(path: Path, sha: str | None, params: Any) -> DocFrequencies | None:
    """A cache file if it is whole and for these passages (by sha256) and tokenizer; else None (counted again)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if (
        not isinstance(data, dict)
        or data.get("format") != DOC_FREQ_FORMAT
        or data.get("passages_sha256") != sha
        or data.get("tokenizer") != params.to_json()
        or not isinstance(data.get("df"), dict)
        or not isinstance(data.get("passages"), int)
    ):
        return None
    df = data["df"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in df.values()):
        return None
    vocab = {term: i for i, term in enumerate(df)}
    counts = np.fromiter(df.values(), dtype=np.int64, count=len(df))
    return DocFrequencies(data["passages"], vocab, counts, params, f"cached ({path})")


# -- the feature vector ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signals:
    """Every signal of one question: ``retrieval`` (None when no search was needed), ``question``, ``rarity``
    (None when not needed)."""

    retrieval: RetrievalSignals | None
    question: QuestionSignals
    rarity: Rarity | None

    def vector(self, names: Sequence[str]) -> np.ndarray:
        """The named features (:data:`FEATURES`) as floats: booleans and the question word's one-hot as 0/1."""
        out = []
        for name in names:
            if name in RETRIEVAL_FEATURES:
                assert self.retrieval is not None
                out.append(float(getattr(self.retrieval, name)))
            elif name == "rarity":
                assert self.rarity is not None
                out.append(self.rarity.score)
            elif name.startswith("wh="):
                out.append(float(self.question.wh == name[3:]))
            else:
                out.append(float(getattr(self.question, name)))
        return np.asarray(out, dtype=np.float64)


def signals(
    question: str,
    names: Sequence[str],
    search: Callable[[], Any] | None,
    freqs: Callable[[], DocFrequencies] | None,
) -> Signals:
    """The signals ``names`` need: the search (``search()`` returns a :class:`~ragate.retrieval.types.ScoredHits`)
    only for a retrieval feature, the document frequencies only for "rarity"."""
    found = None
    if any(n in RETRIEVAL_FEATURES for n in names):
        assert search is not None
        hits = search()
        found = retrieval_signals(hits.scores, hits.kind)
    rare = None
    if "rarity" in names:
        assert freqs is not None
        rare = rarity(question, freqs())
    return Signals(found, question_signals(question), rare)
