"""Gates that read no model: they decide from the search the method runs anyway and from the question's own text,
before (and without) any LM call (issue 51, build item 3).

Recent work finds such signals competitive once every LM call is counted: Marina et al. (EMNLP 2025, "LLM-
independent adaptive RAG: let the question speak for itself") match LLM-based gates with external features of the
question (entity popularity, question type, ...) at a fraction of the cost, and Moskvoretskii et al. (ACL 2025,
"Adaptive retrieval without self-knowledge? Bringing uncertainty back home") compare 35 adaptive-retrieval methods
and find simple estimators often win once LM and retrieval calls are counted. ragate's versions:

**Retrieval side** (:func:`retrieval_signals`): the question's top-k search (k = 5, TARG's reader: the search these
methods run anyway, so when the gate says "retrieve" the reader reads those very hits and no second search is
made). The scores are the ones the ranking rests on (``Retriever.scored_search``): cosines for a dense index and
for a hybrid one (its dense half: the fused RRF scores carry only ranks), BM25 scores for a BM25 index.

- ``top1``: the best passage's score. Dense: a cosine in [-1, 1], comparable across questions (all-MiniLM-L6-v2
  gives ~0.3 for an unrelated passage, ~0.6-0.8 for one on the question's topic). BM25: unbounded, and it grows
  with the number and rarity of the question's terms, so it partly measures the question's length and wording.
- ``gap``: top-1 minus top-2. One passage standing out of the rest (large gap) suggests a specific passage about
  the question; for BM25 the gap is in the same unbounded units as the scores.
- ``dispersion``: the standard deviation (population, ddof 0) of the top-k scores; a flat list (near 0) means no
  passage is closer than the others. It scales with the scores (BM25's grows with the question's length).

**Direction.** Each retrieval signal retrieves when *high*: a confident, peaked search is one whose passages are
more likely to hold the answer, so reading them is more likely to help. Whether that ranks "the closed-book answer
is wrong" is an empirical question (``benchmarks/nomodel_auroc.py`` prints the AUROC); an AUROC below 0.5 says the
other direction ranks better, and the trained combination learns each sign from the data.

**Question side** (:func:`question_signals`, :func:`rarity`): the number of words, the question word (who, what,
when, where, which, why, how, how-many, yes-no, other), whether the question holds a digit, whether it asks for or
names a date, and the corpus frequency of its rarest entity-like term as a popularity proxy (Mallen et al. 2023:
models know popular entities; Marina et al. use Wikipedia page views, which ragate does not have): the document
frequency df of the term in the index's passages, scored ``ln((N + 1) / (df + 1))`` (higher: rarer: retrieve).
Entity-like terms are the question's capitalised words (the first word only when it is not a question or function
word); a question with none (NQ's are lower-cased) falls back to all its content words. Terms are BM25's (lower
case, English stop words dropped, Snowball stems); document frequencies come from the index's BM25 side when it has
one (free: the column sizes of its score matrix) and otherwise from one pass over ``passages.jsonl``, cached beside
the index (``doc_freq.json``, written atomically; plain JSON) or under RAGATE_HOME when the index is read-only.

**Trained** (``no-model-lr``): a logistic regression over these signals, fitted with scikit-learn from a sweep's
records by ``ragate gate fit`` and saved as plain JSON (the scaler's means and scales, the coefficients and the
intercept; no pickle). Its score is the fitted probability of the label (``closed-wrong``: the closed-book answer
is wrong; ``retrieval-fixed``: the retrieval answer scored higher, SKR's label). The file records the model whose
answers labelled it, the index's corpus and encoder and the signals' score kind, and is refused where any differs.
It is read by inference with numpy alone.

None of these gates reads a draft: the trace's first stage is the search (or nothing), and a "no" is answered by
the direct answer generated after it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ragate.errors import RagateError
from ragate.fileio import atomic_writer, lone_surrogate, parse_json, utf8_text
from ragate.gates.base import Gate, GateContext, GateDecision, threshold_decision

SIGNAL_K = 5  # the search depth the retrieval signals read: TARG's top-5, the search the methods run anyway
RETRIEVAL_FEATURES = ("top1", "gap", "dispersion")
QUESTION_WORDS = ("who", "what", "when", "where", "which", "why", "how", "how-many", "yes-no", "other")
QUESTION_FEATURES = ("words", "digit", "date", *(f"wh={w}" for w in QUESTION_WORDS), "rarity")
FEATURES = (*RETRIEVAL_FEATURES, *QUESTION_FEATURES)
FEATURE_SETS = {"all": FEATURES, "retrieval": RETRIEVAL_FEATURES, "question": QUESTION_FEATURES}
LABELS = ("closed-wrong", "retrieval-fixed")
WEIGHTS_FORMAT = "ragate-gate-weights"
WEIGHTS_VERSION = 1
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
_FREQS_LOCK = threading.Lock()


def doc_frequencies(retriever: Any) -> DocFrequencies:
    """The document frequency of every BM25 term in ``retriever``'s passages: from its BM25 side when it has one
    (the column sizes of the score matrix: no pass), else one pass over ``passages.jsonl``, cached beside the
    index (:data:`DOC_FREQ_FILE`) or under RAGATE_HOME. Kept in memory per index for the process."""
    from ragate.retrieval.bm25 import BM25Retriever

    inner = _inner(retriever)
    root = index_root(retriever)
    if root is None:
        raise RagateError(
            f"the corpus-frequency signal counts terms in an index's passages, and this {getattr(retriever, 'kind', '?')} "
            "retriever has no index directory: use an index built by `ragate index build`"
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


def _passage_pass(root: Path, sha: str | None) -> DocFrequencies:
    """Document frequencies from one pass over ``root/passages.jsonl`` (BM25's default tokenizer), read from or
    written to the cache file (atomically; plain JSON)."""
    from ragate.models import ragate_home
    from ragate.retrieval.bm25 import BM25Params, _make_stemmer, tokenize_queries
    from ragate.retrieval.store import PASSAGES, iter_passage_file

    params = BM25Params()
    places = [root / DOC_FREQ_FILE]
    if sha:
        places.append(ragate_home() / "doc-freq" / f"{sha}.json")
    for place in places:
        cached = _read_doc_freq(place, sha, params)
        if cached is not None:
            return cached
    stemmer = _make_stemmer(params.stemmer)
    df: dict[str, int] = {}
    n = 0
    batch: list[str] = []

    def count(texts: list[str]) -> None:
        for terms in tokenize_queries(texts, params, stemmer):
            for term in set(terms):
                df[term] = df.get(term, 0) + 1

    for passage in iter_passage_file(root / PASSAGES):
        n += 1
        batch.append(passage.contents)
        if len(batch) == 4096:
            count(batch)
            batch = []
    count(batch)
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
    vocab = {term: i for i, term in enumerate(df)}
    return DocFrequencies(n, vocab, np.fromiter(df.values(), dtype=np.int64, count=len(df)), params,
                          f"passages.jsonl pass ({where})")  # fmt: skip


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


# -- the trained combination's weights ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class GateWeights:
    """A standardised logistic regression: score = sigmoid(intercept + coef . (x - mean) / scale) over the named
    ``features``; ``meta`` records the label, the model, the index's corpus, the encoder and the signals' score
    kind it was fitted with, and where the records came from."""

    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    meta: Mapping[str, Any]

    def __post_init__(self) -> None:
        fault = _weights_fault(list(self.features), self.mean, self.scale, self.coef, self.intercept)
        if fault is not None:
            raise RagateError(f"gate weights: {fault}")

    def score(self, x: np.ndarray) -> float:
        """P(label | x) under the fitted model."""
        z = self.intercept + float(
            np.dot(self.coef, (np.asarray(x, dtype=np.float64) - self.mean) / self.scale)
        )
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    @property
    def reads_search(self) -> bool:
        return any(f in RETRIEVAL_FEATURES for f in self.features)

    @property
    def reads_corpus(self) -> bool:
        return self.reads_search or "rarity" in self.features

    def to_json(self) -> dict[str, Any]:
        return {
            "format": WEIGHTS_FORMAT,
            "format_version": WEIGHTS_VERSION,
            "features": list(self.features),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "coef": self.coef.tolist(),
            "intercept": self.intercept,
            **self.meta,
        }


def _weights_fault(features: Any, mean: Any, scale: Any, coef: Any, intercept: Any) -> str | None:
    if not isinstance(features, list) or not features or not all(isinstance(f, str) for f in features):
        return f"features must be a non-empty list of names, not {str(features)[:60]}"
    unknown = [f for f in features if f not in FEATURES]
    if unknown:
        return f"unknown features {unknown[:3]} (known: {', '.join(FEATURES)})"
    if len(set(features)) != len(features):
        return "a feature is named twice"
    arrays = {}
    for name, value in (("mean", mean), ("scale", scale), ("coef", coef)):
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if not isinstance(value, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value
        ):
            return f"{name} must be a list of numbers"
        arrays[name] = np.asarray(value, dtype=np.float64)
        if arrays[name].shape != (len(features),):
            return f"{name} has {arrays[name].size} values for {len(features)} features"
        if not np.all(np.isfinite(arrays[name])):
            return f"{name} holds NaN or infinity"
    if not np.all(arrays["scale"] > 0):
        return "every scale must be positive"
    if isinstance(intercept, bool) or not isinstance(intercept, int | float) or not math.isfinite(intercept):
        return f"the intercept must be a finite number, not {intercept!r:.40}"
    return None


def _record_fault(data: Mapping[str, Any]) -> str | None:
    """What is wrong with what a weights file records besides its numbers: its label, its model (an object),
    its index and encoder (objects or null), its score kind (text or null)."""
    for key in ("model", "index", "encoder"):
        if data.get(key) is not None and not isinstance(data.get(key), dict):
            return f"its {key} must be an object, not {str(data.get(key))[:40]}"
    if data.get("label") not in LABELS:
        return f"its label must be one of {', '.join(LABELS)}, not {str(data.get('label'))[:40]}"
    if not isinstance(data.get("model"), dict):
        return "it records no model"
    if data.get("score_kind") is not None and not isinstance(data.get("score_kind"), str):
        return "its score_kind must be a string"
    return None


def save_weights(weights: GateWeights, path: str | Path) -> Path:
    """Write ``weights`` as one JSON object, atomically."""
    path = Path(path)
    with atomic_writer(path) as f:
        f.write((json.dumps(weights.to_json(), ensure_ascii=False, indent=1) + "\n").encode())
    return path


def load_weights(path: str | Path) -> GateWeights:
    """Read a weights file written by :func:`save_weights`; a damaged or foreign file is a named error."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise RagateError(
            f"gate weights {str(path)!r} not found: fit them with `ragate gate fit --sweep SWEEP_DIR --out FILE`"
        )
    stat = path.stat()
    return _load_weights(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)  # keyed by mtime and size: a refit is re-read
def _load_weights(path: str, mtime_ns: int, size: int) -> GateWeights:
    fix = "fit them again with `ragate gate fit`"
    try:
        data = parse_json(utf8_text(path, RagateError, fix), path, RagateError, fix)
    except OSError as err:
        raise RagateError(f"{path} cannot be read ({err.strerror}); {fix}") from None
    if not isinstance(data, dict) or data.get("format") != WEIGHTS_FORMAT:
        raise RagateError(f"{path} is not a gate weights file (format {WEIGHTS_FORMAT}); {fix}")
    if data.get("format_version") != WEIGHTS_VERSION:
        raise RagateError(
            f"{path} is gate weights format version {data.get('format_version')!r}; this ragate reads version "
            f"{WEIGHTS_VERSION}: {fix}"
        )
    if (found := lone_surrogate(data)) is not None:
        raise RagateError(f"{path}: damaged gate weights: {found}, which is not text; {fix}")
    numbers = (data.get(k) for k in ("features", "mean", "scale", "coef", "intercept"))
    fault = _weights_fault(*numbers) or _record_fault(data)
    if fault is not None:
        raise RagateError(f"{path}: damaged gate weights: {fault}; {fix}")
    keep = {"features", "mean", "scale", "coef", "intercept", "format", "format_version"}
    return GateWeights(
        tuple(data["features"]),
        np.asarray(data["mean"], dtype=np.float64),
        np.asarray(data["scale"], dtype=np.float64),
        np.asarray(data["coef"], dtype=np.float64),
        float(data["intercept"]),
        {k: v for k, v in data.items() if k not in keep},
    )


def check_weights(
    weights: GateWeights,
    *,
    model: Mapping[str, Any],
    encoder: Mapping[str, Any] | None,
    corpus: Mapping[str, Any] | None,
    score_kind: str | None,
    where: str = "this run",
) -> None:
    """Refuse weights fitted for another model (its answers gave the labels), another index's corpus (the
    document frequencies and the scores), another encoder or another kind of score (the retrieval signals)."""
    meta = weights.meta
    fitted = meta.get("model") or {}
    if fitted.get("sha256") and model.get("sha256"):
        same = fitted["sha256"] == model["sha256"]
    else:
        same = (fitted.get("engine"), fitted.get("model")) == (model.get("engine"), model.get("model"))
    if not same:
        raise RagateError(
            f"the gate weights were fitted on what model {fitted.get('model')!r} ({fitted.get('engine')}) got "
            f"wrong, but {where} uses {model.get('model')!r} ({model.get('engine')}): a sweep of this model gives "
            "its labels (`ragate sweep ... --model M` then `ragate gate fit`)"
        )
    if not weights.reads_corpus:
        return
    built = meta.get("index") or {}
    if corpus is None:
        raise RagateError(
            f"the gate weights read the index's corpus ({', '.join(f for f in weights.features if f in (*RETRIEVAL_FEATURES, 'rarity'))}), "
            f"and {where} searches no index directory to check it against: use an index built by `ragate index build`"
        )
    if built.get("passages_sha256") != corpus.get("passages_sha256") or built.get("passages") != corpus.get(
        "passages"
    ):
        raise RagateError(
            f"the gate weights were fitted over an index of {built.get('passages')} passages (sha256 "
            f"{str(built.get('passages_sha256'))[:12]}), but {where} searches {corpus.get('passages')} passages "
            f"(sha256 {str(corpus.get('passages_sha256'))[:12]}): the signals differ; fit them with this index "
            "(`ragate gate fit --index ...`)"
        )
    if not weights.reads_search:
        return
    if meta.get("score_kind") != score_kind:
        raise RagateError(
            f"the gate weights read {meta.get('score_kind')!r} search scores, but {where} gives {score_kind!r} "
            f"scores (a {corpus.get('kind')} index): fit them with this index (`ragate gate fit --index ...`)"
        )
    fitted_encoder = meta.get("encoder") or {}
    now = encoder or {}
    keys = ("name", "dim", "query_prefix")
    if any(fitted_encoder.get(k) != now.get(k) for k in keys):
        raise RagateError(
            f"the gate weights read search scores of encoder {fitted_encoder.get('name')!r}, but {where} embeds with "
            f"{now.get('name')!r}: fit them with this index (`ragate gate fit --index ...`)"
        )


def question_digest(question: str) -> str:
    """A training question's identity in a weights file (16 hex digits of the sha256 of its SKR key)."""
    from ragate.gates.skr import question_key

    return hashlib.sha256(question_key(question).encode()).hexdigest()[:16]


def overlap(weights: GateWeights, questions: Sequence[str]) -> list[str]:
    """The given questions that trained ``weights`` (by :func:`question_digest`)."""
    trained = set(weights.meta.get("questions") or ())
    return [q for q in questions if question_digest(q) in trained]


# -- the gates ----------------------------------------------------------------------------------------------------


class _NoModelGate(Gate):
    """A gate that reads no model: nothing from the backend, and no generation before it decides."""

    reads_index = True
    like = "targ-margin"
    signal: ClassVar[str] = ""

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        value, detail = self.value(ctx)
        return threshold_decision(self.name, value, tau, f" ({detail}; no LM call)")

    def value(self, ctx: GateContext) -> tuple[float, str]:
        raise NotImplementedError


class _RetrievalGate(_NoModelGate):
    tau_source = (
        "ragate's starting point on the cosine scale of a dense or hybrid index (BM25 scores have no fixed scale): "
        "calibrate it to a budget"
    )

    def value(self, ctx: GateContext) -> tuple[float, str]:
        found = ctx.scored_search(SIGNAL_K)
        s = retrieval_signals(found.scores, found.kind)
        return float(getattr(s, self.signal)), f"{self.signal} of the top-{s.k} {s.kind} scores"


class RetrievalTop1(_RetrievalGate):
    name = "retrieval-top1"
    description = "retrieve when the question's best passage scores high (top-1 search score; reads no model)"
    default_tau = 0.5
    signal = "top1"


class RetrievalGap(_RetrievalGate):
    name = "retrieval-gap"
    description = "retrieve when the best passage stands out (top-1 minus top-2 score; reads no model)"
    default_tau = 0.05
    signal = "gap"


class RetrievalDispersion(_RetrievalGate):
    name = "retrieval-dispersion"
    description = "retrieve when the top-5 scores spread (their standard deviation; reads no model)"
    default_tau = 0.05
    signal = "dispersion"


class QuestionLength(_NoModelGate):
    name = "question-length"
    description = "retrieve for questions of more than tau words (reads no model, no index)"
    default_tau = 10.0
    tau_source = "ragate's choice (longer questions are more often multi-part): calibrate it to a budget"
    reads_index = False

    def value(self, ctx: GateContext) -> tuple[float, str]:
        return float(question_signals(ctx.question).words), "words in the question"


class QuestionNumeric(_NoModelGate):
    name = "question-numeric"
    description = (
        "retrieve when the question holds a digit or asks for or names a date (reads no model, no index)"
    )
    default_tau = 0.5
    tau_source = "none: the score is 1 (a digit or a date) or 0"
    reads_index = False
    budget_control = False

    def value(self, ctx: GateContext) -> tuple[float, str]:
        s = question_signals(ctx.question)
        said = "a digit" if s.digit else ("a date" if s.date else "no digit and no date")
        return float(s.digit or s.date), f"the question holds {said}"


class QuestionRarity(_NoModelGate):
    name = "question-rarity"
    description = (
        "retrieve when the question's rarest entity-like term is rare in the corpus: ln((N+1)/(df+1)), a popularity "
        "proxy (reads no model; counts terms in the index's passages)"
    )
    default_tau = math.log(100)
    tau_source = "ragate's choice: the term is in fewer than 1 in 100 passages; calibrate it to a budget"

    def value(self, ctx: GateContext) -> tuple[float, str]:
        retriever = ctx.need_retriever()
        # the first question over an index without a BM25 side counts its passages (then cached)
        with ctx.timed("rarity", overhead=True):
            r = rarity(ctx.question, doc_frequencies(retriever))
        if r.term is None:
            return 0.0, "no content term"
        return r.score, f"rarest term {r.term!r} in {r.df} of {r.n} passages"


class NoModelLR(_NoModelGate):
    """The trained combination: :class:`GateWeights` from ``GateSpec.weights`` (``ragate gate fit``), checked
    against this model, the index's corpus, encoder and score kind."""

    name = "no-model-lr"
    description = (
        "a logistic regression over the retrieval- and question-side signals, fitted on a sweep "
        "(needs --gate-weights; reads no model)"
    )
    default_tau = 0.5
    tau_source = "the fitted probability of the label: 0.5 is even odds (calibrate it to a budget)"
    reads_weights = True

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        path = ctx.params.weights
        if path is None:
            raise RagateError(
                "no-model-lr needs fitted weights: run `ragate sweep` on a training split, then "
                "`ragate gate fit --sweep DIR --out FILE.json`, and pass --gate-weights FILE.json"
            )
        weights = load_weights(path)
        retriever = ctx.need_retriever() if weights.reads_corpus else ctx.retriever
        hits = ctx.scored_search(SIGNAL_K) if weights.reads_search else None
        check_weights(
            weights,
            model=ctx.model_identity(),
            encoder=ctx.encoder_identity() if hits is not None else None,
            corpus=index_corpus(retriever) if retriever is not None else None,
            score_kind=hits.kind if hits is not None else None,
            where="this run",
        )
        with ctx.timed("gate-score", overhead=True):
            found = signals(
                ctx.question,
                weights.features,
                (lambda: hits) if hits is not None else None,
                (lambda: doc_frequencies(retriever)) if "rarity" in weights.features else None,
            )
            score = weights.score(found.vector(weights.features))
        label = weights.meta.get("label")
        return threshold_decision(
            self.name, score, tau, f" (P({label}) from {len(weights.features)} signals; no LM call)"
        )
