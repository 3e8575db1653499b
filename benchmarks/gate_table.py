"""One cost-quality table of every gate a sweep can score (issue 51, item 5), from a sweep directory.

    .venv/bin/python benchmarks/gate_table.py derive OLD_SWEEP NEW_SWEEP
    .venv/bin/ragate sweep NEW_SWEEP --resume ... --methods ALL     # the gates the old sweep lacks (see below)
    .venv/bin/python benchmarks/gate_table.py table NEW_SWEEP [NEW_SWEEP ...] [--metric em] [--out FILE.md]

``derive`` starts a sweep from an older one without recomputing its closed-book and retrieval answers: the same
questions, model, index, prompts and readers, so each family's two answers are the older sweep's. It drops the
scores of TARG's entropy and margin gates, which older sweeps computed with a draft shorter than k averaged over
its tokens (before issue 51), so that resuming the sweep re-scores them as Eqs. 1-2 divide (by k), and marks the
config so (``targ_mean``). ``derived_from`` in config.json names the older sweep.

``table`` prints, per gate and per sweep (dataset): the AUROC of its score for "the closed-book answer is wrong"
and for "retrieval fixes the answer" (the retrieval answer scores higher), with 95% bootstrap intervals over
questions (``--resamples``, default 1000; ``--seed``, default 0); the first AUROC minus ``--versus``'s (default TARG's margin, k = 20) over the
questions both scored in one family, with a paired interval (the same resamples for both); the seconds per
question its decision took in the sweep (its own LM calls, search or nothing), and its LM calls, generated tokens and searches per question (recorded by sweeps since
2026-11-28: averaged over the questions that have them, their number in brackets); and its accuracy at budgets 0.1 / 0.2 / 0.3 / 0.5 (tau = F^-1(1 - rho) on these questions'
scores, as every sweep's budget points) against a random gate at the same rate in the same family, whose expected
per-question score is rho * retrieval + (1 - rho) * closed-book, with paired bootstrap intervals of the
difference. The CPU overhead over the paired floor is benchmarks/gate_overhead.py's (a separate, timed run).
An AUROC cell reads "too few (N of n ...)" where the rarer class of its label has fewer than 10 questions (MuSiQue:
one right closed-book answer in 250): such an AUROC, and a bootstrap most of whose resamples hold one class, says
nothing. docs/results/gate_table.md is this command's output (scripts/render_docs.py re-renders it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ragate.eval.metrics import DEFAULT_BOOT, Resampling
from ragate.eval.sweep import compact, finite_scores
from ragate.eval.thresholds import threshold_for_budget
from ragate.fileio import atomic_writer
from ragate.learning.scores import MIN_CLASS
from ragate.uncertainty import auroc

STALE = ("targ-entropy", "targ-margin")  # scored before issue 51 as a mean over the tokens present
BUDGETS = (0.1, 0.2, 0.3, 0.5)
BOOT = DEFAULT_BOOT  # the results spec's resamples and seed (docs/results/spec.toml)


def derive(old: Path, new: Path) -> None:
    if (new / "sweep.jsonl").exists():
        raise SystemExit(f"{new} already holds a sweep: resume it with ragate sweep {new} --resume")
    config = json.loads((old / "config.json").read_text())
    if config.get("targ_mean") == "k":
        raise SystemExit(f"{old}'s TARG scores already divide by k: resume it instead")
    new.mkdir(parents=True, exist_ok=True)
    records = compact(old / "sweep.jsonl")
    dropped = 0
    with atomic_writer(new / "sweep.jsonl") as f:
        for r in records:
            kept = {m: g for m, g in r["gates"].items() if m not in STALE}
            dropped += len(r["gates"]) - len(kept)
            methods = [m for m in r["methods"] if m not in STALE]
            f.write((json.dumps(r | {"gates": kept, "methods": methods}) + "\n").encode())
    config["methods"] = [m for m in config["methods"] if m not in STALE]
    config["derived_from"] = {
        "sweep": str(old),
        "kept": "each family's closed-book and retrieval answers and the scores of gates other than TARG's "
        "entropy and margin",
        "dropped": f"{dropped} scores of {', '.join(STALE)} (a short draft averaged over its tokens, before issue 51)",
    }
    with atomic_writer(new / "config.json") as f:
        f.write(json.dumps(config, indent=2).encode())
    for extra in ("skr_labels",):
        if config.get(extra):
            print(f"note: resume with --{extra.replace('_', '-')} {config[extra]}")
    print(f"derived {new} from {old}: {len(records)} records, {dropped} stale TARG scores dropped")


def _boot(rng: np.random.Generator, n: int, resamples: int = BOOT.samples) -> np.ndarray:
    return rng.integers(0, n, size=(resamples, n))


def _resampled_auroc(scores: np.ndarray, labels: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The AUROC on each resample, nan where a resample leaves one class out."""
    return np.array([np.nan if (a := auroc(scores[i].tolist(), labels[i].tolist())) is None else a for i in idx])


def _auroc_ci(scores: np.ndarray, labels: np.ndarray, idx: np.ndarray) -> tuple[float | None, float, float]:
    point = auroc(scores.tolist(), labels.tolist())
    values = _resampled_auroc(scores, labels, idx)
    values = values[~np.isnan(values)]
    low, high = (np.percentile(values, [2.5, 97.5]) if values.size else (np.nan, np.nan))
    return point, float(low), float(high)


def _auroc_gap(
    records: list[dict[str, Any]],
    gate: str,
    versus: str,
    metric: str,
    cache: dict[tuple[int, ...], np.ndarray] | None = None,
    boot: Resampling = BOOT,
) -> tuple[float | None, float, float]:
    """AUROC("closed-book wrong") of ``gate`` minus that of ``versus`` over the questions that scored both in one
    family (the same answers, so the same labels), with a paired 95% bootstrap interval (the same resamples).
    ``cache`` keeps ``versus``'s resampled AUROCs per question set, so a table computes them once, not per gate."""
    keep = tuple(k for k, r in enumerate(records) if gate in r["gates"] and versus in r["gates"])
    if not keep or gate == versus:
        return None, np.nan, np.nan
    rs = [records[k] for k in keep]
    a = np.array(finite_scores([r["gates"][gate]["score"] for r in rs]))
    b = np.array(finite_scores([r["gates"][versus]["score"] for r in rs]))
    wrong = np.array([float(r["closed"]["scores"][metric]) == 0 for r in rs])
    point_a, point_b = auroc(a.tolist(), wrong.tolist()), auroc(b.tolist(), wrong.tolist())
    if point_a is None or point_b is None:
        return None, np.nan, np.nan
    idx = _boot(np.random.default_rng(boot.seed + 1), len(rs), boot.samples)
    cache = {} if cache is None else cache
    if keep not in cache:
        cache[keep] = _resampled_auroc(b, wrong, idx)
    gaps = _resampled_auroc(a, wrong, idx) - cache[keep]
    gaps = gaps[~np.isnan(gaps)]
    low, high = np.percentile(gaps, [2.5, 97.5]) if gaps.size else (np.nan, np.nan)
    return point_a - point_b, float(low), float(high)


def gate_rows(
    run_dir: Path, metric: str, versus: str = "targ-margin", boot: Resampling = BOOT
) -> list[dict[str, Any]]:
    records = compact(run_dir / "sweep.jsonl")
    gates = sorted({m for r in records for m in r["gates"]})
    rows = []
    versus_aurocs: dict[tuple[int, ...], np.ndarray] = {}
    for gate in gates:
        rs = [r for r in records if gate in r["gates"]]
        n = len(rs)
        scores = np.array(finite_scores([r["gates"][gate]["score"] for r in rs]))
        closed = np.array([float(r["closed"]["scores"][metric]) for r in rs])
        opened = np.array([float(r["open"]["scores"][metric]) for r in rs])
        idx = _boot(np.random.default_rng(boot.seed), n, boot.samples)
        wrong = _too_few(closed == 0, "wrong closed-book", "right closed-book") or _auroc_ci(scores, closed == 0, idx)
        fixes = _too_few(opened > closed, "fixed by retrieval", "not fixed") or _auroc_ci(scores, opened > closed, idx)
        seconds = float(np.mean([r["gates"][gate].get("seconds", np.nan) for r in rs]))
        costed = [r["gates"][gate] for r in rs if "lm_calls" in r["gates"][gate]]  # sweeps since 2026-11-28
        cost = (
            {k: float(np.mean([g[k] for g in costed])) for k in ("lm_calls", "decoded_tokens", "searches")}
            | {"n": len(costed)}
            if costed
            else None
        )
        at = {}
        for rho in BUDGETS:
            tau = threshold_for_budget(scores.tolist(), rho)
            take = scores > tau
            got = np.where(take, opened, closed)
            rate = float(take.mean())
            rand = rate * opened + (1 - rate) * closed
            diff = got - rand
            boots = diff[idx].mean(axis=1)
            low, high = np.percentile(boots, [2.5, 97.5])
            at[rho] = (float(got.mean()), rate, float(diff.mean()), float(low), float(high))
        gap = wrong if isinstance(wrong, str) else _auroc_gap(records, gate, versus, metric, versus_aurocs, boot)
        row = {"gate": gate, "n": n, "wrong": wrong, "gap": gap, "fixes": fixes, "seconds": seconds, "cost": cost}
        rows.append(row | {"at": at})
    return rows


def _too_few(y: np.ndarray, yes: str, no: str) -> str | None:
    """The verdict rule's "too few": where the rarer class of a label has fewer than MIN_CLASS questions, an AUROC
    (and its bootstrap, many of whose resamples hold one class only) says nothing; the cell says so, with the count."""
    pos, n = int(y.sum()), len(y)
    if min(pos, n - pos) >= MIN_CLASS:
        return None
    few, name = (pos, yes) if pos < n - pos else (n - pos, no)
    return f"too few ({few} of {n} {name})"


def _ci(v: tuple[float | None, float, float] | str, sign: str = "") -> str:
    if isinstance(v, str):
        return v
    return "n/a" if v[0] is None else f"{v[0]:{sign}.3f} [{v[1]:{sign}.3f}, {v[2]:{sign}.3f}]"


def table(
    run_dirs: list[Path],
    metric: str,
    versus: str = "targ-margin",
    boot: Resampling = BOOT,
    rows: dict[Path, list[dict[str, Any]]] | None = None,
) -> str:
    """The table of ``run_dirs``; ``rows`` gives each one's :func:`gate_rows` where they are computed already."""
    rows = {} if rows is None else rows
    lines = []
    for run_dir in run_dirs:
        config = json.loads((run_dir / "config.json").read_text())
        lines.append(f"\n### {config['dataset']} ({run_dir.name})\n")
        head = " | ".join(f"{metric.upper()} at {rho:g}: Δ vs random" for rho in BUDGETS)
        lines.append(
            f"| gate | n | AUROC closed-book wrong | minus {versus}'s (paired) | AUROC retrieval fixes | s/q to "
            f"decide | LM calls / decoded tokens / searches per q (over n) | {head} |"
        )
        lines.append("|---|---|---|---|---|---|---|" + "---|" * len(BUDGETS))
        for row in rows.get(run_dir) or gate_rows(run_dir, metric, versus, boot):
            cells = [
                f"{100 * g:.1f}: {100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
                for g, _rate, d, lo, hi in (row["at"][rho] for rho in BUDGETS)
            ]
            c = row["cost"]
            spent = "–" if c is None else f"{c['lm_calls']:.2f} / {c['decoded_tokens']:.1f} / {c['searches']:.2f} ({c['n']})"
            lines.append(
                f"| {row['gate']} | {row['n']} | {_ci(row['wrong'])} | {_ci(row['gap'], '+')} | {_ci(row['fixes'])} | "
                f"{row['seconds']:.2f} | {spent} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines) + "\n"


def plot(
    run_dirs: list[Path],
    metric: str,
    out: Path,
    boot: Resampling = BOOT,
    rows: dict[Path, list[dict[str, Any]]] | None = None,
) -> dict[str, list[float]]:
    """AUROC ("closed-book answer wrong") against what deciding took (seconds per question in the sweep), one
    point per gate and dataset, with the AUROC's interval; returns what it plotted (seconds, AUROC, low, high).
    ``rows``: each run's :func:`gate_rows` where they are computed already (the plot reads no gap)."""
    rows = {} if rows is None else rows
    plotted: dict[str, list[float]] = {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(run_dirs), figsize=(6.5 * len(run_dirs), 5.5), squeeze=False)
    for ax, run_dir in zip(axes[0], run_dirs, strict=True):
        config = json.loads((run_dir / "config.json").read_text())
        drawn = 0
        for row in rows.get(run_dir) or gate_rows(run_dir, metric, boot=boot):
            if isinstance(row["wrong"], str):  # too few of one class
                continue
            point, low, high = row["wrong"]
            if point is None:
                continue
            drawn += 1
            x = max(row["seconds"], 1e-4)
            ax.errorbar(x, point, yerr=[[point - low], [high - point]], fmt="o", ms=4, capsize=2)
            plotted[f"{run_dir.name}|{row['gate']}"] = [x, point, low, high]
            ax.annotate(row["gate"], (x, point), fontsize=7, xytext=(3, 3), textcoords="offset points")
        if not drawn:  # the table's rule: no AUROC where a class has too few questions
            ax.text(0.5, 0.6, "no AUROC: too few questions of one class\n(the table says how many)",
                    transform=ax.transAxes, ha="center", fontsize=9)  # fmt: skip
        ax.axhline(0.5, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("seconds per question to decide (the sweep's, charged; log scale)")
        ax.set_ylabel(f"AUROC: closed-book answer wrong ({metric})")
        ax.set_title(f"{config['dataset']}, {config.get('model')}, n = {config.get('limit')}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return plotted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("derive", help="a new sweep from an older one, TARG's stale scores dropped")
    d.add_argument("old", type=Path)
    d.add_argument("new", type=Path)
    t = sub.add_parser("table", help="print the cost-quality table of one or more sweeps")
    t.add_argument("run_dirs", type=Path, nargs="+")
    t.add_argument("--metric", choices=("em", "f1", "acc"), default="em")
    t.add_argument("--out", type=Path, default=None)
    t.add_argument("--plot", type=Path, default=None, help="a PNG: AUROC against seconds per question to decide")
    t.add_argument(
        "--versus", default="targ-margin", help="the gate each AUROC is compared with, paired (default targ-margin)"
    )
    t.add_argument("--seed", type=int, default=0, help="the bootstrap's numpy seed (the paired gaps' is seed + 1)")
    t.add_argument("--resamples", type=int, default=BOOT.samples, help="the bootstrap's resamples")
    args = parser.parse_args(argv)
    if args.command == "derive":
        derive(args.old, args.new)
        return 0
    boot = Resampling(args.resamples, args.seed)
    rows = {d: gate_rows(d, args.metric, args.versus, boot) for d in args.run_dirs}  # the table's and the plot's
    text = table(args.run_dirs, args.metric, args.versus, boot, rows)
    print(text)
    if args.out is not None:
        with atomic_writer(args.out) as f:
            f.write(text.encode())
    if args.plot is not None:
        from ragate.report.plots import figure_data

        print(figure_data(plot(args.run_dirs, args.metric, args.plot, boot, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
