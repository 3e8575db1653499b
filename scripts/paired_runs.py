"""Paired bootstrap differences between methods of *different* runs over the questions both answered.

``ragate report --compare`` pairs methods inside one run (and the rows it takes from a sweep). A re-measured row (a new default, a fixed setting)
lives in a new run; this prints ``new - old`` for each ``NEW_RUN:METHOD=OLD_RUN:METHOD`` pair, over the
question ids the two have in common (a side may be a sweep directory: its method at the default threshold, or
``never@PROMPTS`` / ``always@PROMPTS``, the closed-book or retrieval answers of the family with those prompts,
e.g. ``never@targ``, or the whole family key where two families share prompts), in EM, F1 and contains-accuracy (points), with the paired bootstrap 95%
interval (``ragate.eval.metrics.paired_bootstrap_diff``; ``--resamples``, default 1000, ``--seed``, default 0) and the page's verdict
("not established" where the interval reaches 0). It also prints the smallest difference the run could
establish: 1.96 times the standard error of the paired differences, the half-width an effect must exceed.

Run: ``.venv/bin/python scripts/paired_runs.py docs/results/runs/NEW:etc=docs/results/runs/OLD:etc`` (``--name
T=docs/results/runs/NEW`` writes that run as ``T`` in the table's cells, for a page's generated block).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path
from typing import Any

from ragate.eval.metrics import DEFAULT_BOOT, Resampling, paired_bootstrap_diff
from ragate.eval.records import by_method, latest, read_records
from ragate.eval.sweep import compact, default_records

METRICS = ("em", "f1", "acc")


def _side(spec: str) -> tuple[Path, str]:
    run, sep, method = spec.rpartition(":")
    if not sep or not run or not method:
        raise SystemExit(f"error: {spec!r} is not RUN_DIR:METHOD")
    return Path(run), method


@functools.cache
def _sweep(run: Path) -> list[dict[str, Any]]:
    """A sweep's records, read once however many rows name it."""
    return compact(run / "sweep.jsonl")


@functools.cache
def _records(run: Path) -> list[dict[str, Any]]:
    """Answers in the shape of eval records: an eval run's, or a sweep's methods at their default thresholds
    (the rows ``ragate report --sweep`` takes from a sweep directory); read once."""
    if (run / "sweep.jsonl").is_file():
        return default_records(_sweep(run))
    if (run / "questions.jsonl").is_file():
        return latest(read_records(run / "questions.jsonl", repair=False))
    raise SystemExit(f"error: {run} holds no questions.jsonl or sweep.jsonl: give an eval or sweep directory")


def _scores(run: Path, method: str) -> dict[str, dict[str, float]]:
    """Per question id, the scores of ``method`` in ``run`` (see :func:`_records`), or of a sweep family's
    closed-book or retrieval answers (``never@PROMPTS`` / ``always@PROMPTS``)."""
    side, at, prompts = method.partition("@")
    if at and side in ("never", "always") and (run / "sweep.jsonl").is_file():
        rows = [r for r in _sweep(run) if prompts in (r["family"], r["family"].split("|")[0])]
        families = sorted({r["family"] for r in rows})
        if len(families) != 1:
            raise SystemExit(f"error: {prompts!r} names {len(families)} families of {run}: {families or 'none'}")
        return {r["id"]: r["closed" if side == "never" else "open"]["scores"] for r in rows}
    for name, rows in by_method(_records(run)):
        if name == method:
            return {r["id"]: r["scores"] for r in rows if "scores" in r}
    raise SystemExit(f"error: {run} has no answers of method {method!r}")


def compare(new: str, old: str, only: set[str] | None = None, boot: Resampling = DEFAULT_BOOT) -> dict[str, Any]:
    """One row: ``new - old`` per metric over the shared question ids (within ``only`` when given), its intervals
    drawn as ``boot`` says."""
    a, b = _scores(*_side(new)), _scores(*_side(old))
    ids = [i for i in a if i in b and (only is None or i in only)]
    if not ids:
        raise SystemExit(f"error: {new} and {old} share no question")
    row: dict[str, Any] = {"new": new, "old": old, "n": len(ids)}
    for metric in METRICS:
        x = [100.0 * a[i][metric] for i in ids]
        y = [100.0 * b[i][metric] for i in ids]
        d = [p - q for p, q in zip(x, y, strict=True)]
        mean = sum(d) / len(d)
        sd = math.sqrt(sum((v - mean) ** 2 for v in d) / max(1, len(d) - 1))
        lo, hi = paired_bootstrap_diff(x, y, samples=boot.samples, seed=boot.seed)
        row[metric] = (mean, lo, hi, 1.96 * sd / math.sqrt(len(d)))
    return row


def _answered_by_all(run: Path) -> set[str]:
    groups = [{r["id"] for r in rows if "scores" in r} for _, rows in by_method(_records(run))]
    return set.intersection(*groups) if groups else set()


def _verdict(lo: float, hi: float) -> str:
    return "higher" if lo > 0 else "lower" if hi < 0 else "not established"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="+", help="NEW_RUN:METHOD=OLD_RUN:METHOD")
    ap.add_argument(
        "--only",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="every row over the questions that every method of this (running) eval run has answered",
    )
    ap.add_argument(
        "--name",
        action="append",
        default=[],
        metavar="ALIAS=RUN_DIR",
        help="write RUN_DIR as ALIAS in the new/old cells (default: the directory's name)",
    )
    ap.add_argument("--seed", type=int, default=0, help="the paired intervals' numpy seed")
    ap.add_argument("--resamples", type=int, default=1000, help="the paired intervals' resamples")
    args = ap.parse_args(argv)
    boot = Resampling(args.resamples, args.seed)
    only = _answered_by_all(args.only) if args.only else None
    aliases = {}
    for item in args.name:
        alias, sep, run = item.partition("=")
        if not sep or not alias or not run:
            raise SystemExit(f"error: --name {item!r} is not ALIAS=RUN_DIR")
        aliases[Path(run)] = alias
    print(
        "| new | old | n | ΔEM [95%] | verdict | ΔF1 [95%] | Δacc [95%] | verdict (acc) | smallest ΔEM n can establish |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for pair in args.pairs:
        new, sep, old = pair.partition("=")
        if not sep:
            raise SystemExit(f"error: {pair!r} is not NEW_RUN:METHOD=OLD_RUN:METHOD")
        r = compare(new, old, only, boot)
        cells = {m: f"{r[m][0]:+.1f} [{r[m][1]:+.1f}, {r[m][2]:+.1f}]" for m in METRICS}
        name = lambda s: f"{aliases.get(Path(s.rpartition(':')[0]), Path(s.rpartition(':')[0]).name)}:{s.rpartition(':')[2]}"
        print(
            f"| {name(new)} | {name(old)} | {r['n']} | {cells['em']} | {_verdict(*r['em'][1:3])} | {cells['f1']} | "
            f"{cells['acc']} | {_verdict(*r['acc'][1:3])} | ±{r['em'][3]:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
