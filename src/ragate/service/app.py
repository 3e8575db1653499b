"""The HTTP service: one method, one model and one index per process, behind a small guarded API.

``create_app(settings)`` loads the model and the index once (or takes them ready-made) and returns a FastAPI app:

- ``POST /v1/answer``: ``{"question", "method"?, "options"?: {"max_tokens", "threshold", "k"}}`` → the answer,
  whether it retrieved, the gate's score and threshold, the documents read, the trace and timings
- ``POST /v1/search``: ``{"query", "k"?}`` → the index's hits
- ``POST /v1/chat/completions`` and ``GET /v1/models``: OpenAI's API over the pipeline (see ``openai_api``)
- ``GET /healthz`` (never needs the key) and ``GET /metrics`` (Prometheus)
- ``GET /v1/budget``: with ``--budget``, the controller's target, window, rate and tau, and their history
- ``GET /``: the service's own web page (``page``; its files need no key, the data it asks for does)

Every request passes :class:`Guard` first (bearer token, body size, JSON content type, UTF-8) and every pipeline
call takes a slot of :class:`Slots` (429 with ``Retry-After`` when all are taken), runs in a worker thread under
the per-request timeout (504), and a local model is used by one request at a time (llama.cpp and torch models
are not thread-safe; one request's draft, retrieval and answer also keep the model's prefix cache to themselves).
Every error is JSON ``{"error": {"message", "type"}}``; no stack trace reaches a client.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ragate.backends import Backend
from ragate.budget import BudgetController
from ragate.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    GateError,
    RagateError,
)
from ragate.gates.base import TokenUncertainty
from ragate.gates.registry import get_gate
from ragate.methods import MethodSpec, all_methods, get_method
from ragate.methods.needs import capability_summary, method_support
from ragate.methods.trace import Trace
from ragate.pipeline import Pipeline
from ragate.retrieval.function import SearchError
from ragate.retrieval.types import Hit, Retriever
from ragate.savings import AlwaysRetrieveCost, AnswerLog, Savings, log_entry
from ragate.service import openai_api
from ragate.service.admission import Slots, Ticket
from ragate.service.guard import ApiError, Guard, error_response
from ragate.service.metrics import ServiceMetrics
from ragate.service.page import install_page
from ragate.service.settings import ServiceSettings
from ragate.version import __version__

log = logging.getLogger("ragate.service")
T = TypeVar("T")

ENDPOINT_LIST = (
    "POST /v1/answer, POST /v1/search, POST /v1/chat/completions, GET /v1/models, GET /v1/budget, GET /healthz, "
    "GET /metrics, GET / (the web page)"
)


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
    def budget(self) -> BudgetController | None:
        """``--budget``: the served method's tau, kept at a retrieval rate."""
        return self.pipeline.budget

    def controls(self, method: str | None, options: AnswerOptions | None = None) -> bool:
        """Whether the budget controller sets this request's threshold: the served method, no threshold asked."""
        return self.pipeline.controls(method, options.threshold if options is not None else None)

    async def work(self, fn: Callable[[Callable[[], bool]], T], kind: str = "answer") -> T:
        """Run ``fn(wanted)`` in a worker thread within a slot and the timeout, mapping ragate's errors to HTTP
        ones. ``wanted()`` turns false once the request gave up: check it after waiting for a lock. ``kind``
        groups requests of like duration for the Retry-After estimate."""
        if not self.slots.take(kind):
            wait = self.slots.retry_after()
            raise ApiError(
                429,
                f"the server is busy: {self.slots.n} requests are being answered (its concurrency limit); "
                f"retry after {wait} s",
                {"Retry-After": str(wait)},
            )
        ticket = Ticket(self.slots, kind)

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
        self.spec(method, options)  # a bad method or option is a 400 before the request takes a slot
        start = time.perf_counter()

        def go(wanted: Callable[[], bool]) -> Trace:
            # a request that timed out while waiting for the model gives up there: nobody reads the answer
            return self.pipeline.answer(
                question,
                method=method,
                threshold=options.threshold,
                k=options.k,
                max_tokens=options.max_tokens,
                still_wanted=wanted,
            ).trace

        trace = await self.work(go)
        total = time.perf_counter() - start
        savings = self.savings.savings(trace)
        self.metrics.observe_trace(trace)
        self.metrics.observe_savings(trace, savings)
        if self.answer_log is not None:
            self.answer_log.write(_finite(log_entry(trace, savings, model=self.pipeline.model_label)))
        if self.budget is not None and self.controls(method, options):  # the pipeline observed it
            self.metrics.observe_budget(self.budget.budget, self.budget.tau, self.budget.rate())
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
        return trace, timings, savings

    def extension(self, trace: Trace, timings: dict[str, Any], savings: Savings) -> dict[str, Any]:
        """What ragate adds to an answer: the decision, its evidence, its cost and what it saved against always
        retrieving (``savings``: measured, estimated, unknown or n/a; see :mod:`ragate.savings`)."""
        return {
            "method": trace.method,
            "retrieved": trace.retrieved,
            "decision": "retrieve" if trace.retrieved else "skip",
            "gate": {
                "score": trace.gate.score,
                "threshold": trace.gate.threshold,
                "retrieve": trace.gate.retrieve,
                "reason": trace.gate.reason,
            },
            "documents": [_hit(h) for h in trace.documents],
            "model": self.lm.model,
            "index": self.index_name,
            "timings": timings,
            "savings": savings.to_json(),
            **({"budget": self.budget_info()} if self.budget is not None else {}),
        }

    def budget_info(self) -> dict[str, Any]:
        assert self.budget is not None
        return {
            "budget": self.budget.budget,
            "window": self.budget.window,
            "window_rate": self.budget.rate(),
            "next_threshold": self.budget.tau,
            # the last write of the state failed (a full disk): tau lives in memory only until a write succeeds
            **({"state_write_error": self.budget.write_error} if self.budget.write_error else {}),
        }

    async def health(self, *, authorised: bool = True) -> tuple[int, dict[str, Any]]:
        """The service's state. ``/healthz`` needs no key, so without one (where the server has a key) it does
        not say where the model and the index are on disk, nor which LM servers it uses. Over LM servers it gives
        what the balancer believes of each (up or down, since when, why, the next probe), after probing those up
        and those down whose probe is due (docs/service.md, "Fleet health"): 200 while one is up, 503 when none
        is."""
        info = {
            "status": "ok", "version": __version__, "method": self.served.name, "model": self.lm.model,
            "engine": self.lm.engine, "index": self.index_name, "passages": self.passages,
            "in_progress": self.slots.used, "max_concurrency": self.slots.n,
            "capabilities": capability_summary(self.lm),
        }  # fmt: skip
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


def _draft(trace: Trace, spec: MethodSpec) -> dict[str, Any] | None:
    """The draft the gate read, token by token (``draft_tokens``): each token's text, log-probability, the
    runner-up where the backend returned alternatives, and ``u``, what the gate reads in it (its
    :meth:`~ragate.gates.base.Gate.token_uncertainty`; ``1 - p`` for a gate whose score is not made of per-token
    values). None where no gate drafted (no-retrieval, always, dynamic methods, CRAG-lite)."""
    draft = trace.draft
    if draft is None:
        return None
    view = None
    try:
        view = get_gate(spec.gate.kind).token_uncertainty(draft, spec.gate)
    except Exception as err:  # noqa: BLE001 - a user's gate failing here must not fail a made answer
        log.warning("the gate %r could not give its per-token view: %s", spec.gate.kind, err)
    if view is None or len(view.values) != len(draft):
        p = tuple(1.0 - math.exp(lp) for lp in draft.logprobs)
        view = TokenUncertainty("1 - p (this gate scores no single token)", p, 0, 1.0)
    tokens = []
    for i, text in enumerate(draft.tokens):
        token: dict[str, Any] = {"text": text, "logprob": draft.logprobs[i], "u": view.values[i]}
        chosen = draft.token_ids[i] if draft.token_ids else None
        others = [
            t for t in draft.top_logprobs[i]
            if (t.token_id != chosen if chosen is not None and t.token_id is not None else t.token != text)
        ]  # fmt: skip
        if others:
            best = max(others, key=lambda t: t.logprob)
            token["runner_up"] = {"text": best.token, "logprob": best.logprob}
        tokens.append(token)
    divisor = view.scored if view.divisor is None else view.divisor
    return {"measure": view.measure, "scored": view.scored, "divisor": divisor, "scale": view.scale, "tokens": tokens}


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such scores become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# -- error handlers ---------------------------------------------------------------------------------------------
def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        if exc.status >= 500:
            log.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc.message)
        return error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no endpoint {request.method} {request.url.path}; endpoints: {ENDPOINT_LIST}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}; endpoints: {ENDPOINT_LIST}"
        return error_response(exc.status_code, message, dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = []
        for e in exc.errors():
            if e.get("type") == "json_invalid":
                detail = (e.get("ctx") or {}).get("error", "decode error")
                return error_response(400, f"the request body is not valid JSON: {detail}")
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            problems.append(f"{where}: {e.get('msg')}")
        return error_response(422, "invalid request: " + "; ".join(problems))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> Response:  # logged with its traceback by uvicorn
        return error_response(
            500, f"internal server error ({type(exc).__name__}); the server's log has the details"
        )


# -- the app ----------------------------------------------------------------------------------------------------
def load_pipeline(
    settings: ServiceSettings, lm: Backend | None = None, retriever: Retriever | None = None
) -> tuple[Pipeline, str, tuple[Callable[[], None], ...]]:
    """The :class:`Pipeline` ``settings`` describe (model and index loaded once, method and needs checked first),
    its index's name, and what else to close at shutdown. Given ``lm`` and ``retriever`` stay the caller's."""
    get_method(settings.method)
    closers: tuple[Callable[[], None], ...] = ()
    if retriever is not None:
        index, name = None, f"(a given {retriever.kind} retriever)"
    elif settings.milvus_uri:
        from ragate.retrieval.milvus import MilvusRetriever

        retriever = MilvusRetriever.open(settings.milvus_uri, collection=settings.milvus_collection)
        index, name, closers = None, f"milvus:{settings.milvus_uri}#{settings.milvus_collection}", (retriever.close,)
    else:
        from ragate.retrieval.demo import demo_index

        index = settings.index or demo_index()
        name = str(index)
    provider = None
    if settings.trace_file is not None:
        from ragate.tracing import trace_to_file

        provider = trace_to_file(settings.trace_file)
        closers = (*closers, provider.shutdown)
    state = settings.budget_state
    if settings.budget is not None and state is None:
        from ragate.models import ragate_home

        state = str(ragate_home() / "service" / f"budget-{settings.method}.json")
    try:
        pipeline = Pipeline(
            settings.method,
            model=settings.model,
            backend=settings.engine,
            base_url=settings.openai_base_url,
            index=index,
            retriever=retriever,
            calibration=settings.calibration,
            budget=settings.budget,
            window=settings.budget_window,
            budget_gain=settings.budget_gain,
            budget_state=state,
            fallback=settings.fallback,
            skr_labels=settings.skr_labels,
            gate_weights=settings.gate_weights,
            lm=lm,
            backend_options=settings.backend_options,
            early_exit=settings.early_exit,
            prompts=settings.prompts,
            max_question_chars=settings.max_question_chars,
            tracer_provider=provider,
            trace_content=settings.trace_content,
        )
    except BaseException:
        for close in closers:
            close()
        raise
    return pipeline, name, closers


def create_app(
    settings: ServiceSettings, lm: Backend | None = None, retriever: Retriever | None = None
) -> FastAPI:
    """The service for ``settings``. Without ``lm`` and ``retriever`` it loads both (and closes them at shutdown);
    given ones stay the caller's."""
    owned = lm is None and retriever is None
    if not owned and (lm is None or retriever is None):
        raise ValueError("give both lm and retriever, or neither")
    pipeline, index_name, closers = load_pipeline(settings, lm, retriever)
    answer_log = None
    if settings.answer_log is not None:
        try:
            answer_log = AnswerLog(settings.answer_log)
        except BaseException:
            for closer in closers:
                closer()
            if owned:
                pipeline.close()
            raise
        closers = (*closers, answer_log.close)
    metrics = ServiceMetrics.create()
    runtime = Runtime(
        settings=settings,
        pipeline=pipeline,
        index_name=index_name,
        metrics=metrics,
        slots=Slots(settings.max_concurrency, metrics.in_progress.set),
        passages=len(pipeline.retriever),
        owned=owned,
        started=time.time(),
        closers=closers,
        answer_log=answer_log,
    )
    if runtime.budget is not None:
        metrics.observe_budget(runtime.budget.budget, runtime.budget.tau, runtime.budget.rate())

    def close() -> None:  # a request abandoned at its timeout may still be using the model: wait for it
        if runtime.owned:
            runtime.pipeline.close(wait=settings.request_timeout)
        for closer in runtime.closers:  # a Milvus connection, the trace file, the answer log
            closer()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await anyio.to_thread.run_sync(close)

    app = FastAPI(
        title="ragate",
        version=__version__,
        summary="Adaptive retrieval-augmented answers: the model decides when to retrieve.",
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.add_middleware(Guard, settings=settings, metrics=metrics)
    _install_error_handlers(app)
    _routes(app, runtime)
    return app


def _routes(app: FastAPI, rt: Runtime) -> None:
    @app.post("/v1/answer")
    async def answer(body: AnswerRequest) -> Response:
        question = rt.question(body.question)
        trace, timings, savings = await rt.answer(question, body.method, body.options)
        extension = rt.extension(trace, timings, savings)  # also at the top level, where clients before it read it
        if body.draft_tokens:
            extension["draft"] = _draft(trace, rt.spec(body.method, body.options))
        payload = {"answer": trace.answer, "question": question, "usage": openai_api.usage(trace)}
        payload |= {**extension, "ragate": extension, "trace": trace.to_json()}
        return JSONResponse(_finite(payload))

    @app.post("/v1/search")
    async def search(body: SearchRequest) -> Response:
        query = rt.question(body.query)
        if body.k > rt.settings.max_k:
            raise ApiError(400, f"k is {body.k}; this server returns at most {rt.settings.max_k} hits")
        start = time.perf_counter()
        hits = await rt.work(lambda wanted: rt.retriever.search([query], body.k)[0], kind="search")
        payload = {"query": query, "k": body.k, "hits": [_hit(h) for h in hits]}
        return JSONResponse(
            _finite({**payload, "index": rt.index_name, "seconds": time.perf_counter() - start})
        )

    @app.post("/v1/chat/completions")
    async def chat(body: openai_api.ChatCompletionRequest) -> Response:
        if body.n != 1:
            raise ApiError(400, f"n = {body.n}: ragate returns one answer per request (n = 1)")
        try:
            text = body.question()
        except ValueError as err:
            raise ApiError(400, str(err)) from None
        method = body.model if body.model in all_methods() else rt.settings.method
        question = rt.question(text)
        trace, timings, savings = await rt.answer(question, method, AnswerOptions(max_tokens=body.token_limit()))
        extension = _finite(rt.extension(trace, timings, savings))
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            events = openai_api.stream_events(trace, method, extension, include_usage=include_usage)
            return StreamingResponse(
                events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        return JSONResponse(openai_api.completion(trace, method, extension))

    @app.get("/v1/models")
    async def models() -> Response:
        return JSONResponse(openai_api.model_list(list(all_methods()), int(rt.started)))

    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        key = rt.settings.api_key
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        authorised = key is None or (
            scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
        )
        status, info = await rt.health(authorised=authorised)
        return JSONResponse(info, status_code=status)

    @app.get("/metrics")
    async def metrics() -> Response:
        content, media_type = rt.metrics.render()
        return Response(content, media_type=media_type)

    @app.get("/v1/budget")
    async def budget() -> Response:
        if rt.budget is None:
            return JSONResponse(
                {
                    "enabled": False,
                    "message": "this server keeps no retrieval budget: start it with `ragate serve --budget RATE` "
                    "(e.g. 0.3) to hold the share of requests that retrieve",
                }
            )
        return JSONResponse(_finite({"enabled": True, "method": rt.served.name, **rt.budget.snapshot()}))

    install_page(app)


def app_from_env() -> FastAPI:
    """The app for ``$RAGATE_SERVICE_SETTINGS``: the factory each uvicorn worker calls
    (``uvicorn ragate.service.app:app_from_env --factory --workers N``)."""
    return create_app(ServiceSettings.from_env())
