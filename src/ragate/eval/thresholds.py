"""Thresholds from a retrieval budget (TARG section 3.3), and the ``ragate calibrate`` files that record them.

Every gate's score is oriented so that a higher score means "retrieve" and the gate retrieves iff score > tau
(``GateDecision``). A budget rho (the share of questions allowed to retrieve) gives tau = F^-1(1 - rho), the
empirical (1 - rho)-quantile of the dev scores, so that at most a share rho of the dev questions score above it.

On *new* questions that quantile overshoots the budget about half the time. :func:`conservative_threshold` picks
an order statistic of the dev scores instead, so that the rate on new questions from the same distribution stays
at most rho with a chosen confidence (the bound is below). A ``ragate calibrate`` file is read and checked here too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.eval.records import is_count, is_number, short
from ragate.fileio import lone_surrogate, parse_json, utf8_text


def threshold_for_budget(scores: Sequence[float], budget: float) -> float:
    """tau = F^-1(1 - budget) over ``scores`` (TARG section 3.3), the inverted-CDF quantile: the smallest score
    s with F(s) >= 1 - budget, so the share of scores strictly above tau is at most ``budget``.

    A budget of 1 returns a value below every score (always retrieve), 0 the largest score (never retrieve).
    """
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"budget must be a share of questions in [0, 1], got {budget}")
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no dev scores to calibrate on: score at least one question first")
    if not np.all(np.isfinite(values)):
        raise ValueError("dev scores contain NaN or infinity: check the gate's drafts")
    if budget >= 1.0:
        return float(np.nextafter(values.min(), -np.inf))
    # 1 - 0.7 is 0.30000000000000004 in floats, which would move the quantile one question up: rounded first
    return float(np.quantile(values, round(1.0 - budget, 12), method="inverted_cdf"))


def halves(ids: Sequence[str]) -> list[int]:
    """Each question's half (0 or 1) for cross-fitting: the questions ordered by the sha256 of their id, then
    alternated, so the halves differ by at most one question and do not depend on the order a run wrote them in."""
    order = sorted(range(len(ids)), key=lambda i: hashlib.sha256(str(ids[i]).encode()).hexdigest())
    half = [0] * len(ids)
    for rank, i in enumerate(order):
        half[i] = rank % 2
    return half


def cross_fitted_taus(scores: Sequence[float], budget: float, half: Sequence[int]) -> list[float]:
    """A threshold for each question set without its own score: question i, in half ``half[i]`` (0 or 1, e.g.
    :func:`halves`), gets tau = F^-1(1 - budget) (:func:`threshold_for_budget`) over the scores of the other half,
    so no scored question sets the threshold it is decided with (a tau set on the questions it is then judged on
    flatters every gated row). Each half needs at least one question."""
    if len(half) != len(scores):
        raise ValueError(f"{len(scores)} scores but {len(half)} halves")
    if set(half) != {0, 1}:
        raise ValueError(f"cross-fitting needs questions in both halves, got halves {sorted(set(half))}")
    by_half = [threshold_for_budget([s for s, h in zip(scores, half) if h != k], budget) for k in (0, 1)]
    return [by_half[h] for h in half]


@dataclass(frozen=True)
class BudgetBound:
    """A threshold that keeps the retrieval rate on new questions at most ``budget`` with ``confidence``.

    ``k`` is the order statistic used (tau is the k-th smallest of ``n`` dev scores); ``expected_rate`` the
    expected rate on new questions, (n - k + 1) / (n + 1), and ``rate_interval`` its central interval at
    ``confidence``."""

    tau: float
    k: int
    n: int
    budget: float
    confidence: float
    expected_rate: float
    rate_interval: tuple[float, float]
    bound: str = "order statistic (exact binomial)"


def conservative_threshold(
    scores: Sequence[float], budget: float, confidence: float, *, batch: int | None = None
) -> BudgetBound:
    """tau = s_(k), the k-th smallest dev score, with the smallest k such that the rate on new questions,
    p(tau) = P(S > tau), is at most ``budget`` with probability ``confidence`` over the draw of the dev set.

    Why this bound: for n exchangeable scores, F(s_(k)) is distributed as the k-th order statistic of n uniforms
    (stochastically larger when scores tie), so P(p(s_(k)) <= rho) = P(U_(k) >= 1 - rho)
    = P(Binomial(n, 1 - rho) <= k - 1). It is exact and distribution-free, and tighter than DKW's uniform band
    (which pays for all thresholds at once, sqrt(log(1/delta) / 2n): about 0.09 of rate at n = 200, delta =
    0.05), since only one threshold is used. Raises ValueError when n is too small for the confidence: even the
    largest score may then be exceeded too often (n must be at least log(1 - confidence) / log(1 - rho)).

    With ``batch`` = m the guarantee is on the realised rate of a batch of m new questions instead (what a
    service sees over m requests, or a test set of m): the number of them above s_(k) is Beta-Binomial(m,
    n - k + 1, k) for exchangeable scores (fewer when scores tie), and k is the smallest with P(X <= rho m) >=
    confidence. This also covers the batch's own sampling noise, so it picks a higher k."""
    from scipy.stats import beta, betabinom, binom

    if not 0.0 < budget < 1.0:
        raise ValueError(f"budget must be a share of questions strictly between 0 and 1, got {budget}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence}")
    values = np.sort(np.asarray(scores, dtype=np.float64))
    n = values.size
    if n == 0 or not np.all(np.isfinite(values)):
        raise ValueError("need finite dev scores to calibrate on: score at least one question first")
    if batch is not None and batch < 1:
        raise ValueError(f"batch must be a number of new questions >= 1, got {batch}")
    ks = np.arange(1, n + 1)
    if batch is None:
        ok = binom.cdf(ks - 1, n, 1.0 - budget) >= confidence
    else:
        ok = betabinom.cdf(np.floor(budget * batch + 1e-9), batch, n - ks + 1, ks) >= confidence
    if not ok.any():
        if batch is None:
            need = f"score at least {int(np.ceil(np.log(1.0 - confidence) / np.log(1.0 - budget)))}"
        else:
            need = "score more dev questions"
        raise ValueError(
            f"{n} dev questions cannot bound a retrieval rate of {budget:g} at confidence {confidence:g}"
            + (f" over batches of {batch}" if batch else "")
            + f": {need}, or lower the confidence"
        )
    k = int(ks[ok][0])
    # the rate on new questions, 1 - F(s_(k)), is Beta(n - k + 1, k) for continuous scores
    low, high = beta.ppf([(1 - confidence) / 2, (1 + confidence) / 2], n - k + 1, k)
    return BudgetBound(
        tau=float(values[k - 1]),
        k=k,
        n=n,
        budget=budget,
        confidence=confidence,
        expected_rate=(n - k + 1) / (n + 1),
        rate_interval=(float(low), float(high)),
        bound="order statistic (exact binomial)"
        if batch is None
        else f"order statistic (exact beta-binomial, batches of {batch})",
    )


def threshold_from_scores(
    scores: Sequence[float], budget: float, *, confidence: float | None = None, batch: int | None = None
) -> dict[str, Any]:
    """tau for a retrieval ``budget`` from gate scores (no answers needed): the plain quantile, or with
    ``confidence`` the :func:`conservative_threshold`. Returns tau, how it was chosen and the rate it gives on
    these scores (the fields of :class:`ragate.answers.answer.Calibration`). A bound the scores cannot give is a
    :class:`RagateError` naming the fix."""
    if batch is not None and confidence is None:
        raise RagateError(
            "batch needs confidence (e.g. 0.95): it bounds the rate of every batch of new questions"
        )
    try:
        if confidence is None:
            tau = threshold_for_budget(scores, budget)
            found: dict[str, Any] = {"bound": "plain quantile F^-1(1 - budget) (TARG 3.3)"}
        else:
            bound = conservative_threshold(scores, budget, confidence, batch=batch)
            tau = bound.tau
            found = {
                "bound": bound.bound, "confidence": confidence, "batch": batch, "k": bound.k,
                "expected_rate": bound.expected_rate, "rate_interval": bound.rate_interval,
            }  # fmt: skip
    except ValueError as err:
        raise RagateError(str(err)) from None
    rate = retrieval_rate(scores, tau)
    warnings = [rate_warning(scores, budget, rate) if confidence is None else None, mode_warning(scores, tau)]
    warning = "; and ".join(w for w in warnings if w) or None
    return found | {
        "tau": tau,
        "budget": budget,
        "n": len(scores),
        "retrieval_rate": rate,
        **({"warning": warning} if warning else {}),
    }


RATE_TOLERANCE = 0.05  # a plain quantile's rate farther than this from the budget is worth a warning


def rate_warning(scores: Sequence[float], budget: float, rate: float) -> str | None:
    """Why tau gives a rate far from ``budget`` on the very questions it was set on (tied scores, too few
    questions), or None when it is within :data:`RATE_TOLERANCE`."""
    if abs(rate - budget) <= RATE_TOLERANCE:
        return None
    distinct = len(set(scores))
    why = (
        f"only {distinct} distinct score{'s' if distinct != 1 else ''} among {len(scores)} questions (ties move "
        "together)"
        if distinct < len(scores)
        else f"{len(scores)} question{'s' if len(scores) != 1 else ''} cannot give a share of {budget:g}"
    )
    return (
        f"on its own {len(scores)} questions this tau retrieves for {100 * rate:.1f}%, not the budget's "
        f"{100 * budget:g}%: {why}; calibrate on more, and more varied, questions"
    )


MODE_SEPARATION = 3.0  # Ashman's D above which two groups may be two modes (a normal split in two gives ~2.7)
MODE_GAP = 15.0  # and the empty stretch between them is this many times the median gap between distinct scores
# (500 uniform draws each of 40, 100 and 1000 scores: 2, 0 and 1 pass both; 500 normal draws of 300: none)
MODE_SHARE = 0.1  # the smaller group holds at least this share of the questions (and 3 of them)


@dataclass(frozen=True)
class Modes:
    """Two groups of gate scores split where they separate best (Otsu's between-group variance): each group's
    size, mean and range, and Ashman's D = sqrt(2) |mean1 - mean2| / sqrt(var1 + var2)."""

    low: tuple[int, float, float, float]  # size, mean, min, max
    high: tuple[int, float, float, float]
    separation: float


def two_modes(scores: Sequence[float]) -> Modes | None:
    """The scores' two groups when they form two modes, else None: Ashman's D above :data:`MODE_SEPARATION`, an
    empty stretch between the groups of :data:`MODE_GAP` median gaps between distinct scores, the smaller group :data:`MODE_SHARE` of the
    questions (a heuristic for a warning, not a test)."""
    values = np.sort(np.asarray(scores, dtype=np.float64))
    values = values[np.isfinite(values)]
    n = len(values)
    least = max(3, int(np.ceil(MODE_SHARE * n)))
    if n < 2 * least or values[0] == values[-1]:
        return None
    sizes = np.arange(least, n - least + 1)  # the low group is values[:i]
    sums = np.cumsum(values)
    low_mean = sums[sizes - 1] / sizes
    high_mean = (sums[-1] - sums[sizes - 1]) / (n - sizes)
    cut = int(sizes[np.argmax(sizes * (n - sizes) * (high_mean - low_mean) ** 2)])
    a, b = values[:cut], values[cut:]
    spread = float(np.sqrt(a.var() + b.var()))
    separation = float(np.sqrt(2) * abs(b.mean() - a.mean()) / spread) if spread > 0 else float("inf")
    steps = np.diff(values)
    spacing = float(np.median(steps[steps > 0]))
    if separation <= MODE_SEPARATION or b[0] - a[-1] < MODE_GAP * spacing:
        return None
    return Modes(_group(a), _group(b), separation)


def _group(values: np.ndarray) -> tuple[int, float, float, float]:
    return len(values), float(values.mean()), float(values[0]), float(values[-1])


def _show(group: tuple[int, float, float, float]) -> str:
    return f"{group[0]} around {group[1]:.3g} ({group[2]:.3g} to {group[3]:.3g})"


def mode_warning(scores: Sequence[float], tau: float) -> str | None:
    """A warning when the scores form two modes and tau cuts inside one of them: questions of one kind (e.g. the
    document questions of a mix) then retrieve or not by small differences in score, and a budget that matches the
    upper mode's share routes by kind. None otherwise."""
    modes = two_modes(scores)
    if modes is None:
        return None
    for name, (size, mean, lo, hi) in (("lower", modes.low), ("upper", modes.high)):
        if lo <= tau < hi:
            n = modes.low[0] + modes.high[0]
            return (
                f"the {n} scores form two groups, {_show(modes.low)} and {_show(modes.high)} (separation "
                f"{modes.separation:.1f}), and tau = {tau:.4g} cuts inside the {name} one ({size} questions): "
                f"questions of one kind retrieve or not by small differences; if the groups are two kinds of "
                f"question, a budget of {modes.high[0] / n:.2f} (the upper group's share) routes by kind"
            )
    return None


def check_budget_value(budget: Any, what: str = "--budget") -> None:
    """A budget is a finite number in [0, 1]; refused before any model loads."""
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 <= budget <= 1:
        raise RagateError(f"{what} is a retrieval rate in [0, 1] (e.g. 0.3), not {budget!r}")


def read_calibration(path: str | Path) -> dict[str, Any]:
    """A ``ragate calibrate`` file (method, tau, model, engine, how tau was chosen), checked: ``tau`` a finite
    number (not NaN, infinity, a string or ``true``), the shares and counts it records of their types, no lone
    surrogate in its text. Anything else is a :class:`RagateError` naming the file and the fix."""
    path = Path(path)
    fix = "rerun ragate calibrate"
    try:
        text = utf8_text(path, RagateError, fix)
    except OSError as err:
        raise RagateError(f"{path} cannot be read ({err.strerror}); {fix}") from None
    data = parse_json(text, f"{path} is not a `ragate calibrate` file", RagateError, fix)
    fault = _calibration_fault(data)
    if fault is not None:
        raise RagateError(f"{path} is not a usable `ragate calibrate` file: {fault}; {fix}")
    return data  # type: ignore[no-any-return]


def _share(value: Any) -> bool:
    return value is None or (is_number(value) and 0 <= value <= 1)


def _interval(value: Any) -> bool:
    return value is None or (isinstance(value, list) and len(value) == 2 and all(_share(v) for v in value))


def _calibration_fault(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"a JSON object, not {type(data).__name__}"
    if (fault := lone_surrogate(data)) is not None:
        return f"{fault}, which is not text"
    if not isinstance(data.get("method"), str) or not data["method"]:
        return f"'method' must be a method name, not {short(data.get('method'))}"
    if data["method"] == "route":
        return _route_fault(data)
    if not is_number(data.get("tau")):
        return f"'tau' must be a finite number, not {short(data.get('tau'))}"
    fields = {
        **dict.fromkeys(("budget", "confidence", "dev_retrieval_rate", "dev_em", "expected_rate"), _share),
        **dict.fromkeys(("n", "k", "batch"), lambda v: v is None or is_count(v)),
        **dict.fromkeys(("model", "engine", "gate", "objective", "dev", "bound", "source"), _text_or_none),
        "rate_interval": _interval,
    }
    for key, ok in fields.items():
        if key in data and not ok(data[key]):
            return f"{key!r} cannot be {short(data[key])}"
    return None


def _route_fault(data: dict[str, Any]) -> str | None:
    """What is wrong with a route method's calibration (``ragate calibrate --gate route``): two routes or more by
    name, the fields every policy records of their types, then the policy's own: the cascade's stop thresholds (a
    finite number, or null: never stops on NLL, one per route but the last), or the fitted model's numbers, checked
    as the live policy reads them (:mod:`ragate.methods.route_policy`)."""
    routes = data.get("routes")
    if not isinstance(routes, list) or len(routes) < 2 or not all(isinstance(r, str) and r for r in routes):
        return f"'routes' must name two routes or more, not {short(routes)}"
    policy = data.get("policy", "cascade")
    from ragate.methods.spec import POLICY_NAMES, ROUTE_POLICIES

    if policy not in ROUTE_POLICIES:
        return f"'policy' must be {POLICY_NAMES}, not {short(policy)}"
    for key in ("agree", "evidence"):
        if key in data and not isinstance(data[key], bool):
            return f"{key!r} must be true or false, not {short(data[key])}"
    for key in ("budget", "dev_retrievals"):
        if key in data and not (is_number(data[key]) and data[key] >= 0):
            return f"{key!r} must be mean retrievals per question (a number, 0 or more), not {short(data[key])}"
    for key in ("model", "engine", "metric", "dev", "source", "objective"):
        if key in data and not _text_or_none(data[key]):
            return f"{key!r} cannot be {short(data[key])}"
    if policy != "cascade":
        from ragate.methods.route_policy import RoutePolicyModel

        try:
            RoutePolicyModel.from_json(policy, data, len(routes), f"the {policy} policy")
        except RagateError as err:
            return str(err)
        return None
    stops = data.get("stops")
    if not isinstance(stops, list) or len(stops) != len(routes) - 1:
        return f"'stops' must hold {len(routes) - 1} thresholds (one per route but the last), not {short(stops)}"
    if not all(s is None or is_number(s) for s in stops):
        return f"'stops' holds {short(stops)}: each a finite number, or null for a stage that never stops on NLL"
    return None


def _text_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def check_calibration(
    cal: dict[str, Any], path: str | Path, method: str | None, model: str | None, engine: str
) -> None:
    """A calibration belongs to one method and one model: refuse another's (``method`` None: any method)."""
    if method is not None and cal["method"] != method:
        raise RagateError(
            f"{path} calibrates {cal['method']!r}, not {method!r}: pass the calibration of this method "
            f"(ragate calibrate --gate {method} ...)"
        )
    for key, now in (("model", model), ("engine", engine)):
        if key not in cal:
            continue
        if key == "model":  # a local model by its registry name, however either side called it
            same = model_name(cal[key], cal.get("engine", engine)) == model_name(now, engine)
        else:
            same = cal[key] == now
        if not same:
            said = repr(now) if now else f"the default {key}"
            flag = "--model" if key == "model" else "--backend"
            raise RagateError(
                f"{path} was calibrated with {key} {cal[key]!r}, this run uses {said}: a gate's scores, and "
                f"so its threshold, belong to one model; rerun ragate calibrate with this run's {flag}"
            )


def model_name(model: Any, engine: Any) -> Any:
    """A local model's registry name, whatever it was called (None: the default model; an alias: its name); a
    server's model and a path as given."""
    if engine == "openai" or not (model is None or isinstance(model, str)):
        return model
    from ragate.errors import ModelNotFoundError
    from ragate.models import DEFAULT_MODEL, model_spec

    try:
        return model_spec(model or DEFAULT_MODEL).name
    except ModelNotFoundError:
        return model


def retrieval_rate(scores: Sequence[float], tau: float) -> float:
    """The share of ``scores`` above ``tau``: the rate a gate with that threshold retrieves at."""
    values = np.asarray(scores, dtype=np.float64)
    return float(np.mean(values > tau)) if values.size else 0.0


def check_calibratable(spec: Any) -> None:
    """A :class:`RagateError` for a method whose gate has no threshold to set from its scores."""
    from ragate.gates.registry import get_gate

    if spec.dynamic is not None or spec.crag is not None:
        raise RagateError(
            f"method {spec.name!r} has no single-shot gate to calibrate: "
            + ("it decides while generating" if spec.dynamic is not None else "it grades what it retrieved")
        )
    gate = get_gate(spec.gate.kind)
    if not gate.thresholded:
        raise RagateError(
            f"method {spec.name!r} has no gate threshold to calibrate (its gate is {spec.gate.kind!r})"
        )
    if gate.calibration_note:
        raise RagateError(gate.calibration_note)
