"""A live route budget (issue 78), measured by replaying route runs' records: no model call.

    .venv/bin/python benchmarks/route_budget.py RUN [RUN ...] [--routes wo-rag,single-rag,ircot] [--budget 0.8]
        [--window 30] [--seed 0] [--metric em]

The questions every route answered in the runs (``ragate eval --methods wo-rag,single-rag,ircot``, one run per
dataset) are split, per dataset and seeded, in halves. The learned route policy is fitted on the first halves
pooled, its lambda the most accurate within ``--budget`` mean retrievals per question there (what ``ragate
calibrate --gate route --policy learned --budget B`` saves). The second halves are played as a request stream, one
dataset after another (a mix that shifts, as traffic does), each shuffled. Each request is answered by the learned
policy at a fixed lambda (the file's) and at the lambda the live controller sets before it
(:class:`ragate.state.route_budget.RouteBudgetController`, at each of ``--gains``: 0, its default 2, the gate's
16): the route taken is the one
the policy takes at that lambda, its retrievals and score are the route's records (the first route's retrievals
added, since the policy has run it). It prints, per policy and per phase, the mean retrievals per question and the
accuracy, and the largest deviation from the budget of the mean retrievals over a window of W requests, over
the windows that begin after the first W requests.

``--against-adaptive SEEDS`` asks issue 78's second target of the live budget: on each seed's split, Adaptive-RAG's
question classifier is fitted on the same first halves and answers the stream; the learned policy, fitted there
for the retrievals adaptive-rag spent on the stream, answers it at the file's lambda and with lambda held live at
that mean (the controller, default gain). Per seed, each one's mean retrievals and score; then each question's
difference from adaptive-rag averaged over the seeds that played it, with a bootstrap 95% interval over questions
(``--resamples``, ``--interval-seed``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ragate.eval.metrics import bootstrap_ci
from ragate.methods import get_method
from ragate.methods.route_policy import adaptive_choice, right_probabilities
from ragate.report.routes import fit_adaptive, fit_learned, learned_x, read_route_table
from ragate.state.route_budget import ROUTE_GAIN, RouteBudgetController


def split(table: Any, seed: int) -> tuple[list[int], list[tuple[str, np.ndarray]]]:
    """The fit's rows (the first half of each dataset's, seeded shuffle) and the stream's phases (the other halves,
    one dataset after another)."""
    rng = np.random.default_rng(seed)
    fit_rows, phases = [], []
    for dataset in dict.fromkeys(table.datasets):
        rows = rng.permutation([i for i, d in enumerate(table.datasets) if d == dataset])
        fit_rows += rows[: len(rows) // 2].tolist()
        phases.append((dataset, rows[len(rows) // 2 :]))
    return fit_rows, phases


def play(model: Any, played: Any, routes: tuple[str, ...], budget: float, window: int, gain: float | None) -> tuple[np.ndarray, np.ndarray]:
    """The route the learned ``model`` takes on each request of ``played``, in order, at the file's lambda (``gain``
    None) or the live controller's, and the retrievals each request paid (the first route's counted)."""
    right = right_probabilities(model, learned_x(played))
    costs = np.asarray(model.costs)
    spent = played.costs["retrievals"]
    spent = spent + spent[:, :1] * (np.arange(len(routes)) > 0)  # the first route has run: its retrievals count
    base = get_method("route")
    assert base.route is not None
    spec = base.with_(route=replace(base.route, routes=routes, policy="learned", model=model))
    live = None if gain is None else RouteBudgetController(budget, window, spec, None, gain=gain)
    took = []
    for i in range(len(played)):
        lam = model.lam if live is None else live.tau
        j = int((right[i] - lam * costs).argmax())
        took.append(j)
        if live is not None:
            live.record(right[i].tolist(), float(spent[i, j]))
    return np.array(took, dtype=int), spent[np.arange(len(played)), took]


def replay(table: Any, routes: tuple[str, ...], args: argparse.Namespace, budget: float, seed: int) -> dict[str, Any]:
    """One split and stream at one budget: per policy (the file's lambda, then each gain), per phase and over all,
    the mean retrievals and the score, and the largest windowed deviation from the budget after the first W."""
    fit_rows, phases = split(table, seed)
    model = fit_learned(table.take(np.array(fit_rows)), args.metric, budget)
    stream = np.concatenate([rows for _, rows in phases])
    played = table.take(stream)
    scores = played.scores[args.metric]
    policies: dict[str, dict[str, Any]] = {}
    gains = [float(g) for g in args.gains.split(",")]
    for name, gain in [("fixed lambda (the file's)", None), *((f"controller, gain {g:g}", g) for g in gains)]:
        took, paid = play(model, played, routes, budget, args.window, gain)
        got = scores[np.arange(len(stream)), took]
        windowed = np.convolve(paid, np.ones(args.window) / args.window, mode="valid")[args.window :]
        cells, at = [], 0
        for _, rows in phases:
            cells.append((float(paid[at : at + len(rows)].mean()), float(got[at : at + len(rows)].mean())))
            at += len(rows)
        worst = float(np.abs(windowed - budget).max()) if len(windowed) else float("nan")
        policies[name] = {"phases": cells, "all": (float(paid.mean()), float(got.mean())), "worst": worst}
    return {"fit": len(fit_rows), "model": model, "phases": [(d, len(r)) for d, r in phases], "policies": policies}


def against_adaptive(table: Any, routes: tuple[str, ...], args: argparse.Namespace, seeds: list[int]) -> None:
    """Print the learned policy against adaptive-rag at adaptive-rag's retrievals (see the module docstring)."""
    metric = args.metric.upper()
    diffs: dict[str, dict[int, list[float]]] = {"file": {}, "live": {}}
    print(f"the learned policy against adaptive-rag at the retrievals adaptive-rag spent, per seed's split (first "
          f"halves fit both, the second halves played); window {args.window}, gain {ROUTE_GAIN:g}; {metric} x 100; "
          f"intervals: seed {args.interval_seed}, {args.resamples} resamples")
    print()
    print(f"| seed | adaptive-rag: retrievals, {metric} | learned, the file's lambda | learned, lambda held live |")
    print("|---|---|---|---|")
    for seed in seeds:
        fit_rows, phases = split(table, seed)
        fit = table.take(np.array(fit_rows))
        stream = np.concatenate([rows for _, rows in phases])
        played = table.take(stream)
        scores, n = played.scores[args.metric], len(stream)
        chose = adaptive_choice(fit_adaptive(fit, args.metric), played.question_x)[0]
        theirs, paid = scores[np.arange(n), chose], played.costs["retrievals"][np.arange(n), chose]
        budget = float(paid.mean())
        model = fit_learned(fit, args.metric, budget)
        cells = []
        for name, gain in (("file", None), ("live", ROUTE_GAIN)):
            took, spent = play(model, played, routes, budget, args.window, gain)
            ours = scores[np.arange(n), took]
            cells.append(f"{spent.mean():.2f}, {100 * ours.mean():.1f}")
            for row, d in zip(stream.tolist(), (ours - theirs).tolist(), strict=True):
                diffs[name].setdefault(row, []).append(d)
        print(f"| {seed} | {budget:.2f}, {100 * theirs.mean():.1f} | {cells[0]} | {cells[1]} |")
    print()
    for name, label in (("file", "the file's lambda"), ("live", "lambda held live")):
        per = [float(np.mean(v)) for v in diffs[name].values()]
        low, high = bootstrap_ci(per, samples=args.resamples, seed=args.interval_seed)
        verdict = "higher" if low > 0 else "lower" if high < 0 else "not established"
        print(f"learned ({label}) minus adaptive-rag, each question's mean over the seeds that played it ({len(per)} "
              f"questions): {100 * np.mean(per):+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] ({verdict})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="eval runs of every route (one per dataset), played in order")
    p.add_argument("--routes", default="wo-rag,single-rag,ircot")
    p.add_argument("--budget", type=float, default=0.8, help="mean retrievals per question")
    p.add_argument("--window", type=int, default=30)
    p.add_argument("--metric", choices=("em", "f1", "acc"), default="em")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gains", default="0,2,16", help="the controller's gains to compare (comma-separated)")
    p.add_argument("--summary", default=None, metavar="SEEDS:BUDGETS",
                   help="e.g. 0,1,2:0.5,0.8,1.2: one row per policy over every seed and budget (mean |spent - budget|,"
                        " mean largest windowed deviation, mean score and its difference from gain 0's)")  # fmt: skip
    p.add_argument("--against-adaptive", default=None, metavar="SEEDS",
                   help="e.g. 0,1,2: the learned policy against adaptive-rag at adaptive-rag's retrievals")
    p.add_argument("--resamples", type=int, default=1000, help="with --against-adaptive: the bootstrap's resamples")
    p.add_argument("--interval-seed", type=int, default=0, help="with --against-adaptive: the bootstrap's seed")
    args = p.parse_args(argv)
    routes = tuple(args.routes.split(","))
    table = read_route_table(args.runs, routes)
    metric = args.metric.upper()
    if args.against_adaptive:
        against_adaptive(table, routes, args, [int(v) for v in args.against_adaptive.split(",")])
        return 0
    if args.summary:
        seeds, budgets = ([float(v) for v in part.split(",")] for part in args.summary.split(":"))
        runs = [replay(table, routes, args, b, int(s)) for s in seeds for b in budgets]
        print(f"{len(runs)} replays (seeds {', '.join(f'{s:g}' for s in seeds)} x budgets "
              f"{', '.join(f'{b:g}' for b in budgets)}), window {args.window}; means over them; {metric} x 100")  # fmt: skip
        print()
        print(f"| policy | mean retrievals minus budget, absolute | largest windowed deviation | {metric} | "
              f"{metric} minus gain 0's |")  # fmt: skip
        print("|---|---|---|---|---|")
        pairs = [(b, run) for run, (_, b) in zip(runs, [(s, b) for s in seeds for b in budgets], strict=True)]
        for name in runs[0]["policies"]:
            off = np.mean([abs(run["policies"][name]["all"][0] - b) for b, run in pairs])
            worst = np.mean([run["policies"][name]["worst"] for _, run in pairs])
            score = np.mean([run["policies"][name]["all"][1] for _, run in pairs])
            base = np.mean([run["policies"]["controller, gain 0"]["all"][1] for _, run in pairs])
            print(f"| {name} | {off:.3f} | {worst:.2f} | {100 * score:.1f} | {100 * (score - base):+.1f} |")
        return 0
    run = replay(table, routes, args, args.budget, args.seed)
    model = run["model"]
    print(f"{run['fit']} questions fit the learned policy for {args.budget:g} mean retrievals per question "
          f"(lambda {model.lam:.4f}; route costs {', '.join(f'{c:.2f}' for c in model.costs)}); "
          f"{sum(n for _, n in run['phases'])} played in {len(run['phases'])} phases "
          f"({', '.join(f'{d} {n}' for d, n in run['phases'])}); window {args.window}; {metric} x 100")  # fmt: skip
    print()
    print("| policy | " + " | ".join(f"{d}: retrievals, {metric}" for d, _ in run["phases"])
          + f" | all: retrievals, {metric} | largest windowed deviation after the first W |")  # fmt: skip
    print("|---" * (len(run["phases"]) + 3) + "|")
    for name, row in run["policies"].items():
        cells = " | ".join(f"{r:.2f}, {100 * e:.1f}" for r, e in row["phases"])
        print(f"| {name} | {cells} | {row['all'][0]:.2f}, {100 * row['all'][1]:.1f} | {row['worst']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
