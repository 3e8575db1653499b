"""The HTTP service: one method, one model and one index per process, behind a small guarded API.

``create_app(settings)`` loads the model and the index once (or takes them ready-made) and returns a FastAPI app:

- ``POST /v1/answer``: ``{"question", "method"?, "options"?: {"max_tokens", "threshold", "k"}}`` → the answer,
  whether it retrieved, the gate's score and threshold, the documents read, the trace and timings
- ``POST /v1/search``: ``{"query", "k"?}`` → the index's hits
- ``POST /v1/chat/completions`` and ``GET /v1/models``: OpenAI's API over the pipeline (see ``openai_api``)
- ``GET /healthz`` (never needs the key) and ``GET /metrics`` (Prometheus)
- ``GET /v1/methods``: every method grouped by its paper (or ragate's own gates), with its one-line description
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
from typing import Any

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ragate.answers.savings import AnswerLog
from ragate.backends import Backend
from ragate.errors import RagateError
from ragate.gates.base import TokenUncertainty
from ragate.gates.registry import get_gate
from ragate.methods import MethodSpec, all_methods, get_method
from ragate.methods.trace import Trace
from ragate.pipeline import Pipeline
from ragate.retrieval.types import Retriever
from ragate.service import openai_api
from ragate.service.admission import Slots
from ragate.service.guard import ApiError, Guard, error_response
from ragate.service.metrics import ServiceMetrics
from ragate.service.page import install_page
from ragate.service.runtime import (
    AnswerOptions,
    AnswerRequest,
    FeedbackRequest,
    Runtime,
    SearchRequest,
    _finite,
    _hit,
)
from ragate.service.settings import ServiceSettings
from ragate.version import __version__

log = logging.getLogger("ragate.service")

# Seconds a stopping service waits for a request still using the model (cancelled, it stops at its next model step)
# before it leaves the model and the index to the process's exit: freeing them under a running step could crash it.
CLOSE_WAIT = 2.0

ENDPOINT_LIST = (
    "POST /v1/answer, POST /v1/search, POST /v1/chat/completions, POST /v1/feedback, GET /v1/models, GET /v1/methods, "
    "GET /v1/budget, "
    "GET /healthz, "
    "GET /metrics, GET / (the web page)"
)


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
            state=settings.state,
            fallback=settings.fallback,
            skr_labels=settings.skr_labels,
            gate_weights=settings.gate_weights,
            lm=lm,
            backend_options=settings.backend_options,
            early_exit=settings.early_exit,
            prompts=settings.prompts,
            routes=settings.routes,
            max_question_chars=settings.max_question_chars,
            tracer_provider=provider,
            trace_content=settings.trace_content,
            feedback_store=settings.feedback_store,
            shadow=settings.shadow,
            shadow_share=settings.shadow_share,
        )
    except BaseException:
        for close in closers:
            close()
        raise
    return pipeline, name, closers


def _refit(settings: ServiceSettings, pipeline: Pipeline) -> Any:
    if not settings.refit_every or pipeline.learner.store is None:
        return None
    from ragate.service.refit import Refit

    return Refit(pipeline, settings.refit_every, settings.learned_gate, cascade=settings.refit_cascade)


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
    try:
        refit = _refit(settings, pipeline)  # a route pipeline that cannot learn its policy is refused here
        if settings.answer_log is not None:
            answer_log = AnswerLog(settings.answer_log, required=settings.answer_log_required)
    except BaseException:
        for closer in closers:
            closer()
        if owned:
            pipeline.close()
        raise
    if answer_log is not None:
        closers = (*closers, answer_log.close)
    metrics = ServiceMetrics.create()
    runtime = Runtime(
        settings=settings,
        pipeline=pipeline,
        index_name=index_name,
        metrics=metrics,
        slots=Slots(
            settings.max_concurrency, metrics.in_progress.set, deadline=settings.request_timeout,
            parallel=1 if pipeline.lm.engine != "openai" else None,
        ),
        passages=len(pipeline.retriever),
        owned=owned,
        started=time.time(),
        closers=closers,
        answer_log=answer_log,
        refit=refit,
    )
    if runtime.budget is not None:
        metrics.observe_budget(runtime.budget.budget, runtime.budget.tau, runtime.budget.rate())

    def close() -> None:
        # shadow work stops at once (its queue dropped); a request cancelled at the end of the shutdown's grace stops
        # at its next model step, and the store, the model and the index are closed once it has (the store after
        # CLOSE_WAIT at the latest); a given lm and retriever stay the caller's
        runtime.pipeline.close(wait=CLOSE_WAIT)
        for closer in runtime.closers:  # a Milvus connection, the trace file, the answer log
            closer()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runtime.budget is not None:  # the shared store checked on a timer: /healthz sees an outage unasked
            runtime.budget.watch()
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

    @app.post("/v1/feedback")
    async def feedback(body: FeedbackRequest) -> Response:
        from ragate.learning.store import UnknownAnswer, label_json
        from ragate.state.shared import StoreUnavailable

        if rt.pipeline.learner.store is None:
            raise ApiError(
                409, "this server keeps no feedback: start it with `ragate serve --feedback-store FILE` (or --shadow)"
            )
        try:
            said = await anyio.to_thread.run_sync(
                lambda: rt.pipeline.feedback(body.id, correct=body.correct, reference=body.reference)
            )
        except UnknownAnswer as err:
            raise ApiError(404, str(err)) from None
        except StoreUnavailable as err:  # the store or its disk failed (full, down): not the client's fault
            rt.metrics.observe_side_failure("feedback_store")
            raise ApiError(503, str(err), {"Retry-After": "5"}) from None
        except RagateError as err:
            raise ApiError(400, str(err)) from None
        rt.labelled(len(said.labels))
        try:  # the label is kept: a store that fails now costs the counts, not a retry that labels twice
            counts: dict[str, Any] | None = await anyio.to_thread.run_sync(rt.pipeline.learner.store.counts)
        except RagateError:
            counts = None
        reply: dict[str, Any] = {
            "id": body.id, "labels": [label_json(k, v) for k, v in said.labels], "pending": list(said.pending),
            "counts": counts,
        }  # fmt: skip
        if not said.labels and not said.pending:
            reply["note"] = "no label: give the reference answer, or correct: true/false"
        elif said.pending:
            reply["note"] = "the pending labels come when shadow work has answered the other route (see /healthz)"
        return JSONResponse(reply)

    @app.get("/v1/models")
    async def models() -> Response:
        return JSONResponse(openai_api.model_list(list(all_methods()), int(rt.started)))

    @app.get("/v1/methods")
    async def methods() -> Response:
        from ragate.service.plain import method_menu

        return JSONResponse({"groups": method_menu(all_methods())})

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
        await anyio.to_thread.run_sync(rt.gate_file_problem)  # the gate file's refused versions, counted
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
