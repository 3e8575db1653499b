"""A live retrieval budget: keeps the share of questions that retrieve at RHO as traffic drifts (``ragate serve
--budget RHO --window W``, ``Pipeline(budget=RHO)``).

The controller keeps the gate scores and decisions of the last W answered requests and sets, before each request,
tau = F^-1(1 - level) over the scores (the same inverted-CDF quantile as ``ragate calibrate``), at the level

    level = clip(RHO + gain * (RHO - r_W), 0.001, 0.999),   r_W = the share of the last W requests that retrieved.

With ``gain = 0`` this is the plain windowed quantile: a share RHO of the recent scores lies above tau. A gate's
score does not depend on tau, so the window is an unbiased sample of current traffic; but after the mix shifts,
the decisions of the last W requests were made with a tau that lagged behind, and the windowed rate strays far
from RHO (on NQ scores shifted twice by half to 0.7 standard deviations, W = 100: largest deviation 0.17, 45% of
windows outside RHO +- 0.05). The feedback term corrects the *quantile level* by the rate error, in rate units,
so one gain suits every gate whatever its score scale (which is why the feedback acts on the level rather than on
tau itself: a gain on tau would need tuning per gate and oscillates on heavy-tailed scores such as DTR's NLL).
The default gain 16 kept every window within RHO +- 0.05 there (largest deviation 0.04) at a cost of 0.7 points
of accuracy against gain 0, the decisions still ranking questions by score (``benchmarks/budget.py drift``).
Before the window holds W scores, tau is the quantile of those it has (and, with none, the method's own
threshold). The state (scores, recent decisions, tau) is written atomically after every answer and read back on
start, so a restart keeps tau.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragate.errors import RagateError
from ragate.eval.records import is_number
from ragate.eval.thresholds import threshold_for_budget
from ragate.fileio import atomic_writer
from ragate.gates.registry import gate_names, get_gate
from ragate.methods import MethodSpec
from ragate.methods.trace import Trace
from ragate.state.shared import Link, SharedWindow, StoreUnavailable

log = logging.getLogger(__name__)

MIN_WINDOW = 10
DEFAULT_GAIN = 16.0
HISTORY = 500  # the points of tau and the windowed rate kept for GET /v1/budget (in memory, since start)
LEVEL_BOUNDS = (0.001, 0.999)
_DOWN = object()  # what BudgetController._with_store returns when the shared store was not used
WATCH_SECONDS = 1.0  # how often a service checks the shared store with no request (BudgetController.watch)


def read_state(path: Path) -> dict[str, Any]:
    """A saved budget state, its fields checked: scores finite numbers, decisions true/false, tau a finite
    number (JSON allows NaN here and Python reads "123" as a list of characters; neither is a state)."""
    fix = "delete it to start afresh (or pass another --budget-state file)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # bad JSON or UTF-8, 4,300+ digits, deep nesting
        raise RagateError(
            f"{path} is not a readable budget state ({type(err).__name__}: {err}); {fix}"
        ) from None
    if not isinstance(data, dict):
        raise RagateError(f"{path} is not a budget state (a JSON object); {fix}")
    scores, decisions, tau = data.get("scores"), data.get("decisions"), data.get("tau")
    if not (isinstance(scores, list) and all(is_number(s) for s in scores)):
        raise RagateError(f"{path}: 'scores' must be a list of finite numbers; {fix}")
    if not (isinstance(decisions, list) and all(isinstance(d, bool) for d in decisions)):
        raise RagateError(f"{path}: 'decisions' must be a list of true/false; {fix}")
    if not is_number(tau):
        raise RagateError(f"{path}: 'tau' must be a finite number, got {tau!r}; {fix}")
    return data


def check_state_path(path: Path, read: Callable[[Path], Any] = read_state) -> None:
    """Refuse at start a state file that could not be read back (with ``read``) or written after the first
    answer."""
    fix = "pass a --budget-state path in a folder this server can write"
    if path.is_dir():
        raise RagateError(f"--budget-state {path} is a directory; {fix}")
    if path.exists():
        read(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RagateError(
            f"--budget-state {path}: cannot create its folder ({type(err).__name__}: {err}); {fix}"
        ) from None
    try:  # the state is replaced by a file made beside it: make one the same way
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".probe")
    except OSError as err:
        raise RagateError(
            f"--budget-state {path}: its folder is not writable ({type(err).__name__}: {err}); {fix}"
        ) from None
    os.close(fd)
    os.unlink(probe)


def controlled_gates() -> list[str]:
    """The gates whose threshold the controller can move: a score that ranks questions (``Gate.budget_control``)."""
    return [g for g in gate_names() if get_gate(g).budget_control]


def control_level(budget: float, rate: float, gain: float, bounds: tuple[float, float] = LEVEL_BOUNDS) -> float:
    """The level for the next request: the budget corrected by ``gain`` times the windowed error in what was spent,
    clipped to ``bounds`` (a gate's quantile level by default; a route budget's, 0 to the dearest route's cost)."""
    low, high = bounds
    return min(high, max(low, budget + gain * (budget - rate)))


def check_budget(budget: float, window: int, spec: MethodSpec, gain: float = DEFAULT_GAIN) -> None:
    """Refuse settings the controller cannot honour, naming the fix."""
    if not (math.isfinite(gain) and gain >= 0):
        raise RagateError(
            f"--budget-gain must be a number >= 0 (0: the plain windowed quantile), got {gain:g}"
        )
    if not 0.0 < budget < 1.0:
        raise RagateError(f"--budget is a share of requests strictly between 0 and 1, got {budget:g}")
    if window < MIN_WINDOW:
        raise RagateError(
            f"--window {window} is too short to estimate a rate: use at least {MIN_WINDOW} (default 200)"
        )
    if spec.route is not None:
        raise RagateError(
            "a route method's budget is mean retrievals per question, held by its own controller "
            "(ragate.state.route_budget.open_live_budget, which Pipeline(budget=) opens)"
        )
    if not get_gate(spec.gate.kind).budget_control:
        stand_in = (
            " (a fallback gate stands in for the method's own, which this backend cannot serve)"
            if ":fallback=" in spec.name
            else ""
        )
        raise RagateError(
            f"method {spec.name!r} decides with its {spec.gate.kind!r} gate{stand_in}, which has no threshold "
            f"to control; serve a thresholded gate with --budget ({', '.join(controlled_gates())})"
        )


class BudgetController:
    """Thread-safe windowed-quantile controller with an atomically persisted state."""

    def __init__(
        self,
        budget: float,
        window: int,
        spec: MethodSpec,
        state: Path | None,
        *,
        model: str = "",
        gain: float = DEFAULT_GAIN,
        shared: SharedWindow | None = None,
    ) -> None:
        try:
            self._start(budget, window, spec, state, model, gain, shared)
        except BaseException:
            if shared is not None:  # the controller owns the store's connection from here
                shared.close()
            raise

    def _start(
        self, budget: float, window: int, spec: MethodSpec, state: Path | None, model: str, gain: float,
        shared: SharedWindow | None,
    ) -> None:  # fmt: skip
        check_budget(budget, window, spec, gain)
        self.budget, self.window, self.method, self.path, self.model = budget, window, spec.name, state, model
        self.gain = gain
        self._scores: deque[float] = deque(maxlen=window)
        self._decisions: deque[bool] = deque(maxlen=window)
        self._tau = spec.gate.tau
        self._lock = threading.Lock()
        self._history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._observed = 0
        self.write_error: str | None = None
        if state is not None:
            check_state_path(state)
            if state.exists():
                self._load(state)
        self.shared = shared  # the fleet's window in a Valkey/Redis store (ragate.state.shared), else None
        self._link = Link(shared.url.shown) if shared is not None else None
        self._pending: deque[tuple[float | None, bool]] = deque(maxlen=window)  # observed while the store was down
        self._watch: tuple[threading.Event, threading.Thread] | None = None
        if shared is not None:
            scores, decisions, tau = shared.read()  # at start the store answered (connect pinged it)
            if decisions:
                self._set_window(scores, decisions)
                self._tau = tau if tau is not None else self._tau
            elif self._decisions and shared.seed(list(self._scores), list(self._decisions)):
                shared.set_tau(self._tau)  # an empty store takes the window this replica kept (--budget-state)

    @property
    def shared_error(self) -> str | None:
        """Why the shared store is not in use now (None: it is, or there is none): /healthz says degraded."""
        return self._link.error if self._link is not None else None

    def _set_window(self, scores: list[float], decisions: list[bool]) -> None:
        self._scores.clear()
        self._scores.extend(scores[-self.window :])
        self._decisions.clear()
        self._decisions.extend(decisions[-self.window :])

    def _load(self, path: Path) -> None:
        data = read_state(path)
        for key, mine in (("method", self.method), ("model", self.model)):
            if data.get(key) != mine:
                raise RagateError(
                    f"{path} holds the budget state of {key} {data.get(key)!r}, not {mine!r}: its scores do not "
                    "describe this server's gate; pass another --budget-state file (or delete this one)"
                )
        self._scores.extend(float(s) for s in data["scores"][-self.window :])
        self._decisions.extend(data["decisions"][-self.window :])
        self._tau = float(data["tau"])

    def _save(self) -> None:
        """Write the state atomically; a failure is logged once per kind and the answer is kept (the state is
        checked for writability at start, so this is a disk that filled or a folder that changed since)."""
        assert self.path is not None
        try:
            with atomic_writer(self.path) as f:
                f.write(json.dumps(self._state(), allow_nan=False).encode())
        except OSError as err:
            if self.write_error is None:
                log.warning(
                    "cannot write the budget state %s (%s); tau is kept in memory only", self.path, err
                )
            self.write_error = err.strerror or type(err).__name__  # answers carry it: no server paths
        else:
            self.write_error = None

    @property
    def tau(self) -> float:
        """The threshold for the next request: with a shared store, the fleet's (read from it; while the store is
        down, this replica's own from its last view of the window and what it observed since)."""
        with self._lock:
            tau = self._with_store(lambda store: store.tau())
            if tau is not _DOWN and tau is not None:
                self._tau = tau
            return self._tau

    def _with_store(self, op: Callable[[SharedWindow], Any]) -> Any:
        """``op(store)`` on the shared store (re-joining first after an outage); :data:`_DOWN` where there is no
        store, it is down and not yet due for another try, or it fails now (then marked down)."""
        if self.shared is None or self._link is None or not self._link.due():
            return _DOWN
        try:
            if self._link.error is not None:
                self._rejoin()
            out = op(self.shared)
        except StoreUnavailable as err:
            self._link.failed(err)
            return _DOWN
        self._link.ok()
        return out

    def _rejoin(self) -> None:
        """Back from an outage: a store that came back empty (restarted without persistence) takes this replica's
        window, its last view of the fleet's and what it observed since, so tau does not restart from a handful of
        requests; else push what it observed meanwhile. Then set tau from the fleet's window."""
        assert self.shared is not None
        if self._decisions and self.shared.seed(list(self._scores), list(self._decisions)):
            self._pending.clear()
            self.shared.set_tau(self._tau)  # already this window's (observe set it while the store was down)
            return
        scores, decisions = self.shared.push(list(self._pending))
        self._pending.clear()
        if decisions:
            self._set_window(scores, decisions)
            self._tau = threshold_for_budget(list(self._scores), self._level()) if self._scores else self._tau
            self.shared.set_tau(self._tau)

    @property
    def last_tau(self) -> float:
        """The threshold as this replica last set or read it (no store round trip: for metrics and /healthz)."""
        with self._lock:
            return self._tau

    def _level(self) -> float:
        if not self._decisions:  # a shared window whose entries were all unreadable
            return self.budget
        return control_level(self.budget, sum(self._decisions) / len(self._decisions), self.gain)

    def rate(self) -> float | None:
        """The share of the last W answered requests that retrieved (None before the first)."""
        with self._lock:
            return sum(self._decisions) / len(self._decisions) if self._decisions else None

    def observe(self, score: float | None, retrieved: bool) -> float:
        """Record one answered request's gate score and decision; returns the new tau."""
        with self._lock:
            # NaN or inf says nothing about the distribution
            kept = float(score) if score is not None and math.isfinite(score) else None
            if not self._observe_shared(kept, retrieved):
                self._decisions.append(retrieved)
                if kept is not None:
                    self._scores.append(kept)
            if kept is not None and self._scores:
                self._tau = threshold_for_budget(list(self._scores), self._level())
                if self.shared_error is None:
                    self._with_store(lambda store: store.set_tau(self._tau))
            self._observed += 1
            self._history.append({
                "n": self._observed, "time": time.time(), "score": kept,
                "retrieved": retrieved, "tau": self._tau,
                "rate": sum(self._decisions) / len(self._decisions) if self._decisions else None,
            })  # fmt: skip
            if self.path is not None:  # under the lock: states are written in the order they were reached
                self._save()
            return self._tau

    def observe_trace(self, trace: Trace, spec: MethodSpec | None = None) -> float:
        """Record one answered request from its trace (``spec``: the method that answered it; a gate's score is
        the gate's whatever its file): its gate's score and decision; returns the new tau."""
        return self.observe(trace.gate.score, trace.retrieved)

    def _observe_shared(self, score: float | None, retrieved: bool) -> bool:
        """Push one observation to the shared window and take the fleet's window back; False where there is no
        store or it is down (the observation is then kept to push on re-joining)."""
        if self.shared is None:
            return False
        window = self._with_store(lambda store: store.push([(score, retrieved)]))
        if window is _DOWN:
            self._pending.append((score, retrieved))
            return False
        self._set_window(*window)
        return True

    def snapshot(self) -> dict[str, Any]:
        """What the controller holds now, for a page to draw: the target, the window, the rate over it and tau,
        and after each request observed since start (the last ``HISTORY``) its score, its decision, the tau it
        left and the windowed rate then."""
        with self._lock:
            decisions = list(self._decisions)
            return {
                "budget": self.budget, "window": self.window, "gain": self.gain, "tau": self._tau,
                "window_rate": sum(decisions) / len(decisions) if decisions else None,
                "window_requests": len(decisions), "window_retrieved": sum(decisions),
                "observed": self._observed, "history": list(self._history),
                **({"state_write_error": self.write_error} if self.write_error else {}),
                **({"shared": self.shared.url.shown} if self.shared is not None else {}),
                **({"shared_error": self.shared_error} if self.shared_error else {}),
            }  # fmt: skip

    def check_store(self) -> None:
        """One round trip to the shared store, so that an outage is seen, and ended (re-joining), without a request,
        and this replica's view of the fleet's tau (``snapshot``, ``/v1/budget``) is at most one check old: what
        :meth:`watch` runs. While the store is up the round trip holds no lock a request waits for."""
        if self.shared is None or self._link is None:
            return
        if self._link.error is None:
            try:
                tau = self.shared.tau()
            except StoreUnavailable as err:
                with self._lock:
                    self._link.failed(err)
                return
            with self._lock:
                self._tau = tau if tau is not None else self._tau
            return
        with self._lock:  # down: try to re-join when due (at most once per RETRY_SECONDS)
            self._with_store(lambda store: store.ping())

    def watch(self, every: float = WATCH_SECONDS) -> None:
        """Check the shared store every ``every`` seconds on a thread of its own until :meth:`close` (a service
        does: its /healthz then says degraded within about ``every`` seconds of an outage, no request needed)."""
        if self.shared is None or self._watch is not None:
            return
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every):
                try:
                    self.check_store()
                except Exception:  # a side channel: the watcher never dies of the store's errors
                    log.exception("checking the shared state %s failed", self.shared and self.shared.url.shown)

        self._watch = (stop, threading.Thread(target=loop, name="ragate-state-watch", daemon=True))
        self._watch[1].start()

    def close(self) -> None:
        if self._watch is not None:
            self._watch[0].set()
            self._watch[1].join(timeout=5)
        if self.shared is not None:
            self.shared.close()

    def _state(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "model": self.model,
            "budget": self.budget,
            "window": self.window,
            "tau": self._tau,
            "scores": list(self._scores),
            "decisions": list(self._decisions),
        }


def check_budget_places(budget: float | None, budget_state: str | Path | None, state: str | None) -> None:
    """Before a model loads: a budget's state file it could not keep, a ``state=`` URL that is wrong or a store that
    does not answer, or ``state=`` without a budget."""
    if budget is not None and budget_state is not None:
        check_state_path(Path(budget_state))
    if state is not None:
        from ragate.state.shared import connect, parse_state_url

        if budget is None:
            raise RagateError("state= shares the live budget's window among replicas: give budget= too")
        connect(parse_state_url(state)).close()


def open_budget(
    budget: float, window: int, spec: MethodSpec, budget_state: str | Path | None, model: str, gain: float,
    state: str | None,
) -> BudgetController:  # fmt: skip
    """The live controller of a pipeline (``Pipeline(budget=)``), its window kept in the Valkey/Redis store at
    ``state`` that replicas share (:mod:`ragate.state.shared`; the settings checked before the store sees them),
    else its own."""
    shared = None
    if state is not None:
        from ragate.state.shared import SharedWindow, parse_state_url

        check_budget(budget, window, spec, gain)
        shared = SharedWindow(
            parse_state_url(state), method=spec.name, model=model, budget=budget, window=window, gain=gain
        )
    path = Path(budget_state) if budget_state is not None else None
    return BudgetController(budget, window, spec, path, model=model, gain=gain, shared=shared)
