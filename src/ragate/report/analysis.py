"""The papers' analyses of a gate, as pure functions over a run's records (``sweep.jsonl`` / ``questions.jsonl``).

Sweep records (one per question and method family, see :mod:`ragate.eval.sweep`) hold the closed-book answer, the
retrieval answer and every gate's score for the same question, so every analysis of "what the gate's score says
about the question" is a lookup over them: the accuracy/retrieval frontier, base-model accuracy by score decile
(TARG A.6), the error quadrants over (U, Δ) (TARG A.7), the AUROC of the score for "the closed-book answer is
wrong", and threshold transfer between datasets (TARG Table S8). Eval records (one per question and method, see
:mod:`ragate.eval.run`) give the retrieval recall of the query-building methods (DTR Table 4) and PAIRS's split
into directly answered and retrieved questions (PAIRS Fig. 3).

Every gate score is oriented so that higher means "retrieve" (more uncertain), and a gate retrieves iff
score > tau (:mod:`ragate.tuning.calibrate`).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

import numpy as np

from ragate.errors import RagateError
from ragate.eval.metrics import bootstrap_ci
from ragate.eval.sweep import decisions, frontier, method_records, point, swept_methods
from ragate.eval.thresholds import threshold_for_budget
from ragate.uncertainty import auroc

Metric = Literal["em", "f1", "acc"]
BinaryMetric = Literal["em", "acc"]
XY = tuple[float, float]


class FrontierPlot(TypedDict):
    method: str
    metric: str
    n: int
    curve: list[XY]  # (retrieval rate, accuracy) of every distinct threshold, by rising retrieval rate
    default: XY  # the gate's own decisions
    never: XY
    always: XY
    random: list[XY]  # expected accuracy of retrieving for a random share rho, rho = 0, 0.1, ..., 1
    intervals: dict[
        str, XY
    ]  # "default", "never", "always": percentile-bootstrap 95% interval of the accuracy


class DecileRow(TypedDict):
    decile: int  # 1 = lowest scores (most confident) ... 10 = highest
    lo: float  # lowest and highest gate score in the bin
    hi: float
    n: int
    closed_acc: float  # mean metric of the closed-book (Never-RAG) answers in the bin
    open_acc: float  # ... and of the retrieval (Always-RAG) answers
    closed_ci: XY  # percentile-bootstrap 95% interval of closed_acc


class QuadrantTable(TypedDict):
    method: str
    metric: str
    tau: float | None  # None: the gate's own decisions (a text gate, or tau not given)
    n: int
    low_helps: int  # TARG A.7 (a): U <= tau, Δ > 0 ("confidently wrong, retrieval useful")
    low_neutral: int  # (d) is low_neutral + low_hurts: safe without retrieval
    low_hurts: int
    high_helps: int  # (c): U > tau, Δ > 0, where the gate should retrieve
    high_neutral: int
    high_hurts: int  # (b): U > tau, Δ < 0, retrieval harmful


class RecallRow(TypedDict):
    method: str
    n: int  # questions with a recall@k: the method retrieved and gold passages are known
    recall: float


class PairsBreakdown(TypedDict):
    method: str
    metric: str
    n: int
    direct_n: int  # DQ: questions answered without retrieval
    direct_acc: float | None
    retrieved_n: int  # Non-DQ-retrieval: the rest
    retrieved_acc: float | None
    reference: str
    reference_n: int  # DQ-retrieval: the DQs as answered by ``reference`` (always retrieves)
    reference_acc: float | None


class OperatingPoint(TypedDict):
    tau: float
    retrieval_rate: float
    em: float
    f1: float
    acc: float


class Transfer(TypedDict):
    method: str
    budget: float | None  # None: the best-EM threshold, as in TARG Table S8
    transferred: OperatingPoint  # the source's tau on the target questions
    retuned: OperatingPoint  # the target's own tau, chosen the same way
    delta_em: float  # transferred EM - retuned EM


def _scores(rows: Sequence[dict[str, Any]], method: str) -> np.ndarray:
    return np.array([float(r["gates"][method]["score"]) for r in rows], dtype=np.float64)


def frontier_points(
    sweep_records: Sequence[dict[str, Any]], method: str, metric: Metric = "em"
) -> FrontierPlot:
    """Plotting data for one gate's accuracy/retrieval frontier (TARG Fig. 2, DESIGN.md section 1): every
    threshold's operating point, the gate's default point, Never-RAG, Always-RAG, and the random gate, whose
    expected accuracy at rate rho is never + rho * (always - never). The default point, Never and Always carry the
    percentile-bootstrap 95% interval of their accuracy over the questions."""
    f = frontier(sweep_records, method)
    curve = sorted((p["retrieval_rate"], p[metric]) for p in f["points"])
    never, always = f["never"][metric], f["always"][metric]
    rhos = [i / 10 for i in range(11)]
    rows = [r for r in method_records(sweep_records, method) if method in r["gates"]]
    chosen = {
        "default": decisions(rows, method),
        "never": [False] * len(rows),
        "always": [True] * len(rows),
    }
    intervals = {
        name: bootstrap_ci(
            [(r["open"] if x else r["closed"])["scores"][metric] for r, x in zip(rows, which, strict=True)]
        )
        for name, which in chosen.items()
    }
    return {
        "method": method,
        "metric": metric,
        "n": f["n"],
        "curve": curve,
        "default": (f["default"]["retrieval_rate"], f["default"][metric]),
        "never": (0.0, never),
        "always": (1.0, always),
        "random": [(rho, never + rho * (always - never)) for rho in rhos],
        "intervals": intervals,
    }


def decile_bins(scores: Sequence[float], bins: int = 10) -> list[int]:
    """Bin index (0 .. bins-1) of each score by its quantile: bin = floor(bins * #(scores < s) / n). Equal scores
    always share a bin (so a bin may stay empty), and the result does not depend on the order of the input."""
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        return []
    below = np.searchsorted(np.sort(values), values, side="left")
    return [int(b) for b in np.minimum(bins - 1, (bins * below) // values.size)]


def accuracy_by_decile(
    sweep_records: Sequence[dict[str, Any]], method: str, metric: Metric = "em", bins: int = 10
) -> list[DecileRow]:
    """Base-model (closed-book) accuracy per decile of the gate score, lowest scores first (TARG Appendix A.6,
    Fig. S1), with the retrieval answers' accuracy beside it. Empty bins (ties across a boundary) are left out;
    every question is in exactly one row."""
    rows = method_records(sweep_records, method)
    scores = _scores(rows, method)
    groups: dict[int, list[int]] = {}
    for i, b in enumerate(decile_bins(scores.tolist(), bins)):
        groups.setdefault(b, []).append(i)
    out: list[DecileRow] = []
    for b in sorted(groups):
        members = groups[b]
        out.append(
            {
                "decile": b + 1,
                "lo": float(scores[members].min()),
                "hi": float(scores[members].max()),
                "n": len(members),
                "closed_acc": statistics.fmean(rows[i]["closed"]["scores"][metric] for i in members),
                "open_acc": statistics.fmean(rows[i]["open"]["scores"][metric] for i in members),
                "closed_ci": bootstrap_ci([rows[i]["closed"]["scores"][metric] for i in members]),
            }
        )
    return out


def quadrant_table(
    sweep_records: Sequence[dict[str, Any]], method: str, tau: float | None = None, metric: Metric = "em"
) -> QuadrantTable:
    """Counts over (U, Δ) (TARG Appendix A.7, Tables S4/S5): U high when the gate retrieves (score > ``tau``; by
    default the gate's own decision at its own threshold), Δ = retrieval answer's score - closed-book answer's
    score (> 0 retrieval helps, < 0 it hurts, 0 neutral). The six cells sum to n."""
    rows = method_records(sweep_records, method)
    high = decisions(rows, method, tau)
    cells: Counter[str] = Counter()
    for r, h in zip(rows, high, strict=True):
        delta = r["open"]["scores"][metric] - r["closed"]["scores"][metric]
        effect = "helps" if delta > 0 else "hurts" if delta < 0 else "neutral"
        cells[f"{'high' if h else 'low'}_{effect}"] += 1
    return {
        "method": method,
        "metric": metric,
        "tau": tau if tau is not None else rows[0]["gates"][method]["threshold"],
        "n": len(rows),
        "low_helps": cells["low_helps"],
        "low_neutral": cells["low_neutral"],
        "low_hurts": cells["low_hurts"],
        "high_helps": cells["high_helps"],
        "high_neutral": cells["high_neutral"],
        "high_hurts": cells["high_hurts"],
    }


def gate_auroc(
    sweep_records: Sequence[dict[str, Any]], metric: BinaryMetric = "em"
) -> dict[str, float | None]:
    """Per swept gate, the AUROC of its score for "the closed-book answer is wrong" (closed ``metric`` == 0),
    the ranking quality behind TARG's A.6 trend: 1.0 when every wrong answer scores above every right one."""
    out: dict[str, float | None] = {}
    for m in swept_methods(sweep_records):
        rows = method_records(sweep_records, m)
        labels = [r["closed"]["scores"][metric] == 0 for r in rows]
        out[m] = auroc(_scores(rows, m).tolist(), labels)
    return out


def recall_comparison(eval_records: Sequence[dict[str, Any]], k: int = 3) -> list[RecallRow]:
    """Mean recall@k per method (DTR Table 4: question-only = standard-rag, HyDE, Q2D, CoT, DPR = dtr-no-ugt /
    dpr-ais), over the questions where the method retrieved and gold passages are known (records whose
    ``recall@k`` is not None). Methods that never retrieved are left out; first-seen order."""
    key = f"recall@{k}"
    values: dict[str, list[float]] = {}
    for r in eval_records:
        if "error" in r:
            continue
        values.setdefault(r["method"], [])
        if r.get(key) is not None:
            values[r["method"]].append(float(r[key]))
    return [{"method": m, "n": len(v), "recall": statistics.fmean(v)} for m, v in values.items() if v]


def _mean_metric(records: Sequence[dict[str, Any]], metric: Metric) -> float | None:
    return statistics.fmean(r["scores"][metric] for r in records) if records else None


def pairs_breakdown(
    eval_records: Sequence[dict[str, Any]],
    method: str = "pairs",
    reference: str = "dpr-ais",
    metric: Metric = "em",
) -> PairsBreakdown:
    """PAIRS Fig. 3: accuracy of the directly answered questions (DQ), of the retrieved rest (Non-DQ-retrieval),
    and of the DQs answered with retrieval by ``reference`` (DQ-retrieval; PAIRS's always-retrieve DPR-AIS by
    default; None when the run has no such records)."""
    ok = [r for r in eval_records if "error" not in r]
    own = [r for r in ok if r["method"] == method]
    if not own:
        raise RagateError(f"the run has no answers from method {method!r}")
    direct = [r for r in own if not r["retrieved"]]
    retrieved = [r for r in own if r["retrieved"]]
    direct_ids = {r["id"] for r in direct}
    ref = [r for r in ok if r["method"] == reference and r["id"] in direct_ids]
    return {
        "method": method,
        "metric": metric,
        "n": len(own),
        "direct_n": len(direct),
        "direct_acc": _mean_metric(direct, metric),
        "retrieved_n": len(retrieved),
        "retrieved_acc": _mean_metric(retrieved, metric),
        "reference": reference,
        "reference_n": len(ref),
        "reference_acc": _mean_metric(ref, metric),
    }


def _calibrated_tau(rows: Sequence[dict[str, Any]], method: str, budget: float | None) -> float:
    if budget is None:
        return float(frontier(rows, method)["best_em"]["tau"])
    return threshold_for_budget(_scores(rows, method).tolist(), budget)


def _operating_point(rows: Sequence[dict[str, Any]], method: str, tau: float) -> OperatingPoint:
    p = point(rows, [bool(s > tau) for s in _scores(rows, method)])
    return {"tau": tau, "retrieval_rate": p["retrieval_rate"], "em": p["em"], "f1": p["f1"], "acc": p["acc"]}


def threshold_transfer(
    source_sweep_records: Sequence[dict[str, Any]],
    target_sweep_records: Sequence[dict[str, Any]],
    method: str,
    budget: float | None,
) -> Transfer:
    """TARG Table S8: tau calibrated on the source questions (tau = F^-1(1 - budget) over their scores,
    :func:`ragate.eval.thresholds.threshold_for_budget`; ``budget=None``: the source's best-EM tau), applied
    zero-shot to the target, against the target's own tau chosen the same way: retrieval rate and EM of both."""
    source = method_records(source_sweep_records, method)
    target = method_records(target_sweep_records, method)
    transferred = _operating_point(target, method, _calibrated_tau(source, method, budget))
    retuned = _operating_point(target, method, _calibrated_tau(target, method, budget))
    return {
        "method": method,
        "budget": budget,
        "transferred": transferred,
        "retuned": retuned,
        "delta_em": transferred["em"] - retuned["em"],
    }
