"""From labelled traffic to a gate in force: the features an answer records (:func:`answer_features`), the labelled
questions of a feedback store or a sweep (:func:`store_labelled`, :func:`sweep_labelled`), and the fit that writes
the learned gate's file (:func:`learn_from_store`, :func:`learn_labelled`). The fitting itself is
:mod:`ragate.learning.scores`; the gate that reads the file is :mod:`ragate.gates.learned`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ragate.errors import RagateError
from ragate.gates.learned import DRAFT_FEATURES, LEARNED_LABELS, draft_scores, question_digest, save_learned
from ragate.gates.signals import QUESTION_FEATURES, signals
from ragate.learning.scores import (
    DEFAULT_C,
    DEFAULT_COMPONENTS,
    MIN_CLASS,
    Labelled,
    check_labels,
    cross_fitted_curve,
    learn_gate,
    shortfall,
    tune,
)

if TYPE_CHECKING:
    from ragate.backends.base import Backend
    from ragate.learning.store import FeedbackRules, LabelKind

# the question-side signals that need no index (rarity counts the index's passages)
TEXT_FEATURES = tuple(n for n in QUESTION_FEATURES if n != "rarity")


def gap_verdict(gap: tuple[float, float, float]) -> str:
    """How a paired difference (point, low, high) reads: higher, lower, or not established either way."""
    return "higher" if gap[1] > 0 else "lower" if gap[2] < 0 else "not established either way"


@dataclass(frozen=True)
class Paired:
    """Something new against what is in force on the same ``n`` labelled answers: each one's score and the paired
    difference (new minus in force: point, low, high of its bootstrap 95% interval). The new one earns its place
    when the difference is not below 0."""

    n: int
    learned: float
    in_force: float
    gap: tuple[float, float, float]

    @property
    def earns(self) -> bool:
        return self.gap[0] >= 0.0


@dataclass(frozen=True)
class Comparison(Paired):
    """A new gate against the gate in force (``gate``), on the store's own labelled answers that the gate in force
    scored when it answered them: each one's cross-fitted AUROC and the paired difference."""

    gate: str = ""

    def summary(self) -> str:
        verdict = gap_verdict(self.gap)
        head = "it earns its place" if self.earns else f"it ranks worse: {self.gate} stays in force"
        return (
            f"against the gate in force ({self.gate}) on {self.n} labelled answers it scored: AUROC "
            f"{self.learned:.3f} vs {self.in_force:.3f}, paired {self.gap[0]:+.3f} [{self.gap[1]:+.3f}, "
            f"{self.gap[2]:+.3f}] ({verdict}): {head}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate, "n": self.n, "learned_auroc": round(self.learned, 4),
            "in_force_auroc": round(self.in_force, 4), "gap": [round(v, 4) for v in self.gap], "earns": self.earns,
        }  # fmt: skip


@dataclass(frozen=True)
class Learned:
    """A learned gate written to ``path``, with its cross-fitted ``report`` (AUROC and interval, calibration
    error, the cascade's band and drafted share), the label ``counts`` it was fitted on and their kind
    (``label``: closed-wrong or retrieval-changed), its ``comparison`` with the gate in force where one was made,
    and each fitted question's cross-fitted probability (``ids``, ``cross_fitted``)."""

    path: Path
    report: Mapping[str, Any]
    counts: Mapping[str, int]
    label: str
    comparison: Comparison | None = None
    ids: tuple[str, ...] = ()
    cross_fitted: tuple[float, ...] = ()

    def summary(self) -> str:
        r = self.report
        auc = r["cheap_auroc"]
        text = (
            f"learned gate {self.path}: {r['n']} questions labelled {self.label} ({r['positives']} 'retrieve'); "
            f"cross-fitted AUROC {auc[0]:.3f} [{auc[1]:.3f}, {auc[2]:.3f}], calibration error {r['cheap_ece']:.3f}"
        )
        if "rate_at_0.5" in r:
            text += f", retrieves for {100 * float(r['rate_at_0.5']):.0f}% at tau 0.5"
        if "band" in r:
            c = r["cascade_auroc"]
            text += (
                f"; cascade AUROC {c[0]:.3f} drafting {100 * float(r['drafted_share']):.0f}% "
                f"(band {r['band'][0]:.3f}-{r['band'][1]:.3f}; full gate {r['full_auroc'][0]:.3f})"
            )
        if self.comparison is not None:
            text += "\n" + self.comparison.summary()
        return text


GATE_SCORE = "gate:"  # an answer's features keep its gate's score under "gate:KIND" (not a feature a fit reads)
MIN_COMPARED = 3  # answers of each class the gate in force must have scored for a comparison


def compare_with_gate(
    ids: Sequence[str],
    features: Sequence[Mapping[str, float]],
    y: np.ndarray,
    learned: Mapping[str, float],
    gate: str,
    *,
    seed: int = 0,
) -> Comparison | None:
    """The new gate's cross-fitted probabilities (``learned``, by answer id) against the scores the gate ``gate``
    gave the same labelled answers when it answered them (their ``gate:KIND`` feature); None where it scored fewer
    than :data:`MIN_COMPARED` of a class."""
    from ragate.uncertainty import auroc, paired_auroc_gap

    key = GATE_SCORE + gate
    keep = [i for i, (a, f) in enumerate(zip(ids, features, strict=True)) if key in f and a in learned]
    yy = np.asarray(y, dtype=bool)[keep]
    if min(int(yy.sum()), int((~yy).sum())) < MIN_COMPARED:
        return None
    mine = np.array([learned[ids[i]] for i in keep])
    theirs = np.array([float(features[i][key]) for i in keep])
    gap = paired_auroc_gap(mine, theirs, yy, seed=seed)
    learned_auc = auroc(list(map(float, mine)), list(map(bool, yy)))
    in_force = auroc(list(map(float, theirs)), list(map(bool, yy)))
    assert learned_auc is not None and in_force is not None
    return Comparison(len(keep), float(learned_auc), float(in_force), gap, gate=gate)


def answer_features(question: str, draft: Any = None) -> dict[str, float]:
    """The scalar features an answer records: the question's text signals and, when the gate drafted (and the draft
    has per-token values), TARG's entropy and margin scores of its first 20 tokens."""
    found = signals(question, TEXT_FEATURES, None, None)
    out = dict(zip(TEXT_FEATURES, (float(v) for v in found.vector(TEXT_FEATURES)), strict=True))
    if draft is not None and len(draft) and len(getattr(draft, "top_logprobs", ()) or ()) == len(draft):
        try:
            out |= {k: float(v) for k, v in draft_scores(draft).items() if math.isfinite(v)}
        except (RagateError, ValueError):
            pass
    return out


def _labelled(
    ids: Sequence[str],
    features: Sequence[Mapping[str, float]],
    hidden: Sequence[np.ndarray | None],
    y: np.ndarray,
    *,
    use_hidden: bool,
    draft: bool,
) -> Labelled:
    names = list(TEXT_FEATURES)
    if draft:
        names += [n for n in DRAFT_FEATURES if all(n in f for f in features)]
    scalars = np.array([[float(f.get(n, 0.0)) for n in names] for f in features], dtype=np.float64)
    matrix = None
    if use_hidden and hidden and all(h is not None for h in hidden):
        dims = {int(h.shape[0]) for h in hidden if h is not None}
        if len(dims) > 1:
            raise RagateError(
                f"the labelled answers hold hidden states of several sizes {sorted(dims)}: one model's only"
            )
        matrix = np.vstack([np.asarray(h, dtype=np.float64) for h in hidden if h is not None])
    return Labelled(
        tuple(ids), tuple(names), scalars.reshape(len(ids), len(names)), matrix, np.asarray(y, dtype=bool)
    )


def store_labelled(
    store: FeedbackRules, label: str, *, prompts: str | None, hidden: bool = True, draft: bool = True
) -> Labelled:
    """The store's answers labelled ``label`` (of the prompt set ``prompts``) as fitting rows."""
    if label not in LEARNED_LABELS:
        raise RagateError(f"unknown label {label!r}: one of {', '.join(LEARNED_LABELS)}")
    return _rows_labelled(store.labelled(cast("LabelKind", label), prompts=prompts), hidden=hidden, draft=draft)


def _rows_labelled(rows: Any, *, hidden: bool, draft: bool) -> Labelled:
    if len(set(rows.models)) > 1:
        raise RagateError(
            f"the store's labelled answers come from several models ({', '.join(sorted(set(rows.models)))}): a gate "
            "learns one model's traffic; keep one store per model"
        )
    return _labelled(rows.ids, rows.features, rows.hidden, rows.y, use_hidden=hidden, draft=draft)


def question_digests(questions: Sequence[str]) -> list[str]:
    """The sorted sha256 prefixes of the questions a gate was fitted on (its file's record of them, no text)."""
    return sorted({question_digest(q) for q in questions})


def learn_labelled(
    data: Labelled,
    out: str | Path,
    *,
    label: str,
    cascade: float | None = None,
    components: int = DEFAULT_COMPONENTS,
    c: float = DEFAULT_C,
    seed: int = 0,
    model: Mapping[str, Any] | None = None,
    questions: Sequence[str] = (),
    source: str = "",
    tuned: bool = False,
    against: tuple[Sequence[Mapping[str, float]], str] | None = None,
) -> Learned:
    """Fit (:func:`ragate.learning.scores.learn_gate`) and write the gate file atomically. ``tuned``: choose the PCA
    size and L2 strength by cross-fitted AUROC on these labels first (:func:`ragate.learning.scores.tune`).
    ``against``: the rows' recorded features and the name of the gate in force, to compare the new gate with it
    (:func:`compare_with_gate`; the result goes in the report and the file)."""
    from ragate.version import __version__

    check_labels(data.y, label)
    chosen = None
    if tuned:
        cheap_rows = data.select(
            [n for n in data.names if n not in DRAFT_FEATURES], hidden=data.hidden is not None
        )
        components, c, cv = tune(cheap_rows)
        chosen = {"components": components, "C": c, "cross_fitted_auroc": round(cv, 4)}
        components = components or DEFAULT_COMPONENTS
    if cascade is not None and not any(n in DRAFT_FEATURES for n in data.names):
        raise RagateError(
            "a cascade reads the draft's TARG scores in its second stage, and these answers have none: label answers "
            "of a drafting gate (targ-entropy, learned), or learn without a cascade"
        )
    meta: dict[str, object] = {
        "model": dict(model or {}),
        "source": source,
        "ragate": __version__,
        "hidden_dim": None if data.hidden is None else int(data.hidden.shape[1]),
        "questions": question_digests(questions),
    }
    gate, report, probabilities = learn_gate(
        data, label=label, components=components, c=c, seed=seed, cascade_share=cascade, meta=meta
    )
    cross_fitted = tuple(float(v) for v in probabilities)
    comparison = None
    if against is not None:
        comparison = compare_with_gate(
            data.ids, against[0], data.y, dict(zip(data.ids, cross_fitted, strict=True)), against[1], seed=seed
        )
        report["compared"] = comparison.as_dict() if comparison is not None else {"gate": against[1], "n": 0}
    report["params"] = {"components": components, "C": c, "tuned": chosen is not None}
    p = gate.cheap.probabilities(
        data.select([n for n in data.names if n not in DRAFT_FEATURES]).scalars, data.hidden
    )
    report["rate_at_0.5"] = round(
        float(np.mean(p > 0.5)), 4
    )  # of the final fit, on the rows it saw (in-sample)
    cheap_rows = data.select(
        [n for n in data.names if n not in DRAFT_FEATURES], hidden=data.hidden is not None
    )
    report["curve"] = [
        [n, None if v is None else round(v, 4)]
        for n, v in cross_fitted_curve(cheap_rows, components=components, c=c, seed=seed)
    ]
    path = save_learned(gate, out)
    counts = {"retrieve": int(data.y.sum()), "no_retrieve": int((~data.y).sum())}
    return Learned(path, report, counts, label, comparison, tuple(data.ids), cross_fitted)


def label_counts(store: Any, prompts: str | None = None) -> dict[str, dict[str, int]]:
    """The store's labelled answers (of prompt set ``prompts``, as a fit reads them) by label kind and class:
    ``{"closed-wrong": {"retrieve": n, "no_retrieve": m}, "retrieval-changed": {...}}``."""
    out = {}
    for kind in LEARNED_LABELS:
        y = store.labelled(kind, prompts=prompts).y
        out[kind] = {"retrieve": int(y.sum()), "no_retrieve": int((~y).sum())}
    return out


def choose_label(counts: Mapping[str, Mapping[str, int]]) -> tuple[str, str]:
    """The label a fit learns when none is asked for, and why in words: ``closed-wrong`` (gold) where it has
    :data:`MIN_CLASS` of both classes, else ``retrieval-changed`` (shadow answers' silver) where that has; a store
    that can fit neither is refused, naming both kinds' counts and what each needs. ``counts``: as
    :func:`label_counts` gives them."""

    def have(kind: str) -> tuple[int, int]:
        found = counts.get(kind) or {}
        return int(found.get("retrieve", 0)), int(found.get("no_retrieve", 0))

    gold, silver = have("closed-wrong"), have("retrieval-changed")
    if min(gold) >= MIN_CLASS:
        return "closed-wrong", f"gold labels, {gold[0]} 'retrieve' and {gold[1]} 'no-retrieve'"
    if min(silver) >= MIN_CLASS:
        return "retrieval-changed", (
            f"shadow answers' silver labels, {silver[0]} 'retrieve' and {silver[1]} 'no-retrieve': "
            f"closed-wrong has {gold[0]} and {gold[1]}, and needs {shortfall(*gold)} to be fitted"
        )
    raise RagateError(
        f"no label can be fitted yet: closed-wrong (gold) has {gold[0]} 'retrieve' and {gold[1]} 'no-retrieve' "
        f"labels, retrieval-changed (shadow answers' silver) {silver[0]} and {silver[1]}; a fit needs at least "
        f"{MIN_CLASS} of each class, so {shortfall(*gold)} labels of closed-wrong, or {shortfall(*silver)} of "
        "retrieval-changed (post feedback with a reference, keep shadow answers on, or import a labelled sweep)"
    )


def learn_from_store(
    store: FeedbackRules,
    out: str | Path,
    *,
    label: str | None = "closed-wrong",
    prompts: str | None = None,
    cascade: float | None = None,
    hidden: bool = True,
    components: int = DEFAULT_COMPONENTS,
    c: float = DEFAULT_C,
    model: Mapping[str, Any] | None = None,
    tuned: bool = False,
    in_force: str | None = None,
) -> Learned:
    """The learned gate fitted on a feedback store's labels of ``label`` (None: the one the store can fit,
    :func:`choose_label`), written to ``out``; the returned :class:`Learned` names the label it learned and its
    comparison with the gate in force (``in_force``, a gate's name; None: the gate that scored most of the labelled
    answers when it answered them), made on the store's labels (:func:`compare_with_gate`)."""
    if label is None:
        label, _ = choose_label(label_counts(store, prompts))
    if label not in LEARNED_LABELS:
        raise RagateError(f"unknown label {label!r}: one of {', '.join(LEARNED_LABELS)}")
    rows = store.labelled(cast("LabelKind", label), prompts=prompts)  # one read: the rows and their provenance agree
    data = _rows_labelled(rows, hidden=hidden, draft=cascade is not None)
    if model is None and rows.models:  # the model whose answers and hidden states the rows hold
        model = {"model": rows.models[0]}
    gate = in_force or scored_by(rows.features)
    return learn_labelled(
        data, out, label=label, cascade=cascade, components=components, c=c, model=model,
        questions=rows.questions, source=f"feedback store {store.name}", tuned=tuned,
        against=(rows.features, gate) if gate else None,
    )  # fmt: skip


def scored_by(features: Sequence[Mapping[str, float]]) -> str | None:
    """The gate that scored most of these answers when it answered them (their ``gate:KIND`` features)."""
    from collections import Counter

    kinds = Counter(k[len(GATE_SCORE) :] for f in features for k in f if k.startswith(GATE_SCORE))
    return kinds.most_common(1)[0][0] if kinds else None


def sweep_labelled(
    sweep_dir: str | Path,
    lm: Backend | None,
    *,
    label: str = "closed-wrong",
    method: str = "learned",
    family: str | None = None,
    metric: str = "acc",
    hidden: bool = True,
    states_of: Callable[[list[str]], Sequence[np.ndarray | None]] | None = None,
) -> tuple[Labelled, list[str]]:
    """A sweep's questions of ``method``'s family as fitting rows: labels from its records (``closed-wrong``: the
    closed-book answer scores 0 by ``metric``; ``retrieval-changed``: the closed-book and retrieval answers
    disagree), the question's signals, and the hidden state of ``lm`` at the direct prompt (one prefill each), or
    what ``states_of(questions)`` computes (:class:`HiddenStates` on Ray workers) in their order."""
    from ragate.learning.store import answers_agree
    from ragate.learning.sweeps import sweep_questions

    found = sweep_questions(
        Path(sweep_dir), family=family, metric=metric, method=method, what="the gate's labels"
    )
    texts, feats, ys = [], [], []
    for r in found.records:
        q = found.questions[r["id"]]
        texts.append(q)
        feats.append(answer_features(q))
        if label == "closed-wrong":
            ys.append(float(r["closed"]["scores"][metric]) == 0.0)
        elif label == "retrieval-changed":
            ys.append(not answers_agree(r["closed"]["prediction"], r["open"]["prediction"]))
        else:
            raise RagateError(f"unknown label {label!r}: one of {', '.join(LEARNED_LABELS)}")
    if not hidden:
        states: Sequence[np.ndarray | None] = [None] * len(texts)
    elif states_of is not None:
        states = states_of(texts)
    else:
        states = [_hidden_state(method, q, lm) for q in texts]
    data = _labelled(
        [r["id"] for r in found.records],
        feats,
        list(states),
        np.array(ys, dtype=bool),
        use_hidden=hidden,
        draft=False,
    )
    return data, texts


def _hidden_state(method: str, question: str, lm: Any) -> np.ndarray | None:
    from ragate.methods import get_method
    from ragate.methods.question import QuestionRun

    return QuestionRun(get_method(method), question, lm, None).hidden_state()


class HiddenStates:
    """``model``'s hidden state at ``method``'s direct prompt for a question (llama.cpp, each call computed from a
    cleared cache), with the model's name, opened once: what ``ragate gate learn --sweep`` reads, here or on each
    Ray worker (``--engine ray``, :func:`ragate.eval.ray_engine.map_ray`)."""

    def __init__(self, model: str | None, method: str = "learned", threads: int | str | None = None) -> None:
        from ragate.backends import load_backend
        from ragate.backends.threads import thread_options
        from ragate.eval.calls import CallCache

        self.method = method
        self.engine = load_backend(model, "llama.cpp", **thread_options("llama.cpp", threads, None))
        self.lm = CallCache(self.engine, None, f"llama.cpp:{self.engine.model}", exact_prefixes=True)

    @property
    def model(self) -> str:
        return str(self.engine.model)

    def record(self, job: tuple[int, str]) -> tuple[np.ndarray | None, str]:
        return _hidden_state(self.method, job[1], self.lm), self.model

    def close(self) -> None:
        self.engine.close()


def import_sweep(
    store: FeedbackRules,
    sweep_dir: str | Path,
    lm: Backend,
    *,
    method: str = "learned",
    family: str | None = None,
    metric: str = "acc",
    hidden: bool = True,
    draft: bool = True,
    limit: int | None = None,
) -> int:
    """A sweep's labelled questions as "run" rows of a feedback store (the third source of labels): each record of
    ``method``'s family with both labels (``closed-wrong`` by ``metric``; ``retrieval-changed`` from its two answers),
    its question's signals, and, computed with ``lm``, the hidden state at the direct prompt and (``draft``) TARG's
    scores of the 20-token draft after it (the first ``limit`` records only, when given). Rows already imported are
    skipped; returns how many were added."""
    from ragate.learning.store import answers_agree
    from ragate.learning.sweeps import sweep_questions
    from ragate.methods import get_method
    from ragate.methods.question import QuestionRun

    sweep_dir = Path(sweep_dir)
    found = sweep_questions(sweep_dir, family=family, metric=metric, method=method, what="the labels")
    spec = get_method(method)
    added = 0
    for r in found.records[:limit]:
        answer_id = f"run:{sweep_dir.name}:{r['id']}"[:64]
        if store.get(answer_id) is not None:
            continue
        q = found.questions[r["id"]]
        run = QuestionRun(spec, q, lm, None)
        state = run.hidden_state() if hidden else None
        features = answer_features(q, run.draft(20) if draft else None)
        store.record_answer(
            answer_id, question=q, method=method, prompts=spec.prompts.name, answer=r["closed"]["prediction"],
            retrieved=False, features=features, hidden=state,
            model={"model": str(getattr(lm, "model", "")), "engine": str(getattr(lm, "engine", ""))},
        )  # fmt: skip
        store.set_twin(answer_id, opened=r["open"]["prediction"])
        store.add_label(
            answer_id, source="run", kind="closed-wrong", value=float(r["closed"]["scores"][metric]) == 0.0
        )
        changed = not answers_agree(r["closed"]["prediction"], r["open"]["prediction"])
        store.add_label(answer_id, source="run", kind="retrieval-changed", value=changed)
        added += 1
    return added
