"""An eval run's tables recomputed from its records (``questions.jsonl``, never its results.md), for the docs.

    .venv/bin/python scripts/run_tables.py RUN_DIR                        # the methods table of results.md
    .venv/bin/python scripts/run_tables.py RUN_DIR --dynamic              # its table of dynamic methods
    .venv/bin/python scripts/run_tables.py RUN_A:etc RUN_B:dragin RUN_A:single-rag \\
        --columns n,em,f1,acc,retrieval_rate,retrievals,recall,cpu --tuned-labels
    .venv/bin/python scripts/run_tables.py --tune etc TUNE_DIR --columns n,em,retrieval_rate,retrievals
    .venv/bin/python scripts/run_tables.py --speed benchmarks/results/dynamic_speed_transformers.jsonl ...

Rows. ``RUN_DIR`` gives every method of the run (``--methods a,b``: those, in that order); ``RUN_DIR:METHOD``
one method of it, so one table can hold rows of several runs, in the order given. A row is
:func:`ragate.eval.summary.summarize` over the latest answer per (question, method) of its own run, so its
Δlatency is paired against the baseline of that run (``ragate eval`` writes the same numbers into
results.md).

Columns (``--columns``, comma-separated; default: results.md's): ``n``, ``em``, ``f1``, ``acc`` (with
bootstrap 95% intervals), ``retrieval_rate``, ``retrievals`` (per question), ``recall`` (recall@3), ``tokens``
(prompt and completion per question), ``overhead`` (tokens per question), ``seconds`` (wall s/q), ``cpu``
(CPU seconds per question, the records' ``cpu_seconds``: the cost to compare where a run was paused and
resumed, whose wall seconds include the pauses), ``delta_latency`` (paired against the run's baseline).

Labels. ``--label METHOD=TEXT`` renames a row; ``--tuned-labels`` writes a method that ran at a value chosen
by ``ragate tune`` as ``etc (α = 1.3)``, the parameter and value read from the run's ``config.json``
(``tune_files``).

``--tune METHOD TUNE_DIR``: the grid of a ``ragate tune`` output folder (one run per value, ``alpha-1.3``,
...), as the tuner prints it (:func:`ragate.tuning.tune.grid_rows`: every value over the validation questions
answered at every value), with the value ``--target best`` on ``--metric`` chooses and the method's default
marked; ``--note VALUE=TEXT`` adds a note to a value's cell. Columns: ``n``, ``em``/``f1``/``acc`` (no
interval), ``retrieval_rate``, ``retrievals``, ``seconds``.

``--split METHOD RUN_DIR ...``: ``benchmarks/dynamic.py split --method METHOD`` over the runs' records (the
questions METHOD retrieved on and those it did not: each method's EM and recall@3 there, paired intervals,
query lengths), fenced as text.

``--speed FILE ...``: the table of ``benchmarks/dynamic.py speed`` from its JSONL outputs (cached against
naive loop: CPU seconds per question, their ratio, same retrieval positions, same output), rows per file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from dynamic import speed_cells  # benchmarks/dynamic.py: the speed table's own row

from ragate.eval.metrics import DEFAULT_BOOT, Resampling
from ragate.eval.records import by_method, latest, read_records
from ragate.eval.summary import BASELINE, dynamic_table, summarize

DEFAULT_COLUMNS = (
    "n", "em", "f1", "acc", "retrieval_rate", "retrievals", "recall", "tokens", "overhead", "seconds",
    "delta_latency",
)  # fmt: skip
GREEK = {"alpha": "α", "theta": "θ", "tau": "τ"}


def _ci(row: dict[str, Any], key: str) -> str:
    """A share with its interval in points, as results.md writes it: ``24.3 [19.3, 29.0]``."""
    if key not in row:
        return "–"
    lo, hi = row[f"{key}_ci"]
    return f"{100 * row[key]:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _delta(r: dict[str, Any]) -> str:
    if "delta_latency" not in r:
        return "–"
    lo, hi = r["delta_latency_ci"]
    return f"{r['delta_latency']:+.2f} [{lo:+.2f}, {hi:+.2f}]"


# column -> (header, cell); the header of delta_latency names the baseline
COLUMNS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "n": ("n", lambda r: f"{r['n']}" + (f" ({r['errors']} errors)" if r["errors"] else "")),
    "em": ("EM", lambda r: _ci(r, "em")),
    "f1": ("F1", lambda r: _ci(r, "f1")),
    "acc": ("acc (contains)", lambda r: _ci(r, "acc")),
    "retrieval_rate": ("retrieval rate", lambda r: f"{r['retrieval_rate']:.2f}"),
    "retrievals": ("retrievals/q", lambda r: f"{r['retrievals_per_q']:.2f}"),
    "recall": ("recall@3", lambda r: "–" if r["recall"] is None else f"{100 * r['recall']:.1f}"),
    "tokens": ("tokens/q", lambda r: f"{r['prompt_tokens_per_q'] + r['completion_tokens_per_q']:.0f}"),
    "overhead": ("overhead tokens/q", lambda r: f"{r['overhead_tokens_per_q']:.0f}"),
    "seconds": ("s/q", lambda r: f"{r['seconds_per_q']:.2f}"),
    "cpu": ("CPU s/q", lambda r: "–" if r.get("cpu_per_q") is None else f"{r['cpu_per_q']:.1f}"),
    "delta_latency": ("Δlatency vs {baseline} (s)", _delta),
}


def _records(run: Path) -> list[dict[str, Any]]:
    path = run / "questions.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {run} holds no questions.jsonl: give an eval run directory")
    return latest(read_records(path, repair=False))


def _tuned(run: Path) -> dict[str, str]:
    """Per method that ran at a tuned value: ``etc (α = 1.3)``, from the run's config.json."""
    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    return {
        f["method"]: f"{f['method']} ({GREEK.get(f['parameter'], f['parameter'])} = {_value(f['tau'])})"
        for f in config.get("tune_files") or []
    }


def _value(v: float) -> str:
    """A threshold as the docs write it: one decimal where that is exact (1.0, 0.2), else in full."""
    return f"{v:.1f}" if v == round(v, 1) else f"{v:g}"


def _pairs(items: Sequence[str], option: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: {option} {item!r} is not KEY=TEXT")
        out[key] = text
    return out


def method_rows(
    items: Sequence[str], methods: Sequence[str] | None, tuned: bool, boot: Resampling = DEFAULT_BOOT
) -> list[dict[str, Any]]:
    """One summary row per (run, method) named, each over its own run's records (CPU seconds added), its intervals
    drawn as ``boot`` says."""
    rows: list[dict[str, Any]] = []
    cache: dict[Path, list[dict[str, Any]]] = {}
    for item in items:
        path = Path(item)
        if path.is_dir():
            run, wanted = path, list(methods) if methods else None
        else:
            head, sep, method = item.rpartition(":")
            if not sep or not Path(head).is_dir():
                raise SystemExit(f"error: {item!r} is neither a run directory nor RUN_DIR:METHOD")
            run, wanted = Path(head), [method]
        records = cache.setdefault(run, _records(run))
        present = [m for m, _ in by_method(records)]
        if missing := [m for m in wanted or [] if m not in present]:
            raise SystemExit(
                f"error: {run} has no answers of {', '.join(missing)}; its methods: {', '.join(present)}"
            )
        labels = _tuned(run) if tuned else {}
        groups = dict(by_method(records))
        for row in summarize(records, wanted or present, boot):
            ok = [r for r in groups[row["method"]] if "error" not in r]
            cpu = [r["cpu_seconds"] for r in ok if r.get("cpu_seconds") is not None]
            row["cpu_per_q"] = statistics.fmean(cpu) if cpu and len(cpu) == len(ok) else None
            row["label"] = labels.get(row["method"], row["method"])
            rows.append(row)
    return rows


def methods_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    baselines = {r.get("baseline", BASELINE) for r in rows}
    baseline = baselines.pop() if len(baselines) == 1 else "the run's baseline"
    heads = [COLUMNS[c][0].format(baseline=baseline) for c in columns]
    lines = ["| method | " + " | ".join(heads) + " |", "|" + "---|" * (len(columns) + 1)]
    for r in rows:
        if not r.get("n"):
            cells = ["0" if c == "n" else "–" for c in columns]
        else:
            cells = [COLUMNS[c][1](r) for c in columns]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


TUNE_COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "n": ("n", lambda g: f"{g.n}" + (f" ({g.errors} failed)" if g.errors else "")),
    "em": ("EM", lambda g: f"{100 * g.em:.1f}"),
    "f1": ("F1", lambda g: f"{100 * g.f1:.1f}"),
    "acc": ("acc", lambda g: f"{100 * g.acc:.1f}"),
    "retrieval_rate": ("retrieval rate", lambda g: f"{g.retrieval_rate:.2f}"),
    "retrievals": ("retrievals/q", lambda g: f"{g.retrievals:.2f}"),
    "seconds": ("s/q", lambda g: f"{g.seconds:.2f}"),
}


def tune_table(method: str, folder: Path, metric: str, columns: Sequence[str], notes: dict[str, str]) -> str:
    """A ``ragate tune`` folder's grid: each value's row, the value ``--target best`` chooses, the default."""
    from ragate.methods import get_method
    from ragate.tuning.tune import GridRow, Target, _default_value, choose, grid_rows, tunable

    spec = get_method(method)
    parameter = tunable(spec)[0]
    runs: dict[float, list[dict[str, Any]]] = {}
    for run in sorted(folder.glob(f"{parameter}-*")):
        if (run / "questions.jsonl").is_file():
            runs[float(run.name.removeprefix(f"{parameter}-"))] = _records(run)
    if not runs:
        raise SystemExit(f"error: {folder} holds no {parameter}-VALUE run of {method}")
    rows: list[GridRow] = grid_rows(runs, method)
    default = _default_value(spec)
    chosen = choose(rows, Target("best"), metric, default).value
    if metric not in columns:
        raise SystemExit(f"error: --columns must include the --metric {metric!r}")
    heads = [TUNE_COLUMNS[c][0] for c in columns]
    lines = [
        f"| {GREEK.get(parameter, parameter)} | " + " | ".join(heads) + " | |",
        "|" + "---|" * (len(columns) + 2),
    ]
    for g in rows:
        first = _value(g.value)
        note = notes.get(first) or notes.get(f"{g.value:g}")
        marks = [m for m, on in (("chosen", g.value == chosen), ("default", g.value == default)) if on]
        cells = [TUNE_COLUMNS[c][1](g) for c in columns]
        if g.value == chosen:
            first, cells[columns.index(metric)] = f"**{first}**", f"**{cells[columns.index(metric)]}**"
        label = f"{first} ({note})" if note else first
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {', '.join(marks)} |")
    return "\n".join(lines) + "\n"


def speed_table(files: Sequence[Path]) -> str:
    """``benchmarks/dynamic.py speed``'s table from its JSONL files, with the engine of each."""
    lines = [
        (
            "| engine | method | questions | cached CPU s/q | naive CPU s/q | naive / cached "
            "| same positions | same output |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in files:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        for method in dict.fromkeys(r["method"] for r in rows):
            if (cells := speed_cells(rows, method)) is not None:
                engine = next(r.get("engine", "?") for r in rows if r["method"] == method and r["loop"] == "cached")
                lines.append(f"| {engine} | {method} | {cells} |")
    return "\n".join(lines) + "\n"


def split_text(method: str, runs: Sequence[str], boot: Resampling = DEFAULT_BOOT) -> str:
    """``benchmarks/dynamic.py split``'s output over the runs' records, fenced as text."""
    import contextlib
    import importlib.util
    import io

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "dynamic.py"
    spec = importlib.util.spec_from_file_location("ragate_benchmark_dynamic", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = module.split(argparse.Namespace(out=list(runs), method=method, seed=boot.seed, resamples=boot.samples))
    if code:
        raise SystemExit(f"error: benchmarks/dynamic.py split --method {method} failed ({code})")
    return "```text\n" + out.getvalue().strip("\n") + "\n```\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("items", nargs="+", help="RUN_DIR or RUN_DIR:METHOD (--tune: its folder; --speed: files)")
    ap.add_argument("--methods", default=None, help="comma-separated methods of a RUN_DIR item, in order")
    ap.add_argument("--columns", default=None, help="comma-separated columns (see the module's doc)")
    ap.add_argument("--dynamic", action="store_true", help="the dynamic methods' table instead")
    ap.add_argument("--label", action="append", default=[], metavar="METHOD=TEXT", help="a row's label")
    ap.add_argument("--tuned-labels", action="store_true", help="label tuned methods 'etc (α = 1.3)'")
    ap.add_argument("--tune", default=None, metavar="METHOD", help="the item is a `ragate tune` folder")
    ap.add_argument("--metric", default="em", choices=["em", "f1", "acc"], help="--tune: chosen on")
    ap.add_argument("--note", action="append", default=[], metavar="VALUE=TEXT", help="--tune: a note")
    ap.add_argument("--speed", action="store_true", help="the items are `benchmarks/dynamic.py speed` files")
    ap.add_argument("--split", default=None, metavar="METHOD", help="benchmarks/dynamic.py split, fenced")
    ap.add_argument("--seed", type=int, default=0, help="the bootstrap intervals' numpy seed")
    ap.add_argument("--resamples", type=int, default=1000, help="the bootstrap intervals' resamples")
    args = ap.parse_args(argv)
    boot = Resampling(args.resamples, args.seed)
    if args.split:
        print(split_text(args.split, args.items, boot), end="")
        return 0
    if args.speed:
        print(speed_table([Path(p) for p in args.items]), end="")
        return 0
    if args.tune:
        if len(args.items) != 1:
            raise SystemExit("error: --tune takes one tune folder")
        default = ["n", args.metric, "retrieval_rate", "retrievals", "seconds"]
        columns = args.columns.split(",") if args.columns else default
        if bad := [c for c in columns if c not in TUNE_COLUMNS]:
            known = ", ".join(TUNE_COLUMNS)
            raise SystemExit(f"error: unknown --tune column(s) {', '.join(bad)}; known: {known}")
        notes = _pairs(args.note, "--note")
        print(tune_table(args.tune, Path(args.items[0]), args.metric, columns, notes), end="")
        return 0
    columns = args.columns.split(",") if args.columns else list(DEFAULT_COLUMNS)
    if bad := [c for c in columns if c not in COLUMNS]:
        raise SystemExit(f"error: unknown column(s) {', '.join(bad)}; known: {', '.join(COLUMNS)}")
    rows = method_rows(args.items, args.methods.split(",") if args.methods else None, args.tuned_labels, boot)
    labels = _pairs(args.label, "--label")
    for r in rows:
        r["label"] = labels.get(r["method"], r["label"])
    if args.dynamic:
        print(dynamic_table([{**r, "method": r["label"]} for r in rows]), end="")
    else:
        print(methods_table(rows, columns), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
