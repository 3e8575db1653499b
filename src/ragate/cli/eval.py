"""``ragate eval``, ``ragate sweep`` and ``ragate report`` (``ragate calibrate`` is registered between them from
:mod:`ragate.cli.calibrate`): measure methods on real data."""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

from ragate.cli.ask import early_exit_argument
from ragate.cli.options import (
    base_urls,
    check_concurrency,
    check_engine_args,
    common_options,
    concurrency_option,
    engine_options,
)
from ragate.errors import RagateError


def register(subparsers: Any) -> None:
    ev = subparsers.add_parser(
        "eval",
        help="run methods over a dataset: per-question JSONL (resumable), results JSON and a Markdown table",
        description="Run methods over a dataset. Writes OUT/questions.jsonl as it goes (rerun with --resume after "
        "a kill), then OUT/results.json and OUT/results.md.",
    )
    common_options(ev, dataset_required=False)
    ev.add_argument("--methods", help="comma-separated method names (see `ragate ask --help`)")
    engine_options(ev)
    concurrency_option(ev)
    early_exit_argument(ev)
    ev.set_defaults(run=_run_eval)

    sw = subparsers.add_parser(
        "sweep",
        help="exact accuracy/retrieval frontiers of single-shot gates in two passes",
        description="Pass 1 stores each question's closed-book answer, retrieval answer and every gate's score "
        "(OUT/sweep.jsonl, resumable); pass 2 turns every threshold and budget into a lookup (OUT/sweep.json, "
        "OUT/sweep.md). With only RUN_DIR, pass 2 is redone from the stored records.",
    )
    sw.add_argument("run_dir", nargs="?", type=Path, help="an existing sweep directory (pass 2 only)")
    common_options(sw, dataset_required=False)
    sw.add_argument("--methods", help="comma-separated gate methods, e.g. dtr,targ-margin,random")
    engine_options(sw)
    concurrency_option(sw)
    sw.add_argument("--at", action="append", default=[], help="METHOD=TAU: print that operating point")
    sw.add_argument(
        "--metric",
        choices=("em", "f1", "acc"),
        default="em",
        help="accuracy in the frontier table (sweep.json keeps all three)",
    )
    sw.set_defaults(run=_run_sweep)

    from ragate.cli.calibrate import register as register_calibrate

    register_calibrate(subparsers)

    rep = subparsers.add_parser(
        "report",
        help="Markdown + PNG plots (and HTML) for an eval or sweep directory; for a service's answer log "
        "(serve --answer-log FILE), the savings and retrieval rate over time",
    )
    rep.add_argument("run_dir", type=Path, help="a run directory, or a service's answer log (a file)")
    rep.add_argument("--out", type=Path, default=None, help="output folder (default RUN_DIR/report)")
    rep.add_argument(
        "--metric",
        choices=("em", "f1", "acc"),
        default=None,
        help="accuracy in plots, deciles, quadrants and paired differences (default: em, or acc when EM is near 0 "
        "for every method while acc is not: answers in sentences, as small models write them)",
    )
    rep.add_argument(
        "--budgets",
        default=None,
        help="comma-separated retrieval budgets, e.g. 0.05,0.1,0.15,0.2,0.3: add the budget-matched table (TARG Tables 3-4)",
    )
    rep.add_argument(
        "--with",
        dest="with_runs",
        action="append",
        type=Path,
        default=[],
        help="an eval run on the same questions whose methods join the budget table as single points (repeatable)",
    )
    rep.add_argument(
        "--select",
        choices=("best", "quantile"),
        default="best",
        help="a gate's point within a budget: its best one (TARG's tables, optimistic) or tau = F^-1(1 - budget)",
    )
    rep.add_argument(
        "--sweep",
        type=Path,
        default=None,
        help="a sweep on the same questions: an eval run's report takes the methods it already answered "
        "(gates at their default thresholds, never/always with a swept family's prompts) into its paired differences",
    )
    rep.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="METHOD:AGAINST",
        help="add one pair to an eval run's paired differences, e.g. dpr-ais:dtr-no-ugt (repeatable)",
    )
    rep.add_argument(
        "--routes",
        default=None,
        metavar="A,B,C",
        help="print the routes' frontier instead (nothing written): each fixed route, the cascade and the oracle, "
        "replayed from an eval run (and the --with runs) that answered every question with each of these methods, "
        "cheapest first",
    )
    rep.add_argument(
        "--seed", type=int, default=None, help="--routes: the cross-fitting halves' and the bootstrap's seed (default 0)"
    )
    rep.add_argument("--resamples", type=int, default=None, help="--routes: the bootstrap's resamples (default 1000)")
    rep.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="--routes: draw the pooled frontier (accuracy against retrievals per question, bootstrap 95%% bars)",
    )
    rep.set_defaults(run=_run_report)


def _fold(args: argparse.Namespace, kind: str) -> int:
    from ragate.eval.shards import fold_runs

    if args.out is None:
        raise RagateError("--fold writes the folded run into --out DIR: name a new directory")
    folded = fold_runs(args.fold, args.out)
    if folded != kind:
        raise RagateError(f"the shards are {folded} runs: fold them with `ragate {folded} --fold`")
    print(f"folded {len(args.fold)} shards into {args.out}")
    return 0


def _config(args: argparse.Namespace, methods: str) -> Any:
    from ragate.eval.config import EvalConfig
    from ragate.eval.run import timeout_note
    from ragate.eval.thresholds import check_calibration, read_calibration
    from ragate.methods import get_method

    names = tuple(m.strip() for m in methods.split(",") if m.strip())
    if not names:
        raise RagateError("--methods is empty: name at least one method, e.g. --methods no-retrieval,dtr")
    for name in names:
        get_method(name)  # a typo fails now, with "did you mean"
    thresholds: dict[str, float] = {}
    tuned: list[str] = []
    for path in args.calibration:
        cal = read_calibration(path)
        if cal["method"] == "route":
            raise RagateError(
                f"{path} holds a route method's stop thresholds, which ragate eval does not take: serve or ask "
                "with it (--method route --calibration FILE); ragate report RUN --routes ... scores thresholds "
                "tuned on other questions (cross-fitted) without a model call"
            )
        if cal["method"] not in names:
            raise RagateError(
                f"{path} calibrates {cal['method']!r}, which this run does not evaluate ({', '.join(names)}): "
                "pass the calibration of a method in --methods"
            )
        if get_method(cal["method"]).dynamic is not None:  # a `ragate tune` file, checked by the run
            from ragate.eval.tunefile import read_tune

            read_tune(path)
            tuned.append(str(path))
        else:
            check_calibration(cal, path, None, args.model, args.engine)
        thresholds[cal["method"]] = float(cal["tau"])
    for item in args.threshold:
        method, sep, value = item.partition("=")
        if not sep:
            raise RagateError(f"--threshold {item!r}: write METHOD=TAU, e.g. --threshold dtr=0.01")
        get_method(method)
        thresholds[method] = _finite(value, f"--threshold {item!r}")
    if args.engine != "openai" and args.base_url:
        raise RagateError("--base-url needs --backend openai")
    if args.extra_body and args.engine != "openai":
        raise RagateError("--extra-body adds fields to a server's requests: use it with --backend openai")
    if args.shard is not None:
        from ragate.eval.shards import parse_shard

        parse_shard(args.shard)
    return EvalConfig(
        dataset=str(args.dataset),
        methods=names,
        model=args.model,
        engine=args.engine,
        index=str(args.index) if args.index else None,
        limit=args.limit,
        seed=args.seed,
        thresholds=tuple(sorted(thresholds.items())),
        base_url=base_urls(args.base_url),
        fallback=getattr(args, "fallback", None),
        shard=args.shard,
        extra_body=args.extra_body,
        extra=timeout_note(args.openai_timeout) | _thread_note(args),
        offset=getattr(args, "offset", 0),
        skr_labels=str(args.skr_labels) if getattr(args, "skr_labels", None) else None,
        cross_encoder=getattr(args, "cross_encoder", None),
        tuned=tuple(tuned),
        gate_weights=_gate_weights(args, names),
        # eval: TARG's early exit unless --no-early-exit; a sweep reads every gate draft whole (it ranks scores)
        early_exit=not getattr(args, "no_early_exit", True),
    )


def _thread_note(args: argparse.Namespace) -> dict[str, Any]:
    """``--threads`` / ``--batch-threads`` as ``EvalConfig.extra`` records them (where not auto): they change no
    answer (ragate.backends.threads), so a resume may change them."""
    from ragate.backends.threads import thread_options

    thread_options(args.engine, args.threads, args.batch_threads)  # checked before any model loads
    return {
        key: int(value)
        for key, value in (("threads", args.threads), ("batch_threads", args.batch_threads))
        if value not in (None, "auto")
    }


def _gate_weights(args: argparse.Namespace, names: tuple[str, ...]) -> str | None:
    """``--gate-weights``, which goes with a method whose gate reads them (no-model-lr, learned)."""
    from ragate.eval.config import reads_weights

    path = getattr(args, "gate_weights", None)
    if path is None:
        return None
    if not reads_weights(names):
        raise RagateError(
            "--gate-weights goes with a trained gate that reads them (--methods no-model-lr or learned), which this run "
            f"does not run ({', '.join(names)})"
        )
    return str(path)


def _default_out(args: argparse.Namespace, kind: str) -> Path:
    if args.out is not None:
        return Path(args.out)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{Path(str(args.dataset)).stem}-{args.model or 'smollm2-135m'}")
    return Path("runs") / (f"{name}-{kind}" if kind != "eval" else name)


def _run_eval(args: argparse.Namespace) -> int:
    from ragate.eval.run import run_eval
    from ragate.eval.summary import summary_table

    if args.fold:
        return _fold(args, "eval")
    if not args.dataset or not args.methods:
        raise RagateError("ragate eval needs --dataset and --methods (or --fold DIR... to merge shards)")
    check_concurrency(args)
    check_engine_args(args)
    config = _config(args, args.methods)
    out = _default_out(args, "eval")
    print(f"run directory: {out}")
    results = run_eval(
        config,
        out,
        resume=args.resume,
        progress=not args.quiet,
        concurrency=args.concurrency,
        workers=args.workers,
        call_cache=args.call_cache,
        cache=args.cache,
        accept_rebuilt_index=args.accept_rebuilt_index,
        engine=args.run_engine,
        ray_address=args.ray_address,
        ray_workers=args.ray_workers,
        ray_start_timeout=args.ray_start_timeout,
    )
    paid, charged = results["calls"]["paid"], results["calls"]["charged"]
    if charged["calls"]:
        print(
            f"LM calls: {int(charged['calls'])} charged, {int(paid['calls'])} computed "
            f"({charged['cpu_seconds']:.0f} CPU s charged, {paid['cpu_seconds']:.0f} paid)"
        )
    print(summary_table(results["summary"]))
    print(f"wrote {out / 'questions.jsonl'}, {out / 'results.json'}, {out / 'results.md'}")
    return _report_failures(out, results["summary"])


def _report_failures(out: Path, summary: list[dict[str, Any]]) -> int:
    """Say on stderr how many answers of each method failed and the first error; 1 when a method has no
    answer at all (every one failed), else 0."""
    failed = [row for row in summary if row.get("errors")]
    if not failed:
        return 0
    from ragate.eval.records import latest, read_records

    first: dict[str, str] = {}
    for record in latest(read_records(out / "questions.jsonl", repair=False)):
        if "error" in record:
            first.setdefault(record["method"], record["error"])
    for row in failed:
        total = row["n"] + row["errors"]
        print(
            f"ragate eval: {row['errors']} of {total} answers of {row['method']} failed (recorded in "
            f"questions.jsonl; --resume retries them); the first: {first.get(row['method'], '?')}",
            file=sys.stderr,
        )
    return 1 if any(row["n"] == 0 for row in failed) else 0


def _run_sweep(args: argparse.Namespace) -> int:
    from ragate.eval.sweep import compact, method_records, point, sweep_markdown, sweep_pass, write_sweep
    from ragate.report.tables import unfolded_records

    at = [(item.partition("=")[0], _finite(item.partition("=")[2], f"--at {item!r}")) for item in args.at]
    if args.fold:
        return _fold(args, "sweep")
    if args.run_dir is not None:
        out = args.run_dir
        records = compact(out / "sweep.jsonl")
        if not records:
            raise RagateError(
                f"{out} has no sweep.jsonl records: run `ragate sweep --dataset ... --methods ...`"
            )
    else:
        if not args.dataset or not args.methods:
            raise RagateError("give RUN_DIR, or --dataset and --methods to run pass 1")
        check_concurrency(args)
        check_engine_args(args)
        config = _config(args, args.methods)
        out = _default_out(args, "sweep")
        print(f"sweep directory: {out}")
        records = sweep_pass(
            config,
            out,
            resume=args.resume,
            progress=not args.quiet,
            workers=args.workers,
            call_cache=args.call_cache,
            cache=args.cache,
            accept_rebuilt_index=args.accept_rebuilt_index,
            concurrency=args.concurrency,
            engine=args.run_engine,
            ray_address=args.ray_address,
            ray_workers=args.ray_workers,
            ray_start_timeout=args.ray_start_timeout,
        )
    fronts = write_sweep(out, records, args.metric)
    print(sweep_markdown(fronts, args.metric))
    if args.run_dir is not None and (pending := unfolded_records(out)):
        print(f"ragate sweep: warning: not in this pass 2: {pending}", file=sys.stderr)
    for method, tau in at:
        rows = [r for r in method_records(records, method) if method in r["gates"]]
        if not rows:
            raise RagateError(f"--at {method}={tau:g}: the sweep has no gate scores for {method!r}")
        p = point(rows, [r["gates"][method]["score"] > tau for r in rows])
        print(f"{method} at tau {tau:g}: " + ", ".join(f"{k} {v:.4f}" for k, v in p.items()))
    print(f"wrote {out / 'sweep.json'}, {out / 'sweep.md'}")
    return 0


def _run_report(args: argparse.Namespace) -> int:
    if args.routes is None and (args.seed is not None or args.resamples is not None or args.plot is not None):
        from ragate.errors import RagateError

        raise RagateError("--seed, --resamples and --plot go with the routes' frontier: give --routes A,B,C too")
    if Path(args.run_dir).is_file():  # a service's answer log (ragate serve --answer-log)
        from ragate.answers.savings import read_log, savings_report
        from ragate.fileio import atomic_writer

        text = savings_report(read_log(args.run_dir))
        print(text, end="")
        if args.out is not None:
            with atomic_writer(args.out) as f:
                f.write(text.encode())
            print(f"wrote {args.out}")
        return 0
    if args.routes is not None:
        from ragate.report.route_report import routes_report

        routes = [r.strip() for r in args.routes.split(",") if r.strip()]
        given = {k: v for k, v in (("seed", args.seed), ("samples", args.resamples), ("plot", args.plot)) if v is not None}
        print(routes_report([args.run_dir, *args.with_runs], routes, args.metric or "em", **given), end="")
        return 0
    from ragate.errors import RagateError
    from ragate.eval.summary import parse_pair
    from ragate.report.matched import parse_budgets
    from ragate.report.tables import unfolded_records, write_report

    budgets = parse_budgets(args.budgets) if args.budgets else ()
    if args.with_runs and not budgets:
        raise RagateError("--with adds single points to the budget-matched table: pass --budgets too")
    compare = [parse_pair(text) for text in args.compare]
    written = write_report(
        args.run_dir,
        args.out,
        metric=args.metric,
        budgets=budgets,
        with_runs=args.with_runs,
        select=args.select,
        sweep=args.sweep,
        compare=compare,
    )
    for path in written:
        print(f"wrote {path}")
    if pending := unfolded_records(Path(args.run_dir)):
        print(f"ragate report: warning: not in the report: {pending}", file=sys.stderr)
    return 0


def _finite(value: str, what: str) -> float:
    """A threshold from the command line: a finite number (NaN would compare false with every score)."""
    try:
        tau = float(value)
    except ValueError:
        tau = math.nan
    if not math.isfinite(tau):
        raise RagateError(f"{what}: the threshold must be a finite number, e.g. dtr=0.01")
    return tau
