"""Print TARG's prefix-length table (acc and agreement with k = 20 at each budget) from committed gate sweeps.

    .venv/bin/python scripts/prefix_table.py docs/results/runs/sweep-gates-nq-open-oracle-qwen2.5-coder-1.5b-300 \
        docs/results/runs/sweep-gates-hotpotqa-qwen2.5-coder-1.5b-300

For each sweep, gate (targ-margin, targ-entropy) and budget (0.1, 0.2, 0.3, 0.5) it runs what ``ragate calibrate
--gate GATE --prefixes 5,10,20 --budget RHO --metric acc --from-sweep SWEEP`` computes (no model call, no file
written) and prints one row: the accuracy at that budget for k = 5 / 10 / 20 and how often k = 5's and k = 10's
decisions agree with k = 20's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragate.tuning.calibrate import calibrate_prefixes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", type=Path, nargs="+")
    parser.add_argument("--gates", default="targ-margin,targ-entropy")
    parser.add_argument("--budgets", default="0.1,0.2,0.3,0.5")
    parser.add_argument("--metric", choices=("em", "f1", "acc"), default="acc")
    args = parser.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",")]
    print(
        f"| sweep | n | gate | budget | {args.metric}, k = 5 / 10 / 20 | agreement with k = 20: k = 5 / 10 |\n"
        "|---|---|---|---|---|---|"
    )
    for sweep in args.sweeps:
        dataset = json.loads((sweep / "config.json").read_text()).get("dataset", sweep.name)
        for gate in args.gates.split(","):
            for budget in budgets:
                result = calibrate_prefixes(
                    gate, (5, 10, 20), budget, from_sweep=sweep, progress=False, metric=args.metric
                )
                rows = {row["k"]: row for row in result["prefixes"]}
                acc = " / ".join(f"{100 * rows[k][args.metric]:.1f}" for k in (5, 10, 20))
                agree = " / ".join(
                    "-" if rows[k].get("agreement_with_k20") is None else f"{100 * rows[k]['agreement_with_k20']:.0f}%"
                    for k in (5, 10)
                )
                print(f"| {dataset} | {result['n']} | {gate} | {budget:g} | {acc} | {agree} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
