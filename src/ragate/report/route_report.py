"""The routes' frontier as ``ragate report RUN --routes ...`` prints it: the pooled table, one per dataset where the
records span several, the figure's data where one is drawn, the targets, which routes are right on which questions,
and each stop check's AUROC (:mod:`ragate.report.routes` replays the policies, :mod:`ragate.report.route_plot` draws
them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.report.route_frontier import frontier
from ragate.report.route_plot import by_dataset, plot_routes
from ragate.report.route_targets import targets_markdown
from ragate.report.routes import (
    DEFAULT_TARGETS,
    RouteTable,
    _cell,
    checks_markdown,
    frontier_markdown,
    read_route_table,
)


def right_patterns(table: RouteTable, metric: str) -> dict[tuple[bool, ...], np.ndarray]:
    """Each pattern of routes right (score > 0) that some question has, cheapest route first, with the questions
    (row indices) that have it: what any policy over these routes can gain or lose by sending a question on."""
    right = table.scores[metric] > 0
    out: dict[tuple[bool, ...], np.ndarray] = {}
    for pattern in sorted({tuple(bool(v) for v in row) for row in right}, reverse=True):
        out[pattern] = np.flatnonzero((right == np.array(pattern)).all(axis=1))
    return out


def patterns_markdown(table: RouteTable, metric: str) -> str:
    """The questions of each pattern of routes right (:func:`right_patterns`), pooled and, where the table spans
    several datasets, per dataset: where only the cheap route is right, a policy gains by stopping; where the dear
    route alone is, by sending on; where all or none are, the route chosen changes nothing but the cost."""
    names = sorted(set(table.datasets)) if len(set(table.datasets)) > 1 else []
    datasets = np.array(table.datasets)
    head = "| " + " | ".join(map(_cell, table.routes)) + " | questions | share |" + "".join(f" {_cell(d)} |" for d in names)
    lines = [head, "|" + "---|" * (len(table.routes) + 2 + len(names))]
    for pattern, rows in right_patterns(table, metric).items():
        marks = " | ".join("right" if ok else "wrong" for ok in pattern)
        per = "".join(f" {int((datasets[rows] == d).sum())} |" for d in names)
        lines.append(f"| {marks} | {len(rows)} | {len(rows) / len(table):.1%} |{per}")
    return "\n".join(lines)


def routes_report(
    run_dirs: Sequence[str | Any],
    routes: Sequence[str],
    metric: str = "em",
    *,
    targets: Sequence[float] = DEFAULT_TARGETS,
    seed: int = 0,
    samples: int = 1000,
    plot: str | Any | None = None,
) -> str:
    """The frontier of ``routes`` over the eval runs ``run_dirs`` (their records only, a route's answer from the
    first run that holds it), with a line that says what it was computed from; where the records span several
    datasets, the pooled frontier and then each dataset's (the pooled policies' choices on its questions). ``seed``
    sets the cross-fitting halves and the bootstrap, ``samples`` the bootstrap's resamples. ``plot``: a PNG path
    where the pooled frontier is drawn (written atomically; the report then says the figure's data)."""
    if not (isinstance(seed, int) and seed >= 0):
        raise RagateError(f"the seed (--seed) is a whole number, 0 or more, not {seed!r}")
    if not (isinstance(samples, int) and samples >= 1):
        raise RagateError(f"the bootstrap's resamples (--resamples) are a whole number, 1 or more, not {samples!r}")
    table = read_route_table(run_dirs, routes)
    rows = frontier(table, metric, targets=targets, seed=seed)
    nll = [r for r, ok in zip(routes, np.isfinite(table.nll).all(axis=0), strict=True) if not ok]
    said = f"; no log-probabilities in the records of {', '.join(nll)}, which never stop on NLL" if nll else ""
    where = " + ".join(str(d) for d in run_dirs)
    parts = by_dataset(table, rows)
    text = (
        f"{len(table)} questions answered by every route ({', '.join(routes)}) in {where}{said}; {metric.upper()} "
        f"x 100, costs per question; seed {seed}, {samples} resamples.\n\n"
        + ("Pooled over the datasets:\n\n" if parts else "")
        + frontier_markdown(table, rows, metric, samples=samples, seed=seed) + "\n"
    )
    for name, sub, sub_rows in parts:
        text += f"\n{name} ({len(sub)} questions; the pooled policies' choices):\n\n"
        text += frontier_markdown(sub, sub_rows, metric, samples=samples, seed=seed) + "\n"
    if plot is not None:
        from pathlib import Path

        from ragate.fileio import atomic_writer

        png, data = plot_routes(rows, table, metric, samples=samples, seed=seed)
        with atomic_writer(Path(plot)) as f:
            f.write(png)
        text += f"\n{data}\n"  # the path is left out: the check draws it into a scratch file
    text += (
        "\nThe targets (issue 78), each with its paired 95% interval"
        + (", pooled" if parts else "") + ":\n\n" + targets_markdown(table, rows, metric, seed=seed, samples=samples) + "\n"
    )
    text += (
        f"\nWhich routes are right ({metric.upper()} > 0), question by question"
        + (", pooled and per dataset" if parts else "") + ":\n\n" + patterns_markdown(table, metric) + "\n"
    )
    return (
        text + "\nEach stop check on its own, for the question it would stop on:\n\n"
        + checks_markdown(table, metric, seed=seed, samples=samples) + "\n"
    )
