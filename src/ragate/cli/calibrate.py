"""``ragate calibrate``: a gate's threshold for a retrieval budget (from questions, a dev set or a sweep), by dev
EM, or with TARG's prefix length chosen alongside it (``--prefixes``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ragate.cli.ask import thread_arguments
from ragate.cli.options import (
    BACKEND_CHOICES,
    base_urls,
    check_concurrency,
    check_engine_args,
    concurrency_option,
    engine_options,
    server_request_options,
)
from ragate.errors import RagateError


def register(subparsers: Any) -> None:
    cal = subparsers.add_parser(
        "calibrate",
        help="a gate threshold for a retrieval budget, from questions alone (no answers needed), a sweep, or dev EM",
        description="Set a gate's threshold tau. With --budget RHO, tau = F^-1(1 - RHO) over the gate's scores of "
        "the given questions (TARG 3.3): --questions FILE (one question a line, or JSONL; answers not needed), "
        "--dev DATASET, or --from-sweep RUN_DIR (scores a sweep already computed: no model call). --confidence "
        "bounds the rate on new questions like these. --objective em picks the tau of the best dev EM instead. "
        "The file it saves goes to ragate ask/eval/serve --calibration and Pipeline(calibration=). With --gate "
        "route, --from-sweep takes an eval run that answered every question with every route (--routes), --budget "
        "is mean retrievals per question, and the file holds one NLL stop threshold per stage of the cascade "
        "(for ragate ask/serve --method route).",
    )
    cal.add_argument("--gate", required=True, help="a gate method, e.g. targ-margin, dtr, targ-entropy")
    cal.add_argument(
        "--budget",
        type=float,
        help="target retrieval rate in [0, 1]; with --gate route, mean retrievals per question (e.g. 0.8)",
    )
    cal.add_argument(
        "--routes",
        default=None,
        metavar="M1,M2,...",
        help="with --gate route: the routes, cheapest first, as the run answered them (default "
        "wo-rag,single-rag,ircot); the file sets one NLL stop threshold per route but the last",
    )
    cal.add_argument(
        "--policy",
        choices=("cascade", "calibrated", "adaptive-rag", "learned"),
        default=None,
        help="with --gate route: the cascade's stop thresholds (default), the cascade whose checks a fit per stage "
        "combines (calibrated), Adaptive-RAG's question classifier (no "
        "--budget), or the learned policy (P(right) per route - lambda * retrievals, lambda for --budget)",
    )
    cal.add_argument(
        "--evidence",
        action="store_true",
        help="with --gate route: tune and serve the cascade with the evidence check (an answer written from "
        "documents stops only where they hold it; needs records that say so)",
    )
    cal.add_argument(
        "--no-agree",
        dest="agree",
        action="store_false",
        help="with --gate route: tune and serve the cascade without the agreement check",
    )
    cal.add_argument(
        "--with",
        dest="with_runs",
        action="append",
        type=Path,
        default=[],
        metavar="RUN_DIR",
        help="with --gate route: more eval runs of the same model whose records add routes or questions",
    )
    cal.add_argument(
        "--confidence",
        type=float,
        default=None,
        help="keep the rate on new questions at most --budget with this probability, e.g. 0.95 (an exact "
        "order-statistic bound; default: the plain quantile, which overshoots about half the time)",
    )
    cal.add_argument(
        "--batch",
        type=int,
        default=None,
        help="with --confidence: bound the realised rate of every M new questions (a test set, a day of "
        "traffic), not only the rate of their distribution; picks a higher tau",
    )
    cal.add_argument("--objective", choices=("budget", "em"), default="budget")
    source = cal.add_mutually_exclusive_group(required=True)
    source.add_argument("--dev", help="dev dataset name or JSONL path (questions with answers)")
    source.add_argument(
        "--questions",
        type=Path,
        help='your own questions, without answers: a text file (one a line) or JSONL with "question"',
    )
    source.add_argument(
        "--from-sweep",
        type=Path,
        metavar="RUN_DIR",
        help="a `ragate sweep` directory that scored this gate: its scores, no model call (with --gate route: "
        "a `ragate eval` run of every route over the same questions)",
    )
    source.add_argument(
        "--from-store",
        metavar="STORE",
        help="with --gate route --policy learned: a feedback store's route answers whose closed-book and "
        "one-retrieval paths are both labelled (a SQLite file or redis:// URL; ragate.learning.route_traffic)",
    )
    cal.add_argument(
        "--check",
        type=Path,
        default=None,
        metavar="FILE",
        help="other questions (same forms as --questions): score them and print the rate tau gives there",
    )
    cal.add_argument(
        "--limit", type=int, default=200, help="dev questions to score (default 200; --dev only)"
    )
    cal.add_argument("--model", default=None)
    cal.add_argument("--backend", dest="engine", choices=BACKEND_CHOICES, default="llama.cpp")
    cal.add_argument(
        "--base-url",
        "--openai-base-url",
        dest="base_url",
        action="append",
        default=[],
        help="an OpenAI-compatible server's /v1 URL (with --backend openai); repeat it for a fleet of servers "
        "of one model",
    )
    concurrency_option(cal)
    server_request_options(cal)
    cal.add_argument(
        "--index", default=None, help="index directory (gates that embed or search, and --objective em)"
    )
    cal.add_argument(
        "--gate-weights",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --gate no-model-lr or learned: the file it reads (`ragate gate fit`, `ragate gate learn`)",
    )
    cal.add_argument(
        "--prefixes",
        default=None,
        metavar="K,K,...",
        help="with --gate targ-margin or targ-entropy and --budget: choose TARG's prefix length k and tau together "
        "(A.8): tau_k for the budget at each k (5, 10, 20), the k of the best dev EM (ties to the shorter draft); "
        "saves the chosen gate's calibration (e.g. targ-margin@k=10) with every k's row and its agreement with "
        "k = 20 (--dev or --from-sweep)",
    )
    cal.add_argument(
        "--metric",
        choices=("em", "f1", "acc"),
        default="em",
        help="with --prefixes: the dev accuracy that chooses k (acc where answers come in sentences and EM is 0)",
    )
    thread_arguments(cal)
    engine_options(cal)
    cal.add_argument("--seed", type=int, default=0)
    cal.add_argument("--out", type=Path, default=None, help="where to save the calibration JSON")
    cal.add_argument("--quiet", action="store_true")
    cal.set_defaults(run=_run_calibrate)


def _run_calibrate(args: argparse.Namespace) -> int:
    if args.gate == "route":
        return _calibrate_routes(args)
    if args.routes is not None or args.with_runs or args.policy is not None or args.evidence or not args.agree \
            or args.from_store is not None:  # fmt: skip
        raise RagateError(
            "--routes, --policy, --with, --evidence, --no-agree and --from-store go with --gate route (a route "
            "method's policy)"
        )
    if args.objective == "budget" and args.budget is None:
        raise RagateError("--objective budget needs --budget RHO (a retrieval rate in [0, 1], e.g. 0.2)")
    if args.batch is not None and args.confidence is None:
        raise RagateError("--batch M needs --confidence (e.g. 0.95): it bounds the rate of M new questions")
    if args.confidence is not None and args.objective != "budget":
        raise RagateError("--confidence bounds a budget: use it with --objective budget --budget RHO")
    if args.objective == "em" and args.dev is None:
        raise RagateError("--objective em needs answers: pass --dev DATASET (questions with answers)")
    if args.engine != "openai" and args.base_url:
        raise RagateError("--base-url needs --backend openai")
    check_concurrency(args)
    check_engine_args(args)
    if args.from_sweep is not None and args.run_engine == "ray":
        raise RagateError("--from-sweep reads the scores a sweep computed (no model call): leave out --engine ray")
    if args.budget is not None:
        from ragate.eval.thresholds import check_budget_value

        check_budget_value(args.budget)  # before any model loads
    if args.prefixes is not None:
        return _calibrate_prefixes(args)
    if args.dev is not None:
        from ragate.tuning.calibrate import calibrate

        result = calibrate(
            method=args.gate,
            dev=args.dev,
            objective=args.objective,
            budget=args.budget,
            confidence=args.confidence,
            batch=args.batch,
            limit=args.limit,
            model=args.model,
            engine=args.engine,
            base_url=base_urls(args.base_url),
            index=args.index,
            seed=args.seed,
            progress=not args.quiet,
            concurrency=args.concurrency,
            extra_body=args.extra_body,
            openai_timeout=args.openai_timeout,
            gate_weights=str(args.gate_weights) if args.gate_weights else None,
            run_engine=args.run_engine,
            ray_address=args.ray_address,
            ray_workers=args.ray_workers,
            ray_start_timeout=args.ray_start_timeout,
        )
        source = Path(args.dev).stem
    elif args.from_sweep is not None:
        from ragate.tuning.calibrate import calibrate_from_sweep

        result = calibrate_from_sweep(
            args.from_sweep, args.gate, args.budget, confidence=args.confidence, batch=args.batch
        )
        source = args.from_sweep.name
    else:
        result = _calibrate_questions(args)
        source = args.questions.stem
    out = args.out or Path("calibration") / (
        f"{args.gate}-{source}-{args.objective}"
        + (f"-{args.budget:g}" if args.objective == "budget" else "")
        + ".json"
    )
    from ragate.fileio import atomic_writer

    with atomic_writer(out) as f:
        f.write(json.dumps(result, indent=2).encode())
    print(
        f"{args.gate}: tau = {result['tau']:.6g} ({result['objective']}); on {result['n']} questions it "
        f"retrieves for {100 * result['dev_retrieval_rate']:.1f}%"
        + (f", dev EM {100 * result['dev_em']:.1f}" if result.get("dev_em") is not None else "")
    )
    if "rate_interval" in result:
        low, high = result["rate_interval"]
        print(
            f"with confidence {result['confidence']:g}, new questions retrieve at most {100 * args.budget:g}% "
            f"(expected {100 * result['expected_rate']:.1f}%, {100 * low:.1f}-{100 * high:.1f}%)"
        )
    if result.get("warning"):
        print(f"ragate calibrate: warning: {result['warning']}", file=sys.stderr)
    if args.check is not None:
        _check_rate(args, result)
    print(f"saved {out}; use it with: ragate ask|eval|serve ... --calibration {out}")
    return 0


def _calibrate_routes(args: argparse.Namespace) -> int:
    """The route method's stop thresholds for a budget of mean retrievals per question, from an eval run that
    answered every question with every route (``ragate.report.route_budget``; no model call)."""
    from ragate.cli.ask import routes_argument
    from ragate.fileio import atomic_writer
    from ragate.methods import get_method
    from ragate.report.route_budget import calibrate_routes

    policy = args.policy or "cascade"
    if args.from_store is not None:
        return _routes_from_store(args, policy)
    if args.from_sweep is None:
        raise RagateError(
            "--gate route sets its stop thresholds from every route's answers to the same questions: run "
            "ragate eval --methods wo-rag,single-rag,ircot --out RUN and pass --from-sweep RUN (or, for the learned "
            "policy, --from-store STORE: labelled traffic)"
        )
    if args.budget is None and policy != "adaptive-rag":
        raise RagateError(f"--gate route --policy {policy} needs --budget B: mean retrievals per question, e.g. 0.8")
    given = [flag for flag, value in (("--objective", args.objective != "budget"), ("--confidence", args.confidence),
             ("--prefixes", args.prefixes), ("--batch", args.batch), ("--check", args.check), ("--model", args.model),
             ("--index", args.index), ("--gate-weights", args.gate_weights)) if value]  # fmt: skip
    if given:
        raise RagateError(
            f"--gate route reads the run's records (no model call) and takes --budget, --policy, --routes, --with, "
            f"--metric, --evidence and --no-agree: drop {', '.join(given)} (the run's model is the file's)"
        )
    if policy != "cascade" and (args.evidence or not args.agree):
        raise RagateError("--evidence and --no-agree set the cascade's checks: use them with --policy cascade")
    routes = routes_argument(args.routes) or get_method("route").route.routes  # type: ignore[union-attr]
    result = calibrate_routes([args.from_sweep, *args.with_runs], routes, args.budget, args.metric, policy=policy,
                              agree=args.agree, evidence=args.evidence)  # fmt: skip
    budget = f"-{args.budget:g}" if args.budget is not None else ""
    out = args.out or Path("calibration") / f"route-{policy}-{args.from_sweep.name}{budget}.json"
    with atomic_writer(out) as f:
        f.write(json.dumps(result, indent=2).encode())
    stops = ", ".join("never" if s is None else f"{s:.4g}" for s in result.get("stops", ()))
    if policy == "cascade":
        chosen = f"NLL stop thresholds {stops}"
        if args.evidence and not result["evidence"]:
            chosen += " (without the evidence check: the records do not say whether answers are in their passages)"
    elif policy == "learned":
        chosen = f"the learned policy, lambda {result['lambda']:.4g}"
    elif policy == "calibrated":
        chosen = f"the cascade's stage fits, thresholds {stops}"
    else:
        chosen = "Adaptive-RAG's question classifier"
    spent = f"{result['dev_retrievals']:.2f} retrievals per question"
    if "reach" in result:
        low, high = result["reach"]
        spent += f" (budget {args.budget:g}; the routes reach {low:.2f} to {high:.2f})"
    print(
        f"route ({', '.join(result['routes'])}): {chosen}; on {result['n']} questions {spent}, "
        f"{args.metric.upper()} {100 * result['dev_score']:.1f} where it was fitted (ragate report RUN --routes ... "
        "scores the policies cross-fitted)"
    )
    print(f"saved {out}: ragate ask/serve --method route --calibration {out}")
    return 0


def _routes_from_store(args: argparse.Namespace, policy: str) -> int:
    """The learned route policy from a feedback store's labelled route answers (ragate.learning.route_traffic)."""
    from ragate.cli.ask import routes_argument
    from ragate.cli.gate import _open_store
    from ragate.fileio import atomic_writer
    from ragate.learning.route_traffic import calibrate_routes_from_store
    from ragate.methods.route import route_specs
    from ragate.methods.spec import RouteSpec

    if policy != "learned" or args.budget is None:
        raise RagateError(
            "--from-store fits the learned route policy (traffic labels its two paths): give --policy learned "
            "--budget B (mean retrievals per question); the cascade's thresholds come from a run of every route "
            "(--from-sweep RUN)"
        )
    if args.with_runs or args.evidence or not args.agree or args.metric != "em" or args.model or args.index:
        raise RagateError("--from-store takes --policy learned, --budget, --routes and --out")
    routes = routes_argument(args.routes) or ("no-retrieval", "standard-rag")
    route_specs(RouteSpec(tuple(routes)))  # unknown, repeated or misordered routes: refused before reading
    with _open_store(args.from_store) as store:
        result = calibrate_routes_from_store(store, routes, args.budget)
    out = args.out or Path("calibration") / f"route-learned-traffic-{args.budget:g}.json"
    with atomic_writer(out) as f:
        f.write(json.dumps(result, indent=2).encode())
    print(
        f"route ({', '.join(result['routes'])}): the learned policy, lambda {result['lambda']:.4g}, fitted on "
        f"{result['n']} labelled route answers of {args.from_store} ({result['model']}); "
        f"{result['dev_retrievals']:.2f} retrievals per question there, EM {100 * result['dev_score']:.1f}"
    )
    print(f"saved {out}: ragate ask/serve --method route --calibration {out}")
    return 0


def _calibrate_prefixes(args: argparse.Namespace) -> int:
    """``--prefixes``: TARG's k and tau chosen together for a budget (A.8)."""
    from ragate.fileio import atomic_writer
    from ragate.tuning.calibrate import calibrate_prefixes
    from ragate.tuning.prefixes import parse_prefixes

    if args.questions is not None or args.objective != "budget" or args.confidence is not None:
        raise RagateError(
            "--prefixes picks k by dev EM at a plain budget: use it with --budget RHO and --dev or --from-sweep "
            "(not --questions, --objective em or --confidence)"
        )
    result = calibrate_prefixes(
        args.gate, parse_prefixes(args.prefixes), args.budget, from_sweep=args.from_sweep, dev=args.dev,
        limit=args.limit, model=args.model, engine=args.engine, base_url=base_urls(args.base_url),
        index=args.index, seed=args.seed, progress=not args.quiet, concurrency=args.concurrency,
        extra_body=args.extra_body, metric=args.metric, run_engine=args.run_engine, ray_address=args.ray_address,
        ray_workers=args.ray_workers, ray_start_timeout=args.ray_start_timeout,
    )  # fmt: skip
    source = args.from_sweep.name if args.from_sweep is not None else Path(args.dev).stem
    print(f"{args.gate} at budget {args.budget:g} on {result['n']} questions:")
    metric = result["metric"]
    print(f"| k | gate | tau_k | retrieval rate | dev {metric} | agrees with k = 20 |\n|---|---|---|---|---|---|")
    for row in result["prefixes"]:
        agree = row.get("agreement_with_k20")
        print(
            f"| {row['k']} | {row['method']} | {row['tau']:.4g} | {100 * row['retrieval_rate']:.1f}% | "
            f"{100 * row[metric]:.1f} | {'-' if agree is None else f'{100 * agree:.1f}%'} |"
        )
    out = args.out or Path("calibration") / f"{args.gate}-prefixes-{source}-{args.budget:g}.json"
    with atomic_writer(out) as f:
        f.write(json.dumps(result, indent=2).encode())
    print(f"chose k = {result['prefix']} ({result['method']}), tau = {result['tau']:.6g}")
    print(f"saved {out}; use it with: ragate ask|eval|serve --method {result['method']} --calibration {out}")
    return 0


def _pipeline_options(args: argparse.Namespace) -> dict[str, Any]:
    from ragate.backends.threads import check_threads
    from ragate.eval.run import server_options

    threads: int | str | None = check_threads(args.threads, "--threads")
    if args.run_engine == "ray":
        from ragate.eval.ray_engine import worker_threads

        threads = worker_threads(threads, args.engine)
    return {
        "method": args.gate,
        "model": args.model,
        "backend": args.engine,
        "base_url": base_urls(args.base_url),
        "index": args.index,
        "seed": args.seed,
        "gate_weights": args.gate_weights,
        "threads": threads,
        "batch_threads": check_threads(args.batch_threads, "--batch-threads"),
        "backend_options": server_options(args.concurrency, args.extra_body, args.openai_timeout)
        if args.engine == "openai"
        else None,
    }


def _pipeline(args: argparse.Namespace) -> Any:
    from ragate.pipeline import Pipeline

    return Pipeline(**_pipeline_options(args))


class PipelineScores:
    """Question i's gate score and gate (seed ``seed + i``, as ``Pipeline.scores``) through a Pipeline opened once
    per Ray worker (``--engine ray``, :func:`ragate.eval.ray_engine.map_ray`)."""

    def __init__(self, options: dict[str, Any]) -> None:
        from ragate.pipeline import Pipeline

        self.rag = Pipeline(**options)

    def record(self, job: tuple[int, str]) -> tuple[float, str]:
        i, question = job
        return self.rag.decide(question, seed=self.rag.seed + i).score, self.rag.spec.gate.kind

    def close(self) -> None:
        self.rag.close()


def _ray_scores(args: argparse.Namespace, questions: list[str]) -> list[tuple[float, str]]:
    from ragate.eval.ray_engine import map_ray

    return map_ray(
        list(enumerate(questions)), PipelineScores, (_pipeline_options(args),), address=args.ray_address,
        workers=args.ray_workers, progress=not args.quiet, desc=f"score {args.gate}",
        start_timeout=args.ray_start_timeout,
    )  # fmt: skip


def _calibrate_questions(args: argparse.Namespace) -> dict[str, Any]:
    """``--questions FILE``: the gate's scores of your own questions (no answers) through a Pipeline (one per Ray
    worker with ``--engine ray``)."""
    from ragate.eval.thresholds import check_calibratable
    from ragate.methods import get_method

    check_calibratable(get_method(args.gate))  # before the model loads
    if args.objective != "budget":
        raise RagateError("--questions has no answers to score EM with: use --budget RHO")
    if args.run_engine == "ray":  # Pipeline.calibrate's scores, from Pipelines on the workers
        from ragate.answers.answer import Calibration
        from ragate.eval.datasets import read_questions
        from ragate.eval.thresholds import check_budget_value

        check_budget_value(args.budget, "budget")  # before any model loads
        scored = _ray_scores(args, read_questions(args.questions))
        calibration = Calibration.from_scores(
            [s for s, _ in scored], args.budget, confidence=args.confidence, batch=args.batch, method=args.gate,
            gate=scored[0][1], model=args.model, engine=args.engine, source=str(args.questions),
        )  # fmt: skip
        return calibration.to_json() | {"seed": args.seed}
    import warnings

    with _pipeline(args) as rag, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # its warning is printed with the result
        found = rag.calibrate(
            args.questions,
            args.budget,
            confidence=args.confidence,
            batch=args.batch,
            progress=not args.quiet,
            concurrency=args.concurrency,
        )
    return found.to_json() | {"seed": args.seed}


def _check_rate(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Score the ``--check`` questions and print the rate this tau gives there."""
    from ragate.eval.datasets import read_questions
    from ragate.eval.thresholds import retrieval_rate

    questions = read_questions(args.check)
    if args.run_engine == "ray":
        scores = [score for score, _ in _ray_scores(args, questions)]
    else:
        with _pipeline(args) as rag:
            scores = [
                d.score for d in rag.scores(questions, progress=not args.quiet, concurrency=args.concurrency)
            ]
    rate = retrieval_rate(scores, float(result["tau"]))
    verdict = "within" if rate <= (args.budget or 1.0) else "above"
    print(
        f"on {len(questions)} other questions ({args.check}) tau = {result['tau']:.6g} retrieves for "
        f"{100 * rate:.1f}% ({verdict} the budget of {100 * (args.budget or 0):g}%)"
    )
