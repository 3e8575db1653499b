"""The routes' frontier as a figure: each policy's accuracy against its mean retrievals per question, with the
bootstrap 95% interval of its accuracy, from the rows :func:`ragate.report.route_frontier.frontier` replayed; and the
frontier per dataset where the records span several (the pooled policies' choices, reported on each dataset's
questions)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ragate.eval.metrics import bootstrap_ci
from ragate.report.plots import canvas, figure_data
from ragate.report.routes import RouteTable, Row

# each family its marker, so that a colour the cycle repeats still tells rows apart
MARKERS = (("always", "s"), ("cascade: calibrated", "D"), ("cascade:", "o"), ("learned", "^"), ("adaptive", "X"),
           ("oracle", "*"))  # fmt: skip


def points(rows: Sequence[Row], *, samples: int, seed: int) -> list[tuple[str, float, float, float, float]]:
    """Per row with answers: its name, mean retrievals per question, accuracy, and the accuracy's bootstrap 95%
    interval (the percentile interval over resampled questions)."""
    out = []
    for row in rows:
        if not row.costs:
            continue
        lo, hi = bootstrap_ci(row.score.tolist(), samples=samples, seed=seed)
        out.append((row.name, float(np.mean(row.costs["retrievals"])), float(np.mean(row.score)), lo, hi))
    return out


def plot_routes(rows: Sequence[Row], table: RouteTable, metric: str, *, samples: int, seed: int) -> tuple[bytes, str]:
    """The figure (PNG bytes) and the line standing for its data (:func:`ragate.report.plots.figure_data`)."""
    render = canvas()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 5.5))
    ax = fig.add_subplot()
    drawn = points(rows, samples=samples, seed=seed)
    for i, (name, x, y, lo, hi) in enumerate(drawn):
        marker = next((m for prefix, m in MARKERS if name.startswith(prefix)), "o")
        ax.errorbar([x], [100 * y], yerr=[[100 * (y - lo)], [100 * (hi - y)]], color=f"C{i % 10}", capsize=3, lw=1,
                    marker=marker, ms=7, label=name)  # fmt: skip
    ax.set(
        xlabel="retrievals per question",
        ylabel=f"{metric.upper()} (%)",
        title=f"routes ({', '.join(table.routes)}) on {len(table)} questions (bars: bootstrap 95%)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.subplots_adjust(left=0.07, right=0.58)
    data = figure_data({name: [x, y, lo, hi] for name, x, y, lo, hi in drawn})
    return render(fig), data


def by_dataset(table: RouteTable, rows: Sequence[Row]) -> list[tuple[str, RouteTable, list[Row]]]:
    """Each dataset's questions of a pooled table, with the pooled rows' answers and costs on them (the same
    policies, fitted on the pool, reported per dataset); empty where the table holds one dataset."""
    names = sorted(set(table.datasets))
    if len(names) < 2:
        return []
    out = []
    for name in names:
        keep = np.array([d == name for d in table.datasets])
        sub = [
            Row(r.name, r.taken[keep], r.score[keep], {k: v[keep] for k, v in r.costs.items()}, r.note)
            if r.costs
            else r
            for r in rows
        ]
        out.append((name, table.take(np.flatnonzero(keep)), sub))
    return out
