"""``ragate ask``: answer one question and show how sure the model was of every token.

Without ``--method`` it answers closed-book and shows every token's scores; with ``--method NAME`` it runs that
adaptive-retrieval method against ``--index`` (default: the demo index) and shows the gate's decision, the
documents read and the cost of every stage. The closed-book prompt is DTR's direct-answer prompt
(Appendix D, Figure 11), sent through the model's chat template.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ragate.backends import ENGINES, load_backend
from ragate.errors import RagateError
from ragate.methods.needs import capability_summary
from ragate.methods.trace import Trace
from ragate.types import Generation, GenerationRequest, Message
from ragate.uncertainty import (
    DEFAULT_MARGIN_BETA,
    margin_uncertainty,
    mean_entropy,
    mean_margin_uncertainty,
    normalised_nll,
)

CLOSED_BOOK_MAX_TOKENS = 32
CLOSED_BOOK_PROMPT = "{question}\nAnswer the question using a single word or phrase."  # DTR Fig. 11


@dataclass(frozen=True)
class AskResult:
    """One answered question with the generation behind it."""

    question: str
    generation: Generation
    model: str
    engine: str
    capabilities: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        gen = self.generation
        entropies, exact = gen.step_entropies()
        gaps = _gaps(gen)
        tokens = [
            {
                "token": tok,
                "token_id": gen.token_ids[i] if gen.token_ids else None,
                "offset": list(gen.offsets[i]),
                "logprob": gen.logprobs[i],
                "entropy": entropies[i],
                "margin": gaps[i],
                "top_logprobs": [
                    {"token": t.token, "token_id": t.token_id, "logprob": t.logprob} for t in top
                ],
            }
            for i, (tok, top) in enumerate(zip(gen.tokens, gen.top_logprobs, strict=True))
        ]
        return {
            "question": self.question,
            "answer": gen.text.strip(),
            "model": self.model,
            "backend": self.engine,
            "finish_reason": gen.finish_reason,
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens,
            "seconds": round(gen.seconds, 4),
            "entropy": "exact" if exact else ("top-k approximation (lower bound)" if len(gen) else None),
            "uncertainty": summary(gen),
            "tokens": tokens,
            "capabilities": self.capabilities,
        }


def summary(gen: Generation) -> dict[str, float | None]:
    """Whole-answer scores: DTR's u (Eq. 3), TARG's U_ent (Eq. 1) and U_mar with beta=3 (Eq. 2)."""
    if len(gen) == 0:
        return {"normalised_nll": None, "mean_entropy": None, "mean_margin_uncertainty": None}
    entropies, _ = gen.step_entropies()
    gaps = [g for g in _gaps(gen) if g is not None]
    return {
        "normalised_nll": normalised_nll(gen.logprobs),
        "mean_entropy": mean_entropy(entropies),
        "mean_margin_uncertainty": mean_margin_uncertainty(gaps) if gaps else None,
    }


def ask(
    question: str, *, model: str | None, engine: str, max_tokens: int, top_k: int, **options: Any
) -> AskResult:
    from ragate.answers.answer import check_question

    question = check_question(question)
    try:
        request = GenerationRequest(
            prompt=(Message("user", CLOSED_BOOK_PROMPT.format(question=question)),),
            max_tokens=max_tokens,
            top_logprobs=top_k,
        )
    except ValueError as err:
        raise RagateError(str(err)) from err
    with load_backend(model, engine, **options) as backend:
        request = replace(request, top_logprobs=min(top_k, backend.capabilities.top_k))
        [gen] = backend.generate([request])
        return AskResult(question, gen, backend.model, backend.engine, capability_summary(backend))


def render(result: AskResult) -> str:
    """A human-readable answer followed by one line per token: logprob, probability, entropy, margin."""
    gen = result.generation
    scores = summary(gen)
    entropies, exact = gen.step_entropies()
    gaps = _gaps(gen)
    lines = [
        f"Q: {result.question}",
        f"A: {gen.text.strip() or '(empty answer)'}",
        "",
        (
            f"model {result.model} on {result.engine}: {gen.completion_tokens} tokens in {gen.seconds:.2f} s "
            f"(finish: {gen.finish_reason})"
        ),
        "uncertainty: "
        + ", ".join(
            f"{label} {_fmt(scores[key])}"
            for label, key in (
                ("DTR normalised NLL u", "normalised_nll"),
                ("mean entropy", "mean_entropy"),
                (f"TARG margin U (beta={DEFAULT_MARGIN_BETA:g})", "mean_margin_uncertainty"),
            )
        ),
        "",
        (
            f"{'#':>3}  {'token':<16} {'logprob':>8} {'prob':>6} {'entropy':>8} {'margin':>7} {'exp(-g/3)':>9}  "
            "runner-up"
        ),
    ]
    if not exact:
        lines[-1] += "   (entropy: top-k approximation)"
    for i, tok in enumerate(gen.tokens):
        top = gen.top_logprobs[i]
        runner = next((t for t in top if t.token != tok), None)
        gap = gaps[i]
        lines.append(
            f"{i + 1:>3}  {tok!r:<16} {gen.logprobs[i]:>8.3f} {math.exp(gen.logprobs[i]):>6.3f} "
            f"{entropies[i]:>8.3f} {_fmt(gap, 7, 2)} {_fmt(None if gap is None else margin_uncertainty(gap), 9, 3)}  "
            + (f"{runner.token!r} {runner.logprob:.2f}" if runner else "")
        )
    return "\n".join(lines)


def _gaps(gen: Generation) -> list[float | None]:
    return [gen.top1_top2_gaps[i] if len(top) >= 2 else None for i, top in enumerate(gen.top_logprobs)]


def _fmt(value: float | None, width: int = 0, digits: int = 3) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def ask_with_method(
    question: str,
    method: str,
    *,
    index: str | None,
    model: str | None,
    engine: str,
    threshold: float | None,
    gate: str | None = None,
    selector: str | None = None,
    fallback: str | None = None,
    skr_labels: str | None = None,
    gate_weights: str | None = None,
    proxy_model: str | None = None,
    calibration: str | None = None,
    max_tokens: int | None = None,
    cross_encoder: str | None = None,
    prompts: str | None = None,
    routes: tuple[str, ...] | None = None,
    progress: Any = None,
    tracer_provider: Any = None,
    trace_content: bool | None = None,
    threads: int | str | None = None,
    batch_threads: int | str | None = None,
    early_exit: bool = True,
    **options: Any,
) -> tuple[Trace, dict[str, Any]]:
    """Run a named method on one question through :class:`ragate.Pipeline` against ``index`` (default: the demo
    index); returns the trace and the backend's capabilities. ``fallback`` names the gate to run where the backend
    cannot serve the method's own (``ragate.methods.needs.require``)."""
    from ragate.answers.answer import check_question
    from ragate.pipeline import Pipeline

    question = check_question(question)
    with Pipeline(
        method,
        model=model,
        backend=engine,
        index=index,
        threshold=threshold,
        calibration=calibration,
        gate=gate,
        selector=selector,
        fallback=fallback,
        skr_labels=skr_labels,
        gate_weights=gate_weights,
        proxy_model=proxy_model,
        max_tokens=max_tokens,
        cross_encoder=cross_encoder,
        prompts=prompts,
        routes=routes,
        backend_options=options,
        tracer_provider=tracer_provider,
        trace_content=trace_content,
        threads=threads,
        batch_threads=batch_threads,
        early_exit=early_exit,
    ) as rag:
        answer = rag.answer(question, progress=progress)
        return answer.trace, capability_summary(rag.lm)


def render_trace(trace: Trace) -> str:
    """The answer, the gate's decision and why, the documents read, and the cost of every stage."""
    gate = trace.gate
    verdict = "retrieved" if trace.retrieved else "answered without retrieval"
    lines = [
        f"Q: {trace.question}",
        f"A: {trace.answer or '(empty answer)'}",
        "",
        f"method {trace.method}: {verdict} (score {gate.score:.4g}, threshold {gate.threshold:g}): {gate.reason}",
    ]
    if trace.dynamic is not None:
        info = trace.dynamic
        lines.append(
            f"generated {info.generated_tokens} tokens ({info.discarded_tokens} cut away); output: {info.output}"
        )
        for e in info.retrievals:
            lines.append(
                f"  retrieval at answer token {e.at_token} ({e.query_form} query {e.query!r}): {e.reason}"
            )
    if trace.documents:
        lines.append("documents read:")
        lines += [
            f"  {h.rank}. [{h.id}] {h.passage.title} (score {h.score:.3f})"
            + (f"  from {h.passage.source}" if h.passage.source else "")
            for h in trace.documents
        ]
    lines.append(f"time {trace.seconds:.2f} s, {trace.lm_calls} LM calls, {trace.tokens} tokens:")
    for s in trace.stages:
        tokens = (
            f"{s.prompt_tokens:>5} prompt + {s.completion_tokens:>4} generated tokens"
            if s.prompt_tokens
            else ""
        )
        lines.append(f"  {s.name:<15} {s.seconds:6.2f} s  {tokens}" + ("  (overhead)" if s.overhead else ""))
    return "\n".join(lines)


class StageLine:
    """``ragate ask``'s status on stderr while it works: the stage running and the seconds so far (one line,
    rewritten in place on a terminal; a line per stage otherwise)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.tty = enabled, sys.stderr.isatty()
        self.start = time.perf_counter()

    def __call__(self, stage: str) -> None:
        if not self.enabled:
            return
        text = f"ragate: {stage} ... ({time.perf_counter() - self.start:.0f} s)"
        sys.stderr.write(f"\r\033[K{text}" if self.tty else f"{text}\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {}
    if args.backend == "openai":
        if not args.base_url:
            raise RagateError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        options["base_url"] = args.base_url
        options["logprobs"] = args.openai_logprobs
    elif args.base_url:
        raise RagateError("--base-url goes with --backend openai")
    elif args.openai_logprobs != "auto":
        raise RagateError("--openai-logprobs goes with --backend openai")
    if args.fallback and not args.method:
        raise RagateError("--fallback goes with --method (the gate to run where the backend cannot serve it)")
    if args.prompts and not args.method:
        raise RagateError("--prompts goes with --method (the method whose prompt set it replaces)")
    if args.calibration and not args.method:
        raise RagateError("--calibration goes with --method (the method whose threshold it sets)")
    if args.gate_weights and not args.method:
        raise RagateError(
            "--gate-weights goes with --method no-model-lr or learned (the trained gates that read them)"
        )
    if args.max_tokens is not None and args.max_tokens < 1:
        raise RagateError(f"max_tokens must be >= 1, got {args.max_tokens}")
    if args.no_early_exit and not args.method:
        raise RagateError("--no-early-exit goes with --method (a gate's draft; closed-book has none)")
    if (args.trace or args.trace_content) and not args.method:
        raise RagateError("--trace and --trace-content go with --method (the spans are the gate's and the answer's)")
    if args.method:
        from ragate.answers.answer import Answer, check_question
        from ragate.methods import get_method
        from ragate.methods.configure import configure_method

        check_question(args.question)  # every mistake in the command is named before anything is printed
        spec = configure_method(
            get_method(args.method),
            args.gate,
            args.selector,
            args.skr_labels,
            args.max_tokens,
            None,
            cross_encoder=args.cross_encoder,
            prompts=args.prompts,
            gate_weights=args.gate_weights,
            proxy_model=args.proxy_model,
            routes=routes_argument(args.routes),
        )
        status = StageLine(not args.quiet)
        if args.index is None and spec.retrieves:
            print(
                "ragate: no --index given: reading the demo index (a Wikipedia sample); "
                "pass --index DIR for your own (ragate index build --docs ...)",
                file=sys.stderr,
            )
        status("loading the model and the index")
        provider = None
        if args.trace:
            from ragate.tracing import trace_to_file

            provider = trace_to_file(args.trace)
        try:
            trace, capabilities = ask_with_method(
                args.question,
                args.method,
                index=args.index,
                model=args.model,
                engine=args.backend,
                threshold=args.threshold,
                gate=args.gate,
                selector=args.selector,
                fallback=args.fallback,
                skr_labels=args.skr_labels,
                gate_weights=args.gate_weights,
                proxy_model=args.proxy_model,
                calibration=args.calibration,
                max_tokens=args.max_tokens,
                cross_encoder=args.cross_encoder,
                prompts=args.prompts,
                routes=routes_argument(args.routes),
                progress=status,
                tracer_provider=provider,
                trace_content=args.trace_content or None,
                threads=args.threads,
                batch_threads=args.batch_threads,
                early_exit=not args.no_early_exit,
                **options,
            )
        finally:
            status.done()
            if provider is not None:
                provider.shutdown()
        out = {**Answer.of(trace).to_json(), "capabilities": capabilities}  # documents with text and source
        if args.json:
            from ragate.fileio import finite_json

            out, replaced = finite_json(out)
            if replaced:  # strict JSON: a gate score of +inf is null, and said so
                out["notes"] = [f"{replaced} non-finite number(s) (NaN or infinity) written as null"]
            print(json.dumps(out, ensure_ascii=False, allow_nan=False))
        else:
            print(render_trace(trace))
        return 0
    if args.index:
        raise RagateError(
            "--index goes with --method (e.g. --method dtr); without a method ragate ask is closed-book"
        )
    from ragate.backends.threads import thread_options

    options |= thread_options(args.backend, args.threads, args.batch_threads)
    result = ask(
        args.question,
        model=args.model,
        engine=args.backend,
        max_tokens=CLOSED_BOOK_MAX_TOKENS if args.max_tokens is None else args.max_tokens,
        top_k=args.top_k,
        **options,
    )
    if args.json:
        json.dump(result.to_json(), sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(render(result))
    return 0


def trace_options(p: argparse.ArgumentParser) -> None:
    """``--trace FILE`` and ``--trace-content``: OpenTelemetry spans of every answer (``ragate ask``, ``serve``)."""
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="append OpenTelemetry spans of every answer (gate, retrieval, generations) to FILE as JSON lines "
        "(needs ragate[trace]); without it the spans go to the application's tracer provider, if any",
    )
    p.add_argument(
        "--trace-content",
        action="store_true",
        help="spans carry the question, the answer and the documents' text (default: ids, scores and counts only)",
    )


def thread_arguments(p: argparse.ArgumentParser) -> None:
    """``--threads`` and ``--batch-threads``: a local engine's threads (``ragate ask``, ``eval``, ``sweep``,
    ``serve``)."""
    p.add_argument(
        "--threads",
        default="auto",
        metavar="N|auto",
        help="a local engine's threads for generating: auto (default) uses the CPUs this process may run on that "
        "other processes leave free, looked at again as it runs; N fixes them (llama.cpp; torch's for transformers)",
    )
    p.add_argument(
        "--batch-threads",
        default=None,
        metavar="N|auto",
        help="llama.cpp's threads for evaluating prompts (default: as --threads)",
    )


def early_exit_argument(p: argparse.ArgumentParser) -> None:
    """``--no-early-exit``: every gate's draft decoded whole (``ragate ask``, ``eval``, ``serve``)."""
    p.add_argument(
        "--no-early-exit",
        action="store_true",
        help="decode every gate draft whole: by default TARG's entropy and margin gates stop their draft once "
        "the decision 'retrieve' is settled (same decisions and answers; the score is then a lower bound)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "ask",
        help="answer a question and show per-token uncertainty",
        description="Answer a question closed-book with the default (or given) model and show, for every "
        "token, its log-probability, entropy and top-1/top-2 margin.",
    )
    parser.add_argument("question", help="the question, in quotes")
    parser.add_argument(
        "--model",
        default=None,
        help="model name (see `ragate models list`), GGUF file or model directory; default: smollm2-135m",
    )
    parser.add_argument(
        "--backend", default="llama.cpp", choices=list(ENGINES), help="engine (default llama.cpp)"
    )
    parser.add_argument(
        "--base-url",
        "--openai-base-url",
        dest="base_url",
        default=None,
        help="base URL of an OpenAI-compatible server (with --backend openai; --openai-base-url is the old name)",
    )
    parser.add_argument(
        "--openai-logprobs",
        choices=("auto", "on", "off"),
        default="auto",
        help="what the server returns: auto asks it once (default), on trusts top-20, off sends no logprobs "
        "request (text-only gates only)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"longest answer in tokens: closed-book (default {CLOSED_BOOK_MAX_TOKENS}); with --method every answer "
        "stage (the draft kept as the answer, the reader, a dynamic loop's answer; default the method's own: 64, "
        "100 for dynamic methods). Gate drafts (TARG's 20-token prefix) and pseudo-contexts keep their lengths",
    )
    parser.add_argument("--top-k", type=int, default=5, help="alternatives shown per token (default 5)")
    parser.add_argument(
        "--method",
        default=None,
        help="decide whether to retrieve with a named method (dtr, pairs, targ-margin, ...; see docs/methods.md); "
        "without it: closed-book with per-token scores",
    )
    parser.add_argument(
        "--index",
        default=None,
        help="index directory for --method (`ragate index build`); without it the demo index (a Wikipedia "
        "sample that ships with ragate, built on first use) is read, and ragate says so on stderr",
    )
    parser.add_argument(
        "--gate", default=None, help="replace the method's gate (e.g. targ-margin, ugt, pairs)"
    )
    parser.add_argument(
        "--selector", default=None, help="replace the method's selector (e.g. hyde, dpr-ais, q2d)"
    )
    parser.add_argument(
        "--threshold", type=float, default=None, help="the gate's threshold (default: the paper's)"
    )
    parser.add_argument(
        "--fallback",
        default=None,
        metavar="GATE",
        help="with --method: where the backend cannot serve the method's gate (no logprobs, too few top-k), run "
        "this gate instead (e.g. verbal-confidence, pairs); the method is then named NAME:fallback=GATE",
    )
    parser.add_argument(
        "--skr-labels",
        default=None,
        metavar="FILE",
        help="with --method skr: the label set of training questions it votes with (`ragate skr fit`)",
    )
    parser.add_argument(
        "--gate-weights",
        default=None,
        metavar="FILE",
        help="with --method no-model-lr or learned: the file the trained gate reads (`ragate gate fit`, "
        "`ragate gate learn`)",
    )
    parser.add_argument(
        "--proxy-model",
        default=None,
        metavar="MODEL",
        help="with --method proxy-margin or proxy-entropy: the small local model whose draft decides (a name or "
        "GGUF path; default SmolLM2-135M)",
    )
    parser.add_argument(
        "--cross-encoder",
        default=None,
        metavar="DIR",
        help="with --method dpr-ais-rerank or rerank: a sentence-transformers CrossEncoder folder (PAIRS Eq. 7's K)",
    )
    parser.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="with --method: the threshold from `ragate calibrate` (same method and model)",
    )
    parser.add_argument(
        "--prompts",
        default=None,
        metavar="SET",
        help="with --method: another prompt set for it (dtr, pairs, targ-question-first, targ: TARG's reader with the "
        "documents first); benchmarks/prompt_layouts.py prints how much of each gate's prompt the reader reuses",
    )
    parser.add_argument("--routes", default=None, metavar="M1,M2,...", help=ROUTES_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--quiet", action="store_true", help="no status line on stderr while it works")
    thread_arguments(parser)
    early_exit_argument(parser)
    trace_options(parser)
    parser.set_defaults(run=run)


ROUTES_HELP = (
    "with --method route: the methods it routes between, cheapest first (default wo-rag,single-rag,ircot; or "
    "no-retrieval,standard-rag,... for single-shot routes); see docs/methods.md, Routes"
)


def routes_argument(text: str | None) -> tuple[str, ...] | None:
    """``--routes a,b,c`` as the routes' names (None: not given); the route method checks them."""
    if text is None:
        return None
    return tuple(name.strip() for name in text.split(",") if name.strip())
