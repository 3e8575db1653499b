"""Retrieval budgets that hold (issue H), measured by replaying stored sweep records: no new LM calls.

    .venv/bin/python benchmarks/budget.py transfer SWEEP_DIR [SWEEP_DIR ...] [--splits 1000] [--dev-share 0.5]
        [--budgets 0.1,0.2,0.3,0.5] [--confidence 0.95] [--metric acc] [--gates targ-margin,...]

``transfer``: a `ragate sweep` stores, per question, each gate's score and the closed-book and retrieval answers'
scores. Each of ``--splits`` random splits puts ``--dev-share`` of the questions in a dev set and the rest in a
test set ("new questions"); on the dev scores tau is calibrated two ways for each budget rho: the plain quantile
F^-1(1 - rho) (TARG 3.3) and the conservative order statistic of ``ragate calibrate --confidence`` (an exact
binomial bound on the rate over new questions' *distribution*), and the batch-bound order statistic of
``--batch M`` with M = the test set's size (a beta-binomial bound on the realised rate of M new questions). The
table gives, for each, the mean realised
retrieval rate on the test questions, the share of splits where it exceeds rho, and the mean test accuracy
(each question takes its retrieval answer iff its score is above tau).

The share of splits over budget mixes two kinds of chance: the dev draw (which the bound covers) and the finite
test set's own sampling noise around the true rate (which it does not: a test set of m questions moves the
realised rate by about sqrt(rho (1 - rho) / m)); the batch bound covers both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ragate.eval.calibrate import conservative_threshold, threshold_for_budget
from ragate.eval.records import read_records
from ragate.eval.sweep import method_records, swept_methods

UNCALIBRATED = ("random",)  # a coin's rate is its parameter, not a threshold on a score


def transfer_rows(
    rows: list[dict[str, Any]],
    method: str,
    budgets: list[float],
    *,
    splits: int,
    dev_share: float,
    confidence: float,
    metric: str,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per budget: the plain and the conservative tau's realised test rate, share over budget and
    accuracy, over ``splits`` random dev/test splits of ``rows`` (one sweep record per question)."""
    scores = np.array([r["gates"][method]["score"] for r in rows], dtype=np.float64)
    closed = np.array([r["closed"]["scores"][metric] for r in rows], dtype=np.float64)
    opened = np.array([r["open"]["scores"][metric] for r in rows], dtype=np.float64)
    n = len(rows)
    n_dev = round(dev_share * n)
    if not 1 <= n_dev < n:
        raise SystemExit(f"--dev-share {dev_share} leaves no dev or no test questions out of {n}")
    rng = np.random.default_rng(seed)
    out = []
    for rho in budgets:
        seen: dict[str, list[tuple[float, float]]] = {"plain": [], "conservative": [], "batch": []}
        too_few = None
        for _ in range(splits):
            order = rng.permutation(n)
            dev, test = order[:n_dev], order[n_dev:]
            taus = {"plain": threshold_for_budget(scores[dev].tolist(), rho)}
            try:
                taus["conservative"] = conservative_threshold(scores[dev].tolist(), rho, confidence).tau
                taus["batch"] = conservative_threshold(
                    scores[dev].tolist(), rho, confidence, batch=len(test)
                ).tau
            except ValueError as err:
                too_few = str(err)
            for how, tau in taus.items():
                retrieve = scores[test] > tau
                accuracy = float(np.where(retrieve, opened[test], closed[test]).mean())
                seen[how].append((float(retrieve.mean()), accuracy))
        row: dict[str, Any] = {"method": method, "budget": rho, "n": n, "dev": n_dev, "too_few": too_few}
        for how, pairs in seen.items():
            if pairs and (how == "plain" or too_few is None):
                row[how] = {
                    "rate": statistics.fmean(p[0] for p in pairs),
                    "over": statistics.fmean(float(p[0] > rho) for p in pairs),
                    "accuracy": statistics.fmean(p[1] for p in pairs),
                }
        out.append(row)
    return out


def transfer(args: argparse.Namespace) -> int:
    budgets = [float(b) for b in args.budgets.split(",")]
    for folder in args.sweeps:
        path = Path(folder) / "sweep.jsonl"
        if not path.is_file():
            print(
                f"{folder} holds no sweep.jsonl: pass the --out folder of a `ragate sweep`", file=sys.stderr
            )
            return 2
        records = read_records(path)
        gates = args.gates.split(",") if args.gates else swept_methods(records)
        print(
            f"\n{folder}: {args.splits} random splits, {100 * args.dev_share:g}% dev / the rest test, "
            f"confidence {args.confidence:g}, {args.metric}\n"
        )
        print(
            "| gate | n (dev) | budget ρ | plain τ: test rate | over ρ | "
            f"{args.metric} | conservative τ: test rate | over ρ | {args.metric} | batch-bound τ: test rate | "
            f"over ρ | {args.metric} |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for gate in gates:
            if gate in UNCALIBRATED:
                continue
            rows = method_records(records, gate)
            for row in transfer_rows(
                rows, gate, budgets, splits=args.splits, dev_share=args.dev_share,
                confidence=args.confidence, metric=args.metric, seed=args.seed,
            ):  # fmt: skip
                cells = []
                for how in ("plain", "conservative", "batch"):
                    got = row.get(how)
                    cells.append(
                        f"{got['rate']:.3f} | {100 * got['over']:.1f}% | {100 * got['accuracy']:.1f}"
                        if got
                        else "too few dev questions | – | –"
                    )
                print(
                    f"| {gate} | {row['n']} ({row['dev']}) | {row['budget']:g} | " + " | ".join(cells) + " |"
                )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser(
        "transfer", help="plain vs conservative tau on random dev/test splits of sweep records"
    )
    t.add_argument("sweeps", nargs="+", help="`ragate sweep` --out folders")
    t.add_argument("--splits", type=int, default=1000)
    t.add_argument("--dev-share", type=float, default=0.5)
    t.add_argument("--budgets", default="0.1,0.2,0.3,0.5")
    t.add_argument("--confidence", type=float, default=0.95)
    t.add_argument("--metric", choices=("em", "f1", "acc"), default="acc")
    t.add_argument("--gates", default=None, help="comma-separated (default: every swept gate but random)")
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(run=transfer)
    args = p.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
