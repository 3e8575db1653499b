"""What a :class:`ragate.Pipeline` holds to learn the traffic it serves (``Pipeline.learner``): the turns at a local
model between requests and shadow work, the feedback store each answer and its features go to, the shadow worker
that runs the path the gate did not take, a user's feedback, and the learned gate fitted and put in force
(:mod:`ragate.learning.store`, :mod:`ragate.learning.shadow`, :mod:`ragate.learning.fit`,
:mod:`ragate.gates.learned`). The learner reads its pipeline through :class:`Host`; the one thing it changes there
is the method in force: its gate, when a fitted gate goes in force, or its route policy, when one fitted on the
store's route answers does."""

from __future__ import annotations

import contextlib
import math
import numbers
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ragate.errors import RagateError
from ragate.methods import MethodSpec, run_method

if TYPE_CHECKING:
    import numpy as np

    from ragate.answers.answer import Answer
    from ragate.backends.base import Backend
    from ragate.backends.turns import ModelTurns
    from ragate.learning.fit import Learned
    from ragate.learning.shadow import Shadow, ShadowJob
    from ragate.learning.store import FeedbackResult, FeedbackRules
    from ragate.retrieval.types import Retriever
    from ragate.state.budget import BudgetController
    from ragate.state.route_budget import RouteBudgetController

SHADOW_STEP_TOKENS = 16  # prompt tokens per step of shadow work: a request waits for no more than that
UNCERTAIN_BAND = (
    0.1  # an answer whose gate score sits within this share of recent scores of tau is "uncertain"
)


class UncertainBand:
    """Whether a gate score sits near its threshold: within :data:`UNCERTAIN_BAND` of the recent scores (the last
    ``size``) of it, by rank; where the gate's label is least sure, so a label there teaches the gate most. It keeps
    the last decisions too: the traffic's retrieval rate a new gate's threshold keeps."""

    def __init__(self, size: int = 200) -> None:
        from collections import deque

        self._scores: deque[float] = deque(maxlen=size)
        self._retrieved: deque[bool] = deque(maxlen=size)
        self._lock = threading.Lock()

    def rate(self) -> float | None:
        """The share of the last answers that retrieved (None before any)."""
        with self._lock:
            return sum(self._retrieved) / len(self._retrieved) if self._retrieved else None

    def observe(self, score: float, threshold: float, retrieved: bool) -> bool:
        """Note an answer's gate score and decision; whether the score sits near the threshold."""
        with self._lock:
            self._retrieved.append(bool(retrieved))
            if not (math.isfinite(score) and math.isfinite(threshold)):
                return False
            self._scores.append(score)
            seen = list(self._scores)
        if len(seen) < 20:
            return False
        low, high = min(score, threshold), max(score, threshold)
        between = sum(low <= s <= high for s in seen) - 1
        return between / len(seen) <= UNCERTAIN_BAND


def left_open(wait: float | None) -> None:
    """A pipeline closed while a question was still being answered past ``wait`` seconds."""
    import warnings

    warnings.warn(
        f"ragate: a question was still being answered {wait or 0:g} s after close(): the model and the index it uses "
        "are left for the process's exit to free",
        RuntimeWarning,
        stacklevel=3,
    )


class _Unhook:
    """On close, takes the pipeline's turns off a backend (one the caller gave stays usable without them)."""

    def __init__(self, backend: Backend, step: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
        self.backend, self.step = backend, step

    def close(self) -> None:
        if getattr(self.backend, "step", None) == self.step:
            self.backend.step = None


class _ShadowWork:
    """Closes shadow work in order: the worker stops (a running job at its next model step), then its context."""

    def __init__(self, shadow: Shadow, twin: Backend | None, stop: threading.Event) -> None:
        self.shadow, self.twin, self.stop = shadow, twin, stop

    def close(self) -> None:
        self.stop.set()
        self.shadow.close(wait=1.0)  # a running job stops at its next step
        if self.twin is not None and not self.shadow.alive:
            self.twin.close()  # a worker still inside a step keeps its context (freed with the process)


class Host(Protocol):
    """What a :class:`Learner` reads of the pipeline it serves (:class:`ragate.Pipeline` is one)."""

    spec: MethodSpec  # the method in force; the learner sets its gate when a fitted gate goes in force
    seed: int
    lm: Backend
    budget: BudgetController | RouteBudgetController | None
    calibration: dict[str, Any] | None  # the calibration file in force; a route policy that goes in force replaces it

    def spec_for(self, method: str | None = None) -> MethodSpec: ...

    @property
    def retriever(self) -> Retriever: ...

    @property
    def model_label(self) -> str: ...


class Learner:
    """The learning half of a pipeline: turns at its model, the feedback store, the shadow worker and the learned
    gate in force. ``lock`` is the pipeline's model lock (a local model answers one call at a time), held by shadow
    work that runs on the model itself and while the gate in force changes."""

    def __init__(self, host: Host, lock: contextlib.AbstractContextManager[Any]) -> None:
        self._host, self._lock = host, lock
        self.store: FeedbackRules | None = None
        self.shadow: Shadow | None = None
        self.gate_file: str | None = None
        self.turns: ModelTurns | None = None
        self.band = UncertainBand()
        self._local = True
        self._answering = 0  # requests waiting for or using the model (shadow work waits for none)
        self._count_lock = threading.Lock()
        self._side_errors: set[str] = set()
        self._owned: list[_Unhook | _ShadowWork | FeedbackRules] = []
        self._engine_lm: Backend | None = None
        self._shadow_lm: Backend | None = None
        self._shadow_stop = threading.Event()

    def open(
        self,
        raw: Backend,
        *,
        share: float,
        turns_of: Learner | None,
        store: str | Path | FeedbackRules | None,
        shadow: float,
        queue_size: int,
    ) -> None:
        """Turns at a local model between requests and shadow work (:mod:`ragate.backends.turns`), those of
        ``turns_of`` where this pipeline shares its model, each of ``raw``'s steps a request's; then the feedback
        store and the shadow worker, where asked for."""
        from ragate.backends.turns import ModelTurns, check_share

        check_share(share)
        self._engine_lm, self._local = raw, raw.engine != "openai"
        if not self._local:
            self.turns = None
        elif turns_of is not None and turns_of.turns is not None:
            self.turns = turns_of.turns
        else:
            self.turns = ModelTurns(share)
            raw.step = self.turns.request_step
            self._owned.append(_Unhook(raw, self.turns.request_step))
        self._open_learning(store, shadow, queue_size)

    def _open_learning(
        self, store: str | Path | FeedbackRules | None, shadow: float, queue_size: int
    ) -> None:
        from ragate.learning.shared_store import open_feedback_store
        from ragate.learning.store import FeedbackRules

        if isinstance(shadow, bool) or not isinstance(shadow, numbers.Real) or not 0.0 <= shadow <= 1.0:
            raise RagateError(
                f"shadow is the share of answers shadowed, a number in [0, 1], not {shadow!r:.40}"
            )
        if store is None and shadow > 0:
            from ragate.models import ragate_home

            store = ragate_home() / "feedback.db"
        if store is not None:
            self.store = store if isinstance(store, FeedbackRules) else open_feedback_store(store)
            if not isinstance(store, FeedbackRules):
                self._owned.append(self.store)
        if shadow > 0:
            from ragate.learning.shadow import Shadow

            twin = self._shadow_engine()
            self.shadow = Shadow(
                float(shadow), self._shadow_answer, self._shadow_label,
                busy=(lambda: False) if twin is not None else (lambda: self._answering > 0),
                queue_size=queue_size, seed=self._host.seed,
            )  # fmt: skip
            self._owned.append(_ShadowWork(self.shadow, twin, self._shadow_stop))
        if self._host.spec.gate.kind == "learned":
            self.gate_file = self._host.spec.gate.weights
            self._warn_if_fitted_elsewhere()

    def _warn_if_fitted_elsewhere(self) -> None:
        """A learned gate fitted on other traffic (another store, a sweep) may rank this traffic worse than a fixed
        gate: say what it was fitted on, once, when the pipeline opens."""
        import warnings

        from ragate.gates.learned import load_learned

        if self.gate_file is None:
            return
        try:
            meta = load_learned(self.gate_file).meta
        except RagateError:
            return  # the gate's own loader names a damaged file when it decides
        source = str(meta.get("source") or "unknown traffic")
        if self.store is not None and source == f"feedback store {self.store.name}":
            return
        report = meta.get("report") or {}
        n, positives = int(report.get("n") or 0), int(report.get("positives") or 0)
        auc = (report.get("cheap_auroc") or [None])[0]
        share = f"{100 * positives / n:.0f}% of them labelled 'retrieve'" if n else "labels unknown"
        warnings.warn(
            f"ragate: the learned gate {self.gate_file} was fitted on {source} ({n} questions, {share}; cross-fitted "
            f"AUROC {auc if auc is not None else '-'}), not on this traffic: there it may rank worse than a fixed gate. "
            "Keep a feedback store, label some answers (POST /v1/feedback, Pipeline.feedback) and `ragate gate learn "
            "--store FILE` compares the two on your labels",
            RuntimeWarning,
            stacklevel=5,  # the caller of Pipeline(...)
        )

    def _shadow_engine(self) -> Backend | None:
        """A context of its own over the model's weights for shadow work, taking the model a step at a time under
        the pipeline's turns (:mod:`ragate.backends.turns`), where the engine has one (llama.cpp); else None (shadow
        work then waits for idle time and gives the model up at stage boundaries)."""
        raw, turns = self._engine_lm, self.turns
        if raw is None or turns is None or not hasattr(raw, "twin"):
            return None
        from ragate.eval.calls import exact_calls

        twin: Backend = raw.twin(step_tokens=SHADOW_STEP_TOKENS)
        stop = self._shadow_stop
        twin.step = lambda: turns.shadow_step(stop)
        self._shadow_lm = exact_calls(twin)
        return twin

    def stop_shadow(self) -> None:
        """Shadow work stops first on close, without waiting for the model: its queue is dropped and a running job
        stops at its next model step (the worker, or what closes it with its model context)."""
        for work in [o for o in self._owned if isinstance(o, _ShadowWork)]:
            self._owned.remove(work)
            work.close()

    def close(self, *, everything: bool = True) -> None:
        """Close what the learner opened, the feedback store always; the rest only with ``everything`` (a question
        still being answered past the pipeline's ``close(wait=)`` keeps the model's turns)."""
        self.stop_shadow()
        while self._owned:
            opened = self._owned.pop()
            if everything or opened is self.store:
                opened.close()

    def wanted(self, still_wanted: Callable[[], bool] | None) -> contextlib.AbstractContextManager[None]:
        """While a request holds the model: its steps stop once its caller gave it up (a local model's turns)."""
        return self.turns.wanted(still_wanted) if self.turns is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Counts a request waiting for or using the model (shadow work on the model itself waits for none)."""
        with self._count_lock:
            self._answering += 1
        try:
            yield
        finally:
            with self._count_lock:
                self._answering -= 1

    def keep(self, answer: Answer, spec: MethodSpec, method: str | None) -> Answer:
        """Record ``answer`` and its features in the store under a new id, and offer it to the shadow worker; a
        store that fails costs a warning (once per kind of failure), never the answer."""
        import dataclasses
        import uuid

        from ragate.learning.fit import GATE_SCORE, answer_features
        from ragate.learning.shadow import ShadowJob

        assert self.store is not None
        answer_id = uuid.uuid4().hex
        gate = answer.trace.gate
        uncertain = self.band.observe(gate.score, gate.threshold, answer.retrieved)
        try:
            features = answer_features(answer.question, answer.trace.draft)
            if math.isfinite(gate.score):  # the gate in force's score, which a new gate is compared with
                features[GATE_SCORE + spec.gate.kind] = float(gate.score)
            paths = None
            if spec.route is not None:  # its two paths, and what the learned route policy reads of the first answer
                from ragate.learning.route_traffic import DECIDED_BY, first_answer_features, policy_digest

                paths = route_answers(answer, spec)
                features |= first_answer_features(answer.trace.route, spec.route.routes[0])
                features[DECIDED_BY + policy_digest(spec.route)] = 1.0  # which policy chose (not a feature)
            self.store.record_answer(
                answer_id, question=answer.question, method=spec.name, prompts=spec.prompts.name,
                answer=answer.text, retrieved=answer.retrieved, features=features, hidden=answer.trace.hidden,
                model={"model": self._host.model_label, "engine": self._host.lm.engine}, paths=paths,
            )  # fmt: skip
        except Exception as err:  # noqa: BLE001 (a side channel: any failure costs a warning, not the answer)
            self._side_warning("feedback store", err)
            return answer
        answer = dataclasses.replace(answer, id=answer_id)
        job: ShadowJob | None = ShadowJob(answer_id, answer.question, answer.retrieved, answer.text, method)
        if spec.route is not None:  # the routes' own answers are the two paths; shadow work runs only a missing one
            try:
                job = self._route_twins(answer_id, answer, spec)
            except Exception as err:  # noqa: BLE001 (a side channel, as above)
                self._side_warning("feedback store", err)
                return answer
        if self.shadow is not None and job is not None:
            self.shadow.offer(job, uncertain=uncertain)
        return answer

    def _route_twins(self, answer_id: str, answer: Answer, spec: MethodSpec) -> ShadowJob | None:
        """A route method's answer in the store's two paths: the closed-book route's answer (the first route, where
        it is closed-book and ran) and the one-retrieval route's (the first route that may retrieve, where it ran
        and read documents). Both known: they are the answer's twins, and their (dis)agreement its silver label at
        once. Otherwise the shadow job that runs the route a missing path stands for, alone (never the whole
        cascade again; :func:`route_job`)."""
        from ragate.learning.store import answers_agree

        assert self.store is not None and spec.route is not None
        if None in route_paths(spec):
            return None
        closed, opened = route_answers(answer, spec)  # recorded as the answer's paths (keep)
        if closed is not None and opened is not None:
            self.store.add_label(answer_id, source="shadow", kind="retrieval-changed", value=not answers_agree(closed, opened),
                                 detail={"other": "both answered by the route cascade"})  # fmt: skip
            return None
        return route_job(answer_id, answer.question, spec, closed, opened)

    def _side_warning(self, what: str, err: Exception) -> None:
        import warnings

        key = f"{what}:{type(err).__name__}"
        if key not in self._side_errors:
            self._side_errors.add(key)
            warnings.warn(
                f"ragate: the {what} failed ({type(err).__name__}: {err}); answers go on without it",
                RuntimeWarning,
                stacklevel=4,  # the caller of Pipeline.answer
            )

    def _shadow_answer(self, job: ShadowJob) -> str:
        """The path the gate did not take for ``job`` (see :mod:`ragate.learning.shadow`): on the shadow context, a
        step at a time, where there is one; else on the model, giving it up at each stage a request waits."""
        from dataclasses import replace as _replace

        from ragate.backends.turns import GivenUp
        from ragate.gates.spec import GateSpec
        from ragate.learning.shadow import Preempted

        host = self._host
        spec = host.spec_for(job.method)
        other = _replace(spec, gate=GateSpec("never" if job.retrieved else "always"))
        retriever = None if job.retrieved else host.retriever
        if self._shadow_lm is not None:
            return run_method(other, job.question, self._shadow_lm, retriever, seed=host.seed).answer

        def yield_to_requests(stage: str) -> None:  # at each stage: a request waiting takes the model first
            if self._shadow_stop.is_set():
                raise GivenUp("shadow work stops: the pipeline closes")
            if self._answering > 0:
                raise Preempted(stage)

        with self._lock if self._local else contextlib.nullcontext():
            trace = run_method(
                other, job.question, host.lm, retriever, seed=host.seed, progress=yield_to_requests
            )
        return trace.answer

    def _shadow_label(self, job: ShadowJob, other: str) -> dict[str, bool]:
        from ragate.learning.store import answer_correct, answers_agree

        assert self.store is not None
        closed, opened = (other, job.answer) if job.retrieved else (job.answer, other)
        self.store.set_twin(job.answer_id, closed=closed, opened=opened)
        labels = {"retrieval-changed": not answers_agree(closed, opened)}
        if job.reference is not None:
            labels["closed-wrong"] = not answer_correct(closed, job.reference)
            labels["retrieved-wrong"] = not answer_correct(opened, job.reference)
        for kind, value in labels.items():
            self.store.add_label(
                job.answer_id, source="shadow", kind=kind, value=value, detail={"other": other[:500]}  # type: ignore[arg-type]
            )  # fmt: skip
        return labels

    def feedback(
        self, answer: Answer | str, *, correct: bool | None = None, reference: str | None = None
    ) -> FeedbackResult:
        """See :meth:`ragate.Pipeline.feedback`."""
        from ragate.learning.shadow import ShadowJob
        from ragate.learning.store import FeedbackResult, pending_labels, unknown_answer

        if self.store is None:
            raise RagateError(
                "this pipeline keeps no feedback: make it with feedback_store='feedback.db' (or shadow=)"
            )
        answer_id = answer if isinstance(answer, str) else getattr(answer, "id", None)
        if not isinstance(answer_id, str) or not answer_id:
            raise RagateError("feedback names an answer this pipeline gave (its Answer, or Answer.id)")
        labels = tuple(self.store.feedback(answer_id, correct=correct, reference=reference))
        row = self.store.get(answer_id)
        if row is None:
            raise unknown_answer(answer_id)
        pending = pending_labels(row, reference)
        if pending and self.shadow is not None and reference is not None:
            spec = self._host.spec_for(row.method) if row.method == self._host.spec.name else None
            if spec is not None and spec.route is not None:  # the route the missing path stands for, alone
                job = route_job(answer_id, row.question, spec, row.closed_answer, row.open_answer, reference=reference)
            else:
                job = ShadowJob(answer_id, row.question, row.retrieved, row.answer, row.method, reference=reference)
            if job is None or not self.shadow.settle(job):
                pending = ()
        elif self.shadow is None:
            pending = ()
        return FeedbackResult(labels, pending)

    def learn(
        self, out: str | Path | None, *, label: str | None, cascade: float | None, hidden: bool, use: bool
    ) -> Learned:
        """See :meth:`ragate.Pipeline.learn`; a gate that goes in force becomes the host's method's gate."""
        import os
        from dataclasses import replace as _replace

        from ragate.gates.spec import GateSpec
        from ragate.learning.fit import learn_from_store

        if self.store is None:
            raise RagateError("this pipeline keeps no labels: make it with feedback_store= or shadow=")
        host = self._host
        if use and host.spec.route is not None:
            raise RagateError(
                "a learned gate does not steer a route method (its checks or policy choose the route): learn with "
                "use=False to keep the gate file for a gate method; fit the routes' policy on these labels and put "
                "it in force with learn_routes(budget, use=True) (ragate.learning.route_traffic)"
            )
        target = Path(out) if out is not None else self.store.gate_path()
        candidate = target.with_name(f"{target.stem}.candidate{target.suffix}") if use else target
        learned = learn_from_store(
            self.store, candidate, label=label, prompts=host.spec.prompts.name, cascade=cascade, hidden=hidden,
            model={"model": host.model_label, "engine": host.lm.engine}, in_force=host.spec.gate.kind,
        )  # fmt: skip
        if not use or (learned.comparison is not None and not learned.comparison.earns):
            return learned
        os.replace(candidate, target)
        learned = _replace(learned, path=target)
        tau = self._traffic_tau(learned.cross_fitted)
        with self._lock:
            host.spec = _replace(host.spec, gate=GateSpec("learned", threshold=tau, weights=str(target)))
            self.gate_file = str(target)
        return learned

    def route_plan(self, budget: float | None, *, use: bool) -> tuple[list[str], float]:
        """The two routes traffic labels and the budget a route policy is fitted for, refused naming the fix where
        this pipeline cannot learn one (no store, not a route method, no such routes, no budget; with ``use``, more
        routes than those two, no shadow work, a budget other than the live one). ``ragate serve --refit-every``
        asks this before it serves."""
        from ragate.learning.route_traffic import budget_for, check_in_force

        spec = self._host.spec
        if self.store is None:
            raise RagateError("this pipeline keeps no labels: make it with feedback_store= (and shadow=)")
        if spec.route is None:
            raise RagateError(f"learn_routes() fits a route method's policy; this pipeline answers with {spec.name!r}")
        paths = route_paths(spec)
        if None in paths:
            raise RagateError(f"the routes {', '.join(spec.route.routes)} have no closed-book and one-retrieval route "
                              "for traffic to label")  # fmt: skip
        routes = [p for p in paths if p is not None]
        if use and list(spec.route.routes) != routes:
            raise RagateError(
                f"traffic labels two routes ({', '.join(routes)}), so a policy fitted on it routes between those two; "
                f"this pipeline routes among {', '.join(spec.route.routes)}: learn with use=False and serve the file "
                f"on a pipeline of those two routes (routes={routes!r}), or fit a policy over every route from a "
                "run of each (ragate calibrate --gate route --policy learned --from-sweep RUN)"
            )
        if use:
            check_in_force(self.shadow is not None, budget, self._host.budget)
        return routes, budget_for(budget, self._host.budget, self._host.calibration)

    def learn_routes(self, budget: float | None, out: str | Path | None, *, use: bool = False) -> dict[str, Any]:
        """See :meth:`ragate.Pipeline.learn_routes`; a policy that goes in force becomes the host's route policy
        (and the live route budget's, whose window starts anew: its probabilities were the old fit's)."""
        import json

        from ragate.fileio import atomic_writer
        from ragate.learning.route_traffic import (
            calibrate_routes_from_store,
            learn_from_traffic,
            policy_digest,
        )
        from ragate.state.route_budget import RouteBudgetController

        host = self._host
        routes, budget = self.route_plan(budget, use=use)
        assert self.store is not None and host.spec.route is not None
        target = Path(out) if out is not None else self.store.gate_path().with_name(f"route-learned-{budget:g}.json")
        if not use:
            found = calibrate_routes_from_store(self.store, routes, budget)
        else:
            from ragate.eval.thresholds import check_calibration

            first = host.calibration is None or host.calibration.get("source") != "traffic"
            found = learn_from_traffic(self.store, routes, budget, in_force=policy_digest(host.spec.route), first=first)
            check_calibration(found, target, "route", host.model_label, host.lm.engine)  # this model's answers
            if not found["compared"]["earns"]:
                target, use = target.with_name(f"{target.stem}.candidate{target.suffix}"), False
        with atomic_writer(target) as f:
            f.write(json.dumps(found, indent=2).encode())
        if use:
            from ragate.methods.route import with_calibration

            spec = with_calibration(host.spec, found, target, routes_given=True)
            with self._lock:  # the live budget's window first: a request between the two is dropped from it
                if isinstance(host.budget, RouteBudgetController):
                    host.budget.refit(spec)
                host.spec, host.calibration = spec, found
        return found | {"path": str(target), "in_force": use}

    def _traffic_tau(self, probabilities: Sequence[float] | np.ndarray) -> float | None:
        """The threshold at which a new gate retrieves at this traffic's rate: the live budget's, else the rate of
        the last answers (None where neither is known: the gate's own default)."""
        import numpy as np

        budget = self._host.budget
        rate = float(budget.budget) if budget is not None else self.band.rate()
        if rate is None or not len(probabilities):
            return None
        return float(np.quantile(np.asarray(probabilities, dtype=float), min(1.0, max(0.0, 1.0 - rate))))


def route_paths(spec: MethodSpec) -> tuple[str | None, str | None]:
    """The routes that stand for the store's two paths: the closed-book route (the first, where it is closed-book)
    and the one-retrieval route (the first that may retrieve); None where the routes have none."""
    from ragate.methods.route import route_cost, route_specs

    assert spec.route is not None
    specs = route_specs(spec.route)
    closed = specs[0].name if route_cost(specs[0]) == 0 else None
    return closed, next((s.name for s in specs if route_cost(s) > 0), None)


def route_answers(answer: Answer, spec: MethodSpec) -> tuple[str | None, str | None]:
    """A route answer's two paths: the closed-book route's answer and the one-retrieval route's (where it ran and
    read documents), each None where that route did not answer (a multi-step route's answer is neither)."""
    info = answer.trace.route
    closed_route, opener = route_paths(spec)
    if info is None:
        return None, None
    said = {r: (a, got) for r, a, got in zip(info.ran, info.answers, info.retrieved, strict=False)}
    closed = said[closed_route][0] if closed_route in said else None
    opened = said[opener][0] if opener in said and said[opener][1] else None
    return closed, opened


def route_job(
    answer_id: str, question: str, spec: MethodSpec, closed: str | None, opened: str | None, *,
    reference: str | None = None,
) -> ShadowJob | None:  # fmt: skip
    """The shadow job for a route answer one of whose paths is missing: the one-retrieval route alone where the
    closed-book answer is known, the closed-book route alone where the retrieval answer is; None where neither is
    known or the routes have no closed-book or no retrieving route."""
    from ragate.learning.shadow import ShadowJob

    closed_route, opener = route_paths(spec)
    if closed_route is None or opener is None:
        return None
    if closed is not None and opened is None:
        return ShadowJob(answer_id, question, False, closed, opener, reference=reference)
    if opened is not None and closed is None:
        return ShadowJob(answer_id, question, True, opened, closed_route, reference=reference)
    return None


def check_gate_file(spec: MethodSpec, lm: Backend) -> None:
    """A gate file fitted on another model, or with numbers that overflow, is refused when the pipeline opens, not
    per request (the gate's own check: ``Gate.check_file``)."""
    if spec.gate.weights is not None:
        from ragate.gates.registry import get_gate

        get_gate(spec.gate.kind).check_file(str(spec.gate.weights), lm)
