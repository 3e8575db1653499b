"""``ragate gate fit``: the trained gate that reads no model (``no-model-lr``, :mod:`ragate.gates.nomodel`) from a
sweep's pass-1 records.

Each record of one method family (default: the family ``no-model-lr`` answers with, TARG's reader, which
``targ-margin`` and ``targ-entropy`` share) gives a label and the question gives the signals: the question's top-5
search over the index (the sweep's, or ``--index``), its text, and its rarest term's corpus frequency. The label is
an option:

- ``closed-wrong`` (default): the closed-book answer is wrong (its ``metric`` is 0), the event the issue's AUROC
  ranks ("closed-book answer wrong");
- ``retrieval-fixed``: the retrieval answer scores higher than the closed-book one (SKR's label, section 3.1).

scikit-learn fits a standardised logistic regression (``StandardScaler`` then ``LogisticRegression``, L2 with
inverse strength ``C``); the file keeps the scaler's means and scales and the coefficients as plain JSON, with the
model whose answers gave the labels, the index's corpus, the encoder, the signals' score kind and a digest of each
training question (so that ``eval`` and ``sweep`` refuse to score them with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.gates.registry import get_gate
from ragate.gates.signals import (
    FEATURE_SETS,
    RETRIEVAL_FEATURES,
    SIGNAL_K,
    doc_frequencies,
    index_corpus,
    signals,
)
from ragate.gates.weights import LABELS, GateWeights, question_digest
from ragate.learning.sweeps import sweep_model, sweep_questions


def record_label(record: dict[str, Any], label: str, metric: str) -> bool:
    """One sweep record's label: ``closed-wrong`` (closed ``metric`` == 0) or ``retrieval-fixed`` (open > closed)."""
    closed, opened = float(record["closed"]["scores"][metric]), float(record["open"]["scores"][metric])
    if label == "closed-wrong":
        return closed == 0.0
    if label == "retrieval-fixed":
        return opened > closed
    raise RagateError(f"unknown label {label!r}: choose one of {', '.join(LABELS)}")


def feature_matrix(
    questions: Sequence[str], features: Sequence[str], retriever: Any
) -> tuple[np.ndarray, str | None]:
    """The signals ``features`` of each question over ``retriever`` (one batched top-5 search when a retrieval
    signal is named), and the search scores' kind (None without a retrieval signal)."""
    found = (
        retriever.scored_search(list(questions), SIGNAL_K)
        if any(f in RETRIEVAL_FEATURES for f in features)
        else None
    )
    freqs = doc_frequencies(retriever) if "rarity" in features else None
    rows = []
    for i, question in enumerate(questions):
        s = signals(
            question,
            features,
            (lambda i=i: found[i]) if found is not None else None,  # type: ignore[misc]
            (lambda: freqs) if freqs is not None else None,
        )
        rows.append(s.vector(features))
    kinds = {f.kind for f in found} if found is not None else set()
    if len(kinds) > 1:
        raise RagateError(f"the index gave search scores of several kinds ({sorted(kinds)}): fit one kind")
    matrix = np.vstack(rows) if rows else np.zeros((0, len(features)))
    return matrix, (kinds.pop() if kinds else None)


def _cross_validated(x: np.ndarray, y: np.ndarray, c: float) -> tuple[float | None, int]:
    """The AUROC of out-of-fold predictions (stratified folds, at most 5, fewer when the rarer class has fewer
    questions; seeded), and the number of folds; (None, 0) when the rarer class has fewer than 2 questions."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from ragate.uncertainty import auroc

    folds = min(5, int(y.sum()), int((~y).sum()))
    if folds < 2:
        return None, 0
    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=1000))
    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=0)
    predicted = cross_val_predict(model, x, y, cv=split, method="predict_proba")[:, 1]
    return auroc(predicted.tolist(), y.tolist()), folds


def fit_gate(
    sweep_dir: str | Path,
    *,
    gate: str = "no-model-lr",
    index: str | None = None,
    family: str | None = None,
    metric: str = "em",
    label: str = "closed-wrong",
    features: str = "all",
    c: float = 1.0,
) -> GateWeights:
    """The weights of ``gate`` fitted on ``sweep_dir``'s records of ``family`` (default: ``gate``'s method's)."""
    import sklearn
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from ragate.methods.question import encoder_identity
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index
    from ragate.uncertainty import auroc

    if not get_gate(gate).reads_weights:
        raise RagateError(f"the gate {gate!r} reads no fitted weights: `ragate gate fit` fits no-model-lr")
    if label not in LABELS:
        raise RagateError(f"unknown label {label!r}: choose one of {', '.join(LABELS)}")
    if features not in FEATURE_SETS:
        raise RagateError(f"unknown feature set {features!r}: choose one of {', '.join(FEATURE_SETS)}")
    if not (c > 0 and np.isfinite(c)):
        raise RagateError(f"--C is the inverse regularisation strength: a positive number, not {c}")
    names = FEATURE_SETS[features]
    sweep_dir = Path(sweep_dir)
    found = sweep_questions(sweep_dir, family=family, metric=metric, method=gate, what="the gate's labels")
    saved, config, mine = found.saved, found.config, found.records
    texts = [found.questions[r["id"]] for r in mine]
    y = np.array([record_label(r, label, metric) for r in mine], dtype=bool)
    positives = int(y.sum())
    if positives in (0, len(y)):
        raise RagateError(
            f"all {len(y)} records of {sweep_dir} are labelled {label!r} = {bool(positives)} by {metric}: a fit needs "
            "both labels (a small model that answers in sentences gets no exact match: try --metric acc, or the "
            "other --label)"
        )
    model = sweep_model(saved, sweep_dir)
    index = index if index is not None else saved.get("index")
    with open_index(index or demo_index()) as retriever:
        x, score_kind = feature_matrix(texts, names, retriever)
        corpus = index_corpus(retriever)
        encoder = encoder_identity(retriever) if score_kind is not None else None
    scaler = StandardScaler().fit(x)
    regression = LogisticRegression(C=c, max_iter=1000).fit(scaler.transform(x), y)
    coef = np.asarray(regression.coef_, dtype=np.float64).reshape(-1)
    intercept = float(np.asarray(regression.intercept_).reshape(-1)[0])
    mean, scale = np.asarray(scaler.mean_, dtype=np.float64), np.asarray(scaler.scale_, dtype=np.float64)
    cross, folds = _cross_validated(x, y, c)
    weights = GateWeights(tuple(names), mean, scale, coef, intercept, {})
    training = auroc([weights.score(row) for row in x], y.tolist())
    meta = {
        "gate": gate,
        "label": label,
        "metric": metric,
        "feature_set": features,
        "model": model,
        "index": {**(corpus or {}), "path": str(Path(index).expanduser().resolve()) if index else "demo"},
        "encoder": encoder,
        "score_kind": score_kind,
        "signal_k": SIGNAL_K,
        "dataset": config.dataset,
        "dataset_files": found.files,
        "offset": config.offset,
        "limit": config.limit,
        "family": found.family,
        "sweep": str(sweep_dir.resolve()),
        "n": len(y),
        "positives": positives,
        "fit": {
            "library": "scikit-learn",
            "version": sklearn.__version__,
            "estimator": "StandardScaler + LogisticRegression (L2, lbfgs)",
            "C": c,
        },
        "auroc": {"training": training, "cross_validated": cross, "folds": folds},
        "questions": sorted({question_digest(q) for q in texts}),
    }
    return GateWeights(weights.features, mean, scale, coef, intercept, meta)
