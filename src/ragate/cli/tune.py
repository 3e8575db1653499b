"""``ragate tune``: a dynamic method's trigger threshold (ETC alpha, DRAGIN/FLARE theta) set on a validation split."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from ragate.errors import RagateError


def register(subparsers: Any) -> None:
    from ragate.cli.options import BACKEND_CHOICES, server_request_options
    from ragate.tuning.tune import DEFAULT_TEST_LIMIT

    p = subparsers.add_parser(
        "tune",
        help="a dynamic method's trigger threshold (ETC alpha, DRAGIN/FLARE theta) from a validation split",
        description="Run a dynamic method over validation questions once per value of a grid (each value an "
        "ordinary resumable eval run under --out), pick the value for a target (the best validation metric, ties "
        "to fewer retrievals; or the retrievals per question nearest R) and save it as a calibration file for "
        "ragate eval/ask/reproduce --calibration. Validation questions that are in the test split (by default the "
        f"dataset's first {DEFAULT_TEST_LIMIT}) are refused, by id and by text, and so is a run that scores a "
        "validation question with the tuned value.",
    )
    p.add_argument(
        "--method",
        required=True,
        help="a dynamic method: etc (and its variants), dragin, flare, targ-recheck",
    )
    p.add_argument("--dataset", required=True, help="dataset name or JSONL of validation questions")
    p.add_argument(
        "--offset", type=int, default=0, help="skip the dataset's first N questions (e.g. the test split)"
    )
    p.add_argument(
        "--limit", type=int, default=None, help="validation questions after --offset (default: all)"
    )
    p.add_argument(
        "--grid",
        default=None,
        help="comma-separated values, e.g. 0.8,1.0,1.3 (default per trigger: ETC alpha 0.8-2.0 around the "
        "authors' 1.3, DRAGIN theta 0.8-2.0, FLARE theta 0.2-0.6, targ-recheck tau 0.4-1.2)",
    )
    p.add_argument(
        "--target",
        default="best",
        help="best (the best validation --metric, ties to fewer retrievals) or retrievals=R (the retrievals "
        "per question nearest R, ties to the better metric)",
    )
    p.add_argument(
        "--metric", choices=("em", "f1", "acc"), default="em", help="the validation metric (default em)"
    )
    p.add_argument("--test-dataset", default=None, help="the dataset of the test split (default: --dataset)")
    p.add_argument("--test-offset", type=int, default=0, help="where the test split starts (default 0)")
    p.add_argument(
        "--test-limit",
        type=int,
        default=DEFAULT_TEST_LIMIT,
        help=f"questions in the test split (default {DEFAULT_TEST_LIMIT}, the split the project's runs score)",
    )
    p.add_argument("--index", default=None, help="index directory (default: the demo index)")
    p.add_argument("--model", default=None, help="model name or GGUF path (default: smollm2-135m)")
    p.add_argument("--backend", dest="engine", choices=BACKEND_CHOICES, default="llama.cpp")
    p.add_argument(
        "--base-url",
        action="append",
        default=[],
        help="an OpenAI-compatible server's /v1 URL (with --backend openai); repeat it for a fleet",
    )
    server_request_options(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder of the grid's run directories (default runs/tune-METHOD-DATASET-MODEL)",
    )
    p.add_argument(
        "--save",
        type=Path,
        default=None,
        metavar="FILE",
        help="the tune file (default calibration/METHOD-DATASET-tune-TARGET.json)",
    )
    p.add_argument("--workers", type=int, default=1, help="processes for a local model, one per core")
    from ragate.cli.options import engine_options

    engine_options(p)
    p.add_argument("--concurrency", type=int, default=1, help="questions in flight (with --backend openai)")
    p.add_argument("--call-cache", type=Path, default=None, help="where LM calls are stored (as ragate eval)")
    p.add_argument("--no-call-cache", dest="cache", action="store_false", help="compute every call in full")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(run=_run)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text)


def _run(args: argparse.Namespace) -> int:
    from ragate.cli.options import base_urls, check_concurrency
    from ragate.tuning.tune import parse_grid, parse_target, save_tune, table, tune

    if args.engine != "openai" and args.base_url:
        raise RagateError("--base-url needs --backend openai")
    check_concurrency(args)
    from ragate.cli.options import check_engine_args

    check_engine_args(args)
    grid = parse_grid(args.grid) if args.grid is not None else None
    target = parse_target(args.target)  # before any model loads
    stem = Path(str(args.dataset)).stem
    out = args.out or Path("runs") / _slug(f"tune-{args.method}-{stem}-{args.model or 'smollm2-135m'}")
    result = tune(
        method=args.method,
        dataset=args.dataset,
        out=out,
        offset=args.offset,
        limit=args.limit,
        grid=grid,
        target=target,
        metric=args.metric,
        test_dataset=args.test_dataset,
        test_offset=args.test_offset,
        test_limit=args.test_limit,
        model=args.model,
        engine=args.engine,
        base_url=base_urls(args.base_url),
        index=args.index,
        seed=args.seed,
        progress=not args.quiet,
        workers=args.workers,
        concurrency=args.concurrency,
        call_cache=args.call_cache,
        cache=args.cache,
        extra_body=args.extra_body,
        openai_timeout=args.openai_timeout,
        run_engine=args.run_engine,
        ray_address=args.ray_address,
        ray_workers=args.ray_workers,
        ray_start_timeout=args.ray_start_timeout,
    )
    from ragate.tuning.tune import GridRow

    rows = [GridRow(**r) for r in result["table"]]
    print(table(rows, result["parameter"], args.metric, result["tau"]))
    print(
        f"{args.method}: {result['parameter']} = {result['tau']:g} (target {result['target']}, metric "
        f"{args.metric}): on {result['n']} validation question{'s' if result['n'] != 1 else ''} ({result['dev']}) "
        f"{args.metric} "
        f"{100 * result['dev_metric']:.1f}, {result['dev_retrievals_per_question']:.2f} retrievals per question"
        + (f"; the default is {result['default']:g}" if result.get("default") is not None else "")
    )
    path = args.save or Path("calibration") / _slug(f"{args.method}-{stem}-tune-{target}-{args.metric}.json")
    save_tune(result, path)
    print(
        f"saved {path}; use it with: ragate eval|ask ... --calibration {path}, ragate reproduce ... --calibration {path}"
    )
    return 0
