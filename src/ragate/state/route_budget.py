"""A live route budget: holds the learned route policy's mean retrievals per question at B as traffic drifts
(``ragate serve --method route --calibration FILE --budget B``, ``Pipeline(method="route", calibration=FILE,
budget=B)``; the policy is :mod:`ragate.methods.route_policy`'s ``learned``).

The learned policy answers with the first route, then takes the route of the largest P(right) - lambda * cost
(after MBA-RAG's reward of right minus lambda times steps, COLING 2025). ``ragate calibrate --gate route --policy
learned --budget B`` sets lambda once, on the questions it was fitted on; live questions differ from them, and what
the policy spends drifts from B. The controller keeps, for each of the last W answered requests, every route's
P(right) (read once the first route has answered, so it does not depend on lambda: the window is a sample of
current traffic, as the gate's scores are for :mod:`ragate.state.budget`) and the retrievals the request made,
and sets, before each choice,

    lambda = the smallest lambda >= 0 at which the window's mean expected cost,
             (1/W) sum over requests of cost[argmax_r P_r - lambda * cost_r], is at most the level,
    level  = clip(B + gain * (B - m_W), 0, the dearest route's cost),  m_W = mean retrievals the last W made.

The expected cost is each route's mean retrievals from the fit (the file's ``costs``). A multi-step route's
retrievals vary with the question, so the feedback term corrects the level by the error in what was spent, as the
gate controller's corrects its quantile level by the rate error. Its default gain is 2, not the gate's 16: one
request's retrievals range over 0 to 3 or more where a gate's decision is 0 or 1, so the windowed mean is noisier
and a high gain swings the level from one end to the other, spending on the wrong questions (replayed on the
HotpotQA and NQ route runs by ``benchmarks/route_budget.py --summary``: docs/methods.md, "A live route budget").
Before the window holds MIN_WINDOW requests, lambda is the file's. The state (the window and lambda, with the
digest of the fit its probabilities came from) is written atomically after every answer and read back on start
(a state of a refitted file is left: its window starts anew, as it does when a policy fitted on the server's own
labelled traffic goes in force, :meth:`RouteBudgetController.refit`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.eval.records import is_number
from ragate.fileio import atomic_writer
from ragate.methods import MethodSpec
from ragate.methods.route_policy import RoutePolicyModel
from ragate.methods.trace import Trace
from ragate.state.budget import (
    DEFAULT_GAIN,
    HISTORY,
    MIN_WINDOW,
    BudgetController,
    check_budget_places,
    check_state_path,
    control_level,
    open_budget,
)

log = logging.getLogger(__name__)
ROUTE_GAIN = 2.0  # the default gain: see the module docstring
# what a route budget's numbers are, beside the gate budget's fields (GET /v1/budget, an answer's budget)
ROUTE_UNITS = {"unit": "mean retrievals per question", "threshold_name": "lambda"}


def route_model(spec: MethodSpec) -> RoutePolicyModel:
    """The learned route policy a live budget moves, refused naming the fix for any other method or policy."""
    route = spec.route
    if route is None:
        raise ValueError(f"method {spec.name!r} is not a route method")
    if route.policy == "learned" and route.model is not None:
        return route.model
    if route.policy == "adaptive-rag":
        why = "adaptive-rag runs the one route its classifier gives each question: it has no price to move"
    else:
        why = (f"the {route.policy} policy's stop thresholds are set for a budget by ragate calibrate --gate route "
               f"--policy {route.policy} --budget B (--calibration FILE serves them)")  # fmt: skip
    raise RagateError(
        f"a live route budget moves the learned policy's price of a retrieval (lambda), and {why}; to hold a budget "
        "live, serve a learned policy: ragate calibrate --gate route --policy learned --from-sweep RUN (or "
        "--from-store STORE) --budget B, then --calibration FILE --budget B"
    )


def check_route_budget(budget: Any, window: int, spec: MethodSpec, gain: float = ROUTE_GAIN) -> None:
    """Refuse, before the model loads, settings a live route budget cannot honour: another policy than learned,
    a budget outside what its routes can spend (0 up to the dearest route's mean retrievals), a short window."""
    model = route_model(spec)
    _check_first_route(spec)
    high = max(model.costs)
    if not (is_number(budget) and 0 < budget <= high):
        raise RagateError(
            f"a route budget is mean retrievals per question, above 0 and at most {high:.2f} (what the dearest "
            f"route spends on the questions it was fitted on), not {budget!r}"
        )
    if not (math.isfinite(gain) and gain >= 0):
        raise RagateError(f"--budget-gain must be a number >= 0 (0: no feedback), got {gain:g}")
    if window < MIN_WINDOW:
        raise RagateError(f"--window {window} is too short to estimate a mean: use at least {MIN_WINDOW} (default 200)")


def _check_first_route(spec: MethodSpec) -> None:
    """A live route budget prices the routes after the first (the policy's costs: the first has run when it
    chooses), so it holds B only where the first route makes no retrieval; refused otherwise, naming the fix."""
    from ragate.methods.registry import get_method

    assert spec.route is not None
    first = spec.route.routes[0]
    if get_method(first).retrieves:
        raise RagateError(
            f"a live route budget holds the retrievals of the routes after the first, and the first route {first!r} "
            "may retrieve too, which the policy's price does not count: put a closed-book route first (wo-rag, "
            "no-retrieval) and refit, or serve the file without --budget (its lambda was set for its budget on the "
            "questions it was fitted on)"
        )


def price_for(rows: np.ndarray, costs: np.ndarray, level: float) -> float:
    """The smallest lambda >= 0 (to a relative 1e-9) at which the mean over ``rows`` (each request's P(right) per
    route) of the cost of the route maximising P - lambda * cost is at most ``level``. That mean only falls as lambda
    grows (the chosen route's cost never rises with its price), and changes only where two routes tie on a row,
    (P_i - P_j) / (c_i - c_j): each such candidate is taken a hair above itself, where the tie goes to the cheaper
    route whatever the routes' order, and the first candidate within the level is found by bisection (a large
    enough lambda takes a cost-0 route everywhere)."""
    dp = rows[:, :, None] - rows[:, None, :]
    dc = costs[None, :, None] - costs[None, None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        ties = np.where(np.broadcast_to(dc, dp.shape) != 0, dp / dc, np.nan)
    candidates = np.unique(np.concatenate([[0.0], ties[np.isfinite(ties) & (ties > 0)]])) * (1 + 1e-9) + 1e-12

    def spent(lam: float) -> float:
        return float(costs[(rows - lam * costs).argmax(axis=1)].mean())

    low, high = 0, len(candidates) - 1  # the answer's index lies in [low, high]
    while low < high:
        mid = (low + high) // 2
        if spent(float(candidates[mid])) <= level + 1e-12:
            high = mid
        else:
            low = mid + 1
    return float(candidates[low])


def fit_digest(model: RoutePolicyModel) -> str:
    """The digest of the fit whose probabilities a window holds (a refitted file starts a new window)."""
    fit = {k: v for k, v in model.to_json().items() if k != "lambda"}
    return hashlib.sha256(json.dumps(fit, sort_keys=True).encode()).hexdigest()[:16]


def read_route_state(path: Path, routes: int) -> dict[str, Any]:
    """A saved route budget state, every field checked; else a :class:`RagateError` naming the fix."""
    fix = "delete it to start afresh (or pass another --budget-state file)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise RagateError(f"{path} is not a readable budget state ({type(err).__name__}: {err}); {fix}") from None
    if not isinstance(data, dict):
        raise RagateError(f"{path} is not a budget state (a JSON object); {fix}")
    rows, spent, lam = data.get("rows"), data.get("spent"), data.get("lambda")
    if not (isinstance(rows, list) and all(isinstance(r, list) and len(r) == routes
                                           and all(is_number(p) and 0 <= p <= 1 for p in r) for r in rows)):  # fmt: skip
        raise RagateError(f"{path}: 'rows' must be lists of {routes} probabilities (one per route); {fix}")
    if not (isinstance(spent, list) and len(spent) == len(rows) and all(is_number(s) and s >= 0 for s in spent)):
        raise RagateError(f"{path}: 'spent' must hold one count of retrievals (0 or more) per row; {fix}")
    if not (isinstance(lam, int | float) and is_number(lam) and lam >= 0):
        raise RagateError(f"{path}: 'lambda' must be a finite number, 0 or more, got {lam!r}; {fix}")
    return data


class RouteBudgetController:
    """Thread-safe: lambda for the next request (:attr:`tau`) from the window of the last W answered requests,
    the state written atomically after each (:meth:`observe_trace`)."""

    shared = None  # a route budget keeps its own window (no Valkey/Redis store): what the service asks of a budget
    shared_error = None

    def __init__(
        self, budget: float, window: int, spec: MethodSpec, state: Path | None, *, model: str = "",
        gain: float = ROUTE_GAIN,
    ) -> None:  # fmt: skip
        check_route_budget(budget, window, spec, gain)
        self.budget, self.window, self.method, self.path, self.model, self.gain = (
            budget, window, spec.name, state, model, gain,
        )  # fmt: skip
        self._take(route_model(spec))
        self._rows: deque[tuple[float, ...]] = deque(maxlen=window)
        self._spent: deque[float] = deque(maxlen=window)
        self._lock = threading.Lock()
        self._history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._observed = 0
        self.write_error: str | None = None
        if state is not None:
            check_state_path(state, read=lambda path: read_route_state(path, len(self.costs)))
            if state.exists():
                self._load(state)

    def _take(self, policy: RoutePolicyModel) -> None:
        """Hold ``policy``: its costs, its fit's digest and its lambda as the level to start from."""
        self.policy, self.costs, self.digest = policy, np.asarray(policy.costs, dtype=float), fit_digest(policy)
        self._lam = policy.lam

    def _load(self, path: Path) -> None:
        data = read_route_state(path, len(self.costs))
        for key, mine in (("method", self.method), ("model", self.model)):
            if data.get(key) != mine:
                raise RagateError(
                    f"{path} holds the route budget state of {key} {data.get(key)!r}, not {mine!r}: its "
                    "probabilities are not this server's policy's; pass another --budget-state file (or delete it)"
                )
        if data.get("fit") != self.digest:  # a refitted file: its probabilities differ, so the window starts anew
            log.warning("%s was kept for another fit of the route policy: lambda starts from the file's", path)
            return
        self._rows.extend(tuple(map(float, r)) for r in data["rows"][-self.window :])
        self._spent.extend(float(s) for s in data["spent"][-self.window :])
        self._lam = float(data["lambda"])

    def _save(self) -> None:
        assert self.path is not None
        state = {"kind": "route", "method": self.method, "model": self.model, "fit": self.digest,
                 "budget": self.budget, "window": self.window, "lambda": self._lam,
                 "rows": [list(r) for r in self._rows], "spent": list(self._spent)}  # fmt: skip
        try:
            with atomic_writer(self.path) as f:
                f.write(json.dumps(state, allow_nan=False).encode())
        except OSError as err:
            if self.write_error is None:
                log.warning("cannot write the budget state %s (%s); lambda is kept in memory only", self.path, err)
            self.write_error = err.strerror or type(err).__name__
        else:
            self.write_error = None

    @property
    def tau(self) -> float:
        """The learned policy's price of one retrieval for the next request (the route method's threshold)."""
        with self._lock:
            return self._lam

    last_tau = tau

    def _mean(self) -> float | None:
        """The mean retrievals per request over the window (None while it is empty); the lock held."""
        return sum(self._spent) / len(self._spent) if self._spent else None

    def rate(self) -> float | None:
        """The mean retrievals per request over the last W answered (None before the first)."""
        with self._lock:
            return self._mean()

    def level(self) -> float:
        """The expected cost lambda is set for: the budget corrected by ``gain`` times the error in what was spent."""
        spent = self._mean()
        return control_level(self.budget, self.budget if spent is None else spent, self.gain, (0.0, float(self.costs.max())))

    def observe_trace(self, trace: Trace, spec: MethodSpec | None = None) -> float:
        """Record one answered request from its trace: each route's P(right) (its "learned" checks) and the
        retrievals it made; returns the new lambda. ``spec``: the method that answered it; probabilities of
        another fit than the controller's (a request in flight while a new policy went in force, :meth:`refit`)
        are left out of the window."""
        right = [c.score for c in trace.route.checks if c.kind == "learned"] if trace.route is not None else []
        model = spec.route.model if spec is not None and spec.route is not None else None
        if model is not None and fit_digest(model) != self.digest:
            right = []
        return self.record(right, trace.retrievals)

    def record(self, right: list[float | None], retrievals: float) -> float:
        """Record one answered request: each route's P(right) as the policy read it, and the retrievals it made
        (a request without the policy's probabilities, one answered before the first route could, is counted in
        the history but not the window); returns the new lambda."""
        with self._lock:
            if len(right) == len(self.costs) and all(p is not None and math.isfinite(p) for p in right):
                self._rows.append(tuple(float(p) for p in right))  # type: ignore[arg-type]
                self._spent.append(float(retrievals))
                if len(self._rows) >= MIN_WINDOW:
                    self._lam = price_for(np.array(self._rows), self.costs, self.level())
            self._observed += 1
            self._history.append({"n": self._observed, "time": time.time(), "score": None, "tau": self._lam,
                                  "retrievals": retrievals, "retrieved": retrievals > 0, "rate": self._mean()})  # fmt: skip
            if self.path is not None:
                self._save()
            return self._lam

    def refit(self, spec: MethodSpec) -> None:
        """The route policy of ``spec`` went in force (``Pipeline.learn_routes(use=True)``): the window held the old
        fit's probabilities, so it starts anew from the new fit's lambda (the history of what was spent is kept)."""
        policy = route_model(spec)
        with self._lock:
            self._take(policy)
            self._rows.clear()
            self._spent.clear()
            if self.path is not None:
                self._save()

    def observe(self, score: float | None, retrieved: bool) -> float:
        """A route method has no decision before its answer to count (``Pipeline.decide`` refuses it first)."""
        raise RagateError(f"{self.method!r} decides while it answers: its budget counts answers (answer())")

    def snapshot(self) -> dict[str, Any]:
        """What the controller holds now, in the gate controller's fields (``window_rate``: mean retrievals per
        request; ``tau``: lambda), with ``unit`` saying so, for ``GET /v1/budget`` and the page."""
        with self._lock:
            return {
                "budget": self.budget, "window": self.window, "gain": self.gain, "tau": self._lam,
                **ROUTE_UNITS, "rate_high": float(self.costs.max()),
                "window_rate": self._mean(), "window_requests": len(self._spent),
                "window_retrieved": sum(1 for s in self._spent if s > 0), "observed": self._observed,
                "history": list(self._history),
                **({"state_write_error": self.write_error} if self.write_error else {}),
            }  # fmt: skip

    def watch(self) -> None:
        """Nothing to watch: no shared store."""

    def close(self) -> None:
        """Nothing held open: the state is written after every answer."""


def check_live_budget(
    budget: float | None, window: int, gain: float | None, budget_state: str | Path | None, state: str | None,
    spec: MethodSpec,
) -> None:  # fmt: skip
    """Before a model loads (``Pipeline(budget=...)``): a route method's budget checked here, a gate's places
    (:func:`ragate.state.budget.check_budget_places`); a shared store is for a gate's window only."""
    if spec.route is None or budget is None:
        check_budget_places(budget, budget_state, state)
        return
    check_route_budget(budget, window, spec, ROUTE_GAIN if gain is None else gain)
    if state is not None:
        raise RagateError(
            "state= shares a gate budget's window among replicas; a route budget keeps its own window: drop state= "
            "(or serve a gate method)"
        )
    if budget_state is not None:
        model = route_model(spec)
        check_state_path(Path(budget_state), read=lambda path: read_route_state(path, len(model.costs)))


def open_live_budget(
    budget: float, window: int, spec: MethodSpec, budget_state: str | Path | None, model: str,
    gain: float | None, state: str | None,
) -> BudgetController | RouteBudgetController:  # fmt: skip
    """A pipeline's live budget: a route method's lambda (:class:`RouteBudgetController`), else its gate's
    threshold (:func:`ragate.state.budget.open_budget`); ``gain`` None: each one's default."""
    if spec.route is None:
        return open_budget(budget, window, spec, budget_state, model, DEFAULT_GAIN if gain is None else gain, state)
    path = Path(budget_state) if budget_state is not None else None
    return RouteBudgetController(budget, window, spec, path, model=model, gain=ROUTE_GAIN if gain is None else gain)
