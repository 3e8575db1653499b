"""Retrieval budgets that hold (issue H), measured by replaying stored sweep records: no new LM calls.

    .venv/bin/python benchmarks/budget.py transfer SWEEP_DIR [SWEEP_DIR ...] [--splits 1000] [--dev-share 0.5]
        [--budgets 0.1,0.2,0.3,0.5] [--confidence 0.95] [--metric acc] [--gates targ-margin,...] [--summary]
    .venv/bin/python benchmarks/budget.py drift SWEEP_DIR SWEEP_DIR [...] --gate targ-margin [--budget 0.3]
        [--window 50] [--plot drift.png]
    .venv/bin/python benchmarks/budget.py in-order SWEEP_DIR [...] [--gates dtr,targ-margin] [--budget 0.3]
        [--dev 150] [--window 50]

``transfer``: a `ragate sweep` stores, per question, each gate's score and the closed-book and retrieval answers'
scores. Each of ``--splits`` random splits puts ``--dev-share`` of the questions in a dev set and the rest in a
test set ("new questions"); on the dev scores tau is calibrated two ways for each budget rho: the plain quantile
F^-1(1 - rho) (TARG 3.3) and the conservative order statistic of ``ragate calibrate --confidence`` (an exact
binomial bound on the rate over new questions' *distribution*), and the batch-bound order statistic of
``--batch M`` with M = the test set's size (a beta-binomial bound on the realised rate of M new questions). The
table gives, for each, the mean realised
retrieval rate on the test questions, the share of splits where it exceeds rho, and the mean test accuracy
(each question takes its retrieval answer iff its score is above tau). ``--summary`` prints instead one row per
sweep: the min-max over gates and budgets of each tau's share of splits over budget, the batch bound's exact tail,
and the batch bound's accuracy cost against the plain quantile at rho = 0.3 (docs/evaluation.md's table).

The share of splits over budget mixes two kinds of chance: the dev draw (which the bound covers) and the finite
test set's own sampling noise around the true rate (which it does not: a test set of m questions moves the
realised rate by about sqrt(rho (1 - rho) / m)); the batch bound covers both.

``drift``: the questions of several sweeps (one gate, one model, e.g. NQ then HotpotQA then StrategyQA), each
shuffled, are played one phase after another as a request stream. A fixed tau, calibrated on the first W requests
(the traffic it was deployed on), and the service's controller (:class:`ragate.state.budget.BudgetController`,
tau = the quantile of the last W scores) decide each request in turn. It prints each one's largest deviation of
the windowed retrieval rate from rho after the first W requests, the share of requests outside rho +- 0.05, and
accuracy per phase from the recorded closed-book and retrieval answers; ``--plot`` draws the windowed rates.
Deviations count the windows that begin after the first W requests (the controller's first window is its
warm-up); a window of W i.i.d. requests at rate rho varies by about sqrt(rho (1 - rho) / W) by chance alone.

``in-order``: what an offline tau does when the next questions are not like the ones it was set on. The sweep's
questions are kept in file order (a file is often not in random order: HotpotQA's dev file starts with bridge
questions); tau is set on the first ``--dev`` questions (plain quantile, ``--confidence``, and the batch bound
for the rest) and applied to the rest, and the controller (window W) decides the same stream one request at a
time. It prints the rate each gives on the rest, and the controller's largest windowed deviation there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ragate.eval.sweep import compact, method_records, swept_methods
from ragate.methods import get_method
from ragate.service.budget import DEFAULT_GAIN, BudgetController
from ragate.tuning.calibrate import conservative_threshold, threshold_for_budget

UNCALIBRATED = ("random",)  # a coin's rate is its parameter, not a threshold on a score

HOWS = ("fixed", "quantile", "controller")

CHUNK = 2000  # transfer's splits drawn and scored this many at a time (memory: a few MB per 1,000 at n = 300)


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
    ranks = np.arange(n_dev, dtype=np.float64)  # the bounds' k depend on n, m, rho and the confidence only
    for rho in budgets:
        seen: dict[str, list[tuple[float, float]]] = {"plain": [], "conservative": [], "batch": []}
        too_few = None
        ks: dict[str, int] = {}
        try:
            ks["conservative"] = conservative_threshold(ranks, rho, confidence).k
            ks["batch"] = conservative_threshold(ranks, rho, confidence, batch=n - n_dev).k
        except ValueError as err:
            too_few = str(err)
        threshold_for_budget(scores, rho)  # its checks (a budget in [0, 1], finite scores), once
        done = 0
        while done < splits:  # in chunks, drawn in the same order as one at a time: the same splits
            chunk = min(CHUNK, splits - done)
            done += chunk
            order = np.stack([rng.permutation(n) for _ in range(chunk)])
            dev, test = order[:, :n_dev], order[:, n_dev:]
            ordered = np.sort(scores[dev], axis=1)
            taus = {"plain": plain_taus(ordered, rho)}  # = threshold_for_budget(scores[dev], rho), per split
            taus |= {how: ordered[:, k - 1] for how, k in ks.items()}  # = conservative_threshold(...).tau
            for how, tau in taus.items():
                retrieve = scores[test] > tau[:, None]
                accuracy = np.where(retrieve, opened[test], closed[test]).mean(axis=1)
                seen[how].extend(zip(retrieve.mean(axis=1).tolist(), accuracy.tolist(), strict=True))
        row: dict[str, Any] = {"method": method, "budget": rho, "n": n, "dev": n_dev, "too_few": too_few}
        for how, pairs in seen.items():
            if pairs and (how == "plain" or too_few is None):
                row[how] = {
                    "rate": statistics.fmean(p[0] for p in pairs),
                    "over": statistics.fmean(float(p[0] > rho) for p in pairs),
                    "accuracy": statistics.fmean(p[1] for p in pairs),
                }
        if "batch" in ks and "batch" in row:
            row["batch"]["exact_over"] = batch_exceedance(n_dev, n - n_dev, ks["batch"], rho)
        out.append(row)
    return out


def plain_taus(ordered: np.ndarray, rho: float) -> np.ndarray:
    """threshold_for_budget of each row of ``ordered`` (each split's dev scores, sorted): the inverted-CDF
    quantile F^-1(1 - rho), the smallest score s with F(s) >= 1 - rho; below every score at rho = 1."""
    if rho >= 1.0:
        return np.nextafter(ordered[:, 0], -np.inf)
    return np.quantile(ordered, round(1.0 - rho, 12), axis=1, method="inverted_cdf")


def batch_exceedance(n_dev: int, m: int, k: int, rho: float) -> float:
    """P(more than rho * m of m new questions score above s_(k), the k-th smallest of n_dev dev scores): the
    beta-binomial tail that the batch bound keeps at most 1 - confidence, exact for distinct exchangeable scores
    (a random dev/test split of one pool is such a draw). What the splits' share over budget estimates."""
    from scipy.stats import betabinom

    return float(1.0 - betabinom.cdf(np.floor(rho * m + 1e-9), m, n_dev - k + 1, k))


def transfer(args: argparse.Namespace) -> int:
    budgets = [float(b) for b in args.budgets.split(",")]
    se = 100 * (0.05 * 0.95 / args.splits) ** 0.5
    summary: list[tuple[str, list[dict[str, Any]]]] = []
    for folder in args.sweeps:
        path = Path(folder) / "sweep.jsonl"
        if not path.is_file():
            print(
                f"{folder} holds no sweep.jsonl: pass the --out folder of a `ragate sweep`", file=sys.stderr
            )
            return 2
        records = compact(path)
        gates = args.gates.split(",") if args.gates else swept_methods(records)
        if not args.summary:
            print(
                f"\n{folder}: {args.splits} random splits, {100 * args.dev_share:g}% dev / the rest test, "
                f"confidence {args.confidence:g}, {args.metric}; a share over budget near 5% has a Monte-Carlo "
                f"s.e. of {se:.2f} points; 'exact' is the beta-binomial P(over ρ) of the batch bound's k\n"
            )
            print(
                "| gate | n (dev) | budget ρ | plain τ: test rate | over ρ | "
                f"{args.metric} | conservative τ: test rate | over ρ | {args.metric} | batch-bound τ: test rate | "
                f"over ρ (exact) | {args.metric} |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        mine: list[dict[str, Any]] = []
        for gate in gates:
            if gate in UNCALIBRATED:
                continue
            rows = method_records(records, gate)
            for row in transfer_rows(
                rows, gate, budgets, splits=args.splits, dev_share=args.dev_share,
                confidence=args.confidence, metric=args.metric, seed=args.seed,
            ):  # fmt: skip
                mine.append(row)
                if args.summary:
                    continue
                cells = []
                for how in ("plain", "conservative", "batch"):
                    got = row.get(how)
                    exact = f" ({100 * got['exact_over']:.1f}%)" if got and "exact_over" in got else ""
                    cells.append(
                        f"{got['rate']:.3f} | {100 * got['over']:.1f}%{exact} | {100 * got['accuracy']:.1f}"
                        if got
                        else "too few dev questions | – | –"
                    )
                print(
                    f"| {gate} | {row['n']} ({row['dev']}) | {row['budget']:g} | " + " | ".join(cells) + " |"
                )
        summary.append((Path(folder).name, mine))
    if args.summary:
        print_transfer_summary(summary, args, budgets, se)
    return 0


COST_AT = 0.3  # the budget at which --summary gives the batch bound's accuracy cost


def print_transfer_summary(
    summary: list[tuple[str, list[dict[str, Any]]]], args: argparse.Namespace, budgets: list[float], se: float
) -> None:
    """One row per sweep: the min-max over gates and budgets of each tau's share of splits over budget, the
    batch bound's exact P(over rho), and the batch bound's accuracy cost against the plain quantile at COST_AT."""

    def span(values: list[float], unit: str = "%") -> str:
        return f"{min(values):.1f}–{max(values):.1f}{unit}" if values else "–"

    cost = any(abs(b - COST_AT) < 1e-12 for b in budgets)
    paid_head = f" {args.metric} cost of the batch bound at ρ = {COST_AT:g} (largest: plain τ → batch τ) |"
    print(
        "| sweep (n: dev / test) | plain quantile: splits over ρ | conservative (population) τ: over ρ | "
        "batch-bound τ (`--batch M`): over ρ | its exact P(over ρ) |" + (paid_head if cost else "")
    )
    print("|---|---|---|---|---|" + ("---|" if cost else ""))
    gap = 0.0  # the largest |Monte-Carlo share - exact tail| of the batch bound, in points
    for name, rows in summary:
        over = {how: [100 * r[how]["over"] for r in rows if how in r] for how in ("plain", "conservative")}
        batch = [r["batch"] for r in rows if "exact_over" in r.get("batch", {})]
        over["batch"] = [100 * b["over"] for b in batch]
        exact = [100 * b["exact_over"] for b in batch]
        gap = max([gap] + [abs(o - e) for o, e in zip(over["batch"], exact, strict=True)])
        sizes = sorted({(r["n"], r["dev"]) for r in rows})
        label = ", ".join(f"{n}: {dev} / {n - dev}" for n, dev in sizes)
        cells = [span(over["plain"]), span(over["conservative"]), span(over["batch"]), span(exact)]
        if cost:
            paid = [
                (100 * (r["plain"]["accuracy"] - r["batch"]["accuracy"]), r)
                for r in rows
                if abs(r["budget"] - COST_AT) < 1e-12 and "batch" in r
            ]
            if paid:
                _, r = max(paid, key=lambda c: c[0])
                cells.append(
                    span([c for c, _ in paid], " points")
                    + f" ({r['method']}: {100 * r['plain']['accuracy']:.1f} → {100 * r['batch']['accuracy']:.1f})"
                )
            else:
                cells.append("–")
        print(f"| {name} ({label}) | " + " | ".join(cells) + " |")
    gates = list(dict.fromkeys(r["method"] for _, rows in summary for r in rows))
    print(
        f"\nMin–max over the gates {', '.join(gates)} and the budgets ρ = {', '.join(f'{b:g}' for b in budgets)}; "
        f"{args.splits} random splits each, {100 * args.dev_share:g}% dev / the rest test, confidence "
        f"{args.confidence:g}, {args.metric}. A share over budget near 5% has a Monte-Carlo s.e. of {se:.2f} points; "
        f"the batch bound's share is at most {gap:.2f} points ({gap / se:.1f} s.e.) from its exact P(over ρ)."
    )


def replay(
    phases: list[list[dict[str, Any]]],
    gate: str,
    budget: float,
    window: int,
    metric: str,
    gain: float = DEFAULT_GAIN,
) -> dict[str, Any]:
    """Decisions of a fixed tau (the quantile of the first ``window`` scores), of the plain windowed quantile
    (the controller with gain 0) and of the controller with ``gain`` over the concatenated ``phases``; per
    request, for each: retrieved, correct; and the windowed rates."""
    from ragate.methods import get_method
    from ragate.service.budget import BudgetController

    stream = [(p, r) for p, rows in enumerate(phases) for r in rows]
    if len(stream) <= window:
        raise SystemExit(f"{len(stream)} requests in all: the stream must be longer than --window {window}")
    scores = [r["gates"][gate]["score"] for _, r in stream]
    fixed_tau = threshold_for_budget(scores[:window], budget)
    controllers = {
        "quantile": BudgetController(budget, window, get_method(gate), None, gain=0.0),
        "controller": BudgetController(budget, window, get_method(gate), None, gain=gain),
    }
    out: dict[str, Any] = {how: [] for how in HOWS} | {
        "phase": [p for p, _ in stream],
        "fixed_tau": fixed_tau,
    }
    for (_, r), s in zip(stream, scores, strict=True):
        decisions = {"fixed": s > fixed_tau} | {how: s > c.tau for how, c in controllers.items()}
        for how, c in controllers.items():
            c.observe(s, decisions[how])
        for how, retrieve in decisions.items():
            answer = r["open"] if retrieve else r["closed"]
            out[how].append((retrieve, answer["scores"][metric]))
    for how in HOWS:
        retrieved = np.array([d[0] for d in out[how]], dtype=np.float64)
        rates = np.convolve(
            retrieved, np.ones(window) / window, mode="valid"
        )  # rate over the last W requests
        out[f"{how}_rates"] = rates  # rates[i]: requests i .. i + W - 1
    return out


def drift(args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    phases, names = [], []
    for folder in args.sweeps:
        path = Path(folder) / "sweep.jsonl"
        if not path.is_file():
            print(
                f"{folder} holds no sweep.jsonl: pass the --out folder of a `ragate sweep`", file=sys.stderr
            )
            return 2
        rows = method_records(compact(path), args.gate)
        phases.append([rows[i] for i in rng.permutation(len(rows))])
        names.append(Path(folder).name)
    got = replay(phases, args.gate, args.budget, args.window, args.metric, args.gain)
    phase = np.array(got["phase"])
    print(
        f"\n{args.gate}, budget {args.budget:g}, window {args.window}: "
        + " -> ".join(f"{n} ({len(p)})" for n, p in zip(names, phases, strict=True))
        + f"; fixed tau {got['fixed_tau']:.4g} (the quantile of the first {args.window} requests)\n"
    )
    print(
        "| decided by | largest deviation of the windowed rate from ρ | windows outside ρ ± 0.05 | "
        + " | ".join(f"{n}: rate / {args.metric}" for n in names)
        + " |"
    )
    print("|---|---|---|" + "---|" * len(names))
    labels = {
        "fixed": "fixed τ",
        "quantile": "windowed quantile (gain 0)",
        "controller": f"controller, gain {args.gain:g}",
    }
    for how in HOWS:
        rates = got[f"{how}_rates"][args.window :]  # windows that begin after the first W requests
        deviation = np.abs(rates - args.budget) if rates.size else np.zeros(1)
        cells = []
        for p in range(len(phases)):
            mine = [d for d, q in zip(got[how], phase, strict=True) if q == p]
            cells.append(f"{np.mean([d[0] for d in mine]):.2f} / {100 * np.mean([d[1] for d in mine]):.1f}")
        print(
            f"| {labels[how]} | {deviation.max():.3f} | {100 * np.mean(deviation > 0.05):.1f}% | "
            + " | ".join(cells)
            + " |"
        )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 3.5))
        x = np.arange(args.window, args.window + len(got["fixed_rates"]))
        ax.plot(x, got["fixed_rates"], label=f"fixed τ = {got['fixed_tau']:.3g}")
        ax.plot(x, got["quantile_rates"], label=f"windowed quantile (window {args.window}, gain 0)")
        ax.plot(x, got["controller_rates"], label=f"controller (window {args.window}, gain {args.gain:g})")
        ax.axhspan(args.budget - 0.05, args.budget + 0.05, color="grey", alpha=0.2, label="ρ ± 0.05")
        for start in np.flatnonzero(np.diff(phase)) + 1:
            ax.axvline(start, color="black", linestyle=":", linewidth=1)
        ax.set_xlabel("request")
        ax.set_ylabel(f"retrieval rate, last {args.window}")
        ax.set_title(f"{args.gate}: " + " → ".join(names), fontsize=8)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}", file=sys.stderr)
        from ragate.report.plots import figure_data

        print("\n" + figure_data({f"{how} rates": got[f"{how}_rates"] for how in HOWS} | {"phase": phase}))
    return 0


def in_order(args: argparse.Namespace) -> int:
    print(
        f"| sweep | gate | plain tau: rate on the rest | --confidence {args.confidence:g} | batch bound | "
        f"controller (window {args.window}): rate on the rest, largest windowed deviation |"
    )
    print("|---|---|---|---|---|---|")
    for folder in args.sweeps:
        path = Path(folder) / "sweep.jsonl"
        if not path.is_file():
            print(f"{folder} holds no sweep.jsonl: pass the --out folder of a `ragate sweep`", file=sys.stderr)
            return 2
        records = compact(path)  # one record per (question, family), in the order they were written
        gates = args.gates.split(",") if args.gates else [g for g in swept_methods(records) if g not in UNCALIBRATED]
        for gate in gates:
            scores = [float(r["gates"][gate]["score"]) for r in method_records(records, gate)]
            dev, rest = scores[: args.dev], scores[args.dev :]
            if not rest:
                raise SystemExit(f"{folder}: {len(scores)} questions; --dev {args.dev} leaves none to apply tau to")
            taus = (
                threshold_for_budget(dev, args.budget),
                conservative_threshold(dev, args.budget, args.confidence).tau,
                conservative_threshold(dev, args.budget, args.confidence, batch=len(rest)).tau,
            )
            rates = [float(np.mean(np.asarray(rest) > tau)) for tau in taus]
            controller = BudgetController(args.budget, args.window, get_method(gate), None)
            decided = []
            for s_ in scores:
                decided.append(s_ > controller.tau)
                controller.observe(s_, decided[-1])
            tail = np.asarray(decided[args.dev :], dtype=np.float64)
            windows = np.convolve(tail, np.ones(args.window) / args.window, mode="valid")
            print(
                f"| {Path(folder).name} | {gate} | "
                + " | ".join(f"{r:.3f}" for r in rates)
                + f" | {tail.mean():.3f}, {np.abs(windows - args.budget).max():.3f} |"
            )
    print(
        f"\nbudget {args.budget:g}; tau set on the first {args.dev} questions in file order, applied to the rest; "
        "the controller starts cold at the method's own tau on the first question"
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
    t.add_argument(
        "--summary", action="store_true",
        help="one row per sweep: the min-max over gates and budgets of each column (the table in docs/evaluation.md)",
    )  # fmt: skip
    t.set_defaults(run=transfer)
    d = sub.add_parser("drift", help="a fixed tau vs the live controller over a stream whose mix changes")
    d.add_argument("sweeps", nargs="+", help="`ragate sweep` --out folders, played in this order")
    d.add_argument("--gate", required=True)
    d.add_argument("--budget", type=float, default=0.3)
    d.add_argument("--window", type=int, default=50)
    d.add_argument(
        "--gain", type=float, default=DEFAULT_GAIN, help="the controller's feedback gain (0: quantile)"
    )
    d.add_argument("--metric", choices=("em", "f1", "acc"), default="acc")
    d.add_argument("--plot", type=Path, default=None, help="write the windowed rates as a PNG")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(run=drift)
    o = sub.add_parser("in-order", help="tau set on a sweep's first questions, applied to the rest in file order")
    o.add_argument("sweeps", nargs="+", help="`ragate sweep` --out folders")
    o.add_argument("--gates", default=None, help="comma-separated (default: every swept gate but random)")
    o.add_argument("--budget", type=float, default=0.3)
    o.add_argument("--dev", type=int, default=150, help="questions tau is set on (default 150)")
    o.add_argument("--confidence", type=float, default=0.95)
    o.add_argument("--window", type=int, default=50)
    o.set_defaults(run=in_order)
    args = p.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
