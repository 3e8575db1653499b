"""``ragate reproduce NAME``: a paper's table rerun with ragate, the paper's numbers beside ours."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ragate.errors import RagateError


def register(subparsers: Any) -> None:
    from ragate.cli.options import BACKEND_CHOICES, server_request_options

    p = subparsers.add_parser(
        "reproduce",
        help="rerun a paper's table (targ-table1, dtr-table2, pairs-table2, etc-table2) and print it beside ours",
        description="Run a paper table's protocol (its datasets that ragate has, its methods, its retrieval rates) "
        "against any backend, and print the paper's number beside ragate's with its bootstrap 95%% interval, and "
        "the setting differences (model, retriever, corpus, n). Every run is resumable: rerun the same command "
        "after a kill. docs/reproduce.md says how to run the full packs on a GPU server.",
    )
    p.add_argument("name", nargs="?", help="the pack, e.g. targ-table1 (--list shows them)")
    p.add_argument("--list", action="store_true", help="list the packs and exit")
    p.add_argument("--limit", type=int, default=None, help="first N questions of each dataset (a smoke run)")
    p.add_argument("--datasets", default="", help="comma-separated: only these of the table's datasets")
    p.add_argument(
        "--methods", default="", help="comma-separated ragate methods: only these of the table's rows"
    )
    p.add_argument(
        "--paper-model", default=None, help="which model's rows of a multi-model table (default: the pack's)"
    )
    p.add_argument(
        "--model", default=None, help="model name or GGUF path (a server's model name with openai)"
    )
    p.add_argument("--backend", dest="engine", choices=BACKEND_CHOICES, default="llama.cpp")
    p.add_argument(
        "--base-url",
        action="append",
        default=[],
        help="an OpenAI-compatible server's /v1 URL (with --backend openai); repeat it for a fleet",
    )
    server_request_options(p)
    p.add_argument("--index", default=None, help="index directory (default: the demo index)")
    p.add_argument("--concurrency", type=int, default=1, help="questions in flight (with --backend openai)")
    p.add_argument("--workers", type=int, default=1, help="processes for a local model, one per core")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--call-cache", type=Path, default=None, help="where LM calls are stored (as ragate eval)")
    p.add_argument("--no-call-cache", dest="cache", action="store_false", help="compute every call in full")
    p.add_argument(
        "--out", type=Path, default=None, help="where the runs and the table go (default runs/reproduce-NAME)"
    )
    p.add_argument(
        "--calibration",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="a `ragate tune` file: its dynamic method runs at the tuned trigger threshold on the dataset of the "
        "file's test split (repeatable; a scored validation question is refused)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from ragate.cli.options import base_urls, check_concurrency
    from ragate.report.reproduce import markdown, pack_names, reproduce

    if args.list:
        print("\n".join(pack_names()))
        return 0
    if not args.name:
        raise RagateError(f"name a pack: {', '.join(pack_names())}")
    if args.engine != "openai" and args.base_url:
        raise RagateError("--base-url needs --backend openai")
    check_concurrency(args)
    out = args.out or Path("runs") / f"reproduce-{args.name}"
    table = reproduce(
        args.name,
        out,
        limit=args.limit,
        datasets=[d for d in args.datasets.split(",") if d.strip()],
        methods=[m.strip() for m in args.methods.split(",") if m.strip()],
        paper_model=args.paper_model,
        model=args.model,
        engine=args.engine,
        base_url=base_urls(args.base_url),
        index=args.index,
        seed=args.seed,
        concurrency=args.concurrency,
        workers=args.workers,
        progress=not args.quiet,
        call_cache=args.call_cache,
        cache=args.cache,
        extra_body=args.extra_body,
        openai_timeout=args.openai_timeout,
        calibration=args.calibration,
    )
    print(markdown(table))
    print(f"wrote {out / 'reproduce.md'}, {out / 'reproduce.json'}")
    return 0
