"""The options the measuring commands share (``ragate eval``, ``sweep``, ``calibrate``; ``tune``, ``reproduce``
and ``serve`` take some of them): dataset, model, backend and servers, run directory, thresholds, workers, the
call cache, and their checks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ragate.cli.ask import thread_arguments
from ragate.errors import RagateError

BACKEND_CHOICES = ("llama.cpp", "transformers", "openai")


def common_options(p: argparse.ArgumentParser, *, dataset_required: bool = True) -> None:
    p.add_argument(
        "--dataset", required=dataset_required, help="dataset name (see docs/evaluation.md) or JSONL"
    )
    p.add_argument("--index", default=None, help="index directory (default: the demo index)")
    p.add_argument("--model", default=None, help="model name or GGUF path (default: smollm2-135m)")
    p.add_argument("--backend", dest="engine", choices=BACKEND_CHOICES, default="llama.cpp")
    p.add_argument(
        "--base-url",
        action="append",
        default=[],
        help="an OpenAI-compatible server's /v1 URL (with --backend openai); repeat it to spread the calls over a "
        "fleet of servers of one model",
    )
    p.add_argument("--limit", type=int, default=None, help="first N questions (after --offset)")
    p.add_argument(
        "--offset",
        type=int,
        default=0,
        help="skip the first N questions, e.g. to sweep a training split for `ragate skr fit` (default 0)",
    )
    p.add_argument(
        "--skr-labels",
        type=Path,
        default=None,
        metavar="FILE",
        help="the label set the skr method votes with (from `ragate skr fit`); its questions must not be this "
        "run's",
    )
    p.add_argument(
        "--gate-weights",
        type=Path,
        default=None,
        metavar="FILE",
        help="the file a trained gate reads: no-model-lr's weights (`ragate gate fit`) or a learned gate "
        "(`ragate gate learn`); its training questions must not be this run's",
    )
    p.add_argument(
        "--cross-encoder",
        default=None,
        metavar="DIR",
        help="a sentence-transformers CrossEncoder folder: the K of rerank and dpr-ais-rerank (PAIRS Eq. 7)",
    )
    p.add_argument("--seed", type=int, default=0)
    thread_arguments(p)
    p.add_argument("--out", type=Path, default=None, help="run directory (default runs/DATASET-MODEL)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument(
        "--accept-rebuilt-index",
        action="store_true",
        help="resume although the index was rebuilt, when its passages, encoder and settings are the same (recorded)",
    )
    p.add_argument("--threshold", action="append", default=[], help="METHOD=TAU, repeatable")
    p.add_argument(
        "--calibration",
        action="append",
        default=[],
        type=Path,
        help="a `ragate calibrate` file, or a `ragate tune` file (a dynamic method's trigger threshold), repeatable",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--fallback",
        default=None,
        metavar="GATE",
        help="where the backend cannot serve a method's gate (no logprobs, too few top-k), run this gate instead "
        "(e.g. verbal-confidence, pairs); recorded in config.json. Default: such a method is an error",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="shard the questions over N processes, each pinned to its own core with a one-thread engine "
        "(use the number of cores for a local model)",
    )
    server_request_options(p)
    p.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="answer every N-th question from the I-th (0-based), e.g. 0/2 on one machine and 1/2 on another; "
        "fold the shards' directories with --fold",
    )
    p.add_argument(
        "--fold",
        nargs="+",
        type=Path,
        default=None,
        metavar="DIR",
        help="merge the directories of every shard of one run into --out (checks they are one run: same settings, "
        "dataset file, index and model); nothing is computed",
    )
    p.add_argument(
        "--call-cache",
        type=Path,
        default=None,
        help="where each distinct LM call is stored and reused (default: RAGATE_HOME/calls.sqlite, shared by runs)",
    )
    p.add_argument(
        "--no-call-cache",
        dest="cache",
        action="store_false",
        help="compute every LM call in full: no stored call, no prompt started from an earlier one's state "
        "(same predictions; every call paid)",
    )


def server_request_options(p: argparse.ArgumentParser) -> None:
    """``--openai-timeout`` and ``--extra-body``: how a run talks to an OpenAI-compatible server."""
    p.add_argument(
        "--openai-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --backend openai: the most one HTTP exchange may take (default 60; raise it for a CPU server "
        "or long answers)",
    )
    p.add_argument(
        "--extra-body",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="server-specific fields added to every request with --backend openai, e.g. '{\"repeat_penalty\": 1.0}' "
        "for llama-cpp-python's server (which penalises repeats unless told otherwise); recorded and compared on "
        "--resume",
    )


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {text!r} (e.g. '{{\"repeat_penalty\": 1.0}}')")
    return value


def concurrency_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="questions in flight at once; above 1 only with --backend openai (a local model runs one at a time). "
        "Each question's calls stay in order, so the answers are those of --concurrency 1",
    )


def base_urls(values: list[str] | None) -> str | tuple[str, ...] | None:
    """Repeated ``--base-url`` values: None, one URL, or a fleet (several)."""
    urls = list(dict.fromkeys(values or []))
    return None if not urls else urls[0] if len(urls) == 1 else tuple(urls)


def check_concurrency(args: argparse.Namespace) -> None:
    if args.concurrency < 1:
        raise RagateError(f"--concurrency must be >= 1, not {args.concurrency}")
    if args.concurrency > 1 and args.engine != "openai":
        raise RagateError("--concurrency above 1 needs --backend openai: a local model answers one at a time")


def engine_options(p: argparse.ArgumentParser) -> None:
    """--engine, --ray-workers, --ray-address, --ray-start-timeout (eval, sweep, tune, calibrate, gate learn)."""
    p.add_argument(
        "--engine",
        dest="run_engine",  # --backend's dest is engine (the LM's)
        choices=("local", "ray"),
        default="local",
        help="local (default): this machine's processes; ray: batches of questions as tasks of Ray actors "
        "(--ray-workers), each with its own model; the same results, and for eval, sweep and tune the same "
        "resumable run directory (pip install 'ragate[ray]')",
    )
    p.add_argument(
        "--ray-workers", type=int, default=None, metavar="N",
        help="with --engine ray: Ray actors, each with its own model (default: one per CPU of the cluster)",
    )  # fmt: skip
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="with --engine ray: the cluster to join (auto, HOST:6379 or ray://HOST:10001); default: start a "
        "local one",
    )
    p.add_argument(
        "--ray-start-timeout", type=float, default=30.0, metavar="SECONDS",
        help="with --engine ray: seconds the cluster has to answer (an address where nothing does is refused "
        "before any run directory is written) or a local one to start (default 30; raise it on a busy machine)",
    )  # fmt: skip


def check_engine_args(args: argparse.Namespace) -> None:
    """The engine's settings, before any work (a wrong --ray-address, or one where no cluster answers within
    --ray-start-timeout, fails here)."""
    from ragate.eval.ray_engine import check_engine, reach_cluster

    check_engine(
        args.run_engine, ray_address=args.ray_address, ray_workers=args.ray_workers, workers=getattr(args, "workers", 1),
        handed_in=False, concurrency=getattr(args, "concurrency", 1), ray_start_timeout=args.ray_start_timeout,
    )  # fmt: skip
    if args.run_engine == "ray":
        reach_cluster(args.ray_address, args.ray_start_timeout)

