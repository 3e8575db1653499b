"""Print one markdown table of a committed benchmark output file, as it stands there, for a generated block.

    .venv/bin/python scripts/show_table.py benchmarks/results/FILE.txt [--table N]

A table is a run of consecutive lines starting with ``|``. ``--table N`` picks the N-th table of the file
(0-based; negative counts from the end; default -1, the last one, the summary most benchmarks print last).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def tables(text: str) -> list[list[str]]:
    found: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line.rstrip())
        elif current:
            found.append(current)
            current = []
    if current:
        found.append(current)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--table", type=int, default=-1)
    args = parser.parse_args(argv)
    found = tables(args.file.read_text(encoding="utf-8"))
    if not found:
        parser.error(f"{args.file} holds no markdown table")
    print("\n".join(found[args.table]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
