"""``write_report(run_dir)``: one run directory's tables and plots as ``report.md``, PNGs and ``report.html``.

Reads an eval run (``questions.jsonl``, ``results.json``) and/or a sweep run (``sweep.jsonl``) and writes, where
the data allows: the eval summary table, the sweep's frontier table, the gates' AUROC, closed-book accuracy by
score decile (TARG A.6), the (U, Δ) quadrants (TARG A.7), retrieval recall (DTR Table 4) and PAIRS's direct/
retrieved split (PAIRS Fig. 3); ``frontier.png`` and ``deciles.png``, with percentile-bootstrap 95% intervals as
error bars; and ``report.html`` with the plots inlined. The metric is EM unless asked, or, when EM is near zero where
accuracy (the gold answer contained) is not, accuracy: a small model that answers in sentences scores ~0 EM even
when it is right (:func:`report_metric`).
Plots need matplotlib (``pip install 'ragate[eval]'``), imported only here, and rendered with the Agg canvas
directly, so the process-wide matplotlib backend is left as it was.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ragate.errors import RagateError, RunFormatError
from ragate.eval.records import latest, read_records
from ragate.eval.run import RECALL_K
from ragate.eval.rundir import read_results, read_run_config
from ragate.eval.summary import (
    derived_table,
    differences_table,
    paired_differences,
    summarize,
    summary_markdown,
    summary_table,
)
from ragate.eval.sweep import compact, default_records, frontier, sweep_markdown, swept_methods
from ragate.fileio import atomic_writer
from ragate.report.analysis import (
    Metric,
    accuracy_by_decile,
    frontier_points,
    gate_auroc,
    pairs_breakdown,
    quadrant_table,
    recall_comparison,
)
from ragate.report.plots import (  # noqa: F401 (operating_intervals and operating_points stay importable here)
    METRIC_LABEL,
    canvas,
    operating_intervals,
    operating_points,
    plot_deciles,
    plot_frontiers,
    plot_operating_points,
)

PAIRS_METHODS = ("pairs", "pairs-exclude-num", "pairs-embedding")


NEAR_ZERO_EM = 0.05  # EM at most this for every method ...
SENTENCE_GAP = 0.10  # ... while accuracy is at least this much higher somewhere: answers in sentences


def report_metric(
    eval_records: Sequence[dict[str, Any]], sweep_records: Sequence[dict[str, Any]]
) -> tuple[Metric, str | None]:
    """The metric a report uses when none is asked for: EM, or accuracy when EM is near zero for every method (at
    most :data:`NEAR_ZERO_EM`) while accuracy is not (:data:`SENTENCE_GAP` higher somewhere), the mark of answers in
    sentences that hold the gold answer; with the sentence that says why, or None for EM."""
    em: list[float] = []
    acc: list[float] = []
    for row in summarize([r for r in eval_records if "error" not in r]):
        if row.get("n"):
            em.append(row["em"])
            acc.append(row["acc"])
    for side in ("closed", "open"):  # a sweep: Never-RAG's and Always-RAG's answers bound every gate's
        answers = [r[side]["scores"] for r in sweep_records]
        if answers:
            em.append(sum(a["em"] for a in answers) / len(answers))
            acc.append(sum(a["acc"] for a in answers) / len(answers))
    if not em or max(em) > NEAR_ZERO_EM or max(acc) < max(em) + SENTENCE_GAP:
        return "em", None
    return "acc", (
        f"**Metric: {METRIC_LABEL['acc']}.** EM is at most {100 * max(em):.1f}% here while accuracy reaches "
        f"{100 * max(acc):.1f}%: the answers are sentences that hold the gold answer, which EM (the answer equal to "
        "a gold one) scores 0. Plots and tables below use accuracy; `ragate report --metric em` shows EM."
    )


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _demote(markdown: str) -> str:
    """Headings one level down, so a run's own "# title" sits under the report's sections."""
    return re.sub(r"^(#+) ", r"##\1 ", markdown, flags=re.MULTILINE)


def auroc_markdown(sweep_records: Sequence[dict[str, Any]]) -> str:
    by_em, by_acc = gate_auroc(sweep_records, "em"), gate_auroc(sweep_records, "acc")
    lines = ["| gate method | AUROC, closed-book EM wrong | AUROC, closed-book acc wrong |", "|---|---|---|"]
    for m in by_em:
        em, acc = by_em[m], by_acc[m]
        lines.append(
            f"| {m} | {'–' if em is None else f'{em:.3f}'} | {'–' if acc is None else f'{acc:.3f}'} |"
        )
    return "\n".join(lines) + "\n"


def deciles_markdown(
    sweep_records: Sequence[dict[str, Any]], methods: Sequence[str], metric: Metric = "em"
) -> str:
    tables = {
        m: {row["decile"]: row for row in accuracy_by_decile(sweep_records, m, metric)} for m in methods
    }
    lines = ["| decile | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for d in range(1, 11):
        cells = []
        for m in methods:
            row = tables[m].get(d)
            cells.append(
                "–" if row is None else f"{_pct(row['closed_acc'])} / {_pct(row['open_acc'])} ({row['n']})"
            )
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def quadrant_markdown(
    sweep_records: Sequence[dict[str, Any]], methods: Sequence[str], metric: Metric = "em"
) -> str:
    lines = [
        (
            "| gate method | tau | n | (a) low U, Δ>0 | (b) high U, Δ<0 | (c) high U, Δ>0 | (d) low U, Δ≤0 "
            "| high U, Δ=0 |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in methods:
        q = quadrant_table(sweep_records, m, metric=metric)
        n = q["n"]
        cells = [q["low_helps"], q["high_hurts"], q["high_helps"], q["low_neutral"] + q["low_hurts"]]
        cells.append(q["high_neutral"])
        shown = " | ".join(f"{c} ({100 * c / n:.1f}%)" for c in cells)
        tau = "own decision" if q["tau"] is None else f"{q['tau']:.4g}"
        lines.append(f"| {m} | {tau} | {n} | {shown} |")
    return "\n".join(lines) + "\n"


def recall_markdown(eval_records: Sequence[dict[str, Any]]) -> str:
    lines = [f"| method | n | recall@{RECALL_K} |", "|---|---|---|"]
    for row in recall_comparison(eval_records, RECALL_K):
        lines.append(f"| {row['method']} | {row['n']} | {_pct(row['recall'])} |")
    return "\n".join(lines) + "\n"


def pairs_markdown(
    eval_records: Sequence[dict[str, Any]], methods: Sequence[str], metric: Metric = "em"
) -> str:
    name = METRIC_LABEL[metric]
    lines = [
        (
            f"| method | n | DQ (answered directly): n / {name} | Non-DQ-retrieval: n / {name} "
            f"| DQ-retrieval: n / {name} |"
        ),
        "|---|---|---|---|---|",
    ]
    for m in methods:
        b = pairs_breakdown(eval_records, m, metric=metric)
        lines.append(
            f"| {m} | {b['n']} | {b['direct_n']} / {_pct(b['direct_acc'])} "
            f"| {b['retrieved_n']} / {_pct(b['retrieved_acc'])} "
            f"| {b['reference_n']} / {_pct(b['reference_acc'])} ({b['reference']}) |"
        )
    return "\n".join(lines) + "\n"


def markdown_to_html(markdown: str, images: dict[str, bytes], title: str) -> str:
    """The subset of Markdown the report uses: headings, bullets, pipe tables, ``![alt](file.png)`` (inlined as
    data URIs from ``images``) and paragraphs."""
    body: list[str] = []
    table: list[list[str]] = []

    bullets: list[str] = []

    def flush() -> None:
        if bullets:
            body.append("<ul>" + "".join(f"<li>{html.escape(b)}</li>" for b in bullets) + "</ul>")
            bullets.clear()
        if table:
            head, *rest = table
            body.append("<table>\n<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>")
            body.extend("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rest)
            body.append("</table>")
            table.clear()

    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                table.append(cells)
            continue
        if line.startswith("- "):
            bullets.append(line[2:])
            continue
        flush()
        if m := re.match(r"^(#{1,6}) (.*)$", line):
            level = len(m.group(1))
            body.append(f"<h{level}>{html.escape(m.group(2))}</h{level}>")
        elif m := re.match(r"^!\[(.*)\]\((.*)\)$", line):
            data = base64.b64encode(images[m.group(2)]).decode()
            body.append(f'<p><img alt="{html.escape(m.group(1))}" src="data:image/png;base64,{data}"></p>')
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    flush()
    style = (
        "body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
        "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}img{max-width:100%}"
    )
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _results_markdown(run_dir: Path) -> str:
    """The summary table of a finished run's results.json; one too damaged to print is named."""
    try:
        return summary_markdown(read_results(run_dir))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise RunFormatError(
            f"{run_dir / 'results.json'} cannot be reported ({type(err).__name__}: {err}); delete it and rerun "
            "`ragate eval ... --resume` on this directory, which writes it again from questions.jsonl"
        ) from None


def _config(run_dir: Path) -> dict[str, Any]:
    """A run's config.json, with the provenance of its results.json where config.json has none (an eval run)."""
    config = read_run_config(run_dir) if (run_dir / "config.json").exists() else {}
    if config and "provenance" not in config:
        provenance = read_results(run_dir).get("provenance")
        if provenance is not None:
            config["provenance"] = provenance
    return config


def _identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """What must match for two runs' points to share a table: the dataset file, the questions' offset, the model
    (name and engine, and the file's sha256 where both record it) and the index (encoder and passage count)."""
    model = (config.get("provenance") or {}).get("model") or {}
    index = config.get("index_identity") or {}
    return {
        "dataset file": [f.get("sha256") for f in config.get("dataset_files") or []] or None,
        "offset": config.get("offset", 0) or 0,
        "model": (config.get("model"), config.get("engine")),
        "model file": model.get("sha256"),
        "index": (
            ((index.get("encoder") or {}).get("name"), index.get("passages"))
            if index
            else config.get("index")
        ),
    }


def check_same_setup(sweep: Path, other: Path, flag: str = "--with") -> None:
    """Refuse ``flag other`` when its run read another dataset file, offset, model or index than the run ``sweep``
    (facts one of them does not record are not compared)."""
    a, b = _config(sweep), _config(other)
    if not a or not b:
        return
    kind = "the sweep" if flag == "--with" else "the run"
    files = a.get("dataset_files")
    if files is not None and b.get("dataset_files") not in (None, files):
        raise RagateError(
            f"{flag} {other} read another dataset file than {kind} {sweep} (sha256 differs): its answers would be "
            "to other questions"
        )
    mine, theirs = _identity(a), _identity(b)
    for what in mine:
        if (
            mine[what] is not None
            and theirs[what] is not None
            and type(mine[what]) is type(theirs[what])  # an older run records its index by path only
            and mine[what] != theirs[what]
        ):
            raise RagateError(
                f"{flag} {other} ran with another {what} than {kind} {sweep} ({theirs[what]!r} vs "
                f"{mine[what]!r}): its answers would not be comparable; run it with the same settings"
            )


def _matched_section(
    run_dir: Path,
    sweep_records: Sequence[dict[str, Any]],
    budgets: Sequence[float],
    with_runs: Sequence[Path | str],
    metric: Metric,
    select: str = "best",
) -> list[str]:
    """The budget-matched table (TARG Tables 3-4) of a sweep and, as single points, the methods of eval runs."""
    from ragate.report.matched import matched_markdown, matched_table, point_label, references

    if not sweep_records:
        raise RagateError(
            f"--budgets needs a sweep: {run_dir} holds no sweep.jsonl (run `ragate sweep`, then report it with "
            "--with EVAL_DIR for methods with one operating point)"
        )
    extra: list[dict[str, Any]] = []
    for other in map(Path, with_runs):
        if not (other / "questions.jsonl").exists():
            raise RagateError(
                f"--with {other}: no questions.jsonl there (an eval run directory from `ragate eval`)"
            )
        check_same_setup(run_dir, other)
        thresholds = _config(other).get("thresholds") or {}
        more = [
            r
            | ({"label": f"{r['method']} θ={thresholds[r['method']]:g}"} if r["method"] in thresholds else {})
            for r in latest(read_records(other / "questions.jsonl"))
            if "error" not in r
        ]
        twice = sorted({point_label(r) for r in more} & {point_label(r) for r in extra})
        if twice:
            raise RagateError(
                f"--with {other} has {', '.join(twice)} again (an earlier --with run has it too): pass each "
                "method's run once (one run per threshold: `ragate eval --threshold METHOD=TAU`)"
            )
        extra += more
    if select not in ("best", "quantile"):
        raise RagateError(f"--select {select!r}: best (TARG's best point within the budget) or quantile")
    rows = matched_table(sweep_records, extra, budgets, metric, select)  # type: ignore[arg-type]
    how = (
        "its best operating point with retrieval rate <= the budget (TARG's tables: chosen on these questions' "
        "answers, so optimistic; the random gate's row shows by how much)"
        if select == "best"
        else "tau = F^-1(1 - budget) of its scores (TARG section 3.3's calibration, blind to the answers)"
    )
    return [
        "## Budget-matched comparison (TARG Tables 3-4)",
        "",
        (
            f"Each swept gate at {how}, exact from the sweep ({METRIC_LABEL[metric]} in %); a method with one operating "
            "point enters at its own rate and is marked over budget above it. Δ vs Always-RAG and Δ vs a random "
            "gate at the same rate are paired over the same questions, with the same reader, with bootstrap 95% "
            "intervals; one that crosses 0 is *not established*. Δlatency is seconds per question over Never (for "
            "swept gates whose draft starts the closed-book answer, an upper bound)."
        ),
        "",
        matched_markdown(rows, references(sweep_records, metric), metric),
    ]


def _from_sweep(run_dir: Path, sweep: Path, eval_records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sweep's default records for the methods the eval run lacks, on the eval run's questions."""
    if not (sweep / "sweep.jsonl").exists():
        raise RagateError(f"--sweep {sweep}: no sweep.jsonl there (a sweep directory from `ragate sweep`)")
    check_same_setup(run_dir, sweep, flag="--sweep")
    have = {r["method"] for r in eval_records}
    ids = {r["id"] for r in eval_records}
    records = default_records(compact(sweep / "sweep.jsonl"))
    return [r for r in records if r["method"] not in have and r["id"] in ids]


def unfolded_records(run_dir: Path) -> str | None:
    """A sentence naming the records of ``run_dir`` still in worker part files (a multi-worker run that is running
    or was killed; a report reads but never folds them), or None."""
    from ragate.eval.workers import unfolded

    counts = {name: unfolded(run_dir / name) for name in ("questions.jsonl", "sweep.jsonl")}
    if not any(counts.values()):
        return None
    where = ", ".join(f"{n} records in the part files of {name}" for name, n in counts.items() if n)
    return (
        f"{where}, from a multi-worker run still running or killed; when it ends they are folded in, and a killed "
        "run folds them at its next --resume"
    )


def write_report(
    run_dir: Path | str,
    out: Path | str | None = None,
    *,
    metric: Metric | None = None,
    budgets: Sequence[float] = (),
    with_runs: Sequence[Path | str] = (),
    select: str = "best",
    sweep: Path | str | None = None,
    compare: Sequence[tuple[str, str]] = (),
) -> list[Path]:
    """Write ``report.md``, ``frontier.png``, ``deciles.png`` (sweeps only) and ``report.html`` for the run in
    ``run_dir`` into ``out`` (default ``run_dir/report``), each atomically; returns the paths written. With
    ``budgets``, a sweep's report gains the budget-matched table (:mod:`ragate.report.matched`), where the eval
    runs ``with_runs`` (on the same questions) add their methods' single operating points. With ``sweep`` (a sweep
    directory on the same questions), an eval run's report gains the methods that sweep already answered (its
    gates at their default thresholds, and never/always retrieving with a swept family's prompts) in the paired
    differences, instead of computing them again (:func:`ragate.eval.sweep.default_records`). ``compare`` adds
    named (method, against) pairs to the paired differences (:func:`ragate.eval.summary.paired_differences`).
    ``metric`` (em, f1, acc) is the one plots, deciles, quadrants and paired differences use; None: EM, or accuracy
    where EM is near zero and accuracy is not (:func:`report_metric`, said at the top of the report)."""
    run_dir = Path(run_dir)
    questions_path, sweep_path = run_dir / "questions.jsonl", run_dir / "sweep.jsonl"
    if not questions_path.exists() and not sweep_path.exists():
        raise RagateError(
            f"{run_dir} holds no run to report: neither questions.jsonl (from `ragate eval`) nor sweep.jsonl "
            "(from `ragate sweep`) is there"
        )
    canvas()  # a missing matplotlib fails before any work
    out_dir = Path(out) if out is not None else run_dir / "report"
    eval_records = latest(read_records(questions_path))
    sweep_records = compact(sweep_path)
    ok = [r for r in eval_records if "error" not in r]
    if sweep is not None and not eval_records:
        raise RagateError(
            f"--sweep adds a sweep's answers to an eval run's report, and {run_dir} holds no eval records "
            "(questions.jsonl from `ragate eval`)"
        )
    if compare and not eval_records:
        raise RagateError(
            f"--compare pairs methods of an eval run, and {run_dir} holds no eval records (questions.jsonl from "
            "`ragate eval`)"
        )
    sweep_dir = Path(sweep) if sweep is not None else None
    derived = _from_sweep(run_dir, sweep_dir, eval_records) if sweep_dir is not None else []
    md = [f"# ragate report: {run_dir.name}", ""]
    if metric is None:
        metric, why = report_metric(eval_records, sweep_records)
        if why:
            md += [why, ""]
    if pending := unfolded_records(run_dir):
        md += [f"**Not in this report:** {pending}.", ""]
    label = METRIC_LABEL[metric]
    images: dict[str, bytes] = {}

    if eval_records:
        md += [
            "## Evaluation summary",
            "",
            "Accuracy, retrieval and cost of each method on the same questions.",
            "",
        ]
        if (run_dir / "results.json").exists():
            md.append(_demote(_results_markdown(run_dir)))
        else:
            md += ["The run has not finished (no results.json): the records so far.", ""]
            md.append(summary_table(summarize(eval_records)))
        if derived:
            md += [
                "## Methods answered by the sweep",
                "",
                (
                    f"Not computed again: from the sweep {sweep_dir.name if sweep_dir else ''} on the same questions, each gate at its "
                    "default threshold and each method that never or always retrieves with a swept family's "
                    "prompts and selector (the same calls; costs as the sweep recorded them, the gates' seconds an "
                    "upper bound where the draft starts the closed-book answer)."
                ),
                "",
                derived_table(derived),
            ]
        rows = paired_differences([*eval_records, *derived], metric, compare=compare)
        if differences := differences_table(rows, metric):
            md += [
                f"## Paired differences in {label}",
                "",
                (
                    "Each method against never and always retrieving"
                    + (", then the pairs asked for with --compare," if compare else "")
                    + " on the questions both answered: the mean difference and its paired bootstrap 95% "
                    "interval; an interval that crosses 0 is *not established*, whichever way the mean points."
                ),
                "",
                differences,
            ]
    methods = swept_methods(sweep_records)
    if methods:
        fronts = [frontier(sweep_records, m) for m in methods]
        images["frontier.png"] = plot_frontiers(
            [frontier_points(sweep_records, m, metric) for m in methods], metric
        )
        images["deciles.png"] = plot_deciles(sweep_records, methods, metric)
        md += [
            "## Accuracy / retrieval frontier",
            "",
            (
                f"Each gate at every threshold, exactly, from one sweep pass ({METRIC_LABEL[metric]} in %; Never/Always = "
                "no retrieval / retrieval for every question; the random gate's expected accuracy is the straight "
                "line between them). In the plot, each gate's default point, Never and Always carry the "
                "percentile-bootstrap 95% interval of their accuracy over the questions."
            ),
            "",
            sweep_markdown(fronts, metric),
            "![frontier](frontier.png)",
            "",
            "## Gate AUROC",
            "",
            (
                "How well each gate's score ranks the questions the model gets wrong without retrieval above those it "
                "gets right (0.5 = chance, 1 = perfect)."
            ),
            "",
            auroc_markdown(sweep_records),
            "## Closed-book accuracy by gate-score decile (TARG A.6)",
            "",
            (
                f"Closed-book / retrieval {label} (%) and question count per decile of each gate's score, lowest "
                f"score first: a useful gate's closed-book {label} falls from decile 1 to 10."
            ),
            "",
            deciles_markdown(sweep_records, methods, metric),
            "![deciles](deciles.png)",
            "",
            "## Error quadrants over (U, Δ) (TARG A.7)",
            "",
            (
                "Questions by whether the gate retrieves at its own threshold (high U) and whether retrieval raises, "
                f"lowers or keeps the {label} (Δ): (a) is what the gate misses, (c) what it catches, (b) where it "
                "hurts."
            ),
            "",
            quadrant_markdown(sweep_records, methods, metric),
        ]
    elif ok:  # no sweep: one point per evaluated method
        images["frontier.png"] = plot_operating_points(summarize(eval_records), metric)
        md += [
            "## Operating points",
            "",
            f"Each method's retrieval rate and {label}, with its percentile-bootstrap 95% interval over the questions.",
            "",
            "![frontier](frontier.png)",
            "",
        ]
    if recall_comparison(ok, RECALL_K):
        md += [
            f"## Retrieval recall@{RECALL_K} (DTR Table 4)",
            "",
            (
                f"Mean recall@{RECALL_K} (%) of the documents each method read, over the questions where it retrieved "
                "and gold passages are known."
            ),
            "",
            recall_markdown(ok),
        ]
    pairs = [m for m in PAIRS_METHODS if any(r["method"] == m for r in ok)]
    if pairs:
        md += [
            "## PAIRS: directly answered vs retrieved (PAIRS Fig. 3)",
            "",
            (
                f"{label} (%) of the questions PAIRS answered without retrieval (DQ), of those it retrieved for, and "
                "of the DQs as answered with retrieval by the reference method."
            ),
            "",
            pairs_markdown(ok, pairs, metric),
        ]

    if budgets:
        md += _matched_section(run_dir, sweep_records, budgets, with_runs, metric, select)

    markdown = "\n".join(md).rstrip("\n") + "\n"
    files: dict[str, bytes] = {"report.md": markdown.encode(), **images}
    files["report.html"] = markdown_to_html(markdown, images, f"ragate report: {run_dir.name}").encode()
    written = []
    for name, data in files.items():
        with atomic_writer(out_dir / name) as f:
            f.write(data)
        written.append(out_dir / name)
    return written
