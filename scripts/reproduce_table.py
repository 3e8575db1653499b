"""Print a ``ragate reproduce`` run's table from its committed ``reproduce.json``: ragate's side, or the paper's.

    .venv/bin/python scripts/reproduce_table.py docs/results/runs/reproduce-NAME [--paper] [--ran-only] [--seed N]

Default: ragate's measured side (n, EM with its bootstrap 95% interval, where the paper's number lies against
that interval, F1, accuracy (gold answer contained), retrieval rate, the row's note). ``--paper``: the numbers the
pack transcribes from the paper (EM, F1, retrieval rate; not measured here). ``--ran-only`` leaves out the rows
this run did not answer (n = 0). ``--seed N`` (and ``--resamples``) computes each row again from the run's
records with today's ragate, its interval drawn with that seed (:func:`ragate.report.reproduce.rescored`),
rather than printing what ``ragate reproduce`` wrote.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ragate.eval.metrics import DEFAULT_BOOT, Resampling
from ragate.report.reproduce import rescored


def _num(value: Any, rate: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if rate else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--paper", action="store_true", help="the paper's numbers, not ragate's")
    parser.add_argument("--ran-only", action="store_true", help="leave out rows with n = 0")
    parser.add_argument("--seed", type=int, default=None, help="draw the intervals again from the run's records")
    parser.add_argument("--resamples", type=int, default=None, help="with --seed: the bootstrap's resamples (1000)")
    args = parser.parse_args(argv)
    if args.resamples is not None and args.seed is None:
        parser.error("--resamples redraws the intervals with --seed: give --seed too")
    if args.seed is None:  # as `ragate reproduce` wrote them
        table = json.loads((args.run / "reproduce.json").read_text(encoding="utf-8"))
    else:
        table = rescored(args.run, Resampling(DEFAULT_BOOT.samples if args.resamples is None else args.resamples, args.seed))
    rows = [r for r in table["rows"] if not (args.ran_only and not r["n"])]
    if args.paper:
        print(f"| dataset | paper row | {table['paper_model']} EM | F1 | retrieval rate |")
        print("|---|---|---:|---:|---:|")
        for r in rows:
            p = r["paper"]
            em = p.get("em") if p.get("em") is not None else p.get("acc")
            print(
                f"| {r['dataset']} | {r['label']} | {_num(em)} | {_num(p.get('f1'))} "
                f"| {_num(p.get('retrieval_rate'), True)} |"
            )
        return 0
    print(
        "| dataset | paper row | ragate method | n | EM [95%] | paper's EM | F1 | acc | retrieval rate | note |"
    )
    print("|---|---|---|---:|---|---|---:|---:|---:|---|")
    for r in rows:
        paper, ours, ci = r["paper"], r["ours"], r["interval"]
        metric = "em" if paper.get("em") is not None else "acc"
        where = ""
        if ci and paper.get(metric) is not None:
            lo, hi = ci
            where = "in" if lo <= paper[metric] <= hi else ("above" if paper[metric] > hi else "below")
        measured = f"{ours[metric]:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]" if ours and ci else "-"
        print(
            f"| {r['dataset']} | {r['label']} | {r['method'] or '-'} | {r['n'] or '-'} | {measured} | {where} "
            f"| {_num(ours.get('f1'))} | {_num(ours.get('acc'))} | {_num(ours.get('retrieval_rate'), True)} "
            f"| {r['note']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
