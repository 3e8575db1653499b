"""Entry point of the ``ragate`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ragate.errors import RagateError
from ragate.version import __version__

SUBCOMMAND_MODULES = (
    "ragate.cli.ask", "ragate.cli.models", "ragate.cli.corpus", "ragate.cli.index", "ragate.cli.eval",
    "ragate.cli.tune", "ragate.cli.serve", "ragate.cli.skr", "ragate.cli.gate", "ragate.cli.reproduce",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="ragate",
        description="Decide when a language model should retrieve, and how it should choose what to read.",
    )
    parser.add_argument("--version", action="version", version=f"ragate {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except RagateError as err:
        print(f"ragate: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ragate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
