"""The routes' frontier: accuracy against cost for each fixed route, the oracle and the cascade, replayed from an
eval run that answered every question with every route.

A route method runs each route as that method alone, so a route's answer to a question does not depend on the
other routes: one eval run of every route over the same questions (``ragate eval --methods wo-rag,single-rag,ircot``)
holds what any cascade would answer and pay, without running it. The cascade
(:func:`ragate.methods.route.run_route`) stops at the first route whose answer's normalised NLL (DTR Eqs. 2-3) is at
most the stage's threshold or, from the second route on, agrees with the answer of the route before; it pays for
every route it ran. The oracle takes the cheapest route that is right (the first route where none is): the label
Adaptive-RAG (Jeong et al., NAACL 2024) trains its classifier on, for evaluation only.

Adaptive-RAG's own policy is the baseline: a classifier of the question alone, trained on the cheapest right route
of training questions (where no route is right, the dataset's kind: the multi-step route for a multi-hop dataset,
the one-retrieval route otherwise; its Section 3.3), here a multinomial logistic regression on ragate's question
features in place of the paper's T5-Large, cross-fitted like the thresholds. It pays for the one route it chose.

Stop thresholds for a target cost are chosen on questions disjoint from those they are scored on (two-fold
cross-fitting): the questions are split in two halves by a seeded shuffle, and each half is answered with the
thresholds whose cascade, on the other half, is the most accurate at mean retrievals within the target (ties:
fewer retrievals, then more tokens saved). A target is a share of the last route's mean retrievals. Paired bootstrap
95% intervals compare each row with always taking the last route, over the same questions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import numpy as np

from ragate.errors import RagateError
from ragate.eval.metrics import paired_bootstrap_diff
from ragate.eval.summary import verdict
from ragate.methods.route import answers_agree, route_specs
from ragate.methods.route_policy import (
    Linear,
    RoutePolicyModel,
    adaptive_choice,
    answer_vector,
    learned_values,
    question_vector,
)
from ragate.methods.spec import RouteSpec
from ragate.methods.trace import Stage, answer_nll
from ragate.text import evidence_applies, extract_answer

COSTS = ("retrievals", "lm_calls", "tokens", "seconds")
METRICS = ("em", "f1", "acc")
DEFAULT_TARGETS = (0.25, 0.4, 0.6)  # shares of the last route's mean retrievals
GRID = tuple(q / 10 for q in range(11))  # each stage's thresholds: these quantiles of its NLLs on the tuning half
Pays = Literal["taken", "every", "first"]
MULTI_HOP = frozenset({"hotpotqa", "hotpotqa-train-raw", "2wikimultihopqa", "musique"})  # Adaptive-RAG's kinds


@dataclass(frozen=True, eq=False)
class RouteTable:
    """Every route's answer to the same questions: per question (rows) and route (columns, cheapest first) its
    scores, cost and answer NLL (nan where the record holds no log-probabilities)."""

    routes: tuple[str, ...]
    ids: tuple[str, ...]
    questions: tuple[str, ...]
    datasets: tuple[str, ...]
    answers: tuple[tuple[str, ...], ...]
    scores: Mapping[str, np.ndarray]  # metric -> (n, routes)
    costs: Mapping[str, np.ndarray]  # "retrievals", "lm_calls", "tokens", "seconds" -> (n, routes)
    nll: np.ndarray  # (n, routes)
    supported: np.ndarray  # (n, routes): 1 where the answer is found in the passages it read, nan where not recorded

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, rows: np.ndarray) -> RouteTable:
        """These ``rows``' table, with their question features where this table has computed them (a policy fitted
        on a half then reads them without computing them again)."""
        taken = RouteTable(
            self.routes,
            tuple(self.ids[i] for i in rows),
            tuple(self.questions[i] for i in rows),
            tuple(self.datasets[i] for i in rows),
            tuple(self.answers[i] for i in rows),
            {k: v[rows] for k, v in self.scores.items()},
            {k: v[rows] for k, v in self.costs.items()},
            self.nll[rows],
            self.supported[rows],
        )
        if "question_x" in self.__dict__:  # functools.cached_property keeps it in the instance's __dict__
            taken.__dict__["question_x"] = self.question_x[rows]
        return taken

    @functools.cached_property
    def question_x(self) -> np.ndarray:
        """The questions' features (:func:`ragate.methods.route_policy.question_vector`), computed once for every
        policy that reads them."""
        return question_vector(self.questions)

    @property
    def has_nll(self) -> bool:
        """Whether some route but the last has an NLL to stop on (a route without one never stops on NLL)."""
        return bool(np.isfinite(self.nll[:, :-1]).any())

    @property
    def has_evidence(self) -> bool:
        """Whether the records say, for some route but the last, whether its answer is in the passages it read
        (``supported``): the cascade's evidence check reads it."""
        return bool(np.isfinite(self.supported[:, :-1]).any())


def record_nll(record: Mapping[str, Any]) -> float | None:
    """The answer's normalised NLL from an eval record's trace (None: its stages hold no log-probabilities, as in
    runs recorded before stages kept them)."""
    trace = record.get("trace") or {}
    names = {f.name for f in fields(Stage)}
    stages = [Stage(**{k: v for k, v in s.items() if k in names}) for s in trace.get("stages") or []]
    return answer_nll(stages, dynamic=trace.get("dynamic") is not None)


def _answer(record: Mapping[str, Any]) -> str:
    """The answer's text as the live cascade compares it (the trace's answer, not the extracted prediction)."""
    trace = record.get("trace") or {}
    return str(trace["answer"]) if isinstance(trace.get("answer"), str) else str(record.get("prediction", ""))


def _cost(record: Mapping[str, Any]) -> tuple[float, float, float, float]:
    stages = (record.get("trace") or {}).get("stages") or []
    calls = sum(1 for s in stages if s.get("prompt_tokens") or s.get("completion_tokens"))
    tokens = record.get("prompt_tokens", 0) + record.get("completion_tokens", 0)  # overhead is inside these
    return float(record.get("retrievals", 0)), float(calls), float(tokens), float(record.get("seconds", 0.0))


def _supported(record: Mapping[str, Any]) -> float:
    """The record's evidence check as the live cascade reads it: 1 or 0, nan where it says nothing (nothing read, a
    run before records kept it, or a yes/no answer, exempt since 2026-12-05 and so left out of older records too)."""
    found = record.get("supported")
    if not isinstance(found, bool) or not evidence_applies(extract_answer(_answer(record))):
        return math.nan
    return float(found)


def route_table(records: Iterable[Mapping[str, Any]], routes: Sequence[str]) -> RouteTable:
    """The questions every route answered, in the order of the first route's records (a question a route
    answered twice: its first record). A question is its dataset and its id: datasets number their questions
    alike (2WikiMultihopQA's and MuSiQue's ids are both 0, 1, ...), so records pooled over datasets keep each."""
    by_route: dict[str, dict[tuple[str, str], Mapping[str, Any]]] = {r: {} for r in routes}
    for r in records:
        if r.get("method") in by_route and "error" not in r:
            by_route[r["method"]].setdefault((str(r.get("dataset", "")), str(r["id"])), r)
    if missing := [r for r in routes if not by_route[r]]:
        raise RagateError(
            f"the run has no answered records of route {missing[0]!r}: run every route over the same questions "
            f"(ragate eval --methods {','.join(routes)})"
        )
    keys = tuple(k for k in by_route[routes[0]] if all(k in by_route[r] for r in routes))
    if not keys:
        raise RagateError(f"no question was answered by every route of {', '.join(routes)}")
    rows = [[by_route[r][k] for r in routes] for k in keys]
    ids = tuple(i for _, i in keys)
    scores = {m: np.array([[float(x["scores"][m]) for x in row] for row in rows]) for m in METRICS}
    cost = np.array([[_cost(x) for x in row] for row in rows])  # (n, routes, 4)
    nll = np.array([[math.nan if (v := record_nll(x)) is None else v for x in row] for row in rows])
    supported = np.array([[_supported(x) for x in row] for row in rows])
    return RouteTable(
        tuple(routes),
        ids,
        tuple(str(row[0].get("question", "")) for row in rows),
        tuple(str(row[0].get("dataset", "")) for row in rows),
        tuple(tuple(_answer(x) for x in row) for row in rows),
        scores,
        {name: cost[:, :, j] for j, name in enumerate(COSTS)},
        nll,
        supported,
    )


def cascade(table: RouteTable, stops: Sequence[float], *, agree: bool = True, evidence: bool = False) -> np.ndarray:
    """The route the cascade answers each question with (its index): the first whose NLL is at most its stop
    threshold or (from the second route on, with ``agree``) whose answer agrees with the route before's and (with
    ``evidence``) is found in the passages it read, where the record says so; the last route otherwise. A missing
    NLL never stops (as in :func:`ragate.methods.route.run_route`)."""
    n, last = len(table), len(table.routes) - 1
    taken = np.full(n, last)
    for i in range(n):
        for j in range(last):
            nll = table.nll[i, j]
            stop = bool(np.isfinite(nll) and nll <= stops[j])
            if agree and j > 0 and not stop:
                stop = answers_agree(table.answers[i][j], table.answers[i][j - 1])
            if evidence and table.supported[i, j] == 0.0:  # read passages, and the answer is not in them
                stop = False
            if stop:
                taken[i] = j
                break
    return taken


def oracle(table: RouteTable, metric: str) -> np.ndarray:
    """The cheapest route that is right on each question (score > 0), the first route where none is."""
    right = table.scores[metric] > 0
    return np.where(right.any(axis=1), right.argmax(axis=1), 0)


def halves(n: int, seed: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The two folds of cross-fitting, as (scored, trained) pairs: the questions split in two by a seeded shuffle."""
    order = np.random.default_rng(seed).permutation(n)
    a, b = order[: n // 2], order[n // 2 :]
    return (a, b), (b, a)


def route_labels(table: RouteTable, metric: str) -> np.ndarray:
    """Adaptive-RAG's training labels: the cheapest right route, else the dataset's kind (the last route for a
    multi-hop dataset, the first one-retrieval route otherwise)."""
    from ragate.methods.registry import get_method
    from ragate.methods.route import route_cost

    right = table.scores[metric] > 0
    last = len(table.routes) - 1
    one = next((j for j, r in enumerate(table.routes) if route_cost(get_method(r)) == 1), last)
    kind = np.array([last if d in MULTI_HOP else one for d in table.datasets])
    return np.where(right.any(axis=1), right.argmax(axis=1), kind)


def _classifier() -> Any:
    """The logistic regression every policy here fits: standardised features, L2 at scikit-learn's default."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))


def fit_adaptive(table: RouteTable, metric: str) -> RoutePolicyModel:
    """Adaptive-RAG's question classifier fitted on every question of ``table`` (:func:`route_labels`); where the
    labels hold one route only (or there are none: the last route), that route for every question."""
    y = route_labels(table, metric)
    classes = np.unique(y) if len(y) else np.array([len(table.routes) - 1])
    if len(classes) == 1:
        return RoutePolicyModel("adaptive-rag", choose=int(classes[0]))
    return RoutePolicyModel("adaptive-rag", choose=Linear.from_sklearn(_classifier().fit(table.question_x, y)))


def adaptive_rag(table: RouteTable, metric: str, *, seed: int = 0) -> np.ndarray:
    """Each question's route as Adaptive-RAG's question classifier chooses it, trained on the other half of the
    questions (:func:`fit_adaptive`; the halves of :func:`cross_fitted`)."""
    taken = np.zeros(len(table), dtype=int)
    for scored, trained in halves(len(table), seed):
        if len(scored):
            taken[scored] = adaptive_choice(fit_adaptive(table.take(trained), metric), table.question_x[scored])[0]
    return taken


def learned_x(table: RouteTable) -> np.ndarray:
    """The learned policy's features: the question's, then the first route's answer's (:func:`answer_vector`)."""
    first = [answer_vector(table.nll[i, 0], table.answers[i][0], table.costs["tokens"][i, 0]) for i in range(len(table))]
    return np.hstack([table.question_x, np.array(first, dtype=float).reshape(len(table), -1)])


LAMBDAS = (0.0, *np.geomspace(1e-3, 10.0, 49).tolist())


def fit_learned(table: RouteTable, metric: str, target: float) -> RoutePolicyModel:
    """The learned policy fitted on every question of ``table``: a logistic fit of P(right) per route on
    :func:`learned_x` (a constant where the questions hold one outcome), each route's mean retrievals (the first's
    0: it has run), and lambda the one whose choices are the most accurate with mean retrievals (the first route's
    plus the chosen one's) at most ``target`` (the largest where none is)."""
    x, right = learned_x(table), table.scores[metric] > 0
    fits: list[Linear | float] = []
    for r in range(len(table.routes)):
        y = right[:, r]
        fits.append(Linear.from_sklearn(_classifier().fit(x, y)) if len(np.unique(y)) == 2 else float(y.mean() if len(y) else 0.0))
    cost = table.costs["retrievals"].mean(axis=0) if len(table) else np.zeros(len(table.routes))
    model = RoutePolicyModel("learned", right=tuple(fits), costs=(0.0, *map(float, cost[1:])))
    p, costs = learned_values(model, x), np.asarray(model.costs)
    lam = most_accurate_within(table, LAMBDAS, lambda lam: np.argmax(p - lam * costs, axis=1), target, metric,
                               pays="first")  # fmt: skip
    return replace(model, lam=lam if lam is not None else LAMBDAS[-1])


def learned(table: RouteTable, metric: str, target: float, *, seed: int = 0) -> np.ndarray:
    """Each question's route by P(right | route, features) - lambda * the route's mean retrievals
    (:func:`fit_learned` on the other half of the questions; the first route always runs)."""
    x = learned_x(table)
    taken = np.zeros(len(table), dtype=int)
    for scored, trained in halves(len(table), seed):
        if not len(scored) or not len(trained):
            continue  # nothing to learn from: the first route
        taken[scored] = np.argmax(learned_values(fit_learned(table.take(trained), metric, target), x[scored]), axis=1)
    return taken


@dataclass(frozen=True)
class Row:
    """One policy's answers: the route taken per question, what it scored and what it paid (per question)."""

    name: str
    taken: np.ndarray
    score: np.ndarray
    costs: Mapping[str, np.ndarray]
    note: str = ""


def outcome(table: RouteTable, name: str, taken: np.ndarray, metric: str, *, pays: Pays, note: str = "") -> Row:
    """The row of a policy taking ``taken``: its score and its cost, which ``pays`` says: "taken", the route taken
    alone (a fixed route, a classifier of the question, the oracle); "every", every route up to the one taken (a
    cascade runs them in turn); "first", the first route and the one taken (a policy that reads the first
    route's answer, then chooses)."""
    n = np.arange(len(table))
    routes = np.arange(len(table.routes))[None, :]
    ran = {"taken": routes == taken[:, None], "every": routes <= taken[:, None]}.get(pays)
    if ran is None:
        ran = (routes == taken[:, None]) | (routes == 0)
    costs = {k: (v * ran).sum(axis=1) for k, v in table.costs.items()}
    return Row(name, taken, table.scores[metric][n, taken], costs, note)


def _quantiles(values: np.ndarray) -> list[float]:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return [-math.inf]
    return [-math.inf, *sorted({float(np.quantile(finite, q)) for q in GRID})]


def tune_stops(
    table: RouteTable, target: float, metric: str, *, agree: bool = True, evidence: bool = False
) -> tuple[float, ...]:
    """The stop thresholds (one per route but the last) whose cascade on ``table`` is the most accurate with mean
    retrievals at most ``target``; ties: fewer retrievals, then fewer tokens. -inf: that stage never stops on
    NLL. Over a grid of each stage's NLL quantiles."""
    grids = [_quantiles(table.nll[:, j]) for j in range(len(table.routes) - 1)]
    best = most_accurate_within(
        table, combinations(grids), lambda stops: cascade(table, stops, agree=agree, evidence=evidence), target,
        metric, pays="every", tokens=True,
    )  # fmt: skip
    return best if best is not None else tuple(max(g) for g in grids)  # none within: stop as early as it can


def combinations(grids: Sequence[Sequence[float]]) -> list[tuple[float, ...]]:
    """Every choice of one value per grid (each stage's threshold), in the order a grid search tries them."""
    return [tuple(map(float, c)) for c in np.array(np.meshgrid(*grids, indexing="ij")).reshape(len(grids), -1).T]


def most_accurate_within(
    table: RouteTable,
    candidates: Sequence[Any],
    route_of: Callable[[Any], np.ndarray],
    target: float,
    metric: str,
    *,
    pays: Pays,
    tokens: bool = False,
) -> Any:
    """The candidate (thresholds, a lambda) whose routes (``route_of``) are the most accurate on ``table`` with
    mean retrievals at most ``target``; ties: fewer retrievals (with ``tokens``, then fewer tokens), then the
    first tried. None where no candidate is within the target."""
    best, best_key = None, None
    for candidate in candidates:
        row = outcome(table, "", route_of(candidate), metric, pays=pays)
        spent = float(row.costs["retrievals"].mean()) if len(table) else 0.0
        if spent > target + 1e-9:
            continue
        key: tuple[float, ...] = (-float(row.score.mean()) if len(table) else 0.0, spent)
        key += (float(row.costs["tokens"].mean()),) if tokens else ()
        if best_key is None or key < best_key:
            best, best_key = candidate, key
    return best


def cross_fitted(
    table: RouteTable, target: float, metric: str, *, seed: int = 0, agree: bool = True, evidence: bool = False
) -> np.ndarray:
    """Each question's route under thresholds tuned on the other half of the questions (:func:`tune_stops`)."""
    taken = np.zeros(len(table), dtype=int)
    for scored, tuned in halves(len(table), seed):
        if not len(scored):
            continue
        if not len(tuned):  # nothing to tune on: no stage stops on NLL
            stops: tuple[float, ...] = (-math.inf,) * (len(table.routes) - 1)
        else:
            stops = tune_stops(table.take(tuned), target, metric, agree=agree, evidence=evidence)
        taken[scored] = cascade(table.take(scored), stops, agree=agree, evidence=evidence)
    return taken


def _cell(text: str) -> str:
    """Text set in a Markdown table cell: a "|" in a method's name cannot end the cell."""
    return text.replace("|", "\\|")


def frontier_markdown(
    table: RouteTable, rows: Sequence[Row], metric: str = "em", *, samples: int = 1000, seed: int = 0
) -> str:
    """The frontier as a Markdown table: per row the metric (x 100), its paired difference with always taking the
    last route, the share of questions each route answered, and mean retrievals, LM calls, tokens and seconds per
    question."""
    base = rows[len(table.routes) - 1]
    head = (
        f"| policy | {metric.upper()} | minus always {_cell(table.routes[-1])} (paired 95%) | "
        + " / ".join(map(_cell, table.routes))
        + " answered | retrievals/q | LM calls/q | tokens/q | seconds/q |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if row.note and not row.costs:
            lines.append(f"| {_cell(row.name)} | – | {_cell(row.note)} | | | | | |")
            continue
        if row is base:
            gap = "–"
        else:
            lo, hi = paired_bootstrap_diff(row.score.tolist(), base.score.tolist(), samples=samples, seed=seed)
            d = float(np.mean(row.score - base.score))
            gap = f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] ({verdict(lo, hi)})"
        shares = " / ".join(f"{np.mean(row.taken == j):.2f}" for j in range(len(table.routes)))
        c = {k: float(np.mean(v)) for k, v in row.costs.items()}
        lines.append(
            f"| {_cell(row.name)} | {100 * float(np.mean(row.score)):.1f} | {gap} | {shares} | {c['retrievals']:.2f} | "
            f"{c['lm_calls']:.2f} | {c['tokens']:.0f} | {c['seconds']:.1f} |"
        )
    return "\n".join(lines)


def question_wrong(table: RouteTable, route: int, metric: str, *, seed: int = 0) -> np.ndarray:
    """A classifier of the question alone: P(route ``route``'s answer wrong) for each question, cross-fitted on the
    halves (a logistic regression on :func:`ragate.methods.route_policy.question_vector`)."""
    x, wrong = table.question_x, table.scores[metric][:, route] <= 0
    p = np.zeros(len(table))
    for scored, trained in halves(len(table), seed):
        if not len(scored):
            continue
        if len(np.unique(wrong[trained])) < 2:
            p[scored] = float(wrong[trained].mean()) if len(trained) else 0.5
            continue
        model = _classifier().fit(x[trained], wrong[trained])
        p[scored] = model.predict_proba(x[scored])[:, 1]
    return p


def checks_markdown(table: RouteTable, metric: str = "em", *, seed: int = 0, samples: int = 1000) -> str:
    """Each stop check's AUROC for "this route's answer is wrong" beside a classifier of the question alone's (the
    paired difference, bootstrap 95%): the answer's NLL (higher: more likely wrong), from the second route on,
    disagreement with the route before, and, where the records hold it (``supported``, runs since 2026-12-05), the
    answer not found in the passages it read."""
    lines = [
        (
            f"| route | check | AUROC for its answer wrong ({metric.upper()}) [95%] | minus the question "
            "classifier's (paired 95%) | wrong / n |"
        ),
        "|---|---|---|---|---|",
    ]
    for j, route in enumerate(table.routes[:-1]):
        wrong = table.scores[metric][:, j] <= 0
        n = f"{int(wrong.sum())} / {len(table)}"
        if wrong.all() or not wrong.any():
            lines.append(f"| {_cell(route)} | – | one class only | | {n} |")
            continue
        asked = question_wrong(table, j, metric, seed=seed)
        checks = [("question classifier (cross-fitted)", asked)]
        if np.isfinite(table.nll[:, j]).all():
            checks.append(("NLL", table.nll[:, j]))
        else:
            lines.append(f"| {_cell(route)} | NLL | no log-probabilities in the records | | {n} |")
        if j > 0:
            agree = np.array([answers_agree(a[j], a[j - 1]) for a in table.answers])
            checks.append((f"disagrees with {table.routes[j - 1]}", (~agree).astype(float)))
        found = np.isfinite(table.supported[:, j])  # the answers the evidence check says something about
        for name, score in checks:
            lines.append(_check_line(route, name, score, asked, wrong, seed=seed, samples=samples))
        if found.sum() >= 2 and 0 < wrong[found].sum() < found.sum():
            name = "answer not in its passages" + ("" if found.all() else " (the answers it applies to)")
            lines.append(_check_line(route, name, 1.0 - table.supported[found, j], asked[found], wrong[found],
                                     seed=seed, samples=samples))  # fmt: skip
    return "\n".join(lines)


def _check_line(
    route: str, name: str, score: np.ndarray, asked: np.ndarray, wrong: np.ndarray, *, seed: int, samples: int
) -> str:
    """One check's row: its AUROC for the answer wrong and, beside the question classifier's, the paired gap."""
    from ragate.uncertainty import auroc_interval, paired_auroc_gap

    point, lo, hi = auroc_interval(score, wrong, seed=seed, resamples=samples)
    gap = "–"
    if score is not asked:
        d, dlo, dhi = paired_auroc_gap(score, asked, wrong, seed=seed, resamples=samples)
        gap = f"{d:+.3f} [{dlo:+.3f}, {dhi:+.3f}] ({verdict(dlo, dhi)})"
    n = f"{int(wrong.sum())} / {len(wrong)}"
    return f"| {_cell(route)} | {_cell(name)} | {point:.3f} [{lo:.3f}, {hi:.3f}] | {gap} | {n} |"


def read_route_table(run_dirs: Sequence[str | Any], routes: Sequence[str]) -> RouteTable:
    """The route table of ``routes`` over the eval runs ``run_dirs`` (a route's answer from the first run that
    holds it); routes that a route method would refuse (unknown, in two answer formats, not cheapest first) are
    refused here too, so that a cascade, a policy and the oracle replay what a route method can run."""
    from pathlib import Path

    from ragate.eval.records import read_records

    if len(set(routes)) != len(routes) or len(routes) < 2:
        raise RagateError(f"--routes names two routes or more, each once, cheapest first (got {','.join(routes)})")
    route_specs(RouteSpec(tuple(routes)))  # routes this version knows, in one answer format, cheapest first
    records: list[dict[str, Any]] = []
    for run_dir in run_dirs:
        path = Path(run_dir) / "questions.jsonl"
        if not path.is_file():
            raise RagateError(f"{run_dir} holds no questions.jsonl: give an eval run directory (ragate eval --out DIR)")
        records += read_records(path, repair=False, check=_answer_fault)
    return route_table(records, routes)


def _answer_fault(record: dict[str, Any]) -> str | None:
    """An answer a route table reads (a method's record without an error) must hold its scores."""
    if "method" in record and "error" not in record and "scores" not in record:
        return 'no "scores" in this answer (a route table compares the routes\' scores)'
    return None
