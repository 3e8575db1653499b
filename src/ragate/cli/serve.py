"""``ragate serve``: the HTTP service (FastAPI + uvicorn) over one method, one model and one index.

Binds 127.0.0.1 unless told otherwise; a non-loopback ``--host`` without an API key gets a warning. With
``--workers N`` uvicorn runs N processes on one port, each loading the model and the index once
(docs/service.md). The key is best passed as ``$RAGATE_API_KEY`` (a command line is visible to other users).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ragate.backends import ENGINES
from ragate.backends.turns import DEFAULT_SHARE
from ragate.cli.ask import ROUTES_HELP, early_exit_argument, routes_argument, thread_arguments, trace_options
from ragate.cli.options import base_urls
from ragate.errors import RagateError
from ragate.methods.needs import DEFAULT_TEXT_GATE

# Seconds a stopping server (SIGTERM, Ctrl-C) gives the requests in flight to finish; then they are cancelled (and
# stop computing at their next model step). Shadow work is not waited for (ragate.service.app, its shutdown).
GRACE_SECONDS = 3


def settings_from_args(args: argparse.Namespace) -> Any:
    """The :class:`ServiceSettings` for the parsed command line (the API key from the environment if not given)."""
    from ragate.backends.threads import check_threads
    from ragate.service.settings import API_KEY_ENV, ServiceSettings

    engine = args.backend or ("openai" if args.base_url else "llama.cpp")
    if args.base_url and engine != "openai":
        raise RagateError(f"--base-url goes with --backend openai, not --backend {engine}")
    try:
        fallback = args.fallback or (DEFAULT_TEXT_GATE if args.method is None else None)
        return ServiceSettings(
            method=args.method or ServiceSettings.method,
            fallback=fallback,
            openai_logprobs=args.openai_logprobs,
            skr_labels=str(args.skr_labels) if args.skr_labels else None,
            gate_weights=str(args.gate_weights) if args.gate_weights else None,
            calibration=str(args.calibration) if args.calibration else None,
            index=args.index,
            milvus_uri=args.milvus,
            milvus_collection=args.milvus_collection,
            model=args.model,
            engine=engine,
            openai_base_url=base_urls(args.base_url),
            host=args.host,
            port=args.port,
            api_key=args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None),
            workers=args.workers,
            max_body_bytes=args.max_body_bytes,
            max_question_chars=args.max_question_chars,
            max_tokens=args.max_tokens_limit,
            max_concurrency=args.max_concurrency,
            budget=args.budget,
            budget_window=args.window,
            budget_gain=args.budget_gain,
            budget_state=str(args.budget_state) if args.budget_state else None,
            state=args.state,
            request_timeout=args.timeout,
            read_timeout=args.read_timeout,
            backend_timeout=args.openai_timeout,
            max_reply_bytes=args.max_reply_bytes,
            prompt_state_mb=args.prompt_state_mb,
            threads=check_threads(args.threads, "--threads"),
            batch_threads=check_threads(args.batch_threads, "--batch-threads"),
            early_exit=not args.no_early_exit,
            prompts=args.prompts,
            routes=routes_argument(args.routes),
            answer_log=str(args.answer_log) if args.answer_log else None,
            answer_log_required=args.answer_log_required,
            trace_file=str(args.trace) if args.trace else None,
            trace_content=args.trace_content,
            feedback_store=str(args.feedback_store) if args.feedback_store else None,
            shadow=args.shadow,
            shadow_share=args.shadow_share,
            refit_every=args.refit_every,
            learned_gate=str(args.learned_gate) if args.learned_gate else None,
            refit_cascade=args.refit_cascade,
        )
    except ValueError as err:
        raise RagateError(str(err)) from err


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ragate.service.app import create_app
        from ragate.service.deadline import READ_TIMEOUT_ENV, HeaderDeadline
        from ragate.service.settings import API_KEY_ENV, SETTINGS_ENV
    except ImportError as err:
        raise RagateError(
            f"ragate serve needs the service extra: pip install 'ragate[service]' ({err})"
        ) from err
    settings = settings_from_args(args)
    if not settings.loopback and settings.api_key is None:
        print(
            f"ragate: warning: serving on {settings.host} without an API key: anyone who can reach port "
            f"{settings.port} can use the model; set RAGATE_API_KEY or --api-key",
            file=sys.stderr,
        )
    where = f"http://{settings.host}:{settings.port}"
    common: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": args.log_level,
        "server_header": False,
        "timeout_graceful_shutdown": GRACE_SECONDS,
        "http": HeaderDeadline,  # a client gets --read-timeout for its headers too, not forever
    }
    os.environ[READ_TIMEOUT_ENV] = str(settings.read_timeout)  # read by every worker's protocol
    if settings.workers > 1:
        from ragate.methods import get_method
        from ragate.retrieval.demo import demo_index

        get_method(settings.method)  # fail here, not in every worker
        # build the demo index once here, not in every worker at the same time
        if settings.index is None and settings.milvus_uri is None:
            settings = replace(settings, index=str(demo_index()))
        os.environ[SETTINGS_ENV] = settings.to_json()  # read by every worker's app_from_env()
        if settings.api_key is not None:
            os.environ[API_KEY_ENV] = settings.api_key
        print(f"ragate serve: {settings.workers} workers on {where}", file=sys.stderr, flush=True)
        uvicorn.run("ragate.service.app:app_from_env", factory=True, workers=settings.workers, **common)
        return 0
    app = create_app(settings)
    rt = app.state.runtime
    print(
        f"ragate serve: method {rt.served.name}, model {rt.lm.model} ({rt.lm.engine}), index {rt.index_name} "
        f"({rt.passages} passages), auth {'on' if settings.api_key else 'off'}; listening on {where}",
        file=sys.stderr,
        flush=True,
    )
    server = uvicorn.Server(uvicorn.Config(app, **common))
    with _stop_signals(server):
        server.run()
    if not server.started:
        return 3  # uvicorn's own status for a server that could not start (a port in use; its log says why)
    _leave_cancelled_requests()
    return 0


@contextlib.contextmanager
def _stop_signals(server: Any) -> Iterator[None]:
    """SIGTERM and SIGINT (Ctrl-C) stop ``server`` gracefully, and the stop exits 0. uvicorn shuts down on either,
    then sends the signal again to the handler it found, which (Python's own) would end a clean stop by the signal
    (status -15, or 130 for Ctrl-C). The handler it finds is the server's: before uvicorn installs its own it stops
    the server, after the shutdown it does nothing more."""
    signals = (signal.SIGTERM, signal.SIGINT)
    before = {sig: signal.signal(sig, server.handle_exit) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _leave_cancelled_requests(wait: float = 0.5) -> None:
    """End the process now where a request cancelled by the shutdown is still inside a model step. Nobody reads
    its answer, but Python would wait for its thread (a worker thread, not a daemon) until the step ends, which on
    a busy CPU can take many seconds; the service has closed what it opened (the feedback store, the answer log)."""
    me = threading.current_thread()
    deadline = time.monotonic() + wait
    for thread in threading.enumerate():
        if thread is not me and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    busy = [t for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]
    if busy:
        print(
            f"ragate serve: stopped without waiting for {len(busy)} worker thread(s) still in a cancelled request's "
            "model step",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(0)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from ragate.service.settings import ServiceSettings

    d = ServiceSettings()
    p = subparsers.add_parser(
        "serve",
        help="serve answers, search and an OpenAI-compatible chat endpoint over HTTP, and a page at /",
        description="Serve one adaptive-retrieval method over HTTP: POST /v1/answer, POST /v1/search, "
        "POST /v1/chat/completions (OpenAI format), GET /v1/budget, GET /healthz, GET /metrics, and a web page "
        "at / to look at each decision. See docs/service.md.",
    )
    p.add_argument(
        "--method",
        default=None,
        help=f"the default method (default {d.method}; where the backend cannot serve its gate, e.g. an API "
        f"without logprobs, the {DEFAULT_TEXT_GATE} gate decides instead and /healthz says so)",
    )
    p.add_argument(
        "--fallback",
        default=None,
        metavar="GATE",
        help="the gate to serve where the backend cannot serve the method's own (no logprobs, too few top-k); "
        "without it an explicit --method the backend cannot serve is an error",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--index", default=None, help="index directory (default: the demo index)")
    where.add_argument("--milvus", default=None, metavar="URI", help="serve a Milvus collection instead")
    p.add_argument("--milvus-collection", default=d.milvus_collection, help="with --milvus (default ragate)")
    p.add_argument("--model", default=None, help="model name, GGUF file or directory (default smollm2-135m)")
    p.add_argument("--backend", default=None, choices=list(ENGINES), help="engine (default llama.cpp)")
    p.add_argument(
        "--base-url",
        "--openai-base-url",
        dest="base_url",
        action="append",
        default=[],
        help="run the LM on an OpenAI-compatible server (implies --backend openai; --openai-base-url is the old "
        "name); repeat it to spread the calls over a fleet of servers of one model",
    )
    p.add_argument(
        "--openai-timeout",
        type=float,
        default=d.backend_timeout,
        help="seconds per LM server call, connect, headers and body together; a server slower than this fails "
        f"the call over to another server of the fleet (default {d.backend_timeout:g})",
    )
    p.add_argument(
        "--max-reply-bytes",
        type=int,
        default=d.max_reply_bytes,
        metavar="BYTES",
        help="the longest reply read from an LM server; a longer one is cut off and fails over like a server "
        f"error (default {d.max_reply_bytes} = {d.max_reply_bytes // 2**20} MiB, ~10,000 tokens with top-20 "
        "logprobs)",
    )
    p.add_argument(
        "--prompts",
        default=None,
        metavar="SET",
        help="another prompt set for the served method (dtr, pairs, targ-question-first, targ)",
    )
    p.add_argument("--routes", default=None, metavar="M1,M2,...", help=ROUTES_HELP)
    p.add_argument(
        "--prompt-state-mb",
        type=int,
        default=d.prompt_state_mb,
        metavar="MB",
        help="llama.cpp: memory for the kept prompt states a new prompt starts from (the gate's draft for the "
        f"reading prompt, a dynamic method's exemplars); 0 keeps none (default {d.prompt_state_mb})",
    )
    thread_arguments(p)
    early_exit_argument(p)
    p.add_argument(
        "--openai-logprobs",
        choices=("auto", "on", "off"),
        default=d.openai_logprobs,
        help="what the LM server returns: auto asks it once at start (default), on trusts top-20, off is text only",
    )
    p.add_argument(
        "--skr-labels",
        default=None,
        metavar="FILE",
        help="with --method skr: the label set of training questions it votes with (`ragate skr fit`)",
    )
    p.add_argument(
        "--gate-weights",
        default=None,
        metavar="FILE",
        help="with --method no-model-lr: the trained gate's weights (`ragate gate fit`)",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="FILE",
        help="the served method's threshold from `ragate calibrate` (same method and model); with --budget it is "
        "only the starting point",
    )
    p.add_argument("--host", default=d.host, help=f"address to bind (default {d.host}: this machine only)")
    p.add_argument("--port", type=int, default=d.port, help=f"port (default {d.port})")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (default: $RAGATE_API_KEY, else none)",
    )
    p.add_argument(
        "--workers", type=int, default=1, help="uvicorn worker processes on the one port (default 1)"
    )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=d.max_concurrency,
        help=f"requests answered at once per worker; more get 429 (default {d.max_concurrency})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=d.request_timeout,
        help=f"seconds per request, queueing included; a slower one gets 504 (default {d.request_timeout:g}: DTR with "
        "the 1.5B model on 2 CPU cores takes up to ~120 s)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="keep the share of requests that retrieve at this rate, e.g. 0.3: the served method's threshold "
        "follows the quantile of its last --window gate scores; with --method route and a learned policy's "
        "--calibration, mean retrievals per question, e.g. 0.8 (docs/service.md)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=d.budget_window,
        help=f"requests the budget's rate and threshold are taken over (default {d.budget_window}, at least 10)",
    )
    p.add_argument(
        "--budget-gain",
        type=float,
        default=d.budget_gain,
        help="feedback of the windowed rate error on the threshold's quantile level (default 16; a learned route "
        "policy's budget: 2, on its mean retrievals; "
        "0: the plain windowed quantile)",
    )
    p.add_argument(
        "--budget-state",
        type=Path,
        default=None,
        help="where the budget keeps its window and threshold across restarts "
        "(default RAGATE_HOME/service/budget-METHOD.json)",
    )
    p.add_argument(
        "--state",
        default=None,
        metavar="URL",
        help="redis://[USER:PASSWORD@]HOST:PORT/DB[?timeout=SECONDS] (Valkey or Redis; rediss:// over TLS; not "
        "cluster mode): the budget window that replicas behind one load balancer share, so that they hold one "
        "retrieval rate; without it each replica keeps its own (docs/deployment.md)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=d.read_timeout,
        help=f"seconds a client may take to send its request body; slower gets 408 (default {d.read_timeout:g})",
    )
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body")
    p.add_argument("--max-question-chars", type=int, default=d.max_question_chars, help="longest question")
    p.add_argument(
        "--max-tokens-limit",
        type=int,
        default=d.max_tokens,
        help="largest options.max_tokens a request may ask",
    )
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument(
        "--answer-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="append each answer's decision, cost and savings against always retrieving to FILE (JSON lines, no "
        "question text); `ragate report FILE` adds them up. Best effort: a line that cannot be written (a full "
        "disk) is counted in /metrics and reported in /healthz, and the answer still goes out",
    )
    p.add_argument(
        "--answer-log-required",
        action="store_true",
        help="with --answer-log: an audit trail; an answer whose line cannot be written is a 503, not returned",
    )
    p.add_argument(
        "--feedback-store", default=None, metavar="FILE|URL",
        help="keep each answer's features (question signals, draft scores, the model's hidden state) and its labels "
        "in this SQLite file, or in redis://HOST:PORT/DB to share them among replicas; answers then carry an id "
        "that POST /v1/feedback names (default with --shadow: RAGATE_HOME/feedback.db)",
    )  # fmt: skip
    p.add_argument(
        "--shadow", type=float, default=0.0, metavar="SHARE",
        help="for this share of answers (e.g. 0.05) run the path the gate did not take after the response, in the "
        "background, and label the question by whether retrieval changed the answer (default 0: off)",
    )  # fmt: skip
    p.add_argument(
        "--shadow-share", type=float, default=DEFAULT_SHARE, metavar="SHARE",
        help="the part of a local model's time shadow work takes while requests wait (it takes all of it when none "
        "do, and a request waits for it one model step at most; default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--refit-every", type=int, default=0, metavar="N",
        help="learn the gate again after every N new labels and put it in force where it ranks them at least as "
        "well as the gate in force (with --method route over a closed-book and a one-retrieval route: the learned "
        "route policy, for --budget or the --calibration file's; 0: never; default)",
    )  # fmt: skip
    p.add_argument(
        "--refit-cascade", type=float, default=None, metavar="SHARE",
        help="with --refit-every: learn a cascade that drafts for this share of questions (default: the cheap gate "
        "alone)",
    )  # fmt: skip
    p.add_argument(
        "--learned-gate", type=Path, default=None, metavar="FILE",
        help="where --refit-every writes the learned gate, or with --method route the learned route policy "
        "(default: beside the feedback store)",
    )  # fmt: skip
    trace_options(p)
    p.set_defaults(run=run)


__all__ = ["register", "run", "settings_from_args"]
