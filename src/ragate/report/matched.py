"""The budget-matched comparison of TARG section 5.1 (Tables 3-4): each method's best operating point whose
retrieval rate stays within a budget rho.

A swept gate (``ragate sweep``) can take any of its thresholds, so its point at rho is the best of its exact
frontier points with rate <= rho (ties: the lower rate), as in TARG's tables. That choice looks at the answers'
correctness on the very questions it is scored on, so it is optimistic, also for the random gate (whose row
shows the size of that bias); ``select="quantile"`` takes instead tau = F^-1(1 - rho) of the gate's scores
(TARG section 3.3's calibration, blind to correctness). A method with one operating point (an eval run: CRAG-lite,
FLARE, a gate at a fixed threshold) enters at rho when its own rate is within rho, and is marked over budget
otherwise; TARG section 5.1 bounds every baseline to one retrieval, so a method that retrieved more than once
for some question (FLARE at its own settings) says so in its row ("not bounded: 2.2 retrievals/q"; ``flare-once``
is FLARE within the bound). Each point carries its paired bootstrap 95% intervals against Always-RAG *with the same reader* (the
retrieval answer of the method's own family, on the same questions) and against a random gate at the same rate
with that reader (whose expected score on a question is rate x its retrieval score + (1 - rate) x its
closed-book score: the control that says whether the gate's *choice* of questions is worth anything), and
Δlatency against Never (seconds per question).

Latency of a swept point, per question: the gate's charged seconds plus the answer's (the retrieval answer where it
retrieves, else the closed-book one). Where the gate's draft is itself the start of the closed-book answer (TARG,
DTR, Self-RAG-lite) that draft is counted twice on the no-retrieval path, so the figure is an upper bound there.
An eval method's latency is its measured seconds per question.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ragate.errors import RagateError
from ragate.eval.metrics import DEFAULT_BOOT, Resampling, paired_bootstrap_diff
from ragate.eval.summary import interval_points, points, verdict
from ragate.eval.sweep import method_records, swept_methods
from ragate.eval.thresholds import threshold_for_budget

DEFAULT_BUDGETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6)  # TARG's regime is 5-30% (Table 4: ~15%)
Select = Literal["best", "quantile"]


def parse_budgets(text: str) -> tuple[float, ...]:
    """``"0.2,0.4"`` -> (0.2, 0.4); every budget in (0, 1]."""
    try:
        budgets = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise RagateError(f"--budgets {text!r}: give comma-separated rates, e.g. 0.2,0.4,0.6") from None
    if not budgets or any(not 0 < b <= 1 for b in budgets):
        raise RagateError(f"--budgets {text!r}: every budget is a retrieval rate in (0, 1]")
    return tuple(sorted(set(budgets)))


def _compare(
    chosen: Sequence[float],
    always: Sequence[float],
    never: Sequence[float],
    rate: float,
    boot: Resampling = DEFAULT_BOOT,
) -> dict[str, Any]:
    """Paired differences from Always-RAG and from a random gate at the same rate with the same reader, whose
    expected score on question i is rate * always_i + (1 - rate) * never_i."""
    lo, hi = paired_bootstrap_diff(chosen, always, samples=boot.samples, seed=boot.seed)
    random = [rate * a + (1 - rate) * n for a, n in zip(always, never, strict=True)]
    rlo, rhi = paired_bootstrap_diff(chosen, random, samples=boot.samples, seed=boot.seed)
    return {
        "delta_vs_always": statistics.fmean(chosen) - statistics.fmean(always),
        "ci_vs_always": (lo, hi),
        "verdict": verdict(lo, hi),
        "delta_vs_random": statistics.fmean(chosen) - statistics.fmean(random),
        "ci_vs_random": (rlo, rhi),
        "verdict_vs_random": verdict(rlo, rhi),
    }


def swept_point(
    rows: Sequence[Mapping[str, Any]],
    method: str,
    budget: float,
    metric: str = "em",
    select: Select = "best",
    boot: Resampling = DEFAULT_BOOT,
) -> dict[str, Any]:
    """``method``'s operating point within ``budget`` on the sweep ``rows``: its best exact point with rate <=
    ``budget`` (``select="best"``, TARG's tables), or tau = F^-1(1 - budget) of its scores (``"quantile"``, chosen
    without looking at any answer's correctness, so its comparisons carry no selection bias)."""
    scores = np.array([r["gates"][method]["score"] for r in rows], dtype=float)
    if select == "quantile":
        taus = [threshold_for_budget(scores.tolist(), budget)]
    else:
        taus = [float(np.nextafter(scores.min(), -np.inf)), *sorted(set(scores.tolist()))]
    best: tuple[float, float, float] | None = None  # (metric, -rate, tau)
    for tau in taus:
        retrieve = scores > tau
        rate = float(retrieve.mean())
        if rate > budget + 1e-12:
            continue
        value = statistics.fmean(
            (r["open"] if x else r["closed"])["scores"][metric] for r, x in zip(rows, retrieve, strict=True)
        )
        if best is None or (value, -rate) > best[:2]:
            best = (value, -rate, tau)
    assert (
        best is not None
    )  # the highest score retrieves for none (rate 0), and the quantile stays within rho
    tau = best[2]
    retrieve = scores > tau
    chosen = [
        (r["open"] if x else r["closed"])["scores"][metric] for r, x in zip(rows, retrieve, strict=True)
    ]
    always = [r["open"]["scores"][metric] for r in rows]
    never = [r["closed"]["scores"][metric] for r in rows]
    latency = [
        r["gates"][method]["seconds"] + (r["open"] if x else r["closed"])["seconds"] - r["closed"]["seconds"]
        for r, x in zip(rows, retrieve, strict=True)
    ]
    return {
        "method": method,
        "kind": f"swept ({select})",
        "budget": budget,
        "n": len(rows),
        "tau": tau,
        metric: statistics.fmean(chosen),
        "retrieval_rate": float(retrieve.mean()),
        "delta_latency": statistics.fmean(latency),
    } | _compare(chosen, always, never, float(retrieve.mean()), boot)


def single_point(
    records: Sequence[Mapping[str, Any]],
    method: str,
    budget: float,
    reference: Mapping[str, Mapping[str, Any]],
    metric: str = "em",
    boot: Resampling = DEFAULT_BOOT,
) -> dict[str, Any]:
    """An eval method's one operating point at ``budget``: in budget or not; compared, on the questions it shares
    with ``reference`` (sweep rows of its family by question id), with that family's Always-RAG and Never."""
    mine = [r for r in records if r["method"] == method and "error" not in r]
    if not mine:
        raise RagateError(f"the eval run has no answered questions for {method!r}")
    rate = statistics.fmean(float(bool(r["retrieved"])) for r in mine)
    point: dict[str, Any] = {
        "method": method,
        "kind": "one point",
        "budget": budget,
        "n": len(mine),
        "tau": None,
        metric: statistics.fmean(r["scores"][metric] for r in mine),
        "retrieval_rate": rate,
        "within_budget": rate <= budget + 1e-12,
        "retrievals_per_question": statistics.fmean(float(r.get("retrievals") or 0) for r in mine),
        "max_retrievals": max(int(r.get("retrievals") or 0) for r in mine),
    }
    shared = [r for r in mine if r["id"] in reference]
    if shared:
        refs = [reference[r["id"]] for r in shared]
        point |= _compare(
            [r["scores"][metric] for r in shared],
            [x["open"]["scores"][metric] for x in refs],
            [x["closed"]["scores"][metric] for x in refs],
            rate,
            boot,
        )
        point["n_paired"] = len(shared)
        point["delta_latency"] = statistics.fmean(
            r["seconds"] - x["closed"]["seconds"] for r, x in zip(shared, refs, strict=True)
        )
    return point


def matched_table(
    sweep_records: Sequence[dict[str, Any]],
    eval_records: Sequence[dict[str, Any]] = (),
    budgets: Sequence[float] = DEFAULT_BUDGETS,
    metric: str = "em",
    select: Select = "best",
) -> list[dict[str, Any]]:
    """Every method's point at every budget: the sweep's gates (``select`` as in :func:`swept_point`), then the
    eval run's methods (by name)."""
    from ragate.eval.sweep import family_key
    from ragate.methods import get_method

    rows: list[dict[str, Any]] = []
    swept = swept_methods(sweep_records)
    for budget in budgets:
        for m in swept:
            rows.append(swept_point(method_records(sweep_records, m), m, budget, metric, select))
        for label in dict.fromkeys(point_label(r) for r in eval_records):
            if label in swept:
                continue
            mine = [r for r in eval_records if point_label(r) == label]
            m = mine[0]["method"]
            family = family_key(get_method(m))
            reference = {r["id"]: r for r in sweep_records if r["family"] == family}
            rows.append(single_point(mine, m, budget, reference, metric) | {"method": label})
    return rows


def point_label(record: Mapping[str, Any]) -> str:
    """The row name of an eval record's method: its ``label`` (e.g. "flare θ=0.3", for one method run at two
    thresholds), else the method's name."""
    return str(record.get("label") or record["method"])


def references(sweep_records: Sequence[Mapping[str, Any]], metric: str = "em") -> list[dict[str, Any]]:
    """Never and Always-RAG per family of the sweep: the rows every budget is compared with."""
    out = []
    for family in dict.fromkeys(r["family"] for r in sweep_records):
        rows = [r for r in sweep_records if r["family"] == family]
        out.append(
            {
                "family": family,
                "methods": sorted({m for r in rows for m in r["methods"]}),
                "n": len(rows),
                "never": statistics.fmean(r["closed"]["scores"][metric] for r in rows),
                "always": statistics.fmean(r["open"]["scores"][metric] for r in rows),
                "always_latency": statistics.fmean(
                    r["open"]["seconds"] - r["closed"]["seconds"] for r in rows
                ),
            }
        )
    return out


def matched_markdown(
    rows: Sequence[Mapping[str, Any]], refs: Sequence[Mapping[str, Any]], metric: str = "em"
) -> str:
    """The table in points: per budget, each method's metric, rate, Δlatency and its difference from Always-RAG
    with the paired interval; an interval that crosses 0 is "not established"."""
    name = {"em": "EM", "f1": "F1", "acc": "acc"}.get(metric, metric)
    lines = [
        "| family (methods) | n | Never " + name + " | Always-RAG " + name + " | Always Δlatency (s) |",
        "|---|---|---|---|---|",
    ]
    for r in refs:
        lines.append(
            f"| {', '.join(r['methods'])} | {r['n']} | {100 * r['never']:.1f} | {100 * r['always']:.1f} "
            f"| {r['always_latency']:+.2f} |"
        )
    lines += [
        "",
        (
            f"| budget ρ | method | {name} | rate | τ | Δlatency vs Never (s) | Δ{name} vs Always-RAG [95%] "
            f"| verdict | Δ{name} vs random at the same rate [95%] | verdict |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        over = r.get("within_budget") is False
        tau = "–" if r["tau"] is None else f"{r['tau']:.4g}"
        if "ci_vs_always" in r:
            lo, hi = r["ci_vs_always"]
            diff = f"{points(r['delta_vs_always'])} {interval_points(lo, hi)}"
            verdict = r["verdict"]
            diff += f" | {verdict} | {points(r['delta_vs_random'])} {interval_points(*r['ci_vs_random'])}"
            verdict = r["verdict_vs_random"]
        else:
            diff, verdict = "– | no Always-RAG on these questions | –", "–"
        latency = "–" if r.get("delta_latency") is None else f"{r['delta_latency']:+.2f}"
        notes = ["over budget"] if over else []
        if r.get("max_retrievals", 0) > 1:
            notes.append(f"not bounded: {r['retrievals_per_question']:.1f} retrievals/q")
        value = f"{100 * r[metric]:.1f}" + (f" ({'; '.join(notes)})" if notes else "")
        lines.append(
            f"| {r['budget']:g} | {r['method']} | {value} | {r['retrieval_rate']:.2f} | {tau} | {latency} "
            f"| {diff} | {verdict} |"
        )
    return "\n".join(lines) + "\n"
