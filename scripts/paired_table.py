"""Print docs/results.md's paired table for an eval run: each comparison the page makes, in acc and in EM.

``ragate report`` writes one metric per report; ``scripts/results.sh`` writes two for each single-shot run,
``RUN/report/report.md`` (contains-accuracy) and ``RUN/report-em/report.md`` (EM), both with the page's
``--compare`` pairs. This script reads their "Paired differences" tables and prints one Markdown table with
both metrics side by side, for the pairs given (default: the page's 25), so the numbers on the page are the
reports' own, copied by a program rather than by hand.

Run: ``.venv/bin/python scripts/paired_table.py docs/results/runs/nq-open-oracle-qwen2.5-coder-1.5b-300``
(``--pairs dpr-ais:standard-rag,pairs:dpr-ais`` for others; ``--drop skr,self-eval`` leaves out the page's pairs
with methods a run lacks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PAGE_PAIRS = (
    "dpr-ais:standard-rag",
    "pairs:standard-rag",
    "pairs-exclude-num:standard-rag",
    "dtr-no-ugt:standard-rag",
    "dpr-ais:dtr-no-ugt",
    "dtr:dtr-no-ugt",
    "pairs:dpr-ais",
    "pairs-exclude-num:dpr-ais",
    "pairs-exclude-num:pairs",
    "dpr-ais-dynamic:dpr-ais",
    "dpr-ais-rerank:dpr-ais",
    "hyde:standard-rag",
    "q2d:standard-rag",
    "cot:standard-rag",
    "hyde:q2d",
    "cot:hyde",
    "llm-judge:standard-rag",
    "random:standard-rag",
    "targ-entropy:standard-rag",
    "targ-margin:standard-rag",
    "targ-variance:standard-rag",
    "self-eval:standard-rag",
    "self-rag-lite:standard-rag",
    "skr:standard-rag",
    "standard-rag:no-retrieval",
)


def paired_rows(report: Path) -> dict[tuple[str, str], list[str]]:
    """The cells of each row of the report's "## Paired differences" table, by (method, against)."""
    if not report.exists():
        raise SystemExit(f"{report} is missing: run scripts/results.sh (or ragate report) for this run first")
    rows: dict[tuple[str, str], list[str]] = {}
    inside = False
    for line in report.read_text().splitlines():
        if line.startswith("## "):
            inside = line.startswith("## Paired differences")
        elif inside and line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cells[0] != "method" and not cells[0].startswith("---"):
                rows[cells[0], cells[1]] = cells
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="an eval run directory with report/ and report-em/")
    parser.add_argument(
        "--pairs", default=",".join(PAGE_PAIRS), help="METHOD:AGAINST,... (default: the page's)"
    )
    parser.add_argument("--drop", default="", help="METHOD,...: leave out the pairs with these methods")
    args = parser.parse_args(argv)
    acc = paired_rows(args.run / "report" / "report.md")
    em = paired_rows(args.run / "report-em" / "report.md")
    drop = set(filter(None, args.drop.split(",")))
    keys = [
        (m, v) for m, _, v in (pair.partition(":") for pair in args.pairs.split(",")) if not {m, v} & drop
    ]
    for method, against in keys:
        if (method, against) not in acc or (method, against) not in em:
            raise SystemExit(
                f"{method}:{against}: not in both reports' paired tables (add --compare {method}:{against})"
            )
    print("| method | vs | n | Δacc [95%] | verdict (acc) | ΔEM [95%] | verdict (EM) |")
    print("|---|---|---|---|---|---|---|")
    for method, against in keys:
        a, e = acc[method, against], em[method, against]
        print(f"| {method} | {against} | {a[2]} | {a[3]} {a[4]} | {a[5]} | {e[3]} {e[4]} | {e[5]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
