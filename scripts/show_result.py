"""Print a committed benchmark output file as a fenced text block, for a generated block of the docs.

    .venv/bin/python scripts/show_result.py benchmarks/results/FILE.txt
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: show_result.py FILE", file=sys.stderr)
        return 2
    text = Path(argv[0]).read_text(encoding="utf-8").strip("\n")
    print("```text\n" + text + "\n```")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
