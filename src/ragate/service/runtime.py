"""What a running service holds and does per request (:class:`Runtime`: the pipeline, its limits, budget, answer
log and counters; one answer or search in a worker thread under the request's slot and timeout), and the request
bodies it accepts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from ragate.answers.savings import AlwaysRetrieveCost, AnswerLog, AnswerLogError, Savings, log_entry
from ragate.backends import Backend
from ragate.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    GateError,
    RagateError,
)
from ragate.methods import MethodSpec, get_method
from ragate.methods.needs import capability_summary, method_support
from ragate.methods.trace import Trace
from ragate.pipeline import Pipeline
from ragate.retrieval.function import SearchError
from ragate.retrieval.types import Hit, Retriever
from ragate.service.admission import Slots, Ticket
from ragate.service.guard import ApiError
from ragate.service.metrics import ServiceMetrics
from ragate.service.settings import ServiceSettings
from ragate.state.budget import BudgetController
from ragate.state.route_budget import ROUTE_UNITS, RouteBudgetController
from ragate.version import __version__

if TYPE_CHECKING:
    from ragate.service.refit import Refit

log = logging.getLogger("ragate.service")
T = TypeVar("T")


# -- request bodies ---------------------------------------------------------------------------------------------
class AnswerOptions(BaseModel):
    """Per-request changes to the method: answer length, gate threshold, documents read."""

    model_config = ConfigDict(extra="forbid", strict=True)  # "4" or true is not a number
    max_tokens: int | None = Field(default=None, ge=1)
    threshold: float | None = Field(default=None, allow_inf_nan=False)
    k: int | None = Field(default=None, ge=1)


class AnswerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "4" or true is not a number
    question: str
    method: str | None = None
    options: AnswerOptions = Field(default_factory=AnswerOptions)
    draft_tokens: bool = False  # add the gate's draft, token by token, with each token's uncertainty


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "true" is not a boolean
    id: str = Field(min_length=1, max_length=64)  # the id an answer came with
    correct: bool | None = None
    reference: str | None = Field(default=None, min_length=1, max_length=2000)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "4" or true is not a number
    query: str
    k: int = Field(default=5, ge=1)


@dataclass(frozen=True)
class Runtime:
    """Everything a request needs, built once per process and kept on ``app.state.runtime``: the
    :class:`~ragate.pipeline.Pipeline` that answers, and the service's own limits and counters."""

    settings: ServiceSettings
    pipeline: Pipeline
    index_name: str
    metrics: ServiceMetrics
    slots: Slots
    passages: int  # counted once: a Milvus count is a network call /healthz should not depend on
    owned: bool  # whether the app loaded (and so closes) the model and the index
    started: float
    closers: tuple[Callable[[], None], ...] = ()  # what else the app opened and closes (a Milvus connection)
    savings: AlwaysRetrieveCost = field(default_factory=AlwaysRetrieveCost)
    answer_log: AnswerLog | None = None
    refit: Refit | None = None  # where the server learns its gate as labels come

    def labelled(self, n: int = 0) -> None:
        """New labels came (feedback, or shadow work after an answer): refit where it is due."""
        if self.refit is not None:
            self.refit.check()

    @property
    def lm(self) -> Backend:
        return self.pipeline.lm

    @property
    def retriever(self) -> Retriever:
        return self.pipeline.retriever

    @property
    def served(self) -> MethodSpec:
        """The served method as the backend can run it (with its fallback gate, if any)."""
        return self.pipeline.spec

    @property
    def budget(self) -> BudgetController | RouteBudgetController | None:
        """``--budget``: the served method's tau, kept at a retrieval rate (a learned route policy's lambda, kept at
        mean retrievals per question)."""
        return self.pipeline.budget

    def controls(self, method: str | None, options: AnswerOptions | None = None) -> bool:
        """Whether the budget controller sets this request's threshold: the served method, no threshold asked."""
        return self.pipeline.controls(method, options.threshold if options is not None else None)

    async def work(self, fn: Callable[[Callable[[], bool]], T], kind: str = "answer") -> T:
        """Run ``fn(wanted)`` in a worker thread within a slot and the timeout, mapping ragate's errors to HTTP
        ones. ``wanted()`` turns false once the request gave up: check it after waiting for a lock. ``kind``
        groups requests of like duration for the Retry-After estimate."""
        if (work := self.slots.take(kind)) is None:
            wait = self.slots.retry_after(kind)
            why = (
                f"{self.slots.n} requests are being answered (its concurrency limit)"
                if self.slots.used >= self.slots.n
                else f"the requests ahead would keep this one past its limit of {self.settings.request_timeout:g} s"
            )
            raise ApiError(429, f"the server is busy: {why}; retry after {wait} s", {"Retry-After": str(wait)})
        ticket = Ticket(self.slots, work, waits=kind == "answer")  # an answer waits for the model

        def run() -> T:
            if not ticket.start():
                raise TimeoutError("given up before it started")
            try:
                return fn(ticket.wanted)
            finally:
                ticket.done()

        try:
            with anyio.fail_after(self.settings.request_timeout):
                return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        except TimeoutError:
            raise self.timed_out("the request took longer than the server's limit of") from None
        except BackendTimeoutError as err:  # the LM client's own timeout, when it fires before the server's
            raise self.timed_out(
                f"the language model did not answer in time ({err}); the server's limit is"
            ) from None
        except BackendUnavailableError as err:
            raise ApiError(503, f"the language model is unavailable: {err}", {"Retry-After": "5"}) from None
        except BackendError as err:
            raise ApiError(502, f"the language model failed: {err}") from None
        except (GateError, SearchError) as err:  # the server's own gate or search, not the client's request
            log.warning("a served gate or search failed: %s", err)
            raise ApiError(500, f"the server could not answer: {err}") from None
        except (RagateError, ValueError, NotImplementedError) as err:
            raise ApiError(400, str(err)) from None
        finally:
            ticket.give_up()

    def timed_out(self, what: str) -> ApiError:
        """A 504 naming the server's time limit and what to ask for instead."""
        return ApiError(
            504,
            f"{what} {self.settings.request_timeout:g} s, queueing included: the operator can raise it with "
            "`ragate serve --timeout SECONDS`; or ask for fewer tokens (options.max_tokens) or a cheaper method",
        )

    def spec(self, method: str | None, options: AnswerOptions) -> MethodSpec:
        """The method with the request's options, within the server's limits (checked before the request waits)."""
        s = self.settings
        if options.max_tokens is not None and options.max_tokens > s.max_tokens:
            raise ApiError(400, f"options.max_tokens is {options.max_tokens}; this server allows {s.max_tokens}")
        if options.k is not None and options.k > s.max_k:
            raise ApiError(400, f"options.k is {options.k}; this server allows at most {s.max_k} documents")
        try:
            spec = self.pipeline.spec_for(
                method, threshold=options.threshold, k=options.k, max_tokens=options.max_tokens
            )
        except RagateError as err:
            raise ApiError(400, str(err)) from None
        if spec.gate.kind == "skr" and spec.gate.labels is None:
            raise ApiError(
                400,
                "this server has no SKR label set: it answers skr when started with --method skr "
                "--skr-labels FILE",
            )
        if spec.gate.kind == "no-model-lr" and spec.gate.weights is None:
            raise ApiError(
                400,
                "this server has no gate weights: it answers no-model-lr when started with --method no-model-lr "
                "--gate-weights FILE",
            )
        return spec

    def question(self, text: str) -> str:
        """The one check of every text a client sends to the pipeline (an answer's question, a search query, a
        chat's last user message): non-empty, not too long, and valid Unicode (JSON can carry a lone surrogate
        such as ``\\ud800``, which no tokenizer or encoder can read)."""
        question = text.strip()
        if not question:
            raise ApiError(400, "the question is empty: send the question as a non-empty string")
        try:
            question.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ApiError(
                400,
                f"the text has a lone surrogate ({question[err.start]!r} at character {err.start}): send valid "
                "Unicode (a surrogate pair, or the character itself)",
            ) from None
        if len(question) > self.settings.max_question_chars:
            raise ApiError(
                400,
                f"the question is {len(question)} characters; this server takes at most "
                f"{self.settings.max_question_chars} (put documents in the index, not in the question)",
            )
        return question

    async def answer(
        self, question: str, method: str | None, options: AnswerOptions
    ) -> tuple[Trace, dict[str, Any], Savings]:
        """Run the method through the pipeline; the trace, the timings (queueing = time not spent in a stage) and
        what the answer saved against always retrieving."""
        spec = self.spec(method, options)  # a bad method or option is a 400 before the request takes a slot
        kept = self.pipeline.learner.store is not None and spec.dynamic is None  # an answer the store should keep
        start = time.perf_counter()

        def go(wanted: Callable[[], bool]) -> Any:
            # a request that timed out while waiting for the model gives up there: nobody reads the answer
            return self.pipeline.answer(
                question,
                method=method,
                threshold=options.threshold,
                k=options.k,
                max_tokens=options.max_tokens,
                still_wanted=wanted,
            )

        answered = await self.work(go)
        if kept and not answered.id:  # the store failed (a full disk): the answer goes on without its id
            self.metrics.observe_side_failure("feedback_store")
        trace = answered.trace
        self.labelled()
        total = time.perf_counter() - start
        savings = self.savings.savings(trace)
        self.metrics.observe_trace(trace)
        self.metrics.observe_savings(trace, savings)
        if self.answer_log is not None:
            try:
                if not self.answer_log.write(_finite(log_entry(trace, savings, model=self.pipeline.model_label))):
                    self.metrics.observe_side_failure("answer_log")
            except AnswerLogError as err:  # required (an audit trail): no answer leaves without its line
                self.metrics.observe_side_failure("answer_log")
                raise ApiError(503, f"{err.strerror}; the answer was not returned", {"Retry-After": "30"}) from None
        if self.budget is not None and self.controls(method, options):  # the pipeline observed it
            self.metrics.observe_budget(self.budget.budget, self.budget.last_tau, self.budget.rate())
        stage = {s.name: 0.0 for s in trace.stages}
        for s in trace.stages:
            stage[s.name] += s.seconds
        timings = {
            "total_seconds": total,
            "pipeline_seconds": trace.seconds,
            "queue_seconds": max(0.0, total - trace.seconds),
            "overhead_seconds": sum(s.seconds for s in trace.stages if s.overhead),
            "stages": stage,
        }
        if answered.id:
            timings["answer_id"] = answered.id
        return trace, timings, savings

    def extension(self, trace: Trace, timings: dict[str, Any], savings: Savings) -> dict[str, Any]:
        """What ragate adds to an answer: the decision, its evidence, its cost and what it saved against always
        retrieving (``savings``: measured, estimated, unknown or n/a; see :mod:`ragate.answers.savings`)."""
        return {
            **({"id": timings["answer_id"]} if timings.get("answer_id") else {}),
            "method": trace.method,
            "retrieved": trace.retrieved,
            "decision": "retrieve" if trace.retrieved else "skip",
            "gate": {
                "score": trace.gate.score,
                "threshold": trace.gate.threshold,
                "retrieve": trace.gate.retrieve,
                "reason": trace.gate.reason,
                "summary": self.plain(trace),
            },
            **({"route": asdict(trace.route)} if trace.route is not None else {}),  # the route and its checks
            "documents": [_hit(h) for h in trace.documents],
            "model": self.lm.model,
            "index": self.index_name,
            "timings": timings,
            "savings": savings.to_json(),
            **({"budget": self.budget_info()} if self.budget is not None else {}),
        }

    def plain(self, trace: Trace) -> str:
        """The decision in plain words (:func:`ragate.service.plain.plain_reason`), for the page."""
        from ragate.service.plain import plain_reason, route_reason

        if trace.route is not None:
            return route_reason(trace.route)
        spec = self.served if trace.method == self.served.name else get_method(trace.method)
        return plain_reason(spec.gate.kind, trace.retrieved, dynamic=spec.dynamic is not None)

    def served_threshold(self) -> float | None:
        """The tau the served method decides at now: the budget controller's, else the set or default one (None
        for a method without a threshold of its own: never, always, a dynamic trigger)."""
        from ragate.gates.registry import get_gate

        if self.budget is not None:  # as last read (no store round trip on the event loop)
            return float(self.budget.last_tau)
        gate = self.served.gate
        if gate.kind in ("never", "always") or self.served.dynamic is not None:
            return None
        return float(gate.threshold if gate.threshold is not None else get_gate(gate.kind).default_tau)

    def learning(self, *, authorised: bool = True) -> dict[str, Any]:
        """The learned gate in force (its file and when it was written), the store's label counts, the shadow
        worker's and the refit's state; empty where the server learns nothing. Not ``authorised``: no path and no
        message that could hold one (the store's and the gate file's paths, errors, the refit's summary)."""
        p = self.pipeline
        out: dict[str, Any] = {}
        hidden = "(send the API key to see it)"
        if p.learner.gate_file is not None:
            path = Path(p.learner.gate_file)
            out["gate_file"] = {
                "path": str(path) if authorised else hidden,
                "modified": path.stat().st_mtime if path.is_file() else None,
            }
        if p.learner.store is not None:
            name = p.learner.store.name if authorised else hidden
            try:
                out["store"] = {"path": name, **p.learner.store.counts()}
            except Exception as err:  # noqa: BLE001 (a failing store is reported, not fatal
                out["store"] = {"path": name, "error": f"{type(err).__name__}: {err}"[:300] if authorised else hidden}
        if p.learner.shadow is not None:
            out["shadow"] = p.learner.shadow.describe()
            if p.learner.turns is not None:
                out["shadow"]["turns"] = p.learner.turns.describe()
        if self.refit is not None:
            out["refit"] = self.refit.describe()
        if not authorised:
            for part, keys in (("shadow", ("last_error",)), ("refit", ("last_error", "last_summary"))):
                for key in keys:
                    if out.get(part, {}).get(key) is not None:
                        out[part][key] = hidden
        return out

    def gate_file_problem(self) -> str | None:
        """Why the served learned gate file is not in force as it is now (the last good gate decides meanwhile:
        :func:`ragate.gates.learned.gate_in_force`), or None; its refused versions are counted in the metrics."""
        if self.pipeline.learner.gate_file is None:
            return None
        from ragate.gates.learned import gate_in_force

        try:
            state = gate_in_force(self.pipeline.learner.gate_file, self.lm)
        except RagateError as err:  # no version of it ever loaded here: nothing to fall back on
            return f"{err} (no version of it has loaded: the learned gate cannot decide)"
        self.metrics.observe_gate_file(state.refusals)
        if state.problem is None:
            return None
        return f"{state.problem} (the gate last read from it decides until it loads and checks again)"

    def budget_info(self) -> dict[str, Any]:
        assert self.budget is not None
        return {
            "budget": self.budget.budget,
            "window": self.budget.window,
            "window_rate": self.budget.rate(),
            "next_threshold": self.budget.tau,
            **(ROUTE_UNITS if isinstance(self.budget, RouteBudgetController) else {}),
            # the last write of the state failed (a full disk): tau lives in memory only until a write succeeds
            **({"state_write_error": self.budget.write_error} if self.budget.write_error else {}),
        }

    async def health(self, *, authorised: bool = True) -> tuple[int, dict[str, Any]]:
        """The service's state. ``/healthz`` needs no key, so without one (where the server has a key) it does
        not say where the model, the index, the feedback store and the learned gate's file are on disk, nor which LM
        servers it uses. Over LM servers it gives
        what the balancer believes of each (up or down, since when, why, the next probe), after probing those up
        and those down whose probe is due (docs/service.md, "Fleet health"): 200 while one is up, 503 when none
        is."""
        info: dict[str, Any] = {
            "status": "ok", "version": __version__, "method": self.served.name,
            "method_description": self.served.description, "threshold": self.served_threshold(),
            "model": self.lm.model,
            "engine": self.lm.engine, "index": self.index_name, "passages": self.passages,
            "in_progress": self.slots.used, "max_concurrency": self.slots.n,
            "capabilities": capability_summary(self.lm),
        }  # fmt: skip
        learning = self.learning(authorised=authorised)
        if learning:
            info["learning"] = learning
        problems = [e for e in (self.answer_log.error if self.answer_log is not None else None,) if e]
        if self.budget is not None and self.budget.shared_error:  # the replicas' shared window; tau is local now
            problems.append(f"shared state: {self.budget.shared_error}")
        if (gate_file := await anyio.to_thread.run_sync(self.gate_file_problem)) is not None:
            problems.append(
                f"learned gate file: {gate_file if authorised else 'refused (send the API key to see why)'}"
            )
        if problems:  # a side channel fails; the answers go on (docs/service.md, "Degraded")
            info["status"] = "degraded: " + "; ".join(problems)
        states = self.pipeline.prompt_states
        if states is not None:  # what the kept prompt states hold, against their bound (--prompt-state-mb)
            info["prompt_states"] = states
        if self.served.name != self.settings.method:  # require() renamed it: a fallback gate decides
            info["fallback"] = (
                f"the {self.lm.engine} backend cannot serve {self.settings.method!r}'s gate "
                f"({method_support(get_method(self.settings.method), self.lm.capabilities)[1]}): "
                f"its answers are decided by the {self.served.gate.kind!r} gate"
            )
        if not authorised:
            hidden = "(send the API key to see it)"
            info |= {"index": hidden, "model": Path(str(self.lm.model)).name or hidden}
        check = getattr(self.lm, "check_servers", None) if self.lm.engine == "openai" else None
        if check is None:
            return 200, info
        views = await anyio.to_thread.run_sync(check, self.settings.health_timeout)
        info["servers"] = {
            (v.url if authorised else f"server {i + 1}"): v.to_json(detail=authorised)
            for i, v in enumerate(views)
        }
        down = [v for v in views if not v.up]
        if len(down) < len(views):
            return 200, info
        said = "; ".join(f"{v.url}: {v.problem}" for v in down) if authorised else "send the key to see why"
        which = "servers are" if len(views) > 1 else "server is"
        message = (
            f"the language model {which} unavailable ({said}); each is probed again and answers calls once it "
            "answers a probe"
        )
        return 503, {
            **info,
            "status": "unavailable",
            "error": {"message": message, "type": "backend_unavailable"},
        }


def _hit(h: Hit) -> dict[str, Any]:
    """A document as an answer or a search returns it, with the file it was cut from where the index knows it."""
    p = h.passage
    out = {"id": h.id, "title": p.title, "text": p.text, "score": h.score, "rank": h.rank}
    if p.source is not None:
        out["source"] = p.source
    span = getattr(p, "span", None)
    if span is not None:
        out["span"] = list(span)
    return out


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such scores become null (:func:`ragate.fileio.finite_json`)."""
    from ragate.fileio import finite_json

    return finite_json(value)[0]
