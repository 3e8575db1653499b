"""``ragate models``: list the known models and install them (``ragate models`` alone lists them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ragate.models import DEFAULT_MODEL, KNOWN_MODELS, install_model, list_models, model_spec, model_status


def _add_home(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--home", type=Path, default=default, help="ragate home (default: $RAGATE_HOME, else ~/.cache/ragate)"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models", help="list and install models", description=__doc__.split("\n")[0]
    )
    _add_home(parser, None)
    parser.set_defaults(run=run_list)
    commands = parser.add_subparsers(dest="models_command", metavar="ACTION")

    # SUPPRESS: `ragate models --home X list` keeps X instead of the subcommand's default.
    _add_home(commands.add_parser("list", help="show the known models and where they are"), argparse.SUPPRESS)
    install = commands.add_parser("install", help="download (or locate) a known model and verify it")
    _add_home(install, argparse.SUPPRESS)
    install.add_argument("name", help=f"one of: {', '.join(s.name for s in KNOWN_MODELS)}")
    install.add_argument("--verify", action="store_true", help="check an installed model's sha256 too")
    install.add_argument("--quiet", action="store_true", help="no progress output")
    install.set_defaults(run=run_install)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


ENGINE_CAPABILITIES = (
    ("llama.cpp", "full next-token distribution (exact entropy), top-100 logprobs, seeded sampling; every gate"),
    ("transformers", "full distribution, top-100 logprobs, attentions (DRAGIN's query), seeded sampling"),
    ("openai", ("asked at start: top-k logprobs (entropy gates approximate, margin needs k >= 2) or none "
                "(text-only gates: pairs, verbal-confidence, targ-variance, llm-judge from its reply; or --fallback)")),
)  # fmt: skip


def run_list(args: argparse.Namespace) -> int:
    rows = [("NAME", "INSTALLED", "SIZE", "PATH", "DESCRIPTION")]
    for status in list_models(args.home):
        spec = status.spec
        name = f"{spec.name} *" if spec.name == DEFAULT_MODEL else spec.name
        path = str(status.path) if status.installed else "-"
        rows.append((name, "yes" if status.installed else "no", _size(spec.size), path, spec.description))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    print("\n* default model. Any local GGUF file or model directory also works by path.")
    print("\nWhat each engine gives the gates (ragate ask --json shows it for a loaded backend):")
    for engine, gives in ENGINE_CAPABILITIES:
        print(f"  {engine:<13} {gives}")
    for status in list_models(args.home):
        if not status.installed:
            print(f"To install {status.spec.name}: {status.spec.install_hint}")
    return 0


def run_install(args: argparse.Namespace) -> int:
    spec = model_spec(args.name)
    fresh = not model_status(spec, home=args.home).installed
    path = install_model(spec.name, home=args.home, progress=not args.quiet, verify=args.verify)
    print(path)
    if fresh or args.verify:
        print(f"sha256 {spec.sha256} (verified)")
    else:
        print(f"already installed (size checked; add --verify to check sha256 {spec.sha256})")
    return 0
