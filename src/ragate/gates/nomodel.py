"""Gates that read no model: they decide from the search the method runs anyway and from the question's own text,
before (and without) any LM call.

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
the direct answer generated after it. The signals are computed in :mod:`ragate.gates.signals`, the trained gate's
weights file is :mod:`ragate.gates.weights`; this module holds the gates.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from ragate.errors import RagateError
from ragate.gates.base import FittedFile, Gate, GateContext, GateDecision, threshold_decision
from ragate.gates.signals import (  # noqa: F401 (most of them stay importable here)
    _FREQS,
    DOC_FREQ_FILE,
    DOC_FREQ_FORMAT,
    FEATURE_SETS,
    FEATURES,
    QUESTION_WORDS,
    SIGNAL_K,
    DocFrequencies,
    QuestionSignals,
    Rarity,
    RetrievalSignals,
    Signals,
    doc_frequencies,
    entity_words,
    index_corpus,
    index_root,
    question_signals,
    question_word,
    rarity,
    rarity_score,
    retrieval_signals,
    signals,
)
from ragate.gates.weights import (  # noqa: F401 (most of them stay importable here)
    WEIGHTS_FORMAT,
    GateWeights,
    check_weights,
    check_weights_model,
    load_weights,
    question_digest,
    save_weights,
)


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

    counts_terms = True
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
    weights_source = (
        "run `ragate sweep` on a training split (e.g. --offset 300), then "
        "`ragate gate fit --sweep DIR --out FILE.json`"
    )

    def fitted_file(self, path: str) -> FittedFile:
        """:func:`load_weights`; its training questions are :func:`question_digest` digests."""
        weights = load_weights(path)
        return FittedFile(
            frozenset(weights.meta.get("questions") or ()),
            question_digest,
            {
                "questions": int(weights.meta.get("n") or 0),
                "label": weights.meta.get("label"),
                "features": list(weights.features),
            },
        )

    def check_file(self, path: str, lm: Any) -> None:
        """The file's numbers (:func:`load_weights`) and the model whose answers labelled it; the index's corpus,
        encoder and score kind are checked where the search runs (:meth:`decide`)."""
        from ragate.models import model_identity

        check_weights_model(load_weights(path), model_identity(lm.model, lm.engine), path=path)

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
