"""How each dynamic method asked: per method of an eval run, its triggered queries and how many hold the question.

ETC and DRAGIN form their query over the question and the text so far (ETC section 3.3); issue M found that
ragate's fallback without attention kept the question in few of ETC's queries and most of DRAGIN's (by this
script's rule 48 of 321 against 413 of 642; the issue counted 59 and 441 by a rule it did not state), so the two
were compared on different queries. This prints, per method: questions, triggered retrievals (the
retrieval before generating, Single RAG's and IRCoT's first, is not counted), how many of those queries contain
the whole question (normalised as answers are: case, punctuation, articles), the share, the query forms used, how many fired on a negative score (for ETC: a sharp *drop* of entropy,
which the paper's |trend| >= alpha fires on and the authors' signed comparison does not), how often the safety
bound on retrievals was reached, and recall@3 of the passages read.

Run: ``.venv/bin/python scripts/dynamic_queries.py docs/results/runs/dynamic-hotpotqa-qwen2.5-coder-1.5b-300``
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from ragate.eval.records import by_method, latest, read_records
from ragate.text import normalize_answer


def _fold(text: str) -> str:
    return normalize_answer(text)  # SQuAD's: case, punctuation, articles and white space folded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="eval run directories")
    ap.add_argument("--methods", default=None, help="comma-separated methods (default: every dynamic one)")
    args = ap.parse_args(argv)
    wanted = set(args.methods.split(",")) if args.methods else None
    print(
        "| run | method | questions | triggered queries | with the question | share | forms | fired on a negative "
        "score | bound reached | recall@3 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        path = run / "questions.jsonl"
        if not path.is_file():
            raise SystemExit(f"error: {path} does not exist: give an eval run directory")
        for method, rows in by_method(latest(read_records(path, repair=False))):
            if (wanted and method not in wanted) or not any("dynamic" in r.get("trace", {}) for r in rows):
                continue
            queries = with_question = bound = negative = 0
            forms: Counter[str] = Counter()
            recalls = [r["recall@3"] for r in rows if r.get("recall@3") is not None]
            for r in rows:
                info = r["trace"].get("dynamic") or {}
                bound += bool(info.get("bound_reached"))
                question = _fold(r["question"])
                for event in info.get("retrievals", []):
                    if event["query_form"] == "initial":
                        continue
                    queries += 1
                    forms[event["query_form"]] += 1
                    with_question += question in _fold(event["query"])
                    negative += event["score"] < 0
            share = f"{100 * with_question / queries:.1f}%" if queries else "–"
            recall = f"{100 * sum(recalls) / len(recalls):.1f}" if recalls else "–"
            used = ", ".join(f"{f} {n}" for f, n in forms.most_common()) or "–"
            print(
                f"| {run.name} | {method} | {len(rows)} | {queries} | {with_question} | {share} | {used} | {negative} | "
                f"{bound} | {recall} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
